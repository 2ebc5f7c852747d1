"""A code workflow's run: the executor's `RunContext`, positions, and replay by position.

Owns what is particular to workflows as code, and nothing of a step's own
life: each ``run.step`` call becomes a `Step` that the executor drives with
the same rules as a DAG's (attempts, retries, deadlines, pools, intents).
What lives here:

- **Positions.** A call takes the run's next position at once, before any
  ``await``, and checks its arguments (JSON, digested). In a live run its
  ``step_called`` is written before the step's first attempt: with that
  attempt's creation when the step's task starts (one write), or earlier,
  before a wait's start or any end of the run's steps and waits
  (`write_calls`), so that the log keeps every call before the ends that
  came after it. Steps started together are numbered in call order.
- **Replay.** Recovery runs the function again from the top (`replay`).
  Each call at a recorded position is checked against the record (name and
  argument digest; a mismatch is `WorkflowDiverged`). Recorded outcomes are
  handed back in the order the log recorded them, interleaved with the
  calls as the log recorded those, so concurrent branches ask for their
  next steps in the order they did the first time and take the same
  positions. Nothing is written while replaying: a divergence leaves the
  run untouched. Once every recorded call was made again, the run is taken
  up (`take_up`): orphaned attempts are asked about and ended, unfinished
  steps continue, and new calls run live.

The function must await only what its `RunContext` gives it: while
replaying, the driver lets the event loop run until the next recorded call
is made, and a function that waits on anything else (a clock, a socket)
never makes it, which is reported as a divergence.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, cast

from typing_extensions import final

from ._attempt import is_terminal
from ._codec import new_called
from ._errors import AttemptKernelError
from ._findings import Reconciler
from ._ledger import Ledger, StepView, has_succeeded, may_run_again
from ._outcome import StepOutcome, outcome
from ._operate import OperationRefused, check_signal_name
from ._records import JSON, StepCalled, WaitEnded, WaitStarted
from ._workflow import (
    RetryPolicy,
    Step,
    StepFunction,
    StepOptions,
    WorkflowError,
    check_step,
    is_async_function,
    new_step,
)

MAX_STEP_NAME: Final = 10_000
"""The longest step name a ``run.step`` call may give (every record of the step carries it)."""

REPLAY_PATIENCE: Final = 10_000
"""Event-loop turns the replay waits for the next recorded call before it
calls the function divergent (a deterministic function makes it in a few)."""


@final
class StepFailed(AttemptKernelError):
    """A code workflow's step did not succeed; raised where the function awaits it.

    ``outcome`` says how the step ended: ``outcome.state`` is its last
    attempt's state (`Failed`, `TimedOut`, `Indeterminate`, `Cancelled`),
    ``outcome.error`` its error, ``outcome.outstanding`` the idempotency
    keys left to reconcile. The function may catch it and go on; a step
    that left an effect outstanding still makes the run end
    ``needs-reconciliation``.
    """

    def __init__(self, run: str, outcome: StepOutcome) -> None:
        state = "never started" if outcome.state is None else type(outcome.state).__name__
        detail = f": {outcome.error}" if outcome.error else ""
        left = (
            f"; outstanding (reconcile these): {', '.join(outcome.outstanding)}"
            if outcome.outstanding
            else ""
        )
        super().__init__(
            f"step {outcome.step!r} of run {run!r} did not succeed"
            f" (attempt {outcome.attempts}: {state}){detail}{left}"
        )
        self.run: Final = run
        self.outcome: Final = outcome


@final
class WorkflowDiverged(AttemptKernelError):
    """A code workflow's function, run again, asked for another step than the log holds.

    ``position`` is where; ``recorded`` is what the log holds there: a step
    (`StepCalled`: ``name`` and argument digest) or a wait (`WaitStarted`);
    ``requested`` what the code asked for, as (name, argument digest), where
    a sleep is ``("run.sleep", "")`` and a wait for a signal
    ``("run.wait_for_signal", name)``; None when it asked for nothing (it
    returned, raised, or waited on something else). Nothing was written for the run and nothing was sent:
    restore the code the run started with (its version is in the log), or
    leave the run unfinished.
    """

    def __init__(
        self,
        run: str,
        position: int,
        recorded: StepCalled | WaitStarted,
        requested: tuple[str, str] | None,
        why: str = "",
    ) -> None:
        asked = f"the code {why}" if requested is None else f"the code asked for {_asked(requested)}"
        super().__init__(
            f"run {run!r} diverged at position {position}: the log holds {_held(recorded)}"
            f" there, but {asked};"
            " nothing was written for this run and nothing was sent. Run it with the"
            " code it started with, or leave it unfinished"
        )
        self.run: Final = run
        self.position: Final = position
        self.recorded: Final = recorded
        self.requested: Final = requested


def _asked(requested: tuple[str, str]) -> str:
    name, detail = requested
    if name == "run.sleep":
        return "a sleep (run.sleep)"
    if name == "run.wait_for_signal":
        return f"a wait for signal {detail!r}"
    return f"step {name!r} (arguments {detail})"


def _held(recorded: StepCalled | WaitStarted) -> str:
    if isinstance(recorded, StepCalled):
        return f"step {recorded.name!r} (arguments {recorded.digest})"
    if recorded.signal is None:
        return "a sleep (run.sleep)"
    return f"a wait for signal {recorded.signal!r}"


def _duration(value: object, what: str) -> float:
    """``value`` as seconds, if it is a finite number of at least 0; else `WorkflowError`."""
    if type(value) not in (int, float):
        raise WorkflowError(f"{what} must be a number of seconds, got {value!r}")
    seconds = float(cast(float, value))
    if not (0 <= seconds < _INF):  # NaN fails too
        raise WorkflowError(f"{what} must be finite and at least 0 seconds, got {value!r}")
    if seconds * 1_000_000 == _INF:  # its wake time is counted in microseconds
        raise WorkflowError(
            f"{what} must be less than {_MAX_WAIT:.4g} seconds (a wake time is a number of"
            f" microseconds), got {value!r}; to wait for ever, wait for a signal with no timeout"
        )
    return seconds


def _came_late(sent_us: int | None, wake_us: int | None) -> bool:
    """Was a signal recorded at ``sent_us`` (None: taken in by this process, just now)
    at or after a wait's wake time, when its timeout had ended it already?"""
    return sent_us is not None and wake_us is not None and sent_us >= wake_us


def arguments_digest(name: str, args: Sequence[object]) -> tuple[str, list[JSON]]:
    """The digest of a step call's arguments, and the arguments as JSON decodes them.

    The digest is of the arguments as one JSON array, keys sorted, no
    spaces, ASCII only. Raises `WorkflowError` naming the first argument
    that is not a JSON value.
    """
    if not args:
        return _NO_ARGUMENTS, []
    try:
        scalars = _scalars_json(args)
        if scalars is None:
            for index, arg in enumerate(args, 1):
                key = non_string_key(arg)
                if key is not None:
                    raise WorkflowError(
                        f"run.step({name!r}, ...): argument {index} is not a JSON value (it"
                        f" holds the key {key[0]!r}, and JSON objects have string keys only:"
                        " recovery would hand the step another value); pass JSON values only"
                    )
        text = scalars if scalars is not None else _canonical(list(args))
    except (TypeError, ValueError, RecursionError):
        for index, arg in enumerate(args, 1):
            try:
                _canonical(arg)
            except (TypeError, ValueError, RecursionError) as error:
                raise WorkflowError(
                    f"run.step({name!r}, ...): argument {index} is not a JSON value ({error});"
                    " pass JSON values only (they are recorded and handed back on recovery)"
                ) from None
        raise  # not reached: one argument failed above
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    if scalars is not None:
        # what JSON decodes a str, int, float, bool or None to is that value
        return digest, cast("list[JSON]", list(args))
    decoded: list[JSON] = _decode(text)
    return digest, decoded


_canonical: Final = json.JSONEncoder(allow_nan=False, sort_keys=True, separators=(",", ":")).encode
_NO_ARGUMENTS: Final = "sha256:" + hashlib.sha256(b"[]").hexdigest()[:16]
"""The digest of a call without arguments (many steps take none): made once."""
_decode: Final = json.JSONDecoder().decode
_string: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


def _scalars_json(args: Sequence[object]) -> str | None:
    """`_canonical` of the arguments when each is a str, int, float, bool or None (the
    common case, without building an encoder per call); None when one is not."""
    parts: list[str] = []
    for arg in args:
        kind = type(arg)
        if kind is str:
            parts.append(_string(cast(str, arg)))
        elif kind is int:
            parts.append(int.__repr__(cast(int, arg)))
        elif kind is bool:
            parts.append("true" if arg else "false")
        elif arg is None:
            parts.append("null")
        elif kind is float:
            number = cast(float, arg)
            if number != number or number in (_INF, -_INF):
                raise ValueError(f"Out of range float values are not JSON compliant: {number!r}")
            parts.append(float.__repr__(number))
        else:
            return None
    return "[" + ",".join(parts) + "]"


_INF: Final = float("inf")
_MAX_WAIT: Final = sys.float_info.max / 1_000_000
"""The longest sleep or timeout, in seconds: longer ones overflow in microseconds."""


def non_string_key(value: object, depth: int = 0) -> tuple[object] | None:
    """The first key of a dict inside ``value`` that is not a string, if any."""
    if depth > 200:
        return None  # the encoder refuses it as too deep
    if isinstance(value, dict):
        for key, item in cast("dict[object, object]", value).items():
            if type(key) is not str:
                return (key,)
            found = non_string_key(item, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for item in cast("list[object]", value):
            found = non_string_key(item, depth + 1)
            if found is not None:
                return found
    return None
_logged: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def as_logged(value: JSON) -> JSON:
    """``value`` as the run log gives it back: a container's keys become strings and
    its tuples lists, as in a value read back on recovery."""
    if type(value) in (str, int, float, bool, type(None)):
        return value
    decoded: JSON = _decode(_logged(value))
    return decoded




@functools.lru_cache(maxsize=512)
def _async_cached(fn: object) -> bool:
    return is_async_function(fn)


def _is_async(fn: object) -> bool:
    """`is_async_function`, remembered per function (asked at every step call)."""
    try:
        return _async_cached(fn)
    except TypeError:  # an unhashable callable
        return is_async_function(fn)


_CURRENT: Final[contextvars.ContextVar[CodeRun | None]] = contextvars.ContextVar(
    "attempt_kernel_run", default=None
)
"""The run whose function is executing here: a step's own task has None."""

Drive = Callable[[Step, StepCalled | None], Awaitable[StepOutcome]]
"""Drives a step's attempts; the call, when given, is written with the first one."""
EndOrphan = Callable[[Step], Awaitable[None]]


QUIET_SETTLE: Final = 0.05
"""Seconds in which a code run must make no call and see no end before it counts as quiet
(`CodeRun.quiet`): its branches' awaits between an end and their next call run first."""


def _no_quiet() -> None:
    pass


@final
class CodeRun:
    """The executor's `RunContext` for one run of a code workflow (see the module doc)."""

    # Slots: one of these is made for every run, and its attributes are read at every step.
    __slots__ = (
        "_run", "_input", "_ledger", "_defaults", "_declared", "_write", "_may_start", "_drive",
        "_end_orphan", "_replaying", "_clock", "_sleep", "_quiet_after", "_next", "_closed",
        "_loop", "tasks", "failure", "on_failure", "diverged", "_asked", "_asked_waits", "_held",
        "_steps", "waiters", "_blocked", "_news", "on_quiet", "_unwritten", "outcomes", "_ends",
    )

    def __init__(
        self,
        *,
        run: str,
        input: JSON,
        ledger: Ledger,
        defaults: StepOptions,
        domain_states: tuple[str, ...],
        write: Callable[[StepCalled | WaitStarted | WaitEnded], None],
        may_start: Callable[[], bool],
        drive: Drive,
        end_orphan: EndOrphan,
        replaying: bool,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        quiet_after: float | None = None,
    ) -> None:
        self._run: Final = run
        self._input: Final = input
        self._ledger: Final = ledger
        self._defaults: Final = defaults
        self._declared: Final = domain_states
        self._write: Final = write
        self._may_start: Final = may_start
        self._drive: Final = drive
        self._end_orphan: Final = end_orphan
        self._replaying = replaying
        self._clock: Final = clock
        self._sleep: Final = sleep
        self._quiet_after: Final = quiet_after
        self._next = 1
        self._closed = False
        self._loop = asyncio.get_running_loop()
        self.tasks: Final[set[asyncio.Task[None]]] = set()
        """Steps being driven now."""
        self.outcomes: Final[dict[str, StepOutcome]] = {}
        """What each step driven here ended with, by step id (the run's report
        reuses them; see `outcome_of`)."""
        self.failure: BaseException | None = None
        """An error of the run's own machinery (the log failing): the run stops."""
        self.on_failure: Callable[[], None] | None = None
        """Called once `failure` is set (the executor wakes up to stop the run)."""
        self.diverged: WorkflowDiverged | None = None
        self._asked: dict[int, tuple[Step, asyncio.Future[JSON]]] = {}
        """Recorded positions the code asked for again, not answered yet."""
        self._asked_waits: dict[int, asyncio.Future[JSON]] = {}
        """Recorded waits the code asked for again, not answered yet."""
        self._held: list[Callable[[], None]] = []
        """New calls made while replaying: started, in position order, once the run is taken up."""
        self._steps: list[str] = []
        self._unwritten: dict[int, StepCalled] = {}
        """Calls whose ``step_called`` is not written yet, by position: each is
        written with its step's first attempt, when the step's task starts
        (one write instead of two), or earlier by `write_calls`."""
        """Step ids by position, as the code asked for them ("" where it waited)."""
        self.waiters: Final[dict[int, asyncio.Task[None]]] = {}
        """Waits being waited now, by position."""
        self._blocked: set[int] = set()
        """Waits with nothing to take and no wake time come: they wait for news."""
        self._news: asyncio.Future[None] | None = None
        """Resolved (and dropped) by `notify`: a signal may have come. Made by
        the first wait that waits for it (most runs never wait)."""
        self._ends = 0
        """Steps settled and waits ended so far (with ``_next``, what `_check_quiet` watches)."""
        self.on_quiet: Callable[[], None] = _no_quiet
        """Called when every branch of the function waits (no step live) and no
        wake time comes within ``quiet_after`` seconds (see `quiet`)."""

    # ------------------------------------------------------------ RunContext

    @property
    def run(self) -> str:
        return self._run

    @property
    def input(self) -> JSON:
        return self._input

    def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        /,
        *args: JSON,
        retry: RetryPolicy | None = None,
        step_deadline: float | None = None,
        queue_deadline: float | None = None,
        pool: str | None = None,
        reconcilers: Mapping[str, Reconciler] | None = None,
        domain_states: Sequence[str] = (),
    ) -> Awaitable[Any]:
        if self._closed or _CURRENT.get() is not self:  # the message only when refused
            self._check_call(f"run.step({name!r})", "a step")
        # typed str; this guards callers that ignored the annotations
        if type(name) is not str or not name:  # pyright: ignore[reportUnnecessaryComparison]
            raise WorkflowError(f"run.step needs a non-empty step name, got {name!r}")
        if len(name) > MAX_STEP_NAME:
            raise WorkflowError(
                f"run.step: a step name has at most {MAX_STEP_NAME} characters, got one of"
                f" {len(name)} ({name[:40]!r}...)"
            )
        if not _is_async(fn):
            raise WorkflowError(
                f"run.step({name!r}, {getattr(fn, '__qualname__', fn)!r}): the step function is"
                " not an async function; write it as `async def f(ctx: StepContext, ...) -> JSON`"
            )
        digest, decoded = arguments_digest(name, args)
        position = self._next
        step_id = f"{name}@{position}"
        defaults = self._defaults
        if decoded:

            async def call(ctx: Any) -> JSON:
                result: JSON = await fn(ctx, *decoded)
                return result

            run: StepFunction = call
        else:  # no arguments to bind: the step's own function, one coroutine less
            run = fn
        step = new_step(
            step_id,
            run,
            retry=defaults.retry if retry is None else retry,
            step_deadline=defaults.step_deadline if step_deadline is None else step_deadline,
            queue_deadline=defaults.queue_deadline if queue_deadline is None else queue_deadline,
            pool=defaults.pool if pool is None else pool,
            reconcilers=None if reconcilers is None else dict(reconcilers),
            domain_states=tuple(domain_states),
        )
        if not (
            retry is None and step_deadline is None and queue_deadline is None and pool is None
            and not domain_states
        ):  # fmt: skip  # the workflow's defaults were checked when it was made
            check_step(step, f"run {self._run!r}, step {step_id!r}", self._declared)
        self._next += 1
        self._steps.append(step_id)
        future: asyncio.Future[JSON] = self._loop.create_future()
        if not self._replaying:
            self._launch(position, step, name, digest, future)
            return future
        at = self._ledger.runs[self._run].at
        if position > len(at):  # new: started after the replay
            self._held.append(lambda: self._launch(position, step, name, digest, future))
            return future
        recorded = at[position - 1]
        if not isinstance(recorded, StepCalled) or recorded.name != name or recorded.digest != digest:
            raise self._diverge(WorkflowDiverged(self._run, position, recorded, (name, digest)))
        self._asked[position] = (step, future)
        return future

    def _diverge(self, diverged: WorkflowDiverged) -> WorkflowDiverged:
        """Keep the replay's first divergence (the one reported): branches that go
        on after it may diverge too, at later positions that say less."""
        if self.diverged is None:
            self.diverged = diverged
        return diverged

    def sleep(self, seconds: float) -> Awaitable[None]:
        self._check_call("run.sleep()")
        length = _duration(seconds, "run.sleep(seconds)")
        future = self._wait_call(None, length)
        return cast("asyncio.Future[None]", future)

    def wait_for_signal(self, name: str, timeout: float | None = None) -> Awaitable[JSON]:
        self._check_call(f"run.wait_for_signal({name!r})")
        try:
            check_signal_name(name, "run.wait_for_signal")
        except OperationRefused as error:
            raise WorkflowError(str(error)) from None
        length = None if timeout is None else _duration(timeout, "run.wait_for_signal(timeout=)")
        return self._wait_call(name, length)

    def _check_call(self, what: str, kind: str = "a wait") -> None:
        """Refuse a call made after the run finished, from a step, or from another run."""
        if self._closed:
            raise WorkflowError(
                f"{what} was called after run {self._run!r} finished; {kind} belongs to the run"
                " whose function calls it, while it runs"
            )
        current = _CURRENT.get()
        if current is not self:
            where = (
                "from inside a step (a step's function gets a StepContext, not the RunContext)"
                if current is None
                else f"from the function of run {current.run!r}"
            )
            raise WorkflowError(f"{what} of run {self._run!r} was called {where}")

    def _wait_call(self, signal: str | None, seconds: float | None) -> asyncio.Future[JSON]:
        """A wait takes the next position, as a step does (see `sleep`, `wait_for_signal`)."""
        position = self._next
        self._next += 1
        self._steps.append("")
        future: asyncio.Future[JSON] = self._loop.create_future()
        if not self._replaying:
            self._launch_wait(position, signal, seconds, future)
            return future
        at = self._ledger.runs[self._run].at
        if position > len(at):  # new: started after the replay
            self._held.append(lambda: self._launch_wait(position, signal, seconds, future))
            return future
        recorded = at[position - 1]
        if not isinstance(recorded, WaitStarted) or recorded.signal != signal:
            asked = ("run.sleep", "") if signal is None else ("run.wait_for_signal", signal)
            raise self._diverge(WorkflowDiverged(self._run, position, recorded, asked))
        self._asked_waits[position] = future
        return future

    # ------------------------------------------------------------ waits

    def _now_us(self) -> int:
        return int(self._clock() * 1_000_000)

    def _launch_wait(
        self, position: int, signal: str | None, seconds: float | None, future: asyncio.Future[JSON]
    ) -> None:
        if not self._may_start():
            future.cancel()  # cancelled or stopped: no wait starts (as no step does)
            return
        wake = None if seconds is None else self._now_us() + round(seconds * 1_000_000)
        try:
            self.write_calls()  # positions are written in order
            self._write(WaitStarted(position=position, signal=signal, wake_us=wake))
        except BaseException as error:  # the log failed: the run stops
            self._fail(error)
            raise
        self._start_wait(position, signal, wake, future)

    def _start_wait(
        self, position: int, signal: str | None, wake: int | None, future: asyncio.Future[JSON]
    ) -> None:
        task = self._loop.create_task(self._waiting(position, signal, wake, future))
        self.waiters[position] = task
        task.add_done_callback(lambda _: self.waiters.pop(position, None))
        # the function stopped awaiting it (its task was cancelled): so does the wait
        future.add_done_callback(lambda done: task.cancel() if done.cancelled() else None)

    async def _waiting(
        self, position: int, signal: str | None, wake: int | None, future: asyncio.Future[JSON]
    ) -> None:
        _CURRENT.set(None)
        try:
            while not future.done():
                view = self._ledger.runs[self._run]
                taken = None if signal is None else view.untaken(signal)
                if taken is not None and _came_late(taken.sent_us, wake):
                    # Recorded after the timeout, while no process drove the run
                    # (a crash, a run let go): one that had driven it would have
                    # ended the wait by its time first. It stays for a later wait.
                    taken = None
                now = self._now_us()
                if taken is not None or (wake is not None and now >= wake):
                    if not self._may_start():
                        future.cancel()
                        return
                    number = None if taken is None else taken.number
                    self.write_calls()  # calls made before this end go in before it
                    self._write(WaitEnded(position=position, signal=number))
                    # as the log gives it back, so a resumed run sees the same value
                    future.set_result(None if taken is None else as_logged(taken.payload))
                    self._ends += 1
                    self._look_again()
                    return
                news = self._news
                if news is None:
                    news = self._news = self._loop.create_future()
                timer = None if wake is None else asyncio.ensure_future(self._sleep((wake - now) / 1e6))
                self._blocked.add(position)
                try:
                    if self._quiet_after is not None:
                        self._look_for_quiet()
                    await asyncio.wait(
                        [news] if timer is None else [news, timer],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    self._blocked.discard(position)
                    if timer is not None:
                        timer.cancel()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:  # the log failed, most likely: the run stops
            future.cancel()
            self._fail(error)

    def _look_again(self) -> None:
        """A step or a wait ended: if waits are left blocked and no step is live, look whether
        the run is quiet now. Each wait looked when it began, and a step live beside it, or a
        wake time within ``quiet_after`` then, made the run busy; no later look comes unless
        an end asks for one."""
        if self._blocked and not self.tasks and self._quiet_after is not None:
            self._look_for_quiet()

    def _look_for_quiet(self) -> None:
        """Look, once nothing has moved for `QUIET_SETTLE` seconds, whether the run is quiet
        (`on_quiet` if so); news for its waits before then calls the look off."""
        news = self._news
        if news is None:
            news = self._news = self._loop.create_future()
        look = asyncio.ensure_future(self._check_quiet())
        news.add_done_callback(lambda _: look.cancel())

    async def _check_quiet(self) -> None:
        # Only once nothing moved (no call, no end) for QUIET_SETTLE seconds: what a
        # branch was just handed back may start another step, through as many turns
        # of the loop as its awaits take (a gather of gathers). A timer fires only
        # after the callbacks ready before it, so each such turn comes first.
        while True:
            moved = (self._next, self._ends)
            await asyncio.sleep(QUIET_SETTLE)
            if (self._next, self._ends) == moved:
                break
        if self.quiet():
            self.on_quiet()

    def quiet(self) -> bool:
        """Every wait open is waiting for news, no step is live, and no wake time
        comes within ``quiet_after`` seconds: the run may be let go while it waits."""
        if self.tasks or not self.waiters or len(self._blocked) < len(self.waiters):
            return False
        if self._quiet_after is None:
            return False
        view = self._ledger.runs[self._run]
        soonest = min(
            (w.wake_us for p in self._blocked if (w := view.waits.get(p)) is not None and w.wake_us is not None),
            default=None,
        )
        return soonest is None or soonest - self._now_us() >= self._quiet_after * 1_000_000

    def notify(self) -> None:
        """News for the run's waits (a signal was recorded): each looks again."""
        news, self._news = self._news, None
        if news is not None and not news.done():
            news.set_result(None)

    # ------------------------------------------------------------ live steps

    def _launch(
        self, position: int, step: Step, name: str, digest: str, future: asyncio.Future[JSON]
    ) -> None:
        if not self._may_start():
            # The run is being cancelled or stopped: nothing starts, and the
            # function's await of this step ends as a cancellation does (a
            # function awaiting it in a `finally` must not wait forever).
            future.cancel()
            return
        self._unwritten[position] = new_called(step.name, position, name, digest)
        self.tasks.add(self._loop.create_task(self._drive_step(step, future, position)))

    def write_calls(self) -> None:
        """Write the calls not written yet: before a record of a later position (a
        wait's start), and before any end of a step or a wait (the executor calls
        it then), so that every call made before an end is in the log before it,
        as recovery's replay needs (see the module doc)."""
        unwritten = self._unwritten
        while unwritten:
            position = next(iter(unwritten))
            self._write(unwritten.pop(position))

    def _start(self, step: Step, future: asyncio.Future[JSON], position: int = 0) -> None:
        task = self._loop.create_task(self._drive_step(step, future, position))
        self.tasks.add(task)

    async def _drive_step(self, step: Step, future: asyncio.Future[JSON], position: int) -> None:
        # A step's own task runs outside the function (the task has a copy of
        # the context it was made in): run.step from inside a step is refused.
        _CURRENT.set(None)
        # Tasks start in the order they were made, so calls are written in
        # position order (a wait writes those before it first, see _launch_wait).
        called = self._unwritten.pop(position, None) if position else None
        try:
            if called is not None and not self._may_start():
                # The run was cancelled or stopped since the call: as in
                # `_launch`, nothing is written and nothing starts.
                future.cancel()
                return
            done = await self._drive(step, called)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:  # the log failed, most likely: the run stops
            future.cancel()
            self._fail(error)
            return
        finally:
            # A step's task leaves `tasks` itself: one done-callback less per
            # step. (One cancelled before it ran never gets here; the run is
            # over then: `close` empties the set.)
            self.tasks.discard(asyncio.current_task(self._loop))
        self._settle(future, done)
        self._look_again()

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        if self.on_failure is not None:
            self.on_failure()

    def _settle(self, future: asyncio.Future[JSON], done: StepOutcome) -> None:
        self.outcomes[done.step] = done
        self._ends += 1
        if future.done():
            return
        if has_succeeded(done.state):
            # as the log holds it, so that a recovered run sees the same value
            future.set_result(as_logged(done.result))
        else:
            future.set_exception(StepFailed(self._run, done))

    # ------------------------------------------------------------ the function

    async def main(self, function: Callable[[Any], Awaitable[JSON]]) -> JSON:
        """Run the workflow's function with this context as the current run."""
        _CURRENT.set(self)
        try:
            return await function(self)
        except SystemExit as exit:
            # Out of a task, SystemExit breaks the event loop, whose teardown
            # would cancel the run for good (a decision nobody made) and end
            # the process without a word: it is the function's error instead.
            raise WorkflowError(
                f"the workflow function called sys.exit({exit.code!r}) (SystemExit); a run"
                " ends when its function returns or raises an Exception"
            ) from None
        finally:
            self._closed = True

    def outcome_of(self, step: str, view: StepView | None) -> StepOutcome:
        """The step's outcome as its ledger ``view`` says it: the one its drive ended
        with when nothing has moved it since (built again otherwise)."""
        done = self.outcomes.get(step)
        if (
            done is not None and view is not None and done.state is view.attempt.state
            and done.attempts == view.attempt.number and done.outstanding == view.outstanding()
        ):  # fmt: skip
            return done
        return outcome(step, view)

    def steps(self) -> list[str]:
        """The step ids of the run by position, as the code asked for them (not its waits)."""
        return [step for step in self._steps if step]

    # ------------------------------------------------------------ recovery

    async def replay(self, function_task: asyncio.Future[JSON]) -> None:
        """Run the function against the log until every recorded call was made again.

        Raises `WorkflowDiverged` (nothing written) when a call differs from
        the record at its position, or when the function stops asking before
        every recorded position was asked for again.
        """
        view = self._ledger.runs[self._run]
        at = view.at
        last_end: dict[int, int] = {}
        last_call = -1
        for index, event in enumerate(view.events):
            if event < 0:
                last_end[-event] = index
            else:
                last_call = index
        for index, event in enumerate(view.events):
            if event > 0:
                await self._until_asked(event, at[event - 1], function_task)
            elif -event in view.waits:
                self._answer_wait(-event)
            elif last_end[-event] == index:
                # A step that ended leaving an effect outstanding, after which
                # the function went on (a later call is recorded), had its
                # failure then: it is handed back so, though a reconciliation
                # since would let the step run again.
                self._answer(-event, open_then=index in view.open_ends and last_call > index)
        self._replaying = False

    async def _until_asked(
        self, position: int, recorded: StepCalled | WaitStarted, function_task: asyncio.Future[JSON]
    ) -> None:
        turns = 0
        while position > len(self._steps):
            if self.diverged is not None:
                raise self.diverged
            if function_task.done() or turns >= REPLAY_PATIENCE:
                if function_task.done():
                    error = None if function_task.cancelled() else function_task.exception()
                    why = (
                        "returned before asking for it"
                        if error is None
                        else f"raised {type(error).__name__} before asking for it"
                    )
                else:
                    why = (
                        "did not ask for it (a workflow function may await only its run's"
                        " steps and waits; clock reads, asyncio.sleep and I/O belong inside steps)"
                    )
                self.diverged = WorkflowDiverged(self._run, position, recorded, None, why)
                raise self.diverged
            await asyncio.sleep(0)
            turns += 1
        if self.diverged is not None:
            raise self.diverged

    def _answer_wait(self, position: int) -> None:
        """Hand a recorded wait's end back to the code: the signal it took, or None."""
        future = self._asked_waits.pop(position, None)
        if future is None or future.done():
            return
        view = self._ledger.runs[self._run]
        wait = view.waits[position]
        number = wait.taken
        future.set_result(None if number is None else view.signals[number - 1].payload)

    def _answer(self, position: int, *, open_then: bool) -> None:
        """Hand a recorded outcome back to the code, if the step is done for good
        (``open_then``: judged as when it ended, with an effect outstanding)."""
        asked = self._asked.get(position)
        if asked is None:
            return
        step, future = asked
        view = self._ledger.step(self._run, step.name)
        if view is None:
            return
        attempt = view.attempt
        if has_succeeded(attempt.state):
            del self._asked[position]
            future.set_result(view.result)
        elif is_terminal(attempt.state) and not may_run_again(
            step.retry, attempt.state, attempt.last_cause, view.tries,
            view.outstanding() or (("(outstanding when it ended)",) if open_then else ()),
            retryable=view.retryable,
        ):
            del self._asked[position]
            future.set_exception(StepFailed(self._run, outcome(step.name, view)))

    async def take_up(self) -> None:
        """After `replay` and the run's resume record: end orphans, continue the rest.

        Each step the code asked for again that is not done: an orphaned
        attempt (the crash left it live) is asked about by its reconcilers
        and ended as recovery ends one; then the step goes on by the
        kernel's rules (a step that may not run again, such as one left
        `Indeterminate`, answers the code with `StepFailed`). New calls made
        while replaying start now, in position order.
        """
        ledger = self._ledger
        waiting = sorted(self._asked.items())
        self._asked.clear()
        for _, (step, _) in waiting:
            view = ledger.step(self._run, step.name)
            if view is not None and not is_terminal(view.attempt.state):
                await self._end_orphan(step)
        for _, (step, future) in waiting:
            view = ledger.step(self._run, step.name)
            if view is not None:
                attempt = view.attempt
                if not may_run_again(
                    step.retry, attempt.state, attempt.last_cause, view.tries,
                    view.outstanding(), retryable=view.retryable,
                ):
                    self._settle(future, outcome(step.name, view))
                    continue
            self._start(step, future)
        # Waits the code asked for again that have not ended wait for what is left.
        run_view = ledger.runs[self._run]
        for position, future in sorted(self._asked_waits.items()):
            wait = run_view.waits[position]
            self._start_wait(position, wait.signal, wait.wake_us, future)
        self._asked_waits.clear()
        held, self._held = self._held, []
        for launch in held:
            launch()

    def close(self) -> None:
        """The run is over: a later ``run.step`` is refused."""
        self._closed = True
        self.tasks.clear()
        # The executor's callbacks hold the function's task, whose context
        # holds this run: let go of them, so that the run is freed when it
        # ends rather than by a full collection of the garbage collector.
        self.on_quiet = _no_quiet
        self.on_failure = None
