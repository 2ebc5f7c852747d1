"""What the command line refuses before it writes anything: log paths that name a
folder, default log names a workflow's name would move out of the current folder,
JSON nested too deep or holding a number no log can carry.

Each refusal exits 2 with one line on stderr naming the option, and leaves the
folder (and any log in it) byte for byte as it was. The workflows are those of
cliflows.py and pathflows.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attempt_kernel import LogOpenError
from attempt_kernel._inbox import inbox_path
from attempt_kernel.cli._main import main


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (folders by name alone)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize("log", [".", "", "/", "sub/.."])
def test_run_with_a_log_that_names_a_folder_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], log: str
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    assert main(["run", "cliflows:GREETER", "--log", log, "--input", '"ada"']) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"attempt-kernel run: error: --log {log!r} names a folder, not a run log file"
        " (give a file name, e.g. --log runs.jsonl)\n"
    )
    assert listing(tmp_path) == before


def test_a_path_that_names_no_file_has_no_inbox() -> None:
    with pytest.raises(LogOpenError, match=r"^'\.': names a folder, not a run log file, so it has no inbox$"):
        inbox_path(".")


@pytest.mark.parametrize(("target", "name"), [("pathflows:UPWARD", "../escaped"), ("pathflows:NESTED", "a/b")])
def test_run_without_log_refuses_a_workflow_name_that_is_no_plain_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str, name: str
) -> None:
    """The default log is <workflow>.jsonl in the current folder, never elsewhere."""
    here = tmp_path / "here"
    (here / "a").mkdir(parents=True)
    monkeypatch.chdir(here)
    before = listing(tmp_path)
    assert main(["run", target]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"attempt-kernel run: error: workflow {name!r} has a name that is not a plain file name,"
        " so <workflow>.jsonl would not be a file in the current folder; give the log with --log PATH\n"
    )
    assert listing(tmp_path) == before


def test_such_a_workflow_runs_with_an_explicit_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "pathflows:UPWARD", "--log", "up.jsonl"]) == 0
    assert "run result: 1\n" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["up.jsonl"]
