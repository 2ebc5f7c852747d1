"""The PostgreSQL journal's writer thread: group commit, fenced per run (`PgJournal.hand_over`).

Against the session's real server, each test in a schema of its own. The
writer is held with the journal's ``writer_hook`` (a `threading.Event`
it waits on before each group) while records queue, so what goes into
one group is decided by the test, never by timing. A worker that must die
runs as a subprocess (``workerflows.start``), SIGKILLed right after the
group holding its N-th record committed, or inside an effect.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from pgtools import expire_heartbeats, sql_in
from test_workers import finish, journal_records, worker
from workerflows.pay import calls

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    Dispatch,
    Dispatched,
    IntentChanged,
    IntentPlanned,
    Pending,
    Planned,
    Record,
    RunStarted,
    Running,
    StepResult,
    UnencodableRecord,
)
from attempt_kernel.postgres._journal import Lease, LeaseLost, PgJournal
from attempt_kernel.postgres._worker import submit_run

pytestmark = pytest.mark.postgres

RUNS = ("a", "b", "c", "d")


def up_to_dispatched(step: str) -> list[Change]:
    """A run's records from its start to its first effect's ``Dispatched`` (five records)."""
    return [
        RunStarted(workflow="pay"),
        AttemptCreated(step=step, attempt=1),
        AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step=step, attempt=1, name="card", key=f"{step}/card"),
        IntentChanged(step=step, attempt=1, name="card", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
    ]


def claimed(url: str, schema: str, runs: Sequence[str]) -> dict[str, Lease]:
    """``runs`` held by worker ``w`` at fence 1 (their ``runs`` rows), and the leases that say so."""
    for run in runs:
        sql_in(url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES (%s, 'w', 1)", run)
    return {run: Lease(owner="w", fence=1) for run in runs}


async def hand_over_held(
    journal: PgJournal, url: str, gate: threading.Event, queued: dict[str, list[Change]], between: list[str]
) -> list[BaseException | None]:
    """Queue each run's records while the writer is held, take over the runs in ``between``, release.

    Returns what each run's `PgJournal.committed` raised (None: nothing), in ``queued``'s order.
    """
    for run, changes in queued.items():
        journal.new_run(run)
        for change in changes:
            journal.hand_over(run, [change])
    for run in between:  # a takeover: another owner, the fence one higher
        sql_in(url, journal.schema, "UPDATE {s}.runs SET owner = 'w2', fence = fence + 1 WHERE run = %s", run)
    waits = [asyncio.ensure_future(journal.committed(run)) for run in queued]
    await asyncio.sleep(0)  # one turn of the loop: every wait above is registered before the release
    gate.set()
    return list(await asyncio.gather(*waits, return_exceptions=True))


def held_journal(url: str, schema: str, leases: dict[str, Lease]) -> tuple[PgJournal, threading.Event]:
    """A journal whose writer waits for the event returned (set it to let the writer go)."""
    gate = threading.Event()
    return PgJournal(url, schema=schema, leases=leases, writer_hook=gate.wait), gate


def kinds_of(url: str, schema: str, run: str) -> list[str]:
    """The kinds of ``run``'s records in the journal, in order."""
    with PgJournal(url, schema=schema) as journal:
        return [type(item.change).__name__ for item in journal.read_run(run) if isinstance(item, Record)]


FIVE = ["RunStarted", "AttemptCreated", "AttemptTransitioned", "IntentPlanned", "IntentChanged"]


def test_a_lease_lost_in_the_middle_of_a_group_fails_only_that_runs_records(pg_url: str, schema: str) -> None:
    """Three runs' records queue behind a held writer; run b is taken over before the group is written."""
    PgJournal(pg_url, schema=schema).close()  # the tables
    leases = claimed(pg_url, schema, ("a", "b", "c"))
    journal, gate = held_journal(pg_url, schema, leases)
    with journal:
        queued = {run: up_to_dispatched("s") for run in ("a", "b", "c")}
        outcomes = asyncio.run(hand_over_held(journal, pg_url, gate, queued, between=["b"]))
    assert outcomes[0] is None and outcomes[2] is None
    lost = outcomes[1]
    assert isinstance(lost, LeaseLost) and lost.run == "b" and lost.lease == Lease(owner="w", fence=1)
    assert [kinds_of(pg_url, schema, run) for run in ("a", "b", "c")] == [FIVE, [], FIVE]


def test_a_run_whose_lease_a_group_found_lost_takes_no_more_records(pg_url: str, schema: str) -> None:
    """After the group that found b's lease lost: b's next hand-over raises at once, the others go on."""
    PgJournal(pg_url, schema=schema).close()
    leases = claimed(pg_url, schema, ("a", "b"))
    journal, gate = held_journal(pg_url, schema, leases)
    with journal:
        queued = {run: up_to_dispatched("s")[:2] for run in ("a", "b")}
        asyncio.run(hand_over_held(journal, pg_url, gate, queued, between=["b"]))
        with pytest.raises(LeaseLost, match="run 'b'"):
            journal.hand_over("b", [AttemptCreated(step="t", attempt=1)])
        assert journal.hand_over("a", [AttemptCreated(step="t", attempt=1)]) == 3
    assert Counter(r.run for r in journal_records(pg_url, schema)) == Counter({"a": 3})


def test_concurrent_dispatched_share_one_synchronous_commit(pg_url: str, schema: str) -> None:
    """Four runs each hand over records up to a ``Dispatched`` while the writer is held: one group, one synchronous commit."""
    PgJournal(pg_url, schema=schema).close()
    leases = claimed(pg_url, schema, RUNS)
    journal, gate = held_journal(pg_url, schema, leases)
    with journal:
        queued = {run: up_to_dispatched("s") for run in RUNS}
        outcomes = asyncio.run(hand_over_held(journal, pg_url, gate, queued, between=[]))
        assert outcomes == [None, None, None, None]
        assert journal.synchronous_commits == 1
    assert {run: kinds_of(pg_url, schema, run) for run in RUNS} == {run: FIVE for run in RUNS}


def test_a_dispatched_alone_is_not_committed_until_the_writer_runs(pg_url: str, schema: str) -> None:
    """`committed` waits for the writer: held, nothing is in the journal and nothing is synchronously committed."""
    PgJournal(pg_url, schema=schema).close()
    leases = claimed(pg_url, schema, ("a",))
    journal, gate = held_journal(pg_url, schema, leases)

    async def scenario() -> tuple[bool, int, int]:
        journal.new_run("a")
        journal.hand_over("a", up_to_dispatched("s"))
        wait = asyncio.ensure_future(journal.committed("a"))
        await asyncio.sleep(0)
        before = (wait.done(), len(journal_records(pg_url, schema)), journal.synchronous_commits)
        gate.set()
        await wait
        return before

    with journal:
        assert asyncio.run(scenario()) == (False, 0, 0)
        assert journal.synchronous_commits == 1
    assert len(journal_records(pg_url, schema)) == 5


def test_a_record_refused_at_the_hand_over_leaves_the_runs_queued_records_in_order(pg_url: str, schema: str) -> None:
    """A value JSON cannot carry raises at once, handing nothing over; the run's records queued
    before and after it are written, numbered one after the other."""
    PgJournal(pg_url, schema=schema).close()
    leases = claimed(pg_url, schema, ("a",))
    journal, gate = held_journal(pg_url, schema, leases)

    async def scenario() -> int:
        journal.new_run("a")
        journal.hand_over("a", up_to_dispatched("s")[:2])
        with pytest.raises(UnencodableRecord):
            journal.hand_over("a", [StepResult(step="s", attempt=1, value=float("nan"))])
        seq = journal.hand_over("a", [AttemptCreated(step="t", attempt=1)])
        gate.set()
        await journal.committed("a")
        return seq

    with journal:
        assert asyncio.run(scenario()) == 3
    assert kinds_of(pg_url, schema, "a") == ["RunStarted", "AttemptCreated", "AttemptCreated"]


# --------------------------------------------------------------------------
# SIGKILL in the middle of concurrent runs with effects
# --------------------------------------------------------------------------

KILLED_RUNS = ("r1", "r2", "r3", "r4", "r5", "r6")


def dispatched_runs(records: list[Record]) -> set[str]:
    return {
        r.run for r in records if isinstance(r.change, IntentChanged) and r.change.to_state == Dispatched()
    }


# Where the first worker dies: right after the group holding record N
# committed (the hand-over of record N waits for it, then kills), or inside
# the first effect sent, right after the downstream service saw the call.
KILLS = [
    pytest.param({"KILL_AFTER": "12"}, id="after-record-12"),
    pytest.param({"KILL_AFTER": "30"}, id="after-record-30"),
    pytest.param({"KILL_AFTER": "55"}, id="after-record-55"),
    pytest.param({"CRASH_IN_EFFECT": "1"}, id="inside-the-first-effect"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kill", KILLS)
def test_a_worker_killed_among_concurrent_runs_sent_no_effect_before_its_dispatched(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path, kill: dict[str, str]
) -> None:
    """Six runs, four at a time; SIGKILL in the middle: every effect the downstream service saw
    has its ``Dispatched`` in the journal; another worker finishes every run, and each card is
    charged once."""
    for run in KILLED_RUNS:
        submit_run(pg_url, "pay", run, schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, **kill))
    assert code == -signal.SIGKILL, out
    before = journal_records(pg_url, schema)
    sent = {key.split("/")[0] for key in calls(downstream)}
    assert sent <= dispatched_runs(before)
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(worker(pg_url, schema, tmp_path))
    assert code == 0, out
    assert sql_in(pg_url, schema, "SELECT run, done, outcome FROM {s}.runs ORDER BY run") == [
        (run, True, "succeeded") for run in KILLED_RUNS
    ]
    assert Counter(calls(downstream)) == Counter({f"{run}/charge/card": 1 for run in KILLED_RUNS})
