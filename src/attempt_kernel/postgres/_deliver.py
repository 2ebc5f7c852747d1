"""An operator's change delivered to a run in a PostgreSQL journal: signal, cancel, reconcile, resume.

Owns the transaction that delivers a change (`deliver_pg`) and the form of
an ``inbox`` row (`inbox_change`); it decides nothing itself (`_operate`
builds the change from a ledger and says why one is refused) and drives no
run (a worker takes its inbox in, `_worker`; a process that holds runs
outside a worker, `PgJournal.take_in`).

Theory of operation:

- An operator holds no lease. `deliver_pg` locks the run's ``runs`` row
  (``FOR UPDATE``), and only then reads the run's records and builds the
  change, all in one transaction: a worker's fenced appends take the same
  row ``FOR SHARE`` and its release takes it ``FOR UPDATE``, so the records
  read are the run's last ones and the row says truly who holds the run.
- A run a live worker holds (an owner not found dead, the row not done):
  the change goes to the ``inbox`` as the line the journal would hold;
  that worker takes it in within about a second, through its executor,
  and deletes the row after (a crash between: the next holder's
  `refusal` drops what was taken in already). ``recorded`` is False.
- A run another process drives outside a worker, holding it
  (``attempt-kernel run URL`` or ``recover URL``, `RunHolds`: an exclusive
  advisory lock on the run's key): the change goes to the ``inbox`` too,
  since that process numbers the run's records; it takes the change in
  within about a second (`PgJournal.take_in`). ``recorded`` is False. A
  submitted run is woken as well (``wake_at`` cleared): no worker claims it
  while it is held, and once the process lets go (or is stopped) one
  claims it and takes the change in. The
  check takes the same key shared for the transaction, so a process that
  comes to take the run up meanwhile finds it held (and leaves it, as it
  leaves a run another process drives) rather than reading its records
  before the change is committed. Senders to one run go one at a time (an
  advisory lock on another key of the run, `send_key`, for the
  transaction): a run ``run URL`` started has no row to lock. A process
  that lets go of a run takes that key once before it reads the inbox a
  last time (`RunHolds.let_go`), so a sender that found the run held has
  committed by then and its change is read.
- A queued run (its row not done, no record of it yet): a signal or a
  cancel, checked against the run as it will stand once started, goes to
  the ``inbox`` too (``queued`` True), until a worker starts the run: the
  worker records a cancel before any step starts, and takes a signal in
  once the run runs.
- A run whose inbox still holds an earlier change (sent while a worker
  held the run, which then died or let go of it before taking the change
  in): the change goes to the ``inbox`` behind it (``recorded`` False, the
  run woken), so that the run's next holder takes both in, in the order
  sent. Written straight into the journal, it would come before the
  earlier one, and a wait would take the later signal first.
- Any other run: the record is appended with the run's next number, read
  after the lock, and ``wake_at`` is cleared so that a free worker claims
  the run (a signal wakes it, a cancel closes it). A reconciliation that
  leaves a run that ended needing reconciliation with nothing outstanding
  reopens its row (``done = false``), so a worker resumes it. A run with no
  row (started by ``attempt-kernel run URL``, not submitted) that no
  process holds is written directly. ``recorded`` is True.
- The transaction commits synchronously: the change is durable when
  `deliver_pg` returns, in the journal or in the inbox.
- A resume (`resume_pg`) writes no record: it makes an unfinished run that
  no live worker holds claimable now (``wake_at`` cleared, a dead owner
  dropped, a closed row reopened), so that a worker of its workflow takes
  it up at its next claim.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

import psycopg
from typing_extensions import LiteralString, final

from .._codec import encode_record
from .._ledger import Ledger
from .._operate import Build, Delivered, Delivery, OperationRefused, refusal
from ._journal import (
    DEFAULT_SCHEMA,
    PgJournal,
    PgJournalError,
    connect,
    held_by_a_process,
    in_schema,
    inbox_change,
    send_key,
    summary_of,
    summary_upsert_after,
    untextable,
)
from .._records import Record, RunStarted

# {s} is the schema.
_LOCK: Final[LiteralString] = (
    "SELECT r.done, r.owner IS NOT NULL AND NOT r.done AND EXISTS"
    " (SELECT 1 FROM {s}.workers w WHERE w.id = r.owner AND NOT w.dead), r.workflow"
    " FROM {s}.runs r WHERE r.run = %s FOR UPDATE OF r"
)
_NEXT_SEQ: Final[LiteralString] = "SELECT coalesce(max(seq), 0) + 1 FROM {s}.records WHERE run = %s"
_DB_NOW_US: Final[LiteralString] = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
_TO_INBOX: Final[LiteralString] = "INSERT INTO {s}.inbox (run, line) VALUES (%s, %s)"
_INBOX_HOLDS: Final[LiteralString] = "SELECT 1 FROM {s}.inbox WHERE run = %s LIMIT 1"
# Senders to one run, one at a time (a run `run URL` started has no row to
# lock); then whether a process holds the run (`held_by_a_process`).
_ONE_SENDER: Final[LiteralString] = "SELECT pg_advisory_xact_lock(%s)"
_APPEND: Final[LiteralString] = "INSERT INTO {s}.records (run, seq, line) VALUES (%s, %s, %s)"
# The append and its run's summary (schema version 6), one statement.
_APPEND_SUMMARIZED: Final[LiteralString] = summary_upsert_after(_APPEND)
_WAKE: Final[LiteralString] = "UPDATE {s}.runs SET wake_at = NULL WHERE run = %s"
_REOPEN: Final[LiteralString] = (
    "UPDATE {s}.runs SET done = false, outcome = NULL, finished_at = NULL, owner = NULL,"
    " wake_at = NULL WHERE run = %s"
)


def deliver_pg(
    url: str,
    build: Build,
    *,
    run: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    held_here: Collection[str] = frozenset(),
    inbox: bool = True,
) -> Delivered:
    """Deliver the change ``build`` makes to the journal at ``url`` (see the module doc).

    ``run``: the run the change is for, when the caller knows it (a signal,
    a cancel): only its records are read. None (a reconciliation by key):
    the whole journal is read to find the run, and the change is built
    again from the run's records once its row is locked. ``held_here``:
    the runs the caller itself holds (`RunHolds`), whose changes it records
    at once rather than sending them to its own inbox. ``inbox`` False: a
    change that would wait in the inbox is not written at all (for
    `take_in_pg`, whose change is in the inbox already); ``recorded`` False
    says so.

    Returns `Delivered`, durable: ``recorded`` True when the record is in
    the journal, False when it waits in the inbox of the live worker that
    holds the run. Raises `OperationRefused` (nothing written) when the
    change does not apply (an unknown or finished run, a duplicate, an
    intent not outstanding, a journal that breaks the kernel's rules), and
    `PgJournalError` when the database fails (nothing written).
    """
    with PgJournal(url, schema=schema) as journal:  # connects (naming the host) and migrates
        target = run
        if target is None:
            whole = Ledger()
            whole.feed(journal.read())
            _refuse_violations(whole)
            target, _ = build(whole)
        try:
            with connect(url) as conn, conn.transaction():
                conn.execute("SELECT set_config('synchronous_commit', 'on', true)")
                row = conn.execute(in_schema(_LOCK, schema), (target,)).fetchone()
                conn.execute(_ONE_SENDER, (send_key(schema, target),))
                held = target not in held_here and held_by_a_process(conn, schema, target)
                ledger = Ledger()
                ledger.feed(journal.read_run_in(conn, target))
                _refuse_violations(ledger)
                if row is not None and row[0] is False and ledger.run(target) is None:
                    return _to_queued(conn, schema, target, str(row[2]), build, write=inbox)
                built, change = build(ledger)
                if built != target:
                    raise OperationRefused(
                        f"the change was built for run {built!r}, not {target!r}; nothing was written"
                    )
                seq = _one_int(conn.execute(in_schema(_NEXT_SEQ, schema), (target,)).fetchone())
                now = _one_int(conn.execute(_DB_NOW_US).fetchone())
                line = encode_record(seq, now, target, change)
                # An earlier change still waits in the inbox for an unfinished run (sent
                # while a worker held it, which died or let go before taking it in): this
                # one waits behind it, so that the run's next holder takes both in, in the
                # order they were sent.
                view = ledger.runs.get(target)
                behind = (
                    inbox
                    and target not in held_here
                    and view is not None
                    and not view.finished
                    and conn.execute(in_schema(_INBOX_HOLDS, schema), (target,)).fetchone() is not None
                )
                if held or behind or (row is not None and row[1] is True):
                    if inbox:
                        conn.execute(in_schema(_TO_INBOX, schema), (target, line))
                        if (held or behind) and row is not None:
                            # A submitted run a process holds: should that process let go
                            # without taking the change in (stopped, say), a worker claims
                            # the run once it is free, and takes the change in.
                            conn.execute(in_schema(_WAKE, schema), (target,))
                    return Delivered(run=target, change=change, recorded=False)
                # The run's records and this one: what its summary says now.
                number = ledger.records + 1
                ledger.apply(Record(line=number, seq=number, time_us=now, run=target, change=change))
                summary = summary_of(ledger, target)
                if summary is None:
                    conn.execute(in_schema(_APPEND, schema), (target, seq, line))
                else:
                    conn.execute(
                        in_schema(_APPEND_SUMMARIZED, schema), (target, seq, line, target, *summary.values())
                    )
                if row is not None:
                    was_done = row[0] is True
                    view = ledger.runs[target]
                    # A reconciled run that ended needing reconciliation: a worker resumes it.
                    reopen = was_done and view.finished and view.standing() == "interrupted"
                    conn.execute(in_schema(_REOPEN if reopen else _WAKE, schema), (target,))
                return Delivered(run=target, change=change, recorded=True)
        except psycopg.Error as error:
            reason = "; ".join(p.strip() for p in str(error).splitlines() if p.strip())
            raise PgJournalError(
                f"delivering a change to run {target!r} failed: {reason or type(error).__name__}"
                f" (if the commit failed, whether it was written is unknown: `attempt-kernel show`"
                " tells)"
            ) from error


def _to_queued(
    conn: psycopg.Connection[tuple[object, ...]], schema: str, run: str, workflow: str, build: Build, *, write: bool
) -> Delivered:
    """A change for a queued run (submitted, no record yet): to the inbox, until a worker
    starts the run (`_worker`: a cancel is recorded before any step starts, a signal is
    taken in once the run runs).

    The change is built against the run as it will stand once started (its start
    record alone), so what would be refused then is refused now. Whether the
    workflow is written as code (only such a run waits for signals) is known
    only once a worker starts it: a signal is taken for one here, and the
    worker drops it, saying why, if the run turns out to be a DAG's. ``write``
    False: checked, not written.
    """
    started = Ledger()
    started.apply(Record(line=1, seq=1, time_us=0, run=run, change=RunStarted(workflow=workflow, code=True)))
    built, change = build(started)
    if built != run:
        raise OperationRefused(f"the change was built for run {built!r}, not {run!r}; nothing was written")
    if write:
        now = _one_int(conn.execute(_DB_NOW_US).fetchone())
        conn.execute(in_schema(_TO_INBOX, schema), (run, encode_record(1, now, run, change)))
        conn.execute(in_schema(_WAKE, schema), (run,))
    return Delivered(run=run, change=change, recorded=False, queued=True)


def _refuse_violations(ledger: Ledger) -> None:
    if ledger.violation_count:
        first = ledger.violations[0]
        raise OperationRefused(
            f"the journal breaks the kernel's rules (line {first.line}: {first.reason});"
            " nothing was written (see `attempt-kernel replay`)"
        )


def _one_int(row: tuple[object, ...] | None) -> int:
    value = None if row is None else row[0]
    if type(value) is not int:
        raise PgJournalError(f"the database answered {value!r} where a number was expected")
    return value


_ALL_INBOX: Final[LiteralString] = "SELECT id, run, line FROM {s}.inbox ORDER BY id"
_INBOX_ROW_TAKEN: Final[LiteralString] = "DELETE FROM {s}.inbox WHERE id = %s"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TakenIn:
    """What `take_in_pg` did: a line per inbox row handled, and how many changes it recorded."""

    lines: list[str]
    recorded: int


def take_in_pg(
    url: str,
    *,
    skip: Collection[str],
    schema: str = DEFAULT_SCHEMA,
    held_here: Collection[str] = frozenset(),
    only: Collection[str] | None = None,
) -> TakenIn:
    """Record what waits in the inbox for runs no live worker drives; say what was done.

    For `attempt-kernel recover URL`: a change sent while a worker drove its
    run waits in the inbox until that run's next holder takes it in; when
    that worker died and an operator recovers by hand, the change is
    recorded here first (through `deliver_pg`, one transaction each), so
    that recovery decides with it. ``skip``: the runs live workers drive
    (theirs to take in); ``held_here``: the runs the caller holds
    (`RunHolds`), whose changes are recorded here, not sent back to the
    inbox (it holds a run once ``skip`` was asked of it: ``recover URL``
    passes its `RunHolds`' ``held``, which that question fills). A change
    that no longer applies (`refusal`) is dropped, and every row handled is
    deleted. A row whose change would wait in the inbox again stays there,
    untouched and unsaid: that of a queued run (for the worker that starts
    it) or of a run another process holds (for that process to take in).
    ``only``: the runs whose rows are handled (None: every run's).
    Returns a line per row handled, and how many changes were recorded.
    """
    with connect(url) as conn:
        rows = conn.execute(in_schema(_ALL_INBOX, schema)).fetchall()
    said: list[str] = []
    recorded = 0
    for row_id, run, line in rows:
        if type(run) is not str or type(line) is not bytes or type(row_id) is not int:
            raise PgJournalError(f"the inbox table answered {(row_id, run, line)!r}")
        if (only is not None and run not in only) or run in skip:
            continue
        change = inbox_change(line)
        if isinstance(change, str):
            said.append(f"{run}: dropped an inbox entry: {change}")
        else:
            stored = change

            def build(ledger: Ledger) -> tuple[str, Delivery]:
                why = refusal(ledger, run, stored)
                if why is not None:
                    raise OperationRefused(why)
                return run, stored

            try:
                delivered = deliver_pg(url, build, run=run, schema=schema, held_here=held_here, inbox=False)
            except OperationRefused as refused:
                said.append(f"{run}: dropped an inbox entry: {refused}")
            else:
                if not delivered.recorded:
                    continue  # its place is the inbox: left as it is
                said.append(f"{run}: took in {type(stored).__name__} from the inbox (recorded)")
                recorded += 1
        with connect(url) as conn:
            conn.execute(in_schema(_INBOX_ROW_TAKEN, schema), (row_id,))
    return TakenIn(lines=said, recorded=recorded)


def recoverable(url: str, *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The runs `attempt-kernel recover URL` may take up or write for, by their summaries:
    those that stand ``interrupted`` (cut short, or reconciled since they ended needing it),
    and those that stand ``waiting`` that no worker takes up (``run URL`` started them,
    never submitted; a submitted one is the workers'). It holds them before it reads the
    journal (see `RunHolds`)."""
    with PgJournal(url, schema=schema):  # connects (naming the host) and migrates
        pass
    with connect(url) as conn:
        rows = conn.execute(
            in_schema(
                "SELECT s.run FROM {s}.summaries s WHERE s.status = 'interrupted' OR (s.status = 'waiting'"
                " AND NOT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.run = s.run AND r.workflow IS NOT NULL))"
                " ORDER BY s.run",
                schema,
            )
        ).fetchall()
    return [str(run) for (run,) in rows]


def queued_runs(url: str, *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The runs submitted and not started yet (their row open, no record of them): a
    worker of their workflow starts them; recovery, which sees only records, does not."""
    with connect(url) as conn:
        rows = conn.execute(
            in_schema(
                "SELECT r.run FROM {s}.runs r WHERE NOT r.done AND NOT EXISTS"
                " (SELECT 1 FROM {s}.records c WHERE c.run = r.run) ORDER BY r.run",
                schema,
            )
        ).fetchall()
    return [str(run) for (run,) in rows]


def submitted_for(url: str, run: str, *, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The workflow ``run`` was submitted for, if it is in the queue (None: not submitted,
    as no run whose id PostgreSQL text cannot hold, `untextable`, ever was)."""
    if untextable(run) is not None:
        return None
    with connect(url) as conn:
        row = conn.execute(
            in_schema("SELECT workflow FROM {s}.runs WHERE run = %s AND workflow IS NOT NULL", schema), (run,)
        ).fetchone()
    return None if row is None else str(row[0])


def submitted(url: str, runs: Collection[str], *, schema: str = DEFAULT_SCHEMA) -> frozenset[str]:
    """Which of ``runs`` are in the queue, for a worker of their workflow to claim: the
    others (started by ``attempt-kernel run URL``, never submitted) no worker takes."""
    with connect(url) as conn:
        rows = conn.execute(
            in_schema("SELECT run FROM {s}.runs WHERE run = ANY(%s) AND workflow IS NOT NULL", schema), (list(runs),)
        ).fetchall()
    return frozenset(str(run) for (run,) in rows)


def resume_pg(url: str, run: str, *, schema: str = DEFAULT_SCHEMA) -> str:
    """Make ``run`` claimable now, for a worker of its workflow; say what was done.

    Refused (`OperationRefused`, nothing changed) for a run the journal does
    not hold, one that finished, one a live worker drives, one another
    process drives (``attempt-kernel run URL`` or ``recover URL``), one that needs
    reconciliation first, and one no worker can take (started by
    ``attempt-kernel run URL``, not submitted: its workflow is not in the
    queue), with the command that resumes it instead.
    """
    with PgJournal(url, schema=schema) as journal:  # connects (naming the host) and migrates
        try:
            with connect(url) as conn, conn.transaction():
                row = conn.execute(in_schema(_LOCK, schema), (run,)).fetchone()
                held = held_by_a_process(conn, schema, run)
                ledger = Ledger()
                ledger.feed(journal.read_run_in(conn, run))
                _refuse_violations(ledger)
                view = ledger.runs.get(run)
                if view is None and row is None:
                    raise OperationRefused(f"no run {run!r} in the journal; nothing was changed")
                if view is not None:
                    standing = view.standing()
                    if standing == "needs-reconciliation":
                        keys = ", ".join(view.outstanding())
                        raise OperationRefused(
                            f"run {run!r} needs reconciliation first (outstanding: {keys});"
                            " nothing was changed"
                        )
                    if view.finished and standing != "interrupted":
                        raise OperationRefused(
                            f"run {run!r} has finished ({standing}); nothing was changed"
                        )
                if held:
                    raise OperationRefused(
                        f"another process (attempt-kernel run or recover) drives run {run!r} now;"
                        " nothing was changed"
                    )
                if row is None:
                    raise OperationRefused(
                        f"run {run!r} was not submitted, so no worker can take it; resume it with"
                        " `attempt-kernel recover URL --workflows MODULE:ATTR`; nothing was changed"
                    )
                if row[1] is True:
                    raise OperationRefused(
                        f"a live worker drives run {run!r} now; nothing was changed"
                    )
                conn.execute(in_schema(_REOPEN, schema), (run,))
        except psycopg.Error as error:
            raise PgJournalError(f"resuming run {run!r} failed: {_reason(error)}") from error
    return f"run {run!r} is claimable now: a worker of its workflow takes it up at its next claim"


def _reason(error: psycopg.Error) -> str:
    return "; ".join(p.strip() for p in str(error).splitlines() if p.strip()) or type(error).__name__
