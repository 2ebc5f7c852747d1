"""The crash test: SIGKILL a real demo run at seeded moments, recover, replay.

Each case runs ``attempt-kernel demo`` in a subprocess that is killed
abruptly, either right after its N-th record (``--crash-after N``: then the
test knows exactly which appends had returned) or from outside after a
random delay. Then ``attempt-kernel recover`` runs in another subprocess.
The checks: the log is valid; every acknowledged record is present; an
attempt the crash left Running ends Indeterminate exactly when one of its
intents was Dispatched at the kill, and otherwise Cancelled and retried.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from attempt_kernel import (
    AttemptCreated,
    AttemptTransitioned,
    IntentChanged,
    Record,
    RunCancelRequested,
    StepResult,
    read_log,
    replay,
)

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "attempt_kernel"]
SEED = 2026
# The demo's steps that succeed when given the chance (check-visa always
# times out and watch-prices is cancelled or times out, by design).
SUCCEEDING = {"fetch-profile", "search-flights", "book-flight", "send-itinerary"}


@dataclass
class Live:
    """An attempt as the log prefix shows it: state name and intents dispatched."""

    state: str = "Pending"
    dispatched: set[str] = field(default_factory=set[str])
    ends_step: bool = False
    """Its result said `retry: false`: no attempt follows it, even after a crash."""


def live_attempts(records: list[Record]) -> dict[tuple[str, int], Live]:
    """A plain fold of the records, written here independently of the replayer."""
    attempts: dict[tuple[str, int], Live] = {}
    for r in records:
        c = r.change
        if isinstance(c, AttemptCreated):
            attempts[c.step, c.attempt] = Live()
        elif isinstance(c, AttemptTransitioned):
            attempts[c.step, c.attempt].state = type(c.to_state).__name__
        elif isinstance(c, StepResult):
            attempts[c.step, c.attempt].ends_step = not c.retryable
        elif isinstance(c, IntentChanged):
            names = attempts[c.step, c.attempt].dispatched
            if type(c.to_state).__name__ == "Dispatched":
                names.add(c.name)
            else:
                names.discard(c.name)
    return {k: v for k, v in attempts.items() if v.state in ("Pending", "Running")}


def records_of(path: Path) -> list[Record]:
    return [i for i in read_log(path) if isinstance(i, Record)]


def recover_and_check(path: Path, before: list[Record]) -> None:
    orphans = live_attempts(before)
    # the traveller left: the run's cancel was decided, and a cancelled run starts no attempt
    cancelled = any(isinstance(r.change, RunCancelRequested) for r in before)
    done = subprocess.run([*CLI, "recover", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    after = records_of(path)
    assert after[: len(before)] == before  # nothing acknowledged was lost or rewritten
    report = replay(path)
    assert report.valid, report.violations
    final: dict[tuple[str, int], str] = {}
    for r in after:
        if isinstance(r.change, AttemptTransitioned):
            final[r.change.step, r.change.attempt] = type(r.change.to_state).__name__
    last_attempt: dict[str, int] = {}
    for step, number in final:
        last_attempt[step] = max(number, last_attempt.get(step, 0))
    for (step, number), live in orphans.items():
        if live.state == "Running" and live.dispatched:
            assert final[step, number] == "Indeterminate", (step, number)
            assert last_attempt[step] == number  # never retried
        elif live.ends_step or cancelled:  # a last try (its deadline) cut before its end, or a cancelled run
            assert final[step, number] == "Cancelled", (step, number)
            assert last_attempt[step] == number  # not retried
        else:
            assert final[step, number] == "Cancelled", (step, number)
            assert last_attempt[step] > number  # retried
            if step in SUCCEEDING:
                assert final[step, last_attempt[step]] == "Succeeded", (step, after[-5:])
    indeterminate = sum(1 for s in final.values() if s == "Indeterminate")
    assert indeterminate == sum(1 for v in orphans.values() if v.state == "Running" and v.dispatched)


def crash_points() -> list[int]:
    # every record of a whole demo run (36 of them): 23 is where its first
    # Dispatch lands, 34 the cancel decided when the traveller leaves
    return list(range(1, 37))


@pytest.mark.parametrize("n", crash_points())
def test_kill_after_the_nth_record(n: int, tmp_path: Path) -> None:
    """SIGKILL right after record n: exactly n records survive; recovery is exact."""
    path = tmp_path / "run.jsonl"
    killed = subprocess.run(
        [*CLI, "demo", "--log", str(path), "--crash-after", str(n)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = records_of(path)
    assert [r.seq for r in before] == list(range(1, n + 1))
    recover_and_check(path, before)


@pytest.mark.parametrize("case", range(4))
def test_kill_from_outside_at_a_random_moment(case: int, tmp_path: Path) -> None:
    """SIGKILL from another process after a seeded random delay (a write may be torn)."""
    delay = random.Random(SEED + case).uniform(0.0, 0.3)
    path = tmp_path / "run.jsonl"
    child = subprocess.Popen(
        [*CLI, "demo", "--log", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    # the random moment counts from the first record, not from interpreter start-up
    while not path.exists() or path.stat().st_size == 0:
        assert child.poll() is None, "the demo ended before writing anything"
        time.sleep(0.005)
    time.sleep(delay)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    before = records_of(path)
    recover_and_check(path, before)
