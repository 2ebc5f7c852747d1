"""A worker survives its database: reconnecting with backoff, a bound, fencing kept.

First, without a server: the backoff's schedule (`Backoff`, on a fake
random number source, sleep and clock), a worker that cannot reach its
database at the start (it retries on that schedule, then gives up with
`PgConnectFailed`), and the CLI's exit 3 for an unreachable database.

Then against a PostgreSQL server of this module's own (the tests restart
and stop it, which must not disturb the session's shared server), the
command line's worker (``attempt-kernel worker URL --until-idle``, a
subprocess) driving ``workerflows.pay`` runs whose first ``charge`` attempt
waits at a gate before its effect: the server restarted mid-run, the
worker's sessions terminated, the server down longer than
``--reconnect-for``, and the worker cut off from the database (its role
refused logins) longer than ``dead_after`` while another worker takes its
run over. Each waits for records in the journal, never for a sleep alone,
and opens the gate (creates its file) only once the fault is in, so the
fault always finds the charges live, however slow the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pgserver import ThrowawayServer, own_server
from pgtools import sql_in
from typing_extensions import LiteralString
from workerflows.pay import PAY, calls

from attempt_kernel import AttemptTransitioned, Dispatched, IntentChanged, Record, Running, Succeeded, replay
from attempt_kernel.cli._main import main
from attempt_kernel.postgres import Backoff, PgConnectFailed, Worker, run_worker
from attempt_kernel.postgres._journal import DEFAULT_SCHEMA, PgJournal
from attempt_kernel.postgres._worker import submit_run

TESTS = Path(__file__).parent
APP = "attempt-kernel-reconnect-worker"
"""The worker's ``application_name`` (libpq reads PGAPPNAME), so the test finds its sessions."""

# --------------------------------------------------------------------------
# Without a server: the schedule, the bound, the exit code
# --------------------------------------------------------------------------


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class FakeTime:
    """A clock that moves only when the fake sleep sleeps; it records every sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.then: Callable[[], None] | None = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.then is not None:
            self.then()


def upper(low: float, high: float) -> float:
    """The fake random source: always the upper bound of the jitter."""
    return high


def test_the_backoff_doubles_from_base_to_cap_with_full_jitter() -> None:
    """uniform(0, min(cap, base * 2**n)): the bounds asked for, and the waits that come back."""
    asked: list[tuple[float, float]] = []

    def half(low: float, high: float) -> float:
        asked.append((low, high))
        return high / 2

    backoff = Backoff(base=0.1, cap=5.0, uniform=half)
    delays = [backoff.delay(n) for n in range(9)]
    assert asked == [
        (0.0, 0.1), (0.0, 0.2), (0.0, 0.4), (0.0, 0.8), (0.0, 1.6), (0.0, 3.2),
        (0.0, 5.0), (0.0, 5.0), (0.0, 5.0),
    ]  # fmt: skip
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.5, 2.5, 2.5])
    assert Backoff(uniform=upper).delay(10_000) == 5.0  # no overflow far out


@pytest.mark.parametrize(
    ("base", "cap", "message"),
    [
        (0.0, 5.0, "Backoff base must be a positive number of seconds, got 0.0"),
        (float("nan"), 5.0, "Backoff base must be a positive number of seconds, got nan"),
        (1.0, 0.5, r"Backoff cap must be a number of seconds at least base \(1.0\), got 0.5"),
        (1.0, float("inf"), r"Backoff cap must be a number of seconds at least base \(1.0\), got inf"),
    ],
)
def test_a_backoff_refuses_bounds_that_make_no_schedule(base: float, cap: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backoff(base=base, cap=cap)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_a_worker_refuses_a_reconnect_window_that_is_not_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="reconnect_for must be a number of seconds, 0 or more, got"):
        Worker("postgresql://127.0.0.1:1/x", [PAY], reconnect_for=bad)


def test_a_worker_that_cannot_reach_its_database_retries_on_the_schedule_then_gives_up() -> None:
    """Refused connections at the start: waits 0.1, 0.2, 0.4, 0.8 (1.5 s); the next (1.6) would
    end past reconnect_for=2, so it is cut to 0.5 for a last try at 2 s; that fails too, so it
    raises PgConnectFailed naming the database and the window."""
    port = closed_port()
    fake = FakeTime()
    lines: list[str] = []
    backoff = Backoff(uniform=upper, sleep=fake.sleep, clock=fake.clock)
    with pytest.raises(PgConnectFailed) as raised:
        run_worker(
            f"postgresql://postgres@127.0.0.1:{port}/jobs", [PAY],
            reconnect_for=2.0, backoff=backoff, progress=lines.append,
        )  # fmt: skip
    assert fake.slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.5])
    message = str(raised.value)
    assert message.startswith(
        f"database unavailable: PostgreSQL at 127.0.0.1:{port}, database jobs stayed unreachable"
        " for 2.0 s (last error: connection failed: "
    ), message
    assert "Connection refused" in message and "reconnect_for" not in message, message
    assert message.endswith(" stopped after trying to reconnect for 2 s"), message
    assert len(lines) == 5 and all("is unreachable" in line for line in lines), lines
    assert lines[4].endswith("connecting again in 0.50 s (attempt 5)"), lines[4]
    assert lines[0].endswith("connecting again in 0.10 s (attempt 1)"), lines[0]


def test_reconnect_for_zero_gives_up_at_the_first_failure_without_waiting() -> None:
    fake = FakeTime()
    with pytest.raises(
        PgConnectFailed,
        match=r"was unreachable \(last error: .*\), so worker \S+ stopped at the first failure, without trying to"
        r" reconnect$",
    ):
        run_worker(
            f"postgresql://postgres@127.0.0.1:{closed_port()}/jobs", [PAY],
            reconnect_for=0, backoff=Backoff(sleep=fake.sleep, clock=fake.clock),
        )  # fmt: skip
    assert fake.slept == []


def test_a_worker_stopped_while_it_waits_for_the_database_returns_having_closed_nothing() -> None:
    fake = FakeTime()
    worker = Worker(
        f"postgresql://postgres@127.0.0.1:{closed_port()}/jobs", [PAY],
        backoff=Backoff(uniform=upper, sleep=fake.sleep, clock=fake.clock),
    )  # fmt: skip
    fake.then = lambda: worker.stop("the test")
    assert worker.run() == 0
    assert fake.slept == [0.1]


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "URL"],
        ["show", "URL", "r1"],
        ["submit", "URL", "workerflows.pay:PAY"],
        ["pools", "URL"],
        ["replay", "URL"],
        ["worker", "URL", "--workflows", "workerflows.pay:PAY", "--reconnect-for", "0"],
    ],
    ids=["runs", "show", "submit", "pools", "replay", "worker"],
)
def test_an_unreachable_database_is_exit_3_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command that takes a URL: exit 3 (not 2: a usage error), the host and database named."""
    port = closed_port()
    url = f"postgresql://ak:secret@127.0.0.1:{port}/jobs"
    code = main([url if a == "URL" else a for a in argv])
    err = capsys.readouterr().err
    assert code == 3, err
    assert f"PostgreSQL at 127.0.0.1:{port}, database jobs" in err and "secret" not in err, err
    assert err.startswith(f"attempt-kernel {argv[0]}: error: "), err


@pytest.mark.parametrize(
    ("window", "how"),
    [
        ("0", " was unreachable (last error: "),
        ("0.3", " stayed unreachable for 0.3 s (last error: "),
    ],
)
def test_a_worker_that_gave_up_names_the_flag_that_sets_its_window(
    capsys: pytest.CaptureFixture[str], window: str, how: str
) -> None:
    """The command line's message named the Python parameter: `(reconnect_for is 0 s)`."""
    port = closed_port()
    url = f"postgresql://ak@127.0.0.1:{port}/jobs"
    assert main(["worker", url, "--workflows", "workerflows.pay:PAY", "--reconnect-for", window]) == 3
    err = capsys.readouterr().err
    assert err.startswith(
        f"attempt-kernel worker: error: database unavailable: PostgreSQL at 127.0.0.1:{port}, database jobs{how}"
        "connection failed: "
    ), err
    tried = "at the first failure, without trying to reconnect" if window == "0" else f"after trying to reconnect for {window} s"
    assert err.endswith(f" stopped {tried} (--reconnect-for {window})\n"), err
    assert "reconnect_for" not in err


def test_a_reconnect_window_that_is_not_seconds_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["worker", "postgresql://127.0.0.1:1/x", "--workflows", "m:a", "--reconnect-for", "-1"])
    assert exited.value.code == 2
    assert "--reconnect-for: expected a number of seconds, 0 or more, got -1" in capsys.readouterr().err


# --------------------------------------------------------------------------
# A server of this module's own
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ThrowawayServer, str]]:
    """A PostgreSQL of this module's own (and its URL), which the tests restart and stop."""
    yield from own_server()


@pytest.fixture
def url(server: tuple[ThrowawayServer, str]) -> Iterator[str]:
    """The server's URL; the journal (the CLI's default schema) is dropped after each test."""
    yield server[1]
    query(server[1], "DROP SCHEMA IF EXISTS {s} CASCADE")


def pg_ctl(throwaway: ThrowawayServer, *argv: str) -> None:
    """``pg_ctl ARGV`` on the cluster, as the user that owns it (as ThrowawayServer does)."""
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    # --log: the new postmaster must not hold this process's pipes open.
    subprocess.run(
        [
            *as_owner, str(throwaway.bindir / "pg_ctl"),
            "--pgdata", str(throwaway.data), "--log", str(throwaway.data.parent / "again.log"),
            "--wait", "--timeout", "30", *argv,
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60,
    )  # fmt: skip


def start_again(throwaway: ThrowawayServer, url: str) -> None:
    """Start a stopped cluster on its port and socket folder (what ThrowawayServer.start chose)."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    options = (
        f"-c listen_addresses=127.0.0.1 -p {port} -k {throwaway.data.parent / 'sockets'}"
        " -c fsync=off -c full_page_writes=off -c shared_buffers=32MB -c max_connections=50"
    )
    pg_ctl(throwaway, "--options", options, "start")


def query(url: str, statement: LiteralString, *params: object) -> list[tuple[object, ...]]:
    """Run ``statement`` ({s} is the journal's schema) on a connection of its own."""
    return sql_in(url, DEFAULT_SCHEMA, statement, *params)


def worker(url: str, tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    """``attempt-kernel worker URL --until-idle`` (heartbeat 0.2 s, dead after 0.8 s), its output piped."""
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "PGAPPNAME": APP}
    return subprocess.Popen(
        [
            sys.executable, "-m", "attempt_kernel", "worker", url,
            "--workflows", "workerflows.pay:PAY",
            "--heartbeat", "0.2", "--dead-after", "0.8", "--until-idle", *flags,
        ],
        cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the worker did not end within {timeout} s:\n{out}\n{err}")
    return process.returncode, out, err


def journal_records(url: str) -> list[Record]:
    with PgJournal(url) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def charging(url: str, runs: list[str]) -> Callable[[], bool]:
    """True once every one of ``runs`` has its first charge attempt Running (at its gate, before its effect)."""

    def ready() -> bool:
        running = {
            r.run
            for r in journal_records(url)
            if isinstance(r.change, AttemptTransitioned)
            and r.change.step == "charge"
            and r.change.to_state == Running()
        }
        return running >= set(runs)

    return ready


def assert_every_run_succeeded_once(url: str, runs: list[str], downstream: Path) -> None:
    """Closed as succeeded in the queue, each key sent once downstream and dispatched once in the
    journal, one success per step, replays clean."""
    assert query(url, "SELECT run, outcome FROM {s}.runs WHERE done ORDER BY run") == [
        (run, "succeeded") for run in runs
    ]
    assert Counter(calls(downstream)) == Counter(f"{run}/charge/card" for run in runs)
    records = journal_records(url)
    succeeded = Counter(
        (r.run, r.change.step)
        for r in records
        if isinstance(r.change, AttemptTransitioned) and r.change.to_state == Succeeded()
    )
    assert succeeded == Counter({(run, step): 1 for run in runs for step in ("prepare", "charge", "finish")})
    dispatched = Counter(
        f"{r.run}/{r.change.step}/{r.change.name}"
        for r in records
        if isinstance(r.change, IntentChanged) and r.change.to_state == Dispatched()
    )
    assert dispatched == Counter(f"{run}/charge/card" for run in runs)  # each intent dispatched once
    with PgJournal(url) as journal:
        assert replay(journal).valid

# --------------------------------------------------------------------------
# The faults
# --------------------------------------------------------------------------

RUNS = ["r1", "r2", "r3"]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_server_restart_mid_run_and_the_worker_finishes_every_run(
    server: tuple[ThrowawayServer, str], url: str, tmp_path: Path, downstream: Path
) -> None:
    """pg_ctl restart while three charges wait at their gate: the worker reconnects, takes its
    runs over under a fresh id, finishes them all (each key sent once) and exits 0."""
    gate = tmp_path / "gate"
    for run in RUNS:
        submit_run(url, "pay", run, {"gate": str(gate)})
    first = worker(url, tmp_path)
    try:
        wait_for(charging(url, RUNS), "three charges running")
        pg_ctl(server[0], "--mode", "fast", "restart")
    finally:
        gate.touch()  # only now may the charges go on
        code, out, err = finish(first)
    assert code == 0, out + err
    assert "Traceback" not in out + err
    assert "the database connection failed" in out and "is retired after the outage" in out, out
    assert_every_run_succeeded_once(url, RUNS, downstream)


@pytest.mark.slow
@pytest.mark.postgres
def test_the_worker_sessions_terminated_and_it_reconnects_and_finishes(
    url: str, tmp_path: Path, downstream: Path
) -> None:
    """pg_terminate_backend of every session of the worker: it reconnects and finishes, exit 0."""
    gate = tmp_path / "gate"
    for run in RUNS:
        submit_run(url, "pay", run, {"gate": str(gate)})
    first = worker(url, tmp_path)
    try:
        wait_for(charging(url, RUNS), "three charges running")
        rows = query(
            url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", APP
        )
        assert len(rows) >= 2 and all(killed is True for (killed,) in rows), rows
    finally:
        gate.touch()  # only now may the charges go on
        code, out, err = finish(first)
    assert code == 0, out + err
    # Not the server's words ("terminating connection due to administrator
    # command"): whether libpq reads them before it finds the socket closed
    # ("server closed the connection unexpectedly") depends on which session
    # (the heartbeat's, the journal's) next uses its connection, and when.
    assert "the database connection failed" in out, out
    assert "is retired after the outage" in out, out
    assert_every_run_succeeded_once(url, RUNS, downstream)


@pytest.mark.slow
@pytest.mark.postgres
def test_an_outage_longer_than_reconnect_for_is_exit_3_and_a_later_worker_finishes(
    server: tuple[ThrowawayServer, str], url: str, tmp_path: Path, downstream: Path
) -> None:
    """The server stopped mid-run for longer than --reconnect-for 1: exit 3, one error line naming
    the database; once it is back, a fresh worker takes the run over and finishes it."""
    gate = tmp_path / "gate"
    submit_run(url, "pay", "r1", {"gate": str(gate)})
    first = worker(url, tmp_path, "--reconnect-for", "1")
    try:
        wait_for(charging(url, ["r1"]), "the charge running")
        pg_ctl(server[0], "--mode", "fast", "stop")
        gate.touch()  # the charge goes on into the outage
        try:
            code, out, err = finish(first)
        finally:
            start_again(server[0], url)
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
    assert code == 3, out + err
    assert "Traceback" not in err
    port = url.rsplit(":", 1)[1].split("/")[0]
    assert err.startswith(
        f"attempt-kernel worker: error: database unavailable: PostgreSQL at 127.0.0.1:{port},"
        " database postgres stayed unreachable for "
    ), err
    assert err.count("\n") == 1, err
    code, out, err = finish(worker(url, tmp_path))
    assert code == 0 and "taken over from worker" in out, out + err
    assert_every_run_succeeded_once(url, ["r1"], downstream)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_cut_off_past_dead_after_writes_nothing_for_the_run_taken_over(
    url: str, tmp_path: Path, downstream: Path
) -> None:
    """The worker's role refused logins and its sessions ended, mid-charge: another worker
    takes the run over (fence 2) and finishes it. When logins are allowed again, the first
    worker registers under a fresh id, writes nothing (the journal is as the second left it),
    and exits 0 once idle."""
    query(url, "DROP ROLE IF EXISTS cutoff")
    query(url, "CREATE ROLE cutoff LOGIN SUPERUSER")
    cut_url = url.replace("postgres@", "cutoff@")
    gate = tmp_path / "gate"
    submit_run(url, "pay", "r1", {"gate": str(gate)})
    first = worker(cut_url, tmp_path, "--reconnect-for", "60")
    try:
        wait_for(charging(url, ["r1"]), "the charge running")
        (owner,) = query(url, "SELECT owner FROM {s}.runs WHERE run = 'r1'")[0]
        query(url, "ALTER ROLE cutoff NOLOGIN")
        query(url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'cutoff'")
        gate.touch()  # the charge goes on, cut off
        code, out, err = finish(worker(url, tmp_path))
        assert code == 0, out + err
        assert f"r1: taken over from worker {owner} at fence 2" in out, out
        taken = journal_records(url)
        query(url, "ALTER ROLE cutoff LOGIN")
        code, out, err = finish(first)
    finally:
        gate.touch()
        query(url, "ALTER ROLE cutoff LOGIN")
        if first.poll() is None:
            first.kill()
    assert code == 0, out + err
    before, retired, after = out.partition(f"worker {owner} is retired after the outage")
    assert retired and "r1 charge#1: Pending -> Running" in before, out
    assert "r1" not in after, out  # nothing more of the run taken over
    assert journal_records(url) == taken  # nothing written after the takeover
    assert query(url, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 2)]
    assert_every_run_succeeded_once(url, ["r1"], downstream)
