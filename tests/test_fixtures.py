"""The seed's recorded-log test: real executor logs replay with nothing rejected."""

from __future__ import annotations

from pathlib import Path

from attempt_kernel import (
    AttemptTransitioned,
    Cancelled,
    Failed,
    IllegalTransition,
    Indeterminate,
    Pending,
    Record,
    Running,
    Succeeded,
    TimedOut,
    read_log,
    replay,
    transition,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _transitions(name: str) -> list[AttemptTransitioned]:
    return [
        i.change for i in read_log(FIXTURES / name)
        if isinstance(i, Record) and isinstance(i.change, AttemptTransitioned)
    ]  # fmt: skip


def test_every_recorded_change_goes_through_transition() -> None:
    """Each observed (from, cause) of both recorded logs is accepted and reaches the recorded to."""
    for name in ("recorded-demo.jsonl", "recorded-crash.jsonl"):
        changes = _transitions(name)
        assert len(changes) >= 12
        for change in changes:
            try:
                assert transition(change.from_state, change.cause) == change.to_state
            except IllegalTransition as error:  # say which record, not just that one failed
                raise AssertionError(f"{name}: rejected {change}: {error}") from None


def test_recorded_demo_replays_to_its_documented_outcome() -> None:
    """The demo run: valid, 4 succeeded, 1 failed (retried), 1 timed out, 1 cancelled."""
    report = replay(FIXTURES / "recorded-demo.jsonl")
    assert report.valid
    assert report.final_states == {
        Pending(): 0, Running(): 0, Succeeded(): 4, Failed(): 1, Indeterminate(): 0,
        Cancelled(): 1, TimedOut(): 1,
    }  # fmt: skip


def test_recorded_crash_replays_with_one_indeterminate_attempt() -> None:
    """The crashed-and-recovered run: valid, book-flight Indeterminate with its key."""
    report = replay(FIXTURES / "recorded-crash.jsonl")
    assert report.valid
    [open_attempt] = report.indeterminate
    assert (open_attempt.step, open_attempt.attempt) == ("book-flight", 1)
    assert len(open_attempt.outstanding) == 1
    assert report.final_states[Cancelled()] == 1 and report.final_states[Indeterminate()] == 1
