"""A worker process for the tests: ``python -c 'from workerflows.start import main; main()' URL SCHEMA``.

Prints each progress line. ``KILL_AFTER=N`` SIGKILLs the process right
after its N-th record reached the journal (a crash at that point). Exits 0
after `run_worker` returns (``closed N``), 3 when the worker was declared
dead. ``WORKFLOWS=pooled`` serves the admission tests' workflows
(``workerflows.pooled``) instead of ``pay``.

Its lease never expires by itself (dead after 300 s, longer than any
test waits for anything): a test that needs it expired says so, to the database
(`pgtools.expire_heartbeats`) and to the worker's own clock, which SIGUSR1
moves an hour on (`clock`), as if the worker had been frozen that long.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from workerflows.pay import PAY
from workerflows.pooled import HURRY, THINK

from attempt_kernel.postgres._journal import PgJournal
from attempt_kernel._records import Change
from attempt_kernel.postgres._worker import WorkerDeclaredDead, run_worker

HEARTBEAT = 0.2
DEAD_AFTER = 300.0
_AHEAD = [0.0]


def clock() -> float:
    """The worker's own clock: monotonic, plus an hour for every SIGUSR1 (`jump_on_sigusr1`)."""
    return time.monotonic() + _AHEAD[0]


def _jump(signum: int, frame: FrameType | None) -> None:
    _AHEAD[0] += 3600.0


def jump_on_sigusr1() -> None:
    """From now on SIGUSR1 moves `clock` an hour on (sent while frozen: it wakes up past its lease)."""
    signal.signal(signal.SIGUSR1, _jump)


def _kill_after(n: int) -> None:
    """Wrap every journal's appends so that the process dies right after record ``n``
    (right after the statement that wrote it, when several records went in one)."""
    append = PgJournal.append
    written = [0]

    def counted(self: PgJournal, run: str, change: Change) -> int:
        seq = append(self, run, change)
        written[0] += 1
        if written[0] == n:
            print(f"killed after record {n} (seq {seq})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return seq

    append_all = PgJournal.append_all

    def counted_all(self: PgJournal, run: str, changes: Sequence[Change]) -> int:
        seq = append_all(self, run, changes)
        before = written[0]
        written[0] += len(changes)
        if before < n <= written[0]:  # record n went in with this statement
            print(f"killed after record {n} (seq {seq - (written[0] - n)})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return seq

    complete = PgJournal.append_and_complete

    def counted_complete(self: PgJournal, run: str, changes: Sequence[Change], *, outcome: str) -> int:
        seq = complete(self, run, changes, outcome=outcome)
        before = written[0]
        written[0] += len(changes)
        if before < n <= written[0]:
            print(f"killed after record {n} (seq {seq - (written[0] - n)}), row closed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return seq

    hand_over = PgJournal.hand_over

    def counted_hand_over(
        self: PgJournal, run: str, changes: Sequence[Change], *, outcome: str | None = None
    ) -> int:
        seq = hand_over(self, run, changes, outcome=outcome)
        before = written[0]
        written[0] += len(changes)
        if before < n <= written[0]:  # record n is queued: die once the group writing it commits
            self.settle(run)
            closed = "" if outcome is None else ", row closed"
            print(f"killed after record {n} (seq {seq - (written[0] - n)}){closed}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return seq

    setattr(PgJournal, "hand_over", counted_hand_over)
    setattr(PgJournal, "append", counted)
    setattr(PgJournal, "append_all", counted_all)
    setattr(PgJournal, "append_and_complete", counted_complete)


def main() -> None:
    url, schema = sys.argv[1], sys.argv[2]
    kill_after = int(os.environ.get("KILL_AFTER", "0"))
    if kill_after:
        _kill_after(kill_after)
    jump_on_sigusr1()
    try:
        closed = run_worker(
            url,
            [THINK, HURRY] if os.environ.get("WORKFLOWS") == "pooled" else [PAY],
            schema=schema,
            heartbeat=HEARTBEAT,
            dead_after=DEAD_AFTER,
            stop_when_idle=True,
            progress=lambda line: print(line, flush=True),
            clock=clock,
        )
    except WorkerDeclaredDead as error:
        print(f"declared dead: {error}", flush=True)
        sys.exit(3)
    print(f"closed {closed}", flush=True)
