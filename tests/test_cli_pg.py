"""The command line on a PostgreSQL journal: a postgresql:// URL wherever a command takes LOG.

Each test gets a database of its own on the session's throwaway server, and
drives the CLI in subprocesses with the tutorial's workflow file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path

import psycopg
import pytest

from attempt_kernel import replay
from attempt_kernel._ledger import Ledger
from attempt_kernel._records import IntentReconciled, Record, SignalSent
from attempt_kernel.postgres import PgJournal

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

FLOWS = Path(__file__).resolve().parent.parent / "examples" / "tutorial" / "flows.py"
ORDER = '{"order": 8, "amount_cents": 1250}'


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A folder holding the tutorial's workflow file (the CLI imports flows:orders)."""
    shutil.copy(FLOWS, tmp_path / "flows.py")
    return tmp_path


def cli(cwd: Path, *args: str, crash: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.pop("CRASH_DURING", None)
    if crash is not None:
        env["CRASH_DURING"] = crash
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_runs_and_replay_work_on_a_url(db: str, shop: Path) -> None:
    """`run --log URL` writes the journal; `runs URL` and `replay URL` read it."""
    done = cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run status: succeeded" in done.stdout
    runs = cli(shop, "runs", db, "--json")
    assert runs.returncode == 0, runs.stderr
    [row] = json.loads(runs.stdout)["runs"]
    assert (row["run"], row["workflow"], row["status"]) == ("orders-1", "orders", "succeeded")
    checked = cli(shop, "replay", db)
    assert checked.returncode == 0 and "verdict: valid" in checked.stdout


def test_a_crash_on_a_url_is_recovered_reconciled_and_resumed(db: str, shop: Path) -> None:
    """Crash mid-effect, recover, reconcile, recover: the same session as the tutorial's, on PostgreSQL."""
    crashed = cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER, crash="email-receipt")
    assert crashed.returncode == -9
    runs = cli(shop, "runs", db, "--json")
    assert [r["status"] for r in json.loads(runs.stdout)["runs"]] == ["interrupted"]
    first = cli(shop, "recover", db, "--workflows", "flows:orders")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "send-receipt  Indeterminate attempts 1" in first.stdout
    shown = json.loads(cli(shop, "show", db, "orders-1", "--json").stdout)
    [intent] = shown["steps"][1]["attempts"][0]["intents"]
    assert intent["state"] == "Dispatched"
    reconciled = cli(shop, "reconcile", db, "--key", intent["key"], "--rejected", "--note", "not sent")
    assert reconciled.returncode == 0, reconciled.stderr
    second = cli(shop, "recover", db, "--workflows", "flows:orders")
    assert second.returncode == 0 and "run status: succeeded" in second.stdout
    assert json.loads((shop / "outbox.json").read_text()) == {intent["key"]: "receipt for order 8"}


def test_recover_url_without_the_workflow_names_the_url_not_a_python_repr(db: str, shop: Path) -> None:
    """The refusal began `PgJournal(schema='attempt_kernel'): run ...`; a log file's names its path."""
    secret = db.replace("postgres@", "postgres:s3cret-pw@", 1)
    crashed = cli(shop, "run", "flows:orders", "--log", secret, "--input", ORDER, crash="email-receipt")
    assert crashed.returncode == -9
    refused = cli(shop, "recover", secret)
    assert refused.returncode == 2
    where = "postgresql://postgres@" + db.partition("@")[2]
    assert refused.stderr == (
        f"attempt-kernel recover: error: {where}: run 'orders-1' belongs to workflow 'orders', which this"
        " program was not given (given: trip-planner); pass it with --workflows MODULE:ATTR\n"
    )


def test_reconcile_of_a_run_that_run_url_started_names_only_recover(db: str, shop: Path) -> None:
    """No worker takes up a run that `run --log URL` started (never submitted), so once its
    last key is reconciled only `recover URL` goes on with it, as `signal` and `cancel` say;
    reconcile named a worker first."""
    crashed = cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER, crash="email-receipt")
    assert crashed.returncode == -9
    assert cli(shop, "recover", db, "--workflows", "flows:orders").returncode == 0
    shown = json.loads(cli(shop, "show", db, "orders-1", "--json").stdout)
    [intent] = shown["steps"][1]["attempts"][0]["intents"]
    key = intent["key"]
    reconciled = cli(shop, "reconcile", db, "--key", key, "--rejected", "--note", "x")
    assert reconciled.returncode == 0, reconciled.stderr
    where = "postgresql://postgres@" + db.partition("@")[2]
    assert reconciled.stdout == (
        f"reconcile: intent email-receipt of run orders-1 / step send-receipt #1 ({key}) is now Rejected"
        " (it did not happen)\n"
        "  nothing of run orders-1 is outstanding now; no process drives run orders-1 now, and no worker"
        " takes it up (`attempt-kernel run` started it, never submitted):"
        f" `attempt-kernel recover {where} --workflows MODULE:ATTR` resumes it\n"
    )


def test_a_urls_password_is_never_printed(db: str, shop: Path) -> None:
    """run, a crash, recover, replay, runs and show on a URL with a password: none prints it."""
    secret = db.replace("postgres@", "postgres:s3cret-pw@", 1)
    assert secret != db  # the server trusts local connections: the password is only carried
    outputs = [
        cli(shop, "run", "flows:orders", "--log", secret, "--input", ORDER, crash="email-receipt"),
        cli(shop, "recover", secret, "--workflows", "flows:orders"),
        cli(shop, "recover", secret, "--workflows", "flows:orders"),
        cli(shop, "run", "flows:orders", "--log", secret, "--input", ORDER, "--run", "orders-1"),  # exit 1: it ended needs-reconciliation
        cli(shop, "replay", secret),
        cli(shop, "runs", secret),
        cli(shop, "show", secret, "orders-1"),
        cli(shop, "show", secret, "no-such-run"),
    ]
    assert [o.returncode for o in outputs] == [-9, 0, 0, 1, 0, 0, 0, 2], [o.stdout + o.stderr for o in outputs]
    assert "recover: postgresql://postgres@" in outputs[1].stdout  # the source is named, without it
    for output in outputs:
        assert "s3cret-pw" not in output.stdout + output.stderr, output.stdout + output.stderr


def test_a_url_the_driver_cannot_parse_exits_2_without_its_password(shop: Path) -> None:
    """A malformed URL is a wrong argument (exit 2), not an outage (exit 3): the worker
    stops at once instead of retrying it; no command prints the password, though the
    driver's own message quotes it."""
    url = "postgresql://postgres:TopSecret9@[::1/x"
    outputs = [
        cli(shop, "runs", url),
        cli(shop, "submit", url, "flows:orders"),
        cli(shop, "worker", url, "--workflows", "flows:orders", "--reconnect-for", "30"),
    ]
    assert [o.returncode for o in outputs] == [2, 2, 2], [o.stdout + o.stderr for o in outputs]
    for output in outputs:
        assert "TopSecret9" not in output.stdout + output.stderr, output.stdout + output.stderr
        assert "not a PostgreSQL URL the driver can read" in output.stderr, output.stderr
        assert "unreachable" not in output.stderr, output.stderr


def blocked_env(tmp_path: Path) -> dict[str, str]:
    """For waitflows:BLOCKED in tmp_path: its effect waits at tmp_path/gate and books each send."""
    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    (tmp_path / "gate").mkdir()
    return {**os.environ, "WAIT_GATE": str(tmp_path / "gate"), "WAIT_BOOK": str(tmp_path / "book")}


def until_it_exists(process: subprocess.Popen[str], marker: Path) -> None:
    """Return once ``process`` made ``marker`` (a file it writes where a test pauses it);
    fail with its output if it ends first."""
    deadline = time.monotonic() + 60  # no bound asserted: a safety net
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.02)


def at_the_gate(process: subprocess.Popen[str], gate: Path) -> None:
    """Return once a step of ``process`` waits at ``gate`` (WAIT_GATE)."""
    until_it_exists(process, gate / "waiting")


@contextlib.contextmanager
def at_gate(tmp_path: Path, env: dict[str, str], *args: str) -> Generator[subprocess.Popen[str], None, None]:
    """`attempt-kernel ARGS` in tmp_path, handed over once a step of its waits at tmp_path/gate."""
    with subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        at_the_gate(process, tmp_path / "gate")
        yield process


def run_blocked(
    db: str, tmp_path: Path, env: dict[str, str]
) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """`run waitflows:BLOCKED --log DB --run b-1`, handed over once its effect is in flight."""
    return at_gate(tmp_path, env, "run", "waitflows:BLOCKED", "--log", db, "--run", "b-1")


def test_recover_leaves_alone_a_run_that_run_url_drives_and_a_second_run_is_refused(
    db: str, tmp_path: Path
) -> None:
    """`run --log URL` holds no lease: recover took its run over while its effect was in
    flight (Running -> Indeterminate), and the run then died on a duplicate key. It holds
    its run now: recover leaves it alone, a second `run` of the id is refused, and the
    first run finishes, its effect sent once."""
    command = [sys.executable, "-m", "attempt_kernel"]
    gate, book, env = tmp_path / "gate", tmp_path / "book", blocked_env(tmp_path)
    with run_blocked(db, tmp_path, env) as driver:
        recovered = subprocess.run(
            [*command, "recover", db, "--workflows", "waitflows:BLOCKED"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        again = subprocess.run(
            [*command, "run", "waitflows:BLOCKED", "--log", db, "--run", "b-1"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (gate / "open").touch()
        out, err = driver.communicate(timeout=120)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "recover: leaving run b-1 alone: another process (run or recover) drives it" in recovered.stdout
    assert "-> Indeterminate" not in recovered.stdout and "ended orphaned" not in recovered.stdout, recovered.stdout
    assert again.returncode == 2, again.stdout + again.stderr
    assert again.stderr.endswith(
        "attempt-kernel run: error: run 'b-1' in postgresql://postgres@" + db.partition("@")[2]
        + " is being driven by another process (attempt-kernel run or recover) now; nothing was written\n"
    ), again.stderr
    assert driver.returncode == 0, out + err
    assert "run status: succeeded" in out
    assert len(book.read_text().splitlines()) == 1  # the effect was sent once
    assert "verdict: valid" in cli(tmp_path, "replay", db).stdout


def test_run_url_stops_its_run_when_the_session_holding_it_ends(db: str, tmp_path: Path) -> None:
    """The hold lasts as long as its database session: once that session is gone (here
    terminated by the server), another process could take the run over, so `run` stops
    driving it (the stop recorded, the run unfinished) and says why, exit 1."""
    with run_blocked(db, tmp_path, blocked_env(tmp_path)) as driver:
        with psycopg.connect(db, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()"
            ).fetchall()
        assert rows == [(True,)]
        out, err = driver.communicate(timeout=120)
    assert driver.returncode == 1, out + err
    assert err.startswith("attempt-kernel run: error: the database session holding run(s) b-1 ended ("), err
    assert err.endswith(
        "so another process could take them over: they were stopped, unfinished;"
        " `attempt-kernel recover postgresql://postgres@" + db.partition("@")[2]
        + " --workflows waitflows:BLOCKED` resumes them\n"
    ), err
    ledger = journal_ledger(db)
    view = ledger.runs["b-1"]
    assert not view.finished and view.stop_requested


HANDED = (
    "waits in the journal's inbox: the process driving the run (a worker, `run` or `recover`)"
    " takes it in within about a second\n"
)


def test_a_signal_reaches_a_waiting_run_that_run_url_drives(db: str, tmp_path: Path) -> None:
    """`run URL` printed the command that ends its run's wait, but the signal was written
    straight into the journal, where that process never looked again: the run waited on
    forever. The signal now waits in the journal's inbox of the process holding the run,
    which takes it in: the run charges once and succeeds. `resume URL` leaves the run to
    that process, as it leaves a worker's run."""
    from test_cli_waits import book, read_until, start
    from test_cli_waits import cli as waits_cli

    where = "postgresql://postgres@" + db.partition("@")[2]
    driver = start(tmp_path, "run", "waitflows:APPROVER", "--log", db, "--run", "a-1", WAIT_BOOK="book")
    try:
        read_until(driver, f"run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal {where} a-1"
                   " approve (add --payload JSON to send a value)\n")  # fmt: skip
        resumed = waits_cli(tmp_path, "resume", db, "a-1")
        sent = waits_cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        out, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
        driver.communicate()
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "another process (attempt-kernel run or recover) drives run 'a-1' now; nothing was changed" in resumed.stderr
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout == "signal: signal 'approve' for run a-1 with payload \"yes\": " + HANDED, sent.stdout
    assert driver.returncode == 0, out + err
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in out, out
    assert len(book(tmp_path / "book")) == 1
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]
    assert "verdict: valid" in cli(tmp_path, "replay", db).stdout


def test_a_cancel_reaches_a_waiting_run_that_run_url_drives(db: str, tmp_path: Path) -> None:
    """The run ends cancelled in the process that drives it; its effect is never called."""
    from test_cli_waits import book, read_until, start
    from test_cli_waits import cli as waits_cli

    driver = start(tmp_path, "run", "waitflows:APPROVER", "--log", db, "--run", "a-1", WAIT_BOOK="book")
    try:
        read_until(driver, "run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal"
                   f" postgresql://postgres@{db.partition('@')[2]} a-1 approve (add --payload JSON to send a value)\n")  # fmt: skip
        done = waits_cli(tmp_path, "cancel", db, "a-1", "--reason", "not needed")
        out, err = driver.communicate(timeout=120)
    finally:
        driver.kill()
        driver.communicate()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith(HANDED), done.stdout
    assert driver.returncode == 1, out + err
    assert "run status: cancelled" in out, out
    assert book(tmp_path / "book") == []
    runs = json.loads(cli(tmp_path, "runs", db, "--json").stdout)["runs"]
    assert [(r["run"], r["status"]) for r in runs] == [("a-1", "cancelled")]


def test_a_signal_sent_while_run_url_runs_a_step_is_kept_for_the_runs_wait(db: str, tmp_path: Path) -> None:
    """Signals are a mailbox: one sent before the run waits for it is kept. Written
    straight into the journal while `run URL` drove the run, it took the number that
    process gave its next record, and the run died on the duplicate key. It waits in
    the inbox now, and the run takes it in, pays once and returns it."""
    env = blocked_env(tmp_path)
    with at_gate(tmp_path, env, "run", "waitflows:GATED_APPROVER", "--log", db, "--run", "g-1") as driver:
        sent = subprocess.run(
            [sys.executable, "-m", "attempt_kernel", "signal", db, "g-1", "approve", "--payload", '{"by": "ana"}'],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (tmp_path / "gate" / "open").touch()
        out, err = driver.communicate(timeout=120)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout.endswith(HANDED), sent.stdout
    assert driver.returncode == 0, out + err
    assert 'run result: {"paid":{"paid":7},"answer":{"by":"ana"}}' in out, out
    assert len((tmp_path / "book").read_text().splitlines()) == 1
    ledger = journal_ledger(db)
    assert ledger.violation_count == 0
    signals = [r.change for r in journal_records(db) if isinstance(r.change, SignalSent)]
    assert [(s.name, s.payload) for s in signals] == [("approve", {"by": "ana"})]


def journal_records(db: str) -> list[Record]:
    with PgJournal(db) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def test_run_url_of_an_id_a_live_worker_drives_is_refused_naming_the_worker(db: str, shop: Path) -> None:
    """It said "another process (attempt-kernel run or recover)" for a worker's run."""
    PgJournal(db).close()  # the queue's tables
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO attempt_kernel.workers (id, host, pid) VALUES ('w-live', 'elsewhere', 1)")
        conn.execute("INSERT INTO attempt_kernel.runs (run, owner, fence, workflow) VALUES ('o-1', 'w-live', 1, 'orders')")
    refused = cli(shop, "run", "flows:orders", "--log", db, "--run", "o-1", "--input", ORDER)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.endswith(
        "attempt-kernel run: error: run 'o-1' in postgresql://postgres@" + db.partition("@")[2]
        + " is being driven by a live worker now; nothing was written\n"
    ), refused.stderr


def test_submit_prints_a_run_id_escaped_as_runs_does(db: str, shop: Path) -> None:
    """A run id with an ESC and a newline: submit printed it raw (a terminal obeys an ESC)."""
    submitted = cli(shop, "submit", db, "flows:orders", "--run", "a\x1b[31mb\nc", "--input", ORDER)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "a\\x1b[31mb\\nc\n"
    assert "a\\x1b[31mb\\nc" in cli(shop, "runs", db).stdout


def test_submit_refuses_an_empty_run_id_as_run_does(db: str, shop: Path) -> None:
    """`submit --run ''` said "record seq 1 cannot be written: its run id is empty", a
    record nobody asked about; `run` says what was wrong with the argument."""
    submitted = cli(shop, "submit", db, "flows:orders", "--run", "", "--input", ORDER)
    assert (submitted.returncode, submitted.stdout) == (2, "")
    assert submitted.stderr == "attempt-kernel submit: error: --run needs a non-empty id\n"
    assert "orders" not in cli(shop, "runs", db).stdout


def test_export_writes_a_run_log_that_replay_validates(db: str, shop: Path, tmp_path: Path) -> None:
    """`export URL` is a JSON Lines run log; `--run` keeps one run, renumbered from 1."""
    for _ in range(2):
        assert cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER).returncode == 0
    everything = cli(shop, "export", db)
    assert everything.returncode == 0, everything.stderr
    path = tmp_path / "all.jsonl"
    path.write_text(everything.stdout)
    report = replay(path)
    assert report.valid and report.records == 38
    one = cli(shop, "export", db, "--run", "orders-2")
    lines = [json.loads(line) for line in one.stdout.splitlines()]
    assert [line["seq"] for line in lines] == list(range(1, 20))
    assert {line["run"] for line in lines} == {"orders-2"}
    (tmp_path / "one.jsonl").write_text(one.stdout)
    assert replay(tmp_path / "one.jsonl").valid
    missing = cli(shop, "export", db, "--run", "orders-9")
    assert missing.returncode == 2 and "no run 'orders-9'" in missing.stderr


def test_a_url_that_does_not_connect_names_the_host_and_the_reason(shop: Path) -> None:
    """An unreachable server: exit 3 (database unavailable), host and the driver's reason, no traceback."""
    result = cli(shop, "replay", "postgresql://nobody@127.0.0.1:1/nothing")
    assert result.returncode == 3
    assert "127.0.0.1:1" in result.stderr and "Connection refused" in result.stderr
    assert "Traceback" not in result.stderr


def test_pool_sets_a_pool_and_pools_lists_it(db: str, shop: Path) -> None:
    """`pool URL NAME --slots N` creates or resizes a pool; `pools URL` lists it; bad input exits 2."""
    empty = cli(shop, "pools", db)
    assert empty.returncode == 0 and empty.stdout.startswith("no pools in ")
    made = cli(shop, "pool", db, "llm", "--slots", "2")
    assert made.returncode == 0 and made.stdout == "pool llm: 2 slots, 0 held\n", made.stderr
    resized = cli(shop, "pool", db, "llm", "--slots", "0")
    assert resized.stdout == "pool llm: 0 slots, 0 held\n"
    assert cli(shop, "pools", db).stdout == "pool llm: 0 slots, 0 held\n"
    negative = cli(shop, "pool", db, "llm", "--slots", "-1")
    assert negative.returncode == 2 and "expected 0 or more" in negative.stderr
    not_a_url = cli(shop, "pool", "runs.jsonl", "llm", "--slots", "1")
    assert not_a_url.returncode == 2 and "give a postgresql:// URL" in not_a_url.stderr


def test_recover_and_reconcile_leave_a_run_a_live_worker_drives_alone(db: str, shop: Path) -> None:
    """A live worker's run (its row names a worker with a fresh heartbeat) is not recovered or reconciled.

    Once that worker is found dead, recover ends the run's orphan as usual.
    """
    crashed = cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER, crash="email-receipt")
    assert crashed.returncode == -9
    shown = json.loads(cli(shop, "show", db, "orders-1", "--json").stdout)
    [intent] = shown["steps"][1]["attempts"][0]["intents"]
    PgJournal(db).close()  # the queue's tables
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO attempt_kernel.workers (id, host, pid) VALUES ('w-live', 'elsewhere', 1)")
        conn.execute("INSERT INTO attempt_kernel.runs (run, owner, fence, workflow) VALUES ('orders-1', 'w-live', 1, 'orders')")
        count = "SELECT count(*) FROM attempt_kernel.records"
        before = conn.execute(count).fetchall()
        recovered = cli(shop, "recover", db, "--workflows", "flows:orders")
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert recovered.stdout.startswith(
            "recover: leaving run orders-1 alone: a live worker drives it\n"
            "recover: nothing else to do: every run in postgresql://"
        ), recovered.stdout
        assert "that no live process drives has finished; the journal was not changed\n" in recovered.stdout
        assert "every run in it has finished" not in recovered.stdout
        # reconcile reaches the live worker's run through the inbox, not the journal
        handed = cli(shop, "reconcile", db, "--key", intent["key"], "--rejected")
        assert handed.returncode == 0, handed.stdout + handed.stderr
        assert "waits in the journal's inbox: the process driving the run (a worker, `run` or `recover`) takes it in" in handed.stdout
        assert conn.execute(count).fetchall() == before  # nothing written to the journal by either
        inbox = conn.execute("SELECT run FROM attempt_kernel.inbox").fetchall()
        assert inbox == [("orders-1",)]
        conn.execute("UPDATE attempt_kernel.workers SET dead = true WHERE id = 'w-live'")
    # the worker died before taking it in: recover records it first, then recovers
    again = cli(shop, "recover", db, "--workflows", "flows:orders")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "leaving run" not in again.stdout
    assert "recover: orders-1: took in IntentReconciled from the inbox (recorded)\n" in again.stdout
    # the email was rejected (not sent), so the recovered run sends it again
    assert "send-receipt  Succeeded" in again.stdout, again.stdout
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]





WHO_GOES_ON = (
    "`attempt-kernel recover` resumes those cut short; of those that wait, a worker takes up"
    " a submitted one, and a later `recover` one that `run` started"
)
"""What a replay of a journal says goes on with its unfinished runs."""
LEFT = (
    "left waiting (once its signal is sent or its wake time passes, a worker takes up a submitted"
    " run, and `attempt-kernel recover` one that `attempt-kernel run` started); the log was not changed\n"
)


# What `signal` and `cancel` add when they recorded a change to run a-1, which `run URL`
# started and nothing drives now.
NO_DRIVER = (
    "no process drives run a-1 now, and no worker takes it up (`attempt-kernel run` started it,"
    " never submitted): `attempt-kernel recover {where} --workflows MODULE:ATTR`"
)


def run_url_killed_while_it_waits(tmp_path: Path, db: str, run: str) -> None:
    """`run waitflows:APPROVER --log DB --run RUN`, killed (SIGKILL) once its run waits for
    its signal: a run no worker takes up (never submitted), left waiting, held by no one."""
    from test_cli_waits import read_until, start

    where = "postgresql://postgres@" + db.partition("@")[2]
    first = start(tmp_path, "run", "waitflows:APPROVER", "--log", db, "--run", run, WAIT_BOOK="book")
    try:
        read_until(first, f"run {run} waits for signal 'approve'; end the wait with: attempt-kernel signal {where} {run}"
                   " approve (add --payload JSON to send a value)\n")  # fmt: skip
    finally:
        first.kill()
        first.communicate()


def test_runs_url_says_that_the_signal_a_waiting_run_waits_for_came(db: str, tmp_path: Path) -> None:
    """Once its signal is recorded, a run that no process drives does not wait for it any
    more: `runs URL` said it did, and an operator could send it again."""
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    before = cli(tmp_path, "runs", db)
    assert before.stdout.endswith("\nrun a-1 waits for signal 'approve'\n"), before.stdout
    assert cli(tmp_path, "signal", db, "a-1", "approve").returncode == 0
    after = cli(tmp_path, "runs", db)
    assert after.stdout.endswith(
        "\nrun a-1 waits for signal 'approve', which came: it goes on once a process takes the run up\n"
    ), after.stdout
    [row] = json.loads(cli(tmp_path, "runs", db, "--json").stdout)["runs"]
    assert row["waiting_for"] == [{"signal": "approve", "until": None, "came": True}]
    assert (
        "\n  run a-1 waits for signal 'approve', which came: it goes on once a process takes the run up\n"
    ) in cli(tmp_path, "show", db, "a-1").stdout


def test_runs_url_says_a_waiting_run_whose_cancel_was_recorded_waits_no_more(db: str, tmp_path: Path) -> None:
    """A cancel recorded for a waiting run that no process drives: `runs URL` and `show`
    said it still waited for its signal, which an operator could then send for a run
    that ends cancelled whatever comes."""
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    [row] = json.loads(cli(tmp_path, "runs", db, "--json").stdout)["runs"]
    assert (row["status"], row["cancel_requested"]) == ("waiting", False)
    assert cli(tmp_path, "cancel", db, "a-1").returncode == 0
    no_more = "run a-1 waits no more: its cancel was recorded, and it ends cancelled once a process takes the run up\n"
    after = cli(tmp_path, "runs", db)
    assert after.stdout.endswith(f"\n{no_more}"), after.stdout
    assert "waits for signal" not in after.stdout
    [row] = json.loads(cli(tmp_path, "runs", db, "--json").stdout)["runs"]
    assert (row["status"], row["cancel_requested"]) == ("waiting", True)
    assert row["waiting_for"] == [{"signal": "approve", "until": None, "came": False}]
    shown = cli(tmp_path, "show", db, "a-1").stdout
    assert f"\n  {no_more}" in shown and "waits for signal" not in shown
    assert json.loads(cli(tmp_path, "show", db, "a-1", "--json").stdout)["cancel_requested"] is True
    # and no approval is taken for it: no wait of the run would ever take one
    refused = cli(tmp_path, "signal", db, "a-1", "approve")
    assert refused.returncode == 2
    assert "its cancel is recorded, so it ends cancelled and no wait of it takes a signal; nothing was written" in refused.stderr
    assert json.loads(cli(tmp_path, "show", db, "a-1", "--json").stdout)["signals"] == []


def test_recover_on_a_url_finishes_a_waiting_run_that_run_url_started_once_its_signal_is_sent(
    db: str, tmp_path: Path
) -> None:
    """`run URL` killed while its run waited (SIGKILL: its session gone, nothing recorded).
    The run was never submitted, so no worker claims it, and `recover URL` left it waiting
    even once its signal was sent (saying every run had finished): a dead end. Now recover
    says it waits and what takes it up, writes nothing while it cannot go on, and once
    its signal is sent takes it up and finishes it, the card charged once."""
    from test_cli_waits import book
    from test_cli_waits import cli as waits_cli

    where = "postgresql://postgres@" + db.partition("@")[2]
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    with PgJournal(db) as journal:
        before = list(journal.read())
    left = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert left.returncode == 0, left.stdout + left.stderr
    assert left.stdout.startswith(
        f"recover: nothing to do: no run in {where} was cut short; run(s) a-1 only wait, " + LEFT
    ), left.stdout
    with PgJournal(db) as journal:
        assert list(journal.read()) == before  # nothing written
    sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout == (
        f"signal: signal 'approve' for run a-1 with payload \"yes\": recorded in {where}\n"
        f"  {NO_DRIVER.format(where=where)} goes on with it\n"
    )
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.startswith(f"recover: {where}\n  resuming run a-1 (workflow approver)\n")
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in recovered.stdout, recovered.stdout
    assert "unfinished runs: 0\n" in recovered.stdout
    assert len(book(tmp_path / "book")) == 1


def test_a_signal_a_run_no_worker_takes_does_not_wait_for_says_the_run_still_waits(
    db: str, tmp_path: Path
) -> None:
    """A signal the run does not wait for, recorded for a waiting run that `run URL`
    started: signal said that `recover URL` goes on with the run, where recover leaves it
    waiting (its wait for 'approve' goes on) and writes nothing. It now says that the run
    still waits and takes the signal when it waits for that name."""
    from test_cli_waits import cli as waits_cli

    where = "postgresql://postgres@" + db.partition("@")[2]
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    sent = cli(tmp_path, "signal", db, "a-1", "other")
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout == (
        f"signal: signal 'other' for run a-1 with payload {{}}: recorded in {where}\n"
        "  run a-1 still waits (for signal 'approve'), and takes this signal when it waits for 'other'\n"
    )
    left = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert left.returncode == 0, left.stdout + left.stderr
    assert left.stdout.startswith(
        f"recover: nothing to do: no run in {where} was cut short; run(s) a-1 only wait, " + LEFT
    ), left.stdout


def test_recover_url_says_what_goes_on_with_a_sleeping_run_it_let_go_that_no_worker_takes(
    db: str, tmp_path: Path
) -> None:
    """`recover URL` resumes a run that `run URL` started (never submitted) until it sleeps
    for an hour, and lets it go. It said that the run goes on by itself then, and ended
    there: nothing takes such a run up at its wake time but a later recover. It now says
    so as it lets the run go."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel import RunStarted

    where = "postgresql://postgres@" + db.partition("@")[2]
    with PgJournal(db) as journal:
        journal.append("n-1", RunStarted(workflow="napper", nonce="n-1", code=True))
        journal.flush()
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:NAPPER")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert (
        "recover: run n-1 still waits (for a sleep) and no worker takes it up (`attempt-kernel run`"
        f" started it, never submitted): `attempt-kernel recover {where} --workflows waitflows:NAPPER`"
        " goes on with it once its wake time passes\n"
    ) in recovered.stdout, recovered.stdout
    # It also said, as the run began to sleep, that it goes on by itself then.
    assert "goes on by itself" not in recovered.stdout, recovered.stdout
    assert f"; to end the run before then: attempt-kernel cancel {where} n-1\n" in recovered.stdout
    # the replay's summary said that a worker takes up every run that waits
    assert f"unfinished runs: 1 ({WHO_GOES_ON})\n  run n-1\n" in recovered.stdout, recovered.stdout


def test_a_cancel_recorded_for_a_run_no_worker_takes_says_what_ends_it(db: str, tmp_path: Path) -> None:
    """A cancel written straight into the journal for a waiting run that `run URL` started
    said only "recorded": no process drives such a run and no worker takes it up, so
    nothing ends it until an operator runs `recover`. It now says so, naming the command;
    that recover closes the run cancelled, nothing charged."""
    from test_cli_waits import book
    from test_cli_waits import cli as waits_cli

    where = "postgresql://postgres@" + db.partition("@")[2]
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    cancelled = cli(tmp_path, "cancel", db, "a-1", "--reason", "no longer wanted")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout == (
        f"cancel: the cancel of run a-1: recorded in {where}\n  {NO_DRIVER.format(where=where)} ends it\n"
    )
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    ledger = journal_ledger(db)
    assert ledger.runs["a-1"].standing() == "cancelled"
    assert book(tmp_path / "book") == []


def journal_ledger(db: str) -> Ledger:
    """The ledger of everything the journal at ``db`` holds."""
    with PgJournal(db) as journal:
        ledger = Ledger()
        ledger.feed(journal.read())
    return ledger


def a_worker_until_idle(db: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`worker URL --workflows waitflows:APPROVER --until-idle` (the book in tmp_path), which
    must exit 0."""
    from test_cli_waits import cli as waits_cli

    worker = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    return worker


def a_worker_charges_once(db: str, tmp_path: Path) -> Ledger:
    """`a_worker_until_idle`, which must have charged once; the journal's ledger after it."""
    from test_cli_waits import book

    worker = a_worker_until_idle(db, tmp_path)
    assert len(book(tmp_path / "book")) == 1, worker.stdout + worker.stderr
    return journal_ledger(db)


def test_recover_on_a_url_leaves_a_submitted_waiting_run_to_the_workers_and_says_so(
    db: str, tmp_path: Path
) -> None:
    """A submitted run a worker released while it waits: `recover URL` leaves it to the
    workers, and names it, where it said that every run had finished; nothing is written.
    A signal, then a worker, finish it."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    with PgJournal(db) as journal:
        before = list(journal.read())
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.startswith(
        f"recover: nothing to do: no run in {where} was cut short; run(s) a-1 only wait, " + LEFT
    ), recovered.stdout
    assert f"unfinished runs: 1 ({WHO_GOES_ON})\n  run a-1\n" in recovered.stdout
    as_json = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", "--json")
    assert as_json.returncode == 0, as_json.stderr
    reported = json.loads(as_json.stdout)
    assert (reported["changed_nothing"], reported["resumed"], reported["left_waiting"]) == (True, [], ["a-1"])
    with PgJournal(db) as journal:
        assert list(journal.read()) == before  # nothing written
    sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
    assert sent.returncode == 0, sent.stdout + sent.stderr
    ledger = a_worker_charges_once(db, tmp_path)
    assert ledger.runs["a-1"].standing() == "succeeded"
    assert "verdict: valid" in cli(tmp_path, "replay", db).stdout


def test_a_signal_sent_while_recover_url_runs_wakes_a_submitted_run_it_left_waiting(
    db: str, tmp_path: Path
) -> None:
    """`recover URL` holds each run as it comes to it, so a change sent to a run it held
    went to the inbox, for it; but it takes in only the runs it drives. A submitted run it
    left waiting (a worker's to take up) then never woke: the signal sat in the inbox, the
    row still said to wait for ever, and no worker claimed the run. Once recovery is done,
    recover lets go of the runs it will not drive: the signal is recorded, the run woken,
    and a worker finishes it."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    env = blocked_env(tmp_path)
    gate = tmp_path / "gate"
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    # A run for recover to drive for as long as the gate is shut: cut short in its step.
    with at_gate(tmp_path, env, "run", "waitflows:STALLED", "--log", db, "--run", "s-1") as cut:
        cut.kill()
    (gate / "waiting").unlink()
    recover = ("recover", db, "--workflows", "waitflows:APPROVER", "--workflows", "waitflows:STALLED")
    with at_gate(tmp_path, env, *recover) as recovering:  # recovery is done; it drives s-1
        sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        (gate / "open").touch()
        out, err = recovering.communicate(timeout=120)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout.endswith(f": recorded in {where}\n"), sent.stdout
    assert recovering.returncode == 0, out + err
    assert "  resuming run s-1 (workflow stalled)\n  left waiting: run(s) a-1 (" in out, out
    ledger = a_worker_charges_once(db, tmp_path)
    assert (ledger.runs["a-1"].standing(), ledger.runs["s-1"].standing()) == ("succeeded", "succeeded")
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]


# The command line, with the journal's first whole read (recovery's) paused at its end
# until the file "go" appears in the current folder; the file "read" says it got there.
_PAUSED_READ = """
import sys, time
from pathlib import Path
from attempt_kernel.postgres import _journal
whole = _journal.PgJournal.read
def paused(self):
    yield from whole(self)
    if not Path("read").exists():
        Path("read").touch()
        while not Path("go").exists():
            time.sleep(0.02)
_journal.PgJournal.read = paused
from attempt_kernel.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@contextlib.contextmanager
def recover_paused_after_its_read(
    tmp_path: Path, db: str, flows: str
) -> Generator[subprocess.Popen[str], None, None]:
    """`recover DB --workflows FLOWS`, handed over once recovery has read the journal and
    waits for tmp_path/go before it decides anything (`_PAUSED_READ`)."""
    with subprocess.Popen(
        [sys.executable, "-c", _PAUSED_READ, "recover", db, "--workflows", flows],
        cwd=tmp_path, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as recovering:  # fmt: skip
        until_it_exists(recovering, tmp_path / "read")
        yield recovering


def test_recover_on_a_url_holds_the_runs_it_may_take_up_before_it_reads_the_journal(
    db: str, tmp_path: Path
) -> None:
    """`recover URL` read the whole journal, then held each run as recovery came to it. A
    reconciliation sent in between was written straight into the journal, unseen by
    recovery, which then recorded its reconciler's answer from ``Dispatched`` on top of
    it: the journal broke the kernel's rules (recover exit 2, replay INVALID). Held
    first, the run's change waits in the inbox, and is dropped once recovery has settled
    the intent (nothing twice)."""
    shutil.copy(Path(__file__).parent / "recoveryflows.py", tmp_path / "recoveryflows.py")
    flows = "recoveryflows:charges"
    env = {**os.environ, "CRASH_IN_EFFECT": "1"}
    crashed = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "run", flows, "--log", db, "--run", "c-1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr
    [key] = (tmp_path / "calls.txt").read_text().split()
    with recover_paused_after_its_read(tmp_path, db, flows) as recovering:
        sent = cli(tmp_path, "reconcile", db, "--key", key, "--confirmed", "--result", '"ch-op"')
        (tmp_path / "go").touch()
        out, err = recovering.communicate(timeout=120)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout.endswith(HANDED), sent.stdout
    assert recovering.returncode == 0, out + err
    assert "it happened (intent Confirmed)" in out, out
    assert "verdict: valid" in cli(tmp_path, "replay", db).stdout
    ledger = journal_ledger(db)
    assert ledger.violation_count == 0
    assert ledger.runs["c-1"].standing() == "succeeded"
    reconciled = [r.change for r in journal_records(db) if isinstance(r.change, IntentReconciled)]
    assert [(c.by, c.result) for c in reconciled] == [("reconciler", "ch-asked")]
    assert (tmp_path / "calls.txt").read_text().split() == [key]  # charged once
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]


def test_a_worker_leaves_a_dead_workers_run_to_the_recover_that_drives_it(db: str, tmp_path: Path) -> None:
    """`recover URL` takes up a run whose worker died; a live worker claims such runs too.
    The claim never asked whether recover held the run, so both drove it: recover
    crashed on the duplicate key, and with a downstream slow to show a call, the worker's
    reconciler said "not happened" and the charge went out twice (an adversarial pass saw
    6 in 10). The worker then claimed the run and, finding it held, released it, once a
    second (the fence up each time). Its claim passes over a run a process holds now: the
    worker claims nothing and says nothing of it, recover finishes the run, the charge
    sent once."""
    shutil.copy(Path(__file__).parent / "recoveryflows.py", tmp_path / "recoveryflows.py")
    from attempt_kernel.postgres._worker import submit_run

    flows = "recoveryflows:charges"
    submit_run(db, "charges", "c-1")
    crashed = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "worker", db, "--workflows", flows, "--until-idle"],
        cwd=tmp_path, env={**os.environ, "CRASH_IN_EFFECT": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE attempt_kernel.workers SET dead = true")  # found dead, as its heartbeat would say
    with recover_paused_after_its_read(tmp_path, db, flows) as recovering:
        claimed = subprocess.run(
            [sys.executable, "-m", "attempt_kernel", "worker", db, "--workflows", flows, "--until-idle"],
            cwd=tmp_path, env=os.environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        (tmp_path / "go").touch()
        out, err = recovering.communicate(timeout=120)
    assert claimed.returncode == 0, claimed.stdout + claimed.stderr
    assert "c-1:" not in claimed.stderr + claimed.stdout
    with psycopg.connect(db, autocommit=True) as conn:  # the crashed worker's claim, and no other
        assert conn.execute("SELECT fence FROM attempt_kernel.runs WHERE run = 'c-1'").fetchall() == [(1,)]
    assert recovering.returncode == 0, out + err
    assert "resuming run c-1 (workflow charges)" in out, out
    assert "run status: succeeded" in out, out
    assert len((tmp_path / "calls.txt").read_text().split()) == 1  # charged once
    ledger = journal_ledger(db)
    assert ledger.violation_count == 0
    assert ledger.runs["c-1"].standing() == "succeeded"


def test_recover_does_not_say_the_journal_was_not_changed_when_it_recorded_what_an_inbox_held(
    db: str, tmp_path: Path
) -> None:
    """A signal left in the inbox by a worker that died before taking it in: `recover URL`
    records it (waking the run for the workers) and then has nothing else to do. It said
    "the log was not changed" under the line saying it had recorded the signal."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel._codec import encode_record
    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    line = encode_record(1, 1, "a-1", SignalSent(name="approve", payload="yes", id="s-1"))
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO attempt_kernel.inbox (run, line) VALUES ('a-1', %s)", (line,))
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.startswith(
        "recover: a-1: took in SignalSent from the inbox (recorded)\n"
        f"recover: nothing to do: no run in {where} was cut short; run(s) a-1 only wait, left waiting ("
    ), recovered.stdout
    assert "; recovery changed nothing else\n" in recovered.stdout, recovered.stdout
    assert "not changed" not in recovered.stdout, recovered.stdout
    assert a_worker_charges_once(db, tmp_path).runs["a-1"].standing() == "succeeded"


def test_recover_on_a_url_lets_go_of_a_run_that_comes_to_wait(db: str, tmp_path: Path) -> None:
    """A run cut short before its wait (here: only its start recorded): `recover URL` takes
    it up and, once it only waits, lets go of it after a second and exits, saying what it
    waits for, where it waited for good (a signal sent then is recorded, never seen by that
    process). The signal sent after, a second `recover` finishes it."""
    from test_cli_waits import book
    from test_cli_waits import cli as waits_cli

    from attempt_kernel import RunStarted

    where = "postgresql://postgres@" + db.partition("@")[2]
    with PgJournal(db) as journal:
        journal.append("a-1", RunStarted(workflow="approver", nonce="n-1", code=True))
        journal.flush()
    recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert (
        f"run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal {where} a-1"
        " approve (add --payload JSON to send a value)\n"
    ) in recovered.stdout, recovered.stdout
    assert "run status: waiting\n" in recovered.stdout, recovered.stdout
    assert book(tmp_path / "book") == []
    sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
    assert sent.returncode == 0, sent.stdout + sent.stderr
    again = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert again.returncode == 0, again.stdout + again.stderr
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in again.stdout, again.stdout
    assert len(book(tmp_path / "book")) == 1


# The command line, saying when a run it drives is let go while it waits: ./let-go holds
# that run's id.
_NOTED_LET_GO = """
import sys
from pathlib import Path
from attempt_kernel import _coderun
checked = _coderun.CodeRun._check_quiet
async def noted(self):
    await checked(self)
    if self.quiet():
        Path("let-go").write_text(self._run)
_coderun.CodeRun._check_quiet = noted
from attempt_kernel.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("change", ["signal", "cancel"])
def test_a_signal_sent_once_recover_url_let_go_of_its_run_takes_the_run_up_again(
    db: str, tmp_path: Path, change: str
) -> None:
    """`recover URL` takes up a run `run URL` started (no worker ever will) and lets go of
    it once it only waits, while it goes on driving another run. A signal sent then went
    to the inbox (recover still held the run) and was recorded, but the run was never
    taken up again: recover ended saying it waited for that very signal. Now a change
    recorded for a run let go takes the run up again: with its signal it is charged once
    and succeeds; with a cancel it is closed, cancelled, nothing charged."""
    from test_cli_waits import book

    from attempt_kernel import RunStarted

    env = blocked_env(tmp_path)
    gate = tmp_path / "gate"
    with PgJournal(db) as journal:
        journal.append("a-1", RunStarted(workflow="approver", nonce="n-1", code=True))
        journal.flush()
    # A run for recover to drive for as long as the gate is shut: cut short in its step.
    with at_gate(tmp_path, env, "run", "waitflows:STALLED", "--log", db, "--run", "s-1") as cut:
        cut.kill()
    (gate / "waiting").unlink()
    recover = ("recover", db, "--workflows", "waitflows:APPROVER", "--workflows", "waitflows:STALLED")
    with subprocess.Popen(
        [sys.executable, "-c", _NOTED_LET_GO, *recover],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as recovering:  # fmt: skip
        try:
            at_the_gate(recovering, gate)  # it drives s-1
            until_it_exists(recovering, tmp_path / "let-go")
            if change == "signal":
                sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
            else:
                sent = cli(tmp_path, "cancel", db, "a-1", "--reason", "not wanted")
        finally:
            (gate / "open").touch()
        out, err = recovering.communicate(timeout=120)
    assert (tmp_path / "let-go").read_text() == "a-1"
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "waits in the journal's inbox" in sent.stdout, sent.stdout  # recover held the run
    assert recovering.returncode == 0, out + err
    ledger = journal_ledger(db)
    if change == "signal":
        assert 'run result: {"answer":"yes","charged":{"charged":40}}' in out, out
        assert len(book(tmp_path / "book")) == 1
        assert ledger.runs["a-1"].standing() == "succeeded"
    else:
        assert "run a-1 (workflow approver):\n  ask@1  Succeeded     attempts 1\nrun status: cancelled\n" in out, out
        assert book(tmp_path / "book") == []
        assert ledger.runs["a-1"].standing() == "cancelled"
    assert ledger.runs["s-1"].standing() == "succeeded"
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]


# The command line, paused once its runs are driven (`drive_jobs` returned) until ./go
# appears; ./driven says it got there.
_PAUSED_AFTER_DRIVING = """
import sys, time
from pathlib import Path
from attempt_kernel import _resume
drive = _resume.drive_jobs
def paused(*args, **kwargs):
    done = drive(*args, **kwargs)
    Path("driven").touch()
    while not Path("go").exists():
        time.sleep(0.02)
    return done
_resume.drive_jobs = paused
from attempt_kernel.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def signalled_after_driving(tmp_path: Path, db: str, *flags: str) -> tuple[subprocess.CompletedProcess[str], str, str, int]:
    """`recover DB --workflows waitflows:APPROVER FLAGS` paused once its runs are driven
    (`_PAUSED_AFTER_DRIVING`), run a-1 signalled then; the signal's outcome, and recover's
    output and exit once it went on."""
    env = {**os.environ, "WAIT_BOOK": str(tmp_path / "book")}
    with subprocess.Popen(
        [sys.executable, "-c", _PAUSED_AFTER_DRIVING, "recover", db, "--workflows", "waitflows:APPROVER", *flags],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as recovering:  # fmt: skip
        try:
            until_it_exists(recovering, tmp_path / "driven")
            sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        finally:
            (tmp_path / "go").touch()
        out, err = recovering.communicate(timeout=120)
    return sent, out, err, recovering.returncode


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_signal_sent_as_recover_url_ends_is_recorded_and_recover_says_what_goes_on(
    db: str, tmp_path: Path, as_json: bool
) -> None:
    """`recover URL` held the runs it drove until it exited, its inbox taken in no more: a
    signal sent to a run it had let go waited in the inbox, told that the process
    driving the run takes it in within about a second, and sat there unseen once
    recover exited. Recover now lets go of such a run as soon as it is done driving,
    records what came for it meanwhile, and says the run can go on and what goes on
    with it; the next recover finishes it."""
    from test_cli_waits import book
    from test_cli_waits import cli as waits_cli

    from attempt_kernel import RunStarted

    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    where = "postgresql://postgres@" + db.partition("@")[2]
    with PgJournal(db) as journal:
        journal.append("a-1", RunStarted(workflow="approver", nonce="n-1", code=True))
        journal.flush()
    sent, out, err, code = signalled_after_driving(tmp_path, db, *(["--json"] if as_json else []))
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "waits in the journal's inbox" in sent.stdout, sent.stdout  # recover held the run
    assert code == 0, out + err
    if as_json:
        reported = json.loads(out)
        assert (reported["taken_in"], reported["can_go_on"]) == (
            ["a-1: took in SignalSent from the inbox (recorded)"], ["a-1"]
        ), out
    else:
        assert (
            "recover: a-1: took in SignalSent from the inbox (recorded)\n"
            f"recover: run a-1 can go on now, with what came for it as this recover ended;"
            f" `attempt-kernel recover {where} --workflows waitflows:APPROVER` goes on with it\n"
        ) in out, out
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchall() == [(0,)]
    again = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    assert again.returncode == 0, again.stdout + again.stderr
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in again.stdout, again.stdout
    assert len(book(tmp_path / "book")) == 1


def test_a_submitted_run_recover_url_let_go_that_can_go_on_is_named_for_the_workers(
    db: str, tmp_path: Path
) -> None:
    """A submitted run whose worker died is resumed by `recover URL` until it waits; its
    signal comes as recover ends and is recorded there. Recover said that a later
    `recover` goes on with the run, where a later recover leaves a submitted run to the
    workers (it said so: left waiting); a worker of its workflow takes it up."""
    from attempt_kernel import RunStarted
    from attempt_kernel.postgres._worker import submit_run

    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    submit_run(db, "approver", "a-1")
    with PgJournal(db) as journal:  # its worker started it, and died
        journal.append("a-1", RunStarted(workflow="approver", nonce="n-1", code=True))
        journal.flush()
    sent, out, err, code = signalled_after_driving(tmp_path, db)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert code == 0, out + err
    assert (
        "recover: a-1: took in SignalSent from the inbox (recorded)\n"
        "recover: run a-1 can go on now, with what came for it as this recover ended; a worker of"
        " workflow 'approver' takes it up (`attempt-kernel worker URL --workflows MODULE:ATTR`)\n"
    ) in out, out
    assert "goes on with it" not in out, out
    a_worker_until_idle(db, tmp_path)
    assert journal_ledger(db).runs["a-1"].standing() == "succeeded"


def test_recover_on_a_url_leaves_a_queued_runs_inbox_to_the_worker_that_starts_it(
    db: str, tmp_path: Path
) -> None:
    """A signal and a cancel sent to a run submitted but not started wait in the inbox for
    the worker that starts it. `recover URL` deleted them and sent them back, saying twice
    that it took each in "(handed to the process that now drives it)", where no process
    drives the run, and then that every run had finished; every later `recover` did it
    again. Now it leaves them, names the queued run, and writes nothing."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    submit_run(db, "approver", "a-1")
    for args in (("signal", db, "a-1", "approve", "--payload", '"yes"'), ("cancel", db, "a-1", "--reason", "test")):
        sent = cli(tmp_path, *args)
        assert sent.returncode == 0 and "inbox" in sent.stdout, sent.stdout + sent.stderr

    def inbox() -> list[tuple[object, ...]]:
        with psycopg.connect(db, autocommit=True) as conn:
            return conn.execute("SELECT id, run, line FROM attempt_kernel.inbox ORDER BY id").fetchall()

    before = inbox()
    assert len(before) == 2
    for _ in range(2):
        recovered = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER")
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        assert recovered.stdout.startswith(
            f"recover: nothing to do: {where} ends cleanly and every run in it that has started has"
            " finished; run(s) a-1 are queued, for a worker of their workflow to start (anything sent"
            " to them waits in the journal's inbox for it); the log was not changed\n"
        ), recovered.stdout
        assert "took in" not in recovered.stdout, recovered.stdout
        assert inbox() == before  # the same rows: neither taken in nor sent again
    as_json = waits_cli(tmp_path, "recover", db, "--workflows", "waitflows:APPROVER", "--json")
    assert as_json.returncode == 0, as_json.stderr
    reported = json.loads(as_json.stdout)
    assert (reported["changed_nothing"], reported["taken_in"], reported["queued"]) == (True, [], ["a-1"])
    assert inbox() == before
    # The worker that starts the run records the cancel before any step, and drops the signal.
    a_worker_until_idle(db, tmp_path)
    assert journal_ledger(db).runs["a-1"].standing() == "cancelled"
    assert inbox() == []


# A CLI whose `deliver_pg` pauses right after it finds whether a process holds the run:
# a slow sender (its transaction open, the run's send key taken). It writes what it
# found to ./checked, and goes on once ./go-sender exists.
_PAUSED_SENDER = """
import sys, time
from pathlib import Path
from attempt_kernel.postgres import _deliver
found = _deliver.held_by_a_process
def paused(conn, schema, run):
    held = found(conn, schema, run)
    Path("checked").write_text(str(held))
    while not Path("go-sender").exists():
        time.sleep(0.02)
    return held
_deliver.held_by_a_process = paused
from attempt_kernel.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_a_signal_that_found_the_run_held_by_recover_is_taken_in_after_recover_lets_go(
    db: str, tmp_path: Path
) -> None:
    """A sender that found a waiting run held by `recover URL` sends its signal to the
    inbox. If recover let go of the run and read the inbox before that sender committed,
    nobody read the row: the signal was accepted (exit 0) and stayed in the inbox, unseen
    by recover, which had just said the run only waits. Recover now waits for such a
    sender to commit before its last read, and records the signal."""
    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    run_url_killed_while_it_waits(tmp_path, db, "a-1")
    with recover_paused_after_its_read(tmp_path, db, "waitflows:APPROVER") as recovering:
        with subprocess.Popen(
            [sys.executable, "-c", _PAUSED_SENDER, "signal", db, "a-1", "approve", "--payload", '"yes"'],
            cwd=tmp_path, env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as sender:  # fmt: skip
            try:
                deadline = time.monotonic() + 60  # no bound asserted: a safety net (for both waits)
                while not (tmp_path / "checked").exists():
                    assert sender.poll() is None and time.monotonic() < deadline, sender.communicate()
                    time.sleep(0.02)
                checked = (tmp_path / "checked").read_text()
                (tmp_path / "go").touch()
                # Recover lets go of the run, then either ends (it did not wait for the
                # sender) or waits on the sender's key: only then does the sender go on.
                with psycopg.connect(db, autocommit=True) as conn:
                    while recovering.poll() is None and conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    ).fetchone() == (0,):
                        assert time.monotonic() < deadline
                        time.sleep(0.02)
            finally:
                (tmp_path / "go").touch()
                (tmp_path / "go-sender").touch()
            sent_out, sent_err = sender.communicate(timeout=60)
        out, err = recovering.communicate(timeout=120)
    assert checked == "True"  # recover held the run
    assert sender.returncode == 0 and "inbox" in sent_out, sent_out + sent_err
    assert recovering.returncode == 0, out + err
    assert "recover: a-1: took in SignalSent from the inbox (recorded)\n" in out, out
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchone() == (0,)
    ledger = journal_ledger(db)
    assert [signal.name for signal in ledger.runs["a-1"].signals] == ["approve"]


def test_recover_url_does_not_hold_a_submitted_waiting_run_it_leaves_to_the_workers(
    db: str, tmp_path: Path
) -> None:
    """`recover URL` held every waiting run for the whole of its recovery, those it leaves
    to the workers too: a signal to one waited in the inbox, and a worker found the run
    held (by "another process (recover)") and let it be, until recovery ended, however
    long its reconcilers took. Such a run is the workers' from the start now: a signal
    sent while recovery goes on is recorded at once, waking the run."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    with recover_paused_after_its_read(tmp_path, db, "waitflows:APPROVER") as recovering:
        sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        (tmp_path / "go").touch()
        out, err = recovering.communicate(timeout=120)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout.endswith(f": recorded in {where}\n"), sent.stdout
    assert recovering.returncode == 0, out + err
    assert a_worker_charges_once(db, tmp_path).runs["a-1"].standing() == "succeeded"


def test_run_url_refuses_the_id_of_a_run_waiting_in_the_queue(db: str, shop: Path) -> None:
    """`run --log URL --run ID` with the id of a submitted run that no worker has started
    ran it outside the queue, leaving its queue row open for a worker to claim later (and
    with a worker racing, both held it for a moment). It is the queue's: refused, nothing
    written."""
    from attempt_kernel.postgres._worker import submit_run

    submit_run(db, "orders", "q-1")

    def rows() -> list[tuple[object, ...]]:
        with psycopg.connect(db, autocommit=True) as conn:
            return conn.execute("SELECT run, workflow, owner, done FROM attempt_kernel.runs ORDER BY run").fetchall()

    before = rows()
    ran = cli(shop, "run", "flows:orders", "--log", db, "--run", "q-1", "--input", ORDER)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    where = "postgresql://postgres@" + db.partition("@")[2]
    assert ran.stderr == (
        f"attempt-kernel run: error: run 'q-1' in {where} was submitted to its queue, where a worker"
        " of workflow 'orders' starts it (`attempt-kernel worker URL --workflows MODULE:ATTR`);"
        " nothing was written: pick another --run\n"
    ), ran.stderr
    assert ran.stdout == ""
    with PgJournal(db) as journal:
        assert list(journal.read()) == []
    assert rows() == before


def test_recover_url_leaves_a_submitted_waiting_run_to_the_workers_while_its_reconcilers_run(
    db: str, tmp_path: Path
) -> None:
    """Not held before recovery read the journal, a submitted waiting run was still held
    once recovery came to it, for as long as recovery lasted (here a reconciler of another
    run that never answers): a signal to it waited in the inbox of a process that never
    takes it in, and stayed there once that process was stopped. It is the workers'
    throughout now: the signal is recorded at once, and a worker finishes the run."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    where = "postgresql://postgres@" + db.partition("@")[2]
    for flows in ("recoveryflows.py", "waitflows.py"):
        shutil.copy(Path(__file__).parent / flows, tmp_path / flows)
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    env = {**os.environ, "CRASH_IN_EFFECT": "1"}
    crashed = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "run", "recoveryflows:charges", "--log", db, "--run", "c-1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr
    asked = tmp_path / "asked"
    recover = ["recover", db, "--workflows", "waitflows:APPROVER", "--workflows", "recoveryflows:charges"]
    with subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", *recover],
        cwd=tmp_path, env={**os.environ, "RECOVERY_READY": str(asked)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as recovering:  # fmt: skip
        try:
            until_it_exists(recovering, asked)  # recovery came to the waiting run, and asks c-1's reconciler
            sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        finally:
            recovering.terminate()
        recovering.communicate(timeout=60)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert sent.stdout.endswith(f": recorded in {where}\n"), sent.stdout
    assert a_worker_charges_once(db, tmp_path).runs["a-1"].standing() == "succeeded"


def test_a_change_a_holder_never_took_in_wakes_the_submitted_run_for_the_workers(
    db: str, tmp_path: Path
) -> None:
    """A process holds a submitted waiting run (as `recover URL` holds the runs it drives)
    and goes away without taking in the signal sent to it meanwhile (stopped, say). The
    signal waited in the inbox, and the run's row still said to wait for ever: no worker
    claimed it. The sender wakes the run too, so a worker claims it and takes the signal in."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._journal import RunHolds
    from attempt_kernel.postgres._worker import submit_run

    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert released.returncode == 0, released.stdout + released.stderr
    with RunHolds(db) as holds:
        assert holds.take("a-1")
        sent = cli(tmp_path, "signal", db, "a-1", "approve", "--payload", '"yes"')
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert sent.stdout.endswith(HANDED), sent.stdout
    assert a_worker_charges_once(db, tmp_path).runs["a-1"].standing() == "succeeded"
    with psycopg.connect(db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM attempt_kernel.inbox").fetchone() == (0,)


def test_run_url_of_a_submitted_run_that_waits_names_the_workers_not_recover(db: str, tmp_path: Path) -> None:
    """`run --log URL --run ID` of a submitted run a worker started and let go while it
    waits was refused pointing at `recover`, which leaves such a run to the workers and
    does nothing. It now says the run waits, and that a worker of its workflow takes it
    up once its signal is sent; nothing is written."""
    from test_cli_waits import cli as waits_cli

    from attempt_kernel.postgres._worker import submit_run

    shutil.copy(Path(__file__).parent / "waitflows.py", tmp_path / "waitflows.py")
    where = "postgresql://postgres@" + db.partition("@")[2]
    submit_run(db, "approver", "a-1")
    released = waits_cli(tmp_path, "worker", db, "--workflows", "waitflows:APPROVER", "--until-idle")
    assert released.returncode == 0, released.stdout + released.stderr
    before = journal_records(db)
    refused = cli(tmp_path, "run", "waitflows:APPROVER", "--log", db, "--run", "a-1")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr == (
        f"attempt-kernel run: error: run 'a-1' in {where} was submitted to its queue and waits"
        " (for signal 'approve'): a worker of workflow 'approver' takes it up once its signal is"
        " sent or its wake time passes (`attempt-kernel worker URL --workflows MODULE:ATTR`);"
        " nothing was written: pick another --run\n"
    ), refused.stderr
    assert journal_records(db) == before


def test_run_url_picks_an_id_no_submitted_run_has(db: str, shop: Path) -> None:
    """`run --log URL` without `--run` numbered its run from the journal's records alone:
    with `orders-1` submitted (and not started), it picked `orders-1`, and then refused
    its own choice, telling the user to pick another `--run` they never gave."""
    from attempt_kernel.postgres._worker import submit_run

    submit_run(db, "orders", "orders-1")
    ran = cli(shop, "run", "flows:orders", "--log", db, "--input", ORDER)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("starting run orders-2 of workflow orders,"), ran.stdout


def test_run_of_a_workflow_whose_name_postgresql_cannot_hold_is_refused_naming_it(db: str, tmp_path: Path) -> None:
    """`run MODULE:ATTR --log URL` for a workflow named with a NUL (a log file takes it): exit 2
    with one error line naming the workflow name and the NUL, nothing written. Making the run's
    id (`<workflow>-<n>`) asked the queue whether that id was taken, and the driver's
    DataError escaped as a traceback, exit 1."""
    (tmp_path / "nulflows.py").write_text(
        "from attempt_kernel import Step, load_workflow\n\n\n"
        "async def noop(ctx):\n    return 1\n\n\n"
        "named = load_workflow('a\\x00b', [Step(name='s', run=noop)])\n"
    )
    done = cli(tmp_path, "run", "nulflows:named", "--log", db)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        "attempt-kernel run: error: run 'a\\x00b-1': workflow name 'a\\x00b' holds a NUL ('\\x00') at"
        " index 1, which a PostgreSQL journal cannot hold (it keeps run ids, workflow names and domain"
        " states as text); nothing was written. A run log file holds it; on PostgreSQL give a workflow"
        " name without it\n"
    )
    with PgJournal(db) as journal:
        assert list(journal.read()) == []
