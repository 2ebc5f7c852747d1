"""Workers sharing one PostgreSQL journal: submit, claim, heartbeat, take over
(docs/contracts.md, "Many workers").

Owns the queue and the leases in the journal's ``runs`` and ``workers``
tables (migration 2 of `_journal`), and a worker's loop; it applies no
kernel rule (the executor, ledger and recovery do, exactly as for a file)
and judges no heartbeat itself (`_lease` does).

Theory of operation:

- `submit_run` inserts a ``runs`` row (workflow, input, no owner); a run id
  is unique in the journal, queued or already written.
- A worker process registers a fresh id (uuid4; reused ids orphan work),
  and a thread of its own beats ``heartbeat_at = now()`` (the database's
  clock) every ``heartbeat`` seconds on its own connection, so a busy
  event loop never delays a beat.
- Claiming is one fenced statement for as many runs as the worker has
  free slots: each run with no owner, or owned by a worker found dead, is
  locked ``FOR UPDATE SKIP LOCKED`` and given this worker's id with
  ``fence + 1``, on condition that owner and fence are still the ones
  read; the runs come back in the order they became due. A run that a
  process holds (``attempt-kernel run URL`` or ``recover URL``: `RunHolds`)
  is passed over, its row untouched, and claimable again as soon as that
  process lets it go. Before claiming (at most every half heartbeat
  period), a worker marks dead every worker whose heartbeat is older than
  ``dead_after`` by the database's clock; a worker marked dead stays dead
  (its heartbeat fails and it stops).
- Every run a worker gets is handled the same way, new or taken over:
  `recover` limited to that run (reconcilers first, then
  ``Cancel(intent_dispatched=<outstanding?>)`` for orphans, a cancelled run
  closed), then the executor drives it on the journal under the run's
  lease (`PgJournal` with ``leases``): every append checks owner and fence
  in its own statement, so a worker that lost a run writes nothing to it
  (`LeaseLost`) and drops it. The ``runs`` row is closed (``done``) with
  the owner and fence checked too.
- Admission across workers (`_pools`): an attempt of a step that names a
  ``pool`` takes a slot row of that pool (fenced by the run's lease) before
  its ``Admit`` and frees it after its terminal record; a takeover frees
  the slots of the runs it took, after recovery ended their orphans. A
  worker refuses to start when a step names a pool the journal lacks
  (`PoolMissing`).
- A run that only waits is let go by its executor (`LET_GO_AFTER`) and
  released with its wake time in ``runs.wake_at`` (see `_RELEASE_WAITING`):
  it holds no lease and no slot until a claim finds it due, or an
  operator's change (`_deliver`) clears the wake time. While a worker
  drives runs it takes in the operators' changes the ``inbox`` holds for
  them (`INBOX_POLL`), through each run's executor; on a claim, those
  already waiting are recorded before the run's recovery.
- A worker's executors do not wait for the database at each append: the
  journal's writer thread writes what they hand over in groups, one
  synchronous commit per group, and each effect waits only for the group
  that makes its ``Dispatched`` durable (`_journal`, "Group commit").
- A worker that cannot beat stops sending effects before anyone may take
  its runs over: before each ``Dispatched`` the effect waits, awaited
  (its other runs go on), for a live heartbeat until the lease would
  expire, and the append is then refused if none came (`HeartbeatLate`);
  once its own
  heartbeat is expired while the database answers (a frozen process) it
  stops its executors (a graceful stop) and exits (`WorkerDeclaredDead`).
- A worker survives its database (a restart, its sessions terminated, the
  server not up yet at its start): when a connection fails with the
  database unreachable (`connection_lost`), it stops its executors at once
  (their writes fail; nothing new starts), drops every run it held, and
  connects again after capped, fully jittered exponential waits
  (`Backoff`). Once connected it retires its old id and registers a fresh
  one in one transaction, so the runs it dropped are a dead worker's: they
  are taken over on the fenced path (fence + 1, recovery of their live
  attempts, their slots freed), by it or by another worker, exactly as
  after a crash. Whatever its old executors still try to write carries the
  old fence and is refused. It gives up (`PgConnectFailed`, the CLI's exit
  3) when the database stays unreachable for ``reconnect_for`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from typing_extensions import LiteralString, final

from .._codec import encode_record
from .._errors import AttemptKernelError
from .._coderun import WorkflowDiverged
from .._executor import Executor, RunControl, RunRefused, handling_signals
from ._lease import LeaseVerdict, check_timing, lease_decision, may_dispatch
from .._observe import RunObserver, shown, tell
from ._journal import (
    CLAIMABLE_NOW,
    DEFAULT_SCHEMA,
    PG_SCHEMA_VERSION,
    Lease,
    LeaseLost,
    PgConnectFailed,
    PgJournal,
    PgJournalError,
    PgMigrationNeeded,
    PgSchemaTooNew,
    check_schema,
    commits_synchronously,
    connect,
    connection_lost,
    database_named,
    INBOX_OF,
    INBOX_TAKEN,
    hand_in,
    HELD_KEYS,
    hold_key_head,
    hold_key_sql,
    inbox_change,
    migrate,
    refuse_untextable,
    untextable,
    usable,
)
from .._ledger import Ledger
from .._operate import refusal
from ._pools import SlotAdmission, check_pools, free_slots_of_taken_over_run, pools_named
from .._records import JSON, Change, LogItem, RunCancelRequested, RunFinished, RunStarted
from .._recovery import Asked, Recovery, recover
from .._report import asked_line
from .._store import DispatchRefused
from .._workflow import Workflow, WorkflowError, workflows_by_name

_LOGGER: Final = logging.getLogger("attempt_kernel.worker")
"""A worker's own lines: claims, takeovers, lost leases, each run's end."""

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@final
class HeartbeatLate(DispatchRefused):
    """This worker's heartbeat is too old to send an effect safely; nothing was written.

    Another worker may soon take its runs over; the worker stops dispatching
    until a heartbeat succeeds again, and stops altogether once it expired.
    """


@final
class WorkerDeclaredDead(AttemptKernelError):
    """Another worker found this one's heartbeat expired and took its runs over.

    The worker stopped: every write to those runs was refused (`LeaseLost`).
    Start a new worker process (it gets a fresh id).
    """


class WorkerWatcher(Protocol):
    """What a worker tells about itself as it goes (metrics count it: `_metrics.WorkerMetrics`).

    Called from the worker's event loop thread; a call must return at once.
    """

    def started(self, worker: str) -> None:
        """The worker registered under id ``worker``, before its first claim (again, under a
        fresh id, after each reconnect: see `Worker`)."""

    def claimed(self, worker: str, run: str, taken_over: bool) -> None:
        """The worker claimed ``run``; ``taken_over``: from a worker found dead."""

    def lease_lost(self, worker: str, run: str) -> None:
        """The worker dropped ``run``: another worker holds its lease now (`LeaseLost`)."""


# --------------------------------------------------------------------------
# Statements ({s} is the schema)
# --------------------------------------------------------------------------

# Submitting: one statement, so that on a caller's connection it costs one
# round trip and never migrates. It reads the schema's version and inserts
# only at the version this library writes; it answers the version and how
# many rows it inserted.
_SUBMIT: Final[LiteralString] = (
    "WITH v AS (SELECT coalesce(max(version), 0) AS version FROM {s}.schema_version),"
    " ins AS (INSERT INTO {s}.runs (run, workflow, input) SELECT %s, %s, %s FROM v"
    " WHERE v.version = %s AND NOT EXISTS (SELECT 1 FROM {s}.records WHERE run = %s)"
    " ON CONFLICT (run) DO NOTHING RETURNING 1)"
    " SELECT v.version, (SELECT count(*) FROM ins)::integer FROM v"
)
_REGISTER: Final[LiteralString] = "INSERT INTO {s}.workers (id, host, pid) VALUES (%s, %s, %s)"
_BEAT: Final[LiteralString] = (
    "UPDATE {s}.workers SET heartbeat_at = now() WHERE id = %s AND NOT dead RETURNING id"
)
_RETIRE: Final[LiteralString] = "UPDATE {s}.workers SET dead = true WHERE id = %s"
# Mirrors lease_decision's EXPIRED by the database's clock: age > dead_after.
_FIND_DEAD: Final[LiteralString] = (
    "UPDATE {s}.workers SET dead = true"
    " WHERE NOT dead AND id <> %s AND heartbeat_at < now() - make_interval(secs => %s)"
    " RETURNING id"
)
# The fenced claim: owner and fence must still be the ones read
# (docs/contracts.md, "Fenced appends"). Only a run claimable now: queued,
# signalled, or its wake time come (the runs_ready index is in this order and
# ends the scan at now()). Up to %(n)s runs in one statement (a worker's free
# slots), answered in the order they were due.
#
# Never a run that `attempt-kernel run URL` or `recover URL` holds (`RunHolds`):
# the scan passes over a key held, or waited for, exclusively (a look at
# pg_locks, only for a row that is otherwise claimable: `CLAIMABLE_NOW`, the
# rule the queue-depth gauge counts by too), so a held run neither takes a free slot
# nor sees its fence moved; and each run picked is then tried with the
# operators' shared try of its key (`held_by_a_process`), in the same
# statement as its fenced update, after the LIMIT (so on %(n)s keys at most:
# the lock table is small). That try is the worker's mark: held until the
# claim commits, it makes a process that comes to hold the run meanwhile wait
# for the commit, and that process then finds the run a live worker's and
# lets it be (`RunHolds.take`); a run whose key a process took after the look
# fails the try and is not updated. So a worker and a process never both
# drive a run, and neither steps back for nothing.
_CLAIM: Final[LiteralString] = (
    "WITH claimed AS (UPDATE {s}.runs AS r SET owner = %(me)s, fence = r.fence + 1, wake_at = NULL"
    " FROM (SELECT run, owner, fence, coalesce(wake_at, submitted_at) AS due FROM {s}.runs"
    "  WHERE " + CLAIMABLE_NOW + " AND workflow = ANY(%(names)s)"
    "  ORDER BY coalesce(wake_at, submitted_at), run LIMIT %(n)s FOR UPDATE SKIP LOCKED) AS old"
    " WHERE r.run = old.run AND r.owner IS NOT DISTINCT FROM old.owner AND r.fence = old.fence"
    " AND EXISTS (SELECT 1 FROM {s}.workers WHERE id = %(me)s AND NOT dead)"
    " AND pg_try_advisory_xact_lock_shared(" + hold_key_sql("old.run") + ")"
    " RETURNING r.run, r.fence, r.workflow, r.input, old.owner,"
    " EXISTS (SELECT 1 FROM {s}.records WHERE run = r.run) AS written,"
    " EXISTS (SELECT 1 FROM {s}.inbox WHERE run = r.run) AS mail, old.due)"
    " SELECT run, fence, workflow, input, owner, written, mail FROM claimed ORDER BY due, run"
)
# Closing or releasing a run commits synchronously: it makes the run's
# records durable (see _WorkerJournal.flush).
_COMPLETE: Final[LiteralString] = (
    "UPDATE {s}.runs SET done = true, outcome = %s, finished_at = now()"
    " WHERE run = %s AND owner = %s AND fence = %s"
    " AND set_config('synchronous_commit', 'on', true) IS NOT NULL"
)
_RELEASE: Final[LiteralString] = (
    "UPDATE {s}.runs SET owner = NULL WHERE run = %s AND owner = %s AND fence = %s"
    " AND set_config('synchronous_commit', 'on', true) IS NOT NULL"
)
# Releasing a run that waits: the row is locked first, in a statement of its
# own, so that the release's look at the inbox (a new snapshot in READ
# COMMITTED) sees whatever a `deliver_pg` that held the lock put there. In
# one statement, a release that waited for that lock would still read the
# inbox as it was before, and the run would sleep on an operator's change.
_LOCK_HELD: Final[LiteralString] = (
    "SELECT 1 FROM {s}.runs WHERE run = %s AND owner = %s AND fence = %s FOR UPDATE"
)
_RELEASE_WAITING: Final[LiteralString] = (
    "UPDATE {s}.runs SET owner = NULL, wake_at = CASE"
    " WHEN %(now)s OR EXISTS (SELECT 1 FROM {s}.inbox WHERE run = %(run)s) THEN NULL"
    " ELSE coalesce(to_timestamp(%(wake)s::bigint / 1000000.0), 'infinity') END"
    " WHERE run = %(run)s AND owner = %(owner)s AND fence = %(fence)s"
    " AND set_config('synchronous_commit', 'on', true) IS NOT NULL"
)
# Work for a worker that stops when idle: a run claimable now, or one held
# (by a live worker, or a dead one's to take over); a released run whose
# wake time is still to come is not work to wait for, nor is a run that a
# process holds (`RunHolds`, as in `_CLAIM`): no worker claims it while it
# is held, and the process may hold it for as long as it runs. A live
# worker's run is work whoever holds its key: a process that takes the key
# then finds the worker's claim and lets the run be (`RunHolds.take`).
_OPEN_RUNS: Final[LiteralString] = (
    "SELECT count(*) FROM {s}.runs WHERE NOT done AND workflow = ANY(%(names)s)"
    " AND (owner IS NOT NULL OR coalesce(wake_at, submitted_at) <= now())"
    " AND (owner IN (SELECT id FROM {s}.workers WHERE NOT dead)"
    "  OR " + hold_key_sql("run") + " <> ALL (" + HELD_KEYS + "))"
)
LET_GO_AFTER: Final = 1.0
"""Seconds a run's every branch must wait, with no wake time sooner, before its
worker lets go of it (releases its row with its wake time): a shorter wait is
waited in the worker, holding the run."""

BEAT_POLL: Final = 0.01
"""Seconds between two looks at a late heartbeat while an effect waits for a beat."""

INBOX_POLL: Final = 0.5
"""Seconds between a worker's looks at the inbox of the runs it drives."""

RECONNECT_FOR: Final = 300.0
"""Seconds a worker goes on trying to reach an unreachable database before it
gives up (`PgConnectFailed`; the CLI exits 3). Five minutes covers a server
restart, a failover to a standby and a database container starting after
its workers, yet a worker pointed at a wrong URL, or a database that is
gone, still ends soon enough for its supervisor to notice and alert."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """How a worker waits between two attempts to reach its database.

    Capped exponential backoff with full jitter: before attempt ``n`` + 1
    (``n`` = 0, 1, ...) it sleeps ``uniform(0, min(cap, base * 2**n))``
    seconds, so workers that lost one server do not all come back at the
    same instant. ``uniform``, ``sleep`` and ``clock`` (which measures the
    outage against ``reconnect_for``) are there to be replaced in tests.
    """

    base: float = 0.1
    """The first wait's upper bound, in seconds (doubling after each attempt)."""
    cap: float = 5.0
    """The largest upper bound of a wait, in seconds."""
    uniform: Callable[[float, float], float] = random.uniform
    """A random number between its two arguments (`random.uniform`)."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Waits that many seconds (`asyncio.sleep`: the worker's loop still takes signals)."""
    clock: Callable[[], float] = time.monotonic
    """Seconds on a clock that never goes back (`time.monotonic`)."""

    def __post_init__(self) -> None:
        if not 0 < self.base < float("inf"):
            raise ValueError(f"Backoff base must be a positive number of seconds, got {self.base!r}")
        if not self.base <= self.cap < float("inf"):
            raise ValueError(
                f"Backoff cap must be a number of seconds at least base ({self.base!r}), got {self.cap!r}"
            )

    def delay(self, attempt: int) -> float:
        """The wait before attempt ``attempt`` + 1 (0 for the wait after the first failure)."""
        return self.uniform(0.0, min(self.cap, self.base * 2.0 ** min(attempt, 64)))


def _refuse_untextable_workflow(workflow: Workflow) -> None:
    """Raise `WorkflowError` for a workflow a worker could not run: a name PostgreSQL text
    cannot hold (`untextable`) in what the journal keeps as text.

    Its name (the queue's and the claim's), its declared domain states (every
    run of it would be refused at its start) and the pools its steps name
    (no such pool can exist). A step's name may hold either: the slots
    table keeps it escaped (`slot_step`).
    """
    named: list[tuple[str, str]] = [(f"its name {workflow.name!r}", workflow.name)]
    named += [(f"its domain state {state!r}", state) for state in workflow.domain_states]
    default = workflow.defaults.pool
    if default is not None:
        named.append((f"pool {default!r}, the one its steps default to,", default))
    for step in workflow.steps:
        if step.pool is not None:
            named.append((f"pool {step.pool!r} (its step {step.name!r} names it)", step.pool))
    for said, value in named:
        found = untextable(value)
        if found is not None:
            raise WorkflowError(
                f"workflow {workflow.name!r} cannot run on a PostgreSQL journal: {said} holds"
                f" {found}, and PostgreSQL text holds no NUL and no lone surrogate (a run log"
                " file holds both); rename it to run the workflow on workers"
            )


@functools.lru_cache(maxsize=64)
def _statement(text: LiteralString, schema: str) -> bytes:
    """The statement for ``schema``, composed once (the claims and a completion run for every run)."""
    return sql.SQL(text).format(s=sql.Identifier(schema)).as_bytes(None)


# --------------------------------------------------------------------------
# Submitting
# --------------------------------------------------------------------------


def submit_run(
    url: str | psycopg.Connection[Any],
    workflow: str,
    run: str | None = None,
    input: JSON = None,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> str:
    """Queue run ``run`` (default: ``<workflow>-<12 hex digits>``) of ``workflow``; return its id.

    A worker given the workflow (by name) claims and drives it. Run ids are
    unique in the journal: an id already queued or already written is
    refused (`RunRefused`), and nothing is queued. ``input`` must be strict
    JSON, and ``run`` and ``workflow`` free of NULs and lone surrogates,
    which PostgreSQL text cannot hold (`UnencodableRecord` otherwise,
    nothing sent, nothing queued); it becomes the run's ``ctx.input``.

    ``url`` is a ``postgresql://`` URL, or a psycopg connection the caller
    owns. With a URL, submitting opens a connection of its own, queues the
    run (committed when this returns) and closes it; tables missing or
    behind are migrated first, as opening a `PgJournal` does. With a
    connection, the run is one ``INSERT`` in the caller's transaction:
    nothing is committed, rolled back or closed here, a worker sees the run
    once the caller commits, and a rollback takes it back (on an autocommit
    connection it is committed at once). Nothing is migrated there: tables
    missing or behind raise `PgMigrationNeeded` (run ``attempt-kernel
    migrate URL`` once), and a connection in a failed transaction is refused
    before anything is sent. A failed ``INSERT`` leaves the caller's
    transaction failed, as any failed statement does. From a psycopg_pool
    pool: ``with pool.connection() as conn: submit_run(conn, ...)`` (the
    block commits on exit).
    """
    check_schema(schema)
    run_id = run if run is not None else f"{workflow}-{uuid.uuid4().hex[:12]}"
    # The start record must be encodable, here and in the journal's text columns:
    # refuse it now, before anything is sent, not in a worker.
    start = RunStarted(workflow=workflow, input=input, domain_states=())
    refuse_untextable(run_id, (start,))
    encode_record(1, 0, run_id, start)
    text = json.dumps(input, allow_nan=False, separators=(",", ":"))
    values = (run_id, workflow, text, PG_SCHEMA_VERSION, run_id)
    if isinstance(url, str):
        with connect(url) as conn:  # names the host on failure
            try:
                outcome: tuple[int, int] | None = _submitted(conn, schema, run_id, values)
            except PgMigrationNeeded:  # tables missing or too old to say
                outcome = None
            if outcome is None or outcome[0] < PG_SCHEMA_VERSION:  # migrate, as opening a journal does
                migrate(conn, schema=schema)
                outcome = _submitted(conn, schema, run_id, values)
        found, written = outcome
    else:
        found, written = _submitted(usable(url, f"submitting run {run_id!r}"), schema, run_id, values)
    if found != PG_SCHEMA_VERSION:
        if found > PG_SCHEMA_VERSION:
            raise PgSchemaTooNew(found, PG_SCHEMA_VERSION, schema)
        raise PgMigrationNeeded(found, PG_SCHEMA_VERSION, schema, _NOT_ON_CALLERS)
    if written != 1:
        raise RunRefused(
            f"run {run_id!r} is already in the journal (queued or written); run ids are"
            " unique: choose another id, or recover the run that has it"
        )
    return run_id


_NOT_ON_CALLERS: Final = "submit_run does not migrate on the caller's connection"


def _submitted(
    conn: psycopg.Connection[Any], schema: str, run_id: str, values: tuple[object, ...]
) -> tuple[int, int]:
    """Run `_SUBMIT` on ``conn``: the schema's version, and how many runs it queued (0 or 1)."""
    try:
        with conn.cursor(row_factory=tuple_row) as cursor:
            row = cursor.execute(_statement(_SUBMIT, schema), values).fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as error:
        why = error.diag.message_primary or type(error).__name__
        raise PgMigrationNeeded(0, PG_SCHEMA_VERSION, schema, f"{_NOT_ON_CALLERS} ({why})") from None
    except psycopg.errors.UndefinedColumn as error:  # a version 1 runs table: no queue yet
        why = error.diag.message_primary or type(error).__name__
        raise PgMigrationNeeded(None, PG_SCHEMA_VERSION, schema, f"{_NOT_ON_CALLERS} ({why})") from None
    except psycopg.Error as error:
        raise PgJournalError(f"queueing run {run_id!r} failed: {error}") from error
    if row is None or type(row[0]) is not int or type(row[1]) is not int:
        raise PgJournalError(f"queueing run {run_id!r}: the database answered {row!r}")
    return row[0], row[1]


# --------------------------------------------------------------------------
# The heartbeat
# --------------------------------------------------------------------------


@final
class _Heart:
    """Beats from a thread and a connection of its own.

    ``last_ok`` is the worker's time (``clock``, the worker's own) at which
    the last successful beat was *sent* (before the database stamped it), so
    the worker's age of its lease is never younger than the database's (see
    `_lease`).
    """

    def __init__(self, url: str, schema: str, worker: str, period: float, clock: Callable[[], float]) -> None:
        self._url: Final = url
        self._beat: Final = _statement(_BEAT, schema)
        self._worker: Final = worker
        self._period: Final = period
        self._halt: Final = threading.Event()
        self.clock: Final = clock
        self.last_ok = clock()
        self.declared_dead = False
        self._timeout: Final = max(2, int(period * 2))
        """Seconds a beat's connection attempt may take."""
        self.failed_at: float | None = None
        """When the last beat failed (monotonic), or None when the last beat got an answer."""
        self.error: BaseException | None = None
        """The last failed beat's error."""
        self._thread: Final = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def halt(self) -> None:
        self._halt.set()
        self._thread.join(timeout=10)

    def unreachable(self) -> BaseException | None:
        """The error of a beat that failed lately (within two periods and a
        connection attempt): the database does not answer now. None when the
        last beat got an answer, or failed long ago (the process was frozen
        since: that is no outage)."""
        failed = self.failed_at
        if failed is None or time.monotonic() - failed > 2 * self._period + self._timeout:
            return None
        return self.error

    def _loop(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        try:
            while not self._halt.wait(self._period):
                sent = self.clock()
                try:
                    if conn is None:
                        conn = psycopg.connect(
                            self._url, autocommit=True, connect_timeout=self._timeout
                        )
                    row = conn.execute(self._beat, (self._worker,)).fetchone()
                except psycopg.Error as error:
                    if conn is not None:
                        conn.close()
                    conn = None
                    self.error = error
                    self.failed_at = time.monotonic()
                    continue  # the next period tries again; the lease ages meanwhile
                self.failed_at = None
                if row is None:
                    self.declared_dead = True
                    return
                self.last_ok = sent  # read by the loop's thread (`_WorkerJournal._beat`)
        finally:
            if conn is not None:
                conn.close()


# --------------------------------------------------------------------------
# The journal as one worker writes it
# --------------------------------------------------------------------------


@final
class _WorkerJournal:
    """The worker's `PgJournal` with the last guard before an effect.

    Before a ``Dispatched`` (the last write before an effect is sent) the
    executor awaits `ready_to_dispatch`: while this worker's heartbeat is
    not live (`_lease.may_dispatch`), the effect waits there for a beat,
    until the lease would expire, and the worker's other runs go on. The
    append itself then checks again and refuses with `HeartbeatLate`,
    writing nothing, if the heartbeat is still not live. Appends are handed to the
    journal's writer thread (`PgJournal.hand_over`) and the executor awaits
    `durable` where it must (the `GroupCommitLog` seam), so concurrent runs
    share the writer's groups and their synchronous commits.
    """

    def __init__(
        self,
        journal: PgJournal,
        live: Callable[[], LeaseVerdict],
        heart: _Heart,
        dead_after: float,
        say: Callable[[str], None],
    ) -> None:
        self._journal: Final = journal
        self._live: Final = live
        self._heart: Final = heart
        self._dead_after: Final = dead_after
        self._say: Final = say

    def read(self) -> Iterator[LogItem]:
        return self._journal.read()

    def read_run(self, run: str) -> Iterator[LogItem]:
        return self._journal.read_run(run)

    def forget(self, run: str) -> None:
        self._journal.forget(run)

    def ready_to_dispatch(self, run: str) -> Awaitable[None] | None:
        """`DispatchGate`: nothing to wait for while the heartbeat is live, else `_beat`."""
        return None if may_dispatch(self._live()) else self._beat(run)

    async def _beat(self, run: str) -> None:
        """Wait, on the loop, for the heartbeat to be live again, until it expires or the
        worker is declared dead (a look every `BEAT_POLL` seconds)."""
        heart = self._heart
        self._say(f"{run}: this worker's heartbeat is late; its effect waits for a beat")
        while True:
            verdict = self._live()
            if may_dispatch(verdict) or verdict is LeaseVerdict.EXPIRED or heart.declared_dead:
                return
            await asyncio.sleep(BEAT_POLL)

    def _guard(self, run: str) -> None:
        """Refuse (`HeartbeatLate`) the write before an effect unless this worker's heartbeat is live
        (the executor waited for it first, `ready_to_dispatch`)."""
        if may_dispatch(self._live()):
            return
        heart = self._heart
        raise HeartbeatLate(
            f"run {run!r}: this worker's last heartbeat is"
            f" {heart.clock() - heart.last_ok:.1f} s old (dead after {self._dead_after} s);"
            " it sends no new effect until a heartbeat succeeds"
        )

    def append(self, run: str, change: Change) -> int:
        return self.append_all(run, (change,))

    def append_all(self, run: str, changes: Sequence[Change]) -> int:
        """Hand the records to the journal's writer thread (`PgJournal.hand_over`); the loop goes on.

        A ``Dispatched`` among them is refused first, handing nothing over,
        when the heartbeat is late; `durable` then waits for the group
        commit that covers it, before its effect is sent.
        """
        if any(commits_synchronously(change) for change in changes):
            self._guard(run)
        return self._journal.hand_over(run, changes)

    async def durable(self, run: str) -> None:
        """Return once ``run``'s records are committed: durable for a ``Dispatched`` (`PgJournal.committed`).

        The run's other records are made durable by the statement that
        closes or releases its row, which commits synchronously, and a
        synchronous commit flushes the WAL up to it: every earlier commit
        of every run (see `flush`).
        """
        await self._journal.committed(run)

    def settle(self, run: str) -> None:
        """`durable`, blocking: for the executor's synchronous `flush` (an operator's change taken in)."""
        self._journal.settle(run)

    def flush(self) -> None:
        """Nothing to wait for here: the worker makes a run durable when it closes it.

        A ``Dispatched`` append is durable before its effect (`durable`).
        Every other record a run's executor flushes is made durable by the
        statement that closes or releases the run's row, which commits
        synchronously, and a synchronous commit flushes the WAL up to it:
        every earlier commit of every run. A worker that stops otherwise
        flushes as it closes its journal.
        """

    async def complete(self, run: str, changes: Sequence[Change], *, outcome: str) -> None:
        """`PgJournal.append_and_complete` through the writer thread: it shares a group commit too."""
        self._journal.hand_over(run, changes, outcome=outcome)
        await self._journal.committed(run)

    def one_run(self, run: str, *, fresh: bool = False) -> _OneRun:
        """This journal as seen by the executor driving ``run``: only its records
        are read, and its start and end are held back (see `_OneRun`).

        ``fresh``: the run had no record when this worker claimed it, so the
        first read finds nothing without asking the database.
        """
        return _OneRun(self, self._journal, run, fresh=fresh, holds=True)


@final
class _Kept:
    """An observer that keeps what it is told, with the times, to tell a worker's observers afterwards.

    Recovery ends a taken-over run's orphans in a thread of its own, and
    tells its observers there (`recover`); the records reach the worker's
    observers (metrics count the attempts it ends) once it is back on the
    worker's loop, where observers are told (`_observe`).
    """

    def __init__(self) -> None:
        self.written: Final[list[tuple[Change, int]]] = []

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        self.written.append((change, time_us))


@final
class _OneRun:
    """A `Journal` for driving one run: it reads only that run's records
    (`PgJournal.read_run`, numbered from 1), and appends through the
    worker's journal. Reading the whole journal per claimed run made a
    worker's cost grow with the journal's length.

    With ``holds`` (the executor's view in a worker), two records wait to go
    in with another write instead of costing a statement of their own:

    - a fresh run's ``RunStarted`` goes in with the run's next record (the
      first attempt's creation, or whatever the executor writes next). No
      effect can be sent in between: sending one takes a ``Dispatched``
      record, which carries the start with it.
    - the records that end the run (``RunFinished`` last) go in with the
      close of the run's row: once the executor has returned its report,
      the worker passes `end` and the run's status to
      `PgJournal.append_and_complete`, and end and close commit together,
      synchronously.

    So `append` returns for these two before they are in the journal. A
    crash in between leaves the journal as a crash just before that append
    would: a queued run with no record (claimed again as new), or a run
    whose attempts have all ended and which has no end yet (a takeover
    closes it). Nothing else waits; an executor that fails drops what was
    held, and the run is left to recovery, as after any failed append.
    """

    def __init__(
        self,
        writer: _WorkerJournal | PgJournal,
        journal: PgJournal,
        run: str,
        *,
        fresh: bool = False,
        holds: bool = False,
    ) -> None:
        self._writer: Final = writer
        self._journal: Final = journal
        self._run: Final = run
        self._fresh = fresh
        self._holds: Final = holds
        self._held: tuple[Change, ...] = ()
        self._last = 0 if fresh else -1
        """The number of the run's last record handed out (-1: not known yet)."""
        self.end: tuple[Change, ...] = ()
        """The records that end the run, held for the close of its row (see the class doc)."""

    def read(self) -> Iterator[LogItem]:
        if self._fresh:  # once: a later read reads what was written since
            self._fresh = False
            self._journal.new_run(self._run)
            return iter(())
        return self._journal.read_run(self._run)

    def append(self, run: str, change: Change) -> int:
        return self.append_all(run, (change,))

    def append_all(self, run: str, changes: Sequence[Change]) -> int:
        if self.end:
            raise AssertionError(f"run {run!r}: a record after the run's end ({changes[0]!r})")
        if self._holds and run == self._run:
            if self._last == 0 and len(changes) == 1 and isinstance(changes[0], RunStarted):
                self._held = (changes[0],)
                self._last = 1
                return 1
            if self._last >= 0 and isinstance(changes[-1], RunFinished):
                self.end = (*self._held, *changes)
                self._held = ()
                self._last += len(changes)
                return self._last
            changes = (*self._held, *changes)
            self._held = ()
        writer = self._writer
        last = writer.append(run, changes[0]) if len(changes) == 1 else writer.append_all(run, changes)
        self._last = last
        return last

    def flush(self) -> None:
        writer = self._writer
        if isinstance(writer, _WorkerJournal):
            writer.settle(self._run)  # written (or its LeaseLost) before the caller goes on
        else:
            writer.flush()

    def ready_to_dispatch(self, run: str) -> Awaitable[None] | None:
        """`DispatchGate`: the worker's wait for a live heartbeat before an effect."""
        writer = self._writer
        return writer.ready_to_dispatch(run) if isinstance(writer, _WorkerJournal) else None

    async def durable(self, run: str) -> None:
        """`GroupCommitLog.durable`: the worker's executors wait here for the writer's group commit."""
        writer = self._writer
        if isinstance(writer, _WorkerJournal):
            await writer.durable(run)
        else:
            writer.flush()

    def __repr__(self) -> str:
        return f"run {self._run!r} of {self._journal!r}"


# --------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Claim:
    run: str
    fence: int
    workflow: str
    input: JSON
    previous: str | None
    """The owner it was taken from (a dead worker), or None for a queued run."""
    written: bool
    """Whether the journal held records of the run when it was claimed (else nothing to recover)."""
    mail: bool
    """Whether operators' changes for the run waited in the inbox when it was claimed."""


def _claim_of(row: tuple[object, ...]) -> _Claim:
    """A row of the claim statement, its types checked."""
    run, fence, workflow, text, previous, written, mail = row
    if (
        type(run) is not str
        or type(fence) is not int
        or type(workflow) is not str
        or type(text) is not str
        or not (previous is None or type(previous) is str)
        or type(written) is not bool
        or type(mail) is not bool
    ):
        raise PgJournalError(f"the runs table answered {row!r} for a claim")
    try:
        value: JSON = json.loads(text)
    except ValueError as error:  # written past submit_run, which checks it
        raise PgJournalError(
            f"the runs table holds an input for run {run!r} that is not JSON ({error});"
            f" the run is claimed by this worker, which stops: fix or delete the row"
        ) from None
    return _Claim(
        run=run, fence=fence, workflow=workflow, input=value, previous=previous,
        written=written, mail=mail,
    )  # fmt: skip


@final
class Worker:
    """One worker process's loop over a PostgreSQL journal (docs/contracts.md, "Many workers").

    ``concurrency`` bounds the runs it drives at once (each run's own
    attempts run under the executor's ``admission_limit``). ``heartbeat``
    is the beat period and ``dead_after`` (at least three periods) the age
    at which another worker takes its runs over, both in seconds.
    ``progress`` receives one line per state change and per claim, takeover
    and lost lease. ``stop_when_idle`` returns once no run of its workflows
    is left undone in the journal (for tests and batch jobs). ``observers``
    are handed to the executor of every run it drives (`RunObserver`), and
    told of what recovery writes when it takes a run up (the orphans it ends).
    ``watcher`` is told of its start, claims, takeovers and lost leases
    (`WorkerWatcher`). ``clock`` is the worker's own clock in seconds
    (monotonic by default), by which it judges the age of its last
    heartbeat; the database judges it by its own (a test may hand in a
    clock that jumps, to see a worker find its lease expired).

    A workflow whose name, declared domain states or pools hold a NUL or a
    lone surrogate, which PostgreSQL text cannot hold, is refused here
    (`WorkflowError`), before anything is claimed.

    When the database is unreachable (at the start too: a container may
    start before its database) the worker waits and connects again
    (`Backoff`; docs/contracts.md, "A worker survives its database"), for
    at most ``reconnect_for`` seconds (default `RECONNECT_FOR`; 0: never)
    from when it noticed the outage, then gives up with `PgConnectFailed`.
    Each reconnect registers it under a fresh `id` and the runs it dropped
    are taken over, fenced.
    """

    def __init__(
        self,
        url: str,
        workflows: Iterable[Workflow],
        *,
        schema: str = DEFAULT_SCHEMA,
        concurrency: int = 4,
        admission_limit: int = 8,
        heartbeat: float = 1.0,
        dead_after: float = 5.0,
        stop_when_idle: bool = False,
        progress: Callable[[str], None] | None = None,
        grace: float = 5.0,
        observers: Sequence[RunObserver] = (),
        watcher: WorkerWatcher | None = None,
        reconnect_for: float = RECONNECT_FOR,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}")
        if not 0 <= reconnect_for < float("inf"):
            raise ValueError(
                f"reconnect_for must be a number of seconds, 0 or more, got {reconnect_for!r}"
            )
        self._margin: Final = check_timing(heartbeat, dead_after)
        self._id = str(uuid.uuid4())
        self._registered = False
        """Whether ``_id`` is in the workers table (then a reconnect retires it)."""
        self._reconnect_for: Final = float(reconnect_for)
        self._backoff: Final = Backoff() if backoff is None else backoff
        self._closed = 0
        self._url: Final = url
        self._schema: Final = schema
        self._hold: Final = hold_key_head(schema)
        self._workflows: Final = workflows_by_name(workflows, "Worker")
        if not self._workflows:
            raise ValueError("a worker needs at least one workflow")
        for workflow in self._workflows.values():
            _refuse_untextable_workflow(workflow)
        self._names: Final = sorted(self._workflows)
        self._concurrency: Final = concurrency
        self._admission_limit: Final = admission_limit
        self._heartbeat: Final = heartbeat
        self._dead_after: Final = dead_after
        self._stop_when_idle: Final = stop_when_idle
        self._progress: Final = progress
        self._grace: Final = grace
        self._observers: Final = tuple(observers)
        self._leases: Final[dict[str, Lease]] = {}
        self._executors: Final[set[Executor]] = set()
        self._driving: Final[dict[str, Executor]] = {}
        """Each run whose executor drives it now (the inbox is taken in through it)."""
        self._pools: SlotAdmission | None = None
        self._stop_reason: str | None = None
        self._heart: _Heart | None = None
        self._watcher: Final = watcher
        self._clock: Final = clock

    # ------------------------------------------------------------ public

    @property
    def id(self) -> str:
        """The id this worker is registered under (uuid4); a fresh one after each reconnect."""
        return self._id

    def run(self, *, stop_on_signals: bool = False) -> int:
        """Serve until stopped (or idle, with ``stop_when_idle``); return how many runs it closed.

        Raises `WorkerDeclaredDead` when its heartbeat expired while the
        database answered (another worker may have taken its runs over),
        `PgConnectFailed` when the database stayed unreachable for
        ``reconnect_for`` seconds, and `PgJournalError` when the database
        refuses what it asks otherwise. With ``stop_on_signals``, SIGINT and
        SIGTERM stop it gracefully: its runs are stopped and handed back to
        the queue for another worker (while it waits for the database, it
        stops at the end of the current wait).
        """
        try:
            return asyncio.run(self._serve(stop_on_signals))
        except psycopg.Error as error:
            # Not an outage (those are retried): the database refused a statement.
            raise PgJournalError(
                f"worker {self.id}: a statement on its database failed:"
                f" {str(error).strip() or type(error).__name__}; another worker takes its"
                " runs over"
            ) from None

    def stop(self, reason: str = "Worker.stop()") -> None:
        """Stop gracefully; call it from the worker's event loop thread."""
        self._stop_reason = reason

    # ------------------------------------------------------------ helpers

    def _say(self, line: str, level: int = logging.INFO) -> None:
        """A line of its own (a claim, a takeover, a run's end): logged, and to ``progress``."""
        _LOGGER.log(level, "%s", shown(line))  # names from the journal are data
        if self._progress is not None:
            self._progress(line)

    def _say_asked(self, recovery: Recovery) -> None:
        """What each reconciler asked in taking a run over answered (`asked_line`: an answer
        nobody could give is a warning)."""
        self._say_answers(recovery.asked, completed=True)

    def _say_answers(self, answers: Sequence[Asked], *, completed: bool) -> None:
        """Each answer's line (`asked_line`), at its level; ``completed`` False: the takeover
        that asked failed once they came."""
        for asked in answers:
            level, line = asked_line(asked, completed=completed)
            self._say(line, level)

    def _verdict(self) -> LeaseVerdict:
        heart = self._heart
        assert heart is not None
        if heart.declared_dead:
            return LeaseVerdict.EXPIRED
        return lease_decision(heart.clock(), heart.last_ok, self._dead_after, self._margin)

    def _find_dead(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Mark dead every worker whose heartbeat expired by the database's clock."""
        dead = conn.execute(
            _statement(_FIND_DEAD, self._schema), (self.id, self._dead_after)
        ).fetchall()
        for (worker,) in dead:
            self._say(f"worker {worker} is dead (no heartbeat for {self._dead_after} s)", logging.WARNING)

    def _claim(self, conn: psycopg.Connection[tuple[object, ...]], most: int) -> list[_Claim]:
        """One fenced statement: up to ``most`` runs, queued or held by a worker found dead
        (`_find_dead`), in the order they were due."""
        rows = conn.execute(
            _statement(_CLAIM, self._schema),
            {"me": self.id, "names": self._names, "n": most, "hold": self._hold},
        ).fetchall()
        return [_claim_of(row) for row in rows]

    def _idle(self, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
        row = conn.execute(
            _statement(_OPEN_RUNS, self._schema), {"names": self._names, "hold": self._hold}
        ).fetchone()
        return row is not None and row[0] == 0

    # ------------------------------------------------------------ one run

    async def _drive(
        self,
        journal: _WorkerJournal,
        conn: psycopg.Connection[tuple[object, ...]],
        claim: _Claim,
    ) -> bool:
        """Recover and drive one claimed run; True once its row is closed by this worker."""
        run = claim.run
        lease = Lease(owner=self.id, fence=claim.fence)
        self._leases[run] = lease
        workflow = self._workflows[claim.workflow]
        if self._watcher is not None:
            self._watcher.claimed(self.id, run, claim.previous is not None)
        if claim.previous is None:
            self._say(f"{run}: claimed at fence {claim.fence}")
        else:
            self._say(f"{run}: taken over from worker {claim.previous} at fence {claim.fence}", logging.WARNING)
        executor: Executor | None = None
        # A code run's reconcilers answer as its executor takes it up: what they
        # said is logged once the takeover completes, or here if it failed first.
        unsaid: list[Asked] = []
        try:
            prior = None
            # A run with no record has nothing to recover and holds no slot
            # (a slot is taken after its attempt's first record).
            if claim.written:
                recovery, written = await asyncio.to_thread(self._recover, run, claim.mail)
                for change, time_us in written:  # told here, on the loop, as an executor tells them
                    tell(self._observers, run, change, time_us)
                prior = next((r.steps for r in recovery.runs if r.run == run), None)
                self._say_asked(recovery)
                for orphan in recovery.orphans:
                    self._say(
                        f"{run}: orphan {orphan.step}#{orphan.attempt} ended"
                        f" {type(orphan.to_state).__name__}",
                        logging.WARNING,
                    )
                # docs/contracts.md, "Admission across workers": only now that
                # no attempt of an older fence is Running in the journal may
                # the slots it held be taken again.
                for freed in free_slots_of_taken_over_run(conn, self._schema, run, lease):
                    self._say(
                        f"{run}: freed slot {freed.slot} of pool {freed.pool!r}"
                        f" held by {freed.step}#{freed.attempt} of worker {freed.worker}"
                    )
            view = journal.one_run(run, fresh=not claim.written)

            def taken_up(recovery: Recovery) -> None:
                unsaid.clear()  # said now, as answers of a takeover that completed
                self._say_asked(recovery)

            executor = Executor(
                view,
                admission_limit=self._admission_limit,
                progress=self._progress,
                pools=self._pools,
                let_go_after=LET_GO_AFTER,
                observers=self._observers,
                on_taken_up=taken_up,
                on_asked=unsaid.extend,
            )
            self._executors.add(executor)
            self._driving[run] = executor
            if self._stop_reason is not None:
                executor.stop(self._stop_reason, grace=self._grace)
            control = RunControl()
            cancels = [] if claim.written or not claim.mail else self._queued_cancels(conn, run, control)
            report = await executor.run(workflow, run, control=control, prior=prior, input=claim.input)
            if cancels:  # recorded now (the run's end is durable): the rows go
                conn.execute(_statement(INBOX_TAKEN, self._schema), (cancels,))
            if not claim.written and claim.mail:
                # What was sent while it was queued and is still there (it ended
                # before the next look): taken in now, or dropped saying why.
                self._take_in(conn)
            schema = self._schema
            if report.status == "interrupted":  # stopped: back to the queue, for another worker
                conn.execute(_statement(_RELEASE, schema), (run, lease.owner, lease.fence))
                self._say(f"{run}: stopped and released")
                return False
            if report.status == "waiting":  # let go: released until its wake time or a change
                del self._driving[run]  # what comes for it now waits in the inbox
                wake = self._release_waiting(journal, conn, run, lease)
                self._say(f"{run}: waiting, released ({wake})")
                return False
            if view.end:  # the run's end and the row's close: one statement (see `_OneRun`)
                await journal.complete(run, view.end, outcome=report.status)
            elif conn.execute(
                _statement(_COMPLETE, schema), (report.status, run, lease.owner, lease.fence)
            ).rowcount != 1:
                raise LeaseLost(run, lease)
        except LeaseLost as lost:
            self._say(f"{run}: LeaseLost: {lost}", logging.WARNING)
            self._lost(run)
            return False
        except WorkflowDiverged as diverged:
            # Nothing was written for the run. Its row is closed as "diverged",
            # so that no worker with this code takes it again and again; the
            # journal still holds it unfinished, and `recover URL --workflows`
            # with the code it started with resumes it.
            self._say(f"{run}: {diverged}", logging.ERROR)
            if conn.execute(
                _statement(_COMPLETE, self._schema), ("diverged", run, lease.owner, lease.fence)
            ).rowcount != 1:
                self._say(f"{run}: LeaseLost: {LeaseLost(run, lease)}", logging.WARNING)
                self._lost(run)
                return False
            return True
        finally:
            # What the reconcilers said is a fact about the downstream systems,
            # said even though the takeover that asked failed (`_recover` says
            # a DAG run's the same way).
            self._say_answers(unsaid, completed=False)
            if executor is not None:
                self._executors.discard(executor)
            self._driving.pop(run, None)
            self._leases.pop(run, None)
        self._say(f"{run}: {report.status}")
        return True

    def _queued_cancels(
        self, conn: psycopg.Connection[tuple[object, ...]], run: str, control: RunControl
    ) -> list[int]:
        """The inbox rows of a cancel sent while ``run`` was queued (no record yet):
        ``control`` is cancelled with the first one's reason, so the run's start is
        followed by its cancel before any step starts (docs/contracts.md, "Signals
        and cancels reach a queued run"). Signals stay for `_take_in`, once the run
        runs; the rows returned are deleted once the cancel is recorded.
        """
        rows = conn.execute(_statement(INBOX_OF, self._schema), ([run],)).fetchall()
        cancels: list[int] = []
        for number, _, line in rows:
            assert type(number) is int and type(line) is bytes
            change = inbox_change(line)
            if isinstance(change, RunCancelRequested):
                if not cancels:
                    control.cancel(change.reason)
                    self._say(f"{run}: took in RunCancelRequested from the inbox: cancelled before it starts")
                cancels.append(number)
        return cancels

    def _lost(self, run: str) -> None:
        if self._watcher is not None:
            self._watcher.lease_lost(self.id, run)

    def _recover(self, run: str, mail: bool) -> tuple[Recovery, list[tuple[Change, int]]]:
        """`recover` limited to ``run``, on a journal of its own (this runs in a thread:
        reconcilers need an event loop, and a connection serves one thread); and
        what it wrote, each with its time, for the worker's observers.

        With ``mail``, the operators' changes waiting in the inbox for the run
        are taken in first (so that a cancel sent while the run was released
        closes it here), and their rows deleted once they are recorded.
        """
        answers: list[Asked] = []
        try:
            with PgJournal(self._url, schema=self._schema, leases=self._leases) as journal:
                if mail:
                    with connect(self._url, idle_in_transaction=self._dead_after) as inbox:
                        self._take_in_at_claim(journal, inbox, run)
                kept = _Kept()
                recovery = recover(
                    _OneRun(journal, journal, run),
                    self._workflows,
                    source=f"journal {self._schema!r}",
                    only_runs=frozenset({run}),
                    observers=(kept,),
                    on_asked=answers.extend,
                )
                return recovery, kept.written
        except BaseException:
            # What the reconcilers said is a fact about the downstream systems, which
            # someone may need: said even though the takeover failed once they answered.
            self._say_answers(answers, completed=False)
            raise

    def _take_in_at_claim(
        self, journal: PgJournal, inbox: psycopg.Connection[tuple[object, ...]], run: str
    ) -> None:
        rows = inbox.execute(_statement(INBOX_OF, self._schema), ([run],)).fetchall()
        ledger = Ledger()
        ledger.feed(journal.read_run(run))
        taken: list[int] = []
        for number, _, line in rows:
            assert type(number) is int and type(line) is bytes
            change = inbox_change(line)
            why = change if isinstance(change, str) else refusal(ledger, run, change)
            if why is None and not isinstance(change, str):
                journal.append(run, change)
                ledger.apply_change(run, change)
                self._say(f"{run}: took in {type(change).__name__} from the inbox")
            else:
                self._say(f"{run}: dropped an inbox entry: {why}")
            taken.append(number)
        journal.flush()
        if taken:
            inbox.execute(_statement(INBOX_TAKEN, self._schema), (taken,))

    def _take_in(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Hand what waits in the inbox for the runs this worker drives to their executors
        (`hand_in`: one query for all of them; a row of a run whose append fails stays
        for the run's next holder)."""
        driving = self._driving
        hand_in(conn, self._schema, {run: executor.deliver for run, executor in driving.items()}, self._say)

    def _release_waiting(
        self,
        journal: _WorkerJournal,
        conn: psycopg.Connection[tuple[object, ...]],
        run: str,
        lease: Lease,
    ) -> str:
        """Release a run its executor let go of while it waits; say until when.

        Its wake is read from the journal: now when a signal one of its
        waits takes is recorded already or its cancel is decided (both can
        be taken in while the executor lets go), else its earliest wake
        time, else never ('infinity': only a signal wakes it). An operator's
        change that came meanwhile is in the inbox: the run is claimable
        now then (see `_LOCK_HELD`).
        """
        ledger = Ledger()
        ledger.feed(journal.read_run(run))
        view = ledger.runs.get(run)
        waits = [] if view is None else view.open_waits()
        now = view is None or view.cancel_requested or not waits or any(
            w.signal is not None and view.untaken(w.signal) is not None for w in waits
        )
        wakes = [w.wake_us for w in waits if w.wake_us is not None]
        wake = min(wakes) if wakes else None
        schema = self._schema
        with conn.transaction():
            if conn.execute(_statement(_LOCK_HELD, schema), (run, lease.owner, lease.fence)).fetchone() is None:
                raise LeaseLost(run, lease)
            conn.execute(
                _statement(_RELEASE_WAITING, schema),
                {"now": now, "run": run, "wake": wake, "owner": lease.owner, "fence": lease.fence},
            )
        journal.forget(run)  # operators may write it now; whoever claims it reads it first
        if now:
            return "claimable now"
        if wake is None:
            return "until a signal"
        return "until " + datetime.datetime.fromtimestamp(wake / 1e6, datetime.timezone.utc).isoformat()

    # ------------------------------------------------------------ the loop

    async def _serve(self, stop_on_signals: bool) -> int:
        loop = asyncio.get_running_loop()

        def on_signal(number: int) -> None:
            self.stop(signal.Signals(number).name)

        self._closed = 0
        with handling_signals(loop, on_signal) if stop_on_signals else contextlib.nullcontext():
            since: float | None = None  # when the database was found unreachable
            while True:
                session = await self._reconnect(since)
                if session is None:  # stopped while it waited for the database
                    return self._closed
                since = await self._session(session)
                if since is None or self._stop_reason is not None:
                    return self._closed

    async def _reconnect(self, since: float | None) -> _Session | None:
        """Open a session, retrying while the database is unreachable (`Backoff`).

        ``since``: when the outage began (None: the worker's start, which
        waits for the database the same way). A wait that would end past
        ``reconnect_for`` seconds after that is cut to end there, for one
        last try; gives up with `PgConnectFailed` when that fails. None when
        the worker was stopped while it waited.
        """
        backoff = self._backoff
        began = backoff.clock() if since is None else since
        attempt = 0
        last = False  # the try at the window's end was made
        while True:
            try:
                return await asyncio.to_thread(self._open)
            except Exception as error:  # noqa: BLE001  # re-raised unless the database is unreachable
                if not connection_lost(error):
                    raise
                reason = " ".join(str(error).split()) or type(error).__name__
                reason = reason.removeprefix(f"cannot connect to {database_named(self._url)}: ")
            delay = backoff.delay(attempt)
            attempt += 1
            waited = backoff.clock() - began
            if self._reconnect_for == 0 or last or waited >= self._reconnect_for:
                # Said in words, not as the parameter: the CLI adds the flag that sets the
                # window (`--reconnect-for`) after the last words.
                raise PgConnectFailed(
                    f"database unavailable: {database_named(self._url)} was unreachable (last error:"
                    f" {reason}), so worker {self.id} stopped at the first failure, without trying to reconnect"
                    if self._reconnect_for == 0 else
                    f"database unavailable: {database_named(self._url)} stayed unreachable for"
                    f" {waited:.1f} s (last error: {reason}), so worker {self.id} stopped after trying to"
                    f" reconnect for {self._reconnect_for:g} s"
                )  # fmt: skip
            if waited + delay >= self._reconnect_for:  # one more try, as the window ends
                delay, last = self._reconnect_for - waited, True
            self._say(
                f"{database_named(self._url)} is unreachable ({reason}); connecting again in"
                f" {delay:.2f} s (attempt {attempt})",
                logging.WARNING,
            )
            await backoff.sleep(delay)
            if self._stop_reason is not None:
                return None

    def _open(self) -> _Session:
        """Connect (the journal, the claims' connection, the slots'), check the pools, register.

        After an outage, the id the worker had is retired (marked dead) in
        the transaction that registers a fresh one: the runs it dropped are
        then a dead worker's, taken over (by this worker or another) on the
        fenced path, with recovery of their live attempts and their slots
        freed.
        """
        url, schema = self._url, self._schema
        pg = PgJournal(url, schema=schema, leases=self._leases)
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        slots_conn: psycopg.Connection[tuple[object, ...]] | None = None
        try:
            # A worker stopped inside one of its transactions is presumed dead after
            # dead_after: the server ends the session then, and its row locks go
            # (`IDLE_IN_TRANSACTION`), so a takeover or an operator never waits for it.
            conn = connect(url, idle_in_transaction=self._dead_after)
            # Claims commit asynchronously: the run's synchronous
            # commits (Dispatched, its closing) come later in the WAL and make
            # them durable too.
            conn.execute("SET synchronous_commit = off")
            # A step naming a pool the journal lacks would only ever time out.
            check_pools(conn, schema, self._workflows.values())
            # A code workflow's steps may name a pool at any call: take slots
            # for whatever they name.
            if pools_named(self._workflows.values()) or any(
                w.function is not None for w in self._workflows.values()
            ):
                slots_conn = connect(url, idle_in_transaction=self._dead_after)
            fresh = str(uuid.uuid4()) if self._registered else self._id
            with conn.transaction():
                if self._registered:
                    conn.execute(_statement(_RETIRE, schema), (self._id,))
                conn.execute(_statement(_REGISTER, schema), (fresh, socket.gethostname(), os.getpid()))
        except BaseException:
            for opened in (slots_conn, conn, pg):
                if opened is not None:
                    opened.close()
            raise
        if self._registered:
            self._say(
                f"worker {self._id} is retired after the outage; it goes on as worker {fresh}"
                " (the runs it held are taken over)",
                logging.WARNING,
            )
        self._id = fresh
        self._registered = True
        if slots_conn is not None:
            self._pools = SlotAdmission(slots_conn, schema=schema, worker=fresh, leases=self._leases)
        return _Session(pg=pg, conn=conn, slots_conn=slots_conn)

    async def _session(self, session: _Session) -> float | None:
        """Claim and drive runs on ``session`` until stopped, idle, or the database fails.

        Returns when the database was found unreachable (the backoff's
        clock), once every run it drove is dropped; None when it stopped
        otherwise. Raises `WorkerDeclaredDead` when its heartbeat expired
        while the database answered (a frozen process), as before.
        """
        schema = self._schema
        conn = session.conn
        heart = _Heart(self._url, schema, self.id, self._heartbeat, self._clock)
        self._heart = heart
        tasks: dict[asyncio.Task[bool], str] = {}
        expired = False
        outage: BaseException | None = None
        errors: list[BaseException] = []
        try:
            heart.start()
            if self._watcher is not None:
                self._watcher.started(self.id)
            self._say(f"worker {self.id} started")
            journal = _WorkerJournal(session.pg, self._verdict, heart, self._dead_after, self._say)
            poll = min(self._heartbeat / 2, INBOX_POLL)
            swept = -poll
            looked = -poll
            while self._stop_reason is None and outage is None:
                verdict = self._verdict()
                if verdict is LeaseVerdict.EXPIRED:
                    expired = True
                    break
                try:
                    if may_dispatch(verdict):
                        if time.monotonic() - swept >= poll:  # a dead worker's runs wait at most poll longer
                            swept = time.monotonic()
                            self._find_dead(conn)
                        # One statement claims a run for each free slot: a claim
                        # blocks the loop (every run it drives) for a round trip.
                        free = self._concurrency - len(tasks)
                        for claim in self._claim(conn, free) if free > 0 else ():
                            task = asyncio.ensure_future(self._drive(journal, conn, claim))
                            tasks[task] = claim.run
                    if self._driving and time.monotonic() - looked >= INBOX_POLL:
                        looked = time.monotonic()
                        self._take_in(conn)
                    if not tasks and self._stop_when_idle and self._idle(conn):
                        break
                except Exception as error:  # noqa: BLE001  # re-raised unless the database is unreachable
                    if not connection_lost(error):
                        raise
                    outage = error
                    break
                if tasks:
                    done, _ = await asyncio.wait(
                        list(tasks), timeout=poll, return_when=asyncio.FIRST_COMPLETED
                    )
                    for task in done:
                        del tasks[task]
                        try:
                            self._closed += task.result()
                        except Exception as error:  # noqa: BLE001  # re-raised unless the database is unreachable
                            if not connection_lost(error):
                                raise
                            outage = outage or error
                else:
                    await asyncio.sleep(poll)
        finally:
            noticed = self._backoff.clock()  # the outage's start, for reconnect_for
            if outage is None and expired:
                outage = heart.unreachable()  # it could not beat lately: the database is unreachable
            reason = self._stop_reason or (
                "the database connection failed" if outage is not None
                else "this worker's heartbeat expired" if expired
                else "the worker stopped"
            )  # fmt: skip
            # An outage stops the executors at once: their writes fail, and
            # the runs are taken over after the reconnect.
            grace = 0.0 if outage is not None else self._grace
            for executor in list(self._executors):
                executor.stop(reason, grace=grace)
            for task in tasks:
                try:
                    self._closed += await task
                except Exception as error:  # noqa: BLE001  # re-raised below
                    if connection_lost(error):
                        outage = outage or error
                    else:
                        errors.append(error)
            heart.halt()
            if outage is None:
                try:
                    conn.execute(_statement(_RETIRE, schema), (self.id,))
                except psycopg.Error:
                    pass  # its heartbeat expires anyway
            try:
                session.close()
            except Exception as error:  # noqa: BLE001  # re-raised unless the database is unreachable
                if not connection_lost(error):
                    raise
                # The journal's last flush found the database gone (its sessions
                # ended while this worker was frozen, a restart as it stopped):
                # an outage like any other, never an error that ends the worker.
                outage = outage or error
        if errors:
            raise errors[0]
        if outage is not None:
            self._say(
                f"worker {self.id}: the database connection failed"
                f" ({' '.join(str(outage).split()) or type(outage).__name__}); it stopped"
                " starting attempts, dropped its runs, and connects again",
                logging.WARNING,
            )
            return noticed
        if heart.declared_dead or expired:
            raise WorkerDeclaredDead(
                f"worker {self.id}: its heartbeat expired"
                + (" and another worker declared it dead" if heart.declared_dead else "")
                + f"; it stopped after closing {self._closed} run(s); start a new worker process"
            )
        return None


@final
@dataclass(slots=True, kw_only=True)
class _Session:
    """What a worker holds between two outages: its journal and its connections."""

    pg: PgJournal
    conn: psycopg.Connection[tuple[object, ...]]
    slots_conn: psycopg.Connection[tuple[object, ...]] | None

    def close(self) -> None:
        self.conn.close()
        if self.slots_conn is not None:
            self.slots_conn.close()
        self.pg.close()


def run_worker(
    url: str,
    workflows: Iterable[Workflow],
    *,
    schema: str = DEFAULT_SCHEMA,
    concurrency: int = 4,
    heartbeat: float = 1.0,
    dead_after: float = 5.0,
    stop_when_idle: bool = False,
    progress: Callable[[str], None] | None = None,
    stop_on_signals: bool = False,
    observers: Sequence[RunObserver] = (),
    watcher: WorkerWatcher | None = None,
    reconnect_for: float = RECONNECT_FOR,
    backoff: Backoff | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run one worker (`Worker`) until it is stopped; return how many runs it closed."""
    worker = Worker(
        url,
        workflows,
        schema=schema,
        concurrency=concurrency,
        heartbeat=heartbeat,
        dead_after=dead_after,
        stop_when_idle=stop_when_idle,
        progress=progress,
        observers=observers,
        watcher=watcher,
        reconnect_for=reconnect_for,
        backoff=backoff,
        clock=clock,
    )
    return worker.run(stop_on_signals=stop_on_signals)
