"""A throwaway PostgreSQL cluster for the test suite: found, started, removed.

The gate starts a real server: no mocks of the database anywhere, since
only a real server shows how leases, fences and commits behave.
`find_server_bin` looks for the server binaries (``initdb``, ``pg_ctl``,
``postgres``); `ThrowawayServer` runs ``initdb`` into a fresh temporary
folder, starts the cluster on a free port of 127.0.0.1 with a private unix
socket folder, and removes everything on `stop`. ``initdb`` refuses to run
as root, so as root every server command runs as the ``postgres`` user
(``runuser``), in a folder that user owns.

Durability is traded for speed (``fsync=off``): the cluster lives for one
test session, and ``synchronous_commit`` keeps its default so that a
journal's per-transaction setting still means something.

A session killed before its teardown (SIGTERM, SIGKILL, a closed
terminal) would leave its server running, holding its port and folder, for
good. So each started server has a watchdog: a small process of its own
session, reading a pipe whose only writer is the test process. The pipe
ends when that process ends, however it ends, and the watchdog then stops
the server and removes its folder; `stop` ends the pipe itself and waits
for the watchdog to do the same.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

from typing_extensions import final

SEARCHED: Final = ("/usr/lib/postgresql/*/bin", "$PATH")
"""Where `find_server_bin` looks, for messages."""

_SERVER_TOOLS: Final = ("initdb", "pg_ctl", "postgres")

# The watchdog's program: argv is the folder ("" for none), then the stop
# command. It waits for the end of its stdin (the test process gone, or `stop`).
_WATCHDOG: Final = """
import shutil, subprocess, sys
sys.stdin.buffer.read()
subprocess.run(sys.argv[2:], capture_output=True, check=False, timeout=60)
if sys.argv[1]:
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def watchdog(stop: Sequence[str], folder: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a watchdog: once this process ends, however it ends, it runs ``stop`` and
    removes ``folder``. Closing its stdin does the same at once; `call_off` lets it go
    without either."""
    return subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, "" if folder is None else str(folder), *stop],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the tests' process group does not reach it
    )  # fmt: skip


def call_off(dog: subprocess.Popen[bytes]) -> None:
    """Let a `watchdog` go without running its stop command."""
    dog.kill()
    dog.wait()
    if dog.stdin is not None:
        dog.stdin.close()


def _version_key(folder: Path) -> tuple[int, ...]:
    """Debian's /usr/lib/postgresql/<major>/bin, newest major first."""
    name = folder.parent.name
    return (int(name),) if name.isdigit() else (0,)


def find_server_bin() -> Path | None:
    """The folder holding the server binaries (newest Debian major first), or None."""
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    for folder in debian:
        if all((folder / tool).is_file() for tool in _SERVER_TOOLS):
            return folder
    found = [shutil.which(tool) for tool in _SERVER_TOOLS]
    if all(found) and found[0] is not None:
        return Path(found[0]).parent
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ServerFailed(Exception):
    """A server command failed; the message holds its output."""


@final
class ThrowawayServer:
    """One PostgreSQL cluster in a temporary folder, for one test session.

    `start` returns a ``postgresql://`` URL (trust authentication on
    127.0.0.1 only: nothing outside this machine can connect); `stop` stops
    the server at once and removes the folder. Both are safe to call after
    a failure part-way.
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir: Final = bindir
        self._root: Path | None = None
        self._started = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        # initdb refuses root: run every server command as the postgres user.
        self._as: Final[Sequence[str]] = (
            ("runuser", "-u", "postgres", "--") if os.geteuid() == 0 else ()
        )

    @property
    def data(self) -> Path:
        assert self._root is not None, "the server was not started"
        return self._root / "data"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, check=False, timeout=60
        )
        if done.returncode != 0:
            raise ServerFailed(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )

    def start(self) -> str:
        """Create and start the cluster; return its URL."""
        root = Path(tempfile.mkdtemp(prefix="attempt-kernel-pg-"))
        self._root = root
        sockets = root / "sockets"
        sockets.mkdir()
        if self._as:
            owner = pwd.getpwnam("postgres")
            for path in (root, sockets):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        os.chmod(sockets, 0o700)
        self._run(
            str(self.bindir / "initdb"),
            "--pgdata", str(self.data),
            "--username", "postgres",
            "--auth", "trust",
            "--encoding", "UTF8",
            "--locale", "C",
            "--no-sync",
            "--no-instructions",
        )  # fmt: skip
        last: ServerFailed | None = None
        for _ in range(3):  # a free port can be taken between the probe and the start
            port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets}"
                " -c fsync=off -c full_page_writes=off -c shared_buffers=32MB"
                " -c max_connections=50"
            )
            try:
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "--pgdata", str(self.data),
                    "--log", str(root / "server.log"),
                    "--options", options,
                    "--wait", "--timeout", "30",
                    "start",
                )  # fmt: skip
            except ServerFailed as failed:
                last = failed
                continue
            self._started = True
            self._watch(root)
            return f"postgresql://postgres@127.0.0.1:{port}/postgres"
        log = root / "server.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ServerFailed(f"{last}\nserver log:\n{tail}")

    def _watch(self, root: Path) -> None:
        """Start the watchdog that stops the server and removes ``root`` once this process ends."""
        stop = [*self._as, str(self.bindir / "pg_ctl"), "--pgdata", str(root / "data"),
                "--mode", "immediate", "--wait", "stop"]  # fmt: skip
        self._watchdog = watchdog(stop, root)

    def stop(self) -> None:
        """Stop the server at once (it holds nothing worth keeping) and remove its folder."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # the watchdog stops the server and removes the folder
            watchdog.wait(timeout=120)
        root, self._root = self._root, None
        if root is None:
            return
        if not root.exists():  # the watchdog did it all
            self._started = False
            return
        try:
            if self._started:
                self._started = False
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "--pgdata", str(root / "data"),
                    "--mode", "immediate",
                    "--wait",
                    "stop",
                )  # fmt: skip
        finally:
            shutil.rmtree(root, ignore_errors=True)


def own_server() -> Iterator[tuple[ThrowawayServer, str]]:
    """A server of a test module's own (and its URL), for a module-scoped fixture to yield from.

    For tests that restart or stop the server, which the session's shared
    one must never be. No binaries: a failure when CI is set, else a skip.
    """
    import pytest  # only the test modules that use this need it

    bindir = find_server_bin()
    if bindir is None:
        reason = f"no PostgreSQL server binaries in {' or '.join(SEARCHED)}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the PostgreSQL tests must run: {reason}", pytrace=False)
        pytest.skip(reason)
    throwaway = ThrowawayServer(bindir)
    try:
        yield throwaway, throwaway.start()
    finally:
        throwaway.stop()
