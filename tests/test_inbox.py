"""The inbox beside a file log, and the Python functions that deliver through it.

A waiting run is made in-process (`Executor` with ``let_go_after=0`` lets
go of a run once it only waits); "another process holds the log" is this
process holding a `RunLogWriter` (flock locks belong to the open file, so
the sender's own open meets it as another process's would). Expected
records are written out by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from attempt_kernel import (
    Delivered,
    Executor,
    MAX_RECORD_BYTES,
    IntentPlanned,
    FileLog,
    LogNeedsRecovery,
    LogOpenError,
    OperationRefused,
    Record,
    RunCancelRequested,
    RunLogWriter,
    SignalSent,
    cancel_run,
    read_log,
    recover_log,
    replay,
    resume_log,
    send_signal,
)
from attempt_kernel._codec import encode_record
from attempt_kernel._inbox import InboxCorrupt, locked_inbox
from attempt_kernel._ledger import Ledger
from attempt_kernel._operate import reconcile_change, signal_change
from attempt_kernel._operations import deliver_to_file
from waitflows import APPROVER, BLOCKED

RUN = "a-1"


def waiting_log(path: Path, run: str = RUN) -> Path:
    """A log whose run of APPROVER waits for signal 'approve' (no process drives it)."""

    async def go() -> None:
        with RunLogWriter(path) as writer:
            report = await Executor(writer, let_go_after=0).run(APPROVER, run)
            assert report.status == "waiting"

    asyncio.run(go())
    return path


def sent_id(done: Delivered) -> str:
    assert isinstance(done.change, SignalSent)
    return done.change.id


def changes(path: Path) -> list[object]:
    return [item.change for item in read_log(path) if isinstance(item, Record)]


def signals(path: Path) -> list[SignalSent]:
    return [c for c in changes(path) if isinstance(c, SignalSent)]


def inbox_lines(path: Path) -> list[dict[str, object]]:
    inbox = path.with_name(path.name + ".inbox")
    return [json.loads(line) for line in inbox.read_bytes().splitlines()]


def test_a_signal_to_a_log_nobody_holds_is_recorded_at_once(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    done = send_signal(log, RUN, "approve", {"by": "ana"})
    assert done.recorded and done.run == RUN
    [sent] = signals(log)
    assert sent.name == "approve" and sent.payload == {"by": "ana"}
    assert done.change == sent
    assert not (tmp_path / "a.jsonl.inbox").exists()
    assert replay(FileLog(log)).valid


def test_a_signal_without_payload_carries_an_empty_object(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    send_signal(log, RUN, "approve")
    [sent] = signals(log)
    assert sent.payload == {}


def test_a_signal_while_another_writer_holds_the_log_waits_in_the_inbox(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    with RunLogWriter(log):
        done = send_signal(log, RUN, "approve", [1, 2])
    assert not done.recorded
    assert log.read_bytes() == before
    [entry] = inbox_lines(log)
    assert entry["type"] == "signal_sent" and entry["run"] == RUN and entry["seq"] == 1
    assert entry["name"] == "approve" and entry["payload"] == [1, 2]


def test_an_entry_sent_while_a_sender_holds_a_log_without_an_inbox_is_recorded_before_it_lets_go(
    tmp_path: Path,
) -> None:
    """A sender that found no inbox holds the log; a second sender, finding it held, makes the
    inbox and appends there: the first takes that entry in before it lets the log go, so it is
    not left for a writer that may never come."""
    log = waiting_log(tmp_path / "a.jsonl")
    seconds: list[Delivered] = []

    def build(ledger: Ledger) -> tuple[str, SignalSent]:
        seconds.append(send_signal(log, RUN, "approve", "two"))  # the log is held: to the inbox
        return RUN, signal_change(ledger, RUN, "approve", "one")

    first = deliver_to_file(log, build)
    [second] = seconds
    assert first.recorded and not second.recorded
    assert [s.payload for s in signals(log)] == ["one", "two"]
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""
    assert replay(FileLog(log)).valid


def test_the_next_writer_takes_the_inbox_in_and_empties_it(tmp_path: Path) -> None:
    """Entries a holder never took in (it died) are recorded by the next writer, in order."""
    log = waiting_log(tmp_path / "a.jsonl")
    with RunLogWriter(log):
        first = send_signal(log, RUN, "approve", "one")
        second = send_signal(log, RUN, "approve", "two")
    resumed = resume_log(log, [APPROVER])
    [report] = resumed.reports
    assert report.status == "succeeded"
    assert report.result == {"answer": "one", "charged": {"charged": 40}}
    assert [s.id for s in signals(log)] == [sent_id(first), sent_id(second)]
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""
    assert replay(FileLog(log)).valid


def test_a_torn_inbox_tail_is_ignored_and_cut(tmp_path: Path) -> None:
    """A sender killed mid-write: the complete entry before it is applied once, the
    partial line never, and the inbox is empty after."""
    log = waiting_log(tmp_path / "a.jsonl")
    with RunLogWriter(log):
        sent = send_signal(log, RUN, "approve", "whole")
    inbox = tmp_path / "a.jsonl.inbox"
    with open(inbox, "ab") as out:
        out.write(b'{"v":1,"seq":2,"time_us":5,"run":"a-1","type":"signal_sent","name":"appr')
    [report] = resume_log(log, [APPROVER]).reports
    assert report.result == {"answer": "whole", "charged": {"charged": 40}}
    assert [s.id for s in signals(log)] == [sent_id(sent)]
    assert inbox.read_bytes() == b""


def test_a_sender_cuts_a_torn_tail_before_appending(tmp_path: Path) -> None:
    """The next entry is never glued to a dead sender's partial line."""
    log = waiting_log(tmp_path / "a.jsonl")
    inbox = tmp_path / "a.jsonl.inbox"
    with RunLogWriter(log):
        send_signal(log, RUN, "approve", 1)
        with open(inbox, "ab") as out:
            out.write(b'{"v":1,"seq":2,"ti')
        send_signal(log, RUN, "approve", 2)
    assert [(e["seq"], e["payload"]) for e in inbox_lines(log)] == [(1, 1), (2, 2)]


def test_a_signal_recorded_before_a_crash_is_not_taken_in_twice(tmp_path: Path) -> None:
    """A holder that died between recording a signal and emptying the inbox: the log has
    signal X, the inbox still has X; the next writer records it once."""
    log = waiting_log(tmp_path / "a.jsonl")
    signal = SignalSent(name="approve", payload={"n": 1}, id="sig-x")
    with RunLogWriter(log) as writer:
        writer.append(RUN, signal)
    with locked_inbox(log, create=True) as inbox:
        assert inbox is not None
        inbox.append(RUN, signal, 7)
    [report] = resume_log(log, [APPROVER]).reports
    assert report.result == {"answer": {"n": 1}, "charged": {"charged": 40}}
    assert signals(log) == [signal]
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""
    assert replay(FileLog(log)).valid


def test_a_corrupt_inbox_line_is_reported_with_its_number_and_nothing_applied(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    with RunLogWriter(log):
        send_signal(log, RUN, "approve", 1)
        send_signal(log, RUN, "approve", 2)
    inbox = tmp_path / "a.jsonl.inbox"
    first, second = inbox.read_bytes().splitlines(keepends=True)
    inbox.write_bytes(first.replace(b'"payload":1', b'"payload":9') + second)
    before = log.read_bytes()
    with pytest.raises(InboxCorrupt, match=r"a\.jsonl\.inbox: line 1 is corrupt \(checksum mismatch"):
        send_signal(log, RUN, "approve", 3)
    assert log.read_bytes() == before
    with pytest.raises(InboxCorrupt, match="line 1 is corrupt"):
        resume_log(log, [APPROVER])
    assert log.read_bytes() == before


def test_an_inbox_record_that_is_no_operators_change_is_refused(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    [first] = log.read_bytes().splitlines(keepends=True)[:1]  # the run_started record
    (tmp_path / "a.jsonl.inbox").write_bytes(first)
    with pytest.raises(InboxCorrupt, match="line 1 holds a record of type RunStarted, not an operator's change"):
        send_signal(log, RUN, "approve")


def test_a_cancel_of_a_waiting_run_closes_it_without_its_effect(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    with RunLogWriter(log):
        done = cancel_run(log, RUN, "not needed")
    assert done == Delivered(run=RUN, change=RunCancelRequested(reason="not needed"), recorded=False)
    resumed = resume_log(log, [APPROVER])
    assert resumed.reports == ()
    assert resumed.recovery.closed == (RUN,)
    assert "intent_planned" not in log.read_text()
    assert replay(FileLog(log)).valid


@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
def test_a_signal_to_an_unknown_run_writes_nothing(tmp_path: Path, held: bool) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    writer = RunLogWriter(log) if held else None
    try:
        with pytest.raises(OperationRefused) as refused:
            send_signal(log, "a-9", "approve")
        assert str(refused.value) == f"signal 'approve' to run 'a-9': no run 'a-9' in {log}"
    finally:
        if writer is not None:
            writer.close()
    assert log.read_bytes() == before
    assert not (tmp_path / "a.jsonl.inbox").exists()


def test_a_cancel_of_a_finished_run_writes_nothing(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    send_signal(log, RUN, "approve")
    resume_log(log, [APPROVER])
    before = log.read_bytes()
    with pytest.raises(OperationRefused, match=r"run 'a-1' has finished \(succeeded\)"):
        cancel_run(log, RUN)
    assert log.read_bytes() == before


def test_a_missing_log_is_an_open_error(tmp_path: Path) -> None:
    with pytest.raises(LogOpenError, match="no such file"):
        send_signal(tmp_path / "nope.jsonl", RUN, "approve")
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_log_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "a.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(LogOpenError, match=r"is a FIFO \(named pipe\), not a run log"):
        send_signal(fifo, RUN, "approve")


def test_a_fifo_in_the_inboxs_place_is_refused(tmp_path: Path) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    os.mkfifo(tmp_path / "a.jsonl.inbox")
    with RunLogWriter(log), pytest.raises(LogOpenError, match=r"a\.jsonl\.inbox: is a FIFO"):
        send_signal(log, RUN, "approve")


def test_a_file_that_is_not_a_run_log_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_bytes(b"hello\n")
    with pytest.raises(LogNeedsRecovery, match="line 1 is corrupt"):
        send_signal(text, RUN, "approve")
    assert text.read_bytes() == b"hello\n"


def test_a_reconciliation_of_an_intent_whose_attempt_is_live_is_not_taken_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its effect may be in flight in the process that holds the log: the attempt
    records the outcome itself, so the operator's answer is dropped, saying why."""
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("WAIT_GATE", str(gate))
    path = tmp_path / "b.jsonl"

    async def go() -> tuple[str | None, str]:
        with RunLogWriter(path) as writer:
            executor = Executor(writer)
            task = asyncio.ensure_future(executor.run(BLOCKED, "b-1"))
            while not (gate / "waiting").exists():
                await asyncio.sleep(0.01)
            ledger = Ledger()
            ledger.feed(writer.read())
            run, change = reconcile_change(ledger, key_of(path), confirmed=False)
            why = executor.deliver(run, change)
            (gate / "open").touch()
            report = await task
            return why, report.status

    why, status = asyncio.run(go())
    key = key_of(path)
    assert why == f"intent {key!r} belongs to attempt #1 of step 'pay@1', which is live in this process"
    assert status == "succeeded"
    assert "reconciled" not in [json.loads(line)["type"] for line in path.read_bytes().splitlines()]


def key_of(path: Path) -> str:
    [key] = [c.key for c in changes(path) if isinstance(c, IntentPlanned)]
    return key


# --------------------------------------------------------------------------
# An entry that fits the inbox's line but not the log's
# --------------------------------------------------------------------------

NOW_US = 1796116936000000  # a time_us of 16 digits, as every clock reading until 2286


def noted_log(path: Path) -> Path:
    """A waiting log of 10 records (three signals 'note' recorded): the next is seq 11."""
    waiting_log(path)
    for n in range(3):
        send_signal(path, RUN, "note", n)
    assert len(path.read_bytes().splitlines()) == 10
    return path


def filling_signal(payload_bytes: int) -> SignalSent:
    """A signal 'approve' whose payload, a string, encodes to ``payload_bytes`` bytes."""
    return SignalSent(name="approve", payload="x" * (payload_bytes - 2), id="0123456789abcdef")


def inbox_line_bytes(seq: int) -> int:
    """What an inbox line numbered ``seq`` holding `filling_signal` is, minus its payload:
    written out from docs/run-log.md's fields, checksum included."""
    head = f'{{"v":1,"seq":{seq},"time_us":{NOW_US},"run":"{RUN}","type":"signal_sent",'
    tail = '"name":"approve","payload":,"id":"0123456789abcdef","crc":"00000000"}\n'
    return len(head) + len(tail)


def test_an_inbox_entry_too_large_once_numbered_in_the_log_is_dropped_and_the_rest_taken_in(
    tmp_path: Path,
) -> None:
    """A line numbered 1 in the inbox is numbered 11 in the log, one byte longer: the
    entry at exactly the limit cannot be recorded. It is dropped saying why, and the
    entry after it is taken in: the inbox is not wedged for every later change."""
    log = noted_log(tmp_path / "a.jsonl")
    big = filling_signal(MAX_RECORD_BYTES - inbox_line_bytes(1))
    small = SignalSent(name="approve", payload="small", id="fedcba9876543210")
    inbox = tmp_path / "a.jsonl.inbox"
    inbox.write_bytes(encode_record(1, NOW_US, RUN, big) + encode_record(2, NOW_US, RUN, small))
    assert len(inbox.read_bytes().splitlines(keepends=True)[0]) == MAX_RECORD_BYTES
    del big
    writer, recovery = recover_log(log, {"approver": APPROVER})
    writer.close()
    assert len(recovery.taken_in) == 2
    assert recovery.taken_in[0].startswith(
        "a-1: dropped signal 'approve' (0123456789abcdef) from a.jsonl.inbox: record seq 11 of"
        " run 'a-1' (type 'signal_sent') is 67108865 bytes encoded, over the run log's limit"
    )
    assert recovery.taken_in[1] == "a-1: took in signal 'approve' (fedcba9876543210) from a.jsonl.inbox"
    assert [s.payload for s in signals(log)] == [0, 1, 2, "small"]
    assert inbox.read_bytes() == b""
    assert replay(FileLog(log)).valid


def test_a_signal_too_large_for_the_log_is_refused_alike_when_no_process_holds_it(
    tmp_path: Path,
) -> None:
    """The operations promise `OperationRefused` for what they refuse, and the inbox path
    (a process holds the log) keeps it for a payload too large for a record; written
    straight into the log (no holder), the same payload raised `RecordTooLarge` instead,
    so a caller catching the refusal caught it only when the log was held."""
    log = noted_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    payload = "x" * MAX_RECORD_BYTES
    with pytest.raises(OperationRefused) as caught:
        send_signal(log, RUN, "approve", payload)
    del payload
    said = str(caught.value)
    assert said.startswith(f"record seq 11 of run '{RUN}' (type 'signal_sent') is ")
    assert "over the run log's limit of 67108864 bytes per record (MAX_RECORD_BYTES); nothing was written" in said
    assert log.read_bytes() == before
    with pytest.raises(OperationRefused) as cancelled:
        cancel_run(log, RUN, "y" * MAX_RECORD_BYTES)
    assert str(cancelled.value).startswith(f"record seq 11 of run '{RUN}' (type 'run_cancel_requested') is ")
    assert log.read_bytes() == before


def test_a_signal_too_large_for_the_log_once_numbered_there_is_refused_at_the_inbox(
    tmp_path: Path,
) -> None:
    """Its line would fit the inbox numbered 1, but not the log at seq 11: the sender is told
    now, with nothing written, rather than told it waits in the inbox for a taker that
    must drop it."""
    log = noted_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    payload = "x" * (MAX_RECORD_BYTES - inbox_line_bytes(1) - 2)
    with RunLogWriter(log):
        with pytest.raises(OperationRefused, match=r"too large for the run log.*nothing was written to"):
            send_signal(log, RUN, "approve", payload)
    del payload
    assert log.read_bytes() == before
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""
    with RunLogWriter(log):
        small = send_signal(log, RUN, "approve", "x" * 1000)
    assert not small.recorded
    assert [e["seq"] for e in inbox_lines(log)] == [1]
