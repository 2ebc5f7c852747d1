"""A report workflow for the multi-worker session in the README.

`fetch` takes ten seconds (long enough to kill its worker in the middle),
then `publish` posts the report through an effect. published.log stands in
for the downstream system; it outlives any worker, as a real one does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from attempt_kernel import JSON, Step, StepContext, load_workflow

PUBLISHED = Path("published.log")


async def fetch(ctx: StepContext) -> JSON:
    await asyncio.sleep(10)  # a slow data source: long enough to kill its worker by hand
    return {"report": ctx.run, "rows": 42}


async def publish(ctx: StepContext) -> JSON:
    async def post(key: str) -> dict[str, str]:
        with PUBLISHED.open("a") as out:
            out.write(f"{ctx.run} {key}\n")
        return {"posted": key}

    return await ctx.effect("post-report", post)


reports = load_workflow(
    "reports",
    [Step(name="fetch", run=fetch), Step(name="publish", run=publish, after=("fetch",))],
)
