"""The PostgreSQL store: the run log as rows, behind the same seam as the file.

Owns the journal's tables in one PostgreSQL schema, their versioned
migrations, and the statements that append and read records; nothing else.
The wire form is `_codec`'s: each row holds exactly the line the file store
would write for the record (checksum included), so a journal read from
here decodes, replays and exports like a file. It applies no kernel rule
(that is the ledger's), never rewrites or deletes a row, and runs no
worker: leases are only *checked* here (an append can carry the writer's
owner and fence, and writes nothing when they do not match the ``runs``
row); claiming, heartbeats, takeover and admission (the ``pools`` and
``slots`` tables of migration 3) belong elsewhere.

Sequence numbers are per run (schema version 4): a run's records are
numbered 1, 2, 3, ... and keyed by ``(run, seq)``, so appends to different
runs never wait for one another (a journal-wide counter row made every
append in the journal queue behind one lock). A column ``pos``, taken from
a database sequence, orders the journal as a whole. One writer drives a
run at a time (the lease), and it commits a run's record before it writes
the next, so in any snapshot each run's records are a prefix of the run:
`read` reads the journal in one snapshot, checks that each run's numbers
go up by one, and hands the records on numbered 1, 2, 3, ... in ``pos``
order, the gapless journal-wide sequence that a file has and the ledger
checks. Rows written before version 4 keep their journal-wide
numbers (``head.per_run_after`` is the last of them); they are checked
as they were written, and a run that spans the upgrade continues from its
last number.

Runs that wait (schema version 5): a worker releases a run that only
waits, setting its row's ``wake_at`` to the earliest wake time of its
waits ('infinity' when only a signal wakes it; NULL means claimable now),
and an operator's change to a run that a live worker holds goes to the
``inbox`` table (one checksummed record line per row) for that worker to
take in. Delivering (`_deliver`) and taking in (`_worker`) live
elsewhere; here are only the tables.

Durability: a ``Dispatched`` intent change commits with ``synchronous_commit =
on`` before `PgJournal.append` returns (docs/contracts.md, "The write-ahead
rule"); every other append commits asynchronously,
which survives a crash of this process but not of the server until `flush`, or
any later synchronous commit, makes it durable.

Group commit (the writer thread): a worker's executors do not wait for the
database at each append. `PgJournal.hand_over` checks, numbers and encodes
the records on the caller's thread (the event loop), so that a record the
journal refuses raises there and nothing is handed over, and queues them;
a thread of the journal's own, on a connection of its own, takes whatever
is queued and writes it as one transaction in one round trip (psycopg's
pipeline mode), each run's records in one statement fenced as a direct
append's is, with one synchronous commit at its end when any record of the
group must be durable. `PgJournal.committed` awaits the group that covers a
run's records, so concurrent runs' ``Dispatched`` records share one WAL
flush, and each effect is still sent only after its ``Dispatched`` is
durable. A thread, not psycopg's ``AsyncConnection``: measured side by
side (benchmarks/bench_pg_group.py), both wrote groups at about the same
rate, but the async connection kept the event loop's thread busy about
half the time in psycopg's own code, where the thread
leaves the loop to the executors (psycopg releases the GIL while it waits
for the server); and the synchronous entry points, which recovery, the
command line and the executor's ``flush`` call from inside or outside a
loop, can wait for a thread, never for a task of the loop they block.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row
from typing_extensions import LiteralString, Self, assert_never, final

from .._codec import RunLogError, UnencodableRecord, decode_line, encode_record
from .._intent import is_outstanding
from .._ledger import Ledger, RunStanding
from .._operate import Delivery
from .._records import (
    AttemptCreated,
    AttemptTransitioned,
    Change,
    CorruptLine,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    LogItem,
    Record,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    WaitEnded,
    WaitStarted,
)
from .._report import redacted
from .._store import DispatchRefused
from .._runlist import RunFilter, RunRow, WaitOn, listed_status

PG_SCHEMA_VERSION: Final = 7
"""The newest version of the journal's tables this library knows; it refuses a newer one."""

DEFAULT_SCHEMA: Final = "attempt_kernel"
"""The PostgreSQL schema (namespace) that holds the journal's tables."""

READ_BATCH: Final = 1000
"""Rows fetched per query while reading (`read` keeps one snapshot across its queries)."""

CLOCK_RESYNC_S: Final = 10.0
"""Seconds after which a journal reads the database's clock again (see `PgJournal`)."""

_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class PgJournalError(RunLogError):
    """The PostgreSQL journal cannot be opened, read or written."""


@final
class PgConnectFailed(PgJournalError):
    """The URL names no reachable PostgreSQL (the message names the host and why)."""


@final
class PgSchemaTooNew(PgJournalError):
    """The database's journal tables are newer than this library; nothing was changed."""

    def __init__(self, found: int, known: int, schema: str) -> None:
        super().__init__(
            f"the journal in PostgreSQL schema {schema!r} is at version {found}, but this"
            f" library knows versions up to {known}; upgrade attempt-kernel to use it"
        )
        self.found: Final = found
        self.known: Final = known


@final
class PgMigrationNeeded(PgJournalError):
    """The journal's tables are missing or older than this library, and nothing may migrate them here.

    Raised where migrating is not this call's to do (`submit_run` on the
    caller's connection) or not this role's (it lacks the CREATE privilege
    the migration needs); nothing was changed. ``found`` is the version in
    place (0: no journal tables in the schema; None: unknown, the tables
    are too old to say). Run ``attempt-kernel migrate URL`` (or `migrate`)
    once as the schema's owner.
    """

    def __init__(self, found: int | None, known: int, schema: str, why: str) -> None:
        at = (
            "has no journal tables" if found == 0
            else "is older than this library can read" if found is None
            else f"is at version {found}"
        )  # fmt: skip
        super().__init__(
            f"the journal in PostgreSQL schema {schema!r} {at}, this library needs version"
            f" {known}, and {why}; run `attempt-kernel migrate URL --schema {schema}` once,"
            " as a role that may create tables in the schema (its owner)"
        )
        self.found: Final = found
        self.known: Final = known


@final
class PgWriteFailed(PgJournalError):
    """An append or flush failed; the journal refuses appends until it is reopened.

    Whether the failed append was committed is unknown (the connection may
    have dropped during the commit): read the journal again to find out.
    """


@final
class LeaseLost(PgJournalError):
    """The writer's lease on the run is gone (another owner or a newer fence); nothing was written.

    ``lease`` is None when the writer holds no lease on the run at all.
    """

    def __init__(self, run: str, lease: Lease | None) -> None:
        if lease is None:
            super().__init__(
                f"run {run!r}: this writer holds no lease on the run, so it may not write"
                " it (claim the run first)"
            )
        else:
            super().__init__(
                f"run {run!r}: the lease of {lease.owner!r} at fence {lease.fence} is lost"
                " (another worker took the run over); this writer must stop writing it"
            )
        self.run: Final = run
        self.lease: Final = lease


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """Who may write a run: the ``owner`` named in its ``runs`` row, at ``fence``.

    A takeover raises the fence by one (docs/contracts.md, "Fenced appends");
    an append that carries an older fence, or another owner, writes nothing.
    """

    owner: str
    fence: int


# --------------------------------------------------------------------------
# Schema and migrations
# --------------------------------------------------------------------------

# Each migration moves the tables from version n - 1 to n; written once,
# never edited after release (add migration n + 1 instead). {s} is the schema,
# {records} the records table's name as a string literal.
_MIGRATIONS: Final[tuple[tuple[int, tuple[LiteralString, ...]], ...]] = (
    (
        1,
        (
            # One row: the last sequence number handed out (gapless, as a
            # file's are).
            "CREATE TABLE {s}.head ("
            " one boolean PRIMARY KEY DEFAULT true CHECK (one),"
            " last_seq bigint NOT NULL)",
            "INSERT INTO {s}.head (one, last_seq) VALUES (true, 0)",
            "CREATE TABLE {s}.records ("
            " run text NOT NULL,"
            " seq bigint NOT NULL,"
            " line bytea NOT NULL,"
            " PRIMARY KEY (run, seq),"
            " UNIQUE (seq))",
            # Who may write a run, checked by every fenced append
            # (docs/contracts.md, "Fenced appends").
            "CREATE TABLE {s}.runs ("
            " run text PRIMARY KEY,"
            " owner text,"
            " fence bigint NOT NULL DEFAULT 0)",
        ),
    ),
    (
        2,
        (
            # The queue: a submitted run waits with its workflow and
            # input (strict JSON text) until a worker claims it; ``done`` once
            # its driver wrote its end, with the run's status as ``outcome``.
            "ALTER TABLE {s}.runs"
            " ADD COLUMN workflow text,"
            " ADD COLUMN input text,"
            " ADD COLUMN done boolean NOT NULL DEFAULT false,"
            " ADD COLUMN outcome text,"
            " ADD COLUMN submitted_at timestamptz NOT NULL DEFAULT now(),"
            " ADD COLUMN finished_at timestamptz",
            "CREATE INDEX runs_open ON {s}.runs (submitted_at, run) WHERE NOT done",
            # One row per worker process (a fresh id each time): its heartbeat
            # is stamped by the database's clock, never the worker's; a worker
            # found dead stays dead (its heartbeat no longer updates the row).
            "CREATE TABLE {s}.workers ("
            " id text PRIMARY KEY,"
            " host text NOT NULL,"
            " pid integer NOT NULL,"
            " started_at timestamptz NOT NULL DEFAULT now(),"
            " heartbeat_at timestamptz NOT NULL DEFAULT now(),"
            " dead boolean NOT NULL DEFAULT false)",
        ),
    ),
    (
        3,
        (
            # Admission across workers (docs/contracts.md, "Admission across
            # workers"): a pool is a name and a size; its slots are rows, each
            # held by at most one attempt (run, step, attempt), taken by a
            # worker under the run's fence. Claims lock a free row FOR UPDATE
            # SKIP LOCKED; nothing ever counts rows.
            "CREATE TABLE {s}.pools ("
            " name text PRIMARY KEY,"
            " slots integer NOT NULL CHECK (slots >= 0),"
            " changed_at timestamptz NOT NULL DEFAULT now())",
            "CREATE TABLE {s}.slots ("
            " pool text NOT NULL REFERENCES {s}.pools (name),"
            " slot integer NOT NULL CHECK (slot >= 0),"
            " run text,"
            " step text,"
            " attempt integer,"
            " worker text,"
            " fence bigint,"
            " taken_at timestamptz,"
            " PRIMARY KEY (pool, slot),"
            # free (all six null) or held (none null), never half held
            " CHECK (num_nulls(run, step, attempt, worker, fence, taken_at) IN (0, 6)))",
            # One slot per attempt, and a run's slots found by its name.
            "CREATE UNIQUE INDEX slots_holder ON {s}.slots (run, step, attempt)"
            " WHERE run IS NOT NULL",
        ),
    ),
    (
        4,
        (
            # Per-run sequence numbers (module doc): ``pos`` orders the journal
            # and comes from a database sequence, so appends take no shared
            # lock; rows written so far keep their journal-wide numbers, and
            # ``per_run_after`` remembers where those end.
            "ALTER TABLE {s}.records ADD COLUMN pos bigint",
            "UPDATE {s}.records SET pos = seq",
            "ALTER TABLE {s}.records ALTER COLUMN pos SET NOT NULL",
            "ALTER TABLE {s}.records ALTER COLUMN pos ADD GENERATED BY DEFAULT AS IDENTITY",
            "SELECT setval(pg_get_serial_sequence({records}, 'pos'), greatest(last, 1), last > 0)"
            " FROM (SELECT greatest((SELECT coalesce(max(pos), 0) FROM {s}.records),"
            " (SELECT last_seq FROM {s}.head)) AS last) AS found",
            "ALTER TABLE {s}.records DROP CONSTRAINT records_seq_key",
            "CREATE UNIQUE INDEX records_order ON {s}.records (pos)",
            "ALTER TABLE {s}.head ADD COLUMN per_run_after bigint NOT NULL DEFAULT 0",
            "UPDATE {s}.head SET per_run_after = last_seq",
        ),
    ),
    (
        5,
        (
            # Runs that wait (module doc): an operator's change to a run a live
            # worker holds waits here, as the line the journal would hold,
            # until that worker takes it in (and deletes the row).
            "CREATE TABLE {s}.inbox ("
            " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " run text NOT NULL,"
            " line bytea NOT NULL,"
            " sent_at timestamptz NOT NULL DEFAULT now())",
            "CREATE INDEX inbox_run ON {s}.inbox (run, id)",
            # NULL: claimable now; a released waiting run: its earliest wake
            # time, or 'infinity' when only a signal wakes it.
            "ALTER TABLE {s}.runs ADD COLUMN wake_at timestamptz",
            # The claim scans runs in the order they became claimable (queued
            # or signalled: submitted_at; a sleep: its wake time) and stops at
            # now(): runs waiting for a later time are never read.
            "DROP INDEX {s}.runs_open",
            "CREATE INDEX runs_ready ON {s}.runs ((coalesce(wake_at, submitted_at)), run)"
            " WHERE NOT done",
        ),
    ),
    (
        6,
        (
            # Where each run stands (module doc), kept by the statements that
            # append its records: `attempt-kernel runs` reads these rows, not
            # the journal. A table of its own, not columns of ``runs``: a
            # ``runs`` row is the queue's and the lease's (a run started by
            # `attempt-kernel run URL` has none, and a row there is work for
            # a worker). ``first_pos``: its first record's ``pos`` (the
            # journal's order of runs); ``status``: `RunView.standing`
            # (``running`` is the reader's to say); ``waiting_on``: JSON.
            "CREATE TABLE {s}.summaries ("
            " run text PRIMARY KEY,"
            " first_pos bigint NOT NULL,"
            " workflow text,"
            " status text NOT NULL,"
            " finished boolean NOT NULL,"
            " attempts integer NOT NULL,"
            " started_us bigint,"
            " ended_us bigint,"
            " domain_state text,"
            " waiting_on text NOT NULL,"
            " violations integer NOT NULL)",
            "CREATE INDEX summaries_order ON {s}.summaries (first_pos)",
            # `runs --limit N` lists the most recently started first.
            "CREATE INDEX summaries_started ON {s}.summaries"
            " (started_us DESC NULLS LAST, first_pos DESC)",
            "CREATE INDEX summaries_status ON {s}.summaries"
            " (status, started_us DESC NULLS LAST, first_pos DESC)",
            "CREATE INDEX summaries_workflow ON {s}.summaries"
            " (workflow, started_us DESC NULLS LAST, first_pos DESC)",
            "CREATE INDEX summaries_broken ON {s}.summaries (run) WHERE violations > 0",
        ),
    ),
    (
        7,
        (
            # A waiting run whose cancel was recorded waits for nothing now:
            # `runs` says so rather than what its open waits were for. The
            # migration folds every run once more: the column is the waiting
            # runs', but this release's fold also counts violations version 6's
            # did not (an attempt created after its step was done).
            "ALTER TABLE {s}.summaries ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false",
        ),
    ),
)
assert [v for v, _ in _MIGRATIONS] == list(range(1, PG_SCHEMA_VERSION + 1))


_VERSION_TABLE: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c"
    " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = %s AND c.relname = 'schema_version')"
)
"""Whether the schema has a ``schema_version`` table: the catalog says so to any role."""

_MIGRATE_DENIED: Final = "this role may not create tables in it"


def _version_in_place(conn: psycopg.Connection[TupleRow], schema: str) -> int:
    """The schema's journal version (0: no ``schema_version`` table); reads only, creates nothing."""
    with conn.cursor(row_factory=tuple_row) as cursor:  # whatever rows a caller's connection makes
        if not _bool_of(cursor.execute(_VERSION_TABLE, (schema,)).fetchone()):
            return 0
        try:
            row = cursor.execute(
                sql.SQL("SELECT coalesce(max(version), 0) FROM {s}.schema_version").format(
                    s=sql.Identifier(schema)
                )
            ).fetchone()
        except psycopg.errors.InsufficientPrivilege as error:
            raise PgJournalError(
                f"this role may not read the journal in PostgreSQL schema {schema!r} ({_reason(error)});"
                " grant it USAGE on the schema and the privileges on its tables that docs/design.md,"
                ' "Roles and migrations", lists'
            ) from None
    return _int_of(row)


def _migrate(conn: psycopg.Connection[TupleRow], schema: str) -> tuple[int, int]:
    """Bring the schema's tables to `PG_SCHEMA_VERSION`; return the versions before and after.

    One transaction (a savepoint inside a transaction the caller holds open)
    under an advisory lock, so that two processes migrating a new journal
    at once create it once: the second waits for the first and finds its
    work done. A schema already at the version runs only reads (no CREATE
    privilege needed); a newer one is refused unchanged; a role that may not
    create the tables gets `PgMigrationNeeded`, and nothing is created.
    """
    s = sql.Identifier(schema)
    records = sql.Literal(f"{schema}.records")
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"attempt-kernel:{schema}",)
        )
        found = _version_in_place(conn, schema)
        if found > PG_SCHEMA_VERSION:
            raise PgSchemaTooNew(found, PG_SCHEMA_VERSION, schema)
        if found == PG_SCHEMA_VERSION:
            return found, found
        try:
            # Each statement in a savepoint of its own would cost a round
            # trip more; a denied one ends the transaction, and nothing stays.
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=s))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                    " version integer PRIMARY KEY,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(s=s)
            )
            for version, statements in _MIGRATIONS:
                if version <= found:
                    continue
                for statement in statements:
                    conn.execute(sql.SQL(statement).format(s=s, records=records))
                conn.execute(
                    sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s),
                    (version,),
                )
            # Once every table has its columns: a summary of each run (version 6),
            # made again from version 6's (version 7's column, and the violations
            # of this release's fold).
            if found < 7:
                _backfill_summaries(conn, schema, again=found == 6)
        except psycopg.errors.InsufficientPrivilege as error:
            raise PgMigrationNeeded(
                found, PG_SCHEMA_VERSION, schema, f"{_MIGRATE_DENIED} ({_reason(error)})"
            ) from None
    return found, PG_SCHEMA_VERSION


def migrate(url_or_connection: str | psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA) -> int:
    """Create or upgrade the journal's tables in ``schema``; return the version now in place.

    ``url_or_connection``: a ``postgresql://`` URL (a connection of its own,
    closed after), or a psycopg connection the caller owns and keeps. On an
    autocommit connection, or one with no transaction open, the migration is
    one transaction, committed when this returns; inside a transaction the
    caller holds open it is a savepoint, committed (and its lock released)
    with the caller's transaction. Idempotent: a schema already at
    `PG_SCHEMA_VERSION` is only read. Safe to call from several processes at
    once: the migration holds an advisory lock of the schema, so the others
    wait and find it done. Needs a role that may create the schema (or owns
    it): `PgMigrationNeeded` otherwise, `PgSchemaTooNew` for tables newer
    than this library, `PgConnectFailed` for a URL that reaches no server.
    The command line's ``attempt-kernel migrate URL`` calls this.
    """
    return migrate_versions(url_or_connection, schema=schema)[1]


def migrate_versions(
    url_or_connection: str | psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA
) -> tuple[int, int]:
    """`migrate`, returning the versions before and after (what ``attempt-kernel migrate`` prints)."""
    check_schema(schema)
    if isinstance(url_or_connection, str):
        with connect(url_or_connection) as conn:
            return _migrated(conn, schema)
    return _migrated(usable(url_or_connection, "migrate"), schema)


def _migrated(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    try:
        return _migrate(conn, schema)
    except psycopg.Error as error:
        raise PgJournalError(
            f"migrating the journal in PostgreSQL schema {schema!r} failed: {_reason(error)}"
        ) from error


def check_schema(schema: str) -> None:
    """Refuse a schema name that is not a lower-case SQL identifier (`ValueError`)."""
    if not _IDENTIFIER.fullmatch(schema):
        raise ValueError(
            f"schema must be a lower-case SQL identifier (letters, digits, _), got {schema!r}"
        )


def usable(conn: object, action: str) -> psycopg.Connection[Any]:
    """``conn`` if it is a psycopg connection that can take a statement now, else a clear error.

    ``action`` names what was asked (for the message). A caller's connection
    in a failed transaction (an earlier statement failed and nothing rolled
    it back) takes no statement until the caller rolls back; this never does
    it for them.
    """
    if not isinstance(conn, psycopg.Connection):
        raise TypeError(
            f"{action}: expected a postgresql:// URL or a psycopg.Connection, got {type(conn).__name__}"
        )
    checked: psycopg.Connection[Any] = cast(Any, conn)  # its rows may be of any type: a caller's
    if checked.closed:
        raise PgJournalError(f"{action}: the connection given is closed")
    status = checked.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise PgJournalError(
            f"{action}: the connection given is in a failed transaction (an earlier statement"
            " failed); roll it back first (conn.rollback()): nothing was written"
        )
    if status in (TransactionStatus.ACTIVE, TransactionStatus.UNKNOWN):
        raise PgJournalError(
            f"{action}: the connection given cannot take a statement now"
            f" (its transaction status is {status.name}): nothing was written"
        )
    return checked


def _bool_of(row: tuple[object, ...] | None) -> bool:
    value = None if row is None else row[0]
    if type(value) is not bool:
        raise PgJournalError(f"the database answered {value!r} where true or false was expected")
    return value


_OPEN: Final[LiteralString] = (
    "SELECT (SELECT coalesce(max(version), 0) FROM {s}.schema_version),"
    " (SELECT per_run_after FROM {s}.head)"
)
"""What opening a journal reads: its version and ``head.per_run_after`` (one round trip)."""

_NOT_THERE: Final = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.InsufficientPrivilege,
)
"""How `_OPEN` fails on tables missing or too old (or not this role's to read): `_migrate` says which."""


def _open(conn: psycopg.Connection[TupleRow], schema: str) -> int:
    """Open the journal on ``conn`` (its own, autocommit): return ``head.per_run_after``.

    Tables at `PG_SCHEMA_VERSION` are only read (one statement: a role with
    no CREATE privilege opens them). Tables missing or behind are migrated
    first, implicitly, as before `migrate` existed: this needs a role that may
    create them (`PgMigrationNeeded` otherwise, nothing created).
    """
    statement = sql.SQL(_OPEN).format(s=sql.Identifier(schema))
    try:
        try:
            row = conn.execute(statement).fetchone()
        except _NOT_THERE:
            row = None
        if row is None or row[0] != PG_SCHEMA_VERSION:
            _migrate(conn, schema)
            row = conn.execute(statement).fetchone()
    except psycopg.Error as error:
        raise PgJournalError(
            f"opening the journal in PostgreSQL schema {schema!r} failed: {_reason(error)}"
        ) from error
    return _int_of(None if row is None else row[1:])


def _int_of(row: tuple[object, ...] | None) -> int:
    value = None if row is None else row[0]
    if type(value) is not int:
        raise PgJournalError(f"the database answered {value!r} where a number was expected")
    return value


# --------------------------------------------------------------------------
# Text PostgreSQL cannot hold
# --------------------------------------------------------------------------


def untextable(value: str) -> str | None:
    """What in ``value`` a PostgreSQL ``text`` column cannot hold, and where (None: nothing).

    A NUL, which no ``text`` holds, or a lone surrogate, which UTF-8 (the
    database's encoding, and psycopg's) has no bytes for. A run log file's
    JSON escapes both, so a name a file accepts may be one no journal here
    can hold.
    """
    at = value.find("\x00")
    if at >= 0:
        return f"a NUL ('\\x00') at index {at}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"a lone surrogate ({value[error.start]!r}) at index {error.start}"
    return None


def text_fields(run: str, changes: Sequence[Change]) -> Iterator[tuple[str, str]]:
    """The values of ``changes`` to ``run`` that the journal keeps as text, each with its field's name.

    Its workflow's name and its domain states (the ``summaries`` row), then
    the run's id (``records``, ``runs``, ``summaries``), which may be made of
    the workflow's name: the rest of a record is its line, bytes holding
    JSON's escapes.
    """
    for change in changes:
        if isinstance(change, RunStarted):
            yield "workflow name", change.workflow
            for state in change.domain_states:
                yield "domain state", state
        elif isinstance(change, DomainStateSet):
            yield "domain state", change.state
    yield "run id", run


def refuse_untextable(run: str, changes: Sequence[Change]) -> None:
    """Raise `UnencodableRecord` when a value of ``changes`` the journal keeps as text
    (`text_fields`) holds what PostgreSQL text cannot (`untextable`).

    Checked before anything is read or written: the statement would fail in
    the database (a NUL: the journal broken, a run half written, a writer
    thread's whole group failed) or in the driver (a lone surrogate).
    """
    for field, value in text_fields(run, changes):
        what = untextable(value)
        if what is not None:
            where = "" if field == "run id" else f"run {run!r}: "
            raise UnencodableRecord(
                f"{where}{field} {value!r} holds {what}, which a PostgreSQL journal cannot hold"
                " (it keeps run ids, workflow names and domain states as text); nothing was"
                f" written. A run log file holds it; on PostgreSQL give a {field} without it"
            )


# --------------------------------------------------------------------------
# Which appends commit synchronously
# --------------------------------------------------------------------------


def commits_synchronously(change: Change) -> bool:
    """True for a change that must be durable before `append` returns.

    ``Dispatched`` commits synchronously before the effect is sent
    (docs/contracts.md, "The write-ahead rule"); the others
    may commit asynchronously, since a later synchronous commit makes them
    durable too.
    """
    match change:
        case IntentChanged():
            return is_outstanding(change.to_state)
        case SignalSent():
            return True  # an operator's record: durable when its sender is told so
        case (
            RunStarted()
            | RunCancelRequested()
            | RunStopRequested()
            | RunResumed()
            | AttemptCreated()
            | AttemptTransitioned()
            | IntentPlanned()
            | IntentReconciled()
            | DomainStateSet()
            | StepCalled()
            | StepResult()
            | RunFinished()
            | WaitStarted()
            | WaitEnded()
        ):
            return False
        case _:
            assert_never(change)


# --------------------------------------------------------------------------
# Where each run stands: the summaries (schema version 6)
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """A run's ``summaries`` row: where a fold of the run's records says it stands (`summary_of`)."""

    workflow: str | None
    status: RunStanding
    """`RunView.standing` (never ``running``: that is the reader's to say, from the leases)."""
    finished: bool
    attempts: int
    started_us: int | None
    ended_us: int | None
    domain_state: str | None
    waiting_on: tuple[WaitOn, ...]
    """Its open waits while its status is ``waiting`` (else none)."""
    cancel_requested: bool
    """Its status is ``waiting`` and its cancel was recorded (`RunRow.cancel_requested`)."""
    violations: int
    """Records of the run that break the kernel's rules (the fold's violations)."""

    def values(self) -> tuple[object, ...]:
        """The row's columns after ``run`` and ``first_pos``, as `_SUMMARY_VALUES` takes them."""
        # a wait's third field: a signal it takes came (its wake time is read at listing)
        waits = json.dumps([[w.signal, w.wake_us, w.came] for w in self.waiting_on])
        return (
            self.workflow, self.status, self.finished, self.attempts, self.started_us,
            self.ended_us, self.domain_state, waits, self.cancel_requested, self.violations,
        )  # fmt: skip


def summary_of(fold: Ledger, run: str) -> RunSummary | None:
    """The summary of ``run`` from a ledger fed its records, and only its (None: the ledger has no view of it).

    The one rule of where a run stands is the ledger's: the row says what
    `RunView.standing` says, so that `runs` on the summaries prints what
    `runs` on a fold of the journal prints.
    """
    view = fold.runs.get(run)
    if view is None:
        return None
    status = view.standing()
    return RunSummary(
        workflow=view.workflow,
        status=status,
        finished=view.finished,
        attempts=view.attempts,
        started_us=view.started_us,
        ended_us=view.ended_us,
        domain_state=view.domain_state,
        # came: a signal it takes came (one signal, one wait); its wake time is judged when listed
        waiting_on=tuple(
            WaitOn(signal=w.signal, wake_us=w.wake_us, came=took, signal_came=took)
            for w, took in view.open_waits_taking()
        )
        if status == "waiting"
        else (),
        cancel_requested=status == "waiting" and view.cancel_requested,
        violations=fold.violation_count,
    )


# The columns after (run, first_pos), typed, then the upsert that keeps
# first_pos (a run's first record stays its first).
_SUMMARY_VALUES: Final[LiteralString] = (
    "%s::text, %s::text, %s::boolean, %s::integer, %s::bigint, %s::bigint, %s::text, %s::text, %s::boolean,"
    " %s::integer"
)
_SUMMARY_UPSERT: Final[LiteralString] = (
    "INSERT INTO {s}.summaries (run, first_pos, workflow, status, finished, attempts,"
    " started_us, ended_us, domain_state, waiting_on, cancel_requested, violations)"
    " SELECT %s, min(ins.pos), " + _SUMMARY_VALUES + " FROM ins HAVING count(*) > 0"
    " ON CONFLICT (run) DO UPDATE SET workflow = excluded.workflow, status = excluded.status,"
    " finished = excluded.finished, attempts = excluded.attempts,"
    " started_us = excluded.started_us, ended_us = excluded.ended_us,"
    " domain_state = excluded.domain_state, waiting_on = excluded.waiting_on,"
    " cancel_requested = excluded.cancel_requested, violations = excluded.violations"
)


def summary_upsert_after(insert: LiteralString) -> LiteralString:
    """``insert`` (an INSERT into records, with no RETURNING) made one statement with the
    upsert of its run's summary: a data-modifying WITH, so the records and the
    summary commit together or not at all. The statement answers the count of
    records inserted; its summary parameters (run, then `RunSummary.values`)
    follow the insert's."""
    return "WITH ins AS (" + insert + " RETURNING pos), summ AS (" + _SUMMARY_UPSERT + ") SELECT count(*) FROM ins"


def _backfill_summaries(conn: psycopg.Connection[tuple[object, ...]], schema: str, *, again: bool = False) -> None:
    """Migrations 6 and 7's Python: a summary for every run in the journal, by folding each run once.

    Reads the records run by run (a server-side cursor, `READ_BATCH` rows at
    a time), as `PgJournal.read_run` reads one, so a journal written before
    version 6 lists as it did. ``again``: migration 7's, the rows version 6
    wrote are dropped first and written anew (the ``cancel_requested`` of
    the waiting runs, and the violations this release's fold counts that
    version 6's did not: an attempt created after its step was done).
    """
    s = sql.Identifier(schema)
    with conn.cursor(row_factory=tuple_row) as head:  # whatever rows a caller's connection makes
        per_run_after = _int_of(head.execute(sql.SQL("SELECT per_run_after FROM {s}.head").format(s=s)).fetchone())
        if again:
            head.execute(sql.SQL("DELETE FROM {s}.summaries").format(s=s))
    insert = sql.SQL(
        "INSERT INTO {s}.summaries (run, first_pos, workflow, status, finished, attempts,"
        " started_us, ended_us, domain_state, waiting_on, cancel_requested, violations)"
        " VALUES (%s, %s, " + _SUMMARY_VALUES + ")"
    ).format(s=s)
    batch: list[tuple[object, ...]] = []

    def done(run: str, first_pos: int, fold: Ledger) -> None:
        summary = summary_of(fold, run)
        if summary is not None:
            batch.append((run, first_pos, *summary.values()))
        if len(batch) >= READ_BATCH:
            with conn.cursor() as cursor:
                cursor.executemany(insert, batch)
            batch.clear()

    current: str | None = None
    fold = Ledger()
    numbering = _Numbering(per_run_after, journal=False)
    first_pos = position = 0
    with conn.cursor(name="attempt_kernel_backfill", row_factory=tuple_row) as rows:
        rows.itersize = READ_BATCH
        rows.execute(sql.SQL("SELECT pos, seq, run, line FROM {s}.records ORDER BY run, seq").format(s=s))
        for row in rows:
            pos, seq, run, line = _row_of(row, 0)
            if run != current:
                if current is not None:
                    done(current, first_pos, fold)
                current, fold, first_pos, position = run, Ledger(), pos, 0
                numbering = _Numbering(per_run_after, journal=False)
            position += 1
            first_pos = min(first_pos, pos)
            fold.feed(_items(pos, seq, run, line, position, numbering))
    if current is not None:
        done(current, first_pos, fold)
    if batch:
        with conn.cursor() as cursor:
            cursor.executemany(insert, batch)
    conn.execute(sql.SQL("ANALYZE {s}.summaries").format(s=s))  # plans for the filters at once


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    """A run submitted to the journal that no record mentions yet: it waits for a worker."""

    run: str
    workflow: str | None
    submitted_us: int


# --------------------------------------------------------------------------
# The journal
# --------------------------------------------------------------------------


def database_named(url: str) -> str:
    """``PostgreSQL at host:port, database name`` for messages; never the URL (it may hold a password)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        params = {}
    host = str(params.get("host") or "localhost (default socket)")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    database = params.get("dbname")
    named = f", database {database}" if database else ""
    return f"PostgreSQL at {where}{named}"


def _secrets(url: str) -> list[str]:
    """What in ``url`` may be a password: the user-info's text after its first ``:``,
    up to each ``@``, and the value of any parameter whose name reads ``password``
    once percent-decoded; each also percent-decoded. Read by hand: a URL the driver
    cannot parse may still hold one."""
    found: set[str] = set()
    _, scheme, rest = url.partition("://")
    if scheme:
        for at, char in enumerate(rest):
            if char == "@":
                found.add(rest[:at].partition(":")[2])
    for part in re.split(r"[?&\s]", url.partition("?")[2]):
        name, equals, value = part.partition("=")
        if equals and urllib.parse.unquote(name).strip() == "password":
            found.add(value)
    found |= {urllib.parse.unquote(secret) for secret in found}
    return [secret for secret in found if secret]


def scrubbed(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) without any password of ``url``.

    libpq quotes what it cannot parse: the URL, or the token it stopped at
    (which may be the password). A quoted part that holds a password is
    replaced: the URL by its form without the password, anything else by
    ``***``. Text outside quotes is the driver's own, left as it is (replacing
    a short password wherever it occurs would spell it out).
    """
    secrets = _secrets(url)

    def quoted(match: re.Match[str]) -> str:
        mark, inside = match.group(1), match.group(2)
        if not any(secret in inside for secret in secrets):
            return match.group(0)
        return f"{mark}{redacted(url) if inside == url else '***'}{mark}"

    return re.sub(r"([\"'])(.*?)\1", quoted, text)


def _connect_error(url: str, error: psycopg.Error) -> PgJournalError:
    """Name the host and the driver's reason; never the password.

    A URL the driver cannot parse is a `PgJournalError` (a wrong argument,
    which no retry mends); one it can parse but not reach, `PgConnectFailed`.
    So is a URL with an ``@`` in its user name or password not escaped: the
    driver takes the rest for the host, which would print part of a password.
    """
    authority = url.partition("://")[2].partition("?")[0].rpartition("@")[0]
    if "@" in authority:
        return PgJournalError(
            "not a PostgreSQL URL the driver can read: it holds '@' more than once before its"
            " host; write an '@' in a user name or password as %40"
        )
    reason = scrubbed("; ".join(part.strip() for part in str(error).splitlines() if part.strip()), url)
    try:
        conninfo_to_dict(url)
    except psycopg.Error:
        return PgJournalError(f"not a PostgreSQL URL the driver can read: {reason}")
    refused = _BAD_OPTION.match(reason)
    if refused is not None:  # parsed, but a value libpq refuses before it connects
        return PgJournalError(f"not a PostgreSQL URL the driver can read: {refused.group(1)}")
    return PgConnectFailed(f"cannot connect to {database_named(url)}: {reason}")


_BAD_OPTION: Final = re.compile(
    r'connection is bad: (invalid (?:integer value "|port number: "|[a-z_]+ value: ").*)\Z', re.DOTALL
)
"""libpq's refusal of an option's value (a port that is no number, an unknown
``sslmode``), made before it tries to connect: a wrong argument, not an outage."""


_OUTAGE_STATES: Final = frozenset({"57P01", "57P02", "57P03", "53300"})
"""SQLSTATEs of a server going away or not there yet: admin shutdown, crash
shutdown, cannot connect now (starting up or shutting down), too many
connections."""


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is the database being unreachable.

    True for `PgConnectFailed`, and for a ``psycopg.OperationalError`` with
    no SQLSTATE (the server closed the connection, the connection is
    closed, connection refused), of class 08 (connection exception), or in
    `_OUTAGE_STATES`. Anything else (a constraint, a syntax error, a lost
    lease) is not: retrying would fail the same way.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, PgConnectFailed):
            return True
        if isinstance(current, psycopg.OperationalError):
            state = current.sqlstate
            if state is None or state.startswith("08") or state in _OUTAGE_STATES:
                return True
        current = current.__cause__ or current.__context__
    return False


IDLE_IN_TRANSACTION: Final = 30.0
"""Seconds a session of this library may sit idle inside a transaction before the server ends
it (``idle_in_transaction_session_timeout``), the default of `connect`.

None of its transactions waits on its client for more than a moment, but a
process stopped in the middle of one (SIGSTOP, a paused VM, Ctrl-Z) would
hold its row locks for as long as it stays stopped, and every operator's
change to that run, and a worker taking the run over, would wait for it.
The server ends such a session instead, which rolls its transaction back;
the process, once it goes on, finds its connection gone. A worker's own
sessions use its ``dead_after`` (`Worker`)."""


def connect(
    url: str, *, connect_timeout: int = 10, idle_in_transaction: float | None = IDLE_IN_TRANSACTION
) -> psycopg.Connection[TupleRow]:
    """An autocommit connection to ``url``, or `PgConnectFailed` naming the host and why.

    ``idle_in_transaction``: the seconds after which the server ends the session when it
    idles inside a transaction (`IDLE_IN_TRANSACTION`); None leaves the server's setting,
    for a reader whose snapshot stays open while its caller takes its time."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout)
        if idle_in_transaction is not None:
            try:
                conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                    (f"{max(1, round(idle_in_transaction * 1000))}ms",),
                )
            except BaseException:
                conn.close()
                raise
        return conn
    except psycopg.Error as error:
        failure = _connect_error(url, error)
    # Raised out here, with no driver error as its context: `connection_lost`
    # reads a URL the driver cannot parse as a wrong argument, not an outage.
    raise failure


@final
class _Numbering:
    """Checks the numbers of rows read in ``pos`` order: each run's go up by one (module doc).

    Rows at or below ``per_run_after`` were written under journal-wide
    numbering (schema version 3): there, the numbers go up by one across
    the journal (``journal`` is False when only one run is read, which
    can check only that they go up). Memory: one number per run seen.
    """

    def __init__(self, per_run_after: int, *, journal: bool) -> None:
        self._per_run_after: Final = per_run_after
        self._journal: Final = journal
        self._last_old = 0
        self.last: Final[dict[str, int]] = {}

    def problem(self, pos: int, run: str, seq: int) -> str | None:
        """Why row ``(run, seq)`` at ``pos`` is out of place, or None when it is where it belongs."""
        before = self.last.get(run, 0)
        self.last[run] = seq
        if pos <= self._per_run_after:
            last_old, self._last_old = self._last_old, seq
            if self._journal and seq != last_old + 1:
                return f"sequence number {seq} follows {last_old} (rows numbered journal-wide, before schema version 4)"
            if seq <= before:
                return f"sequence number {seq} follows the run's {before}"
            return None
        if seq == before + 1:
            return None
        missing = "a gap: records are missing" if seq > before + 1 else "out of order"
        return f"the run's previous record is seq {before} ({missing})"


def _row_of(row: tuple[object, ...], after: int) -> tuple[int, int, str, bytes]:
    """A records row (``pos, seq, run, line``) checked for its types."""
    pos, seq, run, line = row
    if type(pos) is not int or type(seq) is not int or type(run) is not str or type(line) is not bytes:
        raise PgJournalError(f"the records table holds an unexpected row after {after}")
    return pos, seq, run, line


def _items(
    pos: int, seq: int, run: str, line: bytes, position: int, numbering: _Numbering
) -> Iterator[Record | CorruptLine]:
    """What one records row reads as, numbered ``position`` (see `PgJournal.read`)."""
    item = decode_line(line, position)
    match item:
        case Record():
            if item.run != run or item.seq != seq:
                yield CorruptLine(
                    line=position,
                    reason=f"row of run {run!r} seq {seq} holds the record of run"
                    f" {item.run!r} seq {item.seq}",
                )
                return
            problem = numbering.problem(pos, run, seq)
            if problem is not None:
                yield CorruptLine(line=position, reason=f"row of run {run!r} seq {seq}: {problem}")
            yield Record(line=position, seq=position, time_us=item.time_us, run=run, change=item.change)
        case CorruptLine():
            numbering.problem(pos, run, seq)
            yield CorruptLine(line=position, reason=f"row of run {run!r} seq {seq}: {item.reason}")
        case _:
            assert_never(item)


@final
class PgJournal:
    """A run log in PostgreSQL: the `Journal` seam (read, append, flush) over one schema.

    Opening connects and reads the schema's version: tables at
    `PG_SCHEMA_VERSION` are only read, so a role without the CREATE
    privilege opens them; tables missing or behind are migrated first (as
    `migrate` does), which needs a role that may create them
    (`PgMigrationNeeded` otherwise). One
    journal holds one connection for appending and one more, opened by the
    first `read`, for reading the whole journal in one snapshot; it is used
    from one thread. `append` returns the record's sequence number in its
    run once its transaction has committed (synchronously for
    ``Dispatched``: docs/design.md, "Many workers on PostgreSQL"); `flush`
    makes every returned append durable. A failed append breaks the journal
    (`PgWriteFailed`) until it is reopened.

    `hand_over` and `committed` are the asynchronous path (a worker's
    executors take it; docs/design.md, "Many workers on PostgreSQL", says
    how it groups commits): `hand_over` returns a record's number at once,
    having checked and encoded it, and a writer thread writes what is queued
    in groups, one synchronous commit per group; `committed` awaits the
    group that covers a run's records. The first `hand_over` starts the
    thread and its connection (a journal that never hands over starts none),
    and from then on the synchronous entry points go through the same queue
    and block until their group is written, so each run's records stay in
    order. A lease lost by one run fails that run only: its `committed` and
    later appends raise `LeaseLost`, and none of its later records is
    written, while the other runs of the group commit. A database error
    fails every waiter with `PgWriteFailed` (raised from the database's
    error, so `connection_lost` tells an outage) and breaks the journal.
    `close` writes what is queued, flushes, and ends the thread.

    `take_in` hands what operators left in the journal's ``inbox`` for runs
    this process holds to their executor (`run_jobs` and `resume_log` call
    it while they drive runs), on a connection of its own.

    Each append is one statement. The journal remembers the next number of
    each run it wrote or read to the end (`read_run`), and asks the database
    for it otherwise; one writer per run at a time is the caller's to
    ensure (a lease does it): a record another writer numbered first makes
    the append fail (the ``(run, seq)`` key), never interleave.

    With ``lease``, every append also checks, in the statement that writes
    the record, that the run's ``runs`` row names this owner and fence, and
    raises `LeaseLost` (writing nothing) when it does not. A worker drives
    many runs, each under its own fence: ``leases`` maps each run it holds
    to its lease, read at every append (the caller adds and removes runs as
    it claims and leaves them); an append to a run missing from it raises
    `LeaseLost`.

    ``clock`` gives ``time_us``. By default it is the database's clock: read
    when the journal opens and again every `CLOCK_RESYNC_S` seconds, and
    carried forward in between by this process's monotonic clock (never its
    wall clock, which may be set wrong), so an append costs no extra round
    trip; stamps never go backwards within one journal.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        lease: Lease | None = None,
        leases: Mapping[str, Lease] | None = None,
        clock: Callable[[], int] | None = None,
        connect_timeout: int = 10,
        writer_hook: Callable[[], object] | None = None,
    ) -> None:
        if lease is not None and leases is not None:
            raise ValueError("give lease (one run) or leases (per run), not both")
        if not _IDENTIFIER.fullmatch(schema):
            raise ValueError(
                f"schema must be a lower-case SQL identifier (letters, digits, _), got {schema!r}"
            )
        self.schema: Final = schema
        self.lease: Final = lease
        self._leases: Final = leases
        self._clock: Final = clock
        self._url: Final = url
        self._connect_timeout: Final = connect_timeout
        self._broken: str | None = None
        self._broken_by: BaseException | None = None
        """The error that broke the journal: a later refusal is raised from it
        (so `connection_lost` tells an outage from it)."""
        self._unflushed = False
        self._next: Final[dict[str, int]] = {}
        """The next sequence number of each run this journal knows it for."""
        self._folds: Final[dict[str, Ledger]] = {}
        """A ledger fed every record of each run in `_next` (and only those): it
        says the run's summary after an append (schema version 6)."""
        self._summaries: Final[dict[str, RunSummary | None]] = {}
        """What each run's ``summaries`` row holds now, per its fold (None: no row)."""
        self._offset_us = 0
        self._synced_at_us: int | None = None
        self._last_time = 0
        self._reader: psycopg.Connection[TupleRow] | None = None
        self._mail: psycopg.Connection[TupleRow] | None = None
        """`take_in`'s connection, opened by its first look."""
        self._mail_failed = False
        """`take_in`'s last look failed (said once, not at every look)."""
        # The writer thread (`hand_over`): started by the first hand-over.
        # The lock guards what both threads read: the queue, the tickets
        # written and made durable, the waiters, the runs found lost, and
        # the breakage (``_broken``) once the thread runs.
        self._writer_hook: Final = writer_hook
        """Called by the writer thread before each group (tests hold the writer with it)."""
        self._writer: threading.Thread | None = None
        self._cond: Final = threading.Condition()
        self._queue: list[tuple[int, _Job]] = []
        self._queued: Final[dict[str, int]] = {}
        """Where each run's job is in the queue (its last, which later hand-overs join)."""
        self._tickets = 0
        """The last ticket handed out: one per job, in the order jobs are queued."""
        self._written = 0
        """Every job up to this ticket is written (committed, or dropped as lost)."""
        self._durable = 0
        """Every job up to this ticket survives a crash of the machine."""
        self._waiters: Final[list[_Waiter]] = []
        self._lost: Final[dict[str, Lease | None]] = {}
        """Runs whose lease a group found lost, with the lease it carried."""
        self._closing = False
        self._sync_commits = 0
        self._last_ticket: Final[dict[str, int]] = {}
        """Each run's last job's ticket (the caller's side only)."""
        self._sync_ticket: Final[dict[str, int]] = {}
        """Each run's last job that must be durable (the caller's side only)."""
        self._flush_statement: Final = (
            b"SELECT set_config('synchronous_commit', 'on', true),"
            b" pg_logical_emit_message(true, 'attempt-kernel', 'flush')"
        )
        conn = connect(url, connect_timeout=connect_timeout)
        try:
            per_run_after = _open(conn, schema)
        except BaseException:
            conn.close()
            raise
        self._conn: Final = conn
        self._cursor: Final = conn.cursor()
        """Every append's cursor (`Connection.execute` would make one per statement)."""
        s = sql.Identifier(schema)
        self._per_run_after: Final = per_run_after
        """The last row numbered journal-wide (written before version 4); fixed by the migration."""
        self._db_clock: Final = sql.SQL(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        )
        # The statements that append, by row count and fencing (`_insert`),
        # and those that append and close the run's row, by row count
        # (`_insert_closing`).
        self._inserts: Final[dict[tuple[int, bool, bool], bytes]] = {}
        self._closings: Final[dict[tuple[int, bool], bytes]] = {}
        self._read: Final = sql.SQL(
            "SELECT pos, seq, run, line FROM {s}.records WHERE pos > %s ORDER BY pos LIMIT %s"
        ).format(s=s)
        self._read_run: Final = sql.SQL(
            "SELECT pos, seq, run, line FROM {s}.records"
            " WHERE run = %s AND seq > %s ORDER BY seq LIMIT %s"
        ).format(s=s)

    # ------------------------------------------------------------ reading

    def read_run(self, run: str) -> Iterator[LogItem]:
        """Yield one run's records in order, numbered 1, 2, ... as `export --run` writes them.

        What a worker needs to recover and drive one run without reading the
        whole journal (its ``(run, seq)`` key makes this an index range). A
        row that fails its checksum, or whose number does not follow the
        run's previous one, is a `CorruptLine` naming run and seq. Read to
        its end, it tells this journal the run's next sequence number.
        """
        if untextable(run) is not None:
            return  # no run of such an id can be in the journal: it keeps ids as text
        numbering = _Numbering(self._per_run_after, journal=False)
        fold = Ledger()
        for item in self._rows(self._conn, self._read_run, (run,), f"run {run!r}", numbering, by_pos=False):
            fold.feed((item,))
            yield item
        self._known(run, numbering.last.get(run, 0) + 1, fold)

    def _known(self, run: str, next_seq: int, fold: Ledger) -> None:
        """Remember ``run``'s next number and its fold (every record before that number)."""
        self._next[run] = next_seq
        self._folds[run] = fold
        self._summaries[run] = summary_of(fold, run)
        self._unlose(run)  # read again from the journal: a lease lost before is the past

    def _unlose(self, run: str) -> None:
        """Drop ``run`` from the runs a group found lost (its next write asks the database)."""
        if self._lost:
            with self._cond:
                self._lost.pop(run, None)

    def _forget(self, run: str) -> None:
        self._next.pop(run, None)
        self._folds.pop(run, None)
        self._summaries.pop(run, None)

    def read_run_in(self, conn: psycopg.Connection[TupleRow], run: str) -> Iterator[LogItem]:
        """`read_run` on the caller's ``conn`` (inside its transaction, after its locks).

        For a caller that must read a run in the same transaction as it
        writes it (`_deliver` locks the run's row first); this journal's
        own numbering of the run is left as it was.
        """
        if untextable(run) is not None:
            return iter(())  # no run of such an id can be in the journal (`read_run`)
        numbering = _Numbering(self._per_run_after, journal=False)
        return self._rows(conn, self._read_run, (run,), f"run {run!r}", numbering, by_pos=False)

    def read_run_snapshot(self, run: str) -> list[LogItem]:
        """One run's records as `read_run` numbers them, in one snapshot of the reading
        connection, leaving this journal's own numbering of the run as it was.

        For a reader that outlives sessions (`serve`'s run pages): a session
        the server ended fails this read with `PgJournalError`, and the next
        read opens a new one, where `read_run`'s connection stays closed.
        """
        reader = self._reading()
        try:
            with reader.transaction():
                return list(self.read_run_in(reader, run))
        except psycopg.Error as error:  # the snapshot's end (commit) failed
            raise PgJournalError(f"reading run {run!r} failed: {_reason(error)}") from error

    def read(self) -> Iterator[LogItem]:
        """Yield every record of the journal in ``pos`` order (a `Record` or `CorruptLine`).

        Reads one snapshot (a read-only repeatable-read transaction on a
        connection of its own, so appends meanwhile neither block nor show),
        in batches of `READ_BATCH` rows. Records are numbered 1, 2, 3, ...
        in that order (``seq`` and ``line``: the line numbers of an export).
        A row whose line fails its checksum, holds another row's record, or
        whose number does not follow its run's previous one is a
        `CorruptLine` naming the row's run and seq (followed by the record
        itself when only its number is wrong).
        """
        reader = self._reading()
        try:
            with reader.transaction():
                numbering = _Numbering(self._per_run_after, journal=True)
                yield from self._rows(reader, self._read, (), "the journal", numbering, by_pos=True)
        except psycopg.Error as error:  # the snapshot's end (commit) failed
            raise PgJournalError(f"reading the journal failed: {_reason(error)}") from error

    def _reading(self) -> psycopg.Connection[TupleRow]:
        """The reading connection: read-only, each transaction one snapshot (repeatable read)."""
        reader = self._reader
        if reader is None or reader.closed:
            # No idle-in-transaction limit: a snapshot stays open while the caller takes
            # its time over what was read (an export to a slow pipe); it locks no row.
            reader = self._reader = connect(
                self._url, connect_timeout=self._connect_timeout, idle_in_transaction=None
            )
            reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            reader.read_only = True
        return reader

    def listed(self, only: RunFilter) -> tuple[list[RunRow], int]:
        """What `attempt-kernel runs` prints: the rows ``only`` keeps, and the journal's violations.

        Served by SQL from the ``summaries`` (and, for queued runs, the
        ``runs`` rows with no record yet), in one snapshot; the journal is
        not folded. ``running`` and ``interrupted`` are told apart here, by
        whether a live worker holds the run (`held_runs`). Order and limit
        as `RunFilter` says: the journal's order (queued runs last, by
        submit time), or with a limit the most recently started first.
        """
        query, params = _listing(only)
        # No run's workflow can hold what PostgreSQL text cannot: none is kept (and the
        # database is not asked with a value its driver cannot send)
        none = only.workflow is not None and untextable(only.workflow) is not None
        conn = self._reading()
        try:
            with conn.transaction():
                found = [] if none else conn.execute(sql.SQL(query).format(s=sql.Identifier(self.schema)), params).fetchall()
                violations = _int_of(
                    conn.execute(
                        sql.SQL(
                            "SELECT coalesce(sum(violations), 0)::bigint FROM {s}.summaries WHERE violations > 0"
                        ).format(s=sql.Identifier(self.schema))
                    ).fetchone()
                )
        except psycopg.Error as error:
            raise PgJournalError(f"reading the runs' summaries failed: {_reason(error)}") from error
        return [_listed_row(row) for row in found], violations

    def queued(self, run: str) -> Queued | None:
        """``run`` when it is submitted and no record of it is written yet (None otherwise)."""
        if untextable(run) is not None:
            return None  # no run of such an id can be queued: the journal keeps ids as text
        conn = self._reading()
        try:
            with conn.transaction():
                row = conn.execute(
                    sql.SQL(
                        "SELECT q.workflow, (extract(epoch FROM q.submitted_at) * 1000000)::bigint"
                        " FROM {s}.runs q WHERE q.run = %s AND NOT q.done"
                        " AND NOT EXISTS (SELECT 1 FROM {s}.records WHERE run = q.run) AND " + _UNCLAIMED
                    ).format(s=sql.Identifier(self.schema)),
                    (run,),
                ).fetchone()
        except psycopg.Error as error:
            raise PgJournalError(f"reading run {run!r}'s row failed: {_reason(error)}") from error
        if row is None:
            return None
        workflow, submitted = row
        if (workflow is not None and type(workflow) is not str) or type(submitted) is not int:
            raise PgJournalError(f"the runs table answered {row!r} for run {run!r}")
        return Queued(run=run, workflow=workflow, submitted_us=submitted)

    def _rows(
        self,
        conn: psycopg.Connection[TupleRow],
        query: sql.Composed,
        params: tuple[object, ...],
        what: str,
        numbering: _Numbering,
        *,
        by_pos: bool,
    ) -> Iterator[Record | CorruptLine]:
        """Decode the rows ``query`` returns (``pos, seq, run, line``), in batches after a key.

        The key is the query's order: ``pos`` for the journal (``by_pos``), ``seq`` for one run.
        """
        after = 0
        position = 0
        while True:
            try:
                rows = conn.execute(query, (*params, after, READ_BATCH)).fetchall()
            except psycopg.Error as error:
                raise PgJournalError(
                    f"reading {what} after {'pos' if by_pos else 'seq'} {after} failed: {_reason(error)}"
                ) from error
            for row in rows:
                pos, seq, run, line = _row_of(row, after)
                position += 1
                after = pos if by_pos else seq
                yield from _items(pos, seq, run, line, position, numbering)
            if len(rows) < READ_BATCH:
                return

    def new_run(self, run: str) -> None:
        """Say that ``run`` has no record yet, so its first append is seq 1 without asking the database.

        For a caller that knows it (a worker that just claimed a queued run
        and saw none). Were it wrong, the append would fail on the
        ``(run, seq)`` key, never write a second seq 1.
        """
        self._known(run, 1, Ledger())

    def forget(self, run: str) -> None:
        """Forget ``run``'s next number, so that its next append asks the database.

        For a writer that lets a run go (a worker releasing a waiting run):
        others may write it meanwhile, and a long-lived journal should not
        keep one number per run it ever released.
        """
        self._forget(run)
        self._unlose(run)

    # ------------------------------------------------------------ appending

    def _now(self) -> int:
        """The database's clock in microseconds (see the class doc), or the given clock."""
        if self._clock is not None:
            return self._clock()
        mono = time.monotonic_ns() // 1000
        if self._synced_at_us is None or mono - self._synced_at_us > CLOCK_RESYNC_S * 1_000_000:
            before = time.monotonic_ns() // 1000
            db_now = _int_of(self._conn.execute(self._db_clock).fetchone())
            mono = time.monotonic_ns() // 1000
            self._offset_us = db_now - (before + mono) // 2
            self._synced_at_us = mono
        now = max(self._last_time, mono + self._offset_us)
        self._last_time = now
        return now

    def append(self, run: str, change: Change) -> int:
        """Write one record and return its sequence number in its run (see the class doc).

        Raises `UnencodableRecord` (nothing written) for a value JSON cannot
        carry, or a run id, workflow name or domain state PostgreSQL text
        cannot hold (a NUL, a lone surrogate: `untextable`), and its subclass `RecordTooLarge` (nothing written) for a
        record longer than `MAX_RECORD_BYTES`, the file store's limit, so that
        every row exports to a readable log; `LeaseLost` when the writer's
        lease does not match, and `PgWriteFailed` when the database fails.
        """
        return self._write(run, (change,))

    def append_all(self, run: str, changes: Sequence[Change]) -> int:
        """Write several records of one run in one statement, all or none; return the last one's number.

        What `append` does for each, in order, at the cost of one: the
        executor hands over records it writes back to back (an attempt's
        creation and admission, a step's result and its end). The records
        share one ``time_us``, read once for the call, as the file store's
        do. Commits synchronously if any of them must. Every record is encoded before
        anything is sent: one that `append` would refuse (`UnencodableRecord`,
        `RecordTooLarge`) writes none of them.
        """
        if not changes:
            raise ValueError("append_all needs at least one change")
        return self._write(run, changes)

    def append_and_complete(self, run: str, changes: Sequence[Change], *, outcome: str) -> int:
        """Write a leased run's last records and close its ``runs`` row, in one statement.

        For the driver of a leased run (a worker): ``changes`` (its last
        records, the run's ``RunFinished`` last) and the row's close
        (``done``, ``outcome``, ``finished_at``) commit together,
        synchronously, or not at all: a run's end written this way never
        comes apart from its row's close.
        Returns the last record's number; raises `LeaseLost` (nothing
        written) when the run's row does not name this lease, and
        `ValueError` (nothing written) for records whose last is not a
        ``RunFinished`` and for a journal opened without a lease.
        """
        self._check_closing(changes)
        return self._write(run, changes, outcome)

    def _check_closing(self, changes: Sequence[Change]) -> None:
        if not changes or not isinstance(changes[-1], RunFinished):
            raise ValueError(
                f"append_and_complete closes a run's row with the run's end: its records must end"
                f" with the run's RunFinished (got {[type(c).__name__ for c in changes]})"
            )
        if self._leases is None and self.lease is None:
            raise ValueError(
                "append_and_complete closes a leased run's row; this journal was opened without a lease"
            )

    def _write(self, run: str, changes: Sequence[Change], outcome: str | None = None) -> int:
        if self._writer is not None:
            # The writer runs: every write goes through it, so that each
            # run's records stay in order; this caller waits as it did.
            last = self._hand_over(run, changes, outcome)
            self.settle(run)
            return last
        job = self._prepare(run, changes, outcome)
        try:
            statement, params = self._statement_of(job, self._conn, sync=job.sync)
            cursor = self._cursor.execute(statement, params)
            written = _int_of(cursor.fetchone()) if job.summary else cursor.rowcount
        except psycopg.Error as error:
            self._forget(run)
            self._broken = f"append of record {job.numbers()} of run {run!r} failed: {_reason(error)}"
            self._broken_by = error
            raise PgWriteFailed(
                f"{self._broken}; whether it was committed is unknown until the journal is read again"
            ) from error
        except BaseException:
            self._forget(run)  # the fold may hold records that were not written
            raise
        if written != job.count:
            self._forget(run)
            raise LeaseLost(run, job.lease)
        # A synchronous commit flushes the WAL up to it: every earlier append too.
        self._unflushed = not job.sync
        self._sync_commits += job.sync
        return job.last

    def _prepare(self, run: str, changes: Sequence[Change], outcome: str | None) -> _Job:
        """Check, number and encode ``changes`` into a job that writes them (nothing is sent).

        Raises at once, handing nothing over: `PgWriteFailed` (the journal
        is broken), `LeaseLost` (no lease on the run), `UnencodableRecord`
        and `RecordTooLarge`. The run's next number, fold and summary move
        on here; whoever fails to write the job forgets the run.
        """
        if self._broken is not None:
            raise PgWriteFailed(
                f"the journal failed earlier ({self._broken}); open it again before appending"
            ) from self._broken_by
        refuse_untextable(run, changes)
        leases = self._leases
        lease = self.lease if leases is None else leases.get(run)
        if leases is not None and lease is None:
            raise LeaseLost(run, None)
        sync = outcome is not None or any(commits_synchronously(change) for change in changes)
        first = self._next.get(run, 0)
        applied = False
        try:
            fold = self._folds.get(run)
            if first == 0 or fold is None:
                if self._writer is not None and run in self._last_ticket:
                    # The run's records handed over before it was forgotten
                    # are written before it is read again (the caller's
                    # thread waits, as a synchronous append would).
                    self._wait(run, self._last_ticket[run], 0)
                # What the run holds so far: its next number, and the fold its summary comes from.
                numbering = _Numbering(self._per_run_after, journal=False)
                fold = Ledger()
                try:
                    fold.feed(
                        self._rows(self._conn, self._read_run, (run,), f"run {run!r}", numbering, by_pos=False)
                    )
                except PgJournalError as error:  # the connection failed, as an append's would
                    self._broken = f"reading run {run!r} before appending to it failed: {error}"
                    self._broken_by = error
                    raise PgWriteFailed(f"{self._broken}; nothing was written") from error
                first = numbering.last.get(run, 0) + 1
                self._known(run, first, fold)
            # Client clocks skew: by default the database's clock stamps records.
            # Records written in one go share one time, as in the file store.
            at = self._now()
            lines = [encode_record(first + i, at, run, change) for i, change in enumerate(changes)]
            # The fold takes the records before they are sent; were they not
            # written, the run is forgotten (read again at its next append).
            applied = True
            for change in changes:
                number = fold.records + 1
                fold.apply(Record(line=number, seq=number, time_us=at, run=run, change=change))
            summary = summary_of(fold, run)
            summarized = summary is not None and summary != self._summaries.get(run)
            extra = () if summary is None or not summarized else (run, *summary.values())
            rows = tuple(value for i, line in enumerate(lines) for value in (first + i, line))
        except psycopg.Error as error:  # the database's clock could not be read
            self._forget(run)
            self._broken = f"append to run {run!r} failed: {_reason(error)}"
            self._broken_by = error
            raise PgWriteFailed(f"{self._broken}; nothing was written") from error
        except BaseException:
            if applied:  # the fold holds records that are not written: read the run again next time
                self._forget(run)
            raise
        last = first + len(lines) - 1
        if isinstance(changes[-1], RunFinished):
            self._forget(run)  # a finished run takes no more records: forget it
        else:
            self._next[run] = last + 1
            self._summaries[run] = summary
        return _Job(
            run=run, rows=rows, summary=extra, outcome=outcome if lease is not None else None,
            lease=lease, sync=sync, first=first, last=last,
        )  # fmt: skip

    def _statement_of(
        self, job: _Job, conn: psycopg.Connection[TupleRow], *, sync: bool
    ) -> tuple[bytes, tuple[object, ...]]:
        """The statement that writes ``job``, and its parameters (composed for ``conn``).

        ``sync``: it commits synchronously (a closing always does). In a
        group of several statements, none does: the group's one
        synchronous commit comes last.
        """
        run, lease, count, summarized = job.run, job.lease, job.count, bool(job.summary)
        if job.outcome is not None and lease is not None:
            closing = self._insert_closing(count, summarized, conn)
            return closing, (job.outcome, run, lease.owner, lease.fence, *job.rows, *job.summary)
        mode = "on" if sync else "off"
        fence = () if lease is None else (run, lease.owner, lease.fence)
        insert = self._insert(count, lease is not None, summarized, conn)
        return insert, (run, *job.rows, mode, *fence, *job.summary)

    # ------------------------------------------------------------ the writer thread

    def hand_over(self, run: str, changes: Sequence[Change], *, outcome: str | None = None) -> int:
        """Queue ``changes`` for the journal's writer thread and return the last one's number at once.

        The asynchronous path (a worker's executors take it; see the class
        doc). What `append_all` (or, with ``outcome``,
        `append_and_complete`) checks is checked here, before anything is
        queued: `UnencodableRecord`, `RecordTooLarge`, `PgWriteFailed` for
        a broken journal, and `LeaseLost` for a run with no lease, or one
        whose lease a write of this journal found lost (none of its later
        records is written). `committed` awaits the write. The first call
        starts the writer thread and its connection; `close` ends them.
        """
        if not changes:
            raise ValueError("hand_over needs at least one change")
        if outcome is not None:
            self._check_closing(changes)
        return self._hand_over(run, changes, outcome)

    def _hand_over(self, run: str, changes: Sequence[Change], outcome: str | None) -> int:
        with self._cond:
            lost = self._lost.get(run, _NOT_LOST)
        if lost is not _NOT_LOST:
            self._forget(run)
            raise LeaseLost(run, lost)
        if self._writer is None:
            self._start_writer()
        job = self._prepare(run, changes, outcome)
        with self._cond:
            # The run's job still queued takes these records too (one
            # statement for the run in the group, not one per hand-over),
            # under its ticket: its records come first, and nothing of
            # the run is written in between.
            at = self._queued.get(run)
            queued = None if at is None else self._queue[at]
            if queued is not None and at is not None and queued[1].takes(job):
                ticket = queued[0]
                job = queued[1].merged(job)
                self._queue[at] = (ticket, job)
            else:
                self._tickets += 1
                ticket = self._tickets
                self._queued[run] = len(self._queue)
                self._queue.append((ticket, job))
            self._cond.notify_all()
        self._last_ticket[run] = ticket
        if job.sync:
            self._sync_ticket[run] = ticket
        return job.last

    async def committed(self, run: str) -> None:
        """Return once every record of ``run`` handed over is committed, and durable where it must be.

        Durable (it survives a crash of the machine) when one of them
        commits synchronously (`commits_synchronously`, and a run's
        closing), as `append` would have returned; committed otherwise.
        Concurrent runs waiting here share the writer's groups: one
        synchronous commit covers them all. Raises `LeaseLost` when a
        write of the run found its lease lost (the other runs' records are
        written), `PgWriteFailed` (from the database's error) when the
        database failed: then every waiter fails and the journal is broken.
        """
        ticket = self._last_ticket.get(run)
        if ticket is None:
            self._refuse_if_failed(run)
            return
        wants = self._sync_ticket.get(run, 0)
        loop = asyncio.get_running_loop()
        with self._cond:
            error = self._failure_of(run)
            future: asyncio.Future[None] | None = None
            if error is None and not (ticket <= self._written and wants <= self._durable):
                future = loop.create_future()
                self._waiters.append(_Waiter(run=run, ticket=ticket, wants=wants, future=future, loop=loop))
                self._cond.notify_all()
        try:
            if error is not None:
                raise error
            if future is not None:
                await future
        except (LeaseLost, PgWriteFailed):
            self._forget(run)
            raise
        if run not in self._next and self._last_ticket.get(run) == ticket:
            del self._last_ticket[run]  # the run is finished or forgotten: nothing more to wait for
            self._sync_ticket.pop(run, None)

    def settle(self, run: str) -> None:
        """`committed`, blocking this thread: for a caller that is not a coroutine (the synchronous wrappers)."""
        ticket = self._last_ticket.get(run)
        if ticket is None:
            self._refuse_if_failed(run)
            return
        self._wait(run, ticket, self._sync_ticket.get(run, 0))
        if run not in self._next and self._last_ticket.get(run) == ticket:
            del self._last_ticket[run]
            self._sync_ticket.pop(run, None)

    @property
    def synchronous_commits(self) -> int:
        """How many synchronous commits this journal's appends and flushes made so far (for benchmarks and tests)."""
        with self._cond:
            return self._sync_commits

    def _refuse_if_failed(self, run: str) -> None:
        with self._cond:
            error = self._failure_of(run)
        if error is not None:
            self._forget(run)
            raise error

    def _failure_of(self, run: str | None) -> PgJournalError | None:
        """What a waiter for ``run`` (None: every run) raises now, or None (call with the lock held)."""
        if run is not None:
            lost = self._lost.get(run, _NOT_LOST)
            if lost is not _NOT_LOST:
                return LeaseLost(run, lost)
        if self._broken is not None:
            failed = PgWriteFailed(
                f"{self._broken}; whether it was committed is unknown until the journal is read again"
            )
            failed.__cause__ = self._broken_by
            return failed
        return None

    def _wait(self, run: str | None, ticket: int, wants: int) -> None:
        """Block this thread until ``ticket`` is written and ``wants`` durable (the synchronous wrappers)."""
        with self._cond:
            waiter: _Waiter | None = None
            try:
                while True:
                    error = self._failure_of(run)
                    if error is not None:
                        if run is not None:
                            self._forget(run)
                        raise error
                    if ticket <= self._written and wants <= self._durable:
                        return
                    if waiter is None:
                        waiter = _Waiter(run=run, ticket=ticket, wants=wants, future=None, loop=None)
                        self._waiters.append(waiter)
                        self._cond.notify_all()
                    self._cond.wait()
            finally:
                if waiter is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _start_writer(self) -> None:
        try:
            conn = connect(self._url, connect_timeout=self._connect_timeout)
        except PgConnectFailed as error:
            self._broken = f"connecting the journal's writer failed: {error}"
            self._broken_by = error
            raise PgWriteFailed(f"{self._broken}; nothing was written") from error
        with self._cond:
            # What the direct path left unflushed is ticket 1: written, not durable.
            self._written = self._tickets = 1 if self._unflushed else 0
            self._durable = 0
        self._writer = threading.Thread(
            target=self._writer_loop, args=(conn,), name=f"attempt-kernel journal writer ({self.schema})",
            daemon=True,
        )
        self._writer.start()

    def _writer_loop(self, conn: psycopg.Connection[TupleRow]) -> None:
        """The writer thread: take what is queued, write it as one transaction, release who it covers.

        A group is one transaction in one round trip (`_write_group`):
        every job's statement, fenced as a direct append's is, and, if a
        job or a waiter needs durability, one synchronous commit for the
        whole group. A statement that finds its
        run's lease lost inserts nothing (the statement's own check) and
        the others commit; the run is marked lost, so its later jobs are
        dropped here and its later appends refused. A database error
        rolls the group back and breaks the journal: every waiter fails.
        """
        cond = self._cond
        try:
            while True:
                hook = self._writer_hook
                if hook is not None:
                    hook()
                with cond:
                    while not (self._queue or self._closing or self._flush_due()):
                        cond.wait()
                    batch, self._queue = self._queue, []
                    self._queued.clear()
                    top = batch[-1][0] if batch else self._tickets if self._closing else self._written
                    lost = set(self._lost)
                    want_sync = (
                        any(job.sync for _, job in batch)
                        or any(w.wants > self._durable and w.ticket <= top for w in self._waiters)
                        or (self._closing and self._durable < top)
                    )
                    if not batch and not want_sync:
                        if self._closing:
                            return
                        top = self._written  # nothing to do after all (woken for a waiter it covers)
                jobs = [job for _, job in batch if job.run not in lost]  # a lost run's later records: dropped
                found, synced = self._write_group(conn, jobs, want_sync)
                with cond:
                    for run, lease in found.items():
                        self._lost.setdefault(run, lease)
                    self._written = max(self._written, top)
                    if synced:
                        self._durable = self._written
                        self._sync_commits += 1
                    self._release()
        except Exception as error:  # noqa: BLE001  # every waiter is told, and the journal breaks
            with cond:
                reason = _reason(error) if isinstance(error, psycopg.Error) else repr(error)
                self._broken = f"a group append failed: {reason}"
                self._broken_by = error
                self._queue.clear()
                self._queued.clear()
                self._release()
        finally:
            conn.close()

    def _write_group(
        self, conn: psycopg.Connection[TupleRow], jobs: list[_Job], sync: bool
    ) -> tuple[dict[str, Lease | None], bool]:
        """Send ``jobs`` as one transaction, synchronously committed if ``sync``.

        Returns the runs whose lease a statement found lost (with the lease
        it carried), and whether the commit was synchronous: a statement
        that wrote nothing (a lost lease) commits nothing, so it makes
        nothing durable. One job alone is one plain statement (one round
        trip, as a direct append); several go in psycopg's pipeline mode
        (one round trip too; one implicit transaction in autocommit mode),
        then, with ``sync``, the flush statement, whose setting makes the
        transaction's commit synchronous.
        """
        found: dict[str, Lease | None] = {}
        if len(jobs) == 1:
            job = jobs[0]
            with conn.cursor() as cursor:
                cursor.execute(*self._statement_of(job, conn, sync=sync))
                written = _int_of(cursor.fetchone()) if job.summary else cursor.rowcount
            if written != job.count:
                found[job.run] = job.lease
                return found, False
            return found, sync or job.outcome is not None
        sent: list[tuple[_Job, psycopg.Cursor[TupleRow]]] = []
        try:
            failure: psycopg.Error | None = None
            with conn.pipeline():
                # An error raised through the pipeline's end makes psycopg
                # log a second one (its sync fails too, on a lost
                # connection): the end raises it instead.
                try:
                    for job in jobs:
                        cursor = conn.cursor()
                        cursor.execute(*self._statement_of(job, conn, sync=False))
                        sent.append((job, cursor))
                    if sync:
                        conn.execute(self._flush_statement)
                except psycopg.Error as error:
                    failure = error
            if failure is not None:
                raise failure
            for job, cursor in sent:
                written = _int_of(cursor.fetchone()) if job.summary else cursor.rowcount
                if written != job.count:
                    found.setdefault(job.run, job.lease)
        finally:
            for _, cursor in sent:
                cursor.close()
        return found, sync

    def _flush_due(self) -> bool:
        """Whether a waiter needs a synchronous commit of what is written already (the lock held)."""
        return any(w.ticket <= self._written and w.wants > self._durable for w in self._waiters)

    def _release(self) -> None:
        """Release every waiter the writer's progress covers or its failure fails (the lock held)."""
        keep: list[_Waiter] = []
        for waiter in self._waiters:
            error = self._failure_of(waiter.run)
            if error is None and not (waiter.ticket <= self._written and waiter.wants <= self._durable):
                keep.append(waiter)
            elif waiter.future is not None and waiter.loop is not None:
                try:
                    waiter.loop.call_soon_threadsafe(_settle, waiter.future, error)
                except RuntimeError:
                    pass  # its loop is closed: no one waits any more
        self._waiters[:] = keep
        self._cond.notify_all()  # the synchronous wrappers look for themselves

    def _insert(
        self, count: int, fenced: bool, summarized: bool, conn: psycopg.Connection[TupleRow]
    ) -> bytes:
        """The statement that inserts ``count`` rows of one run, in order (made once per shape).

        One statement, its own transaction: set_config(..., true) sets
        synchronous_commit for its commit only. Rows come as VALUES, so that
        nothing is adapted as an array. Fenced, the lease check and the write
        are one statement (docs/contracts.md, "Fenced appends"): FOR SHARE
        makes a takeover's update of the runs row wait for this commit, or this
        append see the new owner and fence. ``summarized``: the run's summary
        changes, and the same statement upserts it (`summary_upsert_after`).
        """
        statement = self._inserts.get((count, fenced, summarized))
        if statement is None:
            text = (
                "INSERT INTO {s}.records (run, seq, line) SELECT %s, v.n, v.l FROM " + _rows(count)
                + " WHERE set_config('synchronous_commit', %s, true) IS NOT NULL"
            )
            if fenced:
                text += (
                    " AND EXISTS (SELECT 1 FROM {s}.runs"
                    " WHERE run = %s AND owner = %s AND fence = %s FOR SHARE)"
                )
            text += " ORDER BY v.n"
            statement = self._composed(summary_upsert_after(text) if summarized else text, conn)
            self._inserts[(count, fenced, summarized)] = statement
        return statement

    def _composed(self, text: LiteralString, conn: psycopg.Connection[TupleRow]) -> bytes:
        """``text`` for this journal's schema, as bytes (composed once per statement, for the
        connection that sends it: the writer thread never touches the caller's)."""
        return sql.SQL(text).format(s=sql.Identifier(self.schema)).as_bytes(conn)

    def _insert_closing(
        self, count: int, summarized: bool = False, conn: psycopg.Connection[TupleRow] | None = None
    ) -> bytes:
        """`append_and_complete`'s statement for ``count`` rows (made once per shape).

        The fenced update of the run's row comes first (a data-modifying
        ``WITH``, run exactly once); the rows are inserted only if it closed
        the row: the lease check, the close and the write are one statement,
        and so is the upsert of the run's summary when it changes.
        """
        statement = self._closings.get((count, summarized))
        if statement is None:
            closing: LiteralString = (
                "WITH closed AS (UPDATE {s}.runs SET done = true, outcome = %s, finished_at = now()"
                " WHERE run = %s AND owner = %s AND fence = %s"
                " AND set_config('synchronous_commit', 'on', true) IS NOT NULL RETURNING run)"
            )
            insert: LiteralString = (
                "INSERT INTO {s}.records (run, seq, line) SELECT closed.run, v.n, v.l"
                " FROM closed, " + _rows(count) + " ORDER BY v.n"
            )
            if summarized:
                text = (
                    closing + ", ins AS (" + insert + " RETURNING pos), summ AS ("
                    + _SUMMARY_UPSERT + ") SELECT count(*) FROM ins"
                )
            else:
                text = closing + " " + insert
            statement = self._composed(text, self._conn if conn is None else conn)
            self._closings[(count, summarized)] = statement
        return statement

    def flush(self) -> None:
        """Make every returned append durable (a synchronous commit that writes WAL).

        Any commit flushes the WAL up to itself; a transactional logical
        message is the smallest write that makes a commit wait for the disk,
        and it touches no table another writer holds. One statement.
        """
        if self._writer is not None:
            with self._cond:
                ticket = self._tickets
            self._wait(None, ticket, ticket)
            return
        if not self._unflushed:
            return
        if self._broken is not None:
            raise PgWriteFailed(f"the journal failed earlier ({self._broken})") from self._broken_by
        try:
            self._conn.execute(self._flush_statement)
        except psycopg.Error as error:
            self._broken = f"flush failed: {_reason(error)}"
            self._broken_by = error
            raise PgWriteFailed(self._broken) from error
        self._unflushed = False
        self._sync_commits += 1

    # ------------------------------------------------------------ the inbox

    def take_in(self, runs: Collection[str], deliver: Callable[[str, Delivery], str | None]) -> list[str]:
        """Hand what operators left in the journal's inbox for ``runs`` to ``deliver``; say what was done.

        For a process that drives runs outside a worker, holding each one
        (``attempt-kernel run URL`` and ``recover URL`` do): an operator's
        change to a held run is not written into its records, which this
        process numbers, but waits in the ``inbox`` table. `drive_jobs` (so
        `run_jobs` and `resume_log`) calls this about every `INBOX_POLL`
        seconds with the runs it drives and `Executor.deliver`, and once
        more as they end. Each row is deleted once its change is recorded
        or refused (``deliver`` says why); a row whose record could not be
        written stays for the next look. A database error is said (once,
        until a look works again), never raised: the rows wait for the next
        look, or for the next process that drives the run. One line per
        row handled (see `hand_in`), on this journal's own connection.
        """
        said: list[str] = []
        try:
            mail = self._mail
            if mail is None or mail.closed:
                mail = self._mail = connect(self._url, connect_timeout=self._connect_timeout)
            hand_in(mail, self.schema, dict.fromkeys(runs, deliver), said.append)
        except (psycopg.Error, PgJournalError) as error:
            if self._mail is not None:
                self._mail.close()
                self._mail = None
            reason = _reason(error) if isinstance(error, psycopg.Error) else str(error)
            if not self._mail_failed:
                said.append(f"the journal's inbox was not taken in (tried again every look): {reason}")
            self._mail_failed = True
        else:
            self._mail_failed = False
        return said

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Flush (if the journal is healthy) and close the connections. Idempotent."""
        if self._reader is not None:
            self._reader.close()
        if self._mail is not None:
            self._mail.close()
        writer = self._writer
        if writer is not None:
            # The writer writes what is queued, flushes, and ends (its connection too).
            with self._cond:
                healthy = self._broken is None
                self._closing = True
                self._cond.notify_all()
            writer.join()
            self._conn.close()
            if healthy and self._broken is not None:
                raise PgWriteFailed(f"flush failed: {self._broken}") from self._broken_by
            return
        if self._conn.closed:
            return
        try:
            if self._broken is None:
                self.flush()
        finally:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PgJournal(schema={self.schema!r})"


MERGED_ROWS: Final = 16
"""The most records one queued job of a run takes (`_Job.takes`): each count is a statement shape, prepared once."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
    """One run's records made ready to send, numbered ``first`` to ``last``, and under which lease."""

    run: str
    rows: tuple[object, ...]
    """(seq, line) of each record, flat: the statement's VALUES."""
    summary: tuple[object, ...]
    """The run's summary row to upsert with them (`RunSummary.values` after the run), or () when unchanged."""
    outcome: str | None
    """The run's outcome, for the records that end a leased run and close its row."""
    lease: Lease | None
    sync: bool
    """It must be durable before its caller goes on (`commits_synchronously`, a closing)."""
    first: int
    last: int

    @property
    def count(self) -> int:
        """How many rows it must insert (fewer: the lease is lost)."""
        return self.last - self.first + 1

    def numbers(self) -> str:
        return f"seq {self.first or '?'}" if self.first == self.last else f"seq {self.first}-{self.last}"

    def takes(self, later: _Job) -> bool:
        """Whether ``later`` (the run's next records) can go in this job's statement."""
        return (
            self.outcome is None
            and later.lease == self.lease
            and later.first == self.last + 1
            and later.last - self.first < MERGED_ROWS
        )

    def merged(self, later: _Job) -> _Job:
        """This job and ``later`` as one: all the rows, the latest summary, the closing if ``later`` closes."""
        return _Job(
            run=self.run, rows=self.rows + later.rows, summary=later.summary or self.summary,
            outcome=later.outcome, lease=self.lease, sync=self.sync or later.sync,
            first=self.first, last=later.last,
        )  # fmt: skip


@final
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _Waiter:
    """Someone waiting for the writer: until ``ticket`` is written and ``wants`` durable.

    ``future`` (on ``loop``) for `PgJournal.committed`; None for a thread
    that waits on the journal's condition (the synchronous wrappers).
    """

    run: str | None
    ticket: int
    wants: int
    future: asyncio.Future[None] | None
    loop: asyncio.AbstractEventLoop | None


_NOT_LOST: Final = Lease(owner="", fence=-1)
"""The answer of ``PgJournal._lost.get`` for a run whose lease no group found lost."""


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    """Release ``future`` on its loop (the writer thread calls this through ``call_soon_threadsafe``)."""
    if future.done():  # its waiter was cancelled (an executor stopped)
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _rows(count: int) -> LiteralString:
    """``count`` rows of (seq, line) parameters, as the VALUES list ``v(n, l)`` (nothing is adapted as an array)."""
    return "(VALUES (%s::bigint, %s::bytea)" + ", (%s, %s)" * (count - 1) + ") AS v(n, l)"


def _reason(error: psycopg.Error) -> str:
    return "; ".join(part.strip() for part in str(error).splitlines() if part.strip()) or type(
        error
    ).__name__



# What a stored status may be filtered by in SQL directly; ``running`` and
# ``interrupted`` need the leases (`_listing`), ``queued`` the runs table.
_STORED: Final = ("waiting", "succeeded", "failed", "cancelled", "needs-reconciliation")
_HELD: Final[LiteralString] = (
    "EXISTS (SELECT 1 FROM {s}.runs r JOIN {s}.workers w ON w.id = r.owner"
    " WHERE r.run = m.run AND NOT r.done AND NOT w.dead)"
)

# A ``runs`` row (as q) that no live worker holds: a worker that claimed a
# queued run and wrote nothing yet drives it (its first record is coming).
_UNCLAIMED: Final[LiteralString] = (
    "(q.owner IS NULL OR q.owner IN (SELECT id FROM {s}.workers WHERE dead))"
)


def _listing(only: RunFilter) -> tuple[LiteralString, list[object]]:
    """The query `PgJournal.listed` runs for ``only``, and its parameters.

    Two parts, each filtered where its index can serve it: runs with
    records (their summaries; ``running`` is an ``interrupted`` summary
    that a live worker holds, as `held_runs` says), and queued runs (a
    ``runs`` row not done, no summary: no record yet).
    """
    statuses = only.statuses
    params: list[object] = []
    parts: list[LiteralString] = []
    newest: LiteralString = " ORDER BY started_us DESC NULLS LAST, ord DESC NULLS LAST, run DESC"
    if statuses is None or any(status != "queued" for status in statuses):
        where: list[LiteralString] = []
        if statuses is not None:
            either: list[LiteralString] = []
            stored = [status for status in _STORED if status in statuses]
            if stored:
                either.append("m.status = ANY(%s)")
                params.append(stored)
            if "running" in statuses:
                either.append("(m.status = 'interrupted' AND NOT m.finished AND " + _HELD + ")")
            if "interrupted" in statuses:
                either.append("(m.status = 'interrupted' AND (m.finished OR NOT " + _HELD + "))")
            where.append("(" + " OR ".join(either) + ")")
        if only.workflow is not None:
            where.append("m.workflow = %s")
            params.append(only.workflow)
        if only.since_us is not None:
            where.append("m.started_us >= %s")
            params.append(only.since_us)
        if only.until_us is not None:
            where.append("m.started_us < %s")
            params.append(only.until_us)
        part: LiteralString = (
            "SELECT m.run, m.workflow, CASE WHEN m.status = 'interrupted' AND NOT m.finished AND "
            + _HELD + " THEN 'running' ELSE m.status END AS status, m.attempts,"
            " m.started_us, m.ended_us, m.domain_state, m.waiting_on, m.cancel_requested, m.first_pos AS ord"
            " FROM {s}.summaries m"
        )
        if where:
            part += " WHERE " + " AND ".join(where)
        if only.limit is not None:
            # The index order (status, started_us DESC NULLS LAST, first_pos DESC).
            part += " ORDER BY m.started_us DESC NULLS LAST, m.first_pos DESC LIMIT %s"
            params.append(only.limit)
        parts.append(part)
    if statuses is None or "queued" in statuses:
        submitted: LiteralString = "(extract(epoch FROM q.submitted_at) * 1000000)::bigint"
        part = (
            "SELECT q.run, q.workflow, 'queued'::text AS status, 0 AS attempts, " + submitted
            + " AS started_us, NULL::bigint AS ended_us, NULL::text AS domain_state,"
            " '[]'::text AS waiting_on, false AS cancel_requested, NULL::bigint AS ord"
            " FROM {s}.runs q WHERE NOT q.done"
            " AND NOT EXISTS (SELECT 1 FROM {s}.summaries s WHERE s.run = q.run)"
            " AND " + _UNCLAIMED
        )
        if only.workflow is not None:
            part += " AND q.workflow = %s"
            params.append(only.workflow)
        if only.since_us is not None:
            part += " AND " + submitted + " >= %s"
            params.append(only.since_us)
        if only.until_us is not None:
            part += " AND " + submitted + " < %s"
            params.append(only.until_us)
        if only.limit is not None:
            part += " ORDER BY " + submitted + " DESC, q.run DESC LIMIT %s"
            params.append(only.limit)
        parts.append(part)
    query: LiteralString
    if len(parts) > 1:
        query = "SELECT * FROM ((" + ") UNION ALL (".join(parts) + ")) AS listed"
    else:
        query = "SELECT * FROM (" + parts[0] + ") AS listed"
    if only.limit is None:
        query += " ORDER BY ord NULLS LAST, started_us, run"
    else:
        query += newest + " LIMIT %s"
        params.append(only.limit)
    return query, params


def _listed_row(row: tuple[object, ...]) -> RunRow:
    """A row of `_listing`'s query as `attempt-kernel runs` prints it (`RunRow.of`'s rules)."""
    run, workflow, status_text, attempts, started, ended, domain_state, waiting_on, cancel_requested, _ = row
    status = listed_status(str(status_text))
    if (
        type(run) is not str
        or (workflow is not None and type(workflow) is not str)
        or status is None
        or type(attempts) is not int
        or (started is not None and type(started) is not int)
        or (ended is not None and type(ended) is not int)
        or (domain_state is not None and type(domain_state) is not str)
        or type(waiting_on) is not str
        or type(cancel_requested) is not bool
    ):
        raise PgJournalError(f"the summaries table answered an unexpected row {row!r}")
    # [signal, wake_us] in rows written before a wait said whether its signal came
    try:
        waits: object = json.loads(waiting_on)
    except ValueError:
        waits = None
    if type(waits) is not list:
        raise PgJournalError(f"the summaries table answered an unexpected row {row!r}")
    now_us = time.time_ns() // 1000
    return RunRow(
        run=run,
        workflow=workflow,
        status=status,
        attempts=attempts,
        started_us=started,
        # a reconciled run waiting for recovery has not ended yet
        ended_us=None if status == "interrupted" else ended,
        domain_state=domain_state,
        waiting_on=tuple(listed_wait(wait, now_us) for wait in cast("list[object]", waits))
        if status == "waiting"
        else (),
        cancel_requested=status == "waiting" and cancel_requested,
    )


def listed_wait(wait: object, now_us: int) -> WaitOn:
    """One wait of a summary's ``waiting_on`` (see `RunSummary.values`); any other
    shape is a `PgJournalError`."""
    fields = cast("list[object]", wait) if type(wait) is list else []
    if not 2 <= len(fields) <= 3:
        raise PgJournalError(f"the summaries table holds an unexpected wait {wait!r}")
    signal, wake, *came = fields
    if not (
        (signal is None or type(signal) is str)
        and (wake is None or type(wake) is int)
        and came in ([], [True], [False])
    ):
        raise PgJournalError(f"the summaries table holds an unexpected wait {wait!r}")
    return WaitOn.at(signal, wake, signal_came=came == [True], now_us=now_us)


def held_runs(url: str, *, schema: str = DEFAULT_SCHEMA) -> frozenset[str]:
    """Runs a live worker holds right now (not done, its owner not found dead).

    What `attempt-kernel runs` and `show` call ``running`` on a PostgreSQL
    journal; an unfinished run nobody holds is ``interrupted``.
    """
    if not _IDENTIFIER.fullmatch(schema):
        raise ValueError(f"schema must be a lower-case SQL identifier, got {schema!r}")
    with connect(url) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT r.run FROM {s}.runs r JOIN {s}.workers w ON w.id = r.owner"
                " WHERE NOT r.done AND NOT w.dead"
            ).format(s=sql.Identifier(schema))
        ).fetchall()
    return frozenset(str(row[0]) for row in rows)


# The inbox rows of some runs (one query for all of them), and the rows taken in.
INBOX_OF: Final[LiteralString] = "SELECT id, run, line FROM {s}.inbox WHERE run = ANY(%s) ORDER BY id"
INBOX_TAKEN: Final[LiteralString] = "DELETE FROM {s}.inbox WHERE id = ANY(%s)"


def inbox_change(line: bytes) -> Delivery | str:
    """The change an ``inbox`` row holds, or why the row holds none (to drop it)."""
    item = decode_line(line, 1)
    if isinstance(item, CorruptLine):
        return f"an inbox row is unreadable: {item.reason}"
    assert isinstance(item, Record)
    change = item.change
    if isinstance(change, (SignalSent, RunCancelRequested, IntentReconciled)):
        return change
    return f"an inbox row holds {type(change).__name__}, which no operator delivers"


def hand_in(
    conn: psycopg.Connection[TupleRow],
    schema: str,
    deliverers: Mapping[str, Callable[[str, Delivery], str | None]],
    say: Callable[[str], None],
) -> None:
    """Hand what waits in the inbox for the runs of ``deliverers`` to each run's deliverer.

    One query for all of them, in the order sent. Rows are deleted after
    their changes were recorded (the deliverer returns None) or refused
    (it returns why: the run finished, the change was taken in already), so
    a crash in between takes them in again and `refusal` drops what was
    recorded already. A row whose record could not be written (the
    deliverer raises `PgJournalError` or `DispatchRefused`) stays for the
    run's next holder. ``say`` hears one line per row.
    """
    if not deliverers:
        return
    rows = conn.execute(in_schema(INBOX_OF, schema), (list(deliverers),)).fetchall()
    taken: list[int] = []
    for number, run, line in rows:
        if type(number) is not int or type(run) is not str or type(line) is not bytes:
            raise PgJournalError(f"the inbox table answered {(number, run, line)!r}")
        deliver = deliverers.get(run)
        if deliver is None:
            continue
        change = inbox_change(line)
        if isinstance(change, str):
            say(f"{run}: dropped an inbox entry: {change}")
            taken.append(number)
            continue
        try:
            why = deliver(run, change)
        except (PgJournalError, DispatchRefused) as error:
            say(f"{run}: an inbox entry waits for the run's next holder: {error}")
            continue
        if why is None:
            say(f"{run}: took in {type(change).__name__} from the inbox")
        else:
            say(f"{run}: dropped an inbox entry: {why}")
        taken.append(number)
    if taken:
        conn.execute(in_schema(INBOX_TAKEN, schema), (taken,))


def in_schema(text: LiteralString, schema: str) -> sql.Composed:
    """``text`` with ``{s}`` naming ``schema`` (quoted as an identifier)."""
    return sql.SQL(text).format(s=sql.Identifier(schema))


def hold_key(schema: str, run: str, *, purpose: str = "attempt-kernel") -> int:
    """The advisory-lock key of ``run`` in ``schema`` (`RunHolds`; another ``purpose``, another
    key, never the same text): the first 64 bits of SHA-256, as a signed bigint.

    `hold_key_sql` makes the same key in SQL (a worker's claim passes over the
    runs a process holds), so both hash the same bytes: `hold_key_head`, then
    the run id in UTF-8."""
    text = hold_key_head(schema, purpose=purpose) + run.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big", signed=True)


def hold_key_head(schema: str, *, purpose: str = "attempt-kernel") -> bytes:
    """What a hold key hashes before the run id (`hold_key`): the parameter ``%(hold)s``
    of `hold_key_sql`."""
    return f"{purpose}\0{schema}\0".encode()


def hold_key_sql(run: LiteralString) -> LiteralString:
    """`hold_key` in SQL, of the run id the expression ``run`` gives, with ``%(hold)s``
    bound to `hold_key_head`: SHA-256 is built into PostgreSQL (11 and later), so no
    extension is needed, and ``bit(64)::bigint`` reads the first 8 bytes as a signed
    bigint, as ``int.from_bytes(..., signed=True)`` does."""
    return (
        "('x' || encode(substr(sha256(%(hold)s::bytea || convert_to(" + run + ", 'UTF8')), 1, 8),"
        " 'hex'))::bit(64)::bigint"
    )


HELD_KEYS: Final[LiteralString] = (
    "ARRAY(SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks AS l"
    " WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.objsubid = 1"
    " AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()))"
)
"""The keys that processes hold for good, or wait to (`RunHolds` takes a run's key
exclusively; an operator's change only ever takes it shared): a bigint key shows in
``pg_locks`` as its high and low 32 bits. Compare `hold_key_sql` with it; a subquery,
so PostgreSQL reads ``pg_locks`` once per statement, and only once a row asks."""


CLAIMABLE_NOW: Final[LiteralString] = (
    "NOT done AND coalesce(wake_at, submitted_at) <= now()"
    " AND CASE WHEN owner IS NULL OR owner IN (SELECT id FROM {s}.workers WHERE dead)"
    "  THEN " + hold_key_sql("run") + " <> ALL (" + HELD_KEYS + ") ELSE false END"
)
"""A ``{s}.runs`` row that a worker's claim takes now (of any workflow): not done; due (queued,
signalled, or its wake time come); no owner, or one found dead; and not held by a process
(`RunHolds`: ``attempt-kernel run URL`` or ``recover URL`` drives it), whose key the look
at ``pg_locks`` (`HELD_KEYS`) finds held or waited for. The CASE keeps that look from the
rows live workers own. Over the row's own columns, unqualified, with ``%(hold)s`` bound to
`hold_key_head`: the claim (`Worker`) adds its workflows, and the queue-depth gauge
(``attempt_kernel_queue_depth``) counts these rows, so the two never disagree."""


def send_key(schema: str, run: str) -> int:
    """The advisory-lock key an operator's delivery to ``run`` holds for its transaction
    (`deliver_pg`): senders to a run go one at a time, and `RunHolds.let_go` waits
    for the one that found the run held."""
    return hold_key(schema, run, purpose="attempt-kernel-send")


# The hold key of the run id a statement is given (`_given_run`), as the server makes it.
_GIVEN_RUN_KEY: Final[LiteralString] = hold_key_sql("%(run)s::text")


def _given_run(schema: str, run: str) -> dict[str, object]:
    return {"hold": hold_key_head(schema), "run": run}


def held_by_a_process(conn: psycopg.Connection[Any], schema: str, run: str) -> bool:
    """Does a process outside the workers (``attempt-kernel run URL`` or ``recover URL``,
    `RunHolds`) hold ``run``? A shared try of the run's key: when none does, it stays
    taken until ``conn``'s transaction ends (at once in autocommit), so that no process
    takes the run up meanwhile (an operator's change is committed first)."""
    row = conn.execute(
        "SELECT NOT pg_try_advisory_xact_lock_shared(" + _GIVEN_RUN_KEY + ")", _given_run(schema, run)
    ).fetchone()
    return row == (True,)


def server_hold_key(conn: psycopg.Connection[Any], schema: str, run: str) -> int:
    """`hold_key` of ``run`` as the server makes it (`hold_key_sql`), from the run id as the
    database holds it: the key a worker's claim tries. In a UTF8 database it is
    `hold_key`'s; in another encoding, a character that does not come back to the
    same UTF-8 from it (a wave dash in EUC_JP) would make Python's key another one."""
    row = conn.execute("SELECT " + _GIVEN_RUN_KEY, _given_run(schema, run)).fetchone()
    assert row is not None
    key: int = row[0]
    return key


TAKE_WAIT: Final = 0.25
"""Seconds `RunHolds.take` waits for a run's key before it asks again whether a process holds it
for good (or only operators, each for a transaction)."""


@final
class RunHolds:
    """Runs this process drives outside a worker, held so that no other process drives them too.

    A worker holds its runs by lease (the ``runs`` row); a run that
    ``attempt-kernel run URL`` starts has no row, and ``recover URL`` resumes
    runs without taking one. Each holds the runs it drives here instead: a
    session-level advisory lock per run (``pg_advisory_lock`` on a key made
    from the schema and the run id, waiting out operators that hold it for a transaction), on a
    connection of its own. The
    locks go when `close` is called, and when the process dies (the server
    ends its session when the connection drops). So a second ``run`` of the
    same id, or a ``recover`` while a ``run`` (or another ``recover``) drives
    a run, finds the run held and leaves it alone, as the file log's lock
    makes a second writer wait; and a worker's claim passes over a held run
    (`Worker`), until it is let go. The locks last as long as the session: if
    its connection drops while the process goes on, `watch` says so, and
    the process must stop driving the runs.
    """

    def __init__(self, url: str, *, schema: str = DEFAULT_SCHEMA, take_wait: float = TAKE_WAIT) -> None:
        if not _IDENTIFIER.fullmatch(schema):
            raise ValueError(f"schema must be a lower-case SQL identifier, got {schema!r}")
        self._schema: Final = schema
        self._conn: Final = connect(url)
        self._conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{max(1, round(take_wait * 1000))}ms",))
        self.held: Final[set[str]] = set()
        self._keys: Final[dict[str, int]] = {}
        """Each run's key, as the server made it (`server_hold_key`), once asked."""
        self.by_workers: Final[set[str]] = set()
        """Runs `take` refused because a live worker had claimed them."""
        self._worker_owns: Final = sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {s}.runs r JOIN {s}.workers w ON w.id = r.owner"
            " WHERE r.run = %s AND NOT r.done AND NOT w.dead)"
        ).format(s=sql.Identifier(schema))
        # Held for good by another process, and by this session: a lock granted
        # just as its lock timeout fired stays held though the statement failed
        # (PostgreSQL grants a lock that came while the timeout was handled).
        self._held_for_good: Final = (
            "SELECT coalesce(bool_or(pid <> pg_backend_pid()), false),"
            " coalesce(bool_or(pid = pg_backend_pid()), false) FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted"
            " AND mode = 'ExclusiveLock' AND database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database()) AND classid = %s::oid AND objid = %s::oid"
            " AND objsubid = 1"
        )
        self._closing: Final = threading.Event()
        self._watcher: threading.Thread | None = None

    def watch(self, on_lost: Callable[[str], None], every: float = 1.0) -> None:
        """Check every ``every`` seconds, on a thread of its own, that this session is
        still there (its locks end with it: a dropped connection, a terminated backend).
        Once it is not, call ``on_lost`` once, with why, and stop checking; the caller
        stops driving the runs (another process may take them over from then on)."""

        def check() -> None:
            while not self._closing.wait(every):
                try:
                    self._conn.execute("SELECT 1")
                except psycopg.Error as error:
                    if not self._closing.is_set():
                        on_lost(" ".join(str(error).split()) or type(error).__name__)
                    return

        self._watcher = threading.Thread(target=check, name="run holds", daemon=True)
        self._watcher.start()

    def take(self, run: str) -> bool:
        """Hold ``run`` (True), or say that another process, or a live worker, drives it now (False).

        Waits for the key while only operators hold it: an operator sending a
        change to the run holds it, shared, for as long as its transaction
        lasts (`deliver_pg`), where a process that holds the run holds it
        exclusively, for good, and is answered at once. Every ``take_wait``
        seconds of waiting it asks again which it is (one such process may
        have come meanwhile). Raises `PgJournalError` when this session fails."""
        try:
            return self._take(run)
        except psycopg.Error as error:
            raise PgJournalError(f"holding run {run!r} failed: {_reason(error)}") from error

    def _take(self, run: str) -> bool:
        if run in self.held:
            return True  # taken once: a session lock taken twice would need two unlocks
        if untextable(run) is not None:
            # No process can write a run whose id the journal cannot hold (its first
            # append is refused, `refuse_untextable`): there is nothing to hold it against,
            # and the server could not even be asked for its key.
            return True
        key = self._keys.get(run)
        if key is None:
            key = self._keys[run] = server_hold_key(self._conn, self._schema, run)
        unsigned = key & 0xFFFF_FFFF_FFFF_FFFF  # pg_locks shows a bigint key as two oids
        oids = (str(unsigned >> 32), str(unsigned & 0xFFFF_FFFF))
        taken = self._conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
        while not taken:
            held = self._conn.execute(self._held_for_good, oids).fetchone()
            if held == (False, True):
                break  # granted as the wait timed out: held once, as if the wait had succeeded
            if held != (False, False):
                return False
            try:
                self._conn.execute("SELECT pg_advisory_lock(%s)", (key,))
                taken = True
            except psycopg.errors.LockNotAvailable:
                pass  # only operators held it all along (a slow one): ask again
        # Held, then asked whether a live worker claimed the run meanwhile: a worker's
        # claim tries the run's key, shared, in the statement that claims it (`Worker`),
        # and keeps it until that claim commits. So a claim that took the run came
        # before this hold and is seen here, and one that came after found the key
        # held and passed over the run: never do both drive it.
        try:
            row = self._conn.execute(self._worker_owns, (run,)).fetchone()
        except psycopg.errors.UndefinedTable:  # no queue in this schema: no worker either
            row = (False,)
        if row != (False,):
            self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            self.by_workers.add(run)
            return False
        self.held.add(run)
        return True

    def let_go(self, run: str) -> None:
        """Stop holding ``run`` (held or not): another process may take it up from now on,
        and an operator's change to it is written straight into the journal again.

        Returns once every operator who found the run held has committed: such a
        change goes to the inbox, and the sender holds the run's send key
        (`send_key`) from before it looks to its commit. So a read of the inbox
        after this sees each change sent while the run was held."""
        if run in self.held:
            self.held.discard(run)
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._keys[run],))
                with self._conn.transaction():
                    self._conn.execute("SET LOCAL lock_timeout = 0")  # a sender's transaction may be long
                    self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (send_key(self._schema, run),))
            except psycopg.Error as error:  # the session, and every lock of it, is gone
                raise PgJournalError(f"letting go of run {run!r} failed: {_reason(error)}") from error

    def close(self) -> None:
        """Let every run go: unlocked before the connection closes (the server ends a
        closed session a moment later, and a run would stay held until then)."""
        self._closing.set()
        try:
            if self.held and not self._conn.closed:
                self._conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            pass  # the connection is gone: so is its session, and every lock with it
        finally:
            self.held.clear()
            self._conn.close()
            if self._watcher is not None:
                self._watcher.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
