"""Database faults under a running worker: its sessions killed, the server restarted.

Against a PostgreSQL server of this module's own (restarting it must not
disturb the session's server that the other tests share). The worker is
the command line's, ``attempt-kernel worker URL --until-idle``, a
subprocess, driving twelve runs of ``workerflows.pay`` (the fake downstream
service is a file of the keys it was called with). Mid-run, the test kills
the worker's database sessions with ``pg_terminate_backend`` (each one in
turn, then all of them) or restarts the server (``pg_ctl restart -m fast``).
The last runs' charges wait at a gate the test opens only after the fault,
so the fault always finds the worker busy, however slow or fast it ran.

What must hold: the worker reconnects and finishes (exit 0), or exits
cleanly with the CLI's exit code for I/O errors (2) and one line
``attempt-kernel worker: error: ...``, never a traceback; a fresh worker
then finishes every remaining run; nothing acknowledged is lost (the
records read before the fault are still the journal's first records, every
run closed in the queue has its end, every key the downstream saw has its
``Dispatched`` record, no key is sent twice); the journal replays clean.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pgserver import ThrowawayServer, own_server
from pgtools import expire_heartbeats, sql_in
from typing_extensions import LiteralString
from workerflows.pay import calls

from attempt_kernel import (
    AttemptTransitioned,
    Dispatched,
    IntentChanged,
    Record,
    RunFinished,
    Succeeded,
    replay,
)
from attempt_kernel.postgres._journal import DEFAULT_SCHEMA, PgJournal
from attempt_kernel.postgres._worker import submit_run

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TESTS = Path(__file__).parent
RUNS = [f"r{i:02}" for i in range(12)]
GATED = RUNS[-2:]
"""Runs whose first charge waits at the test's gate: the worker cannot be done before the fault."""
APP = "attempt-kernel-fault-worker"
"""The worker's ``application_name`` (libpq reads PGAPPNAME), so the test finds its sessions."""

EXIT_IO_ERROR = 2
"""The CLI's exit code for usage and I/O errors (``attempt-kernel worker --help``)."""

# --------------------------------------------------------------------------
# The server of this module, and helpers
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ThrowawayServer, str]]:
    """A PostgreSQL of this module's own (and its URL), which the tests may restart."""
    yield from own_server()


@pytest.fixture
def url(server: tuple[ThrowawayServer, str]) -> Iterator[str]:
    """The server's URL; the journal (the CLI's default schema) is dropped after each test."""
    yield server[1]
    query(server[1], "DROP SCHEMA IF EXISTS {s} CASCADE")


def restart(throwaway: ThrowawayServer) -> None:
    """``pg_ctl restart -m fast``, as the user that owns the cluster (as ThrowawayServer does)."""
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    # --log: the new postmaster must not hold this process's pipes open.
    subprocess.run(
        [
            *as_owner,
            str(throwaway.bindir / "pg_ctl"),
            "--pgdata", str(throwaway.data),
            "--log", str(throwaway.data.parent / "restarted.log"),
            "--mode", "fast",
            "--wait", "--timeout", "30",
            "restart",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=60,
    )  # fmt: skip


def worker(url: str, tmp_path: Path) -> subprocess.Popen[str]:
    """``attempt-kernel worker URL --until-idle`` (heartbeat 0.2 s, dead after 300 s, 2 runs at once)."""
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "PGAPPNAME": APP}
    return subprocess.Popen(
        [
            sys.executable, "-m", "attempt_kernel", "worker", url,
            "--workflows", "workerflows.pay:PAY",
            "--heartbeat", "0.2", "--dead-after", "300",
            "--concurrency", "2", "--until-idle",
        ],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"the worker did not end within {timeout} s:\n{out}")
    return process.returncode, out


def query(url: str, statement: LiteralString, *params: object) -> list[tuple[object, ...]]:
    """Run ``statement`` ({s} is the journal's schema) on a connection of its own."""
    return sql_in(url, DEFAULT_SCHEMA, statement, *params)


def closed_runs(url: str) -> list[tuple[object, ...]]:
    """(run, outcome) of every run the queue says is done, in run order."""
    return query(url, "SELECT run, outcome FROM {s}.runs WHERE done ORDER BY run")


def journal_records(url: str) -> list[Record]:
    with PgJournal(url) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def worker_sessions(url: str) -> list[tuple[int, str]]:
    """(pid, last query) of the worker's sessions, oldest first."""
    rows = query(
        url,
        "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s ORDER BY backend_start, pid",
        APP,
    )
    return [(int(str(pid)), str(text)) for pid, text in rows]


def terminate(url: str, pids: list[int]) -> None:
    assert pids, "no worker session found to terminate"
    rows = query(url, "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", pids)
    assert all(killed is True for (killed,) in rows), rows


# Which of the worker's sessions: the journal's connection is opened first,
# then the queue's (claims and closing runs); the heartbeat's thread has a
# connection of its own, found by its statement.
def pick(session: str, sessions: list[tuple[int, str]]) -> list[int]:
    """The pids of ``session``; none until the heartbeat's session has beaten (it is told apart by its statement)."""
    beat = [pid for pid, text in sessions if "heartbeat_at = now()" in text]
    if not beat:
        return []  # not yet told apart: the heartbeat's session would pass for the journal's or the queue's
    others = [pid for pid, _ in sessions if pid not in beat]
    match session:
        case "journal":
            return others[:1]
        case "queue":
            return others[1:2]
        case "heartbeat":
            return beat
        case _:
            return [pid for pid, _ in sessions]


# --------------------------------------------------------------------------
# The faults
# --------------------------------------------------------------------------

FAULTS = [
    pytest.param("journal", id="kill-the-journal-session"),
    pytest.param("queue", id="kill-the-queue-session"),
    pytest.param("heartbeat", id="kill-the-heartbeat-session"),
    pytest.param("all", id="kill-every-session"),
    pytest.param("restart", id="restart-postgresql"),
]


@pytest.mark.parametrize("fault", FAULTS)
def test_a_worker_survives_a_database_fault_or_exits_cleanly_and_nothing_acknowledged_is_lost(
    server: tuple[ThrowawayServer, str], url: str, tmp_path: Path, downstream: Path, fault: str
) -> None:
    """Mid-run fault: exit 0 or 2 without a traceback; a fresh worker finishes; no loss; replays clean."""
    gate = tmp_path / "gate"
    for run in RUNS:
        submit_run(url, "pay", run, {"gate": str(gate)} if run in GATED else {"sleep": 0.3})
    first = worker(url, tmp_path)
    try:
        wait_for(lambda: len(closed_runs(url)) >= 4, "four runs closed")
        targets: list[int] = []

        def found() -> bool:
            targets[:] = pick(fault, worker_sessions(url))
            return bool(targets)

        wait_for(found, f"the worker's {fault} session")  # the heartbeat's thread connects on its own
        before = journal_records(url)
        if fault == "restart":
            restart(server[0])
        else:
            terminate(url, targets)
    finally:
        gate.touch()  # the gated charges go on only once the fault is in
        code, out = finish(first)
    assert "Traceback" not in out, out
    assert code in (0, EXIT_IO_ERROR), out
    if code == EXIT_IO_ERROR:
        assert "attempt-kernel worker: error: " in out, out
    expire_heartbeats(url, DEFAULT_SCHEMA)  # it is gone: if it could not retire, the next worker finds it dead
    code, out = finish(worker(url, tmp_path))
    assert "Traceback" not in out and code == 0, out
    assert closed_runs(url) == [(run, "succeeded") for run in RUNS]
    records = journal_records(url)
    assert records[: len(before)] == before  # nothing committed before the fault went missing
    finished = {r.run for r in records if isinstance(r.change, RunFinished)}
    assert finished == set(RUNS)
    dispatched = {
        f"{r.run}/{r.change.step}/{r.change.name}"
        for r in records
        if isinstance(r.change, IntentChanged) and r.change.to_state == Dispatched()
    }
    sent = calls(downstream)
    assert set(sent) <= dispatched  # the write-ahead rule held through the fault
    assert Counter(sent) == Counter(f"{run}/charge/card" for run in RUNS)  # each key sent once
    succeeded = Counter(
        (r.run, r.change.step)
        for r in records
        if isinstance(r.change, AttemptTransitioned) and r.change.to_state == Succeeded()
    )
    assert set(succeeded.values()) == {1}
    with PgJournal(url) as journal:
        assert replay(journal).valid
