"""`resume LOG RUN` on a run that waits: it waits in this process, as `run` does, and
says so: what the run waits for and the command that ends the wait; a `signal` sent
from another process reaches it through the inbox and the run finishes.

The children are waited on by what they print and what the log holds (generous
deadlines that bound nothing), never by a sleep.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_waits import LOG, RUN, book, cli, read_until, start, waiting_log

from attempt_kernel.cli._main import main

pytestmark = pytest.mark.slow

WAITS = (
    "run a-1 waits for signal 'approve'; end the wait with: attempt-kernel signal a.jsonl a-1"
    " approve (add --payload JSON to send a value)\n"
)


def test_resume_of_a_waiting_run_says_what_it_waits_for_and_a_signal_ends_it(tmp_path: Path) -> None:
    waiting_log(tmp_path / LOG)
    child = start(tmp_path, "resume", LOG, RUN, "--workflows", "waitflows:APPROVER", WAIT_BOOK="book")
    try:
        printed = read_until(child, WAITS)
        sent = cli(tmp_path, "signal", LOG, RUN, "approve", "--payload", '{"by": "ana"}')
        assert sent.returncode == 0, sent.stderr
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert printed + out == WAITS + "resume: run 'a-1' was resumed and ended succeeded\n"
    assert len(book(tmp_path / "book")) == 1  # charged once
    assert (tmp_path / f"{LOG}.inbox").read_bytes() == b""


def test_resume_help_says_a_waiting_run_waits_in_this_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["resume", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "until it finishes; other runs are left alone. A run that waits (for a signal or a timer) waits" in text
    assert "until it finishes or waits" not in text
