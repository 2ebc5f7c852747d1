"""Runs that wait: durable sleeps, signals as a mailbox, cancels of a waiting run.

Every test drives the executor with a fake clock and a fake sleep (the
clock moves only when the run sleeps), so no test waits on the machine's
time. Expected records are written out by hand.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from attempt_kernel import (
    JSON,
    Executor,
    FileLog,
    RunCancelRequested,
    RunContext,
    RunLogWriter,
    RunReport,
    SignalSent,
    StepContext,
    Workflow,
    WorkflowDiverged,
    WorkflowError,
    replay,
    workflow,
)
from attempt_kernel._ledger import Ledger

START = 1_000_000.0
"""The fake clock's start, in seconds since the epoch."""


class FakeTime:
    """A clock that moves only when someone sleeps on it."""

    def __init__(self, now: float = START, *, hold: bool = False) -> None:
        self.now = now
        self.slept: list[float] = []
        self.hold = hold
        """Sleeps never end (as a real hour-long one would not, within a test)."""

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.hold:
            await asyncio.Event().wait()
        self.now += seconds
        await asyncio.sleep(0)


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
        with RunLogWriter(path, create=True) as log:
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


@pytest.mark.parametrize("seconds", [-1, -0.001, math.inf, -math.inf, math.nan, "3", True, None])
def test_a_bad_sleep_raises_at_the_call(tmp_path: Path, seconds: object) -> None:
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


@pytest.mark.parametrize("timeout", [-5, math.inf, math.nan])
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
