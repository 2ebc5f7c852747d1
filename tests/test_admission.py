"""Admission across workers: pools of slots shared by every worker (docs/contracts.md, "Admission across workers").

Against the session's real server (`pg_url`), each test in a schema of its
own. Worker processes serve ``workerflows.pooled``, whose step does its work
as a ``pg_sleep`` on a connection named ``admission-work``: a sampler thread
reads the journal, the slots table and ``pg_stat_activity`` while they run.
The executor's side of the seam (`PoolAdmission`) is tested without a
database, with a hand-written admission.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from pgtools import expire_heartbeats, sql_in
from psycopg import sql
from workerflows.pooled import HURRY, THINK, WORK

from attempt_kernel import (
    AttemptTransitioned,
    Executor,
    JSON,
    QueueDeadlinePassed,
    Record,
    RunLogWriter,
    Running,
    Step,
    StepContext,
    Succeeded,
    TimedOut,
    WorkflowError,
    is_terminal,
    load_workflow,
    replay,
)
from attempt_kernel._codec import decode_line
from attempt_kernel.postgres._journal import Lease, LeaseLost, PgJournal
from attempt_kernel.postgres._pools import (
    PoolMissing,
    PoolState,
    SlotAdmission,
    free_slots_of_taken_over_run,
    list_pools,
    set_pool,
)
from attempt_kernel.postgres._worker import run_worker, submit_run

TESTS = Path(__file__).parent
START = "from workerflows.start import main; main()"

# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


def journal_records(url: str, schema: str) -> list[Record]:
    with PgJournal(url, schema=schema) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def transitions(records: list[Record]) -> list[AttemptTransitioned]:
    return [r.change for r in records if isinstance(r.change, AttemptTransitioned)]


def most_running_at_once(records: list[Record]) -> int:
    """The largest number of attempts Running at once after any record of the journal."""
    running: set[tuple[str, str, int]] = set()
    most = 0
    for record in records:
        change = record.change
        if isinstance(change, AttemptTransitioned):
            key = (record.run, change.step, change.attempt)
            if change.to_state == Running():
                running.add(key)
                most = max(most, len(running))
            elif is_terminal(change.to_state):
                running.discard(key)
    return most


def worker(url: str, schema: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """A worker process serving the pooled workflows (heartbeat 0.2 s, dead after 300 s, stops when idle)."""
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "PG_URL": url, "WORKFLOWS": "pooled", **env}
    return subprocess.Popen(
        [sys.executable, "-c", START, url, schema],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def own_run(url: str, schema: str, run: str, owner: str, fence: int) -> None:
    """A runs row held by ``owner`` at ``fence``, as a worker's claim leaves it."""
    sql_in(url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES (%s, %s, %s)", run, owner, fence)


def holders(url: str, schema: str) -> list[tuple[object, ...]]:
    return sql_in(
        url, schema, "SELECT slot, run, step, attempt, worker, fence FROM {s}.slots ORDER BY pool, slot"
    )


async def _noop(ctx: StepContext) -> JSON:
    return None


# --------------------------------------------------------------------------
# Making and sizing pools
# --------------------------------------------------------------------------


@pytest.mark.postgres
def test_set_pool_creates_a_pool_of_free_slots(pg_url: str, schema: str) -> None:
    """set_pool(llm, 3): the pool has 3 slots, none held, as rows 0, 1, 2."""
    assert set_pool(pg_url, "llm", 3, schema=schema) == PoolState(name="llm", slots=3, held=0)
    assert holders(pg_url, schema) == [
        (0, None, None, None, None, None),
        (1, None, None, None, None, None),
        (2, None, None, None, None, None),
    ]


@pytest.mark.postgres
def test_resizing_a_pool_keeps_held_slots_and_lists_every_pool(pg_url: str, schema: str) -> None:
    """Shrinking 3 to 1 while slot 2 is held drops only free slot 1; list_pools shows both pools."""
    set_pool(pg_url, "llm", 3, schema=schema)
    sql_in(
        pg_url, schema,
        "UPDATE {s}.slots SET run = 'r', step = 's', attempt = 1, worker = 'w', fence = 1,"
        " taken_at = now() WHERE slot = 2",
    )
    assert set_pool(pg_url, "llm", 1, schema=schema) == PoolState(name="llm", slots=1, held=1)
    assert [row[0] for row in holders(pg_url, schema)] == [0, 2]
    set_pool(pg_url, "gpu", 0, schema=schema)
    assert list_pools(pg_url, schema=schema) == (
        PoolState(name="gpu", slots=0, held=0),
        PoolState(name="llm", slots=1, held=1),
    )


@pytest.mark.postgres
@pytest.mark.parametrize(("name", "slots"), [("", 1), ("llm", -1), ("llm", 1.5)])
def test_set_pool_refuses_an_empty_name_or_a_bad_size(pg_url: str, name: str, slots: int) -> None:
    """An empty pool name, a negative or fractional size: ValueError, before connecting."""
    with pytest.raises(ValueError):
        set_pool(pg_url, name, slots)


# --------------------------------------------------------------------------
# Taking and freeing slots (one worker's admission, in-process)
# --------------------------------------------------------------------------

POOLED = Step(name="think", run=_noop, pool="llm", queue_deadline=0.2)


@pytest.mark.postgres
def test_slots_are_taken_until_none_is_free_then_the_queue_deadline_passes(pg_url: str, schema: str) -> None:
    """Pool of 2: two attempts get slots 0 and 1; a third waits 0.2 s and is refused; a release lets it in."""
    set_pool(pg_url, "llm", 2, schema=schema)
    own_run(pg_url, schema, "r", "w", 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        admission = SlotAdmission(conn, schema=schema, worker="w", leases={"r": Lease(owner="w", fence=1)})

        async def scenario() -> list[bool]:
            return [await admission.acquire("r", POOLED, n) for n in (1, 2, 3)]

        assert asyncio.run(scenario()) == [True, True, False]
        assert holders(pg_url, schema) == [(0, "r", "think", 1, "w", 1), (1, "r", "think", 2, "w", 1)]
        admission.release("r", POOLED, 1, ended=True)
        assert asyncio.run(admission.acquire("r", POOLED, 3))
        assert holders(pg_url, schema) == [(0, "r", "think", 3, "w", 1), (1, "r", "think", 2, "w", 1)]


@pytest.mark.postgres
def test_an_attempt_that_did_not_end_keeps_its_slot(pg_url: str, schema: str) -> None:
    """release(ended=False) (the log failed before the terminal record) frees nothing."""
    set_pool(pg_url, "llm", 1, schema=schema)
    own_run(pg_url, schema, "r", "w", 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        admission = SlotAdmission(conn, schema=schema, worker="w", leases={"r": Lease(owner="w", fence=1)})
        assert asyncio.run(admission.acquire("r", POOLED, 1))
        admission.release("r", POOLED, 1, ended=False)
    assert holders(pg_url, schema) == [(0, "r", "think", 1, "w", 1)]


@pytest.mark.postgres
def test_a_claim_under_a_lost_lease_raises_lease_lost_and_takes_nothing(pg_url: str, schema: str) -> None:
    """The run's row says fence 2; a claim at fence 1 raises LeaseLost and every slot stays free."""
    set_pool(pg_url, "llm", 1, schema=schema)
    own_run(pg_url, schema, "r", "w", 2)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        admission = SlotAdmission(conn, schema=schema, worker="w", leases={"r": Lease(owner="w", fence=1)})
        with pytest.raises(LeaseLost, match="fence 1 is lost"):
            asyncio.run(admission.acquire("r", POOLED, 1))
        with pytest.raises(LeaseLost, match="holds no lease"):
            asyncio.run(admission.acquire("other", POOLED, 1))
    assert holders(pg_url, schema) == [(0, None, None, None, None, None)]


@pytest.mark.postgres
def test_a_takeover_frees_the_slots_of_older_fences_only_while_it_holds_the_run(
    pg_url: str, schema: str
) -> None:
    """Slots of fence 1 are freed by the holder of fence 2; a stale taker (fence 1) gets LeaseLost."""
    set_pool(pg_url, "llm", 2, schema=schema)
    own_run(pg_url, schema, "r", "old", 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        admission = SlotAdmission(conn, schema=schema, worker="old", leases={"r": Lease(owner="old", fence=1)})
        assert asyncio.run(admission.acquire("r", POOLED, 1))
        sql_in(pg_url, schema, "UPDATE {s}.runs SET owner = 'new', fence = 2")
        with pytest.raises(LeaseLost):
            free_slots_of_taken_over_run(conn, schema, "r", Lease(owner="old", fence=1))
        assert holders(pg_url, schema)[0] == (0, "r", "think", 1, "old", 1)
        freed = free_slots_of_taken_over_run(conn, schema, "r", Lease(owner="new", fence=2))
        assert [(f.pool, f.slot, f.step, f.attempt, f.worker) for f in freed] == [("llm", 0, "think", 1, "old")]
        admission.release("r", POOLED, 1, ended=True)  # the old holder's late release frees nothing more
    assert holders(pg_url, schema) == [(0, None, None, None, None, None), (1, None, None, None, None, None)]


@pytest.mark.postgres
def test_a_worker_refuses_to_start_when_a_step_names_a_missing_pool(pg_url: str, schema: str) -> None:
    """No pool llm in the journal: PoolMissing naming the step and the command that makes it."""
    with pytest.raises(PoolMissing, match=r"workflow 'think', step 'think' needs pool 'llm'.*attempt-kernel pool URL llm --slots N"):
        run_worker(pg_url, [THINK], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)


# --------------------------------------------------------------------------
# The executor's side of the seam (no database)
# --------------------------------------------------------------------------


@dataclass
class OneSlot:
    """A hand-written PoolAdmission of one slot, remembering every call."""

    calls: list[tuple[str, str, int, bool | None]] = field(default_factory=list[tuple[str, str, int, bool | None]])
    held: bool = False

    async def acquire(self, run: str, step: Step, attempt: int) -> bool:
        self.calls.append(("acquire", step.name, attempt, None))
        if self.held:
            await asyncio.sleep(step.queue_deadline)
            return False
        self.held = True
        return True

    def release(self, run: str, step: Step, attempt: int, *, ended: bool) -> None:
        self.calls.append(("release", step.name, attempt, ended))
        self.held = False


def test_the_executor_asks_the_pool_admission_only_for_pooled_steps(tmp_path: Path) -> None:
    """Steps a (pooled), b (not), c (pooled, after a): acquire and release for a and c, each ended."""
    flow = load_workflow(
        "f",
        [
            Step(name="a", run=_noop, pool="p"),
            Step(name="b", run=_noop),
            Step(name="c", run=_noop, pool="p", after=("a",)),
        ],
    )
    pools = OneSlot()

    async def main() -> str:
        with RunLogWriter(tmp_path / "run.log") as log:
            report = await Executor(log, pools=pools).run(flow, "r")
        return report.status

    assert asyncio.run(main()) == "succeeded"
    assert pools.calls == [
        ("acquire", "a", 1, None),
        ("release", "a", 1, True),
        ("acquire", "c", 1, None),
        ("release", "c", 1, True),
    ]


def test_a_pooled_attempt_refused_by_the_admission_ends_timed_out(tmp_path: Path) -> None:
    """Two pooled steps at once on one slot, queue deadline 0.1 s: the second ends TimedOut by QueueDeadlinePassed."""
    async def slow(ctx: StepContext) -> JSON:
        await asyncio.sleep(0.3)
        return None

    flow = load_workflow(
        "f",
        [
            Step(name="a", run=slow, pool="p", queue_deadline=0.1),
            Step(name="b", run=slow, pool="p", queue_deadline=0.1),
        ],
    )

    async def main() -> None:
        with RunLogWriter(tmp_path / "run.log") as log:
            await Executor(log, pools=OneSlot()).run(flow, "r")

    asyncio.run(main())
    with RunLogWriter(tmp_path / "run.log") as log:
        moves = [r.change for r in log.read() if isinstance(r, Record) and isinstance(r.change, AttemptTransitioned)]
    assert [(m.step, m.cause, m.to_state) for m in moves if m.step == "b"] == [
        ("b", QueueDeadlinePassed(), TimedOut())
    ]


def test_without_a_pool_admission_a_pooled_step_runs_under_the_admission_limit(tmp_path: Path) -> None:
    """Executor(log) with no pools: a step naming a pool runs and succeeds."""
    flow = load_workflow("f", [Step(name="a", run=_noop, pool="p")])

    async def main() -> str:
        with RunLogWriter(tmp_path / "run.log") as log:
            return (await Executor(log).run(flow, "r")).status

    assert asyncio.run(main()) == "succeeded"


def test_a_step_with_an_empty_pool_name_is_refused() -> None:
    """pool='' is a WorkflowError naming the step."""
    with pytest.raises(WorkflowError, match=r"step 'a': pool must be None or a non-empty name"):
        load_workflow("f", [Step(name="a", run=_noop, pool="")])


# --------------------------------------------------------------------------
# Many workers on one pool
# --------------------------------------------------------------------------


def count(row: tuple[object, ...] | None) -> int:
    assert row is not None and type(row[0]) is int
    return row[0]


@dataclass
class Sampler:
    """Samples, until stopped, the attempts running in pool llm by three independent readings."""

    url: str
    schema: str
    journal: list[int] = field(default_factory=list[int])
    slots: list[int] = field(default_factory=list[int])
    working: list[int] = field(default_factory=list[int])
    halt: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        s = sql.Identifier(self.schema)
        # One statement reads one snapshot, in which each run's records are a
        # prefix of the run (its writer commits one before the next): the
        # whole journal (a few hundred rows) is read again at every sample.
        read = sql.SQL("SELECT pos, line FROM {s}.records ORDER BY pos").format(s=s)
        held = sql.SQL("SELECT count(*) FROM {s}.slots WHERE pool = 'llm' AND run IS NOT NULL").format(s=s)
        active = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.wait(0.005):
                running: set[tuple[str, str, int]] = set()
                for pos, line in conn.execute(read).fetchall():
                    assert type(pos) is int and type(line) is bytes
                    record = decode_line(line, pos)
                    assert isinstance(record, Record)
                    change = record.change
                    if isinstance(change, AttemptTransitioned):
                        key = (record.run, change.step, change.attempt)
                        if change.to_state == Running():
                            running.add(key)
                        elif is_terminal(change.to_state):
                            running.discard(key)
                self.journal.append(len(running))
                self.slots.append(count(conn.execute(held).fetchone()))
                self.working.append(count(conn.execute(active, (WORK,)).fetchone()))


@pytest.mark.postgres
@pytest.mark.slow
def test_three_workers_on_a_pool_of_two_never_run_more_than_two_attempts(
    pg_url: str, schema: str, tmp_path: Path
) -> None:
    """24 runs, 3 worker processes, pool llm of 2: the journal, the slots and pg_stat_activity never show more than 2."""
    set_pool(pg_url, "llm", 2, schema=schema)
    runs = [f"r{i:02}" for i in range(24)]
    for run in runs:
        submit_run(pg_url, "think", run, {"sleep": 0.05}, schema=schema)
    sampler = Sampler(pg_url, schema)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    try:
        processes = [worker(pg_url, schema, tmp_path) for _ in range(3)]
        results = [finish(p) for p in processes]
    finally:
        sampler.halt.set()
        thread.join()
    assert [code for code, _ in results] == [0, 0, 0], results
    assert max(sampler.journal) == 2 and max(sampler.slots) == 2
    assert 1 <= max(sampler.working) <= 2
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.runs WHERE done AND outcome = 'succeeded'") == [(24,)]
    assert sum(int(out.split("closed ")[-1]) for _, out in results) == 24
    records = journal_records(pg_url, schema)
    assert most_running_at_once(records) == 2
    assert sum(1 for m in transitions(records) if m.to_state == Succeeded()) == 24
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid
    assert list_pools(pg_url, schema=schema) == (PoolState(name="llm", slots=2, held=0),)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_queue_deadline_passes_when_another_workers_attempt_keeps_the_only_slot(
    pg_url: str, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pool of 1 held by a worker process until the test lets it go: a run of hurry in this
    process ends TimedOut by QueueDeadlinePassed."""
    monkeypatch.setenv("PG_URL", pg_url)
    set_pool(pg_url, "llm", 1, schema=schema)
    gate = f"gate:{schema}"
    submit_run(pg_url, "think", "slow", {"gate": gate}, schema=schema)
    with psycopg.connect(pg_url, autocommit=True) as held:
        held.execute("SELECT pg_advisory_lock(hashtext(%s))", (gate,))  # the slow run works until it is let go
        holder = worker(pg_url, schema, tmp_path)
        try:
            deadline = 60.0  # only so that a broken test does not hang
            while sql_in(pg_url, schema, "SELECT count(*) FROM {s}.slots WHERE run = 'slow'") != [(1,)]:
                assert deadline > 0, "the slow run never took the slot"
                deadline -= 0.02
                threading.Event().wait(0.02)
            submit_run(pg_url, "hurry", "quick", schema=schema)
            run_worker(pg_url, [HURRY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
        finally:
            held.execute("SELECT pg_advisory_unlock(hashtext(%s))", (gate,))
            code, out = finish(holder)
    assert code == 0, out
    records = journal_records(pg_url, schema)
    quick = transitions([r for r in records if r.run == "quick"])
    assert [(m.attempt, m.cause, m.to_state) for m in quick] == [(1, QueueDeadlinePassed(), TimedOut())]
    assert sql_in(pg_url, schema, "SELECT run, outcome FROM {s}.runs ORDER BY run") == [
        ("quick", "failed"),
        ("slow", "succeeded"),
    ]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_slot_held_by_a_killed_worker_is_freed_by_the_takeover(pg_url: str, schema: str, tmp_path: Path) -> None:
    """Pool of 1; a worker SIGKILLed inside its step holds the slot; the taker frees it and all 4 runs succeed."""
    set_pool(pg_url, "llm", 1, schema=schema)
    for run in ("r1", "r2", "r3", "r4"):
        submit_run(pg_url, "think", run, schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, CRASH_IN_STEP="1"))
    assert code == -signal.SIGKILL, out
    (held,) = holders(pg_url, schema)
    assert held[0] == 0 and held[2:4] == ("think", 1)
    assert expire_heartbeats(pg_url, schema) == [held[4]]
    code, out = finish(worker(pg_url, schema, tmp_path))
    assert code == 0, out
    assert f"{held[1]}: taken over from worker" in out
    assert f"{held[1]}: freed slot 0 of pool 'llm' held by think#1 of worker {held[4]}" in out
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.runs WHERE done AND outcome = 'succeeded'") == [(4,)]
    records = journal_records(pg_url, schema)
    assert most_running_at_once(records) == 1
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid
    assert holders(pg_url, schema) == [(0, None, None, None, None, None)]
