"""The replayer: folds a run log through the kernel and reports by line.

It proves a recorded log obeys the kernel (spec §5): every attempt change is
fed through `transition` and must give the recorded ``to``; the recorded
from-state must be the one the replayer tracked; nothing follows a terminal
state; every intent change obeys `intent_transition` and belongs to a
`Running` attempt; every ``Cancel``'s ``intent_dispatched`` must equal what
the log's own intent records say at that point; sequence numbers go up by
one; a run starts at most once and nothing of it follows its run_finished.
After a violation the replayer adopts what the record says, so one bad
record gives one violation, not a cascade.

It streams: memory holds the attempts of runs that have not finished, not the
log. It never writes to the log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from typing_extensions import assert_never, final

from ._attempt import (
    ALL_STATES,
    PENDING,
    AttemptState,
    Cancel,
    Pending,
    Failed,
    IllegalTransition,
    Indeterminate,
    Running,
    TimedOut,
    is_terminal,
    transition,
)
from ._intent import (
    PLANNED,
    IllegalIntentTransition,
    IntentState,
    intent_dispatched,
    intent_transition,
    is_outstanding,
)
from ._runlog import (
    AttemptCreated,
    AttemptTransitioned,
    CorruptLine,
    IntentChanged,
    IntentPlanned,
    LogItem,
    Record,
    RunFinished,
    RunStarted,
    StepResult,
    TornTail,
    read_log,
    state_name,
)

MAX_VIOLATIONS_KEPT: Final = 1000
"""Violations beyond this many are counted, not kept (a garbage file has one per line)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """A line of the log that breaks a rule, and which rule."""

    line: int
    reason: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAttempt:
    """An attempt that ended with intents outstanding: reconcile these keys."""

    run: str
    step: str
    attempt: int
    state: str
    line: int
    outstanding: tuple[str, ...]
    """Idempotency keys of the intents still ``Dispatched`` when it ended."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayReport:
    """What a replay found. ``valid`` is true when there is no violation.

    A torn tail is not a violation: it is the unacknowledged record a crash
    cut short; every complete record before it was checked.
    """

    records: int
    final_states: dict[str, int]
    indeterminate: tuple[OpenAttempt, ...]
    to_reconcile: tuple[OpenAttempt, ...]
    unresolved_intents: int
    violations: tuple[Violation, ...]
    violation_count: int
    torn_tail: TornTail | None

    @property
    def valid(self) -> bool:
        """True when every complete record obeys the kernel."""
        return self.violation_count == 0


@dataclass(slots=True)
class AttemptTrack:
    """The replayer's view of one attempt (mutable; internal to replay and recovery)."""

    number: int
    state: AttemptState
    intents: dict[str, IntentState] = field(default_factory=dict)
    result_line: int = 0


@dataclass(slots=True)
class StepTrack:
    """The latest attempt of a step, and the idempotency keys of its intents."""

    latest: AttemptTrack
    keys: dict[str, str] = field(default_factory=dict)


@final
class Replayer:
    """Feed it log items in order; ask for the report at the end.

    ``runs`` holds the live view (run -> step -> `StepTrack`) of every run
    that has not finished; recovery reads it to find orphaned attempts.
    """

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, StepTrack]] = {}
        self.workflows: dict[str, str] = {}  # workflow name of each live run that says it
        self.finished: set[str] = set()
        self.last_seq = 0
        self._expect_seq: int | None = 1
        self._records = 0
        self._items = 0
        # Keyed by state class: hashing a dataclass instance runs Python code.
        self._counts: dict[type, int] = {type(s): 0 for s in ALL_STATES}
        self._indeterminate: list[OpenAttempt] = []
        self._to_reconcile: list[OpenAttempt] = []
        self._unresolved = 0
        self._violations: list[Violation] = []
        self._violation_count = 0
        self._torn: TornTail | None = None

    # ------------------------------------------------------------ reporting

    def _violate(self, line: int, reason: str) -> None:
        self._violation_count += 1
        if len(self._violations) < MAX_VIOLATIONS_KEPT:
            self._violations.append(Violation(line=line, reason=reason))

    def report(self) -> ReplayReport:
        """The report for everything fed so far."""
        violations = list(self._violations)
        count = self._violation_count
        if self._items == 0:
            violations.append(Violation(line=1, reason="the log is empty: no records"))
            count += 1
        return ReplayReport(
            records=self._records,
            final_states={state_name(s): self._counts[type(s)] for s in ALL_STATES},
            indeterminate=tuple(self._indeterminate),
            to_reconcile=tuple(self._to_reconcile),
            unresolved_intents=self._unresolved,
            violations=tuple(violations),
            violation_count=count,
            torn_tail=self._torn,
        )

    # ------------------------------------------------------------ feeding

    def feed(self, item: LogItem) -> None:
        """Check one item of the log against the kernel and update the view."""
        self._items += 1
        match item:
            case Record():
                self._records += 1
                self._record(item)
            case CorruptLine():
                self._violate(item.line, f"corrupt line: {item.reason}")
                self._expect_seq = None  # its seq is unknown; resume at the next record
            case TornTail():
                self._torn = item
            case _:
                assert_never(item)

    def _record(self, rec: Record) -> None:
        if self._expect_seq is not None and rec.seq != self._expect_seq:
            kind = "a gap" if rec.seq > self._expect_seq else "a repeat"
            self._violate(
                rec.line,
                f"sequence number {rec.seq} where {self._expect_seq} was expected ({kind})",
            )
        self._expect_seq = rec.seq + 1
        self.last_seq = rec.seq
        if rec.run in self.finished:
            self._violate(rec.line, f"record for run {rec.run!r} after the run finished")
            return
        change = rec.change
        match change:
            case RunStarted():
                if rec.run in self.workflows or rec.run in self.runs:
                    self._violate(rec.line, f"run {rec.run!r} started twice (or after its records)")
                self.workflows[rec.run] = change.workflow
            case AttemptCreated():
                self._created(rec, change)
            case AttemptTransitioned():
                self._transitioned(rec, change)
            case IntentPlanned():
                self._planned(rec, change)
            case IntentChanged():
                self._intent_changed(rec, change)
            case StepResult():
                attempt = self._live_attempt(rec, change.step, change.attempt, "a step result")
                if attempt is not None:
                    attempt.result_line = rec.line
            case RunFinished():
                self._run_finished(rec)
            case _:
                assert_never(change)

    def _created(self, rec: Record, change: AttemptCreated) -> None:
        steps = self.runs.setdefault(rec.run, {})
        where = f"step {change.step!r} of run {rec.run!r}"
        track = steps.get(change.step)
        if track is None:
            if change.attempt != 1:
                self._violate(rec.line, f"attempt {change.attempt} of {where} created before attempt 1")
            steps[change.step] = StepTrack(latest=AttemptTrack(number=change.attempt, state=PENDING))
        else:
            previous = track.latest
            if not is_terminal(previous.state):
                self._violate(
                    rec.line,
                    f"attempt {change.attempt} of {where} created while attempt"
                    f" {previous.number} is still {state_name(previous.state)}",
                )
            elif change.attempt != previous.number + 1:
                self._violate(
                    rec.line,
                    f"attempt {change.attempt} of {where} created after attempt"
                    f" {previous.number} (expected {previous.number + 1})",
                )
            track.latest = AttemptTrack(number=change.attempt, state=PENDING)
        self._counts[Pending] += 1

    def _attempt(self, rec: Record, step: str, number: int) -> AttemptTrack | None:
        track = self.runs.get(rec.run, {}).get(step)
        if track is None or track.latest.number != number:
            latest = "none" if track is None else str(track.latest.number)
            self._violate(
                rec.line,
                f"attempt {number} of step {step!r} of run {rec.run!r} was never created"
                f" or is not the step's latest attempt (latest: {latest})",
            )
            return None
        return track.latest

    def _live_attempt(
        self, rec: Record, step: str, number: int, what: str
    ) -> AttemptTrack | None:
        attempt = self._attempt(rec, step, number)
        if attempt is None:
            return None
        if not isinstance(attempt.state, Running):
            self._violate(
                rec.line,
                f"{what} for attempt {number} of step {step!r}, which is"
                f" {state_name(attempt.state)}; only a Running attempt has them",
            )
            return None
        return attempt

    def _transitioned(self, rec: Record, change: AttemptTransitioned) -> None:
        attempt = self._attempt(rec, change.step, change.attempt)
        if attempt is None:
            return
        # States carry no data: same class, same state (and no Python __eq__).
        if type(attempt.state) is not type(change.from_state):
            recorded = f"{state_name(change.from_state)} -> {state_name(change.to_state)}"
            self._violate(
                rec.line,
                f"transition {recorded} of attempt {change.attempt} of step {change.step!r}"
                f" starts from {state_name(change.from_state)}, but the attempt is"
                f" {state_name(attempt.state)}",
            )
        else:
            try:
                expected = transition(change.from_state, change.cause)
            except IllegalTransition as error:
                self._violate(rec.line, str(error))
            else:
                if type(expected) is not type(change.to_state):
                    self._violate(
                        rec.line,
                        f"{change.cause!r} from {state_name(change.from_state)} goes to"
                        f" {state_name(expected)}, but the record says"
                        f" {state_name(change.to_state)}",
                    )
            if isinstance(change.cause, Cancel):
                self._check_cancel(rec, change.cause, attempt)
        self._move(rec, change.step, attempt, change.to_state)

    def _check_cancel(self, rec: Record, cause: Cancel, attempt: AttemptTrack) -> None:
        # spec §3: intent_dispatched is true exactly when an intent is outstanding
        actual = intent_dispatched(attempt.intents.values())
        if cause.intent_dispatched == actual:
            return
        if actual:
            names = ", ".join(n for n, s in attempt.intents.items() if is_outstanding(s))
            self._violate(
                rec.line,
                f"Cancel(intent_dispatched=False) while intent {names} is outstanding"
                " (Dispatched, unresolved): the attempt must end Indeterminate",
            )
        else:
            self._violate(
                rec.line,
                "Cancel(intent_dispatched=True) but no intent of the attempt is"
                " outstanding: it must end Cancelled, not Indeterminate",
            )

    def _move(self, rec: Record, step: str, attempt: AttemptTrack, to: AttemptState) -> None:
        self._counts[type(attempt.state)] -= 1
        self._counts[type(to)] += 1
        attempt.state = to
        if not isinstance(to, (Indeterminate, Failed, TimedOut)):
            return
        keys = self.runs[rec.run][step].keys
        outstanding = tuple(keys[n] for n, s in attempt.intents.items() if is_outstanding(s))
        if isinstance(to, Indeterminate) or outstanding:
            entry = OpenAttempt(
                run=rec.run,
                step=step,
                attempt=attempt.number,
                state=state_name(to),
                line=rec.line,
                outstanding=outstanding,
            )
            (self._indeterminate if isinstance(to, Indeterminate) else self._to_reconcile).append(entry)

    def _planned(self, rec: Record, change: IntentPlanned) -> None:
        attempt = self._live_attempt(rec, change.step, change.attempt, f"intent {change.name!r}")
        if attempt is None:
            return
        if change.name in attempt.intents:
            self._violate(rec.line, f"intent {change.name!r} planned twice in one attempt")
            return
        keys = self.runs[rec.run][change.step].keys
        known = keys.setdefault(change.name, change.key)
        if known != change.key:
            self._violate(
                rec.line,
                f"intent {change.name!r} of step {change.step!r} changed its idempotency key"
                f" between attempts ({known!r}, now {change.key!r}); keys must be stable",
            )
            keys[change.name] = change.key
        attempt.intents[change.name] = PLANNED

    def _intent_changed(self, rec: Record, change: IntentChanged) -> None:
        attempt = self._live_attempt(rec, change.step, change.attempt, f"intent {change.name!r}")
        if attempt is None:
            return
        current = attempt.intents.get(change.name)
        if current is None:
            self._violate(rec.line, f"intent {change.name!r} changes before it was planned")
            return
        if type(current) is not type(change.from_state):
            self._violate(
                rec.line,
                f"intent {change.name!r} change starts from {change.from_state!r},"
                f" but the intent is {current!r}",
            )
        else:
            try:
                expected = intent_transition(current, change.cause)
            except IllegalIntentTransition as error:
                self._violate(rec.line, str(error))
            else:
                if type(expected) is not type(change.to_state):
                    self._violate(
                        rec.line,
                        f"{change.cause!r} from {current!r} goes to {expected!r},"
                        f" but the record says {change.to_state!r}",
                    )
        self._unresolved += is_outstanding(change.to_state) - is_outstanding(current)
        attempt.intents[change.name] = change.to_state

    def _run_finished(self, rec: Record) -> None:
        self.workflows.pop(rec.run, None)
        for step, track in self.runs.pop(rec.run, {}).items():
            if not is_terminal(track.latest.state):
                self._violate(
                    rec.line,
                    f"run {rec.run!r} finished while attempt {track.latest.number} of step"
                    f" {step!r} is still {state_name(track.latest.state)}",
                )
        self.finished.add(rec.run)


def replay_items(items: Iterable[LogItem]) -> ReplayReport:
    """Replay log items already read (or built in memory)."""
    replayer = Replayer()
    for item in items:
        replayer.feed(item)
    return replayer.report()


def replay(path: str | os.PathLike[str]) -> ReplayReport:
    """Replay the run log at ``path``. Raises `LogOpenError` if it cannot be opened."""
    return replay_items(read_log(path))
