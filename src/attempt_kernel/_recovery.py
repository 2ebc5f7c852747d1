"""Recovery after a crash: cut the torn tail, rebuild the runs, end orphans.

Spec §6 (normative in spirit): reopen the log, cut a torn tail (its bytes
are kept in a side file, never silently dropped), rebuild the state, and end
each orphaned attempt: a `Running` one with
``Cancel(intent_dispatched=<is an intent outstanding?>)``, a `Pending` one
with ``Cancel(intent_dispatched=False)``. What to resume is then the
executor's business (`PriorStep` per step). No asyncio here.

Recovery refuses a log the replayer finds violations in: resuming from a
state the log does not prove would write more records on top of a lie.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from typing_extensions import assert_never, final

from ._attempt import (
    AttemptState,
    Cancelled,
    Failed,
    Indeterminate,
    Pending,
    QueueDeadlinePassed,
    Running,
    Succeeded,
    TimedOut,
    TransitionCause,
    transition,
)
from ._errors import AttemptKernelError
from ._intent import cancel_cause, is_outstanding
from ._replay import Replayer, ReplayReport
from ._runlog import (
    JSON,
    AttemptCreated,
    AttemptTransitioned,
    IntentChanged,
    IntentPlanned,
    Record,
    RunFinished,
    RunLogWriter,
    RunStarted,
    StepResult,
    TornTail,
    read_log,
    state_name,
)


@final
class RecoveryError(AttemptKernelError):
    """The log cannot be recovered as it is (violations, or a run nobody can resume)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class PriorStep:
    """What the log says about one step of a run being resumed."""

    last_attempt: int
    state: AttemptState
    last_cause: TransitionCause | None
    """The cause of the last attempt's last transition (None if it never moved)."""
    tries: int
    """Attempts that ran and ended Failed or TimedOut (they count against max_attempts)."""
    result: JSON = None
    error: str | None = None
    outstanding: tuple[str, ...] = ()
    """Idempotency keys of the last attempt's intents still outstanding."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OrphanEnded:
    """An attempt the crash left live, and how recovery ended it."""

    run: str
    step: str
    attempt: int
    from_state: str
    to_state: str
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
    """What `recover_log` did and what is left to resume."""

    torn_tail: TornTail | None
    side_file: Path | None
    orphans: tuple[OrphanEnded, ...]
    runs: tuple[RecoveredRun, ...]

    @property
    def changed_nothing(self) -> bool:
        """True when the log needed no cut, no orphan ending and no resume."""
        return self.torn_tail is None and not self.orphans and not self.runs


@dataclass(slots=True)
class _StepFacts:
    last_cause: TransitionCause | None = None
    tries: int = 0
    result: JSON = None
    error: str | None = None


def _fold(path: Path) -> tuple[Replayer, dict[tuple[str, str], _StepFacts], ReplayReport]:
    """Replay the log, also keeping what resuming needs (results, tries)."""
    replayer = Replayer()
    facts: dict[tuple[str, str], _StepFacts] = {}
    for item in read_log(path):
        replayer.feed(item)
        if not isinstance(item, Record):
            continue
        change = item.change
        match change:
            case AttemptTransitioned():
                fact = facts.setdefault((item.run, change.step), _StepFacts())
                fact.last_cause = change.cause
                ran_and_failed = isinstance(change.to_state, (Failed, TimedOut)) and not isinstance(
                    change.cause, QueueDeadlinePassed
                )
                fact.tries += ran_and_failed
            case StepResult():
                fact = facts.setdefault((item.run, change.step), _StepFacts())
                fact.result, fact.error = change.value, change.error
            case AttemptCreated():
                fact = facts.setdefault((item.run, change.step), _StepFacts())
                fact.last_cause, fact.result, fact.error = None, None, None
            case RunFinished():
                for key in [k for k in facts if k[0] == item.run]:
                    del facts[key]
            case RunStarted() | IntentPlanned() | IntentChanged():
                pass
            case _:
                assert_never(change)
    return replayer, facts, replayer.report()


_SHOWN: Final = 3


def recover_log(path: str | os.PathLike[str], known_workflows: Mapping[str, object]) -> tuple[RunLogWriter, Recovery]:
    """Recover the log at ``path``; return the open writer and what was done.

    Takes the writer's lock, cuts a torn tail (kept in a side file), checks
    the log with the replayer, refuses it if there is a violation or a run
    whose workflow is not in ``known_workflows``, then ends every orphaned
    attempt through `transition` and into the log. The caller resumes
    ``Recovery.runs`` with the returned writer and closes it.
    """
    writer = RunLogWriter(path, cut_torn_tail=True)
    try:
        replayer, facts, report = _fold(Path(path))
        if not report.valid:
            shown = "; ".join(f"line {v.line}: {v.reason}" for v in report.violations[:_SHOWN])
            raise RecoveryError(
                f"{path}: the log has {report.violation_count} violation(s) ({shown});"
                " recovery resumes only a log that obeys the kernel"
                " (see `attempt-kernel replay`)"
            )
        # Unfinished runs: those with attempts, and those that only started.
        live_runs = {**dict.fromkeys(replayer.workflows), **dict.fromkeys(replayer.runs)}
        for run in live_runs:
            workflow = replayer.workflows.get(run)
            if workflow is None:
                raise RecoveryError(
                    f"{path}: run {run!r} has no run_started record, so its workflow is"
                    " unknown and it cannot be resumed"
                )
            if workflow not in known_workflows:
                raise RecoveryError(
                    f"{path}: run {run!r} belongs to workflow {workflow!r}, which this"
                    f" program does not know (known: {', '.join(sorted(known_workflows)) or 'none'})"
                )
        orphans: list[OrphanEnded] = []
        runs: list[RecoveredRun] = []
        for run in live_runs:
            priors: dict[str, PriorStep] = {}
            for step, track in replayer.runs.get(run, {}).items():
                attempt = track.latest
                fact = facts.get((run, step), _StepFacts())
                outstanding = tuple(
                    track.keys[name] for name, s in attempt.intents.items() if is_outstanding(s)
                )
                state = attempt.state
                match state:
                    case Running() | Pending():
                        # spec §6: the flag is what the intent record says
                        cause = cancel_cause(attempt.intents.values())
                        to = transition(state, cause)
                        writer.append(
                            run,
                            AttemptTransitioned(
                                step=step,
                                attempt=attempt.number,
                                from_state=state,
                                cause=cause,
                                to_state=to,
                            ),
                        )
                        orphans.append(
                            OrphanEnded(
                                run=run,
                                step=step,
                                attempt=attempt.number,
                                from_state=state_name(state),
                                to_state=state_name(to),
                                outstanding=outstanding,
                            )
                        )
                        state, fact.last_cause = to, cause
                    case Succeeded() | Failed() | Indeterminate() | Cancelled() | TimedOut():
                        pass
                    case _:
                        assert_never(state)
                priors[step] = PriorStep(
                    last_attempt=attempt.number,
                    state=state,
                    last_cause=fact.last_cause,
                    tries=fact.tries,
                    result=fact.result if isinstance(state, Succeeded) else None,
                    error=fact.error,
                    outstanding=outstanding,
                )
            runs.append(RecoveredRun(run=run, workflow=replayer.workflows[run], steps=priors))
        writer.flush()
    except BaseException:
        writer.close()
        raise
    return writer, Recovery(
        torn_tail=writer.cut, side_file=writer.side_file, orphans=tuple(orphans), runs=tuple(runs)
    )

