"""Crash points x reconciliation answers x retry policies, against a downstream that dedupes nothing.

A two-step workflow (``charge`` then ``receipt``, one effect each) runs in
this process against a fake downstream service that counts every call per
idempotency key and deduplicates nothing. A crash is simulated by a journal
that dies like the process after its N-th append (that append and every
later one write nothing, and a `BaseException` unwinds the run), as
``tests/test_defects.py`` does. Between phases the log is recovered and the
run resumed (with a crash point of its own), and outstanding intents are
answered by the step's reconcilers, by an operator through the Python API
(the `IntentReconciled` record the CLI writes) or through the CLI.

Checked for every example, from the log and the downstream's own counts:
an effect whose intent was Confirmed is never called again; a key is sent
again only after a Rejected record for it, or when the step declares its
effects idempotent; no attempt starts while an intent of its step is
outstanding unless the step declares idempotent effects; the log replays
clean after every crash, recovery and reconciliation; a cancelled run is
never resumed and nothing is sent after its cancel; and the run ends.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attempt_kernel import (
    JSON,
    AttemptCreated,
    Change,
    Confirm,
    Confirmed,
    Dispatched,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectRejected,
    EffectUnknown,
    IntentChanged,
    IntentReconciled,
    Job,
    LogItem,
    Record,
    Reject,
    Rejected,
    RetryPolicy,
    RunCancelRequested,
    RunControl,
    RunFinished,
    RunLogWriter,
    RunResumed,
    RunStarted,
    Step,
    StepContext,
    Workflow,
    idempotency_key,
    load_workflow,
    read_log,
    recover,
    replay,
    run_jobs,
)
from attempt_kernel.cli._main import main as cli_main
from logs import key_in, nonce_in

RUN = "order-1"
EFFECTS = {"charge": "charge-card", "receipt": "email"}


def keys(path: Path) -> dict[str, tuple[str, str]]:
    """(step, effect) by idempotency key in the run of the log at ``path`` (keys carry the
    run's random part, from its start record)."""
    return {key_in(path, RUN, step, name): (step, name) for step, name in EFFECTS.items()}

# What the downstream does with each call, in order (then "ok"):
BEHAVIOURS = [
    "ok",  # happens, the reply comes back
    "rejected",  # does not happen, and says so (EffectRejected)
    "lost-reply",  # happens, the reply is lost (an ambiguous error)
    "lost-request",  # does not happen, the caller sees an ambiguous error
    "step-fails",  # happens and replies, then the step itself raises
    "cancel",  # happens; meanwhile the run is cancelled (RunControl.cancel())
]
# The answers to each question about an outstanding key, in order (then the truth):
ANSWERS = ["confirmed", "rejected", "unknown"]
# Who answers: the step's reconcilers (asked by recovery), an operator through
# the Python API, an operator through the CLI.
ANSWERERS = ["reconciler", "operator-api", "operator-cli"]
# initial_interval=0: these tests are about which attempts run, not when (the
# waits are tested in test_retry_backoff.py)
POLICIES = [
    RetryPolicy(initial_interval=0, max_attempts=1),
    RetryPolicy(initial_interval=0, max_attempts=3),
    RetryPolicy(initial_interval=0, max_attempts=1, effects_idempotent=True),
    RetryPolicy(initial_interval=0, max_attempts=3, effects_idempotent=True),
]
# Appends that succeed before the process dies, per phase (None: no crash).
CRASH_POINTS = [None, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 24]
ROUNDS = 12
"""Recover-and-reconcile rounds after which a run that has not ended is a failure."""


class Crash(BaseException):
    """The simulated process dies here."""


@dataclass
class Tape:
    """The sequence number of the last record that reached the log."""

    last: int = 0


class DyingJournal:
    """A journal that dies after ``appends`` more appends: from then on nothing is written."""

    def __init__(self, writer: RunLogWriter, tape: Tape, appends: int | None) -> None:
        self.writer = writer
        self.tape = tape
        self.left = appends
        self.dead = False

    def read(self) -> Iterator[LogItem]:
        return self.writer.read()

    def append(self, run: str, change: Change) -> int:
        if self.dead or self.left == 0:
            self.dead = True
            raise Crash("the process dies here")
        seq = self.writer.append(run, change)
        self.tape.last = seq
        if self.left is not None:
            self.left -= 1
        return seq

    def flush(self) -> None:
        if not self.dead:
            self.writer.flush()


@dataclass
class Downstream:
    """A service that counts every call per key and deduplicates nothing."""

    tape: Tape
    behaviours: list[str]
    answers: list[str]
    calls: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])
    """(key, sequence number of the last record in the log when the call came)."""
    happened: dict[str, bool] = field(default_factory=dict[str, bool])
    """Whether the latest call under each key took effect (the truth)."""
    control: RunControl | None = None
    fail_step: bool = False

    async def call(self, key: str) -> JSON:
        self.calls.append((key, self.tape.last))
        behaviour = self.behaviours.pop(0) if self.behaviours else "ok"
        self.happened[key] = behaviour not in ("rejected", "lost-request")
        if behaviour == "rejected":
            raise EffectRejected("declined")
        if behaviour in ("lost-reply", "lost-request"):
            raise RuntimeError("connection reset")
        if behaviour == "step-fails":
            self.fail_step = True
        if behaviour == "cancel" and self.control is not None:
            self.control.cancel()
            await asyncio.sleep(10)  # the cancel lands while the effect is in flight
        return f"done-{key}"

    def answer(self, key: str) -> str:
        """The next answer about ``key``: the sampled ones, then the truth."""
        if self.answers:
            return self.answers.pop(0)
        return "confirmed" if self.happened.get(key, False) else "rejected"

    async def reconcile(self, key: str) -> EffectFinding:
        answer = self.answer(key)
        if answer == "confirmed":
            return EffectHappened(result=f"asked-{key}")
        if answer == "rejected":
            return EffectNotHappened()
        return EffectUnknown(reason="the service does not know")

    async def supervise(self, control: RunControl) -> None:
        self.control = control


def workflow(downstream: Downstream, policy: RetryPolicy, answerer: str) -> Workflow:
    def step(name: str, effect: str, after: tuple[str, ...]) -> Step:
        async def run(ctx: StepContext) -> JSON:
            value = await ctx.effect(effect, downstream.call)
            if downstream.fail_step:
                downstream.fail_step = False
                raise RuntimeError("the step failed after its effect")
            return value

        reconcilers = {effect: downstream.reconcile} if answerer == "reconciler" else {}
        return Step(name=name, run=run, after=after, retry=policy, reconcilers=reconcilers)

    return load_workflow(
        "orders",
        [step("charge", "charge-card", ()), step("receipt", "email", ("charge",))],
    )


def phase(path: Path, tape: Tape, crash_after: int | None, body: str, downstream: Downstream, wf: Workflow) -> None:
    """One life of the process: start the run, or recover and resume it; it may die midway."""
    writer = RunLogWriter(path, cut_torn_tail=True)
    try:
        log = DyingJournal(writer, tape, crash_after)
        if body == "start":
            run_jobs(log, [Job(workflow=wf, run=RUN, supervise=downstream.supervise)])
        else:
            done = recover(log, {wf.name: wf}, reconciler_deadline=1.0)
            jobs = [
                Job(workflow=wf, run=r.run, prior=r.steps, supervise=downstream.supervise)
                for r in done.runs
            ]
            if jobs:
                run_jobs(log, jobs)
    except Crash:
        pass
    finally:
        writer.close()
    downstream.control = None
    downstream.fail_step = False  # a process that died forgets what it was doing


def records(path: Path) -> list[Record]:
    return [item for item in read_log(path) if isinstance(item, Record)]


def outstanding(path: Path) -> list[tuple[str, int, str]]:
    """(step, attempt, key) of every intent the replay reports outstanding that an operator can
    reconcile: one of its step's latest attempt, whose key no later record settled. (An
    idempotent step's next attempt supersedes an earlier attempt's outstanding intent.)"""
    report = replay(path)
    last: dict[str, tuple[int, bool]] = {}
    latest: dict[str, int] = {}
    nonce = nonce_in(path, RUN)
    for r in records(path):
        c = r.change
        if isinstance(c, (IntentChanged, IntentReconciled)):
            last[idempotency_key(r.run, c.step, c.name, nonce=nonce)] = (c.attempt, c.to_state == Dispatched())
        elif isinstance(c, AttemptCreated):
            latest[c.step] = c.attempt
    return [
        (a.step, a.attempt, key)
        for a in (*report.indeterminate, *report.to_reconcile)
        for key in a.outstanding
        if last[key] == (a.attempt, True) and latest[a.step] == a.attempt
    ]


def answer_as_operator(path: Path, downstream: Downstream, via: str) -> None:
    for step, attempt, key in outstanding(path):
        answer = downstream.answer(key)
        if answer == "unknown":
            continue  # the operator could not tell either; asks again next round
        if via == "operator-cli":
            argv = ["reconcile", str(path), "--key", key, f"--{answer}", "--note", "asked"]
            if answer == "confirmed":
                argv += ["--result", json.dumps(f"told-{key}")]
            assert cli_main(argv) == 0
            continue
        _, name = keys(path)[key]
        confirmed = answer == "confirmed"
        with RunLogWriter(path, create=False) as writer:
            writer.append(
                RUN,
                IntentReconciled(
                    step=step,
                    attempt=attempt,
                    name=name,
                    key=key,
                    from_state=Dispatched(),
                    cause=Confirm() if confirmed else Reject(),
                    to_state=Confirmed() if confirmed else Rejected(),
                    result=f"told-{key}" if confirmed else None,
                    by="operator",
                    note="asked",
                ),
            )
            writer.flush()


def ended(path: Path) -> bool:
    report = replay(path)
    return (
        RUN not in report.unfinished
        and not outstanding(path)
        and any(isinstance(r.change, RunFinished) for r in records(path))
    )


def assert_clean(path: Path, when: str) -> None:
    report = replay(path)
    assert report.valid, (when, report.violations)


def check_properties(path: Path, downstream: Downstream, policy: RetryPolicy) -> None:
    """The five properties, from the log (folded here) and the downstream's own record."""
    confirmed_at: dict[str, int] = {}
    rejected_at: dict[str, list[int]] = {key: [] for key in keys(path)}
    nonce = nonce_in(path, RUN)
    open_intents: dict[str, set[str]] = {step: set() for step in EFFECTS}
    cancelled_at: int | None = None
    for r in records(path):
        c = r.change
        if isinstance(c, (IntentChanged, IntentReconciled)):
            key = idempotency_key(r.run, c.step, c.name, nonce=nonce)
            if c.to_state == Dispatched():
                open_intents[c.step].add(c.name)
            else:
                open_intents[c.step].discard(c.name)
            if c.to_state == Confirmed():
                confirmed_at.setdefault(key, r.seq)
            if c.to_state == Rejected():
                rejected_at[key].append(r.seq)
        elif isinstance(c, AttemptCreated) and c.attempt > 1 and not policy.effects_idempotent:
            assert not open_intents[c.step], (
                f"attempt {c.attempt} of {c.step} started past outstanding {open_intents[c.step]}"
            )
        elif isinstance(c, RunCancelRequested):
            cancelled_at = r.seq if cancelled_at is None else cancelled_at
        elif isinstance(c, (RunResumed, AttemptCreated)):
            assert cancelled_at is None, f"{type(c).__name__} at {r.seq} after the cancel at {cancelled_at}"
    last_call: dict[str, int] = {}
    for key, at in downstream.calls:
        assert key not in confirmed_at or at < confirmed_at[key], (
            f"{key} called at {at}, after it was confirmed at {confirmed_at[key]}"
        )
        if key in last_call and not policy.effects_idempotent:
            before = last_call[key]
            assert any(before < seq <= at for seq in rejected_at[key]), (
                f"{key} sent again at {at} with no Rejected record since the call at {before}"
            )
        if cancelled_at is not None:
            assert at < cancelled_at, f"{key} sent at {at}, after the cancel at {cancelled_at}"
        last_call[key] = at


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    behaviours=st.lists(st.sampled_from(BEHAVIOURS), max_size=4),
    answers=st.lists(st.sampled_from(ANSWERS), max_size=4),
    answerer=st.sampled_from(ANSWERERS),
    policy=st.sampled_from(POLICIES),
    crashes=st.lists(st.sampled_from(CRASH_POINTS), min_size=1, max_size=3),
)
def test_crashes_reconciliation_and_retries_keep_every_promise(
    behaviours: list[str],
    answers: list[str],
    answerer: str,
    policy: RetryPolicy,
    crashes: list[int | None],
) -> None:
    """Whatever the crash points, answers and policy: confirmed effects are never resent, no step
    runs past an outstanding intent unless idempotent, every log replays clean, a cancelled run is
    never resumed, and recover + reconcile rounds end the run."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.jsonl"
        tape = Tape()
        downstream = Downstream(tape=tape, behaviours=list(behaviours), answers=list(answers))
        wf = workflow(downstream, policy, answerer)
        points = iter(crashes)
        phase(path, tape, next(points, None), "start", downstream, wf)
        assert_clean(path, "after the first run")
        assert any(isinstance(r.change, RunStarted) for r in records(path))
        for _ in range(ROUNDS):
            if ended(path):
                break
            operator = "operator-api" if answerer == "reconciler" else answerer
            answer_as_operator(path, downstream, operator)
            assert_clean(path, "after reconciliation")
            phase(path, tape, next(points, None), "recover", downstream, wf)
            assert_clean(path, "after recovery")
        else:
            raise AssertionError(f"the run has not ended after {ROUNDS} rounds: {replay(path)}")
        check_properties(path, downstream, policy)
