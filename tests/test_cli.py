"""The command line, with expected output written out by hand from the README's transition table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from logs import indeterminate_changes, write_log

from attempt_kernel import RunFinished, RunLogWriter, RunStarted
from attempt_kernel.cli._main import main

MARKDOWN = """\
| From \\ Cause | Admit | Succeed | Fail | Cancel(intent_dispatched=False) | Cancel(intent_dispatched=True) | QueueDeadlinePassed | StepDeadlinePassed |
|---|---|---|---|---|---|---|---|
| Pending | Running | rejected | rejected | Cancelled | rejected | TimedOut | rejected |
| Running | rejected | Succeeded | Failed | Cancelled | Indeterminate | rejected | TimedOut |
| Succeeded | rejected | rejected | rejected | rejected | rejected | rejected | rejected |
| Failed | rejected | rejected | rejected | rejected | rejected | rejected | rejected |
| Indeterminate | rejected | rejected | rejected | rejected | rejected | rejected | rejected |
| Cancelled | rejected | rejected | rejected | rejected | rejected | rejected | rejected |
| TimedOut | rejected | rejected | rejected | rejected | rejected | rejected | rejected |
"""

MERMAID = """\
stateDiagram-v2
    [*] --> Pending
    Pending --> Running: Admit
    Pending --> Cancelled: Cancel(intent_dispatched=False)
    Pending --> TimedOut: QueueDeadlinePassed
    Running --> Succeeded: Succeed
    Running --> Failed: Fail
    Running --> Cancelled: Cancel(intent_dispatched=False)
    Running --> Indeterminate: Cancel(intent_dispatched=True)
    Running --> TimedOut: StepDeadlinePassed
    Succeeded --> [*]
    Failed --> [*]
    Indeterminate --> [*]
    Cancelled --> [*]
    TimedOut --> [*]
"""

DOT_EDGES = [
    'Pending -> Running [label="Admit"];',
    'Pending -> Cancelled [label="Cancel(intent_dispatched=False)"];',
    'Pending -> TimedOut [label="QueueDeadlinePassed"];',
    'Running -> Succeeded [label="Succeed"];',
    'Running -> Failed [label="Fail"];',
    'Running -> Cancelled [label="Cancel(intent_dispatched=False)"];',
    'Running -> Indeterminate [label="Cancel(intent_dispatched=True)"];',
    'Running -> TimedOut [label="StepDeadlinePassed"];',
]


def test_table_markdown_is_the_spec_grid(capsys: pytest.CaptureFixture[str]) -> None:
    """`table` prints the full 7x7 grid, rejections included."""
    assert main(["table"]) == 0
    assert capsys.readouterr().out == MARKDOWN


def test_table_mermaid(capsys: pytest.CaptureFixture[str]) -> None:
    """`table --format mermaid` prints the 8 legal edges and the 5 terminal exits."""
    assert main(["table", "--format", "mermaid"]) == 0
    assert capsys.readouterr().out == MERMAID


def test_table_dot(capsys: pytest.CaptureFixture[str]) -> None:
    """`table --format dot` is a digraph with exactly the 8 legal edges."""
    assert main(["table", "--format", "dot"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("digraph attempt {\n") and out.endswith("}\n")
    edges = [line.strip() for line in out.splitlines() if "->" in line]
    assert edges == DOT_EDGES


def test_readme_embeds_the_current_mermaid_diagram() -> None:
    """The README's diagram is the one the CLI prints today."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "```mermaid\n" + MERMAID + "```" in readme


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["tabel"], "invalid choice: 'tabel'"),
        (["table", "--format", "svg"], "invalid choice: 'svg'"),
        (["table", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_wrong_argument_exits_2_with_usage(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong argument exits 2 and prints the usage and what was wrong."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: attempt-kernel" in err and message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["runs", "a.jsonl", "\x1b[2Jex\ntra\u2028"],
            "attempt-kernel runs: error: unrecognized arguments: \\x1b[2Jex\\ntra\\u2028",
        ),
        (
            ["runs", "a.jsonl", "--s=\x1b[2J\nx"],
            "attempt-kernel runs: error: ambiguous option: --s=\\x1b[2J\\nx could match --status, --since",
        ),
    ],
    ids=["unrecognized", "ambiguous"],
)
def test_an_argument_argparse_quotes_in_its_error_is_escaped(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What argparse quotes of the command line in its own errors is escaped, as every
    other message is: the error stays one last line, with no escape sequence in it."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: attempt-kernel runs")
    assert err.splitlines()[-1] == message
    assert "\x1b" not in err and "\u2028" not in err


@pytest.mark.slow
def test_python_dash_m_runs_the_same_cli() -> None:
    """`python -m attempt_kernel table` prints the same grid and exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "table"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == MARKDOWN


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "postgresql://ak:secret@db/jobs", "m:a"],
        ["worker", "postgresql://ak:secret@db/jobs", "--workflows", "m:a"],
        ["pool", "postgresql://ak:secret@db/jobs", "llm", "--slots", "2"],
        ["pools", "postgresql://ak:secret@db/jobs"],
        ["runs", "postgresql://ak:secret@db/jobs"],
        ["replay", "postgresql://ak:secret@db/jobs"],
        ["recover", "postgresql://ak:secret@db/jobs", "--json"],
        ["show", "postgresql://ak:secret@db/jobs", "r-1"],
        ["reconcile", "postgresql://ak:secret@db/jobs", "--key", "k", "--rejected"],
        ["signal", "postgresql://ak:secret@db/jobs", "r-1", "go"],
        ["cancel", "postgresql://ak:secret@db/jobs", "r-1"],
        ["resume", "postgresql://ak:secret@db/jobs", "r-1"],
        ["export", "postgresql://ak:secret@db/jobs"],
        ["run", "m:a", "--log", "postgresql://ak:secret@db/jobs"],
        ["serve", "postgresql://ak:secret@db/jobs"],
        ["migrate", "postgresql://ak:secret@db/jobs"],
    ],
    ids=[
        "submit", "worker", "pool", "pools", "runs", "replay", "recover", "show", "reconcile", "signal",
        "cancel", "resume", "export", "run", "serve", "migrate",
    ],
)  # fmt: skip
@pytest.mark.slow  # a subprocess
def test_a_url_without_the_postgres_extra_is_a_usage_error_naming_it(argv: list[str]) -> None:
    """No traceback: every command that takes a URL says to install the extra, exit 2."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # as if psycopg were not installed
        "from attempt_kernel.cli._main import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "postgresql://ak@db/jobs" in done.stderr and "secret" not in done.stderr
    assert done.stderr.rstrip().endswith("install attempt-kernel[postgres]"), done.stderr


def test_show_says_what_runs_says_of_a_reconciled_run_while_another_process_holds_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that ended needing reconciliation, reconciled since, is unfinished again and
    waits for `recover`: `runs` lists it `interrupted` even while another process holds
    the log (that process does not drive it; nothing does until a recovery), and `show`
    must say the same, not `running`."""
    log = write_log(
        tmp_path / "r.jsonl", [RunStarted(workflow="w", nonce="n0"), *indeterminate_changes(), RunFinished()]
    )
    assert main(["reconcile", str(log), "--key", "k-send", "--rejected"]) == 0
    capsys.readouterr()
    with RunLogWriter(log):  # another process's writer: it drives runs of its own
        assert main(["runs", str(log)]) == 0
        listed = capsys.readouterr().out.splitlines()[1].split()
        assert main(["show", str(log), "r"]) == 0
        shown_first = capsys.readouterr().out.splitlines()[0]
        assert main(["show", "--json", str(log), "r"]) == 0
        shown_json = capsys.readouterr().out
    assert listed[:3] == ["r", "w", "interrupted"]
    assert shown_first == "run r (workflow w): interrupted"
    assert '"status": "interrupted"' in shown_json
