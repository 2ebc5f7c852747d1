"""Resuming from Python: recover a log and drive its runs on, in one call.

What ``attempt-kernel recover`` does, as a library function: `resume_log`
recovers the log (a file through `recover_log`: its lock, its torn tail; any
other `Journal` through `recover`: reconcilers, orphans, cancelled runs
closed) and resumes every run recovery hands back with the workflows given,
on the same writer.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from typing_extensions import TypeAlias, final

from ._coderun import WorkflowDiverged
from ._executor import Job, RunControl, Stopper, drive_jobs
from ._outcome import RunReport
from ._findings import RECONCILER_DEADLINE
from ._inbox import settle_inbox
from ._observe import RunObserver
from ._records import WaitStarted
from ._recovery import Asked, Recovery, recover, recover_log
from ._store import Journal
from ._workflow import Workflow, workflows_by_name

Supervisor: TypeAlias = Callable[[RunControl], Awaitable[None]]
"""Plays the outside world beside a run (it may call ``control.cancel()``)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed:
    """What `resume_log` did: the recovery, then each resumed run's report.

    ``diverged`` lists the code workflows' runs whose code no longer matches
    their log: each was left untouched (nothing written, nothing sent).
    """

    recovery: Recovery
    reports: tuple[RunReport, ...]
    diverged: tuple[WorkflowDiverged, ...] = ()


def resume_log(
    log: str | os.PathLike[str] | Journal,
    workflows: Iterable[Workflow],
    *,
    supervisors: Mapping[str, Supervisor] | None = None,
    admission_limit: int = 8,
    progress: Callable[[str], None] | None = None,
    stop_on_signals: bool = False,
    grace: float = 5.0,
    reconciler_deadline: float = RECONCILER_DEADLINE,
    on_recovered: Callable[[Recovery], None] | None = None,
    skip_runs: Collection[str] = frozenset(),
    on_taken_up: Callable[[Recovery], None] | None = None,
    on_wait: Callable[[str, WaitStarted], None] | None = None,
    stopper: Stopper | None = None,
    let_go_after: float | None = None,
    claimable: Callable[[Collection[str]], Collection[str]] | None = None,
    on_diverged: Callable[[str], None] | None = None,
    source: str | None = None,
    observers: Sequence[RunObserver] = (),
    on_asked: Callable[[Sequence[Asked]], None] | None = None,
) -> Resumed:
    """Recover a run log and resume its runs; return what happened.

    ``log`` is a path to a run log file (its lock is taken and a torn tail
    cut, as `recover_log` does) or a `Journal` already open (any store).
    ``workflows`` are the workflows its runs may belong to (by name); a run
    of another workflow is refused (`RecoveryError`) before anything is
    written. ``supervisors`` (by workflow name) play the outside world beside
    each resumed run. ``on_taken_up`` is called for each code workflow's run
    once its function was checked against the log, with the reconcilers it
    asked and the orphans it ended then (recovery leaves those of a code run
    to that moment). ``on_wait`` is called each time a code run begins to
    wait (as `Executor` says). ``on_recovered`` is called once recovery is done and
    before any run is resumed (the CLI prints what recovery did there).
    With ``stop_on_signals``, SIGINT and SIGTERM stop the resumed runs
    gracefully (`RunsStopped`), as `run_jobs` says, and so does ``stopper``
    (`Stopper`) from another thread. ``skip_runs`` are left
    alone: neither recovered nor resumed (on a PostgreSQL journal, the runs
    a live worker drives, those `attempt-kernel runs URL` lists as
    ``running``; the CLI's ``recover`` passes them here). ``let_go_after``, if
    given, lets go of a code workflow's run once it only waits, with no wake
    time within that many seconds, as `Executor` says: its report says
    ``waiting``, and it waits in the log for the next process that resumes it
    (without it, the run waits in this process). On a `Journal`, a run that
    only waits is left to whoever claims waiting runs (PostgreSQL workers),
    but for those ``claimable`` (given the waiting runs, it returns those
    someone else can claim) leaves out: they are taken up here, as `recover`
    says. ``on_diverged`` is called with a run's id as soon as its code
    diverged (nothing was written for it, nor will be), while the other runs
    go on, on the event loop's thread, so a let-go that may wait belongs on
    another thread (``recover URL`` hands it to one). ``observers`` are told of every record
    written: by recovery first (the inbox's changes it takes in, the
    orphaned attempts it ends), then by the resumed runs, as `Executor`
    says. ``on_asked`` is called with reconcilers' answers (`Asked`) as soon
    as they come and before anything is written for them: recovery's (which
    ``on_recovered`` then tells, written) and a code run's as it is taken up
    (which ``on_taken_up`` then tells, durable); an answer told to
    ``on_asked`` and to neither of those is one the log may not hold, since
    a write failed or the runs stopped first (the command line prints it
    then, as what the downstream system said).
    ``source`` names a `Journal` in `RecoveryError` messages (default:
    its repr; `attempt-kernel recover URL` gives the URL without its
    password); a file is named by its path.
    """
    by_name = workflows_by_name(workflows)
    if isinstance(log, (str, os.PathLike)):
        writer, recovery = recover_log(
            log, by_name, reconciler_deadline=reconciler_deadline, skip_runs=skip_runs, observers=observers,
            on_asked=on_asked,
        )
        try:
            with writer:
                done = _resume(writer, recovery, by_name, supervisors, admission_limit, progress,
                               stop_on_signals, grace, on_recovered, on_taken_up, on_wait, stopper,
                               let_go_after, on_diverged, observers, on_asked)  # fmt: skip
        finally:
            # What a sender appended to the inbox while this process let the log go.
            settle_inbox(log, progress)
    else:
        recovery = recover(
            log, by_name, source=repr(log) if source is None else source, reconciler_deadline=reconciler_deadline,
            skip_runs=skip_runs,
            claimable=claimable,
            observers=observers,
            on_asked=on_asked,
        )  # fmt: skip
        done = _resume(log, recovery, by_name, supervisors, admission_limit, progress,
                       stop_on_signals, grace, on_recovered, on_taken_up, on_wait, stopper,
                       let_go_after, on_diverged, observers, on_asked)  # fmt: skip
    return Resumed(
        recovery=recovery,
        reports=tuple(r for r in done if isinstance(r, RunReport)),
        diverged=tuple(r for r in done if isinstance(r, WorkflowDiverged)),
    )


def _resume(
    journal: Journal,
    recovery: Recovery,
    by_name: Mapping[str, Workflow],
    supervisors: Mapping[str, Supervisor] | None,
    admission_limit: int,
    progress: Callable[[str], None] | None,
    stop_on_signals: bool,
    grace: float,
    on_recovered: Callable[[Recovery], None] | None,
    on_taken_up: Callable[[Recovery], None] | None,
    on_wait: Callable[[str, WaitStarted], None] | None,
    stopper: Stopper | None,
    let_go_after: float | None,
    on_diverged: Callable[[str], None] | None,
    observers: Sequence[RunObserver],
    on_asked: Callable[[Sequence[Asked]], None] | None,
) -> list[RunReport | WorkflowDiverged]:
    if on_recovered is not None:
        on_recovered(recovery)
    watchers = supervisors or {}
    jobs = [
        Job(
            workflow=by_name[run.workflow],
            run=run.run,
            prior=run.steps,
            supervise=watchers.get(run.workflow),
        )
        for run in recovery.runs
    ]
    if not jobs:
        return []
    return drive_jobs(
        journal,
        jobs,
        admission_limit=admission_limit,
        progress=progress,
        stop_on_signals=stop_on_signals,
        grace=grace,
        on_taken_up=on_taken_up,
        on_wait=on_wait,
        stopper=stopper,
        let_go_after=let_go_after,
        on_diverged=on_diverged,
        observers=observers,
        on_asked=on_asked,
    )
