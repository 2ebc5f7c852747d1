"""Prometheus metrics: what a worker counts as it writes, and gauges read from the journal.

Owns the metric names, their labels and the text a scraper reads; it
applies no kernel rule (the ledger says where every run and attempt
stands, the kernel which states are final) and writes nothing anywhere.
It is the only module that imports ``prometheus_client`` (the ``metrics``
extra), so the library and every other command work without it.

Theory of operation:

- Counters and the step-duration histogram are this process's own:
  `RunMetrics` is an executor observer, told of each record the executor
  appended; an attempt that reaches a final state is counted once, by the
  process that wrote its end. The worker's claims, takeovers and lost
  leases come from the worker (`WorkerMetrics`).
- Gauges are read from the journal when scraped (`JournalCollector`): a
  `Ledger` is fed only the records appended since the previous scrape, so
  a scrape costs what was written since, not the journal's length. A run's
  standing changes only with its own records, so only the runs those
  records name are judged again.
- On a file, the new records are the complete lines past the last one
  read; a file cut shorter (recovery cut a torn tail), replaced, or
  rewritten in place (the bytes at either end of what was read differ, see
  `_FileSource`) is read again from its start.
- On PostgreSQL, the new records are the rows past the highest ``pos``
  applied. ``pos`` comes from a sequence, so a row can commit after a row
  with a higher ``pos`` was read: the positions skipped below it are kept
  as holes, and each scrape also reads the rows that came into them. A
  hole is given up once every transaction that was open when it was found
  has ended (that snapshot's ``xmax`` is at most the current ``xmin``) and
  `SETTLE_S` has passed: a rolled-back append leaves a hole forever.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from typing_extensions import LiteralString, assert_never, final

from ._attempt import (
    AttemptState,
    Cancelled,
    Failed,
    Indeterminate,
    Running,
    Succeeded,
    TimedOut,
    is_terminal,
)
from ._codec import decode_line, state_name
from ._ledger import Ledger, RunStanding
from ._logfile import LogOpenError, open_regular
from ._operations import writer_listed
from ._records import (
    AttemptCreated,
    AttemptTransitioned,
    Change,
    CorruptLine,
    DomainStateSet,
    IntentChanged,
    IntentPlanned,
    IntentReconciled,
    Record,
    RunCancelRequested,
    RunFinished,
    RunResumed,
    RunStarted,
    RunStopRequested,
    SignalSent,
    StepCalled,
    StepResult,
    WaitEnded,
    WaitStarted,
)
from ._report import redacted, shown
from ._store import is_url as _is_url

STANDINGS: Final[tuple[RunStanding, ...]] = (
    "running", "waiting", "interrupted", "needs-reconciliation", "succeeded", "failed", "cancelled",
)  # fmt: skip
"""Every value of the ``status`` label of ``attempt_kernel_runs``: each has a series, even at 0."""

FINAL_STATES: Final[tuple[AttemptState, ...]] = (
    Succeeded(), Failed(), Indeterminate(), Cancelled(), TimedOut(),
)  # fmt: skip
"""Every value of the ``state`` label of ``attempt_kernel_attempts_total``."""

DURATION_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
"""Seconds: an agent's step takes from milliseconds (a lookup) to an hour (a human's answer)."""

SETTLE_S: Final = 10.0
"""Seconds a hole in a PostgreSQL journal's positions is watched for a late commit (see the module doc)."""

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The text format of ``generate_latest``'s output here (our names and labels are plain
ASCII, so nothing needs the 1.0.0 format's quoting, which newer prometheus_client
releases name by default): the content type every Prometheus server reads."""

CHECK_BYTES: Final = 4096
"""Bytes at each end of what was read from a log file, read again per scrape to see a rewrite."""

READ_BATCH: Final = 1000
"""Rows read per query from PostgreSQL."""


def journal_label(journal: str) -> str:
    """The ``journal`` label's value: the log path, or the URL without its password, its
    non-printable characters escaped as every report shows them (an ESC as the text ``\\x1b``)."""
    return shown(redacted(journal))


# --------------------------------------------------------------------------
# Counters: what this process writes
# --------------------------------------------------------------------------


@final
class RunMetrics:
    """An executor observer (`RunObserver`): counts final states, times attempts.

    ``attempt_kernel_attempts_total{state}`` counts each attempt that this
    process moved into a final state; ``attempt_kernel_step_duration_seconds``
    observes its time from Running to that state, by the executor's clock
    (an attempt that never ran, or ran under another process, is counted
    but not timed). Call it from one thread (the executor's event loop).
    """

    def __init__(self, registry: CollectorRegistry, journal: str) -> None:
        label = journal_label(journal)
        attempts = Counter(
            "attempt_kernel_attempts",
            "Attempts that reached a final state, counted by the process that wrote it.",
            ["journal", "state"],
            registry=registry,
        )
        self._attempts: Final = {state_name(s): attempts.labels(label, state_name(s)) for s in FINAL_STATES}
        self._duration: Final = Histogram(
            "attempt_kernel_step_duration_seconds",
            "An attempt's time from Running to its final state.",
            ["journal"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        ).labels(label)
        self._running: Final[dict[tuple[str, str, int], int]] = {}
        """When each attempt this process saw start running did (time_us)."""

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        """Count and time one record the executor appended."""
        match change:
            case AttemptTransitioned():
                self._moved(run, change, time_us)
            case (
                RunStarted() | RunCancelRequested() | RunStopRequested() | RunResumed()
                | AttemptCreated() | IntentPlanned() | IntentChanged() | IntentReconciled()
                | StepResult() | DomainStateSet() | RunFinished() | StepCalled() | WaitStarted()
                | WaitEnded() | SignalSent()
            ):  # fmt: skip
                return
            case _:
                assert_never(change)

    def _moved(self, run: str, change: AttemptTransitioned, time_us: int) -> None:
        key = (run, change.step, change.attempt)
        to = change.to_state
        if not is_terminal(to):  # the kernel says which states are final
            if isinstance(to, Running):  # Admit: the attempt starts to run
                self._running[key] = time_us
            return
        self._attempts[state_name(to)].inc()
        started = self._running.pop(key, None)
        if started is not None:
            self._duration.observe(max(0, time_us - started) / 1e6)


@final
class WorkerMetrics:
    """A worker's own counters (`WorkerWatcher`), and its gauges read at scrape time.

    ``attempt_kernel_claims_total`` counts runs this worker claimed (queued
    ones and taken-over ones alike), ``attempt_kernel_takeovers_total`` those
    of them taken from a worker found dead, and
    ``attempt_kernel_lease_losses_total`` runs it dropped because another
    worker took them (`LeaseLost`).
    """

    def __init__(self, registry: CollectorRegistry, journal: str) -> None:
        label = journal_label(journal)
        self._label: Final = label

        def counter(name: str, text: str) -> Counter:
            return Counter(name, text, ["journal", "worker"], registry=registry)

        self._claims: Final = counter("attempt_kernel_claims", "Runs this worker claimed.")
        self._takeovers: Final = counter(
            "attempt_kernel_takeovers", "Runs this worker took over from a worker found dead."
        )
        self._losses: Final = counter(
            "attempt_kernel_lease_losses", "Runs this worker dropped: another worker holds their lease."
        )
        self.workers: Final[list[str]] = []
        """The ids of the workers started in this process (their slots are gauged)."""

    def started(self, worker: str) -> None:
        """The worker registered: its series start at 0."""
        self.workers.append(worker)
        for family in (self._claims, self._takeovers, self._losses):
            family.labels(self._label, worker)

    def claimed(self, worker: str, run: str, taken_over: bool) -> None:
        """The worker claimed ``run``; ``taken_over``: from a dead worker."""
        self._claims.labels(self._label, worker).inc()
        if taken_over:
            self._takeovers.labels(self._label, worker).inc()

    def lease_lost(self, worker: str, run: str) -> None:
        """The worker dropped ``run``: its lease is another worker's now."""
        self._losses.labels(self._label, worker).inc()


# --------------------------------------------------------------------------
# Gauges: read from the journal at scrape time
# --------------------------------------------------------------------------


@final
class _Standings:
    """A ledger fed incrementally, and where each run it saw stands."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self._line = 0
        self._of: Final[dict[str, RunStanding]] = {}
        self.counts: Final[dict[RunStanding, int]] = dict.fromkeys(STANDINGS, 0)

    def apply(self, items: Iterable[Record | CorruptLine]) -> None:
        """Apply records read after the last ones, numbered on from them (the ledger's check)."""
        ledger = self.ledger
        touched: set[str] = set()
        for item in items:
            self._line += 1
            match item:
                case Record():
                    n = self._line
                    ledger.apply(
                        Record(line=n, seq=n, time_us=item.time_us, run=item.run, change=item.change)
                    )
                    touched.add(item.run)
                case CorruptLine():
                    ledger.corrupt(self._line, item.reason)
                case _:
                    assert_never(item)
        of, counts, runs = self._of, self.counts, ledger.runs
        for run in touched:
            view = runs.get(run)
            if view is None:
                continue
            now = view.standing()
            before = of.get(run)
            if before != now:
                if before is not None:
                    counts[before] -= 1
                counts[now] += 1
                of[run] = now

    def standing(self, run: str) -> RunStanding | None:
        return self._of.get(run)

    def indeterminate(self) -> int:
        """Attempts now Indeterminate with an intent still outstanding: what needs a person."""
        return sum(1 for entry in self.ledger.indeterminate if entry.outstanding)


@final
class _FileSource:
    """The complete lines of a log file past the last one read.

    A log is only appended to, but a file may be rewritten in place (a copy
    restored over it: same inode, same or greater size). So the first and
    the last `CHECK_BYTES` of what was read are kept, and read again at
    their offsets before reading on: bytes that differ mean the file was
    rewritten, and it is read again from its start. (A rewrite that keeps
    both windows byte for byte at the same offsets is not seen; records
    carry their time and sequence number, so a different log does not.)
    """

    def __init__(self, path: str) -> None:
        self.path: Final = path
        self._offset = 0
        self._identity: tuple[int, int] | None = None
        self._head = b""
        """The first bytes read (up to `CHECK_BYTES`), at offset 0."""
        self._tail = b""
        """The last bytes read (up to `CHECK_BYTES`), ending at ``_offset``."""

    def new(self) -> tuple[bool, list[Record | CorruptLine]]:
        """(True when the file must be read from its start again, the new items)."""
        try:
            # Without blocking, and refused unless a regular file: a FIFO put
            # at the path would block the open (and every scrape after it).
            fd = open_regular(Path(self.path), os.O_RDONLY, "for reading")
        except LogOpenError:
            if os.path.exists(self.path):
                raise  # a FIFO, a directory, a device, no permission: the scrape says which
            restart = self._identity is not None
            self._forget(None)
            return restart, []
        with open(fd, "rb") as stream:
            stat = os.fstat(fd)
            identity = (stat.st_dev, stat.st_ino)
            restart = (
                identity != self._identity
                or stat.st_size < self._offset
                or os.pread(fd, len(self._head), 0) != self._head
                or os.pread(fd, len(self._tail), self._offset - len(self._tail)) != self._tail
            )
            if restart:
                self._forget(identity)
            stream.seek(self._offset)
            data = stream.read()
        end = data.rfind(b"\n") + 1  # a torn or half-written last line waits for its end
        if end:
            if len(self._head) < CHECK_BYTES:
                self._head = (self._head + data[:end])[:CHECK_BYTES]
            self._tail = (self._tail + data[:end])[-CHECK_BYTES:]
        self._offset += end
        lines = data[:end].splitlines(keepends=True)
        return restart, [decode_line(raw, 0) for raw in lines]

    def _forget(self, identity: tuple[int, int] | None) -> None:
        self._identity, self._offset, self._head, self._tail = identity, 0, b"", b""

    def live(self) -> bool:
        return writer_listed(self.path)


def _texts(value: object) -> list[str]:
    """A ``text[]`` column as psycopg hands it over, checked."""
    if not isinstance(value, list):
        raise AssertionError(f"expected a text array from the journal, got {value!r}")
    items: list[object] = value  # pyright: ignore[reportUnknownVariableType]  # a list of unknown items
    return [str(item) for item in items]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Hole:
    """Positions ``low`` .. ``high`` not read though a later one was: a commit may still fill them."""

    low: int
    high: int
    found_at: float
    """When (monotonic seconds) the scrape that found it ran."""
    xmax: int
    """That scrape's snapshot ``xmax``: every transaction that could fill it began before."""


@final
class _PgSource:
    """The rows of a PostgreSQL journal not applied yet (see the module doc).

    Each scrape reads the rows past the highest ``pos`` applied, and those
    that came into the holes left below it; a hole is given up once every
    transaction that could still fill it has ended (`SETTLE_S`, ``xmin``).
    """

    def __init__(self, url: str, schema: str) -> None:
        import psycopg
        from psycopg import sql

        from .postgres._journal import CLAIMABLE_NOW, connect, hold_key_head

        self._conn: Final = connect(url)
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._conn.read_only = True
        s = sql.Identifier(schema)
        conn = self._conn

        def statement(text: LiteralString) -> bytes:
            return sql.SQL(text).format(s=s).as_bytes(conn)

        # One round trip for all but the records: the snapshot's bounds, the
        # runs live workers hold, the queue (by the worker's claim's own rule,
        # `CLAIMABLE_NOW`: due, no live worker's, held by no process) and the
        # slots of these workers.
        self._state: Final = statement(
            "SELECT txid_snapshot_xmin(txid_current_snapshot()), txid_snapshot_xmax(txid_current_snapshot()),"
            " ARRAY(SELECT r.run FROM {s}.runs r JOIN {s}.workers w ON w.id = r.owner"
            "  WHERE NOT r.done AND NOT w.dead),"
            " (SELECT count(*) FROM {s}.runs WHERE " + CLAIMABLE_NOW + "),"
            " ARRAY(SELECT worker || ' ' || count(*) FROM {s}.slots WHERE worker = ANY(%(workers)s)"
            "  GROUP BY worker)"
        )
        self._hold: Final = hold_key_head(schema)
        self._rows: Final = statement(
            "SELECT pos, line FROM {s}.records WHERE pos > %s ORDER BY pos LIMIT %s"
        )
        self._filled: Final = statement(
            "SELECT r.pos, r.line FROM unnest(%s::bigint[], %s::bigint[]) AS h(low, high)"
            " JOIN {s}.records r ON r.pos BETWEEN h.low AND h.high ORDER BY r.pos"
        )
        self._top = 0
        """The highest ``pos`` applied."""
        self._holes: list[_Hole] = []
        self.held: frozenset[str] = frozenset()
        self.queue_depth = 0
        self.slots: dict[str, int] = {}

    def scrape(self, workers: Sequence[str], apply: Callable[[list[Record | CorruptLine]], None]) -> None:
        """One snapshot: new rows (handed to ``apply`` in batches), held runs, queue, slots.

        `PgJournalError` when the database fails the read (a session it ended, say).
        """
        import psycopg

        from .postgres._journal import PgJournalError

        try:
            self._read(workers, apply)
        except psycopg.Error as error:
            said = "; ".join(part.strip() for part in str(error).splitlines() if part.strip())
            raise PgJournalError(
                f"reading the journal's gauges failed: {said or type(error).__name__}"
            ) from error

    def _read(self, workers: Sequence[str], apply: Callable[[list[Record | CorruptLine]], None]) -> None:
        conn = self._conn
        with conn.transaction():
            row = conn.execute(self._state, {"workers": list(workers), "hold": self._hold}).fetchone()
            if row is None:
                raise AssertionError("the journal's state query answered no row")
            low, high, held, depth, slots = row
            xmin, xmax = int(str(low)), int(str(high))
            self.held = frozenset(_texts(held))
            self.queue_depth = int(str(depth))
            self.slots = {worker: int(n) for worker, _, n in (s.rpartition(" ") for s in _texts(slots))}
            now = time.monotonic()
            holes = self._holes
            if holes:
                filled = conn.execute(
                    self._filled, ([h.low for h in holes], [h.high for h in holes])
                ).fetchall()
                apply([self._decoded(pos, line) for pos, line in filled])
                for pos, _ in filled:
                    assert type(pos) is int
                    self._fill(pos)
            while True:
                rows = conn.execute(self._rows, (self._top, READ_BATCH)).fetchall()
                items: list[Record | CorruptLine] = []
                for pos, line in rows:
                    items.append(self._decoded(pos, line))
                    assert type(pos) is int
                    if pos > self._top + 1:
                        self._holes.append(_Hole(low=self._top + 1, high=pos - 1, found_at=now, xmax=xmax))
                    self._top = pos
                apply(items)
                if len(rows) < READ_BATCH:
                    break
        self._holes = [h for h in self._holes if not (now - h.found_at >= SETTLE_S and h.xmax <= xmin)]

    @staticmethod
    def _decoded(pos: object, line: object) -> Record | CorruptLine:
        if type(pos) is not int or type(line) is not bytes:
            raise AssertionError(f"the records table answered {pos!r}, {line!r}")
        return decode_line(line, 0)

    def _fill(self, pos: int) -> None:
        """Row ``pos`` came into a hole: the hole is split around it."""
        kept: list[_Hole] = []
        for hole in self._holes:
            if hole.low <= pos <= hole.high:
                for low, high in ((hole.low, pos - 1), (pos + 1, hole.high)):
                    if low <= high:
                        kept.append(_Hole(low=low, high=high, found_at=hole.found_at, xmax=hole.xmax))
            else:
                kept.append(hole)
        self._holes = kept

    def close(self) -> None:
        self._conn.close()


@final
class JournalCollector:
    """The journal's gauges, read when scraped (a ``prometheus_client`` collector).

    ``attempt_kernel_indeterminate_attempts``: attempts now Indeterminate
    with an intent not reconciled (what needs a person);
    ``attempt_kernel_outstanding_intents``: intents Dispatched with no
    recorded outcome; ``attempt_kernel_runs{status}``: runs by where they
    stand, as `attempt-kernel runs` says it. On PostgreSQL also
    ``attempt_kernel_queue_depth`` (runs a worker's claim could take now:
    due, no live worker's, held by no process) and, for the
    workers of ``worker_ids``, ``attempt_kernel_slots_held``.
    """

    def __init__(
        self, journal: str, *, schema: str | None = None, worker_ids: Sequence[str] = ()
    ) -> None:
        self.label: Final = journal_label(journal)
        self._journal: Final = journal
        self._schema: Final = schema
        self._workers: Final = worker_ids
        self._lock: Final = threading.Lock()
        self._standings = _Standings()
        self._file: _FileSource | None = None if _is_url(journal) else _FileSource(journal)
        self._pg: _PgSource | None = None

    def describe(self) -> Iterator[Metric]:
        """The families, without reading the journal (what registering asks for)."""
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        """Read what was appended since the last scrape; the gauges as they stand now."""
        with self._lock:
            families = self._families()
            self._read()
            self._fill(families)
        return iter(families)

    def prime(self) -> None:
        """Read the journal as it is now, so that the first scrape reads only what came since."""
        with self._lock:
            self._read()

    def close(self) -> None:
        """Close the journal connection (PostgreSQL)."""
        with self._lock:
            if self._pg is not None:
                self._pg.close()
                self._pg = None

    def _families(self) -> list[GaugeMetricFamily]:
        journal = ["journal"]
        out = [
            GaugeMetricFamily(
                "attempt_kernel_indeterminate_attempts",
                "Attempts now Indeterminate whose intents are not all reconciled (alert above zero).",
                labels=journal,
            ),
            GaugeMetricFamily(
                "attempt_kernel_outstanding_intents",
                "Intents Dispatched with no recorded outcome.",
                labels=journal,
            ),
            GaugeMetricFamily(
                "attempt_kernel_runs", "Runs by where they stand.", labels=["journal", "status"]
            ),
        ]
        if self._file is None:
            out += [
                GaugeMetricFamily(
                    "attempt_kernel_queue_depth", "Runs a worker's claim could take now.", labels=journal
                ),
                GaugeMetricFamily(
                    "attempt_kernel_slots_held",
                    "Pool slots this worker holds.",
                    labels=["journal", "worker"],
                ),
            ]
        return out

    def _read(self) -> None:
        file = self._file
        if file is not None:
            restart, items = file.new()
            if restart:
                self._standings = _Standings()
            self._standings.apply(items)
            return
        if self._pg is None:
            from .postgres._journal import DEFAULT_SCHEMA

            self._pg = _PgSource(self._journal, self._schema or DEFAULT_SCHEMA)
        try:
            self._pg.scrape(self._workers, self._standings.apply)
        except BaseException:
            self._pg.close()  # the next scrape connects afresh and reads what it missed
            self._pg = None
            raise

    def _fill(self, families: list[GaugeMetricFamily]) -> None:
        label = self.label
        standings = self._standings
        ledger = standings.ledger
        families[0].add_metric([label], standings.indeterminate())
        families[1].add_metric([label], ledger.unresolved_intents)
        counts = dict(standings.counts)
        # "running" is the unfinished runs a writer holds now, as the CLI says it.
        pg, file = self._pg, self._file
        if pg is not None:
            for run in pg.held:
                if standings.standing(run) == "interrupted":
                    counts["interrupted"] -= 1
                    counts["running"] += 1
        elif file is not None and file.live():
            counts["running"] += counts["interrupted"]
            counts["interrupted"] = 0
        for status in STANDINGS:
            families[2].add_metric([label, status], counts[status])
        if pg is not None:
            families[3].add_metric([label], pg.queue_depth)
            for worker in self._workers:
                families[4].add_metric([label, worker], pg.slots.get(worker, 0))


# --------------------------------------------------------------------------
# Exposition
# --------------------------------------------------------------------------


def journal_registry(journal: str, *, schema: str | None = None) -> tuple[CollectorRegistry, JournalCollector]:
    """A registry holding only the journal's gauges (no process's counters)."""
    registry = CollectorRegistry(auto_describe=True)
    collector = JournalCollector(journal, schema=schema)
    registry.register(collector)
    return registry, collector


def metrics_app(journal: str) -> Callable[[], tuple[bytes, str]]:
    """A ``/metrics`` page for a journal (a log path or a PostgreSQL URL): call it per scrape.

    It returns the text exposition and its content type: the journal's
    gauges (no counters: a web view writes no attempt). The journal is
    read incrementally across calls; calls from several threads take turns.
    """
    registry, _ = journal_registry(journal)

    def page() -> tuple[bytes, str]:
        return generate_latest(registry), CONTENT_TYPE

    return page


@final
class WorkerExposition:
    """Everything a worker serves at ``/metrics``: its counters and the journal's gauges.

    Pass `observer` to the worker's executors and `watcher` to the worker;
    `serve` starts the HTTP server (a daemon thread) before the worker claims anything.
    """

    def __init__(self, journal: str, *, schema: str | None = None) -> None:
        self.registry: Final = CollectorRegistry(auto_describe=True)
        self.observer: Final = RunMetrics(self.registry, journal)
        self.watcher: Final = WorkerMetrics(self.registry, journal)
        self.gauges: Final = JournalCollector(journal, schema=schema, worker_ids=self.watcher.workers)
        self.registry.register(self.gauges)

    def page(self) -> tuple[bytes, str]:
        """One scrape: the text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE

    def serve(self, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; return the address bound.

        Raises `OSError` when the port cannot be bound (in use, or not allowed).
        """
        from prometheus_client import start_http_server

        server, _ = start_http_server(port, addr=host, registry=self.registry)
        address = server.server_address
        threading.Thread(target=self._prime, name="metrics-prime", daemon=True).start()
        return str(address[0]), int(address[1])

    def _prime(self) -> None:
        # A long journal's first read can outlast a scraper's timeout: read it
        # now, beside the worker starting, rather than in the first scrape.
        try:
            self.gauges.prime()
        except Exception:  # noqa: BLE001  # the first scrape meets and reports the same error
            return
