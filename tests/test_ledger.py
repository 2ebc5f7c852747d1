"""The ledger's derived rules, written out by hand from docs/contracts.md
and docs/design.md, "The ledger".

Each rule is a function of states and causes; the expected answers below
are typed in from the contracts' tables, never computed by the code under test.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest
from logs import indeterminate_changes, simple_changes, write_log

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptState,
    AttemptTransitioned,
    Cancel,
    Cancelled,
    Change,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    Fail,
    Failed,
    IllegalTransition,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Pending,
    Planned,
    QueueDeadlinePassed,
    read_log,
    Reject,
    Rejected,
    RetryPolicy,
    RunCancelRequested,
    RunFinished,
    Running,
    RunStarted,
    StepDeadlinePassed,
    StepResult,
    Succeed,
    Succeeded,
    TimedOut,
    TransitionCause,
)
from attempt_kernel._ledger import (
    Ledger,
    counts_as_try,
    may_run_again,
    needs_reconciliation,
    run_status,
)
from attempt_kernel._replay import feed

SRC = Path(__file__).resolve().parent.parent / "src" / "attempt_kernel"

# (state, the cause that reached it) -> counts against max_attempts?
TRIES: list[tuple[AttemptState, TransitionCause | None, bool]] = [
    (Pending(), None, False),
    (Running(), Admit(), False),
    (Succeeded(), Succeed(), False),
    (Failed(), Fail(), True),
    (TimedOut(), StepDeadlinePassed(), True),
    (TimedOut(), QueueDeadlinePassed(), False),  # it never ran
    (Cancelled(), Cancel(intent_dispatched=False), False),
    (Indeterminate(), Cancel(intent_dispatched=True), False),
]


@pytest.mark.parametrize(("state", "cause", "expected"), TRIES)
def test_counts_as_try(state: AttemptState, cause: TransitionCause | None, expected: bool) -> None:
    """Only an attempt that ran and did not succeed uses up a try."""
    assert counts_as_try(state, cause) is expected


RECONCILE: list[tuple[AttemptState, tuple[str, ...], bool]] = [
    (Pending(), (), False),
    (Running(), ("k",), False),  # live: not judged yet
    (Succeeded(), (), False),
    (Succeeded(), ("k",), True),
    (Failed(), (), False),
    (Failed(), ("k",), True),
    (TimedOut(), (), False),
    (TimedOut(), ("k",), True),
    (Cancelled(), (), False),
    (Indeterminate(), (), False),  # reconciled: stays Indeterminate, needs nobody
    (Indeterminate(), ("k",), True),
]


@pytest.mark.parametrize(("state", "outstanding", "expected"), RECONCILE)
def test_needs_reconciliation(state: AttemptState, outstanding: tuple[str, ...], expected: bool) -> None:
    """An ended attempt while an intent is outstanding (Indeterminate until reconciled)."""
    assert needs_reconciliation(state, outstanding) is expected


ONCE = RetryPolicy(max_attempts=1)
THRICE = RetryPolicy(max_attempts=3)
NO_TIMEOUT_RETRY = RetryPolicy(max_attempts=3, retry_on_timeout=False)
IDEMPOTENT = RetryPolicy(max_attempts=3, effects_idempotent=True)

AGAIN: list[tuple[RetryPolicy, AttemptState, TransitionCause | None, int, tuple[str, ...], bool]] = [
    (THRICE, Succeeded(), Succeed(), 0, (), False),
    (THRICE, Indeterminate(), Cancel(intent_dispatched=True), 0, ("k",), False),
    (ONCE, Indeterminate(), Cancel(intent_dispatched=True), 1, (), True),  # reconciled; no try
    (ONCE, Cancelled(), Cancel(intent_dispatched=False), 5, (), True),  # a cancel is no try
    (THRICE, Failed(), Fail(), 1, (), True),
    (THRICE, Failed(), Fail(), 3, (), False),  # out of tries
    (ONCE, Failed(), Fail(), 1, (), False),
    (THRICE, Failed(), Fail(), 1, ("k",), False),  # the effect may have happened
    (IDEMPOTENT, Failed(), Fail(), 1, ("k",), True),  # same key again, downstream dedups
    (THRICE, TimedOut(), StepDeadlinePassed(), 1, (), True),
    (NO_TIMEOUT_RETRY, TimedOut(), StepDeadlinePassed(), 1, (), False),
    (THRICE, TimedOut(), QueueDeadlinePassed(), 0, (), False),  # too late, never ran
    (THRICE, TimedOut(), StepDeadlinePassed(), 1, ("k",), False),
    (IDEMPOTENT, TimedOut(), StepDeadlinePassed(), 2, ("k",), True),
    (IDEMPOTENT, TimedOut(), StepDeadlinePassed(), 3, ("k",), False),
]


@pytest.mark.parametrize(("policy", "state", "cause", "tries", "outstanding", "expected"), AGAIN)
def test_may_run_again(
    policy: RetryPolicy,
    state: AttemptState,
    cause: TransitionCause | None,
    tries: int,
    outstanding: tuple[str, ...],
    expected: bool,
) -> None:
    """Retry policy, outstanding intents and idempotent effects decide."""
    assert may_run_again(policy, state, cause, tries, outstanding) is expected


@pytest.mark.parametrize("state", [Pending(), Running()])
def test_may_run_again_refuses_a_live_attempt(state: AttemptState) -> None:
    """Asking about an attempt that has not ended is a caller's bug, said loudly."""
    with pytest.raises(AssertionError, match="has not ended"):
        may_run_again(THRICE, state, None, 0, ())


def test_run_status_by_hand() -> None:
    """needs-reconciliation beats cancelled beats failed; all succeeded is succeeded."""
    ok = (Succeeded(), ())
    assert run_status([ok, ok], cancelled=False) == "succeeded"
    assert run_status([ok, (None, ())], cancelled=False) == "failed"
    assert run_status([ok, (Failed(), ())], cancelled=False) == "failed"
    assert run_status([ok, (Cancelled(), ())], cancelled=True) == "cancelled"
    assert run_status([(Indeterminate(), ("k",)), ok], cancelled=True) == "needs-reconciliation"
    assert run_status([(Failed(), ("k",))], cancelled=False) == "needs-reconciliation"


def test_a_finished_run_keeps_its_status_not_its_steps(tmp_path: Path) -> None:
    """After run_finished the ledger holds the run's id, workflow and status only."""
    log = write_log(
        tmp_path / "log", [RunStarted(workflow="wf"), *simple_changes(), RunFinished()]
    )
    ledger = Ledger()
    feed(ledger, read_log(log))
    view = ledger.run("r")
    assert view is not None and view.finished and view.workflow == "wf"
    assert view.status == "succeeded" and view.steps == {}


def test_a_cancelled_run_that_finished_is_cancelled(tmp_path: Path) -> None:
    """A run whose cancel was decided ends `cancelled` unless something needs an operator."""
    changes = [RunStarted(workflow="wf"), *simple_changes(), RunCancelRequested(), RunFinished()]
    ledger = Ledger()
    feed(ledger, read_log(write_log(tmp_path / "log", changes)))
    view = ledger.run("r")
    assert view is not None and view.status == "cancelled"
    changes = [RunStarted(workflow="wf"), *indeterminate_changes(), RunCancelRequested(), RunFinished()]
    ledger = Ledger()
    feed(ledger, read_log(write_log(tmp_path / "log2", changes)))
    view = ledger.run("r")
    assert view is not None and view.status == "needs-reconciliation"


def test_an_attempt_created_after_the_cancel_is_a_violation(tmp_path: Path) -> None:
    """A cancelled run starts no attempt (a decision is a record); the ledger names the line."""
    changes = [RunStarted(workflow="wf"), RunCancelRequested(), *simple_changes()]
    ledger = Ledger()
    feed(ledger, read_log(write_log(tmp_path / "log", changes)))
    [violation] = ledger.violations
    assert violation.line == 3
    assert "created after the run's cancel was requested" in violation.reason


def _imports(module: Path) -> set[str]:
    """The sibling modules ``module`` imports (``from ._x import ...``), at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.source
def test_the_package_has_no_import_cycle() -> None:
    """Imports flow one way (kernel, records, ledger, stores, runtime, CLI): no cycle."""
    graph = {p.stem: _imports(p) for p in SRC.glob("_*.py")}
    graph.pop("__main__", None)
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError
    assert order.index("_attempt") < order.index("_ledger") < order.index("_executor")
    assert order.index("_workflow") < order.index("_executor")
    assert "_executor" not in graph["_workflow"] and "_executor" not in graph["_context"]


def test_a_proposed_move_is_applied_and_an_illegal_one_is_refused() -> None:
    """propose_move goes through the kernel; what it proposed is what apply_change applies."""
    ledger = Ledger()
    for change in [RunStarted(workflow="wf"), *simple_changes()[:2]]:  # created, admitted
        ledger.apply_change("r", change)
    with pytest.raises(IllegalTransition):
        ledger.propose_move("r", "s", Admit())  # already Running
    proposed = ledger.propose_move("r", "s", Fail())
    assert (proposed.from_state, proposed.to_state) == (Running(), Failed())
    ledger.apply_change("r", proposed)
    step = ledger.step("r", "s")
    assert step is not None and step.attempt.state == Failed() and step.tries == 1
    assert ledger.violation_count == 0


def test_a_stale_proposal_is_checked_like_any_change() -> None:
    """A proposal whose append failed is never applied unchecked later: an equal but
    different change goes through every check (here: it no longer starts from Running)."""
    ledger = Ledger()
    for change in [RunStarted(workflow="wf"), *simple_changes()[:2]]:
        ledger.apply_change("r", change)
    stale = ledger.propose_move("r", "s", Fail())  # its append "failed": never applied
    ledger.apply_change("r", ledger.propose_move("r", "s", Succeed()))
    ledger.apply_change("r", stale)
    [violation] = ledger.violations
    assert "starts from Running, but the attempt is Succeeded" in violation.reason


def _failed_with_outstanding(attempt: int) -> list[Change]:
    """Attempt ``attempt`` of step 's' dispatches 'pay' (key k) and fails with it outstanding."""
    return [
        AttemptCreated(step="s", attempt=attempt),
        AttemptTransitioned(step="s", attempt=attempt, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step="s", attempt=attempt, name="pay", key="k"),
        IntentChanged(step="s", attempt=attempt, name="pay", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        StepResult(step="s", attempt=attempt, error="ambiguous"),
        AttemptTransitioned(step="s", attempt=attempt, from_state=Running(), cause=Fail(), to_state=Failed()),
    ]


def test_an_outcome_under_a_key_settles_what_earlier_attempts_left_outstanding() -> None:
    """An idempotent retry that confirms key k settles attempt 1's outstanding k too:
    no intent stays unresolved and the attempt listed for reconciliation lists nothing."""
    ledger = Ledger()
    ledger.apply_change("r", RunStarted(workflow="wf"))
    for change in _failed_with_outstanding(1):
        ledger.apply_change("r", change)
    assert ledger.unresolved_intents == 1
    [listed] = ledger.to_reconcile
    assert (listed.attempt, listed.outstanding) == (1, ("k",))
    for change in _failed_with_outstanding(2)[:4]:  # attempt 2 sends k again
        ledger.apply_change("r", change)
    step = ledger.step("r", "s")
    assert step is not None and step.outstanding() == ("k",)
    ledger.apply_change(
        "r",
        IntentChanged(step="s", attempt=2, name="pay", from_state=Dispatched(), cause=Confirm(), to_state=Confirmed(), result={"id": 1}),
    )
    assert ledger.unresolved_intents == 0 and step.outstanding() == ()
    [listed] = ledger.to_reconcile
    assert (listed.attempt, listed.outstanding) == (1, ())
    assert ledger.violation_count == 0


def test_a_key_left_outstanding_by_an_earlier_attempt_can_be_reconciled() -> None:
    """Attempt 2 crashed before sending k again: reconciling k (named on the latest
    attempt) settles attempt 1's outstanding intent and is no violation."""
    ledger = Ledger()
    ledger.apply_change("r", RunStarted(workflow="wf"))
    for change in [*_failed_with_outstanding(1), *_failed_with_outstanding(2)[:2]]:
        ledger.apply_change("r", change)
    ledger.apply_change(
        "r",
        IntentReconciled(step="s", attempt=2, name="pay", key="k", from_state=Dispatched(), cause=Reject(), to_state=Rejected(), by="operator"),
    )
    step = ledger.step("r", "s")
    assert step is not None and step.outstanding() == () and ledger.unresolved_intents == 0
    assert ledger.violation_count == 0
