"""Code workflows for the subprocess tests, run as ``attempt-kernel run agentflows.agents:ATTR``.

The downstream service is a file in the current folder (``calls.txt``, one
idempotency key a line, appended on every call and never deduplicated), so
that it outlives the process as a real one would.

- ``agent``: the model (``think``) picks search, then email, then done.
  With ``KILL_IN_EMAIL`` set in the environment, the email effect SIGKILLs
  its own process right after the service recorded the call.
- ``agent_edited``: the same workflow with its code edited: where the model
  picks search, the code calls ``lookup`` (position 2 asks for another step).
- ``sleeper``: think, nap, wake. The first attempt of nap waits until a file
  ``release`` appears in the current folder (or a minute passes).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    RunContext,
    StepContext,
    Workflow,
    workflow,
)

CALLS = Path("calls.txt")
RELEASE = Path("release")
SCRIPT = ("search", "email")
LONG = 60.0
"""Longer than any test waits."""


def calls() -> list[str]:
    """Every key the downstream service was called with, in order."""
    return CALLS.read_text().split() if CALLS.exists() else []


async def think(ctx: StepContext, turn: int) -> JSON:
    if turn >= len(SCRIPT):
        return {"tool": "done"}
    return {"tool": SCRIPT[turn], "turn": turn}


async def search(ctx: StepContext, turn: int) -> JSON:
    return {"hits": 2}


async def lookup(ctx: StepContext, turn: int) -> JSON:
    return {"found": 1}


async def email(ctx: StepContext, turn: int) -> JSON:
    async def send(key: str) -> JSON:
        with CALLS.open("a") as f:
            f.write(key + "\n")
        if os.environ.get("KILL_IN_EMAIL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return {"delivered": key}

    return await ctx.effect("send", send)


async def ask(key: str) -> EffectFinding:
    return EffectHappened(result={"delivered": key}) if key in calls() else EffectNotHappened()


def _agent(use: dict[str, str]) -> Workflow:
    tools: dict[str, Callable[[StepContext, int], Awaitable[JSON]]] = {
        "search": search,
        "lookup": lookup,
        "email": email,
    }

    @workflow("agent")
    async def flow(run: RunContext) -> JSON:
        turn = 0
        results: list[JSON] = []
        while True:
            decision = await run.step("think", think, turn)
            assert isinstance(decision, dict)
            tool = decision["tool"]
            assert isinstance(tool, str)
            if tool == "done":
                return results
            tool = use.get(tool, tool)
            results.append(await run.step(tool, tools[tool], turn, reconcilers={"send": ask}))
            turn += 1

    return flow


agent = _agent({})
agent_edited = _agent({"search": "lookup"})


async def nap(ctx: StepContext) -> JSON:
    if ctx.attempt == 1:
        loop = asyncio.get_running_loop()
        until = loop.time() + LONG
        while not RELEASE.exists() and loop.time() < until:
            await asyncio.sleep(0.02)
    return "rested"


async def wake(ctx: StepContext) -> JSON:
    return "awake"


async def plan(ctx: StepContext) -> JSON:
    return "plan"


@workflow("sleeper")
async def sleeper(run: RunContext) -> JSON:
    first = await run.step("think", plan)
    second = await run.step("nap", nap)
    return [first, second, await run.step("wake", wake)]
