"""The executor: real runs written to real logs, each replayed through the kernel."""

from __future__ import annotations

import asyncio
import re
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attempt_kernel import (
    Cancelled,
    Failed,
    Indeterminate,
    Record,
    ReplayReport,
    RunLogWriter,
    Succeeded,
    TimedOut,
    read_log,
    replay,
)
from attempt_kernel import EffectRejected, Executor, Pending, RunControl, RunReport, Running, StepContext, StepOutcome
from attempt_kernel._records import JSON, AttemptTransitioned, Change, IntentChanged, IntentReconciled, StepResult
from attempt_kernel._workflow import RetryPolicy, Step, load_workflow

StepFn = Callable[[StepContext], Awaitable[JSON]]


class Ops:
    """Real writes; calls ``hook(n)`` after the n-th record is written."""

    def __init__(self, hook: Callable[[int], None] | None = None) -> None:
        self.records = 0
        self.hook = hook

    def write(self, fd: int, data: bytes) -> int:
        written = os.write(fd, data)
        # one write may carry several records (the writer's append_all)
        for _ in range(data.count(b"\n")):
            self.records += 1
            if self.hook is not None:
                self.hook(self.records)
        return written

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


def execute(
    path: Path,
    steps: list[Step],
    *,
    cancel_after: int | None = None,
    admission_limit: int = 8,
) -> tuple[RunReport, ReplayReport]:
    """Run the steps as workflow 'w', run 'r'; cancel after the given record count."""
    workflow = load_workflow("w", steps)

    async def main() -> RunReport:
        control = RunControl()

        def hook(n: int) -> None:
            if cancel_after is not None and n >= cancel_after:
                control.cancel()

        with RunLogWriter(path, ops=Ops(hook)) as log:
            return await Executor(log, admission_limit=admission_limit).run(workflow, "r", control=control)

    report = asyncio.run(main())
    return report, replay(path)


def outcome(report: RunReport, name: str) -> StepOutcome:
    [found] = [s for s in report.steps if s.step == name]
    return found


def records(path: Path) -> list[Record]:
    return [i for i in read_log(path) if isinstance(i, Record)]


async def returns(ctx: StepContext) -> JSON:
    return {"step": ctx.step, "inputs": dict(ctx.inputs)}


async def hangs(ctx: StepContext) -> JSON:
    await asyncio.sleep(3600)
    return None


def test_chain_succeeds_and_passes_results(tmp_path: Path) -> None:
    """Dependencies run first and their results arrive in ctx.inputs; the log is valid."""
    report, check = execute(
        tmp_path / "log",
        [Step(name="a", run=returns), Step(name="b", run=returns, after=("a",))],
    )
    assert report.status == "succeeded"
    assert outcome(report, "b").result == {"step": "b", "inputs": {"a": {"step": "a", "inputs": {}}}}
    assert check.valid and check.final_states[Succeeded()] == 2 and check.records == 10


def test_failed_step_is_retried_up_to_its_limit(tmp_path: Path) -> None:
    """A step that always raises gets max_attempts attempts, each Failed, then stops."""
    async def broken(ctx: StepContext) -> JSON:
        raise ValueError(f"bad input on attempt {ctx.attempt}")

    report, check = execute(
        tmp_path / "log",
        [Step(name="a", run=broken, retry=RetryPolicy(initial_interval=0, max_attempts=3)), Step(name="b", run=returns, after=("a",))],
    )  # fmt: skip
    a = outcome(report, "a")
    assert (a.state, a.attempts, a.error) == (Failed(), 3, "ValueError: bad input on attempt 3")
    assert outcome(report, "b").state is None  # never started
    assert report.status == "failed"
    assert check.valid and check.final_states[Failed()] == 3


def test_flaky_step_succeeds_on_retry(tmp_path: Path) -> None:
    """Failed once, then a new attempt succeeds."""
    async def flaky(ctx: StepContext) -> JSON:
        if ctx.attempt == 1:
            raise TimeoutError("the tool timed out by itself")  # not the step deadline
        return "ok"

    report, check = execute(tmp_path / "log", [Step(name="a", run=flaky, retry=RetryPolicy(initial_interval=0, max_attempts=2))])
    a = outcome(report, "a")
    assert (a.state, a.attempts, a.result) == (Succeeded(), 2, "ok")
    assert check.valid and check.final_states == {
        Pending(): 0, Running(): 0, Succeeded(): 1, Failed(): 1, Indeterminate(): 0,
        Cancelled(): 0, TimedOut(): 0,
    }  # fmt: skip


def test_step_deadline_times_out_and_is_retried(tmp_path: Path) -> None:
    """Running past the step deadline is StepDeadlinePassed; retried when allowed."""
    report, check = execute(
        tmp_path / "log",
        [Step(name="a", run=hangs, step_deadline=0.02, retry=RetryPolicy(initial_interval=0, max_attempts=2))],
    )
    a = outcome(report, "a")
    assert (a.state, a.attempts, a.error) == (TimedOut(), 2, "step deadline passed")
    assert check.valid and check.final_states[TimedOut()] == 2


def test_no_retry_after_timeout_when_the_policy_says_so(tmp_path: Path) -> None:
    """retry_on_timeout=False stops after the first step-deadline TimedOut."""
    policy = RetryPolicy(initial_interval=0, max_attempts=3, retry_on_timeout=False)
    report, _ = execute(tmp_path / "log", [Step(name="a", run=hangs, step_deadline=0.02, retry=policy)])
    assert outcome(report, "a").attempts == 1


def test_queue_deadline_times_out_pending_and_is_never_retried(tmp_path: Path) -> None:
    """With one slot taken, a second step waits Pending past its queue deadline."""
    report, check = execute(
        tmp_path / "log",
        [
            Step(name="busy", run=hangs, step_deadline=0.3),
            Step(name="queued", run=returns, queue_deadline=0.02, retry=RetryPolicy(initial_interval=0, max_attempts=5)),
        ],
        admission_limit=1,
    )
    queued = outcome(report, "queued")
    assert (queued.state, queued.attempts, queued.error) == (TimedOut(), 1, "queue deadline passed")
    causes = [
        r.change.cause
        for r in records(tmp_path / "log")
        if isinstance(r.change, (AttemptTransitioned, IntentChanged))
    ]
    assert any(type(c).__name__ == "QueueDeadlinePassed" for c in causes)
    assert check.valid


def test_effect_is_write_ahead_and_confirmed(tmp_path: Path) -> None:
    """When the effect is called, its Dispatched record is already on disk."""
    path = tmp_path / "log"
    seen: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            on_disk = path.read_text().splitlines()[-1]
            seen.append(on_disk)
            return {"charged": key}

        return await ctx.effect("charge", charge)

    report, check = execute(path, [Step(name="pay", run=pay)])
    assert '"cause":"Dispatch","to":"Dispatched"' in seen[0]
    key = outcome(report, "pay").result
    assert isinstance(key, dict) and str(key["charged"]).startswith("ak1-")
    intents = [r.change for r in records(path) if isinstance(r.change, IntentChanged)]
    assert [type(c.to_state).__name__ for c in intents] == ["Dispatched", "Confirmed"]
    assert check.valid and check.unresolved_intents == 0


def test_rejected_effect_fails_the_attempt_and_the_retry_reuses_the_key(tmp_path: Path) -> None:
    """EffectRejected: intent Rejected, attempt Failed; the retry sends the same key."""
    keys: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            keys.append(key)
            if len(keys) == 1:
                raise EffectRejected("card declined")
            return "charged"

        return await ctx.effect("charge", charge)

    report, check = execute(tmp_path / "log", [Step(name="pay", run=pay, retry=RetryPolicy(initial_interval=0, max_attempts=2))])
    assert outcome(report, "pay").state == Succeeded() and len(keys) == 2 and keys[0] == keys[1]
    assert check.valid and check.to_reconcile == ()


def test_ambiguous_effect_stays_outstanding_and_is_not_retried(tmp_path: Path) -> None:
    """An effect that raises something else leaves the intent Dispatched: no blind retry."""
    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            raise ConnectionResetError("connection reset mid-request")

        return await ctx.effect("charge", charge)

    report, check = execute(tmp_path / "log", [Step(name="pay", run=pay, retry=RetryPolicy(initial_interval=0, max_attempts=3))])
    pay_out = outcome(report, "pay")
    assert (pay_out.state, pay_out.attempts) == (Failed(), 1)
    assert len(pay_out.outstanding) == 1 and report.status == "needs-reconciliation"
    assert check.valid and [e.state for e in check.to_reconcile] == [Failed()]
    assert check.unresolved_intents == 1


def test_ambiguous_effect_is_retried_when_declared_idempotent(tmp_path: Path) -> None:
    """effects_idempotent=True allows the retry, under the same key."""
    keys: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            keys.append(key)
            if len(keys) == 1:
                raise ConnectionResetError("reset")
            return "ok"

        return await ctx.effect("charge", charge)

    policy = RetryPolicy(initial_interval=0, max_attempts=2, effects_idempotent=True)
    report, check = execute(tmp_path / "log", [Step(name="pay", run=pay, retry=policy)])
    assert outcome(report, "pay").state == Succeeded() and keys[0] == keys[1]
    assert check.valid


def test_cancel_without_dispatched_intent_is_cancelled(tmp_path: Path) -> None:
    """Cancelling a run whose running step has no outstanding intent: Cancelled."""
    report, check = execute(tmp_path / "log", [Step(name="a", run=hangs)], cancel_after=3)
    assert outcome(report, "a").state == Cancelled() and report.status == "cancelled"
    assert check.valid and check.final_states[Cancelled()] == 1
    assert check.final_states[Indeterminate()] == 0


def test_cancel_while_intent_dispatched_is_indeterminate(tmp_path: Path) -> None:
    """Cancelling while an effect is in flight: Indeterminate, with its key reported."""
    in_flight = asyncio.Event()

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            in_flight.set()
            await asyncio.sleep(3600)
            return None

        return await ctx.effect("charge", charge)

    async def main() -> RunReport:
        control = RunControl()
        with RunLogWriter(tmp_path / "log") as log:
            running = asyncio.ensure_future(
                Executor(log).run(load_workflow("w", [Step(name="pay", run=pay)]), "r", control=control)
            )
            await in_flight.wait()  # the downstream service has the call
            control.cancel()
            return await running

    report = asyncio.run(main())
    check = replay(tmp_path / "log")
    pay_out = outcome(report, "pay")
    assert pay_out.state == Indeterminate() and len(pay_out.outstanding) == 1
    assert check.valid and len(check.indeterminate) == 1
    assert check.indeterminate[0].outstanding == pay_out.outstanding


def test_pending_attempts_are_cancelled_cleanly(tmp_path: Path) -> None:
    """A step still waiting for admission when the run is cancelled ends Cancelled."""
    report, check = execute(
        tmp_path / "log",
        [Step(name="busy", run=hangs), Step(name="waiting", run=hangs)],
        admission_limit=1,
        cancel_after=4,
    )
    assert {s.step: s.state for s in report.steps} == {"busy": Cancelled(), "waiting": Cancelled()}
    assert check.valid


def test_unencodable_result_fails_the_attempt_and_keeps_the_log_valid(tmp_path: Path) -> None:
    """A step returning a set fails with a clear error; nothing half-written."""
    async def bad(ctx: StepContext) -> JSON:
        return {1, 2}  # type: ignore[return-value]

    report, check = execute(tmp_path / "log", [Step(name="a", run=bad)])
    a = outcome(report, "a")
    assert a.state == Failed()
    assert a.error is not None and a.error.startswith("the step returned a value the run log cannot encode")
    results = [r.change for r in records(tmp_path / "log") if isinstance(r.change, StepResult)]
    assert [c.error is not None for c in results] == [True]
    assert check.valid


def test_a_result_nested_deeper_than_the_log_takes_fails_the_attempt_and_the_log_stays_valid(
    tmp_path: Path,
) -> None:
    """A result nested 300 levels deep (the log takes 256) fails its attempt, naming the
    limit; the log replays clean."""
    async def deep(ctx: StepContext) -> JSON:
        value: JSON = []
        for _ in range(299):
            value = [value]
        return value

    report, check = execute(tmp_path / "log", [Step(name="a", run=deep)])
    a = outcome(report, "a")
    assert a.state == Failed()
    assert a.error is not None and "nested deeper than 256 levels of arrays and objects" in a.error
    assert check.valid


def test_a_result_with_keys_json_writes_alike_fails_the_attempt_and_the_log_stays_usable(
    tmp_path: Path,
) -> None:
    """``{1: .., "1": ..}`` would be written with the key "1" twice, a line the reader
    refuses: the log would refuse every later append and recovery. The attempt fails
    instead, naming the keys, and the log replays clean."""
    async def twins(ctx: StepContext) -> JSON:
        return {1: "int", "1": "str"}  # type: ignore[dict-item]

    report, check = execute(tmp_path / "log", [Step(name="a", run=twins)])
    a = outcome(report, "a")
    assert a.state == Failed()
    assert a.error is not None and "an object has keys 1 and '1'" in a.error
    assert check.valid


def test_intent_name_used_twice_fails_the_attempt(tmp_path: Path) -> None:
    """Two effects with one name in one attempt is a StepError (the attempt fails)."""
    async def twice(ctx: StepContext) -> JSON:
        async def ok(key: str) -> JSON:
            return None

        await ctx.effect("mail", ok)
        return await ctx.effect("mail", ok)

    report, check = execute(tmp_path / "log", [Step(name="a", run=twice)])
    a = outcome(report, "a")
    assert a.state == Failed() and a.error is not None and "intent 'mail' is used twice" in a.error
    assert check.valid


class Gated:
    """A run log (a `DispatchGate`) that has every effect wait one turn of the event loop
    before its ``Dispatched``, as a worker's does while its heartbeat is late (a new log:
    nothing to read)."""

    def __init__(self, writer: RunLogWriter) -> None:
        self._writer = writer
        self.waits = 0

    def append(self, run: str, change: Change) -> int:
        return self._writer.append(run, change)

    def flush(self) -> None:
        self._writer.flush()

    def ready_to_dispatch(self, run: str) -> Awaitable[None] | None:
        self.waits += 1
        return asyncio.sleep(0)


def test_twin_effects_of_one_name_gathered_while_the_log_has_them_wait_fail_the_attempt(tmp_path: Path) -> None:
    """Two effects of one name gathered in one attempt, while the log has effects wait
    before their Dispatched: both passed the "used twice" check, then both waited, then
    both wrote, and the executor died on its own assertion ("planned twice in one
    attempt"), the log holding records that break the kernel's rules. The check now
    comes after the wait: the attempt fails with the StepError, the card is charged once,
    and the log replays clean."""
    sent: list[str] = []

    async def twins(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            sent.append(key)
            return None

        await asyncio.gather(ctx.effect("card", charge), ctx.effect("card", charge))
        return None

    path = tmp_path / "log"

    async def main() -> RunReport:
        with RunLogWriter(path) as writer:
            gated = Gated(writer)
            report = await Executor(gated).run(load_workflow("w", [Step(name="a", run=twins)]), "r")
            assert gated.waits == 2
            return report

    a = outcome(asyncio.run(main()), "a")
    assert a.state == Failed() and a.error is not None and "intent 'card' is used twice" in a.error
    assert len(sent) == 1
    assert replay(path).valid


def test_blocking_work_in_a_thread_keeps_deadlines_working(tmp_path: Path) -> None:
    """run_blocking moves a blocking call off the loop: the deadline fires while it blocks."""
    release = threading.Event()
    path = tmp_path / "log"

    async def blocking(ctx: StepContext) -> JSON:
        return await ctx.run_blocking(lambda: release.wait(30))

    workflow = load_workflow("w", [Step(name="a", run=blocking, step_deadline=0.05)])

    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            report = await Executor(log).run(workflow, "r")
        still_blocked = not release.is_set()
        release.set()  # let the thread finish so the loop can close
        assert still_blocked
        return report

    report = asyncio.run(main())
    assert outcome(report, "a").state == TimedOut()
    assert replay(path).valid


def test_what_a_blocking_call_raises_reaches_its_step(tmp_path: Path) -> None:
    """run_blocking hands the thread's exception to the awaiting step: the attempt fails with it."""

    def broken() -> None:
        raise ValueError("no route to the printer")

    async def blocking(ctx: StepContext) -> JSON:
        await ctx.run_blocking(broken)
        return None

    report, check = execute(tmp_path / "log", [Step(name="a", run=blocking)])
    a = outcome(report, "a")
    assert a.state == Failed() and a.error is not None and "no route to the printer" in a.error
    assert check.valid


def test_cancelling_the_awaiting_task_closes_the_log_off(tmp_path: Path) -> None:
    """task.cancel() on the run: attempts end Cancelled, run_finished written, then it raises."""
    path = tmp_path / "log"
    workflow = load_workflow("w", [Step(name="a", run=hangs)])

    async def main() -> None:
        with RunLogWriter(path) as log:
            task = asyncio.ensure_future(Executor(log).run(workflow, "r"))
            await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    check = replay(path)
    assert check.valid and check.final_states[Cancelled()] == 1
    assert type(records(path)[-1].change).__name__ == "RunFinished"


def test_admission_limit_must_be_positive(tmp_path: Path) -> None:
    """Executor(admission_limit=0) is a usage error."""
    with RunLogWriter(tmp_path / "log") as log, pytest.raises(ValueError, match="admission_limit"):
        Executor(log, admission_limit=0)


@pytest.mark.parametrize("after", [float("nan"), -1.0, -0.5], ids=["nan", "minus-one", "minus-half"])
def test_let_go_after_must_be_a_number_of_seconds_from_zero_up(tmp_path: Path, after: float) -> None:
    """Executor(let_go_after=nan) was taken as "never let go" and a negative one as "at
    once": both are usage errors now, saying what it takes."""
    with RunLogWriter(tmp_path / "log") as log, pytest.raises(ValueError) as refused:
        Executor(log, let_go_after=after)
    assert str(refused.value) == f"let_go_after must be None or a number of seconds from 0 up, got {after!r}"


# ------------------------------------------------------------------ generated fault schedules

BEHAVIOURS = ["ok", "fail", "hang", "effect-ok", "effect-reject", "effect-ambiguous", "effect-hang"]


def _scheduled(plan: list[str]) -> StepFn:
    async def run(ctx: StepContext) -> JSON:
        what = plan[min(ctx.attempt, len(plan)) - 1]
        if what == "ok":
            return ctx.attempt
        if what == "fail":
            raise RuntimeError("scheduled failure")
        if what == "hang":
            await asyncio.sleep(3600)

        async def perform(key: str) -> JSON:
            if what == "effect-reject":
                raise EffectRejected("no")
            if what == "effect-ambiguous":
                raise OSError("lost the answer")
            if what == "effect-hang":
                await asyncio.sleep(3600)
            return key

        return await ctx.effect("side-effect", perform)

    return run


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plans=st.lists(st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=3), min_size=1, max_size=4),
    chain=st.booleans(),
    idempotent=st.booleans(),
    cancel_after=st.one_of(st.none(), st.integers(min_value=1, max_value=40)),
)
def test_generated_fault_schedules_always_give_valid_logs(
    tmp_path: Path, plans: list[list[str]], chain: bool, idempotent: bool, cancel_after: int | None
) -> None:
    """Failures, timeouts, effects and cancels at generated moments: every log replays clean."""
    path = tmp_path / f"log-{os.urandom(4).hex()}"
    steps = [
        Step(
            name=f"s{i}",
            run=_scheduled(plan),
            after=(f"s{i - 1}",) if chain and i else (),
            step_deadline=0.02,
            retry=RetryPolicy(initial_interval=0, max_attempts=len(plan), effects_idempotent=idempotent),
        )
        for i, plan in enumerate(plans)
    ]
    report, check = execute(path, steps, cancel_after=cancel_after)
    assert check.valid, check.violations
    # Indeterminate only through a cancel that caught an intent in flight
    for s in report.steps:
        if s.state == Indeterminate():
            assert cancel_after is not None and s.outstanding
    assert check.final_states[Pending()] == 0 and check.final_states[Running()] == 0


def test_a_cancel_as_a_retry_is_due_starts_no_new_attempt(tmp_path: Path) -> None:
    """Found by the generated schedules on Python 3.10 (whose wait_for can swallow a
    cancellation): once the cancel is recorded, no attempt is created or admitted."""
    for _ in range(20):
        report, check = execute(
            tmp_path / f"log-{os.urandom(4).hex()}",
            [Step(name="s0", run=_scheduled(["fail", "ok"]), step_deadline=0.02,
                  retry=RetryPolicy(initial_interval=0, max_attempts=2))],
            cancel_after=1,  # the failing example hypothesis found
        )  # fmt: skip
        assert check.valid, check.violations
        assert report.status in ("cancelled", "succeeded")


def test_cancel_before_a_started_dependent_runs_leaves_it_not_started(tmp_path: Path) -> None:
    """Found by the generated schedules: a dependent task cancelled before its first
    attempt is reported as never started, and the log stays valid."""
    report, check = execute(
        tmp_path / "log",
        [Step(name="s0", run=returns), Step(name="s1", run=returns, after=("s0",))],
        cancel_after=2,  # the failing example hypothesis found
    )
    assert check.valid
    assert report.status == "cancelled"
    assert outcome(report, "s1").state in (None, Cancelled())


class FailAt:
    """Writes that fail (EIO, nothing written) from the one holding the n-th record on."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0

    def write(self, fd: int, data: bytes) -> int:
        self.count += data.count(b"\n")  # one write may carry several records
        if self.count >= self.n:
            raise OSError(5, "Input/output error")
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 12])
def test_a_failing_log_stops_the_run_and_what_was_written_recovers(
    n: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """If the log cannot be written, the run stops with LogWriteFailed, leaving no task
    unawaited; recovery then ends the orphans and the log replays clean."""
    import gc

    from attempt_kernel import LogWriteFailed, recover_log

    path = tmp_path / "log"
    steps = [
        Step(name="a", run=returns),
        Step(name="b", run=hangs, step_deadline=0.05),
        Step(name="c", run=returns, after=("a",)),
    ]
    workflow = load_workflow("w", steps)

    async def main() -> None:
        with RunLogWriter(path, ops=FailAt(n)) as log:
            await Executor(log).run(workflow, "r")

    with pytest.raises(LogWriteFailed):
        asyncio.run(main())
    gc.collect()  # an unawaited failed task would log "exception was never retrieved"
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    writer, recovery = recover_log(path, {"w": workflow})
    writer.close()
    assert recovery.runs and replay(path).valid


def test_executor_runs_against_any_run_log_store() -> None:
    """The executor needs only RunLog's append and flush: an in-memory store serves too."""
    from attempt_kernel import RunLog

    class MemoryLog:
        def __init__(self) -> None:
            self.records: list[tuple[str, Change]] = []
            self.flushes = 0

        def append(self, run: str, change: Change) -> int:
            self.records.append((run, change))
            return len(self.records)

        def flush(self) -> None:
            self.flushes += 1

    store = MemoryLog()
    sink: RunLog = store  # checked by mypy: MemoryLog satisfies the protocol

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            return "ok"

        return await ctx.effect("charge", charge)

    workflow = load_workflow("w", [Step(name="pay", run=pay)])
    report = asyncio.run(Executor(sink).run(workflow, "r"))
    assert report.status == "succeeded"
    kinds = [type(c).__name__ for _, c in store.records]
    assert kinds == [
        "RunStarted", "AttemptCreated", "AttemptTransitioned", "IntentPlanned",
        "IntentChanged", "IntentChanged", "StepResult", "AttemptTransitioned", "RunFinished",
    ]  # fmt: skip
    assert store.flushes == 2  # before the effect (write-ahead) and at the run's end


def test_admission_limit_holds_across_concurrent_runs(tmp_path: Path) -> None:
    """Two runs on one executor share its limit: never more than 2 attempts at once."""
    from attempt_kernel import Job, run_jobs

    running = 0
    peak = 0

    async def busy(ctx: StepContext) -> JSON:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return None

    workflow = load_workflow("w", [Step(name=f"s{i}", run=busy) for i in range(4)])
    with RunLogWriter(tmp_path / "log") as log:
        reports = run_jobs(log, [Job(workflow=workflow, run="r1"), Job(workflow=workflow, run="r2")], admission_limit=2)
    assert [r.status for r in reports] == ["succeeded", "succeeded"]
    assert peak == 2
    assert replay(tmp_path / "log").valid


def test_a_step_started_as_a_stop_arrives_creates_no_attempt(tmp_path: Path) -> None:
    """Found by the PostgreSQL fault tests: a dependent whose task was started just before
    the stop was recorded must not create an attempt during the grace period."""
    path = tmp_path / "log"

    async def first(ctx: StepContext) -> JSON:
        return 1

    async def second(ctx: StepContext) -> JSON:
        return 2

    workflow = load_workflow(
        "w", [Step(name="a", run=first), Step(name="b", run=second, after=("a",))]
    )

    async def main() -> RunReport:
        with RunLogWriter(path) as log:
            executor: Executor | None = None

            def progress(line: str) -> None:
                if line.endswith("a#1: Running -> Succeeded") and executor is not None:
                    executor.stop("test", grace=0.2)

            executor = Executor(log, progress=progress)
            return await executor.run(workflow, "r")

    report = asyncio.run(main())
    assert report.status == "interrupted"
    assert outcome(report, "b").state is None and outcome(report, "b").attempts == 0
    check = replay(path)
    assert check.valid, check.violations


def test_a_refused_dispatch_stops_the_run_and_its_attempt_ends_as_recovery_would(tmp_path: Path) -> None:
    """The log refuses the Dispatched write (a worker's late heartbeat): nothing is sent, the
    attempt ends Cancelled (not Failed, even with no retry), the run stays unfinished, and
    resuming it sends the effect once."""
    from attempt_kernel import (
        Admit,
        AttemptCreated,
        Cancel,
        Dispatched,
        DispatchRefused,
        IntentPlanned,
        LogItem,
        RunStarted,
        RunStopRequested,
        read_log,
        resume_log,
    )

    class Refused(DispatchRefused):
        pass

    class RefusesOnce:
        """A file log that refuses its first Dispatched change, writing nothing."""

        def __init__(self, writer: RunLogWriter) -> None:
            self.writer = writer
            self.refused = False

        def read(self) -> Iterator[LogItem]:
            return self.writer.read()

        def append(self, run: str, change: Change) -> int:
            if isinstance(change, IntentChanged) and change.to_state == Dispatched() and not self.refused:
                self.refused = True
                raise Refused("the heartbeat is late")
            return self.writer.append(run, change)

        def flush(self) -> None:
            self.writer.flush()

    sent: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            sent.append(key)
            return "ok"

        return await ctx.effect("charge", charge)

    workflow = load_workflow("w", [Step(name="pay", run=pay)])  # max_attempts 1: a Fail would be final
    path = tmp_path / "log"

    async def first() -> RunReport:
        with RunLogWriter(path) as writer:
            return await Executor(RefusesOnce(writer)).run(workflow, "r")

    report = asyncio.run(first())
    assert report.status == "interrupted" and sent == []
    changes = [item.change for item in read_log(path) if isinstance(item, Record)]
    key = changes[3].key if isinstance(changes[3], IntentPlanned) else "?"
    nonce = changes[0].nonce if isinstance(changes[0], RunStarted) else "?"
    assert re.fullmatch("[0-9a-f]{16}", nonce), nonce  # the run's random part of its keys
    assert changes == [
        RunStarted(workflow="w", input=None, nonce=nonce),
        AttemptCreated(step="pay", attempt=1),
        AttemptTransitioned(step="pay", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="pay", attempt=1, name="charge", key=key),
        RunStopRequested(reason="the log refused to dispatch 'charge' of r/pay#1: the heartbeat is late"),
        AttemptTransitioned(
            step="pay", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=False), to_state=Cancelled()
        ),
    ]
    resumed = resume_log(path, [workflow])
    assert [r.status for r in resumed.reports] == ["succeeded"]
    assert sent == [key] and replay(path).valid


def test_a_step_function_that_raises_before_making_its_coroutine_fails_its_attempt(tmp_path: Path) -> None:
    """A step's callable that raises when called, before it returns an awaitable (a factory
    that finds no client), fails the attempt as a raise inside the coroutine would: the
    executor goes on, the run ends failed, and the log is valid."""

    def no_client(ctx: StepContext) -> Awaitable[JSON]:
        raise LookupError(f"no client configured for {ctx.step}")

    report, check = execute(
        tmp_path / "log",
        [Step(name="a", run=no_client, retry=RetryPolicy(initial_interval=0, max_attempts=2))],
    )
    a = outcome(report, "a")
    assert (a.state, a.attempts, a.error) == (Failed(), 2, "LookupError: no client configured for a")
    assert report.status == "failed"
    assert check.valid and check.final_states[Failed()] == 2


# --------------------------------------------------------------------------
# A cancel asks reconcilers first, as a stop, recovery and a takeover do
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finding", "intent_to", "attempt_state"),
    [
        ("happened", "Confirmed", Cancelled()),
        ("not-happened", "Rejected", Cancelled()),
    ],
)
def test_a_cancelled_run_asks_the_reconciler_of_an_effect_in_flight_before_ending_its_attempt(
    tmp_path: Path, finding: str, intent_to: str, attempt_state: object
) -> None:
    """A cancel that lands while an effect is in flight asks the step's reconciler first:
    its answer settles the intent, so the attempt ends Cancelled, not Indeterminate
    (nothing ordinary pages an operator)."""
    from attempt_kernel import EffectFinding, EffectHappened, EffectNotHappened

    asked: list[str] = []

    async def ask_bank(key: str) -> EffectFinding:
        asked.append(key)
        return EffectHappened(result={"id": "ch-1"}) if finding == "happened" else EffectNotHappened()

    async def main() -> RunReport:
        sent = asyncio.Event()

        async def charge(ctx: StepContext) -> JSON:
            async def send(key: str) -> JSON:
                sent.set()
                await asyncio.Event().wait()  # the bank never answers
                return None

            return await ctx.effect("charge-card", send)

        workflow = load_workflow("w", [Step(name="charge", run=charge, reconcilers={"charge-card": ask_bank})])
        control = RunControl()
        with RunLogWriter(tmp_path / "log") as log:
            task = asyncio.ensure_future(Executor(log).run(workflow, "r", control=control))
            await sent.wait()
            control.cancel()
            return await task

    report = asyncio.run(main())
    assert report.status == "cancelled"
    assert outcome(report, "charge").state == attempt_state
    [reconciled] = [r.change for r in records(tmp_path / "log") if isinstance(r.change, IntentReconciled)]
    assert (reconciled.by, reconciled.note, type(reconciled.to_state).__name__) == (
        "reconciler",
        "asked when the run was cancelled, before ending the attempt",
        intent_to,
    )
    assert len(asked) == 1
    check = replay(tmp_path / "log")
    assert check.valid, check.violations
    assert check.to_reconcile == ()


def test_a_reconcilers_answer_a_cancel_could_not_record_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log fails as the cancel records what the reconciler said: the answer (it
    happened) is in no record, so it is logged at WARNING, saying the log may not hold
    it, before the failure ends the run. Before, it was lost with the error."""
    import errno

    from attempt_kernel import EffectFinding, EffectHappened, LogWriteFailed

    class Breaks(Ops):
        broken = False

        def write(self, fd: int, data: bytes) -> int:
            if self.broken:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return super().write(fd, data)

    ops = Breaks()

    async def ask_bank(key: str) -> EffectFinding:
        ops.broken = True  # the disk fails just as the bank answers
        return EffectHappened(result={"id": 7})

    async def main() -> None:
        sent = asyncio.Event()

        async def charge(ctx: StepContext) -> JSON:
            async def send(key: str) -> JSON:
                sent.set()
                await asyncio.Event().wait()
                return None

            return await ctx.effect("charge-card", send)

        workflow = load_workflow("w", [Step(name="charge", run=charge, reconcilers={"charge-card": ask_bank})])
        control = RunControl()
        with RunLogWriter(tmp_path / "log", ops=ops) as log:
            task = asyncio.ensure_future(Executor(log).run(workflow, "r", control=control))
            await sent.wait()
            control.cancel()
            with pytest.raises(LogWriteFailed):
                await task

    asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "reconciler" in r.getMessage()]
    assert len(warned) == 1
    assert re.fullmatch(
        r"r charge#1: asked the reconciler about 'charge-card' \(ak1-[0-9a-f]+\): it happened \(intent Confirmed\);"
        r" ending the attempt did not complete, so the journal may not hold this answer",
        warned[0],
    ), warned[0]
