"""What the command line prints of a run's WARNING lines while it drives runs.

When a cancel or a graceful stop ends an attempt whose effect is in flight,
the step's reconcilers are asked first; an answer nobody could give (unknown,
with the reconciler's reason) is recorded nowhere: the line the executor
logs is its only trace, and the reason the attempt ends Indeterminate (an
answer the log then failed to record likewise). The commands that drive runs
(`run`, `recover`, `resume`, `worker LOG`) print such lines on stderr, one
line each, escaped: when stderr is a terminal as progress lines, once;
otherwise as warning lines. What the log records (the Indeterminate
attempt) adds no line: the stop's own line stays the last.

hangflows.py's effect hangs until the stop or the cancel comes; its run id,
step and intent names and the reconciler's reason hold line breaks, escape
sequences and U+2028. Idempotency keys are read from the downstream's book.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
RUN = "r\n1\x1b[2J"
SHOWN_RUN = "r\\n1\\x1b[2J"
LOG = "h.jsonl"
TARGET = "hangflows:hang"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HANG_ANSWER"}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def _calls(cwd: Path) -> list[str]:
    book = cwd / "calls.txt"
    return book.read_text().split() if book.exists() else []


def _stopped_when_called(
    cwd: Path, args: list[str], calls: int, stop: str, stderr: int | None = None, **env: str
) -> tuple[int, str, str]:
    """``attempt-kernel ARGS`` in a child; once the effect was called ``calls`` times in
    all, SIGTERM it (``stop`` "signal") or cancel the run from another process ("cancel");
    its exit code and output (stderr "" when ``stderr`` is a file descriptor of its own)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, env=_env(**env), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if stderr is None else stderr, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # an event awaited, not a bound: generous
        while len(_calls(cwd)) < calls:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the effect was never called"
            time.sleep(0.02)
        if stop == "signal":
            child.send_signal(signal.SIGTERM)
        else:
            cancel = subprocess.run(
                [sys.executable, "-m", "attempt_kernel", "cancel", LOG, RUN, "--reason", "by\x1b[31m\nhand"],
                cwd=cwd, env=_env(), capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert cancel.returncode == 0, cancel.stderr
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    return child.returncode, out, err or ""


def _asked(command: str, key: str, attempt: int) -> str:
    return (
        f"attempt-kernel {command}: warning: {SHOWN_RUN} ch\\u2028arge\\r#{attempt}: asked the reconciler"
        f" about 'charge\\x1b[31m-card\\n' ({key}): unknown (bank\\nsays \\x1b[2Jno\\u2028idea)"
    )


def test_run_stopped_by_sigterm_prints_the_reconcilers_unknown_answer(tmp_path: Path) -> None:
    code, _, err = _stopped_when_called(tmp_path, ["run", TARGET, "--log", LOG, "--run", RUN], 1, "signal")
    [key] = _calls(tmp_path)
    assert code == 143, err
    assert err.splitlines() == [
        _asked("run", key, 1),
        f"attempt-kernel run: stopped by SIGTERM; unfinished run(s) {SHOWN_RUN} can be resumed with"
        f" `attempt-kernel recover {LOG} --workflows {TARGET}`",
    ]


def test_run_cancelled_from_outside_prints_the_reconcilers_unknown_answer(tmp_path: Path) -> None:
    code, out, err = _stopped_when_called(tmp_path, ["run", TARGET, "--log", LOG, "--run", RUN], 1, "cancel")
    [key] = _calls(tmp_path)
    assert code == 1, err
    assert err.splitlines() == [_asked("run", key, 1)]
    assert out.splitlines()[-1] == "run status: needs-reconciliation"


def test_run_prints_an_answer_the_log_failed_to_record_before_its_error(tmp_path: Path) -> None:
    """The bank said the charge happened, and then the log could not grow: the answer is
    in no record, so the line saying it comes before the write's error."""
    code, _, err = _stopped_when_called(
        tmp_path, ["run", TARGET, "--log", LOG, "--run", RUN], 1, "signal",
        HANG_ANSWER="happened-then-full", HANG_LOG=LOG,
    )  # fmt: skip
    [key] = _calls(tmp_path)
    assert code == 2, err
    [said, error] = err.splitlines()
    assert said == (
        f"attempt-kernel run: warning: {SHOWN_RUN} ch\\u2028arge\\r#1: asked the reconciler about"
        f" 'charge\\x1b[31m-card\\n' ({key}): it happened (intent Confirmed); ending the attempt did"
        " not complete, so the journal may not hold this answer"
    )
    assert error.startswith(f"attempt-kernel run: error: {LOG}: the writer failed")


@pytest.mark.parametrize(
    ("args", "again"),
    [
        (["recover", LOG], f"attempt-kernel recover {LOG} --workflows {TARGET}"),
        (["resume", LOG, RUN], f"attempt-kernel resume {LOG} $'r\\x0a1\\x1b[2J' --workflows {TARGET}"),
        (["worker", LOG], f"attempt-kernel worker {LOG} --workflows {TARGET}"),
    ],
    ids=["recover", "resume", "worker"],
)
def test_a_resumed_run_stopped_by_sigterm_prints_the_reconcilers_unknown_answer(
    tmp_path: Path, args: list[str], again: str
) -> None:
    # First stopped where the bank says the charge never happened: attempt 1 ends
    # Cancelled, the run interrupted; the command resumes it and sends attempt 2.
    first = _stopped_when_called(
        tmp_path, ["run", TARGET, "--log", LOG, "--run", RUN], 1, "signal", HANG_ANSWER="not-happened"
    )
    assert first[0] == 143, first
    code, _, err = _stopped_when_called(tmp_path, [*args, "--workflows", TARGET], 2, "signal")
    _, key = _calls(tmp_path)
    command = args[0]
    assert code == 143, err
    assert err.splitlines() == [
        _asked(command, key, 2),
        f"attempt-kernel {command}: stopped by SIGTERM; unfinished run(s) {SHOWN_RUN} can be resumed with `{again}`",
    ]


def test_on_a_terminal_the_answer_is_one_progress_line_and_no_warning_beside_it(tmp_path: Path) -> None:
    main, terminal = pty.openpty()
    try:
        code, _, _ = _stopped_when_called(
            tmp_path, ["run", TARGET, "--log", LOG, "--run", RUN], 1, "signal", stderr=terminal
        )
        os.close(terminal)
        terminal = -1
        said = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the other end closed: all was read
                break
            if not chunk:
                break
            said += chunk
    finally:
        if terminal != -1:
            os.close(terminal)
        os.close(main)
    [key] = _calls(tmp_path)
    assert code == 143
    assert said.decode().splitlines() == [
        f"  .. {SHOWN_RUN} ch\\u2028arge\\r#1: Pending -> Running",
        f"  .. {SHOWN_RUN} ch\\u2028arge\\r#1: asked the reconciler about 'charge\\x1b[31m-card\\n' ({key}):"
        " unknown (bank\\nsays \\x1b[2Jno\\u2028idea)",
        f"  .. {SHOWN_RUN} ch\\u2028arge\\r#1: Running -> Indeterminate",
        f"attempt-kernel run: stopped by SIGTERM; unfinished run(s) {SHOWN_RUN} can be resumed with"
        f" `attempt-kernel recover {LOG} --workflows {TARGET}`",
    ]
