"""Spans: a run's records become one OpenTelemetry span tree, timed and parented by the records.

Each test runs a workflow through a real executor with a `Spans` on a
private tracer provider (never the global one) and an in-memory exporter.
The executor's clock says ``1000 + n`` seconds while ``n`` records have been
written, so record ``n`` is stamped ``T(n)``, except that records written in
one go (an attempt's creation and admission, with a code step's call before
them; an effect's Planned and Dispatched; a step's result and its end) all
get the first one's time; every
span, parent, time, attribute and status below is written out by hand from
the record order.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from opentelemetry.util.types import AttributeValue

from attempt_kernel import (
    JSON,
    AttemptCreated,
    LogItem,
    LogWriteFailed,
    AttemptTransitioned,
    Change,
    Executor,
    Failed,
    IntentChanged,
    IntentPlanned,
    Running,
    RetryPolicy,
    RunContext,
    RunControl,
    RunFinished,
    RunLogWriter,
    RunRefused,
    RunResumed,
    RunStopRequested,
    SignalSent,
    Spans,
    Step,
    StepContext,
    Workflow,
    load_workflow,
    workflow,
)
from attempt_kernel._observe import tell
from attempt_kernel import (
    Admit, Cancel, Dispatch, Dispatched, Fail, Indeterminate, Pending, Planned, RunStarted, Succeed, Succeeded,
)

Summary = tuple[str, "str | None", int, int, dict[str, AttributeValue], StatusCode]


def T(n: int) -> int:
    """The time of record ``n`` (0-based), in nanoseconds."""
    return (1000 + n) * 1_000_000_000


class Seen:
    """Keeps the records, so that the clock can count them and tests can read keys."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        self.changes.append(change)


def summary(spans: tuple[ReadableSpan, ...]) -> list[Summary]:
    """Each span as (name, its parent's name, start, end, attributes, status code), in end order."""
    names = {span.context.span_id: span.name for span in spans if span.context is not None}
    return [
        (
            span.name,
            None if span.parent is None else names[span.parent.span_id],
            span.start_time or 0,
            span.end_time or 0,
            dict(span.attributes or {}),
            span.status.status_code,
        )
        for span in spans
    ]


def traced(
    path: Path, flow: Workflow, *, cancel_after: int | None = None
) -> tuple[InMemorySpanExporter, Seen]:
    """Run ``flow`` as run ``r-1`` with a Spans observer; cancel once ``cancel_after`` records are written."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = Seen()

    async def main() -> None:
        control = RunControl()

        async def supervise() -> None:
            while cancel_after is not None and len(seen.changes) < cancel_after:
                await asyncio.sleep(0)
            control.cancel()

        with RunLogWriter(path) as log:
            executor = Executor(
                log,
                observers=[seen, Spans(provider.get_tracer("tests"))],
                clock=lambda: 1000.0 + len(seen.changes),
            )
            watcher = asyncio.ensure_future(supervise()) if cancel_after is not None else None
            await executor.run(flow, "r-1", control=control)
            if watcher is not None:
                await watcher

    asyncio.run(main())
    return exporter, seen


def key_of(seen: Seen, step: str) -> str:
    [key] = [c.key for c in seen.changes if isinstance(c, IntentPlanned) and c.step == step]
    return key


async def greet(ctx: StepContext) -> JSON:
    return "hi"


async def flaky(ctx: StepContext) -> JSON:
    if ctx.attempt == 1:
        raise ValueError("first try fails")
    return "ok"


async def pay(ctx: StepContext) -> JSON:
    async def charge(key: str) -> JSON:
        return {"paid": 5}

    return await ctx.effect("charge", charge)


async def pay_forever(ctx: StepContext) -> JSON:
    async def charge(key: str) -> JSON:
        await asyncio.sleep(3600)
        return None

    return await ctx.effect("charge", charge)


def test_a_dag_run_is_one_trace_with_a_span_per_step_attempt_and_effect(tmp_path: Path) -> None:
    """A step that succeeds, one retried once, and one whose effect is confirmed: the whole tree."""
    flow = load_workflow(
        "w",
        [
            Step(name="greet", run=greet),
            Step(name="flaky", run=flaky, after=("greet",), retry=RetryPolicy(max_attempts=2, initial_interval=0)),
            Step(name="pay", run=pay, after=("flaky",)),
        ],
    )
    exporter, seen = traced(tmp_path / "log", flow)
    # records: 0 RunStarted; greet 1-4; flaky#1 5-8 (fails), flaky#2 9-12;
    # pay 13 created, 14 running, 15 planned, 16 dispatched, 17 confirmed,
    # 18 result, 19 succeeded; 20 RunFinished. Written in one go, stamped
    # with the first one's time: 1-2, 3-4, 5-6, 7-8, 9-10, 11-12, 13-14,
    # 15-16, 18-19.
    key = key_of(seen, "pay")
    run, ok, error = {"attempt_kernel.run": "r-1"}, StatusCode.OK, StatusCode.ERROR
    assert summary(exporter.get_finished_spans()) == [
        ("attempt greet#1", "step greet", T(1), T(3),
         {**run, "attempt_kernel.step": "greet", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step greet", "run w", T(1), T(3),
         {**run, "attempt_kernel.step": "greet", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("attempt flaky#1", "step flaky", T(5), T(7),
         {**run, "attempt_kernel.step": "flaky", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Failed"}, error),
        ("attempt flaky#2", "step flaky", T(9), T(11),
         {**run, "attempt_kernel.step": "flaky", "attempt_kernel.attempt": 2,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step flaky", "run w", T(5), T(11),
         {**run, "attempt_kernel.step": "flaky", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("effect charge", "attempt pay#1", T(15), T(17),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt": 1, "attempt_kernel.intent": "charge",
          "attempt_kernel.idempotency_key": key, "attempt_kernel.intent.state": "Confirmed"}, ok),
        ("attempt pay#1", "step pay", T(13), T(18),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step pay", "run w", T(13), T(18),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("run w", None, T(0), T(20),
         {**run, "attempt_kernel.workflow": "w", "attempt_kernel.run.status": "succeeded"}, ok),
    ]  # fmt: skip


def test_all_spans_of_a_run_share_its_trace_and_the_run_span_is_a_root(tmp_path: Path) -> None:
    exporter, _ = traced(tmp_path / "log", load_workflow("w", [Step(name="greet", run=greet)]))
    spans = exporter.get_finished_spans()
    assert len({span.context.trace_id for span in spans if span.context is not None}) == 1
    assert [span.name for span in spans if span.parent is None] == ["run w"]


def test_a_failed_attempt_carries_the_steps_error_as_its_status_description(tmp_path: Path) -> None:
    flow = load_workflow("w", [Step(name="flaky", run=flaky, retry=RetryPolicy(max_attempts=2, initial_interval=0))])
    exporter, _ = traced(tmp_path / "log", flow)
    [first] = [span for span in exporter.get_finished_spans() if span.name == "attempt flaky#1"]
    assert first.status.description == "ValueError: first try fails"


def test_a_cancel_with_an_effect_in_flight_leaves_an_indeterminate_attempt_and_a_dispatched_effect(
    tmp_path: Path,
) -> None:
    """The effect span ends with its attempt, still Dispatched; the run needs reconciliation."""
    # records: 0 RunStarted, 1 created, 2 running, 3 planned, 4 dispatched,
    # 5 cancel requested, 6 Indeterminate, 7 RunFinished (1-2 and 3-4 written
    # in one go, stamped T(1) and T(3))
    exporter, seen = traced(tmp_path / "log", load_workflow("w", [Step(name="pay", run=pay_forever)]), cancel_after=5)
    key = key_of(seen, "pay")
    run, error = {"attempt_kernel.run": "r-1"}, StatusCode.ERROR
    assert summary(exporter.get_finished_spans()) == [
        ("effect charge", "attempt pay#1", T(3), T(6),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt": 1, "attempt_kernel.intent": "charge",
          "attempt_kernel.idempotency_key": key, "attempt_kernel.intent.state": "Dispatched"}, StatusCode.UNSET),
        ("attempt pay#1", "step pay", T(1), T(6),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Indeterminate"}, error),
        ("step pay", "run w", T(1), T(6),
         {**run, "attempt_kernel.step": "pay", "attempt_kernel.attempt.state": "Indeterminate"}, error),
        ("run w", None, T(0), T(7),
         {**run, "attempt_kernel.workflow": "w", "attempt_kernel.run.status": "needs-reconciliation"}, error),
    ]  # fmt: skip


@workflow("coded")
async def coded(run: RunContext) -> JSON:
    await run.step("greet", greet)
    return await run.step("pay", pay)


def test_a_code_workflows_steps_are_named_by_their_call_position(tmp_path: Path) -> None:
    """A code run: steps ``greet@1`` and ``pay@2``, the run's status from its function's return."""
    # records: 0 RunStarted, 1 StepCalled, greet@1 2-5, 6 StepCalled,
    # pay@2 7 created, 8 running, 9 planned, 10 dispatched, 11 confirmed,
    # 12 result, 13 succeeded; 14 RunFinished. Written in one go, stamped
    # with the first one's time: 1-3, 4-5, 6-8, 9-10, 12-13.
    exporter, seen = traced(tmp_path / "log", coded)
    key = key_of(seen, "pay@2")
    run, ok = {"attempt_kernel.run": "r-1"}, StatusCode.OK
    assert summary(exporter.get_finished_spans()) == [
        ("attempt greet@1#1", "step greet@1", T(1), T(4),
         {**run, "attempt_kernel.step": "greet@1", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step greet@1", "run coded", T(1), T(4),
         {**run, "attempt_kernel.step": "greet@1", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("effect charge", "attempt pay@2#1", T(9), T(11),
         {**run, "attempt_kernel.step": "pay@2", "attempt_kernel.attempt": 1, "attempt_kernel.intent": "charge",
          "attempt_kernel.idempotency_key": key, "attempt_kernel.intent.state": "Confirmed"}, ok),
        ("attempt pay@2#1", "step pay@2", T(6), T(12),
         {**run, "attempt_kernel.step": "pay@2", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step pay@2", "run coded", T(6), T(12),
         {**run, "attempt_kernel.step": "pay@2", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("run coded", None, T(0), T(14),
         {**run, "attempt_kernel.workflow": "coded", "attempt_kernel.run.status": "succeeded"}, ok),
    ]  # fmt: skip


@workflow("asker")
async def asker(run: RunContext) -> JSON:
    await run.step("greet", greet)
    return await run.wait_for_signal("go")


def test_a_run_let_go_while_it_waits_ends_its_spans_as_waiting_and_its_resume_opens_a_new_one(
    tmp_path: Path,
) -> None:
    """A run an executor lets go of while it waits writes nothing more: its run span stayed
    open for as long as the process lived, never exported, and kept in memory. It ends at
    the let-go, status ``waiting``; the executor that takes the run up again opens a
    ``run resumed`` span, as a new process would."""
    # records: 0 RunStarted, 1 StepCalled, greet@1 2-5 (1-3 and 4-5 written in one go),
    # 6 WaitStarted; let go at 7; 7 SignalSent, 8 RunResumed, 9 WaitEnded, 10 RunFinished.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = Seen()
    let_go: list[list[str]] = []

    async def main() -> None:
        with RunLogWriter(tmp_path / "log") as log:
            executor = Executor(
                log,
                observers=[seen, Spans(provider.get_tracer("tests"))],
                clock=lambda: 1000.0 + len(seen.changes),
                let_go_after=1.0,
            )
            first = await executor.run(asker, "r-1")
            assert first.status == "waiting"
            let_go.append([span.name for span in exporter.get_finished_spans()])
            assert executor.deliver("r-1", SignalSent(name="go", payload="yes", id="s-1")) is None
            second = await executor.run(asker, "r-1", prior={})
            assert second.status == "succeeded"

    asyncio.run(main())
    assert let_go == [["attempt greet@1#1", "step greet@1", "run asker"]]
    run, ok = {"attempt_kernel.run": "r-1"}, StatusCode.OK
    assert summary(exporter.get_finished_spans()) == [
        ("attempt greet@1#1", "step greet@1", T(1), T(4),
         {**run, "attempt_kernel.step": "greet@1", "attempt_kernel.attempt": 1,
          "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("step greet@1", "run asker", T(1), T(4),
         {**run, "attempt_kernel.step": "greet@1", "attempt_kernel.attempt.state": "Succeeded"}, ok),
        ("run asker", None, T(0), T(7),
         {**run, "attempt_kernel.workflow": "asker", "attempt_kernel.run.status": "waiting"}, StatusCode.UNSET),
        ("run resumed", None, T(8), T(10), {**run, "attempt_kernel.run.resumed": True}, StatusCode.UNSET),
    ]  # fmt: skip


class Releases:
    """Keeps each run an executor said it released (`ReleaseObserver`)."""

    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        pass

    def run_released(self, run: str, status: Literal["waiting", "interrupted"], time_us: int) -> None:
        self.released.append((run, status))


def test_a_run_refused_is_not_said_to_be_released(tmp_path: Path) -> None:
    """A fresh start of a run the log holds unfinished is refused: this executor never
    drove it, so its observers are not told it let the run go (a `Spans` shared with the
    executor that does drive it would end that run's spans under it)."""
    path = tmp_path / "log"
    releases = Releases()

    async def main() -> None:
        with RunLogWriter(path) as log:
            first = await Executor(log, let_go_after=1.0, observers=[releases]).run(asker, "r-1")
            assert first.status == "waiting"
            with pytest.raises(RunRefused):
                await Executor(log, observers=[releases]).run(asker, "r-1")

    asyncio.run(main())
    assert releases.released == [("r-1", "waiting")]


class FailingAt:
    """A run log whose ``fail_at``-th append (1-based) fails, as a full disk would fail it."""

    def __init__(self, writer: RunLogWriter, fail_at: int) -> None:
        self._writer = writer
        self._left = fail_at

    def read(self) -> Iterator[LogItem]:
        return self._writer.read()

    def append(self, run: str, change: Change) -> int:
        self._left -= 1
        if self._left == 0:
            raise LogWriteFailed("write failed: the disk is full")
        return self._writer.append(run, change)

    def flush(self) -> None:
        self._writer.flush()


def test_a_run_whose_log_fails_under_it_ends_its_spans_as_interrupted(tmp_path: Path) -> None:
    """The log fails at the step's result (record 4): the run is cut off with no record
    to say so, and its spans end then (they stayed open for the process's life), the
    run's status ``interrupted``. This log writes records one by one (no ``append_all``),
    so each has its own time: the attempt starts at record 2."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen = Seen()

    async def main() -> None:
        with RunLogWriter(tmp_path / "log") as writer:
            executor = Executor(
                FailingAt(writer, 5),
                observers=[seen, Spans(provider.get_tracer("tests"))],
                clock=lambda: 1000.0 + len(seen.changes),
            )
            with pytest.raises(LogWriteFailed):
                await executor.run(asker, "r-1")

    asyncio.run(main())
    got = [(name, parent, start, end, attrs.get("attempt_kernel.run.status"))
           for name, parent, start, end, attrs, _ in summary(exporter.get_finished_spans())]  # fmt: skip
    assert got == [
        ("attempt greet@1#1", "step greet@1", T(2), T(4), None),
        ("step greet@1", "run asker", T(2), T(4), None),
        ("run asker", None, T(0), T(4), "interrupted"),
    ]


def _fed(changes: list[Change]) -> InMemorySpanExporter:
    """Tell a Spans the changes by hand, change ``n`` at ``1000 + n`` seconds."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = Spans(provider.get_tracer("tests"))
    for n, change in enumerate(changes):
        spans.record_written("r-1", change, (1000 + n) * 1_000_000)
    return exporter


def test_a_run_resumed_in_a_new_process_gets_a_new_run_span_without_a_status() -> None:
    """Only RunResumed and later were seen: the span is ``run resumed``, its status unknown."""
    exporter = _fed([
        RunResumed(),
        AttemptCreated(step="flaky", attempt=2),
        AttemptTransitioned(step="flaky", attempt=2, from_state=Pending(), cause=Admit(), to_state=Running()),
        AttemptTransitioned(step="flaky", attempt=2, from_state=Running(), cause=Fail(), to_state=Failed()),
        RunFinished(),
    ])  # fmt: skip
    run = {"attempt_kernel.run": "r-1"}
    assert summary(exporter.get_finished_spans()) == [
        ("attempt flaky#2", "step flaky", T(1), T(3),
         {**run, "attempt_kernel.step": "flaky", "attempt_kernel.attempt": 2,
          "attempt_kernel.attempt.state": "Failed"}, StatusCode.ERROR),
        ("step flaky", "run resumed", T(1), T(3),
         {**run, "attempt_kernel.step": "flaky", "attempt_kernel.attempt.state": "Failed"}, StatusCode.ERROR),
        ("run resumed", None, T(0), T(4), {**run, "attempt_kernel.run.resumed": True}, StatusCode.UNSET),
    ]  # fmt: skip


def test_a_stopped_run_ends_its_spans_with_its_last_live_attempt_as_interrupted() -> None:
    """No RunFinished follows a stop: the spans end when the last live attempt does."""
    exporter = _fed([
        RunStarted(workflow="w"),
        AttemptCreated(step="pay", attempt=1),
        AttemptTransitioned(step="pay", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="pay", attempt=1, name="charge", key="k-1"),
        IntentChanged(step="pay", attempt=1, name="charge", from_state=Planned(), cause=Dispatch(),
                      to_state=Dispatched()),
        RunStopRequested(reason="SIGTERM"),
        AttemptTransitioned(step="pay", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True),
                            to_state=Indeterminate()),
    ])  # fmt: skip
    got = [(name, parent, start, end, attrs.get("attempt_kernel.run.status"))
           for name, parent, start, end, attrs, _ in summary(exporter.get_finished_spans())]  # fmt: skip
    assert got == [
        ("effect charge", "attempt pay#1", T(4), T(6), None),
        ("attempt pay#1", "step pay", T(1), T(6), None),
        ("step pay", "run w", T(1), T(6), None),
        ("run w", None, T(0), T(6), "interrupted"),
    ]


def test_a_retried_step_whose_last_attempt_failed_ends_at_that_attempts_end() -> None:
    """The step span waits for a retry that never comes and ends, at the run's end, when its attempt did."""
    exporter = _fed([
        RunStarted(workflow="w"),
        AttemptCreated(step="s", attempt=1),
        AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()),
        RunFinished(),
    ])  # fmt: skip
    got = [(name, start, end, attrs.get("attempt_kernel.run.status"), status)
           for name, _, start, end, attrs, status in summary(exporter.get_finished_spans())]  # fmt: skip
    assert got == [
        ("attempt s#1", T(1), T(3), None, StatusCode.ERROR),
        ("step s", T(1), T(3), None, StatusCode.ERROR),
        ("run w", T(0), T(4), "failed", StatusCode.ERROR),
    ]


def test_records_of_a_run_never_opened_here_make_no_spans() -> None:
    exporter = _fed([AttemptCreated(step="s", attempt=1), RunFinished()])
    assert exporter.get_finished_spans() == ()


def test_without_opentelemetry_spans_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"install attempt-kernel\[otel\]"):
        Spans()


@pytest.mark.slow
def test_importing_the_package_does_not_import_opentelemetry() -> None:
    code = "import sys, attempt_kernel; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "[]\n"


class RaisesOnEnd(SpanProcessor):
    """A span processor with a bug: it raises on the end of every span."""

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("the processor broke")


def test_a_span_processor_that_raises_on_a_spans_end_leaves_no_other_span_of_the_run_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SDK hands a span's end to its processors in turn, and one that raises makes
    ``span.end`` raise, after the processors before it saw the end. That must not cut
    the run's other spans off: each still ends, at its own time (here the exporter sits
    before the broken processor, so it sees them all), and each failure is logged."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(RaisesOnEnd())
    spans = Spans(provider.get_tracer("tests"))
    changes: list[Change] = [
        RunStarted(workflow="w"),
        AttemptCreated(step="a", attempt=1),
        AttemptTransitioned(step="a", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        AttemptCreated(step="b", attempt=1),
        AttemptTransitioned(step="b", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        AttemptTransitioned(step="a", attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
        AttemptTransitioned(step="b", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()),
        RunFinished(),
    ]  # fmt: skip
    for n, change in enumerate(changes):
        tell([spans], "r-1", change, (1000 + n) * 1_000_000)  # as the executor tells its observers
    ended = exporter.get_finished_spans()
    names = {span.context.span_id: span.name for span in ended if span.context is not None}
    got = [
        (
            span.name,
            None if span.parent is None else names.get(span.parent.span_id, "a span never ended"),
            span.start_time,
            span.end_time,
            (span.attributes or {}).get("attempt_kernel.run.status"),
        )
        for span in ended
    ]
    assert got == [
        ("attempt a#1", "step a", T(1), T(5), None),
        ("step a", "run w", T(1), T(5), None),
        ("attempt b#1", "step b", T(3), T(6), None),
        ("step b", "run w", T(3), T(6), None),
        ("run w", None, T(0), T(7), "failed"),
    ]
    failures = [record for record in caplog.records if record.levelname == "ERROR"]
    assert len(failures) == 5
    assert all("the processor broke" in (record.exc_text or "") for record in failures)
