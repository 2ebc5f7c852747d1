"""When a worker's lease is live, expiring or expired (docs/contracts.md, "A
worker presumed dead never writes again"): pure decisions.

Owns the one rule that judges a heartbeat's age; nothing else. No I/O, no
clock: every function is handed the times it judges, so the worker (its own
monotonic clock, measured from when it *sent* its last successful
heartbeat) and the database (``now()`` against the stamped
``heartbeat_at``, in the takeover statement of `_worker`, which mirrors
`lease_decision`'s ``EXPIRED``) ask the same question, and a test can run
it on a fake clock.

Why the holder stops before anyone may take over: the holder's age of its
own heartbeat is never smaller than the database's (it starts counting
before the database stamps the beat), so when a taker sees ``EXPIRED`` the
holder already sees at least ``EXPIRING`` and dispatches nothing; the
margin is the time its last ``Dispatched`` has to reach the effect.
"""

from __future__ import annotations

import enum

from typing_extensions import assert_never, final


@final
class LeaseVerdict(enum.Enum):
    """How old a worker's last heartbeat is, measured against ``dead_after``."""

    LIVE = "live"
    """Younger than ``dead_after - margin``: the holder may dispatch effects."""
    EXPIRING = "expiring"
    """Within ``margin`` of ``dead_after``: the holder sends nothing new; nobody may take over yet."""
    EXPIRED = "expired"
    """Older than ``dead_after``: the worker is dead; another may take its runs over."""


def lease_decision(now: float, last_heartbeat: float, dead_after: float, margin: float) -> LeaseVerdict:
    """Judge a heartbeat sent (or stamped) at ``last_heartbeat``, at ``now`` (same clock, seconds)."""
    age = now - last_heartbeat
    if age > dead_after:
        return LeaseVerdict.EXPIRED
    if age >= dead_after - margin:
        return LeaseVerdict.EXPIRING
    return LeaseVerdict.LIVE


def may_dispatch(verdict: LeaseVerdict) -> bool:
    """The holder may commit a new ``Dispatched`` (and claim new runs) only while live."""
    match verdict:
        case LeaseVerdict.LIVE:
            return True
        case LeaseVerdict.EXPIRING | LeaseVerdict.EXPIRED:
            return False
        case _:
            assert_never(verdict)


def may_take_over(verdict: LeaseVerdict) -> bool:
    """Another worker may take the runs over only once the heartbeat expired."""
    match verdict:
        case LeaseVerdict.EXPIRED:
            return True
        case LeaseVerdict.LIVE | LeaseVerdict.EXPIRING:
            return False
        case _:
            assert_never(verdict)


def check_timing(heartbeat: float, dead_after: float) -> float:
    """The margin for ``heartbeat`` and ``dead_after``, or ValueError naming the fix.

    ``dead_after`` must span at least three heartbeat periods, so that one late
    beat never kills a worker; the margin is one period.
    """
    if not heartbeat > 0:
        raise ValueError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
    if not dead_after >= 3 * heartbeat:
        raise ValueError(
            f"dead_after ({dead_after!r} s) must be at least three heartbeat periods"
            f" ({3 * heartbeat!r} s); raise dead_after or shorten heartbeat"
        )
    return heartbeat
