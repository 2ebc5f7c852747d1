"""The README's code runs and says what it claims."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attempt_kernel import JSON, Executor, RunLogWriter, RunObserver, SignalSent, Step, StepContext, Workflow, load_workflow

README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_readme_usage_opens_with_a_code_workflow_that_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's first Python example, run as a script, runs its workflow and prints the comment."""
    usage = README.read_text().split("## Usage\n", 1)[1]
    first = _readme_python_blocks()[0]
    assert usage.split("```python\n", 1)[1].startswith(first)  # the section's first example
    assert "@workflow(" in first
    monkeypatch.chdir(tmp_path)
    exec(compile(first, "README.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out == "succeeded ['search@1', 'send_digest@2'] sent 2 results to ada@example.com\n"
    assert (tmp_path / "digest.jsonl").exists()


@pytest.mark.slow
def test_readme_code_workflow_runs_from_the_command_line_as_shown(tmp_path: Path) -> None:
    """Saved as flows.py, the README's first example prints what its `run flows:digest` block shows."""
    (tmp_path / "flows.py").write_text(_readme_python_blocks()[0])
    result = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "run", "flows:digest"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "$ attempt-kernel run flows:digest\n" + result.stdout + "```" in README.read_text()


def test_readme_usage_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's kernel example executes and prints the refusal it shows."""
    blocks = _readme_python_blocks()
    assert len(blocks) == 2, "README has a code workflow and a kernel example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[1], "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert out.startswith("illegal transition: Admit() from Cancelled(): a terminal state")
    alert_level = namespace["alert_level"]
    assert callable(alert_level)
    from attempt_kernel import Indeterminate, Running

    assert alert_level(Indeterminate()) == "page the operator"
    assert alert_level(Running()) == "none"


def test_readme_holds_exactly_two_setup_commands() -> None:
    """The set-up section has two sh blocks, and the second is what .ci/run runs."""
    section = README.read_text().split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert len(commands) == 2
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_readme_replay_output_is_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay report quoted in the README is today's output for the example."""
    from attempt_kernel.cli._main import main

    monkeypatch.chdir(README.parent)
    assert main(["replay", "examples/checkout.jsonl"]) == 0
    out = capsys.readouterr().out
    assert "$ attempt-kernel replay examples/checkout.jsonl\n" + out + "```" in README.read_text()


def test_run_log_doc_example_lines_are_real_records() -> None:
    """Each line of docs/run-log.md's example is a line of examples/checkout.jsonl."""
    doc = (README.parent / "docs" / "run-log.md").read_text()
    block = doc.split("## An example", 1)[1].split("```\n", 2)[1]
    lines = block.strip().splitlines()
    assert len(lines) == 4
    example = (README.parent / "examples" / "checkout.jsonl").read_text().splitlines()
    for line in lines:
        assert line in example


def block_with(doc: str, marker: str) -> str:
    """The one python block of ``doc`` that holds ``marker``."""
    blocks: list[str] = re.findall(r"```python\n(.*?)```", doc, re.DOTALL)
    [block] = [b for b in blocks if marker in b]
    return block


def test_executor_doc_waiting_example_waits_for_its_signal(tmp_path: Path) -> None:
    """docs/executor.md's waiting example: approved by a signal, or None at its timeout."""
    doc = (README.parent / "docs" / "executor.md").read_text()
    namespace: dict[str, object] = {"__name__": "docs_waiting"}
    exec(compile(block_with(doc, "async def payer("), "docs/executor.md", "exec"), namespace)
    payer = namespace["payer"]
    assert isinstance(payer, Workflow)
    clock = [1_000_000.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds
        await asyncio.sleep(0)

    async def main(run: str, send: bool) -> JSON:
        with RunLogWriter(tmp_path / f"{run}.jsonl") as log:
            executor = Executor(log, clock=lambda: clock[0], sleep=sleep)
            task = asyncio.ensure_future(executor.run(payer, run))
            if send:
                await asyncio.sleep(0)  # the run starts (a signal sent before its wait is kept)
                sent = SignalSent(name="approve", payload={"by": "ana"}, id="s1")
                assert executor.deliver(run, sent) is None
            return (await task).result

    assert asyncio.run(main("p-1", True)) == {"approved": {"by": "ana"}}
    assert slept == [2.0]
    assert asyncio.run(main("p-2", False)) == "nobody answered"
    assert slept == [2.0, 86400.0]


def test_executor_doc_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/executor.md's example runs and prints what its comments say."""
    doc = (README.parent / "docs" / "executor.md").read_text()
    block = block_with(doc, "EffectRejected")
    exec(compile(block, "docs/executor.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "succeeded"
    assert out[1] == (
        "{'Pending': 0, 'Running': 0, 'Succeeded': 2, 'Failed': 1, 'Indeterminate': 0,"
        " 'Cancelled': 0, 'TimedOut': 0}"
    )


def test_readme_demo_output_is_what_the_demo_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main job's output quoted in the README is what `demo` prints in a fresh folder."""
    from attempt_kernel.cli._main import main

    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "$ attempt-kernel demo\n" + out + "```" in README.read_text()


def test_the_fake_context_example_tests_a_step_without_the_executor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/executor.md's unit-test example runs and prints what its comments say."""
    doc = (README.parent / "docs" / "executor.md").read_text()
    block = block_with(doc, "from attempt_kernel import JSON, Perform, StepContext")
    exec(compile(block, "docs/executor.md", "exec"), {"__name__": "docs_example"})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "{'order': 'order-7', 'sent': {'message_id': '<test-key-email-receipt@mail.example>'}}",
        "['email-receipt']",
    ]


def test_the_code_workflow_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/executor.md's code workflow, run as a user's script, prints what its comments show."""
    doc = (README.parent / "docs" / "executor.md").read_text()
    block = block_with(doc, "async def think(")
    exec(compile(block, "docs/executor.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "succeeded ['think@1', 'search@2', 'think@3', 'search@4', 'think@5']",
        "[{'hits': 3, 'query': 'q0'}, {'hits': 3, 'query': 'q1'}]",
    ]
    assert f"    # {out[0]}\n    # {out[1]}\n" in block


def test_executor_doc_observer_counts_final_states(tmp_path: Path) -> None:
    """docs/executor.md's observer, given to an executor, counts one Succeeded attempt."""
    doc = (README.parent / "docs" / "executor.md").read_text()
    namespace: dict[str, object] = {"__name__": "docs_observer"}
    exec(compile(block_with(doc, "class FinalStates:"), "docs/executor.md", "exec"), namespace)
    watching = namespace["watching"]
    assert isinstance(watching, RunObserver)

    async def greet(ctx: StepContext) -> JSON:
        return "hi"

    async def main() -> None:
        with RunLogWriter(tmp_path / "o.jsonl") as log:
            await Executor(log, observers=[watching]).run(load_workflow("w", [Step(name="g", run=greet)]), "r")

    asyncio.run(main())
    assert getattr(watching, "counts") == {"Succeeded": 1}


def test_tracing_doc_example_prints_its_span_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tracing.md's example runs one step and prints the three spans its comment shows."""
    doc = (README.parent / "docs" / "tracing.md").read_text()
    block = block_with(doc, "Spans(provider.get_tracer")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/tracing.md", "exec"), {"__name__": "docs_tracing"})
    out = capsys.readouterr().out
    assert out == "['attempt greet#1', 'step greet', 'run hello']\n"
    assert "# " + out in block
    assert (tmp_path / "greet.jsonl").exists()


def test_agents_doc_determinism_rule_lets_the_function_await_its_durable_waits() -> None:
    """docs/agents.md told code to "await nothing but its steps (a sleep or a socket read
    belongs in a step too)": an agent that waits for a rate limit then sleeps inside an
    attempt, holding a slot for the whole sleep and losing it to a crash. run.sleep and
    run.wait_for_signal are what a workflow awaits to wait (docs/executor.md)."""
    agents = (README.parent / "docs" / "agents.md").read_text()
    rule = " ".join(agents.split("## What must be deterministic\n", 1)[1].split("```", 1)[0].split())
    assert "a sleep or a socket read belongs in a step too" not in rule
    assert (
        "The function must also await nothing but what its `RunContext` gives it: its steps,"
        " its waits (`run.sleep`, `run.wait_for_signal`) and `asyncio.gather` of them."
        " A socket read belongs in a step, and a pause in `run.sleep`, never `asyncio.sleep`:"
    ) in rule, rule


def test_every_python_block_in_the_docs_is_run_by_a_test() -> None:
    """No example escapes running: README has two python blocks, executor.md six (five run above,
    the one that submits on a connection by test_submit_conn.py), agents.md one (run by
    test_agents.py), tracing.md one (run above)."""
    counts = {
        path.name: len(re.findall(r"```python\n", path.read_text()))
        for path in [README, *sorted((README.parent / "docs").glob("*.md"))]
    }
    assert {name: n for name, n in counts.items() if n} == {
        "README.md": 2,
        "agents.md": 1,
        "executor.md": 6,
        "tracing.md": 1,
    }


def _tracked_text_files() -> list[Path]:
    """The tracked files the references check reads: src/, tests/, docs/ and the top-level docs."""
    root = README.parent
    tops = ["src", "tests", "docs", "README.md", "CHANGELOG.md", "pyproject.toml", "noxfile.py"]
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *tops], cwd=root, capture_output=True, text=True, check=False
    )
    if listed.returncode == 0 and listed.stdout:
        paths = [root / name for name in listed.stdout.split("\0") if name]
    else:  # not a git checkout (an unpacked sdist): every file under the same roots
        paths = [p for top in tops for p in ([root / top] if (root / top).is_file() else (root / top).rglob("*"))]
    return [p for p in paths if p.is_file() and "__pycache__" not in p.parts]


def test_no_file_cites_a_document_or_tracker_outside_the_repository() -> None:
    """The repository stands alone: no file points at an outside design's sections or an issue number."""
    # Built from pieces so that this file does not match itself.
    outside = re.compile(
        "|".join(["spec" + " \N{SECTION SIGN}", re.escape(".." + "/shared"), r"\bissue" + " [0-9]"]), re.IGNORECASE
    )
    found = [
        f"{path.relative_to(README.parent)}:{number}: {line.strip()}"
        for path in _tracked_text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert found == [], "cite docs/contracts.md (or the repository's own doc) instead:\n" + "\n".join(found)


def test_contracts_doc_has_the_headings_code_comments_cite() -> None:
    """Every docs/contracts.md heading a src/ comment names in quotes exists, word for word."""
    doc = (README.parent / "docs" / "contracts.md").read_text()
    headings = set(re.findall(r"^#+ (.+)$", doc, re.MULTILINE))
    cited: set[str] = set()
    for path in sorted((README.parent / "src").rglob("*.py")):
        text = re.sub(r"\s*\n\s*(?:# )?", " ", path.read_text())  # join wrapped comment lines
        cited.update(re.findall(r'docs/contracts\.md, "([^"]+)"', text))
    assert cited, "src/ cites docs/contracts.md"
    assert sorted(cited - headings) == []
