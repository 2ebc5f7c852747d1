"""The tutorial's workflow: an order is charged, then its receipt is emailed.

Two effects, each performed through ``ctx.effect`` under an idempotency key:
``charge-card`` (with a reconciler that asks the bank about a key) and
``email-receipt`` (without one, so an unanswered question is left to an
operator). bank.json and outbox.json stand in for the payment provider and
the mail provider: like real downstream systems, they outlive a crash.
Set CRASH_DURING=<effect name> to kill the process in the middle of that
effect, as a power cut would.

Run it with ``attempt-kernel run flows:orders --input '{"order": ...}'``
(docs/tutorial.md).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    Step,
    StepContext,
    load_workflow,
)

BANK = Path("bank.json")
OUTBOX = Path("outbox.json")


def _load(path: Path) -> dict[str, JSON]:
    if not path.exists():
        return {}
    data: dict[str, JSON] = json.loads(path.read_text())
    return data


def _save(path: Path, data: dict[str, JSON]) -> None:
    # insertion order, never sorted: entries stay in the order they arrived
    path.write_text(json.dumps(data, indent=1) + "\n")


def _crash_if_asked(effect: str) -> None:
    if os.environ.get("CRASH_DURING") == effect:
        os.kill(os.getpid(), signal.SIGKILL)


def _order(ctx: StepContext) -> dict[str, JSON]:
    order = ctx.input
    if not isinstance(order, dict):
        raise TypeError(f"the run's input must be a JSON object, not {order!r}")
    return order


async def charge(ctx: StepContext) -> JSON:
    order = _order(ctx)
    ctx.set_state("charging")

    async def charge_card(key: str) -> JSON:
        bank = _load(BANK)
        if key not in bank:  # the provider deduplicates by key
            bank[key] = {"amount_cents": order["amount_cents"], "charge": f"ch-{len(bank) + 1}"}
            _save(BANK, bank)
        _crash_if_asked("charge-card")  # the charge went through; nobody heard back
        return {"charge": bank[key]}

    return await ctx.effect("charge-card", charge_card)


async def ask_bank(key: str) -> EffectFinding:
    """The reconciler of charge-card: did the bank take a charge under this key?"""
    bank = _load(BANK)
    if key in bank:
        return EffectHappened(result={"charge": bank[key]})
    return EffectNotHappened()


async def send_receipt(ctx: StepContext) -> JSON:
    order = _order(ctx)
    ctx.set_state("receipting")

    async def email(key: str) -> JSON:
        _crash_if_asked("email-receipt")  # dies before the mail provider sees anything
        outbox = _load(OUTBOX)
        outbox[key] = f"receipt for order {order['order']}"
        _save(OUTBOX, outbox)
        return {"message_id": f"<{key}@mail.example>"}

    sent = await ctx.effect("email-receipt", email)
    ctx.set_state("done")
    return sent


orders = load_workflow(
    "orders",
    [
        Step(
            name="charge",
            run=charge,
            domain_states=("charging",),
            reconcilers={"charge-card": ask_bank},
        ),
        Step(
            name="send-receipt",
            run=send_receipt,
            after=("charge",),
            domain_states=("receipting", "done"),
        ),
    ],
    domain_states=["charging", "receipting", "done"],
)
