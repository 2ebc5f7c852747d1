"""A workflow for signals that land while a command recovers a log, before any run is live.

``charges``: one step that charges a card through an effect. The downstream
service is a file in the current folder (``calls.txt``, one idempotency key
a line). With ``CRASH_IN_EFFECT`` set, the effect records its call and then
kills the process (``os._exit``): the log is left with the intent
``Dispatched`` and no outcome, so the next recovery asks the step's
reconciler. With ``RECOVERY_READY`` set, the reconciler writes that file and
then waits for good (only a signal ends it): the test signals the process
while it is recovering. It waits on the event loop, or, with
``RECOVERY_BLOCKS=thread``, in a sleep loop that holds the thread, so that
the signal lands inside the reconciler's own frame. Without either, the effect and the reconciler
answer at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from attempt_kernel import JSON, EffectFinding, EffectHappened, EffectNotHappened, Step, StepContext, load_workflow

CALLS = Path("calls.txt")


def calls() -> list[str]:
    """Every key the downstream service was called with, in order."""
    return CALLS.read_text().split() if CALLS.exists() else []


async def charge(ctx: StepContext) -> JSON:
    async def charge_card(key: str) -> JSON:
        with CALLS.open("a") as f:
            f.write(key + "\n")
        if os.environ.get("CRASH_IN_EFFECT"):
            os._exit(70)  # a crash with the charge sent and its Dispatched durable
        return "ch-sent"

    return await ctx.effect("charge-card", charge_card)


async def ask_downstream(key: str) -> EffectFinding:
    ready = os.environ.get("RECOVERY_READY")
    if ready:
        Path(ready).write_text("asked\n")
        if os.environ.get("RECOVERY_BLOCKS") == "thread":
            while True:  # blocks the event loop in Python code: a signal lands in this frame
                time.sleep(0.05)
        await asyncio.Event().wait()  # set by nobody: only a signal ends this
    return EffectHappened(result="ch-asked") if key in calls() else EffectNotHappened()


charges = load_workflow("charges", [Step(name="charge", run=charge, reconcilers={"charge-card": ask_downstream})])
