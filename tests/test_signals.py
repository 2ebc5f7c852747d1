"""Graceful stops (docs/contracts.md, "A graceful stop is not a cancel"): SIGINT and SIGTERM sent to `attempt-kernel run` mid-run.

Each case runs a workflow from ``tests/propflows/signalflows.py`` in a
subprocess, waits (by reading the log) until an attempt is live, sends the
signal, and then checks what an operator would: the exit code, one line on
stderr, and a log that stays valid, unfinished and resumable by `recover`.
A stop is not a cancel: recovery resumes a stopped run and closes a
cancelled one. No test judges how long the child took: where that matters
(it exits as soon as its step ends, not when the grace ends), the child
runs with a grace of an hour, so only the step's end can let it exit
before the safety-net timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from attempt_kernel import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    IntentChanged,
    Job,
    Record,
    RunCancelRequested,
    RunStarted,
    RunControl,
    RunFinished,
    RunLogWriter,
    RunsStopped,
    RunStopRequested,
    Cancelled,
    Step,
    StepContext,
    Stopper,
    Workflow,
    idempotency_key,
    load_workflow,
    read_log,
    recover_log,
    replay,
    run_jobs,
)
from attempt_kernel.cli._main import GRACE
from logs import key_in

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
FLOWS = "propflows.signalflows"
LOG = "run.jsonl"
RUN = "r1"
SAFETY = GRACE + 60.0
"""Seconds a stopped child may take to exit before the test fails (a safety net, not a speed check)."""
HOUR_OF_GRACE = 3600.0
"""A grace period no test waits out."""


def charge_key(cwd: Path) -> str:
    """The charge's idempotency key in the run's log (keys carry the run's random part)."""
    return key_in(cwd / LOG, RUN, "charge", "charge-card")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``attempt-kernel ARGS`` in a fresh interpreter, in ``cwd``, with the test flows importable."""
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def records(cwd: Path) -> list[Record]:
    return [item for item in read_log(cwd / LOG) if isinstance(item, Record)]


def states(cwd: Path) -> dict[tuple[str, int], str]:
    """Each attempt's last state by (step, number), folded here from the records."""
    out: dict[tuple[str, int], str] = {}
    for r in records(cwd):
        c = r.change
        if isinstance(c, AttemptCreated):
            out[c.step, c.attempt] = "Pending"
        elif isinstance(c, AttemptTransitioned):
            out[c.step, c.attempt] = type(c.to_state).__name__
    return out


def status(cwd: Path) -> str:
    """The run's status as `runs --json` says it."""
    done = cli(cwd, "runs", LOG, "--json")
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["runs"]
    assert row["run"] == RUN
    value = row["status"]
    assert isinstance(value, str)
    return value


def start(cwd: Path, attr: str, grace: float = GRACE) -> subprocess.Popen[str]:
    """``attempt-kernel run`` in a child; ``grace``: its grace period instead of `GRACE`."""
    return spawn(cwd, grace, "run", f"{FLOWS}:{attr}", "--log", LOG, "--run", RUN)


def spawn(cwd: Path, grace: float, *args: str) -> subprocess.Popen[str]:
    """``attempt-kernel ARGS`` in a child process, with ``grace`` as its grace period."""
    program = f"import attempt_kernel.cli._main as m; m.GRACE = {grace!r}; raise SystemExit(m.main())"
    return subprocess.Popen(
        [sys.executable, "-c", program, *args],
        cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_until(cwd: Path, child: subprocess.Popen[str], seen: Callable[[list[Record]], bool]) -> None:
    """Poll the log (another process is writing it) until ``seen`` says yes."""
    deadline = time.monotonic() + 60
    while not ((cwd / LOG).exists() and seen(records(cwd))):
        assert child.poll() is None, "the run ended before the moment the test waits for"
        assert time.monotonic() < deadline, "the moment never came"
        time.sleep(0.02)


def running(step: str) -> Callable[[list[Record]], bool]:
    return lambda rs: any(
        isinstance(r.change, AttemptTransitioned)
        and r.change.step == step
        and type(r.change.to_state).__name__ == "Running"
        for r in rs
    )


def in_flight(cwd: Path) -> Callable[[list[Record]], bool]:
    """The intent is Dispatched in the log and the downstream service has the call."""
    def started(rs: list[Record]) -> str | None:
        for r in rs:  # the key needs the run's start (its random part); it comes first
            if isinstance(r.change, RunStarted):
                return idempotency_key(RUN, "charge", "charge-card", nonce=r.change.nonce)
        return None

    return lambda rs: started(rs) in calls(cwd) and any(
        isinstance(r.change, IntentChanged) and type(r.change.to_state).__name__ == "Dispatched"
        for r in rs
    )


def stop(
    cwd: Path, attr: str, sig: signal.Signals, when: Callable[[list[Record]], bool], grace: float = GRACE
) -> tuple[subprocess.Popen[str], str]:
    """Start the run, send ``sig`` once ``when`` holds; return the child once it exited, and its stderr."""
    child = start(cwd, attr, grace)
    wait_until(cwd, child, when)
    child.send_signal(sig)
    _, err = child.communicate(timeout=SAFETY)
    return child, err


def stop_requested(rs: list[Record]) -> bool:
    """The child has taken the first signal: its stop is in the log."""
    return any(isinstance(r.change, RunStopRequested) for r in rs)


def calls(cwd: Path) -> list[str]:
    path = cwd / "calls.txt"
    return path.read_text().split() if path.exists() else []


SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]


# ------------------------------------------------- a step blocked in a thread


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_a_step_blocked_in_run_blocking_does_not_keep_a_stopped_run_alive(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """A call in ``run_blocking`` that never returns: the signal still ends the process
    once the grace has passed (the attempt Cancelled, the run unfinished), and recover
    finishes the run. The thread held the process open (and the log locked) before."""
    child = start(tmp_path, "blocks", grace=0.1)
    wait_until(tmp_path, child, lambda _: "blocking" in calls(tmp_path))
    child.send_signal(sig)
    try:
        _, err = child.communicate(timeout=SAFETY)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"the process outlived its stop: its blocked thread kept it open ({sig.name})")
    assert child.returncode == code, err
    assert states(tmp_path) == {("block", 1): "Cancelled"}
    assert status(tmp_path) == "interrupted"
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:blocks")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(tmp_path) == {("block", 1): "Cancelled", ("block", 2): "Succeeded", ("wake", 1): "Succeeded"}


def test_a_stopped_run_jobs_returns_while_a_blocking_call_goes_on(tmp_path: Path) -> None:
    """run_jobs, stopped, returns without waiting for a step's call in ``run_blocking``
    (the call finishes on its own, as after a deadline)."""
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        release.wait(SAFETY)
        returned.set()

    async def blocking(ctx: StepContext) -> JSON:
        await ctx.run_blocking(block)
        return None

    stopper = Stopper()

    async def stop_once_blocked(control: RunControl) -> None:
        while not entered.is_set():
            await asyncio.sleep(0.01)
        stopper.stop(signal.SIGTERM)

    workflow = load_workflow("blocker", [Step(name="b", run=blocking)])
    try:
        with RunLogWriter(tmp_path / LOG) as writer, pytest.raises(RunsStopped):
            run_jobs(writer, [Job(workflow=workflow, run=RUN, supervise=stop_once_blocked)], grace=0.0, stopper=stopper)
        went_on = not returned.is_set()
    finally:
        release.set()
    assert went_on
    assert states(tmp_path) == {("b", 1): "Cancelled"}


# ------------------------------------------------------- a step that sleeps


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_a_signal_while_a_step_sleeps_exits_with_one_line_after_the_grace(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """128+signal once the grace has passed (the 60 s nap ends Cancelled, not finished), one line
    on stderr naming the signal, no traceback."""
    child, err = stop(tmp_path, "naps", sig, running("nap"))
    assert child.returncode == code, err
    assert states(tmp_path) == {("nap", 1): "Cancelled"}
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"stopped by {sig.name}" in err and "attempt-kernel recover" in err, err


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_a_stopped_run_is_unfinished_with_no_live_attempt(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """The log holds run_stop_requested and no run_finished; the sleeping attempt ended Cancelled
    and its dependent never started; `runs` says interrupted; `replay` is valid and lists the run."""
    child, err = stop(tmp_path, "naps", sig, running("nap"))
    assert child.returncode == code, err
    kinds = [type(r.change) for r in records(tmp_path)]
    assert kinds.count(RunStopRequested) == 1 and RunFinished not in kinds
    assert states(tmp_path) == {("nap", 1): "Cancelled"}
    assert status(tmp_path) == "interrupted"
    checked = cli(tmp_path, "replay", LOG)
    assert checked.returncode == 0, checked.stdout
    assert "unfinished runs: 1" in checked.stdout and f"  run {RUN}" in checked.stdout
    assert replay(tmp_path / LOG).unfinished == (RUN,)


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_recover_finishes_a_run_a_signal_stopped(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    """`recover --workflows` gives the cancelled step a new attempt and runs its dependent."""
    child, err = stop(tmp_path, "naps", sig, running("nap"))
    assert child.returncode == code, err
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:naps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(tmp_path) == {
        ("nap", 1): "Cancelled",
        ("nap", 2): "Succeeded",
        ("wake", 1): "Succeeded",
    }
    assert isinstance(records(tmp_path)[-1].change, RunFinished)
    assert status(tmp_path) == "succeeded"
    assert replay(tmp_path / LOG).valid and replay(tmp_path / LOG).unfinished == ()


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_a_signal_during_resume_stops_the_run_and_a_later_resume_finishes_it(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """`resume LOG RUN` stops on a signal as `run` does: one line naming the signal and the
    command that resumes, 128+signal, the run interrupted (not cancelled), and a second
    `resume` finishes it."""
    child, err = stop(tmp_path, "long_naps", signal.SIGINT, running("nap"))
    assert child.returncode == 130, err
    resuming = spawn(tmp_path, GRACE, "resume", LOG, RUN, "--workflows", f"{FLOWS}:long_naps")
    wait_until(tmp_path, resuming, lambda rs: states(tmp_path).get(("nap", 2)) == "Running")
    resuming.send_signal(sig)
    _, err = resuming.communicate(timeout=SAFETY)
    assert resuming.returncode == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"stopped by {sig.name}" in err and f"attempt-kernel resume {LOG} {RUN}" in err, err
    assert status(tmp_path) == "interrupted"
    assert not any(isinstance(r.change, RunCancelRequested) for r in records(tmp_path))
    done = cli(tmp_path, "resume", LOG, RUN, "--workflows", f"{FLOWS}:long_naps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(tmp_path) == {
        ("nap", 1): "Cancelled",
        ("nap", 2): "Cancelled",
        ("nap", 3): "Succeeded",
        ("wake", 1): "Succeeded",
    }
    assert status(tmp_path) == "succeeded"


def test_a_step_that_ends_within_the_grace_keeps_its_result_and_nothing_new_starts(
    tmp_path: Path,
) -> None:
    """A step the test lets end only once the stop is recorded finishes during the grace (exit
    as soon as it does: the grace here is an hour, longer than the safety net); its dependent
    starts only on recover."""
    child = start(tmp_path, "briefs", grace=HOUR_OF_GRACE)
    wait_until(tmp_path, child, running("brief"))
    child.send_signal(signal.SIGINT)
    wait_until(tmp_path, child, stop_requested)
    (tmp_path / "release").touch()  # propflows.signalflows.RELEASE: the step ends now, in the grace
    _, err = child.communicate(timeout=SAFETY)
    assert child.returncode == 130, err
    assert states(tmp_path) == {("brief", 1): "Succeeded"}
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:briefs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(tmp_path) == {("brief", 1): "Succeeded", ("wake", 1): "Succeeded"}
    assert status(tmp_path) == "succeeded"


# ------------------------------------------------------- an effect in flight


@pytest.mark.parametrize(("sig", "code"), SIGNALS)
def test_a_signal_during_an_effect_ends_the_attempt_indeterminate(
    tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """The outstanding intent makes the stopped attempt Indeterminate (the grace ended the 60 s
    effect); the run stays unfinished."""
    child, err = stop(tmp_path, "charges", sig, in_flight(tmp_path))
    assert child.returncode == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert states(tmp_path) == {("charge", 1): "Indeterminate"}
    assert calls(tmp_path) == [charge_key(tmp_path)]
    assert status(tmp_path) == "interrupted"
    report = replay(tmp_path / LOG)
    assert report.valid and report.unfinished == (RUN,)
    assert [a.outstanding for a in report.indeterminate] == [(charge_key(tmp_path),)]


def test_recover_and_reconcile_finish_a_run_stopped_during_an_effect(tmp_path: Path) -> None:
    """recover ends the run needing reconciliation; `reconcile --confirmed` then `recover`
    ends it succeeded with the confirmed result, and the effect is never sent again."""
    child, err = stop(tmp_path, "charges", signal.SIGINT, in_flight(tmp_path))
    assert child.returncode == 130, err
    first = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:charges")
    assert first.returncode == 0, first.stdout + first.stderr
    assert status(tmp_path) == "needs-reconciliation"
    answer = cli(tmp_path, "reconcile", LOG, "--key", charge_key(tmp_path), "--confirmed", "--result", '"ch-1"')
    assert answer.returncode == 0, answer.stderr
    second = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:charges")
    assert second.returncode == 0, second.stdout + second.stderr
    assert status(tmp_path) == "succeeded"
    assert states(tmp_path) == {("charge", 1): "Indeterminate", ("charge", 2): "Succeeded"}
    assert calls(tmp_path) == [charge_key(tmp_path)]
    assert replay(tmp_path / LOG).valid


def test_a_crash_during_an_effect_is_settled_by_the_steps_reconciler(tmp_path: Path) -> None:
    """SIGKILL mid-effect, then `recover`: the reconciler finds the charge, the run succeeds,
    and the effect was sent once (the baseline the next test holds a graceful stop to)."""
    child = start(tmp_path, "asked_charges")
    wait_until(tmp_path, child, in_flight(tmp_path))
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=SAFETY)
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:asked_charges")
    assert done.returncode == 0, done.stdout + done.stderr
    assert status(tmp_path) == "succeeded"
    assert calls(tmp_path) == [charge_key(tmp_path)]


def test_a_stop_during_an_effect_leaves_no_more_to_reconcile_than_a_crash(tmp_path: Path) -> None:
    """SIGINT mid-effect, then `recover`: the step's reconciler is asked (only what
    nobody could answer is Indeterminate), so the run succeeds as it does after a SIGKILL."""
    child, err = stop(tmp_path, "asked_charges", signal.SIGINT, in_flight(tmp_path))
    assert child.returncode == 130, err
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:asked_charges")
    assert done.returncode == 0, done.stdout + done.stderr
    assert status(tmp_path) == "succeeded"
    assert calls(tmp_path) == [charge_key(tmp_path)]


# ------------------------------------------------------- a second Ctrl-C


def test_a_second_sigint_during_the_grace_exits_at_once(tmp_path: Path) -> None:
    """The second SIGINT exits 130 at once, leaving the attempt Running as a crash would (had
    the child waited, the grace would have ended the attempt Cancelled)."""
    child = start(tmp_path, "naps", grace=HOUR_OF_GRACE)  # the grace must not end before the second SIGINT
    wait_until(tmp_path, child, running("nap"))
    child.send_signal(signal.SIGINT)
    wait_until(tmp_path, child, stop_requested)
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=SAFETY)
    assert child.returncode == 130
    assert states(tmp_path) == {("nap", 1): "Running"}


_STOPPED_THEN_SIGNALLED = """
import asyncio, os, signal, sys
from attempt_kernel import (
    Job, RunControl, RunLogWriter, RunStopRequested, RunsStopped, StepContext, Step, Stopper,
    load_workflow, read_log, run_jobs,
)

state = {}

async def held(ctx: StepContext) -> str:
    state["running"] = True
    while "release" not in state:
        await asyncio.sleep(0.01)
    return "done"

stopper = Stopper()

async def supervise(control: RunControl) -> None:
    while "running" not in state:
        await asyncio.sleep(0.01)
    stopper.stop(signal.SIGTERM)  # as a lost hold stops the CLI's runs
    while not any(isinstance(item.change, RunStopRequested) for item in read_log("run.jsonl")):
        await asyncio.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)  # the operator's first signal
    for _ in range(10):  # the loop's turns in which asyncio hands the signal to its handler
        await asyncio.sleep(0)
    state["release"] = True

with RunLogWriter("run.jsonl") as writer:
    try:
        run_jobs(
            writer, [Job(workflow=load_workflow("held", [Step(name="h", run=held)]), run="r1", supervise=supervise)],
            stop_on_signals=True, grace=3600.0, stopper=stopper,
        )
    except RunsStopped as stopped:
        print("stopped by", signal.Signals(stopped.signal).name)
"""


def test_the_first_signal_after_a_stoppers_stop_still_gets_the_grace(tmp_path: Path) -> None:
    """A stop from a `Stopper` (the CLI's, when it loses a run's hold) is not a signal: the
    operator's first SIGINT after it waits out the grace as a first SIGINT does, where it
    exited at once, as only a second signal should."""
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED_THEN_SIGNALLED], cwd=tmp_path, capture_output=True, text=True, timeout=SAFETY
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped by SIGTERM\n", "")
    assert states(tmp_path) == {("h", 1): "Succeeded"}


def test_recover_finishes_a_run_left_by_a_second_sigint(tmp_path: Path) -> None:
    """After the abrupt exit, `recover` ends the orphan Cancelled and finishes the run."""
    child = start(tmp_path, "naps", grace=HOUR_OF_GRACE)  # the grace must not end before the second SIGINT
    wait_until(tmp_path, child, running("nap"))
    child.send_signal(signal.SIGINT)
    wait_until(tmp_path, child, stop_requested)
    child.send_signal(signal.SIGINT)
    child.communicate(timeout=SAFETY)
    assert child.returncode == 130
    done = cli(tmp_path, "recover", LOG, "--workflows", f"{FLOWS}:naps")
    assert done.returncode == 0, done.stdout + done.stderr
    assert states(tmp_path) == {
        ("nap", 1): "Cancelled",
        ("nap", 2): "Succeeded",
        ("wake", 1): "Succeeded",
    }
    assert status(tmp_path) == "succeeded"
    assert replay(tmp_path / LOG).valid


# ------------------------------------------------------- a stop is not a cancel


async def _sleep_long(ctx: StepContext) -> JSON:
    await asyncio.sleep(60)
    return None


SLEEPER = load_workflow("sleeper", [Step(name="sleep", run=_sleep_long)])


async def _wake(ctx: StepContext) -> JSON:
    return "awake"


WAKES = load_workflow("wakes", [Step(name="wake", run=_wake)])


def test_after_a_stop_recovery_resumes_the_run(tmp_path: Path) -> None:
    """A SIGINT stop (in process, through run_jobs) leaves a run recovery hands back to resume."""

    async def interrupt(control: RunControl) -> None:
        while not running("sleep")(records(tmp_path)):  # the attempt is live, however slow the machine
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    log = tmp_path / LOG
    with RunLogWriter(log) as writer, pytest.raises(RunsStopped) as stopped:
        run_jobs(
            writer,
            [Job(workflow=SLEEPER, run=RUN, supervise=interrupt)],
            stop_on_signals=True,
            grace=0.1,
        )
    assert stopped.value.signal == signal.SIGINT
    assert [r.status for r in stopped.value.reports] == ["interrupted"]
    writer, recovery = recover_log(log, {"sleeper": SLEEPER})
    writer.close()
    assert [r.run for r in recovery.runs] == [RUN] and recovery.closed == ()


def test_after_a_cancel_recovery_closes_the_run(tmp_path: Path) -> None:
    """RunControl.cancel() finishes the run cancelled; recovery has nothing to resume."""

    async def cancel(control: RunControl) -> None:
        while not running("sleep")(records(tmp_path)):
            await asyncio.sleep(0.01)
        control.cancel()

    log = tmp_path / LOG
    with RunLogWriter(log) as writer:
        [report] = run_jobs(writer, [Job(workflow=SLEEPER, run=RUN, supervise=cancel)])
    assert report.status == "cancelled"
    assert isinstance(records(tmp_path)[-1].change, RunFinished)
    writer, recovery = recover_log(log, {"sleeper": SLEEPER})
    writer.close()
    assert recovery.runs == () and recovery.changed_nothing


# --------------------------------------------------------------------------
# Stopper: the same stop, from another thread
# --------------------------------------------------------------------------


def _slow_workflow(started: threading.Event) -> Workflow:
    async def slow(ctx: StepContext) -> JSON:
        started.set()
        await asyncio.sleep(3600)
        return None

    return load_workflow("slow", [Step(name="s", run=slow)])


def test_a_stopper_stops_runs_driven_on_another_thread_as_a_signal_would(tmp_path: Path) -> None:
    """run_jobs on a thread (no signal reaches it there): `Stopper.stop` from this one
    records the stop, ends the live attempt as recovery would, and raises RunsStopped."""
    started = threading.Event()
    stopper = Stopper()
    raised: list[BaseException] = []

    def drive() -> None:
        with RunLogWriter(tmp_path / "log") as log:
            try:
                run_jobs(log, [Job(workflow=_slow_workflow(started), run="r")], grace=0.0, stopper=stopper)
            except BaseException as error:  # noqa: BLE001  # handed to the test's thread
                raised.append(error)

    thread = threading.Thread(target=drive)
    thread.start()
    assert started.wait(60)
    stopper.stop(signal.SIGTERM)
    thread.join(60)
    assert not thread.is_alive()
    [error] = raised
    assert isinstance(error, RunsStopped) and error.signal == signal.SIGTERM
    assert [r.status for r in error.reports] == ["interrupted"]
    changes = [i.change for i in read_log(tmp_path / "log") if isinstance(i, Record)]
    assert isinstance(changes[-2], RunStopRequested) and changes[-2].reason == "SIGTERM"
    assert isinstance(changes[-1], AttemptTransitioned) and changes[-1].to_state == Cancelled()
    assert stopper.stopped == signal.SIGTERM


def test_a_stopper_stopped_before_the_runs_start_stops_them_as_they_start(tmp_path: Path) -> None:
    started = threading.Event()
    stopper = Stopper()
    stopper.stop(signal.SIGINT)
    stopper.stop(signal.SIGTERM)  # a second stop does nothing
    with RunLogWriter(tmp_path / "log") as log, pytest.raises(RunsStopped) as caught:
        run_jobs(log, [Job(workflow=_slow_workflow(started), run="r")], grace=0.0, stopper=stopper)
    assert caught.value.signal == signal.SIGINT
    assert not started.is_set()


@pytest.mark.parametrize("number", [0, 999])
def test_a_stopper_refuses_a_number_that_is_no_signal_at_the_call(tmp_path: Path, number: int) -> None:
    """`Stopper.stop(0)` was taken, and the runs it was handed to went on: the stop's
    RunsStopped could not name the number (`signal.Signals(0)`), so the event loop logged
    a ValueError in its callback, the run ran to its end, and run_jobs raised that
    ValueError instead of returning. It is refused where it is made now, nothing stopped."""
    stopper = Stopper()
    with pytest.raises(ValueError) as caught:
        stopper.stop(number)
    assert str(caught.value) == (
        f"Stopper.stop: {number} is not a signal's number; give one (signal.SIGTERM, the default,"
        " or signal.SIGINT): RunsStopped names it and the command line exits 128 plus it"
    )
    assert stopper.stopped is None
    started = threading.Event()
    stopper.stop(signal.SIGINT)  # the stopper still works
    with RunLogWriter(tmp_path / "log") as log, pytest.raises(RunsStopped) as stopped:
        run_jobs(log, [Job(workflow=_slow_workflow(started), run="r")], grace=0.0, stopper=stopper)
    assert stopped.value.signal == signal.SIGINT


# --------------------------------------------------------------------------
# The caller's own handlers come back
# --------------------------------------------------------------------------


def _callers_handler(number: int, frame: FrameType | None) -> None:
    raise AssertionError(f"the caller's handler ran for signal {number}")


def test_run_jobs_stopped_by_sigterm_gives_the_callers_handlers_back(tmp_path: Path) -> None:
    """SIGINT and SIGTERM are the caller's again once a run_jobs that a SIGTERM stopped has
    returned, not the defaults (which would kill the caller at its next SIGTERM)."""

    async def terminate(control: RunControl) -> None:
        while not running("sleep")(records(tmp_path)):
            await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    before = {n: signal.signal(n, _callers_handler) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        with RunLogWriter(tmp_path / LOG) as writer, pytest.raises(RunsStopped) as stopped:
            run_jobs(
                writer, [Job(workflow=SLEEPER, run=RUN, supervise=terminate)], stop_on_signals=True, grace=0.0
            )
        after = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert stopped.value.signal == signal.SIGTERM
    assert after == {signal.SIGINT: _callers_handler, signal.SIGTERM: _callers_handler}


def test_run_jobs_leaves_an_ignored_sigint_ignored(tmp_path: Path) -> None:
    """A process started with SIGINT ignored (a shell's background job) still ignores it
    after run_jobs, rather than being interrupted by it."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with RunLogWriter(tmp_path / LOG) as writer:
            [report] = run_jobs(writer, [Job(workflow=WAKES, run=RUN)], stop_on_signals=True)
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    assert report.status == "succeeded"
    assert after == signal.SIG_IGN
