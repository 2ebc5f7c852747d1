"""docs/agents.md is real: its session, replayed in a fresh folder, prints what the doc shows.

Every ``$ command`` of the doc's ```console blocks runs, in order, in one
fresh folder holding copies of examples/agent/agent.py and agent_v2.py
(tests/sessions.py says how; only timestamps and idempotency keys are
normalised). The exit codes the doc's prose gives are checked against a
hand-written list. The doc's excerpts are lines of those files, both files
pass `mypy --strict` and pyright strict as user code, and the doc's Python
example does what its prose says after a crash.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest
from sessions import attempt_kernel_on_path, missing_line, replay_session, shell, text_blocks, workflow_in

from attempt_kernel import Asked, Executor, RunLogWriter, Workflow, resume_log

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "agents.md"
AGENT = ROOT / "examples" / "agent"
FILES = [AGENT / "agent.py", AGENT / "agent_v2.py"]

# Written by hand from the doc's prose, one per `$` command, in order.
EXIT_CODES = [
    0,  # run: succeeded
    137,  # run, crashed in the email (128 + SIGKILL)
    0,  # runs
    0,  # show
    0,  # recover: the reconciler finds the email, the run succeeds
    0,  # show | sed: the email step's two attempts
    0,  # cat mailbox.json
    137,  # run, crashed in the email again
    0,  # cp the log
    2,  # recover with agent_v2: diverged
    0,  # cmp: the log is unchanged
    0,  # recover with the old code: succeeded
    2,  # recover given two workflows of one name: refused
    0,  # run agent_v2: succeeded
    0,  # grep the versions
]

pytestmark = pytest.mark.slow


def _folder(tmp_path: Path) -> tuple[Path, str]:
    """A fresh folder holding the two example files, and a PATH with attempt-kernel."""
    path = attempt_kernel_on_path(tmp_path / "bin")
    work = tmp_path / "agent"
    work.mkdir()
    for file in FILES:
        shutil.copy(file, work / file.name)
    return work, path


def test_the_agent_session_prints_what_the_doc_shows(tmp_path: Path) -> None:
    """Each command of docs/agents.md, run in a fresh folder, prints the doc's output and exit code."""
    work, path = _folder(tmp_path)
    replay_session(DOC, work, path, EXIT_CODES)


def test_the_doc_s_times_show_the_retry_waits_its_prose_gives() -> None:
    """The session's comparison leaves times out, so they are checked here: the shown
    `exchange_rate@4` attempts start a second and then two apart (the prose, and
    `RetryPolicy`'s default backoff). A transcript once showed them in one millisecond."""
    text = DOC.read_text()
    step = text[text.index("  step exchange_rate@4\n") : text.index("  step think@5\n")]
    created = [
        datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
        for stamp in re.findall(r"(\S+)  created\n", step)
    ]  # fmt: skip
    assert len(created) == 3
    gaps = [(b - a).total_seconds() for a, b in zip(created, created[1:])]
    assert 1.0 <= gaps[0] < 1.5 and 2.0 <= gaps[1] < 2.5, gaps


def test_the_doc_quotes_lines_of_the_example_files() -> None:
    """Each excerpt in docs/agents.md is lines of agent.py or of agent_v2.py, in order."""
    sources = [file.read_text().splitlines() for file in FILES]
    blocks = text_blocks(DOC)
    assert len(blocks) == 6
    for block in blocks:
        assert any(missing_line(block, source) is None for source in sources), block


def test_the_example_files_pass_mypy_strict() -> None:
    """agent.py and agent_v2.py have no error under the project's `mypy --strict`."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *map(str, FILES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_files_pass_pyright_strict(tmp_path: Path) -> None:
    """agent.py and agent_v2.py have no error under pyright in strict mode, as user code."""
    for file in FILES:
        shutil.copy(file, tmp_path / file.name)
    config = {"typeCheckingMode": "strict", "include": ["agent.py", "agent_v2.py"]}
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    result = subprocess.run(
        [sys.executable, "-m", "pyright", "--pythonpath", sys.executable],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors" in result.stdout


def test_the_determinism_example_gets_its_recorded_clock_and_choice_back_after_a_crash(
    tmp_path: Path,
) -> None:
    """docs/agents.md's greeter, cut off before its run finished, recovers to the same result."""
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    namespace: dict[str, object] = {"__name__": "agents_doc"}
    exec(compile(block, "docs/agents.md", "exec"), namespace)
    greeter = namespace["greeter"]
    assert isinstance(greeter, Workflow)
    log = tmp_path / "greeter.jsonl"

    async def first() -> object:
        with RunLogWriter(log) as writer:
            return (await Executor(writer).run(greeter, "greeter-1")).result

    result = asyncio.run(first())
    lines = log.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["type"] == "run_finished"
    crashed = tmp_path / "crashed.jsonl"
    crashed.write_bytes(b"".join(lines[:-1]))  # both steps succeeded; the run never finished
    [again] = resume_log(crashed, [greeter]).reports
    assert again.status == "succeeded"
    assert again.result == result  # a new clock reading would differ


# --------------------------------------------------------------------------
# Library bugs found while writing docs/agents.md (remove the mark once fixed)
# --------------------------------------------------------------------------


def _crashed_agent_run(tmp_path: Path) -> tuple[Path, str]:
    """A folder whose assistant.jsonl holds assistant-1, killed while its email was being sent."""
    work, path = _folder(tmp_path)
    shutil.copy(ROOT / "examples" / "tutorial" / "flows.py", work / "flows.py")
    code, _ = shell(
        "CRASH_DURING=email attempt-kernel run agent:assistant"
        """ --input '{"customer": "ada@example.com", "wants": "a EuroPython ticket"}'""",
        work,
        path,
    )
    assert code == 137
    return work, path


def test_recover_given_workflows_flag_twice_uses_both(tmp_path: Path) -> None:
    """`--workflows A --workflows B` gives recover both A and B."""
    work, path = _crashed_agent_run(tmp_path)
    code, out = shell(
        "attempt-kernel recover assistant.jsonl --workflows agent:assistant --workflows flows:orders",
        work,
        path,
    )
    assert code == 0, out
    assert "run status: succeeded" in out


def test_recover_of_a_code_run_says_what_the_reconciler_found(tmp_path: Path) -> None:
    """recover prints the reconciler's answer and the orphan's end for a code run, as for a DAG's."""
    work, path = _crashed_agent_run(tmp_path)
    code, out = shell("attempt-kernel recover assistant.jsonl --workflows agent:assistant", work, path)
    assert code == 0, out
    assert "asked the reconciler of assistant-1 / send_email@8 #1 about email (ak1-" in out
    assert "): it happened (intent Confirmed)" in out
    assert "ended orphaned attempt assistant-1 / send_email@8 #1: Running -> Cancelled" in out


def test_resume_log_tells_a_code_runs_answers_as_they_come_then_as_taken_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resume_log(on_asked=...)` hears what the email's reconciler said before the run's
    taking up is told (`on_taken_up`, once it is durable): a caller whose write fails in
    between still knows it."""
    work, _ = _crashed_agent_run(tmp_path)
    monkeypatch.chdir(work)  # the example's bank and mailbox are files in its folder
    assistant = workflow_in(work / "agent.py", "assistant", "agents_on_asked")
    told: list[tuple[str, list[tuple[str, str, int, str, str]]]] = []

    def answers(asked: Sequence[Asked]) -> list[tuple[str, str, int, str, str]]:
        return [(a.run, a.step, a.attempt, a.intent, type(a.finding).__name__) for a in asked]

    resumed = resume_log(
        work / "assistant.jsonl",
        [assistant],
        on_asked=lambda asked: told.append(("asked", answers(asked))),
        on_taken_up=lambda done: told.append(("taken up", answers(done.asked))),
    )
    assert [r.status for r in resumed.reports] == ["succeeded"]
    email = [("assistant-1", "send_email@8", 1, "email", "EffectHappened")]
    assert told == [("asked", email), ("taken up", email)]
