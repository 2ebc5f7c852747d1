"""Forged run logs: every line well-formed and checksummed, the records hostile.

The lines are written by hand here, the checksum computed as docs/run-log.md
("The checksum") says, so that no record passes through the encoder under
test: a log no writer of this library would produce, as a bug elsewhere, an
edit or another tool might. Every reader must give a documented answer
(a report with violations, a refusal naming the line, exit 1 or 2), never a
traceback, and must leave the bytes already written as they were.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from waitflows import APPROVER

from attempt_kernel import (
    CorruptLine,
    Executor,
    LogNeedsRecovery,
    Record,
    RecoveryError,
    RunLogWriter,
    RunRefused,
    Step,
    StepContext,
    load_workflow,
    read_log,
    recover_log,
    replay,
)
from attempt_kernel.cli._main import main

T0 = 1_796_511_283_000_000
CODE_START = '"type":"run_started","workflow":"approver","nonce":"27c4ea0ff2f1190a","code":true'


def line(seq: int, run: str, rest: str, *, time_us: int | None = None) -> bytes:
    """One record line of run ``run`` whose fields after ``run`` are ``rest`` (JSON text)."""
    stamp = T0 + seq if time_us is None else time_us
    body = f'{{"v":1,"seq":{seq},"time_us":{stamp},"run":"{run}",{rest}}}'.encode()
    return body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body)


def forged(path: Path, rests: list[str], run: str = "a-1") -> Path:
    path.write_bytes(b"".join(line(seq, run, rest) for seq, rest in enumerate(rests, 1)))
    return path


@pytest.mark.parametrize(
    "number",
    [
        pytest.param("9" * 5000, id="more-digits-than-int-takes"),
        pytest.param("\\u00b2", id="superscript-two"),
    ],
)
def test_an_attempt_of_a_code_step_whose_position_is_no_number_is_a_violation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], number: str
) -> None:
    """A code run's `created` whose step id ends ``@`` and a 5,000-digit number, or
    ``@²`` (a digit to `str.isdigit`, none to `int`): replay, runs, show and
    recover all died on the ledger's ValueError with a traceback."""
    log = forged(tmp_path / "forged.jsonl", [CODE_START, f'"type":"created","step":"ask@{number}","attempt":1'])
    before = log.read_bytes()
    step = "ask@" + ("9" * 5000 if number.startswith("9") else "\u00b2")
    expected = (
        f"attempt 1 of step {step!r} of run 'a-1' created, but no step_called record gave the step a position"
    )
    report = replay(log)
    assert [(v.line, v.reason) for v in report.violations] == [(2, expected)]
    assert main(["replay", str(log)]) == 1
    assert f"  line 2: {expected}\n" in capsys.readouterr().out
    assert main(["runs", str(log)]) == 0
    assert main(["show", str(log), "a-1"]) == 0
    assert main(["recover", str(log)]) == 2
    assert "line 2: attempt 1 of step" in capsys.readouterr().err
    assert log.read_bytes() == before


# --------------------------------------------------------------------------
# Random forged logs, read by the library's readers
# --------------------------------------------------------------------------

KEY = "ak1-d4b632b56d3d6a3995bcc09b43c8c93f"
STRANGE = ["s", "a\\u0000b", "\\ud800", "a\\u2028b", "\\u001b[2J", "<b>&amp;</b>", "x" * 300, "", "\\u00b2", "9" * 5000]
BIG = [0, 1, 2, -1, 2**63, 10**30]


def _rec(kind: str, n: int, name: str) -> str:
    """The fields after ``run`` of one forged record of ``kind`` (hand-written JSON text)."""
    step, at = (f"ask@{n}", n) if kind.startswith("code") else ("fetch-profile", n)
    pool = {
        "run_started": '"type":"run_started","workflow":"demo-flow","nonce":"5c5c5a3b54be9ab2"',
        "code_run_started": CODE_START,
        "run_finished": '"type":"run_finished"',
        "run_finished_ok": '"type":"run_finished","ok":true,"result":[1]',
        "run_cancel_requested": '"type":"run_cancel_requested","reason":"r"',
        "run_stop_requested": '"type":"run_stop_requested","reason":"SIGINT"',
        "run_resumed": '"type":"run_resumed"',
        "created": f'"type":"created","step":"{step}","attempt":{at}',
        "code_created": f'"type":"created","step":"{step}","attempt":1',
        "code_created_odd": f'"type":"created","step":"ask@{name}","attempt":1',
        "admit": f'"type":"transition","step":"{step}","attempt":{at},"from":"Pending","cause":"Admit","to":"Running"',
        "succeed": f'"type":"transition","step":"{step}","attempt":{at},"from":"Running","cause":"Succeed","to":"Succeeded"',
        "bad_from": f'"type":"transition","step":"{step}","attempt":{at},"from":"Failed","cause":"Admit","to":"Running"',
        "cancel_true": f'"type":"transition","step":"{step}","attempt":{at},"from":"Running","cause":"Cancel","intent_dispatched":true,"to":"Indeterminate"',
        "cancel_false": f'"type":"transition","step":"{step}","attempt":{at},"from":"Running","cause":"Cancel","intent_dispatched":false,"to":"Cancelled"',
        "result": f'"type":"result","step":"{step}","attempt":{at},"ok":true,"value":{{"k":"{name}"}}',
        "result_no_retry": f'"type":"result","step":"{step}","attempt":{at},"ok":false,"error":"e","retry":false',
        "planned": f'"type":"intent_planned","step":"{step}","attempt":{at},"intent":"{name}","key":"{KEY}"',
        "dispatch": f'"type":"intent","step":"{step}","attempt":{at},"intent":"{name}","from":"Planned","cause":"Dispatch","to":"Dispatched"',
        "confirm_undispatched": f'"type":"intent","step":"{step}","attempt":{at},"intent":"{name}","from":"Planned","cause":"Confirm","to":"Confirmed"',
        "reconciled": f'"type":"reconciled","step":"{step}","attempt":{at},"intent":"{name}","key":"{KEY}","from":"Dispatched","cause":"Reject","to":"Rejected","by":"operator","note":"n"',
        "domain_state": f'"type":"domain_state","step":"{step}","attempt":{at},"state":"{name}"',
        "code_step_called": f'"type":"step_called","step":"ask@{n}","position":{n},"name":"ask","digest":"sha256:5fa9c84e83b8ffe9"',
        "code_step_called_odd": f'"type":"step_called","step":"{name}@{n}","position":{n},"name":"{name}","digest":"d"',
        "code_wait_started": f'"type":"wait_started","position":{n},"signal":"{name}"',
        "code_sleep_started": f'"type":"wait_started","position":{n},"wake_us":{T0 + n}',
        "code_wait_ended": f'"type":"wait_ended","position":{n}',
        "code_wait_ended_signal": f'"type":"wait_ended","position":{n},"signal":{n}',
        "signal_sent": f'"type":"signal_sent","name":"{name}","id":"{name}{n}","payload":{{}}',
        "signal_null": f'"type":"signal_sent","name":"{name}","id":"i","payload":null',
        "unknown_field": '"type":"run_resumed","extra":{"a":[1,2]}',
        "repeated_key": '"type":"run_resumed","type":"run_finished"',
    }
    return pool[kind]


KINDS = [
    "run_started", "code_run_started", "run_finished", "run_finished_ok", "run_cancel_requested",
    "run_stop_requested", "run_resumed", "created", "code_created", "code_created_odd", "admit", "succeed", "bad_from",
    "cancel_true", "cancel_false", "result", "result_no_retry", "planned", "dispatch",
    "confirm_undispatched", "reconciled", "domain_state", "code_step_called", "code_step_called_odd",
    "code_wait_started", "code_sleep_started", "code_wait_ended", "code_wait_ended_signal",
    "signal_sent", "signal_null", "unknown_field", "repeated_key",
]  # fmt: skip



async def _fetch(ctx: StepContext) -> int:
    return 1


WORKFLOWS = {"demo-flow": load_workflow("demo-flow", [Step(name="fetch-profile", run=_fetch)]), "approver": APPROVER}

forged_record = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from(["a-1", "a-1", "t-1", "zz"]),
    st.sampled_from([*BIG, 3, 4]),
    st.sampled_from(STRANGE),
    st.sampled_from(["next", "next", "next", "repeat", "skip", "back"]),
    st.sampled_from([None, None, None, 0, -1, 2**63, 10**30]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(started=st.booleans(), records=st.lists(forged_record, min_size=1, max_size=14))
@example(started=True, records=[("code_created_odd", "a-1", 1, "\\u00b2", "next", None)])
def test_library_readers_answer_any_forged_log_as_documented(
    tmp_path_factory: pytest.TempPathFactory,
    started: bool,
    records: list[tuple[str, str, int, str, str, int | None]],
) -> None:
    """Read back, replayed, recovered and opened by an executor, a forged log gets a
    documented answer: items one per line, a report whose violations name lines of the
    log, a recovery that refuses a log breaking the rules with nothing written
    (`RecoveryError`, `LogNeedsRecovery`), an executor that refuses it (`RunRefused`)."""
    log = tmp_path_factory.mktemp("forged") / "forged.jsonl"
    lines, seq = [], 0
    if started:  # a code run a-1 and a run t-1 that began as the writer begins them: the forged records follow
        lines = [line(1, "a-1", _rec("code_run_started", 1, "s")), line(2, "t-1", _rec("run_started", 1, "s"))]
        seq = 2
    for kind, run, n, name, numbering, stamp in records:
        seq = {"next": seq + 1, "repeat": max(seq, 1), "skip": seq + 2, "back": max(seq - 1, 1)}[numbering]
        lines.append(line(seq, run, _rec(kind, n, name), time_us=stamp))
    data = b"".join(lines)
    log.write_bytes(data)

    items = list(read_log(log))
    assert [item.line for item in items] == list(range(1, len(lines) + 1))
    assert all(isinstance(item, (Record, CorruptLine)) for item in items)
    corrupt = any(isinstance(item, CorruptLine) for item in items)

    report = replay(log)
    assert report.records == sum(isinstance(item, Record) for item in items)
    assert all(1 <= v.line <= len(lines) for v in report.violations)
    assert report.violation_count == len(report.violations)
    assert report.valid == (report.violation_count == 0)
    if corrupt:
        assert not report.valid

    try:
        writer, _ = recover_log(log, WORKFLOWS, reconciler_deadline=0.01)
    except LogNeedsRecovery:
        assert corrupt
        assert log.read_bytes() == data
    except RecoveryError:
        assert log.read_bytes() == data
    else:
        writer.close()
        assert report.valid
        assert log.read_bytes().startswith(data)
    log.write_bytes(data)

    try:
        writer = RunLogWriter(log)
    except LogNeedsRecovery:
        assert corrupt
    else:
        try:
            Executor(writer)
        except RunRefused as refused:
            assert not report.valid
            assert "the log breaks the kernel's rules (line " in str(refused)
        else:
            assert report.valid
        finally:
            writer.close()
    assert log.read_bytes() == data


def test_resume_of_a_run_with_no_start_record_says_so_not_workflow_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 'zz' has an attempt but no `run_started` (a log written by another program): its
    workflow is unknown. `resume` said ``run 'zz' belongs to workflow None, which was not
    loaded`` and suggested a `recover --workflows` that refuses such a run too."""
    log = forged(tmp_path / "nostart.jsonl", ['"type":"created","step":"s","attempt":1'], run="zz")
    before = log.read_bytes()
    assert main(["resume", str(log), "zz"]) == 2
    assert capsys.readouterr().err == (
        "attempt-kernel resume: error: run 'zz' has records in the log but no start record (`run_started`),"
        " so no workflow of it is known and nothing can resume it; nothing was written\n"
    )
    assert main(["recover", str(log)]) == 2  # what the old message suggested: refused too
    assert "'zz'" in capsys.readouterr().err
    assert log.read_bytes() == before
