"""Waiting runs on PostgreSQL: what 10,000 released runs cost an idle worker, and how fast a signal wakes one.

Starts a throwaway PostgreSQL of its own (the tests' `ThrowawayServer`),
queues N runs (default 10,000) of a code workflow that waits for signal
``go`` and then returns, and starts worker A (`run_worker`, a process of
its own) on them: it drives each to its wait and releases it ('infinity':
only a signal wakes it). Once every run is released, it measures, over
the same window, A's RSS and CPU% while it idles beside worker B, an idle
worker on an empty journal (another schema) that has no waiting run, and
the claim statement's time on each journal (the baseline: the empty one).

Then the signal-to-resume latency: one signal at a time through
`deliver_pg`, each after a random pause (so that signals do not fall
in step with the worker's rounds), timed from its return (the signal is durable then) until
the run's row is closed by a worker (claimed, replayed, its wait ended,
its end written). The worker looks for claimable runs every half
heartbeat period (0.5 s by default), which bounds what this can show.

Prints figures; asserts nothing about time.

Usage: python benchmarks/bench_waits.py [--runs N] [--samples S] [--idle SECONDS]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers: the throwaway server

from pgserver import ThrowawayServer, find_server_bin  # noqa: E402

from attempt_kernel import JSON, RunContext, workflow  # noqa: E402
from attempt_kernel._operate import signal_change  # noqa: E402
from attempt_kernel.postgres._deliver import deliver_pg  # noqa: E402
from attempt_kernel.postgres._journal import PgJournal  # noqa: E402
# the worker's own claim statement, timed as the worker runs it
from attempt_kernel.postgres._journal import hold_key_head  # noqa: E402
from attempt_kernel.postgres._worker import _CLAIM, _statement, run_worker  # noqa: E402  # pyright: ignore[reportPrivateUsage]

BUSY: Final = "attempt_kernel"
EMPTY: Final = "empty_journal"


@workflow("waiter")
async def waiter(run: RunContext) -> JSON:
    return await run.wait_for_signal("go")


def serve(url: str, schema: str) -> None:
    """A worker process (heartbeat 1 s, the default): `python -c` runs this."""
    run_worker(url, [waiter], schema=schema, concurrency=1000, stop_on_signals=True)


def start_worker(url: str, schema: str) -> subprocess.Popen[bytes]:
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); from bench_waits import serve; serve(sys.argv[1], sys.argv[2])"
    return subprocess.Popen(
        [sys.executable, "-c", code, url, schema],
        stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def scalar(conn: psycopg.Connection[tuple[object, ...]], query: sql.Composed) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None and type(row[0]) is int
    return row[0]


def claim_ms(conn: psycopg.Connection[tuple[object, ...]], schema: str, samples: int = 200) -> float:
    """The worker's claim statement for a worker id that is not registered (it claims nothing)."""
    claim = _statement(_CLAIM, schema)
    times: list[float] = []
    for _ in range(samples):
        start = time.perf_counter()
        conn.execute(claim, {"me": "bench-nobody", "names": ["waiter"], "n": 1, "hold": hold_key_head(schema)}).fetchall()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description="waiting runs on PostgreSQL workers")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of the idle window")
    args = parser.parse_args()
    bindir = find_server_bin()
    if bindir is None:
        print("bench_waits: no PostgreSQL server binaries; skipped")
        return 0
    server = ThrowawayServer(bindir)
    url = server.start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for schema in (BUSY, EMPTY):
            PgJournal(url, schema=schema).close()  # migrates
        with psycopg.connect(url, autocommit=True) as conn:
            s = sql.Identifier(BUSY)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {s}.runs (run, workflow, input)"
                    " SELECT 'w-' || g, 'waiter', 'null' FROM generate_series(1, %s) AS g"
                ).format(s=s),
                (args.runs,),
            )
            started = time.perf_counter()
            a = start_worker(url, BUSY)
            workers.append(a)
            released = sql.SQL(
                "SELECT count(*) FROM {s}.runs WHERE owner IS NULL AND wake_at = 'infinity'"
            ).format(s=s)
            while scalar(conn, released) < args.runs:
                if a.poll() is not None:
                    raise SystemExit("bench_waits: worker A exited")
                time.sleep(0.2)
            print(
                f"{args.runs} runs driven to their wait and released by one worker in"
                f" {time.perf_counter() - started:.1f} s"
            )
            b = start_worker(url, EMPTY)
            workers.append(b)
            time.sleep(3.0)  # B's start (imports, connections) is not idling
            before = {p.pid: cpu_seconds(p.pid) for p in workers}
            window = time.perf_counter()
            time.sleep(args.idle)
            elapsed = time.perf_counter() - window
            for name, p, what in (
                ("A", a, f"{args.runs} released waiting runs in its journal"),
                ("B", b, "an empty journal"),
            ):
                cpu = (cpu_seconds(p.pid) - before[p.pid]) / elapsed * 100
                print(f"idle worker {name} ({what}): RSS {rss_mib(p.pid):.1f} MiB, CPU {cpu:.2f}%")
            print(
                f"claim statement, median: {claim_ms(conn, BUSY):.3f} ms with {args.runs} waiting runs,"
                f" {claim_ms(conn, EMPTY):.3f} ms on the empty journal"
            )
            latencies: list[float] = []
            done = sql.SQL("SELECT done FROM {s}.runs WHERE run = %s").format(s=s)
            jitter = random.Random(7)
            for n in range(1, args.samples + 1):
                run = f"w-{n}"
                # not in step with the worker's poll (each close ends one of its rounds)
                time.sleep(jitter.uniform(0.0, 0.5))
                # deliver_pg calls the lambda before it returns: run and n are this turn's
                deliver_pg(url, lambda ledger: (run, signal_change(ledger, run, "go", n)), run=run, schema=BUSY)
                sent = time.perf_counter()
                while True:
                    row = conn.execute(done, (run,)).fetchone()
                    if row is not None and row[0] is True:
                        break
                    time.sleep(0.002)
                latencies.append(time.perf_counter() - sent)
            latencies.sort()
            p50 = latencies[len(latencies) // 2] * 1000
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
            print(
                f"signal to the run's close ({args.samples} signals, one at a time):"
                f" p50 {p50:.0f} ms, p99 {p99:.0f} ms (claim poll: every 0.5 s)"
            )
    finally:
        for p in workers:
            p.terminate()
        for p in workers:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
