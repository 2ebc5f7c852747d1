"""Group commit benchmark: effects/s of the file log beside one write+fsync per record.

The workload: R runs (default 100) of a workflow of 5 chained steps, one
effect per step. Every effect's ``Dispatched`` must be durable before the
effect is sent, so without group commit each effect costs one fsync: the
bare loop (one ``write`` + ``fsync`` per record, same folder, same run) is
that limit. Printed, each the best of a few alternating rounds:

- concurrent (all R runs at once): effects/s with group commit (target
  >= 2x the bare loop's records/s), whose default picks inline or the
  flush thread for a group's fsync by how long fsyncs take; with every
  group's fsync on the thread, every fsync on it, and every fsync inline;
  the same workload with the writer's ``durable`` hidden (the executor
  then calls the synchronous ``flush``, as before group commit); and with
  fsync disabled, the executor's CPU ceiling on this machine;
- sequential (one run at a time): time per effect beside the bare loop's
  time per record (target within 1.5x), with the lone waiter's fsync
  inline (the writer's choice), on the flush thread, and before group
  commit (``durable`` hidden): the numbers behind the writer's choice;
- p50/p99 of the time an effect waits for the fsync that covers its
  ``Dispatched``: grouped (concurrent) against alone (sequential), and how
  many fsyncs each made (and how many of them inline, on the loop's thread).

Two figures say what bounds the targets on this machine. Concurrent: with
fsync disabled the executor's CPU alone sets a ceiling that no way of
flushing can pass; group commit is printed as a share of it. Sequential:
a run fsyncs once per effect (its ``Dispatched``) and once at its end, so
one at a time can come no closer to the bare loop than those fsyncs (each
counted as one of the bare loop's write+fsync) plus the CPU per effect
with fsync disabled. Where a sequential run's time goes is printed too:
the time spent inside fsync calls, and the rest, which with real fsyncs
between them has measured well above the CPU with fsync disabled. And "sequential runs must not get slower" is measured
as the median of P paired rounds (group commit and the synchronous flush
back to back, in alternating order): single runs here vary by 20% or more.

Usage: python benchmarks/bench_group_commit.py [--runs R] [--rounds N] [--pairs P]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from attempt_kernel import (
    Change,
    Dispatched,
    Executor,
    IntentChanged,
    LogItem,
    RunLogWriter,
    StepContext,
    Workflow,
)
from attempt_kernel import JSON
from attempt_kernel import Step, load_workflow

STEPS = 5


async def pay(ctx: StepContext) -> JSON:
    async def send(key: str) -> JSON:
        return None

    return await ctx.effect("pay", send)


WORKFLOW: Workflow = load_workflow(
    "bench",
    [Step(name=f"s{i}", run=pay, after=(f"s{i - 1}",) if i else ()) for i in range(STEPS)],
)


class NoFsync:
    """Real writes, no fsync: the executor's CPU cost alone."""

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        pass


class Counted:
    """Real writes and fsyncs, counted and timed, and how many fsyncs ran inline (on the loop's thread)."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.inline = 0
        self.seconds = 0.0

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        self.inline += threading.current_thread() is threading.main_thread()
        start = time.perf_counter()
        os.fsync(fd)
        self.seconds += time.perf_counter() - start


class SyncOnly:
    """The writer with ``durable`` hidden: the executor flushes synchronously, as before group commit."""

    def __init__(self, writer: RunLogWriter) -> None:
        self._writer = writer

    def read(self) -> Iterator[LogItem]:
        return self._writer.read()

    def append(self, run: str, change: Change) -> int:
        return self._writer.append(run, change)

    def flush(self) -> None:
        self._writer.flush()


class Timed:
    """The writer, timing each ``durable`` that follows a ``Dispatched`` (an effect's wait)."""

    def __init__(self, writer: RunLogWriter) -> None:
        self._writer = writer
        self._dispatched: set[str] = set()
        self.waits: list[float] = []

    def read(self) -> Iterator[LogItem]:
        return self._writer.read()

    def append(self, run: str, change: Change) -> int:
        if isinstance(change, IntentChanged) and isinstance(change.to_state, Dispatched):
            self._dispatched.add(run)
        return self._writer.append(run, change)

    def flush(self) -> None:
        self._writer.flush()

    async def durable(self, run: str) -> None:
        start = time.perf_counter()
        await self._writer.durable(run)
        if run in self._dispatched:
            self._dispatched.discard(run)
            self.waits.append(time.perf_counter() - start)


def drive(log: SyncOnly | Timed | RunLogWriter, runs: int, concurrent: bool) -> float:
    """Seconds to drive ``runs`` runs of the workflow on ``log``, all at once or one by one."""

    async def main() -> None:
        executor = Executor(log, admission_limit=runs)
        if concurrent:
            reports = await asyncio.gather(*(executor.run(WORKFLOW, f"r{i}") for i in range(runs)))
        else:
            reports = [await executor.run(WORKFLOW, f"r{i}") for i in range(runs)]
        assert all(r.status == "succeeded" for r in reports)

    start = time.perf_counter()
    asyncio.run(main())
    return time.perf_counter() - start


def executor_seconds(
    path: Path, runs: int, mode: str, concurrent: bool
) -> tuple[float, list[float], tuple[int, int, float]]:
    """One measurement; returns seconds and, in mode ``timed``, each effect's wait and the
    fsyncs made (all, those inline, and the seconds spent in them)."""
    counted = Counted()
    ops = NoFsync() if mode == "nofsync" else counted if mode == "timed" else None
    paths: dict[str, Literal["alone", "loop", "thread"]] = {"thread": "thread", "loop": "loop", "mix": "alone"}
    RunLogWriter.flush_on = paths.get(mode, "timed")
    try:
        with RunLogWriter(path, ops=ops) as writer:
            if mode == "sync":
                return drive(SyncOnly(writer), runs, concurrent), [], (0, 0, 0.0)
            if mode == "timed":
                timed = Timed(writer)
                seconds = drive(timed, runs, concurrent)
                return seconds, timed.waits, (counted.fsyncs, counted.inline, counted.seconds)
            return drive(writer, runs, concurrent), [], (0, 0, 0.0)
    finally:
        RunLogWriter.flush_on = "timed"


def bare_seconds(path: Path, records: int) -> float:
    """One write + fsync per record, records the size of a Dispatched line."""
    line = b'{"v":1,"seq":1,"time_us":1796116936000000,"run":"r1","type":"intent","step":"s1",' \
        b'"attempt":1,"intent":"pay","from":"Planned","cause":"Dispatch","to":"Dispatched","crc":"0"}\n'
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(records):
            os.write(fd, line)
            os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description="group commit benchmark (file log)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args()
    runs, effects = args.runs, args.runs * STEPS
    print(
        f"Python {sys.version.split()[0]}; {runs} runs x {STEPS} chained steps, one effect"
        f" each ({effects} effects); best of {args.rounds}, alternating"
    )
    modes = [
        ("bare", False),
        ("group", True),
        ("mix", True),
        ("thread", True),
        ("loop", True),
        ("sync", True),
        ("nofsync", True),
        ("group", False),
        ("thread", False),
        ("loop", False),
        ("sync", False),
        ("nofsync", False),
        ("timed", True),
        ("timed", False),
    ]
    best = {m: float("inf") for m in modes}
    waits: dict[bool, list[float]] = {True: [], False: []}
    fsyncs: dict[bool, tuple[int, int, float]] = {True: (0, 0, 0.0), False: (0, 0, 0.0)}
    paired: list[float] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        n = 0
        for _ in range(args.rounds):
            for mode, concurrent in modes:
                n += 1
                path = Path(tmp) / f"log{n}"
                if mode == "bare":
                    seconds = bare_seconds(path, effects)
                else:
                    seconds, timed, made = executor_seconds(path, runs, mode, concurrent)
                    if mode == "timed" and (not waits[concurrent] or seconds < best[mode, concurrent]):
                        waits[concurrent], fsyncs[concurrent] = timed, made
                best[mode, concurrent] = min(best[mode, concurrent], seconds)
                path.unlink()
        for i in range(args.pairs):
            pair: dict[str, float] = {}
            for mode in ("group", "sync") if i % 2 == 0 else ("sync", "group"):
                n += 1
                path = Path(tmp) / f"log{n}"
                pair[mode] = executor_seconds(path, runs, mode, False)[0]
                path.unlink()
            paired.append(pair["group"] / pair["sync"])
    bare = best["bare", False] / effects
    ok = True
    print(f"bare loop, one write+fsync per record: {1 / bare:8,.0f} records/s ({bare * 1e6:,.0f} us/record)")
    print(f"concurrent ({runs} runs at once), effects/s:")
    group = effects / best["group", True]
    ratio = group * bare
    print(f"  group commit               : {group:8,.0f}  = {ratio:.1f}x the bare loop (target >= 2x)")
    mix = effects / best["mix", True]
    print(f"  every group's on the thread: {mix:8,.0f}  = {mix * bare:.1f}x the bare loop")
    thread = effects / best["thread", True]
    print(f"  every fsync on the thread  : {thread:8,.0f}  = {thread * bare:.1f}x the bare loop")
    loop = effects / best["loop", True]
    print(f"  every fsync inline gathered: {loop:8,.0f}  = {loop * bare:.1f}x the bare loop")
    sync = effects / best["sync", True]
    print(f"  before it (durable hidden) : {sync:8,.0f}  = {sync * bare:.1f}x the bare loop")
    nofsync = effects / best["nofsync", True]
    print(f"  fsync disabled (CPU limit) : {nofsync:8,.0f}  = {nofsync * bare:.1f}x the bare loop")
    print(
        f"  group commit reaches {group / nofsync:.0%} of that ceiling; the 2x target is"
        f" {'within' if nofsync * bare >= 2 else 'above'} it on this machine"
    )
    ok = ok and ratio >= 2
    print("sequential (one run at a time), time per effect:")
    for mode, label in (
        ("group", "lone waiter inline (chosen)"),
        ("thread", "lone waiter on the thread  "),
        ("loop", "inline gathered            "),
        ("sync", "before it (durable hidden) "),
        ("nofsync", "fsync disabled (CPU only)  "),
    ):
        per = best[mode, False] / effects
        print(f"  {label}: {per * 1e6:8,.0f} us  = {per / bare:.2f}x the bare loop's per record")
    seq_ratio = best["group", False] / effects / bare
    per_effect = fsyncs[False][0] / effects
    floor = per_effect + best["nofsync", False] / effects / bare
    print(f"  target: within 1.5x of the bare loop: {seq_ratio:.2f}x")
    print(
        f"  floor on this machine: {per_effect:.2f} fsyncs per effect + the CPU alone"
        f" = {floor:.2f}x the bare loop"
    )
    timed_per = best["timed", False] / effects
    in_fsync = fsyncs[False][2] / effects
    print(
        f"  where the time goes (the timed run, {timed_per * 1e6:,.0f} us per effect):"
        f" {in_fsync * 1e6:,.0f} us in fsync ({fsyncs[False][2] / max(fsyncs[False][0], 1) * 1e6:,.0f} us each),"
        f" {(timed_per - in_fsync) * 1e6:,.0f} us outside it, against"
        f" {best['nofsync', False] / effects * 1e6:,.0f} us with fsync disabled"
    )
    ok = ok and seq_ratio <= 1.5
    if paired:
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        print(
            f"  group commit beside the synchronous flush, {len(paired)} paired rounds: median"
            f" {statistics.median(paired):.3f}x (quartiles {quartiles[0]:.3f} to {quartiles[2]:.3f})"
        )
    print("time an effect waits for its flush (Dispatched written -> durable):")
    for concurrent, label in ((True, "grouped (concurrent)"), (False, "alone (sequential)  ")):
        w = waits[concurrent]
        print(
            f"  {label}: p50 {quantile(w, 50) * 1e6:8,.0f} us  p99 {quantile(w, 99) * 1e6:8,.0f} us"
            f"  ({len(w)} waits, {fsyncs[concurrent][0]} fsyncs, {fsyncs[concurrent][1]} inline)"
        )
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
