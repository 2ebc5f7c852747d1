"""SIGINT and SIGTERM that reach the command line outside a run's own handling: one
line, exit 130 or 143, no traceback.

A run's own signals (a graceful stop) are test_signals.py's. Here the signal
comes while `run` or `worker` is still importing its workflow module
(startupflows.py announces that moment in a file and waits for a signal):
nothing has begun and nothing is written; or while `worker` recovers a log and
a step's reconciler is being asked (recoveryflows.py announces that): recovery
is cut off and starts over, whole, at the next `recover`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attempt_kernel import AttemptCreated, AttemptTransitioned, Record, read_log, replay
from logs import key_in

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent


SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def _signal_when(
    ready: Path, sig: signal.Signals, args: list[str], cwd: Path, env: dict[str, str]
) -> tuple[int, str, str]:
    """``attempt-kernel ARGS`` in a child; ``sig`` once ``ready`` exists; its exit and output."""
    child = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # an event awaited, not a bound: generous
        while not ready.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the moment the test waits for never came"
            time.sleep(0.02)
        child.send_signal(sig)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child.returncode, out, err


@pytest.mark.parametrize(("sig", "code"), SIGNALS, ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    "args",
    [["run", "startupflows:STARTUP", "--log", "s.jsonl"], ["worker", "w.jsonl", "--workflows", "startupflows:STARTUP"]],
    ids=["run", "worker"],
)
def test_a_signal_while_a_command_loads_its_workflow_exits_with_one_line(
    tmp_path: Path, sig: signal.Signals, code: int, args: list[str]
) -> None:
    ready = tmp_path / "ready"
    kept = []
    if args[0] == "worker":  # it refuses a missing log before it loads a workflow
        (tmp_path / "w.jsonl").touch()
        kept = ["w.jsonl"]
    done = _signal_when(ready, sig, args, tmp_path, _env(STARTUP_READY=str(ready)))
    assert done == (code, "", f"attempt-kernel {args[0]}: interrupted by {sig.name}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready", *kept]  # no log was made
    assert all((tmp_path / name).stat().st_size == 0 for name in kept)  # nor written


def _states(log: Path) -> dict[tuple[str, int], str]:
    """Each attempt's last state by (step, number), folded here from the records."""
    out: dict[tuple[str, int], str] = {}
    for item in read_log(log):
        if isinstance(item, Record) and isinstance(item.change, AttemptCreated):
            out[item.change.step, item.change.attempt] = "Pending"
        elif isinstance(item, Record) and isinstance(item.change, AttemptTransitioned):
            out[item.change.step, item.change.attempt] = type(item.change.to_state).__name__
    return out


@pytest.mark.parametrize(
    ("blocks", "sig", "code"),
    [("loop", signal.SIGINT, 130), ("loop", signal.SIGTERM, 143), ("thread", signal.SIGTERM, 143)],
    ids=["awaiting-SIGINT", "awaiting-SIGTERM", "blocking-SIGTERM"],
)
def test_a_signal_while_worker_recovers_a_log_exits_with_one_line_and_recovery_starts_over(
    tmp_path: Path, blocks: str, sig: signal.Signals, code: int
) -> None:
    """The charge's process crashed with it sent; a worker, asking the step's reconciler
    about it, is signalled: it says so and exits 130/143 (SIGTERM killed it without a
    word before), nothing in the log is lost, and `recover` then asks again, settles
    the charge (sent once) and the run succeeds."""
    flows = "recoveryflows:charges"
    crashed = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "run", flows, "--log", "c.jsonl", "--run", "r1"],
        cwd=tmp_path, env=_env(CRASH_IN_EFFECT="1"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert crashed.returncode == 70, crashed.stdout + crashed.stderr
    log = tmp_path / "c.jsonl"
    before = log.read_bytes()
    assert _states(log) == {("charge", 1): "Running"}
    ready = tmp_path / "ready"
    args = ["worker", "c.jsonl", "--workflows", flows]
    returncode, out, err = _signal_when(ready, sig, args, tmp_path, _env(RECOVERY_READY=str(ready), RECOVERY_BLOCKS=blocks))
    assert (returncode, err) == (code, f"attempt-kernel worker: interrupted by {sig.name}\n")
    assert out == "worker: serving the runs of c.jsonl (charges)\n"
    assert log.read_bytes() == before  # recovery was cut off before it wrote: nothing lost, nothing added
    assert replay(log).valid
    done = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "recover", "c.jsonl", "--workflows", flows],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # the orphan ends Cancelled (its charge answered, none outstanding); the next attempt
    # takes the confirmed charge instead of sending it again
    assert _states(log) == {("charge", 1): "Cancelled", ("charge", 2): "Succeeded"}
    assert (tmp_path / "calls.txt").read_text().split() == [key_in(log, "r1", "charge", "charge-card")]
    assert replay(log).valid
