"""`serve`'s ``/metrics`` against a log that changes under it: replaced by a FIFO or a
directory, rewritten in place. A real server on a real socket (`test_web.serving`),
real files; the expected numbers are written out by hand."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from attempt_kernel._metrics import metrics_app
from test_web import Client, add_waiting_runs, serving


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
