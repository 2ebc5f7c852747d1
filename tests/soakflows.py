"""The soak's workflow (`tests/soak.py`): code steps with effects, a gather, a sleep, a signal.

Every effect calls the fake downstream service, the book named by
``DOWNSTREAM``: one line per call, ``key step pid``, appended under an
exclusive lock and fsynced before the effect returns, and nothing is
deduplicated, so the soak counts how often each key was really sent. The
steps' reconcilers ask the book by key, except for a third of the keys
(chosen by the key's last byte), where they cannot tell: those attempts
end ``Indeterminate``, and the soak's operator reconciles them.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import zlib
from pathlib import Path

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectUnknown,
    RetryPolicy,
    RunContext,
    StepContext,
    workflow,
)


def book() -> Path:
    """The fake downstream service's call book."""
    return Path(os.environ["DOWNSTREAM"])


def sent_keys(path: Path) -> list[str]:
    """The keys the downstream service was called with, one per call."""
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def cannot_tell(key: str) -> bool:
    """Whether the reconcilers cannot tell about ``key`` (a third of the keys)."""
    return int(key[-2:], 16) % 3 == 0


async def ask(key: str) -> EffectFinding:
    """The steps' reconciler: the book, by key, unless it `cannot_tell`."""
    if cannot_tell(key):
        return EffectUnknown(reason="the soak's reconciler cannot tell about this key")
    if key in sent_keys(book()):
        return EffectHappened(result={"sent": key})
    return EffectNotHappened()


async def act(ctx: StepContext, what: str) -> JSON:
    """A step: a short pause (so that kills land inside steps too), then one effect."""
    await asyncio.sleep(0.005 * (zlib.crc32(f"{ctx.run}/{what}".encode()) % 5))

    async def send(key: str) -> JSON:
        with book().open("a") as calls:
            fcntl.flock(calls, fcntl.LOCK_EX)
            calls.write(f"{key} {ctx.run}/{ctx.step} {os.getpid()}\n")
            calls.flush()
            os.fsync(calls.fileno())
        await asyncio.sleep(0.01)
        return {"sent": key}

    return await ctx.effect("send", send)


RETRY = RetryPolicy(max_attempts=5)
RECONCILERS = {"send": ask}


@workflow("soak")
async def soak(run: RunContext) -> JSON:
    """Charge, then ship and mail at once, nap, wait for an approval (1.5 s at most), settle."""
    charged = await run.step("charge", act, "charge", reconcilers=RECONCILERS, retry=RETRY)
    shipped, mailed = await asyncio.gather(
        run.step("ship", act, "ship", reconcilers=RECONCILERS, retry=RETRY),
        run.step("mail", act, "mail", reconcilers=RECONCILERS, retry=RETRY),
    )
    await run.sleep(0.3)
    approved = await run.wait_for_signal("approve", timeout=1.5)
    settled = await run.step("settle", act, "settle", reconcilers=RECONCILERS, retry=RETRY)
    return {"approved": approved is not None, "effects": [charged, shipped, mailed, settled]}
