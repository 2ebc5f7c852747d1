"""`serve`'s ``/metrics`` against a log that changes under it: replaced by a FIFO or a
directory, rewritten in place. A real server on a real socket (`test_web.serving`),
real files; the expected numbers are written out by hand."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Generator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from attempt_kernel._metrics import CONTENT_TYPE, journal_registry, metrics_app
from attempt_kernel._operations import cancel_run, resume_run
from test_metrics import script
from test_web import Client, add_waiting_runs, end_other_sessions, serving
from waitflows import APPROVER

STATUSES = ("running", "waiting", "interrupted", "needs-reconciliation", "succeeded", "failed", "cancelled")


@pytest.fixture
def approvals(tmp_path: Path) -> Path:
    """a-1 and a-2 wait for signal 'approve' (the approver workflow of ``waitflows``)."""
    return add_waiting_runs(tmp_path / "a.jsonl", "a-1", "a-2")


@contextlib.contextmanager
def fifo_at(path: Path) -> Generator[None, None, None]:
    """The log at ``path`` replaced by a FIFO for the block; a reader blocked opening it is let go after."""
    path.unlink()
    os.mkfifo(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # ENXIO: nobody is blocked reading it, as it should be
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def test_a_fifo_at_the_log_path_is_a_503_naming_it_and_every_scrape_answers(approvals: Path) -> None:
    """The scrape never opens the FIFO blocking (which held the collector's lock, so every
    later scrape hung too): each one answers 503 saying what the path is."""
    with serving(str(approvals), metrics=metrics_app(str(approvals))) as url:
        client = Client(url)
        assert client.get("/metrics")[0] == 200
        with fifo_at(approvals):
            answers = [client.request("/metrics") for _ in range(2)]
    said = f"The log cannot be read: {approvals}: is a FIFO (named pipe), not a run log (a run log is a regular file)\n"
    assert [(status, headers["Content-Type"], body) for status, headers, body in answers] == [
        (503, "text/plain; charset=utf-8", said),
        (503, "text/plain; charset=utf-8", said),
    ]


def test_a_directory_at_the_log_path_is_a_503_naming_it(approvals: Path) -> None:
    with serving(str(approvals), metrics=metrics_app(str(approvals))) as url:
        client = Client(url)
        assert client.get("/metrics")[0] == 200
        approvals.unlink()
        approvals.mkdir()
        status, body = client.get("/metrics")
    assert status == 503
    assert body == f"The log cannot be read: {approvals}: is a directory, not a run log (a run log is a regular file)\n"


def gauges(text: str, log: Path) -> dict[str, float]:
    """The journal's gauges in a scrape's text, by name (``runs:STATUS`` for the runs)."""
    label = re.escape(f'journal="{log}"')
    found: dict[str, float] = {}
    for name in ("attempt_kernel_indeterminate_attempts", "attempt_kernel_outstanding_intents"):
        [number] = re.findall(rf"^{name}{{{label}}} (\S+)$", text, re.MULTILINE)
        found[name.removeprefix("attempt_kernel_")] = float(number)
    for status in STATUSES:
        [number] = re.findall(rf'^attempt_kernel_runs{{{label},status="{status}"}} (\S+)$', text, re.MULTILINE)
        found[f"runs:{status}"] = float(number)
    return found


def test_a_log_rewritten_in_place_is_counted_again_from_its_start(approvals: Path, tmp_path: Path) -> None:
    """Another log copied over this one (same inode, longer): the gauges say what the new
    content holds, where the source read on from its old offset and kept the old counts."""
    other = tmp_path / "other.jsonl"
    script(other)  # 'ok' failed; 'stuck' is Indeterminate with its charge outstanding
    inode = approvals.stat().st_ino
    with serving(str(approvals), metrics=metrics_app(str(approvals))) as url:
        client = Client(url)
        status, before = client.get("/metrics")
        assert status == 200
        approvals.write_bytes(other.read_bytes())
        assert approvals.stat().st_ino == inode  # rewritten in place, not replaced
        status, after = client.get("/metrics")
        assert status == 200
        add_waiting_runs(approvals, "a-9")  # and read on from there, as before
        status, appended = client.get("/metrics")
        assert status == 200
    nothing: dict[str, float] = {f"runs:{s}": 0 for s in STATUSES}
    assert gauges(before, approvals) == {
        **nothing, "indeterminate_attempts": 0, "outstanding_intents": 0, "runs:waiting": 2,
    }
    assert gauges(after, approvals) == {
        **nothing, "indeterminate_attempts": 1, "outstanding_intents": 1,
        "runs:needs-reconciliation": 1, "runs:failed": 1,
    }  # fmt: skip
    assert gauges(appended, approvals) == {
        **nothing, "indeterminate_attempts": 1, "outstanding_intents": 1,
        "runs:needs-reconciliation": 1, "runs:failed": 1, "runs:waiting": 1,
    }  # fmt: skip


def test_a_log_rewritten_in_place_to_the_same_size_is_counted_again(approvals: Path, tmp_path: Path) -> None:
    """Same size, other content: a-2 cancelled and ended in the copy (its reason pads the
    copy to the original's size): the gauges follow the copy."""
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(approvals.read_bytes())
    size = approvals.stat().st_size
    with serving(str(approvals), metrics=metrics_app(str(approvals))) as url:
        client = Client(url)
        assert client.get("/metrics")[0] == 200
        add_waiting_runs(approvals, "a-3")
        grown = approvals.stat().st_size - size
        status, _ = client.get("/metrics")  # a-1, a-2, a-3 waiting: read to the end
        assert status == 200
        # The copy, the same size as the log now: a-2 cancelled there, with a reason of the right length.
        cancelled = copy_with_cancel(copy, "a-2", grown)
        assert len(cancelled) == approvals.stat().st_size
        approvals.write_bytes(cancelled)
        status, after = client.get("/metrics")
        assert status == 200
    nothing: dict[str, float] = {f"runs:{s}": 0 for s in STATUSES}
    assert gauges(after, approvals) == {
        **nothing, "indeterminate_attempts": 0, "outstanding_intents": 0,
        "runs:waiting": 1, "runs:cancelled": 1,
    }  # fmt: skip


def copy_with_cancel(log: Path, run: str, grown: int) -> bytes:
    """The bytes of ``log`` with ``run`` cancelled and ended after them, ``grown`` bytes more
    (the cancel's reason is as long as it takes)."""

    def cancelled(reason: str) -> bytes:
        scratch = log.with_name(f"scratch-{len(reason)}.jsonl")
        scratch.write_bytes(log.read_bytes())
        cancel_run(scratch, run, reason)
        resume_run(scratch, run, [APPROVER])  # ends it, as its cancel decided
        return scratch.read_bytes()

    # The reason may be written more than once: its length per character, from two tries.
    one, two = len(cancelled("x")), len(cancelled("xx"))
    per = two - one
    padding, odd = divmod(log.stat().st_size + grown - one, per)
    assert padding >= 0 and odd == 0, (one, two, grown)
    return cancelled("x" * (1 + padding))


def test_a_control_character_in_the_log_name_is_escaped_in_the_journal_label(tmp_path: Path) -> None:
    """As `replay --metrics` writes it: an ESC in the path is the text ``\\x1b``, never raw."""
    log = add_waiting_runs(tmp_path / "odd\x1bname.jsonl", "a-1")
    with serving(str(log), metrics=metrics_app(str(log))) as url:
        status, text = Client(url).get("/metrics")
    assert status == 200
    assert "\x1b" not in text
    assert f'attempt_kernel_runs{{journal="{tmp_path}/odd\\\\x1bname.jsonl",status="waiting"}} 1.0\n' in text


@pytest.mark.postgres
def test_on_postgresql_a_scrape_that_meets_a_lost_session_is_a_503_and_the_next_reads_again(db: str) -> None:
    """A session PostgreSQL ended (a restart, an idle timeout) is said as the log that
    cannot be read, as a FIFO is: the driver's error dropped the connection unanswered."""
    from attempt_kernel.postgres import PgJournal

    with PgJournal(db):
        pass  # the tables
    registry, collector = journal_registry(db)
    try:
        with serving(db, metrics=lambda: (generate_latest(registry), CONTENT_TYPE)) as url:
            client = Client(url)
            assert client.get("/metrics")[0] == 200
            end_other_sessions(db)
            lost = client.request("/metrics")
            status, text = client.get("/metrics")
    finally:
        collector.close()
    assert (lost[0], lost[1]["Content-Type"]) == (503, "text/plain; charset=utf-8")
    assert lost[2] == (
        "The log cannot be read: reading the journal's gauges failed:"
        " terminating connection due to administrator command\n"
    )
    assert status == 200
    assert f'attempt_kernel_queue_depth{{journal="{db}"}} 0.0\n' in text
