"""The test suite's throwaway PostgreSQL server is gone once its session is, however it ends.

A session killed before its teardown (the gate's CI stopped, a developer's
``pkill``) left its server running for good, holding a port and a folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from pgserver import find_server_bin

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

_SESSION = """
import sys
sys.path.insert(0, sys.argv[1])
from pgserver import ThrowawayServer, find_server_bin
bindir = find_server_bin()
assert bindir is not None
server = ThrowawayServer(bindir)
url = server.start()
print(url, server.data.parent, flush=True)
sys.stdin.read()  # until the test kills this process
"""


def gone(url: str, folder: Path) -> bool:
    if folder.exists():
        return False
    try:
        with psycopg.connect(url, connect_timeout=2):
            return False
    except psycopg.OperationalError:
        return True


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_session_leaves_no_server_running(how: signal.Signals) -> None:
    if find_server_bin() is None:
        pytest.skip("no PostgreSQL server binaries")
    with subprocess.Popen(
        [sys.executable, "-c", _SESSION, str(Path(__file__).parent)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as session:  # fmt: skip
        try:
            assert session.stdout is not None
            url, folder = session.stdout.readline().split()
            with psycopg.connect(url) as conn:  # it runs
                assert conn.execute("SELECT 1").fetchone() == (1,)
            os.kill(session.pid, how)
            session.wait(timeout=60)
            deadline = time.monotonic() + 60  # waits for the event; bounds nothing
            while not gone(url, Path(folder)):
                assert time.monotonic() < deadline, f"the server of a killed session still runs at {url}"
                time.sleep(0.1)
        finally:
            session.kill()
