"""Helpers that build small run logs for tests (records written out by hand)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from attempt_kernel import (
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Change,
    Dispatch,
    Dispatched,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    Pending,
    Planned,
    Record,
    Running,
    RunLogWriter,
    RunStarted,
    StepResult,
    Succeed,
    Succeeded,
    idempotency_key,
    read_log,
)


def fixed_clock(start_us: int = 1_000_000_000) -> Callable[[], int]:
    """A clock that ticks 0.5 s per call, so logs are byte-for-byte reproducible."""
    ticks = itertools.count()
    return lambda: start_us + next(ticks) * 500_000


def simple_changes(step: str = "s") -> list[Change]:
    """One attempt that succeeds: created, admitted, result, succeeded."""
    return [
        AttemptCreated(step=step, attempt=1),
        AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        StepResult(step=step, attempt=1, value={"ok": 1}),
        AttemptTransitioned(step=step, attempt=1, from_state=Running(), cause=Succeed(), to_state=Succeeded()),
    ]


def indeterminate_changes(step: str = "mail") -> list[Change]:
    """One attempt cancelled while its intent is Dispatched."""
    return [
        AttemptCreated(step=step, attempt=1),
        AttemptTransitioned(step=step, attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()),
        IntentPlanned(step=step, attempt=1, name="send", key="k-send"),
        IntentChanged(step=step, attempt=1, name="send", from_state=Planned(), cause=Dispatch(), to_state=Dispatched()),
        AttemptTransitioned(step=step, attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()),
    ]


def write_log(path: Path, changes: list[Change], run: str = "r") -> Path:
    """Write ``changes`` for ``run`` to a new log at ``path``."""
    with RunLogWriter(path, clock=fixed_clock()) as log:
        for change in changes:
            log.append(run, change)
    return path


def nonce_in(path: Path, run: str) -> str:
    """The random part of ``run``'s keys, as the start record in the log at ``path`` has it."""
    for item in read_log(path):
        if isinstance(item, Record) and item.run == run and isinstance(item.change, RunStarted):
            return item.change.nonce
    raise AssertionError(f"run {run!r} has no run_started record in {path}")


def key_in(path: Path, run: str, step: str, name: str) -> str:
    """The idempotency key intent ``name`` of ``step`` carries in ``run`` of the log at
    ``path``: made from the names and the run's random part, as its start records it."""
    return idempotency_key(run, step, name, nonce=nonce_in(path, run))


UNENCODABLE: list[object] = [
    {1, 2},
    object(),
    float("nan"),
    b"bytes",
    {1: "int", "1": "str"},
    {True: 1, "true": 2},
    [{"deep": {None: 1, "null": 2}}],
    {float("nan"): 1, "nan": 2},
]
"""Values no log may hold: not JSON, or a dict whose keys JSON writes alike (the reader
refuses a key written twice). Every store must refuse each with nothing written."""
UNENCODABLE_IDS: list[str] = [
    "set", "object", "nan", "bytes", "keys 1 and '1'", "keys True and 'true'", "keys None and 'null' nested",
    "a NaN key beside 'nan'",
]

