"""Typing tests: checked by mypy (the gate) and pyright, and imported by pytest.

`assert_type` lines pin the public signatures. The ``# type: ignore[code]``
lines are negative tests: with ``warn_unused_ignores`` on, mypy fails the
gate if one of these misuses ever stops being an error. pyright honours the
same comments (``enableTypeIgnoreComments``) and, with the file-level
``reportUnnecessaryTypeIgnoreComment`` below, fails the same way.
"""
# pyright: reportUnnecessaryTypeIgnoreComment=true

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Literal

from typing_extensions import assert_never, assert_type

from attempt_kernel import (
    JSON,
    Admit,
    AttemptState,
    Cancel,
    Cancelled,
    Change,
    Failed,
    IllegalTransition,
    Indeterminate,
    Pending,
    ReleaseObserver,
    RetryPolicy,
    RunContext,
    Running,
    StepContext,
    StepFailed,
    StepOutcome,
    Succeeded,
    TimedOut,
    TransitionCause,
    Workflow,
    is_terminal,
    transition,
    workflow,
)


async def lookup(ctx: StepContext, city: str) -> dict[str, int]:
    return {city: len(city)}


async def pair(ctx: StepContext, a: int, b: Mapping[str, JSON]) -> list[int]:
    return [a, len(b)]


async def nothing(ctx: StepContext) -> None:
    return None


@workflow("typed-trip", version="1", retry=RetryPolicy(max_attempts=2))
async def typed_trip(run: RunContext) -> JSON:
    """A user's code workflow, typed as the docs show it: no cast anywhere."""
    found = await run.step("lookup", lookup, "Oslo", step_deadline=5.0)
    assert_type(found, dict[str, int])
    both = await run.step("pair", pair, 1, {"k": [1, 2]}, reconcilers={})
    assert_type(both, list[int])
    pending = run.step("nothing", nothing)
    _ = assert_type(pending, Awaitable[None])
    try:
        await pending
    except StepFailed as failed:
        assert_type(failed.outcome, StepOutcome)
    return {"found": found, "both": both}


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


async def _code_misuses(run: RunContext) -> None:  # pyright: ignore[reportUnusedFunction]  # only type-checked
    """Never called: each line must stay a type error."""
    await run.step("lookup", lookup, 3)  # type: ignore[arg-type]
    await run.step("lookup", lookup)  # type: ignore[arg-type]
    await run.step("pair", pair, 1, {"k": {1, 2}})  # type: ignore[type-var,arg-type]
    await run.step("lookup", lookup, "Oslo", retry=3)  # type: ignore[call-overload]


def _workflow_types() -> None:  # pyright: ignore[reportUnusedFunction]  # only type-checked
    assert_type(typed_trip, Workflow)


def test_user_match_handles_every_state() -> None:
    """The exhaustive user match above runs for each state."""
    assert describe(Pending()) == "live"
    assert describe(Succeeded()) == "done"
    assert describe(Indeterminate()) == "reconcile"


def test_the_typed_code_workflow_runs(tmp_path: Path) -> None:
    """The typed workflow above is a real one: it runs to its result."""
    import asyncio

    from attempt_kernel import Executor, RunLogWriter

    async def main() -> JSON:
        with RunLogWriter(tmp_path / "t.jsonl") as log:
            report = await Executor(log).run(typed_trip, "t-1")
        return report.result

    assert asyncio.run(main()) == {"found": {"Oslo": 4}, "both": [1, 1]}


class Released:
    """A user's observer also told of the runs an executor lets go, as docs/executor.md shows it."""

    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        pass

    def run_released(self, run: str, status: Literal["waiting", "interrupted"], time_us: int) -> None:
        self.released.append((run, status))


@workflow("typed-waiter")
async def typed_waiter(run: RunContext) -> JSON:
    return await run.wait_for_signal("go")


def test_a_release_observer_is_an_observer_the_executor_takes(tmp_path: Path) -> None:
    """A `ReleaseObserver` is a `RunObserver` that is also told of released runs: one
    typed so goes in ``observers`` with no cast (mypy and pyright check this)."""
    import asyncio

    from attempt_kernel import Executor, RunLogWriter

    async def main(watching: ReleaseObserver) -> str:
        with RunLogWriter(tmp_path / "t.jsonl") as log:
            report = await Executor(log, observers=[watching], let_go_after=0.0).run(typed_waiter, "w-1")
        return report.status

    released = Released()
    assert asyncio.run(main(released)) == "waiting"
    assert released.released == [("w-1", "waiting")]
