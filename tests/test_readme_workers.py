"""The README's multi-worker session is run as written, and what it shows is checked.

The README's PostgreSQL session is three console blocks: set-up (install,
activate, a throwaway server), the session (six runs, three workers, one
killed), and the stop. This test takes every ``$ `` command of those
blocks from README.md, runs them one by one in one bash process (so `cd`,
`URL=` and the background jobs carry over, as they do for a person typing
them), and compares each command's output (stdout and stderr together)
with the lines the README shows under it.

What differs from the README, and why:

- the server's folder and port: `/tmp/ak-pg` and 55432 become a fresh
  folder and a free port, so the test never meets a server of its own or
  a person's; the server binaries' folder is the one found on the machine;
- the install and `source .venv/bin/activate` lines are not run (the test
  runs in an environment that has the package and psycopg installed): the
  test puts this interpreter's `bin` first on PATH instead, which is what
  activating does; the fresh-clone check runs those two lines by hand;
- lines compared are normalized: ISO times, worker ids, report numbers and
  the dots pg_ctl prints while it waits are replaced by placeholders, and
  the lines are compared as multisets, since which worker claims which run
  and in which order lines interleave differ from run to run. Everything
  else (each message, each level, each count, every line a filter keeps)
  must be exactly as shown.

bash prints a notice for a killed background job into whatever command
runs next; an interactive shell prints job numbers too. The README says
these are left out, and the test drops the notice lines (and only those).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from attempt_kernel import AttemptTransitioned, Record, read_log, replay, transition
from pgserver import call_off, find_server_bin, watchdog

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FLOWS = ROOT / "examples" / "workers" / "flows.py"
SECTION = "## Many workers on PostgreSQL"
README_BIN = "/usr/lib/postgresql/15/bin"
NOT_RUN = (
    "python3 -m venv .venv && .venv/bin/pip install -q '.[postgres]'",
    "source .venv/bin/activate",
)


@dataclass(frozen=True)
class Command:
    line: str
    shown: tuple[str, ...]


def session_blocks() -> list[list[Command]]:
    """The console blocks of the README's PostgreSQL section, each as its commands and shown lines."""
    text = README.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    blocks: list[list[Command]] = []
    for body in re.findall(r"^```console\n(.*?)^```$", text[start:end], re.MULTILINE | re.DOTALL):
        commands: list[Command] = []
        for raw in body.splitlines():
            if raw.startswith("$ "):
                commands.append(Command(raw[2:], ()))
            else:
                assert commands, f"README: output before any command: {raw!r}"
                last = commands[-1]
                commands[-1] = Command(last.line, (*last.shown, raw))
        blocks.append(commands)
    return blocks


NOTICE = re.compile(r"^\S+: line \d+: +\d+ (Killed|Terminated) ")


def normalized(lines: list[str] | tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for line in lines:
        line = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "<time>", line)
        line = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<worker>", line)
        line = re.sub(r"report-\d", "report-N", line)
        line = re.sub(r"\.{2,} done", "... done", line)
        out.append(line)
    return sorted(out)


def test_the_session_is_three_blocks_with_the_commands_a_new_user_needs() -> None:
    """Set-up, session, stop: the install of the extra, the folder, the waits and the stop are there."""
    setup, session, stop = session_blocks()
    lines = [c.line for c in setup]
    assert lines[:3] == [*NOT_RUN, "REPO=$PWD"]
    assert lines[-1] == "cd $REPO/examples/workers"
    # the wait until every run is claimed and its fetch running (worker 1 is killed in the middle of it)
    assert any(c.line.startswith("until ") and "fetch#1: Pending -> Running" in c.line for c in session)
    assert any(c.line.startswith("until ") and "--status succeeded" in c.line for c in session)
    assert [c.line for c in stop][0] == "kill %2 %3 && wait"
    assert any("pg_ctl -D /tmp/ak-pg/data stop" in c.line for c in stop)
    assert [c.line for c in stop][-1] == "rm -r /tmp/ak-pg"


def test_the_readme_session_runs_as_written(tmp_path: Path) -> None:
    """Every command of the README's three blocks prints what the README shows under it."""
    if os.geteuid() != 0:
        pytest.skip("the README's session runs the server with runuser, which needs root")
    bindir = find_server_bin()
    assert bindir is not None, "no PostgreSQL server binaries"
    folder = tempfile.mkdtemp(prefix="ak-pg-readme-")
    os.rmdir(folder)  # the README's first server command makes it
    port = free_port()
    work = tmp_path / "checkout"
    (work / "examples" / "workers").mkdir(parents=True)
    shutil.copy(FLOWS, work / "examples" / "workers" / "flows.py")
    outputs = tmp_path / "outputs"
    outputs.mkdir()

    commands = [c for block in session_blocks() for c in block]
    script = ["set -u"]
    ran: list[tuple[int, Command]] = []
    for n, command in enumerate(commands):
        if command.line in NOT_RUN:
            assert command.shown == ()
            continue
        line = command.line.replace("/tmp/ak-pg", folder).replace("55432", str(port))
        line = line.replace(README_BIN, str(bindir))
        script.append(f"{{\n{line}\n}} > {shlex.quote(str(outputs / str(n)))} 2>&1")  # a comment ends at the newline
        ran.append((n, command))
        if line.startswith("attempt-kernel export "):  # kept for the checks below; the stop removes it
            script.append(f"cp journal.jsonl {shlex.quote(str(outputs / 'journal.jsonl'))}")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    shell = subprocess.Popen(
        ["bash", "-c", "\n".join(script)], cwd=work, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    # Should this process be killed, the session's shell, its workers and its
    # server would run on (the shell has a session of its own): the watchdog
    # ends them. On the way out below it is killed first, so it does neither.
    data = Path(folder) / "data"
    pg_ctl = shlex.join(["runuser", "-u", "postgres", "--", str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])
    guard = watchdog(["bash", "-c", f"kill -KILL -- -{shell.pid}; {pg_ctl}"], Path(folder))
    try:
        # Generous: the session takes about 40 s; this only keeps a broken run from hanging.
        transcript, _ = shell.communicate(timeout=300)
    finally:
        call_off(guard)
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        if data.exists():  # the run failed before the README's stop: stop its server
            subprocess.run(
                ["runuser", "-u", "postgres", "--", str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                capture_output=True, timeout=60,
            )  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)
    assert shell.returncode == 0, transcript
    for n, command in ran:
        printed = [line for line in (outputs / str(n)).read_text().splitlines() if not NOTICE.match(line)]
        assert normalized(printed) == normalized(command.shown), f"$ {command.line}\n" + "\n".join(printed)
    # The stop removed what the session wrote.
    left = sorted(p.name for p in (work / "examples" / "workers").iterdir() if p.name != "__pycache__")
    assert left == ["flows.py"]
    # The seed's recorded-fixture check, on the journal the three workers
    # wrote with a takeover: every change goes through `transition`, nothing
    # is rejected, and each reaches its recorded state.
    journal = outputs / "journal.jsonl"
    assert replay(journal).valid
    moves = [
        item.change for item in read_log(journal)
        if isinstance(item, Record) and isinstance(item.change, AttemptTransitioned)
    ]  # fmt: skip
    # Each run: fetch and publish admitted and ended (4); each of worker 1's
    # two runs also its orphan fetch#1, admitted and ended Cancelled (2).
    assert len(moves) == 6 * 4 + 2 * 2
    for move in moves:
        assert transition(move.from_state, move.cause) == move.to_state


def free_port() -> int:
    """A free TCP port on 127.0.0.1, probed and released for the server to take."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_readme_s_worker_flags_are_the_ones_the_takeover_test_uses() -> None:
    """The README's worker command, parsed: the flags a reader copies are the ones checked below."""
    [_, session, _] = session_blocks()
    [start] = [c.line for c in session if " worker $URL " in c.line]
    assert start == (
        "for w in 1 2 3; do attempt-kernel worker $URL --workflows flows:reports --concurrency 2"
        " --heartbeat 0.5 --dead-after 10 > worker-$w.out & done"
    )
