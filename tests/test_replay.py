"""The replayer and the `replay` command, against hand-written expectations."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from logs import indeterminate_changes, simple_changes, write_log

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
    Dispatch,
    Dispatched,
    Fail,
    Failed,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    OpenAttempt,
    Pending,
    Planned,
    Running,
    RunFinished,
    StepResult,
    Succeed,
    Succeeded,
    TimedOut,
    StepDeadlinePassed,
    Violation,
    replay,
)
from attempt_kernel.cli._main import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "checkout.jsonl"

ZERO = {
    Pending(): 0, Running(): 0, Succeeded(): 0, Failed(): 0,
    Indeterminate(): 0, Cancelled(): 0, TimedOut(): 0,
}  # fmt: skip


def _violations(tmp_path: Path, changes: list[Change]) -> list[Violation]:
    return list(replay(write_log(tmp_path / "log", changes)).violations)


# ------------------------------------------------------------------ valid logs


def test_the_example_log_replays_to_the_hand_written_report() -> None:
    """examples/checkout.jsonl: the counts and the Indeterminate attempt, by hand."""
    report = replay(EXAMPLE)
    assert report.valid and report.violations == ()
    assert report.records == 32
    assert report.final_states == {**ZERO, Succeeded(): 2, Failed(): 1, Indeterminate(): 1,
                                   Cancelled(): 1, TimedOut(): 1}  # fmt: skip
    assert report.indeterminate == (
        OpenAttempt(
            run="order-1042", step="send-receipt", attempt=1, state=Indeterminate(), line=23,
            outstanding=("ak1-f2e4fb06edd92da1dc128a19cba45352",),
        ),
    )  # fmt: skip
    assert report.to_reconcile == ()
    assert report.unresolved_intents == 1
    assert report.torn_tail is None


@pytest.mark.slow
def test_example_file_is_what_its_script_writes(tmp_path: Path) -> None:
    """The committed example equals a fresh run of examples/make_checkout_log.py."""
    out = tmp_path / "checkout.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_checkout_log.py"), str(out)],
        check=True, timeout=60,
    )  # fmt: skip
    assert out.read_bytes() == EXAMPLE.read_bytes()


def test_failed_with_outstanding_intent_is_listed_to_reconcile(tmp_path: Path) -> None:
    """A Failed attempt whose intent is still Dispatched is reported with its key."""
    changes: list[Change] = [
        AttemptCreated(step="pay", attempt=1),
        AttemptTransitioned(step="pay", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="pay", attempt=1, name="charge", key="k-charge"),
        IntentChanged(step="pay", attempt=1, name="charge", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        StepResult(step="pay", attempt=1, error="ConnectionReset"),
        AttemptTransitioned(step="pay", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()),
    ]  # fmt: skip
    report = replay(write_log(tmp_path / "log", changes))
    assert report.valid
    assert report.to_reconcile == (
        OpenAttempt(run="r", step="pay", attempt=1, state=Failed(), line=6, outstanding=("k-charge",)),
    )
    assert report.indeterminate == ()


def test_timed_out_with_outstanding_intent_is_listed_to_reconcile(tmp_path: Path) -> None:
    """A step deadline firing mid-call leaves the intent outstanding: reconcile."""
    changes: list[Change] = [
        AttemptCreated(step="pay", attempt=1),
        AttemptTransitioned(step="pay", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="pay", attempt=1, name="charge", key="k"),
        IntentChanged(step="pay", attempt=1, name="charge", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        AttemptTransitioned(step="pay", attempt=1, from_state=Running(), cause=StepDeadlinePassed(), to_state=TimedOut()),
    ]  # fmt: skip
    report = replay(write_log(tmp_path / "log", changes))
    assert [e.state for e in report.to_reconcile] == [TimedOut()]


def test_torn_tail_is_reported_and_is_not_a_violation(tmp_path: Path) -> None:
    """Every complete record is checked; the torn tail is named, the log stays valid."""
    path = write_log(tmp_path / "log", simple_changes())
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":5')
    report = replay(path)
    assert report.valid and report.records == 4
    assert report.torn_tail is not None and report.torn_tail.line == 5
    assert report.final_states == {**ZERO, Succeeded(): 1}


# ------------------------------------------------------------------ violations


def test_empty_file_is_valid_and_says_it_records_nothing(tmp_path: Path) -> None:
    """An empty log breaks no rule: valid, no records (the same rule as a torn-only log)."""
    path = tmp_path / "log"
    path.write_bytes(b"")
    report = replay(path)
    assert report.valid and report.records == 0 and report.violations == ()
    assert report.torn_tail is None


def test_transition_from_terminal_state(tmp_path: Path) -> None:
    """Nothing follows a terminal state."""
    changes = simple_changes() + [
        AttemptTransitioned(step="s", attempt=1, from_state=Succeeded(), cause=Fail(), to_state=Failed()),
    ]  # fmt: skip
    [v] = _violations(tmp_path, changes)
    assert v.line == 5 and "terminal state has no outgoing transitions" in v.reason


def test_illegal_pair_and_wrong_to_state(tmp_path: Path) -> None:
    """A rejected pair and a legal pair with the wrong recorded target are each one violation."""
    changes: list[Change] = [
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Succeed(), to_state=Succeeded()),
        AttemptCreated(step="t", attempt=1),
        AttemptTransitioned(step="t", attempt=1, from_state=Pending(), cause=Admit(), to_state=Succeeded()),
    ]  # fmt: skip
    v1, v2 = _violations(tmp_path, changes)
    assert v1.line == 2 and "illegal transition: Succeed() from Pending()" in v1.reason
    assert v2.line == 4 and "goes to Running, but the record says Succeeded" in v2.reason


def test_from_state_differs_from_tracked(tmp_path: Path) -> None:
    """The recorded from-state must be the state the replayer tracked."""
    changes: list[Change] = [
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
    ]  # fmt: skip
    [v] = _violations(tmp_path, changes)
    assert v.line == 2 and "starts from Running, but the attempt is Pending" in v.reason


def test_cancel_false_while_intent_outstanding(tmp_path: Path) -> None:
    """Cancel(intent_dispatched=False) with a Dispatched intent contradicts the log."""
    changes = indeterminate_changes()[:-1] + [
        AttemptTransitioned(step="mail", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=False), to_state=Cancelled()),
    ]  # fmt: skip
    [v] = _violations(tmp_path, changes)
    assert v.line == 5 and "Cancel(intent_dispatched=False) while intent send is outstanding" in v.reason


def test_cancel_true_with_nothing_outstanding(tmp_path: Path) -> None:
    """Cancel(intent_dispatched=True) with no Dispatched intent would fake an Indeterminate."""
    changes: list[Change] = [
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="s", attempt=1, name="n", key="k"),
        IntentChanged(step="s", attempt=1, name="n", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        IntentChanged(step="s", attempt=1, name="n", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed()),
        AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()),
    ]  # fmt: skip
    [v] = _violations(tmp_path, changes)
    assert v.line == 6 and "no intent of the attempt is outstanding" in v.reason


def test_intent_change_on_an_attempt_that_is_not_running(tmp_path: Path) -> None:
    """Intents belong to Running attempts: Pending and terminal ones are refused."""
    changes: list[Change] = [
        AttemptCreated(step="s", attempt=1),
        IntentPlanned(step="s", attempt=1, name="n", key="k"),
        *simple_changes("t"),
        IntentPlanned(step="t", attempt=1, name="n", key="k"),
    ]
    v1, v2 = _violations(tmp_path, changes)
    assert v1.line == 2 and "which is Pending; only a Running attempt" in v1.reason
    assert v2.line == 7 and "which is Succeeded" in v2.reason


def test_illegal_intent_transition(tmp_path: Path) -> None:
    """An intent change must obey the intent table (Planned cannot be Confirmed)."""
    changes = simple_changes()[:2] + [
        IntentPlanned(step="s", attempt=1, name="n", key="k"),
        IntentChanged(step="s", attempt=1, name="n", from_state=Planned(), cause=Confirm(), to_state=Confirmed()),
        IntentChanged(step="s", attempt=1, name="m", from_state=Planned(), cause=Abandon(), to_state=Abandoned()),
    ]  # fmt: skip
    v1, v2 = _violations(tmp_path, changes)
    assert v1.line == 4 and "illegal intent transition: Confirm() from Planned()" in v1.reason
    assert v2.line == 5 and "'m' changes before it was planned" in v2.reason


def test_idempotency_key_must_be_stable_across_attempts(tmp_path: Path) -> None:
    """The retry of a step must reuse its intents' keys."""
    def attempt(n: int, key: str) -> list[Change]:
        return [
            AttemptCreated(step="s", attempt=n),
            AttemptTransitioned(step="s", attempt=n, from_state=Pending(), cause=Admit(), to_state=Running()),
            IntentPlanned(step="s", attempt=n, name="n", key=key),
            IntentChanged(step="s", attempt=n, name="n", from_state=Planned(), cause=Abandon(), to_state=Abandoned()),
            AttemptTransitioned(step="s", attempt=n, from_state=Running(), cause=Fail(), to_state=Failed()),
        ]  # fmt: skip

    [v] = _violations(tmp_path, attempt(1, "k1") + attempt(2, "k2"))
    assert v.line == 8 and "changed its idempotency key" in v.reason


def test_retry_created_while_previous_attempt_is_live(tmp_path: Path) -> None:
    """A new attempt while the previous one runs, or a skipped number, is a violation."""
    changes = simple_changes()[:2] + [AttemptCreated(step="s", attempt=2)]
    [v] = _violations(tmp_path, changes)
    assert v.line == 3 and "created while attempt 1 is still Running" in v.reason


def _failed_attempt(n: int, *, retry: bool, end: Change | None = None) -> list[Change]:
    """Attempt ``n`` of step 's': created, admitted, a failed result, then ``end`` (Fail by default)."""
    return [
        AttemptCreated(step="s", attempt=n),
        AttemptTransitioned(step="s", attempt=n, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step="s", attempt=n, error="ValueError: no", retryable=retry),
        end or AttemptTransitioned(step="s", attempt=n, from_state=Running(), cause=Fail(), to_state=Failed()),
    ]  # fmt: skip


def test_no_attempt_follows_a_result_that_said_retry_false(tmp_path: Path) -> None:
    """A `retry: false` result ends its step: an attempt created after it is a violation."""
    [v] = _violations(tmp_path, _failed_attempt(1, retry=False) + _failed_attempt(2, retry=True))
    assert v == Violation(
        line=5,
        reason="attempt 2 of step 's' of run 'r' created after attempt 1's result said"
        " retry: false; that result ends the step",
    )


def test_no_attempt_follows_retry_false_even_when_a_crash_ended_the_attempt_cancelled(tmp_path: Path) -> None:
    """A crash between the `retry: false` result and its Fail ends the attempt Cancelled; the step still ends."""
    cancelled = AttemptTransitioned(
        step="s", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=False), to_state=Cancelled()
    )
    [v] = _violations(tmp_path, _failed_attempt(1, retry=False, end=cancelled) + _failed_attempt(2, retry=True))
    assert v.line == 5 and "result said retry: false" in v.reason


def test_a_retry_after_a_result_without_the_field_is_no_violation(tmp_path: Path) -> None:
    """A failed result that may be retried (no `retry` field) lets attempt 2 follow."""
    assert _violations(tmp_path, _failed_attempt(1, retry=True) + _failed_attempt(2, retry=False)) == []


def test_no_attempt_follows_a_succeeded_one(tmp_path: Path) -> None:
    """A step whose attempt Succeeded is done: another attempt of it is a violation."""
    [v] = _violations(tmp_path, simple_changes() + _failed_attempt(2, retry=True))
    assert v == Violation(
        line=5, reason="attempt 2 of step 's' of run 'r' created after attempt 1 Succeeded; that step is done"
    )


def test_records_after_run_finished_and_unfinished_attempts(tmp_path: Path) -> None:
    """run_finished with a live attempt, then any record of that run, are violations."""
    changes = simple_changes()[:2] + [RunFinished(), AttemptCreated(step="x", attempt=1)]
    v1, v2 = _violations(tmp_path, changes)
    assert v1.line == 3 and "finished while attempt 1 of step 's' is still Running" in v1.reason
    assert v2.line == 4 and "after the run finished" in v2.reason


def test_sequence_gap_and_repeat(tmp_path: Path) -> None:
    """Sequence numbers must go up by exactly one."""
    creations: list[Change] = [AttemptCreated(step=f"s{i}", attempt=1) for i in range(4)]
    path = write_log(tmp_path / "log", creations)
    lines = path.read_bytes().splitlines(keepends=True)
    report = replay(_write(tmp_path / "gap", [lines[0], lines[2], lines[3]]))
    assert [(v.line, "3 where 2 was expected (a gap)" in v.reason) for v in report.violations] == [
        (2, True)
    ]
    report = replay(_write(tmp_path / "rep", [lines[0], lines[1], lines[1], lines[2]]))
    assert [v.line for v in report.violations if "(a repeat)" in v.reason] == [3]


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def test_corrupt_middle_line_is_a_violation_and_the_rest_is_checked(tmp_path: Path) -> None:
    """Corruption is reported by line, and later records are still replayed."""
    path = write_log(tmp_path / "log", simple_changes() + indeterminate_changes())
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"Admit", b"Adm1t")
    report = replay(_write(path, lines))
    assert report.violations[0] == Violation(
        line=2, reason="corrupt line: checksum mismatch (the line was altered)"
    )
    assert len(report.indeterminate) == 1  # the later attempt was still followed


# ------------------------------------------------------------------ CLI


def test_cli_replay_valid_log_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """`replay` on the example prints the report and exits 0."""
    assert main(["replay", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "attempts by final state: Pending 0, Running 0, Succeeded 2, Failed 1, " in out
    assert "Indeterminate 1, Cancelled 1, TimedOut 1" in out
    assert "ak1-f2e4fb06edd92da1dc128a19cba45352" in out
    assert out.endswith("verdict: valid\n")


def test_cli_replay_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --json` prints one JSON document with the same facts."""
    assert main(["replay", "--json", str(EXAMPLE)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is True and doc["records"] == 32
    assert doc["final_states"]["Indeterminate"] == 1
    assert doc["indeterminate"][0]["outstanding_keys"] == ["ak1-f2e4fb06edd92da1dc128a19cba45352"]
    assert doc["violations"] == [] and doc["torn_tail"] is None


def test_cli_replay_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --metrics` prints the Prometheus text format ending in # EOF, counters as _total
    (their TYPE too), a journal label."""
    assert main(["replay", "--metrics", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out.splitlines()
    where = f'journal="{EXAMPLE}"'
    assert "# TYPE attempt_kernel_log_attempts_total counter" in out
    assert f'attempt_kernel_log_attempts_total{{{where},state="Indeterminate"}} 1' in out
    assert f'attempt_kernel_log_attempts_total{{{where},state="Succeeded"}} 2' in out
    assert not [line for line in out if 'state="Pending"' in line or 'state="Running"' in line]
    # the names a live worker serves, so the shipped alerting rules apply to a log file too
    assert f"attempt_kernel_indeterminate_attempts{{{where}}} 1" in out
    assert f"attempt_kernel_outstanding_intents{{{where}}} 1" in out
    assert f"attempt_kernel_log_violations{{{where}}} 0" in out
    assert out[-1] == "# EOF"


def test_cli_replay_metrics_exits_0_with_violations_and_escapes_the_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --metrics the violations are a metric, so `> f.tmp && mv f.tmp f.prom` still updates."""
    path = write_log(tmp_path / 'we"ird\\log', simple_changes()[:1] + simple_changes()[3:])
    assert main(["replay", "--metrics", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    label = str(path).replace("\\", "\\\\").replace('"', '\\"')
    assert f'attempt_kernel_log_violations{{journal="{label}"}} 1' in out


def test_cli_replay_violations_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log with a violation exits 1 and names the line."""
    path = write_log(tmp_path / "log", simple_changes()[:1] + simple_changes()[3:])
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "  line 2: transition Running -> Succeeded" in out and "verdict: INVALID" in out


@pytest.mark.parametrize("name", ["missing.jsonl", "."])
def test_cli_replay_io_error_exits_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file or a directory exits 2 with a message naming the path."""
    assert main(["replay", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attempt-kernel replay: error: ") and str(tmp_path) in err


def test_cli_replay_needs_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    """`replay` without LOG is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as info:
        main(["replay"])
    assert info.value.code == 2
    assert "the following arguments are required: LOG" in capsys.readouterr().err


def test_replay_does_not_write_to_the_log(tmp_path: Path) -> None:
    """The replayer only reads: bytes and mtime are unchanged."""
    path = write_log(tmp_path / "log", simple_changes())
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    replay(path)
    main(["replay", "--json", str(path)])
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_run_started_twice_or_after_its_records(tmp_path: Path) -> None:
    """run_started opens a run once, before its other records."""
    from attempt_kernel import RunStarted

    changes: list[Change] = [
        RunStarted(workflow="w"),
        AttemptCreated(step="s", attempt=1),
        RunStarted(workflow="w"),
    ]
    [v] = _violations(tmp_path, changes)
    assert v.line == 3 and "started twice (or after its records)" in v.reason
