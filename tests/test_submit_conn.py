"""`submit_run` on the caller's connection: inside the caller's transaction, never migrating.

Against the session's real server (`pg_url`), each test in a schema of its
own, migrated first where the test needs it. Whether a run is queued is
asked on a connection of its own (`sql_in`), as a worker would see it.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from pgtools import sql_in
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from workerflows.pay import PAY, calls

from attempt_kernel import RunRefused, UnencodableRecord
from attempt_kernel.postgres import (
    PgJournalError,
    PgMigrationNeeded,
    PgSchemaTooNew,
    migrate,
    run_worker,
    submit_run,
)

pytestmark = pytest.mark.postgres


def queued(url: str, schema: str) -> list[tuple[object, ...]]:
    return sql_in(url, schema, "SELECT run, workflow, input, done FROM {s}.runs ORDER BY run")


def test_a_rollback_takes_the_submitted_run_back(pg_url: str, schema: str) -> None:
    """Submitted in the caller's transaction: invisible to others before, gone after the rollback."""
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url) as conn:
        conn.execute("SELECT 1")  # the caller's own work opened the transaction
        assert submit_run(conn, "pay", "r1", {"order": 7}, schema=schema) == "r1"
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # not committed
        assert queued(pg_url, schema) == []
        conn.rollback()
        assert queued(pg_url, schema) == []
        assert not conn.closed  # the caller's connection stays the caller's


def test_a_commit_queues_the_run_and_a_worker_runs_it(pg_url: str, schema: str, downstream: Path) -> None:
    """Committed with the caller's other write: the run is there, and a worker finishes it."""
    migrate(pg_url, schema=schema)
    sql_in(pg_url, schema, "CREATE TABLE {s}.orders (id integer)")
    with psycopg.connect(pg_url) as conn:
        conn.execute(sql.SQL("INSERT INTO {s}.orders VALUES (7)").format(s=sql.Identifier(schema)))
        submit_run(conn, "pay", "r1", {"order": 7}, schema=schema)
        conn.commit()
    assert sql_in(pg_url, schema, "SELECT id FROM {s}.orders") == [(7,)]
    assert queued(pg_url, schema) == [("r1", "pay", '{"order":7}', False)]
    assert run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=0.8, stop_when_idle=True) == 1
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    assert calls(downstream) == ["r1/charge/card"]


def test_an_autocommit_connection_queues_at_once(pg_url: str, schema: str) -> None:
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        submit_run(conn, "pay", "r1", schema=schema)
        assert queued(pg_url, schema) == [("r1", "pay", "null", False)]


def test_a_connection_in_a_failed_transaction_is_refused_clearly(pg_url: str, schema: str) -> None:
    """An earlier statement failed: the error says to roll back; after the rollback, submit works."""
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(
            PgJournalError,
            match=r"submitting run 'r1': the connection given is in a failed transaction .*"
            r"roll it back first \(conn.rollback\(\)\): nothing was written",
        ):
            submit_run(conn, "pay", "r1", schema=schema)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR  # left as it was
        conn.rollback()
        submit_run(conn, "pay", "r1", schema=schema)
        conn.commit()
    assert queued(pg_url, schema) == [("r1", "pay", "null", False)]


def test_a_closed_connection_and_a_wrong_type_are_refused(pg_url: str, schema: str) -> None:
    conn = psycopg.connect(pg_url)
    conn.close()
    with pytest.raises(PgJournalError, match="submitting run 'r1': the connection given is closed"):
        submit_run(conn, "pay", "r1", schema=schema)
    with pytest.raises(TypeError, match="expected a postgresql:// URL or a psycopg.Connection, got int"):
        submit_run(7, "pay", "r1", schema=schema)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]


def test_the_callers_connection_is_never_migrated(pg_url: str, schema: str) -> None:
    """No tables: PgMigrationNeeded naming `attempt-kernel migrate`; the schema is still not there."""
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(
            PgMigrationNeeded,
            match=rf"schema '{schema}' has no journal tables, .*submit_run does not migrate on the"
            rf" caller's connection .*attempt-kernel migrate URL --schema {schema}",
        ) as caught:
            submit_run(conn, "pay", "r1", schema=schema)
        assert caught.value.found == 0
        conn.rollback()
    rows = sql_in(pg_url, schema, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", schema)
    assert rows == [(0,)]


def test_a_schema_behind_is_not_migrated_on_the_callers_connection(pg_url: str, schema: str) -> None:
    """Tables at version 5 (migrations 6 and 7 undone by hand): refused naming version 5; nothing queued."""
    migrate(pg_url, schema=schema)
    sql_in(pg_url, schema, "DELETE FROM {s}.schema_version WHERE version >= 6")
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(PgMigrationNeeded, match="is at version 5, this library needs version 7") as caught:
            submit_run(conn, "pay", "r1", schema=schema)
        assert caught.value.found == 5
        conn.commit()
    assert queued(pg_url, schema) == []
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(5,)]


def test_a_newer_schema_is_refused_on_the_callers_connection(pg_url: str, schema: str) -> None:
    migrate(pg_url, schema=schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.schema_version (version) VALUES (8)")
    with psycopg.connect(pg_url) as conn, pytest.raises(PgSchemaTooNew, match="at version 8"):
        submit_run(conn, "pay", "r1", schema=schema)
    assert queued(pg_url, schema) == []


def test_a_duplicate_id_is_refused_and_the_callers_transaction_goes_on(pg_url: str, schema: str) -> None:
    """RunRefused fails no statement: the caller's transaction commits its other run."""
    migrate(pg_url, schema=schema)
    submit_run(pg_url, "pay", "r1", schema=schema)
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(RunRefused, match="run 'r1' is already in the journal"):
            submit_run(conn, "pay", "r1", schema=schema)
        submit_run(conn, "pay", "r2", schema=schema)
        conn.commit()
    assert queued(pg_url, schema) == [("r1", "pay", "null", False), ("r2", "pay", "null", False)]


def test_an_unencodable_input_sends_nothing(pg_url: str, schema: str) -> None:
    """NaN is refused before any statement: the caller's connection is still idle."""
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(UnencodableRecord):
            submit_run(conn, "pay", "r1", float("nan"), schema=schema)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.parametrize(
    ("run", "value"),
    [("", None), ("r1", {1: "int", "1": "str"})],
    ids=["an empty run id", "keys 1 and '1' in the input"],
)
def test_a_run_whose_records_the_reader_would_refuse_is_not_queued(
    pg_url: str, schema: str, run: str, value: object
) -> None:
    """Refused before any statement: a worker would write records the journal's
    reader refuses, and every worker that took the run over would stop on them."""
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(UnencodableRecord):
            submit_run(conn, "pay", run, value, schema=schema)  # type: ignore[arg-type]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert queued(pg_url, schema) == []


def test_a_connection_with_dict_rows_works(pg_url: str, schema: str) -> None:
    """The caller's row factory is the caller's: submit reads its own answer as a tuple."""
    migrate(pg_url, schema=schema)
    with psycopg.Connection[DictRow].connect(pg_url, row_factory=dict_row) as conn:
        assert submit_run(conn, "pay", "r1", schema=schema) == "r1"
        conn.commit()
    assert queued(pg_url, schema) == [("r1", "pay", "null", False)]


def test_submit_by_url_still_migrates_a_new_schema(pg_url: str, schema: str) -> None:
    """Backwards compatible: a URL (a role that may create tables) creates the journal, then queues."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    assert queued(pg_url, schema) == [("r1", "pay", "null", False)]
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(7,)]


def test_the_executor_docs_place_order_example_commits_both_or_neither(db: str) -> None:
    """docs/executor.md's `place_order`: the order and its run commit together; a failed order
    insert rolls the run back with it."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "executor.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.DOTALL) if "def place_order(" in b]
    namespace: dict[str, object] = {"__name__": "docs_place_order"}
    exec(compile(block, "docs/executor.md", "exec"), namespace)
    place_order = namespace["place_order"]
    assert callable(place_order)
    migrate(db)
    with psycopg.connect(db, autocommit=True) as setup:
        setup.execute("CREATE TABLE orders (id integer PRIMARY KEY CHECK (id > 0), run text NOT NULL)")
    with psycopg.connect(db) as conn:
        assert place_order(conn, 7) == "order-7"
        with pytest.raises(psycopg.errors.CheckViolation):
            place_order(conn, -1)  # the order is refused after its run was queued
    assert queued(db, "attempt_kernel") == [("order-7", "pay", '{"order":7}', False)]
    assert sql_in(db, "public", "SELECT id, run FROM {s}.orders") == [(7, "order-7")]


@pytest.mark.parametrize(
    ("text", "said"),
    [("a\x00b", r"a NUL \('\\x00'\) at index 1"), ("ab\ud800", r"a lone surrogate \('\\ud800'\) at index 2")],
    ids=["nul", "lone-surrogate"],
)
@pytest.mark.parametrize("field", ["run id", "workflow name"])
@pytest.mark.parametrize("by", ["url", "connection"])
def test_a_run_id_or_workflow_postgresql_cannot_hold_is_refused_before_anything_is_sent(
    pg_url: str, schema: str, by: str, field: str, text: str, said: str
) -> None:
    """`UnencodableRecord` naming the field and the character, nothing queued, and the caller's
    transaction left as it was: a lone surrogate escaped as UnicodeEncodeError, and a NUL
    as "queueing run ... failed: PostgreSQL text fields cannot contain NUL (0x00) bytes",
    naming neither the field nor where the NUL was."""
    migrate(pg_url, schema=schema)
    run, workflow = (text, "pay") if field == "run id" else ("r1", text)
    refused = pytest.raises(UnencodableRecord, match=f"{field} {re.escape(repr(text))} holds {said}")
    if by == "url":
        with refused:
            submit_run(pg_url, workflow, run, {"order": 7}, schema=schema)
    else:
        with psycopg.connect(pg_url) as conn:
            conn.execute("SELECT 1")  # the caller's own work opened the transaction
            with refused:
                submit_run(conn, workflow, run, {"order": 7}, schema=schema)
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # not failed
            conn.commit()
    assert queued(pg_url, schema) == []
