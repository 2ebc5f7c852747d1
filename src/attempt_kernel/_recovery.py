"""Recovery after a crash: a ledger of the log turned into resume points.

Spec §6 (normative in spirit): reopen the log, cut a torn tail (its bytes
are kept in a side file, never silently dropped), rebuild the state (the
ledger, `_ledger`), and end each orphaned attempt: a `Running` one with
``Cancel(intent_dispatched=<is an intent outstanding?>)``, a `Pending` one
with ``Cancel(intent_dispatched=False)``, both asked of the ledger. A run
whose cancel was decided (a ``run_cancel_requested`` record) is then closed,
never resumed (spec §4); every other unfinished run is handed back as resume
points (`PriorStep` per step) for the executor. No asyncio here.

Recovery refuses a log the ledger finds violations in: resuming from a state
the log does not prove would write more records on top of a lie. It is
restartable: stopped at any point, run it again and it goes on from what the
log then says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from typing_extensions import final

from ._attempt import AttemptState, is_terminal, transition
from ._errors import AttemptKernelError
from ._ledger import Ledger, PriorStep, snapshot
from ._logfile import RunLogWriter
from ._records import AttemptTransitioned, RunFinished, TornTail
from ._replay import feed
from ._store import Journal


@final
class RecoveryError(AttemptKernelError):
    """The log cannot be recovered as it is (violations, or a run nobody can resume)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OrphanEnded:
    """An attempt the crash left live, and how recovery ended it."""

    run: str
    step: str
    attempt: int
    from_state: AttemptState
    to_state: AttemptState
    outstanding: tuple[str, ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveredRun:
    """A run the log shows unfinished: its workflow and each step's standing."""

    run: str
    workflow: str
    steps: Mapping[str, PriorStep]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What recovery did and what is left to resume."""

    torn_tail: TornTail | None
    side_file: Path | None
    orphans: tuple[OrphanEnded, ...]
    runs: tuple[RecoveredRun, ...]
    """Unfinished runs to resume."""
    closed: tuple[str, ...] = ()
    """Runs whose cancel was decided before the crash: closed, not resumed."""

    @property
    def changed_nothing(self) -> bool:
        """True when the log needed no cut, no orphan ending, no closing and no resume."""
        return self.torn_tail is None and not self.orphans and not self.runs and not self.closed


_SHOWN: Final = 3


def recover(journal: Journal, known_workflows: Mapping[str, object], *, source: str = "the log") -> Recovery:
    """Recover a journal already held by this writer (any store, spec §4).

    Reads it into a ledger, refuses it if there is a violation or an
    unfinished run whose workflow is not in ``known_workflows`` (nothing is
    written then), ends every orphaned attempt through `transition` and into
    the journal, closes the runs whose cancel was decided, and returns the
    rest to resume. ``source`` names the journal in error messages.
    """
    ledger = Ledger()
    feed(ledger, journal.read())
    if ledger.violation_count:
        shown = "; ".join(f"line {v.line}: {v.reason}" for v in ledger.violations[:_SHOWN])
        raise RecoveryError(
            f"{source}: the log has {ledger.violation_count} violation(s) ({shown});"
            " recovery resumes only a log that obeys the kernel"
            " (see `attempt-kernel replay`)"
        )
    live = ledger.live_runs()
    for view in live:
        if view.cancel_requested:
            continue  # closed below; its workflow is not needed
        if view.workflow is None:
            raise RecoveryError(
                f"{source}: run {view.run!r} has no run_started record, so its workflow is"
                " unknown and it cannot be resumed"
            )
        if view.workflow not in known_workflows:
            raise RecoveryError(
                f"{source}: run {view.run!r} belongs to workflow {view.workflow!r}, which this"
                f" program does not know (known: {', '.join(sorted(known_workflows)) or 'none'})"
            )
    orphans: list[OrphanEnded] = []
    runs: list[RecoveredRun] = []
    closed: list[str] = []
    for view in live:
        run = view.run
        for name, step in list(view.steps.items()):
            attempt = step.attempt
            before = attempt.state
            if is_terminal(before):
                continue
            outstanding = step.outstanding()
            # spec §6: the flag is what the intent record says
            cause = ledger.cancel_cause(run, name)
            to = transition(before, cause)
            change = AttemptTransitioned(
                step=name, attempt=attempt.number, from_state=before, cause=cause, to_state=to
            )
            journal.append(run, change)
            ledger.apply_change(run, change)
            orphans.append(
                OrphanEnded(
                    run=run,
                    step=name,
                    attempt=attempt.number,
                    from_state=before,
                    to_state=to,
                    outstanding=outstanding,
                )
            )
        if view.cancel_requested:
            # spec §4: a cancel that was decided is never undone by a crash
            journal.append(run, RunFinished())
            ledger.apply_change(run, RunFinished())
            closed.append(run)
            continue
        assert view.workflow is not None  # checked above
        steps = {name: snapshot(step) for name, step in view.steps.items()}
        runs.append(RecoveredRun(run=run, workflow=view.workflow, steps=steps))
    journal.flush()
    return Recovery(
        torn_tail=None, side_file=None, orphans=tuple(orphans), runs=tuple(runs), closed=tuple(closed)
    )


def recover_log(
    path: str | os.PathLike[str], known_workflows: Mapping[str, object]
) -> tuple[RunLogWriter, Recovery]:
    """Recover the run log file at ``path``; return the open writer and what was done.

    Takes the writer's lock (a missing file is an error, never created), cuts
    a torn tail (kept in a side file), then `recover`s it. The caller resumes
    ``Recovery.runs`` with the returned writer and closes it.
    """
    writer = RunLogWriter(path, cut_torn_tail=True, create=False)
    try:
        done = recover(writer, known_workflows, source=str(path))
    except BaseException:
        writer.close()
        raise
    return writer, Recovery(
        torn_tail=writer.cut,
        side_file=writer.side_file,
        orphans=done.orphans,
        runs=done.runs,
        closed=done.closed,
    )
