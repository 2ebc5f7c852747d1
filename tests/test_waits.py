"""Runs that wait: durable sleeps, signals as a mailbox, cancels of a waiting run.

Every test drives the executor with a fake clock and a fake sleep (the
clock moves only when the run sleeps), so no test waits on the machine's
time. Expected records are written out by hand.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import tempfile
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from time import time as wall_clock

import pytest

from attempt_kernel import (
    JSON,
    AttemptCreated,
    Change,
    CorruptLine,
    Executor,
    FileLog,
    OperationRefused,
    Record,
    RunCancelRequested,
    RunFinished,
    RunStarted,
    WaitEnded,
    WaitStarted,
    read_log,
    RunContext,
    RunLogWriter,
    RunReport,
    SignalSent,
    StepContext,
    Succeeded,
    Workflow,
    WorkflowDiverged,
    WorkflowError,
    replay,
    resume_log,
    send_signal,
    workflow,
)
from attempt_kernel._codec import encode_record
from attempt_kernel._executor import Job, drive_jobs
from attempt_kernel._ledger import Ledger
from attempt_kernel._operate import cancel_change, refusal, signal_change
from logs import write_log

START = 1_000_000.0
"""The fake clock's start, in seconds since the epoch."""


class FakeTime:
    """A virtual clock: it moves only when every sleeper waits, to the earliest wake.

    Sleeps end in the order of their wake times, as real ones would, without
    waiting: once the event loop has run a few turns with nothing else to
    do, the clock jumps to the earliest pending wake and that sleep ends.
    """

    def __init__(self, now: float = START, *, hold: bool = False) -> None:
        self.now = now
        self.slept: list[float] = []
        self.hold = hold
        """Sleeps never end (as a real hour-long one would not, within a test)."""
        self._pending: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0
        self._kicked = False

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._count += 1
        entry = (self.now + seconds, self._count, future)
        self._pending.append(entry)
        if not self.hold and not self._kicked:
            self._kicked = True
            loop.call_soon(self._advance, 20)
        try:
            await future
        finally:
            if entry in self._pending:
                self._pending.remove(entry)

    def _advance(self, turns: int) -> None:
        loop = asyncio.get_running_loop()
        if turns > 0:
            loop.call_soon(self._advance, turns - 1)
            return
        live = [entry for entry in self._pending if not entry[2].done()]
        if not live:
            self._kicked = False
            return
        wake, _, future = min(live)
        self.now = max(self.now, wake)
        self._pending.remove((wake, _, future))
        future.set_result(None)
        loop.call_soon(self._advance, 20)


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def kinds(path: Path) -> list[str]:
    return [str(r["type"]) for r in records(path)]


def of_type(path: Path, kind: str) -> list[dict[str, object]]:
    return [r for r in records(path) if r["type"] == kind]


async def noted(ctx: StepContext, text: str) -> JSON:
    return text


Deliveries = Callable[[Executor], Awaitable[None]]


def drive(
    path: Path,
    flow: Workflow,
    run: str,
    time: FakeTime,
    *,
    resume: bool = False,
    meanwhile: Deliveries | None = None,
    let_go_after: float | None = None,
) -> RunReport:
    """Run (or resume) ``run`` on the log at ``path``; ``meanwhile`` plays the operator."""

    async def main() -> RunReport:
        # The log stamps records with the executor's clock, as docs/executor.md asks.
        with RunLogWriter(path, create=True, clock=lambda: int(time.now * 1_000_000)) as log:
            executor = Executor(
                log, clock=time.clock, sleep=time.sleep, let_go_after=let_go_after
            )
            task = asyncio.ensure_future(
                executor.run(flow, run, prior={} if resume else None)
            )
            if meanwhile is not None:
                await meanwhile(executor)
            return await task

    return asyncio.run(main())


async def until_waiting(path: Path, count: int = 1) -> None:
    """Let the loop run until the log holds ``count`` wait_started records."""
    for _ in range(10_000):
        if kinds(path).count("wait_started") >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the run never waited {count} time(s): {kinds(path)}")


def signal(name: str, payload: JSON, id: str) -> SignalSent:
    return SignalSent(name=name, payload=payload, id=id)


# --------------------------------------------------------------------------
# Sleeps
# --------------------------------------------------------------------------


@workflow("napper")
async def napper(run: RunContext) -> JSON:
    first = await run.step("before", noted, "a")
    await run.sleep(30)
    second = await run.step("after", noted, "b")
    return [first, second]


def test_a_sleep_records_its_wake_time_and_its_end(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    time = FakeTime()
    report = drive(path, napper, "n-1", time)
    assert report.status == "succeeded" and report.result == ["a", "b"]
    assert time.slept == [30.0]
    [started] = of_type(path, "wait_started")
    assert started["position"] == 2 and started["wake_us"] == 1_000_030_000_000
    assert "signal" not in started
    [ended] = of_type(path, "wait_ended")
    assert ended["position"] == 2 and "signal" not in ended
    # the step after the sleep takes the position after it
    assert [r["step"] for r in of_type(path, "step_called")] == ["before@1", "after@3"]
    assert replay(FileLog(path)).valid


def cut_after(path: Path, kind: str) -> None:
    """Keep the log up to and including its first record of ``kind`` (a crash there)."""
    lines = path.read_bytes().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == kind)
    path.write_bytes(b"".join(lines[: index + 1]))


def test_a_crash_during_a_sleep_resumes_with_only_the_remainder(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, napper, "n-1", FakeTime())
    cut_after(path, "wait_started")  # the process died while it slept
    later = FakeTime(START + 12)  # 12 s of the 30 have passed
    report = drive(path, napper, "n-1", later, resume=True)
    assert report.status == "succeeded" and report.result == ["a", "b"]
    assert later.slept == [18.0]
    # the step before the sleep was not run again
    assert [r["step"] for r in of_type(path, "step_called")] == ["before@1", "after@3"]
    assert len(of_type(path, "wait_started")) == 1 and len(of_type(path, "wait_ended")) == 1
    assert replay(FileLog(path)).valid


def test_a_wake_time_already_past_resumes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, napper, "n-1", FakeTime())
    cut_after(path, "wait_started")
    later = FakeTime(START + 3600)
    report = drive(path, napper, "n-1", later, resume=True)
    assert report.status == "succeeded"
    assert later.slept == []


def test_a_sleep_resumed_on_a_clock_set_back_waits_until_its_wake_time_on_that_clock(tmp_path: Path) -> None:
    """Resumed where the clock reads 1000 s before the sleep began (a clock set back, a machine
    whose clock is behind): the wake time is a moment, so the 30 s sleep lasts 1030 s by that
    clock, as docs/executor.md says; it never ends sooner than its wake time."""
    path = tmp_path / "log.jsonl"
    drive(path, napper, "n-1", FakeTime())
    cut_after(path, "wait_started")
    behind = FakeTime(START - 1000)
    report = drive(path, napper, "n-1", behind, resume=True)
    assert report.status == "succeeded" and report.result == ["a", "b"]
    assert behind.slept == [1030.0]
    assert replay(FileLog(path)).valid


def test_a_signal_wait_resumed_on_a_clock_set_back_times_out_at_its_wake_time_on_that_clock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, approver, "a-1", FakeTime())
    cut_after(path, "wait_started")  # the process died while it waited
    behind = FakeTime(START - 1000)
    report = drive(path, approver, "a-1", behind, resume=True)
    assert (report.status, report.result) == ("succeeded", "timed out")
    assert behind.slept == [4600.0]


@pytest.mark.parametrize(
    "seconds", [-1, -0.001, math.inf, -math.inf, math.nan, "3", True, None, 1e303, sys.float_info.max]
)
def test_a_bad_sleep_raises_at_the_call(tmp_path: Path, seconds: object) -> None:
    """Also a finite length too long to count in microseconds (``sys.float_info.max``
    as "for ever"): a WorkflowError naming the call, not an OverflowError."""
    @workflow("bad-sleep")
    async def bad(run: RunContext) -> JSON:
        try:
            await run.sleep(seconds)  # type: ignore[arg-type]  # the point of the test
        except WorkflowError as error:
            return str(error)
        return "slept"

    report = drive(tmp_path / "log.jsonl", bad, "b-1", FakeTime())
    assert isinstance(report.result, str) and "run.sleep(seconds)" in report.result
    assert "wait_started" not in kinds(tmp_path / "log.jsonl")


def test_a_sleep_of_zero_records_and_ends_at_once(tmp_path: Path) -> None:
    @workflow("zero")
    async def zero(run: RunContext) -> JSON:
        await run.sleep(0)
        return "ok"

    time = FakeTime()
    report = drive(tmp_path / "log.jsonl", zero, "z-1", time)
    assert report.result == "ok" and time.slept == []
    assert kinds(tmp_path / "log.jsonl").count("wait_ended") == 1


# --------------------------------------------------------------------------
# Signals
# --------------------------------------------------------------------------


@workflow("approver")
async def approver(run: RunContext) -> JSON:
    await run.step("ask", noted, "may I charge 40 EUR?")
    answer = await run.wait_for_signal("approve", timeout=3600)
    if answer is None:
        return "timed out"
    return {"approved": answer}


def test_a_signal_sent_while_the_run_waits_is_returned(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"

    async def operator(executor: Executor) -> None:
        await until_waiting(path)
        assert executor.deliver("a-1", signal("approve", {"by": "ana"}, "s1")) is None

    report = drive(path, approver, "a-1", FakeTime(), meanwhile=operator)
    assert report.status == "succeeded"
    assert report.result == {"approved": {"by": "ana"}}
    [started] = of_type(path, "wait_started")
    assert started["signal"] == "approve" and started["wake_us"] == 1_003_600_000_000
    [sent] = of_type(path, "signal_sent")
    assert sent["name"] == "approve" and sent["payload"] == {"by": "ana"} and sent["id"] == "s1"
    [ended] = of_type(path, "wait_ended")
    assert ended["position"] == 2 and ended["signal"] == 1
    assert replay(FileLog(path)).valid


def test_the_timeout_returns_none_and_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    time = FakeTime()
    report = drive(path, approver, "a-1", time)
    assert report.result == "timed out"
    assert time.slept == [3600.0]
    [ended] = of_type(path, "wait_ended")
    assert "signal" not in ended  # it ended by its time


@workflow("two-approvals")
async def two_approvals(run: RunContext) -> JSON:
    await run.step("ask", noted, "twice")
    first = await run.wait_for_signal("approve")
    second = await run.wait_for_signal("approve")
    return [first, second]


def test_signals_sent_before_the_wait_are_kept_and_taken_in_order_once_each(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"

    async def operator(executor: Executor) -> None:
        # both arrive before the run's first wait: the first step is not
        # even done yet (its records may not be written)
        for _ in range(10_000):
            if "run_started" in kinds(path):
                break
            await asyncio.sleep(0)
        assert executor.deliver("t-1", signal("approve", 1, "one")) is None
        assert executor.deliver("t-1", signal("approve", 2, "two")) is None
        # the same signal taken in again (a crash before its inbox was cleared)
        assert executor.deliver("t-1", signal("approve", 1, "one")) == "signal 'one' is recorded already"

    report = drive(path, two_approvals, "t-1", FakeTime(), meanwhile=operator)
    assert report.result == [1, 2]
    assert [r["signal"] for r in of_type(path, "wait_ended")] == [1, 2]
    assert len(of_type(path, "signal_sent")) == 2
    assert replay(FileLog(path)).valid


def test_a_resumed_wait_hands_back_the_signal_it_took(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"

    async def operator(executor: Executor) -> None:
        await until_waiting(path)
        executor.deliver("a-1", signal("approve", "yes", "s1"))

    drive(path, approver, "a-1", FakeTime(), meanwhile=operator)
    cut_after(path, "wait_ended")  # died right after taking the signal in
    report = drive(path, approver, "a-1", FakeTime(), resume=True)
    assert report.result == {"approved": "yes"}
    assert len(of_type(path, "wait_ended")) == 1
    assert replay(FileLog(path)).valid


def test_a_signal_for_a_name_never_waited_for_stays_untaken(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"

    async def operator(executor: Executor) -> None:
        await until_waiting(path)
        executor.deliver("a-1", signal("other", {}, "x"))
        executor.deliver("a-1", signal("approve", True, "y"))

    report = drive(path, approver, "a-1", FakeTime(), meanwhile=operator)
    assert report.result == {"approved": True}
    ledger = Ledger(keep=frozenset({"a-1"}))
    ledger.feed(FileLog(path).read())
    view = ledger.runs["a-1"]
    assert [(s.name, s.taken_at) for s in view.signals] == [("other", None), ("approve", 2)]


@pytest.mark.parametrize("name", ["", "a\nb", "tab\there", "\x00", "x" * 201])
def test_a_bad_signal_name_raises_at_the_call(tmp_path: Path, name: str) -> None:
    @workflow("bad-name")
    async def bad(run: RunContext) -> JSON:
        try:
            await run.wait_for_signal(name)
        except WorkflowError as error:
            return str(error)
        return "waited"

    report = drive(tmp_path / "log.jsonl", bad, "b-1", FakeTime())
    assert isinstance(report.result, str) and "signal name" in report.result


@pytest.mark.parametrize("timeout", [-5, math.inf, math.nan, 1e303, sys.float_info.max])
def test_a_bad_timeout_raises_at_the_call(tmp_path: Path, timeout: float) -> None:
    @workflow("bad-timeout")
    async def bad(run: RunContext) -> JSON:
        try:
            await run.wait_for_signal("go", timeout=timeout)
        except WorkflowError as error:
            return str(error)
        return "waited"

    report = drive(tmp_path / "log.jsonl", bad, "b-1", FakeTime())
    assert isinstance(report.result, str) and "timeout" in report.result


# --------------------------------------------------------------------------
# Cancel, letting go, divergence
# --------------------------------------------------------------------------


def test_a_cancel_of_a_waiting_run_ends_it_cancelled_at_once(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"

    async def operator(executor: Executor) -> None:
        await until_waiting(path)
        assert executor.deliver("a-1", RunCancelRequested(reason="customer left")) is None

    report = drive(path, approver, "a-1", FakeTime(), meanwhile=operator)
    assert report.status == "cancelled"
    assert kinds(path)[-2:] == ["run_cancel_requested", "run_finished"]
    [cancel] = of_type(path, "run_cancel_requested")
    assert cancel["reason"] == "customer left"  # recorded once, by deliver
    assert "wait_ended" not in kinds(path)
    assert replay(FileLog(path)).valid


def test_a_run_let_go_while_it_waits_writes_nothing_more_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    report = drive(path, approver, "a-1", FakeTime(hold=True), let_go_after=1.0)
    assert report.status == "waiting"
    assert kinds(path)[-1] == "wait_started"
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    assert ledger.runs["a-1"].standing() == "waiting"
    assert replay(FileLog(path)).valid

    async def operator(executor: Executor) -> None:
        assert executor.deliver("a-1", signal("approve", "ok", "s1")) is None

    # the signal is recorded before the run is taken up again
    report = drive(path, approver, "a-1", FakeTime(), resume=True, meanwhile=operator)
    assert report.result == {"approved": "ok"}
    assert kinds(path).count("step_called") == 1  # "ask" was not asked again


async def step_after_turns(ctx: StepContext, text: str) -> JSON:
    """A step that is still live when the wait beside it starts: it yields the loop a few times."""
    for _ in range(10):
        await asyncio.sleep(0)
    return text


@workflow("wait-beside-a-step")
async def wait_beside_a_step(run: RunContext) -> JSON:
    go, done = await asyncio.gather(run.wait_for_signal("go"), run.step("work", step_after_turns, "done"))
    return {"go": go, "work": done}


def test_a_run_whose_last_step_ends_after_its_wait_began_is_let_go_once_the_step_is_done(tmp_path: Path) -> None:
    """The wait starts while a step beside it is live, so the run is not quiet then; once the
    step ends and only the wait is left, the run is let go (it would hold its worker's lease
    and slot until the signal came)."""
    path = tmp_path / "log.jsonl"

    async def main() -> RunReport:
        with RunLogWriter(path, create=True, clock=lambda: int(START * 1_000_000)) as log:
            executor = Executor(log, clock=lambda: START, let_go_after=1.0)
            # a safety net only: without the let-go the run waits for a signal no one sends
            return await asyncio.wait_for(executor.run(wait_beside_a_step, "w-1"), timeout=60)

    report = asyncio.run(main())
    assert report.status == "waiting"
    assert kinds(path)[-1] == "transition"  # the step's end, and nothing after it
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    view = ledger.runs["w-1"]
    assert view.standing() == "waiting"
    assert view.steps["work@2"].attempt.state == Succeeded()
    assert replay(FileLog(path)).valid


@workflow("wait-beside-a-nap")
async def wait_beside_a_nap(run: RunContext) -> JSON:
    go, _ = await asyncio.gather(run.wait_for_signal("go"), run.sleep(0.5))
    return {"go": go}


def test_a_run_whose_short_sleep_ends_beside_a_wait_is_let_go_then(tmp_path: Path) -> None:
    """The signal's wait begins with a sleep of half a second beside it (a wake time within
    the second: not quiet); once the sleep is over only the signal's wait is left, and the
    run is let go."""
    path = tmp_path / "log.jsonl"
    time = FakeTime()
    report = drive(path, wait_beside_a_nap, "n-1", time, let_go_after=1.0)
    assert report.status == "waiting"
    assert time.slept == [0.5]
    assert kinds(path)[-1] == "wait_ended"  # the sleep's end, and nothing after it
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    assert ledger.runs["n-1"].standing() == "waiting"
    assert replay(FileLog(path)).valid


async def brief(ctx: StepContext, text: str) -> JSON:
    """A step that is live for a moment (so that the wait beside it begins while it runs)."""
    await asyncio.sleep(0.02)
    return text


@workflow("fan-beside-a-wait")
async def fan_beside_a_wait(run: RunContext) -> JSON:
    """A two-level fan-out beside a wait: between its last step's result and its next call,
    the branch goes through more turns of the loop than a gather of steps takes."""

    async def one(x: str) -> JSON:
        return await run.step("q", brief, x)

    async def two(x: str) -> list[JSON]:
        return list(await asyncio.gather(one(x + "1"), one(x + "2")))

    async def branch() -> JSON:
        await asyncio.gather(two("a"), two("b"))
        return await run.step("ask", brief, "may I?")

    go, asked = await asyncio.gather(run.wait_for_signal("go"), branch())
    return {"go": go, "asked": asked}


def test_a_branch_many_turns_from_its_next_call_is_not_cut_off_by_a_let_go(tmp_path: Path) -> None:
    """The fan-out's four steps end; the branch takes its time to call ``ask``, and the run is
    let go only once ``ask`` has run too and the wait is all that is left."""
    path = tmp_path / "log.jsonl"

    async def main() -> RunReport:
        with RunLogWriter(path, create=True) as log:
            executor = Executor(log, let_go_after=1.0)
            return await asyncio.wait_for(executor.run(fan_beside_a_wait, "f-1"), timeout=60)  # a safety net

    report = asyncio.run(main())
    assert report.status == "waiting"
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    view = ledger.runs["f-1"]
    assert sorted(view.steps) == ["ask@6", "q@2", "q@3", "q@4", "q@5"]
    assert all(step.attempt.state == Succeeded() for step in view.steps.values())
    assert replay(FileLog(path)).valid


@workflow("dawdler")
async def dawdler(run: RunContext) -> JSON:
    """Awaits something that is no step nor wait (against the rules: a timer) between a step's
    result and its next call, beside a wait."""

    async def branch() -> JSON:
        await run.step("first", brief, "1")
        await asyncio.sleep(0.3)
        return await run.step("second", brief, "2")

    go, second = await asyncio.gather(run.wait_for_signal("go"), branch())
    return {"go": go, "second": second}


def test_a_function_that_awaits_no_step_for_long_is_let_go_and_goes_on_once_its_wait_ends(
    tmp_path: Path,
) -> None:
    """The documented limit: nothing moves for longer than the settle (the branch awaits a
    timer), so the run counts as quiet and is let go before ``second``; once the signal is
    sent, the resumed run answers ``first`` from the log and runs ``second`` once."""
    path = tmp_path / "log.jsonl"

    async def main() -> RunReport:
        with RunLogWriter(path, create=True) as log:
            executor = Executor(log, let_go_after=1.0)
            return await asyncio.wait_for(executor.run(dawdler, "d-1"), timeout=60)  # a safety net

    assert asyncio.run(main()).status == "waiting"
    assert kinds(path).count("step_called") == 1  # `second` was never called
    send_signal(path, "d-1", "go", "yes")
    [resumed] = resume_log(path, [dawdler]).reports
    assert resumed.result == {"go": "yes", "second": "2"}
    assert [(r["step"], r["attempt"]) for r in of_type(path, "created")] == [("first@2", 1), ("second@3", 1)]
    assert replay(FileLog(path)).valid


def test_can_go_on_says_whether_a_run_let_go_would_go_on_with_what_its_log_holds(tmp_path: Path) -> None:
    """`Executor.can_go_on`: False for a run let go that only waits, for a signal it does
    not wait for, for a run the executor does not know, for one it drives and for one that
    finished; True once the signal it waits for is recorded."""
    path = tmp_path / "log.jsonl"
    time = FakeTime(hold=True)  # the wait's wake time (an hour) never comes
    seen: list[bool] = []

    async def main() -> tuple[RunReport, RunReport]:
        with RunLogWriter(path, create=True) as log:
            executor = Executor(log, clock=time.clock, sleep=time.sleep, let_go_after=1.0)
            first = await executor.run(approver, "a-1")
            seen.append(executor.can_go_on("a-1"))
            assert executor.deliver("a-1", signal("other", {}, "s0")) is None
            seen.append(executor.can_go_on("a-1"))
            seen.append(executor.can_go_on("b-1"))
            assert executor.deliver("a-1", signal("approve", "ok", "s1")) is None
            seen.append(executor.can_go_on("a-1"))
            again = asyncio.ensure_future(executor.run(approver, "a-1", prior={}))
            await asyncio.sleep(0)
            seen.append(executor.can_go_on("a-1"))  # driven here now
            second = await again
            seen.append(executor.can_go_on("a-1"))
            return first, second

    first, second = asyncio.run(main())
    assert (first.status, second.status, second.result) == ("waiting", "succeeded", {"approved": "ok"})
    assert seen == [False, False, False, True, False, False]


def test_a_run_resumed_after_its_cancel_was_recorded_ends_cancelled(tmp_path: Path) -> None:
    """A run let go while it waits, then cancelled (recorded), then resumed by the same
    executor: it ends cancelled at once, the decision recorded once; it was let go again,
    waiting, as if nothing had been decided."""
    path = tmp_path / "log.jsonl"
    first, second = let_go_cancelled_and_resumed(path)
    assert (first.status, second.status) == ("waiting", "cancelled")
    assert kinds(path)[-3:] == ["run_cancel_requested", "run_resumed", "run_finished"]
    [decided] = of_type(path, "run_cancel_requested")
    assert decided["reason"] == "no longer wanted"
    assert replay(FileLog(path)).valid


def test_a_signal_taken_in_as_its_run_is_let_go_takes_the_run_up_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """drive_jobs with ``let_go_after``: the signal the run waits for is taken in from the
    inbox after the executor decided to let the run go, but before its report is in
    (the let-go's flush is awaited). The run goes on with it, in the same call; it was
    reported waiting for the very signal its log held, and nobody drove it again."""
    path = tmp_path / "log.jsonl"
    flush = Executor._durable  # pyright: ignore[reportPrivateUsage]
    sent: list[bool] = []

    def durable(self: Executor, run: str) -> Awaitable[None]:
        done = flush(self, run)
        view = self._ledger.runs[run]  # pyright: ignore[reportPrivateUsage]
        if sent or not view.is_waiting():
            return done

        async def signalled_meanwhile() -> None:
            await done
            sent.append(not send_signal(path, run, "approve", "ok").recorded)  # to the inbox
            while not view.signals:  # taken in by drive_jobs's pump
                await asyncio.sleep(0.05)

        return signalled_meanwhile()

    monkeypatch.setattr(Executor, "_durable", durable)
    with RunLogWriter(path, create=True) as log:
        [report] = drive_jobs(log, [Job(workflow=approver, run="a-1")], let_go_after=0)
    assert sent == [True]
    assert isinstance(report, RunReport)
    assert (report.status, report.result) == ("succeeded", {"approved": "ok"})
    assert kinds(path).count("signal_sent") == 1
    assert kinds(path).count("step_called") == 1
    assert replay(FileLog(path)).valid


def test_a_run_resumed_after_its_cancel_was_recorded_is_not_said_to_wait(tmp_path: Path) -> None:
    """``on_wait`` for a run let go while it waits, cancelled, then resumed by the same
    executor (drive_jobs takes such a run up again): its wait ends at once with the run,
    cancelled, and is not said to go on; the command line printed "run a-1 waits for
    signal 'approve'; end the wait with: ..." for a run that was ending cancelled."""
    said: list[tuple[str, str | None]] = []
    first, second = let_go_cancelled_and_resumed(
        tmp_path / "log.jsonl", on_wait=lambda run, wait: said.append((run, wait.signal))
    )
    assert (first.status, second.status) == ("waiting", "cancelled")
    assert said == [("a-1", "approve")]  # when it began to wait, and not again


def test_a_run_let_go_whose_wake_time_passes_while_others_are_driven_is_taken_up_again(
    tmp_path: Path,
) -> None:
    """drive_jobs with ``let_go_after``: a run let go at a sleep whose wake time comes
    while the call still drives another run goes on then, in the same call. It was left
    waiting though its wake time had passed (`recover URL` printed that it went on by
    itself then, and nothing took it up: `run URL` started it, so no worker would)."""
    path = tmp_path / "log.jsonl"

    @workflow("short-sleeper")
    async def sleeper(run: RunContext) -> JSON:
        await run.sleep(0.3)
        return "rested"

    async def outlast(ctx: StepContext) -> JSON:
        # until the sleeper's wake time has passed, however slow the machine
        while not (started := of_type(path, "wait_started")):
            await asyncio.sleep(0.02)
        wake = int(str(started[0]["wake_us"])) / 1_000_000
        while wall_clock() < wake + 0.3:
            await asyncio.sleep(0.02)
        return "done"

    @workflow("outlaster")
    async def outlaster(run: RunContext) -> JSON:
        return await run.step("outlast", outlast)

    with RunLogWriter(path, create=True) as log:
        reports = drive_jobs(
            log, [Job(workflow=sleeper, run="s-1"), Job(workflow=outlaster, run="o-1")], let_go_after=0
        )
    assert [(r.run, r.status, r.result) for r in reports if isinstance(r, RunReport)] == [
        ("s-1", "succeeded", "rested"), ("o-1", "succeeded", "done"),
    ]  # fmt: skip
    assert replay(FileLog(path)).valid


def let_go_cancelled_and_resumed(
    path: Path, on_wait: Callable[[str, WaitStarted], None] | None = None
) -> tuple[RunReport, RunReport]:
    """Run a-1 of ``approver`` let go while it waits, then cancelled ("no longer wanted"),
    then resumed by the same executor: both reports."""
    time = FakeTime(hold=True)

    async def main() -> tuple[RunReport, RunReport]:
        with RunLogWriter(path, create=True) as log:
            executor = Executor(log, clock=time.clock, sleep=time.sleep, let_go_after=1.0, on_wait=on_wait)
            first = await executor.run(approver, "a-1")
            assert executor.deliver("a-1", cancel_change(executor_ledger(path), "a-1", "no longer wanted")) is None
            second = await executor.run(approver, "a-1", prior={})
            return first, second

    return asyncio.run(main())


def executor_ledger(path: Path) -> Ledger:
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    return ledger


def test_a_signal_sent_after_the_timeout_while_nobody_drove_the_run_is_not_taken(
    tmp_path: Path,
) -> None:
    # The wait's timeout came while no process drove the run (it was let go,
    # as after a crash); the approval was sent after it. A process that had
    # been up then would have ended the wait with None: so must the resumed one.
    path = tmp_path / "log.jsonl"
    report = drive(path, approver, "a-1", FakeTime(hold=True), let_go_after=1.0)
    assert report.status == "waiting"
    [started] = of_type(path, "wait_started")
    assert started["wake_us"] == 1_003_600_000_000  # START + 3600 s
    with RunLogWriter(path, clock=lambda: 1_003_660_000_000) as log:  # a minute late
        log.append("a-1", SignalSent(name="approve", payload="yes", id="late"))
    report = drive(path, approver, "a-1", FakeTime(START + 3_700), resume=True)
    assert report.result == "timed out"
    [ended] = of_type(path, "wait_ended")
    assert "signal" not in ended  # it ended by its time
    view = ledger_of(path).runs["a-1"]
    assert [(s.id, s.taken_at) for s in view.signals] == [("late", None)]
    assert replay(FileLog(path)).valid


def test_a_signal_sent_before_the_timeout_while_nobody_drove_the_run_is_taken(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, approver, "a-1", FakeTime(hold=True), let_go_after=1.0)
    with RunLogWriter(path, clock=lambda: 1_003_599_000_000) as log:  # a second early
        log.append("a-1", SignalSent(name="approve", payload="yes", id="early"))
    report = drive(path, approver, "a-1", FakeTime(START + 3_700), resume=True)
    assert report.result == {"approved": "yes"}
    [ended] = of_type(path, "wait_ended")
    assert ended["signal"] == 1


def test_a_sleep_due_soon_is_not_let_go(tmp_path: Path) -> None:
    @workflow("short-nap")
    async def short(run: RunContext) -> JSON:
        await run.sleep(0.5)
        return "up"

    time = FakeTime()
    report = drive(tmp_path / "log.jsonl", short, "s-1", time, let_go_after=1.0)
    assert report.status == "succeeded" and time.slept == [0.5]


def test_code_that_waits_where_the_log_holds_a_step_diverges(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, approver, "a-1", FakeTime(hold=True), let_go_after=1.0)
    before = path.read_bytes()

    @workflow("approver")
    async def edited(run: RunContext) -> JSON:
        await run.step("ask", noted, "may I charge 40 EUR?")
        await run.sleep(10)  # the log holds a wait for "approve" here
        return "slept"

    with pytest.raises(WorkflowDiverged) as caught:
        drive(path, edited, "a-1", FakeTime(), resume=True)
    assert caught.value.position == 2
    assert "a wait for signal 'approve'" in str(caught.value)
    assert "a sleep (run.sleep)" in str(caught.value)
    assert path.read_bytes() == before  # nothing written


# --------------------------------------------------------------------------
# Forged logs: the replayer's rules for waits and signals
# --------------------------------------------------------------------------

CODE_START = RunStarted(workflow="approver", code=True, nonce="n0")


def violations(path: Path, changes: list[Change]) -> list[str]:
    """The reasons replay gives for a log of ``changes`` (written with valid checksums)."""
    write_log(path, [CODE_START, *changes], run="a-1")
    return [v.reason for v in replay(FileLog(path)).violations]


def test_a_wait_ended_that_takes_another_names_signal_is_a_violation(tmp_path: Path) -> None:
    reasons = violations(
        tmp_path / "log.jsonl",
        [
            WaitStarted(position=1, signal="approve"),
            SignalSent(name="deny", payload={}, id="x"),
            WaitEnded(position=1, signal=1),
        ],
    )
    assert reasons == [
        "wait at position 1 of run 'a-1' took signal 1 ('deny'), but it waits for 'approve'"
    ]


def test_a_signal_taken_twice_is_a_violation(tmp_path: Path) -> None:
    reasons = violations(
        tmp_path / "log.jsonl",
        [
            SignalSent(name="go", payload=1, id="x"),
            WaitStarted(position=1, signal="go"),
            WaitEnded(position=1, signal=1),
            WaitStarted(position=2, signal="go"),
            WaitEnded(position=2, signal=1),
        ],
    )
    assert reasons == [
        "wait at position 2 of run 'a-1' took signal 1, which the wait at position 1 took already"
    ]


def test_signals_of_one_name_taken_out_of_order_is_a_violation(tmp_path: Path) -> None:
    reasons = violations(
        tmp_path / "log.jsonl",
        [
            SignalSent(name="go", payload=1, id="x"),
            SignalSent(name="go", payload=2, id="y"),
            WaitStarted(position=1, signal="go"),
            WaitEnded(position=1, signal=2),
        ],
    )
    assert reasons == [
        "wait at position 1 of run 'a-1' took signal 2 before signal 1 of the same name"
        " (signals are taken in the order they were sent)"
    ]


def test_forged_wait_records_each_give_one_violation(tmp_path: Path) -> None:
    cases: list[tuple[list[Change], str]] = [
        ([WaitEnded(position=1)], "wait at position 1 of run 'a-1' ended, but it never started"),
        (
            [WaitStarted(position=1, signal="go"), WaitEnded(position=1)],
            "wait at position 1 of run 'a-1' ended by time, but it waits for signal 'go' with"
            " no timeout",
        ),
        (
            [WaitStarted(position=2, wake_us=5)],
            "a sleep of run 'a-1' started at position 2 where 1 was expected (positions go 1,"
            " 2, 3, ..., one record each)",
        ),
        (
            [WaitStarted(position=1, signal="go"), WaitEnded(position=1, signal=3)],
            "wait at position 1 of run 'a-1' took signal 3, but the run has 0 signal(s)",
        ),
        (
            [SignalSent(name="go", payload=1, id="x"), SignalSent(name="go", payload=2, id="x")],
            "signal 'go' of run 'a-1' recorded twice (id 'x')",
        ),
        (
            [RunCancelRequested(reason="no"), WaitStarted(position=1, wake_us=5)],
            "a sleep of run 'a-1' started after the run's cancel was requested",
        ),
        (
            [WaitStarted(position=1, wake_us=5), WaitEnded(position=1), WaitEnded(position=1)],
            "wait at position 1 of run 'a-1' ended twice",
        ),
    ]
    for index, (changes, reason) in enumerate(cases):
        assert violations(tmp_path / f"log{index}.jsonl", changes) == [reason], changes


def test_a_wait_in_a_dag_run_and_a_signal_after_the_end_are_violations(tmp_path: Path) -> None:
    path = write_log(
        tmp_path / "log.jsonl",
        [RunStarted(workflow="dag"), WaitStarted(position=1, wake_us=5), RunFinished()],
        run="d-1",
    )
    with RunLogWriter(path) as log:
        log.append("d-1", SignalSent(name="go", payload={}, id="late"))
    assert [v.reason for v in replay(FileLog(path)).violations] == [
        "a sleep started at position 1 in run 'd-1', which did not start as a code workflow's run",
        "record for run 'd-1' after the run finished",
    ]


def test_a_signal_sent_line_with_a_null_payload_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_log(path, [CODE_START], run="a-1")
    # a valid checksum over a line that says null: the decoder still refuses it
    line = encode_record(2, 5, "a-1", SignalSent(name="go", payload={}, id="x")).decode()
    body = line.replace('"payload":{}', '"payload":null')
    head = body[: body.index(',"crc"')]
    crc = format(zlib.crc32((head + "}").encode()), "08x")  # docs/run-log.md's rule
    with path.open("a") as out:
        out.write(f'{head},"crc":"{crc}"}}\n')
    [corrupt] = [item for item in read_log(path) if isinstance(item, CorruptLine)]
    assert corrupt.line == 2
    assert "field 'payload' of a signal_sent must be a JSON value other than null" in corrupt.reason


def test_the_docs_wait_example_decodes_to_these_records() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "run-log.md").read_text()
    section = doc[doc.index("## Waits and signals") :]
    block = section[section.index("```\n") + 4 : section.index("\n```", section.index("```\n") + 4)]
    folder = Path(tempfile.mkdtemp())
    (folder / "doc.jsonl").write_text(block + "\n")
    changes = [
        (item.seq, item.change) for item in read_log(folder / "doc.jsonl") if isinstance(item, Record)
    ]
    assert changes == [
        (7, WaitStarted(position=2, wake_us=1796116966000000)),
        (8, WaitEnded(position=2)),
        (9, WaitStarted(position=3, signal="approve", wake_us=1796120566000000)),
        (10, SignalSent(name="approve", payload={"by": "ana"}, id="5f0c9a1e7d3b2a44")),
        (11, WaitEnded(position=3, signal=1)),
    ]


# --------------------------------------------------------------------------
# Operators' changes, judged from the ledger alone
# --------------------------------------------------------------------------


def ledger_of(path: Path) -> Ledger:
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    return ledger


def test_signal_and_cancel_are_refused_for_unknown_finished_and_dag_runs(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [RunStarted(workflow="dag")], run="d-1")
    with RunLogWriter(path) as log:
        log.append("c-1", RunStarted(workflow="done", code=True))
        log.append("c-1", RunFinished())
    ledger = ledger_of(path)
    with pytest.raises(OperationRefused, match=r"no run 'x-9' in the log"):
        signal_change(ledger, "x-9", "go")
    with pytest.raises(OperationRefused, match=r"run 'c-1' has finished \(succeeded\)"):
        signal_change(ledger, "c-1", "go")
    with pytest.raises(OperationRefused, match=r"a DAG workflow's run"):
        signal_change(ledger, "d-1", "go")
    with pytest.raises(OperationRefused, match=r"run 'c-1' has finished"):
        cancel_change(ledger, "c-1")
    assert cancel_change(ledger, "d-1", "why") == RunCancelRequested(reason="why")
    with pytest.raises(OperationRefused, match=r"control character at index 1"):
        signal_change(ledger, "d-1", "a\x1bb")
    with pytest.raises(OperationRefused, match=r"not a JSON value"):
        signal_change(ledger, "d-1", "go", {"n": math.nan})


def test_a_signal_without_a_payload_carries_an_empty_object(tmp_path: Path) -> None:
    path = write_log(tmp_path / "log.jsonl", [CODE_START], run="a-1")
    change = signal_change(ledger_of(path), "a-1", "approve")
    assert change.payload == {} and change.name == "approve" and len(change.id) == 16


def test_refusal_drops_what_was_taken_in_already(tmp_path: Path) -> None:
    path = write_log(
        tmp_path / "log.jsonl",
        [CODE_START, SignalSent(name="go", payload=1, id="x"), RunCancelRequested(reason="r")],
        run="a-1",
    )
    ledger = ledger_of(path)
    assert refusal(ledger, "a-1", SignalSent(name="go", payload=1, id="x")) == (
        "signal 'x' is recorded already"
    )
    assert refusal(ledger, "a-1", SignalSent(name="go", payload=1, id="y")) is None
    assert refusal(ledger, "a-1", RunCancelRequested(reason="again")) == (
        "the cancel of run 'a-1' is recorded already"
    )
    assert refusal(ledger, "zz", RunCancelRequested()) == "no run 'zz' in the log"


# --------------------------------------------------------------------------
# Concurrent waits, and a crash at every record
# --------------------------------------------------------------------------


@workflow("fan")
async def fan(run: RunContext) -> JSON:
    async def branch(label: str, seconds: float) -> JSON:
        await run.sleep(seconds)
        return await run.step("after", noted, label)

    gathered: list[JSON] = list(
        await asyncio.gather(branch("slow", 20), branch("fast", 5), run.wait_for_signal("go", 60))
    )
    return gathered


def test_concurrent_waits_replay_in_their_recorded_order(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    report = drive(path, fan, "f-1", FakeTime())
    # positions are taken at the calls: the wait's call is made while gather's
    # arguments are built, before either branch runs, so the wait is @1, the
    # slow sleep @2 and the fast one @3; the fast branch then calls its step first
    assert report.result == ["slow", "fast", None]
    assert [(r["position"], r["wake_us"]) for r in of_type(path, "wait_started")] == [
        (1, 1_000_060_000_000), (2, 1_000_020_000_000), (3, 1_000_005_000_000),
    ]  # fmt: skip
    assert [r["step"] for r in of_type(path, "step_called")] == ["after@4", "after@5"]
    assert [r["position"] for r in of_type(path, "wait_ended")] == [3, 2, 1]
    lines = path.read_bytes().splitlines(keepends=True)
    clean = path.read_bytes()
    for cut in range(1, len(lines)):
        crashed = tmp_path / f"cut{cut}.jsonl"
        crashed.write_bytes(b"".join(lines[:cut]))
        last = json.loads(lines[cut - 1])["type"]
        if last == "run_finished":
            continue
        resumed = drive(crashed, fan, "f-1", FakeTime(START + 100), resume=True)
        assert resumed.result == ["slow", "fast", None], cut
        assert replay(FileLog(crashed)).valid, cut
        # the same positions for the same steps, whatever the crash point
        steps = [r["step"] for r in of_type(crashed, "step_called")]
        assert steps == ["after@4", "after@5"], (cut, steps)
    assert path.read_bytes() == clean


class Card:
    """A payment service that counts every charge it is asked for, by key."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}


def charging(card: Card) -> Workflow:
    async def charge(ctx: StepContext, amount: int) -> JSON:
        async def perform(key: str) -> JSON:
            card.charges[key] = card.charges.get(key, 0) + 1
            return {"charged": amount}

        return await ctx.effect("charge", perform)

    @workflow("charger")
    async def charger(run: RunContext) -> JSON:
        amount = await run.step("quote", noted, "40")
        answer = await run.wait_for_signal("approve", timeout=600)
        if answer is None:
            return "expired"
        if answer != {"ok": True}:
            return "denied"
        await run.sleep(3)  # a rate limit
        return await run.step("charge", charge, int(str(amount)))

    return charger


def test_a_crash_at_every_record_charges_the_card_at_most_once(tmp_path: Path) -> None:
    card = Card()
    flow = charging(card)
    path = tmp_path / "log.jsonl"

    async def approve(executor: Executor) -> None:
        await until_waiting(path)
        executor.deliver("c-1", signal("approve", {"ok": True}, "s1"))

    report = drive(path, flow, "c-1", FakeTime(), meanwhile=approve)
    assert report.result == {"charged": 40}
    assert list(card.charges.values()) == [1]
    lines = path.read_bytes().splitlines(keepends=True)
    for cut in range(1, len(lines)):
        if json.loads(lines[cut - 1])["type"] == "run_finished":
            continue
        crashed = tmp_path / f"cut{cut}.jsonl"
        crashed.write_bytes(b"".join(lines[:cut]))
        again = Card()
        kinds_before = [json.loads(line)["type"] for line in lines[:cut]]

        async def approve_if_needed(executor: Executor) -> None:
            if "signal_sent" not in kinds_before:
                await until_waiting(crashed)
                executor.deliver("c-1", signal("approve", {"ok": True}, "s1"))

        resumed = drive(
            crashed, charging(again), "c-1", FakeTime(START + 5), resume=True,
            meanwhile=approve_if_needed,
        )  # fmt: skip
        assert replay(FileLog(crashed)).valid, cut
        intents = [json.loads(line).get("to") for line in lines[:cut] if b'"intent"' in line]
        if "Confirmed" in intents:
            # the charge is known to have happened: its result is reused
            assert again.charges == {}, cut
            assert resumed.result == {"charged": 40}, cut
        elif "Dispatched" in intents:
            # the crash left the charge outstanding: never sent again
            assert again.charges == {}, cut
            assert resumed.status == "needs-reconciliation", cut
        else:
            assert list(again.charges.values()) == [1], cut
            assert resumed.result == {"charged": 40}, cut


# --------------------------------------------------------------------------
# Recovery and stops of waiting runs
# --------------------------------------------------------------------------


def test_recovery_closes_a_waiting_run_whose_cancel_was_decided(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    drive(path, approver, "a-1", FakeTime(hold=True), let_go_after=1.0)  # waits, let go
    with RunLogWriter(path) as log:
        log.append("a-1", RunCancelRequested(reason="the customer left"))
    resumed = resume_log(path, [approver])
    assert resumed.reports == ()  # nothing to run again: recovery closed it
    assert kinds(path)[-2:] == ["run_cancel_requested", "run_finished"]
    assert ledger_of(path).runs["a-1"].standing() == "cancelled"
    assert replay(FileLog(path)).valid


def test_a_stop_during_a_sleep_leaves_it_to_resume_with_the_remainder(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    time = FakeTime(hold=True)

    async def main() -> RunReport:
        with RunLogWriter(path, create=True) as log:
            executor = Executor(log, clock=time.clock, sleep=time.sleep)
            task = asyncio.ensure_future(executor.run(napper, "n-1"))
            await until_waiting(path)
            executor.stop("SIGTERM")
            return await task

    report = asyncio.run(main())
    assert report.status == "interrupted"
    assert kinds(path)[-2:] == ["wait_started", "run_stop_requested"]
    assert ledger_of(path).runs["n-1"].standing() == "waiting"
    later = FakeTime(START + 25)
    report = drive(path, napper, "n-1", later, resume=True)
    assert report.result == ["a", "b"] and later.slept == [5.0]
    assert replay(FileLog(path)).valid


def test_a_sleep_past_the_year_9999_is_recorded_and_its_progress_line_still_prints(
    tmp_path: Path,
) -> None:
    @workflow("long-nap")
    async def long_nap(run: RunContext) -> JSON:
        await run.sleep(1e300)
        return "woke"

    lines: list[str] = []

    async def main() -> RunReport:
        with RunLogWriter(tmp_path / "log.jsonl", create=True) as log:
            time = FakeTime(hold=True)
            executor = Executor(log, clock=time.clock, sleep=time.sleep, progress=lines.append)
            task = asyncio.ensure_future(executor.run(long_nap, "l-1"))
            await until_waiting(tmp_path / "log.jsonl")
            executor.stop("test")
            return await task

    assert asyncio.run(main()).status == "interrupted"
    [started] = of_type(tmp_path / "log.jsonl", "wait_started")
    assert started["wake_us"] == 1_000_000_000_000 + round(1e300 * 1_000_000)
    assert [line for line in lines if "sleeping" in line] == [
        f"l-1 @1: sleeping until time_us {1_000_000_000_000 + round(1e300 * 1_000_000)}"
    ]


def test_progress_lines_say_what_a_run_waits_for() -> None:
    from attempt_kernel._observe import wait_line

    assert wait_line("a-1", WaitStarted(position=2, signal="approve", wake_us=1_796_120_566_000_000)) == (
        "a-1 @2: waiting for signal 'approve' until 2026-12-01T10:22:46.000Z"  # date -u -d @1796120566
    )
    assert wait_line("a-1", WaitStarted(position=3, signal="go")) == "a-1 @3: waiting for signal 'go'"
    assert wait_line("a-1", WaitEnded(position=3, signal=4)) == "a-1 @3: wait ended (took signal 4)"
    assert wait_line("a-1", WaitEnded(position=2)) == "a-1 @2: wait ended (its wake time came)"


def test_a_wait_from_inside_a_step_or_after_the_run_is_refused(tmp_path: Path) -> None:
    kept: list[RunContext] = []

    async def sneaky(ctx: StepContext) -> JSON:
        run = kept[0]
        try:
            await run.sleep(1)
        except WorkflowError as error:
            return str(error)
        return "slept"

    @workflow("misuse")
    async def misuse(run: RunContext) -> JSON:
        kept.append(run)
        return await run.step("inner", sneaky)

    report = drive(tmp_path / "log.jsonl", misuse, "m-1", FakeTime())
    assert report.result == (
        "run.sleep() of run 'm-1' was called from inside a step (a step's function gets a"
        " StepContext, not the RunContext)"
    )
    with pytest.raises(WorkflowError) as caught:
        _ = kept[0].wait_for_signal("go")  # raises at the call, before anything to await
    assert str(caught.value) == (
        "run.wait_for_signal('go') was called after run 'm-1' finished; a wait belongs to the"
        " run whose function calls it, while it runs"
    )


def test_signal_and_cancel_name_a_run_with_records_but_no_start_and_a_finished_one(tmp_path: Path) -> None:
    """A log written by hand (as the README's examples/checkout.jsonl) can hold a run's
    records with no `run_started`: `runs` and `show` list such a run, and `signal` and
    `cancel` said there was no such run in the log."""
    path = write_log(tmp_path / "log.jsonl", [AttemptCreated(step="s", attempt=1)], run="h-1")
    with RunLogWriter(path) as log:
        log.append("h-2", AttemptCreated(step="s", attempt=1))
        log.append("h-2", RunFinished())
    ledger = ledger_of(path)
    no_start = (
        r"run 'h-1' has records in the log but no start record \(`run_started`\), so no workflow"
        r" of it is known and nothing would take the change in; nothing was written"
    )
    with pytest.raises(OperationRefused, match=no_start):
        signal_change(ledger, "h-1", "go")
    with pytest.raises(OperationRefused, match=no_start):
        cancel_change(ledger, "h-1")
    with pytest.raises(OperationRefused, match=r"run 'h-2' has finished \([a-z-]+\); nothing was written"):
        signal_change(ledger, "h-2", "go")
    assert refusal(ledger, "h-1", RunCancelRequested()) == (
        "run 'h-1' has records in the log but no start record (`run_started`), so no workflow"
        " of it is known and nothing would take the change in"
    )
