"""The next release of agent.py: the same workflow, with a spending check before each charge.

Same workflow name (``assistant``), version ``v2``: it calls one step more,
``check_budget``, before ``charge_card``. A run that v1 started and a crash
left unfinished cannot be recovered with it: at the position where the log
holds ``charge_card``, this code asks for ``check_budget``, and recovery
refuses (docs/agents.md shows it). The model and the tools are agent.py's.
"""

from __future__ import annotations

from attempt_kernel import JSON, RunContext, StepContext, workflow

from agent import think, use_tool, as_object, as_number, as_text

BUDGET_CENTS = 50000


async def check_budget(ctx: StepContext, args: JSON) -> JSON:
    amount = as_number(as_object(args)["amount_cents"])
    if amount > BUDGET_CENTS:
        raise ValueError(f"{amount / 100:.2f} EUR is over the budget, {BUDGET_CENTS / 100:.2f} EUR")
    return {"within_budget": True}


@workflow("assistant", version="v2")
async def assistant(run: RunContext) -> JSON:
    conversation: list[JSON] = [{"role": "user", "content": run.input}]
    while True:
        reply = as_object(await run.step("think", think, conversation))
        if "done" in reply:
            return reply["done"]
        tool = as_text(reply["tool"])
        if tool == "charge_card":  # new in v2
            await run.step("check_budget", check_budget, reply["args"])
        result = await use_tool(run, tool, reply["args"])
        conversation.append({"role": "tool", "tool": tool, "result": result})
