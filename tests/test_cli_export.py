"""`export` of a file log: the records renumbered 1, 2, ..., never hiding a gap or a repeat.

The logs are written line by line with `encode_record` and hand-picked numbers,
so that the only thing wrong with them is their numbering.
"""

from __future__ import annotations

import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from logs import simple_changes

from attempt_kernel import Change, RunFinished, RunStarted, replay
from attempt_kernel._codec import encode_record

pytestmark = pytest.mark.slow

CHANGES: list[Change] = [RunStarted(workflow="w", nonce="n0"), *simple_changes(), RunFinished()]
"""Six records of run 'r': started, created, admitted, result, succeeded, finished."""


def numbered(path: Path, seqs: list[int]) -> Path:
    """The log at ``path`` with CHANGES numbered ``seqs`` (each line checksummed)."""
    path.write_bytes(b"".join(
        encode_record(seq, 1_000_000 + i, "r", change) for i, (seq, change) in enumerate(zip(seqs, CHANGES))
    ))  # fmt: skip
    return path


def export(log: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "export", str(log)],
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("seqs", "line", "why"),
    [
        ([1, 2, 4, 5, 6, 7], 3, "sequence number 4 where 3 was expected (a gap: records are missing)"),
        ([1, 2, 3, 3, 4, 5], 4, "sequence number 3 where 4 was expected (a repeat)"),
        # The log's head cut off (records 1 to 4 lost): renumbered from 1, the export was valid.
        ([5, 6, 7, 8, 9, 10], 1, "sequence number 5 where 1 was expected (a gap: records are missing)"),
        ([2**63, 2**63 + 1, 2**63 + 2, 2**63 + 3, 2**63 + 4, 2**63 + 5], 1,
         f"sequence number {2**63} where 1 was expected (a gap: records are missing)"),
    ],
    ids=["gap", "repeat", "head-missing", "head-at-2**63"],
)  # fmt: skip
def test_export_refuses_a_log_whose_numbering_it_would_hide(
    tmp_path: Path, seqs: list[int], line: int, why: str
) -> None:
    log = numbered(tmp_path / "gap.jsonl", seqs)
    assert [v.line for v in replay(log).violations] == [line]  # its numbering is all that is wrong
    before = log.read_bytes()
    result = export(log)
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"attempt-kernel export: error: {log}: line {line}: {why}; nothing more exported (renumbered, the export"
        f" would hide it; `attempt-kernel replay {log}` lists what is wrong)\n"
    )
    # What came before the bad line, as it was; nothing after it.
    assert result.stdout == b"".join(before.splitlines(keepends=True)[: line - 1])
    assert log.read_bytes() == before


def test_export_of_a_log_numbered_without_fault_is_the_log(tmp_path: Path) -> None:
    log = numbered(tmp_path / "ok.jsonl", [1, 2, 3, 4, 5, 6])
    result = export(log)
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout == log.read_bytes()


def test_export_refuses_a_corrupt_line_naming_its_line_as_a_gap_is_named(tmp_path: Path) -> None:
    """`export --help` and docs/run-log.md promise the corrupt record is refused naming its
    line, as a gap or repeat is (``LOG: line N: ...``), the lines before it written as they were."""
    log = numbered(tmp_path / "corrupt.jsonl", [1, 2, 3, 4, 5, 6])
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b',"crc"', b',"crx"')  # line 3 loses its checksum
    log.write_bytes(b"".join(lines))
    result = export(log)
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"attempt-kernel export: error: {log}: line 3: no checksum at the end of the line; nothing more exported\n"
    )
    assert result.stdout == b"".join(lines[:2])


def test_export_refusing_a_record_it_cannot_write_names_its_line_in_the_log(tmp_path: Path) -> None:
    """A run's input nested 300 levels deep, in a line another tool wrote: the reader takes
    it (replay: valid) but the writer refuses a value over MAX_RECORD_DEPTH. With ``--run``
    the refusal said only ``record seq 1 of run 'deep'`` (its number in the export), while
    the log holds it at line 7 and line 1 is another run's record."""
    log = numbered(tmp_path / "deep.jsonl", [1, 2, 3, 4, 5, 6])
    body = (
        '{"v":1,"seq":7,"time_us":1000006,"run":"deep","type":"run_started","workflow":"w","nonce":"n1","input":'
        + "[" * 300 + "]" * 300 + "}"
    ).encode()
    log.write_bytes(log.read_bytes() + body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body))
    assert replay(log).valid
    before = log.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "export", str(log), "--run", "deep"],
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.decode() == (
        f"attempt-kernel export: error: {log}: line 7: record seq 1 of run 'deep' cannot be written: a JSON value"
        " in it is nested deeper than 256 levels of arrays and objects (MAX_RECORD_DEPTH), which not every"
        " reader could parse back (numbered 1 in the export); nothing more exported\n"
    )
    assert result.stdout == b""
    assert log.read_bytes() == before
