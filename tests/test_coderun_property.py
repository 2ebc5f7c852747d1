"""Crash anywhere, recover, crash recovery anywhere, recover again: a code workflow's
effects stay at most once per key, its positions stay put, its log replays clean.

The workflow is an agent: a fake model (the ``think`` step) picks a tool per
turn from a hand-written list, as a generated script says, then says done.
Some turns pick two tools, run as concurrent branches (``asyncio.gather``),
each of which then writes a ``note`` step: which note takes which position
depends on which tool ended first, so recovery must hand recorded results
back in the order the log recorded them.
Three tools reach a fake downstream service that deduplicates nothing and
keeps its own book of every call (key, what called it, how long the log was
at that moment, whether it took effect):

- ``email`` (effect ``send``, two attempts): when it fails, the service
  refuses the first call for its key (the intent is Rejected, the step tries
  again under the same key);
- ``charge`` (effect ``charge``, one attempt): when it fails, the charge
  happens but its reply is lost (the intent stays Dispatched);
- ``flaky`` (effect ``ping``, two attempts): pings, then raises on its first
  attempt (and on every attempt when it fails);
- ``search`` has no effect and, when it fails, raises.

A crash right after the N-th record is the log's first N lines; whether an
effect whose Dispatched record is the N-th line reached the service is
drawn. Reconcilers tell the truth or say they do not know; they never lie.

The expected positions and effects are written out from the script by hand
(``expected``), not taken from a run.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attempt_kernel import (
    JSON,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectRejected,
    EffectUnknown,
    Executor,
    FileLog,
    RetryPolicy,
    RunContext,
    RunLogWriter,
    RunReport,
    StepContext,
    StepFailed,
    Workflow,
    replay,
    resume_log,
    workflow,
)

RUN: Final = "agent-1"
TOOLS: Final = ("search", "email", "charge", "flaky")
EFFECT_OF: Final = {"email": "send", "charge": "charge", "flaky": "ping"}
"""The effect each tool performs, by hand; search performs none."""


@dataclass(frozen=True)
class Use:
    """One tool the fake model picks, and whether it fails this time."""

    tool: str
    fails: bool
    turns: int = 0
    """Event-loop turns the tool takes before it acts: branches side by side end in
    an order of their own, not in the order they were called."""


Turn = Sequence[Use]
"""One decision of the fake model: one tool, or two run side by side."""


@dataclass(frozen=True)
class Call:
    """One call the downstream service received."""

    key: str
    label: str
    """``step@position/effect``: who called."""
    line: int
    """How many records the log held when the call came: its Dispatched record is this line."""
    took_effect: bool


# --------------------------------------------------------------------------
# The downstream service and the agent
# --------------------------------------------------------------------------


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines_of(path)]


class Downstream:
    """A service that deduplicates nothing; its book outlives the crashed process.

    ``past`` is the book as the crash left it; ``honest`` says whether its
    reconciler answers (always the truth) or says it does not know.
    """

    def __init__(self, log: Path, past: Sequence[Call], honest: bool) -> None:
        self.log = log
        self.calls: list[Call] = list(past)
        self.honest = honest
        self.ran: list[str] = []
        """The step ids whose function ran in this process (the agent books them)."""

    def count(self, key: str) -> int:
        return sum(1 for c in self.calls if c.key == key)

    def took_effect(self, key: str) -> bool:
        return any(c.key == key and c.took_effect for c in self.calls)

    async def send(self, ctx: StepContext, effect: str, key: str, *, refuse_first: bool) -> JSON:
        held = records(self.log)
        # docs/contracts.md, "The write-ahead rule": the Dispatched record is in the log first.
        # Not always the last record: with group commit, the records of other branches that
        # shared its fsync may follow it.
        mine = [r["to"] for r in held if r["type"] == "intent" and (r["step"], r["intent"]) == (ctx.step, effect)]
        assert mine[-1:] == ["Dispatched"], held[-1]
        took = not (refuse_first and self.count(key) == 0)
        self.calls.append(Call(key=key, label=f"{ctx.step}/{effect}", line=len(held), took_effect=took))
        if not took:
            raise EffectRejected(f"the service refused {key}")
        return {"delivered": key}

    async def ask(self, key: str) -> EffectFinding:
        if not self.honest:
            return EffectUnknown()
        if self.took_effect(key):
            return EffectHappened(result={"delivered": key})
        return EffectNotHappened()


def agent(service: Downstream, script: Sequence[Turn]) -> Workflow:
    """The agent whose model decides ``script``, one turn at a time, then done."""

    def fails(turn: int, slot: int) -> bool:
        return script[turn][slot].fails

    async def take_time(ctx: StepContext, turn: int, slot: int) -> None:
        service.ran.append(ctx.step)
        for _ in range(script[turn][slot].turns):
            await asyncio.sleep(0)

    async def think(ctx: StepContext, turn: int) -> JSON:
        service.ran.append(ctx.step)
        if turn >= len(script):
            return {"tool": "done"}
        return {"tools": [use.tool for use in script[turn]], "turn": turn}

    async def search(ctx: StepContext, turn: int, slot: int) -> JSON:
        await take_time(ctx, turn, slot)
        if fails(turn, slot):
            raise RuntimeError("the index is down")
        return {"hits": 3}

    async def email(ctx: StepContext, turn: int, slot: int) -> JSON:
        await take_time(ctx, turn, slot)
        async def perform(key: str) -> JSON:
            return await service.send(ctx, "send", key, refuse_first=fails(turn, slot))

        return await ctx.effect("send", perform)

    async def charge(ctx: StepContext, turn: int, slot: int) -> JSON:
        await take_time(ctx, turn, slot)
        async def perform(key: str) -> JSON:
            reply = await service.send(ctx, "charge", key, refuse_first=False)
            if fails(turn, slot):
                raise ConnectionError("the reply was lost")
            return reply

        return await ctx.effect("charge", perform)

    async def flaky(ctx: StepContext, turn: int, slot: int) -> JSON:
        await take_time(ctx, turn, slot)
        async def perform(key: str) -> JSON:
            return await service.send(ctx, "ping", key, refuse_first=False)

        pong = await ctx.effect("ping", perform)
        if fails(turn, slot) or ctx.attempt == 1:
            raise RuntimeError("flaky")
        return pong

    async def note(ctx: StepContext, tool: str, turn: int, slot: int) -> JSON:
        service.ran.append(ctx.step)
        return f"{tool} of turn {turn} ({slot}) is done"

    tools: dict[str, tuple[Callable[[StepContext, int, int], Awaitable[JSON]], RetryPolicy]] = {
        "search": (search, RetryPolicy()),
        # initial_interval=0: which attempts run is what is tested here, not when
        "email": (email, RetryPolicy(initial_interval=0, max_attempts=2)),
        "charge": (charge, RetryPolicy()),
        "flaky": (flaky, RetryPolicy(initial_interval=0, max_attempts=2)),
    }
    reconcilers = {"send": service.ask, "charge": service.ask, "ping": service.ask}

    async def branch(run: RunContext, tool: str, turn: int, slot: int, beside: bool) -> JSON:
        fn, retry = tools[tool]
        try:
            result = await run.step(tool, fn, turn, slot, retry=retry, reconcilers=reconcilers)
        except StepFailed:
            result = "failed"
        if beside:
            await run.step("note", note, tool, turn, slot)
        return result

    @workflow("agent")
    async def flow(run: RunContext) -> JSON:
        turn = 0
        results: list[JSON] = []
        while True:
            decision = await run.step("think", think, turn)
            assert isinstance(decision, dict)
            if decision.get("tool") == "done":
                return results
            picked = decision["tools"]
            assert isinstance(picked, list)
            names = [str(tool) for tool in picked]
            beside = len(names) > 1
            results.append(
                list(await asyncio.gather(*(branch(run, t, turn, i, beside) for i, t in enumerate(names))))
            )
            turn += 1

    return flow


# --------------------------------------------------------------------------
# What the script says, by hand
# --------------------------------------------------------------------------


def expected(script: Sequence[Turn]) -> tuple[list[tuple[int, str]], set[str]]:
    """The (position, name) of every call, and every effect that takes effect.

    think, then the turn's tools in call order, then (two tools) their two
    notes, ...; a final think. Every effect tool takes effect once, failing
    or not: a refused email is sent again, a lost reply's charge happened,
    the flaky tool pings before it raises.
    """
    calls: list[tuple[int, str]] = []
    effects: set[str] = set()
    position = 1
    for turn in script:
        calls.append((position, "think"))
        position += 1
        for use in turn:
            calls.append((position, use.tool))
            if use.tool != "search":
                effects.add(f"{use.tool}@{position}/{EFFECT_OF[use.tool]}")
            position += 1
        if len(turn) == 2:
            calls += [(position, "note"), (position + 1, "note")]
            position += 2
    calls.append((position, "think"))
    return calls, effects


# --------------------------------------------------------------------------
# Checks on a log and the service's book
# --------------------------------------------------------------------------


def execute(path: Path, flow: Workflow, limit: int) -> RunReport:
    async def main() -> RunReport:
        with RunLogWriter(path, create=True) as log:
            return await Executor(log, admission_limit=limit).run(flow, RUN)

    return asyncio.run(main())


def keys_by_label(path: Path) -> dict[str, str]:
    """``step/intent`` -> idempotency key, from the log's intent_planned records."""
    keys: dict[str, str] = {}
    for r in records(path):
        if r["type"] == "intent_planned":
            label, key = f"{r['step']}/{r['intent']}", r["key"]
            assert isinstance(key, str)
            assert keys.setdefault(label, key) == key, f"{label} changed its key"
    return keys


def outcomes(path: Path) -> list[tuple[int, str, str]]:
    """(line, key, "Confirmed"/"Rejected") for every intent outcome the log records."""
    keys = keys_by_label(path)
    found: list[tuple[int, str, str]] = []
    for line, r in enumerate(records(path), 1):
        if r["type"] == "intent" and r["to"] in ("Confirmed", "Rejected"):
            to = r["to"]
            assert isinstance(to, str)
            found.append((line, keys[f"{r['step']}/{r['intent']}"], to))
        elif r["type"] == "reconciled" and r["to"] in ("Confirmed", "Rejected"):
            key, to = r["key"], r["to"]
            assert isinstance(key, str) and isinstance(to, str)
            found.append((line, key, to))
    return found


def check_book(path: Path, book: Sequence[Call]) -> None:
    """A key is called again only after the log shows its earlier intent Rejected,
    and never once the log shows it Confirmed."""
    known = outcomes(path)
    previous: dict[str, int] = {}
    for call in book:
        before = [(line, to) for line, key, to in known if key == call.key and line < call.line]
        assert ("Confirmed" not in [to for _, to in before]), f"{call} sent after its Confirmed"
        if call.key in previous:
            rejected = [line for line, to in before if to == "Rejected" and line > previous[call.key]]
            assert rejected, f"{call} sent again, but no Rejected since line {previous[call.key]}"
        previous[call.key] = call.line


def check_recovered(
    path: Path, book: Sequence[Call], script: Sequence[Turn], clean_keys: dict[str, str]
) -> None:
    assert replay(FileLog(path)).violation_count == 0
    calls, effects = expected(script)
    got = [(r["position"], r["name"]) for r in records(path) if r["type"] == "step_called"]
    assert got == calls
    check_book(path, book)
    # keys are per run, and the run is the same: every key is the crash-free run's
    assert keys_by_label(path).items() <= clean_keys.items()
    ended = [r["to"] for r in records(path) if r["type"] == "transition"]
    if "Indeterminate" not in ended:
        assert {c.label for c in book if c.took_effect} == effects
    assert [r["type"] for r in records(path)].count("run_finished") == 1
    assert records(path)[-1]["type"] == "run_finished"


def orphans(rows: Sequence[dict[str, object]]) -> dict[tuple[str, int], bool]:
    """The attempts a crash leaves live, and whether one of their intents is
    Dispatched with no outcome: a plain fold of the records, independent of the ledger."""
    live: dict[tuple[str, int], set[str]] = {}
    for r in rows:
        attempt = r.get("attempt")
        if not isinstance(attempt, int):
            continue  # a run's own record
        at = (str(r["step"]), attempt)
        if r["type"] == "created":
            live[at] = set()
        elif r["type"] == "transition" and r["to"] not in ("Pending", "Running"):
            live.pop(at, None)
        elif r["type"] in ("intent", "reconciled") and at in live:
            if r["to"] == "Dispatched":
                live[at].add(str(r["intent"]))
            else:
                live[at].discard(str(r["intent"]))
    return {at: bool(names) for at, names in live.items()}


def check_nothing_ran_again(path: Path, cut: int, ran: Sequence[str]) -> None:
    """A position that succeeded before the crash is answered from the log: its function does not run."""
    done = {str(r["step"]) for r in records(path)[:cut] if r["type"] == "transition" and r["to"] == "Succeeded"}
    assert not done & set(ran), sorted(done & set(ran))


def check_orphans(path: Path, cut: int, honest: bool) -> None:
    """Each attempt the crash left live ends Cancelled, or Indeterminate exactly when
    its effect was in flight and the reconciler could not tell; Indeterminate is never retried."""
    rows = records(path)
    ends = {(r["step"], r["attempt"]): r["to"] for r in rows[cut:] if r["type"] == "transition"}
    for (step, attempt), in_flight in orphans(rows[:cut]).items():
        assert ends[step, attempt] == ("Indeterminate" if in_flight and not honest else "Cancelled"), (
            step, attempt, in_flight, honest,
        )  # fmt: skip
    created = {(r["step"], r["attempt"]) for r in rows if r["type"] == "created"}
    for r in rows:
        number = r.get("attempt")
        if r["type"] == "transition" and r["to"] == "Indeterminate":
            assert isinstance(number, int)
            assert (r["step"], number + 1) not in created, f"{r['step']} retried after Indeterminate"


def survivors(book: Sequence[Call], cut: int, reached: bool) -> list[Call]:
    """The calls a crash right after record ``cut`` leaves in the service's book."""
    return [c for c in book if c.line < cut or (c.line == cut and reached)]


uses = st.builds(Use, tool=st.sampled_from(TOOLS), fails=st.booleans(), turns=st.integers(0, 3))
turns = st.lists(uses, min_size=1, max_size=2)


def crash_points(low: int, high: int, book: Sequence[Call]) -> st.SearchStrategy[int]:
    """Any record from ``low`` to ``high``, half of the time one next to a call
    (just before its Dispatched record, at it, just after it)."""
    near = sorted({c.line + d for c in book for d in (-1, 0, 1)} & set(range(low, high + 1)))
    anywhere = st.integers(low, high)
    return st.one_of(st.sampled_from(near), anywhere) if near else anywhere


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(turns, max_size=5), limit=st.sampled_from([1, 8]), data=st.data())
def test_recovery_twice_over_keeps_effects_at_most_once_and_positions_put(
    script: list[list[Use]], limit: int, data: st.DataObject
) -> None:
    """``limit`` is the admission limit: with 1, a branch waits Pending for the other."""
    with tempfile.TemporaryDirectory() as folder:
        clean = Path(folder) / "clean.jsonl"
        service = Downstream(clean, [], honest=True)
        report = execute(clean, agent(service, script), limit)
        calls, effects = expected(script)
        assert [(r["position"], r["name"]) for r in records(clean) if r["type"] == "step_called"] == calls
        assert {c.label for c in service.calls if c.took_effect} == effects
        refused = sum(1 for turn in script for use in turn if use.tool == "email" and use.fails)
        assert len(service.calls) == len(effects) + refused
        assert report.status in ("succeeded", "needs-reconciliation")
        clean_keys = keys_by_label(clean)

        total = len(lines_of(clean))
        cut = data.draw(crash_points(1, total - 1, service.calls), label="crash right after record")
        crashed = Path(folder) / "crashed.jsonl"
        crashed.write_bytes(b"".join(line + b"\n" for line in lines_of(clean)[:cut]))
        in_flight = any(c.line == cut for c in service.calls)
        reached = in_flight and data.draw(st.booleans(), label="the call in flight reached the service")
        first = Downstream(crashed, survivors(service.calls, cut, reached), data.draw(st.booleans(), label="honest"))
        resumed = resume_log(crashed, [agent(first, script)], admission_limit=limit)
        assert resumed.diverged == ()
        assert [r.run for r in resumed.reports] == [RUN]
        check_recovered(crashed, first.calls, script, clean_keys)
        check_orphans(crashed, cut, first.honest)
        check_nothing_ran_again(crashed, cut, first.ran)

        # a second crash, in the middle of what recovery wrote, and recovery again
        length = len(lines_of(crashed))
        if length - 1 <= cut:
            return
        again_cut = data.draw(
            crash_points(cut + 1, length - 1, first.calls), label="recovery crashes after record"
        )
        twice = Path(folder) / "twice.jsonl"
        twice.write_bytes(b"".join(line + b"\n" for line in lines_of(crashed)[:again_cut]))
        in_flight = any(c.line == again_cut for c in first.calls)
        reached = in_flight and data.draw(st.booleans(), label="the call in flight reached the service")
        second = Downstream(
            twice, survivors(first.calls, again_cut, reached), data.draw(st.booleans(), label="honest")
        )
        resumed = resume_log(twice, [agent(second, script)], admission_limit=limit)
        assert resumed.diverged == ()
        assert [r.run for r in resumed.reports] == [RUN]
        check_recovered(twice, second.calls, script, clean_keys)
        check_orphans(twice, again_cut, second.honest)
        check_nothing_ran_again(twice, again_cut, second.ran)
