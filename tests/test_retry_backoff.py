"""The wait before a retry: its formula, its jitter, its durability, and non-retryable errors.

Time is faked throughout: the executor gets a clock and a sleep that record
the waits asked of them, so no test waits for real or races the machine.
Expected waits are written by hand from the rule in `RetryPolicy`'s doc.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from attempt_kernel import (
    JSON,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Change,
    Confirm,
    Confirmed,
    CorruptLine,
    Dispatch,
    Dispatched,
    Executor,
    Fail,
    Failed,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Pending,
    Planned,
    PriorStep,
    Record,
    RetryPolicy,
    RunControl,
    RunLogWriter,
    RunReport,
    RunStarted,
    Running,
    Step,
    StepContext,
    StepOutcome,
    StepResult,
    Succeeded,
    TimedOut,
    Workflow,
    WorkflowError,
    load_workflow,
    read_log,
    recover_log,
    replay,
)
from attempt_kernel._codec import decode_line, encode_record
from attempt_kernel._ledger import retry_delay
from attempt_kernel._workflow import check_step

T_US = 1_000_000_000
"""When the hand-written logs' records were written: 1000 s after the epoch."""
T = 1000.0


class FakeTime:
    """A clock that moves only when the executor sleeps; every sleep is recorded."""

    def __init__(self, now: float = T) -> None:
        self.now = now
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


class StuckTime:
    """A sleep that never ends by itself; ``asleep`` is set once a wait began."""

    def __init__(self, now: float = T) -> None:
        self.now = now
        self.waits: list[float] = []
        self.asleep = asyncio.Event()
        self.interrupted = False

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.asleep.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.interrupted = True
            raise


class Calls:
    """Steps that count their attempts and fail as told."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def failing(self, error: Callable[[int], Exception | None]) -> Callable[[StepContext], Awaitable[JSON]]:
        async def run(ctx: StepContext) -> JSON:
            self.attempts.append(ctx.attempt)
            raised = error(ctx.attempt)
            if raised is not None:
                raise raised
            return "done"

        return run


def always(error: Exception) -> Callable[[int], Exception | None]:
    return lambda attempt: error


def until(last_failing: int) -> Callable[[int], Exception | None]:
    return lambda attempt: RuntimeError("429 Too Many Requests") if attempt <= last_failing else None


def workflow(calls: Calls, error: Callable[[int], Exception | None], policy: RetryPolicy) -> Workflow:
    return load_workflow("w", [Step(name="s", run=calls.failing(error), retry=policy)])


def execute(path: Path, flow: Workflow, time: FakeTime, run: str = "r") -> RunReport:
    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            return await Executor(log, clock=time.clock, sleep=time.sleep).run(flow, run)

    return asyncio.run(main())


def the_step(report: RunReport) -> StepOutcome:
    [outcome] = report.steps
    return outcome


def results(path: Path) -> list[StepResult]:
    return [i.change for i in read_log(path) if isinstance(i, Record) and isinstance(i.change, StepResult)]


def write(path: Path, changes: list[Change], at_us: int = T_US) -> Path:
    """A log of run 'r' whose records were all written at ``at_us``; no run_finished (a crash)."""
    with RunLogWriter(path, clock=lambda: at_us) as log:
        for change in [RunStarted(workflow="w"), *changes]:
            log.append("r", change)
    return path


def failed_attempt(number: int, *, retryable: bool = True) -> list[Change]:
    return [
        AttemptCreated(step="s", attempt=number),
        AttemptTransitioned(step="s", attempt=number, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step="s", attempt=number, error="RuntimeError: 429", retryable=retryable),
        AttemptTransitioned(step="s", attempt=number, from_state=Running(), cause=Fail(), to_state=Failed()),
    ]


def resume(path: Path, flow: Workflow, time: FakeTime) -> RunReport:
    """Recover the log, then resume its one run with a fake-timed executor."""
    writer, recovery = recover_log(path, {"w": flow})
    with writer:
        [run] = recovery.runs

        async def main() -> RunReport:
            executor = Executor(writer, clock=time.clock, sleep=time.sleep)
            return await executor.run(flow, "r", prior=run.steps)

        return asyncio.run(main())


# --------------------------------------------------------------------------
# The waits between attempts
# --------------------------------------------------------------------------


def test_waits_double_from_the_initial_interval_up_to_the_cap(tmp_path: Path) -> None:
    """initial 1, factor 2, max 5, five failing tries: the executor sleeps 1, 2, 4, 5."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=5, initial_interval=1.0, backoff_factor=2.0, max_interval=5.0)
    report = execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    assert time.waits == [1.0, 2.0, 4.0, 5.0]
    assert calls.attempts == [1, 2, 3, 4, 5]
    assert (the_step(report).state, the_step(report).attempts) == (Failed(), 5)
    assert replay(tmp_path / "log").valid


def test_default_policy_waits_one_second_then_doubles(tmp_path: Path) -> None:
    """Asked only for attempts, a step waits 1 s, then 2 s, then 4 s."""
    calls, time = Calls(), FakeTime()
    report = execute(tmp_path / "log", workflow(calls, until(3), RetryPolicy(max_attempts=4)), time)
    assert time.waits == [1.0, 2.0, 4.0]
    assert (the_step(report).state, the_step(report).attempts) == (Succeeded(), 4)


def test_default_cap_is_a_hundred_times_the_initial_interval(tmp_path: Path) -> None:
    """initial 0.5 s and no max_interval: the doubling stops at 50 s."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=9, initial_interval=0.5)
    execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    assert time.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 50.0]


def test_default_cap_stops_the_doubling_at_a_hundred_seconds(tmp_path: Path) -> None:
    """initial 1 s, doubling, no max_interval: the eighth retry waits 100 s, not 128 s."""
    calls, time = Calls(), FakeTime()
    execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), RetryPolicy(max_attempts=10)), time)
    assert time.waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 100.0, 100.0]


def test_max_interval_caps_every_later_wait(tmp_path: Path) -> None:
    """initial 3, factor 10, max 7: 3, then 7 and 7 (30 and 300 capped)."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=4, initial_interval=3.0, backoff_factor=10.0, max_interval=7.0)
    execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    assert time.waits == [3.0, 7.0, 7.0]


def test_factor_one_waits_the_same_each_time(tmp_path: Path) -> None:
    """backoff_factor 1 keeps every wait at initial_interval."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=4, initial_interval=0.25, backoff_factor=1.0)
    execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    assert time.waits == [0.25, 0.25, 0.25]


def test_initial_interval_zero_retries_at_once(tmp_path: Path) -> None:
    """initial_interval 0: every attempt starts at once; the sleep is never asked."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=3, initial_interval=0.0)
    report = execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    assert time.waits == [] and the_step(report).attempts == 3


def test_a_step_timeout_waits_like_a_failure(tmp_path: Path) -> None:
    """A step-deadline TimedOut counts as a try, so its retry waits too."""
    time = FakeTime()
    seen: list[int] = []

    async def slow_once(ctx: StepContext) -> JSON:
        seen.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.sleep(3600)
        return "done"

    flow = load_workflow(
        "w", [Step(name="s", run=slow_once, step_deadline=0.01, retry=RetryPolicy(max_attempts=2))]
    )
    report = execute(tmp_path / "log", flow, time)
    assert time.waits == [1.0] and seen == [1, 2]
    assert the_step(report).state == Succeeded()


def test_huge_try_counts_wait_the_cap_without_overflow() -> None:
    """2.0 ** 4999 overflows a float; the wait is simply max_interval."""
    policy = RetryPolicy(max_attempts=10_000, initial_interval=1.0, backoff_factor=2.0, max_interval=60.0)
    assert retry_delay(policy, 5000, run="r", step="s", attempt=5001) == 60.0


def test_no_try_yet_means_no_wait() -> None:
    """After no counted try (only cancels), the formula asks for no wait."""
    assert retry_delay(RetryPolicy(max_attempts=3), 0, run="r", step="s", attempt=2) == 0.0


# --------------------------------------------------------------------------
# Jitter
# --------------------------------------------------------------------------

def jittery() -> RetryPolicy:
    """A constant 4 s wait, jittered by up to half of it."""
    return RetryPolicy(max_attempts=20, initial_interval=4.0, backoff_factor=1.0, jitter=0.5)


JITTERY = jittery()
RUNS = ["r", "order-1042", "", "ünïcode", "run with spaces"]
STEPS = ["s", "charge", "call-model"]


def test_jitter_stays_within_its_fraction_of_the_wait() -> None:
    """Jitter 0.5 on a 4 s wait: every wait lies in [2, 6]."""
    for run in RUNS:
        for step in STEPS:
            for attempt in range(2, 60):
                delay = retry_delay(JITTERY, 1, run=run, step=step, attempt=attempt)
                assert 2.0 <= delay <= 6.0, (run, step, attempt, delay)


def test_jitter_is_the_same_for_the_same_run_step_and_attempt() -> None:
    """The wait is recomputed identically (as after a crash): no random draw."""
    for run in RUNS:
        for step in STEPS:
            for attempt in (2, 3, 17):
                first = retry_delay(JITTERY, 1, run=run, step=step, attempt=attempt)
                again = retry_delay(jittery(), 1, run=run, step=step, attempt=attempt)
                assert first == again


def test_jitter_differs_between_attempts_and_runs() -> None:
    """Different attempts (and runs) get different waits: retries do not move in step."""
    by_attempt = {retry_delay(JITTERY, 1, run="r", step="s", attempt=a) for a in range(2, 22)}
    by_run = {retry_delay(JITTERY, 1, run=run, step="s", attempt=2) for run in RUNS}
    assert len(by_attempt) > 10 and len(by_run) > 3


def test_jitter_zero_and_no_wait_stay_exact() -> None:
    """No jitter leaves the wait as the formula says; jitter on a zero wait is still zero."""
    assert retry_delay(RetryPolicy(initial_interval=1.5), 2, run="r", step="s", attempt=3) == 3.0
    zero = RetryPolicy(initial_interval=0.0, jitter=1.0)
    assert retry_delay(zero, 4, run="r", step="s", attempt=5) == 0.0


def test_jitter_applies_after_the_cap(tmp_path: Path) -> None:
    """Waits through the executor: capped at 2 s, then moved by up to 10 % (so 1.8 to 2.2)."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=6, initial_interval=1.0, max_interval=2.0, jitter=0.1)
    execute(tmp_path / "log", workflow(calls, always(RuntimeError("429")), policy), time)
    [first, *rest] = time.waits
    assert 0.9 <= first <= 1.1
    assert len(rest) == 4 and all(1.8 <= wait <= 2.2 for wait in rest)


def test_two_executions_of_a_run_wait_the_same(tmp_path: Path) -> None:
    """The same run id, step and attempts: the same jittered waits, in another process or log."""
    policy = RetryPolicy(max_attempts=4, jitter=0.3)
    one, two = FakeTime(), FakeTime()
    execute(tmp_path / "one", workflow(Calls(), always(RuntimeError("429")), policy), one, run="order-7")
    execute(tmp_path / "two", workflow(Calls(), always(RuntimeError("429")), policy), two, run="order-7")
    assert one.waits == two.waits and len(one.waits) == 3
    assert one.waits != [1.0, 2.0, 4.0]  # jittered indeed


# --------------------------------------------------------------------------
# Non-retryable errors
# --------------------------------------------------------------------------


class BadRequest(ValueError):
    """A 400: asking again gives the same answer."""


def test_non_retryable_error_stops_at_the_first_attempt(tmp_path: Path) -> None:
    """A non-retryable type ends the step at once, with attempts left and no wait."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=5, non_retryable=(BadRequest,))
    report = execute(tmp_path / "log", workflow(calls, always(BadRequest("bad prompt")), policy), time)
    assert calls.attempts == [1] and time.waits == []
    assert (the_step(report).state, the_step(report).error) == (Failed(), "BadRequest: bad prompt")
    assert report.status == "failed"
    assert [r.retryable for r in results(tmp_path / "log")] == [False]
    assert b'"retry":false' in (tmp_path / "log").read_bytes()


def test_a_subclass_of_a_non_retryable_type_is_not_retried(tmp_path: Path) -> None:
    """non_retryable matches as isinstance does: ValueError covers BadRequest."""
    calls, time = Calls(), FakeTime()
    policy = RetryPolicy(max_attempts=5, non_retryable=(KeyError, ValueError))
    execute(tmp_path / "log", workflow(calls, always(BadRequest("no")), policy), time)
    assert calls.attempts == [1]


def test_other_errors_are_still_retried_until_a_non_retryable_one(tmp_path: Path) -> None:
    """A 429 is retried after its wait; the 400 that follows ends the step."""
    calls, time = Calls(), FakeTime()

    def errors(attempt: int) -> Exception:
        return RuntimeError("429") if attempt == 1 else BadRequest("400")

    policy = RetryPolicy(max_attempts=5, non_retryable=(BadRequest,))
    report = execute(tmp_path / "log", workflow(calls, errors, policy), time)
    assert calls.attempts == [1, 2] and time.waits == [1.0]
    assert the_step(report).attempts == 2
    assert [r.retryable for r in results(tmp_path / "log")] == [True, False]
    assert b'"retry":true' not in (tmp_path / "log").read_bytes()  # written only when false


def test_the_last_try_the_policy_allows_says_so_in_its_result(tmp_path: Path) -> None:
    """Three tries allowed, all failing: the third result is the step's end, and the log
    says so (`retry: false`), as for a non-retryable error; the first two say nothing."""
    calls, time = Calls(), FakeTime()
    report = execute(tmp_path / "log", workflow(calls, until(9), RetryPolicy(max_attempts=3)), time)
    assert calls.attempts == [1, 2, 3] and report.status == "failed"
    assert [r.retryable for r in results(tmp_path / "log")] == [True, True, False]


def test_a_step_done_with_its_last_try_is_not_retried_under_a_policy_that_now_allows_more(
    tmp_path: Path,
) -> None:
    """Failed on the last of two tries, then a crash before the run's end was written;
    the code now allows five tries. The step was done: recovery runs nothing again."""
    calls, time = Calls(), FakeTime()
    execute(tmp_path / "clean", workflow(calls, until(9), RetryPolicy(max_attempts=2)), time)
    lines = (tmp_path / "clean").read_bytes().splitlines(keepends=True)
    assert b"run_finished" in lines[-1]
    path = tmp_path / "log"
    path.write_bytes(b"".join(lines[:-1]))
    calls = Calls()
    report = resume(path, workflow(calls, until(9), RetryPolicy(max_attempts=5)), time)
    assert calls.attempts == [] and report.status == "failed"
    assert (the_step(report).state, the_step(report).attempts) == (Failed(), 2)
    assert replay(path).valid


class Hangs:
    """A step that never returns: its step deadline ends each of its attempts."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    async def run(self, ctx: StepContext) -> JSON:
        self.attempts.append(ctx.attempt)
        await asyncio.Event().wait()
        return None


def hanging(hangs: Hangs, policy: RetryPolicy) -> Workflow:
    return load_workflow("w", [Step(name="s", run=hangs.run, retry=policy, step_deadline=0.01)])


def test_the_last_try_ended_by_its_step_deadline_says_so_in_a_result(tmp_path: Path) -> None:
    """Two tries allowed, both past their deadline: the second's end is a result that says
    `retry: false`, written before its TimedOut; the first writes none (a try follows it)."""
    hangs, time = Hangs(), FakeTime()
    report = execute(tmp_path / "log", hanging(hangs, RetryPolicy(max_attempts=2)), time)
    assert hangs.attempts == [1, 2] and report.status == "failed"
    assert (the_step(report).state, the_step(report).error) == (TimedOut(), "step deadline passed")
    assert [(r.attempt, r.error, r.retryable) for r in results(tmp_path / "log")] == [
        (2, "step deadline passed", False)
    ]
    assert replay(tmp_path / "log").valid


def test_a_deadline_the_policy_does_not_retry_ends_the_step_at_its_first_try_and_says_so(tmp_path: Path) -> None:
    """retry_on_timeout=False with five tries allowed: the first deadline ends the step, in the log."""
    hangs, time = Hangs(), FakeTime()
    report = execute(tmp_path / "log", hanging(hangs, RetryPolicy(max_attempts=5, retry_on_timeout=False)), time)
    assert hangs.attempts == [1] and the_step(report).state == TimedOut()
    assert [(r.attempt, r.retryable) for r in results(tmp_path / "log")] == [(1, False)]


def test_a_step_whose_last_try_passed_its_deadline_is_not_retried_under_a_policy_that_now_allows_more(
    tmp_path: Path,
) -> None:
    """Timed out on the last of two tries, then a crash before the run's end was written;
    the code now allows five tries. The step was done: recovery runs nothing again (it
    ran tries 3, 4 and 5 when the log did not say so)."""
    hangs, time = Hangs(), FakeTime()
    execute(tmp_path / "clean", hanging(hangs, RetryPolicy(max_attempts=2)), time)
    lines = (tmp_path / "clean").read_bytes().splitlines(keepends=True)
    assert b"run_finished" in lines[-1]
    path = tmp_path / "log"
    path.write_bytes(b"".join(lines[:-1]))
    hangs = Hangs()
    report = resume(path, hanging(hangs, RetryPolicy(max_attempts=5)), time)
    assert hangs.attempts == [] and report.status == "failed"
    assert (the_step(report).state, the_step(report).attempts) == (TimedOut(), 2)
    assert replay(path).valid


def test_non_retryable_failure_is_not_retried_after_a_crash(tmp_path: Path) -> None:
    """The log says the error was non-retryable: recovery's resume point says so, and nothing runs."""
    path = write(tmp_path / "log", failed_attempt(1, retryable=False))
    calls, time = Calls(), FakeTime()
    flow = workflow(calls, until(0), RetryPolicy(max_attempts=5, non_retryable=(BadRequest,)))
    writer, recovery = recover_log(path, {"w": flow})
    writer.close()
    [run] = recovery.runs
    assert run.steps["s"].retryable is False
    report = resume(path, flow, time)
    assert calls.attempts == [] and time.waits == []
    assert (the_step(report).state, the_step(report).attempts) == (Failed(), 1)
    assert report.status == "failed" and replay(path).valid


def test_a_retryable_failure_is_retried_after_a_crash(tmp_path: Path) -> None:
    """The control: the same log without the flag gets its second attempt."""
    path = write(tmp_path / "log", failed_attempt(1))
    calls, time = Calls(), FakeTime(now=T + 30)
    report = resume(path, workflow(calls, until(0), RetryPolicy(max_attempts=5)), time)
    assert calls.attempts == [2] and the_step(report).state == Succeeded()


def test_a_crash_between_a_non_retryable_result_and_its_fail_runs_nothing_again(tmp_path: Path) -> None:
    """Recovery ends the attempt Cancelled, but the recorded result already said: no retry."""
    path = write(tmp_path / "log", failed_attempt(1, retryable=False)[:3])
    calls, time = Calls(), FakeTime()
    report = resume(path, workflow(calls, until(0), RetryPolicy(max_attempts=5)), time)
    assert calls.attempts == [] and report.status == "failed"
    assert replay(path).valid


# --------------------------------------------------------------------------
# Durability: the wait survives a crash and a stop
# --------------------------------------------------------------------------


def test_a_crash_during_the_wait_resumes_with_only_the_remainder(tmp_path: Path) -> None:
    """Failed at T, resumed at T + 0.7 with a 1 s wait: the executor sleeps 0.3 s."""
    path = write(tmp_path / "log", failed_attempt(1))
    calls, time = Calls(), FakeTime(now=T + 0.7)
    report = resume(path, workflow(calls, until(1), RetryPolicy(max_attempts=3)), time)
    assert time.waits == [pytest.approx(0.3)]
    assert calls.attempts == [2] and the_step(report).state == Succeeded()
    assert replay(path).valid


def test_the_remainder_follows_the_backoff_of_the_tries_so_far(tmp_path: Path) -> None:
    """Two tries failed, the second at T: the 2 s wait resumed at T + 0.5 has 1.5 s left."""
    path = write(tmp_path / "log", [*failed_attempt(1), *failed_attempt(2)])
    calls, time = Calls(), FakeTime(now=T + 0.5)
    resume(path, workflow(calls, until(2), RetryPolicy(max_attempts=4)), time)
    assert time.waits == [pytest.approx(1.5)] and calls.attempts == [3]


def test_a_wait_that_passed_during_the_crash_is_not_waited(tmp_path: Path) -> None:
    """Resumed 5 s after a 1 s wait began: the next attempt starts at once."""
    path = write(tmp_path / "log", failed_attempt(1))
    calls, time = Calls(), FakeTime(now=T + 5)
    resume(path, workflow(calls, until(1), RetryPolicy(max_attempts=3)), time)
    assert time.waits == [] and calls.attempts == [2]


def test_a_clock_behind_the_log_waits_no_longer_than_the_whole_wait(tmp_path: Path) -> None:
    """The resuming clock reads before the failure's record: the wait is the whole 1 s, no more."""
    path = write(tmp_path / "log", failed_attempt(1))
    calls, time = Calls(), FakeTime(now=T - 60)
    resume(path, workflow(calls, until(1), RetryPolicy(max_attempts=3)), time)
    assert time.waits == [1.0]


def test_a_cancelled_attempt_is_retried_at_once(tmp_path: Path) -> None:
    """Attempt 1 failed at T, attempt 2 was Running at the crash: recovery cancels it,
    and attempt 3 starts without a wait (a cancel is not the step's failure)."""
    second = failed_attempt(2)[:2]
    path = write(tmp_path / "log", [*failed_attempt(1), *second])
    calls, time = Calls(), FakeTime(now=T)
    report = resume(path, workflow(calls, until(0), RetryPolicy(max_attempts=3)), time)
    assert time.waits == [] and calls.attempts == [3]
    assert the_step(report).state == Succeeded()


def test_a_reconciled_indeterminate_attempt_is_retried_at_once(tmp_path: Path) -> None:
    """Attempt 1 failed at T; attempt 2 ended Indeterminate and its intent was reconciled
    since: attempt 3 starts without a wait (the step did not fail, it was stopped)."""
    second: list[Change] = [
        *failed_attempt(2)[:2],
        IntentPlanned(step="s", attempt=2, name="send", key="k-send"),
        IntentChanged(step="s", attempt=2, name="send", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        AttemptTransitioned(step="s", attempt=2, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()),
        IntentReconciled(step="s", attempt=2, name="send", key="k-send", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed(), by="operator"),
    ]  # fmt: skip
    path = write(tmp_path / "log", [*failed_attempt(1), *second])
    calls, time = Calls(), FakeTime(now=T)
    report = resume(path, workflow(calls, until(0), RetryPolicy(max_attempts=3)), time)
    assert time.waits == [] and calls.attempts == [3]
    assert the_step(report).state == Succeeded() and replay(path).valid


def test_a_resume_point_without_an_end_time_waits_the_whole_wait(tmp_path: Path) -> None:
    """A hand-built resume point that does not say when the attempt ended: the full 1 s."""
    calls, time = Calls(), FakeTime()
    flow = workflow(calls, until(1), RetryPolicy(max_attempts=3))
    prior = {"s": PriorStep(last_attempt=1, state=Failed(), last_cause=Fail(), tries=1)}

    async def main() -> RunReport:
        with RunLogWriter(tmp_path / "log") as log:
            executor = Executor(log, clock=time.clock, sleep=time.sleep)
            return await executor.run(flow, "r", prior=prior)

    report = asyncio.run(main())
    assert time.waits == [1.0] and the_step(report).state == Succeeded()


def test_recovery_hands_the_failure_time_to_the_resume_point(tmp_path: Path) -> None:
    """PriorStep.ended_us is the time of the record that ended the last attempt."""
    path = write(tmp_path / "log", failed_attempt(1), at_us=T_US + 250_000)
    writer, recovery = recover_log(path, {"w": workflow(Calls(), until(0), RetryPolicy())})
    writer.close()
    [run] = recovery.runs
    assert run.steps["s"].ended_us == T_US + 250_000 and run.steps["s"].retryable is True


# --------------------------------------------------------------------------
# A cancel or a stop during the wait
# --------------------------------------------------------------------------


async def settle(task: asyncio.Task[RunReport]) -> None:
    """Let the event loop run a bounded number of turns (not wall-clock time)."""
    for _ in range(100):
        if task.done():
            return
        await asyncio.sleep(0)


def test_a_cancel_during_the_wait_starts_no_new_attempt(tmp_path: Path) -> None:
    """RunControl.cancel() while the step waits to retry: the wait ends, no attempt 2."""
    calls, time = Calls(), StuckTime()
    flow = workflow(calls, always(RuntimeError("429")), RetryPolicy(max_attempts=3))
    path = tmp_path / "log"

    async def main() -> RunReport:
        control = RunControl()
        with RunLogWriter(path) as log:
            executor = Executor(log, clock=time.clock, sleep=time.sleep)
            task = asyncio.ensure_future(executor.run(flow, "r", control=control))
            await time.asleep.wait()
            control.cancel()
            await settle(task)
            assert task.done(), "the cancel did not end the wait"
            return task.result()

    report = asyncio.run(main())
    assert time.waits == [1.0] and time.interrupted and calls.attempts == [1]
    assert report.status == "cancelled" and the_step(report).attempts == 1
    created = [i.change for i in read_log(path) if isinstance(i, Record) and isinstance(i.change, AttemptCreated)]
    assert len(created) == 1
    assert replay(path).valid


def test_a_stop_during_the_wait_ends_it_at_once_and_recovery_waits_the_rest(tmp_path: Path) -> None:
    """Executor.stop() while the step waits: the wait ends (however long the grace), no
    attempt starts, the run stays unfinished; resumed 0.4 s later, it waits the last 0.6 s."""
    calls, stuck = Calls(), StuckTime()
    flow = workflow(calls, until(1), RetryPolicy(max_attempts=3))
    path = tmp_path / "log"

    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            executor = Executor(log, clock=stuck.clock, sleep=stuck.sleep)
            task = asyncio.ensure_future(executor.run(flow, "r"))
            await stuck.asleep.wait()
            executor.stop("test", grace=3600.0)
            await settle(task)
            if not task.done():
                task.cancel()
                pytest.fail("the stop did not end the wait")
            return task.result()

    report = asyncio.run(main())
    assert stuck.waits == [1.0] and stuck.interrupted and calls.attempts == [1]
    assert report.status == "interrupted" and the_step(report).attempts == 1
    check = replay(path)
    assert check.valid and check.unfinished == ("r",)
    # The failure's record was stamped by the writer's real clock; resume 0.4 s after it.
    [ended] = [
        i.time_us for i in read_log(path)
        if isinstance(i, Record) and isinstance(i.change, AttemptTransitioned) and i.change.to_state == Failed()
    ]  # fmt: skip
    time = FakeTime(now=ended / 1_000_000 + 0.4)
    resumed = resume(path, flow, time)
    assert time.waits == [pytest.approx(0.6)] and calls.attempts == [1, 2]
    assert resumed.status == "succeeded" and replay(path).valid


@pytest.mark.parametrize("initial_interval", [1.0, 0.0])
def test_a_stop_not_yet_recorded_when_the_wait_begins_still_starts_no_attempt(
    tmp_path: Path, initial_interval: float
) -> None:
    """The step asks the stop as it fails (as a refused dispatch does): the wait does
    not begin, and the step waits for run() to record the stop rather than create
    attempt 2 under a stop that is asked but not yet written (with a wait or without)."""
    time = FakeTime()
    path = tmp_path / "log"
    executors: list[Executor] = []

    async def fails_and_stops(ctx: StepContext) -> JSON:
        executors[0].stop("asked by the step", grace=3600.0)
        raise RuntimeError("429")

    policy = RetryPolicy(max_attempts=3, initial_interval=initial_interval)
    flow = load_workflow("w", [Step(name="s", run=fails_and_stops, retry=policy)])

    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            executors.append(Executor(log, clock=time.clock, sleep=time.sleep))
            return await executors[0].run(flow, "r")

    report = asyncio.run(main())
    assert time.waits == [] and report.status == "interrupted"
    created = [i.change for i in read_log(path) if isinstance(i, Record) and isinstance(i.change, AttemptCreated)]
    assert len(created) == 1 and replay(path).valid


# --------------------------------------------------------------------------
# The log field
# --------------------------------------------------------------------------


def line(body: str) -> bytes:
    """A checksummed line holding ``body`` (a JSON object without its crc)."""
    raw = body.encode()
    return raw[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(raw)


HEAD = '{"v":1,"seq":1,"time_us":5,"run":"r","type":"result","step":"s","attempt":1'


def test_retry_false_is_written_after_the_error_and_read_back() -> None:
    """The wire form of a non-retryable result, and its decoding."""
    raw = encode_record(1, 5, "r", StepResult(step="s", attempt=1, error="E: x", retryable=False))
    assert raw == line(HEAD + ',"ok":false,"error":"E: x","retry":false}')
    decoded = decode_line(raw, 1)
    assert isinstance(decoded, Record)
    assert decoded.change == StepResult(step="s", attempt=1, error="E: x", retryable=False)


def test_a_result_without_the_field_is_retryable() -> None:
    """Logs written before the field existed read as they did."""
    decoded = decode_line(line(HEAD + ',"ok":false,"error":"E: x"}'), 1)
    assert isinstance(decoded, Record) and isinstance(decoded.change, StepResult)
    assert decoded.change.retryable is True


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (',"ok":false,"error":"E","retry":"no"}', "field 'retry' must be true or false, got 'no'"),
        (',"ok":false,"error":"E","retry":0}', "field 'retry' must be true or false, got 0"),
        (',"ok":false,"error":"E","retry":null}', "field 'retry' must be true or false, got None"),
        (',"ok":true,"value":1,"retry":false}', "field 'retry' belongs to a result with ok false"),
    ],
)
def test_a_wrong_retry_field_is_a_corrupt_line_naming_it(tail: str, reason: str) -> None:
    """Only a JSON boolean, and only on a failed result."""
    decoded = decode_line(line(HEAD + tail), 7)
    assert decoded == CorruptLine(line=7, reason=reason)


# --------------------------------------------------------------------------
# Loading refuses a policy out of range
# --------------------------------------------------------------------------


async def nothing(ctx: StepContext) -> JSON:
    return None


def with_policy(policy: RetryPolicy) -> list[Step]:
    return [Step(name="a", run=nothing, retry=policy)]


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (RetryPolicy(initial_interval=-1.0), "retry.initial_interval must be a finite number of seconds, 0 or more (0: retry at once), got -1.0"),
        (RetryPolicy(initial_interval=float("nan")), "retry.initial_interval must be a finite number of seconds, 0 or more (0: retry at once), got nan"),
        (RetryPolicy(initial_interval=float("inf")), "retry.initial_interval must be a finite number of seconds, 0 or more (0: retry at once), got inf"),
        (RetryPolicy(initial_interval=True), "retry.initial_interval must be a finite number of seconds, 0 or more (0: retry at once), got True"),
        (RetryPolicy(initial_interval="1"), "retry.initial_interval must be a finite number of seconds, 0 or more (0: retry at once), got '1'"),  # type: ignore[arg-type]
        (RetryPolicy(backoff_factor=0.5), "retry.backoff_factor must be a finite number, 1 or more (1: every wait the same), got 0.5"),
        (RetryPolicy(backoff_factor=float("inf")), "retry.backoff_factor must be a finite number, 1 or more (1: every wait the same), got inf"),
        (RetryPolicy(max_interval=0.5), "retry.max_interval must be None or a finite number of seconds, at least initial_interval (1.0), got 0.5"),
        (RetryPolicy(initial_interval=10, max_interval=9.5), "retry.max_interval must be None or a finite number of seconds, at least initial_interval (10), got 9.5"),
        (RetryPolicy(max_interval=float("inf")), "retry.max_interval must be None or a finite number of seconds, at least initial_interval (1.0), got inf"),
        (RetryPolicy(jitter=-0.1), "retry.jitter must be a fraction from 0 to 1, got -0.1"),
        (RetryPolicy(jitter=1.5), "retry.jitter must be a fraction from 0 to 1, got 1.5"),
        (RetryPolicy(jitter=float("nan")), "retry.jitter must be a fraction from 0 to 1, got nan"),
        (RetryPolicy(non_retryable=[ValueError]), "retry.non_retryable must be a tuple of exception types, got [<class 'ValueError'>]"),  # type: ignore[arg-type]
        (RetryPolicy(non_retryable=(ValueError, "KeyError")), "retry.non_retryable must hold exception types (subclasses of Exception, which is what a step's failure is), got 'KeyError'"),  # type: ignore[arg-type]
        (RetryPolicy(non_retryable=(KeyboardInterrupt,)), "retry.non_retryable must hold exception types (subclasses of Exception, which is what a step's failure is), got <class 'KeyboardInterrupt'>"),  # type: ignore[arg-type]
        (RetryPolicy(non_retryable=(ValueError(),)), "retry.non_retryable must hold exception types (subclasses of Exception, which is what a step's failure is), got ValueError()"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_load_workflow_refuses_each_bad_retry_field_naming_it(policy: RetryPolicy, message: str) -> None:
    """Each out-of-range field is a WorkflowError naming the workflow, the step and the field."""
    with pytest.raises(WorkflowError) as info:
        load_workflow("w", with_policy(policy))
    assert str(info.value) == f"workflow 'w', step 'a': {message}"


@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(),
        RetryPolicy(initial_interval=0, max_interval=0),
        RetryPolicy(initial_interval=0),
        RetryPolicy(backoff_factor=1, jitter=1.0),
        RetryPolicy(initial_interval=2, max_interval=2),
        RetryPolicy(non_retryable=(ValueError, OSError)),
    ],
)
def test_load_workflow_accepts_the_edges_of_each_range(policy: RetryPolicy) -> None:
    """0 waits, factor 1, jitter 1, max equal to initial: all allowed."""
    assert load_workflow("w", with_policy(policy)).by_name["a"].retry == policy


def test_check_step_refuses_a_step_made_at_run_time() -> None:
    """The per-step check stands alone, prefixed with where the caller says the step is."""
    with pytest.raises(WorkflowError) as info:
        check_step(Step(name="late", run=nothing, retry=RetryPolicy(jitter=2.0)), "run 'r', step 'late'", ())
    assert str(info.value) == "run 'r', step 'late': retry.jitter must be a fraction from 0 to 1, got 2.0"
    check_step(Step(name="fine", run=nothing, retry=RetryPolicy(max_attempts=3)), "run 'r'", ())


def test_the_run_log_doc_example_of_the_field_is_real_records() -> None:
    """docs/run-log.md's example of ``"retry":false`` decodes, checksum and all."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "run-log.md").read_text()
    block = doc.split("A failed result whose error is not to be retried", 1)[1].split("```\n", 2)[1]
    decoded = [decode_line(raw.encode() + b"\n", n) for n, raw in enumerate(block.strip().splitlines(), 1)]
    assert all(isinstance(d, Record) for d in decoded), decoded
    [result, end] = [d.change for d in decoded if isinstance(d, Record)]
    assert isinstance(result, StepResult) and result.retryable is False
    assert isinstance(end, AttemptTransitioned) and end.to_state == Failed()
