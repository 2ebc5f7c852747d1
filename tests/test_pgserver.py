"""The test suite's throwaway PostgreSQL server is gone once its session is, however it ends.

A session killed before its teardown (the gate's CI stopped, a developer's
``pkill``) left its server running for good, holding a port and a folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from pgserver import find_server_bin
from test_readme_workers import session_blocks

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


def test_the_readme_session_s_server_and_workers_end_with_a_killed_test() -> None:
    """The README test's session runs its own shell, workers and server (as the README's
    reader does), in a session of their own: killed mid-run, the test still ends them."""
    if os.geteuid() != 0 or find_server_bin() is None:
        pytest.skip("the README's session needs root and the PostgreSQL server binaries")
    # The README's commands run the server as postgres, in a folder under this one:
    # pytest's own temporary folders are closed to other users.
    tmp = Path(tempfile.mkdtemp(prefix="ak-readme-killed-"))
    os.chmod(tmp, 0o755)
    try:
        killed_readme_session(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def killed_readme_session(tmp: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp))
    test = f"{Path(__file__).parent / 'test_readme_workers.py'}::test_the_readme_session_runs_as_written"
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", test],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
    ) as run:  # fmt: skip
        try:
            deadline = time.monotonic() + 120  # waits for the event; bounds nothing
            while len(lines := started(tmp)) < 4:  # the server's pid file, up to its port
                assert run.poll() is None, "the README test ended before its server started"
                assert time.monotonic() < deadline, "the README test's server did not start"
                time.sleep(0.1)
            [folder] = tmp.glob("ak-pg-readme-*")  # read now: once the test is killed, it goes
            url = f"postgresql://postgres@127.0.0.1:{lines[3]}/postgres"
            time.sleep(2)  # into the session: its workers start
            os.kill(run.pid, signal.SIGKILL)
            run.wait(timeout=60)
        finally:
            run.kill()
        deadline = time.monotonic() + 60
        while not gone(url, folder):
            assert time.monotonic() < deadline, f"the README session's server still runs at {url}"
            time.sleep(0.1)
    # The session's other processes end as its server does, each in its own time
    # (a worker still exiting under load was once caught by a single look).
    deadline = time.monotonic() + 60
    while left := subprocess.run(["pgrep", "-f", str(tmp)], capture_output=True, text=True).stdout.split():
        assert time.monotonic() < deadline, f"processes of the killed README session still run: {left}"
        time.sleep(0.1)
    # Ended, not run to its end: the session (about 40 s) was killed 2 s in, so
    # its last command (the README's stop, which would end it all too) never ran.
    [outputs] = tmp.glob("pytest-of-*/pytest-[0-9]*/*[0-9]/outputs")
    last = sum(len(block) for block in session_blocks()) - 1
    assert any(outputs.iterdir()) and not (outputs / str(last)).exists()


def started(tmp: Path) -> list[str]:
    """The lines of the README session's server pid file under ``tmp`` so far (none yet: [])."""
    for pid in tmp.glob("ak-pg-readme-*/data/postmaster.pid"):
        try:
            return pid.read_text().splitlines()
        except FileNotFoundError:
            return []
    return []
