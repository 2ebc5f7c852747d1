"""A workflow for the worker tests: prepare, charge a card (an effect), finish.

The fake downstream service is the file named by ``DOWNSTREAM``: every call
of the effect appends one line (``run/step/effect key``) and nothing is
deduplicated, so a test counts how often each key was really sent. The
charge step's reconciler asks that same file, unless ``RECONCILE=off``
(then it cannot tell, and says why: ``RECONCILE_REASON``, or that the test
switched it off).

``CRASH_IN_EFFECT=1`` SIGKILLs the process inside the effect, right after
the downstream service saw the call (as a power cut would);
``HANG_IN_EFFECT=1`` keeps the effect in flight there (an hour), until the
worker is stopped.

The run's input steers the charge step: ``{"sleep": S}`` makes its first
attempt sleep S seconds before the effect; ``{"gate": PATH}`` makes it wait
before the effect until the file PATH exists, so that a test can freeze the
worker or break its database while the attempt is surely live (a worker
stopped there is past its lease when it wakes).
"""

from __future__ import annotations

import asyncio
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


def _downstream() -> Path:
    return Path(os.environ["DOWNSTREAM"])


def calls(path: Path) -> list[str]:
    """The keys the downstream service was called with, one per call, as ``run/step/effect``."""
    return [line.split()[0] for line in _lines(path)]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def prepare(ctx: StepContext) -> JSON:
    return {"prepared": ctx.run}


async def charge(ctx: StepContext) -> JSON:
    order = ctx.input
    if ctx.attempt == 1 and isinstance(order, dict):
        pause = order.get("sleep")
        if isinstance(pause, (int, float)):
            await asyncio.sleep(pause)
        gate = order.get("gate")
        if isinstance(gate, str):
            while not Path(gate).exists():
                await asyncio.sleep(0.02)

    async def charge_card(key: str) -> JSON:
        with _downstream().open("a") as book:
            book.write(f"{ctx.run}/{ctx.step}/card {key}\n")
        if os.environ.get("CRASH_IN_EFFECT") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("HANG_IN_EFFECT") == "1":
            await asyncio.sleep(3600)
        return {"charged": key}

    return await ctx.effect("card", charge_card)


async def ask_card(key: str) -> EffectFinding:
    if os.environ.get("RECONCILE") == "off":
        return EffectUnknown(reason=os.environ.get("RECONCILE_REASON", "the test switched the reconciler off"))
    if any(line.split()[1] == key for line in _lines(_downstream())):
        return EffectHappened(result={"charged": key})
    return EffectNotHappened()


async def finish(ctx: StepContext) -> JSON:
    return {"done": ctx.inputs["charge"]}


PAY = load_workflow(
    "pay",
    [
        Step(name="prepare", run=prepare),
        Step(name="charge", run=charge, after=("prepare",), reconcilers={"card": ask_card}),
        Step(name="finish", run=finish, after=("charge",)),
    ],
)
