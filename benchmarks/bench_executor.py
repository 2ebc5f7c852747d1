"""Executor benchmark: attempts/s beside the run-log writer alone, same records.

Runs N no-op steps (no dependencies, so all are ready at once) through the
executor, and then has a bare `RunLogWriter` append the same records with
the same fsyncs (the executor fsyncs before each effect; the writer-alone
loop flushes at the same places) in the same write calls (`append_all`
where the executor writes records in one go: the creation and admission
of the attempts admitted at once, the first 64; an effect's Planned and
Dispatched; a step's result and its end). Target: the executor at least 50% of the
writer-alone rate, i.e. its own overhead no larger than the logging. The
same again with one intent (a confirmed effect) per step.

Then what a deadline that is met costs an attempt (no target), on Python
3.11 and later: 64 tasks each await one loop turn under a 60 s deadline,
many times over, on the executor's shared timer and under one
``asyncio.timeout`` each (what the executor did before), each beside the
same loop with no deadline at all, in CPU time.

Usage: python benchmarks/bench_executor.py [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    IntentChanged,
    IntentPlanned,
    Pending,
    Planned,
    Running,
    RunFinished,
    RunLogWriter,
    RunStarted,
    StepResult,
    Succeed,
    Succeeded,
    idempotency_key,
)
from attempt_kernel import Job, StepContext, run_jobs
from attempt_kernel import JSON
from attempt_kernel import Step, load_workflow


async def noop(ctx: StepContext) -> JSON:
    return None


async def with_intent(ctx: StepContext) -> JSON:
    async def send(key: str) -> JSON:
        return None

    return await ctx.effect("notify", send)


# fsync's latency dominates both loops and swings from run to run on a
# shared disk (one code measured 42% to 58% in three rounds of 3); the best
# of 5 alternating rounds of each side keeps that swing out of the ratio.
ROUNDS = 5
ADMISSION = 64
"""The executor's admission limit here: the first this many attempts are admitted at once."""


def executor_seconds(path: Path, steps: int, intent: bool) -> float:
    fn = with_intent if intent else noop
    workflow = load_workflow("bench", [Step(name=f"s{i}", run=fn) for i in range(steps)])
    start = time.perf_counter()
    with RunLogWriter(path) as log:
        [report] = run_jobs(log, [Job(workflow=workflow, run="r")], admission_limit=ADMISSION)
    elapsed = time.perf_counter() - start
    assert report.status == "succeeded", report.status
    return elapsed


def writer_seconds(path: Path, steps: int, intent: bool) -> float:
    start = time.perf_counter()
    with RunLogWriter(path) as log:
        log.append("r", RunStarted(workflow="bench"))
        for i in range(steps):
            step = f"s{i}"
            created = AttemptCreated(step=step, attempt=1)
            admitted = AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running())
            if i < ADMISSION:  # admitted at once: in one go
                log.append_all("r", [created, admitted])
            else:
                log.append("r", created)
                log.append("r", admitted)
            if intent:
                log.append_all("r", [
                    IntentPlanned(step=step, attempt=1, name="notify", key=idempotency_key("r", step, "notify")),
                    IntentChanged(step=step, attempt=1, name="notify", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
                ])  # fmt: skip
                log.flush()
                log.append("r", IntentChanged(step=step, attempt=1, name="notify", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed()))
            log.append_all("r", [
                StepResult(step=step, attempt=1, value=None),
                AttemptTransitioned(step=step, attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
            ])  # fmt: skip
        log.append("r", RunFinished())
    return time.perf_counter() - start


# Python 3.10 has no asyncio.timeout, and the executor uses asyncio.wait_for there.
if sys.version_info >= (3, 11):
    from attempt_kernel._executor import _Deadlines, _within  # pyright: ignore[reportPrivateUsage]  # the executor's own deadlines, measured

    def deadline_seconds(kind: str, awaits: int) -> float:
        """CPU seconds of ``awaits`` one-turn awaits by 64 tasks, each under a deadline of ``kind``."""
        per_task = awaits // 64

        async def shared(deadlines: _Deadlines) -> None:
            for _ in range(per_task):
                await _within(deadlines, 60.0, asyncio.sleep(0))

        async def one_timeout_each(deadlines: _Deadlines) -> None:
            for _ in range(per_task):
                async with asyncio.timeout(60.0):
                    await asyncio.sleep(0)

        async def none(deadlines: _Deadlines) -> None:
            for _ in range(per_task):
                await asyncio.sleep(0)

        body = {"shared": shared, "asyncio.timeout": one_timeout_each, "none": none}[kind]

        async def run() -> None:
            deadlines = _Deadlines()
            await asyncio.gather(*(body(deadlines) for _ in range(64)))

        start = time.process_time()
        asyncio.run(run())
        return time.process_time() - start

    def bench_deadlines(awaits: int) -> None:
        best = {"shared": float("inf"), "asyncio.timeout": float("inf"), "none": float("inf")}
        for _ in range(ROUNDS):
            for kind in best:
                best[kind] = min(best[kind], deadline_seconds(kind, awaits))
        n = awaits // 64 * 64
        shared = (best["shared"] - best["none"]) / n
        timeout = (best["asyncio.timeout"] - best["none"]) / n
        print(f"a deadline met, per attempt ({n:,} awaits by 64 tasks, CPU time, beyond the same awaits without one):")
        print(f"  the executor's shared timer: {shared * 1e6:6.2f} us")
        print(f"  one asyncio.timeout each   : {timeout * 1e6:6.2f} us  = {timeout / shared:.1f}x the shared timer (no target)")


def main() -> int:
    parser = argparse.ArgumentParser(description="executor vs writer-alone benchmark")
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; {args.steps:,} steps, best of {ROUNDS}, alternating")
    ok = True
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        for intent in (False, True):
            t_exec = t_write = float("inf")
            for i in range(ROUNDS):
                t_exec = min(t_exec, executor_seconds(Path(tmp) / f"e{intent}{i}", args.steps, intent))
                t_write = min(t_write, writer_seconds(Path(tmp) / f"w{intent}{i}", args.steps, intent))
            ratio = t_write / t_exec
            label = "one intent per step" if intent else "no-op steps, no intents"
            print(f"{label}:")
            print(f"  executor    : {args.steps / t_exec:10,.0f} attempts/s")
            print(f"  writer alone: {args.steps / t_write:10,.0f} attempts' worth of records/s")
            print(f"  executor = {ratio:.0%} of the writer-alone rate (target >= 50%)")
            ok = ok and ratio >= 0.5
    if sys.version_info >= (3, 11):
        bench_deadlines(args.steps * 10)
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
