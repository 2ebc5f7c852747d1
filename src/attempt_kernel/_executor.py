"""The executor: runs a workflow's steps as attempts and writes the run log.

The event loop's side of the kernel (other modules use asyncio too: the
code-workflow runner, the worker, pools, reconcilers' findings, and recovery,
which runs reconcilers under ``asyncio.run``). It keeps no run state of its own:
it asks the ledger (`_ledger`) where an attempt stands, builds the change
through the kernel (`transition`, `intent_transition`), appends it to the run
log, and only then applies it to the ledger (docs/design.md, "The ledger");
side effects happen only through `StepContext.effect`, which makes the
``Dispatched`` record durable (fsync) before it calls the effect
(docs/contracts.md, "The write-ahead rule").

Cancellation is cooperative. Log appends are synchronous calls with no
``await`` inside, so a cancellation can never land in the middle of one: the
log never claims a state the executor has left. The flip side: a step that
blocks the event loop (a synchronous call) delays every deadline and every
cancellation until it returns. Run blocking work with
`StepContext.run_blocking`, which moves it to a thread (a thread cannot be
stopped: when the deadline passes the attempt ends `TimedOut` while the
thread finishes on its own).

A run id is unique in a log: the executor reads the log it appends to (when the
store can be read) into its ledger, refuses to start an unfinished run again,
and answers a finished one with its recorded report. A graceful stop
(`Executor.stop`, which `run_jobs` wires to SIGINT and SIGTERM) is not a cancel
(docs/contracts.md, "A graceful stop is not a cancel"): no new attempt starts,
live attempts get a grace period and then end as recovery would end them, and
the run stays unfinished.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import math
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, Protocol, TypeVar, Union, runtime_checkable

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import (
    PENDING,
    Admit,
    AttemptState,
    Fail,
    QueueDeadlinePassed,
    StepDeadlinePassed,
    Succeed,
    TransitionCause,
    is_terminal,
    transition,
)
from ._codec import RunLogError, UnencodableRecord, new_created, new_result, new_transition
from ._coderun import CodeRun, WorkflowDiverged, non_string_key
from ._context import Perform
from ._errors import AttemptKernelError
from ._findings import EffectHappened, EffectNotHappened, EffectUnknown, ask_all
from ._intent import (
    Confirm,
    Dispatch,
    IntentCause,
    Planned,
    Reject,
    idempotency_key,
    intent_transition,
    is_outstanding,
)
from ._ledger import (
    Ledger,
    PriorStep,
    RunStatus,
    RunView,
    StepView,
    deadline_message,
    has_succeeded,
    may_run_again,
    retry_wait,
    run_status,
)
from ._records import (
    JSON,
    AttemptCreated,
    Change,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    WaitEnded,
    WaitStarted,
)
from ._inbox import inbox_size, locked_inbox
from ._logfile import RunLogWriter
from ._observe import UNLOGGED, LogRecords, ProgressLines, RunObserver, tell, tell_released
from ._operate import Delivery, refusal
from ._outcome import RunReport, StepOutcome, describe, outcome
from ._recovery import Asked, OrphanEnded, Recovery
from ._report import asked_line
from ._store import (
    BatchLog,
    DispatchRefused,
    LogSource,
    RunLog,
    is_batch_log,
    is_dispatch_gate,
    is_group_commit_log,
    is_log_source,
)
from ._workflow import Step, Workflow, check_workflow

T = TypeVar("T")


class EffectRejected(AttemptKernelError):
    """Raise from an effect to say it is known *not* to have happened.

    The intent is recorded `Rejected` and the exception fails the attempt.
    Any other exception from an effect leaves the outcome unknown: the intent
    stays `Dispatched` (outstanding), and the executor never guesses.
    """


@final
class StepError(AttemptKernelError):
    """A step misused its context (an intent name used twice, an undeclared
    domain state, ...); the attempt fails."""


@final
class RunRefused(AttemptKernelError):
    """The run cannot start here: its id is taken by an unfinished run (recover
    it instead), or the log it would be written to breaks the kernel's rules."""


# --------------------------------------------------------------------------
# Public results
# --------------------------------------------------------------------------


@final
class RunControl:
    """Lets code outside the run cancel it at any moment (`cancel`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        # The executor's own wake-ups, called once by the first cancel: a
        # callback each instead of a task awaiting `wait` per run.
        self._listeners: list[Callable[[], None]] = []
        self.reason: str = ""
        """Why it was cancelled, as the record says (set by `cancel`)."""

    def cancel(self, reason: str = "") -> None:
        """Cancel the run: no new attempt starts, live ones end Cancelled or Indeterminate.

        The decision is recorded first (``run_cancel_requested``, with
        ``reason``, by default ``RunControl.cancel()``), so a crash before
        the run's end is written never resumes it. A waiting run ends at once.
        """
        if self._event.is_set():
            return
        self.reason = reason
        self._event.set()
        for listener in list(self._listeners):
            listener()

    @property
    def cancelled(self) -> bool:
        """True once `cancel` was called."""
        return self._event.is_set()

    async def wait(self) -> None:
        """Return once `cancel` was called."""
        await self._event.wait()


# --------------------------------------------------------------------------
# Admission to shared pools
# --------------------------------------------------------------------------


class PoolAdmission(Protocol):
    """Admits the attempts of steps that name a ``pool`` (docs/contracts.md,
    "Admission across workers"), in place of the executor's own
    ``admission_limit``.

    The executor calls `acquire` while the attempt is ``Pending`` and appends
    ``Admit`` only once it returned True; it calls `release` exactly once per
    slot taken, after the attempt's terminal record (``ended=True``), or,
    when the log failed before one could be written, with ``ended=False``:
    the attempt may still be ``Running`` in the log, so a store shared by
    many workers keeps the slot held until whoever ends the attempt (a
    takeover) frees it. All calls come from the executor's event loop.
    """

    async def acquire(self, run: str, step: Step, attempt: int) -> bool:
        """Take a slot of ``step.pool`` for the attempt: True once held, False when
        ``step.queue_deadline`` seconds passed first.

        Cancelled while waiting, it holds nothing.
        """
        ...

    def release(self, run: str, step: Step, attempt: int, *, ended: bool) -> None:
        """Free the attempt's slot (see the class doc for ``ended``)."""
        ...


# --------------------------------------------------------------------------
# The executor's step context
# --------------------------------------------------------------------------

_Effect: TypeAlias = Callable[[str, str, int, str, Perform], Awaitable[JSON]]
_SetState: TypeAlias = Callable[[str, str, int, str], None]


@final
class _Context:
    """The executor's `StepContext`: effects go through the executor's ledger and log."""

    __slots__ = ("_effect", "_set_state", "_key", "run", "step", "attempt", "input", "inputs")

    def __init__(
        self,
        effect: _Effect,
        set_state: _SetState,
        key: Callable[[str, str, str], str],
        run: str,
        step: str,
        attempt: int,
        input: JSON,
        inputs: Mapping[str, JSON],
    ) -> None:
        self._effect: Final = effect
        self._set_state: Final = set_state
        self._key: Final = key
        self.run: Final = run
        self.step: Final = step
        self.attempt: Final = attempt
        self.input: Final = input
        self.inputs: Final = inputs

    def idempotency_key(self, name: str) -> str:
        return self._key(self.run, self.step, name)

    async def effect(self, name: str, perform: Perform) -> JSON:
        return await self._effect(self.run, self.step, self.attempt, name, perform)

    def set_state(self, name: str) -> None:
        self._set_state(self.run, self.step, self.attempt, name)

    async def run_blocking(self, function: Callable[[], T]) -> T:
        return await in_thread(function)


async def in_thread(function: Callable[[], T]) -> T:
    """``function()`` in a daemon thread of its own, awaited: `asyncio.to_thread` with no pool.

    A pool's threads hold the process: ``asyncio.run`` waits for them as it
    closes, and the interpreter again as it exits. A stop (docs/contracts.md,
    "A graceful stop is not a cancel") ends a step's attempt after its grace
    whether or not its blocking call returned, so that call must not keep
    the stopped process alive, holding its log, for as long as it blocks.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():  # the step's task was cancelled meanwhile: nobody waits
            outcome()

    def work() -> None:
        try:
            result = context.run(function)
        except BaseException as error:  # noqa: BLE001  # handed to the awaiting step, as to_thread does
            answer = functools.partial(settle, functools.partial(done.set_exception, error))
        else:
            answer = functools.partial(settle, functools.partial(done.set_result, result))
        with contextlib.suppress(RuntimeError):  # the loop closed: the run has ended without it
            loop.call_soon_threadsafe(answer)

    threading.Thread(target=work, name="run_blocking", daemon=True).start()
    return await done


def _ended_before(run: str, step: str, number: int, name: str, when: str) -> str:
    """What an effect asked for by a branch of a step that outlived its attempt is told."""
    return (
        f"step {step!r} attempt {number} of run {run!r} ended before {when}: effect {name!r}"
        " belongs to an attempt that is over, so nothing more is written or sent for it"
        " (await every effect a step starts: a branch gathered beside one that raises"
        " goes on after the step ended)"
    )


@final
class _Done:
    """Awaitable that is done at once: what `Executor._durable` hands back after a synchronous flush."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_DONE: Final = _Done()


@final
class _Finished:
    """What a DAG run's loop waits on, in order: the name of a step whose task
    ended, "" when the run is cancelled, None when the executor stops.

    An `asyncio.Queue` without what a run never uses (a bound, counting of
    tasks done, several getters): one future per wait, no more.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[str | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: str | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> str | None:
        """The next item, once there is one (for one getter at a time)."""
        while not self._items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        return self._items.popleft()


# --------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class _Ok:
    value: JSON


@final
@dataclass(frozen=True, slots=True)
class _Raised:
    error: Exception


_StepOutput: TypeAlias = Union[_Ok, _Raised]


async def _raise(error: BaseException) -> JSON:
    """An awaitable that raises ``error``: what a step's call raised before it made one."""
    raise error

# Causes carry no data: one value of each serves every attempt's moves.
_ADMIT: Final = Admit()
_SUCCEED: Final = Succeed()
_FAIL: Final = Fail()
_QUEUE_DEADLINE_PASSED: Final = QueueDeadlinePassed()
_STEP_DEADLINE_PASSED: Final = StepDeadlinePassed()
_STEP_DEADLINE_MESSAGE: Final = deadline_message(_STEP_DEADLINE_PASSED)
_DISPATCH: Final = Dispatch()
_PLANNED: Final = Planned()


@final
class StepExited(Exception):
    """A step called ``sys.exit()``: its attempt's error (see `_exited`)."""


def _exited(exit: SystemExit) -> StepExited:
    """A step's ``sys.exit()`` as its error. Out of a task, SystemExit would break the
    event loop, whose teardown cancels every run it drives (a cancel recorded, that
    nobody decided) and ends the process mid-attempt."""
    return StepExited(
        f"the step called sys.exit({exit.code!r}) (SystemExit); a step ends when it returns"
        " or raises an Exception"
    )


async def _guarded(awaitable: Awaitable[JSON]) -> _StepOutput:
    # The step's own exceptions (even a TimeoutError it raises) become values,
    # so that a TimeoutError out of wait_for can only mean the step deadline.
    try:
        return _Ok(await awaitable)
    except Exception as error:  # noqa: BLE001  # a step may raise anything
        return _Raised(error)
    except SystemExit as exit:
        return _Raised(_exited(exit))


if sys.version_info >= (3, 11):

    @final
    class _Deadline:
        """One attempt's live deadline (loop time ``when``): the task it cancels
        when it passes, and that task's count of cancel requests when it was set."""

        __slots__ = ("when", "task", "cancelling", "passed", "group")

        def __init__(
            self, when: float, task: asyncio.Task[object], group: dict[_Deadline, None] | None
        ) -> None:
            self.when: Final = when
            self.task: Final = task
            self.cancelling: Final = task.cancelling()
            self.passed = False
            self.group: Final = group

    @final
    class _Deadlines:
        """Every live attempt's deadline on one timer of the event loop.

        A deadline means what ``asyncio.timeout`` means: when it passes, the
        task awaiting under it is cancelled, and the cancellation comes out
        of the awaited block as TimeoutError unless something else cancelled
        the task too (a cancel of the run wins, as it does under
        ``asyncio.timeout``). What differs is the bookkeeping. One
        ``asyncio.timeout`` per attempt cost a Timeout, a TimerHandle pushed
        on the loop's heap and cancelled, and that dead handle popped again
        when its time came, for deadlines that almost never pass
        (``benchmarks/bench_executor.py`` prints what each way costs an
        attempt). Here, deadlines of one length pass in
        the order they were set (the loop's clock never goes back), so each
        length keeps its live deadlines in an insertion-ordered dict: setting
        one is an insert and ending one a delete. One loop timer is armed for
        the earliest, and moved only when a shorter deadline comes; firing, it
        cancels the tasks whose deadlines passed and arms itself for the next.
        A deadline ended first is out of the dict, so it can never cancel what
        its task does next (the next attempt, or the step after the queue).
        """

        __slots__ = ("_loop", "_live", "_timer", "_armed")

        def __init__(self) -> None:
            self._loop: asyncio.AbstractEventLoop | None = None
            self._live: dict[float, dict[_Deadline, None]] = {}
            """The live deadlines by length, each dict in the order they pass."""
            self._timer: asyncio.TimerHandle | None = None
            self._armed = math.inf
            """The loop time the timer fires at (infinity: not armed)."""

        def start(self, seconds: float | None) -> _Deadline:
            """A deadline ``seconds`` from now for the current task (None: never;
            0 or less: at the loop's next iteration, as ``asyncio.timeout``)."""
            loop = asyncio.get_running_loop()
            if loop is not self._loop:  # a new loop: the old one's timer is gone with it
                self._loop, self._live, self._timer, self._armed = loop, {}, None, math.inf
            task = asyncio.current_task(loop)
            if task is None:
                raise RuntimeError("a deadline is set inside a task")
            if seconds is None:
                return _Deadline(math.inf, task, None)
            when = loop.time() + seconds
            group = self._live.get(seconds)
            if group is None:
                group = self._live[seconds] = {}
            deadline = _Deadline(when, task, group)
            group[deadline] = None
            if when < self._armed:
                self._arm(loop, when)
            return deadline

        def end(self, deadline: _Deadline) -> bool:
            """Clear ``deadline``: True when it passed and nothing else cancelled its
            task since it was set (the cancellation is the deadline's alone)."""
            if not deadline.passed:
                if deadline.group is not None:
                    del deadline.group[deadline]
                return False
            # as asyncio.timeout's exit: the cancel request made by the
            # deadline is taken back, whatever the block did with it
            return deadline.task.uncancel() <= deadline.cancelling

        def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._armed = when
            self._timer = loop.call_at(when, self._fire)

        def _fire(self) -> None:
            loop = self._loop
            assert loop is not None  # armed by start()
            # the loop runs a timer when its time is within the clock's
            # resolution: what it took for now has passed
            now = max(self._armed, loop.time())
            self._timer, self._armed = None, math.inf
            earliest = math.inf
            passed: list[_Deadline] = []
            for seconds, group in list(self._live.items()):
                for deadline in group:
                    if deadline.when > now:
                        earliest = min(earliest, deadline.when)
                        break
                    passed.append(deadline)
                for deadline in passed:
                    del group[deadline]
                    deadline.passed = True
                    deadline.task.cancel()
                passed.clear()
                if not group:
                    del self._live[seconds]
            if earliest < math.inf:
                self._arm(loop, earliest)

    async def _within(deadlines: _Deadlines, seconds: float, awaitable: Awaitable[T]) -> T:
        """Await with a deadline; TimeoutError when it passes (no extra task)."""
        deadline = deadlines.start(seconds)
        try:
            value = await awaitable
        except BaseException as interrupt:
            if deadlines.end(deadline) and type(interrupt) is asyncio.CancelledError:
                raise TimeoutError from interrupt
            raise
        deadlines.end(deadline)
        return value

    async def _guarded_within(
        deadlines: _Deadlines, seconds: float, awaitable: Awaitable[JSON]
    ) -> _StepOutput:
        """`_guarded` under a deadline, in one coroutine (one per attempt, not two).

        The step's own exceptions are caught inside; the deadline's
        cancellation is no Exception, so it still comes out as TimeoutError.
        """
        deadline = deadlines.start(seconds)
        try:
            output: _StepOutput = _Ok(await awaitable)
        except Exception as error:  # noqa: BLE001  # a step may raise anything
            output = _Raised(error)
        except SystemExit as exit:
            output = _Raised(_exited(exit))
        except BaseException as interrupt:
            if deadlines.end(deadline) and type(interrupt) is asyncio.CancelledError:
                raise TimeoutError from interrupt
            raise
        deadlines.end(deadline)
        return output

else:

    @final
    class _Deadlines:
        """On Python 3.10 (no `Task.uncancel`), each deadline is `asyncio.wait_for`'s."""

        __slots__ = ()

    async def _within(deadlines: _Deadlines, seconds: float, awaitable: Awaitable[T]) -> T:
        """Await with a deadline; asyncio.TimeoutError when it passes."""
        return await asyncio.wait_for(awaitable, seconds)

    async def _guarded_within(
        deadlines: _Deadlines, seconds: float, awaitable: Awaitable[JSON]
    ) -> _StepOutput:
        """`_guarded` under a deadline (wait_for needs the inner coroutine)."""
        return await asyncio.wait_for(_guarded(awaitable), seconds)


_NO_INPUTS: Final[Mapping[str, JSON]] = MappingProxyType({})
"""A code step's ``ctx.inputs``: a code step gets its inputs as arguments."""


def _report(workflow: Workflow, run: str, ledger: Ledger, status: RunStatus) -> RunReport:
    view = ledger.runs[run]
    if view.code:
        steps = tuple(outcome(c.step, view.steps.get(c.step)) for c in view.calls)
        return RunReport(
            run=run, workflow=workflow.name, status=status, steps=steps,
            result=view.result, error=view.error,
        )  # fmt: skip
    steps = tuple(outcome(s.name, view.steps.get(s.name)) for s in workflow.steps)
    return RunReport(run=run, workflow=workflow.name, status=status, steps=steps)


def recorded_report(log: LogSource, workflow: Workflow, run: str) -> RunReport:
    """The report of a run that finished in ``log``, rebuilt from its records."""
    ledger = Ledger(keep=frozenset({run}))
    ledger.feed(log.read())
    view = ledger.run(run)
    if view is None or view.status is None:
        raise RunRefused(f"run {run!r} has not finished in this log")
    return _report(workflow, run, ledger, view.status)


def _starts_allowed(view: RunView) -> bool:
    """No attempt starts in a run whose cancel or stop is recorded."""
    return not (view.cancel_requested or view.stop_requested)


@final
class Executor:
    """Runs workflows as attempts under an admission limit, writing one run log.

    ``admission_limit`` bounds how many attempts run at once, across all the
    runs this executor drives; the others wait `Pending` (each up to its
    step's ``queue_deadline``). Use one executor per event loop. ``progress``, if
    given, is called with a one-line description of every state change and
    wait (through an observer of its own).

    ``observers`` are told of every record this executor writes, once the
    log's ``append`` returned and the ledger applied it (`RunObserver`:
    metrics, traces, your own dashboard; a PostgreSQL worker's journal may
    still refuse a record it only queued, docs/executor.md says when); they are told, never asked, so they cannot change a run. The
    records are also logged through ``logging.getLogger("attempt_kernel.run")``
    (silent unless your application configures logging).

    When ``log`` can be read back (a `Journal` such as `RunLogWriter`), the
    executor reads it first, so that run ids stay unique in it; a log whose
    records break the kernel's rules is refused (`RunRefused`).

    ``pools``, if given, admits the attempts of every step that names a
    ``pool`` (a slot of that pool, shared with other processes), instead of
    ``admission_limit``; without it, such steps are admitted under
    ``admission_limit`` like the others.

    ``clock`` (seconds since the Unix epoch, like `time.time`) and ``sleep``
    (an awaitable pause, like `asyncio.sleep`) are what the wait before a
    retry uses (`RetryPolicy`): the wait runs from when the failed attempt
    ended, which for a resumed run is its terminal record's ``time_us``, so
    ``clock`` must tell the time the log's writer stamps records with. Tests
    pass fakes, to see the waits without waiting. A cancel of the run or a
    `stop` ends a wait at once, and no attempt starts.

    ``let_go_after``, if given, lets go of a code workflow's run that waits:
    once every branch of its function waits (`RunContext.sleep`,
    `RunContext.wait_for_signal`), no step is live, and no wake time comes
    within that many seconds, `run` returns a report with status
    ``waiting`` and writes nothing more (a PostgreSQL worker then releases
    the run until its wake time or a signal). Without it, the run waits in
    this process. It is a number of seconds from 0 up (``inf``: never);
    NaN or a negative number raises `ValueError`.

    ``on_wait``, if given, is called with the run and its `WaitStarted`
    record each time a code workflow's run begins to wait (the command
    line prints what the run waits for and the command that ends the wait),
    and for a resumed run with each wait it was left in (but one that ends
    at once: its signal came, its wake time passed), once its function has
    been checked against the log: a run whose code diverged is never said
    to wait.

    ``on_taken_up``, if given, is told what resuming a code workflow's run
    did before the run went on (its function checked against the log):
    the reconcilers asked and the orphaned attempts ended, as a `Recovery`
    (recovery itself leaves a code run's orphans to the executor).
    ``on_asked``, if given, is called with those reconcilers' answers
    (`Asked`) as soon as they come, before anything is written for them,
    as `recover` says of its own: a caller whose taking up then fails (a
    PostgreSQL worker that lost the run's lease) still knows what they said.
    """

    def __init__(
        self,
        log: RunLog,
        *,
        admission_limit: int = 8,
        progress: Callable[[str], None] | None = None,
        pools: PoolAdmission | None = None,
        on_taken_up: Callable[[Recovery], None] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        let_go_after: float | None = None,
        on_wait: Callable[[str, WaitStarted], None] | None = None,
        observers: Sequence[RunObserver] = (),
        on_asked: Callable[[Sequence[Asked]], None] | None = None,
    ) -> None:
        if type(admission_limit) is not int or admission_limit < 1:
            raise ValueError(f"admission_limit must be a positive integer, got {admission_limit!r}")
        if let_go_after is not None and not let_go_after >= 0:  # NaN too: it compares false
            raise ValueError(f"let_go_after must be None or a number of seconds from 0 up, got {let_go_after!r}")
        self._log: Final = log
        # A log that takes several records in one go gets the records that
        # are written back to back that way (one round trip to a database).
        self._batch: Final = log if is_batch_log(log) else None
        # A log whose durability can be awaited lets the other runs go on
        # while one waits, and share its flush (group commit).
        self._group: Final = log if is_group_commit_log(log) else None
        # A log that may have an effect wait before its Dispatched (a worker's,
        # while its heartbeat is late), awaited so that the other runs go on.
        self._gate: Final = log if is_dispatch_gate(log) else None
        self._ledger: Final = Ledger()
        self._limit: Final = admission_limit
        self._progress: Final = progress
        said: tuple[RunObserver, ...] = () if progress is None else (ProgressLines(progress),)
        self._observers: Final[tuple[RunObserver, ...]] = (*observers, *said)
        # Told last, as the last observer; it reads no time, so a run with no
        # other observer reads no clock per record.
        self._log_records: Final = LogRecords()
        self._pools: Final = pools
        self._on_taken_up: Final = on_taken_up
        self._on_asked: Final = on_asked
        self._clock: Final = clock
        self._sleep: Final = sleep
        # One limit for every run this executor drives; made on first use so
        # that it belongs to the running event loop.
        self._admission: asyncio.Semaphore | None = None
        self._deadlines: Final = _Deadlines()
        self._stop: asyncio.Event | None = None
        # Each driven run's wake-up on a stop, called once by the first `stop`
        # (see RunControl._listeners).
        self._stop_listeners: list[Callable[[], None]] = []
        self._grace = 0.0
        self._stop_reason = ""
        self._workflows: dict[str, Workflow] = {}
        self._let_go_after: Final = let_go_after
        self._on_wait: Final = on_wait
        self._controls: Final[dict[str, RunControl]] = {}
        """The runs this executor drives now, each with its control."""
        self._code_runs: Final[dict[str, CodeRun]] = {}
        self._unsent: Final[dict[tuple[str, str, int], dict[str, None]]] = {}
        """Each attempt's effects whose Dispatched waits to be made durable (`_effect`),
        by intent name: their sends have not begun, so an end of the attempt
        meanwhile (a branch of the step raised beside them) records them
        `Rejected` first (`_reject_unsent`), and they are never sent."""
        self._ending: Final[set[tuple[str, str, int]]] = set()
        """Attempts whose end has begun, by a cancellation, while their step's reconcilers
        are asked (`_attempt`): a branch of the step that outlived it asks for no new
        effect and sets no state then (`_closed`)."""
        if is_log_source(log):
            self._ledger.feed(log.read())
            if self._ledger.violation_count:
                first = self._ledger.violations[0]
                raise RunRefused(
                    f"the log breaks the kernel's rules (line {first.line}: {first.reason});"
                    " nothing is appended to it (see `attempt-kernel replay`)"
                )

    # ------------------------------------------------------------ logging

    def _write(self, run: str, change: Change) -> None:
        """Append, then apply, then tell the observers: the log never lags behind the ledger."""
        self._log.append(run, change)
        ledger = self._ledger
        ledger.apply_change(run, change)
        if ledger.violation_count:  # the executor asked the ledger first: a bug
            raise AssertionError(f"executor bug: {ledger.violations[0].reason}")
        observers = self._observers
        if observers:
            tell(observers, run, change, int(self._clock() * 1_000_000))
        if type(change) not in UNLOGGED:  # most records: no call at all
            self._log_records.log(run, change)

    def _durable(self, run: str) -> Awaitable[None]:
        """Awaited, returns once every record of ``run`` written so far survives a crash
        of the machine.

        The store's own ``durable`` is handed back to be awaited, not awaited
        in a coroutine of this method's: a step waits here for every effect,
        and each layer of coroutines is walked at each of its wake-ups. A
        store without it is flushed at once (so a failure raises from the
        call itself, still within the caller's statement).
        """
        group = self._group
        if group is None:
            self._log.flush()
            return _DONE
        return group.durable(run)

    def _move(self, run: str, step: str, cause: TransitionCause) -> AttemptState:
        """Through the kernel, into the log, and only then into the ledger."""
        change = self._ledger.propose_move(run, step, cause)
        if type(cause) is not Admit:  # every other cause ends the attempt
            self._calls_before_an_end(run)
            self._reject_unsent(run, step)
        self._write(run, change)
        return change.to_state

    def _reject_unsent(self, run: str, step: str) -> None:
        """Before the step's attempt ends: each of its effects still waiting for its
        Dispatched to be made durable was never sent, and now never will be
        (`_effect` sees it gone): recorded `Rejected`, as an interrupted wait
        records it (docs/contracts.md, "The write-ahead rule"), so that the
        attempt does not end with an effect outstanding that nobody sent. Not
        one whose key an earlier attempt left outstanding: that send may have
        happened, and the key stays outstanding.

        Called before the end is proposed where a Cancel's flag is read from
        the intent record (`_cancel`); a Fail, Succeed or deadline carries none.
        """
        if not self._unsent:
            return
        view = self._ledger.step(run, step)
        if view is None:
            return
        unsent = self._unsent.pop((run, step, view.attempt.number), None)
        if unsent is None:
            return
        for name in unsent:
            state = view.attempt.intents.get(name)
            if name not in view.superseded and state is not None and is_outstanding(state):
                self._intent(run, step, name, Reject())

    def _calls_before_an_end(self, run: str) -> None:
        """A code run's calls not written yet go in before an attempt's end: recovery
        replays calls and ends in log order, and a call made before an end must
        come before it (see `_coderun`, "Replay")."""
        if self._code_runs:
            code = self._code_runs.get(run)
            if code is not None:
                code.write_calls()

    def _write_all(self, run: str, changes: tuple[Change, ...], batch: BatchLog) -> None:
        """Append records written back to back in one go, then apply each: as `_write` does."""
        batch.append_all(run, changes)
        ledger = self._ledger
        for change in changes:
            ledger.apply_change(run, change)
        if ledger.violation_count:  # the executor asked the ledger first: a bug
            raise AssertionError(f"executor bug: {ledger.violations[0].reason}")
        observers = self._observers
        if observers:
            now_us = int(self._clock() * 1_000_000)
            for change in changes:
                tell(observers, run, change, now_us)
        for change in changes:
            if type(change) not in UNLOGGED:
                self._log_records.log(run, change)

    def _write_together(self, run: str, changes: tuple[Change, ...]) -> None:
        """Records written back to back (a code step's call and its first attempt's
        creation; an effect's Planned and Dispatched): in one append where the log
        can (`BatchLog`), else one by one."""
        if len(changes) == 1:
            self._write(run, changes[0])
        elif self._batch is not None:
            self._write_all(run, changes, self._batch)
        else:
            for change in changes:
                self._write(run, change)

    def _created_and_admitted(
        self, run: str, created: AttemptCreated, lead: tuple[Change, ...], batch: BatchLog
    ) -> None:
        """A new attempt admitted at once: ``lead`` (its creation, after its step's call
        when there is one) and its admission in one append.

        The admission goes through `transition` from ``Pending``, the state
        every created attempt is in; the ledger checks it as it applies it.
        """
        admit = new_transition(created.step, created.attempt, PENDING, _ADMIT, transition(PENDING, _ADMIT))
        self._write_all(run, (*lead, admit), batch)

    def _conclude(self, run: str, step: str, result: StepResult, cause: TransitionCause) -> None:
        """A step's result and the move it makes (`Succeed` or `Fail`), back to back.

        Raises `UnencodableRecord` (nothing written) for a result the log
        cannot encode.
        """
        self._calls_before_an_end(run)
        self._reject_unsent(run, step)
        change = self._ledger.propose_move(run, step, cause)
        batch = self._batch
        if batch is None:
            self._write(run, result)
            self._write(run, change)
        else:
            self._write_all(run, (result, change), batch)

    def _last_try(self, run: str, step: Step) -> bool:
        """Is the running attempt of ``step``, about to fail, the last its retry policy allows?

        Its failed result then says ``retry: false``: the decision that the step
        is done is a record, so recovery keeps it whatever policy the code passes
        then (a step's options are no part of its identity; docs/contracts.md,
        "Recovery runs the function again"), and a crash between the result and
        the attempt's end gives the step no try beyond its last.
        """
        view = self._ledger.step(run, step.name)
        return view is not None and view.tries + 1 >= step.retry.max_attempts

    def _intent(
        self, run: str, step: str, name: str, cause: IntentCause, result: JSON = None
    ) -> None:
        attempt = self._ledger.attempt(run, step)
        current = attempt.intents[name]
        to = intent_transition(current, cause)
        self._write(
            run,
            IntentChanged(
                step=step,
                attempt=attempt.number,
                name=name,
                from_state=current,
                cause=cause,
                to_state=to,
                result=result,
            ),
        )

    async def _effect(self, run: str, step: str, number: int, name: str, perform: Perform) -> JSON:
        """`StepContext.effect`: Planned, Dispatched and durable, then sent
        (the write-ahead rule).

        An effect an earlier attempt of the step confirmed is not sent again:
        its recorded result is returned (docs/contracts.md, "Effects happen at
        most once per key").
        """
        gate = self._gate
        if gate is not None:
            ready = gate.ready_to_dispatch(run)
            if ready is not None:
                # Nothing written yet: a cancel here sends nothing. Awaited before
                # the checks below, so that nothing comes between them and the write
                # (a twin effect of the same name gathered beside this one).
                await ready
        view = self._ledger.step(run, step)
        if (
            view is None
            or view.attempt.number != number
            or is_terminal(view.attempt.state)
            or (self._ending and (run, step, number) in self._ending)
        ):
            # A branch of the step that outlived it (gathered beside one that
            # raised, or never awaited): nothing may be written for an attempt
            # that has ended, or whose end has begun, and nothing is sent
            # (`_closed`, spelled out: every effect asks it).
            raise StepError(_ended_before(run, step, number, name, "it was asked for"))
        if name in view.attempt.intents:
            raise StepError(
                f"step {step!r} attempt {number}: intent {name!r} is used twice;"
                " give each effect of a step its own name"
            )
        if name in view.confirmed:
            return view.confirmed[name]
        key = self._key(run, step, name)
        planned = IntentPlanned(step=step, attempt=number, name=name, key=key)
        dispatched = IntentChanged(
            step=step, attempt=number, name=name, from_state=_PLANNED, cause=_DISPATCH,
            to_state=intent_transition(_PLANNED, _DISPATCH),
        )  # fmt: skip
        try:
            # back to back: in one append where the log can (the ledger checks
            # the pair as it applies it)
            self._write_together(run, (planned, dispatched))
        except DispatchRefused as refused:
            # Nothing was written or sent: not the step's failure. The executor
            # stops, and this attempt, waiting here until the stop
            # cancels it, ends as recovery would end it.
            self.stop(f"the log refused to dispatch {name!r} of {run}/{step}#{number}: {refused}", grace=0.0)
            await asyncio.Event().wait()
            raise AssertionError("a stopped executor left an attempt waiting") from refused
        # docs/contracts.md, "The write-ahead rule": Dispatched is durable
        # before the effect is sent
        attempt = (run, step, number)
        unsent = self._unsent.setdefault(attempt, {})
        unsent[name] = None
        try:
            await self._durable(run)
        except asyncio.CancelledError:
            if not self._take_unsent(attempt, unsent, name):
                raise  # the attempt's end came first and recorded it (`_reject_unsent`)
            # Interrupted (a cancel, a stop, a deadline) before the effect was
            # handed over: this attempt's send is known not to have happened
            # (docs/contracts.md, "The write-ahead rule"), so the attempt is not
            # left Indeterminate. Unless an earlier attempt left the same key
            # outstanding (a retry of idempotent effects): that send may have
            # happened, and Rejected would settle the key for both.
            # (An operator's reconciliation may have settled it meanwhile too.)
            state = view.attempt.intents.get(name)
            if name not in view.superseded and state is not None and is_outstanding(state):
                try:
                    self._intent(run, step, name, Reject())
                except RunLogError:
                    # The log failed: the cancellation still goes on to end the
                    # attempt, whose end meets the same failure there (outside
                    # the step's own code, which must not take it for its own).
                    pass
            raise
        except BaseException:  # the log failed: the attempt ends by that error
            self._take_unsent(attempt, unsent, name)
            raise
        if not self._take_unsent(attempt, unsent, name):
            # The attempt ended while this Dispatched waited, and its end
            # recorded it Rejected (or left an earlier attempt's key outstanding)
            raise StepError(_ended_before(run, step, number, name, "its Dispatched was durable"))
        try:
            value = await perform(key)
        except EffectRejected:
            if self._over(run, step, number):
                raise StepError(_ended_before(run, step, number, name, "its effect answered")) from None
            self._intent(run, step, name, Reject())
            raise
        if self._over(run, step, number):
            # Its end recorded the intent outstanding, and nothing may follow
            # an end: the key is left to reconcile, as the end said.
            raise StepError(_ended_before(run, step, number, name, "its effect answered"))
        try:
            self._intent(run, step, name, Confirm(), value)
        except UnencodableRecord as error:  # nothing was written: confirm without it
            self._intent(run, step, name, Confirm())
            raise StepError(
                f"effect {name!r} happened, but returned a value the run log cannot"
                f" encode ({error}); it is recorded Confirmed without its result"
            ) from None
        return value

    def _over(self, run: str, step: str, number: int) -> bool:
        """Has attempt ``number`` of ``step`` ended (a later one begun, or its run finished)?"""
        view = self._ledger.step(run, step)
        return view is None or view.attempt.number != number or is_terminal(view.attempt.state)

    def _closed(self, run: str, step: str, number: int) -> bool:
        """Is attempt ``number`` of ``step`` over (`_over`), or is its end under way
        (`_ending`: a cancel asks its reconcilers), so that nothing new is begun for it?"""
        return bool(self._ending) and (run, step, number) in self._ending or self._over(run, step, number)

    def _take_unsent(self, attempt: tuple[str, str, int], unsent: dict[str, None], name: str) -> bool:
        """Take effect ``name`` out of ``attempt``'s unsent ones (`_unsent`); False when
        the attempt's end took them all first (`_reject_unsent`)."""
        if self._unsent.get(attempt) is not unsent:
            return False
        del unsent[name]
        if not unsent:
            del self._unsent[attempt]
        return True

    def _key(self, run: str, step: str, name: str) -> str:
        """The idempotency key of an effect: the one the step used before, if any,
        else made from the names and the run's random part (`RunStarted.nonce`)."""
        view = self._ledger.runs[run]
        known = view.steps.get(step)
        if known is not None:
            key = known.keys.get(name)
            if key is not None:
                return key
        return idempotency_key(run, step, name, nonce=view.nonce)

    def _set_state(self, run: str, step: str, number: int, name: str) -> None:
        """`StepContext.set_state`: a declared domain state, into the log
        (docs/contracts.md, "Domain step states")."""
        if self._closed(run, step, number):  # a branch of the step that outlived it
            raise StepError(
                f"step {step!r} attempt {number} of run {run!r} ended before domain state"
                f" {name!r} was set: nothing more is written for an attempt that is over"
                " (await every branch a step starts)"
            )
        declared = self._ledger.runs[run].domain_states
        if name not in declared:
            raise StepError(
                f"step {step!r} attempt {number}: domain state {name!r} is not declared by"
                f" the workflow (declared: {', '.join(declared) or 'none'})"
            )
        self._write(run, DomainStateSet(step=step, attempt=number, state=name))

    async def _ask_reconcilers(
        self,
        run: str,
        step: Step,
        note: str,
    ) -> list[Asked]:
        """Ask the step's reconcilers about its attempt's outstanding intents and
        record what they found (`EffectUnknown` leaves an intent outstanding);
        return what was asked."""
        attempt = self._ledger.attempt(run, step.name)
        keys = self._ledger.runs[run].steps[step.name].keys
        questions = [
            (name, step.reconcilers[name])
            for name, state in attempt.intents.items()
            if is_outstanding(state) and name in step.reconcilers
        ]
        if not questions:
            return []
        findings = await ask_all([(r, keys[name]) for name, r in questions])
        # An effect that answered itself while its reconciler was asked (a branch
        # of the step that outlived it, when a cancel asks) has its own answer in
        # the log: the reconciler's, which came after it, records nothing.
        answered = [
            (name, finding)
            for (name, _), finding in zip(questions, findings)
            if is_outstanding(attempt.intents[name])
        ]
        asked = [
            Asked(run=run, step=step.name, attempt=attempt.number, intent=name, key=keys[name], finding=f)
            for name, f in answered
        ]
        try:
            for name, finding in answered:
                result: JSON = None
                match finding:
                    case EffectHappened():
                        cause: IntentCause = Confirm()
                        result = finding.result
                    case EffectNotHappened():
                        cause = Reject()
                    case EffectUnknown():
                        continue
                    case _:
                        assert_never(finding)
                current = attempt.intents[name]
                self._write(
                    run,
                    IntentReconciled(
                        step=step.name,
                        attempt=attempt.number,
                        name=name,
                        key=keys[name],
                        from_state=current,
                        cause=cause,
                        to_state=intent_transition(current, cause),
                        result=result,
                        by="reconciler",
                        note=note,
                    ),
                )
        except Exception:
            # The log failed (or refused an answer's result) before every answer was
            # in it: what the downstream system said would be lost with the error,
            # and the attempt may end Indeterminate for want of it. Said here, as a
            # takeover that fails says it.
            for one in asked:
                level, line = asked_line(one, completed=False, by="ending the attempt")
                self._log_records.say(level, line)
                if self._progress is not None:
                    self._progress(line)
            raise
        return asked

    def _asked_why(self, run: str) -> str:
        """The note a reconciler's answer is recorded with when a live attempt is ended
        from outside its step: why it was asked."""
        view = self._ledger.runs[run]
        if view.cancel_requested:
            return "asked when the run was cancelled, before ending the attempt"
        if view.stop_requested:
            return "asked when the run was stopped, before ending the attempt"
        return "asked when the attempt was cancelled, before ending it"

    def can_go_on(self, run: str) -> bool:
        """Could ``run``, unfinished and driven by no one here (a code run let go while
        it waited: status ``waiting``), go on now, by this executor's log: its cancel was
        decided, or one of its open waits ends at once (a signal it waits for was taken
        in, a wake time passed)? False for a run this executor drives or does not know."""
        view = self._ledger.runs.get(run)
        if view is None or view.finished or run in self._controls:
            return False
        return view.can_go_on(int(self._clock() * 1_000_000))

    def wakes_at(self, run: str) -> float | None:
        """When ``run``, unfinished and driven by no one here (a code run let go while it
        waited), comes to the soonest wake time of its open waits, in seconds since the
        epoch (this executor's clock); None when no open wait of it has one, or for a
        run this executor drives or does not know."""
        view = self._ledger.runs.get(run)
        if view is None or view.finished or run in self._controls:
            return None
        wakes = [wait.wake_us for wait in view.open_waits() if wait.wake_us is not None]
        return min(wakes) / 1_000_000 if wakes else None

    def deliver(self, run: str, change: Delivery) -> str | None:
        """Record an operator's change for ``run`` in this executor's log, now.

        For the one writer of a log (a process that holds a file log) taking
        in what an operator sent from outside: a signal (`SignalSent`, which
        wakes the run's waits for that name), a cancel (`RunCancelRequested`,
        recorded here, after which the run, if this executor drives it,
        ends as `RunControl.cancel` ends it) or a reconciliation
        (`IntentReconciled`). The record is durable when this returns
        None. A change that no longer applies (the run finished meanwhile,
        the same signal taken in twice, an intent reconciled already) is
        not written: the reason is returned.
        """
        why = refusal(self._ledger, run, change)
        if why is not None:
            return why
        if isinstance(change, IntentReconciled) and run in self._controls:
            step = self._ledger.runs[run].steps[change.step]
            if change.name in step.attempt.intents and not is_terminal(step.attempt.state):
                # Its effect may be in flight here: the attempt records its outcome.
                return (
                    f"intent {change.key!r} belongs to attempt #{step.attempt.number} of step"
                    f" {change.step!r}, which is live in this process"
                )
        self._write(run, change)
        self._log.flush()
        match change:
            case SignalSent():
                code = self._code_runs.get(run)
                if code is not None:
                    code.notify()
            case RunCancelRequested():
                control = self._controls.get(run)
                if control is not None:
                    control.cancel(change.reason)
            case IntentReconciled():
                pass
            case _:
                assert_never(change)
        return None

    def driving(self) -> frozenset[str]:
        """The runs this executor drives now."""
        return frozenset(self._controls)

    def _cancel_decided(self, run: str, reason: str) -> None:
        """Record the run's cancel decision, unless it is recorded already (`deliver`)."""
        if not self._ledger.runs[run].cancel_requested:
            self._write(run, RunCancelRequested(reason=reason))

    def _cancel(self, run: str, step: str) -> None:
        # docs/contracts.md, "Cancelled or Indeterminate: the intent record
        # decides": the flag comes from the intent record, never from where the
        # cancellation was caught (read once the unsent effects are Rejected)
        self._reject_unsent(run, step)
        self._move(run, step, self._ledger.cancel_cause(run, step))

    def _may_start(self, run: str) -> bool:
        """No attempt starts in a run whose cancel or stop is recorded (`_starts_allowed`)."""
        return _starts_allowed(self._ledger.runs[run])

    # ------------------------------------------------------------ stopping

    def stop(self, reason: str, *, grace: float = 5.0) -> None:
        """Stop gracefully: not a cancel (docs/contracts.md, "A graceful stop
        is not a cancel").

        Each run this executor drives records ``run_stop_requested``; no new
        attempt starts; live attempts get ``grace`` seconds to end, then end
        as recovery would end them (``Cancel`` with the intent record's
        flag). The runs stay unfinished (their reports say ``interrupted``),
        so that recovery resumes them. Call it from the event loop's thread.
        """
        self._grace = grace
        self._stop_reason = reason
        if self._stop is None:
            self._stop = asyncio.Event()
        if self._stop.is_set():
            return
        self._stop.set()
        for listener in list(self._stop_listeners):
            listener()

    def _listen(self, control: RunControl, on_cancel: Callable[[], None], on_stop: Callable[[], None]) -> None:
        """Call ``on_cancel`` once the run is cancelled and ``on_stop`` once the
        executor stops (at once for what already happened); `_unlisten` ends it."""
        control._listeners.append(on_cancel)  # pyright: ignore[reportPrivateUsage]
        self._stop_listeners.append(on_stop)
        if control.cancelled:
            on_cancel()
        if self.stopping:
            on_stop()

    def _unlisten(self, control: RunControl, on_cancel: Callable[[], None], on_stop: Callable[[], None]) -> None:
        control._listeners.remove(on_cancel)  # pyright: ignore[reportPrivateUsage]
        self._stop_listeners.remove(on_stop)

    @property
    def stopping(self) -> bool:
        """True once `stop` was called."""
        return self._stop is not None and self._stop.is_set()

    # ------------------------------------------------------------ one attempt

    async def _attempt(
        self,
        run: str,
        step: Step,
        number: int,
        context: _Context,
        admission: asyncio.Semaphore,
        called: StepCalled | None,
    ) -> None:
        """Run attempt ``number`` of ``step`` to a terminal state (the ledger has it).

        ``called``: a code step's call, not written yet (the step's first
        attempt writes it with its own creation, see `_coderun`).
        """
        name = step.name
        created = new_created(name, number)
        lead: tuple[Change, ...] = (created,) if called is None else (called, created)
        # A pooled step takes a shared slot instead of this executor's limit.
        pools = self._pools if step.pool is not None else None
        # Admitted at once (a free slot of this executor's limit): creation and
        # admission go to a batch log together, else one after the other.
        # (Nothing between here and the acquire awaits: the slot stays free.)
        free = pools is None and not admission.locked()
        batch = self._batch if free else None
        if batch is None:
            self._write_together(run, lead)
        try:
            if pools is not None:
                if not await pools.acquire(run, step, number):
                    self._move(run, name, _QUEUE_DEADLINE_PASSED)
                    return
            elif not free:  # a free slot is taken at once, without a timer
                await _within(self._deadlines, step.queue_deadline, admission.acquire())
            else:
                await admission.acquire()
        except asyncio.TimeoutError:
            self._move(run, name, _QUEUE_DEADLINE_PASSED)
            return
        except asyncio.CancelledError:
            if batch is not None:
                self._write_together(run, lead)
            self._cancel(run, name)
            raise
        try:
            if not self._may_start(run):
                if batch is not None:
                    self._write_together(run, lead)
                self._cancel(run, name)  # admitted just as the run was cancelled or stopped
                return
            if batch is None:
                self._move(run, name, _ADMIT)
            else:
                self._created_and_admitted(run, created, lead, batch)
            try:
                try:
                    running = step.run(context)
                except (Exception, SystemExit) as error:  # noqa: BLE001  # a step may raise anything
                    # raised by the call itself, before any coroutine (a step function
                    # called with an argument short): the attempt's failure, as a raise
                    # inside it would be
                    running = _raise(error)
                output = await _guarded_within(self._deadlines, step.step_deadline, running)
            except asyncio.TimeoutError:
                if step.retry.retry_on_timeout and not self._last_try(run, step):
                    self._move(run, name, _STEP_DEADLINE_PASSED)
                else:
                    # No try follows: that decision is a record, as a failed last
                    # try's is (`_last_try`), so recovery keeps it under any policy
                    self._conclude(
                        run, name,
                        StepResult(step=name, attempt=number, error=_STEP_DEADLINE_MESSAGE, retryable=False),
                        _STEP_DEADLINE_PASSED,
                    )  # fmt: skip
                return
            except asyncio.CancelledError:
                # docs/contracts.md, "Cancelled or Indeterminate: the intent
                # record decides": a cancel, a stop, recovery and a takeover all
                # ask the step's reconcilers about its effects in flight first,
                # each answer said as a takeover says it, so that an effect the
                # downstream system can account for never ends Indeterminate.
                # The attempt ends whatever comes of the asking (a second
                # cancellation, a log that fails). Meanwhile a branch of the step
                # that outlived it sends nothing new: an effect still waiting for
                # its Dispatched fsync is Rejected first, as the end would record
                # it (`_reject_unsent`), and no new effect begins (`_ending`).
                ending = (run, name, number)
                self._ending.add(ending)
                try:
                    self._reject_unsent(run, name)
                    for asked in await self._ask_reconcilers(run, step, self._asked_why(run)):
                        level, line = asked_line(asked)
                        self._log_records.say(level, line)
                        if self._progress is not None:
                            self._progress(line)
                finally:
                    self._ending.discard(ending)
                    self._cancel(run, name)
                raise
            match output:
                case _Ok():
                    try:
                        self._conclude(
                            run, name, new_result(name, number, output.value, None), _SUCCEED
                        )
                    except UnencodableRecord as error:  # nothing was written
                        message = f"the step returned a value the run log cannot encode: {error}"
                        self._conclude(
                            run, name,
                            StepResult(step=name, attempt=number, error=message, retryable=not self._last_try(run, step)),
                            _FAIL,
                        )  # fmt: skip
                case _Raised():
                    message = describe(output.error)
                    retryable = not isinstance(output.error, step.retry.non_retryable) and not self._last_try(run, step)
                    try:
                        self._conclude(
                            run, name,
                            StepResult(step=name, attempt=number, error=message, retryable=retryable),
                            _FAIL,
                        )  # fmt: skip
                    except UnencodableRecord as error:  # nothing was written: the message is too large
                        message = (
                            f"the step raised {type(output.error).__name__} with a message"
                            f" the run log cannot hold: {error}"
                        )
                        self._conclude(
                            run, name,
                            StepResult(step=name, attempt=number, error=message, retryable=retryable),
                            _FAIL,
                        )  # fmt: skip
                case _:
                    assert_never(output)
        finally:
            if pools is None:
                admission.release()
            else:
                # docs/contracts.md, "Admission across workers": the slot is
                # freed after the terminal record, never before (a sampler must
                # never see more Running than slots)
                ended = is_terminal(self._ledger.attempt(run, name).state)
                group = self._group
                try:
                    if ended and group is not None:
                        # A store that writes behind (the PostgreSQL journal's
                        # writer thread) may not hold the terminal record yet:
                        # the slot waits for it. If it never gets there, the
                        # attempt may still be Running in the log: the slot
                        # stays held for whoever ends it (a takeover).
                        try:
                            await group.durable(run)
                        except Exception:  # noqa: BLE001  # the run's own error is raised elsewhere
                            ended = False
                finally:  # cancelled meanwhile too: the record is handed over, in order
                    pools.release(run, step, number, ended=ended)

    # ------------------------------------------------------------ one step

    async def _wait_to_retry(self, run: str, step: Step, view: StepView) -> None:
        """Wait what is left of the wait before the step's next attempt (`retry_wait`).

        It runs from when the latest attempt ended. Read from the log (a
        resumed run), that is its terminal record's time, and only the rest
        is waited. Otherwise this executor wrote the end itself a moment ago,
        with no ``await`` since (its own changes carry no record time), so the
        whole wait is left. Never longer than the whole wait (a clock set
        back). A stop ends it at once (or finds it not begun), returning once
        the run has recorded the stop; a cancel cancels this task.
        """
        if not self._may_start(run):
            return
        delay = retry_wait(step.retry, run, view)
        ended = view.ended_us
        left = delay if ended is None else min(delay, ended / 1_000_000 + delay - self._clock())
        stop = self._stop
        assert stop is not None  # made by run() before any step starts
        if left > 0 and not stop.is_set():
            sleeping = asyncio.ensure_future(self._sleep(left))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((sleeping, stopping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeping.cancel()
                stopping.cancel()
        # run() records a stop when it takes it from its queue: return only
        # then, wait or no wait, so that no retry starts under a stop already
        # asked and the step's outcome never reaches run() first (it would
        # take the run for ended and finish it). A cancel cancels this task.
        while stop.is_set() and self._may_start(run):
            await asyncio.sleep(0)

    async def _drive(
        self,
        run: str,
        step: Step,
        input: JSON,
        inputs: Mapping[str, JSON],
        admission: asyncio.Semaphore,
        called: StepCalled | None = None,
    ) -> StepOutcome:
        """Attempts of one step until it succeeds or may not run again (the ledger says).

        ``called``: a code step's call, written with its first attempt (`_attempt`).
        """
        ledger = self._ledger
        while True:
            view = ledger.step(run, step.name)
            if view is not None:
                await self._wait_to_retry(run, step, view)
            if not self._may_start(run):
                # A step started just before a stop (or cancel) was recorded
                # creates no attempt after it (docs/contracts.md, "Decisions
                # are records").
                return outcome(step.name, view)
            number = 1 if view is None else view.attempt.number + 1
            context = _Context(self._effect, self._set_state, self._key, run, step.name, number, input, inputs)
            await self._attempt(run, step, number, context, admission, called)
            called = None
            view = ledger.step(run, step.name)
            assert view is not None  # the attempt was created above
            attempt = view.attempt
            if not self._may_start(run) or not may_run_again(
                step.retry,
                attempt.state,
                attempt.last_cause,
                view.tries,
                view.outstanding(),
                retryable=view.retryable,
            ):
                # A cancelled or stopped run starts no attempt, even where the
                # cancellation of this task was lost (3.10's wait_for can
                # swallow one).
                return outcome(step.name, view)

    # ------------------------------------------------------------ one run

    async def run(
        self,
        workflow: Workflow,
        run: str,
        *,
        control: RunControl | None = None,
        prior: Mapping[str, PriorStep] | None = None,
        input: JSON = None,
    ) -> RunReport:
        """Run ``workflow`` as run ``run`` to its end; return what each step did.

        ``input`` is recorded in the run's start record and handed to every
        step as ``ctx.input``. ``control.cancel()`` cancels the run at any
        moment. ``prior`` (from recovery) resumes a run already in the log:
        ``run_resumed`` is written, succeeded steps are not run again (their
        logged results feed their dependents), other steps continue their
        attempt numbering; a run resumed once its cancel is recorded ends
        cancelled (recovery closes such runs before they get here; a run
        let go while it waited and cancelled since may be resumed by the
        executor that let it go). Cancelling the task that awaits this coroutine
        also cancels the run (the decision and the run's end are logged
        first).

        Run ids are unique in a log the executor could read: starting a run
        that finished there runs nothing and returns its recorded report;
        one that has not finished is refused (`RunRefused`: recover it).

        An ``input`` the log cannot hold is refused before anything is
        written: `UnencodableRecord`, or its subclass `RecordTooLarge` when
        the start record would be longer than `MAX_RECORD_BYTES`; so is, on
        a PostgreSQL journal, a run id, workflow name or declared domain
        state holding a NUL or a lone surrogate. A step
        result over that limit fails its attempt instead (the error names
        the size and the limit), and so does an effect's result, which is
        recorded ``Confirmed`` without it.
        """
        check_workflow(workflow, "Executor.run")
        control = control if control is not None else RunControl()
        if run in self._controls:
            raise RunRefused(f"run {run!r} is being driven by this executor already")
        view = self._ledger.runs.get(run)
        if prior is not None and view is not None and view.cancel_requested and not view.finished:
            # docs/contracts.md, "Decisions are records": a resumed run whose cancel
            # was decided ends cancelled (the decision is not written twice)
            control.cancel("its cancel was decided before it was resumed")
        self._controls[run] = control
        refused = False
        try:
            if workflow.function is not None:
                return await self._run_code(workflow, run, control, prior is not None, input)
            return await self._run_dag(workflow, run, control, prior, input)
        except RunRefused:
            refused = True  # never driven here: whoever drives it is not released
            raise
        finally:
            del self._controls[run]
            self._code_runs.pop(run, None)
            released = self._ledger.runs.get(run)
            if self._observers and not refused and released is not None and not released.finished:
                # let go, stopped or cut off by its log: no record says this process is done with it
                status: Literal["waiting", "interrupted"] = "waiting" if released.is_waiting() else "interrupted"
                tell_released(self._observers, run, status, int(self._clock() * 1_000_000))

    async def _run_dag(
        self,
        workflow: Workflow,
        run: str,
        control: RunControl,
        prior: Mapping[str, PriorStep] | None,
        input: JSON,
    ) -> RunReport:
        ledger = self._ledger
        outcomes: dict[str, StepOutcome] = {}
        known = ledger.run(run)
        if prior is None:
            if known is not None:
                return self._known(workflow, run, known.finished)
            self._start_run(workflow, run, input)
        else:
            if known is None or not known.steps:
                ledger.resume(run, workflow.name, prior)
            self._write(run, RunResumed())
            input = ledger.runs[run].input if input is None else input
            for name in prior:
                step_def = workflow.by_name.get(name)
                view = ledger.step(run, name)
                if step_def is None or view is None:
                    continue
                attempt = view.attempt
                if not may_run_again(
                    step_def.retry,
                    attempt.state,
                    attempt.last_cause,
                    view.tries,
                    view.outstanding(),
                    retryable=view.retryable,
                ):
                    outcomes[name] = outcome(name, view)
        if self._admission is None:
            self._admission = asyncio.Semaphore(self._limit)
        if self._stop is None:
            self._stop = asyncio.Event()
        admission = self._admission
        tasks: dict[str, asyncio.Task[StepOutcome]] = {}
        # Scheduling is by counts, not by rescanning: each step waits for the
        # dependencies that have not succeeded yet; a finished task hands its
        # name to `finished` ("" : the run was cancelled; None: stopped).
        # Only steps with dependencies get these (a run of independent steps
        # would otherwise build two empty containers per step).
        unmet = {
            s.name: {d for d in s.after if d not in outcomes or not has_succeeded(outcomes[d].state)}
            for s in workflow.steps
            if s.after
        }
        dependents: dict[str, list[Step]] = {}
        for s in workflow.steps:
            for d in s.after:
                dependents.setdefault(d, []).append(s)
        finished = _Finished()

        def on_cancel() -> None:
            finished.put("")

        def on_stop() -> None:
            finished.put(None)

        self._listen(control, on_cancel, on_stop)
        loop = asyncio.get_running_loop()
        # One done-callback and one context for every step's task (each
        # add_done_callback would otherwise copy the context): a task is
        # named after its step, and hands that name to `finished`.
        callback_context = contextvars.copy_context()

        def step_done(task: asyncio.Task[StepOutcome]) -> None:
            finished.put(task.get_name())

        def start(step: Step) -> None:
            inputs = {d: outcomes[d].result for d in step.after}
            task = loop.create_task(self._drive(run, step, input, inputs, admission), name=step.name)
            task.add_done_callback(step_done, context=callback_context)
            tasks[step.name] = task

        failure: BaseException | None = None
        cancelled = stopped = False
        try:
            for step in workflow.steps:
                if step.name not in outcomes and not unmet.get(step.name):
                    start(step)
            while tasks:
                done = await finished.get()
                if done == "":
                    cancelled = True
                    # docs/contracts.md, "Decisions are records": the decision
                    # is a record before any attempt ends for it
                    self._cancel_decided(run, control.reason or "RunControl.cancel()")
                    break
                if done is None:
                    stopped = True
                    self._write(run, RunStopRequested(reason=self._stop_reason))
                    # docs/contracts.md, "A graceful stop is not a cancel":
                    # live attempts get a grace period, then end as recovery
                    # would end them; nothing new starts meanwhile.
                    await asyncio.wait(list(tasks.values()), timeout=self._grace)
                    break
                outcomes[done] = tasks.pop(done).result()
                if has_succeeded(outcomes[done].state):
                    for dependent in dependents.get(done, ()):
                        unmet[dependent.name].discard(done)
                        if not unmet[dependent.name] and dependent.name not in outcomes:
                            start(dependent)
        except asyncio.CancelledError as error:
            failure = error
            cancelled = True
            self._cancel_decided(run, "the task driving the run was cancelled")
            raise
        except BaseException as error:
            failure = error
            raise
        finally:
            # A cancel (control.cancel() or of this coroutine), a stop or a
            # failure: end every live attempt (each task logs its own Cancel),
            # and await every task, so none is left behind with an unread
            # exception.
            self._unlisten(control, on_cancel, on_stop)
            for task in tasks.values():
                task.cancel()
            step_errors: list[Exception] = []
            for name, task in tasks.items():
                try:
                    outcomes[name] = await task
                except asyncio.CancelledError:
                    outcomes[name] = outcome(name, ledger.step(run, name))
                except Exception as error:  # noqa: BLE001  # re-raised below
                    step_errors.append(error)
            # run_finished closes a run that ended or was cancelled; a stopped
            # run stays unfinished for recovery, and after a failure (the log
            # itself failing, most likely) recovery closes it.
            if (failure is None or cancelled) and not stopped and not step_errors:
                self._write(run, RunFinished())
            await self._durable(run)
            if failure is None and step_errors:
                raise step_errors[0]
        steps = tuple(
            outcomes[s.name] if s.name in outcomes else outcome(s.name, None) for s in workflow.steps
        )
        status: RunStatus = (
            "interrupted"
            if stopped
            else run_status(((s.state, s.outstanding) for s in steps), cancelled)
        )
        return RunReport(run=run, workflow=workflow.name, status=status, steps=steps)


    def _say_resumed_waits(self, run: str, on_wait: Callable[[str, WaitStarted], None]) -> None:
        """``on_wait`` for each wait a resumed run is in, but one that ends at once
        (its signal came already, its wake time passed, its run's cancel is recorded:
        `run` ends it cancelled)."""
        view = self._ledger.runs[run]
        if view.cancel_requested:
            return
        now_us = int(self._clock() * 1_000_000)
        for wait, ends in view.open_waits_ending(now_us):
            if ends:
                continue
            on_wait(run, WaitStarted(position=wait.position, signal=wait.signal, wake_us=wait.wake_us))

    def _known(self, workflow: Workflow, run: str, finished: bool) -> RunReport:
        """A fresh start of a run id the log already has: its recorded report if
        it finished, else `RunRefused` (run ids are unique in a log)."""
        if not finished:
            raise RunRefused(
                f"run {run!r} is already in the log and has not finished; recovery"
                " resumes it (`attempt-kernel recover LOG`, or `resume_log`)"
            )
        log = self._log
        if not is_log_source(log):
            raise RunRefused(f"run {run!r} already finished in this log")
        return recorded_report(log, workflow, run)

    def _start_run(self, workflow: Workflow, run: str, input: JSON) -> None:
        """The run's start record, with the random part of its keys."""
        self._write(
            run,
            RunStarted(
                workflow=workflow.name,
                input=input,
                domain_states=workflow.domain_states,
                version=workflow.version,
                nonce=secrets.token_hex(8),
                code=workflow.function is not None,
            ),
        )

    # ------------------------------------------------------------ a code run

    async def _run_code(
        self, workflow: Workflow, run: str, control: RunControl, resuming: bool, input: JSON
    ) -> RunReport:
        """Run a code workflow's function (see `_coderun`): live, or from the top
        against the log when ``resuming``."""
        function = workflow.function
        assert function is not None
        ledger = self._ledger
        known = ledger.run(run)
        if not resuming:
            if known is not None:
                return self._known(workflow, run, known.finished)
            self._start_run(workflow, run, input)
        elif known is None or not known.code:
            raise RunRefused(
                f"run {run!r} is not a code workflow's run in this log (or the log cannot be"
                " read back), so it cannot be resumed by running its function again"
            )
        else:
            input = known.input
        if self._admission is None:
            self._admission = asyncio.Semaphore(self._limit)
        if self._stop is None:
            self._stop = asyncio.Event()
        admission = self._admission

        def write(change: StepCalled | WaitStarted | WaitEnded) -> None:
            self._write(run, change)
            if self._on_wait is not None and isinstance(change, WaitStarted):
                self._on_wait(run, change)

        def drive(step: Step, called: StepCalled | None) -> Awaitable[StepOutcome]:
            return self._drive(run, step, input, _NO_INPUTS, admission, called)

        asked: list[Asked] = []
        orphans: list[OrphanEnded] = []

        async def end_orphan(step: Step) -> None:
            # as recovery ends an orphan: its reconcilers first, then the
            # Cancel the intent record decides
            answers = await self._ask_reconcilers(
                run, step, "asked by recovery before ending the orphaned attempt"
            )
            if answers and self._on_asked is not None:
                self._on_asked(answers)
            asked.extend(answers)
            view = ledger.runs[run].steps[step.name]
            before = view.attempt.state
            self._cancel(run, step.name)
            orphans.append(
                OrphanEnded(
                    run=run, step=step.name, attempt=view.attempt.number, from_state=before,
                    to_state=view.attempt.state, outstanding=view.outstanding(),
                )  # fmt: skip
            )

        run_view = ledger.runs[run]  # for may_start: one per run, never replaced
        code = CodeRun(
            run=run,
            input=input,
            ledger=ledger,
            defaults=workflow.defaults,
            domain_states=ledger.runs[run].domain_states,
            write=write,
            # and no cancel or let-go decided but not yet written
            may_start=lambda: _starts_allowed(run_view) and not (control.cancelled or let_go),
            drive=drive,
            end_orphan=end_orphan,
            replaying=resuming,
            clock=self._clock,
            sleep=self._sleep,
            quiet_after=self._let_go_after,
        )
        self._code_runs[run] = code
        let_go = False
        main = asyncio.get_running_loop().create_task(code.main(function))
        if resuming:
            try:
                await code.replay(main)
            except BaseException:
                main.cancel()
                for task in list(code.tasks):
                    task.cancel()
                await asyncio.gather(main, *code.tasks, return_exceptions=True)
                code.close()
                raise
            self._write(run, RunResumed())
            await code.take_up()
            if self._on_taken_up is not None and (asked or orphans):
                # told once what taking up wrote is durable: a store that fails it
                # then (a lost lease) fails it here, and ``on_asked`` was told
                await self._durable(run)
                self._on_taken_up(
                    Recovery(
                        torn_tail=None, side_file=None, orphans=tuple(orphans), runs=(),
                        asked=tuple(asked),
                    )  # fmt: skip
                )
            if self._on_wait is not None:
                # Only now, its code checked against the log: a run that diverged never waits.
                self._say_resumed_waits(run, self._on_wait)
        # One future wakes the run: its function ends, a cancel, a stop, or
        # the log failing under a step.
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def rouse(_: object = None) -> None:
            if not wake.done():
                wake.set_result(None)

        def quiet() -> None:
            nonlocal let_go
            if not main.done() and not control.cancelled and not self.stopping:
                let_go = True
                rouse()

        code.on_quiet = quiet
        main.add_done_callback(rouse)
        self._listen(control, rouse, rouse)
        code.on_failure = rouse
        if code.failure is not None:
            rouse()
        cancelled = stopped = False
        failure: BaseException | None = None
        try:
            await wake
            if code.failure is not None:
                failure = code.failure
            elif control.cancelled:
                # even when the function ended first: the decision came before
                # the run's end was written, and is recorded (RunControl.cancel)
                cancelled = True
                self._cancel_decided(run, control.reason or "RunControl.cancel()")
            elif let_go:
                pass  # it waits: nothing more is written, whoever drives it next goes on
            elif not main.done():
                stopped = True
                self._write(run, RunStopRequested(reason=self._stop_reason))
                if code.tasks:
                    await asyncio.wait(list(code.tasks), timeout=self._grace)
        except asyncio.CancelledError:
            cancelled = True
            self._cancel_decided(run, "the task driving the run was cancelled")
            failure = asyncio.CancelledError()
        finally:
            self._unlisten(control, rouse, rouse)
            # Steps still live (the run was cancelled or stopped, or the function
            # returned without awaiting them) end as a cancel ends them; waits
            # end with nothing written.
            let_go = let_go or not main.done()  # no wait ends, no step starts from here on
            for task in [*code.tasks, *code.waiters.values()]:
                task.cancel()
            if not main.done():
                main.cancel()
            if not main.done() or code.tasks or code.waiters:
                await asyncio.gather(main, *code.tasks, *code.waiters.values(), return_exceptions=True)
            elif not main.cancelled():
                main.exception()  # read here, as gather reads it: it is never left unretrieved
            code.close()
        if failure is None and code.failure is not None:
            failure = code.failure
        if failure is not None and not cancelled:
            await self._durable(run)
            raise failure
        view = ledger.runs[run]
        steps = tuple(code.outcome_of(c.step, view.steps.get(c.step)) for c in view.calls)
        result: JSON = None
        error: str | None = None
        if stopped or (let_go and not cancelled):
            await self._durable(run)
            status: RunStatus = "interrupted" if stopped else "waiting"
            return RunReport(run=run, workflow=workflow.name, status=status, steps=steps)
        if not cancelled:
            if main.cancelled():
                error = "the workflow function was cancelled"
            elif main.exception() is not None:
                error = describe(main.exception() or Exception())
            else:
                result = main.result()
                key = non_string_key(result)
                if key is not None:  # JSON would make it a string: not what was returned
                    result, error = None, (
                        "the workflow function returned a value the run log cannot encode:"
                        f" it holds the key {key[0]!r}, and JSON objects have string keys only"
                    )
        try:
            self._write(run, RunFinished(result=result, error=error))
        except UnencodableRecord as unencodable:  # nothing was written
            result = None
            error = f"the workflow function returned a value the run log cannot encode: {unencodable}"
            self._write(run, RunFinished(error=error))
        await self._durable(run)
        ended = ledger.runs[run].status
        assert ended is not None  # set by run_finished
        status = ended
        if failure is not None:  # the task driving the run was cancelled: say so to it
            raise failure
        return RunReport(
            run=run, workflow=workflow.name, status=status, steps=steps, result=result, error=error
        )


INBOX_POLL: Final = 0.2
"""Seconds between two looks at a file log's inbox while its runs are driven."""


def _take_inbox(
    deliver: _Deliver, log: RunLogWriter, progress: Callable[[str], None] | None, *, block: bool
) -> None:
    """Take in what operators left in the inbox of ``log`` (see `_inbox`), through
    ``deliver`` (`Executor.deliver`'s); a corrupt inbox is reported and left as it is."""
    try:
        with locked_inbox(log.path, create=False, block=block) as inbox:
            if inbox is not None and inbox.size() > 0:
                inbox.take_in(deliver, progress)
    except (RunLogError, OSError) as error:  # a corrupt inbox, a directory in its place
        if progress is not None:
            progress(f"the inbox was not taken in: {error}")


_Deliver: TypeAlias = Callable[[str, Delivery], Union[str, None]]
"""`Executor.deliver`, or what stands in for it (records a change; None, or why not)."""


async def _pump(deliver: _Deliver, log: RunLogWriter, progress: Callable[[str], None] | None) -> None:
    """Take the inbox in at once, then whenever it grows (a ``stat`` every `INBOX_POLL`)."""
    corrupt_at = -1  # the size at which it could not be taken in: said once, not every poll
    while True:
        size = inbox_size(log.path)
        if size > 0 and size != corrupt_at:
            try:
                with locked_inbox(log.path, create=False, block=False) as inbox:
                    if inbox is not None:  # None: a sender holds it; next time
                        inbox.take_in(deliver, progress)
            except (RunLogError, OSError) as error:  # a corrupt inbox, a directory in its place
                corrupt_at = size
                if progress is not None:
                    progress(f"the inbox was not taken in: {error}")
        await asyncio.sleep(INBOX_POLL)


@runtime_checkable
class _TakesIn(Protocol):
    """A journal whose operators' changes for a run this process holds wait apart from
    the run's records (`attempt_kernel.postgres.PgJournal.take_in`)."""

    def take_in(self, runs: Collection[str], deliver: Callable[[str, Delivery], str | None]) -> list[str]: ...


async def _pump_journal(
    deliver: _Deliver, journal: _TakesIn, runs: Collection[str], progress: Callable[[str], None] | None
) -> None:
    """Take in what waits for ``runs`` in ``journal``'s inbox at once, then every `INBOX_POLL`."""
    while True:
        _say_each(journal.take_in(runs, deliver), progress)
        await asyncio.sleep(INBOX_POLL)


def _say_each(lines: list[str], progress: Callable[[str], None] | None) -> None:
    if progress is not None:
        for line in lines:
            progress(line)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One run to drive: a workflow, the run id, a resume point, a supervisor."""

    workflow: Workflow
    run: str
    prior: Mapping[str, PriorStep] | None = None
    supervise: Callable[[RunControl], Awaitable[None]] | None = None
    """Plays the outside world (it may call ``control.cancel()``); stopped when the run ends."""
    input: JSON = None
    """The run's input (``ctx.input``); recorded in its start record."""


@final
class RunsStopped(AttemptKernelError):
    """`run_jobs` was stopped by a signal; the runs are unfinished, for recovery.

    ``signal`` is the signal's number (``signal.SIGINT``, ``signal.SIGTERM``),
    ``reports`` what each run had done (status ``interrupted``).
    """

    def __init__(self, signal_number: int, reports: list[RunReport]) -> None:
        name = signal.Signals(signal_number).name
        super().__init__(f"stopped by {name}; the runs are unfinished and recovery resumes them")
        self.signal: Final = signal_number
        self.reports: Final = reports


@final
class Stopper:
    """Stops, from any thread, the runs driven on another: as SIGINT or SIGTERM does
    under ``stop_on_signals``, for code that cannot take signals there (a thread
    of a web server that resumes a run, say).

    Hand it to `run_jobs`, `resume_log` or `resume_run` (``stopper=``), then call
    `stop` from anywhere: the executor stops gracefully (`Executor.stop`, with
    the call's ``grace``), the runs stay unfinished for recovery, and the call
    that drives them raises `RunsStopped` with ``signal_number``. A stop before
    the runs start stops them as they start; a second stop does nothing.
    """

    def __init__(self) -> None:
        self._lock: Final = threading.Lock()
        self._signal: int | None = None
        self._hooks: Final[list[Callable[[int], None]]] = []

    def stop(self, signal_number: int = signal.SIGTERM) -> None:
        """Stop the runs (``signal_number``: what `RunsStopped` will name).

        A number that is no signal's raises `ValueError` here, and nothing is stopped.
        """
        try:
            signal.Signals(signal_number)
        except ValueError:
            raise ValueError(
                f"Stopper.stop: {signal_number!r} is not a signal's number; give one (signal.SIGTERM,"
                " the default, or signal.SIGINT): RunsStopped names it and the command line exits"
                " 128 plus it"
            ) from None
        with self._lock:
            if self._signal is not None:
                return
            self._signal = signal_number
            hooks = list(self._hooks)
        for hook in hooks:
            hook(signal_number)

    @property
    def stopped(self) -> int | None:
        """The signal number `stop` was called with, or None."""
        return self._signal

    def _attach(self, hook: Callable[[int], None]) -> None:
        with self._lock:
            self._hooks.append(hook)
            stopped = self._signal
        if stopped is not None:
            hook(stopped)

    def _detach(self, hook: Callable[[int], None]) -> None:
        with self._lock:
            self._hooks.remove(hook)


@contextlib.contextmanager
def handling_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[int], None]) -> Generator[None, None, None]:
    """``handler(number)`` on ``loop`` for SIGINT and SIGTERM while inside; afterwards the
    handlers that were there before are back (a caller's own, or an ignored SIGINT):
    asyncio's ``remove_signal_handler`` alone leaves the default ones, which would
    kill the caller's process on its next SIGTERM."""
    numbers = (signal.SIGINT, signal.SIGTERM)
    before = {number: signal.getsignal(number) for number in numbers}
    for number in numbers:
        loop.add_signal_handler(number, handler, number)
    try:
        yield
    finally:
        for number in numbers:
            loop.remove_signal_handler(number)
            previous = before[number]
            if previous is not None:  # None: set outside Python, which cannot be put back
                signal.signal(number, previous)


def run_jobs(
    log: RunLog,
    jobs: list[Job],
    *,
    admission_limit: int = 8,
    progress: Callable[[str], None] | None = None,
    stop_on_signals: bool = False,
    grace: float = 5.0,
    on_wait: Callable[[str, WaitStarted], None] | None = None,
    stopper: Stopper | None = None,
    observers: Sequence[RunObserver] = (),
) -> list[RunReport]:
    """Drive ``jobs`` concurrently on a new event loop; return their reports in order.

    With ``stop_on_signals``, SIGINT and SIGTERM stop the runs gracefully
    (`Executor.stop` with ``grace`` seconds) and `RunsStopped` is raised once
    they are closed off; a second SIGINT exits the process at once (exit
    130), which recovery handles like a crash. ``stopper`` stops them the
    same way from another thread (`Stopper`). ``on_wait`` and ``observers``
    (told of every record the runs write): as `Executor` says. A resumed code workflow whose
    code no longer matches its log does not stop the others: once they are
    done, the first `WorkflowDiverged` is raised (nothing was written for
    that run; `resume_log` reports every divergence instead).
    """
    done = drive_jobs(
        log, jobs, admission_limit=admission_limit, progress=progress,
        stop_on_signals=stop_on_signals, grace=grace, on_wait=on_wait, stopper=stopper,
        observers=observers,
    )  # fmt: skip
    reports: list[RunReport] = []
    for item in done:
        if isinstance(item, WorkflowDiverged):
            raise item
        reports.append(item)
    return reports


def drive_jobs(
    log: RunLog,
    jobs: list[Job],
    *,
    admission_limit: int = 8,
    progress: Callable[[str], None] | None = None,
    stop_on_signals: bool = False,
    grace: float = 5.0,
    on_taken_up: Callable[[Recovery], None] | None = None,
    on_wait: Callable[[str, WaitStarted], None] | None = None,
    stopper: Stopper | None = None,
    let_go_after: float | None = None,
    on_diverged: Callable[[str], None] | None = None,
    observers: Sequence[RunObserver] = (),
    on_asked: Callable[[Sequence[Asked]], None] | None = None,
) -> list[RunReport | WorkflowDiverged]:
    """`run_jobs`, with a diverged job's `WorkflowDiverged` in its place among the
    reports (``on_taken_up``, ``on_asked``, ``on_wait``, ``let_go_after``,
    ``observers``: as `Executor` says).

    ``on_diverged`` is called with a run's id as soon as its code diverged
    (nothing was written for it, and nothing more will be), while the other
    runs go on, on the event loop's thread (the runs wait for it, so a let-go
    that may wait belongs on another thread). From then on this call takes in
    nothing for that run (its changes are the next holder's)."""
    caught: list[int] = []  # the stop's signal, from a signal or the stopper
    signalled: list[int] = []  # the signals themselves: a second one exits at once

    async def drive(executor: Executor, job: Job) -> RunReport | WorkflowDiverged:
        control = RunControl()
        supervisor = (
            asyncio.ensure_future(job.supervise(control)) if job.supervise is not None else None
        )
        try:
            return await executor.run(
                job.workflow, job.run, control=control, prior=job.prior, input=job.input
            )
        except WorkflowDiverged as diverged:
            return diverged
        finally:
            if supervisor is not None:
                supervisor.cancel()

    reports: list[RunReport | WorkflowDiverged] = []
    runs = [job.run for job in jobs]
    journal = log if isinstance(log, _TakesIn) else None  # its inbox: taken in for `runs`
    by_run = {job.run: job for job in jobs}

    async def main() -> None:
        # Returns None: on 3.11, asyncio.run formats its main task (result
        # included) while restoring the SIGINT handler; a 10,000-step report
        # would cost a noticeable repr.
        executor = Executor(
            log, admission_limit=admission_limit, progress=progress, on_taken_up=on_taken_up,
            on_wait=on_wait, let_go_after=let_go_after, observers=observers, on_asked=on_asked,
        )  # fmt: skip
        loop = asyncio.get_running_loop()

        def on_stopper(number: int) -> None:  # on the loop's thread
            if not caught:
                caught.append(number)
                executor.stop(signal.Signals(number).name, grace=grace)

        def on_signal(number: int) -> None:
            # The second signal: no more grace. Only signals count: the first
            # one after a stopper's stop (a lost hold, say) still gets the grace.
            if signalled:
                os._exit(128 + number)
            signalled.append(number)
            on_stopper(number)

        def from_thread(number: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the runs are done
                loop.call_soon_threadsafe(on_stopper, number)

        handling = handling_signals(loop, on_signal) if stop_on_signals else contextlib.nullcontext()
        with handling:
            if stopper is not None:
                stopper._attach(from_thread)  # pyright: ignore[reportPrivateUsage]
            # The runs' tasks, by run; a run that ended leaves it for `ended`.
            driving = {job.run: asyncio.ensure_future(drive(executor, job)) for job in jobs}
            ended: dict[str, RunReport | WorkflowDiverged] = {}
            news = loop.create_future()  # set once a run let go is taken up again

            def take_up_again(run: str) -> bool:
                # A code run let go while it waited (``let_go_after``) is still this
                # process's to drive: once its log lets it go on (a change taken in
                # for it, its signal or its cancel), it is taken up again, here, at
                # once. Left alone, the change would be recorded and the run would
                # wait on for whoever drives it next, though the wait it reported
                # had ended.
                done = ended.get(run)
                if not (
                    isinstance(done, RunReport)
                    and done.status == "waiting"
                    and not (caught or executor.stopping)
                    and executor.can_go_on(run)
                ):
                    return False
                job = by_run[run]
                del ended[run]
                # A resume: the run's records are in this executor's log already.
                again = Job(
                    workflow=job.workflow, run=run, prior=job.prior or {}, supervise=job.supervise,
                    input=job.input,
                )  # fmt: skip
                driving[run] = asyncio.ensure_future(drive(executor, again))
                return True

            def deliver(run: str, change: Delivery) -> str | None:
                why = executor.deliver(run, change)
                if why is None and take_up_again(run) and not news.done():
                    news.set_result(None)
                return why

            # A run let go at a wait with a wake time is taken up again at that time,
            # if this call still drives other runs then (nothing else would: a run
            # `run URL` started is no worker's).
            timers: list[asyncio.TimerHandle] = []

            def wake_later(run: str) -> None:
                at = executor.wakes_at(run)
                if at is not None:
                    timers.append(loop.call_later(max(at - time.time(), 0.0), on_wake, run, at))

            def on_wake(run: str, at: float) -> None:
                if time.time() < at:  # the loop's clock ran ahead of the log's
                    timers.append(loop.call_later(at - time.time() + 0.01, on_wake, run, at))
                elif take_up_again(run) and not news.done():
                    news.set_result(None)

            pump: asyncio.Task[None] | None = None
            try:
                while driving:
                    # Made after the runs' tasks, so its first take-in finds them driven.
                    if isinstance(log, RunLogWriter):
                        pump = asyncio.ensure_future(_pump(deliver, log, progress))
                    elif journal is not None:
                        pump = asyncio.ensure_future(_pump_journal(deliver, journal, runs, progress))
                    while driving:
                        await asyncio.wait([*driving.values(), news], return_when=asyncio.FIRST_COMPLETED)
                        if news.done():
                            news = loop.create_future()
                        for run, task in list(driving.items()):
                            if task.done():
                                del driving[run]
                                ended[run] = task.result()
                                if isinstance(ended[run], WorkflowDiverged) and on_diverged is not None:
                                    runs.remove(run)  # the pump's, and the last look's
                                    on_diverged(run)
                                    continue
                                # A change taken in as the run was let go (its report
                                # not in yet, or the executor still finishing the let-go)
                                # was recorded with no one to take the run up again.
                                if not take_up_again(run) and isinstance(ended[run], RunReport):
                                    wake_later(run)
                    if pump is not None:
                        pump.cancel()
                        await asyncio.gather(pump, return_exceptions=True)
                        pump = None
                        # Once more: for a file, waiting for the inbox's lock, just before
                        # the writer is let go (its owner then calls `settle_inbox`); for
                        # a journal, what came since the last look (a stopped run's
                        # change is recorded now, rather than at its next recovery). A
                        # run this takes up again is driven, and the inbox looked at,
                        # again.
                        if isinstance(log, RunLogWriter):
                            _take_inbox(deliver, log, progress, block=True)
                        elif journal is not None:
                            _say_each(journal.take_in(runs, deliver), progress)
                reports.extend(ended[job.run] for job in jobs)
            finally:
                for timer in timers:
                    timer.cancel()
                if pump is not None:
                    pump.cancel()
                    await asyncio.gather(pump, return_exceptions=True)
                if stopper is not None:
                    stopper._detach(from_thread)  # pyright: ignore[reportPrivateUsage]

    asyncio.run(main())
    if caught:
        raise RunsStopped(caught[0], [r for r in reports if isinstance(r, RunReport)])
    return reports
