"""Resuming from Python: recover a log and drive its runs on, in one call.

What ``attempt-kernel recover`` does, as a library function: `resume_log`
recovers the log (`recover_log`: torn tail, reconcilers, orphans, cancelled
runs closed) and resumes every run recovery hands back with the workflows
given, on the same writer.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from typing_extensions import TypeAlias, final

from ._executor import Job, RunControl, RunReport, run_jobs
from ._findings import RECONCILER_DEADLINE
from ._recovery import Recovery, recover_log
from ._workflow import Workflow

Supervisor: TypeAlias = Callable[[RunControl], Awaitable[None]]
"""Plays the outside world beside a run (it may call ``control.cancel()``)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed:
    """What `resume_log` did: the recovery, then each resumed run's report."""

    recovery: Recovery
    reports: tuple[RunReport, ...]


def resume_log(
    path: str | os.PathLike[str],
    workflows: Iterable[Workflow],
    *,
    supervisors: Mapping[str, Supervisor] | None = None,
    admission_limit: int = 8,
    progress: Callable[[str], None] | None = None,
    stop_on_signals: bool = False,
    grace: float = 5.0,
    reconciler_deadline: float = RECONCILER_DEADLINE,
    on_recovered: Callable[[Recovery], None] | None = None,
) -> Resumed:
    """Recover the run log at ``path`` and resume its runs; return what happened.

    ``workflows`` are the workflows its runs may belong to (by name); a run
    of another workflow is refused (`RecoveryError`) before anything is
    written. ``supervisors`` (by workflow name) play the outside world beside
    each resumed run. ``on_recovered`` is called once recovery is done and
    before any run is resumed (the CLI prints what recovery did there).
    With ``stop_on_signals``, SIGINT and SIGTERM stop the resumed runs
    gracefully (`RunsStopped`), as `run_jobs` says.
    """
    by_name = {workflow.name: workflow for workflow in workflows}
    watchers = supervisors or {}
    writer, recovery = recover_log(path, by_name, reconciler_deadline=reconciler_deadline)
    with writer:
        if on_recovered is not None:
            on_recovered(recovery)
        jobs = [
            Job(
                workflow=by_name[run.workflow],
                run=run.run,
                prior=run.steps,
                supervise=watchers.get(run.workflow),
            )
            for run in recovery.runs
        ]
        reports = (
            run_jobs(
                writer,
                jobs,
                admission_limit=admission_limit,
                progress=progress,
                stop_on_signals=stop_on_signals,
                grace=grace,
            )
            if jobs
            else []
        )
    return Resumed(recovery=recovery, reports=tuple(reports))
