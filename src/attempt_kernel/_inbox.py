"""The inbox beside a file log: operators' changes waiting for the log's one writer.

``LOG.inbox`` (the log's name with ``.inbox`` appended, in the same folder)
holds operators' changes (a signal, a cancel, a reconciliation) sent while
another process holds the log's writer lock. Its format is the run log's:
one checksummed record line per change (`encode_record`), numbered 1, 2, ...
in the order sent. A sender locks the inbox (``flock`` on the inbox file),
appends one line and fsyncs it (and the folder, when it created the file);
once that returns, the change is durable. The process that holds the log
(its taker) locks the inbox, hands each entry in order to a ``deliver``
function (the executor's `Executor.deliver`, which records it or says why
it no longer applies), then empties the inbox and fsyncs it.

Crash rules: a torn last line is a sender that died mid-write, never told
"durable": it is ignored and cut (by the next sender or taker, under the
lock). A line that is corrupt, or a record that is not an operator's change,
is refused with its line number (`InboxCorrupt`) and nothing of the inbox is
applied. A taker that dies between recording entries and emptying the inbox
leaves them behind; the next take-in hands them over again and ``deliver``
drops each one already recorded (`refusal`): nothing is applied twice.

The inbox is never deleted or replaced (only emptied): senders and takers
lock the one file. Owns these bytes and the lock; it applies no kernel rule
(``deliver`` and the ledger do).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Final

from typing_extensions import assert_never, final

from ._codec import MAX_RECORD_BYTES, RecordTooLarge, RunLogError, UnencodableRecord, encode_record
from ._ledger import Ledger
from ._logfile import LogLocked, LogOpenError, RunLogWriter, fsync_dir, open_regular, now_us, read_log
from ._operate import Delivery, OperationRefused, malformed, refusal
from ._records import CorruptLine, IntentReconciled, Record, RunCancelRequested, SignalSent, TornTail
from ._store import Journal

INBOX_SUFFIX: Final = ".inbox"
"""What the inbox's name adds to its log's name."""

Deliver = Callable[[str, Delivery], "str | None"]
"""Records one delivered change for a run, or returns why it no longer applies."""

WIDEST_SEQ: Final = 2**63 - 1
"""A sequence number at least as long as any log's: an entry's line is measured
with it, since the log numbers the record afresh (``seq`` 1 in the inbox may
be ``seq`` 1000000 in the log, six bytes longer)."""


@final
class InboxCorrupt(RunLogError):
    """The inbox holds a corrupt line or a record that is no operator's change; nothing
    of it was applied. The message names the line."""


def inbox_path(log: str | os.PathLike[str]) -> Path:
    """Where the inbox of the file log ``log`` lives: ``<log>.inbox`` beside it.

    A path that names no file (``.``, ``''``, ``/``) has no inbox: `LogOpenError`.
    """
    path = Path(log)
    if path.name in ("", ".."):
        raise LogOpenError(f"{str(log)!r}: names a folder, not a run log file, so it has no inbox")
    return path.with_name(path.name + INBOX_SUFFIX)


def inbox_size(log: str | os.PathLike[str]) -> int:
    """The inbox's size in bytes, by ``stat`` alone (0 when there is none): what a
    taker polls, cheaply, to know that something waits."""
    try:
        return os.stat(inbox_path(log)).st_size
    except OSError:
        return 0


def _describe(change: Delivery) -> str:
    match change:
        case SignalSent():
            return f"signal {change.name!r} ({change.id})"
        case RunCancelRequested():
            return "cancel"
        case IntentReconciled():
            return f"reconciliation of intent {change.key!r}"
        case _:
            assert_never(change)


def _as_delivery(record: Record) -> Delivery | None:
    change = record.change
    if isinstance(change, (SignalSent, RunCancelRequested, IntentReconciled)):
        return change
    return None


@final
class LockedInbox:
    """An inbox opened and locked (exclusively) by this process; see the module doc."""

    def __init__(self, path: Path, fd: int, created: bool) -> None:
        self.path: Final = path
        self._fd: Final = fd
        self.created: Final = created

    def size(self) -> int:
        """Its size in bytes now."""
        return os.fstat(self._fd).st_size

    def entries(self) -> tuple[list[tuple[str, Delivery]], TornTail | None]:
        """Each complete entry (run, change) in order, and the torn tail if any.

        Raises `InboxCorrupt` naming the first bad line.
        """
        found: list[tuple[str, Delivery]] = []
        for item in read_log(self.path):
            match item:
                case Record():
                    change = _as_delivery(item)
                    if change is None:
                        raise InboxCorrupt(
                            f"{self.path}: line {item.line} holds a record of type"
                            f" {type(item.change).__name__}, not an operator's change (signal, cancel,"
                            " reconciliation);"
                            " nothing of the inbox was applied: move the file aside and send the"
                            " changes again"
                        )
                    found.append((item.run, change))
                case CorruptLine():
                    raise InboxCorrupt(
                        f"{self.path}: line {item.line} is corrupt ({item.reason}); nothing of the"
                        " inbox was applied: move the file aside and send the changes again"
                    )
                case TornTail():
                    return found, item
                case _:
                    assert_never(item)
        return found, None

    def append(self, run: str, change: Delivery, time_us: int) -> None:
        """Append one entry and make it durable (a torn tail before it is cut first).

        A change that could never be recorded (`malformed`: a signal name
        the `signal` command refuses, say) is refused, `OperationRefused`,
        and nothing is written.
        """
        bad = malformed(change)
        if bad is not None:
            raise OperationRefused(f"{bad}; nothing was written to {self.path}")
        try:
            # docs/contracts.md, "Append-only and checksummed": a record the
            # writer accepts, the reader accepts; an entry its taker could
            # not append would be dropped after the sender was told "durable".
            encode_record(WIDEST_SEQ, time_us, run, change)
        except RecordTooLarge as error:
            raise OperationRefused(
                f"{_describe(change)} for run {run!r} is too large for the run log: numbered there,"
                f" its record may be up to {error.size} bytes, over the limit of {MAX_RECORD_BYTES}"
                f" bytes per record (MAX_RECORD_BYTES); nothing was written to {self.path}. Keep a"
                " value this large outside the log (a file, an object store) and put a reference"
                " to it in the log instead"
            ) from None
        found, torn = self.entries()
        if torn is not None:  # a sender that died mid-write: never acknowledged
            os.ftruncate(self._fd, torn.offset)
        data = encode_record(len(found) + 1, time_us, run, change)
        written = 0
        while written < len(data):
            n = os.write(self._fd, data[written:])
            if n <= 0:  # a regular file that takes nothing is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += n
        os.fsync(self._fd)
        if self.created:
            fsync_dir(self.path.parent)

    def take_in(self, deliver: Deliver, progress: Callable[[str], None] | None = None) -> int:
        """Hand every entry to ``deliver`` in order, then empty the inbox; return how
        many were recorded (the others were moot or duplicates: dropped, each with a
        ``progress`` line saying why)."""
        found, torn = self.entries()
        if not found and torn is None:
            return 0
        recorded = 0
        for run, change in found:
            try:
                why = deliver(run, change)
            except UnencodableRecord as error:
                # Numbered in the log, its line may be longer than in the inbox
                # (written by other means than `append`, which refuses it):
                # nothing was appended, and the entries after it go on.
                why = str(error)
            if why is None:
                recorded += 1
                if progress is not None:
                    progress(f"{run}: took in {_describe(change)} from {self.path.name}")
            elif progress is not None:
                progress(f"{run}: dropped {_describe(change)} from {self.path.name}: {why}")
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
        return recorded


@contextlib.contextmanager
def locked_inbox(
    log: str | os.PathLike[str], *, create: bool, block: bool = True
) -> Generator[LockedInbox | None, None, None]:
    """The inbox of ``log``, locked; None when there is none (and ``create`` is false)
    or, without ``block``, when another process holds its lock now.

    A FIFO, device or directory in its place is refused (`LogOpenError`, naming
    what it is and whose inbox the path is), never opened blocking.
    """
    path = inbox_path(log)
    refused = f"not an inbox (the inbox of {log} is a regular file at this path; move this one aside)"
    created = False
    flags = os.O_RDWR | os.O_APPEND
    if create:
        try:
            fd = open_regular(path, flags | os.O_CREAT | os.O_EXCL, "for appending", not_what=refused)
            created = True
        except LogOpenError:
            if not path.exists() and not path.is_symlink():
                raise
            fd = open_regular(path, flags, "for appending", not_what=refused)
    else:
        if not os.path.lexists(path):
            yield None
            return
        fd = open_regular(path, flags, "for taking in", not_what=refused)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        except BlockingIOError:
            yield None
            return
        yield LockedInbox(path, fd, created)
    finally:
        os.close(fd)  # releases the lock


@final
class LedgerDelivery:
    """``deliver`` for a writer that drives no run: `refusal`, then append, apply, flush.

    What takes leftover entries in (those a holder that died left behind)
    and what records a sender's own change when it got the writer's lock.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal: Final = journal
        self.ledger: Final = Ledger()
        self.ledger.feed(journal.read())

    def __call__(self, run: str, change: Delivery) -> str | None:
        why = refusal(self.ledger, run, change)
        if why is not None:
            return why
        self.journal.append(run, change)
        self.ledger.apply_change(run, change)
        self.journal.flush()
        return None


def settle_inbox(log: str | os.PathLike[str], progress: Callable[[str], None] | None = None) -> None:
    """After the writer of ``log`` was released: take in what a sender appended
    meanwhile (it saw the writer's lock still held), unless another writer holds the
    log now (it takes the inbox in itself). A log that cannot be opened for
    writing now (say, one needing recovery) keeps its inbox for whoever recovers it.
    """
    if not os.path.lexists(inbox_path(log)):
        return
    with locked_inbox(log, create=False) as inbox:
        if inbox is None or inbox.size() == 0:
            return
        try:
            writer = RunLogWriter(log, create=False)
        except (LogLocked, RunLogError):
            return
        with writer:
            inbox.take_in(LedgerDelivery(writer), progress)


def write_entry(
    log: str | os.PathLike[str], run: str, change: Delivery, clock: Callable[[], int] = now_us
) -> None:
    """Append one entry to the inbox of ``log`` (locking it), durably."""
    with locked_inbox(log, create=True) as inbox:
        assert inbox is not None  # a blocking lock
        inbox.append(run, change, clock())
