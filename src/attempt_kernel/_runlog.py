"""The run log: record codec, append-only writer and streaming reader.

One record per line (JSON Lines), each line checksummed (spec §4); the format
is documented in ``docs/run-log.md``. This module owns bytes on disk and
nothing else: it applies no kernel rule (that is the replayer's job), and it
never rewrites or truncates what is written (cutting a torn tail is
recovery's job, and it keeps the cut bytes aside).

Encoding states, causes and intents goes through functions whose ``match``
is closed by ``assert_never``, so an added state or cause breaks the codec at
type-check time; decoding uses tables built from those same functions.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, Protocol, Union, cast

from typing_extensions import Self, TypeAlias, assert_never, final

from ._attempt import (
    ALL_CAUSES,
    ALL_STATES,
    Admit,
    AttemptState,
    Cancel,
    Cancelled,
    Fail,
    Failed,
    Indeterminate,
    Pending,
    QueueDeadlinePassed,
    Running,
    StepDeadlinePassed,
    Succeed,
    Succeeded,
    TimedOut,
    TransitionCause,
)
from ._errors import AttemptKernelError
from ._intent import (
    ALL_INTENT_CAUSES,
    ALL_INTENT_STATES,
    Abandon,
    Abandoned,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    IntentCause,
    IntentState,
    Planned,
    Reject,
    Rejected,
)

SCHEMA_VERSION: Final = 1
"""The version written in every record's ``v`` field; the reader accepts only it."""

MAX_LINE_BYTES: Final = 1 << 20
"""A longer line is reported as corruption (it is never loaded whole)."""

DEFAULT_BATCH: Final = 64
"""Appends between two fsyncs when the caller does not choose."""

# ,"crc":"xxxxxxxx"}\n closes every line; the checksum covers the line with
# that tail replaced by "}" (the record's JSON without its crc field).
_CRC_OPEN: Final = b',"crc":"'
_TAIL_LEN: Final = len(_CRC_OPEN) + 8 + len(b'"}\n')

JSON: TypeAlias = Union[None, bool, int, float, str, list["JSON"], dict[str, "JSON"]]

# --------------------------------------------------------------------------
# Changes: what a record says happened
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptCreated:
    """Attempt number ``attempt`` of ``step`` was created (in `Pending`)."""

    step: str
    attempt: int


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptTransitioned:
    """The attempt moved ``from_state`` --``cause``--> ``to_state``."""

    step: str
    attempt: int
    from_state: AttemptState
    cause: TransitionCause
    to_state: AttemptState


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentPlanned:
    """The attempt planned intent ``name`` with idempotency key ``key``."""

    step: str
    attempt: int
    name: str
    key: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentChanged:
    """Intent ``name`` of the attempt moved ``from_state`` --``cause``--> ``to_state``."""

    step: str
    attempt: int
    name: str
    from_state: IntentState
    cause: IntentCause
    to_state: IntentState


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """The attempt's step returned ``value`` (``error`` is None) or raised ``error``."""

    step: str
    attempt: int
    value: JSON = None
    error: str | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunStarted:
    """A run of the workflow named ``workflow`` started; recovery resumes it by that name."""

    workflow: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFinished:
    """The executor is done with the run; no record of it may follow."""


Change: TypeAlias = Union[
    RunStarted,
    AttemptCreated,
    AttemptTransitioned,
    IntentPlanned,
    IntentChanged,
    StepResult,
    RunFinished,
]
"""The closed union of record changes."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One decoded line of a run log."""

    line: int
    seq: int
    time_us: int
    """When the record was written: microseconds since the Unix epoch (UTC)."""
    run: str
    change: Change


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class CorruptLine:
    """A line in the log that is not a valid record; the reader goes on after it."""

    line: int
    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class TornTail:
    """An unterminated last line (or a tail of NUL bytes): a crash mid-write.

    Everything before ``line`` is complete. ``offset`` is the byte where the
    torn tail starts; recovery cuts the file there and keeps the bytes aside.
    """

    line: int
    offset: int
    length: int


LogItem: TypeAlias = Union[Record, CorruptLine, TornTail]
"""What the reader yields, line by line."""

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class RunLogError(AttemptKernelError):
    """A run log cannot be opened, read or written."""


@final
class LogOpenError(RunLogError):
    """The log file is missing, is a directory, or cannot be opened."""


@final
class LogReadError(RunLogError):
    """Reading the log failed part-way (an I/O error from the device)."""


@final
class LogLocked(RunLogError):
    """Another writer holds the log; two processes must not write one log."""


@final
class LogNeedsRecovery(RunLogError):
    """The log ends in a torn tail or holds corruption; recover it before appending."""


@final
class LogWriteFailed(RunLogError):
    """A write or fsync failed; the writer refuses appends until the log is reopened."""


@final
class UnencodableRecord(RunLogError):
    """A change holds a value that JSON cannot carry (nothing was written)."""


# --------------------------------------------------------------------------
# Codec: names of states and causes, exhaustive in both directions
# --------------------------------------------------------------------------


def state_name(state: AttemptState) -> str:
    """The name an attempt state is written under."""
    match state:
        case Pending():
            return "Pending"
        case Running():
            return "Running"
        case Succeeded():
            return "Succeeded"
        case Failed():
            return "Failed"
        case Indeterminate():
            return "Indeterminate"
        case Cancelled():
            return "Cancelled"
        case TimedOut():
            return "TimedOut"
        case _:
            assert_never(state)


def cause_name(cause: TransitionCause) -> str:
    """The name a cause is written under (Cancel's flag is a field of its own)."""
    match cause:
        case Admit():
            return "Admit"
        case Succeed():
            return "Succeed"
        case Fail():
            return "Fail"
        case Cancel():
            return "Cancel"
        case QueueDeadlinePassed():
            return "QueueDeadlinePassed"
        case StepDeadlinePassed():
            return "StepDeadlinePassed"
        case _:
            assert_never(cause)


def intent_state_name(state: IntentState) -> str:
    """The name an intent state is written under."""
    match state:
        case Planned():
            return "Planned"
        case Dispatched():
            return "Dispatched"
        case Confirmed():
            return "Confirmed"
        case Rejected():
            return "Rejected"
        case Abandoned():
            return "Abandoned"
        case _:
            assert_never(state)


def intent_cause_name(cause: IntentCause) -> str:
    """The name an intent cause is written under."""
    match cause:
        case Dispatch():
            return "Dispatch"
        case Confirm():
            return "Confirm"
        case Reject():
            return "Reject"
        case Abandon():
            return "Abandon"
        case _:
            assert_never(cause)


# Decoding tables, built from the encoders above (never written by hand).
_STATES: Final[dict[str, AttemptState]] = {state_name(s): s for s in ALL_STATES}
_CAUSES: Final[dict[tuple[str, bool | None], TransitionCause]] = {
    (cause_name(c), c.intent_dispatched if isinstance(c, Cancel) else None): c
    for c in ALL_CAUSES
}
_INTENT_STATES: Final[dict[str, IntentState]] = {
    intent_state_name(s): s for s in ALL_INTENT_STATES
}
_INTENT_CAUSES: Final[dict[str, IntentCause]] = {
    intent_cause_name(c): c for c in ALL_INTENT_CAUSES
}


# Strings are escaped by the json module's own C escaper; the rest of each
# line is a fixed template. This writes byte for byte what
# json.dumps(fields, separators=(",", ":")) writes (a test holds it to that),
# at a third of the cost, which matters because encoding is most of an
# append's CPU time.
_q = json.encoder.encode_basestring_ascii
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


# Names by class, taken from the exhaustive encoders above: a dict lookup is
# cheaper than walking a match's class patterns on every append.
_STATE_NAME: Final = {type(s): state_name(s) for s in ALL_STATES}
_INTENT_STATE_NAME: Final = {type(s): intent_state_name(s) for s in ALL_INTENT_STATES}
_INTENT_CAUSE_NAME: Final = {type(c): intent_cause_name(c) for c in ALL_INTENT_CAUSES}
_CAUSE_JSON: Final = {
    (type(c), c.intent_dispatched if isinstance(c, Cancel) else None): (
        f'"{cause_name(c)}"'
        + (f',"intent_dispatched":{"true" if c.intent_dispatched else "false"}' if isinstance(c, Cancel) else "")
    )
    for c in ALL_CAUSES
}


def _change_json(change: Change) -> str:
    match change:
        case RunStarted():
            return f',"type":"run_started","workflow":{_q(change.workflow)}}}'
        case AttemptCreated():
            return f',"type":"created","step":{_q(change.step)},"attempt":{change.attempt:d}}}'
        case AttemptTransitioned():
            cause = change.cause
            flag = cause.intent_dispatched if isinstance(cause, Cancel) else None
            return (
                f',"type":"transition","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"from":"{_STATE_NAME[type(change.from_state)]}"'
                f',"cause":{_CAUSE_JSON[type(cause), flag]}'
                f',"to":"{_STATE_NAME[type(change.to_state)]}"}}'
            )
        case IntentPlanned():
            return (
                f',"type":"intent_planned","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"intent":{_q(change.name)},"key":{_q(change.key)}}}'
            )
        case IntentChanged():
            return (
                f',"type":"intent","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"intent":{_q(change.name)}'
                f',"from":"{_INTENT_STATE_NAME[type(change.from_state)]}"'
                f',"cause":"{_INTENT_CAUSE_NAME[type(change.cause)]}"'
                f',"to":"{_INTENT_STATE_NAME[type(change.to_state)]}"}}'
            )
        case StepResult():
            head = f',"type":"result","step":{_q(change.step)},"attempt":{change.attempt:d}'
            if change.error is None:
                return f'{head},"ok":true,"value":{_dumps(change.value)}}}'
            return f'{head},"ok":false,"error":{_q(change.error)}}}'
        case RunFinished():
            return ',"type":"run_finished"}'
        case _:
            assert_never(change)


def encode_record(seq: int, time_us: int, run: str, change: Change) -> bytes:
    """One complete line (ending in a newline) for the record.

    Raises `UnencodableRecord` if a value cannot be written as strict JSON
    (a set, an object, NaN, ...).
    """
    try:
        body = (
            f'{{"v":{SCHEMA_VERSION},"seq":{seq:d},"time_us":{time_us:d},"run":{_q(run)}'
            + _change_json(change)
        ).encode()
    except (TypeError, ValueError, RecursionError) as error:
        raise UnencodableRecord(
            f"record seq {seq} of run {run!r} cannot be written as JSON: {error}"
        ) from None
    return b"%s%s%08x\"}\n" % (body[:-1], _CRC_OPEN, zlib.crc32(body))


class _Bad(Exception):
    """Internal: why a line fails to decode (becomes a CorruptLine)."""


def _str(obj: dict[str, object], field: str) -> str:
    value = obj.get(field)
    if type(value) is not str or not value:
        raise _Bad(f"field {field!r} must be a non-empty string, got {value!r}")
    return value


def _int(obj: dict[str, object], field: str) -> int:
    value = obj.get(field)
    if type(value) is not int or value < 1:
        raise _Bad(f"field {field!r} must be a positive integer, got {value!r}")
    return value


def _state(obj: dict[str, object], field: str) -> AttemptState:
    name = obj.get(field)
    state = _STATES.get(name) if type(name) is str else None
    if state is None:
        raise _Bad(f"unknown attempt state {name!r} in field {field!r}")
    return state


def _intent_state(obj: dict[str, object], field: str) -> IntentState:
    name = obj.get(field)
    state = _INTENT_STATES.get(name) if type(name) is str else None
    if state is None:
        raise _Bad(f"unknown intent state {name!r} in field {field!r}")
    return state


_ATTEMPT_KINDS: Final = frozenset({"transition", "created", "result", "intent", "intent_planned"})


def _decode_change(obj: dict[str, object]) -> Change:
    kind = obj.get("type")
    if kind == "run_finished":
        return RunFinished()
    if kind == "run_started":
        return RunStarted(workflow=_str(obj, "workflow"))
    if kind not in _ATTEMPT_KINDS:
        raise _Bad(f"unknown record type {kind!r}")
    # Every other change belongs to an attempt: check its address once.
    step = obj.get("step")
    if type(step) is not str or not step:
        raise _Bad(f"field 'step' must be a non-empty string, got {step!r}")
    attempt = obj.get("attempt")
    if type(attempt) is not int or attempt < 1:
        raise _Bad(f"field 'attempt' must be a positive integer, got {attempt!r}")
    if kind == "transition":
        name = obj.get("cause")
        flag = obj.get("intent_dispatched")
        key: tuple[str, bool | None]
        if name == "Cancel":
            if type(flag) is not bool:
                raise _Bad(f"a Cancel needs a boolean 'intent_dispatched', got {flag!r}")
            key = ("Cancel", flag)
        elif flag is not None or "intent_dispatched" in obj:
            raise _Bad(f"'intent_dispatched' belongs to a Cancel, not to cause {name!r}")
        else:
            key = (name if type(name) is str else "", None)
        cause = _CAUSES.get(key)
        if cause is None:
            raise _Bad(f"unknown cause {name!r} in field 'cause'")
        return AttemptTransitioned(
            step=step,
            attempt=attempt,
            from_state=_state(obj, "from"),
            cause=cause,
            to_state=_state(obj, "to"),
        )
    if kind == "created":
        return AttemptCreated(step=step, attempt=attempt)
    if kind == "result":
        ok = obj.get("ok")
        if ok is True:
            # json.loads yields only JSON values
            return StepResult(step=step, attempt=attempt, value=cast(JSON, obj.get("value")))
        if ok is False:
            return StepResult(step=step, attempt=attempt, error=_str(obj, "error"))
        raise _Bad(f"field 'ok' must be true or false, got {ok!r}")
    if kind == "intent":
        cname = obj.get("cause")
        icause = _INTENT_CAUSES.get(cname) if type(cname) is str else None
        if icause is None:
            raise _Bad(f"unknown intent cause {cname!r} in field 'cause'")
        return IntentChanged(
            step=step,
            attempt=attempt,
            name=_str(obj, "intent"),
            from_state=_intent_state(obj, "from"),
            cause=icause,
            to_state=_intent_state(obj, "to"),
        )
    # kind == "intent_planned", the last of _ATTEMPT_KINDS
    return IntentPlanned(step=step, attempt=attempt, name=_str(obj, "intent"), key=_str(obj, "key"))


_parse = json.JSONDecoder().raw_decode

# The reader builds one Record per line. A frozen dataclass's __init__ pays
# about 100 ns per field to get past its own __setattr__ guard; setting the
# slots through their descriptors builds the same value (a test holds it
# equal to Record(...)) in less than half the time.
_slots = vars(Record)  # the slot descriptors, typed Any
_set_line: Final[Callable[[Record, int], None]] = _slots["line"].__set__
_set_seq: Final[Callable[[Record, int], None]] = _slots["seq"].__set__
_set_time: Final[Callable[[Record, int], None]] = _slots["time_us"].__set__
_set_run: Final[Callable[[Record, str], None]] = _slots["run"].__set__
_set_change: Final[Callable[[Record, Change], None]] = _slots["change"].__set__


def _new_record(line: int, seq: int, time_us: int, run: str, change: Change) -> Record:
    record: Record = object.__new__(Record)
    _set_line(record, line)
    _set_seq(record, seq)
    _set_time(record, time_us)
    _set_run(record, run)
    _set_change(record, change)
    return record


def decode_line(raw: bytes, line: int) -> Record | CorruptLine:
    """Decode one complete line (with its newline) into a record, or say why not."""
    if len(raw) < _TAIL_LEN or raw[-_TAIL_LEN : -_TAIL_LEN + len(_CRC_OPEN)] != _CRC_OPEN:
        return CorruptLine(line=line, reason="no checksum at the end of the line")
    # crc32 of the line with its tail replaced by "}", computed without a copy
    crc = zlib.crc32(b"}", zlib.crc32(memoryview(raw)[:-_TAIL_LEN]))
    # Compared as written (lowercase hex), so that no altered byte goes unseen.
    if raw[-11:] != b'%08x"}\n' % crc:
        return CorruptLine(line=line, reason="checksum mismatch (the line was altered)")
    try:
        text = raw.decode()
        # The whole line parses; a JSON text ending in "}" can only be an object.
        obj: dict[str, object]
        obj, end = _parse(text)
        if end != len(text) - 1:
            raise ValueError("trailing data")
    except (ValueError, RecursionError):
        # RecursionError: pathologically nested brackets must not escape.
        return CorruptLine(line=line, reason="not valid JSON")
    version = obj.get("v")
    if version != SCHEMA_VERSION or type(version) is not int:
        return CorruptLine(
            line=line,
            reason=f"unsupported schema version {version!r} (this reader knows {SCHEMA_VERSION})",
        )
    try:
        seq = _int(obj, "seq")
        stamp = obj.get("time_us")
        if type(stamp) is not int or stamp < 0:
            raise _Bad(f"field 'time_us' must be a non-negative integer, got {stamp!r}")
        return _new_record(line, seq, stamp, _str(obj, "run"), _decode_change(obj))
    except _Bad as bad:
        return CorruptLine(line=line, reason=str(bad))


# --------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------


def _open_for_reading(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")  # noqa: SIM115  # closed by the reader's finally
    except FileNotFoundError:
        raise LogOpenError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LogOpenError(f"{path}: is a directory, not a run log") from None
    except OSError as error:
        raise LogOpenError(f"{path}: cannot open: {error.strerror}") from None


def _rest_is_nul(stream: BinaryIO) -> bool:
    while chunk := stream.read(1 << 16):
        if chunk.strip(b"\x00\n"):
            return False
    return True


def read_log(path: str | os.PathLike[str]) -> Iterator[LogItem]:
    """Yield each line of the log at ``path`` as a `Record` or `CorruptLine`.

    Streams: at most one line (capped at `MAX_LINE_BYTES`) is in memory. An
    unterminated last line, or a tail of NUL bytes, ends the stream with a
    `TornTail`. Raises `LogOpenError` if the file cannot be opened.
    """
    stream = _open_for_reading(Path(path))
    line = 0
    offset = 0
    try:
        while raw := stream.readline(MAX_LINE_BYTES + 1):
            line += 1
            start = offset
            offset += len(raw)
            if not raw.endswith(b"\n"):
                if len(raw) <= MAX_LINE_BYTES:
                    yield TornTail(line=line, offset=start, length=len(raw))
                    return
                # Overlong: skip to the end of the line without keeping it.
                while (more := stream.readline(1 << 16)) and not more.endswith(b"\n"):
                    offset += len(more)
                offset += len(more)
                if not more:
                    yield TornTail(line=line, offset=start, length=offset - start)
                    return
                yield CorruptLine(line=line, reason=f"line longer than {MAX_LINE_BYTES} bytes")
                continue
            if raw[0] == 0 and not raw.strip(b"\x00\n"):
                if _rest_is_nul(stream):
                    size = os.fstat(stream.fileno()).st_size
                    yield TornTail(line=line, offset=start, length=size - start)
                    return
                yield CorruptLine(line=line, reason="a run of NUL bytes inside the log")
                continue
            yield decode_line(raw, line)
    except OSError as error:
        raise LogReadError(f"{path}: reading failed after line {line}: {error.strerror}") from error
    finally:
        stream.close()


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


class RunLog(Protocol):
    """What the executor needs from a run log: append a record, make it durable.

    `RunLogWriter` (a local file) is the embedded default (spec §4); another
    store can serve runs that outgrow one machine by providing these two
    methods with the same promises: `append` returns the record's sequence
    number once the record survives a crash of this process (or raises
    `UnencodableRecord`, writing nothing, for a value JSON cannot carry), and
    after `flush` returns every appended record survives a crash of the
    machine.
    """

    def append(self, run: str, change: Change) -> int: ...

    def flush(self) -> None: ...


def now_us() -> int:
    """The writer's default clock: microseconds since the Unix epoch."""
    return time.time_ns() // 1000


class FileOps(Protocol):
    """The two system calls the writer makes (``os.write`` and ``os.fsync`` by
    default); tests substitute ones that fail."""

    def write(self, fd: int, data: bytes) -> int: ...

    def fsync(self, fd: int) -> None: ...


def _scan_for_append(path: Path) -> tuple[int, TornTail | None]:
    """The last sequence number, and the torn tail if the log ends in one.

    Corruption anywhere is refused: appending after it would bury it.
    """
    last = 0
    for item in read_log(path):
        match item:
            case Record():
                last = item.seq
            case CorruptLine():
                raise LogNeedsRecovery(
                    f"{path}: line {item.line} is corrupt ({item.reason});"
                    " refusing to append after it"
                )
            case TornTail():
                return last, item
            case _:
                assert_never(item)
    return last, None


def _cut_tail(path: Path, fd: int, tail: TornTail) -> Path:
    """Move the torn tail's bytes to a side file, then cut the log before them."""
    side = path.with_name(f"{path.name}.torn-at-{tail.offset}")
    with open(path, "rb") as log:
        log.seek(tail.offset)
        data = log.read()
    # "x": never overwrite an earlier side file (its bytes are evidence too)
    with open(side, "xb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.truncate(fd, tail.offset)
    os.fsync(fd)
    return side


@final
class RunLogWriter:
    """Appends records to a run log; never rewrites what is written.

    Durability: each `append` hands its whole line to the operating system
    (one ``write`` call) before returning, so a returned record survives a
    crash of this process. The file is fsynced once every ``batch_size``
    appends and by `flush` and `close`; after `flush` returns, every returned
    append survives a crash of the machine too. A failed write or fsync
    breaks the writer: it raises `LogWriteFailed` and refuses every later
    append until the log is reopened (a failed fsync is never retried as if
    nothing happened). Only one writer may hold a log (an exclusive lock).

    A log that ends in a torn tail is refused (`LogNeedsRecovery`) unless
    ``cut_torn_tail`` is true, as recovery passes: then, under the lock, the
    tail's bytes are copied to ``<log>.torn-at-<offset>`` (fsynced) and the
    log is cut where the tail began. That cut is the only change ever made
    to bytes already in a log.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = DEFAULT_BATCH,
        clock: Callable[[], int] = now_us,
        ops: FileOps | None = None,
        cut_torn_tail: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.path: Final = Path(path)
        self._batch: Final = batch_size
        self._clock: Final = clock
        # Bound once: the default calls os.write/os.fsync directly, no wrapper.
        self._write: Final = os.write if ops is None else ops.write
        self._fsync: Final = os.fsync if ops is None else ops.fsync
        self._broken: str | None = None
        self._pending = 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise LogOpenError(f"{self.path}: is a directory, not a run log") from None
        except OSError as error:
            raise LogOpenError(f"{self.path}: cannot open for appending: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"{self.path}: another process is writing this log; two writers would"
                " interleave records"
            ) from None
        self.cut: TornTail | None = None
        """The torn tail cut off when opened with ``cut_torn_tail=True``, if any."""
        self.side_file: Path | None = None
        """Where the cut bytes were kept."""
        try:
            self._seq, tail = _scan_for_append(self.path)
            if tail is not None and not cut_torn_tail:
                raise LogNeedsRecovery(
                    f"{self.path}: line {tail.line} is a torn tail (a crash mid-write);"
                    " run `attempt-kernel recover` (it keeps the cut bytes aside) before"
                    " appending"
                )
            if tail is not None:
                self.side_file = _cut_tail(self.path, fd, tail)
                self.cut = tail
        except (RunLogError, OSError) as error:
            os.close(fd)
            if isinstance(error, RunLogError):
                raise
            raise LogWriteFailed(f"{self.path}: cutting the torn tail failed: {error}") from error
        self._fd: int | None = fd

    @property
    def last_seq(self) -> int:
        """The sequence number of the last record in the log (0 when empty)."""
        return self._seq

    def append(self, run: str, change: Change) -> int:
        """Write one record and return its sequence number (see the class doc)."""
        if self._broken is not None:
            raise LogWriteFailed(
                f"{self.path}: the writer failed earlier ({self._broken}); reopen the"
                " log (recovery cuts any torn tail) before appending again"
            )
        if self._fd is None:
            raise LogWriteFailed(f"{self.path}: the writer is closed")
        seq = self._seq + 1
        data = encode_record(seq, self._clock(), run, change)
        try:
            written = self._write(self._fd, data)
            while written < len(data):  # a short write: go on with the rest
                n = self._write(self._fd, data[written:])
                if n <= 0:  # a regular file that takes nothing is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
        except OSError as error:
            self._fail(f"write of record seq {seq}", error)
        self._seq = seq
        self._pending += 1
        if self._pending >= self._batch:
            self.flush()
        return seq

    def flush(self) -> None:
        """fsync: every append that has returned is now durable on disk."""
        if self._fd is None or self._pending == 0:
            return
        if self._broken is not None:
            raise LogWriteFailed(f"{self.path}: the writer failed earlier ({self._broken})")
        try:
            self._fsync(self._fd)
        except OSError as error:
            self._fail(f"fsync after record seq {self._seq}", error)
        self._pending = 0

    def _fail(self, what: str, error: OSError) -> None:
        reason = "the disk is full" if error.errno in (errno.ENOSPC, errno.EFBIG) else error.strerror
        self._broken = f"{what} failed: {reason}"
        raise LogWriteFailed(
            f"{self.path}: {self._broken}; records acknowledged before it stay readable,"
            " and this writer refuses further appends until the log is reopened"
        ) from error

    def close(self) -> None:
        """Flush (if the writer is healthy) and release the log. Idempotent."""
        if self._fd is None:
            return
        try:
            if self._broken is None:
                self.flush()
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
