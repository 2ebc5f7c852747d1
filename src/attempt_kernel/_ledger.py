"""The ledger: where every run, step, attempt and intent stands
(docs/design.md, "The ledger").

Theory of operation
-------------------
The executor (which writes a log), the replayer (which reads one) and
recovery (which resumes one) keep one model of run state, and this is it.
h11's ``_state.py`` calls this "Rule 2": the side that sends and the side
that receives feed the *same* state object. Here the executor builds a
change by asking the ledger (`attempt`, `cancel_cause`), appends it to the
log, then `apply`s it; the replayer `apply`s each record it reads; recovery
applies a whole log and turns the result into resume points.

House rules:

1. Every change goes through the kernel: an attempt's moves through
   `transition`, an intent's through `intent_transition`. The ledger never
   decides a state by itself.
2. Every rule *derived* from the tables lives here, once, as a ``match``
   closed by ``assert_never``: what counts as a try (`counts_as_try`), when a
   step may get another attempt (`may_run_again`), how long it waits for it
   (`retry_wait`, by the formula `retry_delay`), which idempotency keys are
   outstanding (`StepView.outstanding`), when an attempt needs an operator
   (`needs_reconciliation`), how a run ended (`run_status`). Everything else
   asks; nothing else classifies states.
3. A change that contradicts what the ledger knows is a *violation*, kept
   with the line it came from; the ledger then adopts what the change says,
   so one bad record gives one violation, not a cascade. The executor never
   produces one (it asks before it writes); if it did, that is a bug and it
   stops.
4. Memory follows live runs, not log length: when a run finishes its steps
   are dropped; its id, workflow and status stay (a few dozen bytes).

No I/O, no clock, no asyncio. Times are data: a record's ``time_us`` (when
it was written) is kept where a rule needs it (when a step's latest attempt
ended, for the wait before its retry); the executor, which has the clock,
does the waiting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import (
    ALL_STATES,
    PENDING,
    Admit,
    AttemptState,
    Cancel,
    Cancelled,
    Fail,
    Failed,
    IllegalTransition,
    Indeterminate,
    Pending,
    QueueDeadlinePassed,
    Running,
    StepDeadlinePassed,
    Succeed,
    Succeeded,
    TimedOut,
    TransitionCause,
    is_terminal,
    transition,
)
from ._codec import new_transition, state_name
from ._intent import (
    DISPATCHED,
    PLANNED,
    Abandoned,
    Confirmed,
    Dispatched,
    IllegalIntentTransition,
    IntentState,
    cancel_cause,
    intent_dispatched,
    intent_transition,
    is_outstanding,
    Planned,
    Rejected,
)
from ._records import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    CorruptLine,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    LogItem,
    Record,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    TornTail,
    WaitEnded,
    WaitStarted,
)
from ._workflow import RetryPolicy

MAX_VIOLATIONS_KEPT: Final = 1000
"""Violations beyond this many are counted, not kept (a garbage file has one per line)."""

RunStatus: TypeAlias = Literal[
    "succeeded", "failed", "cancelled", "needs-reconciliation", "interrupted", "waiting"
]
"""How a run ended. ``needs-reconciliation``: some step ended Indeterminate or
with an intent outstanding; an operator must ask the downstream systems.
``interrupted``: it was stopped (a signal) and stays unfinished until
recovery resumes it. ``waiting``: its driver let go of it while it waits
(for a signal, or a wake time far off), holding nothing; it stays
unfinished, and whoever drives it next takes the wait up."""

RunStanding: TypeAlias = Literal[
    "running", "waiting", "interrupted", "succeeded", "failed", "cancelled",
    "needs-reconciliation",
]  # fmt: skip
"""Where a run stands in a log, as `attempt-kernel runs` says it: ``running``
while a writer holds the log, ``waiting`` when it is unfinished and waits
(a sleep, or a signal) with no live attempt, ``interrupted`` when it is
unfinished (or reconciled) and recovery resumes it, else how it ended."""

# --------------------------------------------------------------------------
# The derived rules (rule 2 of the module docstring)
# --------------------------------------------------------------------------


def counts_as_try(state: AttemptState, cause: TransitionCause | None) -> bool:
    """Did an attempt that ended in ``state`` by ``cause`` use up one of ``max_attempts``?

    Only an attempt that ran and did not succeed counts: `Failed`, or
    `TimedOut` by its step deadline. A queue timeout never ran; a cancelled
    or `Indeterminate` attempt was stopped from outside, not by the step.
    """
    # Arms in the order of how often each state ends an attempt.
    match state:
        case Succeeded() | Pending() | Running() | Indeterminate() | Cancelled():
            return False
        case Failed():
            return True
        case TimedOut():
            match cause:
                case StepDeadlinePassed():
                    return True
                case QueueDeadlinePassed() | None:
                    return False
                case Admit() | Succeed() | Fail() | Cancel():
                    return False  # not a way into TimedOut: the kernel refuses it
                case _:
                    assert_never(cause)
        case _:
            assert_never(state)


def needs_reconciliation(state: AttemptState, outstanding: tuple[str, ...]) -> bool:
    """Must an operator ask the downstream systems before this step goes on?

    An ended attempt while one of its intents is still outstanding: an
    `Indeterminate` one always is until reconciled (docs/contracts.md,
    "Reconciliation"), another one may be (docs/contracts.md, "Retries and
    outstanding intents": the effect may have happened). A live attempt is not
    judged yet.
    """
    match state:
        case Succeeded() | Failed() | TimedOut() | Indeterminate() | Cancelled():
            return bool(outstanding)
        case Pending() | Running():
            return False
        case _:
            assert_never(state)


def may_run_again(
    policy: RetryPolicy,
    state: AttemptState,
    cause: TransitionCause | None,
    tries: int,
    outstanding: tuple[str, ...],
    *,
    retryable: bool = True,
) -> bool:
    """May a new attempt of a step start after one that ended in ``state``?
    (docs/contracts.md, "Retries and outstanding intents")

    ``cause`` moved the attempt into ``state``; ``tries`` counts the step's
    attempts that `counts_as_try`; ``outstanding`` are the ended attempt's
    intents still `Dispatched`; ``retryable`` is False when its step raised
    one of the policy's ``non_retryable`` types (`StepResult.retryable`).
    Whether the run itself was cancelled is the caller's question
    (`RunView.cancel_requested`).
    """
    match state:
        case Succeeded():
            return False
        case Indeterminate():
            # docs/contracts.md, "Reconciliation": never retried while an
            # intent is outstanding; once every one is reconciled the step gets
            # a new attempt. The Indeterminate attempt does not count against
            # max_attempts (it was stopped from outside, like a cancel).
            return retryable and not outstanding
        case Cancelled():
            # Stopped with nothing outstanding (by the table): may run again,
            # unless its step had raised a non-retryable error already (a
            # crash between the result and its Fail ends it Cancelled).
            return retryable
        case Failed() | TimedOut():
            if not retryable:
                return False  # the step raised a non_retryable type
            match cause:
                case QueueDeadlinePassed():
                    return False  # the step never ran; its deadline says it is too late
                case StepDeadlinePassed():
                    if not policy.retry_on_timeout:
                        return False
                case Fail() | None:
                    pass
                case Admit() | Succeed() | Cancel():
                    return False  # not a way into Failed/TimedOut: the kernel refuses it
                case _:
                    assert_never(cause)
            if outstanding and not policy.effects_idempotent:
                return False  # the effect may have happened; reconcile, do not resend
            return tries < policy.max_attempts
        case Pending() | Running():
            raise AssertionError(f"an attempt in {state!r} has not ended")
        case _:
            assert_never(state)


def retry_delay(policy: RetryPolicy, tries: int, *, run: str, step: str, attempt: int) -> float:
    """Seconds attempt ``attempt`` of ``step`` in ``run`` waits after ``tries`` counted tries.

    The formula of `RetryPolicy`: ``initial_interval * backoff_factor **
    (tries - 1)``, at most ``max_interval`` (None: 100 times
    ``initial_interval``), then moved by up to ``jitter`` of itself, by a
    fraction derived from a hash of (``run``, ``step``, ``attempt``): the same
    arguments give the same wait in every process, so a wait recomputed after
    a crash is the one the crashed process was waiting. No try yet
    (``tries`` < 1): no wait. A pure function of its arguments.
    """
    if tries < 1:
        return 0.0
    initial = policy.initial_interval
    ceiling = 100 * initial if policy.max_interval is None else policy.max_interval
    try:
        delay = min(initial * policy.backoff_factor ** (tries - 1), ceiling)
    except OverflowError:  # a factor raised that far passed any ceiling long ago
        delay = ceiling
    if not policy.jitter or not delay:
        return float(delay)
    # blake2b, not hash(): the same in every process (hash() is salted).
    name = json.dumps([run, step, attempt]).encode()
    digest = hashlib.blake2b(name, digest_size=8).digest()
    spread = int.from_bytes(digest, "big") / 2**64 * 2 - 1  # in [-1, 1)
    return float(delay * (1 + policy.jitter * spread))


def retry_wait(policy: RetryPolicy, run: str, step: StepView) -> float:
    """Seconds between the end of the step's latest attempt and the start of its next.

    Only an attempt that `counts_as_try` (the step's own failure) is followed
    by a wait (`retry_delay`); one stopped from outside (`Cancelled`, an
    `Indeterminate` one once reconciled) is followed by the next at once.
    Whether a next attempt may start at all is `may_run_again`'s question.
    """
    attempt = step.attempt
    if not counts_as_try(attempt.state, attempt.last_cause):
        return 0.0
    return retry_delay(policy, step.tries, run=run, step=step.name, attempt=attempt.number + 1)


def signals_taken(
    waits: Sequence[tuple[str | None, int | None]], untaken: Sequence[tuple[str, int | None]]
) -> list[bool]:
    """For each open wait ``(signal, wake_us)``, by position: does it take one of the
    ``untaken`` signals ``(name, sent_us)`` (in the order recorded) once a process takes
    the run up?

    As the resumed run's waits take them (`_coderun`): in position order, each
    wait the first signal of its name left, unless that one was recorded at or
    after the wait's wake time (the wait ended by its time; the signal stays
    for a later wait). One signal is taken by one wait: two waits open for the
    same name and one signal recorded, the second still waits.
    """
    left: dict[str, list[int | None]] = {}
    for name, sent_us in untaken:
        left.setdefault(name, []).append(sent_us)
    takes: list[bool] = []
    for signal, wake_us in waits:
        pool = None if signal is None else left.get(signal)
        if pool and not (pool[0] is not None and wake_us is not None and pool[0] >= wake_us):
            pool.pop(0)
            takes.append(True)
        else:
            takes.append(False)
    return takes


def has_succeeded(state: AttemptState | None) -> bool:
    """Did the step's last attempt succeed (so its dependents may start)?"""
    match state:
        case Succeeded():
            return True
        case (
            Pending() | Running() | Failed() | Indeterminate() | Cancelled() | TimedOut() | None
        ):
            return False
        case _:
            assert_never(state)


def deadline_message(cause: TransitionCause | None) -> str | None:
    """The error a step reports when its last attempt ended by a deadline."""
    match cause:
        case QueueDeadlinePassed():
            return "queue deadline passed"
        case StepDeadlinePassed():
            return "step deadline passed"
        case Admit() | Succeed() | Fail() | Cancel() | None:
            return None
        case _:
            assert_never(cause)


def run_status(
    steps: Iterable[tuple[AttemptState | None, tuple[str, ...]]], cancelled: bool
) -> RunStatus:
    """How a run ended, from each step's last state (None: never started) and
    outstanding keys, and whether its cancel was decided."""
    all_succeeded = True
    for state, outstanding in steps:
        if state is not None and needs_reconciliation(state, outstanding):
            return "needs-reconciliation"
        all_succeeded = all_succeeded and has_succeeded(state)
    if cancelled:
        return "cancelled"
    return "succeeded" if all_succeeded else "failed"


def code_run_status(
    steps: Iterable[tuple[AttemptState | None, tuple[str, ...]]], cancelled: bool, raised: bool
) -> RunStatus:
    """How a code workflow's run ended: as `run_status` says for what must be
    reconciled and for a cancel; otherwise by its function, which ``raised``
    or returned (a step that failed and that the function caught fails
    nothing)."""
    for state, outstanding in steps:
        if state is not None and needs_reconciliation(state, outstanding):
            return "needs-reconciliation"
    if cancelled:
        return "cancelled"
    return "failed" if raised else "succeeded"


# --------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------


@final
@dataclass(slots=True)
class AttemptView:
    """Where one attempt stands. Owned and changed by the ledger only."""

    number: int
    state: AttemptState
    last_cause: TransitionCause | None = None
    """The cause of its last transition (None while it never moved)."""
    intents: dict[str, IntentState] = field(default_factory=dict[str, IntentState])
    """Its intents' states, by intent name, in the order they were planned."""


@final
@dataclass(slots=True)
class StepView:
    """Where one step of a run stands: its latest attempt and what it left."""

    name: str
    attempt: AttemptView
    """The step's latest attempt."""
    tries: int = 0
    """Attempts that `counts_as_try`."""
    result: JSON = None
    """The latest attempt's returned value, once it returned."""
    error: str | None = None
    """The latest attempt's error, once it raised."""
    keys: dict[str, str] = field(default_factory=dict[str, str])
    """Idempotency key of each intent name, stable across attempts."""
    confirmed: dict[str, JSON] = field(default_factory=dict[str, JSON])
    """The result of each effect known to have happened, by intent name, from
    any attempt (docs/contracts.md, "Effects happen at most once per key": a
    later attempt reuses it instead of sending again)."""
    superseded: dict[str, int] = field(default_factory=dict[str, int])
    """Intents earlier attempts left outstanding, by name (how many): an
    idempotent step retries past them under the same key, so they stay
    outstanding until an outcome for that key is recorded."""
    retryable: bool = True
    """False when the latest attempt's step raised a ``non_retryable`` type
    (its `StepResult` says so): the step gets no new attempt."""
    ended_us: int | None = None
    """When the latest attempt ended: its terminal record's ``time_us``.
    None while it is live, or when the change was applied without a record
    time (`Ledger.apply_change`: the executor that applied it saw it end)."""
    position: int = 0
    """A code workflow's step: its position in the run (0 for a DAG step)."""

    def outstanding(self) -> tuple[str, ...]:
        """Keys still outstanding: the latest attempt's intents that are
        `Dispatched`, and those earlier attempts left behind (reconcile these)."""
        intents = self.attempt.intents
        superseded = self.superseded
        if not intents and not superseded:
            return ()
        # Plain loops: asked at every attempt's end, and a comprehension
        # costs a frame of its own (before Python 3.12).
        names: list[str] = []
        for name, state in intents.items():
            if is_outstanding(state):
                names.append(name)
        for name in superseded:
            if name not in names:
                names.append(name)
        if not names:
            return ()
        keys = self.keys
        return tuple([keys[n] for n in names])


@final
@dataclass(slots=True)
class WaitView:
    """One wait of a code run (`RunContext.sleep`, `RunContext.wait_for_signal`)."""

    position: int
    signal: str | None
    """The signal name it waits for (None: a sleep)."""
    wake_us: int | None
    """When it ends by itself (a sleep's wake time, a timeout); None: never."""
    started_us: int | None = None
    """When its wait_started record was written (records read from a log)."""
    ended: bool = False
    taken: int | None = None
    """The number of the signal it took (None: none, yet or ever)."""


@final
@dataclass(slots=True)
class SignalView:
    """One signal sent to a run (`SignalSent`), numbered 1, 2, 3, ... in the run."""

    number: int
    name: str
    payload: JSON
    id: str
    sent_us: int | None = None
    taken_at: int | None = None
    """The position of the wait that took it (None: not taken yet)."""


@final
@dataclass(slots=True)
class RunView:
    """Where one run stands."""

    run: str
    workflow: str | None = None
    """From its run_started record (None if the log has none)."""
    input: JSON = None
    domain_states: tuple[str, ...] = ()
    """The domain step state names its workflow declares (docs/contracts.md,
    "Domain step states")."""
    domain_state: str | None = None
    """The domain state a step set last."""
    cancel_requested: bool = False
    """A decision to cancel the run is recorded: no new attempt may start."""
    stop_requested: bool = False
    """A graceful stop is recorded and not yet followed by a resume."""
    finished: bool = False
    status: RunStatus | None = None
    """How it ended (`run_status`), once its run_finished record is applied."""
    attempts: int = 0
    """Attempts created, all steps together."""
    started_us: int | None = None
    """When its run_started record was written (records read from a log)."""
    ended_us: int | None = None
    """When its last run_finished record was written."""
    version: str = ""
    """Its workflow's version label (from run_started)."""
    nonce: str = ""
    """The random part of its idempotency keys (from run_started)."""
    code: bool = False
    """A code workflow's run: its steps have positions."""
    calls: list[StepCalled] = field(default_factory=list[StepCalled])
    """A code run's step calls, by position (``calls[p - 1]``)."""
    events: list[int] = field(default_factory=list[int])
    """A code run's calls and step ends in log order: ``p`` when position p
    was called, ``-p`` when an attempt of it ended (recovery hands results
    back to the code in this order). Dropped with its steps."""
    open_ends: set[int] = field(default_factory=set[int])
    """Indexes in `events` of step ends that left an effect outstanding."""
    at: list[StepCalled | WaitStarted] = field(default_factory=list[StepCalled | WaitStarted])
    """A code run's calls by position (``at[p - 1]``): its steps' and its waits'."""
    waits: dict[int, WaitView] = field(default_factory=dict[int, WaitView])
    """A code run's waits, by position."""
    signals: list[SignalView] = field(default_factory=list[SignalView])
    """Signals sent to the run, in the order recorded (``signals[n - 1]`` is number n).
    Kept after the run finishes, so that `attempt-kernel show` lists those never taken."""
    result: JSON = None
    """What a code workflow's function returned (kept for runs the ledger keeps)."""
    error: str | None = None
    """Why a code workflow's function raised, if it did."""
    steps: dict[str, StepView] = field(default_factory=dict[str, StepView])
    """Its steps, in the order they first appeared. Dropped once it finished,
    unless it finished needing reconciliation (kept for reconcile and resume)."""

    def outstanding(self) -> tuple[str, ...]:
        """Idempotency keys still outstanding in any of its steps."""
        return tuple(key for step in self.steps.values() for key in step.outstanding())

    def open_waits(self) -> list[WaitView]:
        """Its waits that have not ended, by position."""
        return [wait for wait in self.waits.values() if not wait.ended]

    def untaken(self, name: str) -> SignalView | None:
        """The first signal named ``name`` that no wait has taken yet."""
        for signal in self.signals:
            if signal.taken_at is None and signal.name == name:
                return signal
        return None

    def open_waits_taking(self) -> list[tuple[WaitView, bool]]:
        """Its open waits, by position, each with whether it takes a signal already
        recorded once a process takes the run up (`signals_taken`)."""
        opened = self.open_waits()
        takes = signals_taken(
            [(w.signal, w.wake_us) for w in opened],
            [(s.name, s.sent_us) for s in self.signals if s.taken_at is None],
        )
        return list(zip(opened, takes))

    def open_waits_ending(self, now_us: int) -> list[tuple[WaitView, bool]]:
        """Its open waits, by position, each with whether it ends at once when a process
        takes the run up: it takes a signal already recorded (`open_waits_taking`), or
        its wake time is at or before ``now_us``."""
        return [
            (w, took or (w.wake_us is not None and w.wake_us <= now_us)) for w, took in self.open_waits_taking()
        ]

    def ends_now(self, wait: WaitView, now_us: int) -> bool:
        """Does ``wait`` end at once: a signal it takes came already, or its wake time
        (microseconds since the epoch) is at or before ``now_us``?"""
        return (wait.signal is not None and self.untaken(wait.signal) is not None) or (
            wait.wake_us is not None and wait.wake_us <= now_us
        )

    def can_go_on(self, now_us: int) -> bool:
        """Could a run that waits go on now: its cancel came, or one of its open waits
        ends at once (`ends_now`)?"""
        return self.cancel_requested or any(self.ends_now(wait, now_us) for wait in self.open_waits())

    def is_waiting(self) -> bool:
        """Unfinished, with a wait open and no attempt live: it waits, holding nothing."""
        if self.finished or not any(not wait.ended for wait in self.waits.values()):
            return False
        return all(is_terminal(step.attempt.state) for step in self.steps.values())

    def standing(self) -> RunStanding:
        """Where the run stands for an operator (``running`` is the CLI's to say)."""
        if not self.finished:
            return "waiting" if self.is_waiting() else "interrupted"
        status = self.status
        assert status is not None  # set by run_finished
        if status == "needs-reconciliation" and not self.outstanding():
            # reconciled: recovery resumes it, unless its cancel was decided
            # (docs/contracts.md, "Decisions are records": a cancel is never
            # undone)
            return "cancelled" if self.cancel_requested else "interrupted"
        return status


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PriorStep:
    """What a log says about one step of a run being resumed, frozen: its last attempt and
    what it left (its state, the tries so far, a result or an error, its intents and their
    keys, the effects confirmed)."""

    last_attempt: int
    state: AttemptState
    last_cause: TransitionCause | None
    """The cause of the last attempt's last transition (None if it never moved)."""
    tries: int
    """Attempts that ran and ended Failed or TimedOut (`counts_as_try`)."""
    result: JSON = None
    error: str | None = None
    outstanding: tuple[str, ...] = ()
    """Idempotency keys of the last attempt's intents still outstanding."""
    intents: Mapping[str, IntentState] = field(default_factory=lambda: MappingProxyType({}))
    """The last attempt's intent states, by intent name."""
    keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The idempotency key of each intent name the step has used."""
    confirmed: Mapping[str, JSON] = field(default_factory=lambda: MappingProxyType({}))
    """The result of each effect known to have happened, by intent name."""
    retryable: bool = True
    """False when the last attempt's step raised a ``non_retryable`` type."""
    ended_us: int | None = None
    """When the last attempt ended (its terminal record's ``time_us``), so that
    a retry waits only what is left of its wait; None when unknown (the whole
    wait is waited again)."""


def snapshot(step: StepView) -> PriorStep:
    """Freeze a step's view into a resume point."""
    attempt = step.attempt
    return PriorStep(
        last_attempt=attempt.number,
        state=attempt.state,
        last_cause=attempt.last_cause,
        tries=step.tries,
        result=step.result if has_succeeded(attempt.state) else None,
        error=step.error,
        outstanding=step.outstanding(),
        intents=MappingProxyType(dict(attempt.intents)),
        keys=MappingProxyType(dict(step.keys)),
        confirmed=MappingProxyType(dict(step.confirmed)),
        retryable=step.retryable,
        ended_us=step.ended_us,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """A line of the log that breaks a rule, and which rule."""

    line: int
    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAttempt:
    """An attempt that ended needing reconciliation: ask about these keys."""

    run: str
    step: str
    attempt: int
    state: AttemptState
    line: int
    outstanding: tuple[str, ...]
    """Idempotency keys of the intents still ``Dispatched`` when it ended."""


def _position(view: RunView, step: str) -> int:
    """The position a code run's step id was called at (0: never called)."""
    _, sep, number = step.rpartition("@")
    at = view.at
    # Only ASCII digits no longer than the run's last position: ``str.isdigit``
    # also takes ``²``, which `int` refuses, and `int` refuses more than 4,300
    # digits; a forged step id may hold either, and is then no called step.
    if not sep or not (number.isascii() and number.isdigit()) or len(number) > len(str(len(at))):
        return 0
    position = int(number)
    if 0 < position <= len(at):
        call = at[position - 1]
        if isinstance(call, StepCalled) and call.step == step:
            return position
    return 0


def _where(run: str, change: AttemptCreated) -> str:
    """Where a created attempt belongs, for a violation's message (built only then)."""
    return f"step {change.step!r} of run {run!r}"


@final
class Ledger:
    """One model of where every run, step, attempt and intent stands.

    Feed it every change of a log, in order: `apply` for records read from a
    log (their line numbers go into violations), `apply_change` for a change
    the caller has just appended. Ask it with `attempt`, `step`, `runs`,
    `cancel_cause` and the derived rules of this module.
    """

    def __init__(self, *, keep: frozenset[str] = frozenset()) -> None:
        self._keep: Final = keep
        """Runs whose steps are kept after they finish (to show or report them)."""
        self.runs: Final[dict[str, RunView]] = {}
        """Every run seen, finished or not (finished ones without their steps)."""
        self.last_seq = 0
        self.records = 0
        self.unresolved_intents = 0
        """Intents now `Dispatched` with no recorded outcome."""
        self.indeterminate: Final[list[OpenAttempt]] = []
        self.to_reconcile: Final[list[OpenAttempt]] = []
        """Attempts that ended in another state with intents outstanding."""
        self.violations: Final[list[Violation]] = []
        self.violation_count = 0
        # Keyed by state class: hashing a dataclass instance runs Python code.
        self._counts: Final[dict[type, int]] = {type(s): 0 for s in ALL_STATES}
        self._expect_seq: int | None = 1
        self._line = 0
        self._time: int | None = None
        """The time_us of the record being applied (None: a change without one)."""
        self._proposed: AttemptTransitioned | None = None

    # ------------------------------------------------------------ questions

    def final_states(self) -> dict[AttemptState, int]:
        """How many attempts are in each state now, in the order of
        docs/contracts.md, "The attempt state machine"."""
        return {s: self._counts[type(s)] for s in ALL_STATES}

    def run(self, run: str) -> RunView | None:
        """The run's view, or None if the ledger has not seen it."""
        return self.runs.get(run)

    def live_runs(self) -> list[RunView]:
        """Runs that have not finished, in the order they first appeared."""
        return [view for view in self.runs.values() if not view.finished]

    def step(self, run: str, step: str) -> StepView | None:
        """The step's view, or None if it has no attempt yet (or its run finished)."""
        view = self.runs.get(run)
        return None if view is None else view.steps.get(step)

    def attempt(self, run: str, step: str) -> AttemptView:
        """The step's latest attempt; it must exist (the executor's question)."""
        return self.runs[run].steps[step].attempt

    def cancel_cause(self, run: str, step: str) -> Cancel:
        """The Cancel that ends the step's latest attempt: its flag comes from
        the intent record (docs/contracts.md, "Cancelled or Indeterminate: the
        intent record decides"), never from where a cancel was caught."""
        return cancel_cause(self.attempt(run, step).intents.values())

    # ------------------------------------------------------------ seeding

    def resume(self, run: str, workflow: str, steps: Mapping[str, PriorStep]) -> None:
        """Take up a run from its resume points (what recovery found in the log)."""
        view = self.runs.setdefault(run, RunView(run=run, workflow=workflow))
        for name, prior in steps.items():
            intents = dict(prior.intents)
            keys = dict(prior.keys)
            superseded: dict[str, int] = {}
            live = {keys.get(n) for n, state in intents.items() if is_outstanding(state)}
            by_key = {key: name for name, key in keys.items()}
            for key in prior.outstanding:
                if key in live:
                    continue
                owner = by_key.get(key)
                if owner is not None:  # left outstanding by an earlier attempt
                    superseded[owner] = superseded.get(owner, 0) + 1
                else:
                    # A resume point built by hand may list keys without
                    # intents: keep them outstanding, never forget one.
                    intents[key], keys[key] = DISPATCHED, key
            view.steps[name] = StepView(
                name=name,
                attempt=AttemptView(
                    number=prior.last_attempt,
                    state=prior.state,
                    last_cause=prior.last_cause,
                    intents=intents,
                ),
                tries=prior.tries,
                result=prior.result,
                error=prior.error,
                keys=keys,
                confirmed=dict(prior.confirmed),
                superseded=superseded,
                retryable=prior.retryable,
                ended_us=prior.ended_us,
            )

    # ------------------------------------------------------------ feeding

    def _violate(self, reason: str) -> None:
        self.violation_count += 1
        if len(self.violations) < MAX_VIOLATIONS_KEPT:
            self.violations.append(Violation(line=self._line, reason=reason))

    def feed(self, items: Iterable[LogItem]) -> TornTail | None:
        """Apply every item of a log, in order; return its torn tail, if any."""
        torn: TornTail | None = None
        change = self._change
        for item in items:
            match item:
                case Record():
                    # apply(item), inlined: this loop is replay's hot path
                    self.records += 1
                    self._line = item.line
                    self._time = item.time_us
                    expect = self._expect_seq
                    if expect is not None and item.seq != expect:
                        self._seq_violation(item.seq, expect)
                    self._expect_seq = item.seq + 1
                    self.last_seq = item.seq
                    change(item.run, item.change)
                case CorruptLine():
                    self.corrupt(item.line, item.reason)
                case TornTail():
                    torn = item
                case _:
                    assert_never(item)
        return torn

    def corrupt(self, line: int, reason: str) -> None:
        """A line that is no record at all: a violation; the sequence check resumes after it."""
        self._line = line
        self._violate(f"corrupt line: {reason}")
        self._expect_seq = None

    def apply(self, record: Record) -> None:
        """Check one record read from a log and update the model."""
        self.records += 1
        self._line = record.line
        self._time = record.time_us
        expect = self._expect_seq
        if expect is not None and record.seq != expect:
            self._seq_violation(record.seq, expect)
        self._expect_seq = record.seq + 1
        self.last_seq = record.seq
        self._change(record.run, record.change)

    def _seq_violation(self, seq: int, expect: int) -> None:
        kind = "a gap" if seq > expect else "a repeat"
        self._violate(f"sequence number {seq} where {expect} was expected ({kind})")

    def apply_change(self, run: str, change: Change) -> None:
        """Apply a change the caller has just appended (no line number to report).

        A transition that `propose_move` built a moment ago from this very
        ledger is applied without being checked again: the kernel checked it
        when it was proposed, against the state it now moves.
        """
        self._line = 0
        self._time = None
        proposed = self._proposed
        if proposed is not None and change is proposed:
            self._proposed = None
            step = self.runs[run].steps[proposed.step]
            self._move(run, step, proposed.cause, proposed.to_state)
            return
        self._change(run, change)

    def propose_move(self, run: str, step: str, cause: TransitionCause) -> AttemptTransitioned:
        """The change that ``cause`` makes to the step's latest attempt, through `transition`.

        Raises `IllegalTransition` (and nothing is proposed) for a pair the
        table refuses. The caller appends the change, then `apply_change`s it.
        """
        attempt = self.runs[run].steps[step].attempt
        before = attempt.state
        change = new_transition(step, attempt.number, before, cause, transition(before, cause))
        self._proposed = change
        return change

    def _change(self, run: str, change: Change) -> None:
        view = self.runs.get(run)
        if view is not None and view.finished:
            # docs/contracts.md, "Reconciliation": a run that ended needing
            # reconciliation takes its reconciliations, then may be resumed;
            # nothing else follows an end.
            kind = type(change)
            if not ((kind is IntentReconciled and view.steps) or kind is RunResumed):
                self._violate(f"record for run {run!r} after the run finished")
                return
        # Arms in the order of how often each change occurs in a log.
        match change:
            case AttemptTransitioned():
                self._transitioned(run, view, change)
            case AttemptCreated():
                self._created(run, view, change)
            case StepResult():
                step = self._live_step(run, view, change.step, change.attempt, "a step result")
                if step is not None:
                    step.result, step.error = change.value, change.error
                    step.retryable = change.retryable
            case StepCalled():
                self._called(run, view, change)
            case IntentChanged():
                self._intent_changed(run, view, change)
            case IntentPlanned():
                self._planned(run, view, change)
            case IntentReconciled():
                self._reconciled(run, view, change)
            case DomainStateSet():
                self._domain_state(run, view, change)
            case WaitStarted():
                self._wait_started(run, view, change)
            case WaitEnded():
                self._wait_ended(run, view, change)
            case SignalSent():
                self._signal(run, view, change)
            case RunStarted():
                if view is not None:
                    self._violate(f"run {run!r} started twice (or after its records)")
                else:
                    view = self.runs[run] = RunView(run=run)
                view.workflow, view.input = change.workflow, change.input
                view.domain_states = change.domain_states
                view.version, view.nonce, view.code = change.version, change.nonce, change.code
                view.started_us = self._time
            case RunCancelRequested():
                if view is None:
                    view = self.runs[run] = RunView(run=run)
                view.cancel_requested = True
            case RunStopRequested():
                if view is None:
                    view = self.runs[run] = RunView(run=run)
                view.stop_requested = True
            case RunResumed():
                self._resumed(run, view)
            case RunFinished():
                self._run_finished(run, view, change)
            case _:
                assert_never(change)

    def _called(self, run: str, view: RunView | None, change: StepCalled) -> None:
        """A code run's step call: positions are contiguous, one record each."""
        if view is None or not view.code:
            self._violate(
                f"step {change.step!r} called at position {change.position} in run {run!r},"
                " which did not start as a code workflow's run"
            )
            return
        expect = len(view.at) + 1
        if change.position != expect:
            self._violate(
                f"step {change.name!r} of run {run!r} called at position {change.position}"
                f" where {expect} was expected (positions go 1, 2, 3, ..., one record each)"
            )
            return
        if change.step != f"{change.name}@{change.position}":
            self._violate(
                f"step call at position {change.position} of run {run!r} names step"
                f" {change.step!r}; it must be {change.name + '@' + str(change.position)!r}"
            )
            return
        view.calls.append(change)
        view.at.append(change)
        view.events.append(change.position)

    def _wait_started(self, run: str, view: RunView | None, change: WaitStarted) -> None:
        """A code run's wait takes the next position, as a step call does."""
        what = "a sleep" if change.signal is None else f"a wait for signal {change.signal!r}"
        if view is None or not view.code:
            self._violate(
                f"{what} started at position {change.position} in run {run!r}, which did not"
                " start as a code workflow's run"
            )
            return
        expect = len(view.at) + 1
        if change.position != expect:
            self._violate(
                f"{what} of run {run!r} started at position {change.position} where {expect}"
                " was expected (positions go 1, 2, 3, ..., one record each)"
            )
            return
        if view.cancel_requested:
            self._violate(f"{what} of run {run!r} started after the run's cancel was requested")
        if change.signal is None and change.wake_us is None:
            self._violate(f"a sleep of run {run!r} at position {change.position} has no wake time")
        view.at.append(change)
        view.waits[change.position] = WaitView(
            position=change.position, signal=change.signal, wake_us=change.wake_us,
            started_us=self._time,
        )  # fmt: skip
        view.events.append(change.position)

    def _wait_ended(self, run: str, view: RunView | None, change: WaitEnded) -> None:
        """A wait ends once: by its wake time, or by taking a signal of its name not taken before."""
        wait = None if view is None else view.waits.get(change.position)
        if view is None or wait is None:
            self._violate(f"wait at position {change.position} of run {run!r} ended, but it never started")
            return
        if wait.ended:
            self._violate(f"wait at position {change.position} of run {run!r} ended twice")
            return
        number = change.signal
        if number is None:
            if wait.wake_us is None:
                self._violate(
                    f"wait at position {change.position} of run {run!r} ended by time, but it"
                    f" waits for signal {wait.signal!r} with no timeout"
                )
        else:
            signals = view.signals
            signal = signals[number - 1] if number <= len(signals) else None
            if signal is None:
                self._violate(
                    f"wait at position {change.position} of run {run!r} took signal {number},"
                    f" but the run has {len(signals)} signal(s)"
                )
            elif wait.signal != signal.name:
                self._violate(
                    f"wait at position {change.position} of run {run!r} took signal {number}"
                    f" ({signal.name!r}), but it waits for"
                    f" {'a wake time' if wait.signal is None else repr(wait.signal)}"
                )
            elif signal.taken_at is not None:
                self._violate(
                    f"wait at position {change.position} of run {run!r} took signal {number},"
                    f" which the wait at position {signal.taken_at} took already"
                )
            else:
                earlier = view.untaken(signal.name)
                if earlier is not None and earlier.number < number:
                    self._violate(
                        f"wait at position {change.position} of run {run!r} took signal"
                        f" {number} before signal {earlier.number} of the same name (signals"
                        " are taken in the order they were sent)"
                    )
                signal.taken_at = change.position
        wait.ended, wait.taken = True, number
        view.events.append(-change.position)

    def _signal(self, run: str, view: RunView | None, change: SignalSent) -> None:
        if view is None:
            self._violate(f"signal {change.name!r} sent to run {run!r}, which never started")
            return
        if change.payload is None:
            self._violate(f"signal {change.name!r} of run {run!r} carries null (a payload is never null)")
        for signal in view.signals:
            if signal.id == change.id:
                self._violate(
                    f"signal {change.name!r} of run {run!r} recorded twice (id {change.id!r})"
                )
                return
        view.signals.append(
            SignalView(
                number=len(view.signals) + 1, name=change.name, payload=change.payload,
                id=change.id, sent_us=self._time,
            )  # fmt: skip
        )

    def _created(self, run: str, view: RunView | None, change: AttemptCreated) -> None:
        if view is None:
            view = self.runs[run] = RunView(run=run)
        if view.cancel_requested:
            self._violate(
                f"attempt {change.attempt} of {_where(run, change)} created after the run's"
                " cancel was requested; a cancelled run starts no attempt"
            )
        elif view.stop_requested:
            self._violate(
                f"attempt {change.attempt} of {_where(run, change)} created after a stop was"
                " requested and before the run was resumed"
            )
        view.attempts += 1
        position = 0
        if view.code:
            at = view.at
            last = at[-1] if at else None
            # most often the step called last (its call was written with it)
            position = (
                len(at)
                if type(last) is StepCalled and last.step == change.step
                else _position(view, change.step)
            )
            if not position:
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created, but no"
                    " step_called record gave the step a position"
                )
        step = view.steps.get(change.step)
        # Every field given: the default factories (dict[str, X]()) cost a
        # generic-alias call each, and this runs once per attempt.
        attempt = AttemptView(number=change.attempt, state=PENDING, last_cause=None, intents={})
        if step is None:
            if change.attempt != 1:
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created before attempt 1"
                )
            view.steps[change.step] = StepView(
                name=change.step,
                attempt=attempt,
                tries=0,
                result=None,
                error=None,
                keys={},
                confirmed={},
                superseded={},
                retryable=True,
                ended_us=None,
                position=position,
            )
        else:
            previous = step.attempt
            if not is_terminal(previous.state):
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created while attempt"
                    f" {previous.number} is still {state_name(previous.state)}"
                )
            elif change.attempt != previous.number + 1:
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created after attempt"
                    f" {previous.number} (expected {previous.number + 1})"
                )
            elif has_succeeded(previous.state):
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created after attempt"
                    f" {previous.number} Succeeded; that step is done"
                )
            elif not step.retryable:
                # docs/run-log.md: a `retry: false` result ends the step, even
                # when a crash ended its attempt before the Fail was written
                self._violate(
                    f"attempt {change.attempt} of {_where(run, change)} created after attempt"
                    f" {previous.number}'s result said retry: false; that result ends the step"
                )
            if previous.intents:
                for name, state in previous.intents.items():
                    if is_outstanding(state):
                        step.superseded[name] = step.superseded.get(name, 0) + 1
            step.attempt = attempt
            step.result = step.error = None
            step.retryable, step.ended_us = True, None
        self._counts[Pending] += 1

    def _step(self, run: str, view: RunView | None, name: str, number: int) -> StepView | None:
        step = None if view is None else view.steps.get(name)
        if step is None or step.attempt.number != number:
            latest = "none" if step is None else str(step.attempt.number)
            self._violate(
                f"attempt {number} of step {name!r} of run {run!r} was never created"
                f" or is not the step's latest attempt (latest: {latest})"
            )
            return None
        return step

    def _live_step(
        self, run: str, view: RunView | None, name: str, number: int, what: str
    ) -> StepView | None:
        step = self._step(run, view, name, number)
        if step is None:
            return None
        state = step.attempt.state
        match state:
            case Running():
                return step
            case Pending() | Succeeded() | Failed() | Indeterminate() | Cancelled() | TimedOut():
                self._violate(
                    f"{what} for attempt {number} of step {name!r}, which is"
                    f" {state_name(state)}; only a Running attempt has them"
                )
                return None
            case _:
                assert_never(state)

    def _transitioned(self, run: str, view: RunView | None, change: AttemptTransitioned) -> None:
        step = self._step(run, view, change.step, change.attempt)
        if step is None:
            return
        attempt = step.attempt
        # States carry no data: same class, same state.
        if type(attempt.state) is not type(change.from_state):
            self._violate(
                f"transition {state_name(change.from_state)} -> {state_name(change.to_state)}"
                f" of attempt {change.attempt} of step {change.step!r} starts from"
                f" {state_name(change.from_state)}, but the attempt is {state_name(attempt.state)}"
            )
        else:
            try:
                expected = transition(change.from_state, change.cause)
            except IllegalTransition as error:
                self._violate(str(error))
            else:
                if type(expected) is not type(change.to_state):
                    self._violate(
                        f"{change.cause!r} from {state_name(change.from_state)} goes to"
                        f" {state_name(expected)}, but the record says"
                        f" {state_name(change.to_state)}"
                    )
            cause = change.cause
            match cause:
                case Admit() | Succeed() | Fail() | QueueDeadlinePassed() | StepDeadlinePassed():
                    pass
                case Cancel():
                    self._check_cancel(cause, attempt)
                case _:
                    assert_never(cause)
        self._move(run, step, change.cause, change.to_state)

    def _check_cancel(self, cause: Cancel, attempt: AttemptView) -> None:
        # docs/contracts.md, "The write-ahead rule": intent_dispatched is true
        # exactly when an intent is outstanding
        actual = intent_dispatched(attempt.intents.values())
        if cause.intent_dispatched == actual:
            return
        if actual:
            names = ", ".join(n for n, s in attempt.intents.items() if is_outstanding(s))
            self._violate(
                f"Cancel(intent_dispatched=False) while intent {names} is outstanding"
                " (Dispatched, unresolved): the attempt must end Indeterminate"
            )
        else:
            self._violate(
                "Cancel(intent_dispatched=True) but no intent of the attempt is"
                " outstanding: it must end Cancelled, not Indeterminate"
            )

    def _move(self, run: str, step: StepView, cause: TransitionCause, to: AttemptState) -> None:
        attempt = step.attempt
        counts = self._counts
        counts[type(attempt.state)] -= 1
        counts[type(to)] += 1
        attempt.state = to
        attempt.last_cause = cause
        if not is_terminal(to):
            return  # Admit: nothing was tried or left yet
        step.tries += counts_as_try(to, cause)
        step.ended_us = self._time
        outstanding = step.outstanding()
        if step.position:
            view = self.runs[run]
            view.events.append(-step.position)
            if outstanding:
                view.open_ends.add(len(view.events) - 1)
        if not needs_reconciliation(to, outstanding):
            return
        entry = OpenAttempt(
            run=run,
            step=step.name,
            attempt=attempt.number,
            state=to,
            line=self._line,
            outstanding=outstanding,
        )
        match to:
            case Indeterminate():
                self.indeterminate.append(entry)
            case Failed() | TimedOut() | Succeeded() | Cancelled() | Pending() | Running():
                self.to_reconcile.append(entry)
            case _:
                assert_never(to)

    def _planned(self, run: str, view: RunView | None, change: IntentPlanned) -> None:
        step = self._live_step(run, view, change.step, change.attempt, f"intent {change.name!r}")
        if step is None:
            return
        intents = step.attempt.intents
        if change.name in intents:
            self._violate(f"intent {change.name!r} planned twice in one attempt")
            return
        known = step.keys.setdefault(change.name, change.key)
        if known != change.key:
            self._violate(
                f"intent {change.name!r} of step {change.step!r} changed its idempotency key"
                f" between attempts ({known!r}, now {change.key!r}); keys must be stable"
            )
            step.keys[change.name] = change.key
        intents[change.name] = PLANNED

    def _intent_changed(self, run: str, view: RunView | None, change: IntentChanged) -> None:
        step = self._live_step(run, view, change.step, change.attempt, f"intent {change.name!r}")
        if step is None:
            return
        intents = step.attempt.intents
        current = intents.get(change.name)
        if current is None:
            self._violate(f"intent {change.name!r} changes before it was planned")
            return
        self._check_intent_move(current, change, f"intent {change.name!r} change", "the record")
        self.unresolved_intents += is_outstanding(change.to_state) - is_outstanding(current)
        intents[change.name] = change.to_state
        self._settle(run, step, change.name, change.to_state, change.result)

    def _settle(
        self, run: str, step: StepView, name: str, state: IntentState, result: JSON
    ) -> None:
        """Remember what is known of an effect across attempts
        (docs/contracts.md, "Effects happen at most once per key")."""
        match state:
            case Confirmed():
                step.confirmed[name] = result
            case Rejected():
                step.confirmed.pop(name, None)  # known not to have happened: send again
            case Planned() | Dispatched() | Abandoned():
                if result is not None:
                    self._violate(f"intent {name!r}: a result belongs to a Confirm only")
                return
            case _:
                assert_never(state)
        # An outcome for the key settles what earlier attempts left under it,
        # and the attempts listed for reconciliation list what is left.
        if step.superseded:
            self.unresolved_intents -= step.superseded.pop(name, 0)
        if not (self.indeterminate or self.to_reconcile):
            return
        left = step.outstanding()
        for entries in (self.indeterminate, self.to_reconcile):
            for i, entry in enumerate(entries):
                if entry.run != run or entry.step != step.name:
                    continue
                kept = tuple(k for k in entry.outstanding if k in left)
                if kept != entry.outstanding:
                    entries[i] = OpenAttempt(
                        run=run,
                        step=step.name,
                        attempt=entry.attempt,
                        state=entry.state,
                        line=entry.line,
                        outstanding=kept,
                    )

    def _check_intent_move(
        self,
        current: IntentState,
        change: IntentChanged | IntentReconciled,
        what: str,
        source: str,
    ) -> None:
        """The recorded intent move must start where the intent is and obey the table."""
        # States carry no data: same class, same state.
        if type(current) is not type(change.from_state):
            self._violate(
                f"{what} starts from {change.from_state!r}, but the intent is {current!r}"
            )
            return
        try:
            expected = intent_transition(current, change.cause)
        except IllegalIntentTransition as error:
            self._violate(str(error))
            return
        if type(expected) is not type(change.to_state):
            self._violate(
                f"{change.cause!r} from {current!r} goes to {expected!r},"
                f" but {source} says {change.to_state!r}"
            )

    def _reconciled(self, run: str, view: RunView | None, change: IntentReconciled) -> None:
        step = self._step(run, view, change.step, change.attempt)
        if step is None:
            return
        intents = step.attempt.intents
        current = intents.get(change.name)
        left_behind = change.name in step.superseded and (
            current is None or not is_outstanding(current)
        )
        if left_behind:
            # an earlier attempt's outstanding intent under this key
            current = DISPATCHED
        elif current is None:
            self._violate(f"reconciliation of intent {change.name!r}, which the attempt never planned")
            return
        known = step.keys.get(change.name)
        if known != change.key:
            self._violate(
                f"reconciliation of intent {change.name!r} names key {change.key!r}, but its"
                f" key is {known!r}"
            )
        self._check_intent_move(
            current, change, f"reconciliation of intent {change.name!r}", "the reconciliation"
        )
        # The attempt keeps its state, its intent moves (docs/contracts.md,
        # "Reconciliation").
        if not left_behind:
            self.unresolved_intents += is_outstanding(change.to_state) - is_outstanding(current)
            intents[change.name] = change.to_state
        self._settle(run, step, change.name, change.to_state, change.result)

    def _domain_state(self, run: str, view: RunView | None, change: DomainStateSet) -> None:
        step = self._live_step(run, view, change.step, change.attempt, "a domain state")
        if step is None or view is None:  # a step exists only in a known run
            return
        if change.state not in view.domain_states:
            declared = ", ".join(view.domain_states) or "none"
            self._violate(
                f"domain state {change.state!r} set by step {change.step!r} is not declared by"
                f" the run's workflow (declared: {declared})"
            )
        view.domain_state = change.state

    def _resumed(self, run: str, view: RunView | None) -> None:
        if view is None:
            self._violate(f"run {run!r} resumed before it started")
            return
        if view.finished:
            left = view.outstanding()
            if view.status != "needs-reconciliation" or left or view.cancel_requested:
                why = (
                    f"intents {', '.join(left)} are outstanding"
                    if left
                    else "its cancel was decided"
                    if view.cancel_requested
                    else "the run finished"
                )
                self._violate(f"run {run!r} resumed, but {why}")
                return
            view.finished, view.status = False, None
        view.stop_requested = False

    def _run_finished(self, run: str, view: RunView | None, change: RunFinished) -> None:
        if view is None:
            view = self.runs[run] = RunView(run=run)
        for name, step in view.steps.items():
            if not is_terminal(step.attempt.state):
                self._violate(
                    f"run {run!r} finished while attempt {step.attempt.number} of step"
                    f" {name!r} is still {state_name(step.attempt.state)}"
                )
        view.finished = True
        view.ended_us = self._time
        steps = ((step.attempt.state, step.outstanding()) for step in view.steps.values())
        if view.code:
            view.status = code_run_status(steps, view.cancel_requested, change.error is not None)
            view.error = change.error
            if run in self._keep:
                view.result = change.result
        else:
            view.status = run_status(steps, view.cancel_requested)
        if view.status != "needs-reconciliation" and run not in self._keep:
            view.steps = {}  # memory follows live runs; these keep what reconcile needs
            view.calls, view.events, view.open_ends = [], [], set()
            view.at, view.waits = [], {}
