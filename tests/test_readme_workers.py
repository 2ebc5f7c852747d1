"""The README's multi-worker session is real: replayed against the session's PostgreSQL.

Three `attempt-kernel worker` processes with the README's flags, six runs
submitted with the README's command, and the worker that holds runs killed
with SIGKILL: another worker takes its runs over at fence 2, every report
is posted once, and the exported journal replays valid. Worker ids and
times differ from run to run, so the test checks what the README says
happened, line by line where the lines are stable. The killed worker's
heartbeat is aged in the database (`expire_heartbeats`) so that the
survivors find it dead at their next look, not after the test waited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pgtools import expire_heartbeats

from attempt_kernel import AttemptTransitioned, Record, read_log, replay, transition

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FLOWS = ROOT / "examples" / "workers" / "flows.py"
WORKER_FLAGS = ["--workflows", "flows:reports", "--concurrency", "2", "--heartbeat", "0.5", "--dead-after", "2"]


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def statuses(cwd: Path, url: str) -> dict[str, str]:
    result = cli(cwd, "runs", url, "--json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, str]] = json.loads(result.stdout)["runs"]
    return {row["run"]: row["status"] for row in rows}


def _holders(outs: list[Path]) -> list[tuple[int, list[str], str]]:
    """The workers holding runs still in fetch (claimed, fetch not ended): index, runs, worker id."""
    holders: list[tuple[int, list[str], str]] = []
    for n, out in enumerate(outs):
        text = out.read_text()
        # Each line: its UTC time, its level, the message.
        claimed = re.findall(r"^\S+ INFO +(report-\d): claimed at fence 1$", text, re.MULTILINE)
        fetched = re.findall(r"^\S+ INFO +(report-\d) fetch#1: Running -> ", text, re.MULTILINE)
        if set(claimed) - set(fetched):
            [worker] = re.findall(r"^\S+ INFO +worker (\S+) started$", text, re.MULTILINE)
            holders.append((n, sorted(set(claimed) - set(fetched)), worker))
    return holders


def test_the_readme_quotes_the_commands_this_test_runs() -> None:
    """The README's session uses the same worker flags and submit command as below."""
    text = README.read_text()
    assert "attempt-kernel worker $URL " + " ".join(WORKER_FLAGS) in text
    assert "attempt-kernel submit $URL flows:reports --run report-$i" in text


def test_a_killed_worker_s_runs_are_taken_over_and_posted_once(db: str, tmp_path: Path) -> None:
    """Kill the worker that holds runs: another takes them over at fence 2 and finishes them."""
    shutil.copy(FLOWS, tmp_path / "flows.py")
    outs = [tmp_path / f"worker-{n}.out" for n in (1, 2, 3)]
    handles = [out.open("w") for out in outs]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "attempt_kernel", "worker", db, *WORKER_FLAGS],
            cwd=tmp_path, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
        for handle in handles
    ]
    try:
        deadline = time.monotonic() + 60  # a safety net
        while not all(re.search(r" worker \S+ started$", out.read_text(), re.MULTILINE) for out in outs):
            assert time.monotonic() < deadline, [o.read_text() for o in outs]
            time.sleep(0.02)
        runs = [f"report-{i}" for i in range(1, 7)]
        for run in runs:
            submitted = cli(tmp_path, "submit", db, "flows:reports", "--run", run)
            assert submitted.returncode == 0 and submitted.stdout == f"{run}\n", submitted.stderr
        # The victim is picked from the workers' output at once, with no
        # command run first: a run is held only for fetch's 3 s after its
        # claim, and on a loaded machine a `runs` here could take that long.
        deadline = time.monotonic() + 60
        while not (holders := _holders(outs)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert holders, [o.read_text() for o in outs]
        victim, held, victim_id = holders[0]
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=60)
        assert expire_heartbeats(db, "attempt_kernel", victim_id) == [victim_id]
        assert set(statuses(tmp_path, db)) == set(runs)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and set(statuses(tmp_path, db).values()) != {"succeeded"}:
            time.sleep(0.3)
        assert statuses(tmp_path, db) == dict.fromkeys(runs, "succeeded")
        survivors = "".join(out.read_text() for n, out in enumerate(outs) if n != victim)
        assert f"worker {victim_id} is dead (no heartbeat for 2.0 s)" in survivors
        for run in held:
            assert f"{run}: taken over from worker {victim_id} at fence 2" in survivors
            assert f"{run}: orphan fetch#1 ended Cancelled" in survivors
        posted = [line.split()[0] for line in (tmp_path / "published.log").read_text().splitlines()]
        assert sorted(posted) == runs  # each report posted once
        exported = cli(tmp_path, "export", db)
        assert exported.returncode == 0, exported.stderr
        (tmp_path / "journal.jsonl").write_text(exported.stdout)
        assert replay(tmp_path / "journal.jsonl").valid
        # The seed's recorded-fixture check, on a journal several workers wrote
        # with a takeover: every observed change goes through transition,
        # nothing is rejected, and it reaches the recorded state.
        moves = [
            item.change
            for item in read_log(tmp_path / "journal.jsonl")
            if isinstance(item, Record) and isinstance(item.change, AttemptTransitioned)
        ]
        assert len(moves) >= 2 * 6 + 2  # Admit and an end for every attempt, two more per takeover
        for move in moves:
            assert transition(move.from_state, move.cause) == move.to_state
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGINT)
        for worker in workers:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        for handle in handles:
            handle.close()
    assert all(w.returncode in (0, -signal.SIGKILL) for w in workers), [w.returncode for w in workers]
    assert os.path.exists(tmp_path / "journal.jsonl")
