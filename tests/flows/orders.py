"""A user's workflow for the operating tests: charge a card, then email a receipt.

The fake downstream service is ``calls.jsonl`` in the current folder: every
call of an effect appends one line ``{"effect", "key", "input"}``, and
nothing is deduplicated, so a test counts how often each effect was really
sent. The environment steers it:

- ``CRASH_DURING=<effect>``: SIGKILL the process inside that effect, right
  after the downstream saw the call (as a power cut would).
- ``RECONCILER=happened|not-happened|unknown|raise|hang``: what the charge
  step's reconciler answers (unset: unknown).

The run's input steers the steps: ``{"fail": true}`` makes the charge step
raise before any effect; ``{"state": NAME}`` makes it set domain state NAME.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectUnknown,
    Step,
    StepContext,
    load_workflow,
)

CALLS = Path("calls.jsonl")
"""The fake downstream service's call book (not a workflow: for the bad-target test)."""


def _call(effect: str, key: str, ctx: StepContext) -> None:
    with CALLS.open("a") as book:
        book.write(json.dumps({"effect": effect, "key": key, "input": ctx.input}) + "\n")
    if os.environ.get("CRASH_DURING") == effect:
        os.kill(os.getpid(), signal.SIGKILL)


async def charge(ctx: StepContext) -> JSON:
    order = ctx.input
    state = "charging"
    if isinstance(order, dict):
        if order.get("fail") is True:
            raise RuntimeError("card declined by the test")
        asked = order.get("state")
        if isinstance(asked, str):
            state = asked
    ctx.set_state(state)

    async def charge_card(key: str) -> JSON:
        _call("charge-card", key, ctx)
        return {"charge": "ch-1"}

    return await ctx.effect("charge-card", charge_card)


async def ask_bank(key: str) -> EffectFinding:
    answer = os.environ.get("RECONCILER", "unknown")
    if answer == "happened":
        return EffectHappened(result={"charge": "ch-from-reconciler"})
    if answer == "not-happened":
        return EffectNotHappened()
    if answer == "raise":
        raise ConnectionError("the bank is down")
    if answer == "hang":
        await asyncio.sleep(30)
    return EffectUnknown(reason="the test said so")


async def send_receipt(ctx: StepContext) -> JSON:
    ctx.set_state("receipting")

    async def email(key: str) -> JSON:
        _call("email-receipt", key, ctx)
        return {"message_id": "m-sent"}

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
