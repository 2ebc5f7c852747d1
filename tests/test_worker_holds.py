"""A worker holds a fresh run's start until its next record, and its end until
the close of its row (`PgJournal.append_and_complete`): attacked at every point.

Real server, real worker processes (``workerflows.adv``, ``workerflows.start``).
After every scenario the journal must hold, per run, seqs 1..n without a gap,
at most one Succeeded attempt per step, exactly one ``RunFinished`` (the last
record) iff the ``runs`` row is done, and replay clean.

No lease expires by waiting (the workers are dead after 300 s): a taker finds
a killed or frozen worker dead because the test aged its heartbeat in the
database (`expire_heartbeats`), and a frozen one wakes past its lease because
the test moved its clock on (SIGUSR1, `workerflows.start.clock`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg
import pytest
from pgtools import expire_heartbeats, sql_in
from psycopg import sql
from workerflows.pay import PAY, calls

from attempt_kernel import (
    AttemptCreated,
    Cancelled,
    Failed,
    Running,
    AttemptTransitioned,
    Change,
    Executor,
    Record,
    RunCancelRequested,
    RunControl,
    RunFinished,
    RunStarted,
    Succeeded,
    replay,
)
from attempt_kernel._codec import decode_line, encode_record
from attempt_kernel.postgres._journal import Lease, PgJournal
from attempt_kernel.postgres._worker import _OneRun, run_worker, submit_run  # pyright: ignore[reportPrivateUsage]
from attempt_kernel.postgres import set_pool

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).parent
ADV = "from workerflows.adv import main; main()"
START = "from workerflows.start import main; main()"


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


def raw_rows(url: str, schema: str) -> list[tuple[str, int, Change]]:
    """(run, seq, change) of every row, as the table numbers them."""
    out: list[tuple[str, int, Change]] = []
    for run, seq, line in sql_in(url, schema, "SELECT run, seq, line FROM {s}.records ORDER BY run, seq"):
        assert isinstance(run, str) and isinstance(seq, int) and isinstance(line, bytes)
        item = decode_line(line, 1)
        assert isinstance(item, Record), item
        out.append((run, seq, item.change))
    return out


def check_journal(url: str, schema: str) -> dict[str, list[Change]]:
    """The invariants every scenario must leave; returns each run's changes."""
    rows = raw_rows(url, schema)
    per_run: dict[str, list[tuple[int, Change]]] = {}
    for run, seq, change in rows:
        per_run.setdefault(run, []).append((seq, change))
    done = {str(r): bool(d) for r, d in sql_in(url, schema, "SELECT run, done FROM {s}.runs")}
    for run, items in per_run.items():
        assert [seq for seq, _ in items] == list(range(1, len(items) + 1)), (run, [s for s, _ in items])
        changes = [c for _, c in items]
        assert isinstance(changes[0], RunStarted), (run, changes[0])
        finished = [i for i, c in enumerate(changes) if isinstance(c, RunFinished)]
        assert finished in ([], [len(changes) - 1]), (run, finished)
        assert bool(finished) == done.get(run, False), (run, finished, done.get(run))
        ok = Counter(
            c.step for c in changes if isinstance(c, AttemptTransitioned) and c.to_state == Succeeded()
        )
        assert all(n == 1 for n in ok.values()), (run, ok)
    for run, is_done in done.items():
        if is_done:
            assert run in per_run, f"{run}: row closed with no record in the journal"
    with PgJournal(url, schema=schema) as journal:
        report = replay(journal)
    assert report.valid, report
    return {run: [c for _, c in items] for run, items in per_run.items()}


def spawn(url: str, schema: str, tmp_path: Path, module: str = ADV, **env: str) -> subprocess.Popen[str]:
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "PG_URL": url, **env}
    return subprocess.Popen(
        [sys.executable, "-c", module, url, schema],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        raise AssertionError(f"worker hung:\n{out}") from None
    return process.returncode, out


def wait_line(process: subprocess.Popen[str], needle: str, timeout: float = 60) -> list[str]:
    """Read the worker's output until a line holds ``needle``; the lines read."""
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not seen in:\n{''.join(seen)}")


def wait_stopped(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1].startswith("T"):
                return
        time.sleep(0.01)
    raise AssertionError("the worker did not stop itself")


def wait_until(predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Poll ``predicate`` until it holds; the timeout only keeps a broken test from hanging."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the awaited state never came"
        time.sleep(0.01)


def row(url: str, schema: str) -> list[tuple[object, ...]]:
    return sql_in(url, schema, "SELECT run, done, outcome, fence, owner IS NULL FROM {s}.runs ORDER BY run")


# --------------------------------------------------------------------------
# 1. SIGKILL at every record of `pay`, and at the held start and end
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 18))
def test_kill_after_every_record_then_a_taker_finishes(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path, n: int
) -> None:
    submit_run(pg_url, "pay", "r1", schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, START, KILL_AFTER=str(n)))
    assert code == -signal.SIGKILL, out
    check_journal(pg_url, schema)
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(spawn(pg_url, schema, tmp_path, START))
    assert code == 0, out
    assert row(pg_url, schema) == [("r1", True, "succeeded", 1 if n == 17 else 2, False)]
    changes = check_journal(pg_url, schema)["r1"]
    assert isinstance(changes[-1], RunFinished)
    assert calls(downstream) == ["r1/charge/card"]


@pytest.mark.parametrize("hook", ["kill-held-start", "kill-held-end"])
def test_kill_while_a_record_is_held_then_a_taker_finishes(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path, hook: str
) -> None:
    submit_run(pg_url, "pay", "r1", schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, ADV_HOOK=hook))
    assert code == -signal.SIGKILL and f"hook {hook}" in out, out
    before = check_journal(pg_url, schema)
    assert before == {} if hook == "kill-held-start" else len(before["r1"]) == 16
    assert row(pg_url, schema) == [("r1", False, None, 1, False)]
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(spawn(pg_url, schema, tmp_path))
    assert code == 0 and "taken over" in out, out
    assert row(pg_url, schema) == [("r1", True, "succeeded", 2, False)]
    check_journal(pg_url, schema)
    assert calls(downstream) == ["r1/charge/card"]


# --------------------------------------------------------------------------
# 2. A graceful stop (SIGTERM) while the start or the end is held
# --------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["term-held-start", "term-held-end"])
def test_sigterm_while_a_record_is_held(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path, hook: str
) -> None:
    submit_run(pg_url, "pay", "r1", {"sleep": 0.3}, schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, ADV_HOOK=hook))
    assert code == 0 and f"hook {hook}" in out, out
    check_journal(pg_url, schema)
    if hook == "term-held-start":
        assert "r1: stopped and released" in out, out
        assert row(pg_url, schema) == [("r1", False, None, 1, True)]
    else:
        assert "r1: succeeded" in out, out
        assert row(pg_url, schema) == [("r1", True, "succeeded", 1, False)]
    code, out = finish(spawn(pg_url, schema, tmp_path))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    check_journal(pg_url, schema)
    assert calls(downstream) == ["r1/charge/card"]


# --------------------------------------------------------------------------
# 3. A takeover while the start or the end is held: the old owner writes nothing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["stop-held-start", "stop-before-close"])
def test_a_takeover_while_a_record_is_held_leaves_the_old_owner_nothing_to_write(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path, hook: str
) -> None:
    submit_run(pg_url, "pay", "r1", schema=schema)
    frozen = spawn(pg_url, schema, tmp_path, ADV_HOOK=hook)
    try:
        wait_line(frozen, f"hook {hook}")
        wait_stopped(frozen.pid)
        assert len(expire_heartbeats(pg_url, schema)) == 1
        code, out = finish(spawn(pg_url, schema, tmp_path))
        assert code == 0 and "taken over from worker" in out, out
        after = raw_rows(pg_url, schema)
        assert row(pg_url, schema) == [("r1", True, "succeeded", 2, False)]
    finally:
        frozen.send_signal(signal.SIGUSR1)  # its own clock an hour on: it wakes up past its lease
        frozen.send_signal(signal.SIGCONT)
    code, out = finish(frozen)
    assert code == 3 and "r1: LeaseLost" in out, out
    assert raw_rows(pg_url, schema) == after
    assert row(pg_url, schema) == [("r1", True, "succeeded", 2, False)]
    check_journal(pg_url, schema)
    assert calls(downstream) == ["r1/charge/card"]


# --------------------------------------------------------------------------
# 4. Pools, failing steps
# --------------------------------------------------------------------------


def test_a_pooled_step_that_never_gets_a_slot(pg_url: str, schema: str, tmp_path: Path) -> None:
    """Pool of 0 slots, queue deadline 0.3 s: the run ends (its start went in with the creation)."""
    set_pool(pg_url, "llm", 0, schema=schema)
    submit_run(pg_url, "hurry", "h1", schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="pooled"))
    assert code == 0, out
    [(run, done, outcome, fence, _)] = row(pg_url, schema)
    assert (run, done, fence) == ("h1", True, 1), out
    changes = check_journal(pg_url, schema)["h1"]
    assert [type(c).__name__ for c in changes] == [
        "RunStarted", "AttemptCreated", "AttemptTransitioned", "RunFinished"
    ], changes
    assert outcome != "succeeded"


def test_a_pooled_step_waiting_for_a_slot_is_stopped_and_taken_up_again(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """THINK waits for a slot of a paused pool; SIGTERM; the pool opens; a second worker finishes it."""
    set_pool(pg_url, "llm", 0, schema=schema)
    submit_run(pg_url, "think", "t1", schema=schema)
    first = spawn(pg_url, schema, tmp_path, WORKFLOWS="pooled")
    seen = wait_line(first, "claimed")
    # created (its start went in with the creation), waiting for a slot
    wait_until(lambda: [type(c) for _, _, c in raw_rows(pg_url, schema)] == [RunStarted, AttemptCreated])
    first.send_signal(signal.SIGTERM)
    code, out = finish(first)
    out = "".join(seen) + out
    assert code == 0 and "t1: stopped and released" in out, out
    check_journal(pg_url, schema)
    set_pool(pg_url, "llm", 1, schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="pooled"))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    check_journal(pg_url, schema)
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.slots WHERE run IS NOT NULL") == [(0,)]


@pytest.mark.parametrize("kill", ["", "kill-held-end"])
def test_failing_steps_end_the_run_failed(pg_url: str, schema: str, tmp_path: Path, kill: str) -> None:
    submit_run(pg_url, "boom", "b1", schema=schema)
    submit_run(pg_url, "allfail", "a1", schema=schema)
    env = {"ADV_HOOK": kill} if kill else {}
    code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="failing", **env))
    if kill:
        assert code == -signal.SIGKILL, out
        assert len(expire_heartbeats(pg_url, schema)) == 1
        code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="failing"))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        ("a1", True, "failed"), ("b1", True, "failed")
    ]
    changes = check_journal(pg_url, schema)
    # boom fails twice (max_attempts 2); the kill may land while b1 runs
    # (a1's end came first): that attempt ends Cancelled, which is no try
    ends = [
        c.to_state for c in changes["b1"] if isinstance(c, AttemptTransitioned) and c.to_state != Running()
    ]
    assert ends.count(Failed()) == 2 and set(ends) <= {Failed(), Cancelled()}, ends
    assert ends[-1] == Failed() and (kill or ends == [Failed(), Failed()]), ends


# --------------------------------------------------------------------------
# 5. The command line while a record is held
# --------------------------------------------------------------------------


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )


@pytest.mark.parametrize("hook", ["stop-held-start", "stop-before-close"])
def test_the_command_line_while_a_record_is_held(db: str, tmp_path: Path, downstream: Path, hook: str) -> None:
    """A live worker frozen with the start held (no record yet) or the end held (16 records)."""
    submit_run(db, "pay", "r1")
    frozen = spawn(db, "attempt_kernel", tmp_path, ADV_HOOK=hook)
    try:
        wait_line(frozen, f"hook {hook}")
        wait_stopped(frozen.pid)
        runs = cli(tmp_path, "runs", db, "--json")
        show = cli(tmp_path, "show", db, "r1")
        export = cli(tmp_path, "export", db)
        checked = cli(tmp_path, "replay", db)
        recovered = cli(tmp_path, "recover", db, "--workflows", "workerflows.pay:PAY")
        rows_before = raw_rows(db, "attempt_kernel")
    finally:
        frozen.send_signal(signal.SIGCONT)
    assert checked.returncode == 0 and "verdict: valid" in checked.stdout
    assert recovered.returncode == 0 and "leaving run r1 alone: a live worker drives it" in recovered.stdout
    if hook == "stop-held-start":
        # the claimed run is invisible: no record yet (as a queued run is)
        assert runs.returncode == 0 and '"runs": []' in runs.stdout
        assert show.returncode == 2 and "no run 'r1'" in show.stderr
        assert export.returncode == 0 and export.stdout == ""
        assert rows_before == []
    else:
        assert runs.returncode == 0 and '"status": "running"' in runs.stdout
        assert show.returncode == 0 and "running" in show.stdout
        assert export.returncode == 0 and len(export.stdout.splitlines()) == 16
        assert len(rows_before) == 16
    code, out = finish(frozen)
    # its lease (dead after 300 s) outlived the freeze: woken, it finishes the run
    assert code == 0 and "r1: succeeded" in out, out
    code, out = finish(spawn(db, "attempt_kernel", tmp_path))
    assert code == 0, out
    assert raw_rows(db, "attempt_kernel")[: len(rows_before)] == rows_before
    check_journal(db, "attempt_kernel")
    assert sql_in(db, "attempt_kernel", "SELECT done FROM {s}.runs") == [(True,)]


# --------------------------------------------------------------------------
# 6. The numbers a held append returns are the numbers written
# --------------------------------------------------------------------------


def test_returned_numbers_are_the_numbers_written(
    pg_url: str, schema: str, downstream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[tuple[str, int, tuple[Change, ...]]] = []
    original = _OneRun.append_all

    def spy(self: _OneRun, run: str, changes: Sequence[Change]) -> int:
        seq = original(self, run, changes)
        handed.append((run, seq, tuple(changes)))
        return seq

    monkeypatch.setattr(_OneRun, "append_all", spy)
    for i in range(4):
        submit_run(pg_url, "pay", f"r{i}", schema=schema)
    assert run_worker(pg_url, [PAY], schema=schema, concurrency=4, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 4
    written = {(run, seq): change for run, seq, change in raw_rows(pg_url, schema)}
    assert handed
    for run, last, changes in handed:
        for i, change in enumerate(changes):
            assert written[(run, last - len(changes) + 1 + i)] == change, (run, last, changes)
    check_journal(pg_url, schema)


# --------------------------------------------------------------------------
# 7. The closing statement commits synchronously, and is fenced
# --------------------------------------------------------------------------


def test_the_closing_statement_sets_synchronous_commit(pg_url: str, schema: str) -> None:
    with PgJournal(pg_url, schema=schema, leases={"r1": Lease(owner="w", fence=1)}) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        statement = journal._insert_closing(1)  # pyright: ignore[reportPrivateUsage]
    with psycopg.connect(pg_url) as conn:  # a transaction, to look at the setting before commit
        conn.execute("SET synchronous_commit = off")
        conn.commit()
        conn.execute(statement, ("succeeded", "r1", "w", 1, 1, encode_record(1, 0, "r1", RunStarted(workflow="pay"))))
        setting = conn.execute("SHOW synchronous_commit").fetchone()
        conn.commit()
    assert setting == ("on",)


# --------------------------------------------------------------------------
# 8. Cancelled runs: before the first attempt, and closed by a takeover's recovery
# --------------------------------------------------------------------------


@pytest.mark.parametrize("when", ["before-run", "after-start"])
def test_a_run_cancelled_before_its_first_attempt_holds_and_closes_cleanly(
    pg_url: str, schema: str, downstream: Path, when: str
) -> None:
    """The worker's own sequence (`_OneRun` holding, then `append_and_complete`), cancelled early."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        view = _OneRun(journal, journal, "r1", fresh=True, holds=True)
        executor = Executor(view)
        control = RunControl()

        async def go() -> str:
            if when == "before-run":
                control.cancel()
            else:
                asyncio.get_running_loop().call_soon(control.cancel)
            report = await executor.run(PAY, "r1", control=control)
            return report.status

        status = asyncio.run(go())
        assert status == "cancelled"
        assert view.end and isinstance(view.end[-1], RunFinished)
        journal.append_and_complete("r1", view.end, outcome=status)
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "cancelled")]
    changes = check_journal(pg_url, schema)["r1"]
    assert type(changes[0]).__name__ == "RunStarted"
    assert calls(downstream) == []


def test_a_cancelled_run_closed_by_a_takeovers_recovery_then_a_crash(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """A takeover's recovery closes a cancelled run with its own append, then the row in a
    second statement (design.md says so): a crash in between leaves a finished run with an
    open row, and the next worker closes the row as cancelled, writing no record."""
    with PgJournal(pg_url, schema=schema) as journal:
        journal.append("r1", RunStarted(workflow="pay"))
        journal.append("r1", AttemptCreated(step="prepare", attempt=1))
        journal.append("r1", RunCancelRequested(reason="operator"))
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'h', 1, true)")
    sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, workflow, input, owner, fence) VALUES ('r1', 'pay', 'null', 'gone', 1)")
    # record 1: recovery ends the orphan; record 2: recovery's RunFinished
    code, out = finish(spawn(pg_url, schema, tmp_path, START, KILL_AFTER="2"))
    assert code == -signal.SIGKILL, out
    changes = [c for _, _, c in raw_rows(pg_url, schema)]
    assert len(changes) == 5 and isinstance(changes[-1], RunFinished)
    assert sql_in(pg_url, schema, "SELECT done FROM {s}.runs") == [(False,)]
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(spawn(pg_url, schema, tmp_path, START))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "cancelled")]
    assert [c for _, _, c in raw_rows(pg_url, schema)] == changes


# --------------------------------------------------------------------------
# 9. SIGKILL sweeps over failing and pooled workflows, several runs at once
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 15))
def test_kill_sweep_failing_workflows(pg_url: str, schema: str, tmp_path: Path, n: int) -> None:
    submit_run(pg_url, "boom", "b1", schema=schema)
    submit_run(pg_url, "allfail", "a1", schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="failing", KILL_AFTER=str(n)))
    check_journal(pg_url, schema)
    if code == -signal.SIGKILL:
        assert len(expire_heartbeats(pg_url, schema)) == 1
        code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="failing"))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        ("a1", True, "failed"), ("b1", True, "failed")
    ], out
    check_journal(pg_url, schema)


@pytest.mark.parametrize("n", range(1, 16))
def test_kill_sweep_pooled_runs(pg_url: str, schema: str, tmp_path: Path, n: int) -> None:
    set_pool(pg_url, "llm", 1, schema=schema)
    for run in ("t1", "t2", "t3"):
        submit_run(pg_url, "think", run, schema=schema)
    code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="pooled", KILL_AFTER=str(n)))
    check_journal(pg_url, schema)
    if code == -signal.SIGKILL:
        assert len(expire_heartbeats(pg_url, schema)) == 1
        code, out = finish(spawn(pg_url, schema, tmp_path, WORKFLOWS="pooled"))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        (r, True, "succeeded") for r in ("t1", "t2", "t3")
    ], out
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.slots WHERE run IS NOT NULL") == [(0,)]
    check_journal(pg_url, schema)


# --------------------------------------------------------------------------
# 10. The closing statement racing a takeover's update of the row
# --------------------------------------------------------------------------


@pytest.mark.parametrize("taker_commits", [True, False])
def test_close_waits_for_a_concurrent_takeover_and_then_writes_nothing(
    pg_url: str, schema: str, taker_commits: bool
) -> None:
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        journal.append_all("r1", (RunStarted(workflow="pay"), AttemptCreated(step="prepare", attempt=1)))
        taker = psycopg.connect(pg_url)  # a transaction held open: the takeover's update, not committed
        taker.execute(sql.SQL("UPDATE {s}.runs SET owner = 'other', fence = 2 WHERE run = 'r1'").format(s=sql.Identifier(schema)))
        outcome: list[object] = []

        def close() -> None:
            try:
                outcome.append(journal.append_and_complete("r1", (RunFinished(),), outcome="failed"))
            except Exception as error:  # noqa: BLE001
                outcome.append(error)

        thread = threading.Thread(target=close)
        thread.start()
        blocker = taker.info.backend_pid
        wait_until(lambda: sql_in(
            pg_url, schema, "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", blocker
        ) == [(1,)])
        assert outcome == []  # blocked on the row lock
        if taker_commits:
            taker.commit()
        else:
            taker.rollback()
        thread.join(60)
        taker.close()
    if taker_commits:
        assert type(outcome[0]).__name__ == "LeaseLost", outcome
        assert sql_in(pg_url, schema, "SELECT done, owner, fence FROM {s}.runs") == [(False, "other", 2)]
        assert len(raw_rows(pg_url, schema)) == 2
    else:
        assert outcome == [3]
        assert sql_in(pg_url, schema, "SELECT done, owner, fence, outcome FROM {s}.runs") == [(True, "w", 1, "failed")]
        assert len(raw_rows(pg_url, schema)) == 3


# --------------------------------------------------------------------------
# 11. append_and_complete closes a row only with the run's end
# --------------------------------------------------------------------------


def test_append_and_complete_refuses_records_that_do_not_end_the_run(pg_url: str, schema: str) -> None:
    """Records that do not end in RunFinished: ValueError, nothing written, the row stays open."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        journal.append("r1", RunStarted(workflow="pay"))
        with pytest.raises(ValueError, match="must end with the run's RunFinished"):
            journal.append_and_complete("r1", (RunCancelRequested(reason="x"),), outcome="succeeded")
        with pytest.raises(ValueError, match="must end with the run's RunFinished"):
            journal.append_and_complete("r1", (RunFinished(), RunCancelRequested(reason="x")), outcome="succeeded")
    assert sql_in(pg_url, schema, "SELECT done FROM {s}.runs") == [(False,)]
    assert len(raw_rows(pg_url, schema)) == 1
