"""Code workflows for the command line's own tests (`--json`, `--workflows`).

`GREETER` runs one step, ``greet``, on its input (a name) and returns
``{"greeting": "hello <name>"}``. `REFUSER` runs one step that raises
``ValueError: no``: the run fails.
"""

from __future__ import annotations

from attempt_kernel import JSON, RunContext, StepContext, workflow


async def greet(ctx: StepContext, name: JSON) -> JSON:
    return f"hello {name}"


async def refuse(ctx: StepContext) -> JSON:
    raise ValueError("no")


@workflow("greeter")
async def GREETER(run: RunContext) -> JSON:
    return {"greeting": await run.step("greet", greet, run.input)}


@workflow("refuser")
async def REFUSER(run: RunContext) -> JSON:
    return await run.step("refuse", refuse)
