"""The README's code runs and says what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_usage_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's Python example executes and prints the refusal it shows."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks, "README has no python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
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
