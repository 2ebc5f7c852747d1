"""`attempt-kernel runs --status failed --limit 50` on PostgreSQL: the summaries beside the fold.

Starts a throwaway PostgreSQL of its own (the tests' `ThrowawayServer`),
makes a journal of 100,000 runs and about 1,000,000 records at schema
version 5 (tests/bulkjournal.py: a quarter of the runs failed, each after
11 attempts of 3 records; the others succeeded, were cancelled or are
unfinished), then opens it, which migrates it to version 6 and folds each
run once into its summary (timed, for context). Then, in the same run:

- filtered: `listed_runs` (the function `runs` calls) with ``--status
  failed --limit 50``, and the text it prints; best of several;
- baseline: what `runs URL` did before the summaries, whatever the
  filters: a fold of the whole journal (`PgJournal.read` into a
  `Ledger`), the leases (`held_runs`), a `RunRow` per run, then the same
  filter (`select`) and the text; once (it reads every record).

Prints both and their ratio. Target: the filtered listing >= 100 times
faster than the fold.

Usage: python benchmarks/bench_runs_filter.py [--runs N] [--attempts A]
(TMPDIR picks the folder of the server's data)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' helpers: the throwaway server

from bulkjournal import bulk_journal  # noqa: E402
from pgserver import ThrowawayServer, find_server_bin  # noqa: E402

from attempt_kernel import _report  # noqa: E402
from attempt_kernel._operations import listed_runs  # noqa: E402
from attempt_kernel._ledger import Ledger  # noqa: E402
from attempt_kernel._runlist import RunFilter, RunRow, select  # noqa: E402
from attempt_kernel.postgres._journal import held_runs  # noqa: E402
from attempt_kernel.postgres import DEFAULT_SCHEMA, PgJournal  # noqa: E402

FILTERED_ROUNDS: Final = 20
ONLY: Final = RunFilter(statuses=frozenset({"failed"}), limit=50)


def listing(rows: list[RunRow], url: str, violations: int) -> str:
    """What `runs URL --status failed --limit 50` prints: the rows, then the warning if any."""
    text = _report.runs_text(rows, url, filtered=True)
    return text + (_report.violations_warning(violations, f"attempt-kernel replay {url}") if violations else "")


def filtered(url: str) -> tuple[float, str]:
    """The listing through the summaries, as `runs URL --status failed --limit 50` makes it."""
    start = time.perf_counter()
    rows, violations = listed_runs(url, ONLY)
    text = listing(rows, url, violations)
    return time.perf_counter() - start, text


def folded(url: str) -> tuple[float, str]:
    """The same listing as `runs URL` made it before the summaries: a fold of the whole journal."""
    start = time.perf_counter()
    with PgJournal(url) as journal:
        ledger = Ledger()
        ledger.feed(journal.read())
    held = held_runs(url)
    rows = [RunRow.of(view, view.run in held) for view in ledger.runs.values()]
    text = listing(select(rows, ONLY), url, ledger.violation_count)
    return time.perf_counter() - start, text


def main() -> int:
    parser = argparse.ArgumentParser(description="runs --status failed --limit 50: summaries vs fold")
    parser.add_argument("--runs", type=int, default=100_000, help="runs in the journal")
    parser.add_argument("--attempts", type=int, default=11, help="attempts of each failed run")
    args = parser.parse_args()
    bindir = find_server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries found (Debian: apt-get install postgresql-15)")
        return 2
    server = ThrowawayServer(bindir)
    url = server.start()
    ok = False
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('server_version')").fetchone()
        start = time.perf_counter()
        records = bulk_journal(url, DEFAULT_SCHEMA, args.runs, attempts=args.attempts)
        made = time.perf_counter() - start
        start = time.perf_counter()
        PgJournal(url).close()  # migration 6: a summary per run, each run folded once
        migrated = time.perf_counter() - start
        print(
            f"Python {sys.version.split()[0]}; PostgreSQL {row[0] if row else '?'} in {tempfile.gettempdir()};"
            f" {args.runs:,} runs, {records:,} records (made in {made:.1f} s; migration 6 folded them"
            f" into summaries in {migrated:.1f} s)"
        )
        best = float("inf")
        text = ""
        for _ in range(FILTERED_ROUNDS):
            took, text = filtered(url)
            best = min(best, took)
        took_fold, text_fold = folded(url)
        assert text == text_fold, "the summaries and the fold list different runs"
        lines = text.count("\n") - 1
        ratio = took_fold / best
        print("runs --status failed --limit 50 (the text printed included):")
        print(f"  summaries (SQL), best of {FILTERED_ROUNDS}  : {best * 1e3:10.2f} ms ({lines} runs listed)")
        print(f"  fold of the whole journal, once : {took_fold * 1e3:10.2f} ms")
        print(f"  summaries {ratio:,.0f}x faster than the fold (target >= 100x)")
        ok = ratio >= 100
    finally:
        server.stop()
    print("all targets met" if ok else "TARGETS MISSED (see the figures above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
