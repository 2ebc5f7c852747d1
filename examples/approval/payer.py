"""An agent that asks a person before it charges a card, and waits for the answer.

The run quotes the order, asks for approval (a message in messages.json, as a
chat or an email would carry it), then waits for the signal ``approve``:
``{"approved": true}`` charges the card (payments.json stands in for the payment
provider, which deduplicates by idempotency key), anything else is a denial,
and no answer within the order's ``timeout_s`` lets the order expire. While
it waits, the run holds no attempt and no slot; a crash or a stop during the
wait loses nothing, and the resumed run waits only for what is left.

Run it with ``attempt-kernel run payer:payer --input '{"order": ...}'``
(docs/tutorial.md, "Waiting for a human").
"""

from __future__ import annotations

import json
from pathlib import Path

from attempt_kernel import JSON, RunContext, StepContext, workflow

PAYMENTS = Path("payments.json")
MESSAGES = Path("messages.json")


def _load(path: Path) -> dict[str, JSON]:
    if not path.exists():
        return {}
    data: dict[str, JSON] = json.loads(path.read_text())
    return data


def _save(path: Path, data: dict[str, JSON]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


async def ask_for_approval(ctx: StepContext, order: str, amount_cents: int) -> JSON:
    """Send the approver a message (once per key, as a mail provider would)."""

    async def send(key: str) -> JSON:
        outbox = _load(MESSAGES)
        if key not in outbox:
            outbox[key] = f"approve the charge of {amount_cents} cents for order {order}?"
            _save(MESSAGES, outbox)
        return {"asked": order}

    return await ctx.effect("ask-approver", send)


async def charge(ctx: StepContext, order: str, amount_cents: int) -> JSON:
    """Charge the card under the step's idempotency key."""

    async def charge_card(key: str) -> JSON:
        bank = _load(PAYMENTS)
        if key not in bank:  # the provider deduplicates by key
            bank[key] = {"order": order, "amount_cents": amount_cents, "charge": f"ch-{len(bank) + 1}"}
            _save(PAYMENTS, bank)
        return bank[key]

    return await ctx.effect("charge-card", charge_card)


def _field(order: JSON, name: str) -> JSON:
    if not isinstance(order, dict) or name not in order:
        raise TypeError(f"the run's input must be a JSON object with {name!r}, not {order!r}")
    value: JSON = order[name]
    return value


@workflow("payer", version="1")
async def payer(run: RunContext) -> JSON:
    order, amount, timeout = (_field(run.input, k) for k in ("order", "amount_cents", "timeout_s"))
    if not (isinstance(order, str) and isinstance(amount, int) and isinstance(timeout, (int, float))):
        raise TypeError(f"order must be a string, amount_cents an integer, timeout_s seconds: {run.input!r}")
    await run.step("ask", ask_for_approval, order, amount)
    answer = await run.wait_for_signal("approve", timeout=timeout)
    if answer is None:
        return {"order": order, "status": "expired"}
    if not isinstance(answer, dict) or answer.get("approved") is not True:
        return {"order": order, "status": "denied", "answer": answer}
    receipt = await run.step("charge", charge, order, amount)
    return {"order": order, "status": "charged", "receipt": receipt}
