"""The web view of a run log or journal (``attempt-kernel serve``): pages and actions.

What it owns: turning HTTP requests into pages (the run list, one run with
its timeline, intents, waits and signals) and operators' actions (signal,
cancel, reconcile, resume) into calls of the operations module, the one
the command line calls too. What it must not do: decide anything about a
run itself. Where a run stands comes from the ledger, its history from
``_history``, every change it writes from ``_operations`` (which refuses,
writing nothing, what may not be done), its words from ``_report``.

Security model (docs/web.md says it for operators): it listens on the
loopback interface unless told otherwise; every page is rendered by Jinja2
with autoescape, so names read from a log are text, never markup, and a
Content-Security-Policy forbids scripts anyway; each action is a POST whose
form carries a token, an HMAC (under a secret drawn when the process
starts) of the browser's session cookie (SameSite=Strict) and a numbered nonce, spent by
its first POST (`_spend`); a
POST without a valid one is refused with 403 before anything is read or
written. On loopback, a request whose Host header is not a loopback name is
refused too, so a page from elsewhere cannot reach it by DNS rebinding; on
any address, a POST whose Origin is not one of this server's own pages is
refused (`_origin_ok`). The socket queues `LISTEN_BACKLOG` connections, and
a connection silent for `IDLE_TIMEOUT` seconds is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import http.cookies
import ipaddress
import json
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Final, Literal, get_args
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import jinja2
from markupsafe import Markup, escape  # Jinja2's own dependency
from typing_extensions import TypeAlias, assert_never, final

from ._codec import cause_name, intent_cause_name, intent_state_name, state_name, strict_json
from ._errors import AttemptKernelError
from ._history import IntentEvent, RunHistory, run_history
from ._ledger import Ledger, RunStanding
from ._operate import Delivered, OperationRefused
from ._executor import Stopper
from ._operations import (
    cancel_run, held_runs, listed_runs, no_such_run, reconcile_intent, resume_run, send_signal, submitted_for,
)  # fmt: skip
from ._runlist import LISTED_STATUSES, RunFilter, listed_status, select
from ._records import JSON, LogItem, RunCancelRequested
from ._report import short, shown, when
from ._store import LogSource, is_url
from ._web_pages import STYLE, TEMPLATES
from ._web_timeline import timeline
from ._workflow import Workflow

MetricsHook: TypeAlias = Callable[[], "tuple[bytes, str]"]
"""What ``/metrics`` serves: a callable returning the body and its content type."""

FlashKind: TypeAlias = Literal["ok", "refused"]

Action: TypeAlias = Literal["signal", "cancel", "reconcile", "resume"]
"""What a run page's forms post: the operator's actions."""
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 500
MAX_BODY: Final = 1 << 20
"""The largest form accepted, in bytes (a signal's payload rides in it)."""
RESUME_WAIT: Final = 2.0
"""Seconds a resume request waits for what resuming did, before it answers anyway."""
RESUME_GRACE: Final = 5.0
"""Seconds a resumed run's live attempts get when the server is stopped (`WebView.stop_resumes`)."""
LISTEN_BACKLOG: Final = 128
"""Connections the kernel queues before the server accepts them (http.server's default is 5)."""
IDLE_TIMEOUT: Final = 30.0
"""Seconds a connection may stay silent before it is closed, so a client cannot hold a thread."""
STOP_GRACE: Final = 10.0
"""Seconds a stopped server waits for the requests it is answering (an action half done) to be answered."""
SPENT_KEPT: Final = 10_000
"""Spent form tokens the server tells apart; past this many, the oldest forms count as spent."""
SESSION_COOKIE: Final = "ak_session"
LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.", "ip6-localhost"})

SECURITY_HEADERS: Final = (
    # No page carries a script; a name that escaped escaping still could not run.
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
     " frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
    ("X-Frame-Options", "DENY"),
    ("Cache-Control", "no-store"),
)  # fmt: skip


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Flash:
    """A message shown once, at the top of the next page this browser loads."""

    kind: FlashKind
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """What the server sends back for one request."""

    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    location: str | None = None
    set_cookie: str | None = None
    allow: str | None = None
    """The methods a 405 names (its ``Allow`` header)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request as the view needs it: method, path, query, headers, body."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""
    local: str = ""
    """The address the connection came in to (the server's end), for the Origin check."""


def is_loopback(host: str) -> bool:
    """Does ``host`` (a name or an address to bind or that a Host header names) mean this machine only?"""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _names_loopback(host_header: str) -> bool:
    """Does a Host header (``127.0.0.1:8421``, ``[::1]:8421``, ``localhost``) name this machine?"""
    try:
        name = urlsplit(f"//{host_header}").hostname
    except ValueError:  # "[" with no "]", say
        return False
    return name is not None and is_loopback(name)


def _host_and_port(authority: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of ``name:port``, ``[::1]:port`` or ``name`` (lowercase), or None."""
    try:
        split = urlsplit(f"//{authority}")
        return (split.hostname or "", split.port)
    except ValueError:  # "[" with no "]", a port that is not a number
        return None


def _origin_ok(origin: str, host_header: str, local: str) -> bool:
    """May a POST carrying ``Origin: origin`` act? (DNS rebinding, on an address that is not loopback.)

    The origin must be the page's own (the Host the request names, over http) and name this
    server: a loopback name or address, the address the connection came in to, or this
    machine's host name. A page from a name an attacker points at this address (its Origin
    and Host then agree) is refused.
    """
    try:
        split = urlsplit(origin)
        origin_host, origin_port = split.hostname, split.port
    except ValueError:
        return False
    host = _host_and_port(host_header)
    if split.scheme != "http" or origin_host is None or host is None:
        return False
    if (origin_host, origin_port or 80) != (host[0], host[1] or 80):
        return False
    if is_loopback(origin_host):
        return True
    try:
        came_to = ipaddress.ip_address(local.partition("%")[0])
        # A dual-stack socket (--host ::) sees an IPv4 client at ::ffff:a.b.c.d.
        if isinstance(came_to, ipaddress.IPv6Address) and came_to.ipv4_mapped is not None:
            came_to = came_to.ipv4_mapped
        if ipaddress.ip_address(origin_host) == came_to:
            return True
    except ValueError:
        pass
    return origin_host in {socket.gethostname().lower(), socket.getfqdn().lower()}


def _json_field(text: str, field: str) -> JSON:
    """Strict JSON from a form field (NaN and Infinity refused), or `OperationRefused`."""
    try:
        value = strict_json(text)
    except json.JSONDecodeError as error:
        raise OperationRefused(
            f"the {field} is not JSON: {error.msg} at line {error.lineno} column {error.colno};"
            " nothing was written"
        ) from None
    except ValueError as error:
        raise OperationRefused(f"the {field} is not JSON: {error}; nothing was written") from None
    return value


_FILTER_TIME: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,6}))?)?)?Z?"
)
"""What the since and until filters take (docs/web.md): a date, a time to the minute or the
second (a datetime-local field's value), or the CLI's form with its fraction and ``Z``."""


def _parse_time(text: str, field: str) -> int | None:
    """``YYYY-MM-DD[THH:MM[:SS[.ffffff]]][Z]`` (UTC) as microseconds; None when empty;
    ValueError naming ``field``. Only these forms: ``datetime.fromisoformat`` takes any
    character between the date and the time (a NUL, a lone surrogate), and offsets."""
    if not text:
        return None
    matched = _FILTER_TIME.fullmatch(text)
    problem = f"{field}: {text!r} is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM)"
    if matched is None:
        raise ValueError(problem)
    year, month, day, hour, minute, second = (int(part or "0") for part in matched.groups()[:6])
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError as error:  # a 30th of February, an hour 25
        raise ValueError(f"{problem}: {error}") from None
    seconds = int((moment - datetime(1970, 1, 1, tzinfo=timezone.utc)).total_seconds())
    return seconds * 1_000_000 + int((matched.group(7) or "").ljust(6, "0"))


def _ascii_number(text: str, most: int) -> int | None:
    """``text`` as a number when it is ASCII digits, else None; any number above ``most`` as
    ``most + 1`` (``int`` refuses a text of more than 4300 digits, and none is needed)."""
    if not (text.isascii() and text.isdigit()):
        return None
    if len(text.lstrip("0")) > len(str(most)):
        return most + 1
    return int(text)


def _action(name: str) -> Action | None:
    for action in ACTIONS:
        if action == name:
            return action
    return None


def _one(params: Mapping[str, list[str]], name: str) -> str:
    """The value of field ``name`` exactly as sent (``""`` when absent); `_fields` saw it is one."""
    values = params.get(name)
    return values[0] if values else ""


class _BadForm(Exception):
    """A query or form the view will not read: not UTF-8, or a field given twice."""


def _fields(text: str, where: str, *, surrogates: bool = True) -> dict[str, list[str]]:
    """The fields of a query string or urlencoded form, values exactly as sent.

    `_BadForm` (a 400 saying what) where a value is not UTF-8 once decoded,
    or a field comes twice: guessing (a U+FFFD in a signal's name, the first
    of two names) would write what nobody sent. ``surrogates``: a surrogate's
    bytes (``%ED%B2%80``) are taken for it, as the links a page makes carry a
    run id or a workflow name holding one (`_quoted`); a form (False) takes
    UTF-8 alone, as a browser sends it, and writes no lone surrogate.
    """
    try:
        fields = parse_qs(text, keep_blank_values=True, errors="surrogatepass" if surrogates else "strict")
    except UnicodeDecodeError:
        raise _BadForm(f"the {where} holds bytes that are not UTF-8") from None
    for name, values in fields.items():
        if len(values) > 1:
            raise _BadForm(f"the {where} gives {shown(name)!r} {len(values)} times")
    return fields


def _exact_attribute(value: str) -> Markup:
    """``value`` for an HTML attribute, given back as it is by the browser's parser: markup
    escaped, and every non-printable character as a numeric character reference, never raw."""
    escaped = str(escape(value))
    return Markup("".join(c if c.isprintable() else f"&#{ord(c)};" for c in escaped))


DOT_SEGMENTS: Final = frozenset({".", ".."})
"""Run ids a path cannot carry: browsers resolve ``/runs/.`` and ``/runs/..``, and their
percent-encoded forms (``%2E``) too, before sending them."""


def _quoted(text: str) -> str:
    """``text`` percent-encoded for a path segment; a lone surrogate (a name JSON can hold,
    UTF-8 cannot) as its surrogate-escaped bytes, which `unquote` gives back."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def _query(fields: Mapping[str, str]) -> str:
    """A query string of ``fields``, its values encoded as `_quoted` encodes them."""
    return urlencode(fields, encoding="utf-8", errors="surrogatepass")


def _run_href(run: str) -> str:
    """The run's page: ``/runs/RUN`` percent-encoded; ``/runs/?id=RUN`` for ``.`` and ``..``."""
    if run in DOT_SEGMENTS:
        return "/runs/?" + _query({"id": run})
    return "/runs/" + _quoted(run)


def _action_href(run: str, action: Action) -> str:
    """Where a run's form posts ``action``: ``/runs/RUN/ACTION``; ``/runs//ACTION?id=RUN`` for ``.`` and ``..``."""
    if run in DOT_SEGMENTS:
        return f"/runs//{action}?" + _query({"id": run})
    return f"/runs/{_quoted(run)}/{action}"


def _sent_key(text: str) -> str:
    """The idempotency key a reconcile form sent: its page writes it percent-encoded
    (`_quoted`), so that any key comes back exactly; a key already plain (``ak1-...``,
    as the kernel makes them) reads as itself."""
    try:
        return unquote(text, errors="surrogatepass")
    except UnicodeDecodeError:  # bytes no key holds: refused as an unknown key is
        raise OperationRefused(f"no intent has key {text!r}: its bytes are not UTF-8; nothing was written") from None


def _event_text(event: IntentEvent) -> str:
    text = (
        f"{when(event.time_us)} {intent_state_name(event.from_state)} ->"
        f" {intent_state_name(event.to_state)} ({intent_cause_name(event.cause)})"
    )
    if event.by is not None:
        text += f" by {shown(event.by)}" + (f": {shown(event.note)}" if event.note else "")
    if event.result is not None:
        text += f" result {shown(short(event.result))}"
    return text


class WebView:
    """The pages and actions of one log or journal, answering `Request` s with `Response` s.

    ``log`` is what the operations are given (a file's path or a
    ``postgresql://`` URL); ``source`` reads it; ``shown_as`` names it on
    the pages (a URL without its password). ``workflows``: what resume may
    drive in this process (a file log). ``one_run``, when given, reads one
    run's records (a PostgreSQL journal's `read_run`), so that a run's page
    never reads the whole journal. ``metrics``: what ``/metrics`` serves,
    when given. ``clock``: seconds since the epoch, for drawing open
    bars up to now.
    """

    def __init__(
        self,
        log: str,
        source: LogSource,
        *,
        shown_as: str,
        workflows: Iterable[Workflow] = (),
        one_run: Callable[[str], Iterable[LogItem]] | None = None,
        metrics: MetricsHook | None = None,
        clock: Callable[[], float] = time.time,
        loopback_only: bool = True,
    ) -> None:
        self.log: Final = log
        self._source: Final = source
        self._shown_as: Final = shown_as
        self._workflows: Final = tuple(workflows)
        self._one_run: Final = one_run
        self._metrics: Final = metrics
        self._clock: Final = clock
        self._loopback_only = loopback_only
        self._secret: Final = secrets.token_bytes(32)
        self._env: Final = jinja2.Environment(
            loader=jinja2.DictLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        # Names from the log shown as text: non-printable characters escaped
        # (then HTML-escaped by autoescape); a form's value keeps the raw name.
        self._env.filters["shown"] = shown
        # A form's value that must come back exactly: escaped, and its non-printable
        # characters written as character references (an ESC stays an ESC, not raw).
        self._env.filters["exact"] = _exact_attribute
        # A PostgreSQL journal reads through one connection: one reader at a time.
        self._read_lock: Final = threading.Lock()
        self._flash_lock: Final = threading.Lock()
        self._flashes: Final[dict[str, list[Flash]]] = {}
        self._resuming: Final[set[str]] = set()
        # What stops the resumes this server drives when it is stopped itself
        # (`stop_resumes`): they run in threads, where no signal reaches.
        self._stopper: Final = Stopper()
        self._resume_threads: Final[dict[str, threading.Thread]] = {}
        # Form tokens are numbered as they are made; each acts once (`_spend`).
        self._token_lock: Final = threading.Lock()
        self._tokens_made = 0
        self._spent: Final[set[int]] = set()
        self._spent_below = 0

    def set_loopback_only(self, value: bool) -> None:
        """Refuse (or not) requests whose Host header is not a loopback name."""
        self._loopback_only = value

    # ------------------------------------------------------------ plumbing

    def _read_run(self, run: str) -> list[LogItem]:
        """The records a run's page needs: that run's alone where the store can read one run."""
        with self._read_lock:
            if self._one_run is not None:
                return list(self._one_run(run))
            return list(self._source.read())

    def _held(self) -> frozenset[str] | None:
        return held_runs(self.log)

    def _token(self, session: str) -> str:
        with self._token_lock:
            self._tokens_made += 1
            number = self._tokens_made
        nonce = f"{number:x}-{secrets.token_hex(8)}"
        mac = hmac.new(self._secret, f"{session}:{nonce}".encode(), hashlib.sha256).hexdigest()
        return f"{nonce}.{mac}"

    def _spend(self, token: str) -> bool:
        """Spend a token `_token_ok` accepted; False when it was spent already (its form was
        sent before: a double click, a resend), so that one form acts once. The numbers of
        the last `SPENT_KEPT` spent tokens are kept; past that, every older form counts as spent."""
        number_text, _, _ = token.partition("-")
        try:
            number = int(number_text, 16)
        except ValueError:  # made by this process (its MAC matched), so never
            return False
        with self._token_lock:
            if number < self._spent_below or number in self._spent:
                return False
            self._spent.add(number)
            if len(self._spent) > SPENT_KEPT:
                kept = sorted(self._spent)[len(self._spent) // 2 :]
                self._spent_below = kept[0]
                self._spent.clear()
                self._spent.update(kept)
            return True

    def _token_ok(self, session: str | None, token: str) -> bool:
        if not session:
            return False
        nonce, dot, mac = token.partition(".")
        if not dot:
            return False
        expected = hmac.new(self._secret, f"{session}:{nonce}".encode(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, mac)

    def _flash(self, session: str, flash: Flash) -> None:
        with self._flash_lock:
            self._flashes.setdefault(session, []).append(flash)

    def _take_flashes(self, session: str) -> list[Flash]:
        with self._flash_lock:
            return self._flashes.pop(session, [])

    def _page(
        self, template: str, session: str, status: int = 200, *, extra: Sequence[Flash] = (), **values: object
    ) -> Response:
        html = self._env.get_template(template).render(
            source=shown(self._shown_as), flashes=[*self._take_flashes(session), *extra], **values
        )
        return Response(status=status, body=html.encode())

    def _message(self, session: str, status: int, heading: str, message: str) -> Response:
        return self._page("message.html", session, status, heading=heading, message=message)

    def _not_allowed(self, session: str, method: str, allow: str, why: str) -> Response:
        page = self._message(session, 405, "Method not allowed", f"{shown(method)} is not served here: {why}.")
        return Response(status=405, body=page.body, allow=allow)

    # ------------------------------------------------------------ dispatch

    def respond(self, request: Request) -> Response:
        """The response to ``request`` (never raises for what a client sends)."""
        cookies = http.cookies.SimpleCookie()
        try:
            cookies.load(request.headers.get("cookie", ""))
        except http.cookies.CookieError:
            pass
        morsel = cookies.get(SESSION_COOKIE)
        known = morsel.value if morsel is not None and len(morsel.value) == 32 else None
        session = known or secrets.token_hex(16)
        response = self._route(request, session, known)
        if known is None:
            cookie = f"{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict"
            response = Response(
                status=response.status, body=response.body, content_type=response.content_type,
                location=response.location, set_cookie=cookie, allow=response.allow,
            )  # fmt: skip
        return response

    def _route(self, request: Request, session: str, known: str | None) -> Response:
        if self._loopback_only and not _names_loopback(request.headers.get("host", "")):
            return self._message(
                session, 403, "Refused",
                "This server answers to its loopback address only (127.0.0.1 or localhost).",
            )  # fmt: skip
        split = urlsplit(request.target)
        try:
            parts = [unquote(p, errors="surrogatepass") for p in split.path.split("/")[1:]]
        except UnicodeDecodeError:  # no run id holds such bytes (`_quoted`)
            return self._message(
                session, 400, "Bad request", "the path holds bytes that are not UTF-8; nothing was done."
            )
        if len(parts) in (2, 3) and parts[0] == "runs" and parts[1] == "" and split.query:
            # /runs/?id=RUN and /runs//ACTION?id=RUN: a run id no path can carry (`_run_href`)
            try:
                query = _fields(split.query, "query")
            except _BadForm as error:
                return self._message(session, 400, "Bad request", f"{error}; nothing was done.")
            parts[1] = _one(query, "id")
        try:
            # Routes are paths, not a closed union: plain comparisons, no match.
            if request.method in ("GET", "HEAD"):
                if parts == [""]:
                    try:
                        query = _fields(split.query, "query")
                    except _BadForm as error:
                        return self._message(session, 400, "Bad request", f"{error}; nothing was listed.")
                    return self._runs_page(query, session)
                if len(parts) == 2 and parts[0] == "runs":
                    return self._run_page(parts[1], session)
                if len(parts) == 3 and parts[0] == "runs" and _action(parts[2]) is not None:
                    return self._not_allowed(session, request.method, "POST", "an action is a form's POST")
                if parts == ["style.css"]:
                    return Response(status=200, body=STYLE.encode(), content_type="text/css; charset=utf-8")
                if parts == ["metrics"]:
                    return self._metrics_page(session)
                return self._message(session, 404, "Not found", f"Nothing at {shown(split.path)}.")
            if request.method == "POST":
                origin = request.headers.get("origin")
                if origin is not None and not _origin_ok(origin, request.headers.get("host", ""), request.local):
                    return Response(
                        status=403,
                        body=f"403 Forbidden: a form posted from {shown(origin)}, not from this server's"
                        " own pages; nothing was written.\n".encode(),
                        content_type="text/plain; charset=utf-8",
                    )
                if len(parts) == 3 and parts[0] == "runs":
                    run, name = parts[1], parts[2]
                    chosen = _action(name)
                    if chosen is None:
                        return self._message(session, 404, "Not found", f"No action {shown(name)!r}.")
                    return self._post(run, chosen, request.body, known)
                return self._message(session, 404, "Not found", f"No action at {shown(split.path)}.")
            return self._message(session, 405, "Method not allowed", f"{shown(request.method)} is not served.")
        except AttemptKernelError as error:  # the log cannot be read (a corrupt file, a lost database)
            return self._message(session, 500, "The log cannot be read", shown(str(error)))

    # ------------------------------------------------------------ /metrics

    def _metrics_page(self, session: str) -> Response:
        # The metrics hook: `attempt_kernel._metrics.metrics_app(journal)` is
        # what `serve` passes as `metrics`; without one there is nothing here.
        if self._metrics is None:
            return self._message(session, 404, "No metrics", "This server was started without metrics.")
        try:
            body, content_type = self._metrics()
        except AttemptKernelError as error:  # the log is a FIFO, a directory, unreadable, corrupt
            # A scraper shows this text as the target's error; 503: no sample was read.
            return Response(
                status=503,
                body=f"The log cannot be read: {shown(str(error))}\n".encode(),
                content_type="text/plain; charset=utf-8",
            )
        return Response(status=200, body=body, content_type=content_type)

    # ------------------------------------------------------------ the run list

    def _runs_page(self, params: Mapping[str, list[str]], session: str) -> Response:
        status_text, workflow = _one(params, "status"), _one(params, "workflow")
        since_text, until_text = _one(params, "since"), _one(params, "until")
        limit_text, older = _one(params, "limit"), _one(params, "older")
        problems: list[str] = []
        # A filter that does not parse is named on the page and left out, links included.
        status = listed_status(status_text) if status_text else None
        if status_text and status is None:
            problems.append(f"status: {status_text!r} is not one of {', '.join(LISTED_STATUSES)}")
            status_text = ""
        try:
            since = _parse_time(since_text, "since")
        except ValueError as error:
            problems.append(str(error))
            since, since_text = None, ""
        try:
            until = _parse_time(until_text, "until")
        except ValueError as error:
            problems.append(str(error))
            until, until_text = None, ""
        limit = DEFAULT_LIMIT
        if limit_text:
            number = _ascii_number(limit_text, MAX_LIMIT)
            if number is not None and 1 <= number <= MAX_LIMIT:
                limit = number
            else:
                problems.append(f"limit: {limit_text!r} is not a number from 1 to {MAX_LIMIT}")
        # What `attempt-kernel runs` lists and how it filters: one function for both.
        rows, violations = listed_runs(self.log, RunFilter())
        only = RunFilter(
            statuses=None if status is None else frozenset({status}),
            workflow=workflow or None,
            since_us=since,
            until_us=until,
            limit=len(rows) or None,  # every run it keeps, newest first
        )
        workflows = sorted({r.workflow for r in rows if r.workflow is not None})
        chosen = select(rows, only)
        start = 0
        if older:
            at = next((i for i, r in enumerate(chosen) if r.run == older), None)
            if at is None:
                problems.append(f"older: no run {shown(older)} among these runs")
            else:
                start = at + 1
        page = chosen[start : start + limit]
        filters = {"status": status_text, "workflow": workflow, "since": since_text, "until": until_text}
        kept = {k: v for k, v in filters.items() if v}
        if limit != DEFAULT_LIMIT:
            kept["limit"] = str(limit)
        older_href = None
        if start + limit < len(chosen) and page:
            older_href = "/?" + _query({**kept, "older": page[-1].run})
        newer_href = ("/?" + _query(kept)) if older else None
        shown_from = start + 1 if page else 0
        summary = f"runs {shown_from}-{start + len(page)} of {len(chosen)}"
        if len(chosen) != len(rows):
            summary += f" (of {len(rows)} in the log)"
        response = self._page(
            "runs.html", session, 400 if problems else 200,
            rows=[
                {
                    "run": shown(r.run), "href": _run_href(r.run),
                    "workflow": shown(r.workflow or "-"), "status": r.status,
                    "workflow_href": None if r.workflow is None else "/?" + _query({"workflow": r.workflow}),
                    "attempts": r.attempts, "started": when(r.started_us), "ended": when(r.ended_us),
                    # as `runs` says it: what a wait takes that came already, or that
                    # it waits for nothing once its cancel was recorded
                    "waiting": "no more: its cancel was recorded" if r.cancel_requested else ", ".join(
                        (f"for signal {shown(repr(w.signal))}" + (
                            ", which came" if w.signal_came else ", whose timeout passed" if w.came else ""
                        ))
                        if w.signal is not None
                        else f"until {when(w.wake_us)}" + (", which has passed" if w.came else "")
                        for w in r.waiting_on
                    ),
                }
                for r in page
            ],
            statuses=LISTED_STATUSES,
            # The option's value is the name as it is (what the filter compares), its text shown().
            workflows=[{"value": w, "text": shown(w)} for w in workflows],
            filters={**filters, "limit": limit}, filtered=bool(kept), max_limit=MAX_LIMIT,
            older=older_href, newer=newer_href, summary=summary,
            violations=violations,
            extra=[Flash(kind="refused", text=f"Filter ignored: {p}") for p in problems],
        )  # fmt: skip
        return response

    # ------------------------------------------------------------ one run

    def _run_page(self, run: str, session: str) -> Response:
        # An id a PostgreSQL journal cannot hold is asked of nobody (the driver fails on it).
        items = [] if no_such_run(self.log, run) is not None else self._read_run(run)
        history = run_history(items, run)
        if history is None:
            return self._message(
                session, 404, "No such run", f"There is no run {shown(run)!r} in {shown(self._shown_as)}."
            )
        ledger = Ledger(keep=frozenset({run}))
        ledger.feed(items)
        view = ledger.run(run)
        outstanding = set(view.outstanding()) if view is not None else set[str]()
        held = self._held()
        # as `runs` says it (RunRow.of): a finished run reconciled since is nobody's
        live = history.standing == "interrupted" and not history.finished and (held is None or run in held)
        status: RunStanding = "running" if live else history.standing
        # finished for good: the page says resume is refused, whoever would take the run up
        done = view is not None and view.finished and history.standing != "interrupted"
        resume_hint, resume_offered = self._resume_hint(run, done)
        now_us = int(self._clock() * 1_000_000)
        open_until = now_us if status in ("running", "waiting") else 0
        return self._page(
            "run.html", session,
            run=history, standing=status, facts=_facts(history),
            tl=timeline(history, open_until_us=open_until),
            attempts=_attempt_rows(history), intents=_intent_rows(history, outstanding),
            waits=_wait_rows(history), signals=_signal_rows(history),
            finished=view is not None and view.finished,
            csrf=self._token(session), actions={a: _action_href(run, a) for a in ACTIONS},
            signal_name=_awaited(history), resume_hint=resume_hint, resume_offered=resume_offered,
            # as `show` says it: of what was read (a file: the whole log; PostgreSQL: the run's records)
            violations=ledger.violation_count,
        )  # fmt: skip

    def _resume_hint(self, run: str, done: bool) -> tuple[str, bool]:
        """What Resume does for ``run``, and whether the page offers it: not for an unfinished
        run no worker takes up (`resume_pg` refuses it), where it says what goes on with it
        instead (``done``: finished for good, and refused as such)."""
        if is_url(self.log):
            if done or submitted_for(self.log, run) is not None:
                return "Reopens the run in the journal; a worker of its workflow takes it up.", True
            return (
                "No worker takes this run up (`attempt-kernel run` started it, never submitted), so there is"
                f" no Resume here: `attempt-kernel recover {shown(self._shown_as)} --workflows MODULE:ATTR`"
                " goes on with it.",
                False,
            )
        if self._workflows:
            names = ", ".join(shown(w.name) for w in self._workflows)
            return f"Drives the run in this server's process (its workflows: {names}) until it finishes or waits.", True
        return (
            "Drives the run in this server's process when it was started with --workflows"
            " naming the run's workflow; else it says which command resumes it.",
            True,
        )

    # ------------------------------------------------------------ actions

    def _post(self, run: str, action: Action, body: bytes, session: str | None) -> Response:
        try:
            form = _fields(body.decode("utf-8"), "form", surrogates=False)
        except (UnicodeDecodeError, _BadForm) as error:
            said = error if isinstance(error, _BadForm) else "the form holds bytes that are not UTF-8"
            return Response(
                status=400,
                body=f"400 Bad Request: {said}; nothing was written.\n".encode(),
                content_type="text/plain; charset=utf-8",
            )
        if session is None or not self._token_ok(session, _one(form, "csrf")):
            return Response(
                status=403,
                body=b"403 Forbidden: this form's token is missing or not this browser's;"
                b" reload the page and send it again. Nothing was written.\n",
                content_type="text/plain; charset=utf-8",
            )
        if not self._spend(_one(form, "csrf")):
            self._flash(
                session,
                Flash(
                    kind="refused",
                    text="Refused: this form was sent already (a second click, or a resend), and is not"
                    " acted on twice; nothing was written. Reload the page to act again.",
                ),
            )
            return Response(status=303, body=b"", location=_run_href(run))
        try:
            text = self._perform(run, action, form, session)
            self._flash(session, Flash(kind="ok", text=text))
        except AttemptKernelError as error:  # OperationRefused among them: nothing was written
            self._flash(session, _flash_of(error))
        return Response(status=303, body=b"", location=_run_href(run))

    def _where(self, delivered: Delivered) -> str:
        journal = is_url(self.log)
        if delivered.recorded:
            return "recorded in the journal" if journal else "recorded in the log"
        if delivered.queued:
            when = "before any step starts" if isinstance(delivered.change, RunCancelRequested) else "once the run runs"
            return f"it waits in the journal's inbox: the run is queued, and the worker that starts it takes it in {when}"
        if journal:
            return (
                "it waits in the journal's inbox: the process driving the run (a worker, `run` or"
                " `recover`) takes it in within about a second"
            )
        return "it waits in the log's inbox: the process writing the log takes it in within about a second"

    def _perform(self, run: str, action: Action, form: Mapping[str, list[str]], session: str) -> str:
        """Do ``action`` through the operations module; what happened, for the flash."""
        match action:
            case "signal":
                name = _one(form, "name")
                payload_text = _one(form, "payload")
                payload: JSON = None
                if payload_text:
                    payload = _json_field(payload_text, "payload")
                    if payload is None:
                        raise OperationRefused(
                            "the payload is null, and a signal's payload never is (leave it empty to"
                            " send {}); nothing was written"
                        )
                delivered = send_signal(self.log, run, name, payload)
                return f"Signal {shown(repr(name))} sent to run {shown(run)}: {self._where(delivered)}."
            case "cancel":
                delivered = cancel_run(self.log, run, _one(form, "reason"))
                return f"Cancel of run {shown(run)}: {self._where(delivered)}."
            case "reconcile":
                key, verdict = _sent_key(_one(form, "key")), _one(form, "verdict")
                if verdict not in ("confirmed", "rejected"):
                    raise OperationRefused("say whether the effect happened (confirm) or not (reject)")
                result_text = _one(form, "result")
                result = _json_field(result_text, "result") if result_text else None
                delivered = reconcile_intent(
                    self.log, key, confirmed=verdict == "confirmed", result=result, note=_one(form, "note"), run=run
                )
                said = "Confirmed (it happened)" if verdict == "confirmed" else "Rejected (it did not happen)"
                return f"Intent {shown(key)} of run {shown(delivered.run)}: {said}, {self._where(delivered)}."
            case "resume":
                return self._resume(run, session)
            case _:
                assert_never(action)

    def stop_resumes(self, signal_number: int) -> list[str]:
        """Stop the resumes this server drives, as SIGINT or SIGTERM stops `resume`: each
        run's stop is recorded, live attempts get `RESUME_GRACE` seconds, and the runs
        stay unfinished. Returns once they are stopped: the runs that were being resumed.
        Resumes asked for afterwards stop as they start."""
        self._stopper.stop(signal_number)
        with self._flash_lock:
            threads = dict(self._resume_threads)
        for thread in threads.values():
            thread.join()
        return sorted(threads)

    def _resume(self, run: str, session: str) -> str:
        """Resume in a thread of its own (on a file log it drives the run, maybe for
        long); answer with what it did if that comes within `RESUME_WAIT`, else say
        it goes on, and show what it did on this browser's next page."""
        with self._flash_lock:
            if run in self._resuming:
                raise OperationRefused(f"run {run!r} is being resumed by this server already")
            self._resuming.add(run)
        outcome = _Outcome()

        def go() -> None:
            try:
                said: str | AttemptKernelError = resume_run(
                    self.log, run, self._workflows, grace=RESUME_GRACE, stopper=self._stopper
                )
            except AttemptKernelError as error:  # OperationRefused among them
                said = error
            except BaseException as error:  # noqa: BLE001  # a step's sys.exit, a bug: said, not lost with the thread
                said = AttemptKernelError(
                    f"the resume of run {run!r} stopped with {type(error).__name__}: {error};"
                    " the run stays unfinished, and may be resumed again"
                )
            with self._flash_lock:
                self._resuming.discard(run)
                self._resume_threads.pop(run, None)
                outcome.said = said
                late = outcome.answered
            if late:
                self._flash(session, _flash_of(said))

        thread = threading.Thread(target=go, name=f"resume {run}", daemon=True)
        with self._flash_lock:
            self._resume_threads[run] = thread
        thread.start()
        thread.join(RESUME_WAIT)
        with self._flash_lock:
            outcome.answered = True
            said = outcome.said
        if said is None:
            return f"Resuming run {shown(run)} in this server's process; reload to follow it."
        if isinstance(said, str):
            return shown(said)
        raise said


@dataclass(slots=True)
class _Outcome:
    """What a resume thread said, and whether its request answered before it did
    (guarded by the view's flash lock)."""

    said: str | AttemptKernelError | None = None
    answered: bool = False


def _flash_of(said: str | AttemptKernelError) -> Flash:
    if isinstance(said, str):
        return Flash(kind="ok", text=shown(said))
    if isinstance(said, OperationRefused):
        return Flash(kind="refused", text=f"Refused: {shown(str(said))}")
    return Flash(kind="refused", text=f"Failed: {shown(str(said))}")


def _awaited(history: RunHistory) -> str:
    """The name of the signal an open wait is for, to fill the signal form with (none once
    the run's cancel was recorded: it ends cancelled whatever comes). Not a name no signal
    can carry (a control character, in a hand-built log): shown, it would fill the form
    with another name, ``a\\x1bb``, that the button would send."""
    if history.cancel_requested:
        return ""
    for wait in history.waits:
        if wait.ended_us is None and wait.signal is not None:
            return wait.signal if wait.signal.isprintable() else ""
    return ""


def _facts(history: RunHistory) -> list[tuple[str, str]]:
    facts: list[tuple[str, str]] = []
    if history.input is not None:
        facts.append(("input", shown(short(history.input, 200))))
    if history.result is not None:
        facts.append(("result", shown(short(history.result, 200))))
    if history.domain_state is not None:
        facts.append(("domain state", shown(history.domain_state)))
    for event in history.events:
        reason = f" ({shown(event.reason)})" if event.reason else ""
        facts.append((event.what, f"{when(event.time_us)}{reason}"))
    return facts


def _attempt_rows(history: RunHistory) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for step in history.steps:
        for a in step.attempts:
            if a.returned:
                outcome = f"result {shown(short(a.result))}"
            elif a.error is not None:
                outcome = f"error {shown(a.error)}"
            else:
                outcome = ""
            rows.append(
                {
                    "step": shown(step.name), "number": a.number,
                    "state": "Pending" if a.state is None else state_name(a.state),
                    "created": when(a.created_us),
                    "css": "st-" + ("Pending" if a.state is None else state_name(a.state)).lower(),
                    # the time of day only: the date is the creation's, a column to the left
                    "moves": [
                        f"{when(m.time_us)[11:]} {state_name(m.from_state)} → {state_name(m.to_state)}"
                        f" ({cause_name(m.cause)})"
                        for m in a.moves
                    ],
                    "outcome": outcome,
                }
            )  # fmt: skip
    return rows


def _intent_rows(history: RunHistory, outstanding: set[str]) -> list[dict[str, object]]:
    return [
        {
            "step": shown(step.name), "attempt": a.number, "name": shown(i.name), "key": i.key,
            # percent-encoded, as a path carries a run id: a browser sends an attribute's line
            # break back as CRLF and a NUL as U+FFFD, and a lone surrogate has no UTF-8 at all
            "key_sent": _quoted(i.key),
            "state": intent_state_name(i.state),
            "events": [_event_text(e) for e in i.events],
            # the ledger says which keys are outstanding; shown once, at the attempt that has it
            "outstanding": i.key in outstanding and a is step.attempts[-1],
        }
        for step in history.steps
        for a in step.attempts
        for i in a.intents
    ]  # fmt: skip


def _wait_rows(history: RunHistory) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for w in history.waits:
        what = "sleep" if w.signal is None else f"signal {shown(repr(w.signal))}"
        if w.wake_us is not None:
            what += f" until {when(w.wake_us)}"
        if w.ended_us is None:
            ended = "open: waiting"
        elif w.taken is not None:
            ended = f"{when(w.ended_us)}, took signal #{w.taken}"
        else:
            ended = f"{when(w.ended_us)}, its time came"
        rows.append({"position": w.position, "what": what, "started": when(w.started_us), "ended": ended})
    return rows


def _signal_rows(history: RunHistory) -> list[dict[str, object]]:
    return [
        {
            "number": s.number, "name": shown(s.name), "payload": shown(short(s.payload, 200)),
            "sent": when(s.sent_us),
            "taken": "not taken yet" if s.taken_at is None else f"the wait @{s.taken_at}",
        }
        for s in history.signals
    ]  # fmt: skip


# --------------------------------------------------------------------------
# The HTTP server
# --------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self, address: tuple[str, int], view: WebView, family: socket.AddressFamily, idle_timeout: float
    ) -> None:
        self.address_family = family
        self.view: Final = view
        self.idle_timeout: Final = idle_timeout
        # Requests read and not yet answered: a stop waits for them (`finish_answers`).
        self._answering = 0
        self._answered: Final = threading.Condition()
        super().__init__(address, _Handler)

    def begin_answer(self) -> None:
        """Count a request as being answered, until `end_answer`."""
        with self._answered:
            self._answering += 1

    def end_answer(self) -> None:
        with self._answered:
            self._answering -= 1
            self._answered.notify_all()

    def finish_answers(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the requests being answered; how many are left.

        Their threads are daemons (a silent client must not keep the process), so
        without this the process would exit under an action half done: its browser
        would get no answer, whether the action was written or not."""
        with self._answered:
            self._answered.wait_for(lambda: self._answering == 0, timeout)
            return self._answering


class _Handler(BaseHTTPRequestHandler):
    server_version = "attempt-kernel"
    sys_version = ""

    def setup(self) -> None:
        # The server's idle timeout (open_server's): a silent client does not keep its thread.
        server = self.server
        assert isinstance(server, _Server)
        self.request.settimeout(server.idle_timeout)
        super().setup()

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        server = self.server
        assert isinstance(server, _Server)
        # Counted inline, not by a wrapper: a record nested near Python's recursion limit
        # is read in this thread, and each frame more here is one level less for it.
        server.begin_answer()
        try:
            length_text = self.headers.get("Content-Length", "0")
            length = _ascii_number(length_text, MAX_BODY) or 0
            if length > MAX_BODY:
                self.send_error(413, "the form is too large")
                return
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            local = str(self.connection.getsockname()[0])
            response = server.view.respond(
                Request(method=method, target=self.path, headers=headers, body=body, local=local)
            )
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            if response.allow is not None:
                self.send_header("Allow", response.allow)
            if response.location is not None:
                self.send_header("Location", response.location)
            if response.set_cookie is not None:
                self.send_header("Set-Cookie", response.set_cookie)
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(response.body)
        finally:
            server.end_answer()

    def end_headers(self) -> None:
        # Every answer carries them: the view's pages, and http.server's own
        # error pages (send_error: its 501 for an unknown method, a 400, a 413).
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log: the terminal is for what serve says, not every request


def open_server(view: WebView, host: str, port: int, *, idle_timeout: float = IDLE_TIMEOUT) -> ThreadingHTTPServer:
    """A server for ``view`` bound to ``host``:``port`` (0: any free port), not yet serving.

    ``idle_timeout``: seconds a connection may stay silent (no request, or a
    request sent no further) before it is closed. Raises `OSError` when it
    cannot bind (``errno.EADDRINUSE``: the port is in use).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    view.set_loopback_only(is_loopback(host))
    return _Server((host.strip("[]"), port), view, family, idle_timeout)


def address_of(server: ThreadingHTTPServer) -> str:
    """The URL the server answers at."""
    host, port = server.server_address[:2]
    name = host.decode() if isinstance(host, bytes) else str(host)
    return f"http://[{name}]:{port}/" if ":" in name else f"http://{name}:{port}/"


class _Stop(BaseException):
    """Internal: SIGTERM arrived; stop serving. A `BaseException`, as
    `KeyboardInterrupt` is: socketserver catches any `Exception` raised while
    it hands a request to a thread, prints it and serves on, which lost the
    signal when it landed there."""


def serve_until_stopped(server: ThreadingHTTPServer, announce: Callable[[str], None]) -> int:
    """Serve until SIGINT or SIGTERM (in the main thread), then close the socket; return
    the signal's number (0 when ``server.shutdown()`` ended it)."""

    def on_term(number: int, frame: FrameType | None) -> None:
        raise _Stop

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        announce(address_of(server))  # inside: a signal may come as soon as it is said
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        return signal.SIGINT
    except _Stop:
        return signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        if isinstance(server, _Server):
            # An action being answered is finished and answered (a second signal stops at once).
            server.finish_answers(STOP_GRACE)
    return 0
