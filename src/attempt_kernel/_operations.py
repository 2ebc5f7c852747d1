"""What an operator does to a run, from Python: signal, cancel, reconcile, resume.

The one place the command line (and the web view) asks to act on a run,
and to know what an action needs: which runs a live process drives now
(`held_runs`), whether a worker takes a run up (`submitted_for`), the runs
a filter keeps (`listed_runs`: on PostgreSQL from the runs' summaries, never
a read of the journal) and the next free run id (`next_run_id`).

The transports: `deliver_to_file` for a file log (recorded at once when no
other process writes the log, else left in its inbox, which that process
takes in within about a second), and, for a ``postgresql://`` URL, the
PostgreSQL journal's own (``attempt_kernel.postgres._deliver``, which needs the
postgres extra). What is recorded is built by `_operate` from a ledger of
the log as it is; a refusal (`OperationRefused`) leaves no trace.

A resume writes no record of its own: on PostgreSQL it makes the run
claimable for a worker of its workflow; on a file log it recovers and
drives the run in this process, with the workflows the caller loaded.
"""

from __future__ import annotations

import fcntl
import os
import shlex
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._codec import RecordTooLarge
from ._inbox import LedgerDelivery, locked_inbox
from ._ledger import Ledger
from ._logfile import FileLog, LogLocked, LogNeedsRecovery, RunLogWriter, now_us, open_regular
from ._operate import (
    Build,
    Delivery,
    Delivered,
    OperationRefused,
    cancel_change,
    reconcile_change,
    signal_change,
)
from ._records import JSON, CorruptLine, IntentReconciled, WaitStarted
from ._report import redacted
from ._runlist import RunFilter, RunRow, select
from ._store import is_url as _is_url
from ._workflow import Workflow, workflows_by_name

if TYPE_CHECKING:  # what resume_run's on_recovered is told, and its stopper
    from ._executor import Stopper
    from ._recovery import Asked, Recovery


def _no_violations(ledger: Ledger, path: Path) -> None:
    if ledger.violation_count:
        first = ledger.violations[0]
        raise OperationRefused(
            f"{path} breaks the kernel's rules (line {first.line}: {first.reason});"
            " nothing was written (see `attempt-kernel replay`)"
        )


def deliver_to_file(
    path: str | os.PathLike[str],
    build: Build,
    *,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], int] = now_us,
) -> Delivered:
    """Deliver the change ``build`` makes to the run log file at ``path``; durable on return.

    When no other process writes the log, this one takes its writer's lock,
    first takes in what a writer that died left in the inbox, then builds
    the change from the log as it is and records it (``recorded=True``).
    When another process holds the lock, the log is read without it, the
    change built from that, and appended to the log's inbox
    (``recorded=False``), which the holder takes in. So it is when no process
    holds the log but it ends in a torn tail (``needs_recovery=True``): the
    change, built from the records before the tail, waits in the inbox for
    whoever recovers the log (recovery cuts the tail, then takes the inbox
    in, checking each entry again). ``build`` refusing (`OperationRefused`)
    writes nothing. A missing file, one that is not a regular file, or one
    that is not a run log or holds corruption raises the error reading or
    writing it would (`LogOpenError`, `LogNeedsRecovery`).
    """
    log = Path(path)
    os.close(open_regular(log, os.O_RDONLY, "for reading"))
    built: tuple[str, Delivery] | None = None
    while True:
        # The inbox's lock is held while the writer's lock is tried: a holder
        # takes the inbox in under that lock before it lets the log go, so an
        # entry appended after seeing the log held is never left behind.
        with locked_inbox(log, create=built is not None) as inbox:
            try:
                writer = RunLogWriter(log, create=False)
            except (LogLocked, LogNeedsRecovery) as error:
                # docs/contracts.md, "A torn tail is not corruption": the tail was never
                # acknowledged, and only the inbox is written here; corruption is refused.
                torn = isinstance(error, LogNeedsRecovery)
                if torn and any(isinstance(item, CorruptLine) for item in FileLog(log).read()):
                    raise
                if built is None:
                    ledger = Ledger()
                    ledger.feed(FileLog(log).read())
                    _no_violations(ledger, log)
                    built = build(ledger)  # a refusal raises here: no inbox is made
                if inbox is None:  # no inbox yet: make one, then look again
                    continue
                run, change = built
                inbox.append(run, change, clock())
                return Delivered(run=run, change=change, recorded=False, needs_recovery=torn)
            with writer:
                deliver = LedgerDelivery(writer)
                _no_violations(deliver.ledger, log)
                if inbox is not None:
                    inbox.take_in(deliver, progress)
                try:
                    run, change = build(deliver.ledger)
                    why = deliver(run, change)
                finally:
                    if inbox is None:
                        # There was no inbox to lock: a process that found the
                        # log held meanwhile may have made one and appended to
                        # it. It is taken in before the log is let go, or it
                        # would wait for a writer that may never come.
                        with locked_inbox(log, create=False) as late:
                            if late is not None:
                                late.take_in(deliver, progress)
                if why is not None:
                    raise OperationRefused(f"{why}; nothing was written")
                return Delivered(run=run, change=change, recorded=True)


def deliver(log: str | os.PathLike[str], build: Build, *, run: str | None = None) -> Delivered:
    """`deliver_to_file`, or for a ``postgresql://`` URL the PostgreSQL journal's
    transport (``run``: the run the change is for, when known before building).

    A change too large for a record is refused as `OperationRefused` (nothing
    written) on every path, as the file log's inbox refuses it."""
    try:
        if _is_url(log):
            assert isinstance(log, str)
            try:
                from .postgres._deliver import deliver_pg  # psycopg is an optional dependency
            except ImportError as error:
                raise _needs_postgres(log, error) from None
            return deliver_pg(log, build, run=run)
        return deliver_to_file(log, build)
    except RecordTooLarge as error:  # the change was checked as JSON when built: only its size is left
        raise OperationRefused(str(error)) from error


def _named(log: str | os.PathLike[str]) -> str:
    """How a refusal names ``log``: its path, or its URL without the password."""
    return redacted(os.fspath(log))


def _needs_postgres(url: str, error: ImportError) -> OperationRefused:
    return OperationRefused(
        f"a PostgreSQL journal needs psycopg ({error}); install attempt-kernel[postgres];"
        " nothing was written"
    )


def no_such_run(log: str | os.PathLike[str], run: str) -> str | None:
    """Why ``run`` is no run of ``log`` without asking it: a PostgreSQL journal keeps run
    ids as text, and no text holds a NUL, nor UTF-8 a lone surrogate (which a log file's
    JSON may hold, and a web page's link carries). None when the journal may hold it; the
    driver would fail on such an id (an encoding error, or a failure that could not say
    whether anything was written)."""
    if not _is_url(log):
        return None
    try:
        run.encode("utf-8")
        holdable = "\x00" not in run
    except UnicodeEncodeError:  # a lone surrogate
        holdable = False
    if holdable:
        return None
    return (
        f"no run {run!r} in {_named(log)}: a PostgreSQL journal holds no run id with a NUL or a"
        " lone surrogate; nothing was written"
    )


def send_signal(log: str | os.PathLike[str], run: str, name: str, payload: JSON = None) -> Delivered:
    """Send signal ``name`` with ``payload`` (None: ``{}``) to ``run``; durable on return.

    ``log`` is a run log file (another process may be running it: the
    signal then waits in the log's inbox, `Delivered.recorded` False, until
    that process takes it in, within about a second) or a ``postgresql://``
    URL. The run's `RunContext.wait_for_signal` for ``name`` takes it, now
    or when it next waits for it (signals are a mailbox). Refused
    (`OperationRefused`, nothing written) for a run the log does not hold,
    that has finished or whose cancel is recorded, a DAG workflow's run, a bad name, or a payload JSON
    cannot carry, nested deeper than 100 levels, or too large for a record
    (`MAX_RECORD_BYTES`).
    """
    where = _named(log)
    held_by_none = no_such_run(log, run)
    if held_by_none is not None:
        raise OperationRefused(f"signal {name!r} to run {run!r}: {held_by_none}")
    return deliver(log, lambda ledger: (run, signal_change(ledger, run, name, payload, where=where)), run=run)


def cancel_run(log: str | os.PathLike[str], run: str, reason: str = "") -> Delivered:
    """Cancel ``run`` from outside: record the decision; durable on return.

    The process that runs it (or recovery, when none does) ends it: live
    attempts end as the intent record decides (``Cancelled``, or
    ``Indeterminate`` when an effect was dispatched), waits end, and the run
    finishes ``cancelled``. ``log`` as `send_signal` says. Refused
    (`OperationRefused`, nothing written) for an unknown or finished run,
    one whose cancel is recorded already, or a ``reason`` too large for a
    record.
    """
    where = _named(log)
    held_by_none = no_such_run(log, run)
    if held_by_none is not None:
        raise OperationRefused(f"cancel of run {run!r}: {held_by_none}")
    return deliver(log, lambda ledger: (run, cancel_change(ledger, run, reason, where=where)), run=run)


def reconcile_intent(
    log: str | os.PathLike[str],
    key: str,
    *,
    confirmed: bool,
    result: JSON = None,
    note: str = "",
    run: str | None = None,
) -> Delivered:
    """Resolve the outstanding intent with idempotency key ``key``; durable on return.

    ``confirmed``: the downstream system says the effect happened (with
    ``result``, if known); else it did not. The attempt keeps its state;
    once no intent of the step is outstanding, recovery (or the process
    running the log, which takes this in) resumes the run. ``log`` as
    `send_signal` says. Refused (`OperationRefused`, nothing written) when
    no intent has that key or it is not outstanding, or ``result`` is nested
    deeper than 100 levels or holds a number that is not finite, or the
    record would be too large (``result`` and ``note`` together). With
    ``run``, refused too when the key is another run's (a page of one run
    reconciles that run's intents only).
    """

    where = _named(log)

    def build(ledger: Ledger) -> tuple[str, IntentReconciled]:
        found, change = reconcile_change(ledger, key, confirmed=confirmed, result=result, note=note, where=where)
        if run is not None and found != run:
            raise OperationRefused(
                f"intent {key!r} belongs to run {found!r}, not to run {run!r}; nothing was written"
            )
        return found, change

    return deliver(log, build)


def next_run_id(ledger: Ledger, workflow: str, also_taken: Callable[[str], bool] | None = None) -> str:
    """``<workflow>-<n>``: one more than the runs of that workflow in the log, skipping ids
    taken (in the log, or, with ``also_taken``, those it says are: a journal's queue)."""
    taken = set(ledger.runs)
    n = 1 + sum(1 for view in ledger.runs.values() if view.workflow == workflow)
    while f"{workflow}-{n}" in taken or (also_taken is not None and also_taken(f"{workflow}-{n}")):
        n += 1
    return f"{workflow}-{n}"


def submitted_for(log: str | os.PathLike[str], run: str) -> str | None:
    """The workflow ``run`` was submitted for to a PostgreSQL journal's queue, whose workers
    take it up (a resume makes it claimable); None for a run never submitted, which
    ``attempt-kernel run --log URL`` started and only ``attempt-kernel recover URL`` goes
    on with, and for every run of a log file (which has no queue)."""
    if not _is_url(log):
        return None
    assert isinstance(log, str)
    try:
        from .postgres._deliver import submitted_for as pg_submitted_for  # psycopg is optional
    except ImportError as error:
        raise _needs_postgres(log, error) from None
    return pg_submitted_for(log, run)


def writer_holds(path: str | os.PathLike[str]) -> bool:
    """Does a process hold the log file's writer lock right now? (False for a missing file.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def writer_listed(path: str | os.PathLike[str]) -> bool:
    """`writer_holds`, asked without taking a lock where ``/proc/locks`` lists the system's locks.

    For whoever asks again and again (a scraper every second, an idle worker
    waiting for the log): the shared lock `writer_holds` takes for an
    instant would make a writer starting in that instant fail (`LogLocked`).
    Where ``/proc/locks`` cannot be read, `writer_holds` answers.
    """
    try:
        info = os.stat(path)
    except OSError:
        return False
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as locks:
            listed = locks.read()
    except OSError:
        return writer_holds(path)
    for entry in listed.splitlines():
        fields = entry.split()
        # "1: FLOCK  ADVISORY  WRITE 123 fd:01:456 0 EOF"; a waiter's entry has "->"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE" and fields[5] == where:
            return True
    return False


def held_runs(log: str | os.PathLike[str]) -> frozenset[str] | None:
    """Which unfinished runs a live process drives right now.

    None means all of them (a process holds the log file's writer lock);
    for a ``postgresql://`` URL, the runs whose owner is a live worker.
    """
    if _is_url(log):
        assert isinstance(log, str)
        try:
            from .postgres._journal import held_runs as pg_held_runs  # psycopg is optional
        except ImportError as error:
            raise _needs_postgres(log, error) from None
        return pg_held_runs(log)
    return None if writer_holds(log) else frozenset()


def resume_run(
    log: str | os.PathLike[str],
    run: str,
    workflows: Iterable[Workflow] = (),
    *,
    stop_on_signals: bool = False,
    grace: float = 5.0,
    on_recovered: Callable[[Recovery], None] | None = None,
    on_wait: Callable[[str, WaitStarted], None] | None = None,
    stopper: Stopper | None = None,
    on_taken_up: Callable[[Recovery], None] | None = None,
    on_asked: Callable[[Sequence[Asked]], None] | None = None,
) -> str:
    """Resume an unfinished run that no process drives; return what was done, in one sentence.

    For a ``postgresql://`` URL, the run is made claimable now, and a worker
    of its workflow takes it up (``workflows`` is not used). For a file log,
    the run is recovered and driven in this process until it finishes or
    stops (this call blocks meanwhile), with its workflow from
    ``workflows``: a run that waits (for a signal, or a timer) waits in this
    process, as under `run_jobs`, and a signal sent meanwhile reaches it
    through the log's inbox. ``on_recovered``, ``on_taken_up``, ``on_asked``
    and ``on_wait`` are told, as `resume_log` tells them, what recovery did
    and handed back, what taking up a code run did (the reconcilers it asked,
    the orphans it ended), each reconciler's answer as it came, and each wait
    the run is in (one it was left in, once its code was checked against the
    log, then each it begins). Refused (`OperationRefused`, nothing written) for an
    unknown or finished run, a run that needs reconciliation first, a run a
    process drives already, and, on a file log, a run whose workflow is not
    in ``workflows`` (the message names the command that resumes it).
    ``workflows`` are the workflows themselves, as `resume_log` takes them:
    a mapping by name (what `recover_log` takes) raises `TypeError` saying
    so, before the log is read.

    With ``stop_on_signals`` (from the main thread), SIGINT and SIGTERM stop
    a file log's run gracefully, giving live attempts ``grace`` seconds:
    the stop is recorded, the run stays unfinished for a later resume, and
    `RunsStopped` is raised (`resume_log`). Without it, a signal
    interrupts the call as it would any other. ``stopper`` (`Stopper`) stops
    it the same way from another thread.
    """
    held_by_none = no_such_run(log, run)
    if held_by_none is not None:
        raise OperationRefused(held_by_none)
    if _is_url(log):
        assert isinstance(log, str)
        try:
            from .postgres._deliver import resume_pg  # psycopg is an optional dependency
        except ImportError as error:
            raise _needs_postgres(log, error) from None
        return resume_pg(log, run)
    from ._resume import resume_log  # the executor's layer: only a resume needs it

    by_name = workflows_by_name(workflows, "resume_run")  # before the log is read: a mapping is refused
    path = Path(log)
    ledger = Ledger()
    ledger.feed(FileLog(path).read())
    _no_violations(ledger, path)
    view = ledger.runs.get(run)
    if view is None:
        raise OperationRefused(f"no run {run!r} in {path}; nothing was written")
    standing = view.standing()
    if standing == "needs-reconciliation":
        raise OperationRefused(
            f"run {run!r} needs reconciliation first (outstanding: {', '.join(view.outstanding())});"
            " nothing was written"
        )
    if view.finished and standing != "interrupted":
        raise OperationRefused(f"run {run!r} has finished ({standing}); nothing was written")
    if writer_holds(path):
        raise OperationRefused(f"a process drives {path} now, and its runs with it; nothing was written")
    if view.workflow is None:  # a log another program wrote: recovery refuses such a run too
        raise OperationRefused(
            f"run {run!r} has records in the log but no start record (`run_started`), so no workflow"
            " of it is known and nothing can resume it; nothing was written"
        )
    workflow = by_name.get(view.workflow)
    if workflow is None:
        raise OperationRefused(
            f"run {run!r} belongs to workflow {view.workflow!r}, which was not loaded; resume it"
            f" with `attempt-kernel recover {shlex.quote(str(path))} --workflows MODULE:ATTR`;"
            " nothing was written"
        )
    # Every other run, finished ones too: one that ended needing reconciliation and
    # was reconciled since is unfinished again, and recovery would resume it.
    others = {name for name in ledger.runs if name != run}
    try:
        resumed = resume_log(
            path, [workflow], skip_runs=others, stop_on_signals=stop_on_signals, grace=grace,
            on_recovered=on_recovered, on_wait=on_wait, stopper=stopper, on_taken_up=on_taken_up,
            on_asked=on_asked,
        )  # fmt: skip
    except LogLocked as error:
        raise OperationRefused(f"{error}; nothing was written") from None
    if resumed.diverged:
        raise OperationRefused(f"{resumed.diverged[0]}")
    for report in resumed.reports:
        if report.run == run:
            keys = [key for step in report.steps for key in step.outstanding]
            if report.status == "needs-reconciliation" and keys:
                # Where it stands is not enough: what to do next, and with which keys.
                return (
                    f"run {run!r} was resumed and ended needs-reconciliation (outstanding intent"
                    f" keys: {', '.join(keys)}); once the downstream system says what happened,"
                    f" `attempt-kernel reconcile {shlex.quote(str(path))} --key KEY --confirmed|--rejected`"
                    " records it for each key"
                )
            return f"run {run!r} was resumed and ended {report.status}"
    return f"run {run!r} was recovered: nothing was left for it to do"


def listed_runs(log: str | os.PathLike[str], only: RunFilter) -> tuple[list[RunRow], int]:
    """The runs of ``log`` that ``only`` keeps (as `attempt-kernel runs` lists them), and the log's violations.

    A log file is folded, then filtered; a PostgreSQL journal answers from
    its runs' summaries (`PgJournal.listed`), without a read of the journal.
    """
    if _is_url(log):
        assert isinstance(log, str)
        try:
            from .postgres._journal import PgJournal  # psycopg is an optional dependency
        except ImportError as error:
            raise OperationRefused(
                f"{redacted(log)}: a PostgreSQL journal needs psycopg ({error});"
                " install attempt-kernel[postgres]"
            ) from None
        with PgJournal(log) as journal:
            return journal.listed(only)
    ledger = Ledger()
    ledger.feed(FileLog(Path(log)).read())
    held = held_runs(log)
    rows = [RunRow.of(view, held is None or view.run in held) for view in ledger.runs.values()]
    return select(rows, only), ledger.violation_count
