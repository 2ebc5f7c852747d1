"""docs/tutorial.md's session is real: replayed in a fresh folder, it prints what the doc shows.

Every ``$ command`` of the tutorial's ```console blocks runs, in order, in
one fresh folder holding a copy of examples/tutorial/flows.py, through
``bash -c`` with ``attempt-kernel`` on ``PATH`` meaning ``sys.executable -m
attempt_kernel``; stdout and stderr are read together, as a terminal shows
them. Only timestamps are normalised. A command killed by a signal is
reported as an interactive shell reports it (``Killed`` for SIGKILL); the
exit codes the tutorial's prose gives are checked against a hand-written
list. The workflow file also passes `mypy --strict` and pyright strict.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
FLOWS = ROOT / "examples" / "tutorial" / "flows.py"
TIMESTAMP = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\b")
CONSOLE = re.compile(r"^```console\n(.*?)^```", re.DOTALL | re.MULTILINE)
TEXT = re.compile(r"^```text\n(.*?)^```", re.DOTALL | re.MULTILINE)

# Written by hand from the tutorial's prose, one per `$` command, in order.
EXIT_CODES = [
    0,  # run: succeeded
    137,  # run, crashed in email-receipt (128 + SIGKILL)
    0,  # runs
    0,  # show
    2,  # recover without --workflows: refused
    0,  # recover --workflows: the log is valid (the run needs reconciliation)
    0,  # runs
    0,  # cat outbox.json
    0,  # reconcile --rejected
    0,  # runs
    0,  # recover --workflows: the email is sent again
    0,  # show
    0,  # cat outbox.json
    137,  # run, crashed in charge-card
    0,  # recover --workflows: the reconciler answers
    0,  # show
    0,  # cat bank.json
]

pytestmark = pytest.mark.slow


def _session() -> list[tuple[str, str]]:
    """(command, expected output) for each `$` line of the console blocks, in order."""
    steps: list[tuple[str, str]] = []
    for block in CONSOLE.findall(TUTORIAL.read_text()):
        for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, _, output = chunk.partition("\n")
            steps.append((command, output))
    return steps


def _normalised(text: str) -> str:
    return TIMESTAMP.sub("<timestamp>", text)


def _shell(command: str, cwd: Path, path: str) -> tuple[int, str]:
    """Exit code and output of one command, as an interactive shell would show them."""
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, "PATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=60,
    )
    output = result.stdout
    if result.returncode < 0:  # bash -c exec'd it, so the signal is ours to report
        number = -result.returncode
        output += "Killed\n" if number == signal.SIGKILL else f"{signal.strsignal(number)}\n"
        return 128 + number, output
    return result.returncode, output


def test_the_tutorial_session_prints_what_the_doc_shows(tmp_path: Path) -> None:
    """Each command of the tutorial, run in a fresh folder, prints the doc's output and exit code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "attempt-kernel"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m attempt_kernel "$@"\n')
    wrapper.chmod(0o755)
    work = tmp_path / "shop"
    work.mkdir()
    shutil.copy(FLOWS, work / "flows.py")
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    session = _session()
    assert len(session) == len(EXIT_CODES), [command for command, _ in session]
    for (command, expected), code in zip(session, EXIT_CODES):
        got_code, got = _shell(command, work, path)
        assert _normalised(got) == _normalised(expected), f"$ {command}"
        assert got_code == code, f"$ {command}\n{got}"


def test_the_tutorial_quotes_lines_of_the_workflow_file() -> None:
    """Each line of the tutorial's excerpts of flows.py is a line of the file, in order."""
    source = FLOWS.read_text().splitlines()
    blocks = TEXT.findall(TUTORIAL.read_text())
    assert blocks
    for block in blocks:
        at = 0
        for line in block.splitlines():
            if line.strip() == "...":
                continue
            assert line in source[at:], line
            at = source.index(line, at) + 1


def test_the_workflow_file_passes_mypy_strict() -> None:
    """examples/tutorial/flows.py has no error under the project's `mypy --strict`."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(FLOWS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_workflow_file_passes_pyright_strict(tmp_path: Path) -> None:
    """examples/tutorial/flows.py has no error under pyright in strict mode, as user code."""
    shutil.copy(FLOWS, tmp_path / "flows.py")
    config = {"typeCheckingMode": "strict", "include": ["flows.py"]}
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "pyright", "--pythonpath", sys.executable, "flows.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
