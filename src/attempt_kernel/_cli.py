"""The ``attempt-kernel`` command line: argparse in, text out.

Exit codes: 0 success (a valid log), 1 a log with violations, 2 a usage or
I/O error (argparse's convention for usage errors).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Final

from . import _report, _table
from ._replay import replay
from ._runlog import RunLogError

EXIT_OK: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_USAGE: Final = 2


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "table":
        render = {"markdown": _table.markdown, "mermaid": _table.mermaid, "dot": _table.dot}
        sys.stdout.write(render[args.format]())
        return EXIT_OK
    if args.command == "replay":
        try:
            report = replay(args.log)
        except RunLogError as error:
            print(f"attempt-kernel replay: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        if args.json:
            sys.stdout.write(_report.as_json(report, args.log))
        elif args.metrics:
            sys.stdout.write(_report.as_metrics(report))
        else:
            sys.stdout.write(_report.as_text(report, args.log))
        return EXIT_OK if report.valid else EXIT_VIOLATIONS
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse forbids it
