"""Workflows for the admission tests: steps that need a slot of pool ``llm``.

The step's work is a database query, ``SELECT pg_sleep(S)``, on a
connection of its own named ``admission-work`` (``application_name``) to
the server named by ``PG_URL``: a sampler counts the attempts at work in
``pg_stat_activity``, independently of the journal and the slots table.
The run's input ``{"sleep": S}`` sets S (default 0.05 s); ``{"gate": G}``
makes the work wait instead until it gets the advisory lock
``hashtext(G)``, which the test holds for as long as the step must work.

``CRASH_IN_STEP=1`` SIGKILLs the process inside the step, right after its
work (the attempt is Running and holds its slot).
"""

from __future__ import annotations

import os
import signal

import psycopg

from attempt_kernel import JSON, Step, StepContext, load_workflow

WORK: str = "admission-work"
"""The ``application_name`` of every step's working connection."""


async def think(ctx: StepContext) -> JSON:
    pause = 0.05
    gate: str | None = None
    order = ctx.input
    if isinstance(order, dict):
        given = order.get("sleep")
        if isinstance(given, (int, float)):
            pause = float(given)
        named = order.get("gate")
        if isinstance(named, str):
            gate = named
    async with await psycopg.AsyncConnection.connect(
        os.environ["PG_URL"], autocommit=True, application_name=WORK
    ) as conn:
        if gate is None:
            await conn.execute("SELECT pg_sleep(%s)", (pause,))
        else:
            await conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (gate,))
            await conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (gate,))
    if os.environ.get("CRASH_IN_STEP") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"thought": ctx.run}


THINK = load_workflow("think", [Step(name="think", run=think, pool="llm", queue_deadline=30)])
"""One pooled step that waits up to 30 s for a slot."""

HURRY = load_workflow("hurry", [Step(name="think", run=think, pool="llm", queue_deadline=0.3)])
"""One pooled step that waits at most 0.3 s for a slot."""
