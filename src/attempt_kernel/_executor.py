"""The executor: runs a workflow's steps as attempts and writes the run log.

The only module that imports asyncio. Every state change goes through the
kernel (`transition`, `intent_transition`) and into the run log *before*
the executor acts on it; side effects happen only through
`StepContext.effect`, which makes the ``Dispatched`` record durable (fsync)
before it calls the effect (spec §3's write-ahead rule).

Cancellation is cooperative. Log appends are synchronous calls with no
``await`` inside, so a cancellation can never land in the middle of one: the
log never claims a state the executor has left. The flip side: a step that
blocks the event loop (a synchronous call) delays every deadline and every
cancellation until it returns. Run blocking work with
`StepContext.run_blocking`, which moves it to a thread (a thread cannot be
stopped: when the deadline passes the attempt ends `TimedOut` while the
thread finishes on its own).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeVar, Union

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import (
    Admit,
    AttemptState,
    Cancelled,
    Fail,
    Failed,
    Indeterminate,
    Pending,
    QueueDeadlinePassed,
    Running,
    StepDeadlinePassed,
    Succeed,
    Succeeded,
    TimedOut,
    TransitionCause,
    transition,
)
from ._errors import AttemptKernelError
from ._intent import (
    PLANNED,
    Confirm,
    Dispatch,
    IntentCause,
    IntentState,
    Reject,
    cancel_cause,
    idempotency_key,
    intent_transition,
    is_outstanding,
)
from ._runlog import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    Change,
    IntentChanged,
    IntentPlanned,
    RunFinished,
    RunLog,
    RunStarted,
    StepResult,
    UnencodableRecord,
    state_name,
)
from ._recovery import PriorStep
from ._workflow import Step, Workflow

T = TypeVar("T")


class EffectRejected(AttemptKernelError):
    """Raise from an effect to say it is known *not* to have happened.

    The intent is recorded `Rejected` and the exception fails the attempt.
    Any other exception from an effect leaves the outcome unknown: the intent
    stays `Dispatched` (outstanding), and the executor never guesses.
    """


@final
class StepError(AttemptKernelError):
    """A step misused its context (an intent name used twice, ...); the attempt fails."""


# --------------------------------------------------------------------------
# Bookkeeping of one attempt (mutable, private)
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Attempt:
    run: str
    step: str
    number: int
    state: AttemptState
    intents: dict[str, IntentState] = field(default_factory=dict)

    def outstanding_keys(self) -> tuple[str, ...]:
        return tuple(
            idempotency_key(self.run, self.step, name)
            for name, state in self.intents.items()
            if is_outstanding(state)
        )


# --------------------------------------------------------------------------
# Public results
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """How a step ended in a run: its last attempt's state and what it left behind."""

    step: str
    state: AttemptState | None
    """The last attempt's state, or None if the step never started."""
    attempts: int
    result: JSON = None
    error: str | None = None
    outstanding: tuple[str, ...] = ()
    """Idempotency keys of intents still outstanding: reconcile these."""


RunStatus: TypeAlias = Literal["succeeded", "failed", "cancelled", "needs-reconciliation"]
"""How a run ended. ``needs-reconciliation``: some step ended Indeterminate or
with an intent outstanding; an operator must ask the downstream systems."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """What a run did, step by step."""

    run: str
    workflow: str
    status: RunStatus
    steps: tuple[StepOutcome, ...]


@final
class RunControl:
    """Lets code outside the run cancel it at any moment (`cancel`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def cancel(self) -> None:
        """Cancel the run: no new attempt starts, live ones end Cancelled or Indeterminate."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        """True once `cancel` was called."""
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


# --------------------------------------------------------------------------
# The step context: the only door to the outside world
# --------------------------------------------------------------------------


@final
class StepContext:
    """Handed to a step's function: its identity, its inputs, and effects."""

    def __init__(self, executor: Executor, attempt: _Attempt, inputs: Mapping[str, JSON]) -> None:
        self._executor = executor
        self._attempt = attempt
        self.run: Final = attempt.run
        self.step: Final = attempt.step
        self.attempt: Final = attempt.number
        self.inputs: Final = inputs
        """Results of the steps this one runs after, by step name."""

    def idempotency_key(self, name: str) -> str:
        """The key effect ``name`` of this step carries, the same in every attempt."""
        return idempotency_key(self.run, self.step, name)

    async def effect(self, name: str, perform: Callable[[str], Awaitable[JSON]]) -> JSON:
        """Perform one external side effect, write-ahead logged as intent ``name``.

        Records the intent `Planned`, then `Dispatched` and fsyncs the log,
        and only then awaits ``perform(idempotency_key)``. If it returns, the
        intent is `Confirmed` and its value returned. If it raises
        `EffectRejected`, the intent is `Rejected` and the error propagates.
        Anything else (another exception, a deadline, a cancellation) leaves
        the intent `Dispatched`: the effect may have happened, and the run log
        says so.
        """
        attempt = self._attempt
        if name in attempt.intents:
            raise StepError(
                f"step {self.step!r} attempt {self.attempt}: intent {name!r} is used twice;"
                " give each effect of a step its own name"
            )
        ex = self._executor
        key = self.idempotency_key(name)
        ex._append(attempt.run, IntentPlanned(step=attempt.step, attempt=attempt.number, name=name, key=key))
        attempt.intents[name] = PLANNED
        ex._intent(attempt, name, Dispatch())
        ex._log.flush()  # spec §3: Dispatched is durable before the effect is sent
        try:
            value = await perform(key)
        except EffectRejected:
            ex._intent(attempt, name, Reject())
            raise
        ex._intent(attempt, name, Confirm())
        return value

    async def run_blocking(self, function: Callable[[], T]) -> T:
        """Run a blocking call in a thread so the event loop (and deadlines) go on."""
        return await asyncio.to_thread(function)


# --------------------------------------------------------------------------
# The executor
# --------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class _Ok:
    value: JSON


@final
@dataclass(frozen=True, slots=True)
class _Raised:
    error: Exception


_StepOutput: TypeAlias = Union[_Ok, _Raised]


async def _guarded(awaitable: Awaitable[JSON]) -> _StepOutput:
    # The step's own exceptions (even a TimeoutError it raises) become values,
    # so that a TimeoutError out of wait_for can only mean the step deadline.
    try:
        return _Ok(await awaitable)
    except Exception as error:  # noqa: BLE001  # a step may raise anything
        return _Raised(error)


if sys.version_info >= (3, 11):

    async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
        """Await with a deadline; TimeoutError when it passes (no extra task)."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:

    async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
        """Await with a deadline; asyncio.TimeoutError when it passes."""
        return await asyncio.wait_for(awaitable, seconds)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@final
class Executor:
    """Runs workflows as attempts under an admission limit, writing one run log.

    ``admission_limit`` bounds how many attempts run at once, across all the
    runs this executor drives; the others wait `Pending` (each up to its
    step's ``queue_deadline``). Use one executor per event loop. ``progress``, if
    given, is called with a one-line description of every state change.
    """

    def __init__(
        self,
        log: RunLog,
        *,
        admission_limit: int = 8,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        if type(admission_limit) is not int or admission_limit < 1:
            raise ValueError(f"admission_limit must be a positive integer, got {admission_limit!r}")
        self._log: Final = log
        self._limit: Final = admission_limit
        self._progress: Final = progress
        # One limit for every run this executor drives; made on first use so
        # that it belongs to the running event loop.
        self._admission: asyncio.Semaphore | None = None

    # ------------------------------------------------------------ logging

    def _append(self, run: str, change: Change) -> None:
        self._log.append(run, change)

    def _move(self, attempt: _Attempt, cause: TransitionCause) -> AttemptState:
        """Through the kernel, into the log, and only then into memory."""
        to = transition(attempt.state, cause)
        self._append(
            attempt.run,
            AttemptTransitioned(
                step=attempt.step,
                attempt=attempt.number,
                from_state=attempt.state,
                cause=cause,
                to_state=to,
            ),
        )
        if self._progress is not None:
            self._progress(
                f"{attempt.run} {attempt.step}#{attempt.number}:"
                f" {state_name(attempt.state)} -> {state_name(to)}"
            )
        attempt.state = to
        return to

    def _intent(self, attempt: _Attempt, name: str, cause: IntentCause) -> None:
        current = attempt.intents[name]
        to = intent_transition(current, cause)
        self._append(
            attempt.run,
            IntentChanged(
                step=attempt.step,
                attempt=attempt.number,
                name=name,
                from_state=current,
                cause=cause,
                to_state=to,
            ),
        )
        attempt.intents[name] = to

    def _cancel(self, attempt: _Attempt) -> None:
        # spec §2: the flag comes from the intent record, never from where the
        # cancellation was caught
        self._move(attempt, cancel_cause(attempt.intents.values()))

    # ------------------------------------------------------------ one attempt

    async def _attempt(
        self,
        attempt: _Attempt,
        step: Step,
        inputs: Mapping[str, JSON],
        admission: asyncio.Semaphore,
    ) -> tuple[TransitionCause, JSON, str | None]:
        """Run a new attempt to a terminal state; return the last cause, result, error."""
        run, number = attempt.run, attempt.number
        self._append(run, AttemptCreated(step=step.name, attempt=number))
        try:
            if admission.locked():  # a free slot is taken at once, without a timer
                await _within(step.queue_deadline, admission.acquire())
            else:
                await admission.acquire()
        except asyncio.TimeoutError:
            self._move(attempt, QueueDeadlinePassed())
            return QueueDeadlinePassed(), None, "queue deadline passed"
        except asyncio.CancelledError:
            self._cancel(attempt)
            raise
        try:
            self._move(attempt, Admit())
            context = StepContext(self, attempt, inputs)
            try:
                output = await _within(step.step_deadline, _guarded(step.run(context)))
            except asyncio.TimeoutError:
                self._move(attempt, StepDeadlinePassed())
                return StepDeadlinePassed(), None, "step deadline passed"
            except asyncio.CancelledError:
                self._cancel(attempt)
                raise
            match output:
                case _Ok():
                    try:
                        self._append(run, StepResult(step=step.name, attempt=number, value=output.value))
                    except UnencodableRecord as error:  # nothing was written
                        message = f"the step returned a value the run log cannot encode: {error}"
                        self._append(run, StepResult(step=step.name, attempt=number, error=message))
                        self._move(attempt, Fail())
                        return Fail(), None, message
                    self._move(attempt, Succeed())
                    return Succeed(), output.value, None
                case _Raised():
                    message = _describe(output.error)
                    self._append(run, StepResult(step=step.name, attempt=number, error=message))
                    self._move(attempt, Fail())
                    return Fail(), None, message
                case _:
                    assert_never(output)
        finally:
            admission.release()

    # ------------------------------------------------------------ one step

    async def _drive(
        self,
        run: str,
        step: Step,
        inputs: Mapping[str, JSON],
        admission: asyncio.Semaphore,
        prior: PriorStep | None,
        live: dict[str, _Attempt],
    ) -> StepOutcome:
        """Attempts of one step until it succeeds or must stop (retry policy).

        ``live[step.name]`` is the step's current attempt, so that a cancelled
        run can still report where each step stood.
        """
        number = prior.last_attempt if prior is not None else 0
        tries = prior.tries if prior is not None else 0
        while True:
            number += 1
            attempt = _Attempt(run=run, step=step.name, number=number, state=Pending())
            live[step.name] = attempt
            cause, value, error = await self._attempt(attempt, step, inputs, admission)
            if _counts_as_try(attempt.state, cause):
                tries += 1
            outstanding = attempt.outstanding_keys()
            if not _retry_allowed(step, attempt.state, cause, tries, outstanding):
                return StepOutcome(
                    step=step.name,
                    state=attempt.state,
                    attempts=number,
                    result=value,
                    error=error,
                    outstanding=outstanding,
                )

    # ------------------------------------------------------------ one run

    async def run(
        self,
        workflow: Workflow,
        run: str,
        *,
        control: RunControl | None = None,
        prior: Mapping[str, PriorStep] | None = None,
    ) -> RunReport:
        """Run ``workflow`` as run ``run`` to its end; return what each step did.

        ``control.cancel()`` cancels the run at any moment. ``prior`` (from
        recovery) resumes a run already in the log: succeeded steps are not
        run again (their logged results feed their dependents), other steps
        continue their attempt numbering. Cancelling the task that awaits this
        coroutine also cancels the run (the log is closed off first).
        """
        control = control if control is not None else RunControl()
        outcomes: dict[str, StepOutcome] = {}
        if prior is None:
            self._append(run, RunStarted(workflow=workflow.name))
        else:
            for name, step_prior in prior.items():
                step_def = workflow.by_name.get(name)
                if step_def is not None and not _retry_allowed(
                    step_def,
                    step_prior.state,
                    step_prior.last_cause,
                    step_prior.tries,
                    step_prior.outstanding,
                ):
                    outcomes[name] = _outcome_from_prior(name, step_prior)
        if self._admission is None:
            self._admission = asyncio.Semaphore(self._limit)
        admission = self._admission
        tasks: dict[str, asyncio.Task[StepOutcome]] = {}
        live: dict[str, _Attempt] = {}
        # Scheduling is by counts, not by rescanning: each step waits for the
        # dependencies that have not succeeded yet; a finished task hands its
        # name to `finished` (None: the run was cancelled).
        unmet = {s.name: {d for d in s.after if not _succeeded(outcomes.get(d))} for s in workflow.steps}
        dependents: dict[str, list[Step]] = {s.name: [] for s in workflow.steps}
        for s in workflow.steps:
            for d in s.after:
                dependents[d].append(s)
        finished: asyncio.Queue[str | None] = asyncio.Queue()
        cancel_wait = asyncio.ensure_future(control.wait())
        cancel_wait.add_done_callback(lambda _: finished.put_nowait(None))

        def start(step: Step) -> None:
            inputs = {d: outcomes[d].result for d in step.after}
            resume_from = prior.get(step.name) if prior is not None else None
            task = asyncio.ensure_future(self._drive(run, step, inputs, admission, resume_from, live))
            task.add_done_callback(lambda _: finished.put_nowait(step.name))
            tasks[step.name] = task

        failure: BaseException | None = None
        try:
            for step in workflow.steps:
                if step.name not in outcomes and not unmet[step.name]:
                    start(step)
            while tasks:
                done = await finished.get()
                if done is None:
                    break
                outcomes[done] = tasks.pop(done).result()
                if _succeeded(outcomes[done]):
                    for dependent in dependents[done]:
                        unmet[dependent.name].discard(done)
                        if not unmet[dependent.name] and dependent.name not in outcomes:
                            start(dependent)
        except BaseException as error:
            failure = error
            raise
        finally:
            # A cancel (control.cancel() or of this coroutine) or a failure: end
            # every live attempt (each task logs its own Cancel), and await every
            # task, so none is left behind with an unread exception.
            cancel_wait.cancel()
            for task in tasks.values():
                task.cancel()
            step_errors: list[Exception] = []
            for name, task in tasks.items():
                try:
                    outcomes[name] = await task
                except asyncio.CancelledError:
                    outcomes[name] = _cancelled_outcome(name, live.get(name))
                except Exception as error:  # noqa: BLE001  # re-raised below
                    step_errors.append(error)
            # run_finished closes a run that ended or was cancelled; after a
            # failure (the log itself failing, most likely) recovery closes it.
            clean = failure is None or isinstance(failure, asyncio.CancelledError)
            if clean and not step_errors:
                self._append(run, RunFinished())
                self._log.flush()
            if failure is None and step_errors:
                raise step_errors[0]
        return _report(workflow, run, outcomes, control.cancelled)


def _cancelled_outcome(name: str, attempt: _Attempt | None) -> StepOutcome:
    if attempt is None:  # cancelled before its first attempt existed
        return StepOutcome(step=name, state=None, attempts=0)
    return StepOutcome(
        step=name,
        state=attempt.state,
        attempts=attempt.number,
        outstanding=attempt.outstanding_keys(),
    )


def _succeeded(outcome: StepOutcome | None) -> bool:
    return outcome is not None and isinstance(outcome.state, Succeeded)


def _counts_as_try(state: AttemptState, cause: TransitionCause) -> bool:
    """Did this attempt use up one of the step's max_attempts? (It ran and did not succeed.)"""
    return isinstance(state, (Failed, TimedOut)) and not isinstance(cause, QueueDeadlinePassed)


def _retry_allowed(
    step: Step,
    state: AttemptState,
    cause: TransitionCause | None,
    tries: int,
    outstanding: tuple[str, ...],
) -> bool:
    """May a new attempt of ``step`` start after one that ended in ``state``? (spec §6)"""
    match state:
        case Succeeded() | Indeterminate():
            return False  # done / never retried: an operator reconciles it
        case Cancelled():
            return True  # stopped by decision with nothing outstanding (recovery)
        case Failed() | TimedOut():
            if isinstance(cause, QueueDeadlinePassed):
                return False  # the step never ran; its deadline says it is too late
            if isinstance(state, TimedOut) and not step.retry.retry_on_timeout:
                return False
            if outstanding and not step.retry.effects_idempotent:
                return False  # the effect may have happened; reconcile, do not resend
            return tries < step.retry.max_attempts
        case Pending() | Running():
            raise AssertionError(f"an attempt in {state!r} has not ended")
        case _:
            assert_never(state)


def _outcome_from_prior(name: str, prior: PriorStep) -> StepOutcome:
    error = prior.error
    if isinstance(prior.last_cause, QueueDeadlinePassed):
        error = "queue deadline passed"
    elif isinstance(prior.last_cause, StepDeadlinePassed):
        error = "step deadline passed"
    return StepOutcome(
        step=name,
        state=prior.state,
        attempts=prior.last_attempt,
        result=prior.result,
        error=error,
        outstanding=prior.outstanding,
    )


def _report(
    workflow: Workflow, run: str, outcomes: Mapping[str, StepOutcome], cancelled: bool
) -> RunReport:
    steps = tuple(
        outcomes.get(s.name, StepOutcome(step=s.name, state=None, attempts=0))
        for s in workflow.steps
    )
    status: RunStatus
    if any(isinstance(s.state, Indeterminate) or s.outstanding for s in steps):
        status = "needs-reconciliation"
    elif cancelled:
        status = "cancelled"
    elif all(isinstance(s.state, Succeeded) for s in steps):
        status = "succeeded"
    else:
        status = "failed"
    return RunReport(run=run, workflow=workflow.name, status=status, steps=steps)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One run to drive: a workflow, the run id, a resume point, a supervisor."""

    workflow: Workflow
    run: str
    prior: Mapping[str, PriorStep] | None = None
    supervise: Callable[[RunControl], Awaitable[None]] | None = None
    """Plays the outside world (it may call ``control.cancel()``); stopped when the run ends."""


def run_jobs(
    log: RunLog,
    jobs: list[Job],
    *,
    admission_limit: int = 8,
    progress: Callable[[str], None] | None = None,
) -> list[RunReport]:
    """Drive ``jobs`` concurrently on a new event loop; return their reports in order."""

    async def drive(executor: Executor, job: Job) -> RunReport:
        control = RunControl()
        supervisor = (
            asyncio.ensure_future(job.supervise(control)) if job.supervise is not None else None
        )
        try:
            return await executor.run(job.workflow, job.run, control=control, prior=job.prior)
        finally:
            if supervisor is not None:
                supervisor.cancel()

    reports: list[RunReport] = []

    async def main() -> None:
        # Returns None: on 3.11, asyncio.run formats its main task (result
        # included) while restoring the SIGINT handler; a 10,000-step report
        # would cost a noticeable repr.
        executor = Executor(log, admission_limit=admission_limit, progress=progress)
        tasks = [asyncio.ensure_future(drive(executor, job)) for job in jobs]
        reports.extend([await task for task in tasks])

    asyncio.run(main())
    return reports
