"""Who is told of the records a run writes: the typed observer, and what is built on it.

An executor tells every `RunObserver` it was given of each record it has
appended to its log (once the log's `append` returned: written, or for a
PostgreSQL worker queued for its writer thread, whose fence may still
refuse it) and applied to its ledger, in log order, on the executor's event loop. The command
line's progress lines (`ProgressLines`), the log lines through `logging`
(`LogRecords`) and the metrics and traces of the optional extras are all
observers; none of them is asked anything, so none can change what a run
does.

An observer must be quick and must not block (it runs between an append
and the run's next move). One that raises is logged (`attempt_kernel`
logger, level ERROR) and told of later records as before: a broken
dashboard never stops a run. No I/O here but that log line.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Sequence
from typing import Final, Literal, Protocol, runtime_checkable

from typing_extensions import assert_never, final

from ._attempt import Indeterminate
from ._codec import state_name
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

LOGGER: Final = logging.getLogger("attempt_kernel")
"""The library's logger; the records runs write are logged by its child ``attempt_kernel.run``."""
# A library adds no handler of its own; this one only keeps logging's
# last resort from printing warnings to stderr when the application set none.
LOGGER.addHandler(logging.NullHandler())

_RUN_LOGGER: Final = logging.getLogger("attempt_kernel.run")

UNRECORDED: Final = "attempt_kernel_unrecorded"
"""The attribute `LogRecords.say` sets (true) on the `logging.LogRecord` of a line no
record of the log carries: a handler that prints only those (the command line's,
without progress lines) tells them from the lines the log keeps anyway."""


@runtime_checkable
class RunObserver(Protocol):
    """Told of each record an executor wrote, after the log's ``append`` returned and the
    executor's ledger applied it (not yet durable: docs/executor.md, "Watching runs:
    observers and logs")."""

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        """``change`` was appended for ``run``; ``time_us``: the executor's clock, in microseconds."""
        ...


@runtime_checkable
class ReleaseObserver(RunObserver, Protocol):
    """A `RunObserver` also told when an executor stops driving a run that has not finished
    and writes no record to say so: a code run let go while it waits (``let_go_after``:
    ``waiting``), or one whose log failed under it, a lost lease say (``interrupted``).
    Whoever takes the run up next writes ``run_resumed``. `Spans` is one: it ends the
    run's spans there."""

    def run_released(self, run: str, status: Literal["waiting", "interrupted"], time_us: int) -> None:
        """This executor no longer drives ``run``, which stands ``status``; ``time_us``: its clock."""
        ...


def tell_released(
    observers: Sequence[RunObserver], run: str, status: Literal["waiting", "interrupted"], time_us: int
) -> None:
    """Tell each `ReleaseObserver` among ``observers`` that ``run`` was released (as `tell`)."""
    for observer in observers:
        if isinstance(observer, ReleaseObserver):
            try:
                observer.run_released(run, status, time_us)
            except Exception:  # an observer never stops a run (module doc)
                LOGGER.exception("observer %r failed on the release of run %r", observer, run)


def tell(observers: Sequence[RunObserver], run: str, change: Change, time_us: int) -> None:
    """Tell each observer of one record; one that raises is logged and the others are still told."""
    for observer in observers:
        try:
            observer.record_written(run, change, time_us)
        except Exception:  # an observer never stops a run (module doc)
            LOGGER.exception("observer %r failed on a record of run %r", observer, run)


def utc(time_us: int) -> str:
    """A time in microseconds as ISO 8601 UTC to the millisecond (``time_us`` itself past year 9999)."""
    try:
        moment = datetime.datetime.fromtimestamp(time_us / 1e6, datetime.timezone.utc)
    except (OverflowError, ValueError, OSError):
        return f"time_us {time_us}"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def wait_line(run: str, change: WaitStarted | WaitEnded) -> str:
    """The progress line of a wait's start or end."""
    at = f"{run} @{change.position}"
    if isinstance(change, WaitEnded):
        taken = "its wake time came" if change.signal is None else f"took signal {change.signal}"
        return f"{at}: wait ended ({taken})"
    until = "" if change.wake_us is None else f" until {utc(change.wake_us)}"
    if change.signal is None:
        return f"{at}: sleeping{until}"
    return f"{at}: waiting for signal {change.signal!r}{until}"


def progress_line(run: str, change: Change) -> str | None:
    """The one line a person watching a run sees for a record, or None for a record they do not.

    An attempt's move (``r-1 fetch#1: Pending -> Running``) and a wait's
    start or end; the rest is bookkeeping that `attempt-kernel show` tells.
    """
    match change:
        case AttemptTransitioned():
            return (
                f"{run} {change.step}#{change.attempt}:"
                f" {state_name(change.from_state)} -> {state_name(change.to_state)}"
            )
        case WaitStarted() | WaitEnded():
            return wait_line(run, change)
        case (
            RunStarted() | RunStopRequested() | RunResumed() | RunCancelRequested() | StepCalled()
            | SignalSent() | AttemptCreated() | IntentPlanned() | IntentChanged()
            | IntentReconciled() | DomainStateSet() | StepResult() | RunFinished()
        ):  # fmt: skip
            return None
        case _:
            assert_never(change)


@final
class ProgressLines:
    """The ``progress`` callback of `Executor`, as an observer: one line per `progress_line`."""

    __slots__ = ("_say",)

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say: Final = say

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        line = progress_line(run, change)
        if line is not None:
            self._say(line)


def _level(change: Change) -> int:
    """INFO for a run's course; WARNING where a person may be needed (an Indeterminate attempt)."""
    if type(change) is AttemptTransitioned and type(change.to_state) is Indeterminate:
        return logging.WARNING
    return logging.INFO


def shown(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\udc80``).

    Names read from a log are data: wherever one is printed or logged it goes
    through here, so a line break in a run id makes no second line and an
    escape reaches no terminal. The result is printable, so escaping it again
    changes nothing (a line logged here and formatted by the command line).
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def run_log_message(run: str, change: Change) -> str | None:
    """The line `LogRecords` logs for a record, or None for a record it does not log."""
    match change:
        case RunStarted():
            return f"{run}: started (workflow {change.workflow!r})"
        case RunFinished():
            return f"{run}: finished" + ("" if change.error is None else f" ({change.error})")
        case RunCancelRequested():
            return f"{run}: cancel requested" + (f" ({change.reason})" if change.reason else "")
        case RunStopRequested():
            return f"{run}: stopped" + (f" ({change.reason})" if change.reason else "")
        case RunResumed():
            return f"{run}: resumed"
        case SignalSent():
            return f"{run}: signal {change.name!r} recorded"
        case AttemptTransitioned() | WaitStarted() | WaitEnded():
            return progress_line(run, change)
        case (
            StepCalled() | AttemptCreated() | IntentPlanned() | IntentChanged() | IntentReconciled()
            | DomainStateSet() | StepResult()
        ):  # fmt: skip
            return None
        case _:
            assert_never(change)


UNLOGGED: Final[frozenset[type[Change]]] = frozenset(
    {StepCalled, AttemptCreated, IntentPlanned, IntentChanged, IntentReconciled, DomainStateSet, StepResult}
)
"""The records `run_log_message` says nothing for (a test holds the two in step)."""


@final
class LogRecords:
    """Logs a run's course through ``logging.getLogger("attempt_kernel.run")``.

    INFO: a run's start, end, stop, resume and cancel, each attempt's move
    and each wait; WARNING: an attempt that became ``Indeterminate``. The
    logger's handlers (the application's, or the command line's) add the
    time. Nothing is formatted unless the logger would emit the line.
    """

    __slots__ = ("_logger",)

    def __init__(self, logger: logging.Logger = _RUN_LOGGER) -> None:
        self._logger: Final = logger

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        if type(change) not in UNLOGGED:  # most records: nothing to ask the logger
            self.log(run, change)

    def log(self, run: str, change: Change) -> None:
        """`record_written` without the time (it reads none), for the executor's own
        use, which skips the `UNLOGGED` records before calling; like any observer
        it never raises: a failing handler is logged."""
        try:
            level = _level(change)
            if not self._logger.isEnabledFor(level):
                return
            message = run_log_message(run, change)
            if message is not None:
                self._logger.log(level, "%s", shown(message))
        except Exception:  # an observer never stops a run (module doc)
            LOGGER.exception("observer %r failed on a record of run %r", self, run)

    def say(self, level: int, line: str) -> None:
        """Log ``line`` at ``level``: a line of a run's course that no record carries (what a
        reconciler asked as a graceful stop ended an attempt answered, `asked_line`); like
        `log`, it never raises."""
        try:
            self._logger.log(level, "%s", shown(line), extra={UNRECORDED: True})
        except Exception:  # an observer never stops a run (module doc)
            LOGGER.exception("observer %r failed on the line %r", self, line)
