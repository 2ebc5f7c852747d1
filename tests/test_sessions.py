"""The session replayer's key pairing (tests/sessions.py), on hand-written outputs."""

from __future__ import annotations

import pytest
from sessions import Keys

DOC_A = "ak1-" + "a" * 32
DOC_B = "ak1-" + "b" * 32
REAL_1 = "ak1-" + "1" * 32
REAL_2 = "ak1-" + "2" * 32


def test_keys_are_paired_by_order_of_first_appearance() -> None:
    keys = Keys()
    keys.learn(f"x {DOC_A} y {DOC_B} z {DOC_A}\n", f"x {REAL_1} y {REAL_2} z {REAL_1}\n")
    assert keys.real == {DOC_A: REAL_1, DOC_B: REAL_2}
    assert keys.as_shown(f"{REAL_2} then {REAL_1}") == f"{DOC_B} then {DOC_A}"


def test_a_command_gets_the_sessions_key_in_place_of_the_documents() -> None:
    keys = Keys()
    keys.learn(f"key {DOC_A}\n", f"key {REAL_1}\n")
    assert keys.in_command(f"attempt-kernel reconcile o.jsonl --key {DOC_A} --rejected") == (
        f"attempt-kernel reconcile o.jsonl --key {REAL_1} --rejected"
    )


def test_a_command_naming_a_key_no_output_showed_is_an_error() -> None:
    with pytest.raises(AssertionError, match="shown by no earlier output"):
        Keys().in_command(f"attempt-kernel reconcile o.jsonl --key {DOC_A} --rejected")


def test_outputs_that_differ_elsewhere_pair_nothing() -> None:
    keys = Keys()
    keys.learn(f"charge {DOC_A}\n", f"refund {REAL_1}\n")
    assert keys.real == {}


def test_a_paired_key_keeps_its_pair_so_another_key_in_its_place_shows_as_a_difference() -> None:
    keys = Keys()
    keys.learn(f"key {DOC_A}\n", f"key {REAL_1}\n")
    keys.learn(f"again {DOC_A}\n", f"again {REAL_2}\n")
    assert keys.as_shown(f"again {REAL_2}\n") != f"again {DOC_A}\n"


def test_one_real_key_where_the_document_shows_two_shows_as_a_difference() -> None:
    keys = Keys()
    keys.learn(f"{DOC_A} {DOC_B}\n", f"{REAL_1} {REAL_1}\n")
    assert keys.as_shown(f"{REAL_1} {REAL_1}\n") != f"{DOC_A} {DOC_B}\n"


def test_timestamps_do_not_stop_the_pairing() -> None:
    keys = Keys()
    keys.learn(
        f"2026-11-30T09:19:58.897Z {DOC_A}\n", f"2027-01-02T03:04:05.678Z {REAL_1}\n"
    )
    assert keys.real == {DOC_A: REAL_1}
