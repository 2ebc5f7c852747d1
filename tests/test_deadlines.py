"""Deadlines on the executor's shared timer: what one timer for every attempt could get wrong.

The executor keeps every live attempt's deadline on one loop timer instead of
one ``asyncio.timeout`` each. These tests pin what that bookkeeping must keep:
a deadline met is gone (it never cancels what its task does next), a shorter
deadline set after a longer one passes on time, a deadline passing while the
step is runnable (between two awaits) still ends it, and the cancel request a
deadline made is taken back when the step swallows it. The meaning of a
deadline itself (TimedOut, the causes, retries, effects in flight) is pinned
by the executor's, the code workflows' and the replay tests.

Where a step must outlive a deadline that was met, the deadline is an hour
and the step moves the event loop's clock past it (`MovableClockLoop`), then
gives the loop a few turns: a stale deadline fires in the first of them. A
deadline that must be met is then met however loaded the machine, where a
short one, met in real time, could pass while a stalled loop had yet to
admit the step.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path


from attempt_kernel import (
    Change,
    Executor,
    Record,
    RunLogWriter,
    RunObserver,
    RunReport,
    StepContext,
    StepDeadlinePassed,
    StepOutcome,
    Succeeded,
    TimedOut,
    read_log,
    replay,
)
from attempt_kernel._records import JSON, AttemptTransitioned
from attempt_kernel._workflow import RetryPolicy, Step, load_workflow

SHORT = 0.05
"""A deadline that is meant to pass."""

MET = 3600.0
"""A deadline that is meant to be met (by a step admitted a few records later): an
hour, passed only by moving the loop's clock (`outlive_the_deadline`)."""

OUTLIVED = 10 * MET
"""The step deadline of a step that outlives `MET`: still to come once the clock has moved."""


class MovableClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a step moves on: a deadline passes when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.ahead = 0.0

    def time(self) -> float:
        return super().time() + self.ahead


async def outlive_the_deadline() -> None:
    """Move the running loop's clock past `MET`, then give the loop turns in which a
    deadline still armed would cancel the caller (it fires in the first)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, MovableClockLoop)
    loop.ahead += 2 * MET
    for _ in range(3):
        await asyncio.sleep(0)


def run_steps(
    path: Path, steps: list[Step], *, admission_limit: int = 8, observers: Sequence[RunObserver] = ()
) -> RunReport:
    """Run the steps as workflow ``w`` on a `MovableClockLoop`, as `asyncio.run` would."""
    workflow = load_workflow("w", steps)

    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            executor = Executor(log, admission_limit=admission_limit, observers=observers)
            return await executor.run(workflow, "r")

    loop = MovableClockLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def outcome(report: RunReport, name: str) -> StepOutcome:
    [found] = [s for s in report.steps if s.step == name]
    return found


def test_a_queue_deadline_met_never_cancels_the_step_that_follows(tmp_path: Path) -> None:
    """Admitted before its queue deadline, a step that then runs past that deadline succeeds."""
    queued = asyncio.Event()

    async def holds_the_slot(ctx: StepContext) -> JSON:
        await queued.wait()
        return "held"

    async def outlives_its_queue_deadline(ctx: StepContext) -> JSON:
        await outlive_the_deadline()
        return "ran"

    class Queued:
        def record_written(self, run: str, change: Change, time_us: int) -> None:
            # the second step's attempt is created, and waits Pending behind the first
            if getattr(change, "step", None) == "second":
                queued.set()

    report = run_steps(
        tmp_path / "log",
        [
            Step(name="first", run=holds_the_slot),
            Step(name="second", run=outlives_its_queue_deadline, queue_deadline=MET, step_deadline=OUTLIVED),
        ],
        admission_limit=1,
        observers=[Queued()],
    )
    second = outcome(report, "second")
    assert (second.state, second.attempts, second.result) == (Succeeded(), 1, "ran")
    assert report.status == "succeeded"
    assert replay(tmp_path / "log").valid


def test_a_deadline_met_by_one_attempt_never_cancels_the_next_attempt(tmp_path: Path) -> None:
    """Attempt 1 waits for a slot under a queue deadline and fails at once; attempt 2,
    in the same task, runs past that deadline and succeeds."""
    queued = asyncio.Event()

    async def holds_the_slot(ctx: StepContext) -> JSON:
        await queued.wait()
        return "held"

    async def fails_then_outlives(ctx: StepContext) -> JSON:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        await outlive_the_deadline()
        return "second attempt ran"

    class Queued:
        def record_written(self, run: str, change: Change, time_us: int) -> None:
            if getattr(change, "step", None) == "retried":
                queued.set()

    report = run_steps(
        tmp_path / "log",
        [
            Step(name="first", run=holds_the_slot),
            Step(
                name="retried", run=fails_then_outlives, queue_deadline=MET, step_deadline=OUTLIVED,
                retry=RetryPolicy(initial_interval=0, max_attempts=2),
            ),  # fmt: skip
        ],
        admission_limit=1,
        observers=[Queued()],
    )
    retried = outcome(report, "retried")
    assert (retried.state, retried.attempts, retried.result) == (Succeeded(), 2, "second attempt ran")
    assert replay(tmp_path / "log").valid


def test_a_shorter_deadline_set_after_a_longer_one_passes_first(tmp_path: Path) -> None:
    """A step with a long deadline starts first, one with a short deadline second: the
    short one times out while the long one runs on (released by that timeout)."""
    released = asyncio.Event()

    async def waits_for_release(ctx: StepContext) -> JSON:
        await released.wait()
        return "released"

    async def hangs(ctx: StepContext) -> JSON:
        await asyncio.Event().wait()
        return None

    class OnTimeout:
        def record_written(self, run: str, change: Change, time_us: int) -> None:
            if isinstance(change, AttemptTransitioned) and change.to_state == TimedOut():
                released.set()

    report = run_steps(
        tmp_path / "log",
        [
            Step(name="long", run=waits_for_release, step_deadline=100 * SHORT),
            Step(name="short", run=hangs, step_deadline=SHORT, retry=RetryPolicy(max_attempts=1)),
        ],
        observers=[OnTimeout()],
    )
    assert [(s.step, s.state) for s in report.steps] == [("long", Succeeded()), ("short", TimedOut())]
    assert outcome(report, "short").error == "step deadline passed"


def test_a_deadline_passes_while_the_step_is_between_two_awaits(tmp_path: Path) -> None:
    """A step that never blocks (it only yields to the loop) still ends TimedOut."""

    async def spins(ctx: StepContext) -> JSON:
        for _ in range(1_000_000):  # bounded, so that a broken deadline fails instead of hanging
            await asyncio.sleep(0)
        return "spun out"

    report = run_steps(
        tmp_path / "log", [Step(name="s", run=spins, step_deadline=SHORT, retry=RetryPolicy(max_attempts=1))]
    )
    s = outcome(report, "s")
    assert (s.state, s.error) == (TimedOut(), "step deadline passed")
    [timed_out] = [
        r.change
        for r in read_log(tmp_path / "log")
        if isinstance(r, Record) and isinstance(r.change, AttemptTransitioned) and r.change.to_state == TimedOut()
    ]
    assert timed_out.cause == StepDeadlinePassed()


# Python 3.10's tasks keep no count of cancel requests (there, each deadline is asyncio.wait_for's).
if sys.version_info >= (3, 11):

    def test_a_deadline_the_step_swallowed_leaves_no_cancel_request_on_its_task(tmp_path: Path) -> None:
        """A step that catches its deadline's cancellation and fails: the next attempt, in
        the same task, finds no cancel request pending on it."""

        async def swallows_then_counts(ctx: StepContext) -> JSON:
            if ctx.attempt == 1:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    raise ValueError("caught the deadline") from None
            task = asyncio.current_task()
            assert task is not None
            return task.cancelling()

        report = run_steps(
            tmp_path / "log",
            [Step(name="s", run=swallows_then_counts, step_deadline=SHORT, retry=RetryPolicy(initial_interval=0, max_attempts=2))],
        )
        s = outcome(report, "s")
        assert (s.state, s.attempts, s.result) == (Succeeded(), 2, 0)
