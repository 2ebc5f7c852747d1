"""Code workflows that wait, for the worker tests of waiting runs, and a worker process.

``approver``: asks (a step that takes a slot of pool ``llm``), waits for
signal ``approve`` with no timeout, then charges (another pooled step) and
returns ``{"approved": <payload>}``.

``napper``: a step, a sleep of ``input["sleep"]`` seconds, another step;
returns ``"rested"``.

``gated``: waits for signal ``go`` while a step waits at a gate (until the
file named by ``GATE`` exists), so the worker holds the run while it
waits; returns ``{"go": <payload>, "gate": "open"}``.

``python -c 'from workerflows.waits import main; main()' URL SCHEMA``
serves them with heartbeat 0.2 s and dead after 300 s (``DEAD_AFTER``
says otherwise), printing each
progress line; it stops on SIGTERM (``stopped N``), or when idle with
``UNTIL_IDLE=1``. With ``FREEZE_ON=TEXT`` it stops itself (SIGSTOP) right
after the first progress line holding TEXT, until the test sends SIGCONT:
the test looks at that moment however late it gets there. Its clock is
`workerflows.start.clock`: SIGUSR1 moves it an hour on, as if the worker
had been frozen that long.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from attempt_kernel import JSON, RunContext, StepContext, workflow
from attempt_kernel.postgres._worker import run_worker
from workerflows.start import clock, jump_on_sigusr1

HEARTBEAT = 0.2
DEAD_AFTER = float(os.environ.get("DEAD_AFTER", "300"))


async def noted(ctx: StepContext, text: str) -> JSON:
    return text


async def at_gate(ctx: StepContext) -> JSON:
    gate = Path(os.environ["GATE"])
    while not gate.exists():
        await asyncio.sleep(0.02)
    return "open"


@workflow("approver")
async def approver(run: RunContext) -> JSON:
    await run.step("ask", noted, "may I charge?", pool="llm")
    answer = await run.wait_for_signal("approve")
    await run.step("charge", noted, "charged", pool="llm")
    return {"approved": answer}


@workflow("napper")
async def napper(run: RunContext) -> JSON:
    await run.step("before", noted, "a")
    given = run.input
    seconds = given.get("sleep", 2.5) if isinstance(given, dict) else 2.5
    assert isinstance(seconds, (int, float))
    await run.sleep(float(seconds))
    await run.step("after", noted, "b")
    return "rested"


@workflow("gated")
async def gated(run: RunContext) -> JSON:
    go, gate = await asyncio.gather(run.wait_for_signal("go"), run.step("gate", at_gate))
    return {"go": go, "gate": gate}


WORKFLOWS = (approver, napper, gated)


def _say(freeze_on: str) -> Callable[[str], None]:
    """Print each progress line; SIGSTOP this process after the first that holds ``freeze_on`` (if not empty)."""
    frozen = [False]

    def say(line: str) -> None:
        print(line, flush=True)
        if freeze_on and freeze_on in line and not frozen[0]:
            frozen[0] = True
            os.kill(os.getpid(), signal.SIGSTOP)

    return say


def main() -> None:
    url, schema = sys.argv[1], sys.argv[2]
    jump_on_sigusr1()
    closed = run_worker(
        url,
        WORKFLOWS,
        schema=schema,
        concurrency=int(os.environ.get("CONCURRENCY", "20")),
        heartbeat=HEARTBEAT,
        dead_after=DEAD_AFTER,
        stop_when_idle=os.environ.get("UNTIL_IDLE") == "1",
        progress=_say(os.environ.get("FREEZE_ON", "")),
        stop_on_signals=True,
        clock=clock,
    )
    print(f"stopped {closed}", flush=True)
