"""The demo and recover commands, run in-process as a user would call them."""

from __future__ import annotations

from pathlib import Path

import pytest

from attempt_kernel import Indeterminate, RunLogWriter, RunStarted, Succeeded, replay
from attempt_kernel._codec import encode_record
from attempt_kernel.cli._main import main


def test_demo_runs_the_workflow_and_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo` prints each step's ending and a valid replay; exit 0."""
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--log", str(log), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "run trip-1 (workflow trip-planner):" in out
    for line in [
        "fetch-profile   Succeeded     attempts 1",
        "search-flights  Succeeded     attempts 2",
        "check-visa      TimedOut      attempts 1  (step deadline passed)",
        "book-flight     Succeeded     attempts 1",
        "send-itinerary  Succeeded     attempts 1",
        "watch-prices    Cancelled     attempts 1",
        "run status: cancelled",
        "verdict: valid",
    ]:
        assert line in out, line
    assert replay(log).final_states[Indeterminate()] == 0


def test_demo_appends_a_new_run_to_an_existing_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second demo on the same log is run trip-2; the whole log stays valid."""
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--log", str(log)]) == 0
    assert main(["demo", "--log", str(log)]) == 0
    assert "run trip-2 (workflow trip-planner):" in capsys.readouterr().out
    assert replay(log).valid and replay(log).final_states[Succeeded()] == 8


def test_recover_on_a_finished_log_changes_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to recover: the message says so and the bytes stay."""
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--log", str(log)]) == 0
    before = log.read_bytes()
    capsys.readouterr()
    assert main(["recover", str(log)]) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "the log was not changed" in out
    assert log.read_bytes() == before


def test_recover_missing_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file is an I/O error naming the path (exit 2)."""
    assert main(["recover", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_recover_unknown_workflow_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run of a workflow the CLI does not know cannot be resumed (exit 2)."""
    from attempt_kernel import AttemptCreated, RunStarted

    log = tmp_path / "log.jsonl"
    with RunLogWriter(log) as w:
        w.append("r", RunStarted(workflow="payroll"))
        w.append("r", AttemptCreated(step="s", attempt=1))
    before = log.read_bytes()
    assert main(["recover", str(log)]) == 2
    err = capsys.readouterr().err
    assert "workflow 'payroll', which this program was not given (given: trip-planner);" in err
    assert "pass it with --workflows MODULE:ATTR" in err
    assert log.read_bytes() == before


def test_second_writer_gets_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While another writer holds the log, demo and recover exit 2 naming the lock."""
    log = tmp_path / "log.jsonl"
    with RunLogWriter(log):
        assert main(["demo", "--log", str(log)]) == 2
        assert "another process is writing this log" in capsys.readouterr().err
        assert main(["recover", str(log)]) == 2
        assert "another process is writing this log" in capsys.readouterr().err


def test_demo_refuses_a_log_with_a_torn_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A torn log must be recovered first; demo says so and changes nothing."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"v":1,"seq":1')
    assert main(["demo", "--log", str(log)]) == 2
    assert "attempt-kernel recover" in capsys.readouterr().err
    assert log.read_bytes() == b'{"v":1,"seq":1'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--crash-after", "0"], "expected a positive integer, got 0"),
        (["demo", "--crash-after", "x"], "expected a positive integer, got 'x'"),
        (["demo", "--seed", "pi"], "invalid int value: 'pi'"),
        (["recover"], "the following arguments are required: LOG"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Wrong arguments are usage errors with a message."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_demo_shows_progress_when_stderr_is_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal each state change is printed as it happens; piped, nothing is."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["demo", "--log", str(tmp_path / "tty.jsonl")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "  .. trip-1 fetch-profile#1: Pending -> Running" in err
    assert "  .. trip-1 search-flights#1: Running -> Failed" in err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert main(["demo", "--log", str(tmp_path / "pipe.jsonl")]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("time_us", [10**30, 253_402_300_800 * 1_000_000])
def test_a_record_time_past_year_9999_is_shown_as_its_number_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], time_us: int
) -> None:
    """A log may hold any integer time (the checksum is valid): `runs` and `show` print the
    number with a note, where a date would overflow or break the format."""
    log = tmp_path / "far.jsonl"
    log.write_bytes(encode_record(1, time_us, "r1", RunStarted(workflow="w", nonce="0" * 16)))
    assert main(["runs", str(log)]) == 0
    assert f"{time_us}us (not a time from 1970 to 9999)" in capsys.readouterr().out
    assert main(["show", str(log), "r1"]) == 0
    assert f"{time_us}us (not a time from 1970 to 9999)  started" in capsys.readouterr().out
