"""Typing tests: checked by mypy (the gate) and pyright, and imported by pytest.

`assert_type` lines pin the public signatures. The ``# type: ignore[code]``
lines are negative tests: with ``warn_unused_ignores`` on, mypy fails the
gate if one of these misuses ever stops being an error. pyright honours the
same comments (``enableTypeIgnoreComments``) and, with the file-level
``reportUnnecessaryTypeIgnoreComment`` below, fails the same way.
"""
# pyright: reportUnnecessaryTypeIgnoreComment=true

from __future__ import annotations

from typing_extensions import assert_never, assert_type

from attempt_kernel import (
    Admit,
    AttemptState,
    Cancel,
    Cancelled,
    Failed,
    IllegalTransition,
    Indeterminate,
    Pending,
    Running,
    Succeeded,
    TimedOut,
    TransitionCause,
    is_terminal,
    transition,
)


def describe(state: AttemptState) -> str:
    """A user's exhaustive match: adding a state makes this a type error."""
    match state:
        case Pending() | Running():
            return "live"
        case Succeeded() | Failed() | Cancelled() | TimedOut():
            return "done"
        case Indeterminate():
            return "reconcile"
        case _:
            assert_never(state)


def _signatures() -> None:  # pyright: ignore[reportUnusedFunction]  # never called: only type-checked
    """Never called: only type-checked."""
    assert_type(transition(Pending(), Admit()), AttemptState)
    assert_type(is_terminal(Running()), bool)
    error = IllegalTransition(Running(), Admit(), "why")
    assert_type(error.from_state, AttemptState)
    assert_type(error.cause, TransitionCause)
    assert_type(error.reason, str)


def _misuses() -> None:  # pyright: ignore[reportUnusedFunction]  # never called: only type-checked
    """Never called: each line must stay a type error."""
    transition("Running", Admit())  # type: ignore[arg-type]
    transition(Running(), "Succeed")  # type: ignore[arg-type]
    Cancel()  # type: ignore[call-arg]
    Cancel(True)  # type: ignore[call-arg]
    Running().x = 1  # type: ignore[attr-defined]
    error = IllegalTransition(Running(), Admit(), "why")
    error.cause = Admit()  # type: ignore[misc]

    class Paused(Running):  # type: ignore[misc]
        pass


def test_user_match_handles_every_state() -> None:
    """The exhaustive user match above runs for each state."""
    assert describe(Pending()) == "live"
    assert describe(Succeeded()) == "done"
    assert describe(Indeterminate()) == "reconcile"
