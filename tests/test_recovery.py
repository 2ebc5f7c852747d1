"""Recovery: cut a torn tail, end orphans through the kernel, resume, refuse what it must."""

from __future__ import annotations

from pathlib import Path

import pytest
from logs import simple_changes, write_log

from attempt_kernel import (
    JSON,
    AttemptTransitioned,
    Cancel,
    Cancelled,
    Indeterminate,
    Job,
    LogNeedsRecovery,
    Pending,
    Record,
    RecoveryError,
    RetryPolicy,
    Running,
    RunLogWriter,
    RunStarted,
    Step,
    StepContext,
    Succeeded,
    Workflow,
    load_workflow,
    read_log,
    recover_log,
    replay,
    run_jobs,
)


class World:
    """Counts calls, so a test can tell which steps ran again."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.hang_effect = False

    def workflow(self) -> Workflow:
        async def plain(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1
            return f"{ctx.step}-done"

        async def pay(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1

            async def charge(key: str) -> JSON:
                return "charged"

            return await ctx.effect("charge", charge)

        async def flaky(ctx: StepContext) -> JSON:
            self.calls[ctx.step] = self.calls.get(ctx.step, 0) + 1
            if ctx.attempt == 1:
                raise RuntimeError("first try fails")
            return "ok"

        return load_workflow(
            "w",
            [
                Step(name="a", run=plain),
                Step(name="pay", run=pay, after=("a",)),
                Step(name="flaky", run=flaky, after=("a",), retry=RetryPolicy(initial_interval=0, max_attempts=2)),
                Step(name="z", run=plain, after=("pay", "flaky")),
            ],
        )


def full_log(tmp_path: Path) -> list[bytes]:
    """The lines of one complete run of World's workflow (admission 1: a fixed order)."""
    path = tmp_path / "full.jsonl"
    with RunLogWriter(path) as log:
        run_jobs(log, [Job(workflow=World().workflow(), run="r")], admission_limit=1)
    assert replay(path).valid
    return path.read_bytes().splitlines(keepends=True)


def crashed(tmp_path: Path, lines: list[bytes], n: int, torn: bytes = b"") -> Path:
    """A log as a crash right after record n would leave it (plus an optional torn tail)."""
    path = tmp_path / f"crash-{n}.jsonl"
    path.write_bytes(b"".join(lines[:n]) + torn)
    return path


def index_of(lines: list[bytes], needle: bytes) -> int:
    """1-based number of the first line containing needle."""
    return next(i for i, line in enumerate(lines, 1) if needle in line)


def test_finished_log_changes_nothing_and_says_so(tmp_path: Path) -> None:
    """A log that ends cleanly with every run finished is left byte for byte."""
    path = crashed(tmp_path, full_log(tmp_path), 10_000)
    before = path.read_bytes()
    writer, recovery = recover_log(path, {"w": World().workflow()})
    writer.close()
    assert recovery.changed_nothing and recovery.runs == ()
    assert path.read_bytes() == before


def test_torn_tail_is_cut_and_kept_in_a_side_file(tmp_path: Path) -> None:
    """The torn bytes move to <log>.torn-at-<offset>; the log is valid after."""
    lines = full_log(tmp_path)
    path = crashed(tmp_path, lines, 4, torn=b'{"v":1,"seq":5,"ti')
    offset = len(b"".join(lines[:4]))
    writer, recovery = recover_log(path, {"w": World().workflow()})
    writer.close()
    assert recovery.torn_tail is not None and recovery.torn_tail.offset == offset
    assert recovery.side_file == tmp_path / f"crash-4.jsonl.torn-at-{offset}"
    assert recovery.side_file is not None
    assert recovery.side_file.read_bytes() == b'{"v":1,"seq":5,"ti'
    assert path.read_bytes().startswith(b"".join(lines[:4]))
    assert replay(path).torn_tail is None


def test_orphan_with_dispatched_intent_ends_indeterminate_and_is_not_retried(tmp_path: Path) -> None:
    """Crash right after the Dispatch record: Indeterminate, its key reported, no new attempt."""
    lines = full_log(tmp_path)
    n = index_of(lines, b'"cause":"Dispatch"')
    path = crashed(tmp_path, lines, n)
    world = World()
    writer, recovery = recover_log(path, {"w": world.workflow()})
    with writer:
        [orphan] = [o for o in recovery.orphans if o.step == "pay"]
        assert (orphan.from_state, orphan.to_state) == (Running(), Indeterminate())
        assert len(orphan.outstanding) == 1
        [run] = recovery.runs
        [report] = run_jobs(writer, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    assert world.calls.get("pay", 0) == 0  # never retried
    assert {s.step: s.state for s in report.steps}["pay"] == Indeterminate()
    assert report.status == "needs-reconciliation"
    check = replay(path)
    assert check.valid and len(check.indeterminate) == 1


def test_orphan_without_intent_is_cancelled_then_retried(tmp_path: Path) -> None:
    """Crash while pay is Running before its Dispatch: Cancelled, then a new attempt succeeds."""
    lines = full_log(tmp_path)
    n = index_of(lines, b'"type":"intent_planned"')
    path = crashed(tmp_path, lines, n)
    world = World()
    writer, recovery = recover_log(path, {"w": world.workflow()})
    with writer:
        [orphan] = [o for o in recovery.orphans if o.step == "pay"]
        assert (orphan.from_state, orphan.to_state) == (Running(), Cancelled())
        [run] = recovery.runs
        [report] = run_jobs(writer, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    states = {s.step: (s.state, s.attempts) for s in report.steps}
    assert states["pay"] == (Succeeded(), 2)
    assert world.calls.get("a", 0) == 0  # Succeeded before the crash: not run again
    assert report.status == "succeeded" and replay(path).valid


def test_pending_orphan_is_cancelled_with_false(tmp_path: Path) -> None:
    """An attempt created but not admitted is ended with Cancel(intent_dispatched=False)."""
    lines = full_log(tmp_path)
    n = index_of(lines, b'"type":"created","step":"pay"')
    path = crashed(tmp_path, lines, n)
    writer, recovery = recover_log(path, {"w": World().workflow()})
    writer.close()
    assert [(o.step, o.from_state, o.to_state) for o in recovery.orphans] == [("pay", Pending(), Cancelled())]
    last = [i for i in read_log(path) if isinstance(i, Record)][-1].change
    assert isinstance(last, AttemptTransitioned) and last.to_state == Cancelled()
    assert last.cause == Cancel(intent_dispatched=False)


def test_failed_step_with_tries_left_is_retried_after_recovery(tmp_path: Path) -> None:
    """flaky failed its first attempt just before the crash: recovery gives it its second."""
    lines = full_log(tmp_path)
    n = index_of(lines, b'"step":"flaky","attempt":1,"from":"Running","cause":"Fail"')
    path = crashed(tmp_path, lines, n)
    world = World()
    writer, recovery = recover_log(path, {"w": world.workflow()})
    with writer:
        [run] = recovery.runs
        [report] = run_jobs(writer, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    assert {s.step: (s.state, s.attempts) for s in report.steps}["flaky"] == (Succeeded(), 2)
    assert replay(path).valid


def test_unknown_workflow_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """A run of a workflow this program does not know cannot be resumed."""
    path = crashed(tmp_path, full_log(tmp_path), 6)
    before = path.read_bytes()
    with pytest.raises(RecoveryError, match="belongs to workflow 'w', which this program was not given"):
        recover_log(path, {"other": load_workflow("other", [Step(name="x", run=World().workflow().steps[0].run)])})
    assert path.read_bytes() == before


def test_recover_log_given_a_list_of_workflows_says_it_takes_a_mapping(tmp_path: Path) -> None:
    """recover_log maps names to workflows; a list (what resume_log takes) is named as such, nothing written."""
    path = crashed(tmp_path, full_log(tmp_path), 6)
    before = path.read_bytes()
    with pytest.raises(TypeError) as caught:
        recover_log(path, [World().workflow()])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    assert str(caught.value) == (
        "recover_log: workflows must map each workflow's name to it ({'w': w}), got a list;"
        " resume_log is the one that takes the workflows themselves"
    )
    assert path.read_bytes() == before


def test_resume_log_given_a_mapping_of_workflows_says_it_takes_the_workflows(tmp_path: Path) -> None:
    """resume_log takes the workflows; a name mapping (what recover_log takes) is named as such, nothing written."""
    from attempt_kernel import resume_log

    path = crashed(tmp_path, full_log(tmp_path), 6)
    before = path.read_bytes()
    with pytest.raises(TypeError) as caught:
        resume_log(path, {"w": World().workflow()})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]
    assert str(caught.value) == (
        "resume_log: workflows must be the workflows themselves ([w, ...]), got 'w', a str"
        " (a dict's key?): pass the mapping's .values(); recover_log is the one that takes a mapping by name"
    )
    assert path.read_bytes() == before


def test_run_without_run_started_is_refused(tmp_path: Path) -> None:
    """A live run that never said its workflow cannot be resumed."""
    path = write_log(tmp_path / "log", simple_changes()[:2])
    with pytest.raises(RecoveryError, match="has no run_started record"):
        recover_log(path, {"w": World().workflow()})


def test_log_with_violations_is_refused(tmp_path: Path) -> None:
    """Recovery does not build on a log the replayer rejects."""
    path = write_log(tmp_path / "log", [RunStarted(workflow="w"), *simple_changes()[:1], *simple_changes()[3:]])
    before = path.read_bytes()
    with pytest.raises(RecoveryError, match="violation"):
        recover_log(path, {"w": World().workflow()})
    assert path.read_bytes() == before


def test_corrupt_log_is_refused(tmp_path: Path) -> None:
    """Corruption in the middle cannot be cut away: LogNeedsRecovery, nothing changed."""
    lines = full_log(tmp_path)
    lines[2] = lines[2].replace(b"Running", b"Runnin9")
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(LogNeedsRecovery, match="line 3 is corrupt"):
        recover_log(path, {"w": World().workflow()})


def test_every_crash_point_recovers_to_a_valid_log(tmp_path: Path) -> None:
    """Cut the complete run after each record in turn: recovery and resume always replay clean."""
    lines = full_log(tmp_path)
    for n in range(1, len(lines)):
        path = crashed(tmp_path, lines, n)
        world = World()
        writer, recovery = recover_log(path, {"w": world.workflow()})
        with writer:
            jobs = [Job(workflow=world.workflow(), run=r.run, prior=r.steps) for r in recovery.runs]
            reports = run_jobs(writer, jobs) if jobs else []
        check = replay(path)
        assert check.valid, (n, check.violations)
        for report in reports:
            assert report.status in ("succeeded", "needs-reconciliation"), (n, report)


def test_run_that_only_started_is_resumed_from_scratch(tmp_path: Path) -> None:
    """A crash right after run_started: the run is resumed and every step runs."""
    path = crashed(tmp_path, full_log(tmp_path), 1)
    world = World()
    writer, recovery = recover_log(path, {"w": world.workflow()})
    with writer:
        [run] = recovery.runs
        assert run.steps == {}
        [report] = run_jobs(writer, [Job(workflow=world.workflow(), run="r", prior=run.steps)])
    assert report.status == "succeeded" and world.calls == {"a": 1, "pay": 1, "flaky": 2, "z": 1}
    assert replay(path).valid


_QUEUED = (
    "run(s) q-1 are queued, for a worker of their workflow to start (anything sent to them"
    " waits in the journal's inbox for it)"
)
_LEFT = (
    "once its signal is sent or its wake time passes, a worker takes up a submitted run,"
    " and `attempt-kernel recover` one that `attempt-kernel run` started"
)


def test_recovery_text_names_the_queued_runs_beside_runs_left_waiting() -> None:
    """A journal with a run that only waits and a queued one: both are named (the queued
    one was left out of the "left waiting" sentence)."""
    from attempt_kernel import _report
    from attempt_kernel._recovery import Recovery

    recovery = Recovery(torn_tail=None, side_file=None, orphans=(), runs=(), left_waiting=("w-1",))
    assert _report.recovery_text(recovery, "DB", queued=["q-1"]) == (
        f"recover: nothing to do: no run in DB was cut short; run(s) w-1 only wait, left waiting"
        f" ({_LEFT}); {_QUEUED}; the log was not changed\n"
    )


def test_recovery_text_names_the_queued_runs_beside_runs_it_resumes() -> None:
    """A journal with a run to resume and a queued one: the queued one is named on a line
    of its own (it was left out of the account of what recovery did)."""
    from attempt_kernel import _report
    from attempt_kernel._recovery import RecoveredRun, Recovery

    resumed = RecoveredRun(run="c-1", workflow="orders", steps={})
    recovery = Recovery(torn_tail=None, side_file=None, orphans=(), runs=(resumed,), left_waiting=("w-1",))
    assert _report.recovery_text(recovery, "DB", queued=["q-1"]) == (
        "recover: DB\n"
        "  resuming run c-1 (workflow orders)\n"
        f"  left waiting: run(s) w-1 ({_LEFT})\n"
        f"  queued: {_QUEUED}\n"
    )
