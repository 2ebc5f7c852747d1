"""The intent record: a write-ahead record of each external side effect.

An *intent* is one side effect that a running attempt means to perform (send an
email, charge a card). Its life is a closed state machine (docs/contracts.md,
"The intent record")::

    Planned --Dispatch--> Dispatched --Confirm--> Confirmed
                                     --Reject--> Rejected
    Planned --Abandon--> Abandoned

Confirmed, Rejected and Abandoned are terminal. An intent is *outstanding*
while it is `Dispatched`: the effect may have happened and nobody knows yet.
The write-ahead rule (docs/contracts.md, "The write-ahead rule"): the
`Dispatched` record is durable in the run log before the effect is sent. Hence
`intent_dispatched` below, the only source of
``Cancel(intent_dispatched=...)``, is true exactly when one of an attempt's
intents is outstanding.

Rules of the intent machine live here, in `intent_transition`, and nowhere
else. Like the kernel, this module does no I/O, reads no clock and makes no
random ids: `idempotency_key` is a pure function of the step's identity.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable, Final, Union

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import Cancel
from ._errors import AttemptKernelError

_json_str: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
"""A string as JSON, the way `json.dumps` writes it (ASCII, escapes)."""

# --------------------------------------------------------------------------
# Intent states (docs/contracts.md, "The intent record": exactly five)
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Planned:
    """Recorded, not yet sent. Nothing external has happened."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatched:
    """Durably recorded as about to be sent: the effect may have happened."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Confirmed:
    """Terminal: the effect is known to have happened."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """Terminal: the effect is known not to have happened."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Abandoned:
    """Terminal: the intent was dropped before it was dispatched."""


IntentState: TypeAlias = Union[Planned, Dispatched, Confirmed, Rejected, Abandoned]
"""The closed union of intent states."""

PLANNED: Final = Planned()
DISPATCHED: Final = Dispatched()
CONFIRMED: Final = Confirmed()
REJECTED: Final = Rejected()
ABANDONED: Final = Abandoned()

# --------------------------------------------------------------------------
# Intent causes
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """The effect is about to be sent (made durable first: write-ahead)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Confirm:
    """The effect's outcome came back: it happened."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """The effect's outcome came back: it did not happen."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Abandon:
    """The intent is dropped before it was dispatched."""


IntentCause: TypeAlias = Union[Dispatch, Confirm, Reject, Abandon]
"""The closed union of intent causes."""

ALL_INTENT_STATES: Final[tuple[IntentState, ...]] = (
    PLANNED,
    DISPATCHED,
    CONFIRMED,
    REJECTED,
    ABANDONED,
)
ALL_INTENT_CAUSES: Final[tuple[IntentCause, ...]] = (
    Dispatch(),
    Confirm(),
    Reject(),
    Abandon(),
)


@final
class IllegalIntentTransition(AttemptKernelError):
    """``cause`` is not a legal move from the intent state ``from_state``."""

    __slots__ = ("from_state", "cause", "reason")

    def __init__(self, from_state: IntentState, cause: IntentCause, reason: str) -> None:
        # BaseException.__new__ has already stored the arguments in ``args``.
        self.from_state: Final = from_state
        self.cause: Final = cause
        self.reason: Final = reason

    def __str__(self) -> str:
        return (
            f"illegal intent transition: {self.cause!r} from {self.from_state!r}: "
            f"{self.reason}"
        )


_INTENT_TERMINAL_REASON: Final = (
    "a resolved or abandoned intent is final; plan a new intent instead"
)


def intent_transition(from_state: IntentState, cause: IntentCause) -> IntentState:
    """Return the intent state that ``cause`` moves ``from_state`` to.

    The four legal rows of docs/contracts.md, "The intent record", return;
    every other pair raises `IllegalIntentTransition` and changes nothing.
    """
    match from_state:
        # State: Planned
        case Planned():
            match cause:
                case Dispatch():
                    return DISPATCHED
                case Abandon():
                    return ABANDONED
                case Confirm() | Reject():
                    raise IllegalIntentTransition(
                        from_state,
                        cause,
                        "a Planned intent has not been sent, so it has no outcome;"
                        " Dispatch it first or Abandon it",
                    )
                case _:
                    assert_never(cause)
        # State: Dispatched (outstanding)
        case Dispatched():
            match cause:
                case Confirm():
                    return CONFIRMED
                case Reject():
                    return REJECTED
                case Dispatch():
                    raise IllegalIntentTransition(
                        from_state, cause, "the intent is already Dispatched"
                    )
                case Abandon():
                    raise IllegalIntentTransition(
                        from_state,
                        cause,
                        "a Dispatched intent may already have taken effect; it can"
                        " only be resolved by Confirm or Reject (or stay outstanding)",
                    )
                case _:
                    assert_never(cause)
        # Terminal states
        case Confirmed() | Rejected() | Abandoned():
            raise IllegalIntentTransition(from_state, cause, _INTENT_TERMINAL_REASON)
        case _:
            assert_never(from_state)


def is_outstanding(state: IntentState) -> bool:
    """True while the intent is `Dispatched`: sent, outcome unknown."""
    match state:
        case Dispatched():
            return True
        case Planned() | Confirmed() | Rejected() | Abandoned():
            return False
        case _:
            assert_never(state)


def intent_dispatched(intents: Iterable[IntentState]) -> bool:
    """Is one of an attempt's intents outstanding (`Dispatched`, unresolved)?

    The only source of ``Cancel(intent_dispatched=...)``: pass the states of
    all the attempt's intents.
    """
    return any(is_outstanding(state) for state in intents)


def cancel_cause(intents: Iterable[IntentState]) -> Cancel:
    """The Cancel that ends an attempt with these intent states
    (docs/contracts.md, "Cancelled or Indeterminate: the intent record
    decides").

    Executor and recovery both cancel through this one function, so the flag
    always comes from the intent record, never from where a cancellation was
    caught.
    """
    return Cancel(intent_dispatched=intent_dispatched(intents))


def idempotency_key(run: str, step: str, name: str, *, nonce: str = "") -> str:
    """The key of intent ``name`` of ``step`` in ``run``, the same for every attempt.

    Stable across attempts of the same step, so a downstream system can
    deduplicate a retried effect and an operator can reconcile an
    `Indeterminate` attempt by asking for this key. ``nonce`` is the run's
    random part (`RunStarted.nonce`): with it, two runs never share a key,
    even when two logs hold the same run id. Without it (logs written before
    runs had one) the key depends on the names alone.
    """
    # With a nonce, the parts go in as one JSON array: no name can contain
    # a separator that makes two effects' keys the same.
    # The array is written as json.dumps([nonce, run, step, name]) writes it
    # (", " between items, non-ASCII escaped), without its general machinery.
    text = (
        f"{run}\x00{step}\x00{name}"
        if not nonce
        else f"[{_json_str(nonce)}, {_json_str(run)}, {_json_str(step)}, {_json_str(name)}]"
    )
    digest = hashlib.sha256(text.encode()).hexdigest()
    return f"ak1-{digest[:32]}"
