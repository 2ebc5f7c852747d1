"""The gate's own configuration stays in step with the source tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Hand-written: the two state machines are mutation-tested, nothing else.
MUTATED = {"src/attempt_kernel/_attempt.py", "src/attempt_kernel/_intent.py"}


@pytest.mark.source
def test_every_module_is_either_mutated_or_excluded() -> None:
    """A new module must be listed: mutated (and killed) or in do_not_mutate."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib arrived in Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    excluded = set(config["do_not_mutate"])
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "src" / "attempt_kernel").rglob("*.py")}
    assert modules - excluded == MUTATED
    assert excluded <= modules  # no stale entries
    nox_text = (ROOT / "noxfile.py").read_text()
    for path in MUTATED:
        assert f'"{path}"' in nox_text  # the session counts its pragmas


@pytest.mark.slow
def test_the_tests_send_sigint_to_their_commands_though_the_gate_was_started_in_the_background() -> None:
    """A shell starts a background job with SIGINT ignored (`nox &`, `nohup`), and every
    process inherits that: the commands the tests interrupt with SIGINT ignored it and
    ran until a test's safety net, five failures that say nothing of the code. The
    session puts SIGINT back (conftest.py), so a command the tests start gets it."""
    test = "tests/test_web.py::test_a_non_loopback_host_warns_that_the_actions_are_reachable"

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=ignore_sigint,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
