"""A code workflow for the worker tests: an agent that thinks, then calls tools.

``think`` reads the conversation so far (every tool's name and result, in
order) and picks the next tool, deterministically: ``search``, then
``send_email`` with what it found, then ``open_ticket``, then done. The
function appends each tool's result to the conversation and thinks again,
so a run of `AGENT` takes positions 1 to 7: ``think@1``, ``search@2``,
``think@3``, ``send_email@4``, ``think@5``, ``open_ticket@6``, ``think@7``.

Two tools have effects on the fake downstream service, the call book named
by ``DOWNSTREAM`` (as in ``workerflows.pay``): every call appends one line,
``run/step/effect key``, and nothing is deduplicated, so a test counts how
often each key was really sent. Their reconcilers ask the book by key.

``AGENT_GATE=DIR`` makes ``open_ticket``'s effect wait, once its attempt
is Dispatched, until the file ``DIR/open`` exists; it first touches
``DIR/waiting`` so that a test knows it is there. ``AGENT_GATE_AT`` says
where it waits: ``after-call`` (default: the book already has the call, as
when the service did it and the answer was lost) or ``before-call`` (the
book has not). A test SIGKILLs the worker while it waits.

``AGENT_ASK_MOVES_LEASE=URL``: ``open_ticket``'s reconciler moves the
lease the first time it is asked (see `ask_ticket`).

``AGENT_TRACE=FILE``: the workflow function appends ``run pid`` to FILE each
time it starts from the top (a probe that decides nothing, so the function
stays deterministic).

``python -c 'from workerflows.agent import main; main()' ARGS`` is the
command line (``attempt-kernel ARGS``) with ``KILL_AFTER=N`` as in
``workerflows.start``: SIGKILL right after the N-th record reached the
journal.

`AGENT_EDITED` is the same workflow name with edited code: after
``search`` it posts to a chat (``post_chat``) instead of sending an email,
so a run `AGENT` started diverges there when the edited code runs it again.
`AGENT_POOLED` is `AGENT` whose ``open_ticket`` needs a slot of pool
``tickets``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from workerflows.start import _kill_after  # pyright: ignore[reportPrivateUsage]

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
from attempt_kernel.cli._main import main as cli

# --------------------------------------------------------------------------
# The fake downstream service
# --------------------------------------------------------------------------


def _book() -> Path:
    return Path(os.environ["DOWNSTREAM"])


def book_lines(path: Path) -> list[tuple[str, str]]:
    """The calls the service saw, one per call: (``run/step/effect``, key)."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(label, key) for label, key in lines]


def _call(ctx: StepContext, effect: str, key: str) -> None:
    with _book().open("a") as book:
        book.write(f"{ctx.run}/{ctx.step}/{effect} {key}\n")


def _as_map(value: JSON) -> dict[str, JSON]:
    assert isinstance(value, Mapping)
    return dict(value)


async def ask_send(key: str) -> EffectFinding:
    """The service's answer about a ``send`` call, by key."""
    if any(seen == key for _, seen in book_lines(_book())):
        return EffectHappened(result={"sent": key})
    return EffectNotHappened()


_MOVED: list[str] = []


async def ask_ticket(key: str) -> EffectFinding:
    """The service's answer about a ``ticket`` call, by key. With ``AGENT_ASK_MOVES_LEASE=URL``,
    the first time it is asked in a process it also moves every unfinished run's lease to
    the dead worker ``gone`` (which the test registered), as another worker's claim would:
    the takeover asking it has lost the run by the time it writes."""
    moves = os.environ.get("AGENT_ASK_MOVES_LEASE")
    if moves and not _MOVED:
        import psycopg

        _MOVED.append(key)
        with psycopg.connect(moves, autocommit=True) as conn:
            conn.execute("UPDATE attempt_kernel.runs SET owner = 'gone', fence = fence + 1 WHERE NOT done")
    if any(seen == key for _, seen in book_lines(_book())):
        return EffectHappened(result={"ticket": key})
    return EffectNotHappened()


async def ask_chat(key: str) -> EffectFinding:
    """The service's answer about a ``chat`` call, by key."""
    if any(seen == key for _, seen in book_lines(_book())):
        return EffectHappened(result={"posted": key})
    return EffectNotHappened()


# --------------------------------------------------------------------------
# The model and the tools
# --------------------------------------------------------------------------


async def think(ctx: StepContext, conversation: Sequence[JSON]) -> JSON:
    """The next tool, from the tools called so far (a fake model: no I/O, no randomness)."""
    used = [_as_map(turn)["tool"] for turn in conversation]
    topic = _as_map(ctx.input).get("topic", "refund") if ctx.input is not None else "refund"
    if not used:
        return {"tool": "search", "args": {"query": topic}}
    if used[-1] == "search":
        hits = _as_map(_as_map(conversation[-1])["result"])["hits"]
        return {"tool": "send_email", "args": {"to": "customer", "body": f"found {hits}"}}
    if used[-1] in ("send_email", "post_chat"):
        return {"tool": "open_ticket", "args": {"summary": f"{topic}: customer told"}}
    return {"tool": "done", "answer": f"{len(used)} tools used"}


async def search(ctx: StepContext, args: JSON) -> JSON:
    query = _as_map(args)["query"]
    return {"hits": 3, "query": query}


async def send_email(ctx: StepContext, args: JSON) -> JSON:
    async def send(key: str) -> JSON:
        _call(ctx, "send", key)
        return {"sent": key}

    return await ctx.effect("send", send)


async def post_chat(ctx: StepContext, args: JSON) -> JSON:
    async def post(key: str) -> JSON:
        _call(ctx, "chat", key)
        return {"posted": key}

    return await ctx.effect("chat", post)


async def _gate() -> None:
    """Wait for ``AGENT_GATE/open`` (see the module doc); nothing when the gate is not set."""
    folder = os.environ.get("AGENT_GATE")
    if not folder:
        return
    (Path(folder) / "waiting").touch()
    while not (Path(folder) / "open").exists():
        await asyncio.sleep(0.02)


async def open_ticket(ctx: StepContext, args: JSON) -> JSON:
    async def ticket(key: str) -> JSON:
        before = os.environ.get("AGENT_GATE_AT") == "before-call"
        if before:
            await _gate()
        _call(ctx, "ticket", key)
        if not before:
            await _gate()
        return {"ticket": key}

    return await ctx.effect("ticket", ticket)


# --------------------------------------------------------------------------
# The workflow, as first written and as edited
# --------------------------------------------------------------------------


def _agent(email_tool: str, version: str, *, name: str = "agent", pool: str | None = None) -> Workflow:
    tools = {"search": search, "send_email": send_email, "post_chat": post_chat, "open_ticket": open_ticket}
    reconcilers = {"send": ask_send, "ticket": ask_ticket, "chat": ask_chat}

    @workflow(name, version=version)
    async def agent(run: RunContext) -> JSON:
        trace = os.environ.get("AGENT_TRACE")
        if trace:
            with open(trace, "a") as out:
                out.write(f"{run.run} {os.getpid()}\n")
        conversation: list[JSON] = []
        while True:
            decision = _as_map(await run.step("think", think, conversation))
            tool = decision["tool"]
            assert isinstance(tool, str)
            if tool == "done":
                return {"answer": decision["answer"], "turns": len(conversation)}
            if tool == "send_email":
                tool = email_tool
            result = await run.step(
                tool,
                tools[tool],
                decision["args"],
                reconcilers=reconcilers,
                pool=pool if tool == "open_ticket" else None,
            )
            conversation.append({"tool": tool, "result": result})

    return agent


AGENT = _agent("send_email", "1")
"""The agent as first written."""

AGENT_EDITED = _agent("post_chat", "2")
"""The same workflow name, edited: a chat post where the email was."""

AGENT_POOLED = _agent("send_email", "1", name="agent-pooled", pool="tickets")
"""`AGENT` named ``agent-pooled``, whose ``open_ticket`` needs a slot of pool ``tickets``."""


def main() -> None:
    """``attempt-kernel`` with ``KILL_AFTER`` (see the module doc)."""
    kill_after = int(os.environ.get("KILL_AFTER", "0"))
    if kill_after:
        _kill_after(kill_after)
    sys.exit(cli(sys.argv[1:]))
