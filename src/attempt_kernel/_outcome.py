"""What a run reports: each step's outcome and the run's, as values.

Pure data built from the ledger's views; no I/O, no asyncio. The executor
returns these, and a code workflow's failed step carries one (`StepFailed`).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    succeeded = has_succeeded(attempt.state)
    return StepOutcome(
        step=name,
        state=attempt.state,
        attempts=attempt.number,
        result=view.result if succeeded else None,
        error=None if succeeded else view.error or deadline_message(attempt.last_cause),
        outstanding=view.outstanding(),
    )
