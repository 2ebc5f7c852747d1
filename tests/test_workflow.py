"""Workflows as data: every load error names its culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from attempt_kernel import JSON
from attempt_kernel._workflow import RetryPolicy, Step, WorkflowError, load_workflow


async def nothing(ctx: object) -> JSON:
    return None


def step(name: str, *after: str, **kw: object) -> Step:
    return Step(name=name, run=nothing, after=after, **kw)  # type: ignore[arg-type]


def test_steps_come_out_dependencies_first() -> None:
    """Each step appears after every step it depends on."""
    wf = load_workflow("w", [step("d", "b", "c"), step("b", "a"), step("c", "a"), step("a")])
    order = [s.name for s in wf.steps]
    assert order.index("a") < order.index("b") < order.index("d")
    assert order.index("c") < order.index("d")
    assert set(order) == {"a", "b", "c", "d"} and wf.by_name["d"].after == ("b", "c")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([step("a"), step("a")], "workflow 'w': duplicate step name 'a'"),
        ([step("a", "ghost")], "workflow 'w', step 'a': depends on unknown step 'ghost'"),
        ([step("a", "a")], "workflow 'w', step 'a': depends on itself"),
        ([step("a", "c"), step("b", "a"), step("c", "b")], "workflow 'w': dependency cycle a -> c -> b -> a"),
        ([], "workflow 'w' has no steps"),
        ([step("")], "workflow 'w': a step has an empty name"),
        ([step("a", queue_deadline=0)], "workflow 'w', step 'a': queue_deadline must be a positive number of seconds, got 0"),
        ([step("a", step_deadline=-1.5)], "workflow 'w', step 'a': step_deadline must be a positive number of seconds, got -1.5"),
        ([step("a", step_deadline=float("inf"))], "step_deadline must be a positive number of seconds, got inf"),
        ([step("a", step_deadline=True)], "step_deadline must be a positive number of seconds, got True"),
        ([step("a", step_deadline="5")], "step_deadline must be a positive number of seconds, got '5'"),
        ([step("a", retry=RetryPolicy(max_attempts=0))], "workflow 'w', step 'a': retry.max_attempts must be at least 1, got 0"),
        ([step("a", retry=RetryPolicy(max_attempts=2.5))], "retry.max_attempts must be at least 1, got 2.5"),  # type: ignore[arg-type]
    ],
)  # fmt: skip
def test_bad_workflow_is_refused_naming_the_culprit(steps: list[Step], message: str) -> None:
    """Each invalid definition raises WorkflowError whose message names what is wrong."""
    with pytest.raises(WorkflowError) as info:
        load_workflow("w", steps)
    assert message in str(info.value)


def test_workflow_needs_a_name() -> None:
    """An empty workflow name is refused."""
    with pytest.raises(WorkflowError, match="non-empty name"):
        load_workflow("", [step("a")])


def test_the_fast_step_builder_makes_exactly_the_dataclass_value() -> None:
    """run.step's Step builder equals Step called as usual (no reconcilers: the default's), and is as frozen."""
    from dataclasses import FrozenInstanceError

    from attempt_kernel import EffectFinding, EffectUnknown, StepContext
    from attempt_kernel._workflow import new_step

    async def fn(ctx: StepContext) -> JSON:
        return None

    async def ask(key: str) -> EffectFinding:
        return EffectUnknown(reason="test")

    retry = RetryPolicy(max_attempts=3)
    plain = new_step("s@1", fn, retry=retry, queue_deadline=5.0, step_deadline=7.0, pool=None, reconcilers=None, domain_states=())
    assert plain == Step(name="s@1", run=fn, retry=retry, queue_deadline=5.0, step_deadline=7.0)
    full = new_step("s@2", fn, retry=retry, queue_deadline=1.0, step_deadline=2.0, pool="llm", reconcilers={"pay": ask}, domain_states=("a",))
    assert full == Step(
        name="s@2", run=fn, retry=retry, queue_deadline=1.0, step_deadline=2.0, pool="llm",
        reconcilers={"pay": ask}, domain_states=("a",),
    )  # fmt: skip
    with pytest.raises(FrozenInstanceError):
        plain.pool = "x"  # type: ignore[misc]


async def _undecorated(run: object) -> JSON:
    """A workflow function its author forgot to decorate with @workflow."""
    return 1


def test_executor_run_given_a_function_that_is_no_workflow_says_how_to_make_one(tmp_path: Path) -> None:
    """`Executor(log).run(f, ...)` on an async function without @workflow ended in
    "AttributeError: 'function' object has no attribute 'function'"; it says what the
    command line says for the same mistake now, and writes nothing."""
    import asyncio

    from attempt_kernel import Executor, RunLogWriter

    log = tmp_path / "w.jsonl"

    async def main() -> None:
        with RunLogWriter(log) as writer:
            await Executor(writer).run(_undecorated, "r-1")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]

    with pytest.raises(TypeError) as caught:
        asyncio.run(main())
    assert str(caught.value) == (
        "Executor.run: _undecorated is a function, not a Workflow; make it with"
        " @attempt_kernel.workflow(...) on an async function, or with attempt_kernel.load_workflow(...)"
    )
    assert log.read_bytes() == b""


def test_a_worker_given_a_mapping_of_workflows_says_it_takes_the_workflows() -> None:
    """`Worker(url, {name: workflow})` ended in "AttributeError: 'str' object has no attribute
    'name'"; refused as resume_log refuses it, before a connection (nothing listens there)."""
    from attempt_kernel.postgres import Worker

    wf = load_workflow("w", [step("a")])
    with pytest.raises(TypeError) as caught:
        Worker("postgresql://app@127.0.0.1:1/db", {"w": wf})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]
    assert str(caught.value) == (
        "Worker: workflows must be the workflows themselves ([w, ...]), got 'w', a str"
        " (a dict's key?): pass the mapping's .values()"
    )
