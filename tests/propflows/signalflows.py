"""Workflows for the signal tests, run as ``attempt-kernel run propflows.signalflows:ATTR``.

The downstream service is a file in the current folder (``calls.txt``, one
idempotency key a line, appended on every call and never deduplicated), so
that it outlives the process as a real one would.
"""

from __future__ import annotations

import asyncio
import threading
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

CALLS = Path("calls.txt")
RELEASE = Path("release")
"""Created by the test once it has stopped the run: a gated step ends only then."""
LONG = 60.0
"""Longer than any test waits: an attempt that sleeps this long is live when the signal comes."""


def calls() -> list[str]:
    """Every key the downstream service was called with, in order."""
    return CALLS.read_text().split() if CALLS.exists() else []


async def nap(ctx: StepContext) -> JSON:
    if ctx.attempt == 1:
        await asyncio.sleep(LONG)
    return "rested"


async def long_nap(ctx: StepContext) -> JSON:
    """Sleeps in its first two attempts: a resume finds the second one live."""
    if ctx.attempt <= 2:
        await asyncio.sleep(LONG)
    return "rested"


async def brief(ctx: StepContext) -> JSON:
    """Its first attempt runs until the test creates `RELEASE` (however late the signal lands)."""
    if ctx.attempt == 1:
        while not RELEASE.exists():
            await asyncio.sleep(0.02)
    return "brief"


async def wake(ctx: StepContext) -> JSON:
    return "awake"


def _block_for_good() -> None:
    with CALLS.open("a") as f:
        f.write("blocking\n")
    threading.Event().wait()  # set by nobody: only the process's end ends this call


async def blocked(ctx: StepContext) -> JSON:
    """Its first attempt blocks in ``run_blocking`` and never returns."""
    if ctx.attempt == 1:
        await ctx.run_blocking(_block_for_good)
    return "unblocked"


async def charge(ctx: StepContext) -> JSON:
    async def charge_card(key: str) -> JSON:
        first = not calls()
        with CALLS.open("a") as f:
            f.write(key + "\n")
        if first:  # the first call hangs: the signal finds it in flight
            await asyncio.sleep(LONG)
        return f"ch-{len(calls())}"

    return await ctx.effect("charge-card", charge_card)


async def ask_downstream(key: str) -> EffectFinding:
    return EffectHappened(result="ch-asked") if key in calls() else EffectNotHappened()


naps = load_workflow("naps", [Step(name="nap", run=nap), Step(name="wake", run=wake, after=("nap",))])
long_naps = load_workflow(
    "long-naps", [Step(name="nap", run=long_nap), Step(name="wake", run=wake, after=("nap",))]
)
briefs = load_workflow(
    "briefs", [Step(name="brief", run=brief), Step(name="wake", run=wake, after=("brief",))]
)
blocks = load_workflow(
    "blocks", [Step(name="block", run=blocked), Step(name="wake", run=wake, after=("block",))]
)
charges = load_workflow("charges", [Step(name="charge", run=charge)])
asked_charges = load_workflow(
    "asked-charges",
    [Step(name="charge", run=charge, reconcilers={"charge-card": ask_downstream})],
)
