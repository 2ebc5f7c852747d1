"""What a run-log record is: the changes it can carry, and the reader's items.

Pure data, and nothing else: no encoding (that is `_codec`), no storage
(`_logfile`), no rule of the kernel (`_ledger`). Every class is a closed,
frozen value, so the ledger can ``match`` over `Change` exhaustively.

Run-level decisions are records too (docs/contracts.md, "Decisions are
records"): a run's start (its workflow and input), a decision to cancel it, a
graceful stop, its resumption, an operator's reconciliation, and its end.
Whatever recovery decides, it decides from these alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from typing_extensions import TypeAlias, final

from ._attempt import AttemptState, TransitionCause
from ._intent import IntentState, IntentCause

JSON: TypeAlias = Union[None, bool, int, float, str, Sequence["JSON"], Mapping[str, "JSON"]]
"""A value the run log can carry: what a step returns and what it receives.

Containers are `Sequence` and `Mapping` (read-only, hence covariant), so a
step that returns ``dict[str, int]`` or ``list[str]`` type-checks where a
`JSON` is expected. Values read back from a log are plain ``dict`` and
``list``; narrow them with ``isinstance(value, dict)``. A value JSON cannot
carry (a set, NaN, an object) is refused when it is written.
"""

# --------------------------------------------------------------------------
# Changes: what a record says happened
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """A run of the workflow named ``workflow`` started with ``input``.

    Recovery resumes the run by that name; steps see ``input`` as
    ``ctx.input``. ``domain_states`` are the domain step state names the
    workflow declares (docs/contracts.md, "Domain step states"); a
    `DomainStateSet` naming another one is a violation.
    """

    workflow: str
    input: JSON = None
    domain_states: tuple[str, ...] = ()
    version: str = ""
    """The workflow's version label, as its definition gave it ("" if none)."""
    nonce: str = ""
    """A random part drawn when the run started; every idempotency key of the
    run is derived from it too, so two runs never share a key, even with the
    same run id in two logs ("" in logs written before keys had it)."""
    code: bool = False
    """True for a workflow written as code: its steps are called at run time
    and each has a position (`StepCalled`)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStopRequested:
    """A graceful stop was asked (a signal): not a cancel (docs/contracts.md,
    "A graceful stop is not a cancel").

    No new attempt starts; live ones end as recovery would end them; the run
    stays unfinished, and `RunResumed` takes it up again.
    """

    reason: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed:
    """Recovery took the unfinished run up again (after a crash, a stop, or
    the reconciliation of a run that had ended needing it)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunCancelRequested:
    """Someone decided to cancel the run (docs/contracts.md, "Decisions are
    records").

    Written before any attempt is ended for it, so a crash after this record
    can never resume the run: recovery ends its live attempts and closes it.
    """

    reason: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepCalled:
    """A code workflow called step ``name`` at ``position`` (1, 2, 3, ... per run).

    Written before the step's first attempt. ``step`` is the id its attempts
    are recorded under (``name@position``); ``digest`` is a digest of the
    JSON arguments, so that a re-run of the workflow's code that asks for
    something else at this position is caught (`WorkflowDiverged`).
    """

    step: str
    position: int
    name: str
    digest: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class WaitStarted:
    """A code workflow's function began to wait at ``position`` (positions are
    shared with its steps).

    `RunContext.sleep` writes ``signal`` None and ``wake_us``, when the run
    wakes up (microseconds since the Unix epoch). `RunContext.wait_for_signal`
    writes the ``signal`` name it waits for, and ``wake_us`` when its timeout
    passes (None: no timeout). A resumed run waits only for what is left.
    """

    position: int
    signal: str | None = None
    wake_us: int | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class WaitEnded:
    """The wait at ``position`` ended: by taking the run's signal number ``signal``
    (1, 2, 3, ... in the order the run's signals were recorded; the function
    gets its payload), or, ``signal`` None, because its wake time came (a
    sleep's end, or a timeout: the function gets None)."""

    position: int
    signal: int | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalSent:
    """Someone sent the run a signal named ``name`` carrying ``payload``.

    Signals are a mailbox: each is taken by one `WaitEnded`, in the order
    they were sent, by a wait for that name. ``payload`` is never null (a
    signal sent without one carries ``{}``), so a timeout's None is never
    mistaken for a signal. ``id`` is unique to the signal: one taken in
    twice (a crash between recording it and clearing where it waited to be
    taken in) is recorded once.
    """

    name: str
    payload: JSON
    id: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptCreated:
    """Attempt number ``attempt`` of ``step`` was created (in `Pending`)."""

    step: str
    attempt: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptTransitioned:
    """The attempt moved ``from_state`` --``cause``--> ``to_state``."""

    step: str
    attempt: int
    from_state: AttemptState
    cause: TransitionCause
    to_state: AttemptState


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentPlanned:
    """The attempt planned intent ``name`` with idempotency key ``key``."""

    step: str
    attempt: int
    name: str
    key: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentChanged:
    """Intent ``name`` of the attempt moved ``from_state`` --``cause``--> ``to_state``.

    A ``Confirm`` carries the effect's ``result``, so that a later attempt
    asking for the same effect gets it without sending the effect again.
    """

    step: str
    attempt: int
    name: str
    from_state: IntentState
    cause: IntentCause
    to_state: IntentState
    result: JSON = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentReconciled:
    """Someone asked the downstream system about an outstanding intent
    (docs/contracts.md, "Reconciliation").

    The intent moves ``from_state`` (``Dispatched``) --``cause``
    (``Confirm`` or ``Reject``)--> ``to_state``, whatever its attempt's state:
    an attempt that ended `Indeterminate` stays so. ``by`` says who decided
    (``operator``, ``reconciler``), ``note`` why; ``result`` is the confirmed
    effect's result, if known.
    """

    step: str
    attempt: int
    name: str
    key: str
    from_state: IntentState
    cause: IntentCause
    to_state: IntentState
    result: JSON = None
    by: str
    note: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DomainStateSet:
    """The running attempt set its workflow's domain step state to ``state``
    (docs/contracts.md, "Domain step states")."""

    step: str
    attempt: int
    state: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """The attempt's step returned ``value`` (``error`` is None) or raised ``error``.

    ``retryable`` is False when the step raised one of its retry policy's
    ``non_retryable`` types, or failed on the last attempt its policy allows:
    the step gets no new attempt, and the log says so for whoever resumes the
    run, whatever policy the code passes then. It belongs to a failure only.
    """

    step: str
    attempt: int
    value: JSON = None
    error: str | None = None
    retryable: bool = True

    def __repr__(self) -> str:
        # ``retryable`` shows only when False, as the log writes it: a result
        # reads in messages and tests as it did before the field existed.
        tail = "" if self.retryable else ", retryable=False"
        return (
            f"StepResult(step={self.step!r}, attempt={self.attempt!r}, value={self.value!r},"
            f" error={self.error!r}{tail})"
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished:
    """The executor is done with the run; no record of it may follow.

    A code workflow's run records what its function returned (``result``)
    or, when it raised, the error (``error``); a DAG run records neither.
    """

    result: JSON = None
    error: str | None = None


Change: TypeAlias = Union[
    RunStarted,
    RunCancelRequested,
    RunStopRequested,
    RunResumed,
    StepCalled,
    WaitStarted,
    WaitEnded,
    SignalSent,
    AttemptCreated,
    AttemptTransitioned,
    IntentPlanned,
    IntentChanged,
    IntentReconciled,
    DomainStateSet,
    StepResult,
    RunFinished,
]
"""The closed union of record changes."""

# --------------------------------------------------------------------------
# What a reader yields
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One decoded record of a run log."""

    line: int
    """Where it is: the line number in a file (1-based)."""
    seq: int
    time_us: int
    """When the record was written: microseconds since the Unix epoch (UTC)."""
    run: str
    change: Change


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CorruptLine:
    """A line in the log that is not a valid record; the reader goes on after it."""

    line: int
    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TornTail:
    """An unterminated last line (or a tail of NUL bytes): a crash mid-write.

    Everything before ``line`` is complete. ``offset`` is the byte where the
    torn tail starts; recovery cuts the file there and keeps the bytes aside.
    """

    line: int
    offset: int
    length: int


LogItem: TypeAlias = Union[Record, CorruptLine, TornTail]
"""What a reader yields, record by record."""
