"""Prometheus metrics: counters from the executor's records, gauges read from a log file.

A scripted run on a real log file (two runs: one fails, one ends
Indeterminate), its executor observed by the metrics, then the metric
values, written out by hand, and the text
exposition checked for names and labels. The gauges are read
incrementally: a torn last line waits for its end, a reconciliation
written later moves them.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from attempt_kernel import Executor, RunControl, RunLogWriter, StepContext
from attempt_kernel.cli._main import main
from attempt_kernel._metrics import JournalCollector, RunMetrics, journal_label, journal_registry
from attempt_kernel.metrics import WorkerExposition, metrics_app  # as docs/metrics.md says
from attempt_kernel._observe import RunObserver
from attempt_kernel._records import JSON, RunStarted
from attempt_kernel._workflow import RetryPolicy, Step, load_workflow


async def returns(ctx: StepContext) -> JSON:
    return ctx.step


async def broken(ctx: StepContext) -> JSON:
    raise ValueError(f"attempt {ctx.attempt} failed")


def script(path: Path, observers: Sequence[RunObserver] = ()) -> str:
    """Run 'ok' (a succeeds, b fails twice) and 'stuck' (its effect is cancelled in flight).

    Returns the idempotency key left outstanding by 'stuck'; ``observers``
    are the executor's.
    """
    flow = load_workflow(
        "w",
        [
            Step(name="a", run=returns),
            Step(name="b", run=broken, after=("a",), retry=RetryPolicy(initial_interval=0, max_attempts=2)),
        ],
    )
    stuck = RunControl()

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            stuck.cancel()  # the run is cancelled while the effect is in flight
            await asyncio.sleep(3600)
            return None

        return await ctx.effect("charge", charge)

    paying = load_workflow("p", [Step(name="pay", run=pay)])

    async def go() -> str:
        with RunLogWriter(path) as log:
            executor = Executor(log, observers=observers)
            await executor.run(flow, "ok")
            report = await executor.run(paying, "stuck", control=stuck)
        [key] = report.steps[0].outstanding
        return key

    return asyncio.run(go())


def observed(path: Path) -> CollectorRegistry:
    """The script run with a `RunMetrics` observing its executor; the registry it counts in."""
    registry = CollectorRegistry()
    script(path, [RunMetrics(registry, str(path))])
    return registry


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    assert found is not None, f"no sample {name}{labels}"
    return found


def test_final_states_are_counted_by_state(tmp_path: Path) -> None:
    """One Succeeded, two Failed, one Indeterminate; no Cancelled or TimedOut, at 0."""
    log = tmp_path / "log"
    registry = observed(log)
    counts = {
        state: value(registry, "attempt_kernel_attempts_total", journal=str(log), state=state)
        for state in ("Succeeded", "Failed", "Indeterminate", "Cancelled", "TimedOut")
    }
    assert counts == {"Succeeded": 1, "Failed": 2, "Indeterminate": 1, "Cancelled": 0, "TimedOut": 0}


def test_every_attempt_that_ran_is_timed(tmp_path: Path) -> None:
    """The four attempts all ran (Admit), so the histogram has four observations."""
    log = tmp_path / "log"
    registry = observed(log)
    assert value(registry, "attempt_kernel_step_duration_seconds_count", journal=str(log)) == 4
    # an hour is the top bucket: every one of them is in it
    assert value(registry, "attempt_kernel_step_duration_seconds_bucket", journal=str(log), le="3600.0") == 4


def test_gauges_after_the_script(tmp_path: Path) -> None:
    """One attempt needs a person, one intent is outstanding; runs: one failed, one to reconcile."""
    log = tmp_path / "log"
    script(log)
    registry, _ = journal_registry(str(log))
    label = str(log)
    assert value(registry, "attempt_kernel_indeterminate_attempts", journal=label) == 1
    assert value(registry, "attempt_kernel_outstanding_intents", journal=label) == 1
    runs = {
        status: value(registry, "attempt_kernel_runs", journal=label, status=status)
        for status in (
            "running", "waiting", "interrupted", "needs-reconciliation", "succeeded", "failed", "cancelled",
        )
    }  # fmt: skip
    assert runs == {
        "running": 0, "waiting": 0, "interrupted": 0, "needs-reconciliation": 1, "succeeded": 0,
        "failed": 1, "cancelled": 0,
    }  # fmt: skip


def test_a_reconciliation_written_later_clears_the_indeterminate_gauge(tmp_path: Path) -> None:
    """The collector reads on from where it stopped; the reconciled run stays cancelled (a cancel is never undone)."""
    log = tmp_path / "log"
    key = script(log)
    registry, _ = journal_registry(str(log))
    label = str(log)
    assert value(registry, "attempt_kernel_indeterminate_attempts", journal=label) == 1
    assert main(["reconcile", str(log), "--key", key, "--rejected"]) == 0
    assert value(registry, "attempt_kernel_indeterminate_attempts", journal=label) == 0
    assert value(registry, "attempt_kernel_outstanding_intents", journal=label) == 0
    assert value(registry, "attempt_kernel_runs", journal=label, status="needs-reconciliation") == 0
    assert value(registry, "attempt_kernel_runs", journal=label, status="cancelled") == 1


def test_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    """Half a record is not read; once its line is complete, it is."""
    log = tmp_path / "log"
    script(log)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1][:20])  # the run_finished of 'stuck' cut short
    registry, _ = journal_registry(str(log))
    label = str(log)
    assert value(registry, "attempt_kernel_runs", journal=label, status="interrupted") == 1
    with log.open("ab") as rest:
        rest.write(lines[-1][20:])
    assert value(registry, "attempt_kernel_runs", journal=label, status="interrupted") == 0
    assert value(registry, "attempt_kernel_runs", journal=label, status="needs-reconciliation") == 1


def test_a_log_replaced_by_a_shorter_one_is_read_again(tmp_path: Path) -> None:
    """A file cut below what was read is read from its start, not past its end."""
    log = tmp_path / "log"
    script(log)
    registry, _ = journal_registry(str(log))
    label = str(log)
    assert value(registry, "attempt_kernel_runs", journal=label, status="failed") == 1
    log.write_bytes(b"")
    assert value(registry, "attempt_kernel_runs", journal=label, status="failed") == 0
    assert value(registry, "attempt_kernel_indeterminate_attempts", journal=label) == 0


def test_unfinished_runs_of_a_log_a_writer_holds_are_running(tmp_path: Path) -> None:
    """While a writer holds the log, its unfinished runs are running, as `attempt-kernel runs` says."""
    log = tmp_path / "log"
    script(log)
    with RunLogWriter(log) as writer:
        writer.append("open", RunStarted(workflow="w"))
    registry, _ = journal_registry(str(log))
    label = str(log)
    assert value(registry, "attempt_kernel_runs", journal=label, status="interrupted") == 1
    with RunLogWriter(log):
        assert value(registry, "attempt_kernel_runs", journal=label, status="running") == 1
        assert value(registry, "attempt_kernel_runs", journal=label, status="interrupted") == 0
    assert value(registry, "attempt_kernel_runs", journal=label, status="running") == 0


def test_a_missing_log_has_every_gauge_at_zero(tmp_path: Path) -> None:
    """Nothing written yet: zeros, a series for every status."""
    registry, _ = journal_registry(str(tmp_path / "none"))
    text = generate_latest(registry).decode()
    assert len(re.findall(r"^attempt_kernel_runs\{", text, re.M)) == 7
    assert re.search(r"^attempt_kernel_indeterminate_attempts\{.*\} 0\.0$", text, re.M)


def test_the_exposition_names_every_metric_with_its_labels(tmp_path: Path) -> None:
    """The text a scraper reads: base names, _total counters, seconds, journal labels."""
    log = tmp_path / "log"
    exposition = WorkerExposition(str(log))
    script(log, [exposition.observer])
    body, content_type = exposition.page()
    text = body.decode()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    j = re.escape(f'journal="{log}"')
    for line in (
        rf'attempt_kernel_attempts_total\{{{j},state="Indeterminate"\}} 1\.0',
        rf'attempt_kernel_attempts_total\{{{j},state="Failed"\}} 2\.0',
        rf"attempt_kernel_step_duration_seconds_count\{{{j}\}} 4\.0",
        rf"attempt_kernel_indeterminate_attempts\{{{j}\}} 1\.0",
        rf"attempt_kernel_outstanding_intents\{{{j}\}} 1\.0",
        rf'attempt_kernel_runs\{{{j},status="needs-reconciliation"\}} 1\.0',
        rf'attempt_kernel_runs\{{{j},status="waiting"\}} 0\.0',
    ):
        assert re.search(f"^{line}$", text, re.M), line
    assert "# TYPE attempt_kernel_attempts_total counter" in text
    assert "# TYPE attempt_kernel_step_duration_seconds histogram" in text
    # a file has no queue and no pools: those are PostgreSQL's
    assert "attempt_kernel_queue_depth" not in text


def test_metrics_app_serves_the_journal_gauges_only(tmp_path: Path) -> None:
    """The web view's page: gauges, no counters, and the exposition's content type."""
    log = tmp_path / "log"
    script(log)
    page = metrics_app(str(log))
    body, content_type = page()
    text = body.decode()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert f'attempt_kernel_indeterminate_attempts{{journal="{log}"}} 1.0' in text
    assert "attempt_kernel_attempts_total" not in text
    assert page()[0] == body  # nothing new: the same page


@pytest.mark.parametrize(
    ("journal", "label"),
    [
        ("postgresql://ak:s3cret@db.example:5432/jobs", "postgresql://ak@db.example:5432/jobs"),
        ("postgres://ak@db/jobs", "postgres://ak@db/jobs"),
        ("/var/log/runs.log", "/var/log/runs.log"),
        # libpq takes any connection parameter in the query, the password among them
        ("postgresql://ak@db/jobs?password=s3cret", "postgresql://ak@db/jobs"),
        (
            "postgresql:///jobs?host=/run/pg&password=s3cret&sslmode=disable&sslpassword=k3y",
            "postgresql:///jobs?host=/run/pg&sslmode=disable",
        ),
        ("postgresql://ak:s3cret@db/jobs?password=s3cret", "postgresql://ak@db/jobs"),
        ("postgresql://db/jobs?password=p@ss", "postgresql://db/jobs"),
    ],
)
def test_the_journal_label_never_carries_a_password(journal: str, label: str) -> None:
    """A URL's password is removed, in its user part or as a query parameter; a path is kept as given."""
    assert journal_label(journal) == label


def test_registering_the_collector_reads_nothing(tmp_path: Path) -> None:
    """Describing the gauges (what registering does) leaves the log unread until a scrape."""
    log = tmp_path / "log"
    script(log)
    collector = JournalCollector(str(log))
    names = [family.name for family in collector.describe()]
    assert names == [
        "attempt_kernel_indeterminate_attempts", "attempt_kernel_outstanding_intents", "attempt_kernel_runs",
    ]  # fmt: skip
    assert all(not family.samples for family in collector.describe())
