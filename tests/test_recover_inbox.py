"""What recovery does with a file log's inbox, and says about it: each entry taken in
or dropped has its line, and a bad entry is refused as a direct change would be.

The inboxes are written with `write_entry`, as a sender that found the log held
would have left them; the logs with `write_log` (records written out by hand).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from logs import simple_changes, write_log

from attempt_kernel import (
    AttemptCreated, OperationRefused, Record, RunFinished, RunStarted, SignalSent, read_log, recover_log,
)  # fmt: skip
from attempt_kernel._codec import encode_record
from attempt_kernel._inbox import write_entry
from attempt_kernel.cli._main import main
from test_cli_waits import waiting_log


def finished_log(path: Path) -> Path:
    """Run 'r' of workflow 'w', started and finished (nothing left to recover)."""
    return write_log(path, [RunStarted(workflow="w"), *simple_changes(), RunFinished()])


def test_recover_prints_a_line_for_an_inbox_entry_it_drops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = finished_log(tmp_path / "a.jsonl")
    write_entry(log, "r", SignalSent(name="approve", payload={}, id="s1"))
    before = log.read_bytes()
    assert main(["recover", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "recover: r: dropped signal 'approve' (s1) from a.jsonl.inbox: run 'r' has finished\n"
        f"recover: nothing to do: {log} ends cleanly and every run in it has finished; the log was not changed\n"
    ), out
    assert log.read_bytes() == before
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""


def test_recover_log_returns_what_it_did_with_each_entry(tmp_path: Path) -> None:
    log = finished_log(tmp_path / "a.jsonl")
    write_entry(log, "r", SignalSent(name="approve", payload={}, id="s1"))
    write_entry(log, "r", SignalSent(name="later", payload=[1], id="s2"))
    writer, recovery = recover_log(log, {})
    writer.close()
    assert recovery.taken_in == (
        "r: dropped signal 'approve' (s1) from a.jsonl.inbox: run 'r' has finished",
        "r: dropped signal 'later' (s2) from a.jsonl.inbox: run 'r' has finished",
    )


def test_a_file_worker_prints_the_line_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = finished_log(tmp_path / "a.jsonl")
    write_entry(log, "r", SignalSent(name="approve", payload={}, id="s1"))
    assert main(["worker", str(log), "--workflows", "cliflows:GREETER", "--until-idle"]) == 0
    assert capsys.readouterr().out == (
        f"worker: serving the runs of {log} (greeter)\n"
        "worker: r: dropped signal 'approve' (s1) from a.jsonl.inbox: run 'r' has finished\n"
        "worker: idle; no unfinished run of these workflows is left\n"
    )


def test_an_inbox_entry_with_a_name_signal_refuses_is_dropped_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Entries written past the door (by hand, or by an older version): the bad ones are
    dropped, each with a line naming why, and the good one after them is recorded."""
    log = waiting_log(tmp_path / "a.jsonl")
    (tmp_path / "a.jsonl.inbox").write_bytes(
        encode_record(1, 1, "a-1", SignalSent(name="ap\x1bprove", payload={}, id="s1"))
        + encode_record(2, 2, "a-1", SignalSent(name="x" * 201, payload={}, id="s2"))
        + encode_record(3, 3, "a-1", SignalSent(name="approve", payload={"ok": 1}, id="s3"))
    )
    assert main(["recover", str(log), "--workflows", "waitflows:APPROVER"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "recover: a-1: dropped signal 'ap\\x1bprove' (s1) from a.jsonl.inbox: signal 's1': signal name"
        " 'ap\\x1bprove' holds a control character at index 2 ('\\x1b'); use printable characters",
        "recover: a-1: dropped signal '" + "x" * 201 + "' (s2) from a.jsonl.inbox: signal 's2': a signal name"
        " has at most 200 characters, got 201",
        "recover: a-1: took in signal 'approve' (s3) from a.jsonl.inbox",
    ]
    sent = [i.change for i in read_log(log) if isinstance(i, Record) and isinstance(i.change, SignalSent)]
    assert sent == [SignalSent(name="approve", payload={"ok": 1}, id="s3")]
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == b""


def test_the_inbox_refuses_to_take_a_name_signal_refuses(tmp_path: Path) -> None:
    """Refused at delivery: nothing bad is ever written to an inbox."""
    log = waiting_log(tmp_path / "a.jsonl")
    write_entry(log, "a-1", SignalSent(name="approve", payload={}, id="s1"))
    before = (tmp_path / "a.jsonl.inbox").read_bytes()
    with pytest.raises(OperationRefused, match=r"^signal 's2': signal name 'a\\tb' holds a control character"):
        write_entry(log, "a-1", SignalSent(name="a\tb", payload={}, id="s2"))
    assert (tmp_path / "a.jsonl.inbox").read_bytes() == before


def test_an_inbox_holding_a_kernel_record_is_refused_in_good_english(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said 'holds a AttemptCreated record'."""
    log = finished_log(tmp_path / "a.jsonl")
    inbox = tmp_path / "a.jsonl.inbox"
    inbox.write_bytes(encode_record(1, 1, "r", AttemptCreated(step="s", attempt=2)))
    assert main(["recover", str(log)]) == 2
    assert capsys.readouterr().err == (
        f"attempt-kernel recover: error: {inbox}: line 1 holds a record of type AttemptCreated, not an"
        " operator's change (signal, cancel, reconciliation); nothing of the inbox was applied: move the"
        " file aside and send the changes again\n"
    )


def test_a_postgresql_inbox_row_holding_a_kernel_record_is_named_in_good_english() -> None:
    from attempt_kernel.postgres._journal import inbox_change

    line = encode_record(1, 1, "r", AttemptCreated(step="s", attempt=2))
    assert inbox_change(line) == "an inbox row holds AttemptCreated, which no operator delivers"
