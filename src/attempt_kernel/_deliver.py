"""Operators' actions delivered to a run: signal, cancel, reconcile, from Python.

The transports: `deliver_to_file` for a file log (recorded at once when no
other process writes the log, else left in its inbox, which that process
takes in within about a second), and, for a ``postgresql://`` URL, the
PostgreSQL journal's own (``attempt_kernel._pgdeliver``, which needs the
postgres extra). What is recorded is built by `_operate` from a ledger of
the log as it is; a refusal (`OperationRefused`) leaves no trace.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ._inbox import LedgerDelivery, locked_inbox
from ._ledger import Ledger
from ._logfile import FileLog, LogLocked, RunLogWriter, now_us, open_regular
from ._operate import (
    Build,
    Delivery,
    Delivered,
    OperationRefused,
    cancel_change,
    reconcile_change,
    signal_change,
)
from ._records import JSON, IntentReconciled


def _no_violations(ledger: Ledger, path: Path) -> None:
    if ledger.violation_count:
        first = ledger.violations[0]
        raise OperationRefused(
            f"{path} breaks the kernel's rules (line {first.line}: {first.reason});"
            " nothing was written (see `attempt-kernel replay`)"
        )


def deliver_to_file(
    path: str | os.PathLike[str],
    build: Build,
    *,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], int] = now_us,
) -> Delivered:
    """Deliver the change ``build`` makes to the run log file at ``path``; durable on return.

    When no other process writes the log, this one takes its writer's lock,
    first takes in what a writer that died left in the inbox, then builds
    the change from the log as it is and records it (``recorded=True``).
    When another process holds the lock, the log is read without it, the
    change built from that, and appended to the log's inbox
    (``recorded=False``), which the holder takes in. ``build`` refusing
    (`OperationRefused`) writes nothing. A missing file, one that is not a
    regular file, or one that is not a run log raises the error reading or
    writing it would (`LogOpenError`, `LogNeedsRecovery`).
    """
    log = Path(path)
    os.close(open_regular(log, os.O_RDONLY, "for reading"))
    built: tuple[str, Delivery] | None = None
    while True:
        # The inbox's lock is held while the writer's lock is tried: a holder
        # takes the inbox in under that lock before it lets the log go, so an
        # entry appended after seeing the log held is never left behind.
        with locked_inbox(log, create=built is not None) as inbox:
            try:
                writer = RunLogWriter(log, create=False)
            except LogLocked:
                if built is None:
                    ledger = Ledger()
                    ledger.feed(FileLog(log).read())
                    _no_violations(ledger, log)
                    built = build(ledger)  # a refusal raises here: no inbox is made
                if inbox is None:  # no inbox yet: make one, then look again
                    continue
                run, change = built
                inbox.append(run, change, clock())
                return Delivered(run=run, change=change, recorded=False)
            with writer:
                deliver = LedgerDelivery(writer)
                _no_violations(deliver.ledger, log)
                if inbox is not None:
                    inbox.take_in(deliver, progress)
                run, change = build(deliver.ledger)
                why = deliver(run, change)
                if why is not None:
                    raise OperationRefused(f"{why}; nothing was written")
                return Delivered(run=run, change=change, recorded=True)


def _is_url(log: str | os.PathLike[str]) -> bool:
    return isinstance(log, str) and log.startswith(("postgresql://", "postgres://"))


def deliver(log: str | os.PathLike[str], build: Build, *, run: str | None = None) -> Delivered:
    """`deliver_to_file`, or for a ``postgresql://`` URL the PostgreSQL journal's
    transport (``run``: the run the change is for, when known before building)."""
    if _is_url(log):
        assert isinstance(log, str)
        try:
            from ._pgdeliver import deliver_pg  # psycopg is an optional dependency
        except ImportError as error:
            raise _needs_postgres(log, error) from None
        return deliver_pg(log, build, run=run)
    return deliver_to_file(log, build)


def _needs_postgres(url: str, error: ImportError) -> OperationRefused:
    return OperationRefused(
        f"a PostgreSQL journal needs psycopg ({error}); install attempt-kernel[postgres];"
        " nothing was written"
    )


def send_signal(log: str | os.PathLike[str], run: str, name: str, payload: JSON = None) -> Delivered:
    """Send signal ``name`` with ``payload`` (None: ``{}``) to ``run``; durable on return.

    ``log`` is a run log file (another process may be running it: the
    signal then waits in the log's inbox, `Delivered.recorded` False, until
    that process takes it in, within about a second) or a ``postgresql://``
    URL. The run's `RunContext.wait_for_signal` for ``name`` takes it, now
    or when it next waits for it (signals are a mailbox). Refused
    (`OperationRefused`, nothing written) for a run the log does not hold or
    that has finished, a DAG workflow's run, a bad name, or a payload JSON
    cannot carry.
    """
    return deliver(log, lambda ledger: (run, signal_change(ledger, run, name, payload)), run=run)


def cancel_run(log: str | os.PathLike[str], run: str, reason: str = "") -> Delivered:
    """Cancel ``run`` from outside: record the decision; durable on return.

    The process that runs it (or recovery, when none does) ends it: live
    attempts end as the intent record decides (``Cancelled``, or
    ``Indeterminate`` when an effect was dispatched), waits end, and the run
    finishes ``cancelled``. ``log`` as `send_signal` says. Refused
    (`OperationRefused`, nothing written) for an unknown or finished run, or
    one whose cancel is recorded already.
    """
    return deliver(log, lambda ledger: (run, cancel_change(ledger, run, reason)), run=run)


def reconcile_intent(
    log: str | os.PathLike[str],
    key: str,
    *,
    confirmed: bool,
    result: JSON = None,
    note: str = "",
) -> Delivered:
    """Resolve the outstanding intent with idempotency key ``key``; durable on return.

    ``confirmed``: the downstream system says the effect happened (with
    ``result``, if known); else it did not. The attempt keeps its state;
    once no intent of the step is outstanding, recovery (or the process
    running the log, which takes this in) resumes the run. ``log`` as
    `send_signal` says. Refused (`OperationRefused`, nothing written) when
    no intent has that key or it is not outstanding.
    """

    def build(ledger: Ledger) -> tuple[str, IntentReconciled]:
        return reconcile_change(ledger, key, confirmed=confirmed, result=result, note=note)

    return deliver(log, build)


