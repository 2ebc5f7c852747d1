"""Code workflows that wait, for the command-line tests of signal, cancel and worker.

`APPROVER` asks (a step), waits for signal ``approve`` (no timeout), then
charges through an effect and returns what it was sent. Its effect appends
one line, ``key``, to the file named by ``WAIT_BOOK`` (when set), so a test
counts how often it was sent. `NAPPER` sleeps for an hour, then returns.
`BLOCKED` has one step whose effect, once Dispatched, touches
``WAIT_GATE/waiting`` and then waits for ``WAIT_GATE/open`` to appear.
`GATED_APPROVER` runs that step, then waits for signal ``approve`` and
returns both: a signal sent while the step runs is kept for the wait.
`STALLED` has one step with no effect that touches ``WAIT_GATE/waiting``
and waits for ``WAIT_GATE/open``: a run to kill and resume at will.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from attempt_kernel import JSON, RunContext, StepContext, workflow


async def ask(ctx: StepContext, question: str) -> JSON:
    return question


def _book(line: str) -> None:
    book = os.environ.get("WAIT_BOOK")
    if book:
        with open(book, "a", encoding="utf-8") as out:
            out.write(line + "\n")


async def charge(ctx: StepContext, amount: int) -> JSON:
    async def perform(key: str) -> JSON:
        _book(key)
        return {"charged": amount}

    return await ctx.effect("charge", perform)


@workflow("approver")
async def APPROVER(run: RunContext) -> JSON:
    await run.step("ask", ask, "may I charge 40 EUR?")
    answer = await run.wait_for_signal("approve")
    charged = await run.step("charge", charge, 40)
    return {"answer": answer, "charged": charged}


@workflow("napper")
async def NAPPER(run: RunContext) -> JSON:
    await run.sleep(3600)
    return "rested"


async def gated(ctx: StepContext, amount: int) -> JSON:
    gate = Path(os.environ["WAIT_GATE"])

    async def perform(key: str) -> JSON:
        (gate / "waiting").touch()
        while not (gate / "open").exists():
            await asyncio.sleep(0.02)
        _book(key)
        return {"paid": amount}

    return await ctx.effect("pay", perform)


@workflow("blocked")
async def BLOCKED(run: RunContext) -> JSON:
    return await run.step("pay", gated, 7)


@workflow("gated-approver")
async def GATED_APPROVER(run: RunContext) -> JSON:
    paid = await run.step("pay", gated, 7)
    answer = await run.wait_for_signal("approve")
    return {"paid": paid, "answer": answer}


async def stall(ctx: StepContext) -> JSON:
    gate = Path(os.environ["WAIT_GATE"])
    (gate / "waiting").touch()
    while not (gate / "open").exists():
        await asyncio.sleep(0.02)
    return "done"


@workflow("stalled")
async def STALLED(run: RunContext) -> JSON:
    return await run.step("stall", stall)
