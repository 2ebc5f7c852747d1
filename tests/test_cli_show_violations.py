"""`show RUN` of a log that breaks the kernel's rules says so, as `runs` does.

The log is written line by line (`test_cli_export.numbered`): run 'r' succeeds, but its
records are numbered 1, 2, 4, 5, 6, 7 (a gap: one violation, nothing else wrong).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_export import numbered

from attempt_kernel.cli._main import main


def test_show_warns_of_a_log_that_breaks_the_rules_as_runs_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = numbered(tmp_path / "gap.jsonl", [1, 2, 4, 5, 6, 7])
    warning = f"warning: the log breaks the kernel's rules 1 time(s); see `attempt-kernel replay {log}`\n"
    assert main(["runs", str(log)]) == 0
    assert capsys.readouterr().out.endswith(warning)
    assert main(["show", str(log), "r"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("run r (workflow w): succeeded\n")
    assert out.endswith(warning)


def test_show_json_counts_the_violations_as_runs_json_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = numbered(tmp_path / "gap.jsonl", [1, 2, 4, 5, 6, 7])
    assert main(["show", str(log), "r", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["run"], doc["status"], doc["violations"]) == ("r", "succeeded", 1)


def test_show_of_a_log_without_fault_has_no_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = numbered(tmp_path / "ok.jsonl", [1, 2, 3, 4, 5, 6])
    assert main(["show", str(log), "r"]) == 0
    assert "warning" not in capsys.readouterr().out
    assert main(["show", str(log), "r", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["violations"] == 0


def test_runs_warns_of_a_file_that_is_no_run_log_though_it_lists_no_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two lines of prose: no run, two lines that are no records. `runs --json` counted them,
    the text said only `no runs in ...`, exit 0, as if the log were sound."""
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\nnot a run log\n")
    assert main(["runs", str(notes)]) == 0
    assert capsys.readouterr().out == (
        f"no runs in {notes}\n"
        f"warning: the log breaks the kernel's rules 2 time(s); see `attempt-kernel replay {notes}`\n"
    )
    assert main(["runs", str(notes), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["violations"] == 2


def test_runs_warns_when_its_filters_keep_no_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = numbered(tmp_path / "gap.jsonl", [1, 2, 4, 5, 6, 7])
    assert main(["runs", str(log), "--status", "failed"]) == 0
    assert capsys.readouterr().out == (
        f"no runs in {log} match the filters\n"
        f"warning: the log breaks the kernel's rules 1 time(s); see `attempt-kernel replay {log}`\n"
    )


def test_runs_and_show_quote_the_replay_they_suggest_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path with a space: `show` quoted it for the shell, `runs` did not."""
    log = numbered(tmp_path / "my gap.jsonl", [1, 2, 4, 5, 6, 7])
    warning = f"warning: the log breaks the kernel's rules 1 time(s); see `attempt-kernel replay '{log}'`\n"
    assert main(["runs", str(log)]) == 0
    assert capsys.readouterr().out.endswith(warning)
    assert main(["show", str(log), "r"]) == 0
    assert capsys.readouterr().out.endswith(warning)
