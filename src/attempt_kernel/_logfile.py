"""The file store: the run log as a file, with its reader, writer, lock and torn tail.

Owns bytes on disk and nothing else: the wire form is `_codec`'s, and it
applies no kernel rule (that is the ledger's). It never rewrites what is
written; the one change ever made to bytes already in a log is recovery's
cut of a torn tail, whose bytes are first kept in a side file.

Only regular files are run logs: a FIFO, a device or a directory is refused
before anything reads or writes it (reading a FIFO would block forever and
``/dev/zero`` never ends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, ClassVar, Final, Literal, Protocol

from typing_extensions import Self, TypeAlias, assert_never, final

from ._codec import MAX_RECORD_BYTES, RunLogError, decode_line, encode_record
from ._records import Change, CorruptLine, LogItem, Record, TornTail

DEFAULT_BATCH: Final = 64
"""Records between two fsyncs when the caller does not choose."""

BATCH_TURNS: Final = 4
"""Turns of the event loop a due batch fsync waits for a group commit to make it instead.

A run that a group's fsync released needs about three turns to reach its
next wait (the effect, the step's end, the next step's task); with 100
runs at once, an fsync made sooner split each round's group in two
(benchmarks/bench_group_commit.py: 61 fsyncs for 500 effects, 6 now)."""

BATCH_CAP: Final = 16
"""Batches past the last fsync's start after which an append fsyncs at once, group or not:
the bound on records a crash of the machine may lose that no one waited on
(1,024 at the default ``batch_size``; a round of 100 runs writes about 700)."""

LONE_GATHERS: Final = 8
"""After this many gathers in a row that found no other waiter, `RunLogWriter.durable`
fsyncs a lone waiter at once, gathering only every this-many-th time."""

INLINE_FSYNC_S: Final = 0.001
"""Seconds: while the writer's fsyncs take less than this (a running average of the
last few made on the loop's thread, which starts at 0), a group's fsync runs
inline on the event loop; from this on, on the writer's flush thread, so that
the loop goes on meanwhile. Starting at 0 keeps one slow first fsync (a new
file's often is) under 4 ms from sending groups to the thread on its own: a
first fsync of 3 ms leaves the average at 0.75 ms.

Handing an fsync to the thread and taking its end back cost about 1 ms per
group on a 2-core machine (the interpreter lock passed to the thread and
back, two wake-ups): more than a fast fsync blocks the loop for
(benchmarks/bench_group_commit.py; docs/design.md has the figures).

An fsync timed on the flush thread reads long while the loop is busy: its
end is read only once the thread has the interpreter lock back, which can
take up to the switch interval (5 ms); so only fsyncs made on the loop's
thread are timed (a lone waiter's, `RunLogWriter.flush`'s, the batch's, a
group's while inline), and while groups are on the flush thread every
`PROBE_EVERY`-th group's fsync runs inline instead, a probe. A disk that
got fast brings groups back inline within a few probes (from a 5 ms
average to under 1 ms, six probes of 0.1 ms: 48 groups), however busy
the loop."""

PROBE_EVERY: Final = 8
"""While the timed choice keeps groups' fsyncs on the flush thread, every this-many-th
group's fsync runs inline instead: a probe, whose time feeds the running average (see
`INLINE_FSYNC_S`). On a slow disk it blocks the loop for one group's fsync in this many."""

_FSYNC_WEIGHT: Final = 0.25
"""The weight of each new fsync's time in the running average (`RunLogWriter`)."""

_fsync_clock: Callable[[], float] = time.perf_counter
"""Times each fsync made on the loop's thread, in seconds (tests put a clock of their own here)."""

# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@final
class LogOpenError(RunLogError):
    """The log file is missing, is not a regular file, or cannot be opened."""


@final
class LogReadError(RunLogError):
    """Reading the log failed part-way (an I/O error from the device)."""


@final
class LogLocked(RunLogError):
    """Another writer holds the log; two processes must not write one log."""


@final
class LogNeedsRecovery(RunLogError):
    """The log ends in a torn tail, or holds corruption before its last line: nothing is
    appended after either.

    A torn tail is recovery's to cut (`recover_log`, ``attempt-kernel
    recover``). Corruption is not: recovery refuses it with this error too,
    nothing written, since no tool here can tell what the bad line held
    (``attempt-kernel replay`` names its line and reason).
    """


@final
class LogWriteFailed(RunLogError):
    """A write or fsync failed; the writer refuses appends until the log is reopened."""


# --------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a regular file"


RUN_LOG: Final = "not a run log (a run log is a regular file)"
"""What `open_regular` says a run log's path holding anything but a regular file is not."""


def open_regular(path: Path, flags: int, doing: str, *, not_what: str = RUN_LOG) -> int:
    """Open ``path`` without blocking and make sure it is a regular file.

    O_NONBLOCK keeps ``open`` from waiting for a FIFO's other end; the flag
    is cleared again once the file is known to be regular. Anything else is
    `LogOpenError`: ``<path>: is <what it is>, <not_what>``; with ``O_CREAT``
    in ``flags``, a missing folder is named as such, not the file it would hold.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        if flags & os.O_CREAT:  # a missing file would be made: its folder is what is missing
            whose = "the log's" if not_what == RUN_LOG else "the file's"
            raise LogOpenError(f"{path.parent}: no such folder ({whose} folder must exist)") from None
        raise LogOpenError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LogOpenError(f"{path}: is a directory, {not_what}") from None
    except OSError as error:
        if error.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
            raise LogOpenError(f"{path}: is a FIFO (named pipe), {not_what}") from None
        raise LogOpenError(f"{path}: cannot open {doing}: {error.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LogOpenError(f"{path}: is {_kind(mode)}, {not_what}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_for_reading(path: Path) -> BinaryIO:
    fd = open_regular(path, os.O_RDONLY, "for reading")
    return open(fd, "rb")  # noqa: SIM115  # closed by the reader's finally


def _rest_is_nul(stream: BinaryIO) -> bool:
    """Is the rest of ``stream`` NUL bytes (and newlines)? The stream is left where it was."""
    where = stream.tell()
    try:
        while chunk := stream.read(1 << 16):
            if chunk.strip(b"\x00\n"):
                return False
        return True
    finally:
        stream.seek(where)


RECORD_START: Final = b'{"v":'
"""How every line the writer writes begins (``_codec.encode_record``)."""


def _may_begin_record(raw: bytes) -> bool:
    """Could ``raw``, a first line with no newline, be the start of a record cut by a crash?

    A crash during the first write leaves a prefix of the first record, or
    NUL bytes where the file grew before its data landed; anything else was
    never written by a run log's writer.
    """
    body = raw.lstrip(b"\x00")
    n = min(len(body), len(RECORD_START))
    return body[:n] == RECORD_START[:n]


def _not_a_run_log(path: str | os.PathLike[str], raw: bytes) -> LogOpenError:
    return LogOpenError(
        f"{path}: not a run log: its first bytes {raw[:24]!r} cannot begin a record (each line of"
        f" a run log begins with {RECORD_START.decode()}); nothing was changed"
    )


def read_log(path: str | os.PathLike[str]) -> Iterator[LogItem]:
    """Yield each line of the log at ``path`` as a `Record` or `CorruptLine`.

    Streams: at most one line is in memory. A line longer than
    `MAX_RECORD_BYTES` (its newline included; the writer never writes one)
    is a `CorruptLine`, skipped without being loaded whole. An unterminated
    last line, or a tail of NUL bytes, ends the stream with a `TornTail`.
    Raises `LogOpenError` if the file cannot be opened or is not a regular
    file (checked before the first read), or is not a run log: a file whose
    only line has no newline and whose first bytes cannot begin a record
    (an empty file, and a first record torn by a crash, are a run log with
    no record).
    """
    stream = _open_for_reading(Path(path))
    line = 0
    offset = 0
    # Locals: this loop runs once per record of the log. A line of at most
    # MAX_RECORD_BYTES, its newline included, comes whole from one
    # readline(limit); a longer one comes cut, without its newline.
    readline, limit, decode = stream.readline, MAX_RECORD_BYTES, decode_line
    try:
        while raw := readline(limit):
            line += 1
            start = offset
            offset += len(raw)
            if raw[-1] != 0x0A:  # no newline: cheaper than raw.endswith per line
                if line == 1 and not _may_begin_record(raw):
                    raise _not_a_run_log(path, raw)
                if len(raw) < MAX_RECORD_BYTES:  # short of the cap: the file ended
                    yield TornTail(line=line, offset=start, length=len(raw))
                    return
                # Overlong: skip to the end of the line without keeping it.
                while (more := stream.readline(1 << 16)) and not more.endswith(b"\n"):
                    offset += len(more)
                offset += len(more)
                if not more:
                    yield TornTail(line=line, offset=start, length=offset - start)
                    return
                yield CorruptLine(line=line, reason=f"line longer than {MAX_RECORD_BYTES} bytes")
                continue
            if raw[0] == 0 and not raw.strip(b"\x00\n"):
                if _rest_is_nul(stream):
                    size = os.fstat(stream.fileno()).st_size
                    yield TornTail(line=line, offset=start, length=size - start)
                    return
                yield CorruptLine(line=line, reason="a run of NUL bytes inside the log")
                continue
            yield decode(raw, line)
    except OSError as error:
        raise LogReadError(f"{path}: reading failed after line {line}: {error.strerror}") from error
    finally:
        stream.close()


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


def now_us() -> int:
    """The writer's default clock: microseconds since the Unix epoch."""
    return time.time_ns() // 1000


class FileOps(Protocol):
    """The two system calls the writer makes (``os.write`` and ``os.fsync`` by
    default); tests substitute ones that fail."""

    def write(self, fd: int, data: bytes) -> int: ...

    def fsync(self, fd: int) -> None: ...


def _scan_for_append(path: Path) -> tuple[int, TornTail | None]:
    """The last sequence number, and the torn tail if the log ends in one.

    Corruption anywhere is refused: appending after it would bury it.
    """
    last = 0
    for item in read_log(path):
        match item:
            case Record():
                last = item.seq
            case CorruptLine():
                raise LogNeedsRecovery(
                    f"{path}: line {item.line} is corrupt ({item.reason});"
                    " refusing to append after it"
                )
            case TornTail():
                return last, item
            case _:
                assert_never(item)
    return last, None


def _side_file(path: Path, offset: int, data: bytes) -> Path:
    """Keep ``data`` (a torn tail cut at ``offset``) in a side file; return its path.

    Restartable at any point, and it never destroys evidence: the bytes go
    to a fresh temporary file that is fsynced, then linked under the first
    free name among ``<log>.torn-at-<offset>``, ``...-<offset>.2``, ...
    (``link`` never replaces a file). A side file already holding exactly
    these bytes (a cut that crashed after keeping them) is reused. A
    half-written temporary file left by a crash is never read as a side
    file; it is removed once the bytes are safe under a final name.

    Nothing already at these names is followed or opened blocking: a name
    holding a symlink, a FIFO or anything but a regular file is never a
    side file (the next name is taken), and the temporary file is created
    fresh (``O_EXCL | O_NOFOLLOW``); a stale one is removed only if it is
    a regular file, anything else there is refused, naming it.
    """
    base = path.with_name(f"{path.name}.torn-at-{offset}")
    partial = path.with_name(f".{path.name}.torn-at-{offset}.partial")
    candidates = (base, *(base.with_name(f"{base.name}.{n}") for n in range(2, 10_000)))
    for candidate in candidates:
        held = _holds(candidate, data)
        if held is None:
            break
        if held:
            _remove_partial(partial, refuse=False)
            return candidate
    _remove_partial(partial, refuse=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(partial, flags, 0o644)
    except FileExistsError:
        raise LogWriteFailed(
            f"{partial}: appeared while the torn tail was being kept (another process writes"
            " there); nothing was cut, run recover again"
        ) from None
    try:
        with open(fd, "wb", closefd=False) as out:
            out.write(data)
        os.fsync(fd)
        made = os.fstat(fd)
        for candidate in candidates:
            try:
                os.link(partial, candidate, follow_symlinks=False)
            except FileExistsError:
                continue
            linked = os.lstat(candidate)
            if (linked.st_dev, linked.st_ino) != (made.st_dev, made.st_ino):
                raise LogWriteFailed(
                    f"{partial}: was replaced while the torn tail was being kept; nothing was"
                    f" cut, and {candidate} is not a side file: move both away and run recover again"
                )
            partial.unlink()
            fsync_dir(path.parent)
            return candidate
    finally:
        os.close(fd)
    raise LogWriteFailed(f"{path}: no free name for the torn tail's side file near {base}")


def _holds(candidate: Path, data: bytes) -> bool | None:
    """Is ``candidate`` a regular file holding exactly ``data``? None when nothing is there.

    Opened without following a symlink and without blocking on a FIFO; a
    name holding anything but a readable regular file holds nothing.
    """
    try:
        fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink (ELOOP), unreadable, ...: leave it, take the next name
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with open(fd, "rb", closefd=False) as found:
            return found.read(len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove_partial(partial: Path, *, refuse: bool) -> None:
    """Remove the temporary copy a crash left at ``partial``, if it is a regular file.

    Anything else there (a symlink, a FIFO, a directory) is left alone, and
    with ``refuse`` (the name is needed) refused, naming it.
    """
    try:
        mode = os.lstat(partial).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode):
        partial.unlink(missing_ok=True)
        return
    if refuse:
        raise LogWriteFailed(
            f"{partial}: is {_kind(mode)}, in the way of the temporary copy of the torn tail (only a"
            " regular file left by a crash is removed there); move it away and run recover"
            " again (nothing was cut)"
        )


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_tail(path: Path, fd: int, tail: TornTail) -> Path:
    """Keep the torn tail's bytes in a side file, then cut the log before them.

    The cut happens only once the side file is durable, so a crash at any
    point leaves the bytes in the log, in a side file, or in both; recovery
    started again simply cuts again.
    """
    with open(open_regular(path, os.O_RDONLY, "for reading"), "rb") as log:
        if os.path.sameopenfile(log.fileno(), fd):
            log.seek(tail.offset)
            data = log.read()
        else:
            raise LogWriteFailed(f"{path}: was replaced while recovery held it; nothing was cut")
    side = _side_file(path, tail.offset, data)
    os.truncate(fd, tail.offset)
    os.fsync(fd)
    return side


_Parked: TypeAlias = dict[asyncio.Future[None], None]
"""Waiters parked until something ends, each on a future of its own, in the order they came."""


@final
class _Inflight:
    """An fsync in flight on the flush thread, and the waiters parked until it ends."""

    __slots__ = ("upto", "outcome", "loop", "parked")

    def __init__(
        self,
        upto: int,
        outcome: concurrent.futures.Future[OSError | None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.upto: Final = upto
        """The last record it covers."""
        self.outcome: Final = outcome
        """Its outcome: the error it met, or None (a thread's future, bound to no event loop)."""
        self.loop: Final = loop
        """The event loop that started it, where its end releases ``parked``."""
        self.parked: Final[_Parked] = {}
        """Waiters of ``loop`` parked until it ends (`_park`)."""
        outcome.add_done_callback(self._ended)

    def _ended(self, _: object) -> None:
        # On the flush thread: the waiters are released on their loop's
        # thread, which sees every waiter that parked before the release runs.
        with contextlib.suppress(RuntimeError):  # the loop closed: no one is left to wake
            self.loop.call_soon_threadsafe(_release, self.parked)

    async def wait(self) -> None:
        """Return once the fsync has ended (whatever it found); a cancel ends only this wait."""
        loop = asyncio.get_running_loop()
        if loop is self.loop:
            await _park(self.parked)
        else:  # a waiter on another loop than the one that started it (one stopped meanwhile)
            await asyncio.shield(asyncio.wrap_future(self.outcome, loop=loop))


async def _park(parked: _Parked) -> None:
    """Wait until ``parked`` is released (`_release`), on a future of this waiter's own.

    What a shared future under ``asyncio.shield`` gave, for less: a waiter
    cancelled meanwhile cancels only its own future (never the fsync or the
    gathering that others wait for) and takes it out at once, and a release
    wakes each waiter with one callback of the loop instead of three.
    """
    own: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    parked[own] = None
    try:
        await own
    finally:
        del parked[own]


def _release(parked: _Parked) -> None:
    """Wake every waiter parked on ``parked`` that is still waiting."""
    # Over a copy: a waiter may leave ``parked`` meanwhile (one stranded in a
    # closed loop, whose coroutine the garbage collector closes).
    for own in tuple(parked):
        if not own.done():
            try:
                own.set_result(None)
            except RuntimeError:  # a waiter stranded in a loop closed since: no one to wake
                pass


def _fsync_outcome(fsync: Callable[[int], None], fd: int) -> OSError | None:
    """Run ``fsync`` (on the writer's flush thread) and hand back its error instead of raising it.

    The error comes back as a value so that whoever looks next (a waiter on
    the event loop, `RunLogWriter.flush` or `RunLogWriter.close`) breaks the
    writer with it: the thread itself changes no state. It is not timed
    (`INLINE_FSYNC_S`: its end waits for the interpreter lock).
    """
    try:
        fsync(fd)
    except OSError as error:
        return error
    return None


@final
class RunLogWriter:
    """Appends records to a run log; never rewrites what is written.

    Durability: each `append` hands its whole line to the operating system
    (one ``write`` call) before returning, so a returned record survives a
    crash of this process; `append_all` does the same for several records
    of a run in one ``write``. The file is fsynced once ``batch_size``
    records have been appended since the last fsync began, and by `flush`
    and `close`; after `flush` returns, every returned append survives a
    crash of the machine too. Outside an event loop that batch fsync is
    made by the append that reaches the count. Inside one it is left to a
    group commit, which covers the same records without splitting the
    group: to the waiters of `durable` while there are any (the last one
    to leave sees to it), else to the end of `BATCH_TURNS` turns of the
    loop, unless an fsync began by then; and never past `BATCH_CAP`
    batches, where the append makes it whatever comes. A failed write or fsync
    breaks the writer: it raises `LogWriteFailed` and refuses every later
    append until the log is reopened (a failed fsync is never retried as if
    nothing happened). Only one writer may hold a log (an exclusive lock).
    Appends from several threads at once are serialized: each record takes
    a number of its own. `durable`, `flush` and `close` are not: they serve
    one event loop at a time (one ``asyncio.run`` after another), and two
    loops in two threads waiting on one writer at once may lose the
    failure of an fsync that one of them began.

    Group commit (`GroupCommitLog`): ``await durable(run)`` returns once
    every record appended so far is on disk, and concurrent waiters share
    one fsync. A waiter is released only by an fsync that began after its
    records were written, and returns at once when an earlier one covered
    them. The first waiter lets the loop run while more waiters keep coming;
    then the group's fsync runs inline while the writer's fsyncs are fast
    (a running average under `INLINE_FSYNC_S`, which is below what a hop
    to a thread and back costs), else on a thread the writer owns, so the
    event loop goes on (other runs append for the next fsync) while it runs
    (but for every `PROBE_EVERY`-th group, fsynced inline to time the disk again).
    A lone waiter fsyncs inline, as `flush` does (a thread hop measured slower
    for a lone run), and after `LONE_GATHERS` gathers in a row that found
    no one else it no longer gives the loop that turn first, but for every
    `LONE_GATHERS`-th wait, which finds other waiters if they came back
    (one run at a time then pays about 3 us of CPU per wait beyond the
    synchronous flush instead of about 6). A failed fsync raises
    `LogWriteFailed` in every waiter it would have released, and breaks
    the writer. `flush` and `close` may be called
    while such an fsync is in flight: both wait for it first (`flush` then
    fsyncs itself: Linux reports a writeback error to one fsync only, so one
    made beside a failed fsync proves nothing; `close` never closes the
    file under it). A batch fsync, which no one waits on, is made beside it,
    and what it covered counts as durable only once that one ends well. The writer holds no state
    bound to an event loop between flushes, so it may serve one
    ``asyncio.run`` after another (a batch fsync still pending when a loop
    closes is made by the next append past the count, or `close`).

    A log that ends in a torn tail is refused (`LogNeedsRecovery`) unless
    ``cut_torn_tail`` is true, as recovery passes: then, under the lock, the
    tail's bytes are copied to ``<log>.torn-at-<offset>`` (fsynced) and the
    log is cut where the tail began. That cut is the only change ever made
    to bytes already in a log.

    With ``create=False`` (recovery passes it) a missing file is an error
    (`LogOpenError`) instead of a new, empty log.
    """

    # How durable() fsyncs once it has gathered its waiters (see
    # _start_flush for the measurements behind the default).
    flush_on: ClassVar[Literal["timed", "alone", "loop", "thread"]] = "timed"
    """How `durable` fsyncs: ``"timed"`` (the default) inline for a lone
    waiter, and for a group inline while fsyncs are fast (`INLINE_FSYNC_S`),
    else on the flush thread but for a probe every `PROBE_EVERY`-th group;
    ``"alone"`` inline for a lone waiter and on the flush thread for every
    group; ``"loop"`` always inline; ``"thread"`` always on the flush
    thread, without gathering first. For benchmarks and tests that measure
    or pin one path."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        batch_size: int = DEFAULT_BATCH,
        clock: Callable[[], int] = now_us,
        ops: FileOps | None = None,
        cut_torn_tail: bool = False,
        create: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.path: Final = Path(path)
        self._batch: Final = batch_size
        self._clock: Final = clock
        # Bound once: the default calls os.write/os.fsync directly, no wrapper.
        self._write: Final = os.write if ops is None else ops.write
        self._fsync: Final = os.fsync if ops is None else ops.fsync
        self._broken: str | None = None
        # Sequence numbers, not counts, so that an fsync in flight while
        # appends go on knows exactly what it covers: _started is the last
        # record an fsync began after (batch_size counts from there), _synced
        # the last one an fsync that succeeded covered.
        self._started = 0
        self._synced = 0
        # The fsync in flight on the flush thread: the last record it covers,
        # its outcome (a thread's future, bound to no event loop), and the
        # waiters parked until it ends (see _park).
        self._inflight: _Inflight | None = None
        # The last record a batch fsync made beside the one in flight covered:
        # durable once that one ends well (see _fsync_now).
        self._beside = 0
        self._waiters = 0
        # The loop a batch fsync is pending on (_batch_due), if any; weak, so
        # that a loop closed with the call pending is not kept alive by it.
        self._batch_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        # Gathers in a row that found no other waiter (see _start_flush).
        self._alone = 0
        # The running average of the times of the fsyncs made on the loop's
        # thread, in seconds: under flush_on "timed", a group's fsync runs
        # inline while it is under INLINE_FSYNC_S. It starts at 0, so that
        # a new file's first fsync, often the slowest, does not send groups
        # to the thread on its own unless it takes 4 ms (INLINE_FSYNC_S).
        self._fsync_s = 0.0
        # Groups that found that average slow since one last found it fast
        # (every PROBE_EVERY-th of them is a probe, inline; the rest go to
        # the flush thread).
        self._threaded = 0
        # While a leader gathers (_start_flush): its loop, and the waiters
        # parked until it is done.
        self._gathering: tuple[asyncio.AbstractEventLoop, _Parked] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Held while an append numbers and writes its records: two threads
        # appending at once (two event loops, say) would take one number twice.
        self._appending = threading.Lock()
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
        fd = open_regular(self.path, flags, "for appending")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"{self.path}: another process is writing this log; two writers would"
                " interleave records"
            ) from None
        self.cut: TornTail | None = None
        """The torn tail cut off when opened with ``cut_torn_tail=True``, if any."""
        self.side_file: Path | None = None
        """Where the cut bytes were kept."""
        try:
            self._seq, tail = _scan_for_append(self.path)
            if tail is not None and not cut_torn_tail:
                raise LogNeedsRecovery(
                    f"{self.path}: line {tail.line} is a torn tail (a crash mid-write);"
                    " run `attempt-kernel recover` (it keeps the cut bytes aside) before"
                    " appending"
                )
            if tail is not None:
                self.side_file = _cut_tail(self.path, fd, tail)
                self.cut = tail
        except (RunLogError, OSError) as error:
            os.close(fd)
            if isinstance(error, RunLogError):
                raise
            raise LogWriteFailed(f"{self.path}: cutting the torn tail failed: {error}") from error
        # What was in the file when it was opened is taken as durable (the
        # scan read it back; recovery fsyncs what it cuts).
        self._started = self._synced = self._seq
        self._fd: int | None = fd

    @property
    def last_seq(self) -> int:
        """The sequence number of the last record in the log (0 when empty)."""
        return self._seq

    def read(self) -> Iterator[LogItem]:
        """Read the log from the start (`read_log`), e.g. to rebuild the ledger."""
        return read_log(self.path)

    def append(self, run: str, change: Change) -> int:
        """Write one record and return its sequence number (see the class doc).

        A record JSON cannot carry raises `UnencodableRecord`, and one whose
        line would be longer than `MAX_RECORD_BYTES` its subclass
        `RecordTooLarge`, before anything is written: the log and the next
        sequence number stay as they were.
        """
        with self._appending:  # numbered and written as one, whatever thread appends too
            fd = self._writable()
            seq = self._seq + 1
            self._write_out(fd, encode_record(seq, self._clock(), run, change), f"record seq {seq}")
            self._seq = seq
        if seq - self._started >= self._batch:
            self._batch_due()
        return seq

    def append_all(self, run: str, changes: Sequence[Change]) -> int:
        """Write several records of ``run`` with one ``write`` call; return the last one's
        sequence number (`BatchLog`).

        Each record is encoded first, so one that JSON cannot carry (or that
        is too large) raises before anything is written, as `append` does
        (and an empty ``changes`` raises `ValueError`). The records share one
        ``time_us``, read once for the call. A
        crash in the middle of the call, or a write that fails part-way (a
        full disk: `LogWriteFailed`), may keep a prefix of the records (the
        last one maybe torn, which recovery cuts, as after any append). The
        executor writes records that follow one another at once this way (an
        attempt's creation and admission, a step's result and its end).
        """
        if not changes:
            raise ValueError("append_all needs at least one change")
        with self._appending:
            fd = self._writable()
            first = self._seq + 1
            now = self._clock()
            data = b"".join([encode_record(seq, now, run, change) for seq, change in enumerate(changes, first)])
            last = first + len(changes) - 1
            self._write_out(fd, data, f"records seq {first} to {last}" if last > first else f"record seq {last}")
            self._seq = last
        if last - self._started >= self._batch:
            self._batch_due()
        return last

    def _writable(self) -> int:
        """The file's descriptor, once `append` may write: LogWriteFailed if broken or closed."""
        if self._inflight is not None and self._inflight.outcome.done():
            self._settle()  # a failed fsync refuses this append, not only a later one
        if self._broken is not None:
            raise LogWriteFailed(
                f"{self.path}: the writer failed earlier ({self._broken}); reopen the"
                " log (recovery cuts any torn tail) before appending again"
            )
        if self._fd is None:
            raise LogWriteFailed(f"{self.path}: the writer is closed")
        return self._fd

    def _write_out(self, fd: int, data: bytes, what: str) -> None:
        """All of ``data`` (``what``: which records, for the error) to the file; a failure breaks the writer."""
        try:
            written = self._write(fd, data)
            while written < len(data):  # a short write: go on with the rest
                n = self._write(fd, data[written:])
                if n <= 0:  # a regular file that takes nothing is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += n
        except OSError as error:
            raise self._fail(f"write of {what}", error) from error

    def flush(self) -> None:
        """fsync: every append that has returned is now durable on disk.

        With an fsync of `durable` in flight, this one waits for it to end
        first, then fsyncs itself, covering every record written so far. Not
        beside it: Linux reports a writeback error to one fsync only, so an
        fsync that succeeds beside a failed one proves nothing.
        """
        if self._inflight is not None:
            self._settle(wait=True)
        self._fsync_now()

    def _fsync_now(self) -> None:
        """fsync every record written so far, now (`flush`, and a batch's fsync, which no
        one waits on: it does not wait for one in flight on the flush thread either).

        One made beside an fsync in flight proves nothing until that one
        ends well (Linux reports a writeback error to one fsync only): what
        it covered counts as durable only then (`_settle`).
        """
        if self._inflight is not None and self._inflight.outcome.done():
            self._settle()
        if self._fd is None or self._synced >= self._seq:
            return
        if self._broken is not None:
            raise LogWriteFailed(f"{self.path}: the writer failed earlier ({self._broken})")
        upto = self._started = self._seq
        self._batch_loop = None  # nothing is owed now; a pending call finds so and ends
        clock = _fsync_clock
        start = clock()
        try:
            self._fsync(self._fd)
        except OSError as error:
            raise self._fail(f"fsync after record seq {upto}", error) from error
        self._took(clock() - start)
        if self._inflight is not None:
            self._beside = max(self._beside, upto)
        else:
            self._synced = max(self._synced, upto)

    def _took(self, seconds: float) -> None:
        """Count an fsync made on the loop's thread, which took ``seconds``, into the
        running average (a threaded one's time waits for the interpreter lock:
        `INLINE_FSYNC_S`)."""
        self._fsync_s += (seconds - self._fsync_s) * _FSYNC_WEIGHT

    async def durable(self, run: str) -> None:
        """Return once every record appended so far (``run``'s among them) is durable on disk.

        Group commit (see the class doc): waiters share one fsync. Raises
        `LogWriteFailed` if the fsync that would release this waiter failed,
        or the writer failed or closed before its records were durable.
        """
        target = self._seq
        if self._synced >= target:
            return
        self._waiters += 1
        try:
            while True:
                inflight = self._inflight
                if inflight is not None and inflight.outcome.done():
                    self._settle()
                    continue
                if self._synced >= target:
                    return
                if self._broken is not None:
                    raise LogWriteFailed(
                        f"{self.path}: the writer failed before record seq {target} was"
                        f" durable ({self._broken})"
                    )
                if self._fd is None:
                    raise LogWriteFailed(
                        f"{self.path}: the writer was closed before record seq {target} was durable"
                    )
                if inflight is None:
                    await self._start_flush()
                    continue
                # In flight: it covers this waiter only if it began after
                # target was written; else this waiter waits for it to end
                # and then for the next one (the loop comes round again).
                await inflight.wait()
        finally:
            self._waiters -= 1
            if self._batch_owed():
                # In a loop this only schedules; outside one (a waiter closed
                # by the garbage collector) it fsyncs, and a failure stays in
                # the writer, which reports it at the next append or wait.
                with contextlib.suppress(LogWriteFailed):
                    self._batch_due()

    def _batch_due(self) -> None:
        """``batch_size`` records are past the last fsync's start: fsync now, or see that one comes.

        Outside an event loop, now. In one, a group commit's fsync is often a
        turn or two away and covers these records too; an fsync made now
        would split the group in two. So it is left to the waiters of
        `durable` while there are any (the last one out sees to it), else
        made `BATCH_TURNS` turns of the loop later unless an fsync began by
        then (`_pay_batch`); and once `BATCH_CAP` batches are past the last
        fsync's start, it is made now whatever comes.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._fsync_now()
            return
        if self._seq - self._started >= BATCH_CAP * self._batch:
            self._fsync_now()
            return
        if self._waiters:
            return
        pending = self._batch_loop
        if pending is None or pending() is not loop:  # one call in flight, not one per append
            self._batch_loop = weakref.ref(loop)
            loop.call_soon(self._pay_batch, BATCH_TURNS)

    def _pay_batch(self, turns: int) -> None:
        """The batch fsync `_batch_due` put off, ``turns`` turns of the loop later, if it is still owed."""
        if not self._batch_owed():
            self._batch_loop = None
            return
        if turns > 1:
            asyncio.get_running_loop().call_soon(self._pay_batch, turns - 1)
            return
        self._batch_loop = None
        # A failure stays in the writer, which reports it at the next append
        # or wait; a loop callback has no caller to raise to.
        with contextlib.suppress(LogWriteFailed):
            self._fsync_now()

    def _batch_owed(self) -> bool:
        """Is a batch fsync due, with no waiter of `durable` left to make it?"""
        return (
            not self._waiters
            and self._seq - self._started >= self._batch
            and self._broken is None
            and self._fd is not None
        )

    async def _start_flush(self) -> None:
        """Make one fsync cover every waiter that can join it; return once it is in flight or done.

        First the leader gathers: it yields to the loop while more waiters
        keep coming (runs that are ready get to append and wait too), and
        those that come wait for it instead of starting fsyncs of their own.
        Then, under ``flush_on = "timed"`` (the default): a lone waiter
        fsyncs inline, as `flush` does, and so does a group while the
        writer's fsyncs take under `INLINE_FSYNC_S` on average; else the
        group's fsync goes to the flush thread, so the loop goes on and
        records pile up for the next fsync while this one runs (every
        `PROBE_EVERY`-th such group is fsynced inline, a probe). Under
        ``"alone"`` every group's fsync goes to the thread.
        benchmarks/bench_group_commit.py measures
        the alternatives in one run: on a 2-core machine shared with other
        work, a thread hop made a sequential run slower than an inline fsync
        in four runs of six (1,176 against 847 us per effect in one). With
        100 runs at once, always-thread fell behind when fsync was fast
        (handing the GIL to the thread and back costs more than the fsync),
        and so did ``"alone"``, by about a tenth against always-inline, on
        a day of 120 us fsyncs; but always-inline blocks the loop for every
        fsync, which costs most when fsync is slow and other runs have work
        to do meanwhile (runs out of step, 4 ms fsyncs: inline 0.88x the
        thread). Choosing by the fsync's time takes the better of the two
        at each end (docs/design.md has the figures).
        """
        mode = self.flush_on
        loop = asyncio.get_running_loop()
        if mode != "thread":
            if self._gathering is not None:
                leader_loop, parked = self._gathering
                if leader_loop is loop:
                    await _park(parked)
                    return
                if not leader_loop.is_closed():
                    # its leader is stranded in another loop, stopped
                    # mid-gathering: it may come back, so this one does
                    # not lead in its place, and fsyncs alone
                    self._flush_unless_ended()
                    return
                self._gathering = None  # its leader's loop closed: it never comes back
            alone = self._alone
            if alone >= LONE_GATHERS and alone % LONE_GATHERS and self._waiters == 1:
                # The last gathers found no one else: fsync at once, as `flush`
                # does, and gather again only every LONE_GATHERS-th time (a
                # probe: when runs come back, gathering comes back with them).
                self._alone = alone + 1
                self._flush_unless_ended()
                return
            gathering: _Parked = {}
            mine = self._gathering = (loop, gathering)
            try:
                while True:  # gather: yield while more waiters keep coming
                    before = self._waiters
                    await asyncio.sleep(0)
                    if self._waiters == before:
                        break
                self._alone = alone + 1 if self._waiters == 1 else 0
                if self._synced >= self._seq or self._inflight is not None:
                    return
                if mode == "loop" or self._waiters == 1 or (mode == "timed" and self._inline()):
                    self._flush_unless_ended()
                    return
            finally:
                if self._gathering is mine:  # not taken over (its loop closed under it)
                    self._gathering = None
                _release(gathering)
        if self._broken is not None or self._fd is None:
            return  # the caller's loop reports it
        pool = self._pool
        if pool is None:
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="runlog-fsync"
            )
        upto = self._started = self._seq
        self._batch_loop = None
        self._inflight = _Inflight(upto, pool.submit(_fsync_outcome, self._fsync, self._fd), loop)

    def _inline(self) -> bool:
        """Under ``flush_on = "timed"``: does this group's fsync run inline?

        Yes while the writer's fsyncs are fast (`INLINE_FSYNC_S`); else on
        the flush thread, but for every `PROBE_EVERY`-th group, a probe.
        """
        if self._fsync_s < INLINE_FSYNC_S:
            self._threaded = 0
            return True
        self._threaded += 1
        return self._threaded % PROBE_EVERY == 0

    def _flush_unless_ended(self) -> None:
        """`flush` for a waiter, unless the writer broke or closed (its `durable` loop reports that)."""
        if self._broken is None and self._fd is not None:
            self.flush()

    def _settle(self, *, wait: bool = False) -> None:
        """Take in the outcome of the fsync in flight if it has ended (or, with ``wait``, once it has).

        On the caller's thread (the event loop's, or `close`'s): the flush
        thread itself changes nothing.
        """
        inflight = self._inflight
        if inflight is None or not (wait or inflight.outcome.done()):
            return
        upto = inflight.upto
        error = inflight.outcome.result()
        self._inflight = None
        beside, self._beside = self._beside, 0
        if error is not None:
            if self._broken is None:  # the first failure is the one to report
                self._fail(f"fsync after record seq {upto}", error)
        elif self._broken is None:  # an fsync after a failed one proves nothing
            self._synced = max(self._synced, upto, beside)

    def _fail(self, what: str, error: OSError) -> LogWriteFailed:
        """Break the writer; return the error for the caller to raise."""
        if error.errno == errno.ENOSPC:
            reason = "the disk is full"
        elif error.errno == errno.EFBIG:  # the disk may have room: say which limit, or it is looked for there
            reason = "the file reached its size limit (`ulimit -f`, or the largest file its file system holds)"
        else:
            reason = error.strerror or f"errno {error.errno}"
        self._broken = f"{what} failed: {reason}"
        failed = LogWriteFailed(
            f"{self.path}: {self._broken}; records acknowledged before it stay readable,"
            " and this writer refuses further appends until the log is reopened"
        )
        failed.__cause__ = error
        return failed

    def close(self) -> None:
        """Flush (if the writer is healthy) and release the log. Idempotent.

        An fsync of `durable` still in flight is waited for first (the file
        is never closed under it); its waiters are then released, or told
        it failed, by what it found. Raises `LogWriteFailed` when the writer
        was healthy and that fsync, or close's own, failed (the log is
        released all the same).
        """
        if self._fd is None:
            return
        try:
            healthy = self._broken is None
            self._settle(wait=True)
            if self._broken is None:
                self.flush()
            elif healthy:  # the fsync in flight failed: said here, as a failure of close's own would be
                raise LogWriteFailed(
                    f"{self.path}: {self._broken}; records appended since the last fsync that"
                    " succeeded may not be on disk"
                )
        finally:
            os.close(self._fd)
            self._fd = None
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@final
class FileLog:
    """A run log file to read (the `LogSource` of the file store); takes no lock."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: Final = Path(path)

    def read(self) -> Iterator[LogItem]:
        """Read the log from the start (`read_log`)."""
        return read_log(self.path)

    def __repr__(self) -> str:
        return f"FileLog({str(self.path)!r})"
