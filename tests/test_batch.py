"""The executor on a log that takes several records in one go (`BatchLog`, as the PostgreSQL journal does).

Records written back to back (an attempt's creation and its admission, a
step's result and its end) go in one `append_all`; the records themselves,
and their order, are those of a plain log. Expected call lists are written
out by hand.
"""

from __future__ import annotations


import asyncio
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from attempt_kernel import (
    JSON,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    Fail,
    Job,
    LogItem,
    Record,
    Pending,
    Running,
    RunFinished,
    RunLogWriter,
    RunStarted,
    Step,
    StepContext,
    StepResult,
    Succeed,
    Succeeded,
    load_workflow,
    read_log,
    replay,
    run_jobs,
)
from attempt_kernel import Failed as FailedState


class Batched:
    """A run log file that also has `append_all`; it notes each call (``one`` or ``all``)."""

    def __init__(self, writer: RunLogWriter) -> None:
        self.writer = writer
        self.calls: list[tuple[str, tuple[Change, ...]]] = []

    def read(self) -> Iterator[LogItem]:
        return self.writer.read()

    def append(self, run: str, change: Change) -> int:
        self.calls.append(("one", (change,)))
        return self.writer.append(run, change)

    def append_all(self, run: str, changes: Sequence[Change]) -> int:
        self.calls.append(("all", tuple(changes)))
        seq = 0
        for change in changes:
            seq = self.writer.append(run, change)
        return seq

    def flush(self) -> None:
        self.writer.flush()


async def ok(ctx: StepContext) -> JSON:
    return "done"


async def boom(ctx: StepContext) -> JSON:
    raise ValueError("no")


async def nan(ctx: StepContext) -> JSON:
    return float("nan")  # strict JSON has no NaN: the log cannot encode it


def admitted(step: str) -> AttemptTransitioned:
    return AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running())


def run_one(tmp_path: Path, steps: list[Step], admission_limit: int = 8) -> Batched:
    with RunLogWriter(tmp_path / "log.jsonl") as writer:
        log = Batched(writer)
        run_jobs(log, [Job(workflow=load_workflow("w", steps), run="r")], admission_limit=admission_limit)
    assert replay(tmp_path / "log.jsonl").valid
    return log


def test_creation_and_admission_then_result_and_end_go_in_pairs(tmp_path: Path) -> None:
    """One succeeding step: start, (created, admitted), (result, succeeded), end."""
    log = run_one(tmp_path, [Step(name="s", run=ok)])
    started = log.calls[0][1][0]
    nonce = started.nonce if isinstance(started, RunStarted) else "?"
    assert re.fullmatch("[0-9a-f]{16}", nonce), nonce  # the run's random part of its keys
    assert log.calls == [
        ("one", (RunStarted(workflow="w", input=None, nonce=nonce),)),
        ("all", (AttemptCreated(step="s", attempt=1), admitted("s"))),
        ("all", (
            StepResult(step="s", attempt=1, value="done"),
            AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
        )),
        ("one", (RunFinished(),)),
    ]  # fmt: skip


def test_a_failing_step_writes_its_error_and_its_failure_together(tmp_path: Path) -> None:
    """The error result and Fail are one call (the default policy's only try: the result
    says the step is done, retryable=False)."""
    log = run_one(tmp_path, [Step(name="s", run=boom)])
    assert log.calls[2] == (
        "all",
        (
            StepResult(step="s", attempt=1, error="ValueError: no", retryable=False),
            AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Fail(), to_state=FailedState()),
        ),
    )


def test_an_unencodable_result_writes_nothing_then_the_error_and_the_failure(tmp_path: Path) -> None:
    """NaN cannot be encoded: the pair with it is refused whole, then the error and Fail go together."""
    log = run_one(tmp_path, [Step(name="s", run=nan)])
    refused, written = [c for c in log.calls[2:] if c[0] == "all"]
    assert refused[1][1] == AttemptTransitioned(  # the pair that was refused whole
        step="s", attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()
    )
    result, failed = written[1]
    assert isinstance(result, StepResult) and result.error is not None and "cannot encode" in result.error
    assert not result.retryable  # the default policy's only try
    assert failed == AttemptTransitioned(step="s", attempt=1, from_state=Running(), cause=Fail(), to_state=FailedState())
    kept = [i.change for i in read_log(tmp_path / "log.jsonl") if isinstance(i, Record)]
    assert [type(c).__name__ for c in kept] == [
        "RunStarted", "AttemptCreated", "AttemptTransitioned", "StepResult", "AttemptTransitioned", "RunFinished"
    ]  # fmt: skip
    assert kept[3] == result  # the refused pair left nothing behind


def test_an_attempt_that_waits_for_admission_is_created_and_admitted_apart(tmp_path: Path) -> None:
    """Limit 1, two independent steps: the second waits, so its creation and admission are two calls."""
    gate = asyncio.Event()

    async def first(ctx: StepContext) -> JSON:
        await asyncio.sleep(0.05)
        gate.set()
        return 1

    async def second(ctx: StepContext) -> JSON:
        return 2

    log = run_one(tmp_path, [Step(name="a", run=first), Step(name="b", run=second)], admission_limit=1)
    b_calls = [c for c in log.calls if any(getattr(x, "step", None) == "b" for x in c[1])]
    assert b_calls[:2] == [("one", (AttemptCreated(step="b", attempt=1),)), ("one", (admitted("b"),))]
    assert log.calls[1] == ("all", (AttemptCreated(step="a", attempt=1), admitted("a")))


def test_protocol_answers_are_kept_per_class_and_per_protocol(tmp_path: Path) -> None:
    """A file writer reads and takes batches; `Reader` only reads; `Appender` does neither."""
    from attempt_kernel._store import is_batch_log, is_log_source

    class Appender:
        def append(self, run: str, change: Change) -> int:
            return 1

        def flush(self) -> None:
            pass

    class Reader:
        def __init__(self, writer: RunLogWriter) -> None:
            self.writer = writer

        def read(self) -> Iterator[LogItem]:
            return self.writer.read()

        def append(self, run: str, change: Change) -> int:
            return self.writer.append(run, change)

        def flush(self) -> None:
            self.writer.flush()

    with RunLogWriter(tmp_path / "run.jsonl") as writer:
        reader = Reader(writer)
        for _ in range(2):  # the second time from the kept answers
            assert (is_log_source(writer), is_batch_log(writer)) == (True, True)
            assert (is_log_source(reader), is_batch_log(reader)) == (True, False)
            assert (is_log_source(Appender()), is_batch_log(Appender())) == (False, False)
