"""Code workflow benchmark: a code run beside a DAG, the writer alone, bare JSON, and replay.

Each figure beside a baseline measured in the same process, the two sides
alternating, best of several rounds each:

- **per-step cost beside a DAG**: R runs of S chained no-op steps, written
  as code (``await run.step(...)`` in sequence) and as a DAG (``after=``
  chains), driven together by `run_jobs`, on the file store (fsyncs as the
  store does them: per batch of 64 and at each run's end). Target: code
  <= 1.2x the DAG in CPU time. Wall time is printed beside it: both sides
  wait for nearly the same fsyncs (a code run writes one record more per
  step), and on this shared disk that wait swung from 0.2 ms to 20 ms per
  step within a minute, so the wall ratio says more about the disk than
  about the code. On a store that accepts every append and keeps nothing,
  the executor's own CPU alone;
- **no-op steps beside the writer alone**: one run of N no-op steps in
  sequence, beside a bare `RunLogWriter` appending the same records (a code
  run's five per step: ``step_called`` and the four an attempt writes) with
  the same fsyncs and in the same write calls as the executor (a step's
  call, creation and admission in one `append_all`, its result and end in
  another), as ``bench_executor.py`` measures a DAG. Target: the code run
  at least 50% of that writer-alone rate, in wall time as there. The rate
  of one `append` per record (what the executor wrote before it grouped
  them) is printed beside it, no target.
  The faster the disk, the lower that ratio (the fsync wait is common to
  both); the CPU-time ratio is printed beside it;
- **replay of a code workflow's log** (records the executor wrote for M
  runs of four steps with arguments and results, one of them sending an
  effect) beside a bare loop that reads each line and ``json.loads`` it,
  in CPU time as ``bench_runlog.py`` does. Target: replay >= 40% of bare.
  The same runs written as a DAG are replayed beside it (no target): what
  a code run's records cost the replayer beyond a DAG's;
- **recovery of a run with K recorded steps**: the run's log cut where a
  crash during step K+1 leaves it (K steps succeeded, the next one
  called and ``Running``). The time to run the function again up to that
  step (its replay phase: the function notes the CPU clock at its top and
  before its K+1-th call), beside ``replay(FileLog(path))`` of the cut
  log, both in CPU time; target within 2x. `resume_log` end to end is
  shown beside it (no target): it reads the log three times before the
  function runs (the writer's scan for its last record, recovery, the
  executor's ledger), then the replay phase, the step run again, the end.

BENCH_TMP picks the folder for the logs (default: the system's temporary
folder); fsync costs depend on the disk under it.

Usage: python benchmarks/bench_coderun.py [--runs R] [--chain S] [--steps N] [--replay-runs M] [--recorded K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from attempt_kernel import (
    JSON,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    Executor,
    FileLog,
    Job,
    Pending,
    Record,
    RunContext,
    RunFinished,
    RunLog,
    RunLogWriter,
    Running,
    RunStarted,
    Step,
    StepCalled,
    StepContext,
    StepResult,
    Succeed,
    Succeeded,
    Workflow,
    load_workflow,
    replay,
    resume_log,
    run_jobs,
    workflow,
)

# fsync's latency swings from run to run on a shared disk; the best of 5
# alternating rounds of each side keeps that swing out of the ratios.
ROUNDS = 5


async def noop(ctx: StepContext) -> JSON:
    return None


class NullLog:
    """A run log that accepts every append and keeps nothing: the executor's own CPU alone."""

    def __init__(self) -> None:
        self._seq = 0

    def append(self, run: str, change: Change) -> int:
        self._seq += 1
        return self._seq

    def flush(self) -> None:
        pass


class NoFsync:
    """File operations that write and never fsync: for building a log to read, quickly."""

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        pass


def cpu_of(func: Callable[[], object]) -> float:
    """CPU seconds (user + system) that one call of ``func`` takes."""
    start = time.process_time()
    func()
    return time.process_time() - start


def chained(steps: int) -> tuple[Workflow, Workflow]:
    """The same ``steps`` chained no-op steps, as code and as a DAG."""

    @workflow("chain-code")
    async def code(run: RunContext) -> JSON:
        for i in range(steps):
            await run.step(f"s{i}", noop)
        return None

    dag = load_workflow(
        "chain-dag",
        [Step(name=f"s{i}", run=noop, after=(f"s{i - 1}",) if i else ()) for i in range(steps)],
    )
    return code, dag


def drive(log: RunLog, flow: Workflow, runs: int) -> None:
    reports = run_jobs(log, [Job(workflow=flow, run=f"r{i}") for i in range(runs)], admission_limit=64)
    assert all(r.status == "succeeded" for r in reports), reports[0]


def bench_code_vs_dag(tmp: Path, runs: int, steps: int) -> bool:
    code, dag = chained(steps)
    n = runs * steps
    inf = float("inf")
    file_wall = {"code": inf, "dag": inf}
    file_cpu = {"code": inf, "dag": inf}
    null_cpu = {"code": inf, "dag": inf}

    def on_file(flow: Workflow, path: Path) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        with RunLogWriter(path) as log:
            drive(log, flow, runs)
        return time.perf_counter() - wall, time.process_time() - cpu

    for i in range(ROUNDS):
        for kind, flow in (("code", code), ("dag", dag)):
            wall, cpu = on_file(flow, tmp / f"chain-{kind}{i}")
            file_wall[kind], file_cpu[kind] = min(file_wall[kind], wall), min(file_cpu[kind], cpu)
            null_cpu[kind] = min(null_cpu[kind], cpu_of(lambda: drive(NullLog(), flow, runs)))

    def line(label: str, best: dict[str, float], target: str) -> float:
        ratio = best["code"] / best["dag"]
        print(f"  {label}: code {best['code'] / n * 1e6:6.1f} us/step, DAG {best['dag'] / n * 1e6:6.1f} us/step"
              f"  = {ratio:.2f}x {target}")  # fmt: skip
        return ratio

    print(f"{runs:,} runs x {steps} chained no-op steps, code beside DAG:")
    ratio = line("file store, CPU time ", file_cpu, "(target <= 1.2x)")
    line("file store, wall time", file_wall, "(the disk's fsync wait included; no target)")
    line("null store, CPU time ", null_cpu, "(the executor alone, no store; no target)")
    return ratio <= 1.2


def sequence(steps: int) -> Workflow:
    @workflow("sequence")
    async def flow(run: RunContext) -> JSON:
        for _ in range(steps):
            await run.step("s", noop)
        return None

    return flow


def recorded_digest(path: Path) -> str:
    """The argument digest a no-argument call recorded in ``path``'s first ``step_called``."""
    for item in FileLog(path).read():
        if isinstance(item, Record) and isinstance(item.change, StepCalled):
            return item.change.digest
    raise AssertionError(f"{path} holds no step_called record")


def wall_and_cpu(func: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    func()
    return time.perf_counter() - wall, time.process_time() - cpu


def code_run(path: Path, flow: Workflow) -> None:
    with RunLogWriter(path) as log:
        [report] = run_jobs(log, [Job(workflow=flow, run="r")], admission_limit=64)
    assert report.status == "succeeded", report.status


def writer_run(path: Path, steps: int, digest: str, grouped: bool) -> None:
    """The records of `sequence`'s run, appended by the writer alone (it flushes only at the end).

    ``grouped``: in the executor's writes (a step's call, creation and
    admission in one `append_all`, its result and end in another); else one
    `append` per record.
    """
    with RunLogWriter(path) as log:
        log.append("r", RunStarted(workflow="sequence", nonce=secrets.token_hex(8), code=True))
        for position in range(1, steps + 1):
            step = f"s@{position}"
            start: list[Change] = [
                StepCalled(step=step, position=position, name="s", digest=digest),
                AttemptCreated(step=step, attempt=1),
                AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
            ]
            end: list[Change] = [
                StepResult(step=step, attempt=1, value=None),
                AttemptTransitioned(step=step, attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
            ]
            for group in (start, end):
                if grouped:
                    log.append_all("r", group)
                else:
                    for change in group:
                        log.append("r", change)
        log.append("r", RunFinished())


def bench_code_vs_writer(tmp: Path, steps: int) -> bool:
    flow = sequence(steps)
    inf = float("inf")
    kinds = ("code", "grouped", "one by one")
    wall: dict[str, float] = dict.fromkeys(kinds, inf)
    cpu: dict[str, float] = dict.fromkeys(kinds, inf)
    digest = ""

    def keep(kind: str, times: tuple[float, float]) -> None:
        wall[kind], cpu[kind] = min(wall[kind], times[0]), min(cpu[kind], times[1])

    for i in range(ROUNDS):
        keep("code", wall_and_cpu(lambda: code_run(tmp / f"seq-code{i}", flow)))
        digest = digest or recorded_digest(tmp / f"seq-code{i}")
        keep("grouped", wall_and_cpu(lambda: writer_run(tmp / f"seq-grouped{i}", steps, digest, True)))
        keep("one by one", wall_and_cpu(lambda: writer_run(tmp / f"seq-single{i}", steps, digest, False)))
    for written in ("seq-grouped0", "seq-single0"):
        same = (tmp / "seq-code0").stat().st_size == (tmp / written).stat().st_size
        assert same, "the writer-alone loop must write as many bytes as the code run"
    ratio = wall["grouped"] / wall["code"]
    print(f"one run of {steps:,} no-op steps in sequence, beside the writer alone (wall):")
    print(f"  code workflow: {steps / wall['code']:10,.0f} steps/s")
    print(f"  writer alone : {steps / wall['grouped']:10,.0f} steps' worth of records/s, in the executor's writes")
    print(f"                 {steps / wall['one by one']:10,.0f} steps' worth of records/s, one append per record")
    print(f"  code = {ratio:.0%} of the writer-alone rate in the same writes (target >= 50%);"
          f" {wall['one by one'] / wall['code']:.0%} of one append per record;"
          f" in CPU time {cpu['grouped'] / cpu['code']:.0%} (no target)")  # fmt: skip
    return ratio >= 0.5


async def think(ctx: StepContext, turn: int) -> JSON:
    return {"n": turn, "tool": "search"}


async def notify(ctx: StepContext, turn: int) -> JSON:
    async def send(key: str) -> JSON:
        return {"sent": key}

    return await ctx.effect("notify", send)


@workflow("agent")
async def agent(run: RunContext) -> JSON:
    """Four steps with an argument and a result each; the second sends an effect."""
    results: list[JSON] = []
    for turn in range(4):
        results.append(await run.step("notify" if turn == 1 else "think", notify if turn == 1 else think, turn))
    return {"turns": len(results)}


def agent_dag() -> Workflow:
    """`agent`'s four steps as a DAG chain: the same results, the same effect, the same step ids."""

    def bind(fn: Callable[[StepContext, int], Awaitable[JSON]], turn: int) -> Callable[[StepContext], Awaitable[JSON]]:
        async def run(ctx: StepContext) -> JSON:
            return await fn(ctx, turn)

        return run

    names = [f"{'notify' if turn == 1 else 'think'}@{turn + 1}" for turn in range(4)]
    return load_workflow(
        "agent",
        [
            Step(name=name, run=bind(notify if turn == 1 else think, turn), after=(names[turn - 1],) if turn else ())
            for turn, name in enumerate(names)
        ],
    )


def write_log(path: Path, flow: Workflow, runs: int) -> None:
    """The executor's log of ``runs`` runs of ``flow``, at most 50 at a time (a busy log interleaves runs).

    No fsync: only the records matter here.
    """

    async def main(log: RunLogWriter) -> None:
        executor = Executor(log, admission_limit=64)
        live = asyncio.Semaphore(50)

        async def one(run: str) -> None:
            async with live:
                report = await executor.run(flow, run)
            assert report.status == "succeeded", report

        await asyncio.gather(*(one(f"run-{i:07d}") for i in range(runs)))

    with RunLogWriter(path, batch_size=1 << 30, ops=NoFsync()) as log:
        asyncio.run(main(log))


def bare_read(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for raw in f:
            json.loads(raw)
            n += 1
    return n


def bench_replay(tmp: Path, runs: int) -> bool:
    logs = {"code": tmp / "agent-code.jsonl", "dag": tmp / "agent-dag.jsonl"}
    write_log(logs["code"], agent, runs)
    write_log(logs["dag"], agent_dag(), runs)
    records: dict[str, int] = {}
    for kind, path in logs.items():
        report = replay(path)
        assert report.valid, report.violations[:3]
        records[kind] = report.records
    inf = float("inf")
    t_bare, t_replay = {"code": inf, "dag": inf}, {"code": inf, "dag": inf}
    for _ in range(ROUNDS):
        for kind, path in logs.items():
            t_bare[kind] = min(t_bare[kind], cpu_of(lambda: bare_read(path)))
            t_replay[kind] = min(t_replay[kind], cpu_of(lambda: replay(path)))
    ratio = {kind: t_bare[kind] / t_replay[kind] for kind in logs}
    n, size = records["code"], logs["code"].stat().st_size
    print(f"replay of a code workflow's log, {runs:,} runs, {n:,} records ({size / 1e6:.0f} MB):")
    print(f"  bare read + json.loads : {n / t_bare['code']:12,.0f} records/s (CPU time)")
    print(f"  replay                 : {n / t_replay['code']:12,.0f} records/s (CPU time)"
          f"  = {ratio['code']:.0%} of bare (target >= 40%)")  # fmt: skip
    print(f"  the same runs as a DAG : {records['dag'] / t_replay['dag']:12,.0f} records/s (CPU time)"
          f"  = {ratio['dag']:.0%} of its bare read; {records['dag']:,} records (no target)")  # fmt: skip
    return ratio["code"] >= 0.40


MARKS: list[float] = []
"""CPU clock readings the recovery benchmark's function takes (see `long_run`)."""


def long_run(recorded: int) -> Workflow:
    """``recorded + 1`` no-op steps in sequence; notes the CPU clock at its top and before the last call.

    Reading a clock in a workflow's function is what the function must not
    do to decide anything; here it decides nothing (the calls are the same
    every time), it only times the replay from outside.
    """

    @workflow("long")
    async def flow(run: RunContext) -> JSON:
        MARKS.append(time.process_time())
        for position in range(1, recorded + 2):
            if position == recorded + 1:
                MARKS.append(time.process_time())
            await run.step("s", noop)
        return None

    return flow


def crash_cut(source: Path, step: str, target: Path) -> None:
    """``source`` as a crash leaves it right after ``step``'s attempt was admitted."""
    lines = source.read_bytes().splitlines(keepends=True)
    for item in FileLog(source).read():
        if isinstance(item, Record):
            change = item.change
            if isinstance(change, AttemptTransitioned) and change.step == step and isinstance(change.cause, Admit):
                target.write_bytes(b"".join(lines[: item.line]))
                return
    raise AssertionError(f"{source} has no admission of {step!r}")


def bench_recovery(tmp: Path, recorded: int) -> bool:
    flow = long_run(recorded)
    full = tmp / "long.jsonl"
    with RunLogWriter(full, batch_size=1 << 30, ops=NoFsync()) as log:
        drive(log, flow, 1)
    cut = tmp / "long-cut.jsonl"
    crash_cut(full, f"s@{recorded + 1}", cut)
    records = replay(cut).records

    def resume(path: Path) -> None:
        MARKS.clear()
        done = resume_log(path, [flow])
        assert not done.diverged and [r.status for r in done.reports] == ["succeeded"], done

    t_replay = t_phase = t_resume = float("inf")
    for i in range(ROUNDS):
        t_replay = min(t_replay, cpu_of(lambda: replay(FileLog(cut))))
        path = tmp / f"long-resume{i}.jsonl"
        shutil.copyfile(cut, path)
        t_resume = min(t_resume, cpu_of(lambda: resume(path)))
        assert len(MARKS) == 2, MARKS
        t_phase = min(t_phase, MARKS[1] - MARKS[0])
    ratio = t_phase / t_replay
    print(f"recovery of a run with {recorded:,} recorded steps ({records:,} records, crash during step {recorded + 1:,}):")
    print(f"  replay(FileLog(path))            : {t_replay * 1e3:7.1f} ms (CPU time)")
    print(f"  function run again up to the step: {t_phase * 1e3:7.1f} ms (CPU time)  = {ratio:.2f}x replay (target <= 2x)")
    print(f"  resume_log end to end            : {t_resume * 1e3:7.1f} ms (CPU time)  = {t_resume / t_replay:.2f}x replay"
          " (three reads of the log, the replay phase, the step, the end; no target)")  # fmt: skip
    return ratio <= 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200, help="runs of the code-beside-DAG figure")
    parser.add_argument("--chain", type=int, default=5, help="chained steps per run of that figure")
    parser.add_argument("--steps", type=int, default=5_000, help="steps of the writer-alone figure")
    parser.add_argument("--replay-runs", type=int, default=2_000, help="runs in the replayed log")
    parser.add_argument("--recorded", type=int, default=1_000, help="recorded steps of the recovered run")
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}; best of {ROUNDS}, alternating")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        ok = bench_code_vs_dag(Path(tmp), args.runs, args.chain)
        ok = bench_code_vs_writer(Path(tmp), args.steps) and ok
        ok = bench_replay(Path(tmp), args.replay_runs) and ok
        ok = bench_recovery(Path(tmp), args.recorded) and ok
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
