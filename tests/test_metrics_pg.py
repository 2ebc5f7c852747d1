"""Prometheus metrics on a PostgreSQL journal: a worker's counters, the queue, late commits.

Against the session's real server (`pg_url`), each test in a schema of its
own; the worker runs in this process, with its metrics beside it.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from psycopg import sql
from workerflows.pay import PAY

from attempt_kernel._codec import encode_record
from attempt_kernel._metrics import JournalCollector, WorkerExposition
from attempt_kernel.postgres._journal import PgJournal, RunHolds
from attempt_kernel._records import RunStarted
from attempt_kernel.postgres._worker import Worker, submit_run

pytestmark = pytest.mark.postgres


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    assert found is not None, f"no sample {name}{labels}"
    return found


def test_a_worker_counts_its_claims_and_the_runs_it_closed(
    pg_url: str, schema: str, downstream: Path
) -> None:
    """Two queued runs, one worker: two claims, no takeover, no lost lease, six attempts succeeded."""
    submit_run(pg_url, "pay", "r1", schema=schema)
    submit_run(pg_url, "pay", "r2", schema=schema)
    exposition = WorkerExposition(pg_url, schema=schema)
    worker = Worker(
        pg_url, [PAY], schema=schema, heartbeat=0.2, dead_after=300, stop_when_idle=True,
        observers=[exposition.observer], watcher=exposition.watcher,
    )  # fmt: skip
    assert worker.run() == 2
    registry, journal, me = exposition.registry, pg_url, worker.id
    assert value(registry, "attempt_kernel_claims_total", journal=journal, worker=me) == 2
    assert value(registry, "attempt_kernel_takeovers_total", journal=journal, worker=me) == 0
    assert value(registry, "attempt_kernel_lease_losses_total", journal=journal, worker=me) == 0
    assert value(registry, "attempt_kernel_runs", journal=journal, status="succeeded") == 2
    # prepare, charge and finish of each run
    assert value(registry, "attempt_kernel_attempts_total", journal=journal, state="Succeeded") == 6
    assert value(registry, "attempt_kernel_step_duration_seconds_count", journal=journal) == 6
    assert value(registry, "attempt_kernel_runs", journal=journal, status="running") == 0
    assert value(registry, "attempt_kernel_queue_depth", journal=journal) == 0
    assert value(registry, "attempt_kernel_slots_held", journal=journal, worker=me) == 0
    assert value(registry, "attempt_kernel_indeterminate_attempts", journal=journal) == 0
    exposition.gauges.close()


def test_queued_runs_are_the_queue_depth(pg_url: str, schema: str) -> None:
    """Three runs submitted, no worker: a queue of three, and no run in the ledger yet."""
    for run in ("q1", "q2", "q3"):
        submit_run(pg_url, "pay", run, schema=schema)
    collector = JournalCollector(pg_url, schema=schema)
    registry = CollectorRegistry()
    registry.register(collector)
    assert value(registry, "attempt_kernel_queue_depth", journal=pg_url) == 3
    assert value(registry, "attempt_kernel_runs", journal=pg_url, status="interrupted") == 0
    collector.close()


def test_a_run_a_process_holds_is_not_in_the_queue_depth(pg_url: str, schema: str) -> None:
    """Two runs submitted and due, one held by a process (`RunHolds`, as `recover URL` holds
    a run it drives): no claim takes the held one while it is held, so the queue is one;
    let go, it is two."""
    for run in ("q1", "q2"):
        submit_run(pg_url, "pay", run, schema=schema)
    collector = JournalCollector(pg_url, schema=schema)
    registry = CollectorRegistry()
    registry.register(collector)
    with RunHolds(pg_url, schema=schema) as holds:
        assert holds.take("q1")
        assert value(registry, "attempt_kernel_queue_depth", journal=pg_url) == 1
    assert value(registry, "attempt_kernel_queue_depth", journal=pg_url) == 2
    collector.close()


def test_a_record_committed_after_a_later_one_was_read_is_still_read(pg_url: str, schema: str) -> None:
    """A row whose ``pos`` was taken first but which commits last is not skipped by the next scrape."""
    with PgJournal(pg_url, schema=schema):
        pass  # the tables
    collector = JournalCollector(pg_url, schema=schema)
    registry = CollectorRegistry()
    registry.register(collector)
    insert = sql.SQL("INSERT INTO {s}.records (run, seq, line) VALUES (%s, 1, %s)").format(
        s=sql.Identifier(schema)
    )
    with psycopg.connect(pg_url) as late:  # a transaction left open: its pos is taken, not visible
        late.execute(insert, ("late", encode_record(1, 1, "late", RunStarted(workflow="w"))))
        with PgJournal(pg_url, schema=schema) as journal:
            journal.append("early", RunStarted(workflow="w"))
        assert value(registry, "attempt_kernel_runs", journal=pg_url, status="interrupted") == 1
        late.commit()
    assert value(registry, "attempt_kernel_runs", journal=pg_url, status="interrupted") == 2
    # and nothing is applied twice
    assert value(registry, "attempt_kernel_runs", journal=pg_url, status="interrupted") == 2
    collector.close()
