"""Workflows as code: positions, results, errors, and recovery by running the code again."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attempt_kernel import (
    JSON,
    Cancelled,
    EffectFinding,
    EffectHappened,
    EffectNotHappened,
    EffectUnknown,
    Executor,
    Failed,
    FileLog,
    Job,
    Indeterminate,
    RetryPolicy,
    RunContext,
    RunLogWriter,
    RunReport,
    StepCalled,
    StepContext,
    StepFailed,
    Succeeded,
    Workflow,
    WorkflowError,
    load_workflow,
    replay,
    resume_log,
    run_jobs,
    workflow,
)
from attempt_kernel._coderun import arguments_digest
from attempt_kernel._executor import recorded_report


def records(path: Path) -> list[dict[str, object]]:
    """The log's records as plain JSON objects, in order."""
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def of_type(path: Path, kind: str) -> list[dict[str, object]]:
    return [r for r in records(path) if r["type"] == kind]


def execute(path: Path, flow: Workflow, run: str, input: JSON = None) -> RunReport:
    async def main() -> RunReport:
        with RunLogWriter(path, create=True) as log:
            return await Executor(log).run(flow, run, input=input)

    return asyncio.run(main())


def crash_after(source: Path, n: int, target: Path) -> Path:
    """The log a crash right after the ``n``-th record leaves: its first n lines."""
    lines = source.read_bytes().splitlines(keepends=True)
    target.write_bytes(b"".join(lines[:n]))
    return target


# --------------------------------------------------------------------------
# A small agent: a fake model picks tools until it says done
# --------------------------------------------------------------------------


class Service:
    """A downstream system that deduplicates nothing: it counts every call by key."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.bodies: dict[str, JSON] = {}

    async def send(self, key: str, body: JSON) -> JSON:
        self.calls[key] = self.calls.get(key, 0) + 1
        self.bodies[key] = body
        return {"delivered": key}

    async def ask(self, key: str) -> EffectFinding:
        if key in self.calls:
            return EffectHappened(result={"delivered": key})
        return EffectNotHappened()


def agent(
    service: Service, script: list[str], name: str = "agent", use: dict[str, str] | None = None
) -> Workflow:
    """The model's decisions are ``script``, one tool per turn, then done.

    ``use`` maps a tool the model picks to the tool the workflow's code calls
    (an edit of the code, for divergence).
    """
    instead = use or {}

    async def think(ctx: StepContext, turn: int) -> JSON:
        if turn >= len(script):
            return {"tool": "done"}
        return {"tool": script[turn], "args": {"turn": turn}}

    async def email(ctx: StepContext, args: JSON) -> JSON:
        async def perform(key: str) -> JSON:
            return await service.send(key, args)

        return await ctx.effect("send", perform)

    async def search(ctx: StepContext, args: JSON) -> JSON:
        return {"hits": 2, "for": args}

    tools: dict[str, Callable[[StepContext, JSON], Awaitable[JSON]]] = {
        "email": email,
        "search": search,
    }

    @workflow(name)
    async def flow(run: RunContext) -> JSON:
        turn = 0
        results: list[JSON] = []
        while True:
            decision = await run.step("think", think, turn)
            assert isinstance(decision, dict)
            tool = decision["tool"]
            assert isinstance(tool, str)
            if tool == "done":
                return {"turns": turn, "results": results}
            tool = instead.get(tool, tool)
            results.append(
                await run.step(tool, tools[tool], decision["args"], reconcilers={"send": service.ask})
            )
            turn += 1

    return flow


# --------------------------------------------------------------------------
# Positions
# --------------------------------------------------------------------------


def test_each_call_records_its_position_name_and_digest_before_its_first_attempt(
    tmp_path: Path,
) -> None:
    log = tmp_path / "a.jsonl"
    report = execute(log, agent(Service(), ["search", "email"]), "a-1")
    assert report.status == "succeeded"
    assert [s.step for s in report.steps] == [
        "think@1", "search@2", "think@3", "email@4", "think@5",
    ]  # fmt: skip
    calls = of_type(log, "step_called")
    assert [(c["position"], c["name"], c["step"]) for c in calls] == [
        (1, "think", "think@1"),
        (2, "search", "search@2"),
        (3, "think", "think@3"),
        (4, "email", "email@4"),
        (5, "think", "think@5"),
    ]
    # think(0) and think(1) carry different arguments, hence different digests
    assert calls[0]["digest"] != calls[2]["digest"]
    kinds = [(r["type"], r.get("step")) for r in records(log)]
    for call in calls:
        assert kinds.index(("step_called", call["step"])) < kinds.index(("created", call["step"]))


def test_the_run_result_is_what_the_function_returned_and_is_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    report = execute(log, agent(Service(), ["search"]), "a-1")
    assert report.result == {"turns": 1, "results": [{"hits": 2, "for": {"turn": 0}}]}
    [end] = of_type(log, "run_finished")
    assert end["ok"] is True
    assert end["result"] == {"turns": 1, "results": [{"hits": 2, "for": {"turn": 0}}]}


def test_gather_numbers_steps_in_call_order(tmp_path: Path) -> None:
    async def slow(ctx: StepContext, label: str) -> JSON:
        for _ in range(5):
            await asyncio.sleep(0)
        return label

    async def fast(ctx: StepContext, label: str) -> JSON:
        return label

    @workflow("fan")
    async def fan(run: RunContext) -> JSON:
        a, b, c = await asyncio.gather(
            run.step("a", slow, "A"), run.step("b", fast, "B"), run.step("c", slow, "C")
        )
        return [a, b, c]

    log = tmp_path / "g.jsonl"
    report = execute(log, fan, "g-1")
    assert report.result == ["A", "B", "C"]
    assert [(c["position"], c["name"]) for c in of_type(log, "step_called")] == [
        (1, "a"), (2, "b"), (3, "c"),
    ]  # fmt: skip
    # the same after a crash before any step ended: recovery runs it again
    crashed = crash_after(log, 5, tmp_path / "g2.jsonl")
    resumed = resume_log(crashed, [fan])
    [again] = resumed.reports
    assert again.result == ["A", "B", "C"]
    assert [c["name"] for c in of_type(crashed, "step_called")] == ["a", "b", "c"]
    assert replay(FileLog(crashed)).violation_count == 0


def test_a_name_may_repeat_the_position_is_the_identity(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    execute(log, agent(Service(), ["search", "search"]), "a-1")
    names = [c["name"] for c in of_type(log, "step_called")]
    assert names == ["think", "search", "think", "search", "think"]


# --------------------------------------------------------------------------
# Results and errors the function sees
# --------------------------------------------------------------------------


def test_a_failed_step_raises_step_failed_which_the_function_may_catch(tmp_path: Path) -> None:
    async def broken(ctx: StepContext) -> JSON:
        raise RuntimeError("the tool is down")

    async def fine(ctx: StepContext) -> JSON:
        return "fallback"

    seen: list[str] = []

    @workflow("catching")
    async def catching(run: RunContext) -> JSON:
        try:
            await run.step("broken", broken, retry=RetryPolicy(initial_interval=0, max_attempts=2))
        except StepFailed as failed:
            seen.append(str(failed))
            assert failed.outcome.state == Failed()
            assert failed.outcome.attempts == 2
            return await run.step("fine", fine)
        return "unreachable"

    report = execute(tmp_path / "c.jsonl", catching, "c-1")
    assert report.status == "succeeded"
    assert report.result == "fallback"
    assert seen == [
        "step 'broken@1' of run 'c-1' did not succeed (attempt 2: Failed):"
        " RuntimeError: the tool is down"
    ]


def test_the_report_of_a_code_run_says_what_its_log_says(tmp_path: Path) -> None:
    # The executor reuses each step's outcome from its drive for the run's
    # report; the report must equal the one rebuilt from the log alone.
    async def broken(ctx: StepContext) -> JSON:
        raise RuntimeError("the tool is down")

    async def fine(ctx: StepContext, value: int) -> JSON:
        return {"value": value}

    @workflow("mixed")
    async def mixed(run: RunContext) -> JSON:
        try:
            await run.step("broken", broken, retry=RetryPolicy(initial_interval=0, max_attempts=2))
        except StepFailed:
            pass
        both = await asyncio.gather(run.step("fine", fine, 1), run.step("fine", fine, 2))
        return [b for b in both]

    log = tmp_path / "m.jsonl"
    report = execute(log, mixed, "m-1")
    rebuilt = recorded_report(FileLog(log), mixed, "m-1")
    assert report == rebuilt
    assert [(s.step, s.state, s.attempts, s.result, s.error) for s in report.steps] == [
        ("broken@1", Failed(), 2, None, "RuntimeError: the tool is down"),
        ("fine@2", Succeeded(), 1, {"value": 1}, None),
        ("fine@3", Succeeded(), 1, {"value": 2}, None),
    ]


def test_an_uncaught_step_failure_fails_the_run_with_the_error_recorded(tmp_path: Path) -> None:
    async def broken(ctx: StepContext) -> JSON:
        raise RuntimeError("no")

    @workflow("uncaught")
    async def uncaught(run: RunContext) -> JSON:
        return await run.step("broken", broken)

    log = tmp_path / "u.jsonl"
    report = execute(log, uncaught, "u-1")
    assert report.status == "failed"
    assert report.error is not None and report.error.startswith("StepFailed: step 'broken@1'")
    [end] = of_type(log, "run_finished")
    assert end["ok"] is False and end["error"] == report.error


def test_a_function_returning_a_value_the_log_cannot_hold_fails_the_run(tmp_path: Path) -> None:
    @workflow("unjson")
    async def unjson(run: RunContext) -> JSON:
        return {"a": {1, 2}}  # type: ignore[dict-item]  # a set is what the test hands over

    log = tmp_path / "n.jsonl"
    report = execute(log, unjson, "n-1")
    assert report.status == "failed"
    assert report.error is not None
    assert report.error.startswith("the workflow function returned a value the run log cannot encode")
    assert replay(FileLog(log)).violation_count == 0


def test_a_step_argument_that_is_not_json_is_refused_at_the_call_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    async def tool(ctx: StepContext, a: JSON, b: JSON) -> JSON:
        return None

    errors: list[str] = []

    @workflow("badarg")
    async def badarg(run: RunContext) -> JSON:
        try:
            not_json: Any = {"x": object()}  # what a caller that ignored the types passes
            _ = run.step("tool", tool, 1, not_json)
        except WorkflowError as error:
            errors.append(str(error))
        return "ok"

    log = tmp_path / "b.jsonl"
    report = execute(log, badarg, "b-1")
    assert report.result == "ok"
    assert len(errors) == 1
    assert errors[0].startswith("run.step('tool', ...): argument 2 is not a JSON value")
    assert of_type(log, "step_called") == []
    assert of_type(log, "created") == []


def test_workflow_refuses_a_function_that_is_not_async() -> None:
    def plain(run: RunContext) -> JSON:
        return None

    with pytest.raises(WorkflowError, match=r"workflow 'w': .*plain.* is not an async function"):
        workflow("w")(plain)  # type: ignore[arg-type]  # the wrong kind of function, on purpose


def test_run_step_refuses_a_step_function_that_is_not_async(tmp_path: Path) -> None:
    def plain(ctx: StepContext) -> JSON:
        return None

    errors: list[str] = []

    @workflow("syncstep")
    async def flow(run: RunContext) -> JSON:
        try:
            await run.step("plain", plain)  # type: ignore[arg-type]  # not async, on purpose
        except WorkflowError as error:
            errors.append(str(error))
        return None

    execute(tmp_path / "s.jsonl", flow, "s-1")
    assert len(errors) == 1 and "plain" in errors[0] and "not an async function" in errors[0]


def test_run_step_after_the_run_finished_is_refused(tmp_path: Path) -> None:
    kept: list[RunContext] = []

    async def noop(ctx: StepContext) -> JSON:
        return None

    @workflow("keeps")
    async def keeps(run: RunContext) -> JSON:
        kept.append(run)
        return None

    execute(tmp_path / "k.jsonl", keeps, "k-1")

    async def later() -> None:
        with pytest.raises(WorkflowError):
            _ = kept[0].step("noop", noop)

    asyncio.run(later())


def test_run_step_from_inside_a_step_is_refused(tmp_path: Path) -> None:
    holder: list[RunContext] = []
    errors: list[str] = []

    async def inner(ctx: StepContext) -> JSON:
        return None

    async def outer(ctx: StepContext) -> JSON:
        try:
            _ = holder[0].step("inner", inner)
        except WorkflowError as error:
            errors.append(str(error))
        return None

    @workflow("nested")
    async def nested(run: RunContext) -> JSON:
        holder.append(run)
        return await run.step("outer", outer)

    execute(tmp_path / "x.jsonl", nested, "x-1")
    assert errors == [
        "run.step('inner') of run 'x-1' was called from inside a step (a step's function"
        " gets a StepContext, not the RunContext)"
    ]


def test_a_finished_run_id_returns_its_recorded_report(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    service = Service()
    flow = agent(service, ["email"])
    first = execute(log, flow, "a-1")
    before = log.read_bytes()
    second = execute(log, flow, "a-1")
    assert log.read_bytes() == before
    assert second.result == first.result
    assert [s.step for s in second.steps] == [s.step for s in first.steps]
    assert sum(service.calls.values()) == 1


# --------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------


def test_two_runs_with_the_same_id_in_two_logs_never_share_a_key(tmp_path: Path) -> None:
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        execute(tmp_path / folder / "a.jsonl", agent(Service(), ["email"]), "agent-1")
    key_one = of_type(tmp_path / "one" / "a.jsonl", "intent_planned")[0]["key"]
    key_two = of_type(tmp_path / "two" / "a.jsonl", "intent_planned")[0]["key"]
    assert key_one != key_two


def test_dag_runs_with_the_same_id_in_two_logs_never_share_a_key(tmp_path: Path) -> None:
    from attempt_kernel import Step

    async def pay(ctx: StepContext) -> JSON:
        async def charge(key: str) -> JSON:
            return key

        return await ctx.effect("charge", charge)

    dag = load_workflow("dag", [Step(name="pay", run=pay)])
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        execute(tmp_path / folder / "d.jsonl", dag, "order-1")
    key_one = of_type(tmp_path / "one" / "d.jsonl", "intent_planned")[0]["key"]
    key_two = of_type(tmp_path / "two" / "d.jsonl", "intent_planned")[0]["key"]
    assert key_one != key_two


# --------------------------------------------------------------------------
# Recovery: the code runs again from the top
# --------------------------------------------------------------------------


def test_recovery_after_every_record_performs_each_effect_once_and_ends_like_a_clean_run(
    tmp_path: Path,
) -> None:
    clean = tmp_path / "clean.jsonl"
    script = ["email", "search", "email"]
    report = execute(clean, agent(Service(), script), "a-1")
    total = len(records(clean))
    assert report.status == "succeeded"
    for n in range(1, total):
        for happened in (True, False):
            log = crash_after(clean, n, tmp_path / f"crash-{n}-{happened}.jsonl")
            service = Service()
            # the effects the crashed process performed: confirmed ones for
            # sure, a dispatched one as the parameter says
            planned = {(r["step"], r["intent"]): r["key"] for r in of_type(log, "intent_planned")}
            for r in of_type(log, "intent"):
                key = planned[r["step"], r["intent"]]
                assert isinstance(key, str)
                if r["to"] == "Confirmed" or (r["to"] == "Dispatched" and happened):
                    service.calls[key] = 1
            resumed = resume_log(log, [agent(service, script)])
            if n == total - 1 and not resumed.reports:
                continue  # only run_finished was missing? then it was closed as is
            assert resumed.diverged == ()
            [again] = resumed.reports
            assert again.status == "succeeded", (n, happened)
            assert again.result == report.result, (n, happened)
            assert sorted(service.calls.values()) == [1, 1], (n, happened, service.calls)
            assert replay(FileLog(log)).violation_count == 0


def test_a_succeeded_position_is_answered_from_the_log_and_runs_nothing(tmp_path: Path) -> None:
    ran: list[int] = []

    async def think(ctx: StepContext, turn: int) -> JSON:
        ran.append(turn)
        return {"tool": "done"} if turn >= 2 else {"tool": "go"}

    @workflow("counts")
    async def counts(run: RunContext) -> JSON:
        turn = 0
        while True:
            decision = await run.step("think", think, turn)
            assert isinstance(decision, dict)
            if decision["tool"] == "done":
                return turn
            turn += 1

    clean = tmp_path / "c.jsonl"
    execute(clean, counts, "c-1")
    assert ran == [0, 1, 2]
    # crash right after think@2 succeeded (its records: called, created, admitted, result, succeeded)
    lines = records(clean)
    cut = next(i for i, r in enumerate(lines) if r.get("step") == "think@3") + 0
    log = crash_after(clean, cut, tmp_path / "c2.jsonl")
    ran.clear()
    [again] = resume_log(log, [counts]).reports
    assert again.result == 2
    assert ran == [2]  # positions 1 and 2 came from the log


def test_concurrent_branches_replay_in_the_order_they_ended(tmp_path: Path) -> None:
    gates: list[asyncio.Event] = []

    async def slow_a1(ctx: StepContext) -> JSON:
        await gates[-1].wait()  # a1 ends only once chain b has asked for b2
        return "a1"

    async def quick(ctx: StepContext, label: str) -> JSON:
        return label

    @workflow("branches")
    async def branches(run: RunContext) -> JSON:
        gate = asyncio.Event()
        gates.append(gate)

        async def chain_a() -> JSON:
            first = await run.step("a1", slow_a1)
            return [first, await run.step("a2", quick, "a2")]

        async def chain_b() -> JSON:
            first = await run.step("b1", quick, "b1")
            second = run.step("b2", quick, "b2")
            gate.set()
            return [first, await second]

        a, b = await asyncio.gather(chain_a(), chain_b())
        return [a, b]

    clean = tmp_path / "br.jsonl"
    report = execute(clean, branches, "br-1")
    assert report.result == [["a1", "a2"], ["b1", "b2"]]
    positions = [(c["position"], c["name"]) for c in of_type(clean, "step_called")]
    # b1 ended before a1, so b2 took position 3 and a2 position 4
    assert positions == [(1, "a1"), (2, "b1"), (3, "b2"), (4, "a2")]
    total = len(records(clean))
    for n in range(1, total):
        log = crash_after(clean, n, tmp_path / f"br-{n}.jsonl")
        resumed = resume_log(log, [branches])
        assert resumed.diverged == (), n
        [again] = resumed.reports
        assert again.result == [["a1", "a2"], ["b1", "b2"]], n
        assert [(c["position"], c["name"]) for c in of_type(log, "step_called")] == positions, n
        assert replay(FileLog(log)).violation_count == 0


def taking_turns(turns: dict[str, int]) -> Callable[[StepContext, str], Awaitable[JSON]]:
    """A step function that gives the event loop ``turns[key]`` turns, then returns ``key``
    (as I/O of that length would: steps end in an order the turns decide)."""

    async def work(ctx: StepContext, key: str) -> JSON:
        for _ in range(turns[key]):
            await asyncio.sleep(0)
        return key

    return work


def calls_of(lines: list[bytes]) -> list[tuple[int, str, str]]:
    """(position, name, digest) of each step call and wait in ``lines``, by position."""
    found = [json.loads(line) for line in lines]
    return sorted(
        (r["position"], r.get("name", "(wait)"), r.get("digest", ""))
        for r in found
        if r["type"] in ("step_called", "wait_started")
    )


@pytest.mark.parametrize("seed", [3, 17])
def test_four_branches_crashed_at_every_record_resume_with_their_calls_where_they_were(
    seed: int, tmp_path: Path
) -> None:
    """Four chains of five steps each, gathered, whose steps take a seeded number of loop turns
    (so they end in a scrambled order), one chain sleeping between two steps: a crash after any
    record resumes without divergence, every call the log held keeps its position, the positions
    stay contiguous, the run makes the same calls in all, and the log replays clean.

    A step's call is written when its task starts, with its first attempt, so another chain's
    step may end between a call and its record; this is what replay must hand back in order.
    """
    rng = random.Random(seed)
    work = taking_turns({f"b{b}s{s}": rng.randint(0, 4) for b in range(4) for s in range(5)})

    @workflow("scrambled")
    async def scrambled(run: RunContext) -> JSON:
        async def chain(b: int) -> list[JSON]:
            done: list[JSON] = []
            for s in range(5):
                done.append(await run.step(f"b{b}", work, f"b{b}s{s}"))
                if (b, s) == (0, 1):
                    await run.sleep(0)
            return done

        return list(await asyncio.gather(*(chain(b) for b in range(4))))

    clean = tmp_path / "clean.jsonl"
    assert execute(clean, scrambled, "r").status == "succeeded"
    lines = clean.read_bytes().splitlines(keepends=True)
    every = calls_of(lines)
    assert len(every) == 21  # 20 steps and the sleep
    for n in range(1, len(lines)):
        log = crash_after(clean, n, tmp_path / f"cut-{n}.jsonl")
        held = calls_of(lines[:n])
        resumed = resume_log(log, [scrambled])
        assert resumed.diverged == () and [r.status for r in resumed.reports] == ["succeeded"], n
        after = calls_of(log.read_bytes().splitlines())
        assert after[: len(held)] == held, n
        assert [p for p, _, _ in after] == list(range(1, 22)), n
        assert sorted((name, digest) for _, name, digest in after) == sorted((name, digest) for _, name, digest in every), n
        assert replay(FileLog(log)).violation_count == 0, n


def test_a_fan_out_beside_a_plain_branch_resumes_after_a_crash_at_every_record(tmp_path: Path) -> None:
    """One branch gathers two fetches, then summarises; the other plans (two loop turns), then acts.
    The summary is called before the plan ends, and its call is in the log before that end (a step's
    call not yet written goes in before any end), so recovery after any record hands the ends back
    with the calls between them and the branches take the same positions."""
    work = taking_turns({"fetch-a": 0, "fetch-b": 0, "plan": 2, "summary": 0, "act": 0})

    @workflow("fan-out")
    async def fan_out(run: RunContext) -> JSON:
        async def research() -> JSON:
            found = await asyncio.gather(run.step("fetch", work, "fetch-a"), run.step("fetch", work, "fetch-b"))
            return [*found, await run.step("summarise", work, "summary")]

        async def planning() -> JSON:
            return [await run.step("plan", work, "plan"), await run.step("act", work, "act")]

        return list(await asyncio.gather(research(), planning()))

    clean = tmp_path / "clean.jsonl"
    assert execute(clean, fan_out, "r").status == "succeeded"
    positions = [(c["position"], c["name"]) for c in of_type(clean, "step_called")]
    assert positions == [(1, "fetch"), (2, "fetch"), (3, "plan"), (4, "summarise"), (5, "act")]
    kinds = [(r["type"], r.get("step"), r.get("to")) for r in records(clean)]
    assert kinds.index(("step_called", "summarise@4", None)) < kinds.index(("transition", "plan@3", "Succeeded"))
    for n in range(1, len(kinds)):
        log = crash_after(clean, n, tmp_path / f"cut-{n}.jsonl")
        resumed = resume_log(log, [fan_out])
        assert resumed.diverged == () and [r.status for r in resumed.reports] == ["succeeded"], n
        assert [(c["position"], c["name"]) for c in of_type(log, "step_called")] == positions, n


def test_an_orphan_with_an_outstanding_effect_ends_indeterminate_and_is_not_retried(
    tmp_path: Path,
) -> None:
    clean = tmp_path / "a.jsonl"
    service = Service()
    execute(clean, agent(service, ["email"]), "a-1")
    lines = records(clean)
    dispatched = next(i for i, r in enumerate(lines) if r.get("to") == "Dispatched")
    log = crash_after(clean, dispatched + 1, tmp_path / "i.jsonl")

    async def unknown(key: str) -> EffectFinding:
        return EffectUnknown()

    after = Service()
    flow = agent(after, ["email"])
    # no reconciler can tell: the Dispatched effect stays outstanding
    after.ask = unknown  # type: ignore[method-assign]  # a reconciler that cannot answer
    resumed = resume_log(log, [flow])
    [again] = resumed.reports
    assert again.status == "needs-reconciliation"
    email = next(s for s in again.steps if s.step == "email@2")
    assert email.state == Indeterminate()
    assert len(email.outstanding) == 1
    assert after.calls == {}  # never sent again
    assert replay(FileLog(log)).violation_count == 0


def test_a_reconciler_that_finds_the_effect_makes_the_orphan_cancelled_and_reuses_the_result(
    tmp_path: Path,
) -> None:
    clean = tmp_path / "a.jsonl"
    execute(clean, agent(Service(), ["email"]), "a-1")
    lines = records(clean)
    dispatched = next(i for i, r in enumerate(lines) if r.get("to") == "Dispatched")
    log = crash_after(clean, dispatched + 1, tmp_path / "r.jsonl")
    planned = of_type(log, "intent_planned")[0]["key"]
    assert isinstance(planned, str)
    service = Service()
    service.calls[planned] = 1  # the crashed process had sent it
    [again] = resume_log(log, [agent(service, ["email"])]).reports
    assert again.status == "succeeded"
    assert service.calls == {planned: 1}
    moves = [
        (r["step"], r["attempt"], r["to"]) for r in of_type(log, "transition") if r["step"] == "email@2"
    ]
    assert moves == [
        ("email@2", 1, "Running"), ("email@2", 1, "Cancelled"),
        ("email@2", 2, "Running"), ("email@2", 2, "Succeeded"),
    ]  # fmt: skip
    assert of_type(log, "reconciled")[0]["note"] == "asked by recovery before ending the orphaned attempt"
    assert again.steps[1].state == Succeeded()


# --------------------------------------------------------------------------
# Divergence
# --------------------------------------------------------------------------


def test_divergence_leaves_the_log_byte_for_byte_and_sends_nothing(tmp_path: Path) -> None:
    clean = tmp_path / "a.jsonl"
    execute(clean, agent(Service(), ["search", "email"]), "a-1")
    lines = records(clean)
    # crash just after the model's second decision (think@3) was recorded
    cut = next(i for i, r in enumerate(lines) if r.get("step") == "email@4")
    log = crash_after(clean, cut, tmp_path / "d.jsonl")
    before = log.read_bytes()
    service = Service()
    # the edited code calls another tool for the model's first decision
    resumed = resume_log(log, [agent(service, ["search", "email"], use={"search": "email"})])
    assert resumed.reports == ()
    [diverged] = resumed.diverged
    assert diverged.run == "a-1"
    assert diverged.position == 2
    assert isinstance(diverged.recorded, StepCalled) and diverged.recorded.name == "search"
    assert diverged.requested is not None and diverged.requested[0] == "email"
    assert str(diverged).startswith(
        "run 'a-1' diverged at position 2: the log holds step 'search' (arguments sha256:"
    )
    assert log.read_bytes() == before
    assert service.calls == {}


def test_divergence_when_the_code_stops_asking(tmp_path: Path) -> None:
    clean = tmp_path / "a.jsonl"
    execute(clean, agent(Service(), ["search", "search"]), "a-1")
    lines = records(clean)
    cut = next(i for i, r in enumerate(lines) if r.get("step") == "think@5")
    log = crash_after(clean, cut, tmp_path / "d.jsonl")
    before = log.read_bytes()

    @workflow("agent")
    async def gives_up(run: RunContext) -> JSON:
        return "nothing"

    resumed = resume_log(log, [gives_up])
    [diverged] = resumed.diverged
    assert diverged.position == 1
    assert diverged.requested is None
    assert "returned before asking for it" in str(diverged)
    assert log.read_bytes() == before


def two_runs_cut_before_either_ends(tmp_path: Path) -> tuple[Path, Workflow]:
    """Runs a-1 and b-1 of two agents, the log cut before either ends, and a-1's agent with
    its code edited (``search`` became ``email``)."""
    clean = tmp_path / "two.jsonl"
    first, second = agent(Service(), ["search"]), agent(Service(), ["search"], name="other")
    with RunLogWriter(clean, create=True) as writer:
        run_jobs(writer, [Job(workflow=first, run="a-1"), Job(workflow=second, run="b-1")])
    ends = [i for i, r in enumerate(records(clean)) if r["type"] == "run_finished"]
    return crash_after(clean, ends[0] - 1, tmp_path / "cut.jsonl"), agent(Service(), ["search"], use={"search": "email"})


def test_one_diverged_run_does_not_stop_the_others(tmp_path: Path) -> None:
    log, edited = two_runs_cut_before_either_ends(tmp_path)
    resumed = resume_log(log, [edited, agent(Service(), ["search"], name="other")])
    [diverged] = resumed.diverged
    assert diverged.run == "a-1"
    [report] = resumed.reports
    assert (report.run, report.status) == ("b-1", "succeeded")
    assert replay(FileLog(log)).violation_count == 0


def test_on_diverged_is_told_of_each_run_whose_code_diverged_once(tmp_path: Path) -> None:
    """``recover URL`` lets go of such a run there; the run is still reported as diverged."""
    log, edited = two_runs_cut_before_either_ends(tmp_path)
    told: list[str] = []
    resumed = resume_log(log, [edited, agent(Service(), ["search"], name="other")], on_diverged=told.append)
    assert told == ["a-1"]
    assert [d.run for d in resumed.diverged] == ["a-1"]
    assert [(r.run, r.status) for r in resumed.reports] == [("b-1", "succeeded")]

def test_a_worker_of_another_kind_is_refused(tmp_path: Path) -> None:
    from attempt_kernel import RecoveryError, Step

    clean = tmp_path / "a.jsonl"
    execute(clean, agent(Service(), ["search"]), "a-1")
    log = crash_after(clean, 4, tmp_path / "k.jsonl")

    async def noop(ctx: StepContext) -> JSON:
        return None

    dag = load_workflow("agent", [Step(name="s", run=noop)])
    with pytest.raises(RecoveryError, match="started by a code workflow named 'agent'"):
        resume_log(log, [dag])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(), st.booleans(), st.integers(), st.text(),
            st.floats(allow_nan=False, allow_infinity=False),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
        ),
        max_size=4,
    )
)  # fmt: skip
@example(args=[])  # a call without arguments (its digest is made once, see arguments_digest)
def test_the_argument_digest_is_the_documented_one(args: list[JSON]) -> None:
    """sha256 of the arguments as one JSON array, keys sorted, no spaces (docs/run-log.md)."""
    text = json.dumps(args, sort_keys=True, separators=(",", ":"), allow_nan=False)
    expected = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    digest, decoded = arguments_digest("s", args)
    assert digest == expected
    assert decoded == json.loads(text)


def test_a_step_called_without_the_argument_its_function_needs_fails_like_one_called_with_too_many(
    tmp_path: Path,
) -> None:
    """A type checker refuses a `run.step` whose arguments do not fit its function; a caller
    that is not type-checked gets Python's own TypeError as the step's failure, an argument
    short as one too many, which the workflow catches as StepFailed: nothing escapes the
    executor."""

    async def needs_x(ctx: StepContext, x: JSON) -> JSON:
        return x

    untyped: Any = needs_x  # what a caller no type checker reads passes

    @workflow("arity")
    async def flow(run: RunContext) -> JSON:
        caught: list[JSON] = []
        for name, args in (("few", ()), ("many", (1, 2))):
            try:
                await run.step(name, untyped, *args)
            except StepFailed as failed:
                caught.append(failed.outcome.error)
        return caught

    report = execute(tmp_path / "log.jsonl", flow, "r")
    assert (report.status, report.result) == (
        "succeeded",
        [
            "TypeError: test_a_step_called_without_the_argument_its_function_needs_fails_like_one_called_with_too_many.<locals>.needs_x() missing 1 required positional argument: 'x'",
            "TypeError: test_a_step_called_without_the_argument_its_function_needs_fails_like_one_called_with_too_many.<locals>.needs_x() takes 2 positional arguments but 3 were given",
        ],
    )
    assert replay(tmp_path / "log.jsonl").valid


# --------------------------------------------------------------------------
# A cancel asks reconcilers first, as a stop, recovery and a takeover do
# --------------------------------------------------------------------------


def _in_flight_run(
    tmp_path: Path,
    ask: Callable[[str], Awaitable[EffectFinding]],
    *,
    cancels: int = 1,
    asked: Callable[[], bool] = lambda: True,
) -> tuple[RunReport | None, Path]:
    """A code run whose one step sends an effect that never answers; once it is sent the
    run is cancelled (and, with ``cancels=2``, its task is cancelled again once
    ``asked()`` says the reconciler is being asked). Returns the report (None when the
    second cancel ended the awaiting task) and the log's path."""
    from attempt_kernel import RunControl

    path = tmp_path / "log.jsonl"

    async def main() -> RunReport | None:
        sent = asyncio.Event()

        async def charge(ctx: StepContext, amount: JSON) -> JSON:
            async def send(key: str) -> JSON:
                sent.set()
                await asyncio.Event().wait()  # the bank never answers
                return None

            return await ctx.effect("charge", send)

        @workflow("pay")
        async def pay(run: RunContext) -> JSON:
            return await run.step("charge_card", charge, run.input, reconcilers={"charge": ask})

        control = RunControl()
        with RunLogWriter(path) as log:
            task = asyncio.ensure_future(Executor(log).run(pay, "p-1", control=control, input=5))
            await asyncio.wait([task, asyncio.ensure_future(sent.wait())], return_when=asyncio.FIRST_COMPLETED)
            assert not task.done(), task.result()
            control.cancel()
            if cancels == 2:
                while not asked() and not task.done():  # into the reconciler's call
                    await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return None
            return await task

    return asyncio.run(main()), path


def test_a_cancelled_code_run_asks_the_reconciler_of_an_effect_in_flight_and_its_attempt_ends_cancelled(
    tmp_path: Path,
) -> None:
    """The effect happened, says the reconciler: the intent is Confirmed with its result and
    the attempt ends Cancelled, where without asking it ended Indeterminate."""

    async def ask_bank(key: str) -> EffectFinding:
        return EffectHappened(result={"charge_id": "ch-1"})

    report, path = _in_flight_run(tmp_path, ask_bank)
    assert report is not None and report.status == "cancelled"
    [step] = report.steps
    assert (step.state, step.outstanding) == (Cancelled(), ())
    [reconciled] = of_type(path, "reconciled")
    assert (reconciled["to"], reconciled["by"], reconciled["note"], reconciled["result"]) == (
        "Confirmed",
        "reconciler",
        "asked when the run was cancelled, before ending the attempt",
        {"charge_id": "ch-1"},
    )
    assert replay(FileLog(path)).violation_count == 0


def test_a_cancelled_code_run_whose_reconciler_cannot_tell_ends_the_attempt_indeterminate(
    tmp_path: Path,
) -> None:
    """The intent record still decides: a reconciler that cannot tell leaves the intent
    outstanding, and the attempt ends Indeterminate with its key to reconcile."""

    async def ask_bank(key: str) -> EffectFinding:
        return EffectUnknown(reason="the bank's API is down")

    report, path = _in_flight_run(tmp_path, ask_bank)
    assert report is not None and report.status == "needs-reconciliation"
    [step] = report.steps
    assert step.state == Indeterminate() and len(step.outstanding) == 1
    assert of_type(path, "reconciled") == []
    assert replay(FileLog(path)).violation_count == 0


def test_a_second_cancel_while_the_reconciler_is_asked_still_ends_the_attempt(tmp_path: Path) -> None:
    """The run's task is cancelled again while the reconciler hangs: the attempt is not
    left Running in the log; it ends as the intent record decides (Indeterminate: no
    answer came), and the log replays clean."""
    called: list[str] = []

    async def ask_bank(key: str) -> EffectFinding:
        called.append(key)
        await asyncio.Event().wait()  # hangs
        return EffectNotHappened()

    report, path = _in_flight_run(tmp_path, ask_bank, cancels=2, asked=lambda: bool(called))
    assert report is None and len(called) == 1
    ends = [(r["step"], r["to"]) for r in of_type(path, "transition") if r["to"] != "Running"]
    assert ends == [("charge_card@1", "Indeterminate")]
    assert replay(FileLog(path)).violation_count == 0
