"""The storage seam (docs/contracts.md, "The storage seam"): what the runtime
needs from any journal.

Reading as well as appending goes through it, so that recovery and replay
can later read a journal that is not a file. `RunLogWriter` and `FileLog`
(``_logfile``) are the embedded default. No I/O here: only the contracts.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from typing_extensions import TypeGuard

from ._errors import AttemptKernelError
from ._records import Change, LogItem


def is_url(log: str | os.PathLike[str]) -> bool:
    """Does ``log`` name a PostgreSQL journal (a ``postgresql://`` or ``postgres://`` URL)
    rather than a log file? A path object never does."""
    return isinstance(log, str) and log.startswith(("postgresql://", "postgres://"))


class DispatchRefused(AttemptKernelError):
    """A log refuses, for now, to append a ``Dispatched`` intent change; it wrote nothing.

    Raised by `RunLog.append` (or `BatchLog.append_all`) for the write
    before an effect, when the writer may not send effects now (a worker
    whose heartbeat is late: `attempt_kernel.postgres.HeartbeatLate`).
    Nothing was sent, so the attempt is not at fault: the executor stops
    (as `Executor.stop` does, with no grace), the attempt ends as recovery
    would end it (``Cancelled``), and its runs stay unfinished for recovery
    or another worker to resume. Subclass it in a log of your own.
    """


@runtime_checkable
class LogSource(Protocol):
    """A journal that can be read from the start, item by item.

    `read` yields every record in order (and a `CorruptLine` or `TornTail`
    where a store has them); it may be called more than once.
    """

    def read(self) -> Iterator[LogItem]:
        """Yield every item from the journal's start, in order.

        Each item is a `Record`, or a `CorruptLine` or `TornTail` where the
        store has them.
        """
        ...


class RunLog(Protocol):
    """What the executor needs from a run log: append a record, make it durable.

    `append` returns the record's sequence number once the record survives a
    crash of this process (or raises `UnencodableRecord`, writing nothing,
    for a value JSON cannot carry, or `DispatchRefused`, writing nothing,
    for a ``Dispatched`` change it may not write now); after `flush`
    returns, every appended record survives a crash of the machine.
    """

    def append(self, run: str, change: Change) -> int:
        """Write one record of ``run`` and return its sequence number once it survives a crash of this process.

        Raises `UnencodableRecord` or `DispatchRefused` (see the class doc)
        before anything is written.
        """
        ...

    def flush(self) -> None:
        """Return once every record appended so far survives a crash of the machine."""
        ...


class Journal(LogSource, RunLog, Protocol):
    """A run log held by one writer, which can also read it back (recovery does)."""


@runtime_checkable
class BatchLog(Protocol):
    """A run log that can also append several records of one run in one go (optional).

    `append_all` appends ``changes`` in order, as `append` would one by
    one, and returns the last one's sequence number; a crash may keep a
    prefix of them (the PostgreSQL journal keeps all or none). The executor
    uses it, where a log has it, for records it writes back to back.
    """

    def append_all(self, run: str, changes: Sequence[Change]) -> int: ...


@runtime_checkable
class GroupCommitLog(Protocol):
    """A run log whose durability can be awaited, so that concurrent runs share one flush (optional).

    The async seam beside `RunLog.flush`. The executor awaits `durable`
    where it must know a record survives a crash of the machine: after a
    ``Dispatched`` and before its effect is sent (docs/contracts.md, "The
    write-ahead rule"), and before it reports a run's end. While one run
    waits, the event loop goes on with the others, and a store may make
    all their records durable with one flush (group commit).

    With it, a store's `RunLog.append` may hand a record over without
    waiting for the store (it still raises `UnencodableRecord`,
    `RecordTooLarge` and `DispatchRefused` at once, handing over nothing,
    and keeps each run's records in order). A record the store then fails
    to write fails that run: the run's next `append` or `durable` raises
    the error, and no later record of that run is written.
    """

    async def durable(self, run: str) -> None:
        """Return once every record of ``run`` appended so far survives a crash of the machine.

        Raises the store's error if one of them could not be written or
        made durable; the store may then refuse every later append (the
        file store does), or only that run's (a lost lease).
        """
        ...


@runtime_checkable
class DispatchGate(Protocol):
    """A log that may have the executor wait before it writes an effect's ``Dispatched`` (optional).

    A PostgreSQL worker's, while its heartbeat is late: the effect waits for
    a beat there, awaited, so that the worker's other runs go on meanwhile,
    and the append that follows refuses (`DispatchRefused`) if none came.
    """

    def ready_to_dispatch(self, run: str) -> Awaitable[None] | None:
        """Something to await before ``run`` writes its next ``Dispatched``, or None to go on at once."""
        ...


# isinstance against a runtime-checkable protocol looks up every member on
# every call; the executor asks once per run (a worker makes one per run),
# so the answer is kept per class (members are looked up on the class).
_ANSWERS: dict[tuple[type, type], bool] = {}


def _is(log: object, protocol: type) -> bool:
    key = (type(log), protocol)
    known = _ANSWERS.get(key)
    if known is None:
        known = _ANSWERS[key] = isinstance(log, protocol)
    return known


def is_log_source(log: object) -> TypeGuard[LogSource]:
    """``isinstance(log, LogSource)``, answered once per class."""
    return _is(log, LogSource)


def is_batch_log(log: object) -> TypeGuard[BatchLog]:
    """``isinstance(log, BatchLog)``, answered once per class."""
    return _is(log, BatchLog)


def is_group_commit_log(log: object) -> TypeGuard[GroupCommitLog]:
    """``isinstance(log, GroupCommitLog)``, answered once per class."""
    return _is(log, GroupCommitLog)


def is_dispatch_gate(log: object) -> TypeGuard[DispatchGate]:
    """``isinstance(log, DispatchGate)``, answered once per class."""
    return _is(log, DispatchGate)
