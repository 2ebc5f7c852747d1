"""Admission across workers: pools of slots in the PostgreSQL journal
(docs/contracts.md, "Admission across workers").

Owns the ``pools`` and ``slots`` tables (migration 3 of `_journal`):
making and resizing a pool (`set_pool`, `list_pools`), and the statements a
worker takes, frees and takes back slots with (`SlotAdmission`,
`free_slots_of_taken_over_run`). It applies no kernel rule (the executor
appends ``Admit`` and the terminal record; recovery ends orphans) and
judges no lease (it only checks, in each claim, the fence the worker holds).

Theory of operation:

- A pool of N slots is N rows ``(pool, slot)``, slot 0 to N - 1. A row is
  free or held by exactly one attempt (run, step, attempt), with the worker and
  the run's fence that took it. Nothing ever counts held rows to decide
  admission (a limit counted under SKIP LOCKED is exceeded: a reported bug
  elsewhere); a claim locks one free row ``FOR UPDATE SKIP LOCKED`` and writes
  the holder into it, so two claims can never hold one row.
- The executor takes a slot while the attempt is ``Pending``, before it
  appends ``Admit``, and frees it after the terminal record: so at every
  moment the attempts ``Running`` in the journal hold distinct slots, and
  never more than N run at once, whatever the number of workers.
- A claim is fenced like an append: it writes nothing unless the run's
  ``runs`` row still names this worker and fence (read ``FOR SHARE``, so a
  takeover waits for the claim to commit, or the claim sees the new fence
  and raises `LeaseLost`). A worker whose log failed before an attempt's
  terminal record keeps the slot held: the attempt may still be ``Running``
  in the journal.
- A takeover first ends the dead worker's orphans (recovery), then frees
  every slot of the run taken under an older fence, checking in the same
  statement that it holds the run at the new fence.
- Waiting is polling with a growing pause (10 ms to 200 ms), up to the
  step's ``queue_deadline``; ``LISTEN/NOTIFY`` would serialise commits (what
  the systems that do this today got wrong). Waiters are not served in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow
from typing_extensions import LiteralString, final

from .._errors import AttemptKernelError
from ._journal import DEFAULT_SCHEMA, Lease, LeaseLost, PgJournal, PgJournalError, connect, untextable
from .._workflow import Step, Workflow

FIRST_PAUSE: Final = 0.01
"""Seconds a waiting attempt sleeps after its first refused claim (doubling each time)."""

LONGEST_PAUSE: Final = 0.2
"""The longest sleep between two claims of a waiting attempt, in seconds."""

# --------------------------------------------------------------------------
# Errors and values
# --------------------------------------------------------------------------


@final
class PoolMissing(AttemptKernelError):
    """A workflow's step names a pool the journal does not have; nothing was started."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PoolState:
    """One pool: its ``name``, its size (``slots``) and how many slots are ``held`` now.

    ``held`` can exceed ``slots`` just after a pool shrank: a running attempt
    is never stopped for it, and a slot above the size is not taken again.
    """

    name: str
    slots: int
    held: int


# --------------------------------------------------------------------------
# Statements ({s} is the schema)
# --------------------------------------------------------------------------

_SET_SIZE: Final[LiteralString] = (
    "INSERT INTO {s}.pools (name, slots) VALUES (%(name)s, %(slots)s)"
    " ON CONFLICT (name) DO UPDATE SET slots = excluded.slots, changed_at = now()"
)
_ADD_ROWS: Final[LiteralString] = (
    "INSERT INTO {s}.slots (pool, slot)"
    " SELECT %(name)s, n FROM generate_series(0, %(slots)s - 1) AS n"
    " ON CONFLICT (pool, slot) DO NOTHING"
)
# A held row above the size stays until its attempt ends (then it is free but
# above the size, so no claim takes it, and the next resize deletes it).
_DROP_ROWS: Final[LiteralString] = (
    "DELETE FROM {s}.slots WHERE pool = %(name)s AND slot >= %(slots)s AND run IS NULL"
)
_LIST: Final[LiteralString] = (
    "SELECT p.name, p.slots, count(t.run) FROM {s}.pools p"
    " LEFT JOIN {s}.slots t ON t.pool = p.name"
    " WHERE %(names)s::text[] IS NULL OR p.name = ANY(%(names)s)"
    " GROUP BY p.name, p.slots ORDER BY p.name"
)
# The fenced claim: one free row below the pool's size, locked SKIP LOCKED, is
# given the attempt only if the run's row still names this worker and fence.
_CLAIM: Final[LiteralString] = (
    "WITH lease AS ("
    "  SELECT 1 FROM {s}.runs WHERE run = %(run)s AND owner = %(worker)s AND fence = %(fence)s"
    "  FOR SHARE),"
    " free AS ("
    "  SELECT t.pool, t.slot FROM {s}.slots t JOIN {s}.pools p ON p.name = t.pool"
    "  WHERE t.pool = %(pool)s AND t.run IS NULL AND t.slot < p.slots"
    "  ORDER BY t.slot LIMIT 1 FOR UPDATE OF t SKIP LOCKED),"
    " taken AS ("
    "  UPDATE {s}.slots AS t SET run = %(run)s, step = %(step)s, attempt = %(attempt)s,"
    "   worker = %(worker)s, fence = %(fence)s, taken_at = now()"
    "  FROM free WHERE t.pool = free.pool AND t.slot = free.slot AND EXISTS (SELECT 1 FROM lease)"
    "  RETURNING t.slot)"
    " SELECT EXISTS (SELECT 1 FROM lease), (SELECT slot FROM taken)"
)
_FREE: Final[LiteralString] = (
    "UPDATE {s}.slots AS t SET run = NULL, step = NULL, attempt = NULL, worker = NULL,"
    " fence = NULL, taken_at = NULL"
)
# The holder is matched whole: a slot freed by a takeover and taken again by
# another attempt is never freed by the old holder.
_RELEASE: Final[LiteralString] = (
    _FREE + " WHERE t.pool = %s AND t.slot = %s AND t.run = %s AND t.step = %s"
    " AND t.attempt = %s AND t.worker = %s AND t.fence = %s"
)
_FREE_TAKEN_OVER: Final[LiteralString] = (
    "WITH old AS ("
    "  SELECT pool, slot, step, attempt, worker FROM {s}.slots"
    "  WHERE run = %(run)s AND fence < %(fence)s"
    "  AND EXISTS (SELECT 1 FROM {s}.runs WHERE run = %(run)s AND owner = %(worker)s"
    "   AND fence = %(fence)s FOR SHARE)"
    "  FOR UPDATE)"
    " " + _FREE + " FROM old WHERE t.pool = old.pool AND t.slot = old.slot"
    " RETURNING old.pool, old.slot, old.step, old.attempt, old.worker"
)


def _statement(text: LiteralString, schema: str) -> sql.Composed:
    return sql.SQL(text).format(s=sql.Identifier(schema))


def slot_step(step: str) -> str:
    """``step`` as the slots table keeps it: a NUL and a lone surrogate, which PostgreSQL
    text cannot hold (`untextable`), escaped as Python writes them (``\\x00``,
    ``\\ud800``); any other name as it is.

    The table's step names who holds a slot, for a release (matched with the
    slot, run, attempt, worker and fence, which tell holders apart whatever
    the name) and for messages (`FreedSlot`). A code workflow may make a
    step's name from the run's input: the claim of such a step must not fail
    in the database, which would stop the worker and then every worker that
    took the run over.
    """
    if untextable(step) is None:
        return step
    return step.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _check_name(name: object) -> str:
    # typed str; this guards callers (and the command line) that ignored it
    if type(name) is not str or not name or len(name) > 200:
        raise ValueError(f"a pool name must be a non-empty string of at most 200 characters, got {name!r}")
    found = untextable(name)
    if found is not None:
        raise ValueError(f"a pool name must be text PostgreSQL can hold: {name!r} holds {found}")
    return name


# --------------------------------------------------------------------------
# Making and reading pools
# --------------------------------------------------------------------------


def set_pool(url: str, name: str, slots: int, *, schema: str = DEFAULT_SCHEMA) -> PoolState:
    """Create pool ``name`` with ``slots`` slots, or resize it; return it as it now is.

    Any number of workers share it: never more than ``slots`` attempts of
    steps naming it run at once. Growing takes effect at once; shrinking
    stops no running attempt (a slot above the new size is not taken again
    once freed). ``slots=0`` pauses the pool: its attempts wait, each up to
    its step's queue deadline. Migrates the journal's tables first.
    """
    _check_name(name)
    if type(slots) is not int or slots < 0:
        raise ValueError(f"slots must be a whole number, 0 or more, got {slots!r}")
    with PgJournal(url, schema=schema):  # connects (naming the host on failure) and migrates
        pass
    values = {"name": name, "slots": slots}
    try:
        with connect(url) as conn, conn.transaction():
            for text in (_SET_SIZE, _ADD_ROWS, _DROP_ROWS):
                conn.execute(_statement(text, schema), values)
            found = _pools(conn, schema, [name])
    except psycopg.Error as error:
        raise PgJournalError(f"setting pool {name!r} to {slots} slots failed: {error}") from error
    assert len(found) == 1  # written in the transaction above
    return found[0]


def list_pools(url: str, *, schema: str = DEFAULT_SCHEMA) -> tuple[PoolState, ...]:
    """Every pool of the journal, by name, with its size and how many slots are held now."""
    with PgJournal(url, schema=schema):
        pass
    with connect(url) as conn:
        return _pools(conn, schema, None)


def _pools(
    conn: psycopg.Connection[TupleRow], schema: str, names: list[str] | None
) -> tuple[PoolState, ...]:
    found: list[PoolState] = []
    for row in conn.execute(_statement(_LIST, schema), {"names": names}).fetchall():
        name, slots, held = row
        if type(name) is not str or type(slots) is not int or type(held) is not int:
            raise PgJournalError(f"the pools table answered {row!r}")
        found.append(PoolState(name=name, slots=slots, held=held))
    return tuple(found)


def pools_named(workflows: Iterable[Workflow]) -> dict[str, str]:
    """Each pool the workflows' steps name, with the first step naming it (for messages).

    A code workflow's steps are known only as its function calls them: the
    pool its steps default to is named here; one a ``run.step`` call names
    is not (a missing pool then holds the attempt `Pending` until its queue
    deadline passes).
    """
    named: dict[str, str] = {}
    for workflow in workflows:
        pool = workflow.defaults.pool
        if workflow.function is not None and pool is not None and pool not in named:
            named[pool] = f"workflow {workflow.name!r} (the pool its steps default to)"
        for step in workflow.steps:
            if step.pool is not None and step.pool not in named:
                named[step.pool] = f"workflow {workflow.name!r}, step {step.name!r}"
    return named


def check_pools(conn: psycopg.Connection[TupleRow], schema: str, workflows: Iterable[Workflow]) -> None:
    """Raise `PoolMissing` for a pool some step names that the journal does not have."""
    named = pools_named(workflows)
    if not named:
        return
    have = {state.name for state in _pools(conn, schema, sorted(named))}
    for pool, where in named.items():
        if pool not in have:
            raise PoolMissing(
                f"{where} needs pool {pool!r}, which the journal in schema {schema!r} does"
                f" not have; create it first: attempt-kernel pool URL {pool} --slots N"
                f" (or set_pool(url, {pool!r}, N))"
            )


# --------------------------------------------------------------------------
# Taking and freeing slots
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Held:
    pool: str
    slot: int
    fence: int


@final
class SlotAdmission:
    """The `PoolAdmission` of one worker: slots of the journal's pools, fenced by its leases.

    ``conn`` is an autocommit connection of its own, used from the worker's
    event loop; ``leases`` is the worker's map of the runs it holds (read at
    every claim). Claims and frees commit asynchronously: a later
    synchronous commit (the next ``Dispatched``, a flush) makes them durable,
    and a server that lost them lost the records that followed them too.
    """

    def __init__(
        self,
        conn: psycopg.Connection[TupleRow],
        *,
        schema: str,
        worker: str,
        leases: Mapping[str, Lease],
    ) -> None:
        self._conn: Final = conn
        self._worker: Final = worker
        self._leases: Final = leases
        self._claim: Final = _statement(_CLAIM, schema)
        self._release: Final = _statement(_RELEASE, schema)
        self._held: Final[dict[tuple[str, str, int], _Held]] = {}
        conn.execute("SET synchronous_commit = off")

    async def acquire(self, run: str, step: Step, attempt: int) -> bool:
        pool = step.pool
        if pool is None:
            raise ValueError(f"step {step.name!r} names no pool; the executor admits it itself")
        deadline = time.monotonic() + step.queue_deadline
        pause = FIRST_PAUSE
        while True:
            # No await between a claim and its answer: a cancellation lands
            # only in the sleep, when nothing is held.
            if self._try(run, step.name, attempt, pool):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, LONGEST_PAUSE)

    def _try(self, run: str, step: str, attempt: int, pool: str) -> bool:
        lease = self._leases.get(run)
        if lease is None or lease.owner != self._worker:
            raise LeaseLost(run, None)
        if untextable(pool) is not None:
            # No pool of that name can exist (`set_pool` could not make it): as for
            # any pool the journal does not have, no slot is free, and the step waits
            # out its queue deadline. Asked, the database would refuse the statement.
            return False
        values = {
            "run": run,
            "step": slot_step(step),
            "attempt": attempt,
            "worker": self._worker,
            "fence": lease.fence,
            "pool": pool,
        }
        try:
            row = self._conn.execute(self._claim, values).fetchone()
        except psycopg.Error as error:
            raise PgJournalError(
                f"run {run!r}: claiming a slot of pool {pool!r} for step {step!r} attempt {attempt} failed: {error}"
            ) from error
        if row is None or type(row[0]) is not bool:
            raise PgJournalError(f"the slots table answered {row!r} for a claim")
        held, slot = row
        if not held:
            raise LeaseLost(run, lease)
        if slot is None:
            return False
        if type(slot) is not int:
            raise PgJournalError(f"the slots table answered {row!r} for a claim")
        self._held[(run, step, attempt)] = _Held(pool=pool, slot=slot, fence=lease.fence)
        return True

    def release(self, run: str, step: Step, attempt: int, *, ended: bool) -> None:
        held = self._held.pop((run, step.name, attempt), None)
        if held is None or not ended:
            return  # not ended: the attempt may be Running in the journal; a takeover frees it
        values = (held.pool, held.slot, run, slot_step(step.name), attempt, self._worker, held.fence)
        try:
            self._conn.execute(self._release, values)
        except psycopg.Error as error:
            raise PgJournalError(
                f"run {run!r}: freeing slot {held.slot} of pool {held.pool!r} failed: {error}"
            ) from error

    def held(self) -> int:
        """How many slots this worker holds now (for tests and progress)."""
        return len(self._held)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FreedSlot:
    """A slot a takeover freed: which pool and slot, and the attempt and worker that held it."""

    pool: str
    slot: int
    step: str
    attempt: int
    worker: str


def free_slots_of_taken_over_run(
    conn: psycopg.Connection[TupleRow], schema: str, run: str, lease: Lease
) -> tuple[FreedSlot, ...]:
    """Free every slot of ``run`` taken under a fence older than ``lease``'s.

    Call it after recovery ended the run's orphans (so no attempt that held
    one is still ``Running`` in the journal). Fenced: it frees nothing
    unless the run's row still names ``lease``; then `LeaseLost`.
    """
    values = {"run": run, "fence": lease.fence, "worker": lease.owner}
    try:
        with conn.transaction():
            rows = conn.execute(_statement(_FREE_TAKEN_OVER, schema), values).fetchall()
            if not rows:
                row = conn.execute(
                    _statement(
                        "SELECT 1 FROM {s}.runs WHERE run = %s AND owner = %s AND fence = %s", schema
                    ),
                    (run, lease.owner, lease.fence),
                ).fetchone()
                if row is None:
                    raise LeaseLost(run, lease)
    except psycopg.Error as error:
        raise PgJournalError(f"run {run!r}: freeing the slots of a taken-over run failed: {error}") from error
    freed: list[FreedSlot] = []
    for pool, slot, step, attempt, worker in rows:
        if (
            type(pool) is not str
            or type(slot) is not int
            or type(step) is not str
            or type(attempt) is not int
            or type(worker) is not str
        ):
            raise PgJournalError(f"the slots table answered {(pool, slot, step, attempt, worker)!r}")
        freed.append(FreedSlot(pool=pool, slot=slot, step=step, attempt=attempt, worker=worker))
    return tuple(freed)
