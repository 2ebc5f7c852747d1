"""The group-commit crash test: a machine crash, simulated, never leaves an effect sent
whose ``Dispatched`` is not in the recovered log.

A child process drives 50 concurrent effect steps (several runs of a
50-step workflow, one effect per step) on a file log. Its `FileOps`
simulates a machine whose page cache dies with it: ``write`` keeps the
bytes in the process's memory, and only ``fsync`` hands them to the real
file (and fsyncs it). So a SIGKILL loses exactly what was never fsynced, as
a power cut would, where a real SIGKILL of the process would lose nothing
the OS had taken. Each effect appends its idempotency key to a downstream
file (one ``os.write`` with O_APPEND) before it returns: the fake
downstream service. In half the rounds the parent kills the child once
that file holds a seeded random number of keys (the kill lands wherever
the child has got to by then); in the other half the child kills itself
right after sending its N-th effect (N seeded), the moment at which an
effect sent too early is caught with its record still unsynced. Then the
parent recovers the log with real system calls,
and checks, key by key, that every key the downstream received belongs to
a ``Dispatched`` intent of the recovered log, and that the log replays
clean.

Half the rounds use the writer's default ``batch_size``, half one too
large ever to fsync by count, so that only ``durable``'s fsyncs make
records durable (the batch's fsyncs otherwise cover, by luck, some
records that a flawed ``durable`` would release too early).

Run directly, the module is the child:
``python test_group_commit_crash.py LOG DOWNSTREAM KILL_AT BATCH`` (``KILL_AT`` 0: the
parent kills it).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from attempt_kernel import (
    Dispatched,
    IntentChanged,
    IntentPlanned,
    Job,
    Record,
    RunLogWriter,
    StepContext,
    read_log,
    recover_log,
    replay,
    run_jobs,
)
from attempt_kernel._logfile import DEFAULT_BATCH
from attempt_kernel._records import JSON
from attempt_kernel._workflow import Step, Workflow, load_workflow

pytestmark = pytest.mark.slow

SEED = 1826
ROUNDS = 20
CONCURRENT = 50
RUNS = 4  # 200 effects per child, if it is not killed first
HUNG = 60.0
NEVER = 10**9  # a batch_size no child reaches


class MachineCrashOps:
    """`FileOps` whose writes reach the file only when fsynced: a SIGKILL is a power cut.

    ``write`` runs on the event loop's thread and ``fsync`` on the writer's
    flush thread or inline, so two fsyncs may overlap: the lock is held until
    the bytes are in the file, so that they land in the order written (as
    the kernel's page cache would keep them).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unsynced: list[bytes] = []

    def write(self, fd: int, data: bytes) -> int:
        with self._lock:
            self._unsynced.append(data)
        return len(data)

    def fsync(self, fd: int) -> None:
        with self._lock:
            view = memoryview(b"".join(self._unsynced))
            self._unsynced = []
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)


def make_workflow(downstream: int, kill_at: int = 0) -> Workflow:
    """50 independent steps, each sending one effect: its key appended to ``downstream``;
    the process SIGKILLs itself right after the ``kill_at``-th (0: never)."""
    sent = 0

    async def send(ctx: StepContext) -> JSON:
        async def deliver(key: str) -> JSON:
            nonlocal sent
            os.write(downstream, f"{key}\n".encode())
            sent += 1
            if sent == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return None

        return await ctx.effect("send", deliver)

    return load_workflow("crash", [Step(name=f"s{i}", run=send) for i in range(CONCURRENT)])


def child(log_path: str, downstream_path: str, kill_at: int, batch: int) -> None:
    downstream = os.open(downstream_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    workflow = make_workflow(downstream, kill_at)
    with RunLogWriter(log_path, ops=MachineCrashOps(), batch_size=batch) as log:
        jobs = [Job(workflow=workflow, run=f"r{i}") for i in range(RUNS)]
        run_jobs(log, jobs, admission_limit=CONCURRENT)
    os.close(downstream)


def dispatched_keys(path: Path) -> set[str]:
    """The keys of every intent the log shows Dispatched (a plain fold, not the replayer)."""
    keys: dict[tuple[str, str, int, str], str] = {}
    dispatched: set[str] = set()
    for item in read_log(path):
        if not isinstance(item, Record):
            continue
        change = item.change
        if isinstance(change, IntentPlanned):
            keys[item.run, change.step, change.attempt, change.name] = change.key
        elif isinstance(change, IntentChanged) and isinstance(change.to_state, Dispatched):
            dispatched.add(keys[item.run, change.step, change.attempt, change.name])
    return dispatched


def wait_for_keys(process: subprocess.Popen[bytes], downstream: Path, count: int) -> None:
    """Until the downstream file holds ``count`` keys, or the child has ended."""
    deadline = time.monotonic() + HUNG  # only a hung child reaches it
    while process.poll() is None:
        try:
            if downstream.read_bytes().count(b"\n") >= count:
                return
        except FileNotFoundError:
            pass
        assert time.monotonic() < deadline, "the child sent too few effects"
        time.sleep(0.001)


def test_no_effect_is_sent_whose_dispatched_a_machine_crash_loses(tmp_path: Path) -> None:
    """SIGKILL at seeded moments, many times: every key the downstream got is Dispatched
    in the recovered log, and every recovered log replays clean."""
    rng = random.Random(SEED)
    workflow = make_workflow(-1)  # recovery sends nothing: it only needs the steps
    sent = killed = 0
    for n in range(ROUNDS):
        log, downstream = tmp_path / f"log{n}", tmp_path / f"downstream{n}"
        log.touch()
        at = rng.randint(1, RUNS * CONCURRENT - 20)
        by_child = n % 2 == 1
        batch = DEFAULT_BATCH if n % 4 < 2 else NEVER
        with open(tmp_path / f"stderr{n}", "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, __file__, str(log), str(downstream), str(at if by_child else 0), str(batch)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            try:
                wait_for_keys(process, downstream, RUNS * CONCURRENT if by_child else at)
                if process.poll() is None:
                    process.send_signal(signal.SIGKILL)
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait()
        assert process.returncode in (0, -signal.SIGKILL), (tmp_path / f"stderr{n}").read_text()
        killed += process.returncode == -signal.SIGKILL
        writer, _ = recover_log(log, {"crash": workflow})
        writer.close()
        received = downstream.read_bytes().decode() if downstream.exists() else ""
        keys = received.split("\n")
        *whole, last = keys  # the last is empty, or a key cut by the kill
        dispatched = dispatched_keys(log)
        missing = [k for k in whole if k not in dispatched]
        assert missing == [], f"round {n}: effects sent without a durable Dispatched: {missing}"
        assert last == "" or any(k.startswith(last) for k in dispatched), f"round {n}: {last!r}"
        report = replay(log)
        assert report.valid, (n, report.violations)
        sent += len(whole)
    # Teeth: most rounds must be killed mid-way, or the test proves little.
    assert killed >= ROUNDS // 2, killed
    print(f"\n{ROUNDS} rounds, {killed} killed mid-way, {sent} effects checked")


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
