"""Group commit in the file store: `RunLogWriter.durable` waiters share one fsync.

The fsyncs are counted by an injected `FileOps`, and held on
``threading.Event``s so that waiters pile up behind one in flight: every
test waits on events, none on time. A held fsync must run on the flush
thread (inline, it would block the loop the test goes on in), so these
tests pin ``flush_on = "alone"``, where every group's fsync goes there;
the default, ``"timed"``, picks inline or the thread by how long fsyncs
take, on a clock the tests that check it bring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import gc
import os
import sys
import threading
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from attempt_kernel import (
    AttemptCreated,
    AttemptTransitioned,
    Change,
    EffectFinding,
    IntentReconciled,
    EffectNotHappened,
    Executor,
    Indeterminate,
    IntentChanged,
    LogWriteFailed,
    Record,
    RetryPolicy,
    RunControl,
    RunLogWriter,
    RunReport,
    RunStarted,
    StepContext,
    Workflow,
    is_terminal,
    read_log,
    recover_log,
    replay,
)
from attempt_kernel._logfile import BATCH_CAP, BATCH_TURNS, INLINE_FSYNC_S, PROBE_EVERY
from attempt_kernel._records import JSON
from attempt_kernel._workflow import Step, load_workflow

# Long enough never to fire on a loaded machine; only a hung test reaches it.
HUNG = 60.0


@pytest.fixture(autouse=True)
def groups_fsync_on_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every group's fsync on the flush thread, where a test can hold it (see the module doc)."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "alone")


class HeldOps:
    """Real writes and fsyncs; the n-th fsync (1-based) in ``hold`` first says it has
    begun (``began[n]``), then waits for ``release[n]``; ``fail`` makes fsyncs raise EIO."""

    def __init__(self, hold: tuple[int, ...] = (), fail: bool = False) -> None:
        self.fsyncs = 0
        self.began = {n: threading.Event() for n in hold}
        self.release = {n: threading.Event() for n in hold}
        self.fail = fail

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        n = self.fsyncs
        if n in self.began:
            self.began[n].set()
            assert self.release[n].wait(HUNG), "the test never released the fsync"
        if self.fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)


async def began(event: threading.Event) -> None:
    """Wait, off the loop, until the flush thread says its fsync began."""
    assert await asyncio.to_thread(event.wait, HUNG), "the fsync never began"


async def how_they_end(waiters: list[asyncio.Task[None]]) -> list[str]:
    """How each waiter ends: the name of the exception it raised, or "NoneType" when it returned."""
    done = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), HUNG)
    return [type(d).__name__ for d in done]


async def waiting(log: RunLogWriter, ops: HeldOps, runs: int, fsync: int = 1) -> list[asyncio.Task[None]]:
    """Runs ``r0``, ``r1``, ... each appended and waiting in durable(), once the held
    fsync number ``fsync`` has begun on the flush thread."""
    for i in range(runs):
        log.append(f"r{i}", RunStarted(workflow="w"))
    waiters = [asyncio.ensure_future(log.durable(f"r{i}")) for i in range(runs)]
    await began(ops.began[fsync])
    return waiters


def test_concurrent_waiters_are_released_by_one_fsync(tmp_path: Path) -> None:
    """Ten waiters on records all written before the fsync began share that one fsync."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> list[int]:
        waiters = await waiting(log, ops, 10)
        assert not any(w.done() for w in waiters)  # all held behind the fsync in flight
        ops.release[1].set()
        await asyncio.gather(*waiters)
        return [ops.fsyncs]

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        assert asyncio.run(main(log)) == [1]


def test_a_record_written_after_the_fsync_began_waits_for_the_next(tmp_path: Path) -> None:
    """A waiter whose record came after the fsync in flight began is released by the next fsync only."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> tuple[list[int], int]:
        async def wait(run: str) -> int:
            await log.durable(run)
            return ops.fsyncs  # which fsync released it

        log.append("a", RunStarted(workflow="w"))
        log.append("b", RunStarted(workflow="w"))
        first = [asyncio.ensure_future(wait("a")), asyncio.ensure_future(wait("b"))]
        await began(ops.began[1])
        log.append("c", RunStarted(workflow="w"))  # while the first fsync is in flight
        late = asyncio.ensure_future(wait("c"))
        ops.release[1].set()
        return list(await asyncio.gather(*first)), await late

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        assert asyncio.run(main(log)) == ([1, 1], 2)


class TimedOps:
    """Real writes and fsyncs on a clock of the test's own: each fsync takes
    ``takes`` seconds of it, and notes whether it ran inline (on the loop's thread)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.takes = 0.0
        self.inline: list[bool] = []

    def clock(self) -> float:
        return self.now

    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.inline.append(threading.current_thread() is threading.main_thread())
        os.fsync(fd)
        self.now += self.takes


async def one_group(log: RunLogWriter, name: str) -> None:
    """Three runs appended, then all three waiting in durable(): one group, one fsync."""
    for i in range(3):
        log.append(f"{name}-{i}", RunStarted(workflow="w"))
    await asyncio.gather(*(log.durable(f"{name}-{i}") for i in range(3)))


async def lone(log: RunLogWriter, name: str) -> None:
    """One run appended and waiting in durable() alone: its own fsync, inline."""
    log.append(name, RunStarted(workflow="w"))
    await log.durable(name)


@pytest.fixture
def timed_ops(monkeypatch: pytest.MonkeyPatch) -> TimedOps:
    """`TimedOps` timing every fsync made on the loop's thread, under the default
    ``flush_on = "timed"`` (the module's autouse fixture pins "alone" elsewhere)."""
    assert (INLINE_FSYNC_S, PROBE_EVERY) == (0.001, 8)
    monkeypatch.setattr(RunLogWriter, "flush_on", "timed")
    ops = TimedOps()
    monkeypatch.setattr("attempt_kernel._logfile._fsync_clock", ops.clock)
    return ops


def test_a_group_fsyncs_inline_while_fsyncs_are_fast_and_on_the_thread_while_they_are_slow(
    tmp_path: Path, timed_ops: TimedOps
) -> None:
    """Under the default ``flush_on = "timed"``: a group's fsync runs inline until the
    running average of the fsyncs' times (each new one weighs a quarter) reaches
    INLINE_FSYNC_S (1 ms), then on the flush thread until it falls below again.
    The average starts at 0; only fsyncs made on the loop's thread feed it (a
    lone waiter's, a group's while inline); a threaded one's time is not counted."""
    ops = timed_ops

    async def main(log: RunLogWriter) -> None:
        # 1: the average starts at 0: inline; 3 ms lifts it to 0.75 ms only
        ops.takes = 0.003
        await one_group(log, "a")
        # 2: still under 1 ms: inline; 8 ms lifts it to 2.5625 ms
        ops.takes = 0.008
        await one_group(log, "b")
        # 3-9: on the thread; each takes 0.1 ms, not counted: still 2.5625 ms
        ops.takes = 0.0001
        for n in range(7):
            await one_group(log, f"c{n}")
        # 10: the eighth group on the thread is a probe, inline: 1.947 ms
        await one_group(log, "d")
        # 11-15: lone waiters, inline: 1.485, 1.139, 0.879, 0.684, 0.538 ms
        for n in range(5):
            await lone(log, f"e{n}")
        # 16: under 1 ms: a group inline again; the average falls to 0.429 ms
        await one_group(log, "f")
        # 17: a lone waiter; its fsync takes 4 ms, as do all from here, and
        # lifts the average to 1.322 ms
        ops.takes = 0.004
        await lone(log, "g")
        # 18, 19: on the thread, not counted: still 1.322 ms
        await one_group(log, "h")
        await one_group(log, "i")
        # 20: a lone waiter is inline whatever the average says: 1.991 ms
        await lone(log, "j")
        # 21: so the next group is on the thread
        await one_group(log, "k")

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        asyncio.run(main(log))
    assert ops.inline == [True, True] + [False] * 7 + [True] * 8 + [False, False, True, False]


def test_while_groups_are_on_the_thread_every_eighth_is_an_inline_probe(
    tmp_path: Path, timed_ops: TimedOps
) -> None:
    """Under ``flush_on = "timed"``, while the average keeps groups on the flush
    thread, every PROBE_EVERY-th group (8) fsyncs inline, and its time alone
    feeds the average (a threaded fsync's may include waiting for the
    interpreter lock): a probe that finds the disk slow keeps groups on the
    thread, and probes that find it fast bring them back inline."""
    ops = timed_ops

    async def main(log: RunLogWriter) -> None:
        # 1: inline (the average starts at 0); 8 ms lifts it to 2 ms
        ops.takes = 0.008
        await one_group(log, "a")
        # 2-8: on the thread, 10 ms each, not counted: still 2 ms
        ops.takes = 0.010
        for n in range(7):
            await one_group(log, f"b{n}")
        # 9: the eighth group since the average went above 1 ms: a probe,
        # inline; its 10 ms lifts the average to 4 ms
        await one_group(log, "c")
        # 10-16 on the thread, then 17 a probe; the disk is fast from here
        # (0.1 ms), which only the probes count: 3.025 ms after 17
        for n in range(7):
            await one_group(log, f"d{n}")
        ops.takes = 0.0001
        await one_group(log, "e")
        # five more rounds of seven on the thread and a probe (18-57); the
        # probes bring the average to 2.294, 1.745, 1.334, 1.025 (49: still
        # not under 1 ms) and 0.794 ms (57)
        for n in range(5 * 8):
            await one_group(log, f"f{n}")
        # 58: under 1 ms: inline
        await one_group(log, "g")

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        asyncio.run(main(log))
    assert ops.inline == [True] + [False] * 7 + [True] + ([False] * 7 + [True]) * 6 + [True]


def test_a_waiter_with_nothing_new_returns_without_an_fsync(tmp_path: Path) -> None:
    """durable() after flush(), with no append between, makes no fsync."""
    ops = HeldOps()
    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        log.append("r", RunStarted(workflow="w"))
        log.flush()
        asyncio.run(log.durable("r"))
        assert ops.fsyncs == 1


def test_a_lone_waiter_is_made_durable(tmp_path: Path) -> None:
    """One waiter alone gets its own fsync (inline) and returns."""
    ops = HeldOps()
    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        log.append("r", RunStarted(workflow="w"))
        asyncio.run(log.durable("r"))
        assert ops.fsyncs == 1


def test_lone_waiters_stop_gathering_and_gathering_comes_back_with_company(tmp_path: Path) -> None:
    """After LONE_GATHERS gathers that found no other waiter, a lone waiter fsyncs at once,
    without giving the loop a turn; when runs come back (each appending, then waiting, in
    one turn of the loop), a probe gather finds them within LONE_GATHERS waits, and from
    then on they share fsyncs again."""
    from attempt_kernel._logfile import LONE_GATHERS

    ops = HeldOps()

    async def main(log: RunLogWriter) -> tuple[list[int], list[int]]:
        ticks = [0]

        async def ticker() -> None:
            while True:
                await asyncio.sleep(0)
                ticks[0] += 1

        ticking = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        turns: list[int] = []  # loop turns each lone wait gave away
        for i in range(LONE_GATHERS + 3):
            log.append(f"lone{i}", RunStarted(workflow="w"))
            before = ticks[0]
            await log.durable(f"lone{i}")
            turns.append(ticks[0] - before)

        async def run(name: str) -> None:
            log.append(name, RunStarted(workflow="w"))
            await log.durable(name)

        fsyncs: list[int] = []  # fsyncs each round of ten runs took
        for round in range(LONE_GATHERS + 2):
            before = ops.fsyncs
            await asyncio.gather(*(run(f"r{round}-{i}") for i in range(10)))
            fsyncs.append(ops.fsyncs - before)
        ticking.cancel()
        return turns, fsyncs

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        turns, fsyncs = asyncio.run(main(log))
    # the first LONE_GATHERS lone waits gathered (a turn at least), the next did not
    assert all(t >= 1 for t in turns[:LONE_GATHERS]), turns
    assert turns[LONE_GATHERS + 1 :] == [0, 0], turns
    # the ten runs of a round share one fsync again by the second round at the latest
    assert fsyncs[1:] == [1] * (LONE_GATHERS + 1), fsyncs
    assert 1 <= fsyncs[0] <= LONE_GATHERS, fsyncs


async def two_waiters_held(log: RunLogWriter, ops: HeldOps) -> list[asyncio.Task[None]]:
    """Runs ``a`` and ``b`` appended and waiting in durable(), behind fsync 1 held on the flush thread."""
    log.append("a", RunStarted(workflow="w"))
    log.append("b", RunStarted(workflow="w"))
    waiters = [asyncio.ensure_future(log.durable(r)) for r in ("a", "b")]
    await began(ops.began[1])
    return waiters


def left_gathering(loop: asyncio.AbstractEventLoop, log: RunLogWriter, *runs: str) -> list[asyncio.Task[None]]:
    """``runs`` appended and waiting in durable() in ``loop``, which then stops after one
    turn: the first leads and has begun gathering, the others have joined it."""
    for run in runs:
        log.append(run, RunStarted(workflow="w"))
    waiters = [loop.create_task(log.durable(run)) for run in runs]
    loop.call_soon(loop.stop)
    loop.run_forever()
    return waiters


async def turns(n: int) -> None:
    """Give the event loop ``n`` turns."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_in_a_loop_a_due_batch_fsync_comes_a_few_turns_later_and_once(tmp_path: Path) -> None:
    """Inside an event loop, appends past ``batch_size`` with no one waiting make no fsync
    at once: one fsync follows, BATCH_TURNS turns of the loop after the first, for all of them."""
    ops = HeldOps()

    async def main(log: RunLogWriter) -> list[int]:
        seen: list[int] = []
        for i in range(5):  # batch_size 3: due at the third and still at the fourth and fifth
            log.append(f"r{i}", RunStarted(workflow="w"))
        seen.append(ops.fsyncs)
        for _ in range(BATCH_TURNS):
            await asyncio.sleep(0)
            seen.append(ops.fsyncs)
        await log.durable("r4")  # everything is covered: no fsync of its own
        seen.append(ops.fsyncs)
        return seen

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=3) as log:
        assert asyncio.run(main(log)) == [0] * BATCH_TURNS + [1, 1]


def test_appends_past_the_batch_while_callers_wait_are_left_to_their_group_fsync(tmp_path: Path) -> None:
    """With waiters of durable() behind an fsync in flight, appends past ``batch_size`` make no
    fsync of their own: the next group's one fsync covers them (two fsyncs in all, not three)."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> int:
        first = await two_waiters_held(log, ops)
        for i in range(5):  # batch_size 3, with the two waiters held
            log.append(f"c{i}", RunStarted(workflow="w"))
        late = [asyncio.ensure_future(log.durable(f"c{i}")) for i in (3, 4)]
        await turns(2 * BATCH_TURNS)
        in_flight_only = ops.fsyncs
        ops.release[1].set()
        await asyncio.gather(*first, *late)
        assert in_flight_only == 1  # only the held one, before its release
        return ops.fsyncs

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=3) as log:
        assert asyncio.run(main(log)) == 2


def test_a_batch_left_to_waiters_who_all_leave_is_fsynced_all_the_same(tmp_path: Path) -> None:
    """Records past ``batch_size`` appended while waiters were held, and that no waiter needed,
    are fsynced once the last waiter has left (its fsync did not cover them)."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> list[int]:
        waiters = await two_waiters_held(log, ops)
        for i in range(4):  # past batch_size 3 since fsync 1 began, and no one waits on them
            log.append(f"c{i}", RunStarted(workflow="w"))
        ops.release[1].set()
        await asyncio.gather(*waiters)
        seen = [ops.fsyncs]
        await turns(BATCH_TURNS + 1)
        seen.append(ops.fsyncs)
        await log.durable("c3")  # covered by then: no fsync of its own
        seen.append(ops.fsyncs)
        return seen

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=3) as log:
        assert asyncio.run(main(log)) == [1, 2, 2]


def test_a_batch_left_to_cancelled_waiters_is_fsynced_all_the_same(tmp_path: Path) -> None:
    """Waiters cancelled behind a held fsync, with records past ``batch_size`` appended meanwhile:
    the batch fsync still comes, a few turns of the loop after they left."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> list[int]:
        waiters = await two_waiters_held(log, ops)
        for i in range(4):
            log.append(f"c{i}", RunStarted(workflow="w"))
        for w in waiters:
            w.cancel()
        done = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(d, asyncio.CancelledError) for d in done)
        await turns(BATCH_TURNS + 1)
        seen = [ops.fsyncs]  # the batch fsync, made while fsync 1 is still held
        ops.release[1].set()
        return seen

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=3) as log:
        assert asyncio.run(main(log)) == [2]
        assert ops.fsyncs == 2  # close found everything covered


def test_past_batch_cap_batches_an_append_fsyncs_at_once_even_in_one_turn(tmp_path: Path) -> None:
    """However long a turn of the loop runs without yielding, the batch fsync put off for a
    group is made by the append that takes BATCH_CAP batches past the last fsync's start."""
    ops = HeldOps()

    async def main(log: RunLogWriter) -> list[int]:
        for i in range(BATCH_CAP * 2 - 1):  # batch_size 2
            log.append(f"r{i}", RunStarted(workflow="w"))
        seen = [ops.fsyncs]
        log.append("last", RunStarted(workflow="w"))
        seen.append(ops.fsyncs)
        return seen

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=2) as log:
        assert asyncio.run(main(log)) == [0, 1]


def test_outside_a_loop_the_batch_fsync_is_inline_even_with_waiters_left_in_one(tmp_path: Path) -> None:
    """Waiters of durable() held in a loop that is not running leave nothing to put a batch
    fsync off for: appends made outside any loop fsync at the batch, as before."""
    ops = HeldOps(hold=(1,))
    loop = asyncio.new_event_loop()
    try:
        with RunLogWriter(tmp_path / "log", ops=ops, batch_size=3) as log:
            log.append("a", RunStarted(workflow="w"))
            log.append("b", RunStarted(workflow="w"))
            waiters = [loop.create_task(log.durable(r)) for r in ("a", "b")]
            loop.run_until_complete(began(ops.began[1]))  # the loop stops; the waiters stay
            for i in range(3):
                log.append(f"c{i}", RunStarted(workflow="w"))
            inline = ops.fsyncs
            ops.release[1].set()
            loop.run_until_complete(asyncio.gather(*waiters))
        assert inline == 2  # the held one, and the batch's own
    finally:
        loop.close()


def test_a_batch_fsync_made_late_that_fails_breaks_the_writer_for_the_next_append(tmp_path: Path) -> None:
    """The batch fsync made at the end of a few turns of the loop has no caller to raise to: when
    it fails, the writer breaks, and the next append (or wait) raises LogWriteFailed."""
    ops = HeldOps(fail=True)

    async def main(log: RunLogWriter) -> list[str]:
        for i in range(3):  # batch_size 3: due, put off
            log.append(f"r{i}", RunStarted(workflow="w"))
        await turns(BATCH_TURNS + 1)
        seen = [str(ops.fsyncs)]
        with pytest.raises(LogWriteFailed, match="fsync after record seq 3 failed"):
            log.append("late", RunStarted(workflow="w"))
        with pytest.raises(LogWriteFailed, match="fsync after record seq 3 failed"):
            await log.durable("r2")
        seen.append("refused")
        return seen

    log = RunLogWriter(tmp_path / "log", ops=ops, batch_size=3)
    try:
        assert asyncio.run(main(log)) == ["1", "refused"]
    finally:
        log.close()  # a broken writer closes without another fsync
    assert ops.fsyncs == 1


def test_a_failed_fsync_raises_in_every_waiter_of_it_and_breaks_the_writer(tmp_path: Path) -> None:
    """Every waiter of a failed fsync gets LogWriteFailed, and the writer then refuses appends."""
    ops = HeldOps(hold=(1,), fail=True)

    async def main(log: RunLogWriter) -> list[str]:
        waiters = await waiting(log, ops, 3)
        ops.release[1].set()
        return await how_they_end(waiters)

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        assert asyncio.run(main(log)) == ["LogWriteFailed"] * 3
        with pytest.raises(LogWriteFailed):
            log.append("r0", AttemptCreated(step="s", attempt=1))


def test_close_waits_for_the_fsync_in_flight(tmp_path: Path) -> None:
    """close() during an fsync of durable() waits for it: the waiters are released, not failed."""
    ops = HeldOps(hold=(1,))
    log = RunLogWriter(tmp_path / "log", ops=ops)

    async def main() -> list[str]:
        waiters = await waiting(log, ops, 2)
        threading.Timer(0.0, ops.release[1].set).start()  # close() blocks the loop
        log.close()
        return await how_they_end(waiters)

    assert asyncio.run(main()) == ["NoneType", "NoneType"]
    assert ops.fsyncs == 1  # close found everything covered by the one in flight


def test_the_writer_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    """Two asyncio.run calls in a row, each grouping waiters, on one writer."""
    ops = HeldOps(hold=(1, 2))

    async def main(log: RunLogWriter, n: int) -> None:
        waiters = await waiting(log, ops, 3, n)
        ops.release[n].set()
        await asyncio.gather(*waiters)

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        asyncio.run(main(log, 1))
        asyncio.run(main(log, 2))
        assert ops.fsyncs == 2


def test_a_waiter_cancelled_behind_the_fsync_in_flight_leaves_it_to_the_others(tmp_path: Path) -> None:
    """Cancelling one waiter ends its wait only: the fsync in flight goes on and releases the rest."""
    ops = HeldOps(hold=(1,))

    async def main(log: RunLogWriter) -> list[str]:
        waiters = await waiting(log, ops, 3)
        waiters[1].cancel()
        await turns(1)
        ops.release[1].set()
        return await how_they_end(waiters)

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        assert asyncio.run(main(log)) == ["NoneType", "CancelledError", "NoneType"]
        assert ops.fsyncs == 1


def test_a_waiter_cancelled_while_its_leader_gathers_leaves_the_group_whole(tmp_path: Path) -> None:
    """Waiters that joined a gathering leader wait for it; one of them cancelled meanwhile
    takes nothing from the others, who share the leader's one fsync."""
    ops = HeldOps()

    async def main(log: RunLogWriter) -> list[str]:
        waiters: list[asyncio.Task[None]] = []
        for i in range(3):
            log.append(f"r{i}", RunStarted(workflow="w"))
            waiters.append(asyncio.ensure_future(log.durable(f"r{i}")))
        await turns(1)  # the first leads and gathers; the other two joined it
        waiters[2].cancel()
        return await how_they_end(waiters)

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        assert asyncio.run(main(log)) == ["NoneType", "NoneType", "CancelledError"]
        assert ops.fsyncs == 1


def test_a_waiter_in_another_loop_is_released_by_the_fsync_a_stopped_loop_began(tmp_path: Path) -> None:
    """An fsync begun by waiters of a loop that then stopped still ends the wait of a waiter in
    the next loop (which then gets an fsync of its own for its record); the stopped loop's
    waiters are released when it runs again."""
    ops = HeldOps(hold=(1,))
    first = asyncio.new_event_loop()
    try:
        with RunLogWriter(tmp_path / "log", ops=ops) as log:
            log.append("a", RunStarted(workflow="w"))
            log.append("b", RunStarted(workflow="w"))
            stranded = [first.create_task(log.durable(r)) for r in ("a", "b")]
            first.run_until_complete(began(ops.began[1]))  # the loop stops; fsync 1 in flight

            async def next_loop() -> int:
                log.append("c", RunStarted(workflow="w"))
                waiter = asyncio.ensure_future(log.durable("c"))
                await turns(1)
                ops.release[1].set()
                await asyncio.wait_for(waiter, HUNG)
                return ops.fsyncs

            assert asyncio.run(next_loop()) == 2  # fsync 1 ended its wait; fsync 2 covered "c"
            first.run_until_complete(asyncio.wait_for(asyncio.gather(*stranded), HUNG))
            assert ops.fsyncs == 2
    finally:
        first.close()


def test_a_waiter_whose_gathering_leader_is_stranded_in_a_stopped_loop_fsyncs_itself(
    tmp_path: Path,
) -> None:
    """A leader left gathering in a loop that stopped cannot lead a waiter of another loop:
    that waiter fsyncs at once instead of waiting for it."""
    ops = HeldOps()
    first = asyncio.new_event_loop()
    try:
        with RunLogWriter(tmp_path / "log", ops=ops) as log:
            [leader] = left_gathering(first, log, "a")
            assert not leader.done() and ops.fsyncs == 0

            async def next_loop() -> None:
                log.append("b", RunStarted(workflow="w"))
                await asyncio.wait_for(log.durable("b"), HUNG)

            asyncio.run(next_loop())
            assert ops.fsyncs == 1  # "a" and "b" both covered by it
            first.run_until_complete(asyncio.wait_for(leader, HUNG))
            assert ops.fsyncs == 1
    finally:
        first.close()


def test_cancelled_waits_behind_a_held_fsync_leave_nothing_behind(tmp_path: Path) -> None:
    """Callers that give up waiting (a timeout around durable) again and again behind one
    fsync that does not end take no memory with them: each cancelled wait is gone at once,
    not when the fsync ends."""
    ops = HeldOps(hold=(1,))
    waits = 5_000

    async def main(log: RunLogWriter) -> int:
        held = await two_waiters_held(log, ops)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(waits):
                waiter = asyncio.ensure_future(log.durable("a"))
                await turns(2)  # parked behind the held fsync
                waiter.cancel()
                await turns(1)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        ops.release[1].set()
        await asyncio.wait_for(asyncio.gather(*held), HUNG)
        return grown

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        grown = asyncio.run(main(log))
    # one wait left behind is about 150 bytes: 750 kB for all of them
    assert grown < 100_000, f"{grown} bytes still held after {waits} cancelled waits"


def test_waiters_of_a_new_loop_share_fsyncs_after_a_leader_was_left_in_a_closed_one(
    tmp_path: Path,
) -> None:
    """A leader left gathering in a loop that was then closed never comes back: waiters of the
    next loop gather among themselves again and share one fsync."""
    ops = HeldOps()
    first = asyncio.new_event_loop()
    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        [leader] = left_gathering(first, log, "a")
        first.close()
        assert not leader.done() and ops.fsyncs == 0

        async def run(i: int) -> None:  # appends when it runs, then waits
            log.append(f"r{i}", RunStarted(workflow="w"))
            await log.durable(f"r{i}")

        async def next_loop() -> None:
            runs = [asyncio.ensure_future(run(i)) for i in range(5)]
            await asyncio.wait_for(asyncio.gather(*runs), HUNG)

        asyncio.run(next_loop())
        assert ops.fsyncs == 1
        del leader  # the closed loop's task, never to run again


def test_a_leader_and_its_group_dropped_with_their_closed_loop_leave_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader gathering and a waiter that joined it, stranded in a loop that was closed:
    when the program drops them, the leader's release of its group (run as its coroutine
    is closed) meets the waiter leaving that group at the same moment, and neither raises."""
    unraisable: list[str] = []

    def hook(raised: sys.UnraisableHookArgs) -> None:
        unraisable.append(repr(raised.exc_value))

    monkeypatch.setattr(sys, "unraisablehook", hook)
    ops = HeldOps()
    first = asyncio.new_event_loop()
    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        leader, joined = left_gathering(first, log, "a", "b")
        first.close()
        assert not leader.done() and not joined.done() and ops.fsyncs == 0
        del joined  # now held only by the leader's group
        del leader  # closes the leader's coroutine, which releases its group
        gc.collect()
        log.append("c", RunStarted(workflow="w"))
        asyncio.run(asyncio.wait_for(log.durable("c"), HUNG))  # the writer still serves
    assert unraisable == []
    assert ops.fsyncs == 1


class EffectsLog:
    """HeldOps for the executor: the first fsync waits (on the flush thread) until
    every run has written its Dispatched, then fails with EIO (inline, every run has
    written it by the time the group's fsync begins)."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.dispatched = 0
        self.all_dispatched = threading.Event()
        self.fsyncs = 0
        self.inline: list[bool] = []  # for each fsync: was it made on the loop's thread?

    def write(self, fd: int, data: bytes) -> int:
        if b'"to":"Dispatched"' in data:
            self.dispatched += 1
            if self.dispatched == self.runs:
                self.all_dispatched.set()
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        self.inline.append(threading.current_thread() is threading.main_thread())
        assert self.all_dispatched.wait(HUNG), "not every run reached its effect"
        raise OSError(errno.EIO, os.strerror(errno.EIO))


@pytest.mark.parametrize("flush_on", ["thread", "timed"])
def test_a_failed_group_fsync_fails_every_waiting_attempt_and_sends_no_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush_on: str
) -> None:
    """Five runs, one effect each, all waiting on a failing fsync: every run raises
    LogWriteFailed, no effect is sent, the writer refuses appends, and the log recovers clean.

    Under ``"thread"`` every fsync is on the flush thread, and the held one
    does not block the loop while the other runs reach their effects. Under
    ``"timed"`` (the default) the group's first fsync runs inline, on the
    loop, once the group has gathered all five.
    """
    monkeypatch.setattr(RunLogWriter, "flush_on", flush_on)
    sent: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            return None

        return await ctx.effect("pay", send)

    workflow = load_workflow("w", [Step(name="s", run=pay)])
    path = tmp_path / "log"
    ops = EffectsLog(runs=5)

    async def main(log: RunLogWriter) -> list[str]:
        executor = Executor(log)
        runs = [executor.run(workflow, f"r{i}") for i in range(5)]
        return [type(r).__name__ for r in await asyncio.gather(*runs, return_exceptions=True)]

    with RunLogWriter(path, ops=ops) as log:
        assert asyncio.run(main(log)) == ["LogWriteFailed"] * 5
        assert (ops.dispatched, ops.fsyncs, sent) == (5, 1, [])
        assert ops.inline == [flush_on == "timed"]
        with pytest.raises(LogWriteFailed):
            log.append("r0", AttemptCreated(step="s", attempt=2))
    writer, recovery = recover_log(path, {"w": workflow})
    writer.close()
    assert sorted(r.run for r in recovery.runs) == ["r0", "r1", "r2", "r3", "r4"]
    assert replay(path).valid


class Ended:
    """An observer that sets ``ended`` once ``after`` attempts have reached a terminal state."""

    def __init__(self, after: int = 1) -> None:
        self.left = after
        self.ended = asyncio.Event()

    def record_written(self, run: str, change: Change, time_us: int) -> None:
        if isinstance(change, AttemptTransitioned) and is_terminal(change.to_state):
            self.left -= 1
            if self.left == 0:
                self.ended.set()


def effect_run(
    sent: list[str], step_deadline: float = 60.0, retry: RetryPolicy | None = None, hangs: bool = False
) -> Workflow:
    """One step, ``s``, that sends one effect, ``pay`` (noted in ``sent``); with ``hangs``
    the downstream service never answers."""

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            if hangs:
                await asyncio.sleep(HUNG)
            return None

        return await ctx.effect("pay", send)

    step = Step(name="s", run=pay, step_deadline=step_deadline, retry=retry or RetryPolicy())
    return load_workflow("w", [step])


def intent_moves(path: Path) -> list[tuple[str, str]]:
    return [
        (type(r.change.cause).__name__, type(r.change.to_state).__name__)
        for r in read_log(path)
        if isinstance(r, Record) and isinstance(r.change, (IntentChanged, AttemptTransitioned))
    ]


@pytest.mark.parametrize("how", ["cancel", "stop"])
def test_an_attempt_interrupted_while_its_dispatched_waits_for_the_fsync_rejects_the_effect(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel or a stop while the effect's Dispatched waits for its fsync: the effect was
    never sent, so the intent is recorded Rejected and the attempt ends Cancelled, not Indeterminate."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")  # the held fsync must not block the loop
    ops = HeldOps(hold=(1,))
    sent: list[str] = []
    path = tmp_path / "log"

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        executor = Executor(log, observers=[ended])
        control = RunControl()
        running = asyncio.ensure_future(executor.run(effect_run(sent), "r", control=control))
        await began(ops.began[1])  # the Dispatched's fsync is in flight
        if how == "cancel":
            control.cancel("the test cancels")
        else:
            executor.stop("the test stops", grace=0.0)
        await asyncio.wait_for(ended.ended.wait(), HUNG)
        ops.release[1].set()
        return await running

    with RunLogWriter(path, ops=ops) as log:
        report = asyncio.run(main(log))
    assert sent == []
    assert report.status == ("cancelled" if how == "cancel" else "interrupted")
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Reject", "Rejected"),
        ("Cancel", "Cancelled"),
    ]
    assert replay(path).valid


def test_a_deadline_passing_while_the_dispatched_waits_for_the_fsync_rejects_the_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step deadline passing while the Dispatched waits for its fsync: Rejected, then
    TimedOut with nothing outstanding, so the step runs again and sends its effect once."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")
    ops = HeldOps(hold=(1,))
    sent: list[str] = []
    path = tmp_path / "log"
    retry = RetryPolicy(max_attempts=2, initial_interval=0.0)

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        executor = Executor(log, observers=[ended])
        running = asyncio.ensure_future(
            executor.run(effect_run(sent, step_deadline=0.05, retry=retry), "r")
        )
        await began(ops.began[1])
        await asyncio.wait_for(ended.ended.wait(), HUNG)  # the deadline passed meanwhile
        ops.release[1].set()
        return await running

    with RunLogWriter(path, ops=ops) as log:
        report = asyncio.run(main(log))
    assert report.status == "succeeded" and len(sent) == 1
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Reject", "Rejected"),
        ("StepDeadlinePassed", "TimedOut"),
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Confirm", "Confirmed"),
        ("Succeed", "Succeeded"),
    ]
    assert replay(path).valid


def gathered_with_a_failure(sent: list[str], fails: Callable[[], Awaitable[None]], send_waits: asyncio.Event | None = None) -> Workflow:
    """One step, ``s``, that gathers its effect ``pay`` (noted in ``sent`` as it is sent;
    with ``send_waits``, the downstream answers once it is set) with a branch of its
    own, ``fails``, that raises: the step fails while its effect is still under way."""

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            if send_waits is not None:
                await send_waits.wait()
            return "charged"

        await asyncio.gather(ctx.effect("pay", send), fails())
        return None

    return load_workflow("w", [Step(name="s", run=pay, retry=RetryPolicy(max_attempts=1))])


async def raise_once(event: threading.Event) -> None:
    """A branch that raises once ``event`` (a held fsync's begun) is set."""
    await began(event)
    raise RuntimeError("the other branch failed")


def test_an_effect_still_waiting_for_its_fsync_when_a_sibling_fails_the_step_is_never_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step gathers an effect with a branch that raises while the effect's Dispatched
    waits for its fsync: the attempt ends Failed then and there. The effect's wait ended
    after that, and it was sent for an attempt already over, its Confirm written after
    the attempt's end and the run's (a log that replays INVALID, which recovery refuses).
    Its send never began, so it is recorded Rejected before the attempt's end, as a
    cancel in that wait records it, and is never sent."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")
    ops = HeldOps(hold=(1,))
    sent: list[str] = []
    path = tmp_path / "log"

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        flow = gathered_with_a_failure(sent, lambda: raise_once(ops.began[1]))
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r"))
        await asyncio.wait_for(ended.ended.wait(), HUNG)  # failed, the fsync still held
        ops.release[1].set()
        return await running

    with RunLogWriter(path, ops=ops) as log:
        report = asyncio.run(main(log))
    assert sent == []
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Reject", "Rejected"),
        ("Fail", "Failed"),
    ]
    assert report.status == "failed"
    assert replay(path).valid


def test_an_effect_that_answers_after_a_sibling_failed_the_step_writes_nothing_more(
    tmp_path: Path,
) -> None:
    """The step gathers an effect with a branch that raises while the downstream service
    is still answering: the attempt ends Failed with the intent outstanding. The answer
    came after, and its Confirm was written after the attempt's end and the run's (the
    log replayed INVALID). Nothing is written for an attempt that has ended: the key
    stays outstanding, as the attempt's end said, for a reconciliation."""
    sent: list[str] = []
    path = tmp_path / "log"
    answer = asyncio.Event()

    async def fails() -> None:
        while not sent:  # the effect is being sent
            await asyncio.sleep(0)
        raise RuntimeError("the other branch failed")

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        flow = gathered_with_a_failure(sent, fails, send_waits=answer)
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r"))
        await asyncio.wait_for(ended.ended.wait(), HUNG)
        answer.set()
        report = await running
        for _ in range(10):  # the effect's answer comes back now
            await asyncio.sleep(0)
        return report

    with RunLogWriter(path) as log:
        report = asyncio.run(main(log))
    [key] = sent
    assert intent_moves(path) == [("Admit", "Running"), ("Dispatch", "Dispatched"), ("Fail", "Failed")]
    assert report.status == "needs-reconciliation"
    assert [s.outstanding for s in report.steps] == [(key,)]
    assert replay(path).valid


def test_an_effect_asked_for_after_its_attempt_ended_writes_and_sends_nothing(tmp_path: Path) -> None:
    """A branch of step ``s`` asks for an effect after another branch failed the attempt,
    while the run goes on (step ``t``): its Planned and Dispatched were written for an
    attempt already over (the log replayed INVALID) and the executor died on its own
    assertion. It is refused (a StepError, to a branch no one awaits): nothing is
    written, nothing is sent."""
    sent: list[str] = []
    path = tmp_path / "log"
    go = asyncio.Event()
    run_ends = asyncio.Event()

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            return None

        async def late() -> JSON:
            await go.wait()
            return await ctx.effect("pay", send)

        async def fails() -> None:
            raise RuntimeError("the other branch failed")

        await asyncio.gather(late(), fails())
        return None

    async def other(ctx: StepContext) -> JSON:
        await run_ends.wait()
        return None

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        flow = load_workflow(
            "w", [Step(name="s", run=pay, retry=RetryPolicy(max_attempts=1)), Step(name="t", run=other)]
        )
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r"))
        await asyncio.wait_for(ended.ended.wait(), HUNG)  # s failed; t still runs
        go.set()
        for _ in range(10):  # the late branch goes on now
            await asyncio.sleep(0)
        run_ends.set()
        return await running

    with RunLogWriter(path) as log:
        report = asyncio.run(main(log))
    assert sent == []
    of_s = [r.change for r in read_log(path) if isinstance(r, Record) and getattr(r.change, "step", "") == "s"]
    assert [type(c).__name__ for c in of_s] == ["AttemptCreated", "AttemptTransitioned", "StepResult", "AttemptTransitioned"]
    assert report.status == "failed"
    assert replay(path).valid


def test_a_domain_state_set_after_its_attempt_ended_writes_nothing(tmp_path: Path) -> None:
    """As for an effect asked for late: a branch of step ``s`` sets a domain state after
    another branch failed the attempt, while the run goes on (step ``t``). Its record was
    written for an attempt already over (the log replayed INVALID) and the run raised
    the executor's own assertion. It is refused (a StepError, to the branch), nothing
    written."""
    path = tmp_path / "log"
    go = asyncio.Event()
    run_ends = asyncio.Event()
    refused: list[str] = []

    async def states(ctx: StepContext) -> JSON:
        async def late() -> None:
            await go.wait()
            try:
                ctx.set_state("charging")
            except Exception as error:  # noqa: BLE001  # what the late branch is told
                refused.append(type(error).__name__)

        async def fails() -> None:
            raise RuntimeError("the other branch failed")

        await asyncio.gather(late(), fails())
        return None

    async def other(ctx: StepContext) -> JSON:
        await run_ends.wait()
        return None

    async def main(log: RunLogWriter) -> RunReport:
        ended = Ended()
        flow = load_workflow(
            "w",
            [
                Step(name="s", run=states, retry=RetryPolicy(max_attempts=1), domain_states=("charging",)),
                Step(name="t", run=other),
            ],
            domain_states=["charging"],
        )
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r"))
        await asyncio.wait_for(ended.ended.wait(), HUNG)  # s failed; t still runs
        go.set()
        for _ in range(10):  # the late branch goes on now
            await asyncio.sleep(0)
        run_ends.set()
        return await running

    with RunLogWriter(path) as log:
        report = asyncio.run(main(log))
    assert refused == ["StepError"]
    assert report.status == "failed"
    assert replay(path).valid


def test_a_retry_interrupted_before_its_send_keeps_the_key_an_earlier_attempt_left_outstanding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 times out inside its send (it may have charged); attempt 2 retries under the same
    key (idempotent effects) and is cancelled while its Dispatched waits for the fsync: its own send
    never happened, but attempt 1's may have, so nothing is Rejected and the key stays to reconcile."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")
    sent: list[str] = []
    retry = RetryPolicy(max_attempts=3, initial_interval=0.0, effects_idempotent=True)
    # attempt 1: the provider hangs past the deadline
    flow = effect_run(sent, step_deadline=0.05, retry=retry, hangs=True)
    path = tmp_path / "log"
    ops = HeldOps(hold=(2,))  # fsync 1: attempt 1's Dispatched; fsync 2: attempt 2's, held

    async def main(log: RunLogWriter) -> RunReport:
        second = Ended(after=2)
        control = RunControl()
        running = asyncio.ensure_future(Executor(log, observers=[second]).run(flow, "r", control=control))
        await began(ops.began[2])
        control.cancel("the test cancels")
        await asyncio.wait_for(second.ended.wait(), HUNG)
        ops.release[2].set()
        return await running

    with RunLogWriter(path, ops=ops) as log:
        report = asyncio.run(main(log))
    [key] = set(sent)
    assert len(sent) == 1 and report.status == "needs-reconciliation"
    assert [(s.state, s.outstanding) for s in report.steps] == [(Indeterminate(), (key,))]
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("StepDeadlinePassed", "TimedOut"),
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Cancel", "Indeterminate"),
    ]
    assert replay(path).valid


class BreaksAfterTheHeldFsyncBegins(HeldOps):
    """HeldOps whose writes fail (EIO) from the moment the held fsync begins."""

    def __init__(self) -> None:
        super().__init__(hold=(1,))
        self.broken = False

    def write(self, fd: int, data: bytes) -> int:
        if self.broken:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.fsyncs == 0:
            self.broken = True
        super().fsync(fd)


def test_a_failing_log_under_an_interrupted_dispatch_never_reaches_the_step_as_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log fails while the Dispatched waits for its fsync and the run is cancelled: the step's
    code sees the cancellation (not the log's error, which it could catch and go on from), the
    effect is not sent, and the run raises LogWriteFailed."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")
    ops = BreaksAfterTheHeldFsyncBegins()
    caught: list[BaseException] = []
    sent: list[str] = []

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            return None

        try:
            return await ctx.effect("pay", send)
        except Exception as error:  # a step that handles what its effect raises
            caught.append(error)
            raise

    async def main(log: RunLogWriter) -> None:
        control = RunControl()
        running = asyncio.ensure_future(
            Executor(log).run(load_workflow("w", [Step(name="s", run=pay)]), "r", control=control)
        )
        await began(ops.began[1])
        control.cancel("the test cancels")
        try:
            with pytest.raises(LogWriteFailed):
                await running
        finally:
            ops.release[1].set()

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        asyncio.run(main(log))
    assert (caught, sent) == ([], [])


class FirstFsyncFails(HeldOps):
    """HeldOps whose first fsync (held on the flush thread) fails with EIO, and whose later
    fsyncs succeed: the way Linux reports a writeback error once, to the first fsync that
    looks, while pages it covered may be lost."""

    def fsync(self, fd: int) -> None:
        first = self.fsyncs == 0
        self.fsyncs += 1
        if first:
            self.began[1].set()
            assert self.release[1].wait(HUNG), "the test never released the fsync"
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)


class ReleasedWhenWaitedFor(concurrent.futures.Future[OSError | None]):
    """The flush thread's outcome: whoever blocks on it releases the held fsync first."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def result(self, timeout: float | None = None) -> OSError | None:
        if not self.done():
            self.release.set()
        return super().result(timeout)


class ReleasingPool:
    """The writer's flush thread, as a pool whose futures are `ReleasedWhenWaitedFor`."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., OSError | None], *args: object) -> ReleasedWhenWaitedFor:
        outcome = ReleasedWhenWaitedFor(self.release)
        thread = threading.Thread(target=lambda: outcome.set_result(fn(*args)))
        self.threads.append(thread)
        thread.start()
        return outcome

    def shutdown(self, wait: bool = True) -> None:
        for thread in self.threads:
            thread.join()


def test_a_batch_fsync_that_succeeds_beside_a_failed_one_does_not_release_its_waiters(
    tmp_path: Path,
) -> None:
    """fsync 1 on the flush thread covers the waiters' records and fails; meanwhile an append
    past `BATCH_CAP` batches fsyncs beside it, and that fsync succeeds (Linux reports a
    writeback error to one fsync only). It proves nothing: the failed fsync's waiters fail,
    since their records may be lost and their effects must not be sent."""
    ops = FirstFsyncFails(hold=(1,))

    async def main(log: RunLogWriter) -> list[str]:
        waiters = await waiting(log, ops, 3)
        for i in range(BATCH_CAP):  # other runs write on: the last append fsyncs inline
            log.append(f"more{i}", RunStarted(workflow="w"))
        ops.release[1].set()
        return await how_they_end(waiters)

    with RunLogWriter(tmp_path / "log", ops=ops, batch_size=1) as log:
        assert asyncio.run(main(log)) == ["LogWriteFailed"] * 3
        assert ops.fsyncs == 2


def test_flush_waits_for_the_fsync_in_flight_and_fails_with_it(tmp_path: Path) -> None:
    """flush() called while fsync 1 of durable() is in flight waits for it (the held fsync is
    let go once anyone blocks on it), and when it fails, so does flush: an fsync of its own
    that succeeded beside the failed one would prove nothing."""
    ops = FirstFsyncFails(hold=(1,))

    async def main(log: RunLogWriter) -> list[str]:
        waiters = await waiting(log, ops, 3)
        try:
            log.flush()
            flushed = "NoneType"
        except LogWriteFailed:
            flushed = "LogWriteFailed"
        ops.release[1].set()
        return [flushed, *await how_they_end(waiters)]

    with RunLogWriter(tmp_path / "log", ops=ops) as log:
        log._pool = ReleasingPool(ops.release[1])  # type: ignore[assignment]
        assert asyncio.run(main(log)) == ["LogWriteFailed"] * 4
        assert ops.fsyncs == 1


def test_close_raises_when_the_fsync_in_flight_it_waited_for_failed(tmp_path: Path) -> None:
    """close() waits for the fsync in flight; when that fsync fails, close raises LogWriteFailed
    (as it does when its own fsync fails): records appended since, that no one waited on, were
    never made durable, and whoever closes the log must not take it for whole."""
    ops = HeldOps(hold=(1,), fail=True)
    log = RunLogWriter(tmp_path / "log", ops=ops)

    async def main() -> list[str]:
        waiters = await waiting(log, ops, 2)
        for waiter in waiters:  # the runs were stopped: no one waits for the fsync any more
            waiter.cancel()
        await how_they_end(waiters)
        log.append("r0", AttemptCreated(step="s", attempt=1))  # e.g. the stopped run's end
        threading.Timer(0.0, ops.release[1].set).start()  # close() blocks the loop
        try:
            log.close()
        except LogWriteFailed:
            return ["LogWriteFailed"]
        return ["NoneType"]

    assert asyncio.run(main()) == ["LogWriteFailed"]
    assert ops.fsyncs == 1


# --------------------------------------------------------------------------
# A cancel asks the reconcilers while a branch of its step still lives
# --------------------------------------------------------------------------


def stray_then_cancelled(
    sent: list[str],
    ask: Callable[[str], Awaitable[EffectFinding]],
    sibling_fails: Callable[[], Awaitable[None]],
    send_waits: asyncio.Event | None = None,
    late: asyncio.Event | None = None,
) -> Workflow:
    """One step, ``s``, that gathers its effect ``pay`` (noted in ``sent`` as it is sent;
    with ``send_waits``, the downstream answers once it is set) with a branch that raises
    (``sibling_fails``); the step catches that and goes on waiting, so ``pay`` lives on
    beside it until the run is cancelled. With ``late``, a branch of the step asks for
    effect ``late`` once it is set. ``ask`` is the reconciler of both effects."""
    strays: list[asyncio.Task[None]] = []

    async def pay(ctx: StepContext) -> JSON:
        async def send(key: str) -> JSON:
            sent.append(key)
            if send_waits is not None:
                await send_waits.wait()
            return "charged"

        async def asks_late() -> None:
            assert late is not None
            await late.wait()
            await ctx.effect("late", send)

        if late is not None:
            strays.append(asyncio.ensure_future(asks_late()))  # held: no one awaits it
        try:
            await asyncio.gather(ctx.effect("pay", send), sibling_fails())
        except RuntimeError:
            pass
        await asyncio.Event().wait()  # until the run is cancelled
        return None

    step = Step(name="s", run=pay, reconcilers={"pay": ask, "late": ask}, retry=RetryPolicy(max_attempts=1))
    return load_workflow("w", [step])


class HeldReconciler:
    """A reconciler that says it is being asked (``in_ask``), then answers ``finding`` once
    the test lets it (``answer``); the keys it was asked about in ``asked``."""

    def __init__(self, finding: EffectFinding | None = None) -> None:
        self.in_ask = asyncio.Event()
        self.answer = asyncio.Event()
        self.asked: list[str] = []
        self.finding: EffectFinding = EffectNotHappened() if finding is None else finding

    async def ask(self, key: str) -> EffectFinding:
        self.asked.append(key)
        self.in_ask.set()
        await self.answer.wait()
        return self.finding


def test_a_branch_effect_waiting_for_its_fsync_is_not_sent_while_a_cancel_asks_the_reconcilers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run is cancelled while a branch of the step (gathered beside one that raised)
    waits for its effect's Dispatched fsync; the cancel asks the step's reconcilers
    before ending the attempt, and the fsync completes during the asking. The effect
    was sent then, for an attempt whose cancel had begun, and its own Confirm raced the
    reconciler's answer: the run raised the kernel's IllegalIntentTransition and never
    finished. Its send never began when the cancel came, so it is recorded Rejected
    before the asking, as the attempt's end records it, and never sent."""
    monkeypatch.setattr(RunLogWriter, "flush_on", "thread")
    ops = HeldOps(hold=(1,))
    sent: list[str] = []
    held = HeldReconciler()
    path = tmp_path / "log"

    async def main(log: RunLogWriter) -> RunReport:
        async def sibling_fails() -> None:
            await began(ops.began[1])
            raise RuntimeError("the other branch failed")

        control = RunControl()
        ended = Ended()
        flow = stray_then_cancelled(sent, held.ask, sibling_fails)
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r", control=control))
        await began(ops.began[1])
        for _ in range(10):  # the sibling raised; the step waits
            await asyncio.sleep(0)
        control.cancel()
        if await asked_first(held.in_ask, ended):
            ops.release[1].set()  # the fsync completes while the reconciler is asked
            await asyncio.wait_for(log.durable("r"), HUNG)  # and is handed back to its waiters
            for _ in range(10):  # the branch goes on from it
                await asyncio.sleep(0)
            held.answer.set()
        ops.release[1].set()
        return await asyncio.wait_for(running, HUNG)

    with RunLogWriter(path, ops=ops) as log:
        report = asyncio.run(main(log))
    assert sent == [] and held.asked == []
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Reject", "Rejected"),
        ("Cancel", "Cancelled"),
    ]
    assert report.status == "cancelled"
    assert replay(path).valid


async def asked_first(in_ask: asyncio.Event, ended: Ended) -> bool:
    """Wait until the reconciler is asked or the attempt has ended; True when it was asked."""
    asking = asyncio.ensure_future(in_ask.wait())
    ending = asyncio.ensure_future(ended.ended.wait())
    await asyncio.wait_for(asyncio.wait([asking, ending], return_when=asyncio.FIRST_COMPLETED), HUNG)
    asking.cancel()
    ending.cancel()
    return in_ask.is_set()


@pytest.mark.parametrize("finding", ["not-happened", "unknown"])
def test_an_effect_that_answers_while_a_cancel_asks_its_reconciler_keeps_its_own_answer(
    tmp_path: Path, finding: str
) -> None:
    """A branch of the step (gathered beside one that raised) has sent its effect when the
    run is cancelled; the effect answers while the cancel asks its reconciler. The
    reconciler's answer was then written over the effect's own Confirm, from a state it
    no longer had: the run raised IllegalIntentTransition and never finished. The
    effect's own answer stands (Confirmed, with its result), the reconciler's, which
    came after it, records nothing, and the attempt ends Cancelled."""
    from attempt_kernel import EffectUnknown

    sent: list[str] = []
    held = HeldReconciler(EffectNotHappened() if finding == "not-happened" else EffectUnknown(reason="down"))
    path = tmp_path / "log"

    async def main(log: RunLogWriter) -> RunReport:
        bank = asyncio.Event()

        async def sibling_fails() -> None:
            while not sent:
                await asyncio.sleep(0)
            raise RuntimeError("the other branch failed")

        control = RunControl()
        ended = Ended()
        flow = stray_then_cancelled(sent, held.ask, sibling_fails, send_waits=bank)
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r", control=control))
        while not sent:
            await asyncio.sleep(0)
        for _ in range(10):  # the sibling raised; the step waits
            await asyncio.sleep(0)
        control.cancel()
        if await asked_first(held.in_ask, ended):
            bank.set()  # the effect answers while its reconciler is asked
            for _ in range(10):
                await asyncio.sleep(0)
        held.answer.set()
        bank.set()
        return await asyncio.wait_for(running, HUNG)

    with RunLogWriter(path) as log:
        report = asyncio.run(main(log))
    assert len(sent) == 1
    assert intent_moves(path) == [
        ("Admit", "Running"),
        ("Dispatch", "Dispatched"),
        ("Confirm", "Confirmed"),
        ("Cancel", "Cancelled"),
    ]
    assert [r for r in read_log(path) if isinstance(r, Record) and isinstance(r.change, IntentReconciled)] == []
    assert report.status == "cancelled"
    assert replay(path).valid


def test_an_effect_asked_for_while_a_cancel_asks_the_reconcilers_is_refused(tmp_path: Path) -> None:
    """A branch of the step asks for a new effect while the run's cancel asks the
    reconcilers of the one in flight: it was written and sent for an attempt whose
    cancel had begun, and the attempt ended Indeterminate on it, its reconciler never
    asked. It is refused (a StepError, to a branch no one awaits): nothing is written
    for it, nothing is sent, and the attempt ends as the reconciler's answer about the
    first effect says."""
    sent: list[str] = []
    held = HeldReconciler()
    path = tmp_path / "log"

    async def main(log: RunLogWriter) -> RunReport:
        late = asyncio.Event()

        async def sibling_fails() -> None:
            while not sent:
                await asyncio.sleep(0)
            raise RuntimeError("the other branch failed")

        control = RunControl()
        ended = Ended()
        flow = stray_then_cancelled(sent, held.ask, sibling_fails, send_waits=asyncio.Event(), late=late)
        running = asyncio.ensure_future(Executor(log, observers=[ended]).run(flow, "r", control=control))
        while not sent:
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        control.cancel()
        if await asked_first(held.in_ask, ended):
            late.set()  # the branch asks for its effect while the reconciler is asked
            for _ in range(10):
                await asyncio.sleep(0)
        held.answer.set()
        return await asyncio.wait_for(running, HUNG)

    with RunLogWriter(path) as log:
        report = asyncio.run(main(log))
    assert len(sent) == 1 and held.asked == sent
    assert intent_moves(path) == [("Admit", "Running"), ("Dispatch", "Dispatched"), ("Cancel", "Cancelled")]
    [reconciled] = [r.change for r in read_log(path) if isinstance(r, Record) and isinstance(r.change, IntentReconciled)]
    assert type(reconciled.to_state).__name__ == "Rejected"
    assert report.status == "cancelled"
    assert replay(path).valid
