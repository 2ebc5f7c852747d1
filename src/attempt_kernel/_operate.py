"""What an operator's action records, decided from the ledger alone: signal, cancel, reconcile.

No I/O: each function reads a `Ledger` of the log and returns the change
to append, or raises `OperationRefused` saying why nothing may be written.
The command line and the Python functions that deliver these changes (to
a file log, directly or through its inbox while another process writes
it; to a PostgreSQL journal) build them here, and so does the process
that takes a delivered change in (`refusal`: it may have become moot, say
a run that finished meanwhile, or a change taken in twice).

Intent moves go through `intent_transition`, as every intent move does.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Union

from typing_extensions import TypeAlias, assert_never, final

from ._codec import json_text
from ._errors import AttemptKernelError
from ._intent import DISPATCHED, Confirm, IntentCause, Reject, intent_transition, is_outstanding
from ._ledger import Ledger, RunView
from ._records import JSON, IntentReconciled, RunCancelRequested, SignalSent

MAX_SIGNAL_NAME: Final = 200
"""The longest signal name (characters)."""

MAX_JSON_DEPTH: Final = 100
"""The deepest nesting of arrays and objects an operator's JSON value may have (a
signal's payload, a reconciled result, a run's input given on the command line):
``[]`` is 1 level, ``[[]]`` 2. Deeper values are refused before anything is written
(a viewer, or Python's own JSON code, would recurse past its limit on them)."""

THE_LOG: Final = "the log"
"""How a refusal names the log when its caller does not say which (``where``)."""

Delivery: TypeAlias = Union[SignalSent, RunCancelRequested, IntentReconciled]
"""A change an operator delivers to a run from outside."""


@final
class OperationRefused(AttemptKernelError):
    """An operator's action was refused; nothing was written. The message says why."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """What an operator's action wrote, and where: it is durable once this exists.

    ``recorded`` is True when ``change`` is in the run log (or journal) now;
    False when another process was writing the log (a file) or driving the
    run (a PostgreSQL worker), and ``change`` waits, durably, in the inbox
    that process takes changes in from (within about a second; a crash of
    either side loses nothing and applies nothing twice).

    ``queued`` is True when the run is queued in a PostgreSQL journal
    (submitted, not started by any worker yet): the change waits in the
    inbox until a worker starts the run. A cancel is then recorded before
    any step starts; a signal reaches the run as if sent once it runs.

    ``needs_recovery`` is True when no process was writing the log file but
    it ends in a torn tail (a crash mid-write): ``change`` waits in the inbox
    until the log is recovered (``attempt-kernel recover``, ``resume``,
    ``worker``, `resume_log`), which cuts the tail and then takes it in.
    """

    run: str
    change: Delivery
    recorded: bool
    queued: bool = False
    needs_recovery: bool = False


Build: TypeAlias = Callable[[Ledger], tuple[str, Delivery]]
"""Builds an operator's change from a ledger of the log as it is: the run and the
change (`signal_change`, `cancel_change`, `reconcile_change`), or raises
`OperationRefused`. A transport calls it with the freshest ledger it has."""


def check_signal_name(name: object, where: str) -> str:
    """``name`` if it can name a signal (non-empty, printable, at most `MAX_SIGNAL_NAME`
    characters), else `OperationRefused` naming ``where``."""
    if type(name) is not str or not name:
        raise OperationRefused(f"{where}: a signal name must be a non-empty string, got {name!r}")
    if len(name) > MAX_SIGNAL_NAME:
        raise OperationRefused(
            f"{where}: a signal name has at most {MAX_SIGNAL_NAME} characters, got {len(name)}"
        )
    for index, char in enumerate(name):
        if "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8, as the command line hands it over
            raise OperationRefused(
                f"{where}: signal name {name!r} is not UTF-8: byte 0x{ord(char) - 0xDC00:02x} at"
                f" index {index}; send a UTF-8 name"
            )
        if not char.isprintable():
            raise OperationRefused(
                f"{where}: signal name {name!r} holds a control character at index {index}"
                f" ({char!r}); use printable characters"
            )
    return name


def json_problem(value: JSON, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` cannot be an operator's JSON value, or None when it can: arrays and
    objects nested deeper than ``limit``, or a number that is not finite (``1e400``
    parses as infinity, which no record can carry). Walks without recursion."""
    todo: list[tuple[JSON, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return f"it holds a number out of range ({item!r}); numbers must be finite"
            continue
        if depth + 1 > limit:
            return f"it is nested deeper than {limit} levels of arrays and objects"
        children: Iterable[JSON] = item.values() if isinstance(item, Mapping) else item
        todo.extend((child, depth + 1) for child in children)
    return None


def value_problem(value: JSON) -> str | None:
    """Why ``value`` cannot be an operator's value in a record (a signal's payload, a
    reconciled result), said after "the payload" or "the result", or None when it can:
    a value the log cannot carry (`json_text`), or one `json_problem` refuses."""
    try:
        json_text(value)  # what the record would hold: refused now, not when it is written
    except (TypeError, ValueError, RecursionError) as error:
        return f"is not a JSON value ({error})"
    problem = json_problem(value)  # JSON, but nested past the limit or out of range
    return None if problem is None else f"is refused: {problem}"


def _open_run(ledger: Ledger, run: str, doing: str, where: str) -> RunView:
    view = ledger.runs.get(run)
    if view is None:
        raise OperationRefused(f"{doing}: no run {run!r} in {where}")
    if view.finished:
        raise OperationRefused(
            f"{doing}: run {run!r} has finished ({view.standing()}); nothing was written"
        )
    if view.workflow is None:
        raise OperationRefused(f"{doing}: {_NO_START.format(run=repr(run))}; nothing was written")
    return view


# A run whose records have no start record: a log written by hand or by another program.
_NO_START: Final = (
    "run {run} has records in the log but no start record (`run_started`), so no"
    " workflow of it is known and nothing would take the change in"
)


def signal_change(
    ledger: Ledger, run: str, name: str, payload: JSON = None, *, id: str | None = None, where: str = THE_LOG
) -> SignalSent:
    """The record of signal ``name`` sent to ``run`` with ``payload`` (None: ``{}``).

    Refused for a run the log does not hold, that has finished, or whose
    cancel is recorded (no wait of it takes a signal then), a bad name, and
    a payload JSON cannot carry. ``id`` defaults to a random one. ``where``
    names the log in a refusal (its path, a URL without its password).
    """
    doing = f"signal {name!r} to run {run!r}"
    check_signal_name(name, doing)
    value: JSON = {} if payload is None else payload
    why = value_problem(value)
    if why is not None:
        raise OperationRefused(f"{doing}: the payload {why}")
    view = _open_run(ledger, run, doing, where)
    if not view.code:
        raise OperationRefused(
            f"{doing}: run {run!r} is a DAG workflow's run; only a workflow written as code"
            " waits for signals"
        )
    if view.cancel_requested:
        # docs/contracts.md, "Decisions are records": the run ends cancelled
        # whatever comes, and a cancelled run starts no wait
        raise OperationRefused(
            f"{doing}: its cancel is recorded, so it ends cancelled and no wait of it takes a"
            " signal; nothing was written"
        )
    return SignalSent(name=name, payload=value, id=secrets.token_hex(8) if id is None else id)


def cancel_change(ledger: Ledger, run: str, reason: str = "", *, where: str = THE_LOG) -> RunCancelRequested:
    """The record of an operator's decision to cancel ``run`` (refused when it is
    unknown, finished, or its cancel is recorded already; ``where`` as `signal_change` says)."""
    doing = f"cancel of run {run!r}"
    view = _open_run(ledger, run, doing, where)
    if view.cancel_requested:
        raise OperationRefused(f"{doing}: its cancel is recorded already; nothing was written")
    return RunCancelRequested(reason=reason or "cancelled by an operator")


def reconcile_change(
    ledger: Ledger,
    key: str,
    *,
    confirmed: bool,
    result: JSON = None,
    note: str = "",
    by: str = "operator",
    where: str = THE_LOG,
) -> tuple[str, IntentReconciled]:
    """The run and the record that reconciles the outstanding intent with ``key``.

    ``confirmed``: the effect happened (with ``result``, if known); else it
    did not. Refused when no intent has that key or it is not outstanding
    (``where`` as `signal_change` says).
    """
    if result is not None and not confirmed:
        raise OperationRefused("a rejected effect has no result (give a result with a confirm only)")
    why = value_problem(result)
    if why is not None:
        raise OperationRefused(f"reconciliation of intent {key!r}: the result {why}")
    found = None
    for view in ledger.runs.values():
        for step in view.steps.values():
            for name in (*step.attempt.intents, *step.superseded):
                if step.keys.get(name) == key:
                    found = (view, step, name)
    if found is None:
        raise OperationRefused(f"no intent with key {key!r} is outstanding in {where}")
    view, step, name = found
    if key not in step.outstanding():
        state = step.attempt.intents[name]
        raise OperationRefused(
            f"intent {key!r} ({name!r} of step {step.name!r}) is not outstanding: it is"
            f" {type(state).__name__}"
        )
    cause: IntentCause = Confirm() if confirmed else Reject()
    change = IntentReconciled(
        step=step.name,
        attempt=step.attempt.number,
        name=name,
        key=key,
        from_state=DISPATCHED,
        cause=cause,
        to_state=intent_transition(DISPATCHED, cause),
        result=result,
        by=by,
        note=note,
    )
    return view.run, change


def malformed(change: Delivery) -> str | None:
    """Why ``change`` could never be recorded, whatever the log holds, or None.

    What `signal_change` and `reconcile_change` refuse in the value itself: a
    signal's name (`check_signal_name`) or payload (`value_problem`), a
    reconciled result (`value_problem`). Asked again of a change that comes
    through an inbox (`refusal`), which someone other than those functions
    may have written.
    """
    match change:
        case SignalSent():
            try:
                check_signal_name(change.name, f"signal {change.id!r}")
            except OperationRefused as error:
                return str(error)
            why = value_problem(change.payload)
            return None if why is None else f"signal {change.name!r} ({change.id}): the payload {why}"
        case RunCancelRequested():
            return None
        case IntentReconciled():
            why = value_problem(change.result)
            return None if why is None else f"reconciliation of intent {change.key!r}: the result {why}"
        case _:
            assert_never(change)


def refusal(ledger: Ledger, run: str, change: Delivery) -> str | None:
    """Why ``change``, delivered for ``run``, may not be appended now (None: it may).

    What the process that takes delivered changes in asks before it
    appends one: a run may have finished since it was sent, a change may
    be taken in a second time (a crash between recording it and clearing
    the inbox it came from), an intent may have been reconciled already.
    And a change that could never be recorded (`malformed`: a signal name
    `signal` refuses) is refused here as it is at the door.
    """
    bad = malformed(change)
    if bad is not None:
        return bad
    view = ledger.runs.get(run)
    if view is None:
        return f"no run {run!r} in the log"
    if view.workflow is None:
        return _NO_START.format(run=repr(run))
    match change:
        case SignalSent():
            if view.finished:
                return f"run {run!r} has finished"
            if not view.code:  # sent while the run was queued, its kind unknown then
                return f"run {run!r} is a DAG workflow's run; only a workflow written as code waits for signals"
            if any(signal.id == change.id for signal in view.signals):
                return f"signal {change.id!r} is recorded already"
            return None
        case RunCancelRequested():
            if view.finished:
                return f"run {run!r} has finished"
            if view.cancel_requested:
                return f"the cancel of run {run!r} is recorded already"
            return None
        case IntentReconciled():
            step = view.steps.get(change.step)
            if step is None or step.keys.get(change.name) != change.key:
                return f"no intent {change.key!r} in run {run!r}"
            if change.key not in step.outstanding():
                return f"intent {change.key!r} is not outstanding"
            if view.finished and view.status != "needs-reconciliation":
                return f"run {run!r} has finished"
            current = step.attempt.intents.get(change.name)
            if current is not None and not is_outstanding(current) and change.name not in step.superseded:
                return f"intent {change.key!r} is not outstanding"
            return None
        case _:
            assert_never(change)
