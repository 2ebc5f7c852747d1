"""The replayer: the ledger fed a whole log, plus the report of what it found.

It proves a recorded log obeys the kernel (docs/contracts.md, "Replay proves a
log"). Every rule is the ledger's (`_ledger`): each attempt change goes through
`transition` and must give the recorded ``to``; the recorded from-state must be
the tracked one; nothing follows a terminal state; intent changes obey
`intent_transition` and belong to a `Running` attempt; a ``Cancel``'s
``intent_dispatched`` equals what the log's own intent records say; sequence
numbers go up by one; a run starts at most once and nothing of it follows its
run_finished; no attempt starts after the run's cancel was requested. This
module only feeds the ledger and freezes what it found into a `ReplayReport`.

It streams: memory holds the steps of runs that have not finished, not the
log. It never writes to the log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from dataclasses import dataclass

from typing_extensions import final

from ._attempt import AttemptState
from ._ledger import Ledger, OpenAttempt, Violation
from ._logfile import FileLog
from ._records import LogItem, TornTail
from ._store import LogSource


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayReport:
    """What a replay found. ``valid`` is true when there is no violation.

    A torn tail is not a violation: it is the unacknowledged record a crash
    cut short; every complete record before it was checked. A log with no
    complete record at all (an empty file, or one holding only a torn tail)
    is valid too: it records nothing, so nothing in it breaks a rule.
    """

    records: int
    final_states: Mapping[AttemptState, int]
    """Attempts by the state they are in at the end of the log, in the order of
    the transition table (`ALL_STATES`)."""
    indeterminate: tuple[OpenAttempt, ...]
    to_reconcile: tuple[OpenAttempt, ...]
    """Attempts that ended in another state with intents still outstanding."""
    unresolved_intents: int
    violations: tuple[Violation, ...]
    violation_count: int
    torn_tail: TornTail | None
    unfinished: tuple[str, ...] = ()
    """Runs that have not finished (or were reconciled since): recovery resumes them."""

    @property
    def valid(self) -> bool:
        """True when every complete record obeys the kernel."""
        return self.violation_count == 0


def feed(ledger: Ledger, items: Iterable[LogItem]) -> TornTail | None:
    """Apply every item of a log to ``ledger``; return the torn tail, if any."""
    return ledger.feed(items)


def report(ledger: Ledger, torn: TornTail | None) -> ReplayReport:
    """Freeze what ``ledger`` found into a report."""
    return ReplayReport(
        records=ledger.records,
        final_states=ledger.final_states(),
        indeterminate=tuple(ledger.indeterminate),
        to_reconcile=tuple(ledger.to_reconcile),
        unresolved_intents=ledger.unresolved_intents,
        violations=tuple(ledger.violations),
        violation_count=ledger.violation_count,
        torn_tail=torn,
        unfinished=tuple(
            view.run for view in ledger.runs.values() if view.standing() in ("interrupted", "waiting")
        ),
    )


def replay_items(items: Iterable[LogItem]) -> ReplayReport:
    """Replay log items already read (or built in memory)."""
    ledger = Ledger()
    return report(ledger, feed(ledger, items))


def replay(log: str | os.PathLike[str] | LogSource) -> ReplayReport:
    """Replay a run log: a path to a file, or any `LogSource`.

    Raises `LogOpenError` if the file is missing or is not a regular file.
    """
    source = FileLog(log) if isinstance(log, (str, os.PathLike)) else log
    return replay_items(source.read())
