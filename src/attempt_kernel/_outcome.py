"""What a run reports: each step's outcome and the run's, as values.

Pure data built from the ledger's views; no I/O, no asyncio. The executor
returns these, and a code workflow's failed step carries one (`StepFailed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from typing_extensions import final

from ._attempt import AttemptState
from ._ledger import RunStatus, StepView, deadline_message, has_succeeded
from ._records import JSON


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """How a step ended in a run: its last attempt's state and what it left behind."""

    step: str
    state: AttemptState | None
    """The last attempt's state, or None if the step never started."""
    attempts: int
    result: JSON = None
    error: str | None = None
    outstanding: tuple[str, ...] = ()
    """Idempotency keys of intents still outstanding: reconcile these."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """What a run did, step by step.

    A code workflow's run lists its steps by position (``name@position``)
    and carries what its function returned (``result``) or, when it
    raised, why (``error``).
    """

    run: str
    workflow: str
    status: RunStatus
    steps: tuple[StepOutcome, ...]
    result: JSON = None
    error: str | None = None


def describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def outcome(name: str, view: StepView | None) -> StepOutcome:
    """A step's outcome as its ledger view says it (never started: no view)."""
    if view is None:
        return StepOutcome(step=name, state=None, attempts=0)
    attempt = view.attempt
    if has_succeeded(attempt.state):
        return _new_outcome(name, attempt.state, attempt.number, view.result, None, view.outstanding())
    error = view.error or deadline_message(attempt.last_cause)
    return _new_outcome(name, attempt.state, attempt.number, None, error, view.outstanding())


# Built through its slot descriptors, as the codec builds records: one for
# every step of every run, at less than half what the frozen dataclass's
# __init__ costs (a test holds the two equal).
_slots = vars(StepOutcome)
_set_step: Final[Callable[[StepOutcome, str], None]] = _slots["step"].__set__
_set_state: Final[Callable[[StepOutcome, AttemptState | None], None]] = _slots["state"].__set__
_set_attempts: Final[Callable[[StepOutcome, int], None]] = _slots["attempts"].__set__
_set_result: Final[Callable[[StepOutcome, JSON], None]] = _slots["result"].__set__
_set_error: Final[Callable[[StepOutcome, str | None], None]] = _slots["error"].__set__
_set_outstanding: Final[Callable[[StepOutcome, tuple[str, ...]], None]] = _slots["outstanding"].__set__


def _new_outcome(
    step: str, state: AttemptState, attempts: int, result: JSON, error: str | None, outstanding: tuple[str, ...]
) -> StepOutcome:
    made: StepOutcome = object.__new__(StepOutcome)
    _set_step(made, step)
    _set_state(made, state)
    _set_attempts(made, attempts)
    _set_result(made, result)
    _set_error(made, error)
    _set_outstanding(made, outstanding)
    return made
