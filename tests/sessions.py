"""Replaying a document's shell session: its commands, run for real, print what it shows.

A session is every ``$ command`` line of a document's ```console blocks, in
order, with the lines after it up to the next ``$`` as its expected output.
`Session` runs each command through ``bash -c`` in one folder, with
``attempt-kernel`` on ``PATH`` meaning ``sys.executable -m attempt_kernel``;
stdout and stderr are read together, as a terminal shows them, and a
command killed by a signal is reported as an interactive shell reports it
(``Killed`` for SIGKILL).

Two things differ from one session to the next, and only they are
normalised: timestamps, and idempotency keys, which carry a random part
drawn when each run starts. A key the document shows is paired with the key
the real session printed in its place, by order of first appearance, when
the two outputs agree with every key masked; from then on the pair holds:
the document's key is put in place of the real one before outputs are
compared byte for byte, and the real key in place of the document's in
later commands (``reconcile --key <the document's key>``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from attempt_kernel import Workflow

TIMESTAMP = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z\b")
KEY = re.compile(r"\bak1-[0-9a-f]{32}\b")
CONSOLE = re.compile(r"^```console\n(.*?)^```", re.DOTALL | re.MULTILINE)
TEXT = re.compile(r"^```text\n(.*?)^```", re.DOTALL | re.MULTILINE)


def console_session(document: Path) -> list[tuple[str, str]]:
    """(command, expected output) for each `$` line of the console blocks, in order."""
    steps: list[tuple[str, str]] = []
    for block in CONSOLE.findall(document.read_text()):
        for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, _, output = chunk.partition("\n")
            steps.append((command, output))
    return steps


def text_blocks(document: Path) -> list[str]:
    """The document's ```text blocks (its excerpts of files)."""
    return TEXT.findall(document.read_text())


def timeless(text: str) -> str:
    return TIMESTAMP.sub("<timestamp>", text)


class Keys:
    """Each idempotency key a document shows, paired with the key the real session printed."""

    def __init__(self) -> None:
        self.real: dict[str, str] = {}
        """The session's key, by the document's."""
        self.shown: dict[str, str] = {}
        """The document's key, by the session's."""

    def in_command(self, command: str) -> str:
        """The command with each of the document's keys replaced by the session's."""

        def real(match: re.Match[str]) -> str:
            key = match.group(0)
            if key not in self.real:
                raise AssertionError(f"$ {command}: key {key} was shown by no earlier output")
            return self.real[key]

        return KEY.sub(real, command)

    def learn(self, expected: str, got: str) -> None:
        """Pair new keys by order of appearance, if the outputs agree with keys masked.

        A key already paired keeps its pair: if the session printed another key
        where the document shows it, the comparison that follows fails.
        """
        if KEY.sub("<key>", timeless(expected)) != KEY.sub("<key>", timeless(got)):
            return  # they differ elsewhere; the comparison says where
        for shown, real in zip(KEY.findall(expected), KEY.findall(got)):
            if shown not in self.real and real not in self.shown:
                self.real[shown] = real
                self.shown[real] = shown

    def as_shown(self, got: str) -> str:
        """The session's output with each paired key replaced by the document's."""
        return KEY.sub(lambda match: self.shown.get(match.group(0), match.group(0)), got)


def attempt_kernel_on_path(folder: Path) -> str:
    """A ``PATH`` whose ``attempt-kernel`` runs this interpreter's package; ``folder`` holds it."""
    folder.mkdir()
    wrapper = folder / "attempt-kernel"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m attempt_kernel "$@"\n')
    wrapper.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def shell(command: str, cwd: Path, path: str) -> tuple[int, str]:
    """Exit code and output of one command, as an interactive shell would show them."""
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, "PATH": path},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=60,
    )
    output = result.stdout
    if result.returncode < 0:  # bash -c exec'd it, so the signal is ours to report
        number = -result.returncode
        output += "Killed\n" if number == signal.SIGKILL else f"{signal.strsignal(number)}\n"
        return 128 + number, output
    return result.returncode, output


def replay_session(document: Path, work: Path, path: str, exit_codes: list[int]) -> None:
    """Run each command of ``document`` in ``work``; each prints the document's output and exit code."""
    session = console_session(document)
    assert len(session) == len(exit_codes), [command for command, _ in session]
    keys = Keys()
    for (command, expected), code in zip(session, exit_codes):
        got_code, got = shell(keys.in_command(command), work, path)
        keys.learn(expected, got)
        assert timeless(keys.as_shown(got)) == timeless(expected), f"$ {command}"
        assert got_code == code, f"$ {command}\n{got}"


def missing_line(block: str, source: list[str]) -> str | None:
    """The first line of ``block`` that is not a line of ``source`` after the ones before it.

    None when every line is there, in order (a ``...`` line skips lines).
    """
    at = 0
    for line in block.splitlines():
        if line.strip() == "...":
            continue
        if line not in source[at:]:
            return line
        at = source.index(line, at) + 1
    return None


def workflow_in(file: Path, attr: str, module: str) -> Workflow:
    """The workflow ``attr`` of the Python file ``file``, imported in this process as
    ``module`` (a user's folder is no package: the CLI imports it by path too)."""
    spec = importlib.util.spec_from_file_location(module, file)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    workflow: object = getattr(loaded, attr)
    assert isinstance(workflow, Workflow)
    return workflow
