"""`attempt-kernel serve`, over HTTP: the run list and its filters, one run's page,
the actions and their refusals, escaping, and the command's own edges.

Most tests run a real server on a free port in a thread of this process
(`serving`) and speak to it with urllib; the command's edges (a port in
use, a non-loopback host, SIGTERM) run it in a subprocess. Logs are written
by the real executor: the approver workflow of ``waitflows`` (it waits for
signal ``approve``), and the demo's trip planner cut right after its seat
was dispatched, then recovered, so its booking is Indeterminate.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import html
import http.client
import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Generator, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from attempt_kernel import (
    LogItem,
    Admit,
    AttemptCreated,
    AttemptTransitioned,
    Cancel,
    Dispatch,
    Dispatched,
    Indeterminate,
    IntentChanged,
    IntentPlanned,
    Planned,
    Rejected,
    AttemptState,
    Executor,
    Fail,
    Failed,
    Pending,
    Running,
    Succeed,
    Succeeded,
    TransitionCause,
    IntentReconciled,
    Record,
    RunLogWriter,
    SignalSent,
    JSON,
    RunContext,
    Workflow,
    workflow,
    read_log,
    replay,
    RunFinished,
    RunResumed,
    RunStopRequested,
    RunCancelRequested,
    RunStarted,
    WaitStarted,
)
from attempt_kernel.cli._main import main
from attempt_kernel._logfile import FileLog
from attempt_kernel._operations import cancel_run, resume_run, send_signal
from attempt_kernel._report import short
from attempt_kernel._store import LogSource
from attempt_kernel._web import MetricsHook, WebView, address_of, open_server, serve_until_stopped
from attempt_kernel._web import _origin_ok  # pyright: ignore[reportPrivateUsage]  # the check itself, over addresses no test machine has
from attempt_kernel._web_timeline import duration, timeline
from attempt_kernel._history import AttemptHistory, Moved, RunHistory, StepHistory, run_history
from waitflows import APPROVER

TESTS = Path(__file__).resolve().parent
HOSTILE = "<script>alert(1)</script>"
TIMEOUT = 60


# --------------------------------------------------------------------------
# Logs, written by the executor
# --------------------------------------------------------------------------


def add_waiting_runs(path: Path, *runs: str) -> Path:
    """Append runs of APPROVER that wait for signal 'approve' (no process drives them)."""

    async def go() -> None:
        with RunLogWriter(path) as writer:
            for run in runs:
                report = await Executor(writer, let_go_after=0).run(APPROVER, run)
                assert report.status == "waiting"

    asyncio.run(go())
    return path


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attempt_kernel", *args],
        cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip


def needs_reconciliation(folder: Path) -> Path:
    """``trip.jsonl``: the demo's run trip-1 as a crash right after its seat was
    dispatched leaves it (the clean log's first lines), then recovered: its
    book-flight attempt is Indeterminate and the run needs reconciliation."""
    clean = folder / "clean.jsonl"
    done = cli(folder, "demo", "--log", str(clean))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = clean.read_bytes().splitlines(keepends=True)
    [cut] = [n for n, line in enumerate(lines, 1) if b'"intent":"reserve-seat"' in line and b'"to":"Dispatched"' in line]
    log = folder / "trip.jsonl"
    log.write_bytes(b"".join(lines[:cut]))
    recovered = cli(folder, "recover", str(log))
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    return log


@pytest.fixture(scope="module")
def trip_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log whose trip-1 needs reconciliation (made once; tests copy it)."""
    return needs_reconciliation(tmp_path_factory.mktemp("trip"))


@pytest.fixture
def trip_log(tmp_path: Path, trip_template: Path) -> Path:
    log = tmp_path / "trip.jsonl"
    shutil.copy(trip_template, log)
    return log


def records(path: Path) -> list[Record]:
    return [item for item in read_log(path) if isinstance(item, Record)]


def nothing_written(log: Path, before: bytes) -> bool:
    return log.read_bytes() == before and not Path(f"{log}.inbox").exists()


# --------------------------------------------------------------------------
# A server in this process, and a browser-like client
# --------------------------------------------------------------------------


@contextlib.contextmanager
def serving(
    log: str,
    source: LogSource | None = None,
    *,
    workflows: Sequence[Workflow] = (),
    metrics: MetricsHook | None = None,
    one_run: Callable[[str], Iterable[LogItem]] | None = None,
) -> Generator[str, None, None]:
    """A server for ``log`` on a free loopback port, for the ``with`` block; its URL."""
    reader = source if source is not None else FileLog(log)
    view = WebView(log, reader, shown_as=log, workflows=workflows, metrics=metrics, one_run=one_run)
    server = open_server(view, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield address_of(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self, req: urllib.request.Request, fp: object, code: int, msg: str, headers: object, newurl: str
    ) -> None:
        return None


class Client:
    """Keeps its session cookie, as a browser does; sees redirects instead of following them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect())

    def request(
        self, path: str, fields: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        data = None if fields is None else urllib.parse.urlencode(fields).encode()
        req = urllib.request.Request(self.base.rstrip("/") + path, data=data, headers=headers or {})
        try:
            with self.opener.open(req, timeout=TIMEOUT) as answer:
                return answer.status, dict(answer.headers.items()), answer.read().decode()
        except urllib.error.HTTPError as error:
            # The error holds the response and its socket: close it here,
            # not in the garbage collector (a ResourceWarning under -W error).
            with error:
                return error.code, dict(error.headers.items()), error.read().decode()

    def get(self, path: str) -> tuple[int, str]:
        status, _, body = self.request(path)
        return status, body

    def token(self, run: str) -> str:
        status, body = self.get(run_path(run))
        assert status == 200, body
        found = re.search(r'name="csrf" value="([^"]+)"', body)
        assert found is not None
        return found.group(1)

    def act(self, run: str, action: str, **fields: str) -> tuple[int, str]:
        """POST ``action`` with this page's token; the status and the flash the next page shows."""
        status, headers, _ = self.request(f"{run_path(run)}/{action}", {"csrf": self.token(run), **fields})
        assert headers.get("Location") == run_path(run)
        _, page = self.get(run_path(run))
        return status, " | ".join(html.unescape(f) for f in re.findall(r'<div class="flash [a-z]+" role="status">(.*?)</div>', page))


def run_path(run: str) -> str:
    return "/runs/" + urllib.parse.quote(run, safe="")


def run_ids(page: str) -> list[str]:
    """The run ids the list page shows, in order."""
    return [html.unescape(m) for m in re.findall(r'<td class="mono"><a href="/runs/[^"]*">(.*?)</a></td>', page)]


@pytest.fixture
def approvals(tmp_path: Path) -> Path:
    """a-1, a-2, a-3 wait for 'approve', started in that order."""
    return add_waiting_runs(tmp_path / "a.jsonl", "a-1", "a-2", "a-3")


# --------------------------------------------------------------------------
# The run list
# --------------------------------------------------------------------------


@pytest.mark.slow  # its log comes from `attempt-kernel demo` in a subprocess
def test_the_list_shows_each_run_newest_first_with_workflow_status_and_attempts(trip_log: Path) -> None:
    add_waiting_runs(trip_log, "a-1")
    with serving(str(trip_log)) as url:
        status, page = Client(url).get("/")
    assert status == 200
    assert run_ids(page) == ["a-1", "trip-1"]
    assert '<span class="badge s-waiting">waiting</span> <span class="muted">for signal &#39;approve&#39;</span>' in page
    assert '<span class="badge s-needs-reconciliation">needs-reconciliation</span>' in page
    for name in ("approver", "trip-planner"):  # each a link to its runs alone
        assert f'<td><a href="/?workflow={name}" title="this workflow\'s runs only">{name}</a></td>' in page


@pytest.mark.slow  # its log comes from `attempt-kernel demo` in a subprocess
def test_the_list_filters_by_status_workflow_and_start_time(trip_log: Path) -> None:
    add_waiting_runs(trip_log, "a-1")
    with serving(str(trip_log)) as url:
        client = Client(url)
        assert run_ids(client.get("/?status=waiting")[1]) == ["a-1"]
        assert run_ids(client.get("/?status=needs-reconciliation")[1]) == ["trip-1"]
        assert run_ids(client.get("/?workflow=trip-planner")[1]) == ["trip-1"]
        assert run_ids(client.get("/?workflow=approver&status=succeeded")[1]) == []
        assert run_ids(client.get("/?since=2000-01-01")[1]) == ["a-1", "trip-1"]
        assert run_ids(client.get("/?since=2999-01-01T00:00")[1]) == []
        assert run_ids(client.get("/?until=2000-01-01")[1]) == []
        status, page = client.get("/?since=yesterday&status=lost&workflow=approver")
    assert status == 400
    assert run_ids(page) == ["a-1"]  # the filters that parse still apply
    assert "since: &#39;yesterday&#39; is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM)" in page
    assert "status: &#39;lost&#39; is not one of queued, running, waiting, interrupted" in page


@pytest.mark.parametrize(
    "since", ["2000-01-01", "2000-01-01T00:00", "2000-01-01T00:00:00", "2000-01-01T00:00:00Z", "2000-01-01T00:00:00.5Z"]
)
def test_a_start_time_filter_in_a_documented_form_is_taken(approvals: Path, since: str) -> None:
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/?since=" + urllib.parse.quote(since, safe=""))
    assert (status, run_ids(page)) == (200, ["a-3", "a-2", "a-1"])


@pytest.mark.parametrize(
    ("query", "shown_as"),
    [
        ("2000-01-01%ED%B2%8000:00", "'2000-01-01\\udc8000:00'"),
        ("2000-01-01%0000:00", "'2000-01-01\\x0000:00'"),
        ("2000-01-01%2200:00", "'2000-01-01\"00:00'"),
        ("2000-01-01%2000:00", "'2000-01-01 00:00'"),
        ("2000-01-01T00:00%2B05:00", "'2000-01-01T00:00+05:00'"),
        ("20000101", "'20000101'"),
        ("%D9%A2000-01-01", "'\u0662000-01-01'"),
    ],
    ids=["lone-surrogate-separator", "nul-separator", "quote-separator", "space-separator", "offset", "basic", "arabic-digit"],
)
def test_a_start_time_filter_in_no_documented_form_is_a_400_naming_it(approvals: Path, query: str, shown_as: str) -> None:
    """The filters took whatever ``datetime.fromisoformat`` takes: any character between the
    date and the time, so a lone surrogate there was written back into the filter's field
    raw, and the list page was an empty reply (UnicodeEncodeError); a NUL went into the
    page raw. Only the documented forms are taken now, as the CLI's --since takes only its own."""
    with serving(str(approvals)) as url:
        status, page = Client(url).get(f"/?since={query}&until={query}")
    assert status == 400
    assert run_ids(page) == ["a-3", "a-2", "a-1"]  # the filter is ignored
    assert f"since: {shown_as} is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM)" in html.unescape(page)
    assert f"until: {shown_as} is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM)" in html.unescape(page)
    assert 'name="since" value=""' in page and "\x00" not in page


@pytest.mark.parametrize("limit", ["%C2%B2", "%D9%A3", "0", "-1", "x"])
def test_a_limit_that_is_not_an_ascii_number_in_range_is_a_400_naming_it(approvals: Path, limit: str) -> None:
    """``²`` passes ``str.isdigit`` and fails ``int``: still a 400 with the message, never a
    dropped connection."""
    with serving(str(approvals)) as url:
        status, page = Client(url).get(f"/?limit={limit}")
    assert status == 400
    assert "is not a number from 1 to" in page


def test_the_run_page_shows_a_run_id_with_control_characters_escaped(tmp_path: Path) -> None:
    """ESC and the right-to-left override in a run id reach the run page's title, heading and
    timeline escaped as the command line shows them, never raw."""
    run = "r\x1b[31m\u202ex"
    log = add_waiting_runs(tmp_path / "odd.jsonl", run)
    with serving(str(log)) as url:
        status, page = Client(url).get("/runs/" + urllib.parse.quote(run, safe=""))
    assert status == 200
    assert "\x1b" not in page and "\u202e" not in page
    assert "<title>Run r\\x1b[31m\\u202ex" in page
    assert '<h1 id="run-id">r\\x1b[31m\\u202ex</h1>' in page
    assert "Timeline of run r\\x1b[31m\\u202ex:" in page


def test_a_run_id_holding_a_lone_surrogate_is_listed_linked_and_signalled(tmp_path: Path) -> None:
    """JSON can hold a lone surrogate (\\udc80), UTF-8 cannot: the list page crashed building
    its link (an empty reply for the whole list). The link carries it surrogate-escaped,
    and the run page and its forms take it back."""
    run = "r\udc80x"
    log = add_waiting_runs(tmp_path / "odd.jsonl", run)
    with serving(str(log)) as url:
        client = Client(url)
        status, listing = client.get("/")
        assert status == 200
        assert '<a href="/runs/r%ED%B2%80x">r\\udc80x</a>' in listing
        status, page = client.get("/runs/r%ED%B2%80x")
        assert status == 200 and '<h1 id="run-id">r\\udc80x</h1>' in page
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert found is not None
        status, _, _ = client.request("/runs/r%ED%B2%80x/signal", {"csrf": found.group(1), "name": "approve"})
        assert status == 303
    assert [r.change.name for r in records(log) if r.run == run and isinstance(r.change, SignalSent)] == ["approve"]


def test_the_list_is_paged_by_limit_with_an_older_link(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        client = Client(url)
        first = client.get("/?limit=2")[1]
        assert run_ids(first) == ["a-3", "a-2"]
        older = re.search(r'<a href="([^"]+)" rel="next">older</a>', first)
        assert older is not None
        second = client.get(html.unescape(older.group(1)))[1]
    assert run_ids(second) == ["a-1"]
    assert 'rel="next"' not in second
    assert "runs 3-3 of 3" in second


# --------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------


def test_an_unknown_run_is_a_404_page_saying_so(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/runs/nobody")
    assert status == 404
    assert "There is no run &#39;nobody&#39; in" in page


def test_the_list_says_which_waits_of_a_waiting_run_got_what_they_wait_for_as_runs_does(tmp_path: Path) -> None:
    """Two waits for 'approve' and one 'approve' recorded: `attempt-kernel runs` says the
    signal came for the first wait and the second still waits; the list's status says
    the same, not that the run waits for two signals (an operator would send both)."""
    log = tmp_path / "twin.jsonl"
    with RunLogWriter(log, create=True) as writer:
        writer.append("a-1", RunStarted(workflow="twin", nonce="n-1", code=True))
        writer.append("a-1", WaitStarted(position=1, signal="approve"))
        writer.append("a-1", WaitStarted(position=2, signal="approve"))
        writer.append("a-1", SignalSent(name="approve", payload=1, id="s-1"))
    with serving(str(log)) as url:
        status, listing = Client(url).get("/")
    assert status == 200
    assert "for signal &#39;approve&#39;, which came, for signal &#39;approve&#39;</span>" in listing


def test_the_list_says_a_waiting_run_whose_cancel_was_recorded_waits_no_more_as_runs_does(tmp_path: Path) -> None:
    """A cancel recorded for a run that waits and that no process drives: the list said
    it waited for its signal, which an operator could then send for a run that ends
    cancelled whatever comes; and the run page no longer offers that signal's name."""
    log = tmp_path / "cancelled.jsonl"
    with RunLogWriter(log, create=True) as writer:
        writer.append("a-1", RunStarted(workflow="twin", nonce="n-1", code=True))
        writer.append("a-1", WaitStarted(position=1, signal="approve"))
        writer.append("a-1", RunCancelRequested(reason="not needed"))
    with serving(str(log)) as url:
        status, listing = Client(url).get("/")
        page_status, page = Client(url).get("/runs/a-1")
    assert (status, page_status) == (200, 200)
    assert '>waiting</span> <span class="muted">no more: its cancel was recorded</span>' in listing
    assert "for signal" not in listing
    assert 'name="name" required value=""' in page



def test_a_run_page_shows_its_timeline_waits_and_signal_form(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/runs/a-1")
    assert status == 200
    assert '<span class="badge s-waiting" id="run-status">waiting</span>' in page
    assert re.search(r'<title>ask@1</title><text class="rowname step"[^>]*>ask@1</text>', page)
    assert ">#1 Succeeded</text>" in page and ">waiting</text>" in page
    for word in ("Succeeded", "Failed", "Indeterminate", "Cancelled", "TimedOut", "Running", "Pending", "wait"):
        assert f'">{word}</text>' in page  # the legend
    assert '<input type="text" name="name" required value="approve">' in page


def test_the_timeline_has_a_row_per_step_and_wait_and_a_bar_per_attempt(approvals: Path) -> None:
    history = run_history(read_log(approvals), "a-1")
    assert history is not None
    drawn = timeline(history, open_until_us=history.waits[0].started_us + 10_000_000)
    assert [(r.kind, r.name) for r in drawn.rows] == [("step", "ask@1"), ("wait", "@2 wait for 'approve'")]
    labelled = [(b.css, b.label, b.open) for b in drawn.bars if b.label]
    assert labelled == [("st-succeeded", "#1 Succeeded", False), ("wait", "waiting", True)]


def _attempt(number: int, created_ms: int, ended_ms: int, failed: bool) -> AttemptHistory:
    """An attempt admitted as soon as it was created, ended ``ended_ms`` after the epoch."""
    end: tuple[TransitionCause, AttemptState] = (Fail(), Failed()) if failed else (Succeed(), Succeeded())
    return AttemptHistory(
        number=number, created_us=created_ms * 1000, state=end[1],
        moves=(
            Moved(time_us=created_ms * 1000, from_state=Pending(), cause=Admit(), to_state=Running()),
            Moved(time_us=ended_ms * 1000, from_state=Running(), cause=end[0], to_state=end[1]),
        ),
        intents=(), returned=not failed, result=None, error="boom" if failed else None, domain_states=(),
    )  # fmt: skip


def test_labels_that_would_overprint_are_said_together_after_their_row() -> None:
    """A retry 20 ms after a failure, on a one-second axis: one label for both; a wide bar holds its own."""
    history = RunHistory(
        run="r", workflow="w", input=None, standing="succeeded", domain_state=None, events=(),
        steps=(
            StepHistory(name="search", attempts=(_attempt(1, 0, 10, True), _attempt(2, 30, 40, False))),
            StepHistory(name="long", attempts=(_attempt(1, 0, 1000, False),)),
        ),
    )  # fmt: skip
    drawn = timeline(history, open_until_us=0)
    assert [(b.label, b.inside) for b in drawn.bars] == [
        ("", False),
        ("#1 Failed · #2 Succeeded", False),
        ("#1 Succeeded", True),
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (0.25, "+250 ms"), (1.5, "+1.5 s"), (180, "+3 min"), (7200, "+2 h")],
)
def test_axis_labels_read_as_durations(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_hostile_run_name_is_shown_as_text(approvals: Path) -> None:
    add_waiting_runs(approvals, HOSTILE)
    with serving(str(approvals)) as url:
        client = Client(url)
        listed = client.get("/")[1]
        status, page = client.get(run_path(HOSTILE))
    assert status == 200
    for body in (listed, page):
        assert "<script" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert HOSTILE in run_ids(listed)


# --------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------


def test_a_signal_sent_through_the_page_is_recorded_and_its_flash_shown(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        client = Client(url)
        status, flash = client.act("a-1", "signal", name="approve", payload='{"by": "ada"}')
        page = client.get("/runs/a-1")[1]
    assert status == 303
    assert flash == "Signal 'approve' sent to run a-1: recorded in the log."
    [sent] = [r.change for r in records(approvals) if isinstance(r.change, SignalSent)]
    assert (sent.name, sent.payload) == ("approve", {"by": "ada"})
    assert "<td>not taken yet</td>" in page
    assert "Signal" not in page.split("<main>")[1].split("<section>")[0]  # a flash is shown once


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "Refused: signal '' to run 'a-1': a signal name must be a non-empty string"),
        ({"name": "approve", "payload": "{oops"}, "Refused: the payload is not JSON: Expecting property name"),
        ({"name": "approve", "payload": "null"}, "Refused: the payload is null"),
        ({"name": "approve", "payload": "NaN"}, "Refused: the payload is not JSON: NaN is not a JSON number"),
    ],
    ids=["no-name", "bad-json", "null", "nan"],
)
def test_a_bad_signal_is_refused_and_writes_nothing(approvals: Path, fields: dict[str, str], expected: str) -> None:
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        status, flash = Client(url).act("a-1", "signal", **fields)
    assert status == 303
    assert flash.startswith(expected)
    assert nothing_written(approvals, before)


@pytest.mark.parametrize(
    ("action", "fields"),
    [("signal", {"name": "approve"}), ("cancel", {"reason": "twice?"})],
    ids=["signal", "cancel"],
)
def test_a_form_sent_twice_acts_once_and_the_second_is_refused_writing_nothing(
    approvals: Path, action: str, fields: dict[str, str]
) -> None:
    """A double click (or a resend) posts one form, with one token, twice. A signal form
    recorded the signal twice: a later wait for that name would take the stale second one
    at once (signals are a mailbox). A token acts once now; its second POST is refused."""
    with serving(str(approvals)) as url:
        client = Client(url)
        token = client.token("a-1")
        first = client.request(f"/runs/a-1/{action}", {"csrf": token, **fields})
        after_first = approvals.read_bytes()
        second = client.request(f"/runs/a-1/{action}", {"csrf": token, **fields})
        page = client.get("/runs/a-1")[1]
    assert [(status, headers.get("Location")) for status, headers, _ in (first, second)] == [
        (303, "/runs/a-1"), (303, "/runs/a-1")
    ]
    flashes = [html.unescape(f) for f in re.findall(r'<div class="flash [a-z]+" role="status">(.*?)</div>', page)]
    assert flashes[-1] == (
        "Refused: this form was sent already (a second click, or a resend), and is not acted on"
        " twice; nothing was written. Reload the page to act again."
    )
    assert approvals.read_bytes() == after_first
    assert len([r for r in records(approvals) if isinstance(r.change, (SignalSent, RunCancelRequested))]) == 1


def test_one_form_posted_twice_at_once_acts_once(approvals: Path) -> None:
    """Two POSTs of one token that race each other (a double click): one signal is recorded."""
    with serving(str(approvals)) as url:
        client = Client(url)
        token = client.token("a-1")
        cookie = "; ".join(f"{c.name}={c.value}" for c in client.jar)
        gate = threading.Barrier(8)

        def post() -> int:
            gate.wait(TIMEOUT)
            connection = http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=TIMEOUT)
            try:
                connection.request(
                    "POST", "/runs/a-1/signal", urllib.parse.urlencode({"csrf": token, "name": "approve"}),
                    {"Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie},
                )  # fmt: skip
                return connection.getresponse().status
            finally:
                connection.close()

        answers: list[int] = []
        threads = [threading.Thread(target=lambda: answers.append(post())) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    assert answers == [303] * 8
    assert [r.change.name for r in records(approvals) if isinstance(r.change, SignalSent)] == ["approve"]


def test_a_post_without_this_browsers_token_is_403_and_writes_nothing(approvals: Path) -> None:
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        alice, mallory = Client(url), Client(url)
        stolen = mallory.token("a-1")  # valid, but for another session
        alice.get("/")
        answers = [
            alice.request("/runs/a-1/cancel", {"reason": "no token"}),
            alice.request("/runs/a-1/cancel", {"csrf": "0" * 16 + "." + "0" * 64}),
            alice.request("/runs/a-1/cancel", {"csrf": stolen}),
            Client(url).request("/runs/a-1/cancel", {"csrf": stolen}),  # no session cookie at all
        ]
    assert [status for status, _, _ in answers] == [403, 403, 403, 403]
    assert "Nothing was written" in answers[0][2]
    assert nothing_written(approvals, before)


def test_the_session_cookie_is_samesite_strict_and_httponly(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        _, headers, _ = Client(url).request("/")
    cookie = headers["Set-Cookie"]
    assert re.fullmatch(r"ak_session=[0-9a-f]{32}; Path=/; HttpOnly; SameSite=Strict", cookie)
    assert "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_an_action_on_a_finished_run_is_refused_and_writes_nothing(approvals: Path) -> None:
    cancel_run(approvals, "a-2", "made finished")
    resume_run(approvals, "a-2", [APPROVER])  # ends it, as its cancel decided
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        client = Client(url)
        cancelled = client.act("a-2", "cancel", reason="again")
        signalled = client.act("a-2", "signal", name="approve")
        page = client.get("/runs/a-2")[1]
    assert cancelled == (303, "Refused: cancel of run 'a-2': run 'a-2' has finished (cancelled); nothing was written")
    assert signalled[1].startswith("Refused: signal 'approve' to run 'a-2': run 'a-2' has finished (cancelled)")
    assert "This run has finished" in page
    assert nothing_written(approvals, before)


def test_cancel_through_the_page_records_the_decision(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        status, flash = Client(url).act("a-3", "cancel", reason="not needed")
    assert (status, flash) == (303, "Cancel of run a-3: recorded in the log.")


@pytest.mark.slow  # its log comes from `attempt-kernel demo` in a subprocess
def test_an_indeterminate_intent_is_reconciled_by_its_button(trip_log: Path) -> None:
    with serving(str(trip_log)) as url:
        client = Client(url)
        page = client.get("/runs/trip-1")[1]
        [key] = re.findall(r'<input type="hidden" name="key" value="([^"]+)">', page)
        assert ">#1 Indeterminate</text>" in page
        status, flash = client.act("trip-1", "reconcile", key=html.unescape(key), verdict="rejected", note="no PNR")
        after = client.get("/runs/trip-1")[1]
    assert status == 303
    assert flash == f"Intent {html.unescape(key)} of run trip-1: Rejected (it did not happen), recorded in the log."
    [done] = [r.change for r in records(trip_log) if isinstance(r.change, IntentReconciled)]
    assert (done.key, done.note, done.by) == (html.unescape(key), "no PNR", "operator")
    assert 'name="key"' not in after  # nothing is outstanding now
    assert "Rejected" in after


def forged_outstanding(path: Path, run: str, key: str) -> Path:
    """Append run ``run`` as a hand-built log may hold it: its one attempt ended Indeterminate
    with intent 'pay' (idempotency key ``key``) outstanding, written by the library's own
    writer, so every checksum is valid and the log breaks no rule."""
    with RunLogWriter(path) as writer:
        writer.append(run, RunStarted(workflow="wf"))
        writer.append(run, AttemptCreated(step="s", attempt=1))
        writer.append(run, AttemptTransitioned(step="s", attempt=1, from_state=Pending(), cause=Admit(), to_state=Running()))
        writer.append(run, IntentPlanned(step="s", attempt=1, name="pay", key=key))
        writer.append(
            run, IntentChanged(step="s", attempt=1, name="pay", from_state=Planned(), cause=Dispatch(), to_state=Dispatched())
        )
        writer.append(
            run,
            AttemptTransitioned(
                step="s", attempt=1, from_state=Running(), cause=Cancel(intent_dispatched=True), to_state=Indeterminate()
            ),
        )
        writer.append(run, RunFinished())
        writer.flush()
    return path


@pytest.mark.parametrize(
    "key",
    ['k"><script>alert(9)</script>', "k\udc80x", "k\nx", "k\r\nx", "k\x00x", "k\x1b[31m\u202ex", "k%41 x+y&z"],
    ids=["markup", "lone-surrogate", "lf", "crlf", "nul", "esc-bidi", "percent-plus-amp"],
)
def test_an_outstanding_key_of_any_characters_is_shown_and_reconciled_by_its_button(tmp_path: Path, key: str) -> None:
    """A hand-built log may give an intent any key. A lone surrogate in one made the run page an
    empty reply (UnicodeEncodeError: the form's hidden field wrote the key raw), and a key with
    a line break or a NUL came back from a browser changed (CRLF, U+FFFD), so its button was
    refused. The form carries the key percent-encoded now, and the reconcile takes it back
    exactly."""
    log = forged_outstanding(tmp_path / "forged.jsonl", "f-1", key)
    with serving(str(log)) as url:
        client = Client(url)
        status, page = client.get("/runs/f-1")
        assert status == 200
        [sent] = re.findall(r'<input type="hidden" name="key" value="([^"]*)">', page)
        assert sent.isascii() and sent.isprintable()
        assert "<script>alert(9)" not in page
        status, headers, _ = client.request(
            "/runs/f-1/reconcile", {"csrf": client.token("f-1"), "key": html.unescape(sent), "verdict": "rejected"}
        )
        assert (status, headers.get("Location")) == (303, "/runs/f-1")
        after = client.get("/runs/f-1")[1]
    [done] = [r.change for r in records(log) if isinstance(r.change, IntentReconciled)]
    assert (done.key, done.by, done.to_state) == (key, "operator", Rejected())
    assert 'name="key"' not in after


def test_a_log_that_breaks_the_kernels_rules_is_said_to_on_the_list_and_on_a_runs_page(tmp_path: Path) -> None:
    """A record that moves a terminal attempt (checksum valid) is one violation: the list
    said so, as `runs` does, but a run's page did not, as `show` does."""
    log = forged_outstanding(tmp_path / "bad.jsonl", "f-1", "k-one")
    with RunLogWriter(log) as writer:
        writer.append(
            "f-1",
            AttemptTransitioned(step="s", attempt=1, from_state=Indeterminate(), cause=Admit(), to_state=Running()),
        )
    warning = (
        "<p class=\"flash refused\">The log breaks the kernel's rules 1 time(s); see"
        " <span class=\"mono\">attempt-kernel replay</span>.</p>"
    )
    with serving(str(log)) as url:
        client = Client(url)
        listing, page = client.get("/")[1], client.get("/runs/f-1")[1]
    assert warning in listing
    assert warning in page


def test_a_reconcile_posted_to_one_runs_page_for_another_runs_key_is_refused(tmp_path: Path) -> None:
    """A run page's form reconciles that run's intents only: a key of run f-2 posted to
    f-1's reconcile (a stale tab, a hand-made request) was recorded for f-2 while the
    answer sent the operator back to f-1's page. It is refused now, naming both runs, and
    nothing is written."""
    log = forged_outstanding(tmp_path / "two.jsonl", "f-1", "k-one")
    forged_outstanding(log, "f-2", "k-two")
    before = log.read_bytes()
    with serving(str(log)) as url:
        status, flash = Client(url).act("f-1", "reconcile", key="k-two", verdict="rejected")
    assert (status, flash) == (
        303,
        "Refused: intent 'k-two' belongs to run 'f-2', not to run 'f-1'; nothing was written",
    )
    assert nothing_written(log, before)


@pytest.mark.slow  # its log comes from `attempt-kernel demo` in a subprocess
def test_a_second_reconcile_of_one_key_is_refused(trip_log: Path) -> None:
    with serving(str(trip_log)) as url:
        client = Client(url)
        [key] = re.findall(r'name="key" value="([^"]+)"', client.get("/runs/trip-1")[1])
        client.act("trip-1", "reconcile", key=key, verdict="confirmed")
        before = trip_log.read_bytes()
        _, flash = client.act("trip-1", "reconcile", key=key, verdict="rejected")
    assert flash.startswith(f"Refused: intent {key!r}")
    assert "is not outstanding" in flash
    assert nothing_written(trip_log, before)


def test_resume_without_the_workflow_is_refused_naming_the_command(approvals: Path) -> None:
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        _, flash = Client(url).act("a-1", "resume")
    assert flash.startswith("Refused: run 'a-1' belongs to workflow 'approver', which was not loaded")
    assert "attempt-kernel recover" in flash
    assert nothing_written(approvals, before)


def resumed_flash(client: Client, run: str) -> str:
    """Press Resume on ``run``; what the server said it did, once it said (a resume that
    outlasts the request says so on a later page)."""
    _, flash = client.act(run, "resume")
    deadline = time.monotonic() + TIMEOUT
    while flash.startswith(f"Resuming run {run} in this server's process"):
        assert time.monotonic() < deadline, "the resume never said what it did"
        time.sleep(0.1)
        page = client.get(f"/runs/{run}")[1]
        flash = html.unescape("".join(re.findall(r'<div class="flash [a-z]+" role="[a-z]+">(.*?)</div>', page))) or flash
    return flash


def test_resume_with_the_workflow_drives_a_signalled_run_to_its_end(approvals: Path) -> None:
    with serving(str(approvals), workflows=[APPROVER]) as url:
        client = Client(url)
        client.act("a-1", "signal", name="approve", payload='"yes"')
        flash = resumed_flash(client, "a-1")
        page = client.get("/runs/a-1")[1]
    assert flash == "run 'a-1' was resumed and ended succeeded"
    assert 'id="run-status">succeeded</span>' in page


@workflow("approver")
async def _exits(run: RunContext) -> JSON:
    # Not SystemExit: sys.exit() in a function is the run's error (a divergence here).
    raise KeyboardInterrupt("out of the loop")


def test_a_resume_that_dies_says_so_and_the_run_may_be_resumed_again(approvals: Path) -> None:
    """A workflow that raises a BaseException out of its event loop ends the resume's thread:
    the operator is told, and the run is not left marked as being resumed (a second resume is
    tried, not refused)."""
    with serving(str(approvals), workflows=[_exits]) as url:
        client = Client(url)
        for _ in range(2):
            flash = resumed_flash(client, "a-1")
            assert "stopped with KeyboardInterrupt: out of the loop" in flash, flash
            assert "being resumed by this server already" not in flash


# --------------------------------------------------------------------------
# Host checks and the metrics hook
# --------------------------------------------------------------------------


def test_a_request_naming_another_host_is_refused_on_loopback(approvals: Path) -> None:
    """A page from elsewhere that rebinds its name to 127.0.0.1 is not answered."""
    with serving(str(approvals)) as url:
        client = Client(url)
        answers = [client.request("/", headers={"Host": host}) for host in ("attacker.example:8421", "[::1")]
        named = [client.request("/", headers={"Host": host})[0] for host in ("localhost:8421", "[::1]:8421")]
    assert [status for status, _, _ in answers] == [403, 403]
    assert "loopback address only" in answers[0][2]
    assert named == [200, 200]


def test_metrics_is_served_by_the_hook_it_is_given(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        missing = Client(url).get("/metrics")[0]
    with serving(str(approvals), metrics=lambda: (b"attempt_kernel_up 1\n", "text/plain; version=0.0.4")) as url:
        status, headers, body = Client(url).request("/metrics")
    assert missing == 404
    assert (status, headers["Content-Type"], body) == (200, "text/plain; version=0.0.4", "attempt_kernel_up 1\n")


# --------------------------------------------------------------------------
# The command: a port in use, a non-loopback host, SIGTERM, no extra
# --------------------------------------------------------------------------


def start_serve(cwd: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`attempt-kernel serve ARGS` in a subprocess, and the URL its first line announces."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "serve", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    found = re.search(r"http://\S+", line)
    if found is None:
        process.kill()
        _, err = process.communicate(timeout=TIMEOUT)
        raise AssertionError(f"serve did not start: {line!r} {err!r}")
    return process, found.group(0)


@pytest.mark.slow
def test_serve_stops_on_sigterm_with_exit_0(approvals: Path) -> None:
    process, url = start_serve(approvals.parent, str(approvals), "--port", "0")
    try:
        assert Client(url).get("/")[0] == 200
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err
    assert out == "serve: stopped\n"
    assert err == ""


def _lock_waiters(path: Path) -> int:
    """How many processes wait for a lock on ``path`` now (``/proc/locks`` lists a waiter with ``->``)."""
    info = os.stat(path)
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    return sum(1 for entry in Path("/proc/locks").read_text().splitlines() if "->" in entry and where in entry.split())


@pytest.mark.slow  # serve in a subprocess
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc/locks to see serve wait for the inbox")
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_action_in_flight_when_serve_is_stopped_is_done_and_answered(approvals: Path, number: int) -> None:
    """serve stopped with an action half done: its thread was a daemon, so the process
    exited under it. The operator's browser got no answer (a reset connection) whether the
    signal was recorded or not, and one resent after a reset was recorded twice. The action
    in flight is finished and answered before serve exits now."""
    inbox = Path(f"{approvals}.inbox")
    inbox.touch()
    process, url = start_serve(approvals.parent, str(approvals), "--port", "0")
    answers: list[int | str] = []
    with open(inbox, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the signal's delivery waits for this lock
        client = Client(url)
        token = client.token("a-1")

        def post() -> None:
            try:
                answers.append(client.request("/runs/a-1/signal", {"csrf": token, "name": "approve"})[0])
            except OSError as error:  # no answer: the connection dropped
                answers.append(type(error).__name__)

        poster = threading.Thread(target=post)
        poster.start()
        deadline = time.monotonic() + TIMEOUT  # until serve waits for the lock; no bound asserted
        while _lock_waiters(inbox) == 0:
            assert time.monotonic() < deadline, "serve never waited for the inbox's lock"
            time.sleep(0.02)
        process.send_signal(number)
        host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
        while True:  # serve has taken the signal once it no longer listens
            try:
                socket.create_connection((host or "", port or 0), timeout=TIMEOUT).close()
            except (ConnectionRefusedError, ConnectionResetError):  # reset: closed as it was reached
                break
            assert time.monotonic() < deadline, "serve never stopped listening"
            time.sleep(0.02)
        fcntl.flock(held, fcntl.LOCK_UN)
    poster.join(TIMEOUT)
    out, err = process.communicate(timeout=TIMEOUT)
    assert (process.returncode, out, err) == (0, "serve: stopped\n", "")
    assert answers == [303]
    assert [r.change.name for r in records(approvals) if isinstance(r.change, SignalSent)] == ["approve"]


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_web_resume_stops_the_run_as_resume_does(approvals: Path, number: int) -> None:
    """A resume the web view drives runs in a thread, where no signal reaches: serve
    died under it, the run neither stopped nor ended. Now the stop is recorded, the run
    stays unfinished, and serve exits 128 + the signal, naming the run."""
    process = subprocess.Popen(
        [sys.executable, "-m", "attempt_kernel", "serve", str(approvals), "--port", "0",
         "--workflows", "waitflows:APPROVER"],
        cwd=approvals.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    assert process.stdout is not None
    found = re.search(r"http://\S+", process.stdout.readline())
    try:
        assert found is not None
        client = Client(found.group(0))
        # a-1 waits for 'approve' again in the server's process: the resume goes on
        assert client.act("a-1", "resume")[1].startswith("Resuming run a-1 in this server's process")
        deadline = time.monotonic() + TIMEOUT  # until the run is resumed; no bound asserted
        while not any(isinstance(r.change, RunResumed) for r in records(approvals) if r.run == "a-1"):
            assert time.monotonic() < deadline, "the run was never resumed"
            time.sleep(0.05)
    finally:
        process.send_signal(number)
        _, err = process.communicate(timeout=TIMEOUT)
    name = signal.Signals(number).name
    assert (process.returncode, err) == (
        128 + number,
        f"attempt-kernel serve: stopped by {name}; the resume of run(s) a-1 was stopped, each run"
        f" unfinished; `attempt-kernel resume {approvals} a-1 --workflows waitflows:APPROVER` resumes it\n",
    )
    changes = [r.change for r in records(approvals) if r.run == "a-1"]
    assert isinstance(changes[-1], RunStopRequested) and changes[-1].reason == name
    assert not any(isinstance(c, RunFinished) for c in changes)


class _SignalledMidAccept(ThreadingHTTPServer):
    """A server that is sent SIGTERM while its main thread hands a request to a
    thread: where a loaded machine's scheduler left serve one CI run."""

    def process_request(self, request: Any, client_address: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before the next line
        super().process_request(request, client_address)


def test_sigterm_while_a_request_is_being_handed_to_a_thread_still_stops_serve() -> None:
    """socketserver swallows an `Exception` raised while it hands a request over
    (it prints "Exception occurred during processing of request" and serves on),
    so a SIGTERM landing there was lost and serve ran on for good."""
    server = _SignalledMidAccept(("127.0.0.1", 0), BaseHTTPRequestHandler)
    # Were the signal lost, this ends the serving so that the test fails, not hangs.
    fallback = threading.Timer(TIMEOUT, server.shutdown)
    fallback.start()
    port = server.server_address[1]
    client = threading.Thread(target=lambda: socket.create_connection(("127.0.0.1", port)).close())
    try:
        number = serve_until_stopped(server, lambda said: client.start())
    finally:
        fallback.cancel()
        client.join()
    assert number == signal.SIGTERM


@pytest.mark.slow
def test_a_non_loopback_host_warns_that_the_actions_are_reachable(approvals: Path) -> None:
    process, _ = start_serve(approvals.parent, str(approvals), "--host", "0.0.0.0", "--port", "0")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0
    assert err.startswith("attempt-kernel serve: warning: listening on 0.0.0.0, not loopback: anyone who can reach")


@pytest.mark.slow
def test_a_port_in_use_exits_2_naming_it(approvals: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(approvals.parent, "serve", str(approvals), "--port", str(port))
    assert done.returncode == 2
    assert done.stderr == f"attempt-kernel serve: error: port {port} on 127.0.0.1 is in use; pick another with --port\n"


@pytest.mark.parametrize("port", ["65536", "99999"])
def test_a_port_outside_the_tcp_range_is_a_usage_error_as_metrics_port_is(
    approvals: Path, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    """argparse refuses it (exit 2, one line): bind() raised OverflowError with a traceback, exit 1."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(approvals), "--port", port])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith(f"attempt-kernel serve: error: argument --port: expected a TCP port (0 to 65535), got {port}\n"), err
    assert "Traceback" not in err


@pytest.mark.slow  # before it was refused, serve listened on every interface: a subprocess, with a timeout
def test_an_empty_host_is_refused_not_taken_for_every_interface(approvals: Path) -> None:
    """`--host ''` (an unset variable, say) listened on all interfaces, warning "listening on ,
    not loopback"; it is a usage error now, naming 0.0.0.0 for every IPv4 interface."""
    done = cli(approvals.parent, "serve", str(approvals), "--host", "", "--port", "0")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.endswith(
        "attempt-kernel serve: error: argument --host: expected an address, got an empty one"
        " (0.0.0.0 listens on every IPv4 interface)\n"
    ), done.stderr


def test_serve_without_jinja2_exits_2_saying_to_install_the_web_extra(
    approvals: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "attempt_kernel._web", None)
    assert main(["serve", str(approvals)]) == 2
    assert "install attempt-kernel[web]" in capsys.readouterr().err


def test_serve_of_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", str(tmp_path / "none.jsonl")]) == 2
    assert "no run log file" in capsys.readouterr().err


# --------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_on_postgresql_the_list_run_page_and_a_signal_work(db: str) -> None:
    from attempt_kernel.postgres import PgJournal

    async def go() -> None:
        with PgJournal(db) as journal:
            report = await Executor(journal, let_go_after=0).run(APPROVER, "p-1")
            assert report.status == "waiting"

    asyncio.run(go())
    journal = PgJournal(db)
    read_runs: list[str] = []

    def one_run(run: str) -> Iterable[LogItem]:
        read_runs.append(run)
        return journal.read_run(run)

    try:
        with serving(db, journal, one_run=one_run) as url:
            client = Client(url)
            assert run_ids(client.get("/?status=waiting")[1]) == ["p-1"]
            assert client.get("/runs/p-2")[0] == 404
            status, flash = client.act("p-1", "signal", name="approve", payload="1")
            page = client.get("/runs/p-1")[1]
    finally:
        journal.close()
    assert set(read_runs) == {"p-2", "p-1"}  # a run's page reads that run alone, never the journal
    assert status == 303
    assert flash == "Signal 'approve' sent to run p-1: recorded in the journal."
    assert "<td>not taken yet</td>" in page


@pytest.mark.postgres
@pytest.mark.parametrize(("run", "path"), [("r\udc80", "r%ED%B2%80"), ("r\x00", "r%00")], ids=["lone-surrogate", "nul"])
def test_on_postgresql_a_run_id_no_journal_can_hold_is_no_run(db: str, run: str, path: str) -> None:
    """A PostgreSQL journal keeps run ids as text: no UTF-8 holds a lone surrogate, no text a
    NUL. A run page or an action for such an id was an empty reply (UnicodeEncodeError out of
    the driver) or a failure that said the change might have been written; it is no run now:
    a 404, and each action refused, nothing written."""
    from attempt_kernel.postgres import PgJournal

    async def go() -> None:
        with PgJournal(db) as journal:
            assert (await Executor(journal, let_go_after=0).run(APPROVER, "p-1")).status == "waiting"

    asyncio.run(go())
    journal = PgJournal(db)
    try:
        with serving(db, journal, one_run=journal.read_run_snapshot) as url:
            client = Client(url)
            status, page = client.get(f"/runs/{path}")
            posted: list[int] = []
            flashes: list[str] = []
            for action, fields in (("signal", {"name": "approve"}), ("cancel", {"reason": "r"}), ("resume", {})):
                posted.append(client.request(f"/runs/{path}/{action}", {"csrf": client.token("p-1"), **fields})[0])
                flashes += re.findall(r'<div class="flash [a-z]+" role="status">(.*?)</div>', client.get("/runs/p-1")[1])
    finally:
        journal.close()
    assert status == 404 and "There is no run" in html.unescape(page)
    assert posted == [303, 303, 303]
    said = f"no run {run!r} in {db}: a PostgreSQL journal holds no run id with a NUL or a lone surrogate; nothing was written"
    assert [html.unescape(f) for f in flashes] == [
        f"Refused: signal 'approve' to run {run!r}: {said}",
        f"Refused: cancel of run {run!r}: {said}",
        f"Refused: {said}",
    ]
    with PgJournal(db) as check:
        assert [type(r.change).__name__ for r in check.read() if isinstance(r, Record)][-1] == "WaitStarted"


@pytest.mark.postgres
@pytest.mark.slow
def test_on_postgresql_resume_is_offered_only_for_a_run_a_worker_can_take(db: str) -> None:
    """p-1 was started outside the queue (as `run --log URL` starts a run): no worker takes it,
    and resume refuses it. Its page offered Resume all the same, saying a worker takes it up;
    it names `recover` now, with no button. s-1, submitted, keeps the form."""
    from attempt_kernel.postgres import PgJournal
    from attempt_kernel.postgres._worker import run_worker, submit_run

    async def go() -> None:
        with PgJournal(db) as journal:
            report = await Executor(journal, let_go_after=0).run(APPROVER, "p-1")
            assert report.status == "waiting"

    asyncio.run(go())
    submit_run(db, "approver", "s-1")
    run_worker(db, [APPROVER], stop_when_idle=True)  # s-1 waits for its signal, released
    journal = PgJournal(db)
    try:
        with serving(db, journal, one_run=journal.read_run) as url:
            client = Client(url)
            unsubmitted = html.unescape(client.get("/runs/p-1")[1])
            submitted = html.unescape(client.get("/runs/s-1")[1])
            _, flash = client.act("s-1", "resume")
    finally:
        journal.close()
    assert "a worker of its workflow takes it up" not in unsubmitted
    assert "Resume run</button>" not in unsubmitted
    assert (
        "No worker takes this run up (`attempt-kernel run` started it, never submitted), so there is no"
        f" Resume here: `attempt-kernel recover {db} --workflows MODULE:ATTR` goes on with it."
    ) in unsubmitted, unsubmitted
    assert "Reopens the run in the journal; a worker of its workflow takes it up." in submitted
    assert "Resume run</button>" in submitted
    assert flash == "run 's-1' is claimable now: a worker of its workflow takes it up at its next claim"


def end_other_sessions(url: str) -> None:
    """End every session of ``url``'s database but this one, as a server restart or a
    proxy's idle timeout ends them."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.mark.postgres
@pytest.mark.slow
def test_on_postgresql_serve_reads_a_run_page_again_once_its_session_was_ended(db: str, tmp_path: Path) -> None:
    """The page that met the lost session says so; the next one reads on a new session
    (every run page was a 500, 'the connection is closed', until serve was restarted)."""
    from attempt_kernel.postgres import PgJournal

    async def go() -> None:
        with PgJournal(db) as journal:
            report = await Executor(journal, let_go_after=0).run(APPROVER, "p-1")
            assert report.status == "waiting"

    asyncio.run(go())
    process, url = start_serve(tmp_path, db, "--port", "0")
    try:
        client = Client(url)
        assert client.get("/runs/p-1")[0] == 200
        end_other_sessions(db)
        lost_status, lost_page = client.get("/runs/p-1")
        status, page = client.get("/runs/p-1")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=TIMEOUT)
    assert lost_status == 500
    assert "terminating connection due to administrator command" in lost_page
    assert status == 200
    assert "<td>open: waiting</td>" in page

# --------------------------------------------------------------------------
# Values the log may hold, however odd
# --------------------------------------------------------------------------


def with_payload(log: Path, run: str, payload_json: bytes) -> None:
    """Append signal 'approve' for ``run`` with ``payload_json`` as its payload, as another tool
    may have written it: the writer's line for a placeholder payload, the JSON put in its
    place and the checksum made again (the CRC-32 of the line without its crc field)."""
    send_signal(log, run, "approve", "PLACEHOLDER")
    *kept, last = log.read_bytes().splitlines(keepends=True)
    body = last[: last.rindex(b',"crc":"')].replace(b'"PLACEHOLDER"', payload_json) + b"}"
    line = body[:-1] + b',"crc":"%08x"}\n' % zlib.crc32(body)
    log.write_bytes(b"".join(kept) + line)


def test_a_payload_nested_980_deep_is_shown_shortened_on_the_run_page(approvals: Path) -> None:
    """Valid JSON that the CLI recorded: the page shows it cut at its 20th level, where rendering
    it recursed past Python's limit (RecursionError: an empty reply)."""
    with_payload(approvals, "a-1", b"[" * 980 + b"]" * 980)
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/runs/a-1")
    assert status == 200, page
    shown_payload = "[" * 20 + "[…]" + "]" * 20  # 20 levels open, the 21st shortened
    assert f'<tr><td>#1</td><td>approve</td><td class="mono">{shown_payload}</td>' in page


SHORT_CASES: list[tuple[JSON, int, str]] = [
    ({"by": "ada", "ok": [1, 2.5, True, None]}, 80, '{"by":"ada","ok":[1,2.5,true,null]}'),
    ("é", 80, '"\\u00e9"'),
    ([[], {}], 80, "[[],{}]"),
    (list(range(30)), 20, "[0,1,2,3,4,5,6,7,..."),
]


@pytest.mark.parametrize(("value", "limit", "text"), SHORT_CASES, ids=["object", "non-ascii", "empty", "cut"])
def test_short_writes_compact_json_cut_to_its_limit(value: JSON, limit: int, text: str) -> None:
    assert short(value, limit) == text


def test_the_signal_form_is_not_filled_with_a_waited_name_no_signal_can_carry(tmp_path: Path) -> None:
    """A hand-built log may have a run wait for a name with a control character, which no
    signal may carry. The form was filled with the name as shown, ``a\\x1bb`` (printable),
    so its button recorded a signal of that other name, which the run does not wait for; the
    field is left empty for such a name now, and a printable one is still filled in."""
    log = tmp_path / "waits.jsonl"
    with RunLogWriter(log) as writer:
        for run, name in (("w-odd", "a\x1bb"), ("w-ok", "<go> \"now\"")):
            writer.append(run, RunStarted(workflow="wf", code=True, nonce="n"))
            writer.append(run, WaitStarted(position=1, signal=name))
        writer.flush()
    with serving(str(log)) as url:
        client = Client(url)
        odd, ok = client.get("/runs/w-odd")[1], client.get("/runs/w-ok")[1]
    assert '<input type="text" name="name" required value="">' in odd
    assert '<input type="text" name="name" required value="&lt;go&gt; &#34;now&#34;">' in ok


def test_a_signal_name_with_spaces_is_recorded_exactly_as_sent(approvals: Path) -> None:
    """' go ' is a name of its own: the form's value was trimmed, recording 'go'."""
    with serving(str(approvals)) as url:
        status, flash = Client(url).act("a-1", "signal", name=" go ", payload=" 1 ")
    assert (status, flash) == (303, "Signal ' go ' sent to run a-1: recorded in the log.")
    [sent] = [r.change for r in records(approvals) if isinstance(r.change, SignalSent)]
    assert (sent.name, sent.payload) == (" go ", 1)


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("name=%FFgo", "400 Bad Request: the form holds bytes that are not UTF-8; nothing was written.\n"),
        ("name=go&name=stop", "400 Bad Request: the form gives 'name' 2 times; nothing was written.\n"),
        ("name=n%ED%B2%80", "400 Bad Request: the form holds bytes that are not UTF-8; nothing was written.\n"),
        ("name=go&payload=%22%ED%B2%80%22", "400 Bad Request: the form holds bytes that are not UTF-8; nothing was written.\n"),
    ],
    ids=["not-utf8", "twice", "surrogate-name", "surrogate-payload"],
)
def test_a_form_that_cannot_be_taken_as_sent_is_a_400_and_writes_nothing(
    approvals: Path, body: str, said: str
) -> None:
    """A name that is not UTF-8 was recorded with U+FFFD in its place; of two names, the first.
    And %ED%B2%80, a surrogate's bytes (no UTF-8 holds them, no browser sends them), was taken
    for a lone surrogate: a payload holding it was recorded, in a PostgreSQL journal too, where
    the CLI refuses any such argument."""
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        client = Client(url)
        token = urllib.parse.quote(client.token("a-1"))
        request = urllib.request.Request(
            url + "runs/a-1/signal", data=f"csrf={token}&{body}".encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            client.opener.open(request, timeout=TIMEOUT)
        with refused.value as answer:
            status, text = answer.code, answer.read().decode()
    assert (status, text) == (400, said)
    assert nothing_written(approvals, before)


def test_a_query_that_is_not_utf8_is_a_400_naming_it(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/?workflow=%FFapprover")
    assert status == 400
    assert "the query holds bytes that are not UTF-8; nothing was listed." in page


def test_a_limit_of_thousands_of_digits_is_a_400_naming_it(approvals: Path) -> None:
    """Past 4300 digits ``int()`` raises ValueError: the page still names the limit, the
    connection is not dropped."""
    with serving(str(approvals)) as url:
        status, page = Client(url).get("/?limit=" + "9" * 5000)
    assert status == 400
    assert "is not a number from 1 to 500" in page


@pytest.mark.parametrize("path", ["/runs/%FFa-1", "/runs/a-1%FF/signal"], ids=["page", "action"])
def test_a_path_that_is_not_utf8_is_a_400_naming_it_and_writes_nothing(approvals: Path, path: str) -> None:
    """No run id holds such bytes (a log's JSON cannot): the request is refused, not dropped."""
    before = approvals.read_bytes()
    with serving(str(approvals)) as url:
        client = Client(url)
        token = client.token("a-1")
        fields = {"csrf": token, "name": "approve"} if path.endswith("/signal") else None
        status, _, page = client.request(path, fields)
    assert status == 400
    assert "the path holds bytes that are not UTF-8; nothing was done." in page
    assert nothing_written(approvals, before)


ODD_WORKFLOWS = ("w\x1b[31m", "w\r\nx", "a&b=c+d%20", "\u202eright")


def add_run_of(log: Path, workflow_name: str, run: str) -> None:
    """A run of a one-step workflow named ``workflow_name``, which succeeds."""

    @workflow(workflow_name)
    async def flow(ctx: RunContext) -> JSON:
        return 1

    async def go() -> None:
        with RunLogWriter(log) as writer:
            report = await Executor(writer, let_go_after=0).run(flow, run)
            assert report.status == "succeeded"

    asyncio.run(go())


def test_each_workflows_filter_link_and_option_select_exactly_its_runs(tmp_path: Path) -> None:
    """Names with ESC, a line break, URL syntax and a right-to-left override: the workflow's link in
    the list and its option in the filter give back exactly that name (the option's value was
    the escaped text, so the filter it sent matched no workflow)."""
    log = tmp_path / "odd.jsonl"
    for n, name in enumerate(ODD_WORKFLOWS, 1):
        add_run_of(log, name, f"r-{n}")
    with serving(str(log)) as url:
        client = Client(url)
        page = client.get("/")[1]
        links = dict(
            (html.unescape(text), html.unescape(href))
            for href, text in re.findall(r'<td><a href="(/\?workflow=[^"]*)" title="[^"]*">(.*?)</a></td>', page)
        )
        options = [as_parsed(v) for v in re.findall(r'<option value="([^"]*)"', page)]
        by_link = {text: run_ids(client.get(href)[1]) for text, href in links.items()}
        # What a browser sends for an option: its value, form-encoded (line breaks aside: it writes CRLF).
        by_option = {
            value: run_ids(client.get("/?" + urllib.parse.urlencode({"workflow": value}))[1])
            for value in options if value and value not in LISTED_STATUSES_TEXT
        }
    assert "\x1b" not in page and "\u202e" not in page
    assert by_option == {"w\x1b[31m": ["r-1"], "w\r\nx": ["r-2"], "a&b=c+d%20": ["r-3"], "\u202eright": ["r-4"]}
    assert by_link == {
        "w\\x1b[31m": ["r-1"], "w\\r\\nx": ["r-2"], "a&b=c+d%20": ["r-3"], "\\u202eright": ["r-4"],
    }  # fmt: skip


def as_parsed(attribute: str) -> str:
    """An attribute's value as a browser's HTML parser reads it: a numeric character reference
    to a control character is that character (Python's html.unescape drops it instead)."""
    return html.unescape(re.sub(r"&#([0-9]+);", lambda m: chr(int(m.group(1))), attribute))


LISTED_STATUSES_TEXT = ("queued", "running", "waiting", "interrupted", "needs-reconciliation", "succeeded", "failed", "cancelled")


@pytest.mark.parametrize("run", [".", ".."])
def test_a_run_named_dot_or_dot_dot_is_linked_through_the_query_and_its_forms_work(
    tmp_path: Path, run: str
) -> None:
    """``/runs/.`` and ``/runs/%2E`` alike are resolved away by browsers before they are sent (the
    list linked to ``/runs/.``): the link and the forms carry such an id in the query."""
    log = add_waiting_runs(tmp_path / "dots.jsonl", run)
    with serving(str(log)) as url:
        client = Client(url)
        [href] = re.findall(r'<td class="mono"><a href="([^"]*)">', client.get("/")[1])
        status, page = client.get(html.unescape(href))
        assert status == 200, page
        [token] = re.findall(r'name="csrf" value="([^"]+)"', page)[:1]
        [action] = re.findall(r'<form method="post" action="([^"]*)" id="signal-form">', page)
        posted, headers, _ = client.request(html.unescape(action), {"csrf": token, "name": "approve"})
    assert html.unescape(href) == f"/runs/?id={run}"
    assert f'<h1 id="run-id">{run}</h1>' in page
    assert html.unescape(action) == f"/runs//signal?id={run}"
    assert (posted, headers["Location"]) == (303, f"/runs/?id={run}")
    assert [(r.run, r.change.name) for r in records(log) if isinstance(r.change, SignalSent)] == [(run, "approve")]


# --------------------------------------------------------------------------
# Server limits: the listen backlog, idle connections, the Origin of a POST
# --------------------------------------------------------------------------


@contextlib.contextmanager
def serving_on(log: Path, host: str, **options: float) -> Generator[tuple[str, int], None, None]:
    """A server for ``log`` bound to ``host`` on a free port (``options``: open_server's); (host, port)."""
    view = WebView(str(log), FileLog(str(log)), shown_as=str(log))
    server = open_server(view, host, 0, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield host, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read a socket's backlog")
def test_the_server_listens_with_a_backlog_of_128(approvals: Path) -> None:
    """http.server's default of 5 refused connections when 100 browsers' requests came at once."""
    with serving_on(approvals, "127.0.0.1") as (_, port):
        listed = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=TIMEOUT, check=True
        ).stdout.split()
    assert listed[:3] == ["LISTEN", "0", "128"]  # state, queued now, backlog


def test_a_silent_connection_is_closed_after_the_idle_timeout(approvals: Path) -> None:
    """A client that connects and says nothing no longer holds a thread for good."""
    with serving_on(approvals, "127.0.0.1", idle_timeout=0.2) as (host, port):
        with socket.create_connection((host, port), timeout=TIMEOUT) as silent:
            closed = silent.recv(1)  # waits for the server to close it, for at most TIMEOUT
        assert closed == b""
        assert Client(f"http://{host}:{port}/").get("/")[0] == 200  # and the server goes on


def test_a_post_from_another_origin_is_refused_and_writes_nothing(approvals: Path) -> None:
    """On 0.0.0.0 no Host is refused, so a page whose name an attacker points at this machine
    (DNS rebinding) could read a form's token and post it: its Origin names no address of
    this server, and the POST is refused. A form from the server's own page is not."""
    before = approvals.read_bytes()
    with serving_on(approvals, "0.0.0.0") as (_, port):
        client = Client(f"http://127.0.0.1:{port}/")
        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        refused = client.request("/runs/a-1/cancel", {"csrf": client.token("a-1")}, headers=evil)
        unchanged = approvals.read_bytes() == before
        own = {"Origin": f"http://127.0.0.1:{port}"}
        accepted = client.request("/runs/a-1/cancel", {"csrf": client.token("a-1")}, headers=own)[0]
    assert refused[0] == 403
    assert refused[2] == (
        f"403 Forbidden: a form posted from http://evil.example:{port}, not from this server's own pages;"
        " nothing was written.\n"
    )
    assert unchanged
    assert accepted == 303


@pytest.mark.parametrize(
    ("origin", "host", "local", "ok"),
    [
        ("http://192.0.2.2:8421", "192.0.2.2:8421", "192.0.2.2", True),
        ("http://192.0.2.2:8421", "192.0.2.2:8421", "::ffff:192.0.2.2", True),  # --host ::, over IPv4
        ("http://[fd00::2]:8421", "[fd00::2]:8421", "fd00::2", True),
        ("http://192.0.2.9:8421", "192.0.2.9:8421", "::ffff:192.0.2.2", False),  # not the address it came to
        ("http://192.0.2.2:8421", "192.0.2.2:9999", "192.0.2.2", False),  # not the page's own Host
        ("null", "192.0.2.2:8421", "192.0.2.2", False),
    ],
    ids=["ipv4", "ipv4 on a dual-stack socket", "ipv6", "another address", "another port", "null"],
)
def test_an_origin_is_this_servers_own_when_it_names_the_address_the_connection_came_to(
    origin: str, host: str, local: str, ok: bool
) -> None:
    assert _origin_ok(origin, host, local) is ok


# --------------------------------------------------------------------------
# Errors: http.server's own pages carry the headers too; a GET of an action is a 405
# --------------------------------------------------------------------------


def raw_answer(url: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    """``method path`` sent as it is (http.client), the status and headers of the answer."""
    split = urllib.parse.urlsplit(url)
    assert split.hostname is not None
    connection = http.client.HTTPConnection(split.hostname, split.port, timeout=TIMEOUT)
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status, dict(answer.headers.items())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("method", "headers", "status"),
    [("PUT", {}, 501), ("POST", {"Content-Length": str(2 << 20)}, 413)],
    ids=["unknown-method", "too-large"],
)
def test_http_servers_own_error_pages_carry_the_security_headers(
    approvals: Path, method: str, headers: dict[str, str], status: int
) -> None:
    with serving(str(approvals)) as url:
        answered, sent = raw_answer(url, method, "/runs/a-1/signal", headers)
    assert answered == status
    assert {name: sent.get(name) for name in (
        "X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options", "Cache-Control",
    )} == {
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
        "Cache-Control": "no-store",
    }  # fmt: skip
    assert sent["Content-Security-Policy"].startswith("default-src 'none';")


def test_a_get_of_an_action_is_405_allowing_post(approvals: Path) -> None:
    with serving(str(approvals)) as url:
        status, headers, page = Client(url).request("/runs/a-1/cancel")
    assert (status, headers.get("Allow")) == (405, "POST")
    assert "GET is not served here: an action is a form&#39;s POST." in page
    assert headers["X-Frame-Options"] == "DENY"


def test_a_content_length_of_thousands_of_digits_is_a_413(approvals: Path) -> None:
    """``int()`` refuses more than 4300 digits: such a length is too large, not a dropped connection."""
    with serving(str(approvals)) as url:
        answered, _ = raw_answer(url, "POST", "/runs/a-1/signal", {"Content-Length": "9" * 5000})
    assert answered == 413


def test_the_docs_exit_codes_of_serve_are_those_it_exits_with(capsys: pytest.CaptureFixture[str]) -> None:
    """An unreachable database exits 3 (as every command given a URL), and a stop during a
    resume 130 or 143: docs/web.md's list of exit codes said 0 and 2 only."""
    assert main(["serve", "postgresql://ak@127.0.0.1:1/jobs", "--port", "0"]) == 3
    assert "cannot connect to PostgreSQL at 127.0.0.1:1, database jobs" in capsys.readouterr().err
    doc = (TESTS.parent / "docs" / "web.md").read_text()
    said = " ".join(doc.partition("\nExit codes: ")[2].partition("\n\n")[0].split())
    assert said.startswith("0 when stopped, 2 for a usage or I/O error"), said
    assert "3 when the database of a postgresql:// URL cannot be reached" in said, said
    assert "130 (SIGINT) or 143 (SIGTERM)" in said, said


@pytest.mark.slow  # its log comes from `attempt-kernel demo` in a subprocess
def test_a_reconciled_run_waiting_for_recovery_is_interrupted_and_may_be_resumed(trip_log: Path) -> None:
    """trip-1 ended needing reconciliation; once its key is reconciled it is unfinished
    again, waiting for a recovery, as `runs` says (`interrupted`), even while another
    process holds the log, and Resume goes on with it: the page must not call it
    `running`, nor say that resume is refused."""
    [key] = [k for entry in replay(trip_log).indeterminate for k in entry.outstanding]
    assert main(["reconcile", str(trip_log), "--key", key, "--rejected"]) == 0
    with serving(str(trip_log)) as url, RunLogWriter(trip_log):  # another process writes the log
        status, page = Client(url).get(run_path("trip-1"))
    assert status == 200
    assert '<span class="badge s-interrupted" id="run-status">interrupted</span>' in page
    assert "resume are refused" not in page
