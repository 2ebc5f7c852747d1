"""Write ``examples/checkout.jsonl``: a hand-built run log of two checkout runs.

Every record below is written out by hand (no executor involved), so the log
shows each ending an attempt can have:

- run order-1042: ``validate`` succeeds; ``charge`` fails once (the card
  charge is rejected) and its retry succeeds under the same idempotency key;
  ``send-receipt`` is cancelled while its email is Dispatched, so it ends
  Indeterminate; ``reserve-stock`` waits past its queue deadline (TimedOut).
- run order-1043: ``validate`` plans an SMS, abandons it, and is cancelled
  with nothing outstanding, so it ends cleanly Cancelled.

Run it with ``python examples/make_checkout_log.py`` (it rewrites the file);
a test checks that the committed file is what this script writes.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from attempt_kernel import (
    Abandon,
    Abandoned,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Cancelled,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    Fail,
    Failed,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    Pending,
    Planned,
    QueueDeadlinePassed,
    Reject,
    Rejected,
    Running,
    RunFinished,
    RunLogWriter,
    StepResult,
    Succeed,
    Succeeded,
    TimedOut,
    idempotency_key,
)

HERE = Path(__file__).resolve().parent
TARGET = HERE / "checkout.jsonl"
START_US = 1_764_460_800_000_000  # 2025-11-30T00:00:00Z; each record 0.25 s after the last


def write(path: Path) -> None:
    if path.exists():
        path.unlink()
    ticks = itertools.count()
    clock = lambda: START_US + next(ticks) * 250_000  # noqa: E731
    r1, r2 = "order-1042", "order-1043"
    charge_key = idempotency_key(r1, "charge", "charge-card")
    receipt_key = idempotency_key(r1, "send-receipt", "email-receipt")
    sms_key = idempotency_key(r2, "validate", "sms-confirm")
    with RunLogWriter(path, clock=clock) as log:
        # run order-1042 / validate: a plain success
        log.append(r1, AttemptCreated(step="validate", attempt=1))
        log.append(r1, AttemptTransitioned(step="validate", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()))
        log.append(r1, StepResult(step="validate", attempt=1, value={"items": 3, "total_cents": 4599}))
        log.append(r1, AttemptTransitioned(step="validate", attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()))
        # charge, attempt 1: the charge is sent and declined, the step fails
        log.append(r1, AttemptCreated(step="charge", attempt=1))
        log.append(r1, AttemptTransitioned(step="charge", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()))
        log.append(r1, IntentPlanned(step="charge", attempt=1, name="charge-card", key=charge_key))
        log.append(r1, IntentChanged(step="charge", attempt=1, name="charge-card", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()))
        log.append(r1, IntentChanged(step="charge", attempt=1, name="charge-card", from_state=Dispatched(), cause=Reject(), to_state=Rejected()))
        log.append(r1, StepResult(step="charge", attempt=1, error="CardDeclined: issuer timeout, retry"))
        log.append(r1, AttemptTransitioned(step="charge", attempt=1, from_state=Running(), cause=Fail(), to_state=Failed()))
        # charge, attempt 2: same idempotency key, confirmed
        log.append(r1, AttemptCreated(step="charge", attempt=2))
        log.append(r1, AttemptTransitioned(step="charge", attempt=2, from_state=Pending(), cause=Admit(), to_state=Running()))
        log.append(r1, IntentPlanned(step="charge", attempt=2, name="charge-card", key=charge_key))
        log.append(r1, IntentChanged(step="charge", attempt=2, name="charge-card", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()))
        log.append(r1, IntentChanged(step="charge", attempt=2, name="charge-card", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed()))
        log.append(r1, StepResult(step="charge", attempt=2, value={"charge_id": "ch_81c2"}))
        log.append(r1, AttemptTransitioned(step="charge", attempt=2, from_state=Running(), cause=Succeed(), to_state=Succeeded()))
        # send-receipt: the email is Dispatched, then the run is cancelled
        log.append(r1, AttemptCreated(step="send-receipt", attempt=1))
        log.append(r1, AttemptTransitioned(step="send-receipt", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()))
        log.append(r1, IntentPlanned(step="send-receipt", attempt=1, name="email-receipt", key=receipt_key))
        log.append(r1, IntentChanged(step="send-receipt", attempt=1, name="email-receipt", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()))
        log.append(r1, AttemptTransitioned(step="send-receipt", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()))
        # reserve-stock: never admitted before its queue deadline
        log.append(r1, AttemptCreated(step="reserve-stock", attempt=1))
        log.append(r1, AttemptTransitioned(step="reserve-stock", attempt=1, from_state=Pending(), cause=QueueDeadlinePassed(), to_state=TimedOut()))
        log.append(r1, RunFinished())
        # run order-1043 / validate: planned an SMS, abandoned it, cancelled cleanly
        log.append(r2, AttemptCreated(step="validate", attempt=1))
        log.append(r2, AttemptTransitioned(step="validate", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()))
        log.append(r2, IntentPlanned(step="validate", attempt=1, name="sms-confirm", key=sms_key))
        log.append(r2, IntentChanged(step="validate", attempt=1, name="sms-confirm", from_state=Planned(), cause=Abandon(), to_state=Abandoned()))
        log.append(r2, AttemptTransitioned(step="validate", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=False), to_state=Cancelled()))
        log.append(r2, RunFinished())


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET)
