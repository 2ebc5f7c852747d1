"""Group commit on PostgreSQL: concurrent runs with effects, the journal's writer thread beside its baselines.

Starts a throwaway PostgreSQL of its own (the tests' `ThrowawayServer`,
made durable as `bench_workers` makes it: ``fsync`` on, so a synchronous
commit costs a real WAL flush), and measures, in the same run:

1. One worker process (`run_worker` in this process), M runs of a
   three-step workflow with one effect per step (each effect's
   ``Dispatched`` must be durable before the effect is sent):
   - concurrent: ``concurrency`` runs at once, the journal's writer thread
     grouping their records (one synchronous commit per group);
   - sequential: the same workload one run at a time (target: concurrent
     >= 3x sequential);
   - today's path, concurrent: the journal as it was before the writer
     thread, each append a synchronous statement on the event loop and each
     ``Dispatched`` its own synchronous commit (the worker's journal
     patched back to `PgJournal.append_all` and `append_and_complete`).
   Effects per second, and synchronous commits per effect.
2. Four worker processes, runs of one step with one effect: effects/s
   beside `bench_workers`' bare SQL loop (its four processes writing a
   one-step run with a worker's statements, no effect).
3. The time an effect waits for its ``Dispatched`` to be durable (from the
   hand-over to the end of `_WorkerJournal.durable`), p50 and p99: grouped
   (the concurrent run of 1) against alone (the sequential run).
4. The choice of a writer thread over psycopg's ``AsyncConnection``: the
   same queue-and-group loop both ways (50 tasks, each handing over four
   one-row inserts and then waiting for a group's synchronous commit, 40
   times), records/s and the share of the time the event loop's thread
   spent on the CPU (what the executors' own work then lacks).

Usage: python benchmarks/bench_pg_group.py [--runs M] [--concurrency C]
(TMPDIR picks the folder of the server's data; its disk decides the fsync cost)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_workers: the server and the bare loop
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers: the throwaway server

from bench_workers import bare_loop, make_durable, percentile, timed  # noqa: E402
from multiprocessing.synchronize import Event
from pgserver import ThrowawayServer, find_server_bin  # noqa: E402

from attempt_kernel import JSON, Change, Dispatched, IntentChanged, Step, StepContext, load_workflow  # noqa: E402
from attempt_kernel.postgres._journal import PgJournal, commits_synchronously  # noqa: E402
from attempt_kernel.postgres._worker import _WorkerJournal, run_worker  # noqa: E402  # pyright: ignore[reportPrivateUsage]  # patched to time and to compare

SCHEMA: Final = "attempt_kernel"  # run_worker's default schema
ROUNDS: Final = 2  # each side's best, alternating: the machine is shared


async def _effect(key: str) -> JSON:
    return None


async def with_effect(ctx: StepContext) -> JSON:
    return await ctx.effect("e", _effect)


THREE: Final = load_workflow(
    "three",
    [
        Step(name="s1", run=with_effect),
        Step(name="s2", run=with_effect, after=("s1",)),
        Step(name="s3", run=with_effect, after=("s2",)),
    ],
)
# Named as bench_workers' workflow, so that its queue and its timing serve it.
ONE: Final = load_workflow("noop", [Step(name="s", run=with_effect)])


def queue(url: str, runs: int, workflow: str) -> None:
    """Empty the journal and queue ``runs`` runs of ``workflow``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {s} CASCADE").format(s=sql.Identifier(SCHEMA)))
    PgJournal(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.runs (run, workflow, input)"
                " SELECT 'run-' || lpad(i::text, 6, '0'), %s, 'null' FROM generate_series(1, %s) AS i"
            ).format(s=sql.Identifier(SCHEMA)),
            (workflow, runs),
        )
        conn.execute("VACUUM ANALYZE")


STATS_SETTLE = 1.0
"""Seconds to let exiting server processes report their statistics before pg_stat_wal is read."""


def sync_commits(url: str) -> int:
    """WAL flushes so far (pg_stat_wal's ``wal_sync``): a synchronous commit, or a group of them, is one."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    return 0 if row is None else int(str(row[0]))


@contextmanager
def todays_path() -> Generator[None, None, None]:
    """The worker's journal as it was before the writer thread: synchronous appends on the loop."""
    saved = (_WorkerJournal.append_all, _WorkerJournal.durable, _WorkerJournal.complete)

    def append_all(self: _WorkerJournal, run: str, changes: Sequence[Change]) -> int:
        if any(commits_synchronously(change) for change in changes):
            self._guard(run)  # pyright: ignore[reportPrivateUsage]
        return self._journal.append_all(run, changes)  # pyright: ignore[reportPrivateUsage]

    async def durable(self: _WorkerJournal, run: str) -> None:
        return None  # the Dispatched committed synchronously in its append

    async def complete(self: _WorkerJournal, run: str, changes: Sequence[Change], *, outcome: str) -> None:
        self._journal.append_and_complete(run, changes, outcome=outcome)  # pyright: ignore[reportPrivateUsage]

    setattr(_WorkerJournal, "append_all", append_all)
    setattr(_WorkerJournal, "durable", durable)
    setattr(_WorkerJournal, "complete", complete)
    try:
        yield
    finally:
        for name, original in zip(("append_all", "durable", "complete"), saved):
            setattr(_WorkerJournal, name, original)


@contextmanager
def effect_waits(into: list[float]) -> Generator[None, None, None]:
    """Record, for each effect, the seconds from its ``Dispatched`` hand-over to the end of its durable wait."""
    append_all, durable = _WorkerJournal.append_all, _WorkerJournal.durable
    handed: dict[str, float] = {}

    def timed_append(self: _WorkerJournal, run: str, changes: Sequence[Change]) -> int:
        last = changes[-1]
        if isinstance(last, IntentChanged) and last.to_state == Dispatched():
            handed[run] = time.perf_counter()
        return append_all(self, run, changes)

    async def timed_durable(self: _WorkerJournal, run: str) -> None:
        await durable(self, run)
        start = handed.pop(run, None)
        if start is not None:
            into.append(time.perf_counter() - start)

    setattr(_WorkerJournal, "append_all", timed_append)
    setattr(_WorkerJournal, "durable", timed_durable)
    try:
        yield
    finally:
        setattr(_WorkerJournal, "append_all", append_all)
        setattr(_WorkerJournal, "durable", durable)


def one_process(url: str, runs: int, concurrency: int, waits: list[float] | None = None) -> tuple[float, int]:
    """Seconds for one in-process worker to finish ``runs`` runs of THREE, and the WAL flushes it caused."""
    queue(url, runs, "three")
    flushes = sync_commits(url)
    start = time.perf_counter()
    if waits is None:
        closed = run_worker(url, [THREE], concurrency=concurrency, stop_when_idle=True)
    else:
        with effect_waits(waits):
            closed = run_worker(url, [THREE], concurrency=concurrency, stop_when_idle=True)
    elapsed = time.perf_counter() - start
    assert closed == runs, (closed, runs)
    # The worker's server processes add their WAL flushes to pg_stat_wal as
    # they exit, a moment after their connections closed: read once they have.
    time.sleep(STATS_SETTLE)
    return elapsed, sync_commits(url) - flushes


def one_effect_worker(url: str, ready: Event, go: Event) -> None:
    """One of the four worker processes: runs of ONE (one step, one effect) until none is left."""
    ready.set()
    go.wait()
    run_worker(url, [ONE], stop_when_idle=True)


# --------------------------------------------------------------------------
# 4. A writer thread or an AsyncConnection
# --------------------------------------------------------------------------

TASKS: Final = 50
ROUNDS_OF_TASK: Final = 40
PER_ROUND: Final = 4
INSERT: Final = (
    b"INSERT INTO bench_writer (run, seq, line) SELECT %s, %s, %s"
    b" WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL"
)
FLUSH: Final = (
    b"SELECT set_config('synchronous_commit', 'on', true), pg_logical_emit_message(true, 'bench', 'flush')"
)
Row = tuple[str, int, bytes]


async def tasks_writing(submit: Callable[[Row], None], wait: Callable[[], asyncio.Future[None]]) -> None:
    """TASKS tasks, each handing over PER_ROUND rows then waiting for their group, ROUNDS_OF_TASK times."""

    async def one(task: int) -> None:
        for round_ in range(ROUNDS_OF_TASK):
            for i in range(PER_ROUND):
                submit((f"t{task}", round_ * PER_ROUND + i, b"x" * 200))
            await wait()

    await asyncio.gather(*(one(task) for task in range(TASKS)))


def loop_cpu() -> float:
    """CPU seconds of the calling thread so far."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def with_thread(url: str) -> tuple[float, float]:
    """Seconds, and the loop thread's CPU seconds, with a writer thread on a synchronous connection."""
    cond = threading.Condition()
    queue: list[Row] = []
    waiters: list[asyncio.Future[None]] = []
    stop = [False]
    loop = asyncio.new_event_loop()

    def release(future: asyncio.Future[None]) -> None:
        if not future.done():
            future.set_result(None)

    def writer(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        while True:
            with cond:
                while not queue and not waiters and not stop[0]:
                    cond.wait()
                if stop[0] and not queue and not waiters:
                    return
                rows, queue[:] = list(queue), []
                released, waiters[:] = list(waiters), []
            with conn.pipeline():
                for row in rows:
                    conn.execute(INSERT, row)
                conn.execute(FLUSH)
            for future in released:
                loop.call_soon_threadsafe(release, future)

    def submit(row: Row) -> None:
        with cond:
            queue.append(row)
            cond.notify()

    def wait() -> asyncio.Future[None]:
        future: asyncio.Future[None] = loop.create_future()
        with cond:
            waiters.append(future)
            cond.notify()
        return future

    with psycopg.connect(url, autocommit=True) as conn:
        thread = threading.Thread(target=writer, args=(conn,))
        thread.start()
        cpu, start = loop_cpu(), time.perf_counter()
        loop.run_until_complete(tasks_writing(submit, wait))
        elapsed, cpu = time.perf_counter() - start, loop_cpu() - cpu
        with cond:
            stop[0] = True
            cond.notify()
        thread.join()
    loop.close()
    return elapsed, cpu


def with_async_connection(url: str) -> tuple[float, float]:
    """Seconds, and the loop thread's CPU seconds, with a writer task on an AsyncConnection."""

    async def measured() -> tuple[float, float]:
        queue: list[Row] = []
        waiters: list[asyncio.Future[None]] = []
        wake = asyncio.Event()
        stop = [False]
        loop = asyncio.get_running_loop()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

            async def writer() -> None:
                while True:
                    await wake.wait()
                    wake.clear()
                    if stop[0] and not queue and not waiters:
                        return
                    rows, queue[:] = list(queue), []
                    released, waiters[:] = list(waiters), []
                    async with conn.pipeline():
                        for row in rows:
                            await conn.execute(INSERT, row)
                        await conn.execute(FLUSH)
                    for future in released:
                        if not future.done():
                            future.set_result(None)

            def submit(row: Row) -> None:
                queue.append(row)
                wake.set()

            def wait() -> asyncio.Future[None]:
                future: asyncio.Future[None] = loop.create_future()
                waiters.append(future)
                wake.set()
                return future

            task = asyncio.ensure_future(writer())
            cpu, start = loop_cpu(), time.perf_counter()
            await tasks_writing(submit, wait)
            elapsed, cpu = time.perf_counter() - start, loop_cpu() - cpu
            stop[0] = True
            wake.set()
            await task
        return elapsed, cpu

    return asyncio.run(measured())


def writer_choice(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_writer (run text, seq integer, line bytea, PRIMARY KEY (run, seq))")
    records = TASKS * ROUNDS_OF_TASK * PER_ROUND
    results: dict[str, tuple[float, float]] = {}
    for _ in range(ROUNDS):
        for label, measure in (("writer thread", with_thread), ("AsyncConnection", with_async_connection)):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("TRUNCATE bench_writer")
            elapsed, cpu = measure(url)
            if label not in results or elapsed < results[label][0]:
                results[label] = (elapsed, cpu)
    print(f"the writer: {TASKS} tasks x {ROUNDS_OF_TASK} groups' waits, {records} one-row inserts:")
    for label, (elapsed, cpu) in results.items():
        print(f"  {label:16}: {records / elapsed:8,.0f} records/s; the event loop's thread on the CPU"
              f" {cpu / elapsed:4.0%} of the time")
    thread, other = results["writer thread"], results["AsyncConnection"]
    print(f"  thread = {other[0] / thread[0]:.2f}x the AsyncConnection's rate, its loop busy"
          f" {thread[1] / thread[0]:.0%} against {other[1] / other[0]:.0%}")


def best(measure: Callable[[], tuple[float, int]]) -> tuple[float, int]:
    return min(measure() for _ in range(ROUNDS))


def main() -> int:
    parser = argparse.ArgumentParser(description="group commit on PostgreSQL")
    parser.add_argument("--runs", type=int, default=200, help="runs of three effect steps, one process")
    parser.add_argument("--concurrency", type=int, default=50, help="runs one worker drives at once")
    parser.add_argument("--worker-runs", type=int, default=1000, help="runs of one effect step, four workers")
    args = parser.parse_args()
    bindir = find_server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries found (Debian: apt-get install postgresql-15)")
        return 2
    server = ThrowawayServer(bindir)
    url = server.start()
    ok = True
    try:
        make_durable(server, url)
        print(
            f"Python {sys.version.split()[0]}; PostgreSQL in {tempfile.gettempdir()} (fsync on);"
            f" {multiprocessing.cpu_count()} CPUs; best of {ROUNDS}"
        )
        effects = args.runs * 3
        grouped_waits: list[float] = []
        alone_waits: list[float] = []
        concurrent = best(lambda: one_process(url, args.runs, args.concurrency))
        sequential = best(lambda: one_process(url, args.runs, 1))
        with todays_path():
            today = best(lambda: one_process(url, args.runs, args.concurrency))
        one_process(url, args.runs, args.concurrency, grouped_waits)
        one_process(url, args.runs, 1, alone_waits)
        print(f"one worker process, {args.runs} runs x 3 steps, one effect per step ({effects} effects):")
        for label, (seconds, flushes) in (
            (f"concurrent ({args.concurrency} at once), writer thread", concurrent),
            ("sequential (1 at a time), writer thread", sequential),
            (f"concurrent ({args.concurrency} at once), today's path", today),
        ):
            print(f"  {label:44}: {effects / seconds:8,.0f} effects/s, {flushes / effects:5.2f} WAL flushes per effect")
        ratio = sequential[0] / concurrent[0]
        print(f"  concurrent = {ratio:.1f}x sequential (target >= 3x);"
              f" {today[0] / concurrent[0]:.1f}x today's path")
        ok = ok and ratio >= 3
        t_workers = min(timed(url, args.worker_runs, one_effect_worker) for _ in range(ROUNDS))
        t_bare = min(timed(url, args.worker_runs, bare_loop) for _ in range(ROUNDS))
        print(f"4 worker processes, {args.worker_runs} runs of one step with one effect:")
        print(f"  workers: {args.worker_runs / t_workers:8,.0f} effects/s (one attempt, one effect each)")
        print(f"  bare SQL loop (bench_workers, no effect): {args.worker_runs / t_bare:8,.0f} attempts/s;"
              f" workers = {t_bare / t_workers:.0%} of it")
        print("the time an effect waits for its Dispatched to be durable (hand-over to release):")
        for label, waits in ((f"grouped ({args.concurrency} at once)", grouped_waits), ("alone (1 at a time)", alone_waits)):
            print(f"  {label:22}: p50 {percentile(waits, 0.5) * 1e3:7.3f} ms, p99 {percentile(waits, 0.99) * 1e3:7.3f} ms"
                  f" ({len(waits)} effects)")
        writer_choice(url)
    finally:
        server.stop()
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
