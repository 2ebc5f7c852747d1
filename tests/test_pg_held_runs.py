"""Operators' changes to a run a process drives outside a worker, on PostgreSQL.

`attempt-kernel run URL` and `recover URL` hold each run they drive with an
advisory lock (`RunHolds`) and number its records themselves. A change sent
to such a run must not be written among those records (it would take the
number the process gives its next record): it waits in the journal's inbox,
and the process takes it in (`PgJournal.take_in`). Nor may a worker claim
such a run: its claim passes over a run whose key a process holds, made in
SQL as `hold_key` makes it in Python. These tests drive the pieces
directly, against a real server; tests/test_cli_pg.py drives the commands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
import time
from pathlib import Path
from typing import Final

import psycopg
import pytest
from pgtools import sql_in
from psycopg import sql
from typing_extensions import LiteralString
from workerflows.pay import PAY, calls

from attempt_kernel._codec import encode_record
from attempt_kernel._ledger import Ledger
from attempt_kernel._operate import Build, Delivery
from attempt_kernel._records import Record, RunCancelRequested, RunStarted, SignalSent
from attempt_kernel.postgres import PgJournal, PgJournalError
from attempt_kernel.postgres._deliver import deliver_pg, take_in_pg
from attempt_kernel.postgres._journal import (
    HELD_KEYS, RunHolds, hold_key, hold_key_head, hold_key_sql, send_key, server_hold_key,
)  # fmt: skip
from attempt_kernel.postgres._worker import _OPEN_RUNS, _statement, run_worker, submit_run  # pyright: ignore[reportPrivateUsage]  # the idle count is under test
from attempt_kernel.postgres._worker import _CLAIM, _statement  # pyright: ignore[reportPrivateUsage]  # the claim statement under test

pytestmark = pytest.mark.postgres


def started(url: str, schema: str, *runs: str) -> None:
    with PgJournal(url, schema=schema) as journal:
        for run in runs:
            journal.append(run, RunStarted(workflow="w", code=True))


def signal(name: str, key: str) -> Build:
    def build(ledger: Ledger) -> tuple[str, Delivery]:
        return "r", SignalSent(name=name, payload={}, id=key)

    return build


def records_of(url: str, schema: str, run: str) -> list[object]:
    with PgJournal(url, schema=schema) as journal:
        return [item.change for item in journal.read_run(run) if isinstance(item, Record)]


def inbox(url: str, schema: str) -> list[tuple[str, bytes]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT run, line FROM {s}.inbox ORDER BY id").format(s=sql.Identifier(schema))
        ).fetchall()
    return [(str(run), bytes(line)) for run, line in rows]


def to_inbox(conn: psycopg.Connection[tuple[object, ...]], schema: str, run: str, line: bytes) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {s}.inbox (run, line) VALUES (%s, %s)").format(s=sql.Identifier(schema)), (run, line)
    )


def test_a_change_to_a_run_another_process_holds_waits_in_the_inbox(pg_url: str, schema: str) -> None:
    """Held by another session: to the inbox, nothing among its records. Held by the
    caller itself (``held_here``): recorded. Held by nobody: recorded, unless an earlier
    change still waits in the run's inbox (the holder let go without taking it in):
    then behind it, so that the next holder takes both in, in the order sent."""
    started(pg_url, schema, "r")
    with RunHolds(pg_url, schema=schema) as holds:
        assert holds.take("r")
        handed = deliver_pg(pg_url, signal("a", "k1"), run="r", schema=schema)
        assert (handed.recorded, handed.queued) == (False, False)
        assert records_of(pg_url, schema, "r") == [RunStarted(workflow="w", code=True)]
        [(run, _)] = inbox(pg_url, schema)
        assert run == "r"
        here = deliver_pg(pg_url, signal("b", "k2"), run="r", schema=schema, held_here={"r"})
        assert here.recorded is True
    behind = deliver_pg(pg_url, signal("c", "k3"), run="r", schema=schema)
    assert behind.recorded is False  # "a", sent before it, waits in the inbox still
    assert records_of(pg_url, schema, "r") == [
        RunStarted(workflow="w", code=True),
        SignalSent(name="b", payload={}, id="k2"),
    ]
    assert [run for run, _ in inbox(pg_url, schema)] == ["r", "r"]
    taken = take_in_pg(pg_url, skip=(), schema=schema)
    assert taken.recorded == 2
    free = deliver_pg(pg_url, signal("d", "k4"), run="r", schema=schema)
    assert free.recorded is True
    assert records_of(pg_url, schema, "r") == [
        RunStarted(workflow="w", code=True),
        SignalSent(name="b", payload={}, id="k2"),
        SignalSent(name="a", payload={}, id="k1"),
        SignalSent(name="c", payload={}, id="k3"),
        SignalSent(name="d", payload={}, id="k4"),
    ]
    assert inbox(pg_url, schema) == []


def a_take_behind_a_sender(
    sender: psycopg.Connection[tuple[object, ...]], holds: RunHolds, schema: str, taken: list[bool]
) -> threading.Thread:
    """In ``sender``'s open transaction, an operator's check of run ``r`` (its key, shared);
    then ``holds.take("r")`` in a thread, its answer into ``taken``: returned once the take
    waits for the key."""
    got = sender.execute("SELECT pg_try_advisory_xact_lock_shared(%s)", (hold_key(schema, "r"),)).fetchone()
    assert got == (True,)
    taker = threading.Thread(target=lambda: taken.append(holds.take("r")))
    taker.start()
    deadline = time.monotonic() + 60  # waits for the event; bounds nothing
    while sender.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    ).fetchone() != (1,):
        assert time.monotonic() < deadline, "the take never waited for the key"
        time.sleep(0.01)
    return taker


def test_a_process_cannot_take_up_a_run_while_a_change_to_it_is_being_written(
    pg_url: str, schema: str
) -> None:
    """The sender's check holds the run's key (shared) until it commits, so a process
    that comes to take the run up then cannot: it never reads the run's records without
    a change that is about to be committed. It waits for the key, however long the
    sender takes: it used to give up after ``take_wait`` and say the run was held, so
    `recover` left an interrupted run alone, as if another process drove it, whenever a
    sender's transaction outlasted a quarter of a second. Once the sender is done, it
    takes the run."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    with psycopg.connect(pg_url, autocommit=True) as sender, RunHolds(pg_url, schema=schema, take_wait=0.05) as holds:
        taken: list[bool] = []
        with sender.transaction():
            taker = a_take_behind_a_sender(sender, holds, schema, taken)
            time.sleep(0.5)  # ten times take_wait: the take asked again, and waits on
            assert taken == []
        taker.join()
        assert taken == [True]
        assert holds.take("r") is True  # taken once: one unlock lets it go
        holds.let_go("r")
    with RunHolds(pg_url, schema=schema) as other:
        assert other.take("r") is True


def test_take_in_hands_each_rows_change_to_deliver_and_deletes_what_it_took(
    pg_url: str, schema: str
) -> None:
    """Only the runs asked for; in the order sent; a refused change is dropped saying why;
    a change whose record could not be written stays for the run's next holder."""
    started(pg_url, schema, "r", "s")
    lines = [
        ("r", encode_record(1, 1, "r", SignalSent(name="a", payload={}, id="k1"))),
        ("s", encode_record(1, 1, "s", SignalSent(name="x", payload={}, id="k9"))),
        ("r", encode_record(1, 1, "r", RunCancelRequested(reason="stop"))),
        ("r", encode_record(1, 1, "r", SignalSent(name="b", payload={}, id="k2"))),
    ]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for run, line in lines:
            to_inbox(conn, schema, run, line)
    seen: list[tuple[str, Delivery]] = []

    def deliver(run: str, change: Delivery) -> str | None:
        seen.append((run, change))
        if isinstance(change, RunCancelRequested):
            return "the run has finished"
        if isinstance(change, SignalSent) and change.id == "k2":
            raise PgJournalError("the journal failed earlier")
        return None

    with PgJournal(pg_url, schema=schema) as journal:
        said = journal.take_in(["r"], deliver)
    assert seen == [
        ("r", SignalSent(name="a", payload={}, id="k1")),
        ("r", RunCancelRequested(reason="stop")),
        ("r", SignalSent(name="b", payload={}, id="k2")),
    ]
    assert said == [
        "r: took in SignalSent from the inbox",
        "r: dropped an inbox entry: the run has finished",
        "r: an inbox entry waits for the run's next holder: the journal failed earlier",
    ]
    assert inbox(pg_url, schema) == [lines[1], lines[3]]


def test_take_in_says_a_failed_look_once_and_takes_in_once_the_database_answers_again(
    pg_url: str, db: str
) -> None:
    """A look that fails is said, not raised (the runs go on), and said once however many
    looks fail in a row; the row waits, and the first look that works takes it in."""
    schema = "attempt_kernel"
    started(db, schema, "r")
    name = db.rpartition("/")[2]
    taken: list[str] = []

    def deliver(run: str, change: Delivery) -> str | None:
        taken.append(run)
        return None

    with PgJournal(db) as journal:
        assert journal.take_in(["r"], deliver) == []  # connected, nothing waits
        with psycopg.connect(db, autocommit=True) as conn:
            to_inbox(conn, schema, "r", encode_record(1, 1, "r", SignalSent(name="a", payload={}, id="k1")))
        with psycopg.connect(pg_url, autocommit=True) as conn:  # another database: this one is shut
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
            try:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                first = journal.take_in(["r"], deliver)
                second = journal.take_in(["r"], deliver)
            finally:
                conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name)))
        assert len(first) == 1, first
        assert first[0].startswith("the journal's inbox was not taken in (tried again every look): "), first
        assert second == []
        assert taken == []
        assert journal.take_in(["r"], deliver) == ["r: took in SignalSent from the inbox"]
    assert taken == ["r"]
    assert inbox(db, schema) == []


def test_a_run_a_live_worker_claimed_is_not_taken_though_its_key_is_free(pg_url: str, schema: str) -> None:
    """A worker's claim tries the run's key in the statement that claims it; a process
    takes the key first and then asks whether a live worker claimed the run. So one of
    the two always sees the other. A run of a worker found dead is taken."""
    PgJournal(pg_url, schema=schema).close()  # the queue's tables
    s = sql.Identifier(schema)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("INSERT INTO {s}.workers (id, host, pid) VALUES ('w-live', 'h', 1), ('w-dead', 'h', 2)").format(s=s))
        conn.execute(sql.SQL("UPDATE {s}.workers SET dead = true WHERE id = 'w-dead'").format(s=s))
        conn.execute(
            sql.SQL("INSERT INTO {s}.runs (run, owner, fence, workflow) VALUES"
                    " ('live', 'w-live', 1, 'w'), ('dead', 'w-dead', 1, 'w')").format(s=s)
        )  # fmt: skip
    with RunHolds(pg_url, schema=schema) as holds:
        assert (holds.take("live"), holds.take("dead")) == (False, True)
        assert (holds.held, holds.by_workers) == ({"dead"}, {"live"})
    with RunHolds(pg_url, schema=schema) as other:  # the refused key was let go at once
        with psycopg.connect(pg_url, autocommit=True) as conn:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (hold_key(schema, "live"),)).fetchone()
            assert got == (True,)
        assert other.take("dead") is True


def test_a_run_another_process_holds_is_answered_at_once_not_after_the_wait(pg_url: str, schema: str) -> None:
    """Only an operator's shared hold is waited out: a process's hold is for good, and
    waiting `take_wait` for each such run made a second `recover` beside one holding 40
    runs take 10 s. Here the holder would let go as soon as the taker waited for the key
    (seen in pg_locks), so a taker that waited would get it; it must answer False first."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    with RunHolds(pg_url, schema=schema) as holder, RunHolds(pg_url, schema=schema, take_wait=60) as taker:
        assert holder.take("r") is True
        taken: list[bool] = []
        thread = threading.Thread(target=lambda: taken.append(taker.take("r")))
        thread.start()
        with psycopg.connect(pg_url, autocommit=True) as look:
            while thread.is_alive():
                waiting = look.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()
                if waiting != (0,):
                    holder.let_go("r")  # a taker that waits for the key gets it now
                time.sleep(0.01)
        thread.join()
        assert taken == [False]
        assert holder.held == {"r"}


@pytest.mark.parametrize("waiting_in", ["take", "let_go"])
def test_a_holder_whose_session_ends_while_it_waits_for_a_sender_says_so(
    pg_url: str, schema: str, waiting_in: str
) -> None:
    """`take` and `let_go` wait for a sender's transaction; should the holder's own session
    end meanwhile (a server restart, a terminated backend), the driver's error came out as
    it was (a traceback from `recover`). It is a `PgJournalError` naming the run now."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    with psycopg.connect(pg_url, autocommit=True) as sender, RunHolds(pg_url, schema=schema, take_wait=0.05) as holds:
        if waiting_in == "let_go":
            assert holds.take("r")
        raised: list[BaseException] = []

        def wait() -> None:
            try:
                holds.take("r") if waiting_in == "take" else holds.let_go("r")
            except BaseException as error:  # noqa: BLE001 - handed to the test's thread
                raised.append(error)

        with sender.transaction():
            if waiting_in == "take":
                sender.execute("SELECT pg_advisory_xact_lock_shared(%s)", (hold_key(schema, "r"),))
            else:
                sender.execute("SELECT pg_advisory_xact_lock(%s)", (send_key(schema, "r"),))
            waiter = threading.Thread(target=wait)
            waiter.start()
            deadline = time.monotonic() + 60  # waits for the event; bounds nothing
            while (row := sender.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()) is None:  # fmt: skip
                assert time.monotonic() < deadline, "the holder never waited for the key"
                time.sleep(0.01)
            sender.execute("SELECT pg_terminate_backend(%s)", row)
            waiter.join(timeout=60)
        assert [type(error) for error in raised] == [PgJournalError]
        assert "run 'r'" in str(raised[0]), raised


class GrantedAsItTimedOut:
    """A `RunHolds` session whose first blocking lock is granted just as its lock timeout
    fires. PostgreSQL then keeps the lock (its LockErrorCleanup grants a lock that came
    while the timeout was handled) and still fails the statement: a session-level
    advisory lock stays held after a `LockNotAvailable`. ``release`` ends the other
    holder's transaction first, which is what grants the lock."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]], release: Callable[[], None]) -> None:
        self._conn = conn
        self._release = release
        self.fired = False

    def execute(self, query: LiteralString | sql.Composed, params: tuple[object, ...] | None = None) -> psycopg.Cursor[tuple[object, ...]]:
        if query == "SELECT pg_advisory_lock(%s)" and not self.fired:
            self.fired = True
            self._release()
            self._conn.execute(query, params)  # granted
            raise psycopg.errors.LockNotAvailable("canceling statement due to lock timeout")
        return self._conn.execute(query, params)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def test_a_lock_granted_as_its_lock_timeout_fired_is_taken_not_mistaken_for_another_holder(
    pg_url: str, schema: str
) -> None:
    """The lock came as the wait's timeout fired: the statement failed, the session held
    the run anyway, and `take` then found the run held "for good" by a process (itself)
    and said False: `recover` left an interrupted run alone, and the gate saw
    `assert [False] == [True]` in the test above once, under load. It is taken, once:
    after `let_go` another process takes it."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    sender = psycopg.connect(pg_url)  # a transaction open until released
    try:
        got = sender.execute("SELECT pg_try_advisory_xact_lock_shared(%s)", (hold_key(schema, "r"),)).fetchone()
        assert got == (True,)
        with RunHolds(pg_url, schema=schema, take_wait=0.05) as holds:
            granted = GrantedAsItTimedOut(holds._conn, sender.commit)  # pyright: ignore[reportPrivateUsage]  # the session under test
            object.__setattr__(holds, "_conn", granted)
            assert holds.take("r") is True
            assert granted.fired
            holds.let_go("r")
            with RunHolds(pg_url, schema=schema) as other:
                assert other.take("r") is True
    finally:
        sender.close()


# --------------------------------------------------------------------------
# Workers leave a held run alone, unclaimed
# --------------------------------------------------------------------------


def note_claims(url: str, schema: str) -> None:
    """Write down, in ``{s}.claims``, each update that moves a run's fence on: a claim."""
    sql_in(url, schema, "CREATE TABLE {s}.claims (id serial, run text, fence bigint)")
    sql_in(
        url, schema,
        "CREATE FUNCTION {s}.note_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO {s}.claims (run, fence) VALUES (NEW.run, NEW.fence); RETURN NEW; END $$",
    )  # fmt: skip
    sql_in(
        url, schema,
        "CREATE TRIGGER noted AFTER UPDATE ON {s}.runs FOR EACH ROW"
        " WHEN (NEW.fence = OLD.fence + 1) EXECUTE FUNCTION {s}.note_claim()",
    )  # fmt: skip


def a_dead_workers_run_and_a_queued_one(url: str, schema: str) -> None:
    """``r``: started by worker ``gone``, found dead, at fence 1, due an hour ago (a run
    `recover URL` takes up, and so would a worker's claim); ``s``: queued, due after it."""
    submit_run(url, "pay", "r", schema=schema)
    with PgJournal(url, schema=schema) as journal:
        journal.append("r", RunStarted(workflow="pay"))
    sql_in(url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'h', 1, true)")
    sql_in(url, schema, "UPDATE {s}.runs SET owner = 'gone', fence = 1, submitted_at = now() - interval '1 hour'")
    submit_run(url, "pay", "s", schema=schema)
    note_claims(url, schema)


def claims(url: str, schema: str) -> list[tuple[object, ...]]:
    return sql_in(url, schema, "SELECT run, fence FROM {s}.claims ORDER BY id")


def test_a_worker_never_claims_a_run_a_process_holds_and_takes_it_up_once_let_go(
    pg_url: str, schema: str, downstream: Path
) -> None:
    """A worker claimed a run that `recover URL` held (fence + 1), found it held and
    released it, due a second later, and did so again every second for as long as the
    hold lasted: a write and a fence each time, and the run late for up to a second once
    let go. Its claim passes over a held run now: no claim, the row as it was (due), and
    the worker goes on with the next run; once the run is let go, the next claim takes it."""
    a_dead_workers_run_and_a_queued_one(pg_url, schema)
    lines: list[str] = []
    with RunHolds(pg_url, schema=schema) as holds:
        assert holds.take("r") is True
        closed = run_worker(
            pg_url, [PAY], schema=schema, concurrency=1, heartbeat=0.2, dead_after=300,
            stop_when_idle=True, progress=lines.append,
        )  # fmt: skip
        assert closed == 1
        assert claims(pg_url, schema) == [("s", 1)]
        assert sql_in(pg_url, schema, "SELECT owner, fence, wake_at IS NULL FROM {s}.runs WHERE run = 'r'") == [
            ("gone", 1, True)
        ]
        assert [line for line in lines if line.startswith("r:")] == []
    assert run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 1
    assert claims(pg_url, schema) == [("s", 1), ("r", 2)]
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        ("r", True, "succeeded"),
        ("s", True, "succeeded"),
    ]
    assert sorted(calls(downstream)) == ["r/charge/card", "s/charge/card"]


def test_a_live_workers_run_is_work_while_a_process_holds_its_key_for_a_moment(pg_url: str, schema: str) -> None:
    """`RunHolds.take` holds a run's key before it asks whether a live worker owns the run
    (then it lets go): meanwhile a worker stopping when idle counted that run out, and could
    exit with work left. A run a live worker owns counts, whoever holds its key; one nobody
    owns, held, does not."""
    submit_run(pg_url, "pay", "r", schema=schema)
    submit_run(pg_url, "pay", "q", schema=schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid) VALUES ('live', 'h', 1)")
    sql_in(pg_url, schema, "UPDATE {s}.runs SET owner = 'live', fence = 1 WHERE run = 'r'")
    count = _statement(_OPEN_RUNS, schema)
    params = {"names": ["pay"], "hold": hold_key_head(schema)}
    with psycopg.connect(pg_url, autocommit=True) as conn, psycopg.connect(pg_url, autocommit=True) as holder:
        assert conn.execute(count, params).fetchone() == (2,)
        for run in ("r", "q"):
            holder.execute("SELECT pg_advisory_lock(%s)", (server_hold_key(holder, schema, run),))
        assert conn.execute(count, params).fetchone() == (1,)  # r: the live worker's; q: held


def test_in_a_database_that_is_not_utf8_a_held_run_is_passed_over_too(pg_url: str, schema: str) -> None:
    """In an EUC_JP database a wave dash comes back from the server's encoding as other
    UTF-8 than Python's, so a key made in Python is not the key the claim tries: the
    process holding the run held another key, and a worker claimed the run beside it.
    The hold's key is made by the server now, as the claim's is."""
    database = f"euc_{schema}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(database)
            )
        )
    url = pg_url.rsplit("/", 1)[0] + "/" + database
    run = "\u301cwave"  # WAVE DASH: EUC_JP maps it to and from another code point
    try:
        submit_run(url, "pay", run, schema=schema)
        with PgJournal(url, schema=schema) as journal:
            journal.append(run, RunStarted(workflow="pay"))
        sql_in(url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'h', 1, true)")
        sql_in(url, schema, "UPDATE {s}.runs SET owner = 'gone', fence = 1")
        with psycopg.connect(url, autocommit=True) as conn:
            assert server_hold_key(conn, schema, run) != hold_key(schema, run)  # the case is real here
        with RunHolds(url, schema=schema) as holds:
            assert holds.take(run) is True
            closed = run_worker(url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
            assert closed == 0
            assert sql_in(url, schema, "SELECT owner, fence FROM {s}.runs") == [("gone", 1)]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


def test_a_run_a_process_waits_to_hold_is_not_claimed_either(pg_url: str, schema: str, downstream: Path) -> None:
    """`recover URL` waits for the run's key while an operator's transaction holds it
    (shared): the run is about to be held, and a worker's claim then took it and released
    it as held. It passes over it now, as over a held run, and the process takes it."""
    a_dead_workers_run_and_a_queued_one(pg_url, schema)
    with psycopg.connect(pg_url, autocommit=True) as sender, RunHolds(pg_url, schema=schema, take_wait=60) as holds:
        taken: list[bool] = []
        with sender.transaction():
            taker = a_take_behind_a_sender(sender, holds, schema, taken)
            closed = run_worker(
                pg_url, [PAY], schema=schema, concurrency=1, heartbeat=0.2, dead_after=300, stop_when_idle=True
            )
            assert closed == 1
        taker.join()
        assert taken == [True]
        assert claims(pg_url, schema) == [("s", 1)]
        assert sql_in(pg_url, schema, "SELECT owner, fence FROM {s}.runs WHERE run = 'r'") == [("gone", 1)]
    assert calls(downstream) == ["s/charge/card"]



def test_a_process_that_comes_for_a_run_as_a_worker_claims_it_leaves_it_to_the_worker(
    pg_url: str, schema: str
) -> None:
    """The claim tries the run's key, shared, in the statement that claims it, and keeps
    it until the claim commits: `recover` coming for the run meanwhile waits, then finds
    the run a live worker's and leaves it. A look alone would not do: the process would
    take the key at once, find the row still the dead worker's, and both would drive the
    run."""
    a_dead_workers_run_and_a_queued_one(pg_url, schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid) VALUES ('w-live', 'h', 2)")
    claim = _statement(_CLAIM, schema)
    with psycopg.connect(pg_url) as claimer, RunHolds(pg_url, schema=schema, take_wait=60) as holds:
        rows = claimer.execute(claim, {"me": "w-live", "names": ["pay"], "n": 1, "hold": hold_key_head(schema)})
        assert [row[:2] for row in rows.fetchall()] == [("r", 2)]
        taken: list[bool] = []
        taker = threading.Thread(target=lambda: taken.append(holds.take("r")))
        taker.start()
        with psycopg.connect(pg_url, autocommit=True) as look:
            deadline = time.monotonic() + 60  # waits for the event; bounds nothing
            while taker.is_alive() and look.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone() != (1,):
                assert time.monotonic() < deadline, "the take never waited for the key"
                time.sleep(0.01)
        claimer.commit()
        taker.join()
        assert taken == [False]
        assert (holds.held, holds.by_workers) == (set(), {"r"})
    assert sql_in(pg_url, schema, "SELECT owner, fence FROM {s}.runs WHERE run = 'r'") == [("w-live", 2)]

# --------------------------------------------------------------------------
# The run's key, in Python and in SQL
# --------------------------------------------------------------------------

RUN_IDS: Final = (
    "r",
    "orders-1",
    "café",
    "日本語の注文",
    "🎉 party",
    "tab\there",
    "line\nfeed\r",
    "\x01\x1b\x1f\x7f\x80\x9f",
    "quote ' backslash \\ percent %s",
    "\u200b\u00a0\ufeff",
    "",
)


def test_hold_keys_are_the_first_64_bits_of_sha256_as_a_signed_bigint() -> None:
    """Written down from ``printf 'attempt-kernel\\0attempt_kernel\\0r' | sha256sum`` and
    the like: a process of one version and a worker of another must agree on every key."""
    assert hold_key("attempt_kernel", "r") == 0x1A4992AB17ACEAC0
    assert hold_key("attempt_kernel", "orders-1") == 0xE983907A74908172 - 2**64
    assert hold_key("attempt_kernel", "café") == 0xBDCE2AB3218544D8 - 2**64
    assert send_key("attempt_kernel", "r") == 0xD619DB46C6A13F6F - 2**64


@pytest.mark.parametrize("run", RUN_IDS)
def test_the_sql_hold_key_is_the_python_one(pg_url: str, schema: str, run: str) -> None:
    """A worker's claim makes the key in SQL, `RunHolds` in Python: the same bigint for
    every id, non-ASCII and control characters included, in any schema."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for where in ("attempt_kernel", schema):
            row = conn.execute(
                "SELECT " + hold_key_sql("%(run)s::text"), {"hold": hold_key_head(where), "run": run}
            ).fetchone()
            assert row == (hold_key(where, run),), (where, run)


def test_held_keys_lists_the_keys_processes_hold_and_not_an_operators(pg_url: str, schema: str) -> None:
    """A key whose high bit is set (``orders-1``'s) too: ``pg_locks`` shows it as two oids."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    keys = {run: hold_key(schema, run) for run in ("r", "orders-1", "s")}
    with psycopg.connect(pg_url, autocommit=True) as sender, RunHolds(pg_url, schema=schema) as holds:
        assert holds.take("r") and holds.take("orders-1")
        with sender.transaction():
            sender.execute("SELECT pg_advisory_xact_lock_shared(%s)", (keys["s"],))
            row = sender.execute("SELECT " + HELD_KEYS).fetchone()
        assert row is not None
        [held] = row
        assert isinstance(held, list)
        assert sorted(keys[run] for run in keys if keys[run] in held) == sorted([keys["r"], keys["orders-1"]])
