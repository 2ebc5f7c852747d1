"""Workflows: as data (named steps and their dependencies) or as code.

Two ways of deciding the next step, one engine. A DAG is checked once, when
it is loaded (`load_workflow`): a cycle, an unknown dependency, a duplicate
step name, a non-positive deadline or attempt limit, or a retry wait out of
range is a `WorkflowError` that names the culprit (`check_step` checks one
step's own fields). A code workflow (`workflow`) is an ``async def`` of a
`RunContext` that calls ``run.step(...)`` as it goes; each call is a step
like a DAG's, with the same options, checked when it is made.

No I/O and no asyncio here: a step's function is just a value (an ``async
def`` the executor awaits), and `RunContext` is only the contract.
"""

from __future__ import annotations

import graphlib
import inspect
import math
from types import MappingProxyType
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar, cast, overload

from typing_extensions import TypeAlias, final

from ._context import StepContext
from ._errors import AttemptKernelError
from ._findings import Reconciler
from ._records import JSON

StepFunction: TypeAlias = Callable[[StepContext], Awaitable[JSON]]
"""What a step runs: an async function of its context, returning a JSON value.

`JSON`'s containers are read-only (`Mapping`, `Sequence`), so an
``async def f(ctx: StepContext) -> dict[str, int]`` is a `StepFunction`.
"""


@final
class WorkflowError(AttemptKernelError):
    """A workflow definition is invalid; the message names the step or field."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How many attempts a step gets, and when a new one may start.

    ``max_attempts`` counts every attempt, the first included. A new attempt
    follows a `Failed` one, or a `TimedOut` one whose *step* deadline passed
    (if ``retry_on_timeout``); never a queue timeout, a cancel or an
    `Indeterminate` attempt. An attempt that ended with an intent still
    outstanding is retried only if ``effects_idempotent`` says the step's
    effects may be sent again under the same idempotency key
    (docs/contracts.md, "Retries and outstanding intents"); otherwise the run
    stops there for reconciliation. An attempt whose step raised an instance of
    one of the ``non_retryable`` exception types is never retried (the log
    records it, so recovery knows too).

    **When a retry starts.** After ``tries`` attempts that counted (Failed,
    or TimedOut by the step deadline), the next one waits
    ``initial_interval * backoff_factor ** (tries - 1)`` seconds, at most
    ``max_interval`` (None: 100 times ``initial_interval``), then moved by
    up to ``jitter`` of itself either way (so a jittered wait may pass
    ``max_interval`` by that fraction). With the defaults that is 1, 2,
    4, 8, ... seconds, never more than 100. ``initial_interval=0`` retries
    at once. An attempt that was stopped from outside (`Cancelled`, or an
    `Indeterminate` one once reconciled) is not the step's failure: the next
    attempt starts at once, without a wait.

    The wait is measured from when the failed attempt ended (its terminal
    record's time), so it is durable without a record of its own: a crash,
    or a graceful stop, during the wait resumes the step with only what is
    left of it. So the jitter is no random draw: it is derived from a hash
    of the run id, the step name and the number of the attempt about to
    start, and the wait recomputed after a crash is the same one.

    The defaults are Temporal's (1 s, doubling, up to 100 s, no jitter):
    a rate-limited call (HTTP 429) backs off instead of spending its
    attempts at once, the waits are the ones the formula says, and
    ``max_attempts`` defaults to 1, so they matter only once a step asks
    for retries. Set ``jitter`` (0.1 to 0.5) when many runs share one rate
    limit and should not retry in step.
    """

    max_attempts: int = 1
    retry_on_timeout: bool = True
    effects_idempotent: bool = False
    initial_interval: float = 1.0
    """Seconds before the first retry (0: at once); finite, not negative."""
    backoff_factor: float = 2.0
    """Each further retry waits this many times longer (at least 1: 1 keeps the wait constant)."""
    max_interval: float | None = None
    """The longest wait before a retry, before jitter (None: 100 times ``initial_interval``)."""
    jitter: float = 0.0
    """The fraction of the wait (0 to 1) that may be added or taken away, per attempt."""
    non_retryable: tuple[type[Exception], ...] = ()
    """Exception types that are never retried: the attempt that raised one is the step's last."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One step: its name, what it runs, what it waits for, and its limits.

    ``after`` names the steps whose results this one needs; it starts when all
    of them have succeeded and receives their results in ``ctx.inputs``.
    ``queue_deadline`` (seconds a `Pending` attempt may wait for admission) and
    ``step_deadline`` (seconds a `Running` attempt may take) must be positive.
    ``domain_states`` names the workflow's domain states this step may set
    (``ctx.set_state``); each must be declared by the workflow. ``reconcilers``
    maps an effect's name to the function that asks the downstream system about
    it (docs/contracts.md, "Recovery"): recovery calls it for an effect a crash
    left outstanding, before it ends the attempt.

    ``pool`` names the shared pool whose slot each attempt of the step needs to
    run (docs/contracts.md, "Admission across workers": never more than the
    pool's size running at once, across every worker); None (the default) needs
    none. Workers on PostgreSQL honour it (the pool is made and sized by
    `set_pool`); an executor given no pool admission (``Executor(pools=...)``)
    admits the step under its ``admission_limit`` like any other. A pooled
    attempt waits ``Pending`` for a slot up to ``queue_deadline``, then ends
    ``TimedOut``.
    """

    name: str
    run: StepFunction
    after: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    queue_deadline: float = 60.0
    step_deadline: float = 60.0
    domain_states: tuple[str, ...] = ()
    reconcilers: Mapping[str, Reconciler] = field(default_factory=lambda: MappingProxyType({}))
    pool: str | None = None


_NO_RECONCILERS: Final[Mapping[str, Reconciler]] = MappingProxyType({})
_step_slots = vars(Step)  # the slot descriptors, typed Any
_set_name: Final[Callable[[Step, str], None]] = _step_slots["name"].__set__
_set_run: Final[Callable[[Step, StepFunction], None]] = _step_slots["run"].__set__
_set_after: Final[Callable[[Step, tuple[str, ...]], None]] = _step_slots["after"].__set__
_set_retry: Final[Callable[[Step, RetryPolicy], None]] = _step_slots["retry"].__set__
_set_queue_deadline: Final[Callable[[Step, float], None]] = _step_slots["queue_deadline"].__set__
_set_step_deadline: Final[Callable[[Step, float], None]] = _step_slots["step_deadline"].__set__
_set_domain_states: Final[Callable[[Step, tuple[str, ...]], None]] = _step_slots["domain_states"].__set__
_set_reconcilers: Final[Callable[[Step, Mapping[str, Reconciler]], None]] = _step_slots["reconcilers"].__set__
_set_pool: Final[Callable[[Step, str | None], None]] = _step_slots["pool"].__set__


def new_step(
    name: str,
    run: StepFunction,
    *,
    retry: RetryPolicy,
    queue_deadline: float,
    step_deadline: float,
    pool: str | None,
    reconcilers: Mapping[str, Reconciler] | None,
    domain_states: tuple[str, ...],
) -> Step:
    """``Step(...)`` with no ``after`` (a code step's), built through the slot
    descriptors at less than half the cost of the frozen dataclass's __init__
    (one per ``run.step`` call; a test holds the two equal). ``reconcilers``
    None is no reconcilers."""
    step: Step = object.__new__(Step)
    _set_name(step, name)
    _set_run(step, run)
    _set_after(step, ())
    _set_retry(step, retry)
    _set_queue_deadline(step, queue_deadline)
    _set_step_deadline(step, step_deadline)
    _set_domain_states(step, domain_states)
    _set_reconcilers(step, _NO_RECONCILERS if reconcilers is None else reconcilers)
    _set_pool(step, pool)
    return step


R = TypeVar("R", bound=JSON)
A1 = TypeVar("A1", bound=JSON)
A2 = TypeVar("A2", bound=JSON)
A3 = TypeVar("A3", bound=JSON)


class RunContext(Protocol):
    """Handed to a code workflow's function: the run's identity, its input, steps and waits.

    ``step(name, fn, *args, **options)`` runs ``fn(ctx, *args)`` as a step
    of the run, with every rule a DAG step has (attempts through the kernel's
    transition table, retries by its `RetryPolicy`, deadlines, a pool,
    reconcilers, domain states, effects through ``ctx.effect``). The call
    takes the run's next position (1, 2, 3, ...) at once, before any
    ``await``, so steps started together (``asyncio.gather``) are numbered
    in call order; the arguments must be JSON values (a digest of them is
    recorded with the position). It returns an awaitable of the step's
    result; awaiting it raises `StepFailed` when the step did not succeed
    (it failed for good, timed out, ended `Indeterminate`, or left an effect
    to reconcile), which the function may catch.

    The options are `Step`'s fields: ``retry``, ``step_deadline``,
    ``queue_deadline`` and ``pool`` default to the workflow's (see
    `workflow`); ``reconcilers`` and ``domain_states`` to none. The
    function must be deterministic given its input and its steps' results:
    clock reads, random numbers, I/O and model calls go inside steps, since
    recovery runs the function again from the top and answers each recorded
    position from the log.
    """

    @property
    def run(self) -> str:
        """The run's id."""
        ...

    @property
    def input(self) -> JSON:
        """The run's input (recorded in its start record); None if it has none."""
        ...

    @overload
    def step(
        self,
        name: str,
        fn: Callable[[StepContext], Awaitable[R]],
        /,
        *,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self,
        name: str,
        fn: Callable[[StepContext, A1], Awaitable[R]],
        a1: A1,
        /,
        *,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self,
        name: str,
        fn: Callable[[StepContext, A1, A2], Awaitable[R]],
        a1: A1,
        a2: A2,
        /,
        *,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[R]: ...

    @overload
    def step(
        self,
        name: str,
        fn: Callable[[StepContext, A1, A2, A3], Awaitable[R]],
        a1: A1,
        a2: A2,
        a3: A3,
        /,
        *,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[R]: ...

    def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[R]],
        /,
        *args: JSON,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[R]:
        """Run ``fn(ctx, *args)`` as the run's next step; see the class doc."""
        ...

    def sleep(self, seconds: float) -> Awaitable[None]:
        """Sleep ``seconds`` (finite, at least 0), durably: the run's next position.

        The wake time is recorded (``wait_started``) before the sleep begins;
        after a crash or a stop, the resumed run sleeps only what is left,
        and not at all once the wake time has passed. While it sleeps the
        run holds no attempt and no slot. A negative, infinite or NaN
        ``seconds``, or one too long to count in microseconds (1.8e302 or
        more), raises `WorkflowError` at the call.
        """
        ...

    def wait_for_signal(self, name: str, timeout: float | None = None) -> Awaitable[JSON]:
        """Wait for the next signal named ``name`` sent to the run; return its payload.

        Signals are a mailbox: one sent before the run waits is kept, and
        each is taken by one wait, in the order sent (``attempt-kernel
        signal``, `send_signal`). A payload is never None (a signal sent
        without one carries ``{}``), so None means ``timeout`` seconds passed
        first (None: wait for ever). The wait takes the run's next position;
        its start and its end (which signal it took) are records, so a
        resumed run gets the same answer. While it waits the run holds no
        attempt and no slot. A bad ``name`` (empty, control characters) or
        ``timeout`` (negative, infinite, NaN, 1.8e302 or more) raises `WorkflowError` at the call.
        """
        ...


WorkflowFunction: TypeAlias = Callable[[RunContext], Awaitable[JSON]]
"""A code workflow: an async function of its `RunContext`, returning the run's result."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepOptions:
    """The options a code workflow's steps get unless a ``run.step`` call gives its own."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    step_deadline: float = 60.0
    queue_deadline: float = 60.0
    pool: str | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Workflow:
    """A checked workflow: a DAG of steps, or a code workflow's function.

    A DAG is made by `load_workflow`, which checks it: ``steps`` in an order
    where each comes after its dependencies. A code workflow is made by
    `workflow`: ``function`` is set, ``steps`` is empty, ``defaults`` are
    the options of its steps. ``domain_states`` are the domain step state
    names it declares; ``version`` is a label recorded in each run's start
    (so that an operator sees which code a run began under).
    """

    name: str
    steps: tuple[Step, ...]
    by_name: Mapping[str, Step]
    domain_states: tuple[str, ...] = ()
    function: WorkflowFunction | None = None
    version: str = ""
    defaults: StepOptions = field(default_factory=StepOptions)


def _positive(value: object, what: str) -> None:
    # typed object: this guards callers that ignored the annotations
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkflowError(f"{what} must be a positive number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise WorkflowError(f"{what} must be a positive number of seconds, got {value!r}")


def is_async_function(fn: object) -> bool:
    """An ``async def`` (or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)
    )


def _declared(name: str, domain_states: Iterable[str]) -> tuple[str, ...]:
    declared: list[str] = []
    for state in domain_states:
        # typed str; this guards callers that ignored the annotations
        if type(state) is not str or not state:  # pyright: ignore[reportUnnecessaryComparison]
            raise WorkflowError(f"workflow {name!r}: a domain state needs a non-empty name, got {state!r}")
        if state in declared:
            raise WorkflowError(f"workflow {name!r}: domain state {state!r} is declared twice")
        declared.append(state)
    return tuple(declared)


def _number(value: object, least: float, what: str, must: str) -> float:
    """A finite int or float of at least ``least``, else a `WorkflowError` saying ``must``."""
    # typed float: this guards callers that ignored the annotations
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WorkflowError(f"{what} must be {must}, got {value!r}")
    if not (math.isfinite(value) and value >= least):
        raise WorkflowError(f"{what} must be {must}, got {value!r}")
    return value


def _check_retry(policy: RetryPolicy, where: str) -> None:
    """Refuse a retry policy whose fields cannot say when a retry starts."""
    limit: object = policy.max_attempts
    if type(limit) is not int or limit < 1:
        raise WorkflowError(f"{where}: retry.max_attempts must be at least 1, got {limit!r}")
    initial = _number(
        policy.initial_interval,
        0,
        f"{where}: retry.initial_interval",
        "a finite number of seconds, 0 or more (0: retry at once)",
    )
    _number(
        policy.backoff_factor,
        1,
        f"{where}: retry.backoff_factor",
        "a finite number, 1 or more (1: every wait the same)",
    )
    if policy.max_interval is not None:
        _number(
            policy.max_interval,
            initial,
            f"{where}: retry.max_interval",
            f"None or a finite number of seconds, at least initial_interval ({initial!r})",
        )
    jitter = _number(policy.jitter, 0, f"{where}: retry.jitter", "a fraction from 0 to 1")
    if jitter > 1:
        raise WorkflowError(f"{where}: retry.jitter must be a fraction from 0 to 1, got {jitter!r}")
    types: object = policy.non_retryable
    if type(types) is not tuple:
        raise WorkflowError(
            f"{where}: retry.non_retryable must be a tuple of exception types, got {types!r}"
        )
    for kind in cast("tuple[object, ...]", types):
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise WorkflowError(
                f"{where}: retry.non_retryable must hold exception types (subclasses of"
                f" Exception, which is what a step's failure is), got {kind!r}"
            )


def check_step(step: Step, where: str, declared: tuple[str, ...]) -> None:
    """Refuse a step whose options break a rule, with a `WorkflowError` prefixed by ``where``.

    Its deadlines, pool name and retry policy, and the domain states it names
    (each must be in ``declared``, the workflow's). `load_workflow` calls it
    for each step; a code workflow's run calls it for each ``run.step``.
    """
    _positive(step.queue_deadline, f"{where}: queue_deadline")
    _positive(step.step_deadline, f"{where}: step_deadline")
    pool: object = step.pool
    if pool is not None and (type(pool) is not str or not pool):
        raise WorkflowError(f"{where}: pool must be None or a non-empty name, got {pool!r}")
    retry: object = step.retry
    if not isinstance(retry, RetryPolicy):  # pyright: ignore[reportUnnecessaryIsInstance]  # guards callers that ignored the annotations
        raise WorkflowError(f"{where}: retry must be a RetryPolicy, got {retry!r}")
    _check_retry(step.retry, where)
    for state in step.domain_states:
        if state not in declared:
            raise WorkflowError(
                f"{where}: domain state {state!r} is not declared by the workflow"
                f" (declared: {', '.join(declared) or 'none'}); declare it in"
                " load_workflow(..., domain_states=[...]) or workflow(..., domain_states=[...])"
            )


def workflow(
    name: str,
    *,
    domain_states: Iterable[str] = (),
    version: str = "",
    retry: RetryPolicy | None = None,
    step_deadline: float = 60.0,
    queue_deadline: float = 60.0,
    pool: str | None = None,
) -> Callable[[WorkflowFunction], Workflow]:
    """Make an ``async def f(run: RunContext) -> JSON`` a code `Workflow` named ``name``.

    Use it as a decorator; the result is a `Workflow`, usable wherever a
    loaded one is (`Executor.run`, `run_jobs`, `resume_log`, and the
    command line's ``run MODULE:ATTR``, ``recover --workflows``,
    ``submit``, ``worker --workflows``). ``domain_states`` declares the
    domain step state names its steps may set; ``version`` is a label
    recorded in each run's start; ``retry``, ``step_deadline``,
    ``queue_deadline`` and ``pool`` are the defaults of its steps (a
    ``run.step`` call may give its own). Raises `WorkflowError` for an
    empty name, a function that is not ``async def``, or a bad option.
    """
    if type(name) is not str or not name:  # pyright: ignore[reportUnnecessaryComparison]
        raise WorkflowError(f"a workflow needs a non-empty name, got {name!r}")
    declared = _declared(name, domain_states)
    defaults = StepOptions(
        retry=RetryPolicy() if retry is None else retry,
        step_deadline=step_deadline,
        queue_deadline=queue_deadline,
        pool=pool,
    )
    if type(version) is not str:  # pyright: ignore[reportUnnecessaryComparison]
        raise WorkflowError(f"workflow {name!r}: version must be a string, got {version!r}")
    probe = Step(
        name="(defaults)",
        run=_never,
        retry=defaults.retry,
        step_deadline=step_deadline,
        queue_deadline=queue_deadline,
        pool=pool,
    )
    check_step(probe, f"workflow {name!r}, default step options", declared)

    def make(function: WorkflowFunction) -> Workflow:
        if not is_async_function(function):
            raise WorkflowError(
                f"workflow {name!r}: {getattr(function, '__qualname__', function)!r} is not an"
                " async function; write it as `async def f(run: RunContext) -> JSON`"
            )
        return Workflow(
            name=name,
            steps=(),
            by_name=MappingProxyType({}),
            domain_states=declared,
            function=function,
            version=version,
            defaults=defaults,
        )

    return make


async def _never(ctx: StepContext) -> JSON:  # the defaults' probe step; never run
    raise AssertionError("the defaults' probe step ran")


def load_workflow(
    name: str, steps: Iterable[Step], *, domain_states: Iterable[str] = ()
) -> Workflow:
    """Check ``steps`` and return them as a `Workflow` (dependencies first).

    ``domain_states`` declares the workflow's domain step state names
    (docs/contracts.md, "Domain step states"). Raises `WorkflowError` naming
    the culprit: an empty or duplicate step name, an unknown dependency, a
    cycle (listed in order), a non-positive deadline or attempt limit, a retry
    interval, factor, jitter or non-retryable type out of range,
    an empty pool name, an empty or repeated domain state name, a step naming a
    domain state the workflow does not declare.
    """
    if not name:
        raise WorkflowError("a workflow needs a non-empty name")
    declared = _declared(name, domain_states)
    by_name: dict[str, Step] = {}
    for step in steps:
        if not step.name:
            raise WorkflowError(f"workflow {name!r}: a step has an empty name")
        if step.name in by_name:
            raise WorkflowError(f"workflow {name!r}: duplicate step name {step.name!r}")
        check_step(step, f"workflow {name!r}, step {step.name!r}", declared)
        by_name[step.name] = step
    if not by_name:
        raise WorkflowError(f"workflow {name!r} has no steps")
    for step in by_name.values():
        for dep in step.after:
            if dep not in by_name:
                raise WorkflowError(
                    f"workflow {name!r}, step {step.name!r}: depends on unknown step {dep!r}"
                )
            if dep == step.name:
                raise WorkflowError(f"workflow {name!r}, step {step.name!r}: depends on itself")
    return Workflow(
        name=name,
        steps=_dependencies_first(name, by_name),
        by_name=by_name,
        domain_states=declared,
    )


def _dependencies_first(workflow: str, steps: Mapping[str, Step]) -> tuple[Step, ...]:
    """Steps in declaration order, each moved after its dependencies.

    graphlib finds a cycle (reported in order); the order itself is a
    depth-first walk from each step in the order they were declared, so a
    workflow declared dependencies-first keeps its order (reports list its
    steps as written).
    """
    try:
        graphlib.TopologicalSorter({name: step.after for name, step in steps.items()}).prepare()
    except graphlib.CycleError as error:
        cycle: list[str] = list(reversed(error.args[1]))
        raise WorkflowError(
            f"workflow {workflow!r}: dependency cycle " + " -> ".join(cycle)
        ) from None
    order: list[Step] = []
    placed: set[str] = set()
    for root in steps:
        if root in placed:
            continue
        placed.add(root)
        stack = [(root, iter(steps[root].after))]
        while stack:
            name, deps = stack[-1]
            dep = next(deps, None)
            if dep is None:
                stack.pop()
                order.append(steps[name])
            elif dep not in placed:
                placed.add(dep)
                stack.append((dep, iter(steps[dep].after)))
    return tuple(order)


def check_by_name(workflows: object, where: str) -> None:
    """Refuse ``workflows`` that are not a mapping by name, naming the fix.

    `recover_log` and `recover` map each workflow's name to it, where
    `resume_log` and `Worker` take the workflows themselves: given the
    latter's form, the lookup by name would fail with an unrelated
    ``TypeError`` deep inside, after the log was opened.
    """
    if isinstance(workflows, Mapping):
        return
    given = cast("list[object]", workflows) if type(workflows) in (list, tuple) else []
    first = given[0] if given else None
    example = f"{{{first.name!r}: {first.name}}}" if isinstance(first, Workflow) else "{'NAME': workflow}"
    raise TypeError(
        f"{where}: workflows must map each workflow's name to it ({example}), got a"
        f" {type(workflows).__name__}; resume_log is the one that takes the workflows themselves"
    )


def workflows_by_name(workflows: Iterable[object], where: str = "resume_log") -> dict[str, Workflow]:
    """The workflows by name; anything else in ``workflows`` is refused, naming the fix.

    A mapping by name is what `recover_log` takes: iterated, it gives the
    names, and the lookup of ``.name`` would fail with an unrelated error.
    ``where`` is the call that was given them (`resume_log`, `resume_run`).
    """
    by_name: dict[str, Workflow] = {}
    for workflow in workflows:
        if not isinstance(workflow, Workflow):  # the callers' are typed; this guards callers that ignored it
            hint = ""
            if isinstance(workflows, Mapping):
                hint = " (a dict's key?): pass the mapping's .values()"
                if where == "resume_log":
                    hint += "; recover_log is the one that takes a mapping by name"
            raise TypeError(
                f"{where}: workflows must be the workflows themselves ([w, ...]), got {workflow!r},"
                f" a {type(workflow).__name__}{hint}"
            )
        by_name[workflow.name] = workflow
    return by_name


def check_workflow(value: object, where: str) -> None:
    """Refuse ``value`` unless it is a `Workflow`, saying how to make one.

    The callers' are typed; this guards callers that ignored it: an ``async def``
    its author forgot to decorate with `workflow` would fail deep inside with an
    unrelated ``AttributeError``.
    """
    if not isinstance(value, Workflow):
        name = getattr(value, "__qualname__", None)
        shown = name if isinstance(name, str) else repr(value)
        kind = "function" if inspect.isfunction(value) else type(value).__name__
        raise TypeError(
            f"{where}: {shown} is a {kind}, not a Workflow; make it with @attempt_kernel.workflow(...)"
            " on an async function, or with attempt_kernel.load_workflow(...)"
        )
