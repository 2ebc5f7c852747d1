"""The run log: codec, reader and writer, including every kind of bad input."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from logs import UNENCODABLE, UNENCODABLE_IDS, fixed_clock, indeterminate_changes, simple_changes, write_log

from attempt_kernel import (
    Abandon,
    Abandoned,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Cancelled,
    Change,
    Confirm,
    Confirmed,
    CorruptLine,
    Failed,
    Dispatch,
    Dispatched,
    IntentChanged,
    IntentPlanned,
    LogItem,
    LogLocked,
    LogNeedsRecovery,
    LogOpenError,
    LogWriteFailed,
    Pending,
    Planned,
    Record,
    Running,
    RunFinished,
    RunLogWriter,
    RunStarted,
    StepCalled,
    StepResult,
    TornTail,
    UnencodableRecord,
    read_log,
    replay,
)
from attempt_kernel._codec import MAX_RECORD_BYTES, decode_line, encode_record
from attempt_kernel._records import JSON


def _line(body: str) -> bytes:
    """A line with a correct checksum around the given JSON body (written by hand)."""
    raw = body.encode()
    return raw[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(raw)


# ------------------------------------------------------------------ codec


def test_encoding_of_a_cancel_transition_is_the_documented_line() -> None:
    """A Cancel record is written exactly as docs/run-log.md shows."""
    line = encode_record(
        7,
        1_764_460_800_250_000,
        "r",
        AttemptTransitioned(
            step="mail", attempt=1, from_state=Running(),
            cause=Cancel(intent_dispatched=False), to_state=Cancelled(),
        ),
    )  # fmt: skip
    body = (
        '{"v":1,"seq":7,"time_us":1764460800250000,"run":"r","type":"transition","step":"mail",'
        '"attempt":1,"from":"Running","cause":"Cancel","intent_dispatched":false,'
        '"to":"Cancelled"}'
    )
    assert line == _line(body)


@pytest.mark.parametrize(
    "change",
    [
        AttemptCreated(step="s", attempt=3),
        AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Cancelled()),
        IntentPlanned(step="s", attempt=1, name="n", key="k"),
        IntentChanged(step="s", attempt=1, name="n", from_state=Planned(), cause=Abandon(), to_state=Abandoned()),
        StepResult(step="s", attempt=1, value={"a": [1, 2.5, None, "x"]}),
        StepResult(step="s", attempt=1, error="boom"),
        RunFinished(),
    ],
    ids=lambda c: type(c).__name__,
)  # fmt: skip
def test_every_change_round_trips(change: object, tmp_path: Path) -> None:
    """Each change type written and read back is equal to the original."""
    path = tmp_path / "log"
    path.write_bytes(encode_record(1, 2, "run-é", change))  # type: ignore[arg-type]
    items = list(read_log(path))
    assert items == [Record(line=1, seq=1, time_us=2, run="run-é", change=change)]  # type: ignore[arg-type]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_a_value_is_written_byte_for_byte_as_json_dumps_writes_it(value: JSON) -> None:
    """A step result's value, an effect's result and a run's input and result: json.dumps's bytes
    (compact separators, ASCII only); the fields around them as docs/run-log.md lists them."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    head = '{"v":1,"seq":1,"time_us":2,"run":"r",'
    assert encode_record(1, 2, "r", StepResult(step="s", attempt=1, value=value)) == _line(
        head + f'"type":"result","step":"s","attempt":1,"ok":true,"value":{text}}}'
    )
    confirmed = IntentChanged(
        step="s", attempt=1, name="n", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed(), result=value
    )
    tail = "}" if value is None else f',"result":{text}}}'
    assert encode_record(1, 2, "r", confirmed) == _line(
        head + '"type":"intent","step":"s","attempt":1,"intent":"n","from":"Dispatched","cause":"Confirm",'
        f'"to":"Confirmed"{tail}'
    )
    assert encode_record(1, 2, "r", RunStarted(workflow="w", input=value)) == _line(
        head + '"type":"run_started","workflow":"w"' + ("}" if value is None else f',"input":{text}}}')
    )


def test_keys_that_json_writes_alike_are_refused_naming_both() -> None:
    """``1`` and ``"1"`` in one dict would both be written as the key "1": a line the
    reader refuses (duplicate key). The writer refuses it first, naming the keys;
    a non-string key alone is still written as JSON writes it."""
    with pytest.raises(
        UnencodableRecord,
        match=r"an object has keys 1 and '1', which JSON writes as the same key '1'",
    ):
        encode_record(1, 2, "r", StepResult(step="s", attempt=1, value={1: "int", "1": "str"}))  # type: ignore[dict-item]
    assert b',"value":{"1":"int","2.5":"float"},' in encode_record(
        1, 2, "r", StepResult(step="s", attempt=1, value={1: "int", 2.5: "float"})  # type: ignore[dict-item]
    )


def test_a_nan_key_is_refused_as_out_of_range_not_as_a_twin_of_the_text_nan() -> None:
    """JSON writes no key for NaN: the encoder's own reason is the one given."""
    with pytest.raises(UnencodableRecord, match="Out of range float values are not JSON compliant"):
        encode_record(1, 2, "r", StepResult(step="s", attempt=1, value={float("nan"): 1, "nan": 2}))  # type: ignore[dict-item]


def test_an_empty_run_id_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """The reader refuses a line whose run is empty, so the writer never writes one."""
    path = write_log(tmp_path / "log", simple_changes())
    before = path.read_bytes()
    with RunLogWriter(path) as log:
        with pytest.raises(UnencodableRecord, match="record seq 5 cannot be written: its run id is empty"):
            log.append("", RunFinished())
        assert log.last_seq == 4
    assert path.read_bytes() == before


def test_a_circular_value_is_refused_and_the_next_one_is_still_written() -> None:
    """A list that holds itself is no JSON value: UnencodableRecord, and the encoder it went
    through (kept for the next values) still writes the same list once it no longer holds itself."""
    looped: list[object] = [1]
    looped.append(looped)
    with pytest.raises(UnencodableRecord, match="Circular reference detected"):
        encode_record(1, 2, "r", StepResult(step="s", attempt=1, value=looped))  # type: ignore[arg-type]
    looped.pop()
    assert b',"value":[1],' in encode_record(1, 2, "r", StepResult(step="s", attempt=1, value=looped))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", UNENCODABLE, ids=UNENCODABLE_IDS)
def test_unencodable_value_is_refused_and_nothing_is_written(value: object, tmp_path: Path) -> None:
    """A result JSON cannot carry raises UnencodableRecord; the log stays as it was."""
    path = write_log(tmp_path / "log", simple_changes())
    before = path.read_bytes()
    with RunLogWriter(path) as log:
        with pytest.raises(UnencodableRecord, match="cannot be written as JSON"):
            log.append("r", StepResult(step="s", attempt=1, value=value))  # type: ignore[arg-type]
        assert log.last_seq == 4
    assert path.read_bytes() == before


# ------------------------------------------------------------------ reader: bad input


def _corrupt(path: Path) -> list[CorruptLine]:
    return [i for i in read_log(path) if isinstance(i, CorruptLine)]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"v":2,"seq":1,"time_us":1,"run":"r","type":"run_finished"}', "unsupported schema version 2"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"party"}', "unknown record type 'party'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"transition","step":"s","attempt":1,"from":"Sleeping","cause":"Admit","to":"Running"}', "unknown attempt state 'Sleeping' in field 'from'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"transition","step":"s","attempt":1,"from":"Pending","cause":"Nudge","to":"Running"}', "unknown cause 'Nudge'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"transition","step":"s","attempt":1,"from":"Running","cause":"Cancel","to":"Cancelled"}', "a Cancel needs a boolean 'intent_dispatched'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"transition","step":"s","attempt":1,"from":"Pending","cause":"Admit","intent_dispatched":true,"to":"Running"}', "belongs to a Cancel"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"intent","step":"s","attempt":1,"intent":"n","from":"Planned","cause":"Yeet","to":"Dispatched"}', "unknown intent cause 'Yeet'"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"intent","step":"s","attempt":1,"intent":"n","from":"Lost","cause":"Dispatch","to":"Dispatched"}', "unknown intent state 'Lost' in field 'from'"),
        ('{"v":1,"seq":0,"time_us":1,"run":"r","type":"run_finished"}', "field 'seq' must be a positive integer"),
        ('{"v":1,"seq":1,"time_us":"noon","run":"r","type":"run_finished"}', "field 'time_us' must be a non-negative integer"),
        ('{"v":1,"seq":1,"time_us":1,"run":"","type":"run_finished"}', "field 'run' must be a non-empty string"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"created","step":"s","attempt":true}', "field 'attempt' must be a positive integer"),
        ('{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":"yes"}', "field 'ok' must be true or false"),
    ],
)  # fmt: skip
def test_bad_record_is_reported_with_its_line_and_field(body: str, reason: str, tmp_path: Path) -> None:
    """A well-checksummed line with bad content is corruption naming the line and field."""
    path = write_log(tmp_path / "log", simple_changes())
    with open(path, "ab") as f:
        f.write(_line(body))
    assert [(c.line, reason in c.reason) for c in _corrupt(path)] == [(5, True)], _corrupt(path)


def test_unparsable_line_with_valid_checksum(tmp_path: Path) -> None:
    """Checksummed garbage is reported as 'not valid JSON'."""
    path = tmp_path / "log"
    raw = b'{"v":1,,}'
    path.write_bytes(raw[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(raw))
    assert _corrupt(path) == [CorruptLine(line=1, reason="not valid JSON")]


def test_bad_checksum_in_the_middle_is_corruption_and_reading_goes_on(tmp_path: Path) -> None:
    """An altered middle record is reported by line; the records after it are read."""
    path = write_log(tmp_path / "log", simple_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"Admit"', b'"Fail"')
    path.write_bytes(b"".join(lines))
    items = list(read_log(path))
    assert items[1] == CorruptLine(line=2, reason="checksum mismatch (the line was altered)")
    assert [type(i).__name__ for i in items] == ["Record", "CorruptLine", "Record", "Record"]


def test_line_without_checksum(tmp_path: Path) -> None:
    """A JSON line with no crc field is corruption."""
    path = tmp_path / "log"
    path.write_bytes(b'{"v":1,"seq":1}\n')
    assert _corrupt(path) == [CorruptLine(line=1, reason="no checksum at the end of the line")]


def test_torn_last_line_is_a_torn_tail_not_corruption(tmp_path: Path) -> None:
    """An unterminated last line is a TornTail; every complete record before it is read."""
    path = write_log(tmp_path / "log", simple_changes())
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":5,"time_us":3,"ru')
    items = list(read_log(path))
    assert [type(i).__name__ for i in items] == ["Record"] * 4 + ["TornTail"]
    assert items[-1] == TornTail(line=5, offset=size, length=30)


def test_bad_line_followed_by_good_one_is_corruption(tmp_path: Path) -> None:
    """A truncated line that is followed by more lines is corruption, not a torn tail."""
    path = write_log(tmp_path / "log", simple_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:20] + b"\n"
    path.write_bytes(b"".join(lines))
    items = list(read_log(path))
    assert isinstance(items[2], CorruptLine) and items[2].line == 3
    assert not any(isinstance(i, TornTail) for i in items)


def test_nul_tail_is_a_torn_tail(tmp_path: Path) -> None:
    """A tail of NUL bytes (a file system's zero fill after a crash) is a torn tail."""
    path = write_log(tmp_path / "log", simple_changes())
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x00" * 300 + b"\n" + b"\x00" * 50)
    items = list(read_log(path))
    assert items[-1] == TornTail(line=5, offset=size, length=351)
    assert sum(isinstance(i, Record) for i in items) == 4


def test_nul_run_inside_the_log_is_corruption(tmp_path: Path) -> None:
    """NUL bytes followed by a real record are corruption."""
    path = write_log(tmp_path / "log", simple_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"\x00" * 10 + b"\n" + b"".join(lines[1:]))
    assert _corrupt(path) == [CorruptLine(line=2, reason="a run of NUL bytes inside the log")]


def test_megabytes_long_line_is_corruption(tmp_path: Path) -> None:
    """A line over the cap is reported as corruption and the next line is still read."""
    path = write_log(tmp_path / "log", simple_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"x" * (MAX_RECORD_BYTES + (1 << 20)) + b"\n" + b"".join(lines[1:]))
    items = list(read_log(path))
    assert items[1] == CorruptLine(line=2, reason=f"line longer than {MAX_RECORD_BYTES} bytes")
    assert [i.line for i in items if isinstance(i, Record)] == [1, 3, 4, 5]


def test_deeply_nested_brackets_do_not_escape_as_recursion_error(tmp_path: Path) -> None:
    """100,000 nested brackets with a valid checksum are corruption saying so, not RecursionError."""
    path = tmp_path / "log"
    body = b'{"v":1,"seq":1,"time_us":1,"run":"r","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path.write_bytes(body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body))
    items = list(read_log(path))
    assert items == [
        CorruptLine(line=1, reason="nested deeper than this reader can parse (the writer takes at most 256 levels)")
    ]


def nested(depth: int) -> JSON:
    """A list holding a list ... ``depth`` levels of arrays in all."""
    value: JSON = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [257, 900])
def test_a_value_nested_deeper_than_the_limit_is_refused_when_written(tmp_path: Path, depth: int) -> None:
    """Python's JSON parser recurses once per level, so how deep a reader can parse
    depends on how deep in its own calls it reads (a 900-deep value the writer took read
    back as "not valid JSON" from a web server's thread): the writer refuses more than
    256 levels, whatever its own stack, and nothing is written."""
    path = write_log(tmp_path / "log", simple_changes())
    before = path.read_bytes()
    with RunLogWriter(path) as log:
        with pytest.raises(UnencodableRecord) as refused:
            log.append("r", StepResult(step="s", attempt=1, value=nested(depth)))
        assert log.last_seq == 4
    assert str(refused.value) == (
        "record seq 5 of run 'r' cannot be written: a JSON value in it is nested deeper than 256"
        " levels of arrays and objects (MAX_RECORD_DEPTH), which not every reader could parse back"
    )
    assert path.read_bytes() == before


def test_a_value_nested_to_the_limit_is_read_back_from_deep_in_a_reader_s_stack(tmp_path: Path) -> None:
    """256 levels, inside strings and objects too, are written, and read back by a reader
    already 500 calls deep."""
    deepest: JSON = {"s": "[[[{{{", "v": nested(254)}  # the object is a level, and the record holds it
    value: JSON = [deepest]
    path = tmp_path / "log"
    with RunLogWriter(path) as log:
        log.append("r", StepResult(step="s", attempt=1, value=value))

    def read_from(calls: int) -> list[LogItem]:
        return list(read_log(path)) if calls == 0 else read_from(calls - 1)

    [item] = read_from(500)
    assert isinstance(item, Record) and item.change == StepResult(step="s", attempt=1, value=value)


def test_binary_file_is_corruption_by_line(tmp_path: Path) -> None:
    """Random bytes are reported as corrupt lines (and a torn tail), never a crash."""
    path = tmp_path / "log"
    path.write_bytes(bytes(range(256)) * 20 + b"\xff\xfe\n")
    items = list(read_log(path))
    assert items and all(isinstance(i, (CorruptLine, TornTail)) for i in items)
    assert any(isinstance(i, CorruptLine) for i in items)


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    """An empty log has no items (the replayer reports it as empty)."""
    path = tmp_path / "log"
    path.write_bytes(b"")
    assert list(read_log(path)) == []


def test_missing_file_is_a_clear_open_error(tmp_path: Path) -> None:
    """A missing path raises LogOpenError naming it."""
    with pytest.raises(LogOpenError, match="nope.jsonl: no such file"):
        list(read_log(tmp_path / "nope.jsonl"))


def test_directory_is_a_clear_open_error(tmp_path: Path) -> None:
    """A directory raises LogOpenError saying so."""
    with pytest.raises(LogOpenError, match="is a directory"):
        list(read_log(tmp_path))
    with pytest.raises(LogOpenError, match="is a directory"):
        RunLogWriter(tmp_path)


# ------------------------------------------------------------------ crash consistency


def test_truncation_at_every_byte_of_the_last_records(tmp_path: Path) -> None:
    """Cut anywhere in the last two records: the torn tail is found, the rest survive."""
    full = write_log(tmp_path / "full", simple_changes() + indeterminate_changes()).read_bytes()
    lines = full.splitlines(keepends=True)
    keep = len(b"".join(lines[:-2]))
    cut_path = tmp_path / "cut"
    for cut in range(keep, len(full) + 1):
        cut_path.write_bytes(full[:cut])
        items = list(read_log(cut_path))
        records = [i for i in items if isinstance(i, Record)]
        assert not any(isinstance(i, CorruptLine) for i in items), cut
        # every complete line is a record; a partial one is exactly one torn tail
        complete = full[:cut].count(b"\n")
        assert len(records) == complete, cut
        partial = cut > 0 and not full[:cut].endswith(b"\n")
        assert isinstance(items[-1], TornTail) is partial, cut


def test_every_single_bit_flip_of_a_middle_record_is_reported(tmp_path: Path) -> None:
    """Flip each bit of record 2 in turn: it is reported at line 2 (or splits the line)."""
    full = write_log(tmp_path / "full", simple_changes()).read_bytes()
    lines = full.splitlines(keepends=True)
    start, length = len(lines[0]), len(lines[1])
    path = tmp_path / "flipped"
    for byte in range(start, start + length):
        for bit in range(8):
            data = bytearray(full)
            data[byte] ^= 1 << bit
            path.write_bytes(bytes(data))
            items = list(read_log(path))
            bad = [i for i in items if not isinstance(i, Record)]
            assert bad, (byte, bit)
            assert all(isinstance(i, CorruptLine) for i in bad), (byte, bit, bad)
            assert bad[0].line == 2, (byte, bit, bad)
            # records 1, 3 and 4 are still read, unless the flip hit record 2's
            # newline and merged it with record 3 into one corrupt line
            merged = byte == start + length - 1
            assert sum(isinstance(i, Record) for i in items) == (2 if merged else 3), (byte, bit)


# ------------------------------------------------------------------ writer


def test_writer_continues_the_sequence_after_reopening(tmp_path: Path) -> None:
    """A reopened log appends after its last record; nothing written is rewritten."""
    path = write_log(tmp_path / "log", simple_changes())
    before = path.read_bytes()
    with RunLogWriter(path, clock=fixed_clock()) as log:
        assert log.last_seq == 4
        assert log.append("r2", RunFinished()) == 5
    assert path.read_bytes().startswith(before)
    assert [i.seq for i in read_log(path) if isinstance(i, Record)] == [1, 2, 3, 4, 5]


def test_writer_refuses_a_log_with_a_torn_tail(tmp_path: Path) -> None:
    """Appending after a torn tail would bury it mid-file: refuse, say recover."""
    path = write_log(tmp_path / "log", simple_changes())
    with open(path, "ab") as f:
        f.write(b'{"v":1')
    before = path.read_bytes()
    with pytest.raises(LogNeedsRecovery, match="line 5 is a torn tail"):
        RunLogWriter(path)
    assert path.read_bytes() == before


def test_second_writer_is_locked_out(tmp_path: Path) -> None:
    """Two writers on one log: the second gets LogLocked; the first goes on."""
    path = tmp_path / "log"
    with RunLogWriter(path) as first:
        first.append("r", AttemptCreated(step="s", attempt=1))
        with pytest.raises(LogLocked, match="another process is writing"):
            RunLogWriter(path)
        first.append("r", RunFinished())
    with RunLogWriter(path) as again:
        assert again.last_seq == 2


class FailingOps:
    """Write and fsync that fail on the n-th call, with the given errno."""

    def __init__(self, *, fail_write_at: int = 0, fail_fsync_at: int = 0, err: int = errno.EIO) -> None:
        self.writes = 0
        self.fsyncs = 0
        self.fail_write_at = fail_write_at
        self.fail_fsync_at = fail_fsync_at
        self.err = err

    def write(self, fd: int, data: bytes) -> int:
        self.writes += 1
        if self.writes == self.fail_write_at:
            raise OSError(self.err, os.strerror(self.err))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.fsyncs == self.fail_fsync_at:
            raise OSError(self.err, os.strerror(self.err))
        os.fsync(fd)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_failed_write_breaks_the_writer_and_keeps_acknowledged_records(n: int, tmp_path: Path) -> None:
    """The n-th write fails: it raises, later appends are refused, records 1..n-1 stay."""
    path = tmp_path / "log"
    log = RunLogWriter(path, ops=FailingOps(fail_write_at=n), batch_size=2)
    acknowledged: list[int] = []
    with pytest.raises(LogWriteFailed, match=f"write of record seq {n} failed"):
        for i in range(1, 20):
            acknowledged.append(log.append("r", AttemptCreated(step=f"s{i}", attempt=1)))
    assert acknowledged == list(range(1, n))
    with pytest.raises(LogWriteFailed, match="reopen the log"):
        log.append("r", RunFinished())
    log.close()
    assert [i.seq for i in read_log(path) if isinstance(i, Record)] == acknowledged


@pytest.mark.parametrize("n", [1, 2, 4])
def test_failed_fsync_is_never_retried_as_if_nothing_happened(n: int, tmp_path: Path) -> None:
    """The n-th fsync fails: the writer refuses appends and flushes until reopened."""
    path = tmp_path / "log"
    ops = FailingOps(fail_fsync_at=n)
    log = RunLogWriter(path, ops=ops, batch_size=3)
    with pytest.raises(LogWriteFailed, match="fsync after record seq"):
        for i in range(1, 100):
            log.append("r", AttemptCreated(step=f"s{i}", attempt=1))
    assert ops.fsyncs == n
    with pytest.raises(LogWriteFailed):
        log.append("r", RunFinished())
    with pytest.raises(LogWriteFailed):
        log.flush()
    log.close()
    assert ops.fsyncs == n  # close did not retry the failed fsync
    assert sum(isinstance(i, Record) for i in read_log(path)) == 3 * n


class ShortWrites:
    """Writes that take at most ``most`` bytes a call (the rest comes in later calls)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.calls = 0

    def write(self, fd: int, data: bytes) -> int:
        self.calls += 1
        return os.write(fd, data[: self.most])

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


def test_append_all_writes_the_records_in_order_in_one_write(tmp_path: Path) -> None:
    """Three records, one write call, consecutive numbers, one time; they read back as given."""
    path = tmp_path / "log"
    ops = FailingOps()
    changes: list[Change] = [
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step="s", attempt=1, value={"n": 1}),
    ]
    with RunLogWriter(path, ops=ops, clock=lambda: 7) as log:
        log.append("r", RunFinished())
        assert log.append_all("r", changes) == 4
        assert ops.writes == 2
        assert log.append("r", RunFinished()) == 5
    records = [i for i in read_log(path) if isinstance(i, Record)]
    assert [(r.seq, r.time_us, r.change) for r in records[1:4]] == [
        (2, 7, changes[0]), (3, 7, changes[1]), (4, 7, changes[2])
    ]  # fmt: skip
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]


def test_append_all_with_one_unencodable_record_writes_none_of_them(tmp_path: Path) -> None:
    """A set in the middle of the batch: UnencodableRecord, nothing written, no number used up."""
    path = tmp_path / "log"
    with RunLogWriter(path) as log:
        with pytest.raises(UnencodableRecord, match="record seq 2 of run 'r' cannot be written as JSON"):
            unencodable = StepResult(step="s", attempt=1, value={1, 2})  # type: ignore[arg-type]
            log.append_all("r", [AttemptCreated(step="s", attempt=1), unencodable, RunFinished()])
        assert log.append("r", RunFinished()) == 1
    assert [i.seq for i in read_log(path) if isinstance(i, Record)] == [1]


def test_append_all_of_nothing_is_refused(tmp_path: Path) -> None:
    """An empty batch is a usage error (as on PostgreSQL); nothing is written."""
    path = tmp_path / "log"
    with RunLogWriter(path) as log:
        with pytest.raises(ValueError, match="append_all needs at least one change"):
            log.append_all("r", [])
    assert path.read_bytes() == b""


def test_append_all_goes_on_after_a_short_write(tmp_path: Path) -> None:
    """A write that takes only part of the batch: the rest follows, every record reads back."""
    path = tmp_path / "log"
    ops = ShortWrites(most=50)
    with RunLogWriter(path, ops=ops) as log:
        log.append_all("r", [AttemptCreated(step=f"s{i}", attempt=1) for i in range(1, 4)])
    assert ops.calls > 3
    assert [i.seq for i in read_log(path) if isinstance(i, Record)] == [1, 2, 3]


def test_a_failed_append_all_names_its_records_and_breaks_the_writer(tmp_path: Path) -> None:
    """The batch's write fails: LogWriteFailed names the records; later appends are refused."""
    path = tmp_path / "log"
    log = RunLogWriter(path, ops=FailingOps(fail_write_at=2))
    log.append("r", RunFinished())
    with pytest.raises(LogWriteFailed, match="write of records seq 2 to 3 failed"):
        log.append_all("r", [AttemptCreated(step="s", attempt=1), RunFinished()])
    with pytest.raises(LogWriteFailed, match="reopen the log"):
        log.append_all("r", [RunFinished()])
    log.close()
    assert [i.seq for i in read_log(path) if isinstance(i, Record)] == [1]


def test_disk_full_is_a_clear_error(tmp_path: Path) -> None:
    """ENOSPC from write says the disk is full."""
    log = RunLogWriter(tmp_path / "log", ops=FailingOps(fail_write_at=1, err=errno.ENOSPC))
    with pytest.raises(LogWriteFailed, match="the disk is full"):
        log.append("r", RunFinished())
    log.close()


def test_a_file_size_limit_is_named_not_called_a_full_disk(tmp_path: Path) -> None:
    """EFBIG from write names the file's size limit, where the disk may have room to spare."""
    log = RunLogWriter(tmp_path / "log", ops=FailingOps(fail_write_at=1, err=errno.EFBIG))
    with pytest.raises(LogWriteFailed) as raised:
        log.append("r", RunFinished())
    log.close()
    assert str(raised.value) == (
        f"{tmp_path / 'log'}: write of record seq 1 failed: the file reached its size limit (`ulimit -f`,"
        " or the largest file its file system holds); records acknowledged before it stay readable,"
        " and this writer refuses further appends until the log is reopened"
    )


FILL_SCRIPT = """
import resource, signal, sys
from attempt_kernel import RunLogWriter, AttemptCreated, LogWriteFailed
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
acked = 0
try:
    with RunLogWriter(sys.argv[1], batch_size=4) as log:
        for i in range(1, 10_000):
            log.append("run", AttemptCreated(step="step-%d" % i, attempt=1))
            acked = i
except LogWriteFailed as error:
    print(acked)
    print(error, file=sys.stderr)
    sys.exit(0)
sys.exit("the file size limit was never hit")
"""


@pytest.mark.slow
def test_a_file_size_limit_stops_the_writer_cleanly(tmp_path: Path) -> None:
    """Under a 4 KiB file-size limit the writer stops with a clear error; acked records read back."""
    path = tmp_path / "log"
    result = subprocess.run(
        [sys.executable, "-c", FILL_SCRIPT, str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    acked = int(result.stdout.strip())
    assert "the file reached its size limit" in result.stderr
    assert path.stat().st_size <= 4096
    items = list(read_log(path))
    records = [i for i in items if isinstance(i, Record)]
    assert [r.seq for r in records] == list(range(1, acked + 1))
    assert not any(isinstance(i, CorruptLine) for i in items)


def test_batch_size_must_be_positive(tmp_path: Path) -> None:
    """batch_size=0 is a usage error."""
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        RunLogWriter(tmp_path / "log", batch_size=0)


def test_fsync_happens_every_batch(tmp_path: Path) -> None:
    """With batch_size=3, seven appends fsync twice, and close once more."""
    ops = FailingOps()
    log = RunLogWriter(tmp_path / "log", ops=ops, batch_size=3)
    for i in range(7):
        log.append("r", AttemptCreated(step=f"s{i}", attempt=1))
    assert ops.fsyncs == 2
    log.close()
    assert ops.fsyncs == 3


def test_fast_record_builder_equals_the_dataclass_constructor() -> None:
    """The reader's descriptor-based builder makes exactly Record(...), still frozen."""
    from dataclasses import FrozenInstanceError

    from attempt_kernel._codec import _new_record  # pyright: ignore[reportPrivateUsage]  # the private fast builder is under test

    built = _new_record(3, 4, 5, "run", RunFinished())
    assert built == Record(line=3, seq=4, time_us=5, run="run", change=RunFinished())
    assert repr(built) == (
        "Record(line=3, seq=4, time_us=5, run='run', change=RunFinished(result=None, error=None))"
    )
    with pytest.raises(FrozenInstanceError):
        built.seq = 9  # type: ignore[misc]


def test_fast_change_builders_make_exactly_the_dataclass_values() -> None:
    """The decoder's descriptor-based builders equal the classes called as usual."""
    from dataclasses import FrozenInstanceError

    from attempt_kernel._codec import new_created, new_result, new_transition  # pyright: ignore[reportPrivateUsage]  # the private fast builders are under test

    transition_change = new_transition("s", 2, Pending(), Admit(), Running())
    assert transition_change == AttemptTransitioned(
        step="s", attempt=2, from_state=Pending(), cause=Admit(), to_state=Running()
    )
    assert repr(new_created("s", 2)) == "AttemptCreated(step='s', attempt=2)"
    assert new_created("s", 2) == AttemptCreated(step="s", attempt=2)
    assert new_result("s", 2, {"n": 1}, None) == StepResult(step="s", attempt=2, value={"n": 1})
    assert new_result("s", 2, None, "boom") == StepResult(step="s", attempt=2, error="boom")
    assert repr(new_result("s", 2, None, "boom")) == "StepResult(step='s', attempt=2, value=None, error='boom')"
    with pytest.raises(FrozenInstanceError):
        transition_change.attempt = 3  # type: ignore[misc]


def test_the_fast_step_outcome_builder_makes_exactly_the_dataclass_value() -> None:
    """outcome()'s builder equals StepOutcome called as usual, and is as frozen."""
    from dataclasses import FrozenInstanceError

    from attempt_kernel import StepOutcome
    from attempt_kernel._outcome import _new_outcome  # pyright: ignore[reportPrivateUsage]  # the private fast builder is under test

    built = _new_outcome("pay", Failed(), 2, None, "boom", ("ak1-k",))
    assert built == StepOutcome(step="pay", state=Failed(), attempts=2, error="boom", outstanding=("ak1-k",))
    assert repr(built) == (
        "StepOutcome(step='pay', state=Failed(), attempts=2, result=None, error='boom', outstanding=('ak1-k',))"
    )
    with pytest.raises(FrozenInstanceError):
        built.attempts = 3  # type: ignore[misc]


def test_fast_call_and_intent_builders_make_exactly_the_dataclass_values() -> None:
    """The decoder's builders of step_called and intent records equal the classes called as usual."""
    from dataclasses import FrozenInstanceError

    from attempt_kernel._codec import new_intent, new_called  # pyright: ignore[reportPrivateUsage]  # the private fast builders are under test

    called = new_called("think@3", 3, "think", "sha256:0123456789abcdef")
    assert called == StepCalled(step="think@3", position=3, name="think", digest="sha256:0123456789abcdef")
    assert repr(called) == "StepCalled(step='think@3', position=3, name='think', digest='sha256:0123456789abcdef')"
    confirmed = new_intent("pay", 2, "charge", Dispatched(), Confirm(), Confirmed(), {"id": "ch-1"})
    assert confirmed == IntentChanged(
        step="pay", attempt=2, name="charge", from_state=Dispatched(), cause=Confirm(),
        to_state=Confirmed(), result={"id": "ch-1"},
    )  # fmt: skip
    assert new_intent("pay", 2, "charge", Planned(), Dispatch(), Dispatched(), None) == IntentChanged(
        step="pay", attempt=2, name="charge", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()
    )
    with pytest.raises(FrozenInstanceError):
        called.position = 4  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        confirmed.result = None  # type: ignore[misc]


DECODED_VALUES: list[tuple[str, object]] = [
    ('"a\\":b"', 'a":b'),  # a string holding '":' (the key count is off; still valid)
    ('{"k":"x\\":y","n":[{"m":1},{"m":2}]}', {"k": 'x":y', "n": [{"m": 1}, {"m": 2}]}),
    ("[[[{}]]]", [[[{}]]]),
]


@pytest.mark.parametrize(("value_json", "expected"), DECODED_VALUES)
def test_values_that_look_like_extra_keys_still_decode(value_json: str, expected: object) -> None:
    """The fast duplicate-key check falls back to the exact one, which accepts these."""
    body = f'{{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":{value_json}}}'
    raw = body[:-1].encode() + b',"crc":"%08x"}\n' % zlib.crc32(body.encode())
    decoded = decode_line(raw, 1)
    assert isinstance(decoded, Record) and isinstance(decoded.change, StepResult)
    assert decoded.change.value == expected


def test_a_duplicate_key_deep_in_a_value_is_corruption() -> None:
    """A repeated key three levels down is found, with a valid checksum."""
    body = '{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,"value":[{"a":[{"b":1,"b":1}]}]}'
    raw = body[:-1].encode() + b',"crc":"%08x"}\n' % zlib.crc32(body.encode())
    decoded = decode_line(raw, 7)
    assert decoded == CorruptLine(line=7, reason="not strict JSON: duplicate key 'b' in an object")


# --------------------------------------------------------------------------
# A file that is not a run log
# --------------------------------------------------------------------------


def _random_without_newline(n: int) -> bytes:
    import random

    chooser = random.Random(7)
    return bytes(b for b in (chooser.randrange(256) for _ in range(2 * n)) if b not in (0x0A, 0x00))[:n]


@pytest.mark.parametrize(
    ("content", "shown"),
    [
        (b"hello", "b'hello'"),
        (b"\x00\x00hello", "b'\\x00\\x00hello'"),
        (b'{"seq":1', "b'{\"seq\":1'"),
    ],
    ids=["hello", "nul-then-text", "json-not-a-record"],
)  # fmt: skip
def test_a_file_whose_first_bytes_cannot_begin_a_record_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, shown: str
) -> None:
    from attempt_kernel.cli._main import main

    log = tmp_path / "x.jsonl"
    log.write_bytes(content)
    for command in ("replay", "recover"):
        assert main([command, str(log)]) == 2
        assert capsys.readouterr().err == (
            f"attempt-kernel {command}: error: {log}: not a run log: its first bytes {shown}"
            ' cannot begin a record (each line of a run log begins with {"v":); nothing was changed\n'
        )
    assert log.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]


def test_five_thousand_random_bytes_are_not_a_run_log(tmp_path: Path) -> None:
    log = tmp_path / "x.jsonl"
    content = _random_without_newline(5000)
    log.write_bytes(content)
    with pytest.raises(LogOpenError, match="not a run log"):
        list(read_log(log))
    with pytest.raises(LogOpenError, match="not a run log"):
        RunLogWriter(log)
    assert log.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl"]


@pytest.mark.parametrize(
    "content", [b"", b'{"v":1,"se', b"{", b"\x00" * 100], ids=["empty", "torn-record", "one-brace", "nul-only"]
)
def test_an_empty_log_and_a_torn_first_record_stay_a_valid_log_with_no_record(tmp_path: Path, content: bytes) -> None:
    log = tmp_path / "x.jsonl"
    log.write_bytes(content)
    items = list(read_log(log))
    if content:
        assert items == [TornTail(line=1, offset=0, length=len(content))]
    else:
        assert items == []
    assert replay(log).valid


def test_records_after_a_nul_run_inside_the_log_are_still_read(tmp_path: Path) -> None:
    """Looking past a run of NUL bytes for the end of the file does not skip what follows it."""
    path = write_log(tmp_path / "log", simple_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"\x00" * 10 + b"\n" + b"".join(lines[1:]))
    items = list(read_log(path))
    assert items[1] == CorruptLine(line=2, reason="a run of NUL bytes inside the log")
    assert [i.line for i in items if isinstance(i, Record)] == [1, 3, 4, 5]


class PausedWrite:
    """Writes that, in thread ``a``, wait until thread ``b`` has written or has reached the
    writer's append lock (`AtTheLock`): ``b`` appends while ``a``'s append is in its write."""

    HUNG = 60.0

    def __init__(self) -> None:
        self.a_writing = threading.Event()
        self.b_progress = threading.Event()

    def write(self, fd: int, data: bytes) -> int:
        name = threading.current_thread().name
        if name == "a":
            self.a_writing.set()
            assert self.b_progress.wait(self.HUNG), "thread b never appended"
        written = os.write(fd, data)
        if name == "b":
            self.b_progress.set()
        return written

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


class AtTheLock:
    """A lock that says when thread ``b`` comes to it (before it waits for it)."""

    def __init__(self, arrived: threading.Event) -> None:
        self.lock = threading.Lock()
        self.arrived = arrived

    def __enter__(self) -> None:
        if threading.current_thread().name == "b":
            self.arrived.set()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_appends_from_two_threads_at_once_take_a_number_each(tmp_path: Path) -> None:
    """Two threads (two event loops, say) appending to one writer at the same moment: each
    record gets a sequence number of its own, and the log replays clean."""
    ops = PausedWrite()
    path = tmp_path / "log"
    with RunLogWriter(path, ops=ops) as log:
        log._appending = AtTheLock(ops.b_progress)  # type: ignore[assignment]
        a = threading.Thread(target=log.append, args=("a", RunStarted(workflow="w")), name="a")
        b = threading.Thread(target=log.append, args=("b", RunStarted(workflow="w")), name="b")
        a.start()
        assert ops.a_writing.wait(PausedWrite.HUNG)
        b.start()
        a.join()
        b.join()
    assert [(r.seq, r.run) for r in read_log(path) if isinstance(r, Record)] == [(1, "a"), (2, "b")]
    assert replay(path).valid
