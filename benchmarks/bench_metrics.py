"""Metrics benchmark on PostgreSQL: a worker's /metrics scrape time, and what scraping costs it.

Starts a throwaway PostgreSQL of its own (the tests' `ThrowawayServer`, as
it is: ``fsync`` off, since both sides of each comparison share it) and
runs `attempt-kernel worker URL --metrics-port` as a subprocess, the way an
operator runs it, on a two-step workflow whose second step sends an effect
(eight records per run: a ``Dispatched`` commit among them).

1. Throughput: M runs queued in an empty journal, then a worker with
   ``--until-idle`` times from its start until it exits, in three
   variants, alternating, each one's best of ``--rounds`` (default `ROUNDS`): no
   ``--metrics-port`` (the baseline), with ``--metrics-port`` and nobody
   scraping, and with a scrape every second. Target: with a scrape every
   second, within 5% of the baseline.
2. Scrape time: a worker serves while runs are queued at 4 per second
   for D seconds, the journal already holding the last round of part 1; this
   process times a GET of ``/metrics`` every second (the first, which
   reads the whole journal, is reported apart). Target: p99 <= 50 ms.

Needs the ``postgres`` and ``metrics`` extras (``nox -s bench`` installs both).

Usage: python benchmarks/bench_metrics.py [--runs M] [--rounds R] [--seconds D]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers: the throwaway server

from pgserver import ThrowawayServer, find_server_bin  # noqa: E402

from attempt_kernel import JSON, Step, StepContext, load_workflow  # noqa: E402
from attempt_kernel.postgres._journal import PgJournal  # noqa: E402

ROUNDS: Final = 2
RATE: Final = 4.0
"""Runs queued per second in part 2."""
SCHEMA: Final = "attempt_kernel"  # the CLI's schema


async def look(ctx: StepContext) -> JSON:
    return {"looked": ctx.run}


async def send(ctx: StepContext) -> JSON:
    async def effect(key: str) -> JSON:
        return {"sent": key}

    return await ctx.effect("mail", effect)


FLOW: Final = load_workflow("bench", [Step(name="look", run=look), Step(name="send", run=send, after=("look",))])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def queue(url: str, first: int, count: int) -> None:
    """Queue runs ``first`` .. ``first + count - 1`` in one statement (submit_run's rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {s}.runs (run, workflow, input)"
                " SELECT 'run-' || lpad(i::text, 7, '0'), 'bench', 'null' FROM generate_series(%s::int, %s::int) AS i"
            ).format(s=sql.Identifier(SCHEMA)),
            (first, first + count - 1),
        )


def worker(url: str, *, port: int | None, until_idle: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "attempt_kernel", "worker", url, "--workflows", "bench_metrics:FLOW"]
    if until_idle:
        command.append("--until-idle")
    if port is not None:
        command += ["--metrics-port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "benchmarks")}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def scrape(port: int) -> float:
    """One GET of /metrics; its time in ms."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        body = answer.read()
    took = (time.perf_counter() - started) * 1000
    assert b"attempt_kernel_indeterminate_attempts" in body
    return took


def scraper(port: int, stop: threading.Event, times: list[float], every: float = 1.0) -> None:
    """Scrape every ``every`` seconds until ``stop``; a refused connection (not up yet) is skipped."""
    while not stop.wait(every):
        try:
            times.append(scrape(port))
        except OSError:
            continue


def fresh(url: str) -> None:
    """An empty journal: each round starts alike (a worker with metrics reads the whole
    journal once as it starts; on a journal grown by earlier rounds, that one-time read
    would weigh on a short round and not on a worker that serves for hours)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {s} CASCADE").format(s=sql.Identifier(SCHEMA)))
    PgJournal(url).close()


def drain(url: str, runs: int, first: int, variant: str) -> float:
    """Queue ``runs`` runs, time a worker (``variant``) until it is idle; return runs/s."""
    fresh(url)
    queue(url, first, runs)
    port = None if variant == "baseline" else free_port()
    stop = threading.Event()
    times: list[float] = []
    started = time.perf_counter()
    process = worker(url, port=port, until_idle=True)
    thread = None
    if variant == "scraped":
        assert port is not None
        thread = threading.Thread(target=scraper, args=(port, stop, times), daemon=True)
        thread.start()
    _, err = process.communicate(timeout=1800)
    took = time.perf_counter() - started
    stop.set()
    if thread is not None:
        thread.join()
    if process.returncode != 0:
        raise SystemExit(f"the worker failed ({variant}): {err.decode()}")
    return runs / took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=600, help="runs per throughput round (default 600)")
    parser.add_argument("--seconds", type=int, default=60, help="seconds of part 2 (default 60)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of each variant (default {ROUNDS})")
    args = parser.parse_args()
    bindir = find_server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries found (Debian: apt-get install postgresql-15)")
        return 2
    server = ThrowawayServer(bindir)
    url = server.start()
    try:
        PgJournal(url).close()  # the tables
        print(f"PostgreSQL {bindir} (fsync off); {os.cpu_count()} cores; {args.runs} runs per round")
        best: dict[str, float] = {}
        first = 1
        for _ in range(args.rounds):
            for variant in ("baseline", "served", "scraped"):
                rate = drain(url, args.runs, first, variant)
                first += args.runs
                best[variant] = max(best.get(variant, 0.0), rate)
                print(f"  {variant:<9} {rate:7.1f} runs/s")
        base = best["baseline"]
        for variant in ("baseline", "served", "scraped"):
            print(f"throughput {variant:<9} best {best[variant]:7.1f} runs/s ({best[variant] / base:.3f} of baseline)")
        print(
            f"target: scraped every second within 5% of the baseline:"
            f" {'met' if best['scraped'] >= 0.95 * base else 'NOT met'}"
        )

        port = free_port()
        process = worker(url, port=port, until_idle=False)
        try:
            deadline = time.monotonic() + 60
            whole = 0.0
            while True:
                try:
                    whole = scrape(port)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            with psycopg.connect(url) as conn:
                row = conn.execute(sql.SQL("SELECT count(*) FROM {s}.records").format(s=sql.Identifier(SCHEMA))).fetchone()
            records = int(str(row[0])) if row is not None else 0
            print(f"first scrape, as the worker starts (it reads the whole journal once: {records} records): {whole:.1f} ms")
            stop = threading.Event()
            times: list[float] = []
            thread = threading.Thread(target=scraper, args=(port, stop, times), daemon=True)
            thread.start()
            end = time.monotonic() + args.seconds
            queued = 0
            while time.monotonic() < end:
                queue(url, first + queued, 1)
                queued += 1
                time.sleep(1 / RATE)
            stop.set()
            thread.join()
            p50 = statistics.median(times)
            p99 = statistics.quantiles(times, n=100, method="inclusive")[98]
            print(
                f"scrape while {RATE:.0f} runs/s are queued ({queued} runs, {len(times)} scrapes):"
                f" p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(times):.1f} ms"
            )
            print(f"target: p99 <= 50 ms: {'met' if p99 <= 50 else 'NOT met'}")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
