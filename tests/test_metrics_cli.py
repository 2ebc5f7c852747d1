"""`attempt-kernel worker --metrics-port`: refusals that exit 2 before anything is claimed;
`serve`'s /metrics."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from pgtools import sql_in

from attempt_kernel import RunLogWriter, RunStarted
from attempt_kernel.cli._main import main
from attempt_kernel.postgres._worker import submit_run

TESTS = Path(__file__).parent


@pytest.mark.postgres
def test_a_port_in_use_exits_2_naming_it_and_claims_nothing(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port is bound before the worker starts: a queued run stays unclaimed."""
    submit_run(db, "blocked", "r1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["worker", db, "--workflows", "waitflows:BLOCKED", "--metrics-port", str(port)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in err, err
    assert sql_in(db, "attempt_kernel", "SELECT run, owner FROM {s}.runs") == [("r1", None)]
    assert sql_in(db, "attempt_kernel", "SELECT count(*) FROM {s}.workers") == [(0,)]


def test_a_port_outside_the_tcp_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse refuses 65536 (exit 2) and says which ports there are."""
    with pytest.raises(SystemExit) as exited:
        main(["worker", "log", "--workflows", "waitflows:BLOCKED", "--metrics-port", "65536"])
    assert exited.value.code == 2
    assert "expected a TCP port (0 to 65535), got 65536" in capsys.readouterr().err


def test_an_empty_metrics_host_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`--metrics-host ''` served on every interface, as `serve --host ''` did: refused as serve's is."""
    with pytest.raises(SystemExit) as exited:
        main(["worker", "log", "--workflows", "waitflows:BLOCKED", "--metrics-port", "0", "--metrics-host", ""])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(
        "attempt-kernel worker: error: argument --metrics-host: expected an address, got an empty one"
        " (0.0.0.0 listens on every IPv4 interface)\n"
    )


@pytest.mark.slow
def test_without_prometheus_client_the_flag_exits_2_naming_the_extra(tmp_path: Path) -> None:
    """A Python where prometheus_client cannot be imported: exit 2, install attempt-kernel[metrics]."""
    blocker = tmp_path / "blocker"
    (blocker / "prometheus_client").mkdir(parents=True)
    (blocker / "prometheus_client" / "__init__.py").write_text(
        'raise ImportError("No module named \'prometheus_client\'")\n'
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), str(TESTS)])}
    (tmp_path / "log").touch()  # a log that exists: the extra is what is missing
    done = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "worker", str(tmp_path / "log"),
         "--workflows", "waitflows:BLOCKED", "--metrics-port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "install attempt-kernel[metrics]" in done.stderr, done.stderr
    assert (tmp_path / "log").read_bytes() == b""  # nothing was served, nothing written


@pytest.mark.slow
def test_serve_mounts_the_journal_gauges_at_metrics(tmp_path: Path) -> None:
    """`attempt-kernel serve LOG`: /metrics answers the journal's gauges (no counters)."""
    log = tmp_path / "run.jsonl"
    with RunLogWriter(log) as writer:
        writer.append("r1", RunStarted(workflow="w"))  # unfinished, nobody drives it
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "serve", str(log), "--port", "0"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"http://\S+", line)
        assert found is not None, line
        with urllib.request.urlopen(found.group(0).rstrip("/") + "/metrics", timeout=60) as answer:
            content_type = answer.headers["Content-Type"]
            text = answer.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert f'attempt_kernel_runs{{journal="{log}",status="interrupted"}} 1.0' in text, text
    assert "attempt_kernel_attempts_total" not in text


@pytest.mark.slow
def test_replay_metrics_writes_a_control_character_in_the_log_name_escaped(tmp_path: Path) -> None:
    """An ESC in the log's file name reached the ``journal`` label raw; it is written as the
    text ``\\x1b``, as every report shows it (backslash and quote escaped as the format says)."""
    log = tmp_path / 'odd\x1b"q\\.jsonl'
    with RunLogWriter(log) as writer:
        writer.append("r1", RunStarted(workflow="w"))
    done = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "replay", "--metrics", str(log)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert f'attempt_kernel_log_records{{journal="{tmp_path}/odd\\\\x1b\\"q\\\\.jsonl"}} 1\n' in done.stdout


@pytest.mark.parametrize("what", ["missing", "fifo", "no-such-workflow"])
def test_a_file_worker_refused_with_metrics_asked_prints_nothing_and_serves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """Refused before a word, as without the flag: 'metrics: serving ...' was printed (and a
    server started) before the log or the workflows were looked at."""
    log = tmp_path / "a.jsonl"
    target = "waitflows:APPROVER"
    if what == "fifo":
        os.mkfifo(log)
    elif what == "no-such-workflow":
        log.touch()
        target = "waitflows:NO_SUCH"
    code = main(["worker", str(log), "--workflows", target, "--metrics-port", "0"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    last = captured.err.splitlines()[-1]
    assert last == {
        "missing": f"attempt-kernel worker: error: {log}: no such file",
        "fifo": f"attempt-kernel worker: error: {log}: is a FIFO (named pipe), not a run log"
        " (a run log is a regular file)",
        "no-such-workflow": "attempt-kernel worker: error: module 'waitflows' has no attribute 'NO_SUCH'",
    }[what]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_metrics_address_on_ipv6_is_printed_as_a_url_that_answers(tmp_path: Path) -> None:
    """``http://::1:PORT/metrics`` is no URL (a client reads ``::1:PORT`` as the host):
    the address is bracketed, as `serve` prints its own."""
    log = tmp_path / "a.jsonl"
    log.touch()
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "worker", str(log), "--workflows", "waitflows:APPROVER",
         "--metrics-port", "0", "--metrics-host", "::1"],
        cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        found = re.fullmatch(r"metrics: serving (http://\[::1\]:[0-9]+/metrics)\n", first)
        assert found is not None, first
        with urllib.request.urlopen(found.group(1), timeout=60) as answer:
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


@pytest.mark.slow
def test_a_file_worker_counts_the_attempts_it_ends(tmp_path: Path) -> None:
    """`worker LOG --metrics-port`: a run cut while its attempt ran is taken up; the orphan
    ends Cancelled and the next attempt Succeeded, and the worker's counters count both
    (they stayed at zero on a log file)."""
    whole = tmp_path / "whole.jsonl"
    assert main(["run", "cliflows:GREETER", "--log", str(whole), "--run", "g-1", "--input", '"ada"']) == 0
    lines = whole.read_bytes().splitlines(keepends=True)
    running = next(i for i, line in enumerate(lines) if b'"to":"Running"' in line)
    log = tmp_path / "a.jsonl"
    log.write_bytes(b"".join(lines[: running + 1]))
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "worker", str(log), "--workflows", "cliflows:GREETER",
         "--metrics-port", "0"],
        cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        found = re.fullmatch(r"metrics: serving (http://127\.0\.0\.1:[0-9]+/metrics)\n", process.stdout.readline())
        assert found is not None
        said: list[str] = []
        while "run status: succeeded\n" not in said:
            line = process.stdout.readline()
            assert line, f"the worker ended before it finished g-1; it printed {said}"
            said.append(line)
        with urllib.request.urlopen(found.group(1), timeout=60) as answer:
            text = answer.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    counted = {
        state: float(value)
        for state, value in re.findall(r'attempt_kernel_attempts_total\{journal="[^"]*",state="(\w+)"\} (\S+)', text)
    }
    assert counted == {
        "Succeeded": 1.0, "Failed": 0.0, "Indeterminate": 0.0, "Cancelled": 1.0, "TimedOut": 0.0,
    }  # fmt: skip
