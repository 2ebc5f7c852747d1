"""`--json` on every command that prints a result: one JSON object on stdout, keys as
docs/cli.md ("JSON output") lists them, errors on stderr with the usual exit codes.

The expected objects are written out by hand from the workflows in cliflows.py
and waitflows.py; what varies (a submitted run's random id) is checked by shape.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

import pytest

from attempt_kernel import IntentReconciled, Record, RunLogWriter, RunStarted, read_log
from attempt_kernel.cli._main import main
from logs import indeterminate_changes, write_log
from test_cli_waits import waiting_log

RUN = "a-1"

ALL_STATES_ZERO = {
    "Pending": 0, "Running": 0, "Succeeded": 0, "Failed": 0, "Indeterminate": 0, "Cancelled": 0, "TimedOut": 0,
}  # fmt: skip


def one_object(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """What the command printed: exactly one JSON object and nothing else on stdout."""
    out = capsys.readouterr().out
    assert out.startswith("{") and out.endswith("}\n"), out
    doc = json.loads(out)
    return cast("dict[str, object]", doc)


def test_run_json_is_the_report_and_says_it_ran(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "g.jsonl"
    assert main(["run", "cliflows:GREETER", "--log", str(log), "--input", '"ada"', "--json"]) == 0
    report: dict[str, object] = {
        "run": "greeter-1",
        "workflow": "greeter",
        "status": "succeeded",
        "steps": [{"step": "greet@1", "state": "Succeeded", "attempts": 1, "error": None, "outstanding_keys": []}],
        "result": {"greeting": "hello ada"},
        "error": None,
    }
    assert one_object(capsys) == {"log": str(log), "ran": True, **report}
    # The same id again: nothing runs, the recorded report is printed, "ran" is false.
    assert main(["run", "cliflows:GREETER", "--log", str(log), "--run", "greeter-1", "--json"]) == 0
    assert one_object(capsys) == {"log": str(log), "ran": False, **report}


def test_show_json_of_a_code_run_that_never_waited_has_empty_waits_and_signals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/cli.md promises `waits` and `signals` for every code run: a code run with no
    wait and no signal had neither key (a consumer reading them got a KeyError)."""
    log = tmp_path / "g.jsonl"
    assert main(["run", "cliflows:GREETER", "--log", str(log), "--input", '"ada"']) == 0
    capsys.readouterr()
    assert main(["show", str(log), "greeter-1", "--json"]) == 0
    shown = one_object(capsys)
    assert (shown["waits"], shown["signals"]) == ([], [])


def test_run_json_of_a_failed_run_exits_1_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "r.jsonl"
    assert main(["run", "cliflows:REFUSER", "--log", str(log), "--json"]) == 1
    assert one_object(capsys) == {
        "log": str(log),
        "ran": True,
        "run": "refuser-1",
        "workflow": "refuser",
        "status": "failed",
        "steps": [{"step": "refuse@1", "state": "Failed", "attempts": 1, "error": "ValueError: no", "outstanding_keys": []}],
        "result": None,
        "error": "StepFailed: step 'refuse@1' of run 'refuser-1' did not succeed (attempt 1: Failed): ValueError: no",
    }  # fmt: skip


def test_signal_then_recover_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The waiting run is signalled (recorded: no process holds the log), then `recover`
    resumes it to its end; its object holds the report and the replay of the log."""
    log = waiting_log(tmp_path / "a.jsonl")
    assert main(["signal", str(log), RUN, "approve", "--payload", '{"by":"ana"}', "--json"]) == 0
    assert one_object(capsys) == {
        "log": str(log), "run": RUN, "signal": "approve", "payload": {"by": "ana"}, "recorded": True,
    }  # fmt: skip
    assert main(["recover", "--workflows", "waitflows:APPROVER", str(log), "--json"]) == 0
    ok: dict[str, object] = {"error": None, "outstanding_keys": [], "state": "Succeeded", "attempts": 1}
    assert one_object(capsys) == {
        "log": str(log),
        "changed_nothing": False,
        "left_alone": [],
        "queued": [],
        "taken_in": [],
        "torn_tail": None,
        "asked": [],
        "orphans_ended": [],
        "closed": [],
        "resumed": [{"run": RUN, "workflow": "approver"}],
        "left_waiting": [],
        "can_go_on": [],
        "reports": [
            {
                "run": RUN,
                "workflow": "approver",
                "status": "succeeded",
                "steps": [{"step": "ask@1", **ok}, {"step": "charge@3", **ok}],
                "result": {"answer": {"by": "ana"}, "charged": {"charged": 40}},
                "error": None,
            }
        ],
        "diverged": [],
        "replay": {
            "log": str(log),
            "valid": True,
            # run_started; ask: step_called, created, admitted, result, succeeded; wait_started,
            # signal_sent, run_resumed, wait_ended; charge: step_called, created, admitted, its
            # intent planned, dispatched, confirmed, result, succeeded; run_finished: 1+5+4+8+1
            "records": 19,
            "final_states": {**ALL_STATES_ZERO, "Succeeded": 2},
            "unresolved_intents": 0,
            "indeterminate": [],
            "to_reconcile": [],
            "torn_tail": None,
            "unfinished_runs": [],
            "violation_count": 0,
            "violations": [],
        },
    }


def test_recover_json_of_a_log_with_nothing_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"")
    assert main(["recover", str(log), "--json"]) == 0
    doc = one_object(capsys)
    assert doc["changed_nothing"] is True
    assert doc["resumed"] == [] and doc["reports"] == []
    assert doc["replay"] == {
        "log": str(log), "valid": True, "records": 0, "final_states": ALL_STATES_ZERO,
        "unresolved_intents": 0, "indeterminate": [], "to_reconcile": [], "torn_tail": None,
        "unfinished_runs": [], "violation_count": 0, "violations": [],
    }  # fmt: skip


def test_signal_json_to_a_held_log_says_it_waits_in_the_inbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    with RunLogWriter(log):  # another process writes the log
        assert main(["signal", str(log), RUN, "approve", "--json"]) == 0
    assert one_object(capsys) == {"log": str(log), "run": RUN, "signal": "approve", "payload": {}, "recorded": False}


def test_cancel_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    assert main(["cancel", str(log), RUN, "--reason", "no need", "--json"]) == 0
    assert one_object(capsys) == {"log": str(log), "run": RUN, "reason": "no need", "recorded": True}


def test_resume_json_says_what_was_done(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    assert main(["signal", str(log), RUN, "approve"]) == 0
    capsys.readouterr()
    assert main(["resume", str(log), RUN, "--workflows", "waitflows:APPROVER", "--json"]) == 0
    assert one_object(capsys) == {
        "log": str(log), "run": RUN, "resumed": "run 'a-1' was resumed and ended succeeded",
        "asked": [], "orphans_ended": [],  # it only waited: no attempt was orphaned
    }  # fmt: skip


def test_reconcile_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "m.jsonl", [RunStarted(workflow="mailer"), *indeterminate_changes()])
    argv = ["reconcile", str(log), "--key", "k-send", "--confirmed", "--result", '{"id":7}', "--note", "in the outbox"]
    assert main([*argv, "--json"]) == 0
    assert one_object(capsys) == {
        "log": str(log), "run": "r", "step": "mail", "attempt": 1, "intent": "send", "key": "k-send",
        "verdict": "confirmed", "result": {"id": 7}, "recorded": True, "still_outstanding": [],
    }  # fmt: skip
    [reconciled] = [i.change for i in read_log(log) if isinstance(i, Record) and isinstance(i.change, IntentReconciled)]
    assert reconciled.note == "in the outbox"


def test_demo_json_holds_the_run_and_the_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "demo.jsonl"
    assert main(["demo", "--log", str(log), "--json"]) == 0
    doc = one_object(capsys)
    assert list(doc) == ["log", "run", "workflow", "status", "steps", "result", "error", "replay"]
    assert (doc["log"], doc["run"], doc["workflow"], doc["status"]) == (str(log), "trip-1", "trip-planner", "cancelled")
    steps = cast("list[dict[str, object]]", doc["steps"])
    assert [(s["step"], s["state"], s["attempts"]) for s in steps] == [
        ("fetch-profile", "Succeeded", 1),
        ("search-flights", "Succeeded", 2),
        ("check-visa", "TimedOut", 1),
        ("book-flight", "Succeeded", 1),
        ("send-itinerary", "Succeeded", 1),
        ("watch-prices", "Cancelled", 1),
    ]
    replayed = doc["replay"]
    assert isinstance(replayed, dict)
    assert (replayed["valid"], replayed["unfinished_runs"], replayed["violations"]) == (True, [], [])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["signal", "{log}", "a-9", "approve", "--json"], "attempt-kernel signal: error: signal 'approve' to run 'a-9': no run 'a-9' in {log}\n"),
        (["cancel", "{log}", "a-9", "--json"], "attempt-kernel cancel: error: cancel of run 'a-9': no run 'a-9' in {log}\n"),
        (["reconcile", "{log}", "--key", "nope", "--rejected", "--json"],
         "attempt-kernel reconcile: error: no intent with key 'nope' is outstanding in {log}\n"),
        (["resume", "{log}", "a-9", "--json"], "attempt-kernel resume: error: no run 'a-9' in "),
        (["run", "cliflows:NOPE", "--log", "{log}", "--json"], "attempt-kernel run: error: module 'cliflows' has no attribute 'NOPE'"),
        (["recover", "{log}", "--json", "--workflows", "cliflows:GREETER", "--workflows", "cliflows:GREETER"],
         "attempt-kernel recover: error: two workflows are named 'greeter'"),
    ],
    ids=["signal", "cancel", "reconcile", "resume", "run", "recover"],
)  # fmt: skip
def test_an_error_under_json_prints_nothing_on_stdout_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    log = waiting_log(tmp_path / "a.jsonl")
    before = log.read_bytes()
    assert main([str(log) if part == "{log}" else part for part in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message.replace("{log}", str(log))), captured.err
    assert log.read_bytes() == before


@pytest.mark.postgres
def test_submit_pool_pools_and_show_json_on_postgresql(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", db, "cliflows:GREETER", "--input", '"bo"', "--json"]) == 0
    submitted = one_object(capsys)
    assert list(submitted) == ["log", "run", "workflow"]
    assert submitted["workflow"] == "greeter"
    run = submitted["run"]
    assert isinstance(run, str) and re.fullmatch(r"greeter-[0-9a-f]{12}", run), run
    assert main(["submit", db, "cliflows:GREETER", "--run", "mine", "--json"]) == 0
    assert one_object(capsys) == {"log": db, "run": "mine", "workflow": "greeter"}
    assert main(["pools", db, "--json"]) == 0
    assert one_object(capsys) == {"log": db, "pools": []}
    assert main(["pool", db, "llm", "--slots", "2", "--json"]) == 0
    assert one_object(capsys) == {"log": db, "pool": "llm", "slots": 2, "held": 0}
    assert main(["pool", db, "gpu", "--slots", "0", "--json"]) == 0
    assert one_object(capsys) == {"log": db, "pool": "gpu", "slots": 0, "held": 0}
    assert main(["pools", db, "--json"]) == 0
    assert one_object(capsys) == {
        "log": db, "pools": [{"pool": "gpu", "slots": 0, "held": 0}, {"pool": "llm", "slots": 2, "held": 0}],
    }  # fmt: skip
    assert main(["resume", db, "mine", "--json"]) == 0
    resumed = one_object(capsys)
    assert list(resumed) == ["log", "run", "resumed", "asked", "orphans_ended"]
    assert (resumed["log"], resumed["run"], resumed["asked"], resumed["orphans_ended"]) == (db, "mine", [], [])
    assert main(["submit", db, "cliflows:GREETER", "--run", "mine", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("attempt-kernel submit: error: ")
