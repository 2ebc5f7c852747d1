"""Recovery after a crash: a ledger of the log turned into resume points.

A code workflow's run is handed back without touching it: its function
runs again (in the executor) before anything is written for it, so that a
divergence is found first, and the options of its unfinished steps
(reconcilers among them) are the ones the code passes now. Only a code run
whose cancel was decided is closed here, its orphans ended without asking
reconcilers (the code that names them is not run for a cancelled run).

docs/contracts.md, "Recovery": reopen the log, cut a torn tail (its bytes are
kept in a side file, never silently dropped), rebuild the state (the ledger,
`_ledger`), and end each orphaned attempt: a `Running` one with
``Cancel(intent_dispatched=<is an intent outstanding?>)``, a `Pending` one with
``Cancel(intent_dispatched=False)``, both asked of the ledger. Before that,
each outstanding intent of an orphan whose step names a reconciler for it is
asked about: an answer is recorded as a reconciliation first, so the attempt
ends `Cancelled` and only what nobody could answer ends `Indeterminate`. A run
whose cancel was decided is then closed, never resumed (docs/contracts.md,
"Decisions are records"); every other unfinished run, and every run that ended
needing reconciliation and has been reconciled since, is handed back as resume
points (`PriorStep` per step) for the executor.

Recovery refuses a log the ledger finds violations in: resuming from a state
the log does not prove would write more records on top of a lie. It is
restartable: stopped at any point, run it again and it goes on from what the
log then says. Reconcilers are async; recovery runs them on an event loop
of its own, each under a deadline (one that raises or runs past it counts
as unknown).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from typing_extensions import assert_never, final

from ._attempt import AttemptState, is_terminal
from ._errors import AttemptKernelError
from ._findings import (
    RECONCILER_DEADLINE,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectUnknown,
    Reconciler,
    ask_all,
)
from ._inbox import LedgerDelivery, locked_inbox
from ._intent import CONFIRMED, DISPATCHED, REJECTED, Confirm, Reject, is_outstanding
from ._ledger import Ledger, PriorStep, snapshot
from ._logfile import RunLogWriter
from ._observe import RunObserver, tell
from ._records import Change, IntentReconciled, LogItem, RunFinished, TornTail
from ._store import Journal
from ._workflow import Workflow, check_by_name



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
class Asked:
    """A reconciler asked about an orphan's outstanding intent, and what it found."""

    run: str
    step: str
    attempt: int
    intent: str
    key: str
    finding: EffectFinding


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
    asked: tuple[Asked, ...] = ()
    """Reconcilers asked before the orphans were ended, with their answers."""
    taken_in: tuple[str, ...] = ()
    """What `recover_log` did with each entry of the log's inbox, one line each:
    ``<run>: took in ...`` or ``<run>: dropped ...: <why>`` (a run that finished, a
    change recorded already)."""
    left_waiting: tuple[str, ...] = ()
    """Runs that only wait (for a signal or a wake time), left to whoever claims
    waiting runs: PostgreSQL workers (`recover` without ``include_waiting``)."""

    @property
    def changed_nothing(self) -> bool:
        """True when the log needed no cut, no orphan ending, no closing and no resume."""
        return (
            self.torn_tail is None
            and not self.orphans
            and not self.runs
            and not self.closed
            and not self.asked
        )


_SHOWN: Final = 3


@final
class _Told:
    """A journal whose appends are told to observers, with the time each was written:
    what recovery writes, told as an executor tells what it writes."""

    def __init__(self, journal: Journal, observers: Sequence[RunObserver]) -> None:
        self._journal: Final = journal
        self._observers: Final = tuple(observers)

    def read(self) -> Iterator[LogItem]:
        return self._journal.read()

    def append(self, run: str, change: Change) -> int:
        seq = self._journal.append(run, change)
        tell(self._observers, run, change, time.time_ns() // 1000)  # the executor's clock
        return seq

    def flush(self) -> None:
        self._journal.flush()


def recover(
    journal: Journal,
    workflows: Mapping[str, Workflow],
    *,
    source: str = "the log",
    reconciler_deadline: float = RECONCILER_DEADLINE,
    only_runs: Collection[str] | None = None,
    skip_runs: Collection[str] = frozenset(),
    include_waiting: bool = False,
    claimable: Callable[[Collection[str]], Collection[str]] | None = None,
    observers: Sequence[RunObserver] = (),
    on_asked: Callable[[Sequence[Asked]], None] | None = None,
) -> Recovery:
    """Recover a journal already held by this writer (any store, through the
    storage seam).

    Reads it into a ledger and refuses it if there is a violation or a run to
    resume whose workflow is not in ``workflows`` (by name; nothing is
    written then). Asks the steps' reconcilers about the orphans'
    outstanding intents and records what they found, ends every orphaned
    attempt through `transition` and into the journal, closes the runs whose
    cancel was decided, and returns the rest to resume: unfinished runs, and
    runs that ended needing reconciliation and were reconciled since.
    ``source`` names the journal in error messages. ``only_runs``, if given,
    limits recovery to those runs (a worker taking one run over),
    and takes up those of them that wait too (a worker claiming a released
    waiting run: handed back, or closed when its cancel was decided);
    ``skip_runs`` leaves those alone (runs a live worker drives); the whole
    journal must still obey the kernel. A run that only waits (standing
    ``waiting``) is handed back only with ``include_waiting`` (to wait in
    this process: a file log has no other driver for it) or when
    ``only_runs`` names it; otherwise it is left to whoever claims waiting
    runs (PostgreSQL workers, which close it once its cancel is decided),
    and named in `Recovery.left_waiting`. ``claimable``, if given, is asked
    which of those runs someone else can claim at all: the others, which no
    one else would take up (on PostgreSQL, runs that ``attempt-kernel run
    URL`` started, never submitted to the queue), are taken up here once
    they can go on (a signal they wait for came, a wake time passed, a
    cancel came), and left waiting, named, until then. ``observers`` are
    told of each record recovery appends (`RunObserver`), once it is
    appended, with the time it was written. ``on_asked``, if
    given, is called with the reconcilers' answers (`Asked`) once they came
    and before anything is written: what they said about the downstream
    system is known to the caller even when a write then fails (a
    PostgreSQL worker that lost the run's lease meanwhile logs them).
    """
    check_by_name(workflows, "recover")
    if observers:
        journal = _Told(journal, observers)
    ledger = Ledger()
    ledger.feed(journal.read())
    if ledger.violation_count:
        shown = "; ".join(f"line {v.line}: {v.reason}" for v in ledger.violations[:_SHOWN])
        raise RecoveryError(
            f"{source}: the log has {ledger.violation_count} violation(s) ({shown});"
            " recovery resumes only a log that obeys the kernel"
            " (see `attempt-kernel replay`)"
        )
    # A waiting run is taken up with ``include_waiting`` (a file log: nothing
    # else drives its waiting runs) or when named in ``only_runs`` (a worker
    # that claimed it again): it is handed back, or closed if its cancel was
    # decided meanwhile. Elsewhere (``recover URL``) it is left to the workers.
    # One that ``claimable`` names is the workers' and is not asked of
    # ``skip_runs`` (asking takes hold of a run, `recover URL`'s `RunHolds`,
    # which would keep workers and operators' changes off it meanwhile).
    candidates = [
        view.run
        for view in ledger.runs.values()
        if view.standing() == "waiting" and not include_waiting and only_runs is None
    ]  # fmt: skip
    if claimable is None:
        waiting = [run for run in candidates if run not in skip_runs]
        others = set(waiting)
    else:
        others = set(claimable(candidates)) if candidates else set[str]()
        waiting = [run for run in candidates if run in others or run not in skip_runs]
    now_us = time.time_ns() // 1000
    ready = {run for run in waiting if run not in others and ledger.runs[run].can_go_on(now_us)}
    left_waiting = tuple(run for run in waiting if run not in ready)
    todo = [
        view
        for view in ledger.runs.values()
        if (
            view.standing() == "interrupted"
            or (view.standing() == "waiting" and (include_waiting or only_runs is not None))
            or view.run in ready
        )
        and (only_runs is None or view.run in only_runs)
        and view.run not in skip_runs
    ]
    for view in todo:
        if view.cancel_requested:
            continue  # closed below; its workflow is not needed
        if view.workflow is None:
            raise RecoveryError(
                f"{source}: run {view.run!r} has no run_started record, so its workflow is"
                " unknown and it cannot be resumed"
            )
        if view.workflow not in workflows:
            raise RecoveryError(
                f"{source}: run {view.run!r} belongs to workflow {view.workflow!r}, which this"
                f" program was not given (given: {', '.join(sorted(workflows)) or 'none'});"
                " pass it with --workflows MODULE:ATTR"
            )
        given_code = workflows[view.workflow].function is not None
        if given_code != view.code:
            kinds = ("a DAG", "a code workflow")
            raise RecoveryError(
                f"{source}: run {view.run!r} was started by {kinds[view.code]} named"
                f" {view.workflow!r}, but the workflow given by that name is"
                f" {kinds[given_code]}; pass the workflow the run started with"
            )
    # docs/contracts.md, "Recovery": ask before ending; what is answered is
    # recorded first.
    questions: list[tuple[str, str, int, str, str, Reconciler]] = []
    for view in todo:
        workflow = workflows.get(view.workflow) if view.workflow is not None else None
        if workflow is None or view.code:
            # A code run's steps are known only once its function runs again:
            # the executor asks their reconcilers, after checking the code
            # against the log (nothing is written for a run that diverged).
            continue
        for name, step in view.steps.items():
            step_def = workflow.by_name.get(name)
            if step_def is None or is_terminal(step.attempt.state):
                continue
            for intent, state in step.attempt.intents.items():
                reconciler = step_def.reconcilers.get(intent)
                if is_outstanding(state) and reconciler is not None:
                    key = step.keys[intent]
                    questions.append((view.run, name, step.attempt.number, intent, key, reconciler))
    findings = (
        asyncio.run(ask_all([(q[5], q[4]) for q in questions], reconciler_deadline))
        if questions
        else []
    )
    asked = [
        Asked(run=run, step=name, attempt=number, intent=intent, key=key, finding=finding)
        for (run, name, number, intent, key, _), finding in zip(questions, findings)
    ]
    if on_asked is not None and asked:
        on_asked(asked)
    for (run, name, number, intent, key, _), finding in zip(questions, findings):
        match finding:
            case EffectHappened():
                change = IntentReconciled(
                    step=name, attempt=number, name=intent, key=key, from_state=DISPATCHED,
                    cause=Confirm(), to_state=CONFIRMED, result=finding.result,
                    by="reconciler", note="asked by recovery before ending the orphaned attempt",
                )  # fmt: skip
            case EffectNotHappened():
                change = IntentReconciled(
                    step=name, attempt=number, name=intent, key=key, from_state=DISPATCHED,
                    cause=Reject(), to_state=REJECTED,
                    by="reconciler", note="asked by recovery before ending the orphaned attempt",
                )  # fmt: skip
            case EffectUnknown():
                continue
            case _:
                assert_never(finding)
        journal.append(run, change)
        ledger.apply_change(run, change)
    orphans: list[OrphanEnded] = []
    runs: list[RecoveredRun] = []
    closed: list[str] = []
    for view in todo:
        run = view.run
        if view.code and not view.cancel_requested:
            # Resumed by running its function again (see above): its orphans
            # are ended then, by the executor, once the code is checked.
            steps = {name: snapshot(step) for name, step in view.steps.items()}
            runs.append(RecoveredRun(run=run, workflow=view.workflow or "", steps=steps))
            continue
        for name, step in list(view.steps.items()):
            attempt = step.attempt
            before = attempt.state
            if is_terminal(before):
                continue
            # docs/contracts.md, "Cancelled or Indeterminate: the intent record
            # decides": the flag is what the intent record says
            ended = ledger.propose_move(run, name, ledger.cancel_cause(run, name))
            journal.append(run, ended)
            ledger.apply_change(run, ended)
            orphans.append(
                OrphanEnded(
                    run=run,
                    step=name,
                    attempt=attempt.number,
                    from_state=before,
                    to_state=ended.to_state,
                    outstanding=step.outstanding(),
                )
            )
        if view.cancel_requested:
            # docs/contracts.md, "Decisions are records": a cancel that was
            # decided is never undone by a crash
            journal.append(run, RunFinished())
            ledger.apply_change(run, RunFinished())
            closed.append(run)
            continue
        assert view.workflow is not None  # checked above
        steps = {name: snapshot(step) for name, step in view.steps.items()}
        runs.append(RecoveredRun(run=run, workflow=view.workflow, steps=steps))
    journal.flush()
    return Recovery(
        torn_tail=None,
        side_file=None,
        orphans=tuple(orphans),
        runs=tuple(runs),
        closed=tuple(closed),
        asked=tuple(asked),
        left_waiting=left_waiting,
    )


def recover_log(
    path: str | os.PathLike[str],
    workflows: Mapping[str, Workflow],
    *,
    reconciler_deadline: float = RECONCILER_DEADLINE,
    skip_runs: Collection[str] = frozenset(),
    observers: Sequence[RunObserver] = (),
    on_asked: Callable[[Sequence[Asked]], None] | None = None,
) -> tuple[RunLogWriter, Recovery]:
    """Recover the run log file at ``path``; return the open writer and what was done.

    Takes the writer's lock (a missing file is an error, never created), cuts
    a torn tail (kept in a side file), takes in the changes operators left in
    the log's inbox, ``<log>.inbox`` (docs/run-log.md, "The inbox"; a corrupt
    inbox is refused with a `RunLogError` naming its line; what became of
    each entry is in `Recovery.taken_in`), then `recover`s it (leaving
    ``skip_runs`` alone). The caller resumes ``Recovery.runs`` with the
    returned writer and closes it. ``observers`` are told of every record it
    appends (the inbox's changes taken in too), and ``on_asked`` of the
    reconcilers' answers before anything is written for them, as `recover`
    says.

    Refused, nothing written: a missing file or one that is no regular file
    (`LogOpenError`), a log another writer holds (`LogLocked`), a corrupt
    line before the last one, which no recovery can mend
    (`LogNeedsRecovery`, naming the line and why), and a log that breaks the
    kernel's rules or holds a run this program cannot resume (`RecoveryError`).
    """
    check_by_name(workflows, "recover_log")  # before the log is opened: nothing is cut
    writer = RunLogWriter(path, cut_torn_tail=True, create=False)
    taken_in: list[str] = []
    try:
        # What operators sent while a writer that died held the log: taken in
        # first, so that recovery decides with it (a cancel closes its run).
        # An entry that no longer applies is dropped, with a line saying why.
        with locked_inbox(path, create=False) as inbox:
            if inbox is not None and inbox.size() > 0:
                inbox.take_in(LedgerDelivery(_Told(writer, observers) if observers else writer), taken_in.append)
        done = recover(
            writer,
            workflows,
            source=str(path),
            reconciler_deadline=reconciler_deadline,
            skip_runs=skip_runs,
            include_waiting=True,
            observers=observers,
            on_asked=on_asked,
        )
    except BaseException:
        writer.close()
        raise
    return writer, Recovery(
        torn_tail=writer.cut,
        side_file=writer.side_file,
        orphans=done.orphans,
        runs=done.runs,
        closed=done.closed,
        asked=done.asked,
        taken_in=tuple(taken_in),
        left_waiting=done.left_waiting,
    )
