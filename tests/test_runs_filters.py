"""`attempt-kernel runs` filters (--status, --workflow, --since, --until, --limit), queued runs,
and the PostgreSQL journal's run summaries, which must say what a fold of the journal says.

The journals are written out by hand (`JOURNAL`: one run of every status a
log can hold), to a file and to PostgreSQL with the same clock, so the
rows expected of both are the same hand-written ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import get_args

import psycopg
import pytest
from bulkjournal import bulk_journal
from logs import fixed_clock, indeterminate_changes, simple_changes
from pgtools import sql_in
from psycopg import sql

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    Confirm,
    Confirmed,
    Dispatched,
    Fail,
    Failed,
    IntentPlanned,
    IntentReconciled,
    Pending,
    RunCancelRequested,
    RunFinished,
    RunLogWriter,
    Running,
    RunStarted,
    StepResult,
    Succeed,
    Succeeded,
    WaitStarted,
)
from attempt_kernel.cli._main import main
from attempt_kernel._operations import listed_runs
from attempt_kernel._ledger import Ledger
from attempt_kernel._runlist import LISTED_STATUSES, ListedStatus, RunFilter, RunRow, parse_time, select
from attempt_kernel.postgres import PgJournal

# One run of each status a log holds, in the order written (fixed_clock: record k at
# 1_000_000_000 + (k - 1) * 500_000 us, so 1970-01-01T00:16:40Z for the first).
JOURNAL: list[tuple[str, list[Change]]] = [
    ("ok-1", [RunStarted(workflow="pay"), *simple_changes(), RunFinished()]),  # records 1-6
    (
        "bad-1",  # records 7-11
        [
            RunStarted(workflow="pay"),
            AttemptCreated(step="s", attempt=1),
            AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
            AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()),
            RunFinished(),
        ],
    ),
    ("stop-1", [RunStarted(workflow="ship"), RunCancelRequested(), RunFinished()]),  # records 12-14
    ("mail-1", [RunStarted(workflow="ship"), *indeterminate_changes(), RunFinished()]),  # records 15-21
    (
        "mail-2",  # records 22-29: ended needing reconciliation, then reconciled
        [
            RunStarted(workflow="ship"),
            *[replace(c, key="k-post") if isinstance(c, IntentPlanned) else c for c in indeterminate_changes()],
            RunFinished(),
            IntentReconciled(
                step="mail", attempt=1, name="send", key="k-post", from_state=Dispatched(),
                cause=Confirm(), to_state=Confirmed(), by="ops",
            ),  # fmt: skip
        ],
    ),
    (
        "cut-1",  # records 30-32: unfinished, an attempt live
        [
            RunStarted(workflow="pay"),
            AttemptCreated(step="s", attempt=1),
            AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        ],
    ),
    ("nap-1", [RunStarted(workflow="nap", code=True), WaitStarted(position=1, signal="go")]),  # records 33-34
]

# run, workflow, status, attempts, started, ended (as `runs --json` prints them)
EXPECTED: list[tuple[str, str, str, int, str | None, str | None]] = [
    ("ok-1", "pay", "succeeded", 1, "1970-01-01T00:16:40.000Z", "1970-01-01T00:16:42.500Z"),
    ("bad-1", "pay", "failed", 1, "1970-01-01T00:16:43.000Z", "1970-01-01T00:16:45.000Z"),
    ("stop-1", "ship", "cancelled", 0, "1970-01-01T00:16:45.500Z", "1970-01-01T00:16:46.500Z"),
    ("mail-1", "ship", "needs-reconciliation", 1, "1970-01-01T00:16:47.000Z", "1970-01-01T00:16:50.000Z"),
    ("mail-2", "ship", "interrupted", 1, "1970-01-01T00:16:50.500Z", None),
    ("cut-1", "pay", "interrupted", 1, "1970-01-01T00:16:54.500Z", None),
    ("nap-1", "nap", "waiting", 0, "1970-01-01T00:16:56.000Z", None),
]


def write_file(path: Path) -> str:
    with RunLogWriter(path, clock=fixed_clock()) as log:
        for run, changes in JOURNAL:
            for change in changes:
                log.append(run, change)
    return str(path)


def write_pg(url: str, schema: str) -> None:
    with PgJournal(url, schema=schema, clock=fixed_clock()) as journal:
        for run, changes in JOURNAL:
            for change in changes:
                journal.append(run, change)


def runs_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[tuple[object, ...]]:
    assert main(["runs", *argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["violations"] == 0
    return [
        (r["run"], r["workflow"], r["status"], r["attempts"], r["started"], r["ended"]) for r in doc["runs"]
    ]


def folded(journal: PgJournal, held: frozenset[str]) -> list[RunRow]:
    """The rows `runs` printed before the summaries: a fold of the whole journal."""
    ledger = Ledger()
    ledger.feed(journal.read())
    return [RunRow.of(view, view.run in held) for view in ledger.runs.values()]


@pytest.fixture
def file_log(tmp_path: Path) -> str:
    return write_file(tmp_path / "log.jsonl")


# --------------------------------------------------------------------------
# Parsing, and the statuses named in --help
# --------------------------------------------------------------------------


def test_the_listed_statuses_are_the_type_s() -> None:
    """`LISTED_STATUSES` names every `ListedStatus`, once."""
    assert sorted(LISTED_STATUSES) == sorted(get_args(ListedStatus))
    assert len(set(LISTED_STATUSES)) == len(LISTED_STATUSES)


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1970-01-01T00:16:40Z", 1_000_000_000),
        ("1970-01-01T00:16:42.500Z", 1_002_500_000),
        ("1970-01-01T00:16:42.5Z", 1_002_500_000),
        ("2027-01-15T08:00:00.000001Z", 1_800_000_000_000_001),
    ],
)
def test_a_utc_time_as_started_prints_it_parses(text: str, micros: int) -> None:
    """Times in the STARTED column's form (with or without a fraction) read back to microseconds."""
    assert parse_time(text) == micros


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--status", "bogus"], "argument --status: unknown status 'bogus' (known: queued, running,"),
        (["--status", "failed,nope"], "argument --status: unknown status 'nope'"),
        (["--since", "yesterday"], "argument --since: expected a UTC time like 2026-12-01T14:07:55Z"),
        (["--until", "2026-12-01 14:07:55"], "got '2026-12-01 14:07:55'"),
        (["--since", "2026-02-30T00:00:00Z"], "argument --since: '2026-02-30T00:00:00Z' is no time"),
        (["--limit", "0"], "argument --limit: expected a positive integer, got 0"),
        (["--limit", "-3"], "argument --limit: expected a positive integer, got -3"),
        (["--limit", "ten"], "argument --limit: expected a positive integer, got 'ten'"),
    ],
)
def test_a_bad_filter_is_a_usage_error_and_reads_nothing(
    tmp_path: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 naming the flag and the value; the log is not even opened (it does not exist)."""
    with pytest.raises(SystemExit) as info:
        main(["runs", str(tmp_path / "missing.jsonl"), *argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err, err
    assert "missing.jsonl" not in err


def test_a_bad_filter_on_a_url_connects_to_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL naming no server: the bad flag is reported, not the connection."""
    with pytest.raises(SystemExit) as info:
        main(["runs", "postgresql://nobody@127.0.0.1:1/none", "--status", "lost"])
    assert info.value.code == 2 and "argument --status: unknown status 'lost'" in capsys.readouterr().err


# --------------------------------------------------------------------------
# A file log: the fold, then the filter
# --------------------------------------------------------------------------


def test_without_filters_the_output_is_as_before(file_log: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Every run, in the log's order, with its status, times and attempts."""
    assert runs_json([file_log], capsys) == EXPECTED


def test_the_text_output_of_a_filter_is_the_table_of_the_rows_kept(
    file_log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--status waiting` prints the table and the wait of the one run kept."""
    assert main(["runs", file_log, "--status", "waiting"]) == 0
    assert capsys.readouterr().out == (
        "RUN    WORKFLOW  STATUS   ATTEMPTS  STARTED                   ENDED  DOMAIN STATE\n"
        "nap-1  nap       waiting  0         1970-01-01T00:16:56.000Z  -      -\n"
        "run nap-1 waits for signal 'go'\n"
    )


def test_a_filter_that_keeps_nothing_says_so(file_log: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", file_log, "--workflow", "payroll"]) == 0
    assert capsys.readouterr().out == f"no runs in {file_log} match the filters\n"


@pytest.mark.parametrize(
    ("argv", "runs"),
    [
        (["--status", "failed"], ["bad-1"]),
        (["--status", "failed,cancelled"], ["bad-1", "stop-1"]),
        (["--status", "interrupted", "--status", "waiting"], ["mail-2", "cut-1", "nap-1"]),
        (["--status", "needs-reconciliation"], ["mail-1"]),
        (["--status", "running"], []),
        (["--status", "queued"], []),
        (["--workflow", "ship"], ["stop-1", "mail-1", "mail-2"]),
        (["--workflow", "ship", "--status", "interrupted"], ["mail-2"]),
        (["--since", "1970-01-01T00:16:47Z"], ["mail-1", "mail-2", "cut-1", "nap-1"]),
        (["--until", "1970-01-01T00:16:47Z"], ["ok-1", "bad-1", "stop-1"]),
        (["--since", "1970-01-01T00:16:43Z", "--until", "1970-01-01T00:16:45.500Z"], ["bad-1"]),
        (["--since", "1970-01-01T00:16:45.501Z", "--until", "1970-01-01T00:16:47.000Z"], []),
        (["--limit", "3"], ["nap-1", "cut-1", "mail-2"]),
        (["--limit", "50"], ["nap-1", "cut-1", "mail-2", "mail-1", "stop-1", "bad-1", "ok-1"]),
        (["--workflow", "pay", "--limit", "2"], ["cut-1", "bad-1"]),
        (["--status", "succeeded,failed", "--limit", "1"], ["bad-1"]),
    ],
)
def test_the_filters_on_a_file_log(
    file_log: str, argv: list[str], runs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each filter keeps the runs written by hand here (a limit: newest first)."""
    assert [row[0] for row in runs_json([file_log, *argv], capsys)] == runs


def test_an_unfinished_run_is_running_while_a_writer_holds_the_file(file_log: str) -> None:
    """`--status running` on a file log: the unfinished runs with no open wait, while it is held."""
    with RunLogWriter(file_log):
        rows, _ = listed_runs(file_log, RunFilter(statuses=frozenset({"running"})))
        assert [r.run for r in rows] == ["cut-1"]
        rows, _ = listed_runs(file_log, RunFilter(statuses=frozenset({"interrupted"})))
        assert [r.run for r in rows] == ["mail-2"]  # a finished run reconciled: recovery's to resume


def test_runs_at_one_microsecond_list_the_later_first_under_a_limit() -> None:
    """Ties in the start time: the run later in the journal comes first."""
    row = RunRow(run="a", workflow=None, status="failed", attempts=0, started_us=5, ended_us=None, domain_state=None)
    rows = [row, RunRow(run="b", workflow=None, status="failed", attempts=0, started_us=5, ended_us=None, domain_state=None),
            RunRow(run="c", workflow=None, status="failed", attempts=0, started_us=None, ended_us=None, domain_state=None)]  # fmt: skip
    assert [r.run for r in select(rows, RunFilter(limit=3))] == ["b", "a", "c"]


# --------------------------------------------------------------------------
# PostgreSQL: the summaries
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_the_summaries_say_what_a_fold_of_the_journal_says(pg_url: str, schema: str) -> None:
    """Every status: the SQL rows equal the fold's rows, and the rows written by hand."""
    write_pg(pg_url, schema)
    with PgJournal(pg_url, schema=schema) as journal:
        rows, violations = journal.listed(RunFilter())
        assert rows == folded(journal, frozenset())
        assert violations == 0
    got = [(r.run, r.workflow, r.status, r.attempts) for r in rows]
    assert got == [(run, workflow, status, attempts) for run, workflow, status, attempts, _, _ in EXPECTED]
    assert rows[-1].waiting_on[0].signal == "go"


@pytest.mark.postgres
def test_running_is_a_run_a_live_worker_holds(pg_url: str, schema: str) -> None:
    """cut-1 held by a live worker is running; mail-2, held by a dead one, stays interrupted."""
    write_pg(pg_url, schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid) VALUES ('live', 'h', 1)")
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'h', 2, true)")
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence, workflow) VALUES ('cut-1', 'live', 1, 'pay')")
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence, workflow) VALUES ('mail-2', 'gone', 1, 'ship')")
    with PgJournal(pg_url, schema=schema) as journal:
        rows, _ = journal.listed(RunFilter())
        assert rows == folded(journal, frozenset({"cut-1"}))
        running, _ = journal.listed(RunFilter(statuses=frozenset({"running"})))
        interrupted, _ = journal.listed(RunFilter(statuses=frozenset({"interrupted"})))
    assert [r.run for r in running] == ["cut-1"]
    assert [r.run for r in interrupted] == ["mail-2"]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("only", "runs"),
    [
        (RunFilter(statuses=frozenset({"failed", "cancelled"})), ["bad-1", "stop-1"]),
        (RunFilter(workflow="ship", statuses=frozenset({"interrupted"})), ["mail-2"]),
        (RunFilter(since_us=parse_time("1970-01-01T00:16:47Z")), ["mail-1", "mail-2", "cut-1", "nap-1"]),
        (RunFilter(until_us=parse_time("1970-01-01T00:16:47Z")), ["ok-1", "bad-1", "stop-1"]),
        (RunFilter(limit=3), ["nap-1", "cut-1", "mail-2"]),
        (RunFilter(workflow="pay", limit=2), ["cut-1", "bad-1"]),
        (RunFilter(statuses=frozenset({"succeeded", "failed"}), limit=1), ["bad-1"]),
    ],
)
def test_the_filters_on_postgresql_keep_what_they_keep_on_a_file(
    pg_url: str, schema: str, tmp_path: Path, only: RunFilter, runs: list[str]
) -> None:
    """The same filter, the same runs, in the same order, on both stores."""
    write_pg(pg_url, schema)
    with PgJournal(pg_url, schema=schema) as journal:
        rows, _ = journal.listed(only)
    assert [r.run for r in rows] == runs
    file_rows, _ = listed_runs(write_file(tmp_path / "log.jsonl"), only)
    assert rows == file_rows


@pytest.mark.postgres
def test_an_operator_s_change_keeps_the_summary(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A reconcile and a cancel, recorded by `deliver`, move the summary as the fold moves."""
    write_pg(db, "attempt_kernel")
    assert main(["reconcile", db, "--key", "k-send", "--confirmed"]) == 0
    assert main(["cancel", db, "cut-1"]) == 0
    capsys.readouterr()
    statuses = {row[0]: row[2] for row in runs_json([db], capsys)}
    assert (statuses["mail-1"], statuses["cut-1"]) == ("interrupted", "interrupted")
    with PgJournal(db) as journal:
        assert journal.listed(RunFilter())[0] == folded(journal, frozenset())


@pytest.mark.postgres
def test_a_lease_lost_append_leaves_the_summary_as_it_was(pg_url: str, schema: str) -> None:
    """A fenced append refused (another owner) writes neither records nor summary."""
    from attempt_kernel.postgres import Lease, LeaseLost

    write_pg(pg_url, schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('cut-1', 'other', 2)")
    before = sql_in(pg_url, schema, "SELECT * FROM {s}.summaries WHERE run = 'cut-1'")
    with PgJournal(pg_url, schema=schema, lease=Lease(owner="me", fence=1)) as journal:
        with pytest.raises(LeaseLost):
            journal.append("cut-1", RunCancelRequested())
        with pytest.raises(LeaseLost):
            journal.append_and_complete("cut-1", [RunFinished()], outcome="failed")
    assert sql_in(pg_url, schema, "SELECT * FROM {s}.summaries WHERE run = 'cut-1'") == before


# --------------------------------------------------------------------------
# Queued runs
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_submitted_run_no_worker_claimed_is_queued(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`runs` lists it queued with its workflow and submit time; `show` says it is queued."""
    from attempt_kernel.postgres._worker import submit_run

    write_pg(db, "attempt_kernel")
    submit_run(db, "pay", "later-1")
    submitted = sql_in(
        db, "attempt_kernel",
        "SELECT to_char(submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        " FROM {s}.runs WHERE run = 'later-1'",
    )[0][0]  # fmt: skip
    assert runs_json([db, "--status", "queued"], capsys) == [("later-1", "pay", "queued", 0, submitted, None)]
    assert [row[0] for row in runs_json([db], capsys)][-1] == "later-1"  # after the runs with records
    assert [row[0] for row in runs_json([db, "--limit", "1"], capsys)] == ["later-1"]  # submitted last
    assert main(["show", db, "later-1"]) == 0
    assert capsys.readouterr().out == (
        f"run later-1 (workflow pay): queued\n  {submitted}  submitted; no worker has claimed it yet"
        " (no record is written)\n"
    )
    assert main(["show", db, "later-1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"run": "later-1", "workflow": "pay", "status": "queued", "submitted": submitted}
    assert main(["show", db, "nobody"]) == 2
    assert "no run 'nobody'" in capsys.readouterr().err


@pytest.mark.postgres
def test_show_on_postgresql_reads_only_the_run(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`show URL RUN` prints the run from its own records (the journal is never read whole)."""
    write_pg(db, "attempt_kernel")

    def no_whole_read(self: PgJournal) -> Iterator[object]:
        raise AssertionError("show read the whole journal")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PgJournal, "read", no_whole_read)
        assert main(["show", db, "bad-1"]) == 0
        assert capsys.readouterr().out.startswith("run bad-1 (workflow pay): failed\n")
        assert main(["runs", db, "--status", "failed"]) == 0  # nor does runs
        assert "bad-1" in capsys.readouterr().out


# --------------------------------------------------------------------------
# Migration from version 5
# --------------------------------------------------------------------------


def version_5_journal(url: str, schema: str) -> None:
    """`JOURNAL` as version 5 wrote it: migrations 1 to 5, rows numbered per run, no summaries."""
    from attempt_kernel._codec import encode_record
    from attempt_kernel.postgres._journal import _MIGRATIONS  # pyright: ignore[reportPrivateUsage]  # version 5 as it was created

    s = sql.Identifier(schema)
    clock = fixed_clock()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=s))
        conn.execute(sql.SQL("CREATE TABLE {s}.schema_version (version integer PRIMARY KEY,"
                             " applied_at timestamptz NOT NULL DEFAULT now())").format(s=s))  # fmt: skip
        for version, statements in _MIGRATIONS[:5]:
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=s, records=sql.Literal(f"{schema}.records")))
            conn.execute(sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s), (version,))
        for run, changes in JOURNAL:
            for seq, change in enumerate(changes, start=1):
                conn.execute(
                    sql.SQL("INSERT INTO {s}.records (run, seq, line) VALUES (%s, %s, %s)").format(s=s),
                    (run, seq, encode_record(seq, clock(), run, change)),
                )


@pytest.mark.postgres
def test_a_version_5_journal_gets_its_summaries_and_goes_on(pg_url: str, schema: str) -> None:
    """Migration 6 folds each run once: the rows are those written by hand, and appends go on."""
    version_5_journal(pg_url, schema)
    with PgJournal(pg_url, schema=schema) as journal:
        rows, violations = journal.listed(RunFilter())
        assert rows == folded(journal, frozenset()) and violations == 0
        assert [(r.run, r.status, r.attempts) for r in rows] == [(e[0], e[2], e[3]) for e in EXPECTED]
        assert journal.append("cut-1", RunCancelRequested()) == 4
        assert journal.append("nap-1", RunFinished()) == 3
        after, _ = journal.listed(RunFilter(statuses=frozenset({"succeeded"})))
        assert [r.run for r in after] == ["ok-1", "nap-1"]
        assert journal.listed(RunFilter())[0] == folded(journal, frozenset())
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(7,)]


@pytest.mark.postgres
def test_a_version_6_journal_says_which_waiting_runs_had_their_cancel_recorded(pg_url: str, schema: str) -> None:
    """Migration 7 folds again the runs whose summary stands waiting: nap-1, whose cancel was
    recorded under version 6, waits no more; every row keeps its status and place."""
    write_pg(pg_url, schema)
    with PgJournal(pg_url, schema=schema) as journal:
        assert journal.append("nap-1", RunCancelRequested()) == 3
    # The tables as version 6 left them: the summaries without the column.
    sql_in(pg_url, schema, "ALTER TABLE {s}.summaries DROP COLUMN cancel_requested")
    sql_in(pg_url, schema, "DELETE FROM {s}.schema_version WHERE version = 7")
    where = "SELECT run, status, first_pos, waiting_on FROM {s}.summaries ORDER BY run"
    before = sql_in(pg_url, schema, where)
    with PgJournal(pg_url, schema=schema) as journal:
        rows, violations = journal.listed(RunFilter())
        assert rows == folded(journal, frozenset()) and violations == 0
    assert [(r.run, r.status, r.cancel_requested) for r in rows if r.status == "waiting"] == [
        ("nap-1", "waiting", True)
    ]
    assert [r.run for r in rows if r.cancel_requested] == ["nap-1"]
    assert sql_in(pg_url, schema, where) == before
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(7,)]


@pytest.mark.postgres
def test_a_version_6_journal_counts_the_attempt_created_after_retry_false_as_replay_does(
    pg_url: str, schema: str
) -> None:
    """0.2.0's replay rule (no attempt after a `retry: false` result) breaks records that
    version 6's fold took for valid, but migration 7 folds again only the runs that stand
    waiting: `runs URL` went on warning of no violation where `replay URL` finds one."""
    again: list[Change] = [
        RunStarted(workflow="pay"),
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step="s", attempt=1, error="ValueError: no", retryable=False),
        AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()),
        AttemptCreated(step="s", attempt=2),
        AttemptTransitioned(step="s", attempt=2, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step="s", attempt=2, value=1),
        AttemptTransitioned(step="s", attempt=2, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
        RunFinished(),
    ]  # fmt: skip
    with PgJournal(pg_url, schema=schema) as journal:
        for change in again:
            journal.append("again-1", change)
    # The tables as version 6 left them: no column, and the count its fold made (it had no such rule).
    sql_in(pg_url, schema, "ALTER TABLE {s}.summaries DROP COLUMN cancel_requested")
    sql_in(pg_url, schema, "DELETE FROM {s}.schema_version WHERE version = 7")
    sql_in(pg_url, schema, "UPDATE {s}.summaries SET violations = 0")
    with PgJournal(pg_url, schema=schema) as journal:
        rows, violations = journal.listed(RunFilter())
        ledger = Ledger()
        ledger.feed(journal.read())
    assert [(r.run, r.status) for r in rows] == [("again-1", "succeeded")]
    assert ledger.violation_count == 1
    assert violations == 1


@pytest.mark.postgres
def test_a_broken_record_is_counted_in_the_summaries(pg_url: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose records break the rules: `runs` warns with the fold's count."""
    with PgJournal(pg_url, schema=schema) as journal:
        journal.append("x", RunStarted(workflow="w"))
        journal.append("x", RunStarted(workflow="w"))  # started twice
        rows, violations = journal.listed(RunFilter())
        ledger = Ledger()
        ledger.feed(journal.read())
    assert violations == ledger.violation_count == 1
    assert [r.run for r in rows] == ["x"]


# --------------------------------------------------------------------------
# 100,000 runs
# --------------------------------------------------------------------------


# Filters on `bulk_journal`'s runs, and the runs they keep, by hand: run i is
# r + six digits, of workflow w{i % 3}, started at 2027-01-15T08:00:00Z + i s
# (+ 1 us); failed when i % 4 == 0, succeeded 1, cancelled 2, interrupted 3.
BIG_CASES: list[tuple[RunFilter, list[str], int]] = [
    (RunFilter(statuses=frozenset({"failed"}), limit=50), ["r099996", "r099992", "r099988"], 50),
    (RunFilter(statuses=frozenset({"interrupted"}), limit=3), ["r099999", "r099995", "r099991"], 3),
    (RunFilter(statuses=frozenset({"cancelled"})), ["r000002", "r000006", "r000010"], 25_000),
    (RunFilter(workflow="w1", limit=2), ["r099997", "r099994"], 2),
    (
        RunFilter(
            statuses=frozenset({"cancelled"}), workflow="w1",
            since_us=parse_time("2027-01-15T08:16:40Z"), until_us=parse_time("2027-01-15T08:16:52Z"),
        ),  # fmt: skip
        ["r001006"],
        1,
    ),
    (RunFilter(since_us=parse_time("2027-01-16T11:46:38Z")), ["r099998", "r099999"], 2),
    (RunFilter(statuses=frozenset({"queued", "running", "waiting"})), [], 0),
]


@pytest.mark.postgres
@pytest.mark.slow
def test_the_filters_on_100_000_runs(pg_url: str, schema: str) -> None:
    """A version 5 journal of 100,000 runs migrated: each filter keeps the runs written by hand
    above, and the summaries equal a fold of the whole journal, run for run (one test: the
    journal is made once)."""
    assert bulk_journal(pg_url, schema, 100_000) == 275_000
    with PgJournal(pg_url, schema=schema) as journal:  # migration 6: each run folded once
        for only, first, count in BIG_CASES:
            rows, violations = journal.listed(only)
            assert violations == 0
            assert ([r.run for r in rows[:3]], len(rows)) == (first, count), only
        rows, _ = journal.listed(RunFilter())
        assert rows == folded(journal, frozenset())
    assert [r.run for r in rows[:2]] == ["r000000", "r000001"]
    assert (rows[0].status, rows[0].attempts, rows[0].started_us) == ("failed", 1, 1_800_000_000_000_001)


# --------------------------------------------------------------------------
# The statements that keep the summaries
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_leased_run_s_end_closes_its_row_and_its_summary_together(pg_url: str, schema: str) -> None:
    """`append_and_complete` under the right lease: the row is done and the summary says succeeded."""
    from attempt_kernel.postgres import Lease

    with PgJournal(pg_url, schema=schema, lease=Lease(owner="me", fence=1), clock=fixed_clock()) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence, workflow) VALUES ('ok-1', 'me', 1, 'pay')")
        journal.new_run("ok-1")
        journal.append_all("ok-1", [RunStarted(workflow="pay"), *simple_changes()])
        journal.append_and_complete("ok-1", [RunFinished()], outcome="succeeded")
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    assert sql_in(
        pg_url, schema, "SELECT run, workflow, status, finished, attempts, started_us, ended_us FROM {s}.summaries"
    ) == [("ok-1", "pay", "succeeded", True, 1, 1_000_000_000, 1_000_500_000)]  # one clock tick per append


@pytest.mark.postgres
def test_the_summarized_closing_statement_sets_synchronous_commit(pg_url: str, schema: str) -> None:
    """The close, the records and the summary: one statement, committed synchronously."""
    from attempt_kernel._codec import encode_record
    from attempt_kernel.postgres import Lease

    with PgJournal(pg_url, schema=schema, leases={"r1": Lease(owner="w", fence=1)}) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        statement = journal._insert_closing(1, True)  # pyright: ignore[reportPrivateUsage]
    summary = ("pay", "interrupted", False, 0, 7, None, None, "[]", False, 0)
    with psycopg.connect(pg_url) as conn:  # a transaction, to look at the setting before commit
        conn.execute("SET synchronous_commit = off")
        conn.commit()
        row = conn.execute(
            statement, ("succeeded", "r1", "w", 1, 1, encode_record(1, 7, "r1", RunStarted(workflow="pay")), "r1", *summary)
        ).fetchone()
        setting = conn.execute("SHOW synchronous_commit").fetchone()
        conn.commit()
    assert (row, setting) == ((1,), ("on",))
    assert sql_in(pg_url, schema, "SELECT run, status, started_us FROM {s}.summaries") == [("r1", "interrupted", 7)]


def test_the_runs_help_names_the_filters_and_what_they_filter_on(capsys: pytest.CaptureFixture[str]) -> None:
    """--help says the times are start times in UTC, and how --limit orders."""
    with pytest.raises(SystemExit):
        main(["runs", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in [
        "--status STATUS", "--workflow NAME", "only runs started at TIME or later",
        "only runs started before TIME", "at most N runs, the most recently started first",
        "queued, running, waiting, interrupted, succeeded, failed, cancelled, needs-reconciliation",
    ]:  # fmt: skip
        assert text in out, text
