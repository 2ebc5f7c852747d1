"""A soak of many workers on PostgreSQL under chaos: `nox -s soak` (not part of the gate).

A throwaway server (`pgserver.ThrowawayServer`), three ``attempt-kernel
worker`` processes, R runs of `soakflows.soak` submitted one at each moment
of the chaos, and for S seconds, at random moments drawn from the seed: a worker SIGKILLed (another started in
its place), a worker stopped (SIGSTOP, another started) and woken again
(SIGCONT) after 0.5 to 2.5 s, past its ``--dead-after``, a signal or a cancel
sent to a run, an ``attempt-kernel recover URL`` beside the workers, and an
operator who reconciles every key the reconcilers could not tell about, by
the book. Then the survivors drain the queue, and the soak checks what
must hold whatever the timing:

- every run ends (none left unfinished, none needing reconciliation once
  the operator answered);
- no key was sent to the downstream service twice, and every key sent has
  its ``Dispatched`` in the journal (the write-ahead rule);
- the journal replays valid;
- no operator's action waits on a stopped worker for as long as it stays
  stopped (each must return within a minute).

A failure prints ``PROBLEM: ...`` and the seed, and exits 1: run it again with
that seed (``--seed``) to draw the same moments. The workers' logs and the
book stay in ``--out``.

Usage: python tests/soak.py [--runs R] [--seconds S] [--seed N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
from pgserver import ThrowawayServer, find_server_bin
from soakflows import sent_keys

from attempt_kernel import (
    Dispatched,
    IntentChanged,
    IntentPlanned,
    OperationRefused,
    Record,
    cancel_run,
    reconcile_intent,
    replay,
    send_signal,
)
from attempt_kernel.postgres import PgJournal, submit_run

TESTS = Path(__file__).parent
ACT_WITHIN = 60.0
"""Seconds an operator's action may take before the soak calls it hung."""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "attempt_kernel", *args]


class Soak:
    """One soak: the server's URL, the processes it started, what happened, what went wrong."""

    def __init__(self, url: str, out: Path, rnd: random.Random) -> None:
        self.url = url
        self.out = out
        self.rnd = rnd
        self.env = {**os.environ, "DOWNSTREAM": str(out / "downstream"), "PYTHONPATH": str(TESTS)}
        self.workers: list[subprocess.Popen[bytes]] = []
        self.stopped: dict[int, float] = {}
        self.recovers: list[subprocess.Popen[bytes]] = []
        self.events: Counter[str] = Counter()
        self.problems: list[str] = []
        self.refusals: dict[str, str] = {}
        """The last refusal of each kind of action (a run finished, a cancel recorded), for the report."""

    def start_worker(self) -> None:
        with (self.out / f"worker-{len(self.workers) + 1}.log").open("wb") as log:
            self.workers.append(
                subprocess.Popen(
                    cli("worker", self.url, "--workflows", "soakflows:soak", "--concurrency", "6",
                        "--heartbeat", "0.2", "--dead-after", "1.0"),
                    env=self.env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            )

    def live(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w.poll() is None and w.pid not in self.stopped]

    def act(self, what: str, action: Callable[[], object]) -> None:
        """An operator's action, in a thread: refused is fine, hung is a problem."""
        failed: list[BaseException] = []

        def go() -> None:
            try:
                action()
            except OperationRefused as refused:
                self.events[f"{what} refused"] += 1
                self.refusals[what] = str(refused)
            except BaseException as error:  # noqa: BLE001  # reported, then the soak goes on
                failed.append(error)

        thread = threading.Thread(target=go, daemon=True)
        thread.start()
        thread.join(ACT_WITHIN)
        if thread.is_alive():
            self.problems.append(f"{what} still waits after {ACT_WITHIN:g} s")
            raise SystemExit(self.report())
        if failed:
            self.problems.append(f"{what} raised {failed[0]!r}")
        self.events[what] += 1

    def reconcile_all(self) -> int:
        """The operator: each key the reconcilers could not tell about, answered by the book;
        how many keys it answered."""
        with PgJournal(self.url) as journal:
            keys = [key for attempt in replay(journal).to_reconcile for key in attempt.outstanding]
        sent = set(sent_keys(self.out / "downstream"))
        for key in keys:
            self.act("reconcile", self._reconcile(key, confirmed=key in sent))
        return len(keys)

    def _reconcile(self, key: str, *, confirmed: bool) -> Callable[[], object]:
        return lambda: reconcile_intent(self.url, key, confirmed=confirmed, note="the soak's operator")

    def chaos(self, ids: list[str], runs: int, seconds: float) -> None:
        """``seconds`` of chaos; a run submitted at each moment until there are ``runs``, so
        that runs start, wait and end all along."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(self.rnd.uniform(0.05, 0.6))
            if len(ids) < runs:
                ids.append(f"r{len(ids)}")
                submit_run(self.url, "soak", ids[-1], {"n": ids[-1]})
            roll, live = self.rnd.random(), self.live()
            if roll < 0.25 and live:
                self.rnd.choice(live).send_signal(signal.SIGKILL)
                self.events["kill"] += 1
                self.start_worker()
            elif roll < 0.32 and live:
                frozen = self.rnd.choice(live)
                frozen.send_signal(signal.SIGSTOP)
                self.stopped[frozen.pid] = time.monotonic() + self.rnd.uniform(0.5, 2.5)
                self.events["stop"] += 1
                self.start_worker()
            elif roll < 0.60 and ids:
                run = self.rnd.choice(self.unfinished() or ids)
                self.act("signal", lambda: send_signal(self.url, run, "approve", {"by": "soak"}))
            elif roll < 0.66 and ids:
                run = self.rnd.choice(self.unfinished() or ids)
                self.act("cancel", lambda: cancel_run(self.url, run, "the soak"))
            elif roll < 0.72 and all(r.poll() is not None for r in self.recovers):
                with (self.out / f"recover-{len(self.recovers) + 1}.log").open("wb") as log:
                    self.recovers.append(
                        subprocess.Popen(cli("recover", self.url, "--workflows", "soakflows:soak"),
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
                    )
                self.events["recover"] += 1
            elif roll < 0.85:
                self.reconcile_all()
            self.wake_due()

    def wake_due(self, every: bool = False) -> None:
        for pid, at in list(self.stopped.items()):
            if every or time.monotonic() >= at:
                os.kill(pid, signal.SIGCONT)
                del self.stopped[pid]

    def drain(self) -> None:
        """Wake every stopped worker, let recover end, and the workers finish every run."""
        self.wake_due(every=True)
        for process in self.recovers:
            process.wait(timeout=120)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.reconcile_all() == 0 and self.open_runs() == 0:
                return
            if not self.live():
                self.start_worker()
            time.sleep(1)
        self.problems.append(f"{self.open_runs()} run(s) still unfinished two minutes after the chaos ended")

    def unfinished(self) -> list[str]:
        """The runs not done yet, in id order (an operator acts on those, mostly)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute("SELECT run FROM attempt_kernel.runs WHERE NOT done ORDER BY run").fetchall()
        return [str(run) for (run,) in rows]

    def open_runs(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM attempt_kernel.runs WHERE NOT done").fetchone()
        assert row is not None
        count: int = row[0]
        return count

    def check(self) -> None:
        with PgJournal(self.url) as journal:
            report = replay(journal)
            records = [item for item in journal.read() if isinstance(item, Record)]
        if not report.valid:
            self.problems.append(f"the journal breaks the kernel's rules: {report.violations[:3]}")
        if report.to_reconcile:
            self.problems.append(f"left needing reconciliation: {report.to_reconcile}")
        keys: dict[tuple[str, str, int, str], str] = {}
        dispatched: set[str] = set()
        for record in records:
            change = record.change
            if isinstance(change, IntentPlanned):
                keys[record.run, change.step, change.attempt, change.name] = change.key
            elif isinstance(change, IntentChanged) and isinstance(change.to_state, Dispatched):
                dispatched.add(keys[record.run, change.step, change.attempt, change.name])
        sent = Counter(sent_keys(self.out / "downstream"))
        twice = {key: n for key, n in sent.items() if n > 1}
        if twice:
            self.problems.append(f"keys sent more than once: {twice}")
        unwritten = sorted(set(sent) - dispatched)
        if unwritten:
            self.problems.append(f"keys sent with no Dispatched in the journal: {unwritten}")
        self.events["effects sent"] = sum(sent.values())
        self.events["Indeterminate attempts"] = len(report.indeterminate)

    def report(self) -> int:
        print(f"events: {dict(sorted(self.events.items()))}")
        for what, why in sorted(self.refusals.items()):
            print(f"last {what} refused: {why}")
        for problem in self.problems:
            print(f"PROBLEM: {problem}")
        return 1 if self.problems else 0

    def stop_everything(self) -> None:
        self.wake_due(every=True)
        for process in [*self.workers, *self.recovers]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, *self.recovers]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="soak many workers on PostgreSQL under chaos")
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seed: int = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {seed}, {args.runs} runs, {args.seconds:g} s of chaos; logs in {out}", flush=True)
    bindir = find_server_bin()
    if bindir is None:
        print("no PostgreSQL server binaries found (Debian: apt-get install postgresql-15)")
        return 2
    server = ThrowawayServer(bindir)
    url = server.start()
    soak = Soak(url, out, random.Random(seed))
    try:
        subprocess.run(cli("migrate", url), check=True, capture_output=True)
        ids: list[str] = []
        for _ in range(3):
            soak.start_worker()
        soak.chaos(ids, args.runs, args.seconds)
        soak.drain()
        soak.check()
    finally:
        soak.stop_everything()
        server.stop()
    code = soak.report()
    print(f"soak: seed {seed}: {'FAILED' if code else 'every check held'}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
