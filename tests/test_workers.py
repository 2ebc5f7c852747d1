"""Workers sharing one PostgreSQL journal: submitting, claiming, fencing, takeover.

Against the session's real server (`pg_url`), each test in a schema of its
own. Workers that must die run as subprocesses (``workerflows.start``),
killed with SIGKILL right after their N-th record, or frozen with SIGSTOP
past their lease; no lease expires by waiting (dead after 300 s): the test
ages a gone worker's heartbeat in the database (`expire_heartbeats`) and,
for a frozen one, moves its own clock on (SIGUSR1). The fake downstream service is a file of the keys it was
called with (``workerflows.pay``). Beside them, a hypothesis state machine
runs the lease decisions (`_lease`) on a fake clock.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
from pgtools import expire_heartbeats, sql_in
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from hypothesis.strategies import sampled_from
from workerflows.pay import PAY, calls, charge, prepare
from workerflows.pay import finish as finish_step

from attempt_kernel import (
    AttemptCreated,
    AttemptTransitioned,
    Cancelled,
    Dispatched,
    EffectFinding,
    EffectNotHappened,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    JSON,
    Record,
    RunCancelRequested,
    RunFinished,
    RunRefused,
    RunStarted,
    RunContext,
    Running,
    Step,
    StepContext,
    Succeeded,
    UnencodableRecord,
    Workflow,
    WorkflowError,
    load_workflow,
    replay,
    workflow,
)
from attempt_kernel.postgres._lease import LeaseVerdict, check_timing, lease_decision, may_dispatch, may_take_over
from attempt_kernel.postgres._journal import Lease, LeaseLost, PgJournal, PgJournalError
from attempt_kernel.postgres._pools import set_pool
from attempt_kernel.postgres._worker import Worker, WorkerDeclaredDead
from attempt_kernel.postgres._worker import _OneRun, run_worker, submit_run  # pyright: ignore[reportPrivateUsage]  # the worker's run view is under test

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).parent
START = "from workerflows.start import main; main()"

# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


def journal_records(url: str, schema: str) -> list[Record]:
    with PgJournal(url, schema=schema) as journal:
        return [item for item in journal.read() if isinstance(item, Record)]


def worker(url: str, schema: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """Start a worker process (heartbeat 0.2 s, dead after 300 s, stops when idle)."""
    environment = {**os.environ, "PYTHONPATH": str(TESTS), **env}
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


def succeeded_per_step(records: list[Record]) -> Counter[str]:
    return Counter(
        r.change.step
        for r in records
        if isinstance(r.change, AttemptTransitioned) and r.change.to_state == Succeeded()
    )


def ended_indeterminate(records: list[Record], step: str) -> bool:
    return any(
        isinstance(r.change, AttemptTransitioned)
        and r.change.step == step
        and r.change.to_state == Indeterminate()
        for r in records
    )


# --------------------------------------------------------------------------
# Submitting and one worker
# --------------------------------------------------------------------------


def test_submit_returns_the_run_id_and_queues_its_workflow_and_input(pg_url: str, schema: str) -> None:
    """A submitted run is a runs row with its workflow and input, no owner, not done."""
    assert submit_run(pg_url, "pay", "r1", {"n": 1}, schema=schema) == "r1"
    assert sql_in(pg_url, schema, "SELECT run, workflow, input, owner, fence, done FROM {s}.runs") == [
        ("r1", "pay", '{"n":1}', None, 0, False)
    ]


def test_submit_refuses_an_id_already_queued(pg_url: str, schema: str) -> None:
    """A second submit of the same id raises RunRefused and queues nothing."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    with pytest.raises(RunRefused, match="run 'r1' is already in the journal"):
        submit_run(pg_url, "pay", "r1", {"other": True}, schema=schema)
    assert sql_in(pg_url, schema, "SELECT run, input FROM {s}.runs") == [("r1", "null")]


def test_submit_refuses_an_id_already_written_in_the_journal(pg_url: str, schema: str) -> None:
    """A run written straight to the journal (no queue row) keeps its id."""
    with PgJournal(pg_url, schema=schema) as journal:
        journal.append("r1", RunStarted(workflow="pay"))
    with pytest.raises(RunRefused):
        submit_run(pg_url, "pay", "r1", schema=schema)


def test_submit_refuses_input_json_cannot_carry(pg_url: str, schema: str) -> None:
    """A NaN input is refused before anything is queued."""
    PgJournal(pg_url, schema=schema).close()
    with pytest.raises(UnencodableRecord):
        submit_run(pg_url, "pay", "r1", float("nan"), schema=schema)
    assert sql_in(pg_url, schema, "SELECT run FROM {s}.runs") == []


def test_submit_without_an_id_names_the_run_after_its_workflow(pg_url: str, schema: str) -> None:
    """The default id is the workflow's name and 12 hex digits."""
    run = submit_run(pg_url, "pay", schema=schema)
    assert run.startswith("pay-") and len(run) == len("pay-") + 12


async def _noted(ctx: StepContext) -> JSON:
    return "noted"


@pytest.mark.parametrize(
    ("flow", "said"),
    [
        (
            lambda: load_workflow("a\x00b", [Step(name="s", run=_noted)]),
            r"workflow 'a\\x00b' cannot run on a PostgreSQL journal: its name 'a\\x00b' holds a NUL",
        ),
        (
            lambda: load_workflow("pay", [Step(name="s", run=_noted)], domain_states=("ok", "b\ud800")),
            r"workflow 'pay' cannot run on a PostgreSQL journal: its domain state 'b\\ud800' holds a lone surrogate",
        ),
        (
            lambda: load_workflow("pay", [Step(name="s", run=_noted, pool="l\x00m")]),
            r"pool 'l\\x00m' \(its step 's' names it\) holds a NUL",
        ),
    ],
    ids=["name", "domain-state", "pool"],
)
def test_a_worker_refuses_a_workflow_postgresql_cannot_hold_before_it_claims_anything(
    pg_url: str, schema: str, flow: Callable[[], Workflow], said: str
) -> None:
    """A name, a declared domain state, a pool or a pooled step's name holding a NUL or a lone
    surrogate (PostgreSQL text holds neither) is a `WorkflowError` naming it, before the worker
    registers or claims: the worker died on its first statement (a workflow name, a pool), or
    claimed a run and died at its start (a domain state), leaving the run held by a dead worker
    for the next one to take over and die on in turn."""
    set_pool(pg_url, "llm", 1, schema=schema)
    submit_run(pg_url, "pay", "r1", schema=schema)
    with pytest.raises(WorkflowError, match=said):
        run_worker(pg_url, [flow()], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
    assert sql_in(pg_url, schema, "SELECT run, owner, fence, done FROM {s}.runs") == [("r1", None, 0, False)]
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.workers") == [(0,)]
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.records") == [(0,)]


@workflow("tickets")
async def _tickets(run: RunContext) -> JSON:
    """Opens one ticket per item of its input, each a pooled step named after the item."""
    items = run.input
    assert isinstance(items, list)
    return [await run.step(f"open {item}", _noted, pool="llm") for item in items if isinstance(item, str)]


@pytest.mark.parametrize(
    "flow",
    [
        lambda: load_workflow("tickets", [Step(name="open a\x00b", run=_noted, pool="llm")]),
        lambda: _tickets,
    ],
    ids=["dag", "code"],
)
def test_a_pooled_step_whose_name_postgresql_text_cannot_hold_runs_and_frees_its_slot(
    pg_url: str, schema: str, flow: Callable[[], Workflow]
) -> None:
    """A pooled step's name with a NUL or a lone surrogate (a code workflow may make it from
    the run's input) takes a slot and frees it like any other: the slots table keeps the name
    with those escaped. Before, the slot's claim failed in the database and killed the worker,
    and each worker that took the run over died the same way."""
    set_pool(pg_url, "llm", 1, schema=schema)
    submit_run(pg_url, "tickets", "t-1", ["a\x00b", "c\ud800d"], schema=schema)
    closed = run_worker(pg_url, [flow()], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
    assert closed == 1
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "succeeded")]
    assert sql_in(pg_url, schema, "SELECT run, step FROM {s}.slots") == [(None, None)]
    with PgJournal(pg_url, schema=schema) as journal:
        report = replay(journal)
    assert report.valid and report.violations == ()


@workflow("odd-pool")
async def _odd_pool(run: RunContext) -> JSON:
    return await run.step("open", _noted, pool="l\x00m", queue_deadline=0.05)


def test_a_code_step_naming_a_pool_postgresql_text_cannot_hold_waits_out_its_queue_deadline(
    pg_url: str, schema: str
) -> None:
    """No pool of such a name can exist, so the step is never admitted: it ends TimedOut by
    its queue deadline, as for a pool the journal does not have, and the worker goes on.
    Before, the claim failed in the database and killed the worker."""
    submit_run(pg_url, "odd-pool", "o-1", schema=schema)
    closed = run_worker(pg_url, [_odd_pool], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
    assert closed == 1
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "failed")]
    with PgJournal(pg_url, schema=schema) as journal:
        moves = [
            (i.change.step, type(i.change.to_state).__name__)
            for i in journal.read()
            if isinstance(i, Record) and isinstance(i.change, AttemptTransitioned)
        ]
    assert moves == [("open@1", "TimedOut")]


@pytest.mark.parametrize(("name", "found"), [("l\x00m", r"a NUL \('\\x00'\) at index 1"), ("l\ud800", "a lone surrogate")])
def test_set_pool_refuses_a_name_postgresql_text_cannot_hold(pg_url: str, schema: str, name: str, found: str) -> None:
    """A ValueError naming the character, as for any other bad pool name: it was a raw
    UnicodeEncodeError from the driver, or the database's refusal."""
    with pytest.raises(ValueError, match=f"a pool name must be text PostgreSQL can hold: .* holds {found}"):
        set_pool(pg_url, name, 1, schema=schema)


def test_one_worker_runs_a_submitted_run_to_the_end(pg_url: str, schema: str, downstream: Path) -> None:
    """run_worker claims the run, drives it to success, closes its row; the journal replays clean."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    closed = run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True)
    assert closed == 1
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 1)]
    with PgJournal(pg_url, schema=schema) as journal:
        report = replay(journal)
    assert report.valid and report.records == 17
    assert calls(downstream) == ["r1/charge/card"]


def test_a_worker_drives_several_runs_and_retires_its_id(pg_url: str, schema: str, downstream: Path) -> None:
    """Three runs, concurrency 2: all succeed; the worker's row is dead once it returns."""
    for run in ("r1", "r2", "r3"):
        submit_run(pg_url, "pay", run, schema=schema)
    assert run_worker(pg_url, [PAY], schema=schema, concurrency=2, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 3
    assert sql_in(pg_url, schema, "SELECT dead FROM {s}.workers") == [(True,)]
    assert sorted(calls(downstream)) == ["r1/charge/card", "r2/charge/card", "r3/charge/card"]


def test_one_statement_claims_a_run_for_each_free_slot(pg_url: str, schema: str, downstream: Path) -> None:
    """Five runs, concurrency 3: the first claim takes r1, r2 and r3 in one transaction,
    and the worker starts them in the order they were submitted.

    A trigger writes down the transaction of each claim (an update that
    moves a run's fence on); a worker claiming one run per statement
    would show three transactions for the first three runs.
    """
    for run in ("r1", "r2", "r3", "r4", "r5"):
        submit_run(pg_url, "pay", run, schema=schema)
    sql_in(pg_url, schema, "CREATE TABLE {s}.claims (id serial, tx bigint, run text)")
    sql_in(
        pg_url, schema,
        "CREATE FUNCTION {s}.note_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " INSERT INTO {s}.claims (tx, run) VALUES (txid_current(), NEW.run); RETURN NEW; END $$",
    )  # fmt: skip
    sql_in(
        pg_url, schema,
        "CREATE TRIGGER noted AFTER UPDATE ON {s}.runs FOR EACH ROW"
        " WHEN (NEW.fence = OLD.fence + 1) EXECUTE FUNCTION {s}.note_claim()",
    )  # fmt: skip
    lines: list[str] = []
    assert run_worker(
        pg_url, [PAY], schema=schema, concurrency=3, heartbeat=0.2, dead_after=300, stop_when_idle=True,
        progress=lines.append,
    ) == 5  # fmt: skip
    rows = sql_in(pg_url, schema, "SELECT tx, run FROM {s}.claims ORDER BY id")
    first = {run for tx, run in rows if tx == rows[0][0]}
    assert first == {"r1", "r2", "r3"}
    # driven in the order they were submitted (the order they became due)
    assert [line.split(":")[0] for line in lines if ": claimed at fence" in line] == ["r1", "r2", "r3", "r4", "r5"]
    assert sorted(str(run) for _, run in rows) == ["r1", "r2", "r3", "r4", "r5"]
    assert sorted(calls(downstream)) == [f"r{i}/charge/card" for i in range(1, 6)]


def test_the_workers_own_lines_escape_a_run_id_for_any_handler(
    pg_url: str, schema: str, downstream: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run id with a line break and a terminal escape: the worker's own lines (claimed, its
    end) are one line each with the id escaped, as the run logger's are, whatever handler
    the application puts on the `attempt_kernel` logger."""
    submit_run(pg_url, "pay", "r\n\x1b[2J", schema=schema)
    with caplog.at_level(logging.INFO, logger="attempt_kernel"):
        assert run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 1
    own = [r.getMessage() for r in caplog.records if r.name == "attempt_kernel.worker" and "r\\n" in r.getMessage()]
    assert own == ["r\\n\\x1b[2J: claimed at fence 1", "r\\n\\x1b[2J: succeeded"]
    assert not [r for r in caplog.records if "\n" in r.getMessage() or "\x1b" in r.getMessage()]


def test_a_claimed_row_whose_input_is_not_json_stops_the_worker_and_names_the_run(pg_url: str, schema: str) -> None:
    """Input written past submit_run: a PgJournalError naming the run; the worker retires its id,
    so the runs claimed with it in the same statement are free to claim again."""
    for run in ("r1", "r2", "r3"):
        submit_run(pg_url, "pay", run, schema=schema)
    sql_in(pg_url, schema, "UPDATE {s}.runs SET input = 'not json' WHERE run = 'r2'")
    with pytest.raises(PgJournalError, match="an input for run 'r2' that is not JSON"):
        run_worker(pg_url, [PAY], schema=schema, concurrency=3, heartbeat=0.2, dead_after=300, stop_when_idle=True)
    assert sql_in(
        pg_url, schema,
        "SELECT r.run, r.fence, w.dead FROM {s}.runs r JOIN {s}.workers w ON w.id = r.owner ORDER BY r.run",
    ) == [("r1", 1, True), ("r2", 1, True), ("r3", 1, True)]  # fmt: skip


def test_dead_after_shorter_than_three_heartbeats_is_refused(pg_url: str) -> None:
    """dead_after 0.5 s with a 0.2 s heartbeat: ValueError naming the fix."""
    with pytest.raises(ValueError, match="at least three heartbeat periods"):
        run_worker(pg_url, [PAY], heartbeat=0.2, dead_after=0.5)


# --------------------------------------------------------------------------
# Per-run leases in the journal
# --------------------------------------------------------------------------


def test_an_append_to_a_run_missing_from_the_leases_raises_lease_lost(pg_url: str, schema: str) -> None:
    """A journal with per-run leases writes nothing to a run it holds no lease on."""
    with PgJournal(pg_url, schema=schema, leases={}) as journal:
        with pytest.raises(LeaseLost, match="holds no lease on the run"):
            journal.append("r", RunStarted(workflow="pay"))
    assert journal_records(pg_url, schema) == []


def test_each_run_is_written_under_its_own_fence(pg_url: str, schema: str) -> None:
    """r1 at fence 2 writes; r2 held at fence 1 while its row says 2 raises LeaseLost."""
    leases = {"r1": Lease(owner="w", fence=2), "r2": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 2), ('r2', 'w', 2)")
        journal.append("r1", RunStarted(workflow="pay"))
        with pytest.raises(LeaseLost, match="fence 1 is lost"):
            journal.append("r2", RunStarted(workflow="pay"))
    assert [r.run for r in journal_records(pg_url, schema)] == ["r1"]


def test_append_and_complete_writes_the_end_and_closes_the_row_in_one_go(pg_url: str, schema: str) -> None:
    """Records 2-3 (a cancel decision and the end) and the row's close: all there, numbered 2 and 3."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        journal.append("r1", RunStarted(workflow="pay"))
        assert journal.append_and_complete("r1", (RunCancelRequested(reason="x"), RunFinished()), outcome="cancelled") == 3
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "cancelled")]
    assert [(r.seq, kind(r)) for r in journal_records(pg_url, schema)] == [
        (1, "run_started"), (2, "RunCancelRequested"), (3, "run_finished")
    ]


def test_append_and_complete_under_a_lost_lease_writes_nothing_and_closes_nothing(pg_url: str, schema: str) -> None:
    """The row says fence 2, the writer holds fence 1: LeaseLost, the row stays open, no record."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 2)")
        with pytest.raises(LeaseLost, match="fence 1 is lost"):
            journal.append_and_complete("r1", (RunStarted(workflow="pay"), RunFinished()), outcome="succeeded")
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(False, None)]
    assert journal_records(pg_url, schema) == []


def test_append_and_complete_needs_a_lease(pg_url: str, schema: str) -> None:
    """A journal opened without a lease has no run row to close: ValueError, nothing written."""
    with PgJournal(pg_url, schema=schema) as journal:
        with pytest.raises(ValueError, match="opened without a lease"):
            journal.append_and_complete("r1", (RunFinished(),), outcome="succeeded")
    assert journal_records(pg_url, schema) == []


def test_a_workers_view_of_a_fresh_run_holds_its_start_and_its_end(pg_url: str, schema: str) -> None:
    """The start waits for the next record, the end for the close; everything else is written at once."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        view = _OneRun(journal, journal, "r1", fresh=True, holds=True)
        assert list(view.read()) == []
        assert view.append("r1", RunStarted(workflow="pay")) == 1
        assert journal_records(pg_url, schema) == []  # held
        assert view.append("r1", AttemptCreated(step="s", attempt=1)) == 2
        assert [kind(r) for r in journal_records(pg_url, schema)] == ["run_started", "AttemptCreated"]
        assert view.append("r1", RunCancelRequested(reason="x")) == 3
        assert view.append("r1", RunFinished()) == 4
        assert view.end == (RunFinished(),)
        assert len(journal_records(pg_url, schema)) == 3  # the end is held for the close
        with pytest.raises(AssertionError, match="a record after the run's end"):
            view.append("r1", RunStarted(workflow="pay"))
        assert journal.append_and_complete("r1", view.end, outcome="cancelled") == 4
    assert [r.seq for r in journal_records(pg_url, schema)] == [1, 2, 3, 4]


def test_a_run_that_ends_right_after_its_start_holds_both_for_the_close(pg_url: str, schema: str) -> None:
    """Start then end, nothing between: both wait, and go in with the close."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        view = _OneRun(journal, journal, "r1", fresh=True, holds=True)
        list(view.read())
        view.append("r1", RunStarted(workflow="pay"))
        assert view.append("r1", RunFinished()) == 2
        assert view.end == (RunStarted(workflow="pay"), RunFinished())
        assert journal_records(pg_url, schema) == []


def test_a_view_that_does_not_hold_writes_each_record_at_once(pg_url: str, schema: str) -> None:
    """Recovery's view (holds=False): the start and the end are written when appended."""
    leases = {"r1": Lease(owner="w", fence=1)}
    with PgJournal(pg_url, schema=schema, leases=leases) as journal:
        sql_in(pg_url, schema, "INSERT INTO {s}.runs (run, owner, fence) VALUES ('r1', 'w', 1)")
        view = _OneRun(journal, journal, "r1", fresh=True)
        list(view.read())
        view.append("r1", RunStarted(workflow="pay"))
        assert view.append("r1", RunFinished()) == 2
        assert view.end == ()
    assert [kind(r) for r in journal_records(pg_url, schema)] == ["run_started", "run_finished"]


# --------------------------------------------------------------------------
# SIGKILL: another worker takes the run over
# --------------------------------------------------------------------------

# (kill after record N, environment of the killed worker, of the taker,
#  what the last record in the journal is, the run's outcome, calls of the
#  effect): by hand from the 17 records of an undisturbed run (see the test
#  above). The kill comes right after the statement that wrote record N:
#  record 1 (the start) goes in with records 2 and 3 (prepare's creation
#  and admission), 15 with 16 (finish's result and Succeed); 17 (the end)
#  goes in with the close of the run's row (the test after this one).
#  and what the taker says the charge's reconciler answered (None: not asked,
#  no intent was outstanding).
NOT_SENT = "it did not happen (intent Rejected)"
SENT = "it happened (intent Confirmed)"
UNKNOWN = "unknown (the test switched the reconciler off)"
KILLS = [
    pytest.param(1, {}, {}, "prepare-running", "succeeded", 1, None, id="after-the-start-and-the-first-admission"),
    pytest.param(7, {}, {}, "charge-running", "succeeded", 1, None, id="charge-running"),
    pytest.param(9, {}, {}, "dispatched", "succeeded", 1, NOT_SENT, id="after-dispatched-reconciled-not-sent"),
    pytest.param(
        9, {}, {"RECONCILE": "off"}, "dispatched", "needs-reconciliation", 0, UNKNOWN, id="after-dispatched-unknown"
    ),
    pytest.param(
        0, {"CRASH_IN_EFFECT": "1"}, {}, "dispatched", "succeeded", 1, SENT, id="inside-the-effect-reconciled-sent"
    ),
    pytest.param(10, {}, {}, "confirmed", "succeeded", 1, None, id="after-confirmed"),
    pytest.param(16, {}, {}, "finish-succeeded", "succeeded", 1, None, id="every-attempt-ended-no-run-end"),
]


def kind(record: Record) -> str:
    change = record.change
    if isinstance(change, RunStarted):
        return "run_started"
    if isinstance(change, RunFinished):
        return "run_finished"
    if isinstance(change, IntentChanged):
        return "dispatched" if change.to_state == Dispatched() else "confirmed"
    if isinstance(change, AttemptTransitioned) and change.to_state == Running():
        return f"{change.step}-running"
    if isinstance(change, AttemptTransitioned) and change.to_state == Succeeded():
        return f"{change.step}-succeeded"
    return type(change).__name__


@pytest.mark.slow
@pytest.mark.parametrize(("n", "killed_env", "taker_env", "nth", "outcome", "sent", "answer"), KILLS)
def test_a_killed_workers_run_is_taken_over_and_finished(
    pg_url: str,
    schema: str,
    tmp_path: Path,
    downstream: Path,
    n: int,
    killed_env: dict[str, str],
    taker_env: dict[str, str],
    nth: str,
    outcome: str,
    sent: int,
    answer: str | None,
) -> None:
    """SIGKILL right after record N; a second worker finds it dead, says what the reconciler
    answered about the outstanding charge, and closes the run."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    env = {**killed_env, **({"KILL_AFTER": str(n)} if n else {})}
    code, out = finish(worker(pg_url, schema, tmp_path, **env))
    assert code == -signal.SIGKILL, out
    before = journal_records(pg_url, schema)
    assert kind(before[-1]) == nth
    assert len(expire_heartbeats(pg_url, schema)) == 1
    code, out = finish(worker(pg_url, schema, tmp_path, **taker_env))
    assert code == 0, out
    assert "r1: taken over from worker" in out and "at fence 2" in out
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, outcome, 2)]
    records = journal_records(pg_url, schema)
    assert records[: len(before)] == before  # the taker only appended
    told = [line for line in out.splitlines() if "asked the reconciler" in line]
    if answer is None:
        assert told == [], out
    else:
        [key] = {r.change.key for r in records if isinstance(r.change, IntentPlanned)}
        assert told == [f"r1 charge#1: asked the reconciler about 'card' ({key}): {answer}"], out
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid
    assert max(succeeded_per_step(records).values()) == 1
    keys = Counter(calls(downstream))
    assert keys == (Counter({"r1/charge/card": sent}) if sent else Counter())
    assert all(count == 1 for count in keys.values()) or ended_indeterminate(records, "charge")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (None, "unknown (the test switched the reconciler off)"),
        # its own text, line breaks and terminal escapes included: escaped, one answer one line
        ("the card service said:\nHTTP 503\x1b[2J", "unknown (the card service said:\\nHTTP 503\\x1b[2J)"),
    ],
)
def test_a_reconciler_that_could_not_tell_is_a_warning_of_the_taker(
    pg_url: str,
    schema: str,
    tmp_path: Path,
    downstream: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reason: str | None,
    said: str,
) -> None:
    """The charge's reconciler cannot tell whether the card was charged: the worker that took the
    run over logs that at WARNING (the attempt ends Indeterminate because of it), naming the key,
    on one line whatever the reconciler's reason holds (escaped, as `shown` escapes names)."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, KILL_AFTER="9"))
    assert code == -signal.SIGKILL, out
    assert len(expire_heartbeats(pg_url, schema)) == 1
    monkeypatch.setenv("RECONCILE", "off")
    if reason is not None:
        monkeypatch.setenv("RECONCILE_REASON", reason)
    with caplog.at_level(logging.INFO, logger="attempt_kernel"):
        assert run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 1
    [key] = {r.change.key for r in journal_records(pg_url, schema) if isinstance(r.change, IntentPlanned)}
    told = [(r.levelname, r.getMessage()) for r in caplog.records if "asked the reconciler" in r.getMessage()]
    assert told == [("WARNING", f"r1 charge#1: asked the reconciler about 'card' ({key}): {said}")]
    assert sql_in(pg_url, schema, "SELECT done, outcome FROM {s}.runs") == [(True, "needs-reconciliation")]


@pytest.mark.slow
def test_what_a_reconciler_answered_is_logged_when_the_takeover_fails_after_asking(
    pg_url: str,
    schema: str,
    tmp_path: Path,
    downstream: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The taker's lease is lost while the charge's reconciler answers (another claim moves the
    run's fence on): the takeover's records never commit, and what the reconciler said, a fact
    about the card service, was logged nowhere. It is logged, at WARNING, saying the takeover did
    not complete; the next takeover asks again and logs its own answer."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, KILL_AFTER="9"))  # Dispatched, never sent
    assert code == -signal.SIGKILL, out
    assert len(expire_heartbeats(pg_url, schema)) == 1
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'test', 0, true)")
    moved: list[str] = []

    async def ask_as_the_lease_moves(key: str) -> EffectFinding:
        if not moved:  # the first takeover only: the next one keeps its lease
            moved.append(key)
            sql_in(pg_url, schema, "UPDATE {s}.runs SET owner = 'gone', fence = fence + 1 WHERE run = 'r1'")
        return EffectNotHappened()

    pay = load_workflow(
        "pay",
        [
            Step(name="prepare", run=prepare),
            Step(name="charge", run=charge, after=("prepare",), reconcilers={"card": ask_as_the_lease_moves}),
            Step(name="finish", run=finish_step, after=("charge",)),
        ],
    )
    with caplog.at_level(logging.INFO, logger="attempt_kernel"):
        assert run_worker(pg_url, [pay], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 1
    [key] = {r.change.key for r in journal_records(pg_url, schema) if isinstance(r.change, IntentPlanned)}
    told = [(r.levelname, r.getMessage()) for r in caplog.records if "asked the reconciler" in r.getMessage()]
    assert told == [
        (
            "WARNING",
            f"r1 charge#1: asked the reconciler about 'card' ({key}): it did not happen (intent Rejected);"
            " the takeover did not complete, so the journal may not hold this answer",
        ),
        ("INFO", f"r1 charge#1: asked the reconciler about 'card' ({key}): it did not happen (intent Rejected)"),
    ]
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 4)]
    assert calls(downstream) == ["r1/charge/card"]


@pytest.mark.slow
def test_a_stopped_worker_logs_what_the_reconciler_it_asked_could_not_tell(
    db: str, tmp_path: Path, downstream: Path
) -> None:
    """SIGTERM to `attempt-kernel worker` while the charge is in flight: the stop ends the
    attempt as a takeover would, its reconciler asked first, and the reconciler cannot tell.
    That answer was recorded nowhere (the attempt ends Indeterminate with no word of why);
    the worker logs it as a taker does, the same line at WARNING."""
    submit_run(db, "pay", "r1")
    environment = {**os.environ, "PYTHONPATH": str(TESTS), "HANG_IN_EFFECT": "1", "RECONCILE": "off"}
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "worker", db, "--workflows", "workerflows.pay:PAY",
         "--heartbeat", "0.2", "--dead-after", "300"],
        cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60  # waits for the event; bounds nothing
    while calls(downstream) != ["r1/charge/card"]:  # the effect went out and hangs
        assert process.poll() is None, finish(process)[1]
        assert time.monotonic() < deadline, "the charge never went out"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, out = finish(process)
    [key] = {r.change.key for r in journal_records(db, "attempt_kernel") if isinstance(r.change, IntentPlanned)}
    told = [line.split(" ", 1)[1] for line in out.splitlines() if "asked the reconciler" in line]
    assert told == [
        f"WARNING r1 charge#1: asked the reconciler about 'card' ({key}): unknown (the test switched the reconciler off)"
    ], out
    assert ended_indeterminate(journal_records(db, "attempt_kernel"), "charge")


@pytest.mark.slow
def test_a_worker_killed_right_after_the_runs_end_leaves_a_closed_row(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """SIGKILL right after the statement that wrote the end and closed the row: nothing is left to take over."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    code, out = finish(worker(pg_url, schema, tmp_path, KILL_AFTER="17"))
    assert code == -signal.SIGKILL and "killed after record 17 (seq 17), row closed" in out, out
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 1)]
    records = journal_records(pg_url, schema)
    assert [r.seq for r in records] == list(range(1, 18)) and kind(records[-1]) == "run_finished"
    code, out = finish(worker(pg_url, schema, tmp_path))
    assert code == 0 and "closed 0" in out and "taken over" not in out, out
    assert journal_records(pg_url, schema) == records
    assert calls(downstream) == ["r1/charge/card"]


@pytest.mark.slow
def test_a_run_claimed_by_a_worker_that_died_before_its_first_record_starts_afresh(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """A worker holds a fresh run's start until the run's next record; dying in between leaves no record.

    The row names a dead worker at fence 1 and the journal holds nothing:
    the next worker takes it over at fence 2 and writes it from seq 1.
    """
    submit_run(pg_url, "pay", "r1", schema=schema)
    sql_in(pg_url, schema, "INSERT INTO {s}.workers (id, host, pid, dead) VALUES ('gone', 'h', 1, true)")
    sql_in(pg_url, schema, "UPDATE {s}.runs SET owner = 'gone', fence = 1")
    code, out = finish(worker(pg_url, schema, tmp_path))
    assert code == 0 and "r1: taken over from worker gone at fence 2" in out, out
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 2)]
    records = journal_records(pg_url, schema)
    assert [r.seq for r in records] == list(range(1, 18)) and kind(records[0]) == "run_started"
    assert calls(downstream) == ["r1/charge/card"]


@pytest.mark.slow
def test_two_workers_share_the_queue_and_each_run_is_driven_once(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """Six runs, two worker processes at once: every run succeeds, every key is sent once."""
    runs = [f"r{i}" for i in range(6)]
    for run in runs:
        submit_run(pg_url, "pay", run, schema=schema)
    first, second = worker(pg_url, schema, tmp_path), worker(pg_url, schema, tmp_path)
    assert finish(first)[0] == 0 and finish(second)[0] == 0
    assert sql_in(pg_url, schema, "SELECT count(*) FROM {s}.runs WHERE done AND outcome = 'succeeded'") == [(6,)]
    assert sorted(calls(downstream)) == [f"{run}/charge/card" for run in runs]
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid


# --------------------------------------------------------------------------
# SIGSTOP: a worker wakes up past its lease
# --------------------------------------------------------------------------


def wait_for(predicate: object, timeout: float = 60) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T): it beats no more."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1].startswith("T")


@pytest.mark.slow
def test_a_worker_frozen_past_its_lease_writes_nothing_after_the_takeover(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """SIGSTOP while charge waits at its gate, takeover, SIGCONT: its writes fail with LeaseLost and the journal is unchanged."""
    gate = tmp_path / "gate"  # charge's first attempt waits here, live, until the test opens it
    submit_run(pg_url, "pay", "r1", {"gate": str(gate)}, schema=schema)
    frozen = worker(pg_url, schema, tmp_path)

    def charging() -> bool:
        return any(kind(r) == "charge-running" for r in journal_records(pg_url, schema))

    wait_for(charging)
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: stopped(frozen.pid))
        assert len(expire_heartbeats(pg_url, schema)) == 1
        code, out = finish(worker(pg_url, schema, tmp_path))
        assert code == 0, out
        assert "taken over from worker" in out
        after_takeover = journal_records(pg_url, schema)
    finally:
        gate.touch()  # woken, it goes on to the effect, as a step that slept through the freeze would
        frozen.send_signal(signal.SIGUSR1)  # its own clock an hour on: it wakes up past its lease
        frozen.send_signal(signal.SIGCONT)
    code, out = finish(frozen)
    assert code == 3, out  # declared dead
    assert "r1: LeaseLost" in out
    assert journal_records(pg_url, schema) == after_takeover
    assert calls(downstream) == ["r1/charge/card"]
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 2)]
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid


@pytest.mark.slow
def test_a_dispatch_refused_for_a_late_heartbeat_stops_the_run_and_it_is_driven_again(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """HeartbeatLate at charge's Dispatched: nothing sent, the attempt ends Cancelled (not Failed:
    charge has no retry), the run is released, and the same worker claims it again and finishes it."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    adv = subprocess.Popen(
        [sys.executable, "-c", "from workerflows.adv import main; main()", pg_url, schema],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(TESTS), "ADV_HOOK": "refuse-dispatch-once"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    code, out = finish(adv)
    assert code == 0 and "hook refuse-dispatch-once at r1/charge#1" in out, out
    assert "r1: stopped and released" in out and "r1: succeeded" in out, out
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 2)]
    records = journal_records(pg_url, schema)
    charge = [
        (r.change.attempt, r.change.to_state)
        for r in records
        if isinstance(r.change, AttemptTransitioned) and r.change.step == "charge"
    ]
    assert charge == [(1, Running()), (1, Cancelled()), (2, Running()), (2, Succeeded())]
    assert calls(downstream) == ["r1/charge/card"]
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid


def test_a_worker_whose_own_clock_passes_its_lease_sends_nothing_and_stops(
    pg_url: str, schema: str, downstream: Path
) -> None:
    """The worker's clock (``clock=``) jumps an hour on as it claims r1: it dispatches nothing,
    raises WorkerDeclaredDead, retires; the next worker finishes r1 at fence 2, charging once.

    Its heartbeat (every 100 s) never beats during the test, so nothing but the
    injected clock judges its lease.
    """
    ahead = [0.0]

    def jump_at_the_claim(line: str) -> None:
        if line == "r1: claimed at fence 1":
            ahead[0] = 3600.0

    submit_run(pg_url, "pay", "r1", schema=schema)
    stale = Worker(
        pg_url, [PAY], schema=schema, heartbeat=100, dead_after=300, stop_when_idle=True,
        progress=jump_at_the_claim, clock=lambda: time.monotonic() + ahead[0],
    )  # fmt: skip
    with pytest.raises(WorkerDeclaredDead, match="its heartbeat expired; it stopped after closing 0 run"):
        stale.run()
    assert calls(downstream) == []
    assert not any(isinstance(r.change, IntentChanged) for r in journal_records(pg_url, schema))
    assert sql_in(pg_url, schema, "SELECT id, dead FROM {s}.workers") == [(stale.id, True)]
    assert sql_in(pg_url, schema, "SELECT done, fence FROM {s}.runs") == [(False, 1)]
    assert run_worker(pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True) == 1
    assert sql_in(pg_url, schema, "SELECT done, outcome, fence FROM {s}.runs") == [(True, "succeeded", 2)]
    assert calls(downstream) == ["r1/charge/card"]
    with PgJournal(pg_url, schema=schema) as journal:
        assert replay(journal).valid


# --------------------------------------------------------------------------
# Lease decisions on a fake clock
# --------------------------------------------------------------------------

HEARTBEAT = 1.0
DEAD_AFTER = 4.0
MARGIN = check_timing(HEARTBEAT, DEAD_AFTER)


def test_lease_decision_by_age() -> None:
    """Ages 0, 2.9, 3, 4 and 4.1 s with dead_after 4 and margin 1: live, live, expiring, expiring, expired."""
    verdicts = [lease_decision(100 + age, 100, DEAD_AFTER, MARGIN) for age in (0, 2.9, 3, 4, 4.1)]
    assert verdicts == [
        LeaseVerdict.LIVE,
        LeaseVerdict.LIVE,
        LeaseVerdict.EXPIRING,
        LeaseVerdict.EXPIRING,
        LeaseVerdict.EXPIRED,
    ]


WORKERS = ["a", "b", "c"]
RUNS = ["r1", "r2"]


class Leases(RuleBasedStateMachine):
    """Claim, heartbeat, time passing, takeover and dispatch on one database clock.

    Each worker measures its own lease from when it *sent* its last good
    beat (the database stamps it later, by ``delay``); a taker judges by the
    database's stamp. A worker keeps believing it holds a run until an
    append tells it otherwise, so the invariant is on beliefs: never two
    workers that may dispatch on one run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.stamped = {w: 0.0 for w in WORKERS}  # heartbeat_at, database clock
        self.sent = {w: 0.0 for w in WORKERS}  # the worker's own last good beat
        self.dead: set[str] = set()
        self.rows: dict[str, Lease | None] = {r: None for r in RUNS}
        self.fences = {r: 0 for r in RUNS}
        self.held: dict[tuple[str, str], Lease] = {}  # what each worker believes it holds
        self.dispatched: list[tuple[str, str, int]] = []

    def own_verdict(self, w: str) -> LeaseVerdict:
        return lease_decision(self.now, self.sent[w], DEAD_AFTER, MARGIN)

    def database_verdict(self, w: str) -> LeaseVerdict:
        return lease_decision(self.now, self.stamped[w], DEAD_AFTER, MARGIN)

    @rule(seconds=sampled_from([0.1, 0.5, 1.0, 2.5, 3.2, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(w=sampled_from(WORKERS), delay=sampled_from([0.0, 0.05, 0.3, 0.9]))
    def heartbeat(self, w: str, delay: float) -> None:
        sent = self.now
        self.now += delay
        if w not in self.dead:  # UPDATE ... WHERE NOT dead
            self.stamped[w] = self.now
            self.sent[w] = sent

    @rule(w=sampled_from(WORKERS), run=sampled_from(RUNS))
    def claim(self, w: str, run: str) -> None:
        row = self.rows[run]
        if w in self.dead or not may_dispatch(self.own_verdict(w)):
            return  # a worker that is not live claims nothing
        free = row is None
        taken_over = row is not None and row.owner != w and may_take_over(self.database_verdict(row.owner))
        if free or taken_over:
            if row is not None:
                self.dead.add(row.owner)
            self.fences[run] += 1
            lease = Lease(owner=w, fence=self.fences[run])
            self.rows[run] = lease
            self.held[(w, run)] = lease

    @rule(w=sampled_from(WORKERS), run=sampled_from(RUNS))
    def dispatch(self, w: str, run: str) -> None:
        lease = self.held.get((w, run))
        if lease is None or not may_dispatch(self.own_verdict(w)):
            return
        if self.rows[run] != lease:  # the fenced append: LeaseLost, nothing written
            del self.held[(w, run)]
            return
        self.dispatched.append((w, run, lease.fence))

    @invariant()
    def at_most_one_worker_may_dispatch_per_run(self) -> None:
        for run in RUNS:
            able = [w for w in WORKERS if (w, run) in self.held and may_dispatch(self.own_verdict(w))]
            assert len(able) <= 1, (run, able, self.now)

    @invariant()
    def a_dead_worker_is_never_live_by_its_own_clock(self) -> None:
        assert all(self.own_verdict(w) is not LeaseVerdict.LIVE for w in self.dead)

    @invariant()
    def dispatches_of_a_run_never_go_back_in_fence(self) -> None:
        for run in RUNS:
            fences = [f for _, r, f in self.dispatched if r == run]
            assert fences == sorted(fences)


TestLeases = Leases.TestCase
TestLeases.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def _callers_handler(number: int, frame: FrameType | None) -> None:
    raise AssertionError(f"the caller's handler ran for signal {number}")


def test_a_worker_that_stops_on_signals_gives_the_callers_handlers_back(pg_url: str, schema: str) -> None:
    """SIGINT and SIGTERM are the caller's again once run_worker(stop_on_signals=True) returns,
    not the defaults (which would kill the caller at its next SIGTERM)."""
    before = {n: signal.signal(n, _callers_handler) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        closed = run_worker(
            pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True, stop_on_signals=True
        )
        after = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert closed == 0
    assert after == {signal.SIGINT: _callers_handler, signal.SIGTERM: _callers_handler}


def test_an_effect_waiting_for_a_late_heartbeat_lets_the_workers_other_runs_go_on(
    pg_url: str, schema: str, tmp_path: Path, downstream: Path
) -> None:
    """The wait for a beat before an effect blocked the worker's event loop: while one
    run's effect waited, every other run stood still (an adversarial pass measured a
    1 s stall of 16 runs), and effects already durable went out only as the lease was
    about to expire. It is awaited now: r1's effect waits for a beat, and r2 meanwhile
    gets past its own gate to its own effect, which waits too. Once the heartbeat is
    live again (the worker's clock set back), both are sent, once each.

    The worker's heartbeat (every 100 s) never beats during the test: the injected
    clock alone says how old it is."""
    gates = {run: tmp_path / f"gate-{run}" for run in ("r1", "r2")}
    for run, gate in gates.items():
        submit_run(pg_url, "pay", run, {"gate": str(gate)}, schema=schema)
    ahead = [0.0]
    lines: list[str] = []
    serving = Worker(
        pg_url, [PAY], schema=schema, heartbeat=100, dead_after=300, stop_when_idle=True, concurrency=2,
        progress=lines.append, clock=lambda: time.monotonic() + ahead[0],
    )  # fmt: skip
    closed: list[int] = []
    thread = threading.Thread(target=lambda: closed.append(serving.run()))
    thread.start()
    try:
        wait_for(lambda: sorted(r.run for r in journal_records(pg_url, schema) if kind(r) == "charge-running") == ["r1", "r2"])
        ahead[0] = 250.0  # 250 s old: within the last period before dead_after, so no new effect
        gates["r1"].touch()
        wait_for(lambda: "r1: this worker's heartbeat is late; its effect waits for a beat" in lines)
        gates["r2"].touch()  # only a loop that goes on while r1 waits gets r2 past its gate
        wait_for(lambda: "r2: this worker's heartbeat is late; its effect waits for a beat" in lines)
        assert not any(kind(r) == "dispatched" for r in journal_records(pg_url, schema))
        assert calls(downstream) == []
        ahead[0] = 0.0  # the heartbeat is live again
    finally:
        for gate in gates.values():
            gate.touch()
        thread.join(timeout=120)
    assert closed == [2], lines
    assert sorted(calls(downstream)) == ["r1/charge/card", "r2/charge/card"]
    assert sql_in(pg_url, schema, "SELECT run, outcome FROM {s}.runs ORDER BY run") == [
        ("r1", "succeeded"), ("r2", "succeeded")
    ]
