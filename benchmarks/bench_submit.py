"""`submit_run` on PostgreSQL: by URL, on a held connection, beside a bare round trip.

Starts a throwaway PostgreSQL of its own (the tests' `ThrowawayServer`;
``fsync`` off, so a commit costs no disk flush: what is measured is round
trips and connections), migrates the default schema once, then times, in
the same run, alternating so that the machine's load falls on all alike:

- baseline: ``SELECT 1`` on a held autocommit connection (one round trip);
- `submit_run(conn, ...)` on a held autocommit connection (one statement:
  it checks the schema's version and queues the run);
- the same on a held connection inside the caller's transaction, with the
  caller's ``commit()`` after it (two round trips);
- `submit_run(url, ...)`: a connection of its own per call (connect,
  queue, close), beside its own baseline: connect, ``SELECT 1``, close;
- before: what `submit_run(url, ...)` did before it took a connection: a
  migrating `PgJournal` opened and closed, then a second connection for the
  insert (the statement of that time).

Prints the median of each and its ratio to the baseline. Targets: a submit
on a held connection within 2x the bare round trip; by URL within 1.5x a
bare connect-query-close (a new connection costs far more than a round
trip, so by URL it can gain at most the statements it no longer sends).

Usage: python benchmarks/bench_submit.py [--samples N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers: the throwaway server

from pgserver import ThrowawayServer, find_server_bin  # noqa: E402

from attempt_kernel.postgres import DEFAULT_SCHEMA, PgJournal, migrate, submit_run  # noqa: E402

# The insert `submit_run` sent before it took a connection (after its PgJournal had migrated).
BEFORE_INSERT: Final = sql.SQL(
    "INSERT INTO {s}.runs (run, workflow, input) SELECT %s, %s, %s"
    " WHERE NOT EXISTS (SELECT 1 FROM {s}.records WHERE run = %s)"
    " ON CONFLICT (run) DO NOTHING"
).format(s=sql.Identifier(DEFAULT_SCHEMA))


def main() -> int:
    parser = argparse.ArgumentParser(description="submit_run: URL vs held connection vs SELECT 1")
    parser.add_argument("--samples", type=int, default=300, help="timed calls of each")
    args = parser.parse_args()
    bindir = find_server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries found (Debian: apt-get install postgresql-15)")
        return 2
    server = ThrowawayServer(bindir)
    url = server.start()
    ok = False
    try:
        migrate(url)
        held = psycopg.connect(url, autocommit=True)
        caller = psycopg.connect(url)
        counter = iter(range(10**9))

        def bare() -> None:
            held.execute("SELECT 1").fetchone()

        def on_held() -> None:
            submit_run(held, "bench", f"h-{next(counter)}")

        def in_transaction() -> None:
            submit_run(caller, "bench", f"t-{next(counter)}")
            caller.commit()

        def by_url() -> None:
            submit_run(url, "bench", f"u-{next(counter)}")

        def connected() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT 1").fetchone()

        def before() -> None:
            run = f"b-{next(counter)}"
            with PgJournal(url):
                pass
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(BEFORE_INSERT, (run, "bench", "null", run))

        cases: dict[str, Callable[[], None]] = {
            "SELECT 1, held connection (baseline)": bare,
            "submit_run(held autocommit connection)": on_held,
            "submit_run(held connection) + commit()": in_transaction,
            "connect, SELECT 1, close (URL baseline)": connected,
            "submit_run(url)": by_url,
            "before: migrating PgJournal + 2nd connection": before,
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(10):  # warm up: connections, plans, caches
            for case in cases.values():
                case()
        for _ in range(args.samples):
            for name, case in cases.items():
                start = time.perf_counter()
                case()
                samples[name].append(time.perf_counter() - start)
        held.close()
        caller.close()
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('server_version')").fetchone()
        print(
            f"Python {sys.version.split()[0]}; PostgreSQL {row[0] if row else '?'} in"
            f" {tempfile.gettempdir()} (fsync off); median of {args.samples} calls each, alternating"
        )
        medians = {name: statistics.median(times) for name, times in samples.items()}
        baseline = medians["SELECT 1, held connection (baseline)"]
        for name, median in medians.items():
            print(f"  {name:<46}: {median * 1e3:8.3f} ms  {median / baseline:7.1f}x the baseline")
        held_ratio = medians["submit_run(held autocommit connection)"] / baseline
        url_ratio = medians["submit_run(url)"] / medians["connect, SELECT 1, close (URL baseline)"]
        url_gain = medians["before: migrating PgJournal + 2nd connection"] / medians["submit_run(url)"]
        print(f"  held connection: {held_ratio:.1f}x a bare round trip (target <= 2x)")
        print(f"  submit_run(url): {url_ratio:.2f}x a bare connect-query-close (target <= 1.5x),"
              f" {url_gain:.1f}x faster than before")  # fmt: skip
        ok = held_ratio <= 2 and url_ratio <= 1.5
    finally:
        server.stop()
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
