"""What ``attempt-kernel runs`` lists: one row per run, and the filters that narrow it.

Owns `RunRow` (a run's line, made from a ledger's view or read from a
store's summary), `RunFilter` with the parsing of its command-line words,
and `select`, the filter over rows a fold made (a PostgreSQL journal
filters in SQL, `PgJournal.listed`, with the same meaning). Where a run
stands is the ledger's to say (`RunView.standing`); this module renders
nothing (`_report` does) and reads no store.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Final, Literal

from typing_extensions import TypeAlias, final

from ._ledger import RunView

ListedStatus: TypeAlias = Literal[
    "queued", "running", "waiting", "interrupted", "succeeded", "failed", "cancelled",
    "needs-reconciliation",
]  # fmt: skip
"""A run's status in ``attempt-kernel runs``: a `RunStanding`, or ``queued``
(submitted to a PostgreSQL journal, no record written yet)."""

LISTED_STATUSES: Final[tuple[ListedStatus, ...]] = (
    "queued", "running", "waiting", "interrupted", "succeeded", "failed", "cancelled",
    "needs-reconciliation",
)  # fmt: skip
"""Every `ListedStatus`, in the order ``--help`` names them (a test checks the two agree)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class WaitOn:
    """What a waiting run waits on: a signal (``signal`` its name) or a timer."""

    signal: str | None
    """The signal's name (None: a sleep)."""
    wake_us: int | None
    """When the wait ends by itself (a sleep's wake time, a timeout; None: never)."""
    came: bool = False
    """What it waits for came already (a signal it takes is recorded, or its wake time
    passed): the run no longer waits for it, and goes on once a process takes it up."""
    signal_came: bool = False
    """A signal it takes is recorded (then `came` too): the wait ends with it, not by
    its wake time."""

    @staticmethod
    def at(signal: str | None, wake_us: int | None, *, signal_came: bool, now_us: int) -> WaitOn:
        """The wait as it stands at ``now_us``: it came if its signal did, or its wake time
        is at or before then."""
        came = signal_came or (wake_us is not None and wake_us <= now_us)
        return WaitOn(signal=signal, wake_us=wake_us, came=came, signal_came=signal_came)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    """One line of `attempt-kernel runs`."""

    run: str
    workflow: str | None
    status: ListedStatus
    attempts: int
    started_us: int | None
    """When its run_started record was written; for a queued run, when it was submitted."""
    ended_us: int | None
    domain_state: str | None
    waiting_on: tuple[WaitOn, ...] = ()
    """What it waits on, when its status is ``waiting``."""
    cancel_requested: bool = False
    """Its status is ``waiting`` and its cancel was recorded: it waits for nothing now, and
    ends cancelled once a process takes it up (its waits stay open in the log until then)."""

    @staticmethod
    def of(view: RunView, writer_live: bool, *, now_us: int | None = None) -> RunRow:
        """The row for a run; ``writer_live``: a writer holds the log, so an
        unfinished run is running rather than interrupted. ``now_us`` (default:
        the clock's) says whether a wake time has passed."""
        now = time.time_ns() // 1000 if now_us is None else now_us
        standing = view.standing()
        if standing == "interrupted" and writer_live and not view.finished:
            standing = "running"
        return RunRow(
            run=view.run,
            workflow=view.workflow,
            status=standing,
            attempts=view.attempts,
            started_us=view.started_us,
            # a reconciled run waiting for recovery has not ended yet
            ended_us=view.ended_us if standing != "interrupted" else None,
            domain_state=view.domain_state,
            waiting_on=tuple(
                WaitOn.at(w.signal, w.wake_us, signal_came=took, now_us=now) for w, took in view.open_waits_taking()
            )
            if standing == "waiting"
            else (),
            cancel_requested=standing == "waiting" and view.cancel_requested,
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunFilter:
    """Which runs `attempt-kernel runs` prints, and how many.

    A run is kept when its status is one of ``statuses`` (None: any), its
    workflow is ``workflow`` (None: any), and its start time (a queued
    run's: its submit time) is at or after ``since_us`` and before
    ``until_us``. With ``limit``, the ``limit`` most recently started of
    those, newest first (runs with no start time last); without it, every
    one in the journal's order.
    """

    statuses: frozenset[ListedStatus] | None = None
    workflow: str | None = None
    since_us: int | None = None
    until_us: int | None = None
    limit: int | None = None

    def keeps(self, row: RunRow) -> bool:
        """Does ``row`` pass the filter (``limit`` aside)?"""
        if self.statuses is not None and row.status not in self.statuses:
            return False
        if self.workflow is not None and row.workflow != self.workflow:
            return False
        if self.since_us is not None and (row.started_us is None or row.started_us < self.since_us):
            return False
        if self.until_us is not None and (row.started_us is None or row.started_us >= self.until_us):
            return False
        return True


def select(rows: Sequence[RunRow], only: RunFilter) -> list[RunRow]:
    """The rows ``only`` keeps, in its order (``rows``: in the journal's order)."""
    kept = [row for row in rows if only.keeps(row)]
    if only.limit is None:
        return kept
    # Newest first; at one microsecond, the later in the journal first.
    ranked = sorted(
        range(len(kept)),
        key=lambda i: (kept[i].started_us is not None, kept[i].started_us or 0, i),
        reverse=True,
    )
    return [kept[i] for i in ranked[: only.limit]]


def listed_status(text: str) -> ListedStatus | None:
    """The status ``text`` names, or None when it names none."""
    for status in LISTED_STATUSES:
        if status == text:
            return status
    return None


def parse_statuses(text: str) -> tuple[ListedStatus, ...]:
    """``failed`` or ``failed,cancelled``: the statuses named, or `ValueError` naming the unknown one."""
    found: list[ListedStatus] = []
    for word in text.split(","):
        status = listed_status(word.strip())
        if status is None:
            raise ValueError(
                f"unknown status {word.strip()!r} (known: {', '.join(LISTED_STATUSES)})"
            )
        found.append(status)
    return tuple(found)


_UTC_TIME: Final = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z")


def parse_time(text: str) -> int:
    """An ISO-8601 UTC time as `runs` prints it (``2026-12-01T14:07:55Z``, or with
    ``.123`` up to microseconds), in microseconds since the epoch; `ValueError` otherwise."""
    matched = _UTC_TIME.fullmatch(text)
    if matched is None:
        raise ValueError(
            f"expected a UTC time like 2026-12-01T14:07:55Z or 2026-12-01T14:07:55.123Z, got {text!r}"
        )
    year, month, day, hour, minute, second = (int(part) for part in matched.groups()[:6])
    fraction = matched.group(7) or ""
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError as error:
        raise ValueError(f"{text!r} is no time: {error}") from None
    seconds = int((moment - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds())
    return seconds * 1_000_000 + int(fraction.ljust(6, "0") or "0")
