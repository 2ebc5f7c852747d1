"""`recover` keeps a torn tail's bytes in side files without following what sits at their names.

A symlink or a FIFO put at the temporary name (``.LOG.torn-at-N.partial``)
or at a final name (``LOG.torn-at-N``, ``...N.2``) is never written
through, read through or opened blocking: the temporary name is refused,
naming it, with nothing cut; a final name holding one is passed over for
the next. The CLI runs in a subprocess, so that a hang is a timeout, not a
stuck test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from logs import simple_changes, write_log

from attempt_kernel import RunFinished, recover_log, replay

pytestmark = pytest.mark.slow

TAIL = b'{"v":1,"seq":5,"ti'


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``attempt-kernel ARGS`` in a fresh interpreter (a hang fails the test with a timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def torn_log(folder: Path) -> tuple[Path, int]:
    """A finished run's log ending in a torn tail; the log and the offset the tail starts at."""
    log = write_log(folder / "run.jsonl", [*simple_changes(), RunFinished()])
    offset = log.stat().st_size
    with open(log, "ab") as f:
        f.write(TAIL)
    return log, offset


def test_a_symlink_at_the_temporary_name_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    log, offset = torn_log(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    partial = tmp_path / f".run.jsonl.torn-at-{offset}.partial"
    partial.symlink_to(victim)
    size = log.stat().st_size

    result = cli("recover", str(log))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f".run.jsonl.torn-at-{offset}.partial: is a symbolic link" in result.stderr
    assert victim.read_bytes() == b"precious\n"
    assert log.stat().st_size == size  # nothing was cut
    assert not (tmp_path / f"run.jsonl.torn-at-{offset}").exists()
    # Once it is moved away, recovery finishes.
    partial.unlink()
    result = cli("recover", str(log))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / f"run.jsonl.torn-at-{offset}").read_bytes() == TAIL
    assert victim.read_bytes() == b"precious\n"


def test_a_fifo_at_the_temporary_name_is_refused_without_blocking(tmp_path: Path) -> None:
    log, offset = torn_log(tmp_path)
    partial = tmp_path / f".run.jsonl.torn-at-{offset}.partial"
    os.mkfifo(partial)
    size = log.stat().st_size

    result = cli("recover", str(log))

    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f".run.jsonl.torn-at-{offset}.partial: is a FIFO (named pipe)" in result.stderr
    assert log.stat().st_size == size


def test_a_symlink_at_the_final_name_is_neither_reused_nor_written_through(tmp_path: Path) -> None:
    """Even one pointing at a file that holds exactly the torn bytes: a symlink is not a
    side file (its target may go away), so the bytes are kept under the next name."""
    log, offset = torn_log(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(TAIL)
    (tmp_path / f"run.jsonl.torn-at-{offset}").symlink_to(elsewhere)

    writer, recovery = recover_log(log, {})
    writer.close()

    kept = tmp_path / f"run.jsonl.torn-at-{offset}.2"
    assert recovery.side_file == kept
    assert not kept.is_symlink() and kept.read_bytes() == TAIL
    assert (tmp_path / f"run.jsonl.torn-at-{offset}").is_symlink()
    assert elsewhere.read_bytes() == TAIL
    assert log.stat().st_size == offset
    assert replay(log).valid


def test_a_fifo_at_the_final_name_is_passed_over_without_blocking(tmp_path: Path) -> None:
    log, offset = torn_log(tmp_path)
    os.mkfifo(tmp_path / f"run.jsonl.torn-at-{offset}")

    result = cli("recover", str(log))

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"its bytes are kept in {tmp_path}/run.jsonl.torn-at-{offset}.2" in result.stdout
    assert (tmp_path / f"run.jsonl.torn-at-{offset}.2").read_bytes() == TAIL
    assert log.stat().st_size == offset


def test_a_temporary_copy_left_whole_by_a_crash_is_replaced_without_help(tmp_path: Path) -> None:
    """A crash after the temporary copy was written (before it got its final name) leaves a
    regular file there: the next recovery removes it and finishes, nobody deletes anything."""
    log, offset = torn_log(tmp_path)
    partial = tmp_path / f".run.jsonl.torn-at-{offset}.partial"
    partial.write_bytes(TAIL)

    writer, recovery = recover_log(log, {})
    writer.close()

    assert recovery.side_file == tmp_path / f"run.jsonl.torn-at-{offset}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", f"run.jsonl.torn-at-{offset}"]
    assert (tmp_path / f"run.jsonl.torn-at-{offset}").read_bytes() == TAIL
