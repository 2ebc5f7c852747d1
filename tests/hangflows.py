"""A workflow whose effect hangs, for what the command line prints when a run is stopped or
cancelled while its effect is in flight.

``hang``: one step whose effect books its idempotency key in ``calls.txt`` (in the
current folder, one key a line) and then waits for good: only a stop or a cancel
ends the attempt, and the step's reconciler is asked then. The reconciler answers
as ``HANG_ANSWER`` says: ``not-happened``; ``happened-then-full``, the charge happened,
after which its process can no longer grow the file ``HANG_LOG`` (the file size
limit set to its size, as a full disk would leave it), so that recording the answer
fails; or (unset) unknown, with a reason holding a line break, an escape sequence and U+2028. The step's and the intent's names,
and the ids the tests give their runs, hold such characters too: every line the
command prints of them must stay one line, with no control character in it.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
from pathlib import Path

from attempt_kernel import JSON, EffectFinding, EffectHappened, EffectNotHappened, EffectUnknown, Step, StepContext, load_workflow

CALLS = Path("calls.txt")
STEP = "ch\u2028arge\r"
INTENT = "charge\x1b[31m-card\n"
REASON = "bank\nsays \x1b[2Jno\u2028idea"


def calls() -> list[str]:
    """Every key the effect was called with, in order."""
    return CALLS.read_text().split() if CALLS.exists() else []


async def charge(ctx: StepContext) -> JSON:
    async def charge_card(key: str) -> JSON:
        with CALLS.open("a") as f:
            f.write(key + "\n")
        await asyncio.Event().wait()  # set by nobody: only a stop or a cancel ends it
        return "not reached"

    return await ctx.effect(INTENT, charge_card)


async def ask_downstream(key: str) -> EffectFinding:
    if os.environ.get("HANG_ANSWER") == "not-happened":
        return EffectNotHappened()
    if os.environ.get("HANG_ANSWER") == "happened-then-full":
        size = Path(os.environ["HANG_LOG"]).stat().st_size
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        return EffectHappened(result="ch-1")
    return EffectUnknown(reason=REASON)


hang = load_workflow("hang", [Step(name=STEP, run=charge, reconcilers={INTENT: ask_downstream})])
