"""The intent record against docs/contracts.md, "The intent record", with every expected value written by hand."""

from __future__ import annotations

import hashlib
import json
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attempt_kernel import (
    Abandon,
    Abandoned,
    Cancel,
    Confirm,
    Confirmed,
    Dispatch,
    Dispatched,
    IllegalIntentTransition,
    IntentCause,
    IntentState,
    Planned,
    Reject,
    Rejected,
    cancel_cause,
    idempotency_key,
    intent_dispatched,
    intent_transition,
    is_outstanding,
)

STATES: Final[list[IntentState]] = [Planned(), Dispatched(), Confirmed(), Rejected(), Abandoned()]
CAUSES: Final[list[IntentCause]] = [Dispatch(), Confirm(), Reject(), Abandon()]
X = None
# Columns: Dispatch, Confirm, Reject, Abandon.
GRID: Final[dict[IntentState, list[IntentState | None]]] = {
    Planned():    [Dispatched(), X,           X,          Abandoned()],
    Dispatched(): [X,            Confirmed(), Rejected(), X],
    Confirmed():  [X,            X,           X,          X],
    Rejected():   [X,            X,           X,          X],
    Abandoned():  [X,            X,           X,          X],
}  # fmt: skip
TERMINAL: Final[list[IntentState]] = [Confirmed(), Rejected(), Abandoned()]


def _outcome(state: IntentState, cause: IntentCause) -> IntentState | None:
    try:
        return intent_transition(state, cause)
    except IllegalIntentTransition:
        return None


@pytest.mark.parametrize("state", STATES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("column", range(4), ids=[repr(c) for c in CAUSES])
def test_every_cell_of_the_intent_grid(state: IntentState, column: int) -> None:
    """Each of the 20 (state, cause) cells gives the hand-written state or a rejection."""
    assert _outcome(state, CAUSES[column]) == GRID[state][column]


def test_grid_has_exactly_four_legal_cells() -> None:
    """The intent table has four rows; the other sixteen cells are rejections."""
    cells = [cell for row in GRID.values() for cell in row]
    assert len(cells) == 20 and sum(c is not None for c in cells) == 4


@given(state=st.sampled_from(STATES), cause=st.sampled_from(CAUSES))
def test_property_intent_accepts_exactly_the_grid(state: IntentState, cause: IntentCause) -> None:
    """Any sampled pair is accepted iff its hand-written cell names a state."""
    expected = GRID[state][CAUSES.index(cause)]
    if expected is None:
        with pytest.raises(IllegalIntentTransition) as info:
            intent_transition(state, cause)
        assert info.value.from_state is state and info.value.cause is cause
    else:
        assert intent_transition(state, cause) == expected


@pytest.mark.parametrize("state", TERMINAL, ids=lambda s: type(s).__name__)
def test_terminal_intent_states_reject_everything(state: IntentState) -> None:
    """Confirmed, Rejected and Abandoned are final."""
    for cause in CAUSES:
        with pytest.raises(IllegalIntentTransition, match="final"):
            intent_transition(state, cause)


def test_dispatched_cannot_be_abandoned() -> None:
    """Once sent, an intent can only be resolved, never quietly dropped."""
    with pytest.raises(IllegalIntentTransition, match="may already have taken effect"):
        intent_transition(Dispatched(), Abandon())


@pytest.mark.parametrize(
    ("state", "outstanding"),
    [(Planned(), False), (Dispatched(), True), (Confirmed(), False), (Rejected(), False),
     (Abandoned(), False)],
)  # fmt: skip
def test_only_dispatched_is_outstanding(state: IntentState, outstanding: bool) -> None:
    """An intent is outstanding exactly while it is Dispatched."""
    assert is_outstanding(state) is outstanding


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], False),
        ([Planned()], False),
        ([Confirmed(), Rejected(), Abandoned()], False),
        ([Confirmed(), Dispatched()], True),
        ([Dispatched()], True),
    ],
)
def test_intent_dispatched_answers_for_an_attempt(
    states: list[IntentState], expected: bool
) -> None:
    """intent_dispatched is true exactly when one intent is Dispatched."""
    assert intent_dispatched(states) is expected


@given(st.lists(st.sampled_from(STATES), max_size=6))
def test_property_intent_dispatched_iff_a_dispatched_is_present(states: list[IntentState]) -> None:
    """For any list of intent states, the answer is 'is Dispatched() among them'."""
    assert intent_dispatched(states) is (Dispatched() in states)


def test_idempotency_key_is_stable_and_distinct() -> None:
    """Same (run, step, name) gives the same key; any difference gives another."""
    key = idempotency_key("run-1", "charge", "charge-card")
    assert key == idempotency_key("run-1", "charge", "charge-card")
    assert key.startswith("ak1-") and len(key) == 36
    others = {
        idempotency_key("run-2", "charge", "charge-card"),
        idempotency_key("run-1", "charge2", "charge-card"),
        idempotency_key("run-1", "charge", "charge-card2"),
        idempotency_key("run-1c", "harge", "charge-card"),  # no ambiguity by concatenation
    }
    assert key not in others and len(others) == 4



def test_idempotency_key_with_a_nonce_hashes_the_four_names_as_a_json_array() -> None:
    """With a nonce the key is the SHA-256 of ["nonce", "run", "step", "name"], written as
    JSON writes it: ", " between items, anything beyond ASCII and every control character escaped."""
    text = '["n-1", "r\\"1", "s\\u00e9p", "a\\u0000b\\ud83d\\ude00"]'
    expected = "ak1-" + hashlib.sha256(text.encode()).hexdigest()[:32]
    assert idempotency_key('r"1', "s\u00e9p", "a\x00b\U0001f600", nonce="n-1") == expected


@given(st.text(min_size=1), st.text(), st.text(), st.text())
def test_property_a_nonced_key_is_the_hash_of_json_dumps(nonce: str, run: str, step: str, name: str) -> None:
    """For any names (surrogates and control characters too), the key is that of json.dumps's array."""
    text = json.dumps([nonce, run, step, name])
    assert idempotency_key(run, step, name, nonce=nonce) == "ak1-" + hashlib.sha256(text.encode()).hexdigest()[:32]

UNSENT = (
    "a Planned intent has not been sent, so it has no outcome; Dispatch it first or"
    " Abandon it"
)
AGAIN = "the intent is already Dispatched"
SENT = (
    "a Dispatched intent may already have taken effect; it can only be resolved by"
    " Confirm or Reject (or stay outstanding)"
)
DONE = "a resolved or abandoned intent is final; plan a new intent instead"
# Columns as in GRID: Dispatch, Confirm, Reject, Abandon (None: legal).
REASONS: Final[dict[IntentState, list[str | None]]] = {
    Planned():    [None,  UNSENT, UNSENT, None],
    Dispatched(): [AGAIN, None,   None,   SENT],
    Confirmed():  [DONE] * 4,
    Rejected():   [DONE] * 4,
    Abandoned():  [DONE] * 4,
}  # fmt: skip


@pytest.mark.parametrize("state", STATES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("column", range(4), ids=[repr(c) for c in CAUSES])
def test_every_intent_rejection_gives_its_reason(state: IntentState, column: int) -> None:
    """Each rejected cell raises with the hand-written reason and keeps its inputs."""
    reason = REASONS[state][column]
    cause = CAUSES[column]
    if reason is None:
        assert GRID[state][column] is not None
        return
    with pytest.raises(IllegalIntentTransition) as info:
        intent_transition(state, cause)
    assert info.value.reason == reason
    assert info.value.from_state is state and info.value.cause is cause
    assert str(info.value) == f"illegal intent transition: {cause!r} from {state!r}: {reason}"


@pytest.mark.parametrize(
    ("state", "cause", "shown"),
    [("Planned", Dispatch(), "'Planned'"), (Planned(), "Dispatch", "'Dispatch'"),
     (Dispatched(), 7, "7")],
)  # fmt: skip
def test_intent_transition_bad_input_names_the_value(
    state: object, cause: object, shown: str
) -> None:
    """A value that is not an intent state or cause fails assert_never, naming it."""
    with pytest.raises(AssertionError) as info:
        intent_transition(state, cause)  # type: ignore[arg-type]
    assert str(info.value) == f"Expected code to be unreachable, but got: {shown}"


def test_is_outstanding_bad_input_names_the_value() -> None:
    """is_outstanding on a non-state fails assert_never, naming it."""
    with pytest.raises(AssertionError) as info:
        is_outstanding("Dispatched")  # type: ignore[arg-type]
    assert str(info.value) == "Expected code to be unreachable, but got: 'Dispatched'"


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ([], Cancel(intent_dispatched=False)),
        ([Planned(), Confirmed(), Rejected(), Abandoned()], Cancel(intent_dispatched=False)),
        ([Confirmed(), Dispatched()], Cancel(intent_dispatched=True)),
    ],
)
def test_cancel_cause_reads_the_intent_record(states: list[IntentState], expected: Cancel) -> None:
    """The one Cancel both executor and recovery use: flagged iff an intent is Dispatched."""
    assert cancel_cause(states) == expected


def test_a_key_with_a_nonce_is_the_sha256_of_the_parts_as_a_json_array() -> None:
    """With a run's random part the key hashes [nonce, run, step, name]; without, the old form."""
    import hashlib

    with_nonce = hashlib.sha256(b'["ab12", "run-1", "charge", "charge-card"]').hexdigest()[:32]
    assert idempotency_key("run-1", "charge", "charge-card", nonce="ab12") == f"ak1-{with_nonce}"
    without = hashlib.sha256(b"run-1\x00charge\x00charge-card").hexdigest()[:32]
    assert idempotency_key("run-1", "charge", "charge-card") == f"ak1-{without}"
    assert idempotency_key("run-1", "charge", "charge-card", nonce="ab13") != f"ak1-{with_nonce}"
