"""Regression tests for the defects that adversarial testing found.

Each test names the defect it guards against. They drive the public API or
the command line in a subprocess, as a user (or an attacker) would: forged
records with a valid checksum, FIFOs, missing files, closed pipes, names
with control characters, a crash between a cancel and the run's end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from logs import fixed_clock, indeterminate_changes, simple_changes, write_log

from attempt_kernel import (
    JSON,
    AttemptTransitioned,
    Cancelled,
    Change,
    Job,
    Record,
    RecoveryError,
    RunCancelRequested,
    RunControl,
    RunFinished,
    RunLogWriter,
    RunStarted,
    Step,
    StepContext,
    load_workflow,
    read_log,
    recover_log,
    replay,
    run_jobs,
)

pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 60, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """Run ``attempt-kernel ARGS`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=stdin,
        errors="backslashreplace",
    )


def forged(record_json: str) -> bytes:
    """A log line for ``record_json`` (a JSON object text) with a *valid* checksum."""
    body = record_json.encode()
    assert body.endswith(b"}")
    return body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body)


# ------------------------------------------------------- side files of a torn tail


def _torn_log(path: Path, tail: bytes = b'{"v":1,"seq":5,"ti') -> Path:
    write_log(path, [*simple_changes(), RunFinished()])
    with open(path, "ab") as f:
        f.write(tail)
    return path


def test_recover_is_not_blocked_by_an_empty_side_file_left_by_a_failed_cut(tmp_path: Path) -> None:
    """A 0-byte <log>.torn-at-N (a cut that died mid-copy) neither blocks recovery nor is lost."""
    log = _torn_log(tmp_path / "run.jsonl")
    offset = log.stat().st_size - len(b'{"v":1,"seq":5,"ti')
    stale = tmp_path / f"run.jsonl.torn-at-{offset}"
    stale.write_bytes(b"")
    writer, recovery = recover_log(log, {})
    writer.close()
    assert recovery.torn_tail is not None and recovery.torn_tail.offset == offset
    assert stale.exists() and stale.read_bytes() == b""  # evidence is never deleted
    assert recovery.side_file is not None and recovery.side_file != stale
    assert recovery.side_file.read_bytes() == b'{"v":1,"seq":5,"ti'
    assert log.stat().st_size == offset


def test_a_second_torn_tail_at_the_same_offset_keeps_both_side_files(tmp_path: Path) -> None:
    """Two crashes that tear the log at one offset leave two side files, each with its bytes."""
    log = _torn_log(tmp_path / "run.jsonl", b"first torn bytes")
    writer, first = recover_log(log, {})
    writer.close()
    with open(log, "ab") as f:
        f.write(b"second torn bytes")
    writer, second = recover_log(log, {})
    writer.close()
    assert first.side_file is not None and second.side_file is not None
    assert first.side_file != second.side_file
    assert first.side_file.read_bytes() == b"first torn bytes"
    assert second.side_file.read_bytes() == b"second torn bytes"


def test_recover_restarts_after_a_crash_between_keeping_the_bytes_and_the_cut(tmp_path: Path) -> None:
    """Side file complete but log not yet cut (a crash there): recovery reuses it, no copy twice."""
    tail = b'{"v":1,"seq":5,"ti'
    log = _torn_log(tmp_path / "run.jsonl", tail)
    offset = log.stat().st_size - len(tail)
    kept = tmp_path / f"run.jsonl.torn-at-{offset}"
    kept.write_bytes(tail)
    (tmp_path / f".run.jsonl.torn-at-{offset}.partial").write_bytes(b"half")  # a dead copy
    writer, recovery = recover_log(log, {})
    writer.close()
    assert recovery.side_file == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", f"run.jsonl.torn-at-{offset}"]
    assert replay(log).valid


def test_recover_after_the_side_file_could_not_be_written_succeeds_next_time(tmp_path: Path) -> None:
    """A failure while keeping the bytes (here: a directory in the way of the copy) is
    reported, cuts nothing, and the next recovery finishes."""
    tail = b'{"v":1,"seq":5,"ti'
    log = _torn_log(tmp_path / "run.jsonl", tail)
    size = log.stat().st_size
    offset = size - len(tail)
    blocker = tmp_path / f".run.jsonl.torn-at-{offset}.partial"
    blocker.mkdir()
    result = cli("recover", str(log))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert log.stat().st_size == size  # nothing was cut
    blocker.rmdir()
    result = cli("recover", str(log))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / f"run.jsonl.torn-at-{offset}").read_bytes() == tail


# ------------------------------------------------------- a cancel is a record


def test_a_run_cancelled_before_a_crash_is_never_resumed(tmp_path: Path) -> None:
    """Crash after the Cancel records but before run_finished: recovery closes the run,
    the cancelled step never runs again and its effect is not performed."""
    calls: list[str] = []

    async def slow(ctx: StepContext) -> JSON:
        calls.append(f"slow#{ctx.attempt}")
        await asyncio.sleep(30)
        return None

    workflow = load_workflow("wf", [Step(name="slow", run=slow)])

    class CrashBeforeTheEnd:
        """A log that dies (like the process) when the run's end is appended."""

        def __init__(self, writer: RunLogWriter) -> None:
            self.writer = writer

        def append(self, run: str, change: Change) -> int:
            if isinstance(change, RunFinished):
                raise KeyboardInterrupt("the process dies here")
            return self.writer.append(run, change)

        def flush(self) -> None:
            self.writer.flush()

    async def cancel_soon(control: RunControl) -> None:
        while not calls:  # once slow's attempt runs, however long the machine took to get there
            await asyncio.sleep(0.01)
        control.cancel()

    log = tmp_path / "run.jsonl"
    with RunLogWriter(log) as writer, pytest.raises(KeyboardInterrupt):
        run_jobs(CrashBeforeTheEnd(writer), [Job(workflow=workflow, run="r", supervise=cancel_soon)])
    assert calls == ["slow#1"]
    writer, recovery = recover_log(log, {"wf": workflow})
    with writer:
        # What the CLI does: resume every run recovery hands back (none here).
        jobs = [Job(workflow=workflow, run=r.run, prior=r.steps) for r in recovery.runs]
        if jobs:
            run_jobs(writer, jobs)
    assert recovery.runs == () and recovery.closed == ("r",)
    assert calls == ["slow#1"]
    report = replay(log)
    assert report.valid, report.violations
    records = [item for item in read_log(log) if isinstance(item, Record)]
    assert isinstance(records[-1].change, RunFinished)
    assert any(isinstance(r.change, RunCancelRequested) for r in records)


# ------------------------------------------------------- forged records


@pytest.mark.parametrize("bad_type", ['["created"]', '{"a":1}', "7", "null", "true"])
def test_a_record_type_that_is_not_a_string_is_a_clear_corruption_error(tmp_path: Path, bad_type: str) -> None:
    """`type` as a list, an object, a number, null or a bool (valid checksum) is corruption at
    its line, from replay (exit 1) and recover/demo (exit 2), never a traceback."""
    log = write_log(tmp_path / "run.jsonl", simple_changes())
    with open(log, "ab") as f:
        f.write(forged(f'{{"v":1,"seq":5,"time_us":1,"run":"r","type":{bad_type},"step":"s","attempt":1}}'))
    result = cli("replay", str(log))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "line 5: corrupt line: unknown record type" in result.stdout
    for args in (["recover", str(log)], ["demo", "--log", str(log)]):
        result = cli(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert "line 5" in result.stderr


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ('{"v":1,"seq":1,"time_us":1,"run":"r","run":"other","type":"run_finished"}', "duplicate key 'run'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":{"a":1,"a":2}}', "duplicate key 'a'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":NaN}', "NaN"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":-Infinity}', "-Infinity"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":1e400}', "1e400"),
    ],
)
def test_non_strict_json_is_corruption(tmp_path: Path, record: str, why: str) -> None:
    """Duplicate keys and NaN/Infinity (valid checksum) are refused, naming the line and why."""
    log = tmp_path / "run.jsonl"
    log.write_bytes(forged(record))
    report = replay(log)
    assert not report.valid
    [violation] = report.violations
    assert violation.line == 1 and violation.reason.startswith("corrupt line: not strict JSON")
    assert why in violation.reason


# ------------------------------------------------------- names printed raw


def test_a_lone_surrogate_in_a_name_is_printed_escaped_by_replay_and_recover(tmp_path: Path) -> None:
    """A run name holding a lone surrogate crashes neither replay nor recover (which
    prints it after writing); both show it escaped."""
    run = "r\udc80"
    log = tmp_path / "run.jsonl"
    changes = indeterminate_changes()
    with RunLogWriter(log, clock=fixed_clock()) as writer:
        writer.append(run, RunStarted(workflow="trip-planner"))  # the CLI's built-in workflow
        for change in changes[:-1]:  # the attempt is left Running, with its intent Dispatched
            writer.append(run, change)
    result = cli("replay", str(log))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    result = cli("recover", str(log))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "ended orphaned attempt r\\udc80 / mail #1: Running -> Indeterminate" in result.stdout
    assert "run r\\udc80 / step mail / attempt 1 (Indeterminate" in result.stdout
    assert replay(log).valid


def test_a_name_with_a_line_break_cannot_forge_the_verdict(tmp_path: Path) -> None:
    """A step name holding '\\nverdict: valid' and an escape code stays on its line, escaped."""
    step = "x\nverdict: valid\x1b[2K"
    changes: list[Change] = [*indeterminate_changes(step)]
    changes.append(changes[0])  # a violation: attempt 1 created again
    log = write_log(tmp_path / "run.jsonl", changes)
    result = cli("replay", str(log))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert "verdict: valid" not in lines and lines[-1] == "verdict: INVALID"
    assert "\x1b" not in result.stdout
    assert "x\\nverdict: valid\\x1b[2K" in result.stdout


# ------------------------------------------------------- empty and torn-only logs


def test_a_log_of_only_a_torn_tail_is_valid_like_an_empty_one_and_recover_finishes(tmp_path: Path) -> None:
    """One rule: no complete record is a valid empty log; recover cuts the tail and finishes,
    and running recover again changes nothing."""
    log = tmp_path / "run.jsonl"
    log.write_bytes(b'{"v":1,"seq":1,"time_us":1,"ru')
    report = replay(log)
    assert report.valid and report.records == 0 and report.torn_tail is not None
    first = cli("recover", str(log))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "cut the torn tail at line 1" in first.stdout and log.read_bytes() == b""
    again = cli("recover", str(log))
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    empty = replay(log)
    assert empty.valid and empty.records == 0 and empty.torn_tail is None


# ------------------------------------------------------- what is not a regular file


@pytest.mark.parametrize("command", [["replay"], ["recover"], ["demo", "--log"]])
def test_a_fifo_is_refused_at_once(tmp_path: Path, command: list[str]) -> None:
    """replay, recover and demo on a FIFO say it is not a run log (exit 2) instead of hanging."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = cli(*command, str(fifo), timeout=60)  # a safety net: hanging on the FIFO fails loudly
    assert result.returncode == 2, result.stdout + result.stderr
    assert "FIFO" in result.stderr and "not a run log" in result.stderr


def test_dev_zero_is_refused_at_once() -> None:
    """replay /dev/zero is refused as a device (exit 2), not read forever."""
    result = cli("replay", "/dev/zero", timeout=60)
    assert result.returncode == 2 and "is a device, not a run log" in result.stderr


def test_recover_on_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    """recover of a path that does not exist says so (exit 2) and creates no file."""
    missing = tmp_path / "nope.jsonl"
    result = cli("recover", str(missing))
    assert result.returncode == 2 and "no such file" in result.stderr
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_recover_still_refuses_an_unknown_workflow_without_writing(tmp_path: Path) -> None:
    """The refusal for an unknown workflow leaves the log byte for byte."""
    log = tmp_path / "run.jsonl"
    with RunLogWriter(log, clock=fixed_clock()) as writer:
        writer.append("r", RunStarted(workflow="elsewhere"))
    before = log.read_bytes()
    with pytest.raises(RecoveryError, match="workflow 'elsewhere'"):
        recover_log(log, {})
    assert log.read_bytes() == before


# ------------------------------------------------------- closed pipes


def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`demo | head -1` prints one line and no BrokenPipeError traceback."""
    log = tmp_path / "run.jsonl"
    shell = f"{sys.executable} -m attempt_kernel demo --log {log} | head -1"
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120)
    assert result.stdout.startswith("demo: run trip-1")
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert replay(log).valid


def test_the_cancel_decision_precedes_every_cancel_record(tmp_path: Path) -> None:
    """The demo's cancel: a run_cancel_requested record comes before the watcher's Cancel."""
    log = tmp_path / "run.jsonl"
    assert cli("demo", "--log", str(log)).returncode == 0
    changes = [item.change for item in read_log(log) if isinstance(item, Record)]
    decided = [i for i, c in enumerate(changes) if isinstance(c, RunCancelRequested)]
    cancels = [
        i
        for i, c in enumerate(changes)
        if isinstance(c, AttemptTransitioned) and isinstance(c.to_state, Cancelled)
    ]
    assert len(decided) == 1 and len(cancels) == 1 and decided[0] < cancels[0]
