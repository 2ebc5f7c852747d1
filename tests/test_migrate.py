"""Explicit migrations, and journals opened by a role that may not create tables.

Against the session's real server (`pg_url`), each test in a schema of its
own. A restricted role (`restricted`) logs in with no CREATE privilege on
the database or the schema; after the owner migrated, it gets exactly the
grants docs/design.md ("Roles and migrations") lists, copied here by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from pgtools import sql_in
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from typing_extensions import LiteralString
from workerflows.pay import PAY, calls
from workerflows.waits import approver

from attempt_kernel import RunStarted, replay
from attempt_kernel._codec import encode_record
from attempt_kernel.cli import main
from attempt_kernel.postgres import (
    PgJournal,
    PgJournalError,
    PgMigrationNeeded,
    PgSchemaTooNew,
    migrate,
    run_worker,
    submit_run,
)

pytestmark = pytest.mark.postgres

ALL_VERSIONS = [(1,), (2,), (3,), (4,), (5,), (6,), (7,)]

# The grants of docs/design.md, "Roles and migrations" ({s} the schema, {r} the role).
GRANTS: tuple[LiteralString, ...] = (
    "GRANT USAGE ON SCHEMA {s} TO {r}",
    "GRANT SELECT ON {s}.schema_version, {s}.head, {s}.pools TO {r}",
    "GRANT SELECT, INSERT ON {s}.records TO {r}",
    "GRANT SELECT, INSERT, UPDATE ON {s}.runs, {s}.workers, {s}.summaries TO {r}",
    "GRANT SELECT, UPDATE ON {s}.slots TO {r}",
    "GRANT SELECT, INSERT, DELETE ON {s}.inbox TO {r}",
)


@dataclass(frozen=True)
class Role:
    name: str
    url: str


def role_url(pg_url: str, name: str) -> str:
    """``pg_url`` logged in as ``name`` (the throwaway server trusts 127.0.0.1)."""
    scheme, rest = pg_url.split("://", 1)
    return f"{scheme}://{name}@{rest.split('@', 1)[1]}"


@pytest.fixture
def restricted(pg_url: str, schema: str) -> Iterator[Role]:
    """A role that can log in and nothing else (no CREATE on the database or any schema)."""
    name = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield Role(name, role_url(pg_url, name))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("DROP OWNED BY {r}").format(r=sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {r}").format(r=sql.Identifier(name)))


def grant(pg_url: str, schema: str, role: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for text in GRANTS:
            conn.execute(sql.SQL(text).format(s=sql.Identifier(schema), r=sql.Identifier(role)))


def schema_exists(pg_url: str, schema: str) -> bool:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row == (1,)


def version_5_journal(url: str, schema: str) -> None:
    """The tables as version 5 left them (migrations 1 to 5, no summaries)."""
    from attempt_kernel.postgres._journal import _MIGRATIONS  # pyright: ignore[reportPrivateUsage]  # version 5 as it was created

    s = sql.Identifier(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=s))
        conn.execute(sql.SQL("CREATE TABLE {s}.schema_version (version integer PRIMARY KEY,"
                             " applied_at timestamptz NOT NULL DEFAULT now())").format(s=s))  # fmt: skip
        for version, statements in _MIGRATIONS[:5]:
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=s, records=sql.Literal(f"{schema}.records")))
            conn.execute(sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s), (version,))


# --------------------------------------------------------------------------
# migrate
# --------------------------------------------------------------------------


def test_migrate_twice_creates_the_tables_once_and_returns_the_same_version(pg_url: str, schema: str) -> None:
    """The first call creates versions 1 to 7; the second changes nothing and says 7 again."""
    assert migrate(pg_url, schema=schema) == 7
    assert migrate(pg_url, schema=schema) == 7
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS


def test_migrate_upgrades_a_version_5_journal(pg_url: str, schema: str) -> None:
    """Tables at version 5 get migrations 6 and 7 only."""
    version_5_journal(pg_url, schema)
    assert migrate(pg_url, schema=schema) == 7
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS


def test_concurrent_migrations_create_the_tables_once(pg_url: str, schema: str) -> None:
    """Four threads migrating a new schema at once: all return 7, each version is recorded once."""
    results: list[int | BaseException] = []
    gate = threading.Barrier(4)

    def one() -> None:
        gate.wait()
        try:
            results.append(migrate(pg_url, schema=schema))
        except BaseException as error:  # noqa: BLE001  # asserted below
            results.append(error)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [7, 7, 7, 7]
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS


def test_migrate_on_a_callers_connection_commits_with_the_callers_transaction(pg_url: str, schema: str) -> None:
    """Inside the caller's open transaction, a rollback takes the migration back; a commit keeps it."""
    with psycopg.connect(pg_url) as conn:
        conn.execute("SELECT 1")  # a transaction is open now
        assert migrate(conn, schema=schema) == 7
        conn.rollback()
        assert not schema_exists(pg_url, schema)
        assert migrate(conn, schema=schema) == 7
        conn.commit()
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS


def test_migrate_on_a_connection_with_dict_rows_upgrades_a_version_5_journal(pg_url: str, schema: str) -> None:
    """The caller's row factory is the caller's: the migration (its backfill too) reads tuples."""
    version_5_journal(pg_url, schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.records (run, seq, line) VALUES ('a', 1, %s)", encode_record(1, 5, "a", RunStarted(workflow="w")))
    with psycopg.Connection[DictRow].connect(pg_url, autocommit=True, row_factory=dict_row) as conn:
        assert migrate(conn, schema=schema) == 7
    assert sql_in(pg_url, schema, "SELECT run, workflow, status FROM {s}.summaries") == [("a", "w", "interrupted")]


def test_migrate_refuses_a_newer_schema_unchanged(pg_url: str, schema: str) -> None:
    """Tables at version 7: PgSchemaTooNew naming both versions; nothing is added."""
    migrate(pg_url, schema=schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.schema_version (version) VALUES (8)")
    with pytest.raises(PgSchemaTooNew, match="at version 8, but this library knows versions up to 7"):
        migrate(pg_url, schema=schema)
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(8,)]


def test_migrate_refuses_a_schema_name_that_is_not_an_identifier(pg_url: str) -> None:
    with pytest.raises(ValueError, match="schema must be a lower-case SQL identifier"):
        migrate(pg_url, schema="x; DROP TABLE y")


def test_migrate_refuses_a_connection_in_a_failed_transaction(pg_url: str, schema: str) -> None:
    """An earlier statement failed: the error says to roll back; nothing is created."""
    with psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(PgJournalError, match=r"migrate: the connection given is in a failed transaction .*roll it back"):
            migrate(conn, schema=schema)
    assert not schema_exists(pg_url, schema)


# --------------------------------------------------------------------------
# A role without CREATE
# --------------------------------------------------------------------------


def test_a_restricted_role_submits_and_works_after_the_owner_migrated(
    pg_url: str, schema: str, restricted: Role, downstream: Path
) -> None:
    """Owner migrates and grants; the role submits (by URL and on its own connection) and a
    worker under it finishes both runs; nothing was created by the role."""
    assert migrate(pg_url, schema=schema) == 7
    grant(pg_url, schema, restricted.name)
    assert submit_run(restricted.url, "pay", "r1", schema=schema) == "r1"
    with psycopg.connect(restricted.url) as conn:
        assert submit_run(conn, "pay", "r2", {"n": 2}, schema=schema) == "r2"
        conn.commit()
    closed = run_worker(restricted.url, [PAY], schema=schema, heartbeat=0.2, dead_after=0.8, stop_when_idle=True)
    assert closed == 2
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        ("r1", True, "succeeded"), ("r2", True, "succeeded"),
    ]  # fmt: skip
    assert sorted(calls(downstream)) == ["r1/charge/card", "r2/charge/card"]
    with PgJournal(restricted.url, schema=schema) as journal:
        assert replay(journal).valid
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS
    owned = sql_in(
        pg_url, schema,
        "SELECT count(*) FROM pg_class WHERE relowner = (SELECT oid FROM pg_roles WHERE rolname = %s)",
        restricted.name,
    )  # fmt: skip
    assert owned == [(0,)]


def test_a_restricted_role_on_an_unmigrated_schema_gets_the_clear_error_and_creates_nothing(
    pg_url: str, schema: str, restricted: Role
) -> None:
    """Open, submit (URL or connection) and migrate: each names `attempt-kernel migrate`; no schema appears."""
    expected = rf"schema '{schema}' has no journal tables, this library needs version 7, .*attempt-kernel migrate URL --schema {schema}"
    with pytest.raises(PgMigrationNeeded, match=expected + ".*owner") as caught:
        PgJournal(restricted.url, schema=schema)
    assert (caught.value.found, caught.value.known) == (0, 7)
    assert "may not create tables in it" in str(caught.value)
    with pytest.raises(PgMigrationNeeded, match=expected):
        submit_run(restricted.url, "pay", "r1", schema=schema)
    with pytest.raises(PgMigrationNeeded, match=expected):
        migrate(restricted.url, schema=schema)
    with psycopg.connect(restricted.url) as conn, pytest.raises(PgMigrationNeeded, match="does not migrate on the caller's connection"):
        submit_run(conn, "pay", "r1", schema=schema)
    assert not schema_exists(pg_url, schema)


def test_a_restricted_role_in_an_empty_schema_it_may_use_creates_nothing(
    pg_url: str, schema: str, restricted: Role
) -> None:
    """The owner made the schema and granted USAGE only: opening fails clearly and leaves it empty."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=sql.Identifier(schema)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {s} TO {r}").format(s=sql.Identifier(schema), r=sql.Identifier(restricted.name)))
    with pytest.raises(PgMigrationNeeded, match="has no journal tables"):
        PgJournal(restricted.url, schema=schema)
    assert sql_in(pg_url, schema, "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace", schema) == [(0,)]


def test_a_restricted_role_on_a_schema_behind_gets_the_clear_error_and_changes_nothing(
    pg_url: str, schema: str, restricted: Role
) -> None:
    """Tables at version 5, the role granted what it may: opening names version 5 and migrate; still 5."""
    version_5_journal(pg_url, schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        s, r = sql.Identifier(schema), sql.Identifier(restricted.name)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {s} TO {r}").format(s=s, r=r))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {r}").format(s=s, r=r))
        conn.execute(sql.SQL("GRANT INSERT ON {s}.runs TO {r}").format(s=s, r=r))
    with pytest.raises(PgMigrationNeeded, match=r"is at version 5, this library needs version 7, .*attempt-kernel migrate") as caught:
        PgJournal(restricted.url, schema=schema)
    assert caught.value.found == 5
    with psycopg.connect(restricted.url) as conn, pytest.raises(PgMigrationNeeded, match="is at version 5"):
        submit_run(conn, "pay", "r1", schema=schema)
    assert sql_in(pg_url, schema, "SELECT max(version) FROM {s}.schema_version") == [(5,)]
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.runs") == [(0,)]


def test_a_role_without_the_grants_is_told_to_grant_them(pg_url: str, schema: str, restricted: Role) -> None:
    """Migrated tables the role may not read: the error names the grants, not a migration."""
    migrate(pg_url, schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {s} TO {r}").format(s=sql.Identifier(schema), r=sql.Identifier(restricted.name)))
    with pytest.raises(PgJournalError, match=r"this role may not read the journal .*grant it USAGE on the schema"):
        PgJournal(restricted.url, schema=schema)


# --------------------------------------------------------------------------
# attempt-kernel migrate
# --------------------------------------------------------------------------


def test_the_migrate_command_prints_the_versions_before_and_after(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """First run: 0 to 7; second: up to date; --json: the three fields."""
    assert main(["migrate", db]) == 0
    assert capsys.readouterr().out == "schema attempt_kernel: migrated from version 0 to version 7\n"
    assert main(["migrate", db]) == 0
    assert capsys.readouterr().out == "schema attempt_kernel: at version 7, up to date (nothing changed)\n"
    assert main(["migrate", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "attempt_kernel", "version_before": 7, "version_after": 7}


def test_the_migrate_command_takes_a_schema(pg_url: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", pg_url, "--schema", schema, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": schema, "version_before": 0, "version_after": 7}
    assert sql_in(pg_url, schema, "SELECT version FROM {s}.schema_version ORDER BY 1") == ALL_VERSIONS


def test_the_migrate_command_refuses_a_bad_schema_and_a_file(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A schema name that is no identifier, and a path instead of a URL: exit 2, nothing done."""
    assert main(["migrate", pg_url, "--schema", "Bad-Name"]) == 2
    assert "attempt-kernel migrate: error: --schema: schema must be a lower-case SQL identifier" in capsys.readouterr().err
    assert main(["migrate", "journal.jsonl"]) == 2
    assert "migrate works on a PostgreSQL journal: give a postgresql:// URL" in capsys.readouterr().err


def test_the_migrate_command_as_a_restricted_role_exits_2_naming_the_fix(
    pg_url: str, schema: str, restricted: Role, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", restricted.url, "--schema", schema]) == 2
    err = capsys.readouterr().err
    assert f"attempt-kernel migrate: error: the journal in PostgreSQL schema '{schema}' has no journal tables" in err
    assert "as a role that may create tables in the schema (its owner)" in err
    assert not schema_exists(pg_url, schema)


@pytest.mark.slow
def test_the_migrate_command_in_a_process_of_its_own(db: str, tmp_path: Path) -> None:
    """`python -m attempt_kernel migrate URL`: exit 0 and the versions; an unreachable server: exit 3."""
    command = [sys.executable, "-m", "attempt_kernel", "migrate"]
    done = subprocess.run([*command, db], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "schema attempt_kernel: migrated from version 0 to version 7\n")
    again = subprocess.run([*command, db, "--json"], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert again.returncode == 0
    assert json.loads(again.stdout) == {"schema": "attempt_kernel", "version_before": 7, "version_after": 7}
    nowhere = "postgresql://nobody@127.0.0.1:1/none"
    failed = subprocess.run([*command, nowhere], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert failed.returncode == 3  # PgConnectFailed: the database is unavailable
    assert "attempt-kernel migrate: error: cannot connect to PostgreSQL at 127.0.0.1:1, database none" in failed.stderr


@pytest.fixture
def restricted_db(db: str) -> Iterator[Role]:
    """`restricted`, for the database `db` (the commands know only the default schema)."""
    name = f"r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield Role(name, role_url(db, name))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS attempt_kernel CASCADE"))
        conn.execute(sql.SQL("DROP OWNED BY {r}").format(r=sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {r}").format(r=sql.Identifier(name)))


def test_the_operators_commands_work_under_the_granted_role(
    db: str, restricted_db: Role, downstream: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under the documented grants only: submit, runs that wait on a pool's slots, signal and
    cancel to released runs, the workers that finish them, then runs and show."""
    assert main(["migrate", db]) == 0
    assert main(["pool", db, "llm", "--slots", "1"]) == 0  # sizing pools is the owner's here
    grant(db, "attempt_kernel", restricted_db.name)
    url = restricted_db.url
    capsys.readouterr()
    assert main(["submit", url, "workerflows.pay:PAY", "--run", "r1"]) == 0
    for run in ("a1", "a2"):
        assert main(["submit", url, "workerflows.waits:approver", "--run", run]) == 0
    flows = [PAY, approver]
    assert run_worker(url, flows, heartbeat=0.2, dead_after=0.8, stop_when_idle=True) == 1  # a1, a2 wait
    assert main(["signal", url, "a1", "approve", "--payload", '"yes"']) == 0
    assert main(["cancel", url, "a2", "--reason", "not needed"]) == 0
    assert run_worker(url, flows, heartbeat=0.2, dead_after=0.8, stop_when_idle=True) == 2
    capsys.readouterr()
    assert main(["runs", url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((row["run"], row["status"]) for row in listed["runs"]) == [
        ("a1", "succeeded"), ("a2", "cancelled"), ("r1", "succeeded"),
    ]  # fmt: skip
    assert main(["show", url, "a1"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "approve" in out
    assert sql_in(db, "attempt_kernel", "SELECT count(*) FROM {s}.slots WHERE run IS NOT NULL") == [(0,)]
