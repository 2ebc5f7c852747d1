"""The run-log codec: one line of JSON per record, checksummed
(docs/contracts.md, "Append-only and checksummed").

Owns the wire form and nothing else: no file, no lock, no kernel rule. The
format is documented in ``docs/run-log.md``.

One table, `Kind`, holds every record's ``type`` tag; the encoder writes a
change's tag from it and the decoder reads a tag back through it, then
matches on the `Kind` (closed by ``assert_never``). A tag that is not in the
table, or that is not a string at all, is a corruption error that names it;
nothing falls through to a default kind. Names of states and causes go the
same way: exhaustive encoders, and decoding tables built from them.

Decoding is strict JSON: a duplicate key in an object, ``NaN`` or an
infinite number is corruption, even under a valid checksum, because the
writer never produces them.

One limit, `MAX_RECORD_BYTES`, bounds a line on both sides: the encoder
refuses a longer record (`RecordTooLarge`) and the file reader reports a
longer line as corruption, so no record the encoder accepts is refused on
reading.
"""

from __future__ import annotations

import enum
import json
import math
import operator
import re
import threading
import zlib
from collections.abc import Callable, Iterable
from itertools import accumulate, repeat
from typing import Final, NoReturn, cast

from typing_extensions import assert_never, final

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
from ._records import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    CorruptLine,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Record,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    WaitEnded,
    WaitStarted,
)

SCHEMA_VERSION: Final = 1
"""The version written in every record's ``v`` field; the reader accepts only it."""

MAX_RECORD_BYTES: Final = 64 << 20
"""The longest line a run log holds, its newline included: 64 MiB (67,108,864 bytes).

The one limit of both sides: `encode_record` refuses a longer record
(`RecordTooLarge`, so nothing is appended) and the reader reports a longer
line as corruption without loading it whole, so every line the writer
accepts, the reader reads back.

Why 64 MiB: a record must hold an agent's transcript of 16 MiB, and JSON's
escaping (the writer emits ASCII only) makes text, control characters
aside, up to three times longer: a Cyrillic or accented letter (2 bytes of
UTF-8) becomes ``\\uXXXX``, an emoji (4 bytes) two of them. 64 MiB holds
16 MiB of any such text with room to spare. Why no more: the reader holds
at most one line, but decoding it takes a few copies (the bytes, the
checksummed copy, the text, the parsed value), so reading a log's largest
record needs a few times its size in memory, and so does writing it. A
larger value belongs outside the log (a file, an object store), with a
reference to it in the log.
"""

MAX_RECORD_DEPTH: Final = 256
"""How deep a JSON value in a record may nest arrays and objects: 256 levels.

`encode_record` refuses a deeper one (`UnencodableRecord`, nothing
appended). Python's JSON parser recurses once per level, within the
interpreter's recursion limit (1,000 calls by default), so how deep a
reader can parse depends on how deep in its own calls it reads: a web
server's thread, a worker's event loop. Without a limit of its own, the
writer took what its own stack allowed, and a reader deeper in its calls
(or on another Python version) read the same line as corrupt. 256 levels
leave a reader more than 700 calls of its own; a value nested deeper
belongs outside the log, as one too large does.
"""

# A value nested deeper than MAX_RECORD_DEPTH has more opening brackets than
# that, and twice as many brackets in all: only such a line is measured.
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP: Final = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # an opening one +1, a closing one -1


def _nesting(body: bytes) -> int:
    """How deep the JSON text ``body`` nests arrays and objects (brackets in strings aside)."""
    brackets = _STRING.sub(b"", body).translate(_BRACKET_STEP, _NOT_BRACKETS)
    return max(accumulate(map(operator.sub, brackets, repeat(1))), default=0)


# ,"crc":"xxxxxxxx"}\n closes every line; the checksum covers the line with
# that tail replaced by "}" (the record's JSON without its crc field).
_CRC_OPEN: Final = b',"crc":"'
_TAIL_LEN: Final = len(_CRC_OPEN) + 8 + len(b'"}\n')
_CRC_OPEN_END: Final = -_TAIL_LEN + len(_CRC_OPEN)


class RunLogError(AttemptKernelError):
    """A run log cannot be opened, read or written."""


class UnencodableRecord(RunLogError):
    """A record cannot be written: it holds a value that JSON cannot carry, or
    it is too large for the log (`RecordTooLarge`), or, for a PostgreSQL
    journal, a run id, workflow name or domain state holding a NUL or a lone
    surrogate (PostgreSQL keeps those as text). Nothing was written."""


@final
class RecordTooLarge(UnencodableRecord):
    """A record's line would be longer than `MAX_RECORD_BYTES`; nothing was written.

    ``size`` is the line's length in bytes and ``limit`` the limit; ``seq``,
    ``run``, ``record_type`` (its ``type`` tag) and ``step`` (None for a
    run-level record) name the record. The message names them all.
    """

    def __init__(self, *, seq: int, run: str, record_type: str, step: str | None, size: int) -> None:
        where = f"type {record_type!r}" if step is None else f"type {record_type!r}, step {step!r}"
        super().__init__(
            f"record seq {seq} of run {run!r} ({where}) is {size} bytes encoded, over the run"
            f" log's limit of {MAX_RECORD_BYTES} bytes per record (MAX_RECORD_BYTES); nothing"
            " was written. Keep a value this large outside the log (a file, an object store)"
            " and put a reference to it in the log instead"
        )
        self.seq: Final = seq
        self.run: Final = run
        self.record_type: Final = record_type
        self.step: Final = step
        self.size: Final = size
        self.limit: Final = MAX_RECORD_BYTES


# --------------------------------------------------------------------------
# The tag table
# --------------------------------------------------------------------------


@final
class Kind(enum.Enum):
    """Every record ``type`` tag: the one table the encoder and decoder share."""

    RUN_STARTED = "run_started"
    RUN_CANCEL_REQUESTED = "run_cancel_requested"
    RUN_STOP_REQUESTED = "run_stop_requested"
    RUN_RESUMED = "run_resumed"
    STEP_CALLED = "step_called"
    WAIT_STARTED = "wait_started"
    WAIT_ENDED = "wait_ended"
    SIGNAL_SENT = "signal_sent"
    CREATED = "created"
    TRANSITION = "transition"
    INTENT_PLANNED = "intent_planned"
    INTENT = "intent"
    RECONCILED = "reconciled"
    DOMAIN_STATE = "domain_state"
    RESULT = "result"
    RUN_FINISHED = "run_finished"


def kind_of(change: Change) -> Kind:
    """The tag a change is written under."""
    match change:
        case RunStarted():
            return Kind.RUN_STARTED
        case RunCancelRequested():
            return Kind.RUN_CANCEL_REQUESTED
        case RunStopRequested():
            return Kind.RUN_STOP_REQUESTED
        case RunResumed():
            return Kind.RUN_RESUMED
        case StepCalled():
            return Kind.STEP_CALLED
        case WaitStarted():
            return Kind.WAIT_STARTED
        case WaitEnded():
            return Kind.WAIT_ENDED
        case SignalSent():
            return Kind.SIGNAL_SENT
        case AttemptCreated():
            return Kind.CREATED
        case AttemptTransitioned():
            return Kind.TRANSITION
        case IntentPlanned():
            return Kind.INTENT_PLANNED
        case IntentChanged():
            return Kind.INTENT
        case IntentReconciled():
            return Kind.RECONCILED
        case DomainStateSet():
            return Kind.DOMAIN_STATE
        case StepResult():
            return Kind.RESULT
        case RunFinished():
            return Kind.RUN_FINISHED
        case _:
            assert_never(change)


_KIND_BY_TAG: Final[dict[str, Kind]] = {k.value: k for k in Kind}

# --------------------------------------------------------------------------
# Names of states and causes, exhaustive in both directions
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


def _flag(cause: TransitionCause) -> bool | None:
    match cause:
        case Cancel():
            return cause.intent_dispatched
        case Admit() | Succeed() | Fail() | QueueDeadlinePassed() | StepDeadlinePassed():
            return None
        case _:
            assert_never(cause)


# Decoding tables, built from the encoders above (never written by hand).
_STATES: Final[dict[str, AttemptState]] = {state_name(s): s for s in ALL_STATES}
_CAUSES: Final[dict[tuple[str, bool | None], TransitionCause]] = {
    (cause_name(c), _flag(c)): c for c in ALL_CAUSES
}
# The causes without a flag, by name: a transition's common case, one lookup.
_PLAIN_CAUSES: Final[dict[str, TransitionCause]] = {
    name: c for (name, flag), c in _CAUSES.items() if flag is None
}
_INTENT_STATES: Final[dict[str, IntentState]] = {
    intent_state_name(s): s for s in ALL_INTENT_STATES
}
_INTENT_CAUSES: Final[dict[str, IntentCause]] = {
    intent_cause_name(c): c for c in ALL_INTENT_CAUSES
}

# --------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------

# Strings are escaped by the json module's own C escaper; the rest of each
# line is a fixed template. This writes byte for byte what
# json.dumps(fields, separators=(",", ":")) writes (a test holds it to that),
# at a third of the cost, which matters because encoding is most of an
# append's CPU time.
_q: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
_dumps: Final = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
# The C encoder `json.dumps` builds for every value (not in typeshed; None in
# a Python built without the json accelerator).
_make_encoder: Final[Callable[..., Callable[[object, int], Iterable[str]]] | None] = getattr(
    json.encoder, "c_make_encoder", None
)
_json_encoders: Final = threading.local()


def json_text(value: object) -> str:
    """``value`` as a record writes it; raises what `encode_record` turns into
    `UnencodableRecord` (TypeError, ValueError, RecursionError): for a caller that
    checks a value before it builds a record (an operator's payload)."""
    return _value(value)


def _value(value: object) -> str:
    """``_dumps(value)``, byte for byte, at a fraction of its cost for the values
    records carry (a step's result, an effect's, a run's input and result).

    ``JSONEncoder.encode`` builds the C encoder anew for every value that is
    not a string; this keeps one per thread (with its own dict of the
    containers being encoded, which is what finds a circular reference, and
    which an error can leave unemptied: it is then cleared).
    """
    if value is None:
        return "null"
    if type(value) not in _SCALARS:
        _no_colliding_keys(value)
    if _make_encoder is None:
        return _dumps(value)
    encode: Callable[[object, int], Iterable[str]] | None = getattr(_json_encoders, "encode", None)
    if encode is None:
        markers: dict[int, object] = {}
        encode = _make_encoder(markers, _refuse, _q, None, ":", ",", False, False, False)
        _json_encoders.encode, _json_encoders.markers = encode, markers
    try:
        return "".join(encode(value, 0))
    except BaseException:
        _json_encoders.markers.clear()
        raise


def _key_text(key: object) -> object:
    """The string JSON makes of a dict's key (what the C encoder writes); any
    other key is returned as it is (the encoder refuses it)."""
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, float):  # a float or a subclass of it, as the encoder writes them
        return float.__repr__(key)
    if isinstance(key, int):
        return int.__repr__(key)
    return key


def _no_colliding_keys(value: object) -> None:
    """Raise ValueError if an object inside ``value`` has two keys that JSON writes
    as the same string (``1`` and ``"1"``, ``True`` and ``"true"``): the line
    would hold a duplicate key, which the reader refuses as corruption.

    Walks with a list, not recursion (a value too deep for the encoder is
    walked, then refused by it); a container met twice is walked once (the
    encoder refuses a circular one). Linear in the value's size.
    """
    todo: list[object] = [value]
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            mapping = cast("dict[object, object]", item)
            if not all(type(k) is str for k in mapping):
                _distinct_keys(mapping)
            todo.extend(v for v in mapping.values() if type(v) not in _SCALARS)
        elif isinstance(item, (list, tuple)):
            todo.extend(v for v in cast("list[object]", item) if type(v) not in _SCALARS)


def _distinct_keys(mapping: dict[object, object]) -> None:
    """ValueError naming the first two keys of ``mapping`` that JSON writes alike."""
    first: dict[object, object] = {}
    for key in mapping:
        text = _key_text(key)
        if isinstance(key, float) and not math.isfinite(key):
            continue  # no JSON key at all: the encoder refuses it, saying so
        twin = first.setdefault(text, key)
        if twin is not key:
            raise ValueError(
                f"an object has keys {twin!r} and {key!r}, which JSON writes as the same key"
                f" {text!r}; a log line cannot hold a key twice"
            )


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _refuse(value: object) -> object:
    """What the encoder calls for a value JSON has no form for: the error `json.dumps` raises."""
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

# Names and tags by class, taken from the exhaustive encoders above: a dict
# lookup is cheaper than walking a match's class patterns on every append.
_STATE_NAME: Final = {type(s): state_name(s) for s in ALL_STATES}
_INTENT_STATE_NAME: Final = {type(s): intent_state_name(s) for s in ALL_INTENT_STATES}
_INTENT_CAUSE_NAME: Final = {type(c): intent_cause_name(c) for c in ALL_INTENT_CAUSES}
_CAUSE_JSON: Final = {
    (type(c), _flag(c)): f'"{cause_name(c)}"'
    + ("" if _flag(c) is None else f',"intent_dispatched":{"true" if _flag(c) else "false"}')
    for c in ALL_CAUSES
}
_PLAIN_CAUSE_JSON: Final = {type(c): _CAUSE_JSON[type(c), None] for c in ALL_CAUSES if _flag(c) is None}
"""`_CAUSE_JSON` of the causes that carry no flag, by class alone (one lookup, no `_flag` call)."""
_T_STARTED: Final = Kind.RUN_STARTED.value
_T_CANCEL: Final = Kind.RUN_CANCEL_REQUESTED.value
_T_CREATED: Final = Kind.CREATED.value
_T_TRANSITION: Final = Kind.TRANSITION.value
_T_PLANNED: Final = Kind.INTENT_PLANNED.value
_T_INTENT: Final = Kind.INTENT.value
_T_RESULT: Final = Kind.RESULT.value
_T_FINISHED: Final = Kind.RUN_FINISHED.value
_T_STOP: Final = Kind.RUN_STOP_REQUESTED.value
_T_RESUMED: Final = Kind.RUN_RESUMED.value
_T_RECONCILED: Final = Kind.RECONCILED.value
_T_DOMAIN: Final = Kind.DOMAIN_STATE.value
_T_CALLED: Final = Kind.STEP_CALLED.value
_T_WAIT_STARTED: Final = Kind.WAIT_STARTED.value
_T_WAIT_ENDED: Final = Kind.WAIT_ENDED.value
_T_SIGNAL: Final = Kind.SIGNAL_SENT.value


def _change_json(change: Change) -> str:
    # Arms in the order of how often each change is written.
    match change:
        case AttemptTransitioned():
            cause = change.cause
            return (
                f',"type":"{_T_TRANSITION}","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"from":"{_STATE_NAME[type(change.from_state)]}"'
                f',"cause":{_PLAIN_CAUSE_JSON.get(type(cause)) or _CAUSE_JSON[type(cause), _flag(cause)]}'
                f',"to":"{_STATE_NAME[type(change.to_state)]}"}}'
            )
        case AttemptCreated():
            return f',"type":"{_T_CREATED}","step":{_q(change.step)},"attempt":{change.attempt:d}}}'
        case StepResult():
            head = f',"type":"{_T_RESULT}","step":{_q(change.step)},"attempt":{change.attempt:d}'
            if change.error is None:
                return f'{head},"ok":true,"value":{_value(change.value)}}}'
            if not change.retryable:  # written only when false: older logs hold no such field
                return f'{head},"ok":false,"error":{_q(change.error)},"retry":false}}'
            return f'{head},"ok":false,"error":{_q(change.error)}}}'
        case StepCalled():
            return (
                f',"type":"{_T_CALLED}","step":{_q(change.step)},"position":{change.position:d}'
                f',"name":{_q(change.name)},"digest":{_q(change.digest)}}}'
            )
        case IntentChanged():
            body = (
                f',"type":"{_T_INTENT}","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"intent":{_q(change.name)}'
                f',"from":"{_INTENT_STATE_NAME[type(change.from_state)]}"'
                f',"cause":"{_INTENT_CAUSE_NAME[type(change.cause)]}"'
                f',"to":"{_INTENT_STATE_NAME[type(change.to_state)]}"'
            )
            if change.result is None:
                return body + "}"
            return f'{body},"result":{_value(change.result)}}}'
        case IntentReconciled():
            body = (
                f',"type":"{_T_RECONCILED}","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"intent":{_q(change.name)},"key":{_q(change.key)}'
                f',"from":"{_INTENT_STATE_NAME[type(change.from_state)]}"'
                f',"cause":"{_INTENT_CAUSE_NAME[type(change.cause)]}"'
                f',"to":"{_INTENT_STATE_NAME[type(change.to_state)]}"'
                f',"by":{_q(change.by)},"note":{_q(change.note)}'
            )
            if change.result is None:
                return body + "}"
            return f'{body},"result":{_value(change.result)}}}'
        case DomainStateSet():
            return (
                f',"type":"{_T_DOMAIN}","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"state":{_q(change.state)}}}'
            )
        case IntentPlanned():
            return (
                f',"type":"{_T_PLANNED}","step":{_q(change.step)},"attempt":{change.attempt:d}'
                f',"intent":{_q(change.name)},"key":{_q(change.key)}}}'
            )
        case WaitStarted():
            body = f',"type":"{_T_WAIT_STARTED}","position":{change.position:d}'
            if change.signal is not None:
                body += f',"signal":{_q(change.signal)}'
            if change.wake_us is not None:
                body += f',"wake_us":{change.wake_us:d}'
            return body + "}"
        case WaitEnded():
            if change.signal is None:
                return f',"type":"{_T_WAIT_ENDED}","position":{change.position:d}}}'
            return (
                f',"type":"{_T_WAIT_ENDED}","position":{change.position:d}'
                f',"signal":{change.signal:d}}}'
            )
        case SignalSent():
            return (
                f',"type":"{_T_SIGNAL}","name":{_q(change.name)},"id":{_q(change.id)}'
                f',"payload":{_value(change.payload)}}}'
            )
        case RunStarted():
            head = f',"type":"{_T_STARTED}","workflow":{_q(change.workflow)}'
            if change.domain_states:
                head += f',"domain_states":[{",".join(_q(n) for n in change.domain_states)}]'
            if change.version:
                head += f',"version":{_q(change.version)}'
            if change.nonce:
                head += f',"nonce":{_q(change.nonce)}'
            if change.code:
                head += ',"code":true'
            if change.input is None:
                return head + "}"
            return f'{head},"input":{_value(change.input)}}}'
        case RunStopRequested():
            return f',"type":"{_T_STOP}","reason":{_q(change.reason)}}}'
        case RunResumed():
            return f',"type":"{_T_RESUMED}"}}'
        case RunCancelRequested():
            return f',"type":"{_T_CANCEL}","reason":{_q(change.reason)}}}'
        case RunFinished():
            if change.error is not None:
                return f',"type":"{_T_FINISHED}","ok":false,"error":{_q(change.error)}}}'
            if change.result is not None:
                return f',"type":"{_T_FINISHED}","ok":true,"result":{_value(change.result)}}}'
            return f',"type":"{_T_FINISHED}"}}'
        case _:
            assert_never(change)


def _step_of(change: Change) -> str | None:
    """The step a change belongs to; None for a run-level change."""
    match change:
        case (
            AttemptCreated() | AttemptTransitioned() | IntentPlanned() | IntentChanged()
            | IntentReconciled() | DomainStateSet() | StepResult() | StepCalled()
        ):  # fmt: skip
            return change.step
        case (
            RunStarted() | RunCancelRequested() | RunStopRequested() | RunResumed() | RunFinished()
            | WaitStarted() | WaitEnded() | SignalSent()
        ):  # fmt: skip
            return None
        case _:
            assert_never(change)


def encode_record(seq: int, time_us: int, run: str, change: Change) -> bytes:
    """One complete line (ending in a newline) for the record.

    Raises `UnencodableRecord` if a value cannot be written as strict JSON
    (a set, an object, NaN, ...), and its subclass `RecordTooLarge` if the
    line would be longer than `MAX_RECORD_BYTES`: the reader would refuse it.
    """
    if not run:  # the reader refuses a line whose run is empty
        raise UnencodableRecord(f"record seq {seq} cannot be written: its run id is empty")
    try:
        body = (
            f'{{"v":{SCHEMA_VERSION},"seq":{seq:d},"time_us":{time_us:d},"run":{_q(run)}'
            + _change_json(change)
        ).encode()
    except (TypeError, ValueError, RecursionError) as error:
        raise UnencodableRecord(
            f"record seq {seq} of run {run!r} cannot be written as JSON: {error}"
        ) from None
    # docs/run-log.md: a record the writer accepts, the reader accepts, from any
    # depth of its own calls. The record's own object is one level.
    if (
        len(body) > 2 * MAX_RECORD_DEPTH
        and body.count(b"[") + body.count(b"{") > MAX_RECORD_DEPTH
        and _nesting(body) > MAX_RECORD_DEPTH + 1
    ):
        raise UnencodableRecord(
            f"record seq {seq} of run {run!r} cannot be written: a JSON value in it is nested deeper"
            f" than {MAX_RECORD_DEPTH} levels of arrays and objects (MAX_RECORD_DEPTH), which not every"
            " reader could parse back"
        )
    # The line is the body with its closing "}" replaced by the checksum's tail.
    size = len(body) - 1 + _TAIL_LEN
    if size > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            seq=seq, run=run, record_type=kind_of(change).value, step=_step_of(change), size=size
        )
    return b'%s%s%08x"}\n' % (body[:-1], _CRC_OPEN, zlib.crc32(body))


# --------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------


class _Bad(Exception):
    """Internal: why a line fails to decode (becomes a CorruptLine)."""


def _str(obj: dict[str, object], field: str) -> str:
    value = obj.get(field)
    if type(value) is str and value:
        return value
    raise _Bad(f"field {field!r} must be a non-empty string, got {_shown(value)}")


def _int(obj: dict[str, object], field: str) -> int:
    value = obj.get(field)
    if type(value) is int and value > 0:
        return value
    raise _Bad(f"field {field!r} must be a positive integer, got {_shown(value)}")


def _shown(value: object) -> str:
    """A value from a bad line, for an error message: repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(obj: dict[str, object], field: str) -> str | None:
    value = obj.get(field)
    return value if type(value) is str else None


def _state(obj: dict[str, object], field: str) -> AttemptState:
    name = obj.get(field)
    state = _STATES.get(name) if type(name) is str else None
    if state is None:
        raise _Bad(f"unknown attempt state {_shown(obj.get(field))} in field {field!r}")
    return state


def _intent_state(obj: dict[str, object], field: str) -> IntentState:
    name = _name(obj, field)
    state = None if name is None else _INTENT_STATES.get(name)
    if state is None:
        raise _Bad(f"unknown intent state {_shown(obj.get(field))} in field {field!r}")
    return state


def _text(obj: dict[str, object], field: str) -> str:
    """An optional free-text field (empty when absent)."""
    value = obj.get(field, "")
    if type(value) is not str:
        raise _Bad(f"field {field!r} must be a string, got {_shown(value)}")
    return value


def _names(obj: dict[str, object], field: str) -> tuple[str, ...]:
    """An optional list of non-empty strings (empty when absent)."""
    value: object = obj.get(field, [])
    names = cast("list[object]", value) if type(value) is list else None
    if names is None or not all(type(n) is str and n for n in names):
        raise _Bad(f"field {field!r} must be a list of non-empty strings, got {_shown(obj.get(field))}")
    return tuple(cast("list[str]", names))


def _intent_cause(obj: dict[str, object]) -> IntentCause:
    name = obj.get("cause")
    cause = _INTENT_CAUSES.get(name) if type(name) is str else None
    if cause is None:
        raise _Bad(f"unknown intent cause {_shown(name)} in field 'cause'")
    return cause


def _cause(obj: dict[str, object]) -> TransitionCause:
    name = _name(obj, "cause")
    if name == "Cancel":
        flag = obj.get("intent_dispatched")
        if type(flag) is not bool:
            raise _Bad(f"a Cancel needs a boolean 'intent_dispatched', got {_shown(flag)}")
        key: tuple[str, bool | None] = ("Cancel", flag)
    elif "intent_dispatched" in obj:
        raise _Bad(f"'intent_dispatched' belongs to a Cancel, not to cause {_shown(obj.get('cause'))}")
    else:
        key = ("" if name is None else name, None)
    cause = _CAUSES.get(key)
    if cause is None:
        raise _Bad(f"unknown cause {_shown(obj.get('cause'))} in field 'cause'")
    return cause


def _decode_change(obj: dict[str, object]) -> Change:
    tag = obj.get("type")
    kind = _KIND_BY_TAG.get(tag) if type(tag) is str else None
    if kind is None:
        raise _Bad(f"unknown record type {_shown(obj.get('type'))} in field 'type'")
    # Arms in the order of how often each kind occurs in a log.
    match kind:
        case Kind.TRANSITION:
            # The common case without a helper call per field; any field in
            # doubt goes through the helpers, which name what is wrong.
            step, attempt, before, after = obj.get("step"), obj.get("attempt"), obj.get("from"), obj.get("to")
            from_state = _STATES.get(before) if type(before) is str else None
            to_state = _STATES.get(after) if type(after) is str else None
            if (
                type(step) is str and step and type(attempt) is int and attempt > 0
                and from_state is not None and to_state is not None
            ):  # fmt: skip
                # A cause without a flag is one lookup; a Cancel (or a stray
                # flag) goes through _cause, which checks the pair.
                name = obj.get("cause")
                cause = (
                    _PLAIN_CAUSES.get(name)
                    if type(name) is str and "intent_dispatched" not in obj
                    else None
                )
                return new_transition(
                    step, attempt, from_state, _cause(obj) if cause is None else cause, to_state
                )
            return new_transition(
                _str(obj, "step"),
                _int(obj, "attempt"),
                _state(obj, "from"),
                _cause(obj),
                _state(obj, "to"),
            )
        case Kind.CREATED:
            step, attempt = obj.get("step"), obj.get("attempt")
            if type(step) is str and step and type(attempt) is int and attempt > 0:
                return new_created(step, attempt)
            return new_created(_str(obj, "step"), _int(obj, "attempt"))
        case Kind.RESULT:
            step, attempt = obj.get("step"), obj.get("attempt")
            if not (type(step) is str and step and type(attempt) is int and attempt > 0):
                step, attempt = _str(obj, "step"), _int(obj, "attempt")  # raise, naming the field
            ok = obj.get("ok")
            if ok is True:
                if "retry" in obj:
                    raise _Bad("field 'retry' belongs to a result with ok false")
                return new_result(step, attempt, cast(JSON, obj.get("value")), None)
            if ok is False:
                retry = obj.get("retry", True)
                if type(retry) is not bool:
                    raise _Bad(f"field 'retry' must be true or false, got {_shown(retry)}")
                return new_result(step, attempt, None, _str(obj, "error"), retry)
            raise _Bad(f"field 'ok' must be true or false, got {_shown(ok)}")
        case Kind.STEP_CALLED:
            step, position, name, digest = obj.get("step"), obj.get("position"), obj.get("name"), obj.get("digest")
            if (
                type(step) is str and step and type(position) is int and position > 0
                and type(name) is str and name and type(digest) is str and digest
            ):  # fmt: skip
                return new_called(step, position, name, digest)
            return StepCalled(
                step=_str(obj, "step"),
                position=_int(obj, "position"),
                name=_str(obj, "name"),
                digest=_str(obj, "digest"),
            )
        case Kind.INTENT:
            step, attempt, name = obj.get("step"), obj.get("attempt"), obj.get("intent")
            before, cause_name, after = obj.get("from"), obj.get("cause"), obj.get("to")
            from_intent = _INTENT_STATES.get(before) if type(before) is str else None
            to_intent = _INTENT_STATES.get(after) if type(after) is str else None
            intent_cause = _INTENT_CAUSES.get(cause_name) if type(cause_name) is str else None
            if (
                type(step) is str and step and type(attempt) is int and attempt > 0
                and type(name) is str and name and from_intent is not None
                and to_intent is not None and intent_cause is not None
            ):  # fmt: skip
                return new_intent(
                    step, attempt, name, from_intent, intent_cause, to_intent, cast(JSON, obj.get("result"))
                )
            return IntentChanged(
                step=_str(obj, "step"),
                attempt=_int(obj, "attempt"),
                name=_str(obj, "intent"),
                from_state=_intent_state(obj, "from"),
                cause=_intent_cause(obj),
                to_state=_intent_state(obj, "to"),
                result=cast(JSON, obj.get("result")),
            )
        case Kind.INTENT_PLANNED:
            return IntentPlanned(
                step=_str(obj, "step"),
                attempt=_int(obj, "attempt"),
                name=_str(obj, "intent"),
                key=_str(obj, "key"),
            )
        case Kind.DOMAIN_STATE:
            return DomainStateSet(
                step=_str(obj, "step"), attempt=_int(obj, "attempt"), state=_str(obj, "state")
            )
        case Kind.RECONCILED:
            return IntentReconciled(
                step=_str(obj, "step"),
                attempt=_int(obj, "attempt"),
                name=_str(obj, "intent"),
                key=_str(obj, "key"),
                from_state=_intent_state(obj, "from"),
                cause=_intent_cause(obj),
                to_state=_intent_state(obj, "to"),
                result=cast(JSON, obj.get("result")),
                by=_str(obj, "by"),
                note=_text(obj, "note"),
            )
        case Kind.RUN_STARTED:
            code = obj.get("code", False)
            if type(code) is not bool:
                raise _Bad(f"field 'code' must be true or false, got {_shown(code)}")
            return RunStarted(
                workflow=_str(obj, "workflow"),
                input=cast(JSON, obj.get("input")),  # json.loads yields only JSON values
                domain_states=_names(obj, "domain_states"),
                version=_text(obj, "version"),
                nonce=_text(obj, "nonce"),
                code=code,
            )
        case Kind.WAIT_STARTED:
            signal = obj.get("signal")
            if signal is not None:
                signal = _str(obj, "signal")
            wake = obj.get("wake_us")
            if wake is not None and (type(wake) is not int or wake < 0):
                raise _Bad(f"field 'wake_us' must be a non-negative integer, got {_shown(wake)}")
            if signal is None and wake is None:
                raise _Bad("a wait_started needs field 'signal' or 'wake_us' (a sleep has a wake time)")
            return WaitStarted(position=_int(obj, "position"), signal=signal, wake_us=wake)
        case Kind.WAIT_ENDED:
            number = None if obj.get("signal") is None else _int(obj, "signal")
            return WaitEnded(position=_int(obj, "position"), signal=number)
        case Kind.SIGNAL_SENT:
            payload = cast(JSON, obj.get("payload"))
            if payload is None:
                raise _Bad("field 'payload' of a signal_sent must be a JSON value other than null")
            return SignalSent(name=_str(obj, "name"), payload=payload, id=_str(obj, "id"))
        case Kind.RUN_FINISHED:
            ok = obj.get("ok")
            if ok is None:
                if "result" in obj or "error" in obj:
                    raise _Bad("a run_finished with a 'result' or an 'error' needs field 'ok'")
                return RunFinished()
            if ok is True:
                if "error" in obj:
                    raise _Bad("a run_finished with 'ok': true has no 'error'")
                return RunFinished(result=cast(JSON, obj.get("result")))
            if ok is False:
                if "result" in obj:
                    raise _Bad("a run_finished with 'ok': false has no 'result'")
                return RunFinished(error=_str(obj, "error"))
            raise _Bad(f"field 'ok' must be true or false, got {_shown(ok)}")
        case Kind.RUN_RESUMED:
            return RunResumed()
        case Kind.RUN_CANCEL_REQUESTED:
            return RunCancelRequested(reason=_text(obj, "reason"))
        case Kind.RUN_STOP_REQUESTED:
            return RunStopRequested(reason=_text(obj, "reason"))
        case _:
            assert_never(kind)


class _NotStrict(ValueError):
    """Internal: valid JSON to Python's parser, but not strict JSON."""


def _no_constant(name: str) -> NoReturn:
    raise _NotStrict(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _NotStrict(f"{text} overflows to infinity")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotStrict(f"duplicate key {_shown(key)} in an object")
            seen.add(key)
    return obj


# Strict JSON. NaN/Infinity and floats go through hooks (rare in records).
# Duplicate keys: checking every object with object_pairs_hook costs a
# Python call per object, a quarter of replay's time; instead a line is
# parsed with plain dicts and its keys counted. Every key ends in '":' in
# the text, so the text holds at least as many '":' as the parsed objects
# hold keys, and exactly as many only when no key is repeated (a repeat
# loses a key) and no string holds '\":' (which adds one). Any other count
# parses the line again with the pair hook, which decides.
_parse: Final = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite).raw_decode
_parse_checking_keys: Final = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite
).raw_decode


def _keys_in(value: object) -> int:
    """How many keys the objects nested in a parsed JSON ``value`` hold."""
    if type(value) is dict:
        obj = cast("dict[str, object]", value)
        n = len(obj)
        items: Iterable[object] = obj.values()
    elif type(value) is list:
        n, items = 0, cast("list[object]", value)
    else:
        return 0
    for item in items:
        n += _keys_in(item)
    return n


# The reader builds one Record per line, and most lines carry a transition
# or a creation. A frozen dataclass's __init__ pays about 100 ns per field to
# get past its own __setattr__ guard; setting the slots through their
# descriptors builds the same value (a test holds each equal to the class
# called as usual) in less than half the time.
_slots = vars(Record)  # the slot descriptors, typed Any
_set_line: Final[Callable[[Record, int], None]] = _slots["line"].__set__
_set_seq: Final[Callable[[Record, int], None]] = _slots["seq"].__set__
_set_time: Final[Callable[[Record, int], None]] = _slots["time_us"].__set__
_set_run: Final[Callable[[Record, str], None]] = _slots["run"].__set__
_set_change: Final[Callable[[Record, Change], None]] = _slots["change"].__set__


_transition_slots = vars(AttemptTransitioned)
_set_t_step: Final[Callable[[AttemptTransitioned, str], None]] = _transition_slots["step"].__set__
_set_t_attempt: Final[Callable[[AttemptTransitioned, int], None]] = _transition_slots["attempt"].__set__
_set_t_from: Final[Callable[[AttemptTransitioned, AttemptState], None]] = _transition_slots["from_state"].__set__
_set_t_cause: Final[Callable[[AttemptTransitioned, TransitionCause], None]] = _transition_slots["cause"].__set__
_set_t_to: Final[Callable[[AttemptTransitioned, AttemptState], None]] = _transition_slots["to_state"].__set__
_created_slots = vars(AttemptCreated)
_set_c_step: Final[Callable[[AttemptCreated, str], None]] = _created_slots["step"].__set__
_set_c_attempt: Final[Callable[[AttemptCreated, int], None]] = _created_slots["attempt"].__set__
_result_slots = vars(StepResult)
_set_r_step: Final[Callable[[StepResult, str], None]] = _result_slots["step"].__set__
_set_r_attempt: Final[Callable[[StepResult, int], None]] = _result_slots["attempt"].__set__
_set_r_value: Final[Callable[[StepResult, JSON], None]] = _result_slots["value"].__set__
_set_r_error: Final[Callable[[StepResult, str | None], None]] = _result_slots["error"].__set__
_set_r_retryable: Final[Callable[[StepResult, bool], None]] = _result_slots["retryable"].__set__


def new_transition(
    step: str, attempt: int, from_state: AttemptState, cause: TransitionCause, to_state: AttemptState
) -> AttemptTransitioned:
    """``AttemptTransitioned(...)`` at less than half the cost (the reader's, and the ledger's at every move)."""
    change: AttemptTransitioned = object.__new__(AttemptTransitioned)
    _set_t_step(change, step)
    _set_t_attempt(change, attempt)
    _set_t_from(change, from_state)
    _set_t_cause(change, cause)
    _set_t_to(change, to_state)
    return change


def new_created(step: str, attempt: int) -> AttemptCreated:
    """``AttemptCreated(step=step, attempt=attempt)``, built as `new_transition` is."""
    change: AttemptCreated = object.__new__(AttemptCreated)
    _set_c_step(change, step)
    _set_c_attempt(change, attempt)
    return change


def new_result(
    step: str, attempt: int, value: JSON, error: str | None, retryable: bool = True
) -> StepResult:
    """``StepResult(...)``, built as `new_transition` is."""
    change: StepResult = object.__new__(StepResult)
    _set_r_step(change, step)
    _set_r_attempt(change, attempt)
    _set_r_value(change, value)
    _set_r_error(change, error)
    _set_r_retryable(change, retryable)
    return change


_called_slots = vars(StepCalled)
_set_s_step: Final[Callable[[StepCalled, str], None]] = _called_slots["step"].__set__
_set_s_position: Final[Callable[[StepCalled, int], None]] = _called_slots["position"].__set__
_set_s_name: Final[Callable[[StepCalled, str], None]] = _called_slots["name"].__set__
_set_s_digest: Final[Callable[[StepCalled, str], None]] = _called_slots["digest"].__set__
_intent_slots = vars(IntentChanged)
_set_i_step: Final[Callable[[IntentChanged, str], None]] = _intent_slots["step"].__set__
_set_i_attempt: Final[Callable[[IntentChanged, int], None]] = _intent_slots["attempt"].__set__
_set_i_name: Final[Callable[[IntentChanged, str], None]] = _intent_slots["name"].__set__
_set_i_from: Final[Callable[[IntentChanged, IntentState], None]] = _intent_slots["from_state"].__set__
_set_i_cause: Final[Callable[[IntentChanged, IntentCause], None]] = _intent_slots["cause"].__set__
_set_i_to: Final[Callable[[IntentChanged, IntentState], None]] = _intent_slots["to_state"].__set__
_set_i_result: Final[Callable[[IntentChanged, JSON], None]] = _intent_slots["result"].__set__


def new_called(step: str, position: int, name: str, digest: str) -> StepCalled:
    """``StepCalled(step=step, position=position, name=name, digest=digest)``, built
    at less than half the cost (the reader's, and a code run's, at every call)."""
    change: StepCalled = object.__new__(StepCalled)
    _set_s_step(change, step)
    _set_s_position(change, position)
    _set_s_name(change, name)
    _set_s_digest(change, digest)
    return change


def new_intent(
    step: str, attempt: int, name: str, from_state: IntentState, cause: IntentCause,
    to_state: IntentState, result: JSON,
) -> IntentChanged:  # fmt: skip
    change: IntentChanged = object.__new__(IntentChanged)
    _set_i_step(change, step)
    _set_i_attempt(change, attempt)
    _set_i_name(change, name)
    _set_i_from(change, from_state)
    _set_i_cause(change, cause)
    _set_i_to(change, to_state)
    _set_i_result(change, result)
    return change


def _new_record(line: int, seq: int, time_us: int, run: str, change: Change) -> Record:
    record: Record = object.__new__(Record)
    _set_line(record, line)
    _set_seq(record, seq)
    _set_time(record, time_us)
    _set_run(record, run)
    _set_change(record, change)
    return record


def strict_json(text: str) -> JSON:
    """A value an operator typed, as strict JSON: `json.JSONDecodeError` where it does not
    parse, `ValueError` for NaN and Infinity (no record could carry them), as the decoder refuses them."""
    value: JSON = json.loads(text, parse_constant=_no_constant)
    return value


def decode_line(raw: bytes, line: int) -> Record | CorruptLine:
    """Decode one complete line (with its newline) into a record, or say why not."""
    if len(raw) < _TAIL_LEN or raw[-_TAIL_LEN:_CRC_OPEN_END] != _CRC_OPEN:
        return CorruptLine(line=line, reason="no checksum at the end of the line")
    # crc32 of the line with its tail replaced by "}". One copy of the line
    # (at most MAX_RECORD_BYTES) is cheaper than a memoryview and two calls.
    crc = zlib.crc32(raw[:-_TAIL_LEN] + b"}")
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
        keys = raw.count(b'":')
        if keys != len(obj):
            nested = obj.get("value")
            if nested is None:
                nested = obj.get("input")
            if nested is None:
                nested = obj.get("result")
            if keys != len(obj) + _keys_in(nested):
                obj, end = _parse_checking_keys(text)
    except _NotStrict as error:
        return CorruptLine(line=line, reason=f"not strict JSON: {error}")
    except RecursionError:  # pathologically nested brackets must not escape
        return CorruptLine(
            line=line,
            reason=f"nested deeper than this reader can parse (the writer takes at most {MAX_RECORD_DEPTH} levels)",
        )
    except ValueError:
        return CorruptLine(line=line, reason="not valid JSON")
    version = obj.get("v")
    if version != SCHEMA_VERSION or type(version) is not int:
        return CorruptLine(
            line=line,
            reason=f"unsupported schema version {_shown(version)} (this reader knows {SCHEMA_VERSION})",
        )
    seq, stamp, run = obj.get("seq"), obj.get("time_us"), obj.get("run")
    try:
        if not (type(seq) is int and seq > 0):
            seq = _int(obj, "seq")  # raises, naming the field
        if not (type(stamp) is int and stamp >= 0):
            raise _Bad(f"field 'time_us' must be a non-negative integer, got {_shown(stamp)}")
        if not (type(run) is str and run):
            run = _str(obj, "run")  # raises, naming the field
        return _new_record(line, seq, stamp, run, _decode_change(obj))
    except _Bad as bad:
        return CorruptLine(line=line, reason=str(bad))
