"""The ``attempt-kernel`` command line: argparse in, text out.

Exit codes: 0 success (a valid log), 1 a log with violations, 2 a usage or
I/O error (argparse's convention for usage errors), 141 when the reader of
the output went away (a closed pipe). Names from a log are escaped where
they are printed.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Final

from . import _report, _table
from ._demo import TRIP_PLANNER, WORKFLOWS
from ._errors import AttemptKernelError
from ._executor import Job, run_jobs
from ._recovery import recover_log
from ._replay import replay
from ._report import shown
from ._codec import RunLogError
from ._logfile import RunLogWriter
from ._records import Record, RunStarted

EXIT_OK: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_USAGE: Final = 2
EXIT_BROKEN_PIPE: Final = 141
"""128 + SIGPIPE, what a shell reports for a writer whose reader went away."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attempt-kernel",
        description="The kernel of a durable runtime for agent workflows.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    table = commands.add_parser(
        "table",
        help="print the attempt transition table, computed by calling transition()",
        description="Print the attempt transition table. Every cell is computed "
        "by calling transition() over all states and causes.",
    )
    table.add_argument(
        "--format",
        choices=("markdown", "mermaid", "dot"),
        default="markdown",
        help="markdown grid (default), mermaid stateDiagram-v2, or Graphviz dot",
    )
    replay_cmd = commands.add_parser(
        "replay",
        help="check that a run log obeys the kernel and report on it",
        description="Replay a run log through the kernel: every change must obey the "
        "transition tables. Exit 0 if valid, 1 if it has violations, 2 for usage or "
        "I/O errors. The log is only read.",
    )
    replay_cmd.add_argument("log", metavar="LOG", help="path of a run log (JSON Lines)")
    output = replay_cmd.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the report as JSON")
    output.add_argument(
        "--metrics", action="store_true", help="print OpenMetrics text for a scraper"
    )
    demo = commands.add_parser(
        "demo",
        help="run the built-in trip-planning agent workflow, then replay its log",
        description="Run the built-in example agent workflow (simulated tools and side "
        "effects: a retried tool call, a step deadline, two effects through intents, a "
        "cancelled watcher), append its records to the log, then replay the log. Exit 0 "
        "if the log is valid, 1 if not, 2 for usage or I/O errors.",
    )
    demo.add_argument(
        "--log", default="demo-run.jsonl", metavar="PATH",
        help="run log to append to (default: demo-run.jsonl; created if missing)",
    )  # fmt: skip
    demo.add_argument(
        "--crash-after", type=_positive_int, metavar="N",
        help="die abruptly (SIGKILL) right after the N-th record is written, as a crash would",
    )  # fmt: skip
    demo.add_argument(
        "--seed", type=int, default=0, metavar="S",
        help="seed for the simulated tools' latencies (default 0)",
    )  # fmt: skip
    recover = commands.add_parser(
        "recover",
        help="recover a log after a crash and resume its unfinished runs",
        description="Cut a torn tail (its bytes are kept in a side file), end every "
        "orphaned attempt (Running: Cancel with the intent record's answer; Pending: "
        "Cancel(intent_dispatched=False)), resume unfinished runs (Succeeded steps are "
        "not run again, Cancelled ones get a new attempt, Indeterminate ones are left "
        "for reconciliation), then replay the log. Exit 0 if valid, 1 if not, 2 for "
        "usage or I/O errors or a log that cannot be recovered.",
    )
    recover.add_argument("log", metavar="LOG", help="path of the run log to recover")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class _CrashAfter:
    """File operations that kill the process right after the N-th write returns."""

    def __init__(self, writes: int) -> None:
        self._left = writes

    def write(self, fd: int, data: bytes) -> int:
        written = os.write(fd, data)
        self._left -= 1
        if self._left == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


def _progress() -> Callable[[str], None] | None:
    """One line per state change on stderr, when a person is watching it."""
    if not sys.stderr.isatty():
        return None
    return lambda line: print(f"  .. {line}", file=sys.stderr, flush=True)


def _replay_and_print(log: str) -> int:
    report = replay(log)
    sys.stdout.write("\n" + _report.as_text(report, log))
    return EXIT_OK if report.valid else EXIT_VIOLATIONS


def _demo(args: argparse.Namespace) -> int:
    log_path: str = args.log
    ops = _CrashAfter(args.crash_after) if args.crash_after is not None else None
    blueprint = WORKFLOWS[TRIP_PLANNER](args.seed)
    with RunLogWriter(log_path, ops=ops) as log:
        # Counted under the log's lock, so two demos never pick the same id.
        existing = sum(
            1 for item in log.read()
            if isinstance(item, Record) and isinstance(item.change, RunStarted)
        )  # fmt: skip
        run = f"trip-{existing + 1}"
        print(f"demo: run {run} of workflow {TRIP_PLANNER}, appending to {shown(log_path)}", flush=True)
        [outcome] = run_jobs(
            log,
            [Job(workflow=blueprint.workflow, run=run, supervise=blueprint.supervise)],
            progress=_progress(),
        )
    sys.stdout.write(_report.run_text(outcome))
    return _replay_and_print(log_path)


def _recover(args: argparse.Namespace) -> int:
    log_path: str = args.log
    writer, recovery = recover_log(log_path, WORKFLOWS)
    with writer:
        sys.stdout.write(_report.recovery_text(recovery, log_path))
        jobs: list[Job] = []
        for run in recovery.runs:
            blueprint = WORKFLOWS[run.workflow](0)
            jobs.append(
                Job(workflow=blueprint.workflow, run=run.run, prior=run.steps,
                    supervise=blueprint.supervise)
            )  # fmt: skip
        for outcome in run_jobs(writer, jobs, progress=_progress()) if jobs else []:
            sys.stdout.write(_report.run_text(outcome))
    return _replay_and_print(log_path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    for stream in (sys.stdout, sys.stderr):
        # A name that the terminal's encoding cannot show is escaped, never a crash.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`demo | head -1`): stop quietly. Python would
        # complain again when it flushes stdout at exit, so point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "table":
        render = {"markdown": _table.markdown, "mermaid": _table.mermaid, "dot": _table.dot}
        sys.stdout.write(render[args.format]())
        return EXIT_OK
    if args.command == "replay":
        try:
            report = replay(args.log)
        except RunLogError as error:
            print(f"attempt-kernel replay: error: {shown(str(error))}", file=sys.stderr)
            return EXIT_USAGE
        if args.json:
            sys.stdout.write(_report.as_json(report, args.log))
        elif args.metrics:
            sys.stdout.write(_report.as_metrics(report))
        else:
            sys.stdout.write(_report.as_text(report, args.log))
        return EXIT_OK if report.valid else EXIT_VIOLATIONS
    if args.command in ("demo", "recover"):
        try:
            return _demo(args) if args.command == "demo" else _recover(args)
        except AttemptKernelError as error:
            print(f"attempt-kernel {args.command}: error: {shown(str(error))}", file=sys.stderr)
            return EXIT_USAGE
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse forbids it
