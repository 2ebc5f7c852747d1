"""The kernel against the README's transition table, with every expected value written out by hand."""

from __future__ import annotations

import copy
from typing import Final, Union, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attempt_kernel import (
    Admit,
    AttemptState,
    Cancel,
    Cancelled,
    Fail,
    Failed,
    IllegalTransition,
    Indeterminate,
    Pending,
    QueueDeadlinePassed,
    Running,
    StepDeadlinePassed,
    Succeed,
    Succeeded,
    TimedOut,
    TransitionCause,
    is_terminal,
    transition,
)
from attempt_kernel._attempt import ALL_CAUSES, ALL_STATES

# Hand-written from the README's transition table. Nothing below is produced by the code under test.
STATES: Final[list[AttemptState]] = [
    Pending(), Running(), Succeeded(), Failed(), Indeterminate(), Cancelled(), TimedOut(),
]  # fmt: skip
CAUSES: Final[list[TransitionCause]] = [
    Admit(),
    Succeed(),
    Fail(),
    Cancel(intent_dispatched=False),
    Cancel(intent_dispatched=True),
    QueueDeadlinePassed(),
    StepDeadlinePassed(),
]
TERMINAL: Final[list[AttemptState]] = [
    Succeeded(), Failed(), Indeterminate(), Cancelled(), TimedOut(),
]  # fmt: skip

X = None  # a rejected cell
# Rows: from-state. Columns, in order: Admit, Succeed, Fail, Cancel(False),
# Cancel(True), QueueDeadlinePassed, StepDeadlinePassed.
GRID: Final[dict[AttemptState, list[AttemptState | None]]] = {
    Pending():       [Running(), X,           X,        Cancelled(), X,               TimedOut(), X],
    Running():       [X,         Succeeded(), Failed(), Cancelled(), Indeterminate(), X,          TimedOut()],
    Succeeded():     [X,         X,           X,        X,           X,               X,          X],
    Failed():        [X,         X,           X,        X,           X,               X,          X],
    Indeterminate(): [X,         X,           X,        X,           X,               X,          X],
    Cancelled():     [X,         X,           X,        X,           X,               X,          X],
    TimedOut():      [X,         X,           X,        X,           X,               X,          X],
}  # fmt: skip

# The seed's normative legal set of (from, to) pairs: exactly these eight.
LEGAL_PAIRS: Final = {
    ("Pending", "Running"),
    ("Pending", "Cancelled"),
    ("Pending", "TimedOut"),
    ("Running", "Succeeded"),
    ("Running", "Failed"),
    ("Running", "TimedOut"),
    ("Running", "Cancelled"),
    ("Running", "Indeterminate"),
}
# All 49 (from, to) pairs, written out; each is legal (True) or not (False).
ALL_PAIRS: Final[dict[tuple[str, str], bool]] = {
    ("Pending", "Pending"): False, ("Pending", "Running"): True,
    ("Pending", "Succeeded"): False, ("Pending", "Failed"): False,
    ("Pending", "Indeterminate"): False, ("Pending", "Cancelled"): True,
    ("Pending", "TimedOut"): True,
    ("Running", "Pending"): False, ("Running", "Running"): False,
    ("Running", "Succeeded"): True, ("Running", "Failed"): True,
    ("Running", "Indeterminate"): True, ("Running", "Cancelled"): True,
    ("Running", "TimedOut"): True,
    ("Succeeded", "Pending"): False, ("Succeeded", "Running"): False,
    ("Succeeded", "Succeeded"): False, ("Succeeded", "Failed"): False,
    ("Succeeded", "Indeterminate"): False, ("Succeeded", "Cancelled"): False,
    ("Succeeded", "TimedOut"): False,
    ("Failed", "Pending"): False, ("Failed", "Running"): False,
    ("Failed", "Succeeded"): False, ("Failed", "Failed"): False,
    ("Failed", "Indeterminate"): False, ("Failed", "Cancelled"): False,
    ("Failed", "TimedOut"): False,
    ("Indeterminate", "Pending"): False, ("Indeterminate", "Running"): False,
    ("Indeterminate", "Succeeded"): False, ("Indeterminate", "Failed"): False,
    ("Indeterminate", "Indeterminate"): False, ("Indeterminate", "Cancelled"): False,
    ("Indeterminate", "TimedOut"): False,
    ("Cancelled", "Pending"): False, ("Cancelled", "Running"): False,
    ("Cancelled", "Succeeded"): False, ("Cancelled", "Failed"): False,
    ("Cancelled", "Indeterminate"): False, ("Cancelled", "Cancelled"): False,
    ("Cancelled", "TimedOut"): False,
    ("TimedOut", "Pending"): False, ("TimedOut", "Running"): False,
    ("TimedOut", "Succeeded"): False, ("TimedOut", "Failed"): False,
    ("TimedOut", "Indeterminate"): False, ("TimedOut", "Cancelled"): False,
    ("TimedOut", "TimedOut"): False,
}  # fmt: skip


@pytest.fixture(params=["remembered", "match-only"], autouse=True)
def answers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every test twice: through the import-time memo, and with it emptied,
    so that the match itself answers (and mutation testing can see it)."""
    mode: str = request.param
    if mode == "match-only":
        monkeypatch.setattr("attempt_kernel._attempt._NEXT", {})
        monkeypatch.setattr("attempt_kernel._attempt._REFUSED", {})
    return mode


def _outcome(state: AttemptState, cause: TransitionCause) -> AttemptState | None:
    try:
        return transition(state, cause)
    except IllegalTransition:
        return None


def test_hand_lists_are_well_formed() -> None:
    """The hand-written lists cover 7 states, 7 cause values and 49 pairs, 8 legal."""
    assert len(set(STATES)) == 7 and len(set(CAUSES)) == 7
    assert len(GRID) == 7 and all(len(row) == 7 for row in GRID.values())
    assert len(ALL_PAIRS) == 49
    assert {pair for pair, legal in ALL_PAIRS.items() if legal} == LEGAL_PAIRS


@pytest.mark.parametrize("state", STATES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("column", range(7), ids=[repr(c) for c in CAUSES])
def test_every_cell_of_the_grid(state: AttemptState, column: int) -> None:
    """Each of the 49 (state, cause) cells gives the hand-written state or a rejection."""
    assert _outcome(state, CAUSES[column]) == GRID[state][column]


def test_reached_pairs_equal_the_seed_legal_set_exactly() -> None:
    """The (from, to) pairs some cause reaches are the seed's 8; the other 41 none."""
    reached: set[tuple[str, str]] = set()
    for state in STATES:
        for cause in CAUSES:
            result = _outcome(state, cause)
            if result is not None:
                reached.add((type(state).__name__, type(result).__name__))
    for pair, legal in ALL_PAIRS.items():
        assert (pair in reached) is legal, pair


@given(state=st.sampled_from(STATES), cause=st.sampled_from(CAUSES))
def test_property_accepts_exactly_the_grid(
    state: AttemptState, cause: TransitionCause
) -> None:
    """Any sampled pair is accepted iff its hand-written cell names a state."""
    expected = GRID[state][CAUSES.index(cause)]
    if expected is None:
        with pytest.raises(IllegalTransition):
            transition(state, cause)
    else:
        assert transition(state, cause) == expected


@given(state=st.sampled_from(TERMINAL), cause=st.sampled_from(CAUSES))
def test_property_terminal_states_reject_everything(
    state: AttemptState, cause: TransitionCause
) -> None:
    """No cause leaves a terminal state."""
    with pytest.raises(IllegalTransition):
        transition(state, cause)


def test_cancel_without_dispatched_intent_is_cancelled() -> None:
    """Seed acceptance: Running + Cancel(intent_dispatched=False) -> Cancelled."""
    assert transition(Running(), Cancel(intent_dispatched=False)) == Cancelled()


def test_cancel_with_dispatched_intent_is_indeterminate() -> None:
    """Seed acceptance: Running + Cancel(intent_dispatched=True) -> Indeterminate."""
    assert transition(Running(), Cancel(intent_dispatched=True)) == Indeterminate()


def test_pending_cancel_with_dispatched_intent_is_rejected() -> None:
    """A Pending attempt cannot have dispatched anything; the claim is rejected."""
    with pytest.raises(IllegalTransition, match="cannot have dispatched") as info:
        transition(Pending(), Cancel(intent_dispatched=True))
    assert info.value.from_state == Pending()
    assert info.value.cause == Cancel(intent_dispatched=True)


@pytest.mark.parametrize("state", TERMINAL, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("cause", CAUSES, ids=repr)
def test_each_terminal_state_rejects_each_cause(
    state: AttemptState, cause: TransitionCause
) -> None:
    """Every cause on every terminal state raises, naming both."""
    with pytest.raises(IllegalTransition, match="terminal") as info:
        transition(state, cause)
    assert info.value.from_state is state
    assert info.value.cause is cause


def test_rejected_call_changes_nothing() -> None:
    """After a rejection the inputs are equal to deep copies taken before."""
    state, cause = Running(), Admit()
    before = (copy.deepcopy(state), copy.deepcopy(cause))
    with pytest.raises(IllegalTransition):
        transition(state, cause)
    assert (state, cause) == before
    # and the same state still moves on legally
    assert transition(state, Succeed()) == Succeeded()


def test_error_message_names_state_cause_and_reason() -> None:
    """The message says what was refused and why."""
    with pytest.raises(IllegalTransition) as info:
        transition(Succeeded(), Fail())
    assert str(info.value) == (
        "illegal transition: Fail() from Succeeded(): a terminal state has no "
        "outgoing transitions; start a new attempt instead"
    )
    assert info.value.reason.startswith("a terminal state")


def test_states_and_causes_are_frozen() -> None:
    """States and causes cannot be mutated after construction."""
    cause = Cancel(intent_dispatched=False)
    with pytest.raises(AttributeError):
        cause.intent_dispatched = True  # type: ignore[misc]
    assert cause == Cancel(intent_dispatched=False)


@pytest.mark.parametrize("flag", [1, 0, "yes", None])
def test_cancel_refuses_a_non_bool(flag: object) -> None:
    """Cancel's fact must be a real bool; 1 or "yes" would pick a branch silently."""
    with pytest.raises(TypeError, match="takes a bool"):
        Cancel(intent_dispatched=flag)  # type: ignore[arg-type]


def test_cancel_takes_its_field_by_keyword_only() -> None:
    """Cancel(True) is refused: the fact must be named at the call site."""
    with pytest.raises(TypeError):
        Cancel(True)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("state", "cause", "shown"),
    [
        ("Running", Succeed(), "'Running'"),
        (Running(), "Succeed", "'Succeed'"),
        (Pending(), 42, "42"),
        (None, Admit(), "None"),
    ],
)
def test_non_state_or_cause_raises_naming_the_value(
    state: object, cause: object, shown: str
) -> None:
    """Bad runtime input (types ignored) fails assert_never, naming the value."""
    with pytest.raises(AssertionError) as info:
        transition(state, cause)  # type: ignore[arg-type]
    assert str(info.value) == f"Expected code to be unreachable, but got: {shown}"


def test_terminal_state_with_non_cause_still_raises() -> None:
    """A terminal state refuses any second argument, naming it."""
    with pytest.raises(IllegalTransition, match="'Admit'"):
        transition(Failed(), "Admit")  # type: ignore[arg-type]


@pytest.mark.parametrize("state", STATES, ids=lambda s: type(s).__name__)
def test_is_terminal_matches_the_contract(state: AttemptState) -> None:
    """Terminal: all but Pending and Running."""
    assert is_terminal(state) is (state in TERMINAL)


def test_transition_returns_shared_instances() -> None:
    """A live attempt's state is one shared object per state, not a new one per call."""
    assert transition(Pending(), Admit()) is transition(Pending(), Admit())
    assert transition(Running(), Succeed()) is transition(Running(), Succeed())


def test_enumerations_are_complete() -> None:
    """ALL_STATES/ALL_CAUSES (used by the CLI) equal the hand lists and the unions."""
    assert list(ALL_STATES) == STATES
    assert list(ALL_CAUSES) == CAUSES
    union_states: object = Union[tuple(type(s) for s in STATES)]  # noqa: UP007
    assert set(get_args(AttemptState)) == set(get_args(union_states))
    assert set(get_args(TransitionCause)) == {type(c) for c in CAUSES}


NOT_RUN = "a Pending attempt has not run; Admit it first"
STEP_DEADLINE = (
    "the step deadline applies to Running attempts; a Pending one times out with"
    " QueueDeadlinePassed"
)
NOT_DISPATCHED = (
    "a Pending attempt cannot have dispatched an intent; the caller's intent record"
    " is inconsistent (an executor bug)"
)
ALREADY = "the attempt is already Running"
QUEUE_DEADLINE = (
    "the queue deadline applies to Pending attempts; a Running one times out with"
    " StepDeadlinePassed"
)
FINAL = "a terminal state has no outgoing transitions; start a new attempt instead"
# The reason of every rejected cell, by hand; columns as in GRID (None: legal).
REASONS: Final[dict[AttemptState, list[str | None]]] = {
    Pending():       [None,    NOT_RUN, NOT_RUN, None,  NOT_DISPATCHED, None,           STEP_DEADLINE],
    Running():       [ALREADY, None,    None,    None,  None,           QUEUE_DEADLINE, None],
    Succeeded():     [FINAL] * 7,
    Failed():        [FINAL] * 7,
    Indeterminate(): [FINAL] * 7,
    Cancelled():     [FINAL] * 7,
    TimedOut():      [FINAL] * 7,
}  # fmt: skip


@pytest.mark.parametrize("state", STATES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("column", range(7), ids=[repr(c) for c in CAUSES])
def test_every_rejection_gives_its_reason_and_keeps_its_inputs(
    state: AttemptState, column: int
) -> None:
    """Each rejected cell raises with the hand-written reason, the state and the cause."""
    reason = REASONS[state][column]
    cause = CAUSES[column]
    if reason is None:
        assert (GRID[state][column] is not None) and transition(state, cause) is not None
        return
    with pytest.raises(IllegalTransition) as info:
        transition(state, cause)
    assert info.value.reason == reason
    assert info.value.from_state is state and info.value.cause is cause
    assert str(info.value) == f"illegal transition: {cause!r} from {state!r}: {reason}"


def test_cancel_refusal_message_names_the_value_and_type() -> None:
    """The Cancel type check says what it got."""
    with pytest.raises(TypeError) as info:
        Cancel(intent_dispatched=1)  # type: ignore[arg-type]
    assert str(info.value) == (
        "Cancel(intent_dispatched=...) takes a bool decided from the intent record,"
        " got 1 (int)"
    )


def test_remembered_answers_are_the_hand_written_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Filling the memo afresh gives GRID's 8 legal cells and REASONS' 41 refusals."""
    from attempt_kernel import _attempt  # pyright: ignore[reportPrivateUsage]  # the test refills the private memo

    next_states: dict[tuple[type, type, bool], AttemptState] = {}
    refused: dict[tuple[type, type, bool], str] = {}
    monkeypatch.setattr(_attempt, "_NEXT", next_states)
    monkeypatch.setattr(_attempt, "_REFUSED", refused)
    _attempt._remember_answers()  # pyright: ignore[reportPrivateUsage]  # the private memo filler is under test
    expected_next: dict[tuple[type, type, bool], AttemptState] = {}
    expected_refused: dict[tuple[type, type, bool], str] = {}
    for state in STATES:
        for column, cause in enumerate(CAUSES):
            key = (type(state), type(cause), isinstance(cause, Cancel) and cause.intent_dispatched)
            to, reason = GRID[state][column], REASONS[state][column]
            if to is not None:
                expected_next[key] = to
            else:
                assert reason is not None
                expected_refused[key] = reason
    assert len(expected_next) == 8 and len(expected_refused) == 41
    assert next_states == expected_next
    assert refused == expected_refused


def test_is_terminal_bad_input_names_the_value() -> None:
    """is_terminal on a non-state fails assert_never, naming it."""
    with pytest.raises(AssertionError) as info:
        is_terminal("Running")  # type: ignore[arg-type]
    assert str(info.value) == "Expected code to be unreachable, but got: 'Running'"
