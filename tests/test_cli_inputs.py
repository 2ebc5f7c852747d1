"""What the command line refuses before it writes anything: log paths that name a
folder, default log names a workflow's name would move out of the current folder,
JSON nested too deep or holding a number no log can carry.

Each refusal exits 2 with one line on stderr naming the option, and leaves the
folder (and any log in it) byte for byte as it was. The workflows are those of
cliflows.py and pathflows.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attempt_kernel import (
    JSON, LogOpenError, OperationRefused, Record, RunStarted, SignalSent, read_log, reconcile_intent, send_signal,
)  # fmt: skip
from attempt_kernel._inbox import inbox_path
from attempt_kernel.cli._main import main
from logs import indeterminate_changes, write_log
from test_cli_waits import waiting_log


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (folders by name alone)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("log", [".", "", "/", "sub/.."])
def test_run_with_a_log_that_names_a_folder_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], log: str
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    assert main(["run", "cliflows:GREETER", "--log", log, "--input", '"ada"']) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"attempt-kernel run: error: --log {log!r} names a folder, not a run log file"
        " (give a file name, e.g. --log runs.jsonl)\n"
    )
    assert listing(tmp_path) == before


def test_a_path_that_names_no_file_has_no_inbox() -> None:
    with pytest.raises(LogOpenError, match=r"^'\.': names a folder, not a run log file, so it has no inbox$"):
        inbox_path(".")


@pytest.mark.parametrize(("target", "name"), [("pathflows:UPWARD", "../escaped"), ("pathflows:NESTED", "a/b")])
def test_run_without_log_refuses_a_workflow_name_that_is_no_plain_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str, name: str
) -> None:
    """The default log is <workflow>.jsonl in the current folder, never elsewhere."""
    here = tmp_path / "here"
    (here / "a").mkdir(parents=True)
    monkeypatch.chdir(here)
    before = listing(tmp_path)
    assert main(["run", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"attempt-kernel run: error: workflow {name!r} has a name that is not a plain file name,"
        " so <workflow>.jsonl would not be a file in the current folder; give the log with --log PATH\n"
    )
    assert listing(tmp_path) == before


def test_such_a_workflow_runs_with_an_explicit_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "pathflows:UPWARD", "--log", "up.jsonl"]) == 0
    assert "run result: 1\n" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["up.jsonl"]


# ------------------------------------------------------- JSON options: depth and range

DEEP_101 = "[" * 101 + "]" * 101
"""An array nested 101 levels deep: one past the limit."""

DEEP_980 = "[" * 980 + "]" * 980
"""Parses in Python, but a viewer recursing through it would fail."""

DEEP_5000 = "[" * 5000 + "]" * 5000
"""Deeper than Python's JSON parser goes (a RecursionError there)."""

TOO_DEEP = "it is nested deeper than 100 levels of arrays and objects; nothing was written"


@pytest.mark.parametrize("payload", [DEEP_101, DEEP_980, DEEP_5000], ids=["101", "980", "5000"])
def test_signal_refuses_a_payload_nested_past_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], payload: str
) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    before = listing(tmp_path)
    assert main(["signal", str(log), "a-1", "approve", "--payload", payload]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"attempt-kernel signal: error: --payload is refused: {TOO_DEEP}\n"
    assert listing(tmp_path) == before


def test_signal_takes_a_payload_nested_exactly_to_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    assert main(["signal", str(log), "a-1", "approve", "--payload", "[" * 100 + "]" * 100]) == 0
    capsys.readouterr()
    [sent] = [i.change for i in read_log(log) if isinstance(i, Record) and isinstance(i.change, SignalSent)]
    depth, value = 0, sent.payload
    while isinstance(value, list) and value:
        depth, value = depth + 1, value[0]
    assert (depth, value) == (99, [])  # 99 arrays holding one, then the innermost: 100 levels


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1e400", "it holds a number out of range (inf); numbers must be finite; nothing was written"),
        ('{"a": [-1e999]}', "it holds a number out of range (-inf); numbers must be finite; nothing was written"),
        (DEEP_101, TOO_DEEP),
        (DEEP_5000, TOO_DEEP),
    ],
    ids=["1e400", "-1e999-inside", "101", "5000"],
)
def test_run_refuses_such_an_input_before_it_prints_or_writes_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "cliflows:GREETER", "--input", text]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no "starting run" line
    assert captured.err == f"attempt-kernel run: error: --input is refused: {problem}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["1e400", DEEP_101, DEEP_5000], ids=["1e400", "101", "5000"])
def test_reconcile_refuses_such_a_result(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    log = write_log(tmp_path / "r.jsonl", [RunStarted(workflow="mailer"), *indeterminate_changes()])
    before = listing(tmp_path)
    assert main(["reconcile", str(log), "--key", "k-send", "--confirmed", "--result", text]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("attempt-kernel reconcile: error: --result is refused: it ")
    assert listing(tmp_path) == before
    # The same reconciliation with a result within bounds is recorded.
    assert main(["reconcile", str(log), "--key", "k-send", "--confirmed", "--result", "[[1]]"]) == 0


def _deep() -> JSON:
    deep: JSON = []
    for _ in range(100):
        deep = [deep]  # 101 levels
    return deep


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (_deep(), "is refused: it is nested deeper than 100 levels of arrays and objects"),
        (
            {1: "int", "1": "str"},
            r"is not a JSON value \(an object has keys 1 and '1', which JSON writes as the same key '1'",
        ),
    ],
    ids=["nested past the limit", "keys JSON writes alike"],
)
def test_the_library_refuses_a_payload_or_result_as_the_command_line_does(
    tmp_path: Path, value: JSON, why: str
) -> None:
    """send_signal and reconcile_intent are the doors the web view and Python callers go
    through: refused there (OperationRefused), nothing written, not left to the writer."""
    log = waiting_log(tmp_path / "a.jsonl")
    before = listing(tmp_path)
    with pytest.raises(OperationRefused, match=rf"^signal 'approve' to run 'a-1': the payload {why}"):
        send_signal(log, "a-1", "approve", value)
    assert listing(tmp_path) == before
    reconcilable = write_log(tmp_path / "r.jsonl", [RunStarted(workflow="mailer"), *indeterminate_changes()])
    before = listing(tmp_path)
    with pytest.raises(OperationRefused, match=rf"^reconciliation of intent 'k-send': the result {why}"):
        reconcile_intent(reconcilable, "k-send", confirmed=True, result=value)
    assert listing(tmp_path) == before


URL = "postgresql://app@127.0.0.1:1/db"  # nothing listens there: each refusal comes before a connection


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "cliflows:GREETER", "--log", URL, "--run", "a\udcffb"],
        ["submit", URL, "cliflows:GREETER", "--run", "a\udcffb"],
        ["signal", URL, "a\udcffb", "approve"],
        ["cancel", URL, "a\udcffb"],
        ["show", URL, "a\udcffb"],
        ["resume", URL, "a\udcffb"],
        ["export", URL, "--run", "a\udcffb"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_run_id_that_is_not_utf8_is_refused_for_a_postgresql_journal(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte the command line could not decode ($'a\\xffb' in bash) reaches Python as a
    lone surrogate, which a file log can hold but PostgreSQL text cannot: every command
    given a URL ended in a traceback from the database driver (exit 1)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"attempt-kernel {argv[0]}: error: run id 'a\\udcffb' is not valid UTF-8 (character 1 stands"
        " for a byte the command line could not decode): a PostgreSQL journal holds only UTF-8 run ids\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", ""], ["runs", ""], ["show", "", "r-1"], ["recover", ""], ["signal", "", "r-1", "go"], ["export", ""],
        ["worker", "", "--workflows", "cliflows:GREETER"],
    ],
    ids=lambda argv: argv[0],
)
def test_an_empty_log_path_is_named_as_such(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`Path("")` is the current folder: the error named `.`, a path the user did not type."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"attempt-kernel {argv[0]}: error: the log path is empty: give a run log's file name"
        " (or a postgresql:// URL)\n"
    )
    assert listing(tmp_path) == {}


@pytest.mark.slow  # a subprocess
def test_a_run_whose_log_fills_the_disk_says_how_to_go_on(tmp_path: Path) -> None:
    """A write that fails mid-run (here the file size limit, as a full disk would) ends `run`
    with the writer's error (exit 2): it now also says the run stays unfinished and which
    `recover` goes on with it, as a stop by a signal does. That recover finishes it."""
    import resource
    import shutil
    import signal
    import subprocess
    import sys

    shutil.copy(Path(__file__).parent / "cliflows.py", tmp_path / "cliflows.py")

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (400, 400))  # the run's first records, not its end

    argv = [sys.executable, "-m", "attempt_kernel", "run", "cliflows:GREETER", "--log", "g.jsonl", "--input", '"ada"']
    ran = subprocess.run(argv, cwd=tmp_path, preexec_fn=limited, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert ran.stderr.startswith("attempt-kernel run: error: g.jsonl: the writer failed"), ran.stderr
    assert ran.stderr.endswith(
        "the file reached its size limit (`ulimit -f`, or the largest file its file system holds));"
        " what was written of run 'greeter-1' stays unfinished: `attempt-kernel recover"
        " g.jsonl --workflows cliflows:GREETER` goes on with it once the log can be written again (or says"
        " there is nothing to do)\n"
    ), ran.stderr
    recovered = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "recover", "g.jsonl", "--workflows", "cliflows:GREETER"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "run status: succeeded" in recovered.stdout, recovered.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", URL, "--workflow", "\udcff"],
        ["pool", URL, "p\udcff", "--slots", "2"],
        ["signal", URL, "r-1", "go\udcff"],
    ],
    ids=lambda argv: argv[0],
)
def test_any_argument_that_is_not_utf8_is_refused_for_a_postgresql_journal(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Not only run ids: a workflow filter or a pool name with a byte the command line
    could not decode ended `runs` in the driver's traceback and `pool` in its codec error."""
    assert main(argv) == 2
    bad = next(arg for arg in argv if "\udcff" in arg)
    assert capsys.readouterr().err == (
        f"attempt-kernel {argv[0]}: error: the argument {bad!r} is not valid UTF-8 (character"
        f" {bad.index(chr(0xDCFF))} stands for a byte the command line could not decode): a PostgreSQL"
        " journal holds only UTF-8 text\n"
    )


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--heartbeat", "2"], "--dead-after (5 s) must be at least three --heartbeat periods (6 s)"),
        (["--heartbeat", "1", "--dead-after", "2"], "--dead-after (2 s) must be at least three --heartbeat periods (3 s)"),
    ],
    ids=["heartbeat-alone", "both"],
)
def test_a_worker_whose_dead_after_spans_fewer_than_three_heartbeats_is_a_usage_error(
    flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker's --dead-after must span three of its --heartbeat periods: `--heartbeat 2`
    (beside the default --dead-after 5) ended the worker in a ValueError's traceback, exit 1,
    the code of a worker declared dead. Refused before a connection, as any wrong argument is."""
    assert main(["worker", URL, "--workflows", "workerflows.pay:PAY", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"attempt-kernel worker: error: {said}: raise --dead-after or shorten --heartbeat\n"
    )
