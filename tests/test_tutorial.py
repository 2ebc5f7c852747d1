"""docs/tutorial.md's session is real: replayed in a fresh folder, it prints what the doc shows.

Every ``$ command`` of the tutorial's ```console blocks runs, in order, in
one fresh folder holding a copy of examples/tutorial/flows.py (tests/sessions.py
says how). Only timestamps and idempotency keys are normalised: each key the
tutorial shows is paired with the key the session printed in its place, by
order of first appearance, and later commands get the session's key
(``reconcile --key ...``). bank.json and outbox.json list their keys in the
order the effects happened (flows.py never sorts them), so the pairing is the
same in every session. The exit codes the tutorial's prose gives are checked
against a hand-written list. The workflow file also passes `mypy --strict`
and pyright strict.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sessions import attempt_kernel_on_path, missing_line, replay_session, text_blocks

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
FLOWS = ROOT / "examples" / "tutorial" / "flows.py"
PAYER = ROOT / "examples" / "approval" / "payer.py"

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
    # waiting for a human (payer.py)
    0,  # run, killed by the shell once it waits (the shell's last command is cat)
    0,  # runs: waiting
    0,  # cat messages.json
    0,  # signal: recorded
    0,  # runs: still waiting, its signal came
    0,  # recover: the signal is taken, the card charged
    0,  # cat payments.json
    0,  # show
    0,  # run while a second shell sends a denial through the inbox: succeeded
    0,  # cat signal.out
    0,  # run whose wait times out: succeeded (expired)
    1,  # run cancelled from a second shell while it waits
    0,  # cat cancel.out
]

pytestmark = pytest.mark.slow


def test_the_tutorial_session_prints_what_the_doc_shows(tmp_path: Path) -> None:
    """Each command of the tutorial, run in a fresh folder, prints the doc's output and exit code."""
    path = attempt_kernel_on_path(tmp_path / "bin")
    work = tmp_path / "shop"
    work.mkdir()
    shutil.copy(FLOWS, work / "flows.py")
    shutil.copy(PAYER, work / "payer.py")
    replay_session(TUTORIAL, work, path, EXIT_CODES)


def test_the_tutorial_quotes_lines_of_the_workflow_files() -> None:
    """Each of the tutorial's excerpts is lines of flows.py or of payer.py, in order."""
    sources = [FLOWS.read_text().splitlines(), PAYER.read_text().splitlines()]
    blocks = text_blocks(TUTORIAL)
    assert len(blocks) >= 2
    for block in blocks:
        assert any(missing_line(block, source) is None for source in sources), block


@pytest.mark.parametrize("example", [FLOWS, PAYER], ids=["flows", "payer"])
def test_the_workflow_file_passes_mypy_strict(example: Path) -> None:
    """examples/tutorial/flows.py and examples/approval/payer.py have no error under `mypy --strict`."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(example)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("example", [FLOWS, PAYER], ids=["flows", "payer"])
def test_the_workflow_file_passes_pyright_strict(tmp_path: Path, example: Path) -> None:
    """The tutorial's workflow files have no error under pyright in strict mode, as user code."""
    shutil.copy(example, tmp_path / "flows.py")
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
