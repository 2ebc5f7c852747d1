"""Runs that wait, on PostgreSQL workers: released with their wake time, woken by operators.

Against the session's real server, each test in a schema of its own (the
command-line test in a database of its own). Workers are subprocesses
(``workerflows.waits``, heartbeat 0.2 s, dead after 300 s), stopped with
SIGTERM or killed with SIGKILL; a killed one is found dead because the test
ages its heartbeat (`expire_heartbeats`), never by waiting. Operators act through `deliver_pg`, with
no lease. Timeouts are safety nets only: every wait polls for something
to happen, and no test judges how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from pgtools import expire_heartbeats, sql_in
from psycopg import sql

from attempt_kernel import Record, RunCancelRequested, RunFinished, RunStarted, SignalSent, replay
from attempt_kernel._ledger import Ledger
from attempt_kernel._operate import OperationRefused, cancel_change, reconcile_change, signal_change
from attempt_kernel.postgres._deliver import deliver_pg
from attempt_kernel.postgres._journal import PgJournal
from attempt_kernel._records import JSON, RunResumed, WaitStarted
from attempt_kernel.postgres._worker import _LOCK_HELD, _RELEASE_WAITING, _statement, submit_run  # pyright: ignore[reportPrivateUsage]  # the release's statements are under test
from attempt_kernel.postgres import set_pool

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).parent
WAITS = "from workerflows.waits import main; main()"
PAY = "from workerflows.start import main; main()"

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def worker(url: str, schema: str, tmp_path: Path, start: str = WAITS, **env: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "GATE": str(tmp_path / "gate"), **env}
    return subprocess.Popen(
        [sys.executable, "-c", start, url, schema],
        cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"the worker hung:\n{out}") from None
    return process.returncode, out


def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM (a graceful stop), then its output; it must exit 0."""
    process.send_signal(signal.SIGTERM)
    code, out = finish(process)
    assert code == 0, out
    return out


def wait_for(what: str, predicate: Callable[[], bool], *workers: subprocess.Popen[str], timeout: float = 60) -> None:
    """Poll ``predicate`` until it holds (the timeout is a safety net; the workers must live)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        for process in workers:
            if process.poll() is not None:
                raise AssertionError(f"a worker exited while waiting for {what}:\n{finish(process)[1]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"safety net: never saw {what}")
        time.sleep(0.05)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T), as a worker with ``FREEZE_ON`` stops itself."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1].startswith("T")


def count(url: str, schema: str, where: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {s}.runs WHERE " + where).format(s=sql.Identifier(schema))  # pyright: ignore[reportArgumentType]  # test-written predicates
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None and type(row[0]) is int
    return row[0]


def released_waiting(url: str, schema: str) -> int:
    """Rows released to wait: no owner, not done, a wake time set."""
    return count(url, schema, "owner IS NULL AND NOT done AND wake_at IS NOT NULL")


def records(url: str, schema: str) -> list[Record]:
    with PgJournal(url, schema=schema) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def ledger_of(url: str, schema: str) -> Ledger:
    ledger = Ledger()
    with PgJournal(url, schema=schema) as journal:
        ledger.feed(journal.read())
    return ledger


def replays_clean(url: str, schema: str) -> None:
    with PgJournal(url, schema=schema) as journal:
        result = replay(journal)
    assert result.valid, result


def signal_to(url: str, schema: str, run: str, payload: JSON) -> bool:
    """`deliver_pg` of signal ``approve``; whether it was recorded at once."""
    delivered = deliver_pg(
        url, lambda ledger: (run, signal_change(ledger, run, "approve", payload)), run=run, schema=schema
    )
    assert delivered.run == run and isinstance(delivered.change, SignalSent)
    return delivered.recorded


def finished_once_each(url: str, schema: str, runs: list[str]) -> list[Record]:
    found = records(url, schema)
    ends = Counter(r.run for r in found if isinstance(r.change, RunFinished))
    assert ends == Counter({run: 1 for run in runs})
    return found


def results(found: list[Record]) -> dict[str, JSON]:
    """Each run's result, from its run_finished record."""
    return {r.run: r.change.result for r in found if isinstance(r.change, RunFinished)}


# --------------------------------------------------------------------------
# Many waiting runs on three workers
# --------------------------------------------------------------------------


def test_sixty_waiting_runs_hold_no_lease_or_slot_and_each_finishes_once_after_its_signal(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    set_pool(pg_url, "llm", 4, schema=schema)
    runs = [f"a-{n:02d}" for n in range(60)]
    for run in runs:
        submit_run(pg_url, "approver", run, schema=schema)
    workers = [worker(pg_url, schema, tmp_path) for _ in range(3)]
    wait_for("every run released to wait", lambda: released_waiting(pg_url, schema) == 60, *workers)
    # The sampler: while they wait, no run holds a lease or a slot, and no
    # worker claims one back (a signal is the only thing that wakes them).
    for _ in range(20):
        assert count(pg_url, schema, "owner IS NOT NULL") == 0
        assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.slots WHERE run IS NOT NULL") == [(0,)]
        assert count(pg_url, schema, "wake_at = 'infinity' AND NOT done") == 60
        time.sleep(0.05)
    ledger = ledger_of(pg_url, schema)
    assert {ledger.runs[run].standing() for run in runs} == {"waiting"}
    recorded = [signal_to(pg_url, schema, run, {"by": run}) for run in runs]
    assert recorded == [True] * 60  # nobody held them: straight into the journal
    wait_for("every run closed", lambda: count(pg_url, schema, "done") == 60, *workers)
    outputs = [stop(process) for process in workers]
    assert sql_in(pg_url, schema, "SELECT DISTINCT outcome FROM {s}.runs") == [("succeeded",)]
    found = finished_once_each(pg_url, schema, runs)
    replays_clean(pg_url, schema)
    assert results(found) == {run: {"approved": {"by": run}} for run in runs}
    sent = Counter(r.run for r in found if isinstance(r.change, SignalSent))
    assert sent == Counter({run: 1 for run in runs})
    # each run's end was said by exactly one worker
    said = Counter(line.split(":")[0] for out in outputs for line in out.splitlines() if line.endswith(": succeeded"))
    assert said == Counter({run: 1 for run in runs})


def test_a_worker_killed_while_its_runs_wait_loses_nothing(pg_url: str, schema: str, tmp_path: Path) -> None:
    """Killed while it may still hold some runs: what was sent to those waits in the inbox
    (nobody has found the worker dead yet), and the next worker takes it in at the claim."""
    set_pool(pg_url, "llm", 4, schema=schema)
    runs = [f"k-{n}" for n in range(10)]
    for run in runs:
        submit_run(pg_url, "approver", run, schema=schema)
    first = worker(pg_url, schema, tmp_path)

    def all_waiting() -> bool:
        started = {r.run for r in records(pg_url, schema) if isinstance(r.change, WaitStarted)}
        return started == set(runs)

    wait_for("every run waiting", all_waiting, first)
    first.kill()
    finish(first)
    held = {
        str(run)
        for (run,) in sql_in(pg_url, schema, "SELECT run FROM {s}.runs WHERE owner IS NOT NULL AND NOT done")
    }
    for run in runs:
        # a row the killed worker still names goes to its inbox: no worker found it dead
        assert signal_to(pg_url, schema, run, "yes") is (run not in held)
    inbox = {str(run) for (run,) in sql_in(pg_url, schema, "SELECT run FROM {s}.inbox")}
    assert inbox == held
    assert len(expire_heartbeats(pg_url, schema)) == 1
    second = worker(pg_url, schema, tmp_path)
    wait_for("every run closed", lambda: count(pg_url, schema, "done") == 10, second)
    out = stop(second)
    found = finished_once_each(pg_url, schema, runs)
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    replays_clean(pg_url, schema)
    assert results(found) == {run: {"approved": "yes"} for run in runs}
    for run in held:
        assert f"{run}: took in SignalSent from the inbox" in out


# --------------------------------------------------------------------------
# One run at a time
# --------------------------------------------------------------------------


def test_a_signal_to_a_run_a_live_worker_holds_goes_through_the_inbox_and_is_taken_in(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    submit_run(pg_url, "gated", "g-1", schema=schema)
    process = worker(pg_url, schema, tmp_path)

    def waiting() -> bool:
        return any(isinstance(r.change, WaitStarted) for r in records(pg_url, schema))

    wait_for("the run waiting while its step is at the gate", waiting, process)
    delivered = deliver_pg(
        pg_url, lambda ledger: ("g-1", signal_change(ledger, "g-1", "go", [1, 2])), run="g-1", schema=schema
    )
    assert delivered.recorded is False  # the worker holds the run: its step is live

    def taken_in() -> bool:
        return any(isinstance(r.change, SignalSent) for r in records(pg_url, schema))

    wait_for("the signal taken in", taken_in, process)
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    (tmp_path / "gate").touch()
    wait_for("the run closed", lambda: count(pg_url, schema, "done") == 1, process)
    out = stop(process)
    assert "g-1: took in SignalSent from the inbox" in out
    assert results(records(pg_url, schema)) == {"g-1": {"go": [1, 2], "gate": "open"}}
    replays_clean(pg_url, schema)


def test_signals_sent_before_and_after_their_runs_worker_is_found_dead_are_taken_in_the_order_sent(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """The first signal waits in the inbox (a live worker held the run); the second comes
    once that worker is found dead and before any worker took the run over: it waits
    behind the first, never ahead of it in the journal (docs/contracts.md, "Signals are
    a mailbox": the signals of one name are taken in the order they were sent)."""
    submit_run(pg_url, "gated", "g-1", schema=schema)
    first = worker(pg_url, schema, tmp_path)

    def waiting() -> bool:
        return any(isinstance(r.change, WaitStarted) for r in records(pg_url, schema))

    wait_for("the run waiting while its step is at the gate", waiting, first)
    def go(payload: str) -> bool:
        """Signal ``go`` with ``payload``; whether it was recorded at once."""
        return deliver_pg(
            pg_url, lambda ledger: ("g-1", signal_change(ledger, "g-1", "go", payload)), run="g-1", schema=schema
        ).recorded

    assert go("first") is False  # the live worker holds the run
    first.kill()
    finish(first)
    (dead,) = expire_heartbeats(pg_url, schema)
    # What another worker's look does, before it has a free slot to take the run over.
    found = sql_in(pg_url, schema, "UPDATE {s}.workers SET dead = true WHERE id = %s RETURNING id", dead)
    assert found == [(dead,)]
    assert go("second") is False  # behind the first, in the inbox
    (tmp_path / "gate").touch()
    second = worker(pg_url, schema, tmp_path)
    wait_for("the run closed", lambda: count(pg_url, schema, "done") == 1, second)
    stop(second)
    found_records = finished_once_each(pg_url, schema, ["g-1"])
    sent = [r.change.payload for r in found_records if isinstance(r.change, SignalSent)]
    assert sent == ["first", "second"]
    assert results(found_records) == {"g-1": {"go": "first", "gate": "open"}}
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    replays_clean(pg_url, schema)


def test_a_worker_frozen_past_its_lease_while_its_sessions_are_ended_comes_back_under_a_fresh_id(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """Frozen (SIGSTOP) past its lease with a run's records not yet flushed, its sessions
    ended meanwhile (the server's idle-in-transaction timeout, a restart): it wakes to a
    journal whose last flush fails on the lost connection. That is its database going
    away (docs/contracts.md, "A worker survives its database"): it comes back under a
    fresh id, never exit 2 with the driver's error."""
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "f-1", schema=schema)
    name = f"frozen-{schema}"
    process = worker(f"{pg_url}?application_name={name}", schema, tmp_path, FREEZE_ON="f-1: waiting, released")
    wait_for("the worker frozen once it released the run", lambda: stopped(process.pid), process)
    ended = sql_in(
        pg_url, schema, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", name
    )
    assert ended and all(row == (True,) for row in ended)
    process.send_signal(signal.SIGUSR1)  # its own clock an hour on: it wakes up past its lease
    process.send_signal(signal.SIGCONT)
    retired = sql_in(pg_url, schema, "SELECT count(*) FROM {s}.workers WHERE dead")

    def back() -> bool:
        rows = sql_in(pg_url, schema, "SELECT count(*) FROM {s}.workers WHERE NOT dead")
        return rows == [(1,)] and sql_in(pg_url, schema, "SELECT count(*) FROM {s}.workers WHERE dead") == [(1,)]

    assert retired == [(0,)]
    wait_for("the worker back under a fresh id", back, process)
    assert signal_to(pg_url, schema, "f-1", {"by": "ana"}) is True  # released: recorded at once
    wait_for("the run closed", lambda: count(pg_url, schema, "done") == 1, process)
    out = stop(process)
    assert "the database connection failed (" in out and "goes on as worker" in out
    assert "Traceback" not in out
    assert results(finished_once_each(pg_url, schema, ["f-1"])) == {"f-1": {"approved": {"by": "ana"}}}
    replays_clean(pg_url, schema)


def test_a_cancel_of_a_released_waiting_run_closes_it_cancelled(pg_url: str, schema: str, tmp_path: Path) -> None:
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "c-1", schema=schema)
    process = worker(pg_url, schema, tmp_path)
    wait_for("the run released", lambda: released_waiting(pg_url, schema) == 1, process)
    delivered = deliver_pg(
        pg_url, lambda ledger: ("c-1", cancel_change(ledger, "c-1", "customer left")), run="c-1", schema=schema
    )
    assert delivered.recorded is True
    wait_for("the run closed", lambda: count(pg_url, schema, "done") == 1, process)
    stop(process)
    assert sql_in(pg_url, schema, "SELECT outcome FROM {s}.runs") == [("cancelled",)]
    kinds = [type(r.change).__name__ for r in records(pg_url, schema)]
    assert kinds[-2:] == ["RunCancelRequested", "RunFinished"]
    assert "WaitEnded" not in kinds and kinds.count("StepCalled") == 1  # "charge" never asked
    assert ledger_of(pg_url, schema).runs["c-1"].standing() == "cancelled"
    replays_clean(pg_url, schema)


def test_a_sleep_is_released_with_its_wake_time_and_claimed_again_only_when_due(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    submit_run(pg_url, "napper", "n-1", {"sleep": 2.5}, schema=schema)
    # Frozen right after the release: however slow this test is to look, the
    # worker cannot have taken the run up again (its wake time may pass).
    process = worker(pg_url, schema, tmp_path, FREEZE_ON="n-1: waiting, released")
    try:
        wait_for("the worker frozen after the release", lambda: stopped(process.pid), process)
        assert released_waiting(pg_url, schema) == 1
        [wake_us] = [r.change.wake_us for r in records(pg_url, schema) if isinstance(r.change, WaitStarted)]
        assert wake_us is not None
        [(row_wake,)] = sql_in(
            pg_url, schema, "SELECT (extract(epoch FROM wake_at) * 1000000)::bigint FROM {s}.runs"
        )
        assert type(row_wake) is int and abs(row_wake - wake_us) <= 1  # the row holds the record's wake time
    finally:
        process.send_signal(signal.SIGCONT)
    # Until its wake time, the row stays released (sampled on the database's clock).
    while True:
        [(due, owner, done)] = sql_in(pg_url, schema, "SELECT wake_at IS NULL OR wake_at <= now(), owner, done FROM {s}.runs")
        if due or done:
            break
        assert owner is None
        time.sleep(0.05)
    wait_for("the run closed", lambda: count(pg_url, schema, "done") == 1, process)
    stop(process)
    found = records(pg_url, schema)
    [resumed] = [r for r in found if isinstance(r.change, RunResumed)]
    assert resumed.time_us >= wake_us  # taken up again only once due
    assert results(found) == {"n-1": "rested"}
    replays_clean(pg_url, schema)


def test_a_worker_until_idle_does_not_wait_for_runs_waiting_on_a_signal(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "i-1", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, UNTIL_IDLE="1"))
    assert code == 0, out
    assert out.splitlines()[-1] == "stopped 0"
    assert "i-1: waiting, released (until a signal)" in out
    assert released_waiting(pg_url, schema) == 1


def test_a_reconciled_run_is_finished_by_a_worker_with_no_recover(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """A run that ended needing reconciliation: `deliver_pg` of the reconciliation reopens
    its row, and a worker resumes and finishes it."""
    submit_run(pg_url, "pay", "p-1", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, PAY, KILL_AFTER="9"))  # right after Dispatched
    assert code == -signal.SIGKILL, out
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(worker(pg_url, schema, tmp_path, PAY, RECONCILE="off"))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "needs-reconciliation")]
    [key] = ledger_of(pg_url, schema).runs["p-1"].outstanding()
    delivered = deliver_pg(
        pg_url, lambda ledger: reconcile_change(ledger, key, confirmed=True, note="asked the bank"), schema=schema
    )
    assert delivered.run == "p-1" and delivered.recorded is True
    assert sql_in(pg_url, schema, "SELECT done, outcome, owner FROM {s}.runs") == [(False, None, None)]
    code, out = finish(worker(pg_url, schema, tmp_path, PAY))
    assert code == 0, out
    assert out.splitlines()[-1] == "closed 1"
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    assert ledger_of(pg_url, schema).runs["p-1"].standing() == "succeeded"
    replays_clean(pg_url, schema)


def test_a_release_that_waits_for_a_delivery_lock_sees_its_inbox_row(pg_url: str, schema: str) -> None:
    """A delivery that holds the run's row while it writes to the inbox: a worker's release
    waiting for that lock leaves the run claimable now, never asleep on the change."""
    PgJournal(pg_url, schema=schema).close()
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid) VALUES ('w', 'h', 1)")
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, workflow, input, owner, fence) VALUES ('r', 'approver', 'null', 'w', 1)")
    s = sql.Identifier(schema)
    with psycopg.connect(pg_url) as operator:  # deliver_pg's transaction, held open
        operator.execute(sql.SQL("SELECT 1 FROM {s}.runs WHERE run = 'r' FOR UPDATE").format(s=s))
        operator.execute(sql.SQL("INSERT INTO {s}.inbox (run, line) VALUES ('r', 'x')").format(s=s))
        done = threading.Event()

        def release() -> None:
            with psycopg.connect(pg_url, autocommit=True) as conn, conn.transaction():
                conn.execute(_statement(_LOCK_HELD, schema), ("r", "w", 1))
                conn.execute(
                    _statement(_RELEASE_WAITING, schema),
                    {"now": False, "run": "r", "wake": None, "owner": "w", "fence": 1},
                )
            done.set()

        releaser = threading.Thread(target=release)
        releaser.start()

        holder = operator.info.backend_pid

        def blocked() -> bool:  # the releaser, and only it, waits for the operator's lock (other tests share the server)
            rows = sql_in(pg_url, schema, "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", holder)
            return rows == [(1,)]

        wait_for("the release waiting for the row lock", blocked)
        assert not done.is_set()
        operator.commit()
    releaser.join(timeout=60)
    assert done.is_set()
    assert sql_in(pg_url, schema, "SELECT owner, wake_at FROM {s}.runs") == [(None, None)]


@pytest.mark.slow
def test_a_worker_frozen_inside_a_transaction_holds_its_locks_no_longer_than_its_dead_after(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """A worker stopped (SIGSTOP) inside the transaction that releases a waiting run holds the
    run's row: the server ends its session once it has idled there for dead_after, so an
    operator's signal, which waits for that row, goes through instead of hanging; woken, the
    worker finds its session gone, comes back under a fresh id, and the run takes the signal."""
    submit_run(pg_url, "gated", "g", schema=schema)
    process = worker(pg_url, schema, tmp_path, DEAD_AFTER="1")
    wait_for("the run waiting while its step is at the gate", lambda: any(isinstance(r.change, WaitStarted) for r in records(pg_url, schema)), process)
    s = sql.Identifier(schema)
    # The row, share-locked before the release asks for it: the appends of the step's end,
    # which share-lock it too, go through, and the release, which locks it for update, waits.
    with psycopg.connect(pg_url) as holder:
        holder.execute(sql.SQL("SELECT 1 FROM {s}.runs WHERE run = 'g' FOR SHARE").format(s=s))
        (tmp_path / "gate").touch()
        pid = holder.info.backend_pid

        blocked: list[tuple[object, ...]] = []

        def release_waits() -> bool:  # the worker's release, and only it, waits for this lock
            blocked[:] = sql_in(pg_url, schema, "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", pid)
            return len(blocked) == 1

        wait_for("the release waiting for the row lock", release_waits, process)
        process.send_signal(signal.SIGSTOP)
    # committed: the frozen worker's release now holds the row, idle in its transaction
    [(release,)] = blocked
    state = "SELECT state FROM pg_stat_activity WHERE pid = %s"
    wait_for("the frozen release idle in its transaction", lambda: sql_in(pg_url, schema, state, release) != [("active",)])
    assert sql_in(pg_url, schema, state, release) in ([("idle in transaction",)], [])  # [] once the server ended it
    sent: list[object] = []
    sender = threading.Thread(
        target=lambda: sent.append(
            deliver_pg(pg_url, lambda ledger: ("g", signal_change(ledger, "g", "go", {"ok": 1})), run="g", schema=schema)
        )
    )
    sender.start()
    sender.join(timeout=60)
    frozen = sender.is_alive()
    process.send_signal(signal.SIGCONT)
    sender.join(timeout=60)
    assert not frozen, "the signal waited for the frozen worker's lock until it was woken"
    assert len(sent) == 1
    wait_for("the run's end", lambda: sql_in(pg_url, schema, "SELECT done FROM {s}.runs") == [(True,)], process)
    out = stop(process)
    assert sql_in(pg_url, schema, "SELECT outcome FROM {s}.runs") == [("succeeded",)], out
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid
    assert results(records(pg_url, schema)) == {"g": {"go": {"ok": 1}, "gate": "open"}}


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip


def test_runs_and_show_say_waiting_for_a_released_run(db: str, tmp_path: Path) -> None:
    """Released, nobody holds it: the journal says it waits, and the commands say so too."""
    set_pool(db, "llm", 4)
    submit_run(db, "approver", "s-1")
    code, out = finish(worker(db, "attempt_kernel", tmp_path, UNTIL_IDLE="1"))
    assert code == 0, out
    listed = cli(tmp_path, "runs", db, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["run"], r["status"]) for r in json.loads(listed.stdout)["runs"]] == [("s-1", "waiting")]
    shown = cli(tmp_path, "show", db, "s-1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "waiting"


@pytest.mark.parametrize(
    ("finished", "run", "refused"),
    [
        (True, "f-1", r"signal 'approve' to run 'f-1': run 'f-1' has finished \(succeeded\); nothing was written"),
        (False, "nobody", r"signal 'approve' to run 'nobody': no run 'nobody' in the log"),
    ],
)
def test_a_delivery_to_a_finished_or_unknown_run_is_refused_writing_nothing(
    pg_url: str, schema: str, finished: bool, run: str, refused: str
) -> None:
    with PgJournal(pg_url, schema=schema) as journal:
        journal.append("f-1", RunStarted(workflow="approver", input=None, code=True))
        if finished:
            journal.append("f-1", RunFinished(result="done"))
    before = records(pg_url, schema)
    with pytest.raises(OperationRefused, match=refused):
        signal_to(pg_url, schema, run, "late")
    assert records(pg_url, schema) == before
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]


# --------------------------------------------------------------------------
# Changes for a queued run: in the inbox until a worker starts it
# --------------------------------------------------------------------------


def test_a_queued_run_cancelled_before_any_worker_starts_it_runs_no_step(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """`cancel` of a submitted run no worker started was refused ('no run in the log'). It
    waits in the inbox now; the worker that claims the run records its start, then the
    cancel, then its end: no attempt is created (its first step never ran)."""
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "q-1", schema=schema)
    delivered = deliver_pg(
        pg_url, lambda ledger: ("q-1", cancel_change(ledger, "q-1", "not needed")), run="q-1", schema=schema
    )
    assert (delivered.recorded, delivered.queued) == (False, True)
    assert records(pg_url, schema) == []
    code, out = finish(worker(pg_url, schema, tmp_path, UNTIL_IDLE="1"))
    assert code == 0, out
    assert "q-1: took in RunCancelRequested from the inbox: cancelled before it starts" in out
    found = finished_once_each(pg_url, schema, ["q-1"])
    assert [type(r.change).__name__ for r in found] == ["RunStarted", "RunCancelRequested", "RunFinished"]
    cancel = found[1].change
    assert isinstance(cancel, RunCancelRequested) and cancel.reason == "not needed"
    assert ledger_of(pg_url, schema).runs["q-1"].standing() == "cancelled"
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    replays_clean(pg_url, schema)


def test_a_signal_sent_to_a_queued_run_is_taken_when_it_waits(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """A signal for a run still queued waits in the inbox; the worker takes it in once the
    run runs, and the run's wait takes it (signals are a mailbox)."""
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "q-2", schema=schema)
    delivered = deliver_pg(
        pg_url, lambda ledger: ("q-2", signal_change(ledger, "q-2", "approve", {"by": "ada"})), run="q-2", schema=schema
    )
    assert (delivered.recorded, delivered.queued) == (False, True)
    code, out = finish(worker(pg_url, schema, tmp_path, UNTIL_IDLE="1"))
    assert code == 0, out
    assert results(finished_once_each(pg_url, schema, ["q-2"])) == {"q-2": {"approved": {"by": "ada"}}}
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    replays_clean(pg_url, schema)


def test_a_change_a_queued_run_would_refuse_is_refused_now(pg_url: str, schema: str) -> None:
    """Checked against the run as it will stand once started: a bad signal name is refused,
    and nothing is written to the inbox."""
    submit_run(pg_url, "approver", "q-3", schema=schema)
    with pytest.raises(OperationRefused, match="signal name"):
        deliver_pg(
            pg_url, lambda ledger: ("q-3", signal_change(ledger, "q-3", "", None)), run="q-3", schema=schema
        )
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]


def test_signals_sent_to_a_queued_run_that_ends_first_are_taken_out_of_the_inbox(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """A cancel and then a signal for a queued run: the cancel ends the run before any step,
    and the signal, which nothing will wait for now, is dropped by that worker, saying why,
    not left in the inbox for a later recover."""
    set_pool(pg_url, "llm", 4, schema=schema)
    submit_run(pg_url, "approver", "q-4", schema=schema)
    deliver_pg(pg_url, lambda ledger: ("q-4", cancel_change(ledger, "q-4", "first")), run="q-4", schema=schema)
    deliver_pg(pg_url, lambda ledger: ("q-4", signal_change(ledger, "q-4", "approve", 1)), run="q-4", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, UNTIL_IDLE="1"))
    assert code == 0, out
    assert "q-4: dropped an inbox entry: run 'q-4' has finished" in out
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.inbox") == [(0,)]
    assert [type(r.change).__name__ for r in finished_once_each(pg_url, schema, ["q-4"])] == [
        "RunStarted", "RunCancelRequested", "RunFinished",
    ]

