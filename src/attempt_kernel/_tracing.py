"""OpenTelemetry spans built from the records a run writes: an observer, nothing more.

`Spans` is a `RunObserver` (see `_observe`): it is told of every record an
executor wrote, in log order, and turns them into one span tree per run::

    run <workflow>
      step <step>
        attempt <step>#<n>
          effect <intent>

Every span is built from records alone: its start and end are the
``time_us`` of the records that open and close it (never a clock read
here), and its parent is set explicitly, never taken from the caller's
current context. So a run's spans say what its log says, whichever process
or worker wrote it, and nothing here can change what a run does.

This module must not import ``opentelemetry`` at import time: the package
imports it, and the ``otel`` extra is optional. The import happens when a
`Spans` is made. The state kept is small and per run: the open spans and,
for the run's status, each step's last attempt state and outstanding keys;
how a run ended is then asked of the ledger's own rule (`run_status`,
`code_run_status`), never decided here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Literal

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import (
    AttemptState,
    Cancelled,
    Failed,
    Indeterminate,
    Pending,
    Running,
    Succeeded,
    TimedOut,
    is_terminal,
)
from ._codec import intent_state_name, state_name
from ._intent import Abandoned, Confirmed, Dispatched, IntentState, Planned, Rejected, is_outstanding
from ._ledger import RunStatus, code_run_status, has_succeeded, run_status
from ._observe import LOGGER
from ._records import (
    AttemptCreated,
    AttemptTransitioned,
    Change,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    WaitEnded,
    WaitStarted,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

_Verdict: TypeAlias = Literal["ok", "error", "unset"]
"""What a span's status says, before it is an OpenTelemetry `Status`."""

RUN: Final = "attempt_kernel.run"
WORKFLOW: Final = "attempt_kernel.workflow"
RUN_STATUS: Final = "attempt_kernel.run.status"
RESUMED: Final = "attempt_kernel.run.resumed"
STEP: Final = "attempt_kernel.step"
ATTEMPT: Final = "attempt_kernel.attempt"
ATTEMPT_STATE: Final = "attempt_kernel.attempt.state"
INTENT: Final = "attempt_kernel.intent"
INTENT_STATE: Final = "attempt_kernel.intent.state"
KEY: Final = "attempt_kernel.idempotency_key"

_MISSING_OTEL: Final = (
    "attempt_kernel.Spans needs the OpenTelemetry API: install attempt-kernel[otel]"
    " (or opentelemetry-api>=1.20)"
)


def attempt_verdict(state: AttemptState) -> _Verdict:
    """An ended attempt's span status: OK only for Succeeded.

    Failed, TimedOut and Indeterminate are errors (Indeterminate needs a
    person). A Cancelled attempt was stopped from outside, by a decision
    recorded in the log: not the step's failure, so its status stays unset.
    """
    match state:
        case Succeeded():
            return "ok"
        case Failed() | TimedOut() | Indeterminate():
            return "error"
        case Cancelled() | Pending() | Running():
            return "unset"
        case _:
            assert_never(state)


def intent_verdict(state: IntentState) -> _Verdict:
    """An effect span's status: OK when Confirmed, an error when Rejected, else unset
    (Abandoned was never sent; Dispatched is not known yet)."""
    match state:
        case Confirmed():
            return "ok"
        case Rejected():
            return "error"
        case Planned() | Dispatched() | Abandoned():
            return "unset"
        case _:
            assert_never(state)


def run_verdict(status: RunStatus) -> _Verdict:
    """A run span's status, from how the run ended."""
    match status:
        case "succeeded":
            return "ok"
        case "failed" | "needs-reconciliation":
            return "error"
        case "cancelled" | "interrupted" | "waiting":
            return "unset"  # a cancel is a decision; the other two are unfinished
        case _:
            assert_never(status)


def ends_effect(state: IntentState) -> bool:
    """Does an intent's move into ``state`` close its effect span?"""
    match state:
        case Confirmed() | Rejected() | Abandoned():
            return True
        case Planned() | Dispatched():
            return False
        case _:
            assert_never(state)


# Mutable, owned by one `Spans` only (like the ledger's views).


@final
@dataclass(slots=True)
class _Effect:
    key: str
    state: IntentState
    span: Span | None = None
    """Open from its Dispatch until its outcome or its attempt's end."""


@final
@dataclass(slots=True)
class _Attempt:
    span: Span
    context: Context
    effects: dict[str, _Effect] = field(default_factory=dict[str, _Effect])
    error: str | None = None
    """What its step raised (`StepResult`), for the span status's description."""


@final
@dataclass(slots=True)
class _Step:
    span: Span
    context: Context
    attempts: dict[int, _Attempt] = field(default_factory=dict[int, _Attempt])
    last_state: AttemptState | None = None
    last_end_us: int | None = None
    outstanding: set[str] = field(default_factory=set[str])
    """Idempotency keys dispatched by its attempts with no outcome recorded."""


@final
@dataclass(slots=True)
class _Run:
    span: Span
    context: Context
    started_here: bool
    """RunStarted was seen here: every step is known, so the status can be derived."""
    code: bool = False
    cancelled: bool = False
    stopping: bool = False
    steps: dict[str, _Step] = field(default_factory=dict[str, _Step])
    ended_steps: dict[str, _Step] = field(default_factory=dict[str, _Step])
    """Steps whose span has ended (a success); kept for the run's status."""


def _ns(time_us: int) -> int:
    return time_us * 1000


@final
class Spans:
    """A `RunObserver` that makes OpenTelemetry spans of the records runs write.

    ``tracer``: where the spans go (default: ``trace.get_tracer("attempt_kernel")``
    of the global tracer provider). Pass it to ``Executor(observers=[...])``
    or ``Worker(observers=[...])``; docs/tracing.md describes the tree and
    its attributes. Needs the ``otel`` extra (``attempt-kernel[otel]``).
    """

    __slots__ = ("_root", "_runs", "_status", "_trace", "_tracer")

    def __init__(self, tracer: Tracer | None = None) -> None:
        try:
            from opentelemetry import context, trace
        except ImportError as error:  # the extra is optional (module doc)
            raise ImportError(_MISSING_OTEL) from error
        self._trace: Final = trace
        self._status: Final = trace.Status
        self._root: Final = context.Context
        self._tracer: Final[Tracer] = trace.get_tracer("attempt_kernel") if tracer is None else tracer
        self._runs: Final[dict[str, _Run]] = {}

    # ------------------------------------------------------------ building blocks

    def _start(
        self, name: str, parent: Context | None, time_us: int, attributes: dict[str, str | int | bool]
    ) -> tuple[Span, Context]:
        if parent is None:
            parent = self._root()  # a run is the root of its own trace (module doc)
        span = self._tracer.start_span(name, context=parent, attributes=attributes, start_time=_ns(time_us))
        return span, self._trace.set_span_in_context(span)

    def _set_verdict(self, span: Span, verdict: _Verdict, description: str | None = None) -> None:
        match verdict:
            case "ok":
                span.set_status(self._status(self._trace.StatusCode.OK))
            case "error":
                span.set_status(self._status(self._trace.StatusCode.ERROR, description))
            case "unset":
                pass
            case _:
                assert_never(verdict)

    def _end(self, span: Span, time_us: int) -> None:
        """End ``span`` at ``time_us``. The SDK hands the end to each span processor in
        turn, and one that raises makes ``end`` raise: that is logged here, so that the
        run's other spans still end and its state is still let go (the failure of one
        processor never leaves spans open, nor a run held in memory for ever)."""
        try:
            span.end(end_time=_ns(time_us))
        except Exception:  # a broken processor; an observer never stops a run (_observe)
            LOGGER.exception("a span processor failed at the end of a span; the run's other spans still end")

    def _end_effect(self, effect: _Effect, time_us: int) -> None:
        span = effect.span
        if span is None:
            return
        effect.span = None
        span.set_attribute(INTENT_STATE, intent_state_name(effect.state))
        self._set_verdict(span, intent_verdict(effect.state))
        self._end(span, time_us)

    def _end_step(self, step: _Step, time_us: int) -> None:
        for attempt in step.attempts.values():  # live at the run's end: none in a valid log
            for effect in attempt.effects.values():
                self._end_effect(effect, time_us)
            self._end(attempt.span, time_us)
        step.attempts.clear()
        if step.last_state is not None:
            step.span.set_attribute(ATTEMPT_STATE, state_name(step.last_state))
            self._set_verdict(step.span, attempt_verdict(step.last_state))
        self._end(step.span, time_us if step.last_end_us is None else step.last_end_us)

    def _end_run(self, run: str, state: _Run, time_us: int, status: RunStatus | None) -> None:
        for step in state.steps.values():
            self._end_step(step, time_us)
        if status is not None:
            state.span.set_attribute(RUN_STATUS, status)
            self._set_verdict(state.span, run_verdict(status))
        self._end(state.span, time_us)
        del self._runs[run]

    def _status_of(self, state: _Run, finished: RunFinished | None) -> RunStatus | None:
        if not state.started_here:
            return None  # steps before the resume were never seen here (docs/tracing.md)
        if finished is None:
            return "interrupted"
        steps = [
            (step.last_state, tuple(sorted(step.outstanding)))
            for step in (*state.ended_steps.values(), *state.steps.values())
        ]
        if state.code:
            return code_run_status(steps, state.cancelled, finished.error is not None)
        return run_status(steps, state.cancelled)

    # ------------------------------------------------------------ the observer

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        """Start or end the spans that ``change`` of ``run`` opens or closes, at ``time_us`` (microseconds).

        A record of a run this observer did not see start or resume is ignored.
        """
        state = self._runs.get(run)
        match change:
            case RunStarted():
                span, context = self._start(
                    f"run {change.workflow}", None, time_us, {RUN: run, WORKFLOW: change.workflow}
                )
                self._runs[run] = _Run(span=span, context=context, started_here=True, code=change.code)
            case RunResumed():
                if state is None:  # taken up in this process: a new run span (docs/tracing.md)
                    span, context = self._start("run resumed", None, time_us, {RUN: run, RESUMED: True})
                    self._runs[run] = _Run(span=span, context=context, started_here=False)
            case RunCancelRequested():
                if state is not None:
                    state.cancelled = True
            case RunStopRequested():
                if state is not None:
                    state.stopping = True
                    self._close_if_stopped(run, state, time_us)
            case AttemptCreated():
                if state is not None:
                    self._attempt_created(run, state, change, time_us)
            case AttemptTransitioned():
                if state is not None:
                    self._attempt_moved(run, state, change, time_us)
            case IntentPlanned():
                attempt = self._attempt(state, change.step, change.attempt)
                if attempt is not None:
                    attempt.effects[change.name] = _Effect(key=change.key, state=Planned())
            case IntentChanged():
                if state is not None:
                    self._intent_moved(run, state, change, time_us)
            case IntentReconciled():
                if state is not None:
                    self._intent_reconciled(state, change, time_us)
            case StepResult():
                attempt = self._attempt(state, change.step, change.attempt)
                if attempt is not None:
                    attempt.error = change.error
            case RunFinished():
                if state is not None:
                    self._end_run(run, state, time_us, self._status_of(state, change))
            case StepCalled() | WaitStarted() | WaitEnded() | SignalSent() | DomainStateSet():
                pass  # no span opens or closes on these
            case _:
                assert_never(change)

    def run_released(self, run: str, status: Literal["waiting", "interrupted"], time_us: int) -> None:
        """End the spans of ``run``, which the executor no longer drives though it has not
        finished (`ReleaseObserver`): let go while it waits, or cut off by its log. Its run
        span ends at ``time_us`` with that ``status`` (none for a run resumed here: its
        steps before the resume were never seen); whoever takes the run up next opens a
        ``run resumed`` span."""
        state = self._runs.get(run)
        if state is not None:
            self._end_run(run, state, time_us, status if state.started_here else None)

    def _attempt(self, state: _Run | None, step: str, number: int) -> _Attempt | None:
        """The open attempt's spans, or None (a run or attempt not opened here)."""
        if state is None:
            return None
        found = state.steps.get(step)
        return None if found is None else found.attempts.get(number)

    def _attempt_created(self, run: str, state: _Run, change: AttemptCreated, time_us: int) -> None:
        step = state.steps.get(change.step)
        if step is None:
            span, context = self._start(
                f"step {change.step}", state.context, time_us, {RUN: run, STEP: change.step}
            )
            step = state.steps[change.step] = _Step(span=span, context=context)
            state.ended_steps.pop(change.step, None)
        span, context = self._start(
            f"attempt {change.step}#{change.attempt}",
            step.context,
            time_us,
            {RUN: run, STEP: change.step, ATTEMPT: change.attempt},
        )
        step.attempts[change.attempt] = _Attempt(span=span, context=context)

    def _attempt_moved(self, run: str, state: _Run, change: AttemptTransitioned, time_us: int) -> None:
        step = state.steps.get(change.step)
        if step is None or not is_terminal(change.to_state):
            return
        attempt = step.attempts.pop(change.attempt, None)
        step.last_state, step.last_end_us = change.to_state, time_us
        if attempt is not None:
            for effect in attempt.effects.values():  # still Dispatched: the attempt's end closes it
                self._end_effect(effect, time_us)
            attempt.span.set_attribute(ATTEMPT_STATE, state_name(change.to_state))
            self._set_verdict(attempt.span, attempt_verdict(change.to_state), attempt.error)
            self._end(attempt.span, time_us)
        if has_succeeded(change.to_state):
            # No attempt follows a success: the step span ends here. Any other
            # end may be followed by a retry, so its span stays open until the
            # next attempt or the run's end (then it ends at this time).
            self._end_step(step, time_us)
            state.ended_steps[change.step] = state.steps.pop(change.step)
        self._close_if_stopped(run, state, time_us)

    def _close_if_stopped(self, run: str, state: _Run, time_us: int) -> None:
        """A stopped run writes no RunFinished: its spans end when its last live attempt does."""
        if state.stopping and not any(step.attempts for step in state.steps.values()):
            self._end_run(run, state, time_us, self._status_of(state, None))

    def _intent_moved(self, run: str, state: _Run, change: IntentChanged, time_us: int) -> None:
        step = state.steps.get(change.step)
        attempt = None if step is None else step.attempts.get(change.attempt)
        if step is None or attempt is None:
            return
        effect = attempt.effects.get(change.name)
        if effect is None:
            return
        effect.state = change.to_state
        if is_outstanding(change.to_state):
            step.outstanding.add(effect.key)
            effect.span, _ = self._start(
                f"effect {change.name}",
                attempt.context,
                time_us,
                {RUN: run, STEP: change.step, ATTEMPT: change.attempt, INTENT: change.name, KEY: effect.key},
            )
        elif ends_effect(change.to_state):
            step.outstanding.discard(effect.key)
            self._end_effect(effect, time_us)

    def _intent_reconciled(self, state: _Run, change: IntentReconciled, time_us: int) -> None:
        step = state.steps.get(change.step) or state.ended_steps.get(change.step)
        if step is None:
            return
        if ends_effect(change.to_state):
            step.outstanding.discard(change.key)
        attempt = step.attempts.get(change.attempt)
        effect = None if attempt is None else attempt.effects.get(change.name)
        if effect is not None:
            effect.state = change.to_state
            self._end_effect(effect, time_us)
