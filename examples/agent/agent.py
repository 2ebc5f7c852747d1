"""A tool-calling agent written as a code workflow, on a fake model.

The model is `decide`: a pure function of the conversation that answers
the next tool call, again and again, until it says it is done. Each of its
answers is the result of a ``think`` step, so the workflow function is
deterministic given its steps' results, and recovery can run it again from
the top. The tools:

- ``web_search`` looks a price up (no side effect);
- ``exchange_rate`` asks a rates service that refuses the first two calls
  (rate limited), so its step gets ``RetryPolicy(max_attempts=3)``;
- ``charge_card`` charges the card through ``ctx.effect``; its reconciler
  asks the bank about the idempotency key;
- ``send_email`` emails the customer through ``ctx.effect``; its reconciler
  asks the mail provider about the key.

bank.json and mailbox.json, in the current folder, stand in for the bank
and the mail provider: like real downstream systems, they outlive a crash,
and they keep what they received under its idempotency key.
Set CRASH_DURING=<effect name> (``charge`` or ``email``) to kill the process
in the middle of that effect, right after the downstream system took it,
as a power cut would.

Run it with ``attempt-kernel run agent:assistant --input '{...}'``
(docs/agents.md).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    RetryPolicy,
    RunContext,
    StepContext,
    workflow,
)

BANK = Path("bank.json")
MAILBOX = Path("mailbox.json")


# --------------------------------------------------------------------------
# JSON, read back with its types
# --------------------------------------------------------------------------


def as_object(value: JSON) -> dict[str, JSON]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {value!r}")
    return value


def as_text(value: JSON) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def as_number(value: JSON) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return value


def _load(path: Path) -> dict[str, JSON]:
    if not path.exists():
        return {}
    return as_object(json.loads(path.read_text()))


def _save(path: Path, data: dict[str, JSON]) -> None:
    # insertion order, never sorted: entries stay in the order they arrived
    path.write_text(json.dumps(data, indent=1) + "\n")


def _crash_if_asked(effect: str) -> None:
    if os.environ.get("CRASH_DURING") == effect:
        os.kill(os.getpid(), signal.SIGKILL)


# --------------------------------------------------------------------------
# The model: a pure function of the conversation
# --------------------------------------------------------------------------


def decide(conversation: Sequence[JSON]) -> dict[str, JSON]:
    """The next tool call, ``{"tool": name, "args": {...}}``, or ``{"done": answer}``."""
    request = as_object(as_object(conversation[0])["content"])
    seen: dict[str, dict[str, JSON]] = {}
    for message in conversation[1:]:
        reply = as_object(message)
        seen[as_text(reply["tool"])] = as_object(reply["result"])
    if "web_search" not in seen:
        return {"tool": "web_search", "args": {"query": f"{as_text(request['wants'])} price"}}
    offer = seen["web_search"]
    if "exchange_rate" not in seen:
        return {"tool": "exchange_rate", "args": {"from": offer["currency"], "to": "EUR"}}
    amount = round(as_number(offer["price_cents"]) * as_number(seen["exchange_rate"]["rate"]))
    if "charge_card" not in seen:
        return {"tool": "charge_card", "args": {"amount_cents": amount, "currency": "EUR"}}
    bought = f"{as_text(offer['title'])} for {amount / 100:.2f} EUR"
    charge = as_text(seen["charge_card"]["charge"])
    if "send_email" not in seen:
        body = f"You bought {bought} (charge {charge})."
        return {
            "tool": "send_email",
            "args": {"to": request["customer"], "subject": "Your receipt", "body": body},
        }
    return {"done": f"Bought {bought} ({charge}); receipt sent."}


async def think(ctx: StepContext, conversation: list[JSON]) -> JSON:
    """One call of the model. A real model answers differently each time: in a step,
    its answer is recorded, and recovery hands the recorded one back."""
    return decide(conversation)


# --------------------------------------------------------------------------
# The tools: each runs as a step
# --------------------------------------------------------------------------


async def web_search(ctx: StepContext, args: JSON) -> JSON:
    """A fake search engine: it finds the same offer for any query."""
    return {"title": "EuroPython 2026 ticket", "price_cents": 35000, "currency": "USD"}


class RateLimited(Exception):
    """The rates service said 429: too many requests."""


async def exchange_rate(ctx: StepContext, args: JSON) -> JSON:
    pair = as_object(args)
    if ctx.attempt < 3:  # the fake service refuses the first two calls
        raise RateLimited("429 Too Many Requests")
    return {"from": pair["from"], "to": pair["to"], "rate": 0.92}


async def charge_card(ctx: StepContext, args: JSON) -> JSON:
    charge = as_object(args)

    async def charge_it(key: str) -> JSON:
        bank = _load(BANK)
        if key not in bank:  # the bank deduplicates by key
            bank[key] = {**charge, "charge": f"ch-{len(bank) + 1}"}
            _save(BANK, bank)
        _crash_if_asked("charge")  # the bank took it; nobody heard back
        return bank[key]

    return await ctx.effect("charge", charge_it)


async def ask_bank(key: str) -> EffectFinding:
    """The reconciler of charge: did the bank take a charge under this key?"""
    bank = _load(BANK)
    if key in bank:
        return EffectHappened(result=bank[key])
    return EffectNotHappened()


async def send_email(ctx: StepContext, args: JSON) -> JSON:
    message = as_object(args)

    async def send(key: str) -> JSON:
        mailbox = _load(MAILBOX)
        mailbox[key] = message  # the provider keeps one message per key
        _save(MAILBOX, mailbox)
        _crash_if_asked("email")  # the provider has it; nobody heard back
        return {"message_id": f"<{key}@mail.example>"}

    return await ctx.effect("email", send)


async def ask_mailbox(key: str) -> EffectFinding:
    """The reconciler of email: does the mail provider hold a message under this key?"""
    if key in _load(MAILBOX):
        return EffectHappened(result={"message_id": f"<{key}@mail.example>"})
    return EffectNotHappened()


async def use_tool(run: RunContext, tool: str, args: JSON) -> JSON:
    """Run the tool the model asked for as the run's next step."""
    if tool == "web_search":
        return await run.step("web_search", web_search, args)
    if tool == "exchange_rate":
        return await run.step(
            "exchange_rate", exchange_rate, args, retry=RetryPolicy(max_attempts=3)
        )
    if tool == "charge_card":
        return await run.step("charge_card", charge_card, args, reconcilers={"charge": ask_bank})
    if tool == "send_email":
        return await run.step("send_email", send_email, args, reconcilers={"email": ask_mailbox})
    raise ValueError(f"the model asked for a tool this agent does not have: {tool!r}")


# --------------------------------------------------------------------------
# The workflow: think, call the tool, tell the model, until it is done
# --------------------------------------------------------------------------


@workflow("assistant", version="v1")
async def assistant(run: RunContext) -> JSON:
    conversation: list[JSON] = [{"role": "user", "content": run.input}]
    while True:
        reply = as_object(await run.step("think", think, conversation))
        if "done" in reply:
            return reply["done"]
        tool = as_text(reply["tool"])
        result = await use_tool(run, tool, reply["args"])
        conversation.append({"role": "tool", "tool": tool, "result": result})
