"""A large PostgreSQL journal made fast: records encoded here and copied in, as version 5 wrote them.

For the tests and the benchmark of `attempt-kernel runs` on many runs: the
journal is made at schema version 5 (no summaries), so that opening it with
`PgJournal` migrates it and folds each run once into its summary. Run ``i``
is ``r`` and six digits, of workflow ``w{i % 3}``, started one second after
run ``i - 1`` (run 0 at `START_US`); by ``i % 4`` it failed (``attempts``
attempts, each Failed), succeeded, was cancelled, or is unfinished
(interrupted).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import psycopg
from psycopg import sql

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    Fail,
    Failed,
    Pending,
    RunCancelRequested,
    RunFinished,
    Running,
    RunStarted,
)
from attempt_kernel._codec import encode_record

START_US: Final = 1_800_000_000_000_000
"""2027-01-15T08:00:00Z, run 0's start."""


def run_changes(i: int, attempts: int) -> list[Change]:
    """Run ``i``'s records (see the module doc)."""
    start: Change = RunStarted(workflow=f"w{i % 3}")
    match i % 4:
        case 0:
            changes: list[Change] = [start]
            for a in range(1, attempts + 1):
                changes += [
                    AttemptCreated(step="s", attempt=a),
                    AttemptTransitioned(step="s", attempt=a, from_state=Pending(), cause=Admit(), to_state=Running()),
                    AttemptTransitioned(step="s", attempt=a, from_state=Running(), cause=Fail(), to_state=Failed()),
                ]
            return [*changes, RunFinished()]
        case 1:
            return [start, RunFinished()]
        case 2:
            return [start, RunCancelRequested(), RunFinished()]
        case _:
            return [start]


def _lines(runs: int, attempts: int) -> Iterator[tuple[str, int, bytes]]:
    for i in range(runs):
        run = f"r{i:06d}"
        at = START_US + i * 1_000_000
        for seq, change in enumerate(run_changes(i, attempts), start=1):
            yield run, seq, encode_record(seq, at + seq, run, change)


def bulk_journal(url: str, schema: str, runs: int, *, attempts: int = 1) -> int:
    """Make the journal of ``runs`` runs in ``schema`` at version 5; return how many records it holds."""
    from attempt_kernel.postgres._journal import _MIGRATIONS  # pyright: ignore[reportPrivateUsage]  # version 5 as it was

    s = sql.Identifier(schema)
    count = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=s))
        conn.execute(sql.SQL("CREATE TABLE {s}.schema_version (version integer PRIMARY KEY,"
                             " applied_at timestamptz NOT NULL DEFAULT now())").format(s=s))  # fmt: skip
        records = sql.Literal(f"{schema}.records")
        for version, statements in _MIGRATIONS[:5]:
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=s, records=records))
            conn.execute(sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s), (version,))
        with conn.transaction(), conn.cursor() as cursor:
            with cursor.copy(sql.SQL("COPY {s}.records (run, seq, line) FROM STDIN").format(s=s)) as copy:
                for row in _lines(runs, attempts):
                    copy.write_row(row)
                    count += 1
        conn.execute(sql.SQL("ANALYZE {s}.records").format(s=s))
    return count
