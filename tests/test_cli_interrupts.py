"""SIGINT that reaches the command line outside a run's own handling: one line, exit 130.

A run's own SIGINT (a graceful stop) is test_signals.py's. Here the signal comes
while `run` is still importing its workflow module (startupflows.py announces
that moment in a file and waits for a signal): nothing has begun, nothing is
written, and no traceback is printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent


def test_sigint_while_run_loads_its_workflow_exits_130_with_one_line(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    env = {**os.environ, "STARTUP_READY": str(ready)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    child = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "run", "startupflows:STARTUP", "--log", "s.jsonl"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # an event awaited, not a bound: generous
        while not ready.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the workflow module was never imported"
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert (child.returncode, out, err) == (130, "", "attempt-kernel run: interrupted by SIGINT\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready"]  # no log was made
