"""The PostgreSQL store: the run log as rows, behind the same seam as the file (spec §10).

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

Sequence numbers are journal-wide and gapless, as in a file: the ledger
requires that they go up by one across the whole journal (spec §5), so one
counter row (``head``) hands them out, and the append that takes a number
holds that row until it commits. Numbers therefore commit in order; a
rolled-back append gives its number back. Rows are keyed by (run, seq), so
one run's records are an index range; a unique ``seq`` orders the journal.

Durability (spec §10): a ``Dispatched`` intent change commits with
``synchronous_commit = on`` before `PgJournal.append` returns (the
write-ahead rule); every other append commits asynchronously, which
survives a crash of this process but not of the server until `flush`, or
any later synchronous commit, makes it durable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from typing_extensions import LiteralString, Self, assert_never, final

from ._codec import RunLogError, decode_line, encode_record
from ._intent import is_outstanding
from ._records import (
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
    StepResult,
)

PG_SCHEMA_VERSION: Final = 3
"""The newest version of the journal's tables this library knows; it refuses a newer one."""

DEFAULT_SCHEMA: Final = "attempt_kernel"
"""The PostgreSQL schema (namespace) that holds the journal's tables."""

READ_BATCH: Final = 1000
"""Rows fetched per query while reading (each query is short; no long transaction)."""

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

    A takeover raises the fence by one (spec §10); an append that carries
    an older fence, or another owner, writes nothing.
    """

    owner: str
    fence: int


# --------------------------------------------------------------------------
# Schema and migrations
# --------------------------------------------------------------------------

# Each migration moves the tables from version n - 1 to n; written once,
# never edited after release (add migration n + 1 instead). {s} is the schema.
_MIGRATIONS: Final[tuple[tuple[int, tuple[LiteralString, ...]], ...]] = (
    (
        1,
        (
            # One row: the last sequence number handed out (spec §4: gapless).
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
            # Who may write a run, checked by every fenced append (spec §10).
            "CREATE TABLE {s}.runs ("
            " run text PRIMARY KEY,"
            " owner text,"
            " fence bigint NOT NULL DEFAULT 0)",
        ),
    ),
    (
        2,
        (
            # The queue (spec §10): a submitted run waits with its workflow and
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
            # Admission across workers (spec §10): a pool is a name and a size;
            # its slots are rows, each held by at most one attempt (run, step,
            # attempt), taken by a worker under the run's fence. Claims lock a
            # free row FOR UPDATE SKIP LOCKED; nothing ever counts rows.
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
)
assert [v for v, _ in _MIGRATIONS] == list(range(1, PG_SCHEMA_VERSION + 1))


def _migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Bring the schema's tables to `PG_SCHEMA_VERSION`; a no-op when they are.

    One transaction under an advisory lock, so that two processes opening a
    new journal at once create it once. A newer schema is refused unchanged.
    """
    s = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"attempt-kernel:{schema}",)
        )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {s}").format(s=s))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {s}.schema_version ("
                " version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(s=s)
        )
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {s}.schema_version").format(s=s)
        ).fetchone()
        found = _int_of(row)
        if found > PG_SCHEMA_VERSION:
            raise PgSchemaTooNew(found, PG_SCHEMA_VERSION, schema)
        for version, statements in _MIGRATIONS:
            if version <= found:
                continue
            for statement in statements:
                conn.execute(sql.SQL(statement).format(s=s))
            conn.execute(
                sql.SQL("INSERT INTO {s}.schema_version (version) VALUES (%s)").format(s=s),
                (version,),
            )


def _int_of(row: tuple[object, ...] | None) -> int:
    value = None if row is None else row[0]
    if type(value) is not int:
        raise PgJournalError(f"the database answered {value!r} where a number was expected")
    return value


# --------------------------------------------------------------------------
# Which appends commit synchronously
# --------------------------------------------------------------------------


def commits_synchronously(change: Change) -> bool:
    """True for a change that must be durable before `append` returns.

    spec §10: ``Dispatched`` commits synchronously before the effect is sent
    (the write-ahead rule); the others may commit asynchronously, since a
    later synchronous commit makes them durable too.
    """
    match change:
        case IntentChanged():
            return is_outstanding(change.to_state)
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
            | StepResult()
            | RunFinished()
        ):
            return False
        case _:
            assert_never(change)


# --------------------------------------------------------------------------
# The journal
# --------------------------------------------------------------------------


def _connect_error(url: str, error: psycopg.Error) -> PgConnectFailed:
    """Name the host and the driver's reason; never the URL (it may hold a password)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        params = {}
    host = str(params.get("host") or "localhost (default socket)")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    database = params.get("dbname")
    named = f", database {database}" if database else ""
    reason = "; ".join(part.strip() for part in str(error).splitlines() if part.strip())
    return PgConnectFailed(f"cannot connect to PostgreSQL at {where}{named}: {reason}")


def connect(url: str, *, connect_timeout: int = 10) -> psycopg.Connection[TupleRow]:
    """An autocommit connection to ``url``, or `PgConnectFailed` naming the host and why."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout)
    except psycopg.Error as error:
        raise _connect_error(url, error) from None


@final
class PgJournal:
    """A run log in PostgreSQL: the `Journal` seam (read, append, flush) over one schema.

    Opening connects and migrates the schema's tables (idempotent). One
    journal holds one connection and is used from one thread. `append`
    returns the record's journal-wide sequence number once its transaction
    has committed (synchronously for ``Dispatched``, see the module doc);
    `flush` makes every returned append durable. A failed append breaks the
    journal (`PgWriteFailed`) until it is reopened.

    With ``lease``, every append also checks, in the statement that writes
    the record, that the run's ``runs`` row names this owner and fence, and
    raises `LeaseLost` (writing nothing) when it does not. A worker drives
    many runs, each under its own fence: ``leases`` maps each run it holds
    to its lease, read at every append (the caller adds and removes runs as
    it claims and leaves them); an append to a run missing from it raises
    `LeaseLost`. ``clock`` gives ``time_us``; by default it is the
    database's clock.
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
        self._broken: str | None = None
        self._unflushed = False
        conn = connect(url, connect_timeout=connect_timeout)
        try:
            _migrate(conn, schema)
        except BaseException:
            conn.close()
            raise
        self._conn: Final = conn
        s = sql.Identifier(schema)
        self._take_seq: Final = sql.SQL(
            "UPDATE {s}.head SET last_seq = last_seq + 1"
            " RETURNING last_seq, set_config('synchronous_commit', %s, true),"
            " (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        ).format(s=s)
        self._insert: Final = sql.SQL(
            "INSERT INTO {s}.records (run, seq, line) VALUES (%s, %s, %s)"
        ).format(s=s)
        # The lease check and the write are one statement (spec §10): FOR SHARE
        # makes a takeover's update of the runs row wait for this commit, or
        # this append see the new owner and fence.
        self._insert_fenced: Final = sql.SQL(
            "INSERT INTO {s}.records (run, seq, line) SELECT %s, %s, %s"
            " WHERE EXISTS (SELECT 1 FROM {s}.runs"
            " WHERE run = %s AND owner = %s AND fence = %s FOR SHARE)"
        ).format(s=s)
        self._read: Final = sql.SQL(
            "SELECT seq, run, line FROM {s}.records WHERE seq > %s ORDER BY seq LIMIT %s"
        ).format(s=s)
        self._read_run: Final = sql.SQL(
            "SELECT seq, run, line FROM {s}.records WHERE run = %s AND seq > %s ORDER BY seq LIMIT %s"
        ).format(s=s)

    # ------------------------------------------------------------ reading

    def read_run(self, run: str) -> Iterator[LogItem]:
        """Yield one run's records in order, numbered 1, 2, ... as `export --run` writes them.

        What a worker needs to recover and drive one run without reading the
        whole journal (its ``(run, seq)`` key makes this an index range). A
        row that fails its checksum is a `CorruptLine` naming run and seq.
        """
        for item in self._rows(self._read_run, (run,), f"run {run!r}"):
            match item:
                case Record():
                    yield Record(
                        line=item.line, seq=item.line, time_us=item.time_us, run=run, change=item.change
                    )
                case CorruptLine():
                    yield item
                case _:
                    assert_never(item)

    def read(self) -> Iterator[LogItem]:
        """Yield every record of the journal in sequence order (a `Record` or `CorruptLine`).

        Reads in batches of `READ_BATCH` rows, each its own short query. A row
        whose line fails its checksum, or whose line names another run or
        sequence number than its key, is a `CorruptLine` that names the row's
        run and seq; ``line`` is the row's position in the journal (1-based),
        its line number in an export.
        """
        return self._rows(self._read, (), "the journal")

    def _rows(
        self, query: sql.Composed, params: tuple[object, ...], what: str
    ) -> Iterator[Record | CorruptLine]:
        """Decode the rows ``query`` returns (``seq, run, line``), in batches after a seq."""
        after = 0
        position = 0
        while True:
            try:
                rows = self._conn.execute(query, (*params, after, READ_BATCH)).fetchall()
            except psycopg.Error as error:
                raise PgJournalError(
                    f"reading {what} after seq {after} failed: {_reason(error)}"
                ) from error
            for row in rows:
                seq, run, line = row
                if type(seq) is not int or type(run) is not str or type(line) is not bytes:
                    raise PgJournalError(f"the records table holds an unexpected row after seq {after}")
                position += 1
                after = seq
                item = decode_line(line, position)
                match item:
                    case Record():
                        if item.run != run or item.seq != seq:
                            yield CorruptLine(
                                line=position,
                                reason=f"row of run {run!r} seq {seq} holds the record of run"
                                f" {item.run!r} seq {item.seq}",
                            )
                        else:
                            yield item
                    case CorruptLine():
                        yield CorruptLine(
                            line=position, reason=f"row of run {run!r} seq {seq}: {item.reason}"
                        )
                    case _:
                        assert_never(item)
            if len(rows) < READ_BATCH:
                return

    # ------------------------------------------------------------ appending

    def append(self, run: str, change: Change) -> int:
        """Write one record and return its sequence number (see the class doc).

        Raises `UnencodableRecord` (nothing written) for a value JSON cannot
        carry, `LeaseLost` when the writer's lease does not match, and
        `PgWriteFailed` when the database fails.
        """
        if self._broken is not None:
            raise PgWriteFailed(
                f"the journal failed earlier ({self._broken}); open it again before appending"
            )
        sync = commits_synchronously(change)
        seq = 0
        try:
            with self._conn.transaction():
                row = self._conn.execute(self._take_seq, ("on" if sync else "off",)).fetchone()
                if row is None:
                    raise PgJournalError(
                        f"the journal's head row in schema {self.schema!r} is missing"
                    )
                seq, _, db_now = row
                if type(seq) is not int or type(db_now) is not int:
                    raise PgJournalError(f"the journal's head answered {row!r}")
                # spec §10: client clocks skew; by default the database's clock stamps records.
                now = db_now if self._clock is None else self._clock()
                line = encode_record(seq, now, run, change)
                leases = self._leases
                lease = self.lease if leases is None else leases.get(run)
                if leases is not None and lease is None:
                    raise LeaseLost(run, None)
                if lease is None:
                    self._conn.execute(self._insert, (run, seq, line))
                else:
                    written = self._conn.execute(
                        self._insert_fenced, (run, seq, line, run, lease.owner, lease.fence)
                    ).rowcount
                    if written != 1:
                        raise LeaseLost(run, lease)
        except psycopg.Error as error:
            self._broken = f"append of record seq {seq or '?'} of run {run!r} failed: {_reason(error)}"
            raise PgWriteFailed(
                f"{self._broken}; whether it was committed is unknown until the journal is read again"
            ) from error
        # A synchronous commit flushes the WAL up to it: every earlier append too.
        self._unflushed = not sync
        return seq

    def flush(self) -> None:
        """Make every returned append durable (a synchronous commit that writes WAL).

        Any commit flushes the WAL up to itself; a transactional logical
        message is the smallest write that makes a commit wait for the disk,
        and it touches no table another writer holds.
        """
        if not self._unflushed:
            return
        if self._broken is not None:
            raise PgWriteFailed(f"the journal failed earlier ({self._broken})")
        try:
            with self._conn.transaction():
                self._conn.execute(
                    "SELECT set_config('synchronous_commit', 'on', true),"
                    " pg_logical_emit_message(true, 'attempt-kernel', 'flush')"
                )
        except psycopg.Error as error:
            self._broken = f"flush failed: {_reason(error)}"
            raise PgWriteFailed(self._broken) from error
        self._unflushed = False

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Flush (if the journal is healthy) and close the connection. Idempotent."""
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


def _reason(error: psycopg.Error) -> str:
    return "; ".join(part.strip() for part in str(error).splitlines() if part.strip()) or type(
        error
    ).__name__



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
