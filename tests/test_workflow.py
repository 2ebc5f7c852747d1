"""Workflows as data: every load error names its culprit."""

from __future__ import annotations

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
