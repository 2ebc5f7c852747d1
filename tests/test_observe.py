"""The executor's observers: told of every record it writes, in order, never asked anything.

Expected records and lines are written out by hand for a one-step workflow
(a step that succeeds) and one whose effect is cancelled in flight.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from attempt_kernel import (
    JSON,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancelled,
    Change,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    DomainStateSet,
    Executor,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Pending,
    Planned,
    Record,
    RunCancelRequested,
    RunControl,
    RunFinished,
    RunLogWriter,
    RunObserver,
    RunResumed,
    RunStarted,
    RunStopRequested,
    Running,
    SignalSent,
    Step,
    StepCalled,
    StepContext,
    StepResult,
    WaitEnded,
    WaitStarted,
    Job,
    load_workflow,
    read_log,
    resume_log,
    run_jobs,
)
from attempt_kernel._observe import UNLOGGED, progress_line, run_log_message


class Seen:
    """An observer that keeps what it is told."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Change, int]] = []

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        self.records.append((run, change, time_us))


class Broken:
    """An observer that raises on every record."""

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        raise RuntimeError("dashboard down")


async def greet(ctx: StepContext) -> JSON:
    return "hi"


async def pay(ctx: StepContext) -> JSON:
    async def charge(key: str) -> JSON:
        await asyncio.sleep(3600)
        return None

    return await ctx.effect("charge", charge)


def _run(path: Path, steps: list[Step], observers: list[RunObserver], *, cancel_after: int | None = None,
         progress: list[str] | None = None) -> None:  # fmt: skip
    workflow = load_workflow("w", steps)

    async def main() -> None:
        control = RunControl()
        seen = Seen()

        async def supervise() -> None:
            while cancel_after is not None and len(seen.records) < cancel_after:
                await asyncio.sleep(0)
            control.cancel()

        with RunLogWriter(path) as log:
            executor = Executor(
                log,
                observers=[*observers, seen],
                progress=None if progress is None else progress.append,
                clock=lambda: 1_700_000_000.5,
            )
            watcher = asyncio.ensure_future(supervise()) if cancel_after is not None else None
            await executor.run(workflow, "r-1", control=control)
            if watcher is not None:
                await watcher

    asyncio.run(main())


def test_an_observer_is_told_every_record_in_the_order_the_log_holds_them(tmp_path: Path) -> None:
    seen = Seen()
    _run(tmp_path / "log", [Step(name="greet", run=greet)], [seen])
    told = [type(change).__name__ for _, change, _ in seen.records]
    assert told == [
        "RunStarted", "AttemptCreated", "AttemptTransitioned", "StepResult",
        "AttemptTransitioned", "RunFinished",
    ]  # fmt: skip
    in_log = [item.change for item in read_log(tmp_path / "log") if isinstance(item, Record)]
    assert [change for _, change, _ in seen.records] == in_log
    assert {run for run, _, _ in seen.records} == {"r-1"}
    assert {time for _, _, time in seen.records} == {1_700_000_000_500_000}


def test_progress_lines_are_an_observer_of_the_attempts_moves(tmp_path: Path) -> None:
    lines: list[str] = []
    _run(tmp_path / "log", [Step(name="greet", run=greet)], [], progress=lines)
    assert lines == ["r-1 greet#1: Pending -> Running", "r-1 greet#1: Running -> Succeeded"]


def test_an_observer_that_raises_is_logged_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Seen()
    with caplog.at_level(logging.ERROR, logger="attempt_kernel"):
        _run(tmp_path / "log", [Step(name="greet", run=greet)], [Broken(), seen])
    assert len(seen.records) == 6
    failures = [r for r in caplog.records if r.name == "attempt_kernel" and r.levelno == logging.ERROR]
    assert len(failures) == 6
    assert failures[0].getMessage().startswith("observer <") and "failed on a record of run 'r-1'" in failures[0].getMessage()


def test_the_run_is_logged_with_a_warning_for_an_indeterminate_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # created, admitted, intent planned, dispatched: the cancel comes with the effect in flight
    with caplog.at_level(logging.INFO, logger="attempt_kernel.run"):
        _run(tmp_path / "log", [Step(name="pay", run=pay)], [], cancel_after=5)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "attempt_kernel.run"]
    assert said == [
        ("INFO", "r-1: started (workflow 'w')"),
        ("INFO", "r-1 pay#1: Pending -> Running"),
        ("INFO", "r-1: cancel requested (RunControl.cancel())"),
        ("WARNING", "r-1 pay#1: Running -> Indeterminate"),
        ("INFO", "r-1: finished"),
    ]


def test_the_run_loggers_lines_escape_names_for_any_handler(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Names from a log are data: a run id with a line break and a terminal escape is escaped
    in the line itself (as `shown` escapes it), so an application's own handler writes one
    line per record, not two, and no escape reaches a terminal; the command line's formatter
    escaped it, no other handler did."""
    workflow = load_workflow("w", [Step(name="greet", run=greet)])

    async def main() -> None:
        with RunLogWriter(tmp_path / "log") as log:
            await Executor(log).run(workflow, "r\n\x1b[2J")

    with caplog.at_level(logging.INFO, logger="attempt_kernel.run"):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.name == "attempt_kernel.run"] == [
        "r\\n\\x1b[2J: started (workflow 'w')",
        "r\\n\\x1b[2J greet#1: Pending -> Running",
        "r\\n\\x1b[2J greet#1: Running -> Succeeded",
        "r\\n\\x1b[2J: finished",
    ]


def test_nothing_is_logged_when_the_application_configures_no_logging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="attempt_kernel.run"):
        _run(tmp_path / "log", [Step(name="greet", run=greet)], [])
    assert [r for r in caplog.records if r.name == "attempt_kernel.run"] == []


def test_bookkeeping_records_have_no_progress_line(tmp_path: Path) -> None:
    seen = Seen()
    _run(tmp_path / "log", [Step(name="greet", run=greet)], [seen])
    lines = [progress_line(run, change) for run, change, _ in seen.records]
    assert lines == [
        None, None, "r-1 greet#1: Pending -> Running", None, "r-1 greet#1: Running -> Succeeded", None,
    ]  # fmt: skip


def test_the_command_lines_log_lines_carry_utc_time_and_level_and_escape_names() -> None:
    from attempt_kernel.cli._main import LogLines

    record = logging.LogRecord(
        "attempt_kernel.worker", logging.WARNING, __file__, 1, "%s", ("r\x1b[31m-1: taken over",), None
    )
    record.created = 1_764_600_000.123
    assert LogLines().format(record) == "2025-12-01T14:40:00.123Z WARNING r\\x1b[31m-1: taken over"


def test_the_records_the_run_logger_skips_unasked_are_those_it_has_no_line_for() -> None:
    # One record of every kind, written out by hand; the run logger is not
    # asked about the kinds in UNLOGGED (the executor and record_written skip
    # them), so those must be exactly the kinds run_log_message says nothing for.

    every: list[Change] = [
        RunStarted(workflow="w"),
        RunCancelRequested(reason="r"),
        RunStopRequested(reason="r"),
        RunResumed(),
        StepCalled(step="s@1", position=1, name="s", digest="sha256:00"),
        WaitStarted(position=2),
        WaitEnded(position=2),
        SignalSent(name="go", payload=None, id="i"),
        AttemptCreated(step="s@1", attempt=1),
        AttemptTransitioned(step="s@1", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="s@1", attempt=1, name="pay", key="k"),
        IntentChanged(step="s@1", attempt=1, name="pay", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        IntentReconciled(
            step="s@1", attempt=1, name="pay", key="k", from_state=Dispatched(), cause=Confirm(),
            to_state=Confirmed(), by="op",
        ),  # fmt: skip
        DomainStateSet(step="s@1", attempt=1, state="drafted"),
        StepResult(step="s@1", attempt=1),
        RunFinished(),
    ]
    assert len({type(change) for change in every}) == 16  # every kind of Change, once each
    silent = {type(change) for change in every if run_log_message("r-1", change) is None}
    assert silent == set(UNLOGGED)
    assert silent == {
        StepCalled, AttemptCreated, IntentPlanned, IntentChanged, IntentReconciled, DomainStateSet, StepResult,
    }  # fmt: skip


def test_run_jobs_tells_its_observers_of_every_record_of_every_run(tmp_path: Path) -> None:
    """The observers given to `run_jobs` are its executor's: told of each run's records."""
    seen = Seen()
    workflow = load_workflow("w", [Step(name="greet", run=greet)])
    with RunLogWriter(tmp_path / "log") as log:
        run_jobs(log, [Job(workflow=workflow, run="r-1"), Job(workflow=workflow, run="r-2")], observers=[seen])
    told = sorted((run, type(change).__name__) for run, change, _ in seen.records)
    assert told == sorted(
        (run, name)
        for run in ("r-1", "r-2")
        for name in ("RunStarted", "AttemptCreated", "AttemptTransitioned", "StepResult", "AttemptTransitioned", "RunFinished")
    )


def test_resume_log_tells_its_observers_of_the_orphan_recovery_ends_before_the_run_goes_on(
    tmp_path: Path,
) -> None:
    """A DAG run cut while its attempt ran: recovery ends the orphan (Cancelled: no intent was
    dispatched) before the run is resumed, and the observers are told of that end first, as a
    worker's observers are told of what recovery wrote when it took a run over."""
    workflow = load_workflow("w", [Step(name="greet", run=greet)])
    whole = tmp_path / "whole"
    _run(whole, [Step(name="greet", run=greet)], [])
    log = tmp_path / "log"
    log.write_bytes(b"".join(whole.read_bytes().splitlines(keepends=True)[:3]))  # greet#1 Running
    seen = Seen()
    resumed = resume_log(log, [workflow], observers=[seen])
    assert [r.status for r in resumed.reports] == ["succeeded"]
    told = [(run, type(change).__name__) for run, change, _ in seen.records]
    assert told == [
        ("r-1", "AttemptTransitioned"), ("r-1", "RunResumed"), ("r-1", "AttemptCreated"),
        ("r-1", "AttemptTransitioned"), ("r-1", "StepResult"), ("r-1", "AttemptTransitioned"),
        ("r-1", "RunFinished"),
    ]  # fmt: skip
    ended = seen.records[0][1]
    assert isinstance(ended, AttemptTransitioned)
    assert (ended.step, ended.attempt, ended.from_state, ended.to_state) == ("greet", 1, Running(), Cancelled())
    in_log = [item.change for item in read_log(log) if isinstance(item, Record)]
    assert [change for _, change, _ in seen.records] == in_log[3:]


def test_resume_log_tells_its_observers_of_the_records_the_resumed_runs_write(tmp_path: Path) -> None:
    """A run cut after its RunStarted, resumed with observers: they are told of what the
    resumed run writes, from its RunResumed to its RunFinished."""
    workflow = load_workflow("w", [Step(name="greet", run=greet)])
    whole = tmp_path / "whole"
    _run(whole, [Step(name="greet", run=greet)], [])
    log = tmp_path / "log"
    log.write_bytes(whole.read_bytes().splitlines(keepends=True)[0])  # RunStarted only
    seen = Seen()
    resumed = resume_log(log, [workflow], observers=[seen])
    assert [r.status for r in resumed.reports] == ["succeeded"]
    assert [(run, type(change).__name__) for run, change, _ in seen.records] == [
        ("r-1", "RunResumed"), ("r-1", "AttemptCreated"), ("r-1", "AttemptTransitioned"),
        ("r-1", "StepResult"), ("r-1", "AttemptTransitioned"), ("r-1", "RunFinished"),
    ]  # fmt: skip
