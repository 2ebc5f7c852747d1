"""One run's history, step by step, as its records tell it (``attempt-kernel show``).

This module groups a run's records and keeps them as they were written:
every attempt with its moves (from, cause, to, when), its intents with
their keys and every change to them (who reconciled what, with which
result and note), its result or error, the domain states it set, and the
run-level decisions. It decides nothing: where the run stands comes from
the ledger, and each state shown is the one a record wrote. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from typing_extensions import assert_never, final

from ._attempt import AttemptState, TransitionCause
from ._intent import PLANNED, IntentCause, IntentState
from ._ledger import Ledger, RunStanding
from ._records import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    CorruptLine,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    LogItem,
    Record,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    TornTail,
    WaitEnded,
    WaitStarted,
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Moved:
    """One transition of an attempt, as recorded."""

    time_us: int
    from_state: AttemptState
    cause: TransitionCause
    to_state: AttemptState


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentEvent:
    """One change of an intent. ``by`` is None for the executor's own changes,
    else who reconciled it (``operator``, ``reconciler``), with ``note``."""

    time_us: int
    from_state: IntentState
    cause: IntentCause
    to_state: IntentState
    result: JSON = None
    by: str | None = None
    note: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class IntentHistory:
    """An intent of an attempt: its key, its state now, every change to it."""

    name: str
    key: str
    planned_us: int
    state: IntentState
    events: tuple[IntentEvent, ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptHistory:
    """One attempt: when it was created, how it moved, what it did."""

    number: int
    created_us: int
    state: AttemptState | None
    """The state its last recorded move reached (None: it never moved, so Pending)."""
    moves: tuple[Moved, ...]
    intents: tuple[IntentHistory, ...]
    returned: bool
    """A result record says it returned ``result`` (else ``error``, if any)."""
    result: JSON
    error: str | None
    domain_states: tuple[tuple[int, str], ...]
    """(when, state) for each domain state it set."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepHistory:
    """A step of the run and all its attempts, in order."""

    name: str
    attempts: tuple[AttemptHistory, ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunEvent:
    """A run-level record: ``started``, ``cancel requested``, ``stop requested``,
    ``resumed`` or ``finished``, with its reason when it has one."""

    time_us: int
    what: str
    reason: str = ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class WaitHistory:
    """One wait of a code run: a sleep (``signal`` None) or a wait for a signal."""

    position: int
    signal: str | None
    wake_us: int | None
    """When it ends by itself (a sleep's wake time, a timeout; None: never)."""
    started_us: int
    ended_us: int | None = None
    """When it ended (None: it has not)."""
    taken: int | None = None
    """The number of the signal it took (None: it ended by its wake time, or has not ended)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalHistory:
    """One signal sent to the run, numbered in the order recorded."""

    number: int
    name: str
    payload: JSON
    sent_us: int
    taken_at: int | None = None
    """The position of the wait that took it (None: no wait has taken it)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunHistory:
    """Everything the log says about one run."""

    run: str
    workflow: str | None
    input: JSON
    standing: RunStanding
    domain_state: str | None
    events: tuple[RunEvent, ...]
    steps: tuple[StepHistory, ...]
    version: str = ""
    """The workflow's version label its start recorded ("" if none)."""
    result: JSON = None
    """What a code workflow's function returned, once its run finished."""
    waits: tuple[WaitHistory, ...] = ()
    """A code run's waits, by position."""
    signals: tuple[SignalHistory, ...] = ()
    """Signals sent to the run, in the order recorded, each with the wait that took it."""
    code: bool = False
    """Its start says it is a code workflow's run (``run_started``'s ``code``)."""
    cancel_requested: bool = False
    """Its cancel was recorded (a ``run_cancel_requested``): it ends cancelled, and a wait
    still open waits for nothing but a process to take the run up."""
    finished: bool = False
    """Its last ``run_finished`` is not followed by a ``run_resumed``. A finished run that
    stands ``interrupted`` (reconciled since it ended needing it) waits for a recovery:
    no process drives it, whoever holds the log."""


@dataclass(slots=True)
class _Intent:
    name: str
    key: str
    planned_us: int
    state: IntentState = PLANNED
    events: list[IntentEvent] = field(default_factory=list[IntentEvent])


@dataclass(slots=True)
class _Attempt:
    number: int
    created_us: int
    state: AttemptState | None = None
    moves: list[Moved] = field(default_factory=list[Moved])
    intents: dict[str, _Intent] = field(default_factory=dict[str, _Intent])
    returned: bool = False
    result: JSON = None
    error: str | None = None
    domain_states: list[tuple[int, str]] = field(default_factory=list[tuple[int, str]])


def _intent(attempt: _Attempt, name: str, key: str, when: int) -> _Intent:
    found = attempt.intents.get(name)
    if found is None:  # only in a log with violations; keep what it says
        found = attempt.intents[name] = _Intent(name=name, key=key, planned_us=when)
    return found


def _latest(steps: dict[str, list[_Attempt]], step: str) -> _Attempt | None:
    attempts = steps.get(step)
    return attempts[-1] if attempts else None


def run_history(items: Iterable[LogItem], run: str) -> RunHistory | None:
    """The history of ``run`` in a log (None if the log never mentions it).

    Reads the whole log once: the ledger is fed every item (it says where the
    run stands); the run's own records are grouped as they come.
    """
    ledger = Ledger(keep=frozenset({run}))
    events: list[RunEvent] = []
    steps: dict[str, list[_Attempt]] = {}
    workflow: str | None = None
    run_input: JSON = None
    version = ""
    code = False
    run_result: JSON = None
    waits: dict[int, WaitHistory] = {}
    signals: list[SignalHistory] = []
    for item in items:
        match item:
            case Record():
                ledger.apply(item)
            case CorruptLine():
                ledger.corrupt(item.line, item.reason)
                continue
            case TornTail():
                continue
            case _:
                assert_never(item)
        if item.run != run:
            continue
        when, change = item.time_us, item.change
        match change:
            case RunStarted():
                workflow, run_input, version, code = change.workflow, change.input, change.version, change.code
                events.append(RunEvent(time_us=when, what="started"))
            case RunCancelRequested():
                events.append(RunEvent(time_us=when, what="cancel requested", reason=change.reason))
            case RunStopRequested():
                events.append(RunEvent(time_us=when, what="stop requested", reason=change.reason))
            case RunResumed():
                events.append(RunEvent(time_us=when, what="resumed"))
            case RunFinished():
                events.append(RunEvent(time_us=when, what="finished", reason=change.error or ""))
                run_result = change.result
            case StepCalled():
                steps.setdefault(change.step, [])  # shown even before its first attempt
            case WaitStarted():
                waits[change.position] = WaitHistory(
                    position=change.position, signal=change.signal, wake_us=change.wake_us,
                    started_us=when,
                )  # fmt: skip
            case WaitEnded():
                wait = waits.get(change.position)
                if wait is not None:
                    waits[change.position] = WaitHistory(
                        position=wait.position, signal=wait.signal, wake_us=wait.wake_us,
                        started_us=wait.started_us, ended_us=when, taken=change.signal,
                    )  # fmt: skip
                number = change.signal
                if number is not None and 0 < number <= len(signals):
                    sent = signals[number - 1]
                    signals[number - 1] = SignalHistory(
                        number=sent.number, name=sent.name, payload=sent.payload,
                        sent_us=sent.sent_us, taken_at=change.position,
                    )  # fmt: skip
            case SignalSent():
                signals.append(
                    SignalHistory(
                        number=len(signals) + 1, name=change.name, payload=change.payload,
                        sent_us=when,
                    )  # fmt: skip
                )
            case AttemptCreated():
                steps.setdefault(change.step, []).append(
                    _Attempt(number=change.attempt, created_us=when)
                )
            case AttemptTransitioned():
                latest = _latest(steps, change.step)
                if latest is not None:
                    latest.moves.append(
                        Moved(
                            time_us=when,
                            from_state=change.from_state,
                            cause=change.cause,
                            to_state=change.to_state,
                        )
                    )
                    latest.state = change.to_state
            case IntentPlanned():
                latest = _latest(steps, change.step)
                if latest is not None:
                    latest.intents[change.name] = _Intent(
                        name=change.name, key=change.key, planned_us=when
                    )
            case IntentChanged():
                latest = _latest(steps, change.step)
                if latest is not None:
                    intent = _intent(latest, change.name, "", when)
                    intent.state = change.to_state
                    intent.events.append(
                        IntentEvent(
                            time_us=when,
                            from_state=change.from_state,
                            cause=change.cause,
                            to_state=change.to_state,
                            result=change.result,
                        )
                    )
            case IntentReconciled():
                attempts = steps.get(change.step, [])
                target = next((a for a in attempts if a.number == change.attempt), None)
                if target is not None:
                    intent = _intent(target, change.name, change.key, when)
                    intent.state = change.to_state
                    intent.events.append(
                        IntentEvent(
                            time_us=when,
                            from_state=change.from_state,
                            cause=change.cause,
                            to_state=change.to_state,
                            result=change.result,
                            by=change.by,
                            note=change.note,
                        )
                    )
            case StepResult():
                latest = _latest(steps, change.step)
                if latest is not None:
                    latest.returned = change.error is None
                    latest.result, latest.error = change.value, change.error
            case DomainStateSet():
                latest = _latest(steps, change.step)
                if latest is not None:
                    latest.domain_states.append((when, change.state))
            case _:
                assert_never(change)
    view = ledger.run(run)
    if view is None:
        return None
    return RunHistory(
        run=run,
        workflow=workflow,
        input=run_input,
        standing=view.standing(),
        cancel_requested=view.cancel_requested,
        finished=view.finished,
        domain_state=view.domain_state,
        version=version,
        result=run_result,
        code=code,
        events=tuple(events),
        waits=tuple(waits[p] for p in sorted(waits)),
        signals=tuple(signals),
        steps=tuple(
            StepHistory(
                name=name,
                attempts=tuple(
                    AttemptHistory(
                        number=a.number,
                        created_us=a.created_us,
                        state=a.state,
                        moves=tuple(a.moves),
                        intents=tuple(
                            IntentHistory(
                                name=i.name,
                                key=i.key,
                                planned_us=i.planned_us,
                                state=i.state,
                                events=tuple(i.events),
                            )
                            for i in a.intents.values()
                        ),
                        returned=a.returned,
                        result=a.result,
                        error=a.error,
                        domain_states=tuple(a.domain_states),
                    )
                    for a in attempts
                ),
            )
            for name, attempts in steps.items()
        ),
    )
