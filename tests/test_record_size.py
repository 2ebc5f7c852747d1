"""The record size limit: a record the writer accepts, the reader accepts.

A value too large for the log is refused when it is written, with an error
naming its size and the limit, and nothing is appended; no valid write can
make a log unreadable. The limit is 64 MiB a line, its newline included.
"""

from __future__ import annotations

import asyncio
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pgtools import sql_in

from attempt_kernel import (
    JSON,
    MAX_RECORD_BYTES,
    AttemptCreated,
    Change,
    Confirm,
    Confirmed,
    CorruptLine,
    Dispatched,
    Executor,
    Failed,
    IntentChanged,
    IntentReconciled,
    Job,
    Record,
    RecordTooLarge,
    RunFinished,
    RunLogWriter,
    RunStarted,
    Step,
    StepContext,
    StepResult,
    Succeeded,
    TornTail,
    UnencodableRecord,
    Workflow,
    load_workflow,
    read_log,
    recover_log,
    replay,
    run_jobs,
)
from attempt_kernel.cli._main import main
from attempt_kernel._codec import decode_line, encode_record
from attempt_kernel.postgres._journal import PgJournal

MIB = 1 << 20
LIMIT = 67_108_864
"""64 MiB, written out by hand: what `MAX_RECORD_BYTES` must be."""


def constant_clock() -> int:
    """Every record's ``time_us`` is 1, so a line's length is known in advance."""
    return 1


def records(path: Path) -> list[Record]:
    return [item for item in read_log(path) if isinstance(item, Record)]


def longest_line(path: Path) -> int:
    """The length of the file's longest line, its newline included (streamed)."""
    longest = 0
    with open(path, "rb") as stream:
        while line := stream.readline(1 << 16):
            length = len(line)
            while not line.endswith(b"\n") and (line := stream.readline(1 << 16)):
                length += len(line)
            longest = max(longest, length)
    return longest


def start(path: Path, workflow: Workflow, run: str = "r", input: JSON = None) -> None:
    """Run ``workflow`` once as run ``run`` on the log at ``path``, with a constant clock."""

    async def go() -> None:
        with RunLogWriter(path, clock=constant_clock) as log:
            await Executor(log).run(workflow, run, input=input)

    asyncio.run(go())


def test_the_limit_is_64_mib() -> None:
    """The limit is 64 MiB, and an oversized record is a kind of unencodable one."""
    assert MAX_RECORD_BYTES == 67_108_864 == 64 * 1024 * 1024
    assert issubclass(RecordTooLarge, UnencodableRecord)


# --------------------------------------------------------------------------
# A step's result: 20 MiB is fine, over the limit fails the attempt
# --------------------------------------------------------------------------


class World:
    """A step returning 20 MiB, and one after it that measures what it got."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def workflow(self) -> Workflow:
        async def big(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1
            return "t" * (20 * MIB)

        async def measure(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1
            value = ctx.inputs["big"]
            assert isinstance(value, str)
            return len(value)

        return load_workflow("w", [Step(name="big", run=big), Step(name="measure", run=measure, after=("big",))])


def test_a_20_mib_result_is_written_replayed_and_recovered(tmp_path: Path) -> None:
    """A step returning 20 MiB succeeds; the log replays clean and recovery resumes after it."""
    path = tmp_path / "large.jsonl"
    world = World()
    with RunLogWriter(path) as log:
        [report] = run_jobs(log, [Job(workflow=world.workflow(), run="r")], admission_limit=1)
    assert report.status == "succeeded"
    assert [(s.step, s.state, s.result) for s in report.steps][1] == ("measure", Succeeded(), 20_971_520)
    check = replay(path)
    assert check.valid and check.records == 10 and check.violations == ()
    writer, recovery = recover_log(path, {"w": world.workflow()})
    writer.close()
    assert recovery.changed_nothing

    # A crash right after the big step succeeded: recovery resumes the run,
    # and the next step gets the 20 MiB value back from the log.
    lines = path.read_bytes().splitlines(keepends=True)
    crashed = tmp_path / "crashed.jsonl"
    crashed.write_bytes(b"".join(lines[:5]))  # run_started, created, admitted, result, succeeded
    resumed = World()
    writer, recovery = recover_log(crashed, {"w": resumed.workflow()})
    with writer:
        assert recovery.orphans == ()
        [run] = recovery.runs
        [report] = run_jobs(writer, [Job(workflow=resumed.workflow(), run="r", prior=run.steps)])
    assert report.status == "succeeded"
    assert resumed.calls == {"measure": 1}
    assert [s.result for s in report.steps][1] == 20_971_520
    assert replay(crashed).valid


async def over_the_limit(ctx: StepContext) -> JSON:
    return "x" * LIMIT


def test_a_result_over_the_limit_fails_the_attempt_naming_size_and_limit(tmp_path: Path) -> None:
    """A result over the limit: the attempt fails saying how large and what the limit is."""
    path = tmp_path / "over.jsonl"
    start(path, load_workflow("w", [Step(name="big", run=over_the_limit)]))
    # Record 4 would have been {"v":1,"seq":4,"time_us":1,"run":"r","type":"result",
    # "step":"big","attempt":1,"ok":true,"value":"xxx...x","crc":"xxxxxxxx"}\n
    head = len('{"v":1,"seq":4,"time_us":1,"run":"r","type":"result","step":"big","attempt":1,"ok":true,"value":')
    size = head + LIMIT + 2 + len(',"crc":"xxxxxxxx"}\n')
    [result] = [r.change for r in records(path) if isinstance(r.change, StepResult)]
    assert result.value is None and result.error == (
        "the step returned a value the run log cannot encode: record seq 4 of run 'r'"
        f" (type 'result', step 'big') is {size} bytes encoded, over the run log's limit of"
        " 67108864 bytes per record (MAX_RECORD_BYTES); nothing was written. Keep a value this"
        " large outside the log (a file, an object store) and put a reference to it in the log"
        " instead"
    )
    check = replay(path)
    assert check.valid and check.final_states[Failed()] == 1 and check.records == 6
    assert longest_line(path) < LIMIT


async def raises_a_huge_message(ctx: StepContext) -> JSON:
    raise ValueError("y" * LIMIT)


def test_an_exception_message_over_the_limit_fails_the_attempt_all_the_same(tmp_path: Path) -> None:
    """A step raising with a message over the limit ends Failed, with an error the log holds."""
    path = tmp_path / "raises.jsonl"
    start(path, load_workflow("w", [Step(name="loud", run=raises_a_huge_message)]))
    [result] = [r.change for r in records(path) if isinstance(r.change, StepResult)]
    assert result.error is not None
    assert result.error.startswith(
        "the step raised ValueError with a message the run log cannot hold: record seq 4 of run 'r'"
        " (type 'result', step 'loud') is "
    )
    assert "over the run log's limit of 67108864 bytes per record" in result.error
    check = replay(path)
    assert check.valid and check.final_states[Failed()] == 1
    assert longest_line(path) < LIMIT


# --------------------------------------------------------------------------
# The exact boundary, on both sides
# --------------------------------------------------------------------------


def result_of(value: str) -> StepResult:
    return StepResult(step="s", attempt=1, value=value)


def test_a_line_of_exactly_the_limit_is_written_and_read_one_byte_more_is_refused(tmp_path: Path) -> None:
    """LIMIT bytes: written and read back; LIMIT + 1 bytes: refused, nothing appended."""
    # The one measurement: the line of this record around an empty string.
    overhead = len(encode_record(1, 1, "r", result_of("")))
    path = tmp_path / "edge.jsonl"
    with RunLogWriter(path, clock=constant_clock) as log:
        assert log.append("r", result_of("e" * (LIMIT - overhead))) == 1
        with pytest.raises(RecordTooLarge) as refused:
            log.append("r", result_of("e" * (LIMIT - overhead + 1)))
        assert (refused.value.size, refused.value.limit) == (67_108_865, 67_108_864)
        assert (refused.value.seq, refused.value.run, refused.value.step) == (2, "r", "s")
        assert "is 67108865 bytes encoded, over the run log's limit of 67108864 bytes" in str(refused.value)
        assert log.last_seq == 1
        assert log.append("r", RunFinished()) == 2  # the refused record used no number
    finished = '{"v":1,"seq":2,"time_us":1,"run":"r","type":"run_finished","crc":"xxxxxxxx"}\n'
    assert path.stat().st_size == 67_108_864 + len(finished)
    items = list(read_log(path))
    assert [type(i) for i in items] == [Record, Record]
    assert items[0] == Record(line=1, seq=1, time_us=1, run="r", change=result_of("e" * (LIMIT - overhead)))


def forged(value: str) -> bytes:
    """A checksummed line the writer would refuse, made by docs/run-log.md's checksum rule."""
    body = (
        '{"v":1,"seq":1,"time_us":1,"run":"r","type":"result","step":"s","attempt":1,"ok":true,'
        f'"value":"{value}"}}'
    ).encode()
    return body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body)


def test_the_reader_refuses_a_line_one_byte_over_the_limit(tmp_path: Path) -> None:
    """A checksummed line of LIMIT + 1 bytes is corruption; the next line is still read."""
    overhead = len(forged(""))
    line = forged("f" * (LIMIT + 1 - overhead))
    assert len(line) == 67_108_865
    after = encode_record(2, 1, "r", RunFinished())
    path = tmp_path / "forged.jsonl"
    path.write_bytes(line + after)
    assert list(read_log(path)) == [
        CorruptLine(line=1, reason="line longer than 67108864 bytes"),
        Record(line=2, seq=2, time_us=1, run="r", change=RunFinished()),
    ]
    # Without its newline at the end of the file, the same bytes are a torn tail.
    path.write_bytes(after + line[:-1])
    assert list(read_log(path))[1:] == [TornTail(line=2, offset=len(after), length=67_108_864)]


# --------------------------------------------------------------------------
# The property: whatever the writer accepts, the reader reads back
# --------------------------------------------------------------------------

_KEYS = st.text(st.characters(exclude_categories=()), max_size=6)
_SCALARS: st.SearchStrategy[JSON] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 2**63, -(2**63) - 1, 10**40]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([5e-324, -0.0, 1.7976931348623157e308, 1e-300]),
    # control characters, lone surrogates, quotes, backslashes, any plane
    st.text(st.characters(exclude_categories=()), max_size=12),
)


def _containers(children: st.SearchStrategy[JSON]) -> st.SearchStrategy[JSON]:
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(_KEYS, children, max_size=4))


SMALL_JSON: st.SearchStrategy[JSON] = st.recursive(_SCALARS, _containers, max_leaves=12)

# Every record type that carries a JSON value, by hand.
CARRIERS: list[Callable[[JSON], Change]] = [
    lambda value: StepResult(step="s", attempt=1, value=value),
    lambda value: RunStarted(workflow="w", input=value, domain_states=("a",)),
    lambda value: IntentChanged(
        step="s", attempt=1, name="i", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed(), result=value
    ),
    lambda value: IntentReconciled(
        step="s", attempt=1, name="i", key="k", from_state=Dispatched(), cause=Confirm(),
        to_state=Confirmed(), result=value, by="operator", note="n",
    ),  # fmt: skip
]


def round_trip_or_refusal(carrier: Callable[[JSON], Change], value: JSON, pad: int, expected_size: int) -> None:
    """Encode ``[pad ASCII letters, value]``: refused exactly when over the limit, else read back whole."""
    change = carrier(["p" * pad, value])
    try:
        line = encode_record(7, 1, "r", change)
    except RecordTooLarge as refused:
        assert expected_size > 67_108_864
        assert (refused.size, refused.limit) == (expected_size, 67_108_864)
        return
    assert len(line) == expected_size <= 67_108_864
    expected = Record(line=1, seq=7, time_us=1, run="r", change=change)
    assert decode_line(line, 1) == expected
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "one.jsonl"
        path.write_bytes(line)
        assert list(read_log(path)) == [expected]


@settings(max_examples=200, deadline=None)
@given(carrier=st.sampled_from(CARRIERS), value=SMALL_JSON)
def test_small_values_of_every_kind_round_trip(carrier: Callable[[JSON], Change], value: JSON) -> None:
    """Small generated values: the writer's line decodes and reads back as the record written."""
    size = len(encode_record(7, 1, "r", carrier(["", value])))
    round_trip_or_refusal(carrier, value, 0, size)


@settings(max_examples=3, deadline=None)
@given(carrier=st.sampled_from(CARRIERS), value=SMALL_JSON, offset=st.integers(min_value=-40, max_value=40))
@example(carrier=CARRIERS[0], value="\x00\u00e9\U0001f600", offset=0)  # exactly the limit
@example(carrier=CARRIERS[1], value={"k": [1.5, -(2**70)]}, offset=1)  # one byte over it
def test_the_writer_cannot_produce_a_line_the_reader_refuses(
    carrier: Callable[[JSON], Change], value: JSON, offset: int
) -> None:
    """Near the limit: RecordTooLarge exactly when the line would be over it, else read back whole."""
    # The padding is ASCII letters: each adds exactly one byte to the line.
    base = len(encode_record(7, 1, "r", carrier(["", value])))
    pad = LIMIT - base + offset
    round_trip_or_refusal(carrier, value, pad, base + pad)


# --------------------------------------------------------------------------
# An effect's result, and a run's input
# --------------------------------------------------------------------------


async def fetches(ctx: StepContext) -> JSON:
    async def download(key: str) -> JSON:
        return "z" * LIMIT

    return await ctx.effect("download", download)


def test_an_effect_result_over_the_limit_is_confirmed_without_it_and_fails_the_step(tmp_path: Path) -> None:
    """The effect happened: it is recorded Confirmed without its result; the attempt fails."""
    path = tmp_path / "effect.jsonl"
    start(path, load_workflow("w", [Step(name="fetch", run=fetches)]))
    [confirm] = [
        r.change for r in records(path) if isinstance(r.change, IntentChanged) and r.change.cause == Confirm()
    ]
    assert (confirm.to_state, confirm.result) == (Confirmed(), None)
    [result] = [r.change for r in records(path) if isinstance(r.change, StepResult)]
    assert result.error is not None
    assert result.error.startswith(
        "StepError: effect 'download' happened, but returned a value the run log cannot encode"
        " (record seq 6 of run 'r' (type 'intent', step 'fetch') is "
    )
    assert "over the run log's limit of 67108864 bytes per record" in result.error
    assert result.error.endswith("; it is recorded Confirmed without its result")
    check = replay(path)
    assert check.valid and check.final_states[Failed()] == 1
    assert longest_line(path) < LIMIT


async def echo(ctx: StepContext) -> JSON:
    return ctx.input


ECHO = load_workflow("echo", [Step(name="echo", run=echo)])
"""Loaded by the command line test as ``test_record_size:ECHO``."""


def test_an_input_over_the_limit_refuses_the_run_and_writes_nothing(tmp_path: Path) -> None:
    """Executor.run raises RecordTooLarge for the start record; the log stays empty."""
    path = tmp_path / "input.jsonl"
    with pytest.raises(RecordTooLarge) as refused:
        start(path, ECHO, input="i" * LIMIT)
    assert (refused.value.seq, refused.value.record_type, refused.value.step) == (1, "run_started", None)
    assert str(refused.value).startswith("record seq 1 of run 'r' (type 'run_started') is ")
    assert path.read_bytes() == b""
    start(path, ECHO, input="small")  # the id was not taken: the run starts afresh
    assert [r.seq for r in records(path)] == [1, 2, 3, 4, 5, 6]


def test_cli_run_with_an_input_over_the_limit_exits_2_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`attempt-kernel run --input` over the limit: exit 2, the message, no traceback, no record."""
    path = tmp_path / "cli.jsonl"
    too_large = '"' + "c" * LIMIT + '"'
    code = main(["run", "test_record_size:ECHO", "--log", str(path), "--run", "r", "--input", too_large])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("attempt-kernel run: error: record seq 1 of run 'r' (type 'run_started') is ")
    assert "over the run log's limit of 67108864 bytes per record" in err
    assert "Traceback" not in err
    assert path.read_bytes() == b""


# --------------------------------------------------------------------------
# The PostgreSQL journal keeps the same limit
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_pg_journal_refuses_an_oversized_record_and_writes_no_row(pg_url: str, schema: str) -> None:
    """RecordTooLarge from append and append_all; no row of the batch, no number used up."""
    with PgJournal(pg_url, schema=schema, clock=constant_clock) as journal:
        assert journal.append("r", RunStarted(workflow="w")) == 1
        with pytest.raises(RecordTooLarge, match="record seq 2 of run 'r' \\(type 'result', step 's'\\)"):
            journal.append("r", result_of("x" * LIMIT))
        with pytest.raises(RecordTooLarge, match="record seq 3 of run 'r'"):
            journal.append_all("r", [AttemptCreated(step="s", attempt=1), result_of("x" * LIMIT)])
        assert sql_in(pg_url, schema, "SELECT seq FROM {s}.records ORDER BY seq") == [(1,)]
        assert journal.append("r", AttemptCreated(step="s", attempt=1)) == 2
        # A line of exactly the limit is a row like any other, and reads back.
        overhead = len(encode_record(3, 1, "r", result_of("")))
        assert journal.append("r", result_of("e" * (LIMIT - overhead))) == 3
        assert sql_in(pg_url, schema, "SELECT length(line) FROM {s}.records WHERE seq = 3") == [(67_108_864,)]
        items = list(journal.read())
    assert items[2] == Record(line=3, seq=3, time_us=1, run="r", change=result_of("e" * (LIMIT - overhead)))
