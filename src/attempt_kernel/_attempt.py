"""The kernel: attempt states, transition causes and the transition function.

Theory of operation
-------------------
An *attempt* is one try of one workflow step. Its life is a closed state
machine of seven states (docs/contracts.md, "The attempt state machine")::

    Pending --Admit--> Running --Succeed--> Succeeded
                               --Fail--> Failed
                               --StepDeadlinePassed--> TimedOut
                               --Cancel(intent_dispatched=False)--> Cancelled
                               --Cancel(intent_dispatched=True)--> Indeterminate
    Pending --Cancel(intent_dispatched=False)--> Cancelled
    Pending --QueueDeadlinePassed--> TimedOut

Every other (state, cause) pair raises `IllegalTransition`.

House rules (after h11's ``_state.py``):

1. Every rule of the attempt state machine lives in this file, in
   `transition`. Nothing else decides where an attempt goes next.
2. The kernel does no I/O, reads no clock and makes no ids. It is a pure
   function of its two arguments.
3. A rejected call changes nothing: states are immutable and `transition`
   keeps no state of its own.
4. Every ``match`` has one subject, ends with ``case _: assert_never(x)`` and
   has no other wildcard, so that ``mypy --strict`` reports an added state or
   cause at each match that does not handle it.

States carry no data, so `transition` returns one shared instance per state
(``RUNNING`` and friends below) instead of building a new object per call: a
live attempt's state costs one reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Union

from typing_extensions import TypeAlias, assert_never, final

from ._errors import AttemptKernelError

# --------------------------------------------------------------------------
# States (docs/contracts.md, "The attempt state machine": exactly seven)
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Pending:
    """Created, waiting for admission under the executor's concurrency limit."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    """Admitted; the step's code is running."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Succeeded:
    """Terminal: the step completed and returned a result."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Failed:
    """Terminal: the step completed with an error."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Indeterminate:
    """Terminal: stopped mid side effect; what happened outside is unknown.

    Reached only by cancelling a `Running` attempt while one of its intents
    is outstanding (``Dispatched`` and unresolved). Operations alert on this
    count, so nothing ordinary may land here.
    """


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Cancelled:
    """Terminal: stopped by decision, with no dispatched intent outstanding."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOut:
    """Terminal: the queue deadline (from `Pending`) or the step deadline
    (from `Running`) passed."""


AttemptState: TypeAlias = Union[
    Pending, Running, Succeeded, Failed, Indeterminate, Cancelled, TimedOut
]
"""The closed union of attempt states. Users never extend it."""

# The shared instances that `transition` returns (see the module docstring).
PENDING: Final = Pending()
RUNNING: Final = Running()
SUCCEEDED: Final = Succeeded()
FAILED: Final = Failed()
INDETERMINATE: Final = Indeterminate()
CANCELLED: Final = Cancelled()
TIMED_OUT: Final = TimedOut()

# --------------------------------------------------------------------------
# Causes (exactly six kinds; Cancel carries the intent fact)
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """The executor admitted a `Pending` attempt to run."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Succeed:
    """The step returned a result."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Fail:
    """The step raised an error."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """The run was cancelled (by decision, or by recovery after a crash).

    ``intent_dispatched`` must come from the intent record: true exactly when
    one of the attempt's intents is outstanding (``Dispatched`` and
    unresolved). Never infer it from where the cancellation was caught.
    """

    intent_dispatched: bool

    def __post_init__(self) -> None:
        # `1` or `"yes"` would silently pick a branch of the table; refuse.
        if type(self.intent_dispatched) is not bool:
            raise TypeError(
                "Cancel(intent_dispatched=...) takes a bool decided from the "
                f"intent record, got {self.intent_dispatched!r} "
                f"({type(self.intent_dispatched).__name__})"
            )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class QueueDeadlinePassed:
    """A `Pending` attempt waited past its queue deadline."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepDeadlinePassed:
    """A `Running` attempt ran past its step deadline."""


TransitionCause: TypeAlias = Union[
    Admit, Succeed, Fail, Cancel, QueueDeadlinePassed, StepDeadlinePassed
]
"""The closed union of transition causes. Users never extend it."""

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@final
class IllegalTransition(AttemptKernelError):
    """``cause`` is not a legal move from ``from_state`` (the README's
    transition table).

    Attributes ``from_state`` and ``cause`` keep both inputs; ``reason`` says
    why the pair is rejected. The message is formatted only when read, so
    that rejecting stays cheap.
    """

    __slots__ = ("from_state", "cause", "reason")

    def __init__(
        self, from_state: AttemptState, cause: TransitionCause, reason: str
    ) -> None:
        # BaseException.__new__ has already stored the three arguments in
        # ``args``; skipping ``super().__init__`` keeps rejection cheap.
        self.from_state: Final = from_state
        self.cause: Final = cause
        self.reason: Final = reason

    def __str__(self) -> str:
        return (
            f"illegal transition: {self.cause!r} from {self.from_state!r}: "
            f"{self.reason}"
        )


_TERMINAL_REASON: Final = (
    "a terminal state has no outgoing transitions; start a new attempt instead"
)


# --------------------------------------------------------------------------
# The transition function: the whole table, one arm per legal row
# --------------------------------------------------------------------------


# The match's own answers, keyed by (state class, cause class, Cancel's flag
# or False): `_NEXT` for the legal pairs, `_REFUSED` (the reason) for the
# rest. Both are filled once at import by asking the match in `transition`
# about every state and cause value (`_remember_answers`, bottom of this
# file) and never written after, so the match stays the one place where a
# rule is written. They exist because CPython pays about 50 ns for each class
# pattern it tries: a lookup keyed by classes is cheaper than the up to eight
# patterns a pair can walk through. Anything else (a subclass, a value that is
# not a state or a cause) goes through the match.
_NEXT: Final[dict[tuple[type, type, bool], AttemptState]] = {}
_REFUSED: Final[dict[tuple[type, type, bool], str]] = {}


def transition(from_state: AttemptState, cause: TransitionCause) -> AttemptState:
    """Return the state that ``cause`` moves ``from_state`` to.

    The legal rows are exactly those of the README's transition table; every
    other pair raises `IllegalTransition` and changes nothing. Passing
    something that is not an `AttemptState` or a `TransitionCause` (a type
    error that mypy reports) raises ``AssertionError`` naming the value.
    """
    # The remembered answers (see _NEXT). Mutating a lookup line cannot change
    # a result, only skip the shortcut, so mutation testing leaves those four.
    flag = type(cause) is Cancel and cause.intent_dispatched  # pragma: no mutate
    key = (type(from_state), type(cause), flag)  # pragma: no mutate
    to = _NEXT.get(key)  # pragma: no mutate
    if to is not None:
        return to
    reason = _REFUSED.get(key)  # pragma: no mutate
    if reason is not None:
        raise IllegalTransition(from_state, cause, reason)
    # The match: legal rows of the transition table return, every other pair
    # raises.
    match from_state:
        # State: Pending
        case Pending():
            match cause:
                case Succeed() | Fail():
                    raise IllegalTransition(
                        from_state, cause, "a Pending attempt has not run; Admit it first"
                    )
                case StepDeadlinePassed():
                    raise IllegalTransition(
                        from_state,
                        cause,
                        "the step deadline applies to Running attempts;"
                        " a Pending one times out with QueueDeadlinePassed",
                    )
                case Admit():
                    return RUNNING
                case Cancel():
                    if cause.intent_dispatched:
                        # docs/contracts.md: Pending cannot have dispatched
                        # anything
                        raise IllegalTransition(
                            from_state,
                            cause,
                            "a Pending attempt cannot have dispatched an intent;"
                            " the caller's intent record is inconsistent"
                            " (an executor bug)",
                        )
                    return CANCELLED
                case QueueDeadlinePassed():
                    return TIMED_OUT
                case _:
                    assert_never(cause)
        # State: Running
        case Running():
            match cause:
                case Admit():
                    raise IllegalTransition(
                        from_state, cause, "the attempt is already Running"
                    )
                case QueueDeadlinePassed():
                    raise IllegalTransition(
                        from_state,
                        cause,
                        "the queue deadline applies to Pending attempts;"
                        " a Running one times out with StepDeadlinePassed",
                    )
                case Succeed():
                    return SUCCEEDED
                case Fail():
                    return FAILED
                case StepDeadlinePassed():
                    return TIMED_OUT
                case Cancel():
                    # docs/contracts.md, "Cancelled or Indeterminate: the
                    # intent record decides": the split is decided by the
                    # intent record alone
                    return INDETERMINATE if cause.intent_dispatched else CANCELLED
                case _:
                    assert_never(cause)
        # Terminal states: nothing leaves them
        case Succeeded() | Failed() | Indeterminate() | Cancelled() | TimedOut():
            raise IllegalTransition(from_state, cause, _TERMINAL_REASON)
        case _:
            assert_never(from_state)


def is_terminal(state: AttemptState) -> bool:
    """True for the five states that no cause leaves (all but Pending, Running)."""
    match state:
        case Pending() | Running():
            return False
        case Succeeded() | Failed() | Indeterminate() | Cancelled() | TimedOut():
            return True
        case _:
            assert_never(state)


# Every state and every cause value, in the order of docs/contracts.md, "The
# attempt state machine". The CLI and the diagrams walk these; tests prove them
# complete against hand-written lists and against the unions themselves.
ALL_STATES: Final[tuple[AttemptState, ...]] = (
    PENDING,
    RUNNING,
    SUCCEEDED,
    FAILED,
    INDETERMINATE,
    CANCELLED,
    TIMED_OUT,
)
ALL_CAUSES: Final[tuple[TransitionCause, ...]] = (
    Admit(),
    Succeed(),
    Fail(),
    Cancel(intent_dispatched=False),
    Cancel(intent_dispatched=True),
    QueueDeadlinePassed(),
    StepDeadlinePassed(),
)


def _remember_answers() -> None:
    for state in ALL_STATES:
        for cause in ALL_CAUSES:
            key = (type(state), type(cause), type(cause) is Cancel and cause.intent_dispatched)
            try:
                _NEXT[key] = transition(state, cause)
            except IllegalTransition as refusal:
                _REFUSED[key] = refusal.reason


_remember_answers()
