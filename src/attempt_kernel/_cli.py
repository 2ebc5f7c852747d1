"""The ``attempt-kernel`` command line: argparse in, text out.

Exit codes: 0 success, 2 usage error (argparse's convention).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import _table


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "table":
        render = {"markdown": _table.markdown, "mermaid": _table.mermaid, "dot": _table.dot}
        sys.stdout.write(render[args.format]())
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse forbids it
