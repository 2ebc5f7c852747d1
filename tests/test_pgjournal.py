"""The PostgreSQL journal against a real server: the store promises, its schema,
its rows, fencing, and the executor and recovery running on it.

Every test here talks to the throwaway server the session starts (`pg_url`);
each gets a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgtools import sql_in
from logs import UNENCODABLE, UNENCODABLE_IDS, fixed_clock, indeterminate_changes, simple_changes
from psycopg import sql

from attempt_kernel import (
    JSON,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Cancelled,
    Change,
    Confirm,
    Confirmed,
    CorruptLine,
    Dispatch,
    Dispatched,
    DomainStateSet,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Job,
    Journal,
    LogItem,
    Pending,
    Planned,
    Record,
    RunCancelRequested,
    RunFinished,
    RunLogError,
    RunLogWriter,
    RunResumed,
    Running,
    RunStarted,
    RunStopRequested,
    Step,
    StepContext,
    StepResult,
    Succeed,
    Succeeded,
    UnencodableRecord,
    Workflow,
    load_workflow,
    recover,
    replay,
    run_jobs,
)
from attempt_kernel.postgres._journal import (
    Lease,
    LeaseLost,
    PgConnectFailed,
    PgJournal,
    PgJournalError,
    PgSchemaTooNew,
    RunHolds,
    connection_lost,
)

pytestmark = pytest.mark.postgres

# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture
def pg(pg_url: str, schema: str) -> Iterator[PgJournal]:
    """A new, empty PostgreSQL journal with the tests' fixed clock."""
    with PgJournal(pg_url, schema=schema, clock=fixed_clock()) as journal:
        yield journal


@pytest.fixture(params=["file", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    """A new, empty journal of each store: the promises of the seam hold for both."""
    if request.param == "file":
        with RunLogWriter(tmp_path / "log.jsonl", clock=fixed_clock()) as writer:
            yield writer
    else:
        url: str = request.getfixturevalue("pg_url")
        name: str = request.getfixturevalue("schema")
        with PgJournal(url, schema=name, clock=fixed_clock()) as journal:
            yield journal


def records(journal: Journal) -> list[tuple[int, str, Change]]:
    return [(i.seq, i.run, i.change) for i in journal.read() if isinstance(i, Record)]


# --------------------------------------------------------------------------
# The store promises, on both stores
# --------------------------------------------------------------------------


def test_an_empty_journal_reads_nothing(store: Journal) -> None:
    """A new journal holds no item."""
    assert list(store.read()) == []


def test_append_returns_sequence_numbers_one_by_one(store: Journal) -> None:
    """The first four appends return 1, 2, 3, 4."""
    assert [store.append("r", change) for change in simple_changes()] == [1, 2, 3, 4]


def test_read_returns_the_appended_records_in_order(store: Journal) -> None:
    """Records of two runs read back in append order, each with its run."""
    a, b = simple_changes("a"), simple_changes("b")
    for run, change in [("r1", a[0]), ("r2", b[0]), ("r1", a[1]), ("r2", b[1])]:
        store.append(run, change)
    store.flush()
    assert records(store) == [(1, "r1", a[0]), (2, "r2", b[0]), (3, "r1", a[1]), (4, "r2", b[1])]


def test_read_can_be_called_again(store: Journal) -> None:
    """A second read yields the same items as the first."""
    for change in simple_changes():
        store.append("r", change)
    assert list(store.read()) == list(store.read())


@pytest.mark.parametrize("value", UNENCODABLE, ids=UNENCODABLE_IDS)
def test_unencodable_value_raises_and_writes_nothing(store: Journal, value: object) -> None:
    """A value JSON cannot carry is refused; the next append still gets the next number."""
    store.append("r", AttemptCreated(step="s", attempt=1))
    with pytest.raises(UnencodableRecord, match="cannot be written as JSON"):
        store.append("r", StepResult(step="s", attempt=1, value=value))  # type: ignore[arg-type]
    assert store.append("r", RunFinished()) == 2
    assert records(store) == [(1, "r", AttemptCreated(step="s", attempt=1)), (2, "r", RunFinished())]


# --------------------------------------------------------------------------
# Schema and migrations
# --------------------------------------------------------------------------


def test_opening_again_keeps_the_records_and_migrates_once(pg_url: str, schema: str) -> None:
    """A second open of the same schema finds the first one's record and adds no version."""
    with PgJournal(pg_url, schema=schema) as first:
        first.append("r", RunStarted(workflow="w"))
    with PgJournal(pg_url, schema=schema) as second:
        assert records(second) == [(1, "r", RunStarted(workflow="w"))]
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == [(1,), (2,), (3,), (4,), (5,), (6,), (7,)]


def test_a_newer_schema_is_refused_naming_both_versions(pg_url: str, schema: str) -> None:
    """A database at version 8 is refused by a library that knows version 7."""
    PgJournal(pg_url, schema=schema).close()
    sql_in(pg_url, schema, "INSERT INTO {s}.schema_version (version) VALUES (8)")
    with pytest.raises(PgSchemaTooNew, match=r"at version 8, but this library knows versions up to 7") as caught:
        PgJournal(pg_url, schema=schema)
    assert (caught.value.found, caught.value.known) == (8, 7)
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == [
        (1,), (2,), (3,), (4,), (5,), (6,), (7,), (8,)
    ]  # fmt: skip


def test_a_schema_name_that_is_not_an_identifier_is_refused(pg_url: str) -> None:
    """Schema names are SQL identifiers of lower-case letters, digits and underscores."""
    with pytest.raises(ValueError, match="schema must be a lower-case SQL identifier"):
        PgJournal(pg_url, schema="Robert'); DROP TABLE x;--")


# --------------------------------------------------------------------------
# Rows: the same records and checksums as the file
# --------------------------------------------------------------------------

EVERY_KIND: list[Change] = [
    RunStarted(workflow="w", input={"n": [1, 2.5, None, "é"]}, domain_states=("drafted",)),
    AttemptCreated(step="s", attempt=1),
    AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
    DomainStateSet(step="s", attempt=1, state="drafted"),
    IntentPlanned(step="s", attempt=1, name="send", key="k-1"),
    IntentChanged(step="s", attempt=1, name="send", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
    StepResult(step="s", attempt=1, error="boom"),
    AttemptTransitioned(
        step="s", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()
    ),
    IntentReconciled(
        step="s",
        attempt=1,
        name="send",
        key="k-1",
        from_state=Dispatched(),
        cause=Confirm(),
        to_state=Confirmed(),
        result={"id": 7},
        by="operator",
        note="seen in the mail log",
    ),
    RunStopRequested(reason="SIGTERM"),
    RunResumed(),
    RunCancelRequested(reason="user asked"),
    RunFinished(),
]


def test_every_change_kind_reads_back_equal(pg: PgJournal) -> None:
    """Each of the twelve kinds of change reads back as the value appended."""
    for change in EVERY_KIND:
        pg.append("r", change)
    assert [c for _, _, c in records(pg)] == EVERY_KIND


def test_rows_hold_the_lines_the_file_store_writes(pg_url: str, schema: str, tmp_path: Path) -> None:
    """Under the same clock, the rows in seq order are the file's bytes, checksums and all."""
    path = tmp_path / "log.jsonl"
    with RunLogWriter(path, clock=fixed_clock()) as writer, PgJournal(
        pg_url, schema=schema, clock=fixed_clock()
    ) as journal:
        for change in EVERY_KIND:
            writer.append("r", change)
            journal.append("r", change)
    lines = [line for (line,) in sql_in(pg_url, schema, "SELECT line FROM {s}.records ORDER BY seq")]
    assert all(isinstance(line, bytes) for line in lines)
    assert lines == path.read_bytes().splitlines(keepends=True)


def test_records_are_stamped_by_the_database_clock_by_default(pg_url: str, schema: str) -> None:
    """Without a clock, time_us comes from the server (client clocks skew)."""
    [(before,)] = sql_in(pg_url, schema, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
    with PgJournal(pg_url, schema=schema) as journal:
        journal.append("r", RunFinished())
        [record] = [i for i in journal.read() if isinstance(i, Record)]
    [(after,)] = sql_in(pg_url, schema, "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
    assert isinstance(before, int) and isinstance(after, int)
    assert before <= record.time_us <= after


def forge(url: str, schema: str, seq: int, line: bytes) -> None:
    sql_in(url, schema, "UPDATE {s}.records SET line = %s WHERE seq = %s", line, seq)


def test_a_row_failing_its_checksum_reads_as_a_corrupt_line_naming_run_and_seq(
    pg: PgJournal, pg_url: str
) -> None:
    """An altered byte in row (r, 2) makes it a CorruptLine; the rows around it still read."""
    for change in simple_changes():
        pg.append("r", change)
    [(line,)] = sql_in(pg_url, pg.schema, "SELECT line FROM {s}.records WHERE seq = 2")
    assert isinstance(line, bytes)
    forge(pg_url, pg.schema, 2, line.replace(b'"Admit"', b'"Fail!"'))
    items: list[LogItem] = list(pg.read())
    assert items[1] == CorruptLine(
        line=2, reason="row of run 'r' seq 2: checksum mismatch (the line was altered)"
    )
    assert [type(i) for i in items] == [Record, CorruptLine, Record, Record]


def test_a_row_holding_another_records_line_is_corrupt(pg: PgJournal, pg_url: str) -> None:
    """A valid line copied into another row does not pass for that row's record."""
    for change in simple_changes():
        pg.append("r", change)
    [(line,)] = sql_in(pg_url, pg.schema, "SELECT line FROM {s}.records WHERE seq = 1")
    assert isinstance(line, bytes)
    forge(pg_url, pg.schema, 3, line)
    assert list(pg.read())[2] == CorruptLine(
        line=3, reason="row of run 'r' seq 3 holds the record of run 'r' seq 1"
    )


def test_replay_reports_a_forged_row_as_a_violation(pg: PgJournal, pg_url: str) -> None:
    """replay reads the journal through the seam and finds the corruption."""
    for change in simple_changes():
        pg.append("r", change)
    forge(pg_url, pg.schema, 4, b'{"v":1}\n')
    report = replay(pg)
    assert not report.valid
    assert report.violations[0].line == 4
    assert report.violations[0].reason == "corrupt line: row of run 'r' seq 4: no checksum at the end of the line"


# --------------------------------------------------------------------------
# Numbering: per run in the rows, one gapless sequence when read
# --------------------------------------------------------------------------


def test_each_run_is_numbered_from_one(pg: PgJournal, pg_url: str) -> None:
    """Appends to a, b, a, b, a return 1, 1, 2, 2, 3; the rows hold those numbers."""
    runs = ["a", "b", "a", "b", "a"]
    changes = simple_changes()
    assert [pg.append(run, changes[i // 2]) for i, run in enumerate(runs)] == [1, 1, 2, 2, 3]
    rows = sql_in(pg_url, pg.schema, "SELECT run, seq FROM {s}.records ORDER BY pos")
    assert rows == [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]


def test_read_numbers_the_journal_one_by_one_in_the_order_written(pg: PgJournal) -> None:
    """The five records of two runs read back as seq 1..5 in append order, and replay clean."""
    pg.append("a", RunStarted(workflow="w"))
    pg.append("b", RunStarted(workflow="w"))
    pg.append("a", RunFinished())
    pg.append("b", RunFinished())
    assert records(pg) == [
        (1, "a", RunStarted(workflow="w")),
        (2, "b", RunStarted(workflow="w")),
        (3, "a", RunFinished()),
        (4, "b", RunFinished()),
    ]
    assert replay(pg).valid


def test_read_run_numbers_one_run_and_the_next_append_follows_it(pg_url: str, schema: str) -> None:
    """A second journal reads run a (2 records) and appends its third as seq 3."""
    with PgJournal(pg_url, schema=schema) as first:
        first.append("a", RunStarted(workflow="w"))
        first.append("b", RunStarted(workflow="w"))
        first.append("a", RunResumed())
    with PgJournal(pg_url, schema=schema) as second:
        assert [(i.seq, i.line) for i in second.read_run("a") if isinstance(i, Record)] == [(1, 1), (2, 2)]
        assert second.append("a", RunFinished()) == 3
        assert second.append("b", RunFinished()) == 2  # b was not read: its number comes from the database


def test_a_missing_row_is_a_gap_named_by_run_and_seq(pg: PgJournal, pg_url: str) -> None:
    """Delete row (r, 2): reading finds seq 3 after seq 1, a violation at that line."""
    for change in simple_changes():
        pg.append("r", change)
    sql_in(pg_url, pg.schema, "DELETE FROM {s}.records WHERE run = 'r' AND seq = 2")
    items = list(pg.read())
    assert items[1] == CorruptLine(
        line=2, reason="row of run 'r' seq 3: the run's previous record is seq 1 (a gap: records are missing)"
    )
    assert [type(i) for i in items] == [Record, CorruptLine, Record, Record]
    gap = [i for i in pg.read_run("r") if isinstance(i, CorruptLine)]
    assert [c.reason for c in gap] == [
        "row of run 'r' seq 3: the run's previous record is seq 1 (a gap: records are missing)"
    ]
    report = replay(pg)
    assert not report.valid and report.violations[0].line == 2


def test_append_all_writes_records_of_a_run_in_order_in_one_go(pg: PgJournal, pg_url: str) -> None:
    """Four records at once after one alone: numbers 2..5, read back in the order given."""
    changes = simple_changes()
    assert pg.append("r", RunStarted(workflow="w")) == 1
    assert pg.append_all("r", changes) == 5
    assert pg.append("r", RunFinished()) == 6
    assert records(pg) == [
        (1, "r", RunStarted(workflow="w")), *[(i, "r", c) for i, c in enumerate(changes, start=2)], (6, "r", RunFinished())
    ]  # fmt: skip
    assert sql_in(pg_url, pg.schema, "SELECT seq FROM {s}.records ORDER BY pos") == [(i,) for i in range(1, 7)]
    with pytest.raises(ValueError, match="at least one change"):
        pg.append_all("r", [])


def test_records_appended_in_one_go_share_one_time(pg: PgJournal) -> None:
    """As in the file store: the clock (0.5 s a tick here) is read once per append, not once per record."""
    pg.append("r", RunStarted(workflow="w"))
    pg.append_all("r", simple_changes())
    pg.append("r", RunFinished())
    times = [item.time_us for item in pg.read() if isinstance(item, Record)]
    assert times == [1_000_000_000, *[1_000_500_000] * 4, 1_001_000_000]


def test_append_all_under_a_lost_lease_writes_none_of_them(pg_url: str, schema: str) -> None:
    """The fence moved on: LeaseLost, and not one of the three records is in the journal."""
    PgJournal(pg_url, schema=schema).close()
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r', 'worker-b', 2)")
    with PgJournal(pg_url, schema=schema, lease=Lease(owner="worker-a", fence=1)) as journal:
        with pytest.raises(LeaseLost):
            journal.append_all("r", simple_changes()[:3])
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.records") == [(0,)]


def test_a_forged_row_with_a_valid_checksum_out_of_its_runs_order_is_reported(pg: PgJournal, pg_url: str) -> None:
    """A row inserted by hand as run r's seq 7 (its line checksummed for seq 7) after seq 4: a gap at its line."""
    from attempt_kernel._codec import encode_record

    for change in simple_changes():
        pg.append("r", change)
    forged = encode_record(7, 0, "r", RunFinished())
    sql_in(pg_url, pg.schema, "INSERT INTO {s}.records (run, seq, line) VALUES ('r', 7, %s)", forged)
    corrupt = [i for i in pg.read() if isinstance(i, CorruptLine)]
    assert corrupt == [
        CorruptLine(line=5, reason="row of run 'r' seq 7: the run's previous record is seq 4 (a gap: records are missing)")
    ]
    assert not replay(pg).valid


def test_two_writers_of_one_run_collide_instead_of_interleaving(pg_url: str, schema: str) -> None:
    """Both journals think seq 2 of run r is theirs: the second append fails, naming the key."""
    with PgJournal(pg_url, schema=schema) as first, PgJournal(pg_url, schema=schema) as second:
        first.append("r", RunStarted(workflow="w"))
        assert second.append("r", RunResumed()) == 2
        with pytest.raises(RunLogError, match=r"append of record seq 2 of run 'r' failed: .*duplicate key"):
            first.append("r", RunResumed())
    assert sql_in(pg_url, schema, "SELECT run, seq FROM {s}.records ORDER BY pos") == [("r", 1), ("r", 2)]


def test_read_is_one_snapshot_and_appends_go_on_during_it(pg: PgJournal) -> None:
    """A read half done sees none of the appends made meanwhile, which neither block nor fail."""
    for run in ("a", "b", "c"):
        pg.append(run, RunStarted(workflow="w"))
    reading = pg.read()
    first = next(reading)
    assert isinstance(first, Record) and first.run == "a"
    assert pg.append("d", RunStarted(workflow="w")) == 1
    assert pg.append("a", RunFinished()) == 2
    assert [i.run for i in reading if isinstance(i, Record)] == ["b", "c"]
    assert [i.run for i in pg.read() if isinstance(i, Record)] == ["a", "b", "c", "d", "a"]


def version_3_journal(url: str, schema: str, rows: list[tuple[str, Change]]) -> None:
    """A journal as version 3 left it: migrations 1 to 3, rows numbered journal-wide, head at the last."""
    from attempt_kernel._codec import encode_record
    from attempt_kernel.postgres._journal import _MIGRATIONS  # pyright: ignore[reportPrivateUsage]  # version 3 as it was created

    s = sql.Identifier(schema)
    clock = fixed_clock()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=s))
        conn.execute(sql.SQL("CREATE TABLE {s}.schema_version (version integer PRIMARY KEY,"
                             " applied_at timestamptz NOT NULL DEFAULT now())").format(s=s))  # fmt: skip
        for version, statements in _MIGRATIONS[:3]:
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=s))
            conn.execute(sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s), (version,))
        for seq, (run, change) in enumerate(rows, start=1):
            conn.execute(
                sql.SQL("INSERT INTO {s}.records (run, seq, line) VALUES (%s, %s, %s)").format(s=s),
                (run, seq, encode_record(seq, clock(), run, change)),
            )
        conn.execute(sql.SQL("UPDATE {s}.head SET last_seq = %s").format(s=s), (len(rows),))


def test_a_version_3_journal_upgrades_and_its_runs_continue(pg_url: str, schema: str) -> None:
    """Rows numbered journal-wide (version 3) keep their numbers; runs spanning the upgrade go on."""
    version_3_journal(
        pg_url, schema, [("a", RunStarted(workflow="w")), ("b", RunStarted(workflow="w")), ("a", RunResumed())]
    )
    with PgJournal(pg_url, schema=schema, clock=fixed_clock()) as journal:
        assert journal.append("a", RunFinished()) == 4  # a's last number was 3
        assert journal.append("b", RunFinished()) == 3  # b's was 2
        assert journal.append("c", RunStarted(workflow="w")) == 1  # a new run starts at 1
        items = list(journal.read())
        assert all(isinstance(i, Record) for i in items)
        assert [(i.seq, i.run) for i in items if isinstance(i, Record)] == [
            (1, "a"), (2, "b"), (3, "a"), (4, "a"), (5, "b"), (6, "c")
        ]  # fmt: skip
        assert [i.line for i in journal.read_run("a") if isinstance(i, Record)] == [1, 2, 3]
        assert replay(journal).valid
    rows = sql_in(pg_url, schema, "SELECT pos, run, seq FROM {s}.records ORDER BY pos")
    assert rows == [(1, "a", 1), (2, "b", 2), (3, "a", 3), (4, "a", 4), (5, "b", 3), (6, "c", 1)]
    assert sql_in(pg_url, schema, "SELECT per_run_after FROM {s}.head") == [(3,)]
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == [(1,), (2,), (3,), (4,), (5,), (6,), (7,)]


def test_a_missing_version_3_row_is_still_found(pg_url: str, schema: str) -> None:
    """Below the upgrade mark numbers go up by one across the journal: a deleted b (seq 2) leaves 3 after 1."""
    version_3_journal(
        pg_url, schema, [("a", RunStarted(workflow="w")), ("b", RunStarted(workflow="w")), ("a", RunResumed())]
    )
    sql_in(pg_url, schema, "DELETE FROM {s}.records WHERE seq = 2")  # before the upgrade: no pos yet
    with PgJournal(pg_url, schema=schema) as journal:
        reasons = [i.reason for i in journal.read() if isinstance(i, CorruptLine)]
    assert reasons == [
        "row of run 'a' seq 3: sequence number 3 follows 1 (rows numbered journal-wide, before schema version 4)"
    ]


# --------------------------------------------------------------------------
# Connecting
# --------------------------------------------------------------------------


def test_an_unreachable_url_names_the_host_and_the_drivers_reason() -> None:
    """Nothing listens on port 1: one line naming 127.0.0.1:1 and the refusal."""
    with pytest.raises(PgConnectFailed) as caught:
        PgJournal("postgresql://postgres@127.0.0.1:1/postgres", connect_timeout=2)
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL at 127.0.0.1:1, database postgres: ")
    assert "Connection refused" in message and "\n" not in message
    assert isinstance(caught.value, RunLogError)


def test_a_summary_wait_says_whether_what_it_waits_for_came_in_old_rows_and_new() -> None:
    """A summary row's wait is [signal, wake_us, came] ([signal, wake_us] in rows written
    before): a wake time passed by now came too; any other shape is refused."""
    from attempt_kernel._runlist import WaitOn
    from attempt_kernel.postgres._journal import listed_wait

    now = 2_000_000
    assert listed_wait(["approve", None], now) == WaitOn(signal="approve", wake_us=None, came=False)
    assert listed_wait(["approve", None, True], now) == WaitOn(signal="approve", wake_us=None, came=True, signal_came=True)
    assert listed_wait([None, 1_000_000, False], now) == WaitOn(signal=None, wake_us=1_000_000, came=True)
    assert listed_wait([None, 3_000_000], now) == WaitOn(signal=None, wake_us=3_000_000, came=False)
    with pytest.raises(PgJournalError, match="unexpected wait"):
        listed_wait(["approve", None, "yes"], now)


def test_a_password_in_the_url_is_never_shown() -> None:
    """The error names the host, not the URL, which may hold a secret."""
    with pytest.raises(PgConnectFailed) as caught:
        PgJournal("postgresql://app:hunter2@127.0.0.1:1/db", connect_timeout=2)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            "postgresql://app:TopSecret9@[::1/db",
            'end of string reached when looking for matching "]" in IPv6 host address in URI:'
            ' "postgresql://app@[::1/db"',
        ),
        ("postgresql://app:Top%Secret@127.0.0.1:1/db", 'invalid percent-encoded token: "***"'),
        ("postgresql://127.0.0.1:1/db?password=Hush%zz", 'invalid percent-encoded token: "***"'),
        ("postgresql://127.0.0.1:1/db?pass%77ord=Hush%zz", 'invalid percent-encoded token: "***"'),
        (
            "postgresql://app:a@[::1/db",  # a short password is not spelled out by its replacements
            'end of string reached when looking for matching "]" in IPv6 host address in URI:'
            ' "postgresql://app@[::1/db"',
        ),
        (
            "postgresql://app:ab@cd@127.0.0.1:1/db",  # else the driver takes "cd@127.0.0.1" for the host
            "it holds '@' more than once before its host; write an '@' in a user name or password as %40",
        ),
        # parsed, then refused by libpq before it connects: not an outage either
        ("postgresql://app:pw@127.0.0.1:abc/db", 'invalid integer value "abc" for connection option "port"'),
        ("postgresql://app@127.0.0.1/db?port=abc", 'invalid integer value "abc" for connection option "port"'),
        ("postgresql://app@127.0.0.1:99999/db", 'invalid port number: "99999"'),
        ("postgresql://app@127.0.0.1:1/db?sslmode=bogus", 'invalid sslmode value: "bogus"'),
    ],
    ids=[
        "quoted whole", "the password is the bad token", "a password parameter",
        "a password parameter with its name escaped", "a one-letter password", "an unescaped @ in it",
        "a port that is no number", "a port parameter that is no number", "a port out of range",
        "an unknown sslmode",
    ],
)
def test_a_url_the_driver_cannot_parse_is_a_wrong_argument_and_hides_its_password(
    url: str, reason: str
) -> None:
    """libpq quotes a URL it cannot parse, or the token it stopped at, which may be the
    password itself: the password is replaced by ***. And such a URL is not an outage
    (`connection_lost` is False): a worker does not retry it for minutes."""
    with pytest.raises(PgJournalError) as caught:
        PgJournal(url, connect_timeout=2)
    assert type(caught.value) is PgJournalError
    assert str(caught.value) == f"not a PostgreSQL URL the driver can read: {reason}"
    assert not connection_lost(caught.value)


# --------------------------------------------------------------------------
# Commits: Dispatched synchronously, the rest asynchronously
# --------------------------------------------------------------------------


def test_only_dispatched_commits_synchronously(pg: PgJournal, pg_url: str) -> None:
    """A trigger records synchronous_commit as each row is written: on only for seq 4, the Dispatch."""
    sql_in(pg_url, pg.schema, "CREATE TABLE {s}.seen (seq bigint, sync text)")
    sql_in(
        pg_url,
        pg.schema,
        "CREATE FUNCTION {s}.note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO {s}.seen VALUES (NEW.seq, current_setting('synchronous_commit'));"
        " RETURN NEW; END $$",
    )
    sql_in(pg_url, pg.schema, "CREATE TRIGGER note AFTER INSERT ON {s}.records FOR EACH ROW EXECUTE FUNCTION {s}.note()")
    for change in indeterminate_changes():
        pg.append("r", change)
    seen = sql_in(pg_url, pg.schema, "SELECT seq, sync FROM {s}.seen ORDER BY seq")
    assert seen == [(1, "off"), (2, "off"), (3, "off"), (4, "on"), (5, "off")]


def test_flush_after_asynchronous_appends_returns(pg: PgJournal) -> None:
    """flush commits synchronously and the journal takes appends after it."""
    pg.append("r", RunStarted(workflow="w"))
    pg.flush()
    assert pg.append("r", RunFinished()) == 2


# --------------------------------------------------------------------------
# Fencing: the hook for leases (workers come later)
# --------------------------------------------------------------------------


def test_a_fenced_append_writes_when_owner_and_fence_match(pg_url: str, schema: str) -> None:
    """The runs row names worker-a at fence 3: its append at fence 3 is written."""
    PgJournal(pg_url, schema=schema).close()
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r', 'worker-a', 3)")
    with PgJournal(pg_url, schema=schema, lease=Lease(owner="worker-a", fence=3)) as journal:
        assert journal.append("r", RunStarted(workflow="w")) == 1
        assert records(journal) == [(1, "r", RunStarted(workflow="w"))]


def test_an_append_under_an_old_fence_raises_lease_lost_and_writes_nothing(pg_url: str, schema: str) -> None:
    """After a takeover raised the fence to 4, worker-a's append at fence 3 is refused."""
    PgJournal(pg_url, schema=schema).close()
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r', 'worker-b', 4)")
    with PgJournal(pg_url, schema=schema, lease=Lease(owner="worker-a", fence=3)) as journal:
        with pytest.raises(LeaseLost, match="the lease of 'worker-a' at fence 3 is lost"):
            journal.append("r", RunFinished())
        assert list(journal.read()) == []
    with PgJournal(pg_url, schema=schema) as unfenced:
        assert unfenced.append("r", RunFinished()) == 1  # the refused append gave its number back


def test_a_run_without_a_runs_row_cannot_be_written_under_a_lease(pg_url: str, schema: str) -> None:
    """No row names the run's owner: a fenced append raises LeaseLost."""
    with PgJournal(pg_url, schema=schema, lease=Lease(owner="worker-a", fence=1)) as journal:
        with pytest.raises(LeaseLost):
            journal.append("r", RunStarted(workflow="w"))


# --------------------------------------------------------------------------
# The executor and recovery on a PostgreSQL journal
# --------------------------------------------------------------------------


class World:
    """Counts step calls and effects, so a test can tell what ran again."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.charges = 0

    def workflow(self) -> Workflow:
        async def plain(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1
            return f"{ctx.step}-done"

        async def pay(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1

            async def charge(key: str) -> JSON:
                self.charges += 1
                return "charged"

            return await ctx.effect("charge", charge)

        return load_workflow("w", [Step(name="a", run=plain), Step(name="pay", run=pay, after=("a",))])


def test_the_executor_runs_on_a_pg_journal_and_replay_finds_it_valid(pg: PgJournal) -> None:
    """Two runs (13 records each) succeed; the journal replays clean."""
    world = World()
    reports = run_jobs(pg, [Job(workflow=world.workflow(), run="r1"), Job(workflow=world.workflow(), run="r2")])
    assert [(r.run, r.status) for r in reports] == [("r1", "succeeded"), ("r2", "succeeded")]
    report = replay(pg)
    assert report.valid and report.records == 26
    assert report.final_states[Succeeded()] == 4


class Crash(Exception):
    """The simulated crash: the process died here, before this append."""


class CrashAfter:
    """A journal whose every append fails once ``n`` records were appended."""

    def __init__(self, journal: PgJournal, n: int) -> None:
        self.journal = journal
        self.left = n

    def read(self) -> Iterator[LogItem]:
        return self.journal.read()

    def append(self, run: str, change: Change) -> int:
        if self.left == 0:
            raise Crash(f"crashed before appending {change}")
        self.left -= 1
        return self.journal.append(run, change)

    def flush(self) -> None:
        if self.left == 0:
            raise Crash("crashed before a flush")
        self.journal.flush()


def crash_after(pg: PgJournal, n: int, world: World) -> None:
    with pytest.raises(Crash):
        run_jobs(CrashAfter(pg, n), [Job(workflow=world.workflow(), run="r")], admission_limit=1)


def test_recovery_ends_a_dispatched_orphan_indeterminate_on_a_pg_journal(pg: PgJournal) -> None:
    """Crash right after record 9 (pay's Dispatch): pay ends Indeterminate and is never charged by the resumed run."""
    world = World()
    crash_after(pg, 9, world)
    recovery = recover(pg, {"w": world.workflow()})
    [orphan] = recovery.orphans
    assert (orphan.step, orphan.from_state, orphan.to_state) == ("pay", Running(), Indeterminate())
    [run] = recovery.runs
    [report] = run_jobs(pg, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    assert report.status == "needs-reconciliation"
    assert world.charges == 0  # the crash came before the effect; nobody may send it blind
    check = replay(pg)
    assert check.valid and len(check.indeterminate) == 1


def test_recovery_cancels_an_orphan_before_dispatch_and_the_retry_succeeds(pg: PgJournal) -> None:
    """Crash after record 8 (pay planned, not dispatched): Cancelled, then a second attempt succeeds."""
    world = World()
    crash_after(pg, 8, world)
    recovery = recover(pg, {"w": world.workflow()})
    [orphan] = recovery.orphans
    assert (orphan.step, orphan.from_state, orphan.to_state) == ("pay", Running(), Cancelled())
    [run] = recovery.runs
    [report] = run_jobs(pg, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    assert report.status == "succeeded"
    assert {s.step: (s.state, s.attempts) for s in report.steps}["pay"] == (Succeeded(), 2)
    assert world.calls == {"a": 1, "pay": 2} and world.charges == 1
    assert replay(pg).valid


def test_recovery_of_a_finished_pg_journal_changes_nothing(pg: PgJournal) -> None:
    """A journal whose runs all finished: recovery writes nothing and says so."""
    world = World()
    run_jobs(pg, [Job(workflow=world.workflow(), run="r")])
    assert recover(pg, {"w": world.workflow()}).changed_nothing
    assert replay(pg).records == 13


def test_a_transition_record_is_the_same_value_after_the_round_trip(pg: PgJournal) -> None:
    """A Succeed transition keeps its from, cause and to through PostgreSQL."""
    change = AttemptTransitioned(step="s", attempt=2, from_state=Running(), cause=Succeed(), to_state=Succeeded())
    pg.append("r", change)
    assert records(pg) == [(1, "r", change)]


# --------------------------------------------------------------------------
# Holding runs outside a worker (RunHolds)
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_run_held_by_one_process_is_refused_to_another_until_it_lets_go(pg_url: str, schema: str) -> None:
    """Two sessions: the first to take a run holds it; the other is told so, holds other runs
    (and the same run id in another schema), and takes it once the first closes."""
    with RunHolds(pg_url, schema=schema) as first, RunHolds(pg_url, schema=schema) as second:
        assert first.take("r") is True
        assert first.take("r") is True  # again: still held, by this one
        assert second.take("r") is False
        assert second.take("s") is True
        assert first.take("s") is False
        with RunHolds(pg_url, schema=schema + "_other") as elsewhere:
            assert elsewhere.take("r") is True
        first.close()
        assert second.take("r") is True
        assert second.held == {"r", "s"}


@pytest.mark.postgres
def test_a_hold_ends_with_the_process_that_took_it(pg_url: str, schema: str) -> None:
    """SIGKILL the holder: the server ends its session, and the run can be taken again."""
    with subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys; from attempt_kernel.postgres._journal import RunHolds\n"
            f"h = RunHolds({pg_url!r}, schema={schema!r}); assert h.take('r'); print('held', flush=True)\n"
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder, RunHolds(pg_url, schema=schema) as other:  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert other.take("r") is False
        holder.kill()
        holder.wait(timeout=60)
        deadline = time.monotonic() + 60  # the server notices the closed connection; no bound asserted
        while not other.take("r"):
            assert time.monotonic() < deadline, "the killed holder's lock was never released"
            time.sleep(0.05)
        assert other.held == {"r"}


def test_a_summary_says_one_signal_came_for_one_of_two_waits_of_its_name() -> None:
    """Two waits for 'approve' open, one 'approve' recorded: the first wait takes it once
    the run is taken up, the second still waits (its row says its signal did not come)."""
    from attempt_kernel import RunStarted, SignalSent, WaitStarted
    from attempt_kernel._ledger import Ledger
    from attempt_kernel.postgres._journal import summary_of

    fold = Ledger()
    changes: list[Change] = [
        RunStarted(workflow="twin", nonce="n-1", code=True),
        WaitStarted(position=1, signal="approve"),
        WaitStarted(position=2, signal="approve"),
        SignalSent(name="approve", payload=1, id="s-1"),
    ]
    for number, change in enumerate(changes, 1):
        fold.apply(Record(line=number, seq=number, time_us=1_000_000, run="a-1", change=change))
    summary = summary_of(fold, "a-1")
    assert summary is not None
    assert [w.came for w in summary.waiting_on] == [True, False]


@pytest.mark.parametrize(
    "wait", [["approve"], [], 5, None, {"signal": "approve", "wake": None}, [["approve"], None]],
    ids=["one-field", "empty", "number", "null", "object", "nested"],
)  # fmt: skip
def test_a_summary_wait_of_any_other_shape_is_refused_as_an_unexpected_wait(wait: object) -> None:
    """A summaries row is the database's answer: a wait that is no [signal, wake_us(, came)]
    list is a `PgJournalError` (exit 3 from the CLI), never a ValueError or TypeError
    escaping as a traceback."""
    from attempt_kernel.postgres._journal import listed_wait

    with pytest.raises(PgJournalError, match="unexpected wait"):
        listed_wait(wait, 2_000_000)


@pytest.mark.parametrize("waiting_on", ["not json", '{"approve": null}', "5", '"x"'], ids=["bad-json", "object", "number", "string"])
def test_a_summary_row_whose_waits_are_no_list_is_refused_as_an_unexpected_row(waiting_on: str) -> None:
    """The row's waiting_on column holds a JSON list of waits; anything else is the
    database answering what no writer wrote: a `PgJournalError`, not a traceback."""
    from attempt_kernel.postgres._journal import _listed_row  # pyright: ignore[reportPrivateUsage]

    row = ("a-1", "w", "waiting", 0, 1_000_000, None, None, waiting_on, False, 0)
    with pytest.raises(PgJournalError, match="unexpected"):
        _listed_row(row)


def test_a_listed_signal_wait_whose_timeout_passed_came_by_its_time_not_by_its_signal() -> None:
    """["approve", wake, False] with the wake time past: the wait came to its end, but
    not by the signal (runs says it goes on without it)."""
    from attempt_kernel._runlist import WaitOn
    from attempt_kernel.postgres._journal import listed_wait

    assert listed_wait(["approve", 1_000_000, False], 2_000_000) == WaitOn(
        signal="approve", wake_us=1_000_000, came=True, signal_came=False
    )


# --------------------------------------------------------------------------
# Text PostgreSQL cannot hold
# --------------------------------------------------------------------------

# A run log file's JSON holds any string; PostgreSQL keeps a run's id, its
# workflow's name and its domain states as text, which holds no NUL and
# (being UTF-8) no lone surrogate.
UNTEXTABLE = [
    pytest.param("a\x00b", r"a NUL \('\\x00'\) at index 1", id="nul"),
    pytest.param("ab\ud800", r"a lone surrogate \('\\ud800'\) at index 2", id="lone-surrogate"),
]


def journal_rows(url: str, schema: str) -> list[tuple[object, ...]]:
    return sql_in(
        url, schema,
        "SELECT (SELECT count(*) FROM {s}.records), (SELECT count(*) FROM {s}.summaries)",
    )  # fmt: skip


@pytest.mark.parametrize(("state", "said"), UNTEXTABLE)
def test_a_domain_state_postgresql_cannot_hold_is_refused_before_the_run_starts(
    pg: PgJournal, pg_url: str, schema: str, state: str, said: str
) -> None:
    """A workflow declaring such a state is refused at its run's start, nothing written,
    the journal still usable: the state's record failed mid-run (a NUL broke the journal
    with three records written; a lone surrogate failed the step with UnicodeEncodeError)."""

    async def mark(ctx: StepContext) -> JSON:
        ctx.set_state(state)
        return "marked"

    flow = load_workflow("w", [Step(name="s", run=mark)], domain_states=(state,))
    with pytest.raises(UnencodableRecord, match=f"domain state {re.escape(repr(state))} holds {said}"):
        run_jobs(pg, [Job(workflow=flow, run="r")])
    assert journal_rows(pg_url, schema) == [(0, 0)]
    assert pg.append("r2", RunStarted(workflow="w")) == 1


@pytest.mark.parametrize(("text", "said"), UNTEXTABLE)
@pytest.mark.parametrize("field", ["run id", "workflow name"])
def test_a_run_id_or_workflow_name_postgresql_cannot_hold_is_refused_and_the_journal_goes_on(
    pg: PgJournal, pg_url: str, schema: str, field: str, text: str, said: str
) -> None:
    """Refused as `UnencodableRecord` naming the field and the character, before the run is
    even read: a NUL broke the journal (`PgWriteFailed`, "whether it was committed is
    unknown"), a lone surrogate escaped as UnicodeEncodeError."""
    run, workflow = (text, "w") if field == "run id" else ("r", text)
    with pytest.raises(UnencodableRecord, match=f"{field} {re.escape(repr(text))} holds {said}.*nothing was written"):
        pg.append(run, RunStarted(workflow=workflow))
    assert journal_rows(pg_url, schema) == [(0, 0)]
    assert pg.append("r2", RunStarted(workflow="w")) == 1


@pytest.mark.parametrize(("state", "said"), UNTEXTABLE)
def test_a_hand_over_postgresql_cannot_hold_is_refused_and_the_group_writes_the_others(
    pg_url: str, schema: str, state: str, said: str
) -> None:
    """On the writer thread's path the refusal comes at the hand-over: the whole group
    failed in the writer (every waiter `PgWriteFailed`, the journal broken), so one run's
    domain state killed the worker that wrote it."""

    async def scenario(journal: PgJournal) -> None:
        journal.hand_over("ok", [RunStarted(workflow="w")])
        with pytest.raises(UnencodableRecord, match=f"domain state {re.escape(repr(state))} holds {said}"):
            journal.hand_over("bad", [RunStarted(workflow="w", domain_states=(state,))])
        await journal.committed("ok")
        await journal.committed("bad")

    with PgJournal(pg_url, schema=schema, clock=fixed_clock()) as journal:
        asyncio.run(scenario(journal))
        assert records(journal) == [(1, "ok", RunStarted(workflow="w"))]


@pytest.mark.parametrize(("text", "said"), UNTEXTABLE)
def test_looking_up_a_run_or_workflow_postgresql_cannot_hold_finds_nothing(
    pg: PgJournal, text: str, said: str
) -> None:
    """No run of such an id (or workflow) can be in the journal, so a lookup finds none,
    as for any id not there; it raised the database's refusal or the driver's
    UnicodeEncodeError."""
    from attempt_kernel._runlist import RunFilter

    pg.append("r", RunStarted(workflow="w"))
    assert list(pg.read_run(text)) == []
    assert pg.read_run_snapshot(text) == []
    assert pg.queued(text) is None
    assert pg.listed(RunFilter(workflow=text)) == ([], 0)
    assert [row.run for row in pg.listed(RunFilter(workflow="w"))[0]] == ["r"]
