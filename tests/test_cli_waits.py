"""`signal`, `cancel`, `reconcile` and `worker LOG` on file logs, from the command line.

The first part calls `main` in-process for what is refused before anything
is written (bad payloads, unknown or finished runs, files that are no run
log). The second runs `attempt-kernel run` / `worker` in subprocesses that
hold the log while the test, as an operator, sends changes from outside;
those wait only for something to happen (polling the log, generous
timeouts), never for a bound on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from attempt_kernel import (
    JSON,
    AttemptTransitioned,
    Executor,
    IntentPlanned,
    IntentReconciled,
    Record,
    RunLogWriter,
    RunResumed,
    RunStarted,
    SignalSent,
    WaitStarted,
    read_log,
)
from attempt_kernel.cli._main import main
from waitflows import APPROVER, NAPPER

TESTS = Path(__file__).parent
LOG = "a.jsonl"
RUN = "a-1"


def waiting_log(path: Path, run: str = RUN) -> Path:
    """A log whose run of APPROVER waits for signal 'approve' (no process drives it)."""

    async def go() -> None:
        with RunLogWriter(path) as writer:
            report = await Executor(writer, let_go_after=0).run(APPROVER, run)
            assert report.status == "waiting"

    asyncio.run(go())
    return path


def records(path: Path) -> list[Record]:
    return [item for item in read_log(path) if isinstance(item, Record)]


# --------------------------------------------------------------------------
# Refused before anything is written (in-process)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("{oops", "--payload is not JSON: Expecting property name enclosed in double quotes at line 1 column 2 (character 1)"),
        ("null", "--payload is null, and a signal's payload never is (omit it to send {})"),
        ("NaN", "--payload is not JSON: NaN is not a JSON number"),
    ],
    ids=["bad-json", "null", "nan"],
)  # fmt: skip
def test_a_bad_payload_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: str, message: str
) -> None:
    log = waiting_log(tmp_path / LOG)
    before = log.read_bytes()
    assert main(["signal", str(log), RUN, "approve", "--payload", payload]) == 2
    assert message in capsys.readouterr().err
    assert log.read_bytes() == before
    assert not (tmp_path / f"{LOG}.inbox").exists()


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["signal", "{log}", "a-9", "approve"], "attempt-kernel signal: error: signal 'approve' to run 'a-9': no run 'a-9' in {log}\n"),
        (["cancel", "{log}", "a-9"], "attempt-kernel cancel: error: cancel of run 'a-9': no run 'a-9' in {log}\n"),
        (["cancel", "{log}", ""], "attempt-kernel cancel: error: cancel of run '': no run '' in {log}\n"),
        (["reconcile", "{log}", "--key", "nope", "--rejected"],
         "attempt-kernel reconcile: error: no intent with key 'nope' is outstanding in {log}\n"),
        (["signal", "{log}", RUN, "ap\x1bprove"], "holds a control character at index 2"),
        # a byte that is not UTF-8, as Python hands it from the command line
        (["signal", "{log}", RUN, "ap\udcffprove"], "is not UTF-8: byte 0xff at index 2; send a UTF-8 name"),
    ],
    ids=["signal-unknown", "cancel-unknown", "cancel-empty", "reconcile-unknown", "control-character", "not-utf8"],
)
@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
def test_a_refused_change_exits_2_with_the_files_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], message: str, held: bool
) -> None:
    log = waiting_log(tmp_path / LOG)
    before = log.read_bytes()
    argv = [str(log) if part == "{log}" else part for part in command]
    if held:
        with RunLogWriter(log):
            code = main(argv)
    else:
        code = main(argv)
    assert code == 2
    err = capsys.readouterr().err
    assert message.replace("{log}", str(log)) in err  # an unknown run or key: in which log
    assert "\x1b" not in err  # control characters are shown escaped
    assert log.read_bytes() == before
    assert not (tmp_path / f"{LOG}.inbox").exists()


def test_a_signal_to_a_finished_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = waiting_log(tmp_path / LOG)
    assert main(["cancel", str(log), RUN]) == 0
    assert main(["recover", str(log), "--workflows", "waitflows:APPROVER"]) == 0
    capsys.readouterr()
    before = log.read_bytes()
    assert main(["signal", str(log), RUN, "approve"]) == 2
    assert "run 'a-1' has finished (cancelled); nothing was written" in capsys.readouterr().err
    assert log.read_bytes() == before


def test_a_signal_to_a_run_whose_cancel_was_recorded_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No wait of a cancelled run takes a signal: an approval recorded after the cancel
    was told that recover goes on with it, though the run ends cancelled whatever comes."""
    log = waiting_log(tmp_path / LOG)
    assert main(["cancel", str(log), RUN]) == 0
    capsys.readouterr()
    before = log.read_bytes()
    assert main(["signal", str(log), RUN, "approve", "--payload", '{"approved": true}']) == 2
    assert capsys.readouterr().err == (
        "attempt-kernel signal: error: signal 'approve' to run 'a-1': its cancel is recorded, so it ends cancelled"
        " and no wait of it takes a signal; nothing was written\n"
    )
    assert log.read_bytes() == before
    assert not (tmp_path / f"{LOG}.inbox").exists()


@pytest.mark.parametrize("command", ["signal", "cancel"])
def test_a_missing_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    argv = [command, str(tmp_path / LOG), RUN] + (["approve"] if command == "signal" else [])
    assert main(argv) == 2
    assert f"{tmp_path / LOG}: no such file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["signal", "cancel"])
def test_a_fifo_exits_2_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    os.mkfifo(tmp_path / LOG)
    argv = [command, str(tmp_path / LOG), RUN] + (["approve"] if command == "signal" else [])
    assert main(argv) == 2
    assert "is a FIFO (named pipe), not a run log" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["signal", "cancel", "resume"])
def test_a_fifo_at_the_inbox_path_exits_2_saying_it_is_no_inbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """Not "not a run log": the path is the inbox's, and what is there is a FIFO (never
    opened blocking: the command returns though nobody writes to it)."""
    log = waiting_log(tmp_path / LOG)
    os.mkfifo(tmp_path / f"{LOG}.inbox")
    before = log.read_bytes()
    extra = {"signal": ["approve"], "cancel": [], "resume": ["--workflows", "waitflows:APPROVER"]}[command]
    assert main([command, str(log), RUN, *extra]) == 2
    assert capsys.readouterr().err == (
        f"attempt-kernel {command}: error: {log}.inbox: is a FIFO (named pipe), not an inbox"
        f" (the inbox of {log} is a regular file at this path; move this one aside)\n"
    )
    assert log.read_bytes() == before


def test_a_signal_to_a_log_with_a_torn_tail_waits_in_the_inbox_for_recovery(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tail was never acknowledged and only the inbox is written: the signal is
    durable there, the log untouched, and the command says who takes it in."""
    log = waiting_log(tmp_path / LOG)
    with log.open("ab") as out:
        out.write(b'{"v":1,"seq":9,"ru')  # a crash mid-write
    before = log.read_bytes()
    assert main(["signal", str(log), RUN, "approve", "--payload", '"yes"']) == 0
    assert capsys.readouterr().out == (
        f"signal: signal 'approve' for run a-1 with payload \"yes\": waits in {log}.inbox: {log} ends"
        " in a torn tail (a crash mid-write) and no process writes it; `attempt-kernel recover"
        f" {log} --workflows MODULE:ATTR` (MODULE:ATTR: your workflow approver) cuts the tail and"
        " takes it in\n"
    )
    assert log.read_bytes() == before
    [entry] = [item for item in read_log(tmp_path / f"{LOG}.inbox") if isinstance(item, Record)]
    assert isinstance(entry.change, SignalSent)
    assert (entry.run, entry.change.name, entry.change.payload) == (RUN, "approve", "yes")


def test_a_signal_to_a_log_with_corruption_before_a_torn_tail_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / LOG)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(lines[0] + b"garbage\n" + b"".join(lines[1:]) + b'{"v":1,"se')
    before = log.read_bytes()
    assert main(["signal", str(log), RUN, "approve"]) == 2
    assert "line 2 is corrupt" in capsys.readouterr().err
    assert log.read_bytes() == before
    assert not (tmp_path / f"{LOG}.inbox").exists()


def test_a_file_that_is_not_a_run_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"shopping list\n")
    assert main(["cancel", str(notes), RUN]) == 2
    assert "line 1 is corrupt" in capsys.readouterr().err
    assert notes.read_bytes() == b"shopping list\n"


def test_signal_to_a_log_nobody_holds_says_it_is_recorded_and_how_to_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / LOG)
    assert main(["signal", str(log), RUN, "approve", "--payload", '{"by":"ana"}']) == 0
    out = capsys.readouterr().out
    assert [r.change.name for r in records(log) if isinstance(r.change, SignalSent)] == ["approve"]
    assert out == (
        f"signal: signal 'approve' for run a-1 with payload {{\"by\":\"ana\"}}:"
        f" recorded in {log}\n"
        f"  no process runs a-1 now; `attempt-kernel recover {log} --workflows MODULE:ATTR`"
        " (MODULE:ATTR: your workflow approver) goes on with it\n"
    )


def test_runs_and_show_say_what_a_waiting_run_waits_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / LOG)
    assert main(["runs", str(log)]) == 0
    text = capsys.readouterr().out
    assert "a-1  approver  waiting  1" in text
    assert text.endswith("\nrun a-1 waits for signal 'approve'\n")
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["status"] == "waiting"
    assert row["waiting_for"] == [{"signal": "approve", "until": None, "came": False}]
    assert main(["show", str(log), RUN]) == 0
    assert "  run a-1 waits for signal 'approve'\n" in capsys.readouterr().out
    assert main(["signal", str(log), RUN, "approve", "--payload", "7"]) == 0
    capsys.readouterr()
    assert main(["show", str(log), RUN, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "waiting"
    assert [s["name"] for s in shown["signals"]] == ["approve"]
    assert [(s["payload"], s["taken_by_wait"]) for s in shown["signals"]] == [(7, None)]
    assert [(w["position"], w["signal"], w["ended"]) for w in shown["waits"]] == [(2, "approve", None)]
    # Once its signal is recorded, the run no longer waits for it: it said it did, and an
    # operator reading that could send the signal again (a second approval, queued).
    assert shown["waiting_for"] == [{"signal": "approve", "until": None, "came": True}]
    came = "run a-1 waits for signal 'approve', which came: it goes on once a process takes the run up\n"
    assert main(["show", str(log), RUN]) == 0
    text = capsys.readouterr().out
    assert f"  {came}" in text
    assert "signal #1 'approve' payload 7: not taken\n" in text
    assert main(["runs", str(log)]) == 0
    assert capsys.readouterr().out.endswith(f"\n{came}")
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["waiting_for"] == [{"signal": "approve", "until": None, "came": True}]


CANCEL_CAME = (
    "run a-1 waits no more: its cancel was recorded, and it ends cancelled once a process takes the run up\n"
)


def test_runs_and_show_say_a_waiting_run_whose_cancel_was_recorded_waits_no_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cancel recorded for a waiting run no process drives: `runs` and `show` said it
    still waited for its signal, and an operator reading that could approve a run that
    will end cancelled whatever comes."""
    log = waiting_log(tmp_path / LOG)
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["cancel_requested"] is False
    assert main(["cancel", str(log), RUN]) == 0
    capsys.readouterr()
    assert main(["runs", str(log)]) == 0
    text = capsys.readouterr().out
    assert "a-1  approver  waiting  1" in text
    assert text.endswith(f"\n{CANCEL_CAME}")
    assert "waits for signal" not in text
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert (row["status"], row["cancel_requested"]) == ("waiting", True)
    assert row["waiting_for"] == [{"signal": "approve", "until": None, "came": False}]
    assert main(["show", str(log), RUN]) == 0
    text = capsys.readouterr().out
    assert f"\n  {CANCEL_CAME}" in text
    assert "waits for signal" not in text
    assert main(["show", str(log), RUN, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["cancel_requested"]) == ("waiting", True)
    assert shown["waiting_for"] == [{"signal": "approve", "until": None, "came": False}]


@pytest.mark.parametrize(
    ("signal", "passed", "waiting_for"),
    [
        (
            None,
            "run a-1 slept until 1970-01-01T00:00:01.000Z, which has passed: it goes on once a process"
            " takes the run up",
            {"timer": "1970-01-01T00:00:01.000Z", "came": True},
        ),
        (
            "approve",
            "run a-1 waited for signal 'approve' until 1970-01-01T00:00:01.000Z, which has passed:"
            " it goes on without it once a process takes the run up",
            {"signal": "approve", "until": "1970-01-01T00:00:01.000Z", "came": True},
        ),
    ],
    ids=["sleep", "signal-timeout"],
)
def test_runs_and_show_say_that_a_wait_whose_wake_time_passed_is_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signal: str | None, passed: str, waiting_for: JSON
) -> None:
    """A run that sleeps, or waits for a signal with a timeout, until a time already past,
    with no process to wake it, does not wait any more: it goes on once a process takes
    it up. A signal wait then goes on without its signal: saying the signal came would
    tell an operator it was approved."""
    log = tmp_path / LOG
    with RunLogWriter(log, create=True) as writer:
        writer.append(RUN, RunStarted(workflow="timed", nonce="n-1", code=True))
        writer.append(RUN, WaitStarted(position=1, signal=signal, wake_us=1_000_000))  # 1970-01-01T00:00:01Z
    assert main(["runs", str(log)]) == 0
    assert capsys.readouterr().out.endswith(f"\n{passed}\n")
    assert main(["show", str(log), RUN]) == 0
    assert f"  {passed}\n" in capsys.readouterr().out
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["waiting_for"] == [waiting_for]


def test_runs_of_a_run_that_never_waited_are_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A DAG run's `runs --json` row has exactly the keys it always had."""
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--log", str(log)]) == 0
    capsys.readouterr()
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert set(row) == {"run", "workflow", "status", "attempts", "started", "ended", "domain_state"}


# --------------------------------------------------------------------------
# While another process holds the log (subprocesses)
# --------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def start(cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(what: Callable[[], bool], child: subprocess.Popen[str] | None = None) -> None:
    """Poll until ``what`` holds (generous: this waits for an event, it bounds nothing)."""
    deadline = time.monotonic() + 60
    while not what():
        assert child is None or child.poll() is None, "the process ended before the moment came"
        assert time.monotonic() < deadline, "the moment never came"
        time.sleep(0.02)


def read_until(child: subprocess.Popen[str], line: str) -> str:
    """What ``child`` prints up to and including ``line`` (a generous deadline)."""
    assert child.stdout is not None
    deadline = time.monotonic() + 60
    fd = child.stdout.fileno()  # read unbuffered: select sees only what no buffer holds
    seen = ""
    while line not in seen.splitlines(keepends=True):
        ready, _, _ = select.select([fd], [], [], 0.5)
        assert time.monotonic() < deadline, f"never printed {line!r}; printed {seen!r}"
        if ready:
            got = os.read(fd, 1 << 16).decode()
            assert got, f"ended before printing {line!r}; printed {seen!r}"
            seen += got
    return seen


def has(path: Path, kind: type) -> Callable[[], bool]:
    return lambda: path.exists() and any(isinstance(r.change, kind) for r in records(path))


def attempt_states(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in records(path):
        if isinstance(r.change, AttemptTransitioned):
            out[r.change.step] = type(r.change.to_state).__name__
    return out


def book(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_signal_reaches_a_run_that_another_process_is_running(tmp_path: Path) -> None:
    """run waits in its process and prints the command that ends the wait; signal goes
    through the inbox; the run takes it, charges once and succeeds; replay says valid."""
    child = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN, WAIT_BOOK="book")
    wait_for(has(tmp_path / LOG, WaitStarted), child)
    sent = cli(tmp_path, "signal", LOG, RUN, "approve", "--payload", '{"by": "ana"}')
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.endswith(
        ": waits in a.jsonl.inbox: the process writing a.jsonl takes it in within about a second\n"
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert (
        "run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal a.jsonl"
        " a-1 approve (add --payload JSON to send a value)\n"
    ) in out
    assert 'run result: {"answer":{"by":"ana"},"charged":{"charged":40}}' in out
    assert len(book(tmp_path / "book")) == 1
    assert (tmp_path / f"{LOG}.inbox").read_bytes() == b""
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_cancel_of_a_waiting_run_that_another_process_runs(tmp_path: Path) -> None:
    """The run ends cancelled and its effect is never called."""
    child = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN, WAIT_BOOK="book")
    wait_for(has(tmp_path / LOG, WaitStarted), child)
    done = cli(tmp_path, "cancel", LOG, RUN, "--reason", "not needed")
    assert done.returncode == 0, done.stderr
    assert "cancel: the cancel of run a-1: waits in a.jsonl.inbox" in done.stdout
    out, err = child.communicate(timeout=60)
    assert child.returncode == 1, err
    assert "run status: cancelled" in out
    assert book(tmp_path / "book") == []
    runs = json.loads(cli(tmp_path, "runs", LOG, "--json").stdout)["runs"]
    assert [(r["run"], r["status"]) for r in runs] == [(RUN, "cancelled")]
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_cancel_while_an_effect_is_dispatched_ends_the_attempt_indeterminate(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    child = start(tmp_path, "run", "waitflows:BLOCKED", "--log", LOG, "--run", "b-1", WAIT_GATE=str(gate))
    wait_for(lambda: (gate / "waiting").exists(), child)
    done = cli(tmp_path, "cancel", LOG, "b-1")
    assert done.returncode == 0, done.stderr
    out, err = child.communicate(timeout=60)
    assert child.returncode == 1, out + err
    assert attempt_states(tmp_path / LOG) == {"pay@1": "Indeterminate"}
    shown = json.loads(cli(tmp_path, "show", LOG, "b-1", "--json").stdout)
    # the effect may have happened: the run waits for someone to reconcile it
    assert shown["status"] == "needs-reconciliation"
    assert [e["what"] for e in shown["events"]][:2] == ["started", "cancel requested"]
    assert cli(tmp_path, "replay", LOG).returncode == 0
    # Reconciled, the run is cancelled, as decided: no hint that something resumes it.
    [key] = [r.change.key for r in records(tmp_path / LOG) if isinstance(r.change, IntentPlanned)]
    reconciled = cli(tmp_path, "reconcile", LOG, "--key", key, "--rejected")
    assert reconciled.returncode == 0, reconciled.stderr
    assert reconciled.stdout == (
        f"reconcile: intent pay of run b-1 / step pay@1 #1 ({key}) is now Rejected (it did not happen)\n"
        "  nothing of run b-1 is outstanding now; it was cancelled, and stays so\n"
    )
    assert json.loads(cli(tmp_path, "show", LOG, "b-1", "--json").stdout)["status"] == "cancelled"


@pytest.mark.slow
def test_reconcile_through_the_inbox_then_a_worker_finishes_the_run(tmp_path: Path) -> None:
    """A run killed with its effect in flight ends Indeterminate in recovery; while
    another run holds the log, reconcile waits in the inbox and is taken in; then
    `worker LOG --until-idle` resumes the reconciled run and it succeeds."""
    gate = tmp_path / "gate"
    gate.mkdir()
    crashed = start(tmp_path, "run", "waitflows:BLOCKED", "--log", LOG, "--run", "b-1", WAIT_GATE=str(gate))
    wait_for(lambda: (gate / "waiting").exists(), crashed)
    crashed.kill()
    crashed.communicate(timeout=60)
    [key] = [r.change.key for r in records(tmp_path / LOG) if isinstance(r.change, IntentPlanned)]
    recovered = cli(tmp_path, "recover", LOG, "--workflows", "waitflows:BLOCKED")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert attempt_states(tmp_path / LOG) == {"pay@1": "Indeterminate"}

    holder = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN)
    wait_for(has(tmp_path / LOG, WaitStarted), holder)
    done = cli(tmp_path, "reconcile", LOG, "--key", key, "--rejected", "--note", "not in the ledger")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"reconcile: intent pay of run b-1 / step pay@1 #1 ({key}) will be Rejected (it did not"
        " happen): waits in a.jsonl.inbox: the process writing a.jsonl takes it in within about"
        " a second\n"
    )
    wait_for(has(tmp_path / LOG, IntentReconciled), holder)
    assert cli(tmp_path, "signal", LOG, RUN, "approve").returncode == 0
    holder.communicate(timeout=60)
    assert holder.returncode == 0

    (gate / "open").touch()
    worker = cli(
        tmp_path, "worker", LOG, "--workflows", "waitflows:BLOCKED", "--workflows", "waitflows:APPROVER",
        "--until-idle", WAIT_GATE=str(gate), WAIT_BOOK="book",
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "worker: idle; no unfinished run of these workflows is left\n" in worker.stdout
    runs = json.loads(cli(tmp_path, "runs", LOG, "--json").stdout)["runs"]
    assert [(r["run"], r["status"]) for r in runs] == [("b-1", "succeeded"), (RUN, "succeeded")]
    assert book(tmp_path / "book") == [key]
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_a_worker_serves_a_waiting_run_and_stops_on_sigterm_when_idle(tmp_path: Path) -> None:
    """run is stopped while waiting; worker LOG takes the run up, a signal reaches it
    through the inbox, the run succeeds, and SIGTERM ends the idle worker (143)."""
    runner = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN)
    wait_for(has(tmp_path / LOG, WaitStarted), runner)
    runner.send_signal(signal.SIGTERM)
    runner.communicate(timeout=60)
    assert runner.returncode == 143
    runs = json.loads(cli(tmp_path, "runs", LOG, "--json").stdout)["runs"]
    assert [(r["run"], r["status"]) for r in runs] == [(RUN, "waiting")]

    worker = start(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    wait_for(has(tmp_path / LOG, RunResumed), worker)
    sent = cli(tmp_path, "signal", LOG, RUN, "approve")
    assert sent.returncode == 0, sent.stderr
    assert "waits in a.jsonl.inbox" in sent.stdout
    seen = read_until(worker, "worker: idle; watching a.jsonl and its inbox for changes\n")
    assert "run status: succeeded\n" in seen
    assert (
        "run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal a.jsonl"
        " a-1 approve (add --payload JSON to send a value)\n"
    ) in seen  # said again when the worker took the waiting run up
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 143, seen + out + err
    assert out == "worker: stopped by SIGTERM while idle; no run was live\n"
    assert len(book(tmp_path / "book")) == 1
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_an_idle_worker_waits_for_a_run_that_took_the_log_then_serves_what_it_left(tmp_path: Path) -> None:
    """An idle worker holds no lock, so `run` may take the log: the worker, woken by its
    records, says it waits for that process and stays; once the run is stopped (SIGTERM,
    its run left waiting) the worker takes the run up, and a signal finishes it."""
    (tmp_path / LOG).touch()
    worker = start(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    read_until(worker, "worker: idle; watching a.jsonl and its inbox for changes\n")
    runner = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN, WAIT_BOOK="book")
    wait_for(has(tmp_path / LOG, WaitStarted), runner)
    seen = read_until(
        worker, "worker: another process is writing a.jsonl (a `run`, `recover` or `resume`); waiting until it lets go\n"
    )
    assert worker.poll() is None, seen
    runner.send_signal(signal.SIGTERM)
    runner.communicate(timeout=60)
    assert runner.returncode == 143
    wait_for(has(tmp_path / LOG, RunResumed), worker)
    sent = cli(tmp_path, "signal", LOG, RUN, "approve")
    assert sent.returncode == 0, sent.stderr
    seen = read_until(worker, "worker: idle; watching a.jsonl and its inbox for changes\n")
    assert "run status: succeeded\n" in seen, seen
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert (worker.returncode, err) == (143, ""), seen + out + err
    assert len(book(tmp_path / "book")) == 1
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_a_worker_stopped_while_it_waits_for_the_log_exits_as_an_idle_one(tmp_path: Path) -> None:
    """SIGINT while another process holds the log: the waiting worker stops at once (130),
    having written nothing."""
    (tmp_path / LOG).touch()
    worker = start(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER")
    read_until(worker, "worker: idle; watching a.jsonl and its inbox for changes\n")
    runner = start(tmp_path, "run", "waitflows:APPROVER", "--log", LOG, "--run", RUN)
    wait_for(has(tmp_path / LOG, WaitStarted), runner)
    read_until(
        worker, "worker: another process is writing a.jsonl (a `run`, `recover` or `resume`); waiting until it lets go\n"
    )
    written = (tmp_path / LOG).read_bytes()
    worker.send_signal(signal.SIGINT)
    out, err = worker.communicate(timeout=60)
    assert (worker.returncode, out, err) == (130, "worker: stopped by SIGINT while idle; no run was live\n", "")
    runner.send_signal(signal.SIGTERM)
    runner.communicate(timeout=60)
    assert (tmp_path / LOG).read_bytes().startswith(written)


@pytest.mark.slow
@pytest.mark.parametrize("torn", [False, True], ids=["clean", "torn-tail"])
def test_worker_until_idle_finishes_a_run_signalled_from_outside(tmp_path: Path, torn: bool) -> None:
    """With a torn tail, the signal waited in the inbox: the worker cuts the tail, then takes it in."""
    log = waiting_log(tmp_path / LOG)
    if torn:
        with log.open("ab") as out:
            out.write(b'{"v":1,"seq":9,"ru')
    sent = cli(tmp_path, "signal", LOG, RUN, "approve", "--payload", '"yes"')
    assert sent.returncode == 0, sent.stderr
    worker = cli(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in worker.stdout
    assert len(book(tmp_path / "book")) == 1
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("target", ["waitflows:APPROVER", "waitflows:NAPPER"], ids=["signal", "sleep"])
def test_worker_until_idle_leaves_a_run_that_waits_for_what_has_not_come(tmp_path: Path, target: str) -> None:
    """A signal nobody sent, a sleep of an hour: nothing is left that the worker could go
    on with now, so it says which run it leaves unfinished and exits 0 instead of waiting
    forever; the run, still waiting, wrote nothing more."""
    flow = APPROVER if target == "waitflows:APPROVER" else NAPPER

    async def go() -> None:
        with RunLogWriter(tmp_path / LOG) as writer:
            report = await Executor(writer, let_go_after=0).run(flow, RUN)
            assert report.status == "waiting"

    asyncio.run(go())
    before = [type(r.change).__name__ for r in records(tmp_path / LOG)]
    worker = start(tmp_path, "worker", LOG, "--workflows", target, "--until-idle", WAIT_BOOK="book")
    try:
        out, err = worker.communicate(timeout=60)  # a safety net: it bounds a hang, not a time
    except subprocess.TimeoutExpired:
        worker.kill()
        out, err = worker.communicate()
        pytest.fail(f"worker --until-idle still waits after 60 s; it printed {out!r}")
    assert worker.returncode == 0, out + err
    assert out.endswith("worker: idle; left unfinished: a-1\n"), out
    if target == "waitflows:NAPPER":
        # It said the run goes on by itself at its wake time; nothing here takes it up then.
        assert "goes on by itself" not in out, out
        assert f"; to end the run before then: attempt-kernel cancel {LOG} a-1\n" in out, out
    runs = json.loads(cli(tmp_path, "runs", LOG, "--json").stdout)["runs"]
    assert [(r["run"], r["status"]) for r in runs] == [(RUN, "waiting")]
    # the worker recorded that it took the run up, and nothing after: its wait goes on
    assert [type(r.change).__name__ for r in records(tmp_path / LOG)] == [*before, "RunResumed"]
    assert cli(tmp_path, "replay", LOG).returncode == 0


@pytest.mark.slow
def test_worker_until_idle_finishes_a_run_it_left_once_its_signal_comes(tmp_path: Path) -> None:
    waiting_log(tmp_path / LOG)
    first = cli(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert first.returncode == 0, first.stdout + first.stderr
    assert book(tmp_path / "book") == []
    sent = cli(tmp_path, "signal", LOG, RUN, "approve", "--payload", '"yes"')
    assert sent.returncode == 0, sent.stderr
    second = cli(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", "--until-idle", WAIT_BOOK="book")
    assert second.returncode == 0, second.stdout + second.stderr
    assert 'run result: {"answer":"yes","charged":{"charged":40}}' in second.stdout
    assert second.stdout.endswith("worker: idle; no unfinished run of these workflows is left\n")
    assert len(book(tmp_path / "book")) == 1
    assert cli(tmp_path, "replay", LOG).returncode == 0


def test_until_idle_goes_on_with_a_waiting_run_once_a_signal_or_a_cancel_is_recorded(tmp_path: Path) -> None:
    """What `worker LOG --until-idle` looks at before it exits: a run that waits with
    nothing come is left; one whose signal, or whose cancel, is in the log is gone on with."""
    from attempt_kernel import cancel_run, send_signal
    from attempt_kernel.cli._main import _left  # pyright: ignore[reportPrivateUsage]

    waiting_log(tmp_path / "waits.jsonl")
    assert _left(str(tmp_path / "waits.jsonl"), {"approver"}, set()) == [(RUN, False)]
    waiting_log(tmp_path / "signalled.jsonl")
    send_signal(tmp_path / "signalled.jsonl", RUN, "approve")
    assert _left(str(tmp_path / "signalled.jsonl"), {"approver"}, set()) == [(RUN, True)]
    waiting_log(tmp_path / "cancelled.jsonl")
    cancel_run(tmp_path / "cancelled.jsonl", RUN)
    assert _left(str(tmp_path / "cancelled.jsonl"), {"approver"}, set()) == [(RUN, True)]


V2 = '''
from attempt_kernel import JSON, RunContext, StepContext, workflow


async def ask(ctx: StepContext, question: str) -> JSON:
    return question


@workflow("approver")
async def APPROVER(run: RunContext) -> JSON:
    await run.step("ask", ask, "may I charge 50 EUR?")  # the log holds 40 EUR at position 1
    return await run.wait_for_signal("approve")
'''


@pytest.mark.slow
def test_worker_until_idle_names_a_run_whose_code_diverged_as_left_unfinished(tmp_path: Path) -> None:
    """The run is not resumed (nothing written for it) and stays unfinished: the worker's
    last line says so, rather than that no unfinished run is left."""
    waiting_log(tmp_path / LOG)
    (tmp_path / "v2.py").write_text(V2)
    before = (tmp_path / LOG).read_bytes()
    worker = cli(tmp_path, "worker", LOG, "--workflows", "v2:APPROVER", "--until-idle")
    assert "attempt-kernel worker: error: run 'a-1' diverged at position 1" in worker.stderr
    assert worker.stdout.endswith(
        "worker: idle; left unfinished: a-1 (its code diverged from its log)\n"
    ), worker.stdout
    assert (tmp_path / LOG).read_bytes() == before


@pytest.mark.slow
def test_worker_until_idle_exits_2_when_it_leaves_a_run_whose_code_diverged(tmp_path: Path) -> None:
    """As `recover` exits 2 for the same log: a diverged run is an error, not idleness."""
    waiting_log(tmp_path / LOG)
    (tmp_path / "v2.py").write_text(V2)
    worker = cli(tmp_path, "worker", LOG, "--workflows", "v2:APPROVER", "--until-idle")
    recovered = cli(tmp_path, "recover", LOG, "--workflows", "v2:APPROVER")
    assert (worker.returncode, recovered.returncode) == (2, 2), worker.stdout + worker.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["recover", LOG, "--workflows", "v2:APPROVER"],
        ["resume", LOG, RUN, "--workflows", "v2:APPROVER"],
        ["worker", LOG, "--workflows", "v2:APPROVER", "--until-idle"],
    ],
    ids=["recover", "resume", "worker"],
)  # fmt: skip
def test_a_run_whose_code_diverged_is_never_said_to_wait(tmp_path: Path, argv: list[str]) -> None:
    """The run was left waiting for 'approve', but its code no longer matches its log:
    no command says it waits, or how to end the wait; each says it diverged."""
    waiting_log(tmp_path / LOG)
    (tmp_path / "v2.py").write_text(V2)
    done = cli(tmp_path, *argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "diverged at position 1" in done.stderr
    assert "waits for" not in done.stdout, done.stdout
    assert "end the wait" not in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    ["a\udcffb", "c\nd", "e'f \\g", "\u00e9\x1b[31m"],
    ids=["undecodable-byte", "newline", "quote-space-backslash", "escape-sequence"],
)  # fmt: skip
def test_the_command_that_ends_a_wait_reaches_the_run_when_pasted_into_bash(tmp_path: Path, run: str) -> None:
    """The run id holds a byte the command line could not decode, or a control
    character: the suggested `signal` command, pasted into bash as printed, signals it."""
    log = waiting_log(tmp_path / LOG, run)
    worker = cli(tmp_path, "worker", LOG, "--workflows", "waitflows:APPROVER", "--until-idle")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    [line] = [line for line in worker.stdout.splitlines() if "end the wait with: " in line]
    command = line.split("end the wait with: ", 1)[1].removesuffix(" (add --payload JSON to send a value)")
    env = {**_env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    pasted = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert pasted.returncode == 0, command + "\n" + pasted.stderr
    assert [(r.run, r.change.name) for r in records(log) if isinstance(r.change, SignalSent)] == [(run, "approve")]


@pytest.mark.parametrize("run", ["n\x00m", "s\ud800t"], ids=["nul", "lone-surrogate"])
def test_a_run_id_no_command_line_can_carry_is_said_so_with_the_python_call(
    run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from attempt_kernel.cli._main import _announce_waits  # pyright: ignore[reportPrivateUsage]

    _announce_waits("a.jsonl")(run, WaitStarted(position=2, signal="approve", wake_us=None))
    shown = run.replace("\x00", "\\x00").replace("\ud800", "\\ud800")
    assert capsys.readouterr().out == (
        f"run {shown} waits for signal 'approve'; end the wait with"
        f" attempt_kernel.send_signal('a.jsonl', '{shown}', 'approve') in Python; no command line"
        " can carry its run id or signal name (a NUL, or text the file system encoding cannot write)\n"
    )


def test_one_signal_came_for_two_waits_of_its_name_says_so_for_one_wait_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two waits for 'approve' open at once and one 'approve' recorded: the first wait
    takes it once a process takes the run up, the second still waits. Saying the
    signal came for both would tell an operator not to send the second one."""
    log = tmp_path / LOG
    with RunLogWriter(log, create=True) as writer:
        writer.append(RUN, RunStarted(workflow="twin", nonce="n-1", code=True))
        writer.append(RUN, WaitStarted(position=1, signal="approve"))
        writer.append(RUN, WaitStarted(position=2, signal="approve"))
        writer.append(RUN, SignalSent(name="approve", payload=1, id="s-1"))
    expected = [{"signal": "approve", "until": None, "came": True}, {"signal": "approve", "until": None, "came": False}]
    assert main(["runs", str(log), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["runs"]
    assert row["waiting_for"] == expected
    assert main(["show", str(log), RUN, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["waiting_for"] == expected
    assert main(["show", str(log), RUN]) == 0
    text = capsys.readouterr().out
    assert "  run a-1 waits for signal 'approve', which came: it goes on once a process takes the run up\n" in text
    assert "  run a-1 waits for signal 'approve'\n" in text

