"""The ``attempt-kernel`` command line: argparse in, text out, one handler per command.

Exit codes: 0 success (a valid log, a run that succeeded), 1 a log with
violations or a run that did not succeed, 2 a usage or I/O error
(argparse's convention for usage errors), 3 the database a URL names is
unavailable (it cannot be reached; a worker gave up reconnecting), 130 and 143 when SIGINT or
SIGTERM stopped runs gracefully (128 + the signal), 141 when the reader of
the output went away (a closed pipe). Names from a log are escaped where
they are printed. Reading commands (``replay``, ``runs``, ``show``) work on
a log another process is writing; writing ones are refused by its lock.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import errno
import importlib
import io
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final, NoReturn, cast

from typing_extensions import assert_never, final

from .. import _report, _table
from .._codec import RunLogError, UnencodableRecord, encode_record, state_name, strict_json
from .._version import __version__
from .._demo import TRIP_PLANNER, WORKFLOWS, Blueprint
from .._errors import AttemptKernelError
from .._findings import EffectHappened, EffectNotHappened, EffectUnknown
from .._executor import Job, RunsStopped, Stopper, recorded_report, run_jobs
from .._history import run_history
from .._ledger import Ledger, RunView
from .._observe import UNRECORDED, utc
from .._logfile import FileLog, LogLocked, LogWriteFailed, RunLogWriter, open_regular
from .._operations import deliver, held_runs, listed_runs, next_run_id, resume_run, submitted_for, writer_listed
from .._inbox import inbox_path, inbox_size, settle_inbox
from .._operate import (
    MAX_JSON_DEPTH, Build, Delivered, Delivery, cancel_change, json_problem, reconcile_change, signal_change,
)  # fmt: skip
from .._records import (
    JSON, CorruptLine, IntentReconciled, LogItem, Record, RunCancelRequested, RunStarted, SignalSent, TornTail, WaitStarted,
)  # fmt: skip
from .._outcome import RunReport
from .._recovery import Asked, Recovery
from .._replay import replay
from .._report import shown
from .._resume import Supervisor, resume_log
from .._runlist import ListedStatus, RunFilter, parse_statuses, parse_time
from .._store import Journal, LogSource
from .._store import is_url as _is_url
from .._workflow import Workflow

if TYPE_CHECKING:  # optional dependencies: imported where a URL is opened, where --metrics-port asks
    from .. import _metrics
    from ..postgres._deliver import TakenIn
    from ..postgres._journal import PgJournal, RunHolds

EXIT_OK: Final = 0
EXIT_VIOLATIONS: Final = 1
EXIT_NOT_SUCCEEDED: Final = 1
EXIT_USAGE: Final = 2
EXIT_DB_UNAVAILABLE: Final = 3
"""The PostgreSQL a URL names cannot be reached (`PgConnectFailed`): retry later, unlike a usage error."""
EXIT_BROKEN_PIPE: Final = 141
"""128 + SIGPIPE, what a shell reports for a writer whose reader went away."""
GRACE: Final = 5.0
"""Seconds live attempts get after SIGINT/SIGTERM before they are ended."""


class _Usage(AttemptKernelError):
    """Internal: a wrong argument found after parsing (exit 2, message as is)."""


def _workflows_flag(parser: argparse.ArgumentParser, help: str, *, required: bool = False) -> None:
    """``--workflows MODULE:ATTR``: one a flag, repeated or a comma list, in any order (`_targets`)."""
    parser.add_argument(
        "--workflows", type=_targets, action="extend", default=None if required else [],
        required=required, metavar="MODULE:ATTR", help=help + _REPEAT,
    )  # fmt: skip


@final
class _Parser(argparse.ArgumentParser):
    """argparse's parser, its error messages escaped: they quote what was typed (an
    unrecognized argument, an ambiguous option's value), which may hold a line break or
    an escape sequence, and the error must stay one last line with no control code."""

    def error(self, message: str) -> NoReturn:
        super().error(shown(message))


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attempt-kernel",
        description="The kernel of a durable runtime for agent workflows.",
    )
    parser.add_argument("--version", action="version", version=f"attempt-kernel {__version__}")
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
        "I/O errors. With --metrics, exit 0 whenever the log could be read (its violations "
        "are a metric, attempt_kernel_log_violations), so that `replay --metrics LOG > f.tmp "
        "&& mv f.tmp f.prom` updates a textfile collector's file. The log is only read.",
    )
    replay_cmd.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    output = replay_cmd.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help=_JSON_HELP)
    output.add_argument(
        "--metrics", action="store_true",
        help="print the Prometheus text format for a scraper, every sample labelled journal=LOG",
    )
    demo = commands.add_parser(
        "demo",
        help="run the built-in trip-planning agent workflow, then replay its log",
        description="Run the built-in example agent workflow (simulated tools and side "
        "effects: a retried tool call, a step deadline, two effects through intents, a "
        "cancelled watcher), append its records to the log, then replay the log. Exit 0 "
        "if the log is valid, 1 if not, 2 for usage or I/O errors, 130/143 when stopped by "
        "SIGINT/SIGTERM (the run stays unfinished for `recover`).",
    )
    demo.add_argument(
        "--log", default="demo-run.jsonl", metavar="PATH",
        help="run log file to append to (default: demo-run.jsonl; created if missing; a file,"
        " not a postgresql:// URL)",
    )  # fmt: skip
    demo.add_argument(
        "--crash-after", type=_positive_int, metavar="N",
        help="die abruptly (SIGKILL) right after the N-th record is written, as a crash would",
    )  # fmt: skip
    demo.add_argument("--json", action="store_true", help=_JSON_HELP)
    demo.add_argument(
        "--seed", type=int, default=0, metavar="S",
        help="seed for the simulated tools' latencies (default 0)",
    )  # fmt: skip
    run = commands.add_parser(
        "run",
        help="run your own workflow (MODULE:ATTR) and write its log",
        description="Import the workflow MODULE:ATTR (a Workflow: a function decorated with "
        "@workflow, or a DAG from load_workflow; the "
        "current folder is on the import path), run it once, append its records to the "
        "log, and print its report. SIGINT/SIGTERM stop it gracefully: no new attempt, "
        f"{GRACE:g} s of grace, then live attempts end as recovery would end them, and "
        "the run stays unfinished for `recover`. Exit 0 if the run succeeded, 1 if not, "
        "2 for usage or I/O errors, 130/143 when stopped by SIGINT/SIGTERM.",
    )
    run.add_argument("target", metavar="MODULE:ATTR", help="the workflow, e.g. flows:orders")
    run.add_argument(
        "--log", metavar="LOG|URL",
        help="run log file to append to (default: <workflow name>.jsonl in the current folder;"
        " a name holding '/' must give --log; created if missing), or a PostgreSQL journal's"
        " postgresql:// URL",
    )  # fmt: skip
    run.add_argument(
        "--run", metavar="ID", dest="run_id",
        help="the run's id (default: <workflow>-<n>, the next free number in the log)",
    )  # fmt: skip
    run.add_argument(
        "--input", metavar="JSON", help="the run's input, as JSON (steps see it as ctx.input)"
    )
    run.add_argument("--json", action="store_true", help=_JSON_HELP)
    recover = commands.add_parser(
        "recover",
        help="recover a log after a crash and resume its unfinished runs",
        description="Cut a torn tail (its bytes are kept in a side file), ask the steps' "
        "reconcilers about effects a crash left outstanding, end every orphaned attempt "
        "(Running: Cancel with the intent record's answer; Pending: "
        "Cancel(intent_dispatched=False)), close runs whose cancel was decided, resume "
        "the others (Succeeded steps are not run again, Cancelled ones get a new attempt, "
        "Indeterminate ones wait for reconciliation), then replay the log. Exit 0 if "
        "valid, 1 if not, 2 for usage or I/O errors or a log that cannot be recovered, "
        "130/143 when stopped by SIGINT/SIGTERM.",
    )
    recover.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    _workflows_flag(recover, "your workflows, beside the built-in demo's")
    recover.add_argument("--json", action="store_true", help=_JSON_HELP)
    runs = commands.add_parser(
        "runs",
        help="list the runs in a log and where each stands",
        description="One line per run: id, workflow, status (queued, running, waiting, "
        "interrupted, succeeded, failed, cancelled, needs-reconciliation), attempts, start "
        "and end time (UTC), domain state; a queued run (submitted to a PostgreSQL journal, "
        "not claimed yet) shows its submit time as its start. The filters narrow the list; "
        "without --limit every run that passes them is listed in the log's order, with "
        "--limit N the N most recently started, newest first. On a PostgreSQL journal the "
        "runs' summaries answer, not a read of the whole journal. The log is only read. "
        "Exit 0, or 2 for usage or I/O errors (a bad filter reads nothing).",
    )
    runs.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    runs.add_argument("--json", action="store_true", help=_JSON_HELP)
    runs.add_argument(
        "--status", type=_statuses, action="append", metavar="STATUS",
        help="only runs with this status; repeat it or give a comma list (failed,cancelled)",
    )  # fmt: skip
    runs.add_argument("--workflow", metavar="NAME", help="only runs of this workflow")
    runs.add_argument(
        "--since", type=_utc_time, metavar="TIME",
        help="only runs started at TIME or later (ISO-8601 UTC as STARTED prints it:"
        " 2026-12-01T14:07:55Z or 2026-12-01T14:07:55.123Z)",
    )  # fmt: skip
    runs.add_argument(
        "--until", type=_utc_time, metavar="TIME",
        help="only runs started before TIME (same form as --since)",
    )  # fmt: skip
    runs.add_argument(
        "--limit", type=_positive_int, metavar="N",
        help="at most N runs, the most recently started first",
    )  # fmt: skip
    show = commands.add_parser(
        "show",
        help="show one run step by step",
        description="The run's attempts with their states, causes and times, results "
        "(shortened) and errors, intents with their keys and states, and who reconciled "
        "what. The log is only read. Exit 0, or 2 for usage or I/O errors or an unknown run.",
    )
    show.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    show.add_argument("run", metavar="RUN", help="the run's id")
    show.add_argument("--json", action="store_true", help=_JSON_HELP)
    reconcile = commands.add_parser(
        "reconcile",
        help="resolve an outstanding intent after asking the downstream system",
        description="Record that the effect under KEY is known to have happened "
        "(--confirmed, with its --result if known) or not (--rejected). The attempt "
        "keeps its state; once no intent of the step is outstanding, `recover` resumes "
        "the run and the step gets a new attempt (confirmed results reused, rejected "
        "effects sent again). Exit 0, or 2 for an unknown key, a key that is not "
        "outstanding, or other usage or I/O errors (nothing is written then). When another "
        "process is writing the log file, the reconciliation waits in the log's inbox "
        "(LOG.inbox) and that process takes it in within about a second." + _PG_INBOX_HELP,
    )
    reconcile.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    reconcile.add_argument("--key", required=True, metavar="KEY", help="the intent's idempotency key")
    answer = reconcile.add_mutually_exclusive_group(required=True)
    answer.add_argument("--confirmed", action="store_true", help="the effect happened")
    answer.add_argument("--rejected", action="store_true", help="the effect did not happen")
    reconcile.add_argument(
        "--result", metavar="JSON", help="with --confirmed: the effect's result, as JSON"
    )
    reconcile.add_argument("--note", default="", metavar="TEXT", help="why, for the record")
    reconcile.add_argument("--json", action="store_true", help=_JSON_HELP)
    signal_cmd = commands.add_parser(
        "signal",
        help="send a signal to a run (it may wait for it with run.wait_for_signal)",
        description="Record signal NAME, with --payload (any JSON value but null; default "
        "{}), for run RUN. When another process is writing the log file, the signal waits "
        "in the log's inbox (LOG.inbox) and that process takes it in within about a second."
        + _PG_INBOX_HELP + " Durable when this returns. Exit 0, or 2 for an unknown or finished run, one whose "
        "cancel is recorded, a bad name or payload, or other usage or I/O errors (nothing is "
        "written then).",
    )
    signal_cmd.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    signal_cmd.add_argument("run", metavar="RUN", help="the run's id")
    signal_cmd.add_argument("name", metavar="NAME", help="the signal's name")
    signal_cmd.add_argument("--payload", metavar="JSON", help="the signal's value, as JSON (default {})")
    signal_cmd.add_argument("--json", action="store_true", help=_JSON_HELP)
    cancel = commands.add_parser(
        "cancel",
        help="cancel a run from outside",
        description="Record the decision to cancel run RUN. The process running it (or "
        "`recover`, when none does) ends it: live attempts end Cancelled, or Indeterminate "
        "when an effect was dispatched; waits end; the run finishes cancelled. When another "
        "process is writing the log file, the cancel waits in the log's inbox (LOG.inbox) "
        "and that process takes it in within about a second." + _PG_INBOX_HELP + " Exit 0, or 2 for"
        " an unknown or finished run, one whose cancel is recorded already, or other usage or I/O"
        " errors (nothing is written then).",
    )
    cancel.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    cancel.add_argument("run", metavar="RUN", help="the run's id")
    cancel.add_argument("--reason", default="", metavar="TEXT", help="why, for the record")
    cancel.add_argument("--json", action="store_true", help=_JSON_HELP)
    resume = commands.add_parser(
        "resume",
        help="resume one unfinished run that no process drives",
        description="On PostgreSQL, make run RUN claimable now: a worker of its workflow takes "
        "it up at its next claim. On a log file, recover run RUN and drive it in this process "
        "(its workflow given with --workflows) until it finishes; other runs are left alone. A "
        "run that waits (for a signal or a timer) waits in this process, as under `run`: it "
        "prints what the run waits for and the command that ends the wait (a `signal` from "
        "elsewhere reaches it through the log's inbox). "
        "Exit 0 when it was resumed, or 2 for an unknown or finished run, one that needs "
        "reconciliation first, one a process drives already, or other usage or I/O errors "
        "(nothing is written then).",
    )
    resume.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    resume.add_argument("run", metavar="RUN", help="the run's id")
    _workflows_flag(resume, "on a log file: the run's workflow (beside the built-in demo's)")
    resume.add_argument("--json", action="store_true", help=_JSON_HELP)
    export = commands.add_parser(
        "export",
        help="write a journal (a PostgreSQL URL, or a log file) as a JSON Lines run log",
        description="Write every record of the journal, or of one run with --run, to "
        "standard output as a run log file that `replay` validates: the same records, "
        "numbered 1, 2, ... in journal order, each with its checksum. Exit 0, or 2 for "
        "usage or I/O errors: a corrupt record, a record nested deeper than the writer "
        "takes (MAX_RECORD_DEPTH; another tool wrote it), or a gap or repeat in the "
        "journal's own numbering (which renumbering would hide), is refused, naming its "
        "line, and nothing after it is written.",
    )
    export.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    export.add_argument("--run", metavar="ID", help="only this run's records")
    submit = commands.add_parser(
        "submit",
        help="enqueue a run of your workflow in a PostgreSQL journal, for the workers",
        description="Enqueue a run of MODULE:ATTR (its name is what the workers match) in "
        "the PostgreSQL journal at URL; a worker claims it. Prints the run id. Exit 0, or 2 "
        "for usage or I/O errors (an id already in the journal is refused).",
    )
    submit.add_argument("url", metavar="URL", help=_URL_HELP)
    submit.add_argument("target", metavar="MODULE:ATTR", help="the workflow, e.g. flows:orders")
    submit.add_argument("--run", metavar="ID", dest="run_id", help="the run's id (default: <workflow>-<random>)")
    submit.add_argument("--input", metavar="JSON", help="the run's input, as JSON")
    submit.add_argument("--json", action="store_true", help=_JSON_HELP)
    worker = commands.add_parser(
        "worker",
        help="serve the runs of a PostgreSQL journal (beside other workers), or of a log file",
        description="With a log file: one process serves every unfinished run of its "
        "workflows in the log, recovering it first, taking in what operators send (signal, "
        "cancel, reconcile) and going on with runs reconciled or signalled from outside; "
        "--until-idle exits once no unfinished run of these workflows is left that it could "
        "go on with now (a run waiting for a signal not sent yet or a wake time still to come "
        "is left waiting); --heartbeat and --dead-after do not apply. With a PostgreSQL URL: one "
        "worker process: a fresh id, a heartbeat judged by the database's "
        "clock, a fenced lease on each run it drives. It claims queued runs and takes over "
        "the runs of workers whose heartbeat is older than --dead-after (reconcilers first, "
        "then their orphans end as recovery ends them). SIGINT/SIGTERM stop it gracefully "
        "and hand its runs back. When the database goes away (a restart, its sessions "
        "terminated, not up yet at the start) it drops its runs, reconnects with jittered "
        "backoff (0.1 s doubling to 5 s) and goes on under a fresh id, its runs taken over "
        "fenced. Exit 0 when stopped (with a URL) or idle (--until-idle), 130/143 when "
        "SIGINT/SIGTERM stopped it (with a log file), 1 when it was declared dead (another "
        "worker took its runs over), 2 for usage or I/O errors (and, "
        "with a log file and --until-idle, when it left a run whose code diverged from its "
        "log, as recover does), 3 when the database stayed unreachable for --reconnect-for "
        "seconds.",
    )
    worker.add_argument("url", metavar="LOG|URL", help=_LOG_HELP)
    _workflows_flag(worker, "the workflows this worker can run", required=True)
    worker.add_argument("--concurrency", type=_positive_int, default=4, metavar="N",
                        help="runs driven at once (default 4); with a log file, attempts "
                             "running at once, its runs all driven together")  # fmt: skip
    worker.add_argument("--heartbeat", type=_positive_float, default=1.0, metavar="S",
                        help="seconds between heartbeats (default 1)")  # fmt: skip
    worker.add_argument("--dead-after", type=_positive_float, default=5.0, metavar="S",
                        help="a worker silent this long is dead and its runs are taken over (default 5; at "
                             "least three --heartbeat periods)")  # fmt: skip
    worker.add_argument("--until-idle", action="store_true",
                        help="exit once no run of these workflows is left that it could go on with now")  # fmt: skip
    worker.add_argument("--reconnect-for", type=_seconds, default=300.0, metavar="SECONDS",
                        help="with a URL: how long to go on reconnecting to an unreachable database"
                        " (also at the start) before exiting 3 (default 300; 0: never)")  # fmt: skip
    worker.add_argument("--metrics-port", type=_port, metavar="N",
                        help="serve Prometheus metrics at http://HOST:N/metrics (0: any free port;"
                        " needs attempt-kernel[metrics])")  # fmt: skip
    worker.add_argument("--metrics-host", type=_host, default="127.0.0.1", metavar="HOST",
                        help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0: every"
                        " IPv4 interface; not empty)")  # fmt: skip
    worker.add_argument("--log-level", choices=_LOG_LEVELS, default="info",
                        help="with a URL: the least level of the lines it prints, each with its UTC"
                        " time and level (default info: claims, takeovers, every state change;"
                        " warning: what may need a person)")  # fmt: skip
    migrate = commands.add_parser(
        "migrate",
        help="create or upgrade the journal's tables in a PostgreSQL database",
        description="Bring the journal's tables in schema S of the PostgreSQL database at URL "
        "to the version this library writes, in one transaction under the schema's advisory "
        "lock (several at once are safe: the others wait and find it done). Run it once, as "
        "a role that may create tables there, before workers that run under a role without "
        "that privilege (see docs/design.md, \"Roles and migrations\"). Prints the version "
        "before and after; a schema already up to date is only read. Exit 0; 2 for usage "
        "or I/O errors (a role that may not create the tables, tables newer than this "
        "library); 3 when the database cannot be reached (try again later).",
    )
    migrate.add_argument("url", metavar="URL", help=_URL_HELP)
    migrate.add_argument("--schema", default="attempt_kernel", metavar="S",
                         help="the PostgreSQL schema of the journal (default attempt_kernel); the other"
                         " commands read and write attempt_kernel only, so a journal in another schema"
                         " is for Python programs that pass schema=S (PgJournal, Worker, run_worker,"
                         " submit_run, migrate)")  # fmt: skip
    migrate.add_argument("--json", action="store_true",
                         help="print one JSON object: schema, version_before, version_after")  # fmt: skip
    pool = commands.add_parser(
        "pool",
        help="create or resize a pool of slots shared by all workers",
        description="Set the size of pool NAME in the PostgreSQL journal at URL: never "
        "more than N attempts of steps naming this pool (Step(pool=NAME)) run at once, "
        "whatever the number of workers. 0 pauses the pool; shrinking stops no running "
        "attempt. Prints the pool. Exit 0, or 2 for usage or I/O errors.",
    )
    pool.add_argument("url", metavar="URL", help=_URL_HELP)
    pool.add_argument("name", metavar="NAME", help="the pool's name")
    pool.add_argument("--slots", type=_non_negative_int, required=True, metavar="N",
                      help="how many attempts of the pool may run at once")  # fmt: skip
    pool.add_argument("--json", action="store_true", help=_JSON_HELP)
    pools = commands.add_parser(
        "pools",
        help="list the pools of a PostgreSQL journal",
        description="One line per pool: its name, its size and how many slots are held now.",
    )
    pools.add_argument("url", metavar="URL", help=_URL_HELP)
    pools.add_argument("--json", action="store_true", help=_JSON_HELP)
    serve = commands.add_parser(
        "serve",
        help="a web view of the runs, with the operator's actions (needs attempt-kernel[web])",
        description="Serve a web view of the log or journal: the run list (filter by status, "
        "workflow, start time), each run as a timeline of its attempts and waits, its intents "
        "with their keys and states, its signals, and forms to signal, cancel, reconcile and "
        "resume, which go through the same operations as the commands of those names. Listens "
        "on 127.0.0.1 unless --host says otherwise (a non-loopback host makes the actions "
        "reachable from the network: a warning says so). Ctrl-C or SIGTERM stops it. Exit 0 "
        "when stopped, 2 for usage or I/O errors (a port in use, no Jinja2: install "
        "attempt-kernel[web]), 3 when a URL's database cannot be reached, 130/143 when the "
        "stop came while it drove a run it resumed on a log file (that run stays unfinished).",
    )
    serve.add_argument("log", metavar="LOG|URL", help=_LOG_HELP)
    serve.add_argument("--host", type=_host, default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0: every IPv4 interface; not empty)")  # fmt: skip
    serve.add_argument("--port", type=_port, default=8421, metavar="N",
                       help="port to listen on (default 8421; 0 picks a free one)")  # fmt: skip
    _workflows_flag(serve, "workflows that resume may drive in this process (a file log only: on a URL, refused)")
    for command_parser in commands.choices.values():
        # So that an error found later is told in the command's name, as argparse tells its own.
        command_parser.set_defaults(command_parser=command_parser)
    return parser


_LOG_HELP: Final = "a run log file, or a PostgreSQL journal's postgresql:// URL"
_URL_HELP: Final = "a PostgreSQL journal's postgresql:// URL (this command has no log file form)"
_JSON_HELP: Final = "print one JSON object on stdout (its keys: docs/cli.md, \"JSON output\")"
_REPEAT: Final = "; one MODULE:ATTR a flag, repeat it for more (or a comma list: a:x,b:y)"


def _targets(text: str) -> list[str]:
    """One ``--workflows`` value: MODULE:ATTR, or several joined by commas (each checked
    for its shape here; imported by `load_target` once the arguments are parsed)."""
    targets = [part.strip() for part in text.split(",")]
    for target in targets:
        module_name, sep, attr = target.partition(":")
        if not sep or not module_name or not attr:
            raise argparse.ArgumentTypeError(
                f"{target!r} is not MODULE:ATTR (for example flows:orders; give one a flag:"
                " --workflows a:x --workflows b:y)"
            )
    return targets


def _number_of_seconds(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (0 <= value if zero else 0 < value) or value == float("inf"):
        kind = "0 or more" if zero else "positive"
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds, {kind}, got {text}" if zero
            else f"expected a {kind} number of seconds, got {text}"
        )  # fmt: skip
    return value


def _positive_float(text: str) -> float:
    return _number_of_seconds(text, zero=False)


def _seconds(text: str) -> float:
    """``--reconnect-for``: a finite number of seconds, 0 or more."""
    return _number_of_seconds(text, zero=True)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (0 to 65535), got {value}")
    return value


def _host(text: str) -> str:
    """``--host``, ``--metrics-host``: an address to listen on. An empty one would listen
    on every interface (what bind() makes of ``''``), which an unset shell variable
    should not open up: that takes ``0.0.0.0``, said."""
    if not text:
        raise argparse.ArgumentTypeError("expected an address, got an empty one (0.0.0.0 listens on every IPv4 interface)")
    return text


def _statuses(text: str) -> tuple[ListedStatus, ...]:
    try:
        return parse_statuses(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _utc_time(text: str) -> int:
    try:
        return parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


class _CrashAfter:
    """File operations that kill the process right after the N-th record is written.

    A write of several records (the writer's ``append_all``) that holds the
    N-th one is cut after it, as a crash in the middle of that write could
    leave the log: the records before survive, the rest never land.
    """

    def __init__(self, records: int) -> None:
        self._left = records

    def write(self, fd: int, data: bytes) -> int:
        lines = data.count(b"\n")
        if lines < self._left:
            self._left -= lines
            return os.write(fd, data)
        end = 0
        for _ in range(self._left):
            end = data.index(b"\n", end) + 1
        os.write(fd, data[:end])
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached: the process was killed")

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


def _progress() -> Callable[[str], None] | None:
    """One line per state change on stderr, when a person is watching it."""
    if not sys.stderr.isatty():
        return None
    return lambda line: print(f"  .. {shown(line)}", file=sys.stderr, flush=True)


@final
class _WarningLines(logging.Handler):
    """What the library logs at WARNING and above that nothing else shows, each one line
    on stderr (``attempt-kernel COMMAND: warning: ...``, escaped), while a command drives
    runs.

    A reconciler's answer asked as a cancel or a stop ended an attempt, when no
    record keeps it (an answer nobody could give: the only trace of why the attempt
    ended Indeterminate; or one the log failed to record: the only trace of what the
    downstream system said), and an observer that failed. The runs' other lines
    (``attempt_kernel.run``: an attempt that became Indeterminate) are in the log,
    which the command's report and `show` read; and when the progress lines are
    printed, they say the runs' lines already.
    """

    def __init__(self, command: str, progress: bool) -> None:
        super().__init__(logging.WARNING)
        self._command: Final = command
        self._progress: Final = progress

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "attempt_kernel.run" and (self._progress or not getattr(record, UNRECORDED, False)):
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            sys.stderr.write(f"attempt-kernel {self._command}: warning: {shown(text)}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001  # as any handler: a failing stream never stops a run
            self.handleError(record)


@contextlib.contextmanager
def _warnings_on_stderr(command: str, progress: Callable[[str], None] | None) -> Generator[None, None, None]:
    """`_WarningLines` on the ``attempt_kernel`` logger while the command drives runs;
    ``progress``: the progress lines the runs are given, if any."""
    handler = _WarningLines(command, progress=progress is not None)
    logger = logging.getLogger("attempt_kernel")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _json_argument(text: str, flag: str) -> JSON:
    """Strict JSON from the command line, or a usage error naming the position; nested
    at most `MAX_JSON_DEPTH` levels, its numbers finite (`json_problem`)."""
    try:
        value = strict_json(text)
    except json.JSONDecodeError as error:
        raise _Usage(
            f"{flag} is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
            f" (character {error.pos})"
        ) from None
    except ValueError as error:
        raise _Usage(f"{flag} is not JSON: {error}") from None
    except RecursionError:  # far deeper than the limit: the parser gave up
        raise _Usage(
            f"{flag} is refused: it is nested deeper than {MAX_JSON_DEPTH} levels of arrays and"
            " objects; nothing was written"
        ) from None
    problem = json_problem(value)
    if problem is not None:
        raise _Usage(f"{flag} is refused: {problem}; nothing was written")
    return value


def load_target(target: str) -> Workflow:
    """The workflow an import path ``MODULE:ATTR`` names (the current folder first).

    Raises an error naming the module and the attribute when the module does
    not import, has no such attribute, or the attribute is not a `Workflow`.
    """
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise _Usage(f"{target!r} is not MODULE:ATTR (for example flows:orders)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001  # whatever the user's module raises
        raise _Usage(
            f"cannot import module {module_name!r} (for {target}):"
            f" {type(error).__name__}: {error}"
        ) from None
    value: object = module
    for part in attr.split("."):
        if not hasattr(value, part):
            raise _Usage(f"module {module_name!r} has no attribute {attr!r}")
        value = getattr(value, part)
    if not isinstance(value, Workflow):
        raise _Usage(
            f"{target} is a {type(value).__name__}, not a Workflow; make it with"
            " @attempt_kernel.workflow(...) on an async function, or with"
            " attempt_kernel.load_workflow(...)"
        )
    return value


def _pg(url: str) -> Journal:
    """The PostgreSQL journal a URL names (psycopg is an optional dependency)."""
    return _pg_journal(url)


def _submitted(url: str) -> Callable[[Collection[str]], Collection[str]]:
    """Of some runs of the journal at ``url``, those a worker can claim (see `resume_log`)."""
    from ..postgres._deliver import submitted

    return lambda runs: submitted(url, runs)


def _submitted_for(url: str, run: str) -> str | None:
    """The workflow ``run`` was submitted for to the journal at ``url``'s queue, if it was."""
    return submitted_for(url, run)


def _pg_journal(url: str) -> PgJournal:
    try:
        from ..postgres._journal import PgJournal
    except ImportError as error:
        raise _Usage(
            f"{_redacted(url)}: a PostgreSQL journal needs psycopg ({error});"
            " install attempt-kernel[postgres]"
        ) from None
    return PgJournal(url)


def _redacted(url: str) -> str:
    """A URL without its password, for messages."""
    return _report.redacted(url)


def _default_log(workflow: str) -> str:
    """``run``'s log without ``--log``: ``<workflow>.jsonl`` in the current folder, for a
    name that is a plain file name; any other name is refused (give ``--log``)."""
    if "/" in workflow or "\x00" in workflow or (os.altsep is not None and os.altsep in workflow):
        raise _Usage(
            f"workflow {workflow!r} has a name that is not a plain file name, so <workflow>.jsonl"
            " would not be a file in the current folder; give the log with --log PATH"
        )
    return f"{workflow}.jsonl"


def _names_a_file(log: str, flag: str) -> None:
    """Refuse a log path whose last part names no file (``''``, ``.``, ``/``, ``dir/..``)."""
    if not _is_url(log) and Path(log).name in ("", ".."):
        raise _Usage(f"{flag} {log!r} names a folder, not a run log file (give a file name, e.g. {flag} runs.jsonl)")


def _source(log: str) -> LogSource:
    """What a reading command reads: a file, or the journal a URL names (see `_reading`)."""
    return _pg(log) if _is_url(log) else FileLog(log)


@contextlib.contextmanager
def _reading(log: str) -> Generator[LogSource, None, None]:
    """`_source` for one command: a journal's connections are closed when it is done."""
    if not _is_url(log):
        yield FileLog(log)
        return
    journal = _pg_journal(log)
    try:
        yield journal
    finally:
        journal.close()


@contextlib.contextmanager
def _journal(log: str, *, create: bool) -> Generator[Journal, None, None]:
    """What a writing command writes: a file under its lock, or the journal a URL names."""
    if _is_url(log):
        journal = _pg(log)
        try:
            yield journal
        finally:
            close = getattr(journal, "close", None)
            if callable(close):
                close()
    else:
        writer = RunLogWriter(log, create=create)  # not opened: nothing was let go, nothing to settle
        try:
            with writer:
                yield writer
        finally:
            # What an operator sent while this process let the log go.
            with contextlib.suppress(RunLogError, OSError):
                settle_inbox(log)


@contextlib.contextmanager
def _settled(log: str) -> Generator[None, None, None]:
    """`settle_inbox` once the writer opened inside is let go."""
    try:
        yield
    finally:
        with contextlib.suppress(RunLogError, OSError):
            settle_inbox(log)


_UNTYPABLE: Final = (
    "no command line can carry its run id or signal name (a NUL, or text the file system encoding cannot write)"
)


def _typed(word: str) -> str | None:
    """``word`` as a shell word that, pasted into bash, hands the command ``word`` back;
    None when no command line can carry it (a NUL, text the file system encoding cannot
    write). Printable text is quoted as every POSIX shell reads it (`shlex.quote`); text
    with a control character or an undecodable byte (``\\udcff``, as the command line
    decodes one) in bash's ``$'...'``, those characters written as their bytes (``\\xff``)."""
    try:
        if "\0" in word or os.fsdecode(os.fsencode(word)) != word:
            return None
    except UnicodeError:  # a lone surrogate that stands for no byte
        return None
    if word.isprintable():
        return shlex.quote(word)
    text = "".join(
        "\\" + c if c in "\\'" else c if c.isprintable() else "".join(f"\\x{b:02x}" for b in os.fsencode(c))
        for c in word
    )
    return f"$'{text}'"


def _command(*words: str) -> str | None:
    """``attempt-kernel WORDS...`` as a line to paste into bash; None when a word cannot
    be typed (`_typed`)."""
    typed = [_typed(word) for word in words]
    return None if None in typed else " ".join(["attempt-kernel", *(t for t in typed if t is not None)])


def _suggested(*words: str) -> str:
    """`_command` of words that came from the command line, which can always be typed back."""
    command = _command(*words)
    assert command is not None, words  # argv never holds a NUL or an unencodable character
    return command


def _announce_waits(log: str, *, kept: bool = True) -> Callable[[str, WaitStarted], None]:
    """What `run` and `recover` print when a run begins to wait (or, resumed, is found
    waiting once its code was checked against the log): on what, and the command
    that ends the wait.

    ``kept``: this process keeps a sleeping run until it wakes, so it goes on by
    itself then. False where the process lets it go (`recover URL`, `worker
    --until-idle`): what goes on with it is said once it is let go.
    """
    where = _redacted(log)

    def say(run: str, wait: WaitStarted) -> None:
        on = _report.WaitOn(signal=wait.signal, wake_us=wait.wake_us)
        line = _report.wait_text(run, on)
        if wait.signal is None:
            ending = _command("cancel", where, run)
            if ending is None:
                ending = f"attempt_kernel.cancel_run({where!r}, {run!r}) in Python; {_UNTYPABLE}"
            if kept:
                line += f"; it goes on by itself then (to end the run instead: {shown(ending)})"
            else:
                line += f"; to end the run before then: {shown(ending)}"
        else:
            command = _command("signal", where, run, wait.signal)
            if command is None:
                line += (
                    f"; end the wait with attempt_kernel.send_signal({where!r}, {run!r},"
                    f" {wait.signal!r}) in Python; {_UNTYPABLE}"
                )
            else:
                line += f"; end the wait with: {shown(command)} (add --payload JSON to send a value)"
        print(line, flush=True)

    return say


def _replay_and_print(log: str) -> int:
    with _reading(log) as source:
        report = replay(source)
    sys.stdout.write("\n" + _report.as_text(report, _redacted(log)))
    return EXIT_OK if report.valid else EXIT_VIOLATIONS


# --------------------------------------------------------------------------
# --json: one JSON object on stdout (its keys are listed in docs/cli.md,
# "JSON output"); errors still go to stderr, with the same exit codes.
# --------------------------------------------------------------------------


def _print_json(doc: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def _replay_json(log: str) -> tuple[dict[str, object], int]:
    """`replay --json`'s object for the log as it is now, and the exit code `replay` gives."""
    with _reading(log) as source:
        report = replay(source)
    doc: dict[str, object] = json.loads(_report.as_json(report, _redacted(log)))
    return doc, EXIT_OK if report.valid else EXIT_VIOLATIONS


def _run_json(report: RunReport) -> dict[str, object]:
    """A run's report: what `run_text` prints, as keys."""
    return {
        "run": report.run,
        "workflow": report.workflow,
        "status": report.status,
        "steps": [
            {
                "step": step.step,
                "state": None if step.state is None else state_name(step.state),
                "attempts": step.attempts,
                "error": step.error,
                "outstanding_keys": list(step.outstanding),
            }
            for step in report.steps
        ],
        "result": report.result,
        "error": report.error,
    }


def _asked_json(recovery: Recovery) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for asked in recovery.asked:
        finding = asked.finding
        match finding:
            case EffectHappened():
                found, reason = "happened", None
            case EffectNotHappened():
                found, reason = "not-happened", None
            case EffectUnknown():
                found, reason = "unknown", finding.reason or None
            case _:
                assert_never(finding)
        out.append({
            "run": asked.run, "step": asked.step, "attempt": asked.attempt, "intent": asked.intent,
            "key": asked.key, "finding": found, "reason": reason,
        })  # fmt: skip
    return out


def _orphans_json(recovery: Recovery) -> list[dict[str, object]]:
    return [
        {
            "run": o.run, "step": o.step, "attempt": o.attempt, "from": state_name(o.from_state),
            "to": state_name(o.to_state), "outstanding_keys": list(o.outstanding),
        }
        for o in recovery.orphans
    ]  # fmt: skip


def _failed_writing(error: RunLogError) -> bool:
    """Did the log fail as it was written (a log file's write or fsync, a PostgreSQL
    journal's append or connection), rather than refuse what it was given?"""
    journal = sys.modules.get(_PG_JOURNAL)  # loaded if a URL was opened (psycopg is optional)
    return isinstance(error, LogWriteFailed) or (journal is not None and isinstance(error, journal.PgJournalError))


@final
class _Unsaid:
    """Reconcilers' answers that came (``came``) and were not yet said as written,
    by what recovery did or what taking up a code run did (``said``).

    What is left when the command fails or stops (a full disk, a lost hold, a
    signal) is what the downstream system told and the log may not hold:
    ``warn`` prints it, so that an operator reconciling by hand knows it.
    """

    def __init__(self, command: str, by: str) -> None:
        self._command: Final = command
        self._by: Final = by  # what did not complete, in the warning's words
        self._answers: list[Asked] = []

    def came(self, answers: Sequence[Asked]) -> None:
        self._answers.extend(answers)

    def said(self, done: Recovery) -> None:
        # Not a clear: a code run's answers may come while another's are said.
        self._answers = [a for a in self._answers if a not in done.asked]

    def warn(self) -> None:
        for asked in self._answers:
            _, line = _report.asked_line(asked, completed=False, by=self._by)
            sys.stderr.write(f"attempt-kernel {self._command}: warning: {shown(line)}\n")
        sys.stderr.flush()
        self._answers = []


def _stopped(command: str, error: RunsStopped, resume: str) -> int:
    runs = ", ".join(shown(r.run) for r in error.reports) or "none"
    name = signal.Signals(error.signal).name
    print(
        f"attempt-kernel {command}: stopped by {name}; unfinished run(s) {runs} can be"
        f" resumed with `{resume}`",
        file=sys.stderr,
    )
    return 128 + error.signal


def _demo(args: argparse.Namespace) -> int:
    log_path: str = args.log
    as_json: bool = args.json
    if _is_url(log_path):
        raise _Usage(f"demo writes a run log file, not a PostgreSQL journal: {_redacted(log_path)!r}")
    _names_a_file(log_path, "--log")
    ops = _CrashAfter(args.crash_after) if args.crash_after is not None else None
    blueprint = WORKFLOWS[TRIP_PLANNER](args.seed)
    with RunLogWriter(log_path, ops=ops) as log, _settled(log_path):
        # Counted under the log's lock, so two demos never pick the same id.
        existing = sum(
            1 for item in log.read()
            if isinstance(item, Record) and isinstance(item.change, RunStarted)
        )  # fmt: skip
        run = f"trip-{existing + 1}"
        if not as_json:
            print(
                f"demo: run {run} of workflow {TRIP_PLANNER}, appending to {shown(_redacted(log_path))}",
                flush=True,
            )
        progress = _progress()
        try:
            with _warnings_on_stderr("demo", progress):
                [outcome] = run_jobs(
                    log,
                    [Job(workflow=blueprint.workflow, run=run, supervise=blueprint.supervise)],
                    progress=progress,
                    stop_on_signals=True,
                    grace=GRACE,
                )
        except RunsStopped as error:
            return _stopped("demo", error, _suggested("recover", _redacted(log_path)))
    if as_json:
        checked, code = _replay_json(log_path)
        _print_json({"log": log_path, **_run_json(outcome), "replay": checked})
        return code
    sys.stdout.write(_report.run_text(outcome))
    return _replay_and_print(log_path)


def _folded(log: Journal) -> Ledger:
    ledger = Ledger()
    ledger.feed(log.read())
    return ledger


def _run(args: argparse.Namespace) -> int:
    target: str = args.target
    as_json: bool = args.json
    workflow = load_target(target)
    run_input = None if args.input is None else _json_argument(args.input, "--input")
    log_path: str = args.log if args.log is not None else _default_log(workflow.name)
    _names_a_file(log_path, "--log")
    if args.run_id == "":  # refused before the log is created
        raise _Usage("--run needs a non-empty id")
    stopper, lost = Stopper(), list[str]()
    with _journal(log_path, create=True) as log, contextlib.ExitStack() as holding:
        def queued(run: str) -> bool:
            return _submitted_for(log_path, run) is not None

        run: str = args.run_id if args.run_id is not None else next_run_id(
            _folded(log), workflow.name, queued if _is_url(log_path) else None
        )
        if _is_url(log_path):
            # README, "Many workers on PostgreSQL": no other run or recover drives it meanwhile
            holds = holding.enter_context(_run_holds(log_path))
            if not holds.take(run):
                driver = "a live worker" if run in holds.by_workers else "another process (attempt-kernel run or recover)"
                raise _Usage(
                    f"run {run!r} in {_redacted(log_path)} is being driven by {driver} now; nothing was written"
                    + ("" if args.run_id is not None else ": pick an id with --run")
                )
            holds.watch(_on_lost(lost, stopper))
        ledger = Ledger()
        ledger.feed(log.read())
        known = ledger.run(run)
        queued_for = _submitted_for(log_path, run) if known is None and _is_url(log_path) else None
        if queued_for is not None:
            raise _Usage(
                f"run {run!r} in {_redacted(log_path)} was submitted to its queue, where a worker of"
                f" workflow {queued_for!r} starts it (`attempt-kernel worker URL --workflows"
                " MODULE:ATTR`); nothing was written: "
                + ("pick another --run" if args.run_id is not None else "run again, or pick an id with --run")
            )
        if known is not None:
            submitted = _submitted_for(log_path, run) if _is_url(log_path) and not known.finished else None
            if submitted is not None and known.standing() == "waiting":
                # `recover` leaves such a run to the workers: it would do nothing
                raise _Usage(
                    f"run {run!r} in {_redacted(log_path)} was submitted to its queue and waits (for"
                    f" {_waits_text(known)}): a worker of workflow {submitted!r} takes it up once its signal is sent"
                    " or its wake time passes (`attempt-kernel worker URL --workflows MODULE:ATTR`);"
                    " nothing was written: pick another --run"
                )
            if not known.finished and known.workflow != workflow.name:
                # --workflows TARGET would be refused: the run is another workflow's
                raise _Usage(
                    f"run {run!r} is already in {_redacted(log_path)} and has not finished, and it is a run of"
                    f" workflow {known.workflow!r}, not {workflow.name!r}; resume it with"
                    f" {_recover_hint(log_path, known.workflow)}, or pick another --run"
                )
            if not known.finished:
                raise _Usage(
                    f"run {run!r} is already in {_redacted(log_path)} and has not finished; resume it"
                    f" with `{_suggested('recover', _redacted(log_path), '--workflows', target)}`"
                )
            if known.workflow != workflow.name:
                raise _Usage(
                    f"run {run!r} in {_redacted(log_path)} belongs to workflow {known.workflow!r},"
                    f" not {workflow.name!r}; pick another --run"
                )
            report = recorded_report(log, workflow, run)
            if as_json:
                _print_json({"log": _redacted(log_path), "ran": False, **_run_json(report)})
            else:
                print(
                    f"run {shown(run)} already finished in {shown(_redacted(log_path))}; nothing was"
                    " run again. Its recorded report:",
                    flush=True,
                )
                sys.stdout.write(_report.run_text(report))
            return EXIT_OK if report.status == "succeeded" else EXIT_NOT_SUCCEEDED
        if not as_json:
            print(
                f"starting run {shown(run)} of workflow {shown(workflow.name)},"
                f" appending to {shown(_redacted(log_path))}",
                flush=True,
            )
        progress = _progress()
        try:
            with _warnings_on_stderr("run", progress):
                [report] = run_jobs(
                    log,
                    [Job(workflow=workflow, run=run, input=run_input)],
                    progress=progress,
                    stop_on_signals=True,
                    grace=GRACE,
                    on_wait=None if as_json else _announce_waits(log_path),
                    stopper=stopper,
                )
        except RunsStopped as error:
            resume = _suggested("recover", _redacted(log_path), "--workflows", target)
            return _hold_lost("run", lost, error, resume) if lost else _stopped("run", error, resume)
        except RunLogError as error:
            if not _failed_writing(error):
                raise
            resume = _suggested("recover", _redacted(log_path), "--workflows", target)
            raise _Usage(
                f"{error}; what was written of run {run!r} stays unfinished: `{resume}` goes on"
                " with it once the log can be written again (or says there is nothing to do)"
            ) from error
    if as_json:
        _print_json({"log": _redacted(log_path), "ran": True, **_run_json(report)})
    else:
        sys.stdout.write(_report.run_text(report))
    return EXIT_OK if report.status == "succeeded" else EXIT_NOT_SUCCEEDED


_PG_INBOX_HELP: Final = (
    " On a PostgreSQL URL, it waits likewise in the journal's inbox when a worker,"
    " `run --log URL` or `recover URL` drives the run."
)


def _run_holds(url: str) -> RunHolds:
    from ..postgres._journal import RunHolds

    return RunHolds(url)


def _on_lost(lost: list[str], stopper: Stopper) -> Callable[[str], None]:
    """What `RunHolds.watch` calls once the holds are gone: stop the runs, noting why."""

    def on_lost(why: str) -> None:
        lost.append(why)
        stopper.stop(signal.SIGTERM)

    return on_lost


def _hold_lost(command: str, lost: list[str], error: RunsStopped, resume: str) -> int:
    """The runs stopped because this process lost its holds on them: say so; exit 1."""
    runs = ", ".join(shown(r.run) for r in error.reports) or "none"
    print(
        f"attempt-kernel {command}: error: the database session holding run(s) {runs} ended"
        f" ({shown(lost[0])}), so another process could take them over: they were stopped,"
        f" unfinished; `{resume}` resumes them",
        file=sys.stderr,
    )
    return EXIT_NOT_SUCCEEDED


@final
class _HeldElsewhere(Collection[str]):
    """The runs `recover URL` leaves alone: those live workers hold, and those another
    process (`run URL`, `recover URL`) holds, asked of each run as recovery comes to it,
    so a run started after any earlier look is held before it is touched."""

    def __init__(self, holds: RunHolds, workers: frozenset[str]) -> None:
        self._holds: Final = holds
        self.workers: Final = set(workers)
        self.driven: Final[set[str]] = set()

    def __contains__(self, run: object) -> bool:
        return isinstance(run, str) and self.driven_elsewhere(run)

    def driven_elsewhere(self, run: str) -> bool:
        """Does a live worker or another process drive ``run``? When none does, this
        process holds it from now on."""
        if run in self.workers or run in self.driven:
            return True
        if self._holds.take(run):
            return False
        if run in self._holds.by_workers:  # claimed since the live workers' runs were read
            self.workers.add(run)
        else:
            self.driven.add(run)
        return True

    @property
    def held_here(self) -> Collection[str]:
        """The runs this process holds (those asked of it that no one else drives)."""
        return self._holds.held

    def let_go(self, runs: Collection[str]) -> None:
        """Stop holding ``runs`` (asked of again, a run is held again)."""
        for run in runs:
            self._holds.let_go(run)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.workers | self.driven))

    def __len__(self) -> int:
        return len(self.workers | self.driven)


def _let_go_of_the_rest(url: str, elsewhere: _HeldElsewhere, recovery: Recovery) -> TakenIn:
    """Let go of the runs `recover URL` held as recovery came to them but will not drive
    (finished, closed, left waiting), and record what was sent to them meanwhile.

    Held, a run's changes wait in the inbox for this process, which takes in
    only those of the runs it drives: a signal to a submitted run left
    waiting would wait there unseen, and no worker would wake the run for it.
    Let go, a change is recorded at once (waking the run); what came while
    it was held is recorded here, through the same path."""
    from ..postgres._deliver import TakenIn, take_in_pg

    driven = {run.run for run in recovery.runs}
    rest = [run for run in elsewhere.held_here if run not in driven]
    if not rest:
        return TakenIn(lines=[], recorded=0)
    elsewhere.let_go(rest)
    return take_in_pg(url, skip=frozenset(), only=rest)


def _let_go_of_the_diverged(url: str, elsewhere: _HeldElsewhere, run: str) -> list[str]:
    """Let go of ``run``, whose code diverged as `recover URL` drove it, and record what
    was sent to it while it was held; the lines saying so.

    Once the executor found the divergence, nothing is written for the run
    here (`drive_jobs` takes in nothing more for it either): held until
    this process exits, it would keep off a `recover` with the code it
    started with, and the workers, for as long as the other runs last.

    Raises nothing: the other runs go on. Should the hold's session have
    failed, `RunHolds.watch` stops them; should the inbox not be read, what
    it holds for the run waits there for the run's next holder, as the
    line returned says."""
    import psycopg

    from ..postgres._deliver import take_in_pg
    from ..postgres._journal import PgJournalError

    try:
        elsewhere.let_go([run])
        return take_in_pg(url, skip=frozenset(), only=[run]).lines
    except (PgJournalError, psycopg.Error) as error:
        why = " ".join(str(error).split()) or type(error).__name__
        return [f"{run}: what was sent to it while it was held waits in the journal's inbox: {why}"]


@final
@dataclass(frozen=True)
class _StillWaits:
    """A run `recover URL` let go that only waits, and that no worker takes up."""

    run: str
    waits: str
    """What it waits for: ``signal 'approve'``, ``a sleep``."""
    until: str
    """When it can go on: ``its signal is sent``, ``its wake time passes``."""


def _let_go_of_the_driven(
    url: str, elsewhere: _HeldElsewhere, runs: list[str]
) -> tuple[TakenIn, list[str], list[_StillWaits]]:
    """Let go of ``runs``, which `recover URL` drove until each only waited, as soon as it
    is done driving; record what was sent to them meanwhile, and return that with the
    runs that can go on now, and those that still only wait that `run URL` started
    (no worker takes them up: a later recover goes on with them).

    Driven, a run's changes are taken in by the executor, which takes up again a
    run it let go once a change lets it go on; once the runs are done, nothing
    here takes in what comes for them, so held until this process exits, a
    change would wait in the inbox unseen. Let go, a change is recorded at once.
    A run whose change came between the executor's last look and the let-go can
    go on, and nothing here drives it now: the caller says what goes on with it."""
    from ..postgres._deliver import submitted, take_in_pg

    elsewhere.let_go(runs)
    late = take_in_pg(url, skip=frozenset(), only=runs)
    ledger = Ledger()
    with _pg_journal(url) as journal:
        for run in runs:
            ledger.feed(journal.read_run(run))
    now_us = time.time_ns() // 1000
    views = [view for run in runs if (view := ledger.runs.get(run)) is not None]
    ready = [view.run for view in views if view.can_go_on(now_us)] if late.recorded else []
    workers = submitted(url, runs)
    still: list[_StillWaits] = []
    for view in views:
        if view.run in workers or not view.is_waiting() or view.can_go_on(now_us):
            continue
        waits = view.open_waits()
        ends = [
            *(["its signal is sent"] if any(w.signal is not None for w in waits) else []),
            *(["its wake time passes"] if any(w.wake_us is not None for w in waits) else []),
        ]  # fmt: skip
        still.append(_StillWaits(
            run=view.run,
            waits=_waits_text(view),
            until=" or ".join(ends),
        ))  # fmt: skip
    return late, ready, still


def _recover(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as holding:
        return _recover_holding(args, holding)


def _recover_holding(args: argparse.Namespace, holding: contextlib.ExitStack) -> int:
    log_path: str = args.log
    targets: list[str] = args.workflows
    demo: Blueprint = WORKFLOWS[TRIP_PLANNER](0)
    workflows = [demo.workflow]
    for target in targets:
        workflow = load_target(target)
        if workflow.name in (w.name for w in workflows):
            raise _Usage(f"two workflows are named {workflow.name!r} (the demo's, or given twice)")
        workflows.append(workflow)
    supervisors: dict[str, Supervisor] = {TRIP_PLANNER: demo.supervise}

    extra = [word for t in targets for word in ("--workflows", t)]
    # docs/contracts.md, "Fenced appends": a run a live worker drives is that
    # worker's; recovering it here would end its live attempts as orphans.
    held = held_runs(log_path) if _is_url(log_path) else None
    # A run that `run URL` or another `recover URL` drives holds no lease;
    # that process holds the run instead (`RunHolds`), and so does this one.
    stopper, lost = Stopper(), list[str]()
    elsewhere: _HeldElsewhere | None = None
    letting_go: concurrent.futures.ThreadPoolExecutor | None = None
    if _is_url(log_path):
        holds = holding.enter_context(_run_holds(log_path))
        holds.watch(_on_lost(lost, stopper))
        elsewhere = _HeldElsewhere(holds, held or frozenset())
        # Where a run whose code diverged is let go (`let_go_of_the_diverged`): one
        # at a time (one session holds the runs), and shut down, each let-go done,
        # before the holds close.
        letting_go = holding.enter_context(
            concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="recover-let-go")
        )
    skipped: Collection[str] = frozenset() if elsewhere is None else elsewhere

    as_json: bool = args.json
    taken_up: list[Recovery] = []
    said: set[str] = set()

    def say_left_alone() -> None:
        if as_json or elsewhere is None:
            return
        for run in sorted(elsewhere.workers - said):
            print(f"recover: leaving run {shown(run)} alone: a live worker drives it")
        for run in sorted(elsewhere.driven - said):
            print(f"recover: leaving run {shown(run)} alone: another process (run or recover) drives it")
        said.update(elsewhere.workers, elsewhere.driven)

    def print_recovery(recovery: Recovery) -> None:
        unsaid.said(recovery)  # written: recovery made its records durable
        taken_in.extend(recovery.taken_in)  # a file log's inbox, taken in by recovery
        rest = None if elsewhere is None else _let_go_of_the_rest(log_path, elsewhere, recovery)
        late = [] if rest is None else rest.lines
        taken_in.extend(late)
        if as_json:
            return
        say_left_alone()  # with those found held as recovery came to them
        for line in [*recovery.taken_in, *late]:
            print(f"recover: {shown(line)}")
        if skipped and recovery.changed_nothing and not recovery.left_waiting:
            # "every run has finished" would be false
            started, also = (" that has started", f"; {_report.queued_clause(queued)}") if queued else ("", "")
            text = (
                f"recover: nothing else to do: every run in {shown(_redacted(log_path))}{started} that no"
                f" live process drives has finished{also}; the journal was not changed\n"
            )
        else:
            text = _report.recovery_text(recovery, _redacted(log_path), queued=queued)
        if recorded_first or (rest is not None and rest.recorded):  # written: the lines above say what
            text = text.replace("; the journal was not changed\n", "; recovery changed nothing else\n")
            text = text.replace("; the log was not changed\n", "; recovery changed nothing else\n")
        sys.stdout.write(text)
        sys.stdout.flush()

    def print_taken_up(done: Recovery) -> None:
        unsaid.said(done)  # durable, as `Executor` tells it
        taken_up.append(done)
        if not as_json:
            sys.stdout.write(_report.taken_up_text(done))
            sys.stdout.flush()

    let_goes: list[concurrent.futures.Future[None]] = []

    def let_go_of_the_diverged(run: str) -> None:
        # Nothing was written for the run, nor will be here: let go at once, so that
        # a `recover` with the code it started with, or a worker, may take it up
        # while this one drives the others. Not here, on the event loop's thread:
        # the let-go waits for a sender still in a transaction on the run
        # (`RunHolds.let_go`), and every other run would wait with it.
        if elsewhere is None or letting_go is None:
            return
        let_goes.append(letting_go.submit(let_go_now, elsewhere, run))

    def let_go_now(elsewhere: _HeldElsewhere, run: str) -> None:  # on the let-go thread
        late = _let_go_of_the_diverged(log_path, elsewhere, run)
        taken_in.extend(late)
        if not as_json and late:
            # One write: the loop's thread prints beside this one.
            sys.stdout.write("".join(f"recover: {shown(line)}\n" for line in late))
            sys.stdout.flush()

    say_left_alone()
    taken_in: list[str] = []
    recorded_first = 0  # changes the inbox held that were recorded before recovery
    queued: list[str] = []  # submitted, not started: a worker's to start, unseen by recovery
    if _is_url(log_path):
        from ..postgres._deliver import queued_runs, recoverable, take_in_pg

        # Every run recovery may take up is held before recovery reads the journal:
        # a change sent to one meanwhile then waits in the inbox (taken in below, or
        # by the executor), where written straight into the journal after the read
        # it would be missing from what recovery decides on.
        assert elsewhere is not None
        for run in recoverable(log_path):
            elsewhere.driven_elsewhere(run)
        # What operators sent while a worker that has died drove its run.

        # Held here (asked of `skipped` first): recorded now, not sent back to the inbox.
        first = take_in_pg(log_path, skip=skipped, held_here=elsewhere.held_here)
        taken_in, recorded_first = list(first.lines), first.recorded
        queued = queued_runs(log_path)
        if not as_json:
            for line in taken_in:
                print(f"recover: {shown(line)}")
    unsaid = _Unsaid("recover", "this recover")
    progress = _progress()
    try:
        with _warnings_on_stderr("recover", progress):
            resumed = resume_log(
                _pg(log_path) if _is_url(log_path) else log_path,
                workflows,
                skip_runs=skipped,
                supervisors=supervisors,
                progress=progress,
                stop_on_signals=True,
                grace=GRACE,
                on_recovered=print_recovery,
                on_taken_up=print_taken_up,
                on_wait=None if as_json else _announce_waits(log_path, kept=not _is_url(log_path)),
                stopper=stopper,
                # A run that only waits is a worker's to take up, unless no worker can
                # (`run URL` started it, never submitted): then it is taken up here once
                # it can go on, and let go of if it only waits again (nothing here would
                # take in a signal sent to it meanwhile).
                claimable=_submitted(log_path) if _is_url(log_path) else None,
                let_go_after=UNTIL_IDLE_LET_GO if _is_url(log_path) else None,
                on_diverged=let_go_of_the_diverged if elsewhere is not None else None,
                source=_redacted(log_path),  # a URL as other errors show it, not the journal's repr
                on_asked=unsaid.came,
            )
    except RunsStopped as error:
        resume = _suggested("recover", _redacted(log_path), *extra)
        return _hold_lost("recover", lost, error, resume) if lost else _stopped("recover", error, resume)
    finally:
        unsaid.warn()  # after a stop's line, before an error's
    for let_go in let_goes:  # each run that diverged is let go before the others, and before recover ends
        let_go.result()
    ready: list[str] = []  # runs let go here that can go on, with what came as recover ended
    if elsewhere is not None:
        waiting = [r.run for r in resumed.reports if r.status == "waiting" and r.run in elsewhere.held_here]
        if waiting:
            late, ready, still = _let_go_of_the_driven(log_path, elsewhere, waiting)
            taken_in.extend(late.lines)
            if not as_json:
                for line in late.lines:
                    print(f"recover: {shown(line)}")
                again = _suggested("recover", _redacted(log_path), *extra)
                for run in ready:
                    # A later recover leaves a submitted run to the workers (claimable).
                    submitted = _submitted_for(log_path, run)
                    then = (
                        f"`{shown(again)}` goes on with it" if submitted is None else
                        f"a worker of workflow {submitted!r} takes it up"
                        " (`attempt-kernel worker URL --workflows MODULE:ATTR`)"
                    )  # fmt: skip
                    print(
                        f"recover: run {shown(run)} can go on now, with what came for it as this recover"
                        f" ended; {then}"
                    )
                for left in still:  # `_announce_waits` said it would go on by itself at its wake time
                    print(
                        f"recover: run {shown(left.run)} still waits (for {left.waits}) and no worker takes"
                        " it up (`attempt-kernel run` started it, never submitted):"
                        f" `{shown(again)}` goes on with it once {left.until}"
                    )
    if as_json:
        recovery = resumed.recovery
        tail = recovery.torn_tail
        checked, code = _replay_json(log_path)
        _print_json({
            "log": _redacted(log_path),
            "changed_nothing": recovery.changed_nothing and not taken_up,
            "left_alone": sorted(skipped),
            "queued": queued,
            "taken_in": taken_in,
            "torn_tail": None if tail is None else {
                "line": tail.line, "offset": tail.offset, "length": tail.length,
                "side_file": None if recovery.side_file is None else str(recovery.side_file),
            },
            "asked": [a for done in (recovery, *taken_up) for a in _asked_json(done)],
            "orphans_ended": [o for done in (recovery, *taken_up) for o in _orphans_json(done)],
            "closed": list(recovery.closed),
            "resumed": [{"run": r.run, "workflow": r.workflow} for r in recovery.runs],
            "left_waiting": list(recovery.left_waiting),
            "can_go_on": ready,
            "reports": [_run_json(report) for report in resumed.reports],
            "diverged": [{"run": d.run, "error": str(d)} for d in resumed.diverged],
            "replay": checked,
        })  # fmt: skip
        for diverged in resumed.diverged:
            sys.stderr.write(f"attempt-kernel recover: error: {shown(str(diverged))}\n")
        return EXIT_USAGE if resumed.diverged else code
    for report in resumed.reports:
        sys.stdout.write(_report.run_text(report))
    code = _replay_and_print(log_path)
    for diverged in resumed.diverged:
        sys.stderr.write(f"attempt-kernel recover: error: {diverged}\n")
    return 2 if resumed.diverged else code


def _run_filter(args: argparse.Namespace) -> RunFilter:
    """The filter the `runs` flags say (each checked by argparse already)."""
    given: list[tuple[ListedStatus, ...]] | None = args.status
    return RunFilter(
        statuses=None if given is None else frozenset(s for group in given for s in group),
        workflow=args.workflow,
        since_us=args.since,
        until_us=args.until,
        limit=args.limit,
    )


def _runs(args: argparse.Namespace) -> int:
    log_path: str = args.log
    only = _run_filter(args)
    rows, violations = listed_runs(log_path, only)
    if args.json:
        sys.stdout.write(_report.runs_json(rows, _redacted(log_path), violations))
    else:
        filtered = only != RunFilter()
        sys.stdout.write(_report.runs_text(rows, _redacted(log_path), filtered=filtered))
        if violations:  # rows or none: a file that is no run log at all lists no run
            sys.stdout.write(_report.violations_warning(violations, _suggested("replay", _redacted(log_path))))
    return EXIT_OK


def _checked(items: Iterable[LogItem], ledger: Ledger) -> Iterator[LogItem]:
    """``items``, each fed to ``ledger`` on its way (which then counts their violations)."""
    for item in items:
        ledger.feed((item,))
        yield item


def _show(args: argparse.Namespace) -> int:
    log_path: str = args.log
    run: str = args.run
    # What `show` reads is checked as `runs` checks it: a log that breaks the
    # kernel's rules is said to, beside the run it shows.
    checked = Ledger()
    if _is_url(log_path):
        # Only this run's records (an index range), never the whole journal.
        with _pg_journal(log_path) as journal:
            history = run_history(_checked(journal.read_run(run), checked), run)
            queued = journal.queued(run) if history is None else None
        if queued is not None:
            if args.json:
                sys.stdout.write(_report.queued_json(queued.run, queued.workflow, queued.submitted_us))
            else:
                sys.stdout.write(_report.queued_text(queued.run, queued.workflow, queued.submitted_us))
            return EXIT_OK
    else:
        history = run_history(_checked(FileLog(log_path).read(), checked), run)
    if history is None:
        name = _redacted(log_path)
        raise _Usage(f"no run {run!r} in {name} (`{_suggested('runs', name)}` lists them)")
    held = held_runs(log_path)
    # as `runs` says it (RunRow.of): a finished run reconciled since is nobody's
    live = history.standing == "interrupted" and not history.finished and (held is None or history.run in held)
    violations = checked.violation_count
    if args.json:
        doc: dict[str, object] = json.loads(_report.show_json(history, live))
        doc["violations"] = violations  # as `runs --json` has it
        _print_json(doc)
    else:
        sys.stdout.write(_report.show_text(history, live))
        if violations:  # the line `runs` ends with
            sys.stdout.write(_report.violations_warning(violations, _suggested("replay", _redacted(log_path))))
    return EXIT_OK


def _where(log: str, delivered: Delivered, workflow: str | None) -> str:
    """Where a delivered change is now, for the operator (``workflow``: its run's)."""
    if delivered.needs_recovery:
        return (
            f"waits in {shown(str(inbox_path(log)))}: {shown(log)} ends in a torn tail (a crash"
            f" mid-write) and no process writes it; {_resume_hint(log, workflow)} cuts the tail"
            " and takes it in"
        )
    if delivered.recorded:
        return f"recorded in {shown(_redacted(log))}"
    if delivered.queued:
        when = "before any step starts" if isinstance(delivered.change, RunCancelRequested) else "once the run runs"
        return f"waits in the journal's inbox: the run is queued, and the worker that starts it takes it in {when}"
    if _is_url(log):
        return (
            "waits in the journal's inbox: the process driving the run (a worker, `run` or"
            " `recover`) takes it in within about a second"
        )
    return (
        f"waits in {shown(str(inbox_path(log)))}: the process writing {shown(log)} takes it in"
        " within about a second"
    )


def _resume_hint(log: str, workflow: str | None) -> str:
    if _is_url(log):
        return (
            f"a worker of its workflow ({shown(workflow or '-')}) takes it up (`attempt-kernel"
            f" worker {shown(_redacted(log))} --workflows MODULE:ATTR`), or `attempt-kernel recover"
            f" {shown(_redacted(log))} --workflows MODULE:ATTR`"
        )
    return shown(_recover_hint(log, workflow))


def _recover_hint(log: str, workflow: str | None) -> str:
    """The `recover` that resumes a run of ``workflow``, whose MODULE:ATTR is not known
    here (the demo's needs none), as text to escape where it is printed."""
    if workflow == TRIP_PLANNER:
        return f"`{_suggested('recover', _redacted(log))}`"
    return (
        f"`{_suggested('recover', _redacted(log), '--workflows', 'MODULE:ATTR')}`"
        f" (MODULE:ATTR: your workflow {workflow or '-'})"
    )


def _deliver_cli(log: str, build: Build, run: str | None) -> tuple[Delivered, Ledger]:
    """Deliver through the log's transport; also return the ledger the change was built from."""
    seen: list[Ledger] = []

    def building(ledger: Ledger) -> tuple[str, Delivery]:
        seen.append(ledger)
        return build(ledger)

    delivered = deliver(log, building, run=run)
    return delivered, seen[-1]


def _signal(args: argparse.Namespace) -> int:
    log: str = args.log
    run: str = args.run
    name: str = args.name
    payload: JSON = None
    if args.payload is not None:
        payload = _json_argument(args.payload, "--payload")
        if payload is None:
            raise _Usage("--payload is null, and a signal's payload never is (omit it to send {})")
    delivered, ledger = _deliver_cli(
        log, lambda ledger: (run, signal_change(ledger, run, name, payload, where=_redacted(log))), run
    )
    change = delivered.change
    assert isinstance(change, SignalSent)
    if args.json:
        _print_json({
            "log": _redacted(log), "run": run, "signal": name, "payload": change.payload,
            "recorded": delivered.recorded,
        })  # fmt: skip
        return EXIT_OK
    print(
        f"signal: signal {shown(repr(name))} for run {shown(run)}"
        f" with payload {shown(_report.short(change.payload))}: {_where(log, delivered, ledger.runs[run].workflow)}"
    )
    if delivered.recorded and not _is_url(log):
        workflow = ledger.runs[run].workflow
        print(f"  no process runs {shown(run)} now; {_resume_hint(log, workflow)} goes on with it")
    elif delivered.recorded and _submitted_for(log, run) is None:
        waits = _still_waits(log, run)
        if waits is None:
            print(f"  {_unsubmitted_hint(log, run)} goes on with it")
        else:  # `recover` would leave it waiting, and write nothing
            print(
                f"  run {shown(run)} still waits (for {waits}), and takes this signal when it waits"
                f" for {shown(repr(name))}"
            )
    return EXIT_OK


def _waits_text(view: RunView) -> str:
    """What a waiting run waits for, for people: ``signal 'approve'``, ``a sleep``."""
    return ", ".join("a sleep" if w.signal is None else f"signal {shown(repr(w.signal))}" for w in view.open_waits())


def _still_waits(url: str, run: str) -> str | None:
    """What ``run`` of the journal at ``url`` waits for, if it only waits and cannot go on
    with what its records hold (a signal sent for another name); else None."""
    ledger = Ledger()
    with _pg_journal(url) as journal:
        ledger.feed(journal.read_run(run))
    view = ledger.runs.get(run)
    if view is None or not view.is_waiting() or view.can_go_on(time.time_ns() // 1000):
        return None
    return _waits_text(view)


def _unsubmitted_hint(url: str, run: str) -> str:
    return (
        f"no process drives run {shown(run)} now, and no worker takes it up (`attempt-kernel run`"
        f" started it, never submitted): `attempt-kernel recover {shown(_redacted(url))}"
        " --workflows MODULE:ATTR`"
    )


def _cancel(args: argparse.Namespace) -> int:
    log: str = args.log
    run: str = args.run
    delivered, ledger = _deliver_cli(
        log, lambda ledger: (run, cancel_change(ledger, run, args.reason, where=_redacted(log))), run
    )
    if args.json:
        _print_json({"log": _redacted(log), "run": run, "reason": args.reason, "recorded": delivered.recorded})
        return EXIT_OK
    print(f"cancel: the cancel of run {shown(run)}: {_where(log, delivered, ledger.runs[run].workflow)}")
    if delivered.recorded and not _is_url(log):
        print(f"  no process runs {shown(run)} now; {_resume_hint(log, ledger.runs[run].workflow)} ends it")
    elif delivered.recorded and _submitted_for(log, run) is None:
        print(f"  {_unsubmitted_hint(log, run)} ends it")
    return EXIT_OK


def _resume_cmd(args: argparse.Namespace) -> int:
    log: str = args.log
    run: str = args.run
    targets: list[str] = args.workflows
    workflows = [WORKFLOWS[TRIP_PLANNER](0).workflow, *(load_target(t) for t in targets)]
    unsaid = _Unsaid("resume", "this resume")
    settled: list[Recovery] = []  # what recovery, then taking the run up, did to it

    def print_settled(done: Recovery) -> None:
        # Before the run goes on: the reconcilers' answers (an "unknown" is why
        # an attempt ends Indeterminate, and no record keeps its reason) and the
        # orphaned attempts ended, with the keys left to reconcile.
        unsaid.said(done)
        settled.append(done)
        if not args.json:
            sys.stdout.write(_report.settled_text(done, "resume"))
            sys.stdout.flush()

    try:
        # A signal stops the run gracefully, as `recover` and `worker` do: a
        # KeyboardInterrupt would cancel it, and a cancel is final.
        # A run that waits waits here, as under `run`: say for what, and how to end it
        # (on_wait says it for a wait it was left in too, once its code is checked).
        with _warnings_on_stderr("resume", None):
            done = resume_run(
                log, run, workflows, stop_on_signals=True, grace=GRACE,
                on_wait=None if args.json else _announce_waits(log),
                on_recovered=print_settled, on_taken_up=print_settled, on_asked=unsaid.came,
            )  # fmt: skip
    except RunsStopped as error:
        again = _suggested("resume", _redacted(log), run, *(word for t in targets for word in ("--workflows", t)))
        return _stopped("resume", error, again)
    finally:
        unsaid.warn()  # after a stop's line, before an error's
    if args.json:
        _print_json({
            "log": _redacted(log), "run": run, "resumed": done,
            "asked": [a for one in settled for a in _asked_json(one)],
            "orphans_ended": [o for one in settled for o in _orphans_json(one)],
        })  # fmt: skip
    else:
        print(f"resume: {shown(done)}")
    return EXIT_OK


def _reconcile(args: argparse.Namespace) -> int:
    log_path: str = args.log
    key: str = args.key
    confirmed: bool = args.confirmed
    if args.result is not None and not confirmed:
        raise _Usage("--result goes with --confirmed (a rejected effect has no result)")
    result = None if args.result is None else _json_argument(args.result, "--result")
    delivered, ledger = _deliver_cli(
        log_path,
        lambda ledger: reconcile_change(
            ledger, key, confirmed=confirmed, result=result, note=args.note, where=_redacted(log_path)
        ),
        None,
    )
    change = delivered.change
    assert isinstance(change, IntentReconciled)
    view = ledger.runs[delivered.run]
    verdict = "Confirmed (it happened)" if confirmed else "Rejected (it did not happen)"
    where = f"intent {shown(change.name)} of run {shown(view.run)} / step {shown(change.step)}"
    where += f" #{change.attempt} ({shown(key)})"
    left = [k for k in view.outstanding() if k != key]
    if args.json:
        _print_json({
            "log": _redacted(log_path), "run": view.run, "step": change.step, "attempt": change.attempt,
            "intent": change.name, "key": key, "verdict": "confirmed" if confirmed else "rejected",
            "result": result, "recorded": delivered.recorded, "still_outstanding": left,
        })  # fmt: skip
        return EXIT_OK
    if not delivered.recorded:
        print(f"reconcile: {where} will be {verdict}: {_where(log_path, delivered, view.workflow)}")
        return EXIT_OK
    print(f"reconcile: {where} is now {verdict}")
    if left:
        print(f"  still outstanding in run {shown(view.run)}: {', '.join(shown(k) for k in left)}")
    elif view.cancel_requested:  # a cancel is for good: nothing resumes the run
        print(f"  nothing of run {shown(view.run)} is outstanding now; it was cancelled, and stays so")
    else:
        # as signal and cancel say it: no worker takes up a run `run --log URL` started
        unsubmitted = _is_url(log_path) and _submitted_for(log_path, view.run) is None
        then = _unsubmitted_hint(log_path, view.run) if unsubmitted else _resume_hint(log_path, view.workflow)
        print(f"  nothing of run {shown(view.run)} is outstanding now; {then} resumes it")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    log: str = args.log
    only: str | None = args.run
    seq = 0
    # The journal's next number, from 1 as replay expects it: renumbering hides no gap
    # or repeat, nor a head of the log cut off (a first record numbered 5).
    expect = 1
    out = sys.stdout.buffer
    with _reading(log) as source:
        for item in source.read():
            match item:
                case Record():
                    if item.seq != expect:
                        kind = "a gap: records are missing" if item.seq > expect else "a repeat"
                        raise _Usage(
                            f"{_redacted(log)}: line {item.line}: sequence number {item.seq} where"
                            f" {expect} was expected ({kind}); nothing more exported (renumbered, the"
                            f" export would hide it; `{_suggested('replay', _redacted(log))}` lists what is wrong)"
                        )
                    expect = item.seq + 1
                    if only is not None and item.run != only:
                        continue
                    seq += 1
                    try:
                        out.write(encode_record(seq, item.time_us, item.run, item.change))
                    except UnencodableRecord as error:
                        # A line another tool wrote, nested deeper than the writer takes, which
                        # this reader could parse: named by its line in the log, as a gap is, since
                        # the number in the message is the export's (with --run, another record's line).
                        raise _Usage(
                            f"{_redacted(log)}: line {item.line}: {error} (numbered {seq} in the export);"
                            " nothing more exported"
                        ) from None
                case CorruptLine():
                    # named as replay and the gap above name it: its line in the log as read
                    raise _Usage(f"{_redacted(log)}: line {item.line}: {item.reason}; nothing more exported")
                case TornTail():
                    pass  # never acknowledged: not part of the journal
                case _:
                    assert_never(item)
    out.flush()
    if only is not None and seq == 0:
        raise _Usage(f"no run {only!r} in {_redacted(log)}")
    return EXIT_OK


def _needs_url(url: str, command: str) -> None:
    if not _is_url(url):
        raise _Usage(f"{command} works on a PostgreSQL journal: give a postgresql:// URL, not {url!r}")
    _needs_psycopg(url)


def _needs_psycopg(url: str) -> None:
    """The message `runs URL` gives without the postgres extra, for every command that takes a URL."""
    try:
        importlib.import_module("psycopg")  # the postgres extra
    except ImportError as error:
        raise _Usage(
            f"{_redacted(url)}: a PostgreSQL journal needs psycopg ({error}); install attempt-kernel[postgres]"
        ) from None


def _submit(args: argparse.Namespace) -> int:
    url: str = args.url
    _needs_url(url, "submit")
    if args.run_id == "":  # as `run` refuses it, before anything is queued
        raise _Usage("--run needs a non-empty id")
    workflow = load_target(args.target)
    run_input = None if args.input is None else _json_argument(args.input, "--input")
    from ..postgres._worker import submit_run

    run = submit_run(url, workflow.name, args.run_id, run_input)
    if args.json:
        _print_json({"log": _redacted(url), "run": run, "workflow": workflow.name})
    else:
        print(shown(run))  # escaped, as runs and show print it
    return EXIT_OK


IDLE_POLL: Final = 0.5
"""Seconds between two looks at an idle file worker's log and inbox."""


def _marks(log: str) -> tuple[int, int, int]:
    """What changes when someone writes to the log or its inbox: sizes and mtime."""
    try:
        stat = os.stat(log)
    except OSError:
        return (-1, -1, inbox_size(log))
    return (stat.st_size, stat.st_mtime_ns, inbox_size(log))


UNTIL_IDLE_LET_GO: Final = 1.0
"""Seconds a run of `worker LOG --until-idle` may only wait, with no wake time
sooner, before the worker lets go of it (as a PostgreSQL worker releases one)."""


def _left(log: str, names: set[str], skip: set[str]) -> list[tuple[str, bool]]:
    """Runs of these workflows left unfinished (or reconciled), each with whether a
    worker could go on with it now: not when it only waits for a signal none of
    which has come, or for a wake time still to come (and no cancel came)."""
    ledger = Ledger()
    ledger.feed(FileLog(log).read())
    now = int(time.time() * 1_000_000)
    return [
        (view.run, not view.is_waiting() or view.can_go_on(now))
        for view in ledger.runs.values()
        if view.workflow in names and view.run not in skip
        and view.standing() in ("interrupted", "waiting")
    ]  # fmt: skip


def _worker_file(
    args: argparse.Namespace, workflows: list[Workflow], exposition: _metrics.WorkerExposition | None
) -> int:
    """`worker LOG`: serve every unfinished run of a log file, in this process (its
    counters, when --metrics-port serves them, count what recovery and the runs write)."""
    log: str = args.url
    targets: list[str] = args.workflows
    names = {w.name for w in workflows}
    if len(names) < len(workflows):
        raise _Usage("two of the --workflows have the same name")
    again = _suggested("worker", log, *(word for t in targets for word in ("--workflows", t)))

    def print_recovery(recovery: Recovery) -> None:
        unsaid.said(recovery)
        for line in recovery.taken_in:
            print(f"worker: {shown(line)}")
        if not recovery.changed_nothing:
            sys.stdout.write(_report.recovery_text(recovery, log))
            sys.stdout.flush()

    def print_taken_up(done: Recovery) -> None:
        unsaid.said(done)
        sys.stdout.write(_report.taken_up_text(done))
        sys.stdout.flush()

    unsaid = _Unsaid("worker", "the worker's recovery")
    print(f"worker: serving the runs of {shown(log)} ({', '.join(shown(n) for n in sorted(names))})", flush=True)
    diverged: set[str] = set()
    first = True
    while True:
        before = _marks(log)
        progress = _progress()
        try:
            with _warnings_on_stderr("worker", progress):
                resumed = resume_log(
                    log,
                    workflows,
                    admission_limit=args.concurrency,
                    progress=progress,
                    stop_on_signals=True,
                    grace=GRACE,
                    on_recovered=print_recovery,
                    on_taken_up=print_taken_up,
                    on_wait=_announce_waits(log, kept=not args.until_idle),
                    skip_runs=frozenset(diverged),
                    # With --until-idle a run that only waits is let go, or the worker
                    # would wait with it for a signal that may never come.
                    let_go_after=UNTIL_IDLE_LET_GO if args.until_idle else None,
                    observers=() if exposition is None else (exposition.observer,),
                    on_asked=unsaid.came,
                )
        except RunsStopped as error:
            return _stopped("worker", error, again)
        except LogLocked:
            if first:  # refused as `run` and `recover` are refused while a process writes the log
                raise
            # An idle worker holds no lock, so a `run`, `recover` or `resume` may have
            # taken the log meanwhile: its turn first, then whatever it leaves.
            stopped = _idle_until(
                f"worker: another process is writing {shown(log)} (a `run`, `recover` or"
                " `resume`); waiting until it lets go",
                # asked without a lock: a probe's shared lock, taken just as the other
                # process lets go, would refuse a `run` starting in that instant
                lambda: not writer_listed(log),
            )
            if stopped is not None:
                return stopped
            continue
        finally:
            unsaid.warn()  # after a stop's line, before an error's
        first = False
        for report in resumed.reports:
            sys.stdout.write(_report.run_text(report))
        for wrong in resumed.diverged:
            diverged.add(wrong.run)
            print(f"attempt-kernel worker: error: {shown(str(wrong))}", file=sys.stderr)
        sys.stdout.flush()
        seen = _marks(log)
        left = _left(log, names, diverged)
        if args.until_idle:
            if any(now for _, now in left) and seen != before:
                continue  # something came in while it ran (a reconciliation taken in, a signal)
            unfinished = [shown(r) for r, _ in left] + [
                f"{shown(r)} (its code diverged from its log)" for r in sorted(diverged)
            ]
            if unfinished:
                print(f"worker: idle; left unfinished: {', '.join(unfinished)}")
            else:
                print("worker: idle; no unfinished run of these workflows is left")
            # as `recover` exits: a run whose code diverged is an error the operator must see
            return EXIT_USAGE if diverged else EXIT_OK
        stopped = _idle_until(
            f"worker: idle; watching {shown(log)} and its inbox for changes", lambda: _marks(log) != seen
        )
        if stopped is not None:
            return stopped


def _idle_until(saying: str, done: Callable[[], bool]) -> int | None:
    """Print ``saying``, then poll ``done`` every `IDLE_POLL` seconds, no run live, until it
    holds (None) or SIGINT or SIGTERM comes: then say so and return the exit code (130, 143).

    The signals are caught before the line is printed: one sent on seeing it stops the
    worker as an idle one."""
    caught: list[int] = []

    def on_signal(number: int, frame: object) -> None:
        caught.append(number)

    handlers = {n: signal.signal(n, on_signal) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(saying, flush=True)
        while not caught and not done():
            time.sleep(IDLE_POLL)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if not caught:
        return None
    print(f"worker: stopped by {signal.Signals(caught[0]).name} while idle; no run was live", flush=True)
    return 128 + caught[0]


def _metrics_served(args: argparse.Namespace) -> _metrics.WorkerExposition | None:
    """Start serving ``/metrics`` when --metrics-port asks, before the worker claims anything."""
    port: int | None = args.metrics_port
    if port is None:
        return None
    host: str = args.metrics_host
    try:
        from .. import _metrics
    except ImportError as error:
        raise _Usage(
            f"--metrics-port needs prometheus_client ({error}); install attempt-kernel[metrics]"
        ) from None
    exposition = _metrics.WorkerExposition(args.url)
    try:
        bound_host, bound_port = exposition.serve(port, host)
    except OSError as error:
        raise _Usage(
            f"--metrics-port {port}: cannot listen on {host}:{port}"
            f" ({error.strerror or error}); choose another port (0: any free one)"
        ) from None
    authority = f"[{bound_host}]" if ":" in bound_host else bound_host  # an IPv6 address
    print(f"metrics: serving http://{authority}:{bound_port}/metrics", flush=True)
    return exposition


_LOG_LEVELS: Final = ("debug", "info", "warning", "error")


@final
class LogLines(logging.Formatter):
    """``2026-12-01T14:07:55.746Z INFO    r-1: claimed at fence 1``: UTC time, level, the
    message escaped (names read from a log are data)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{utc(int(record.created * 1_000_000))} {record.levelname:<7} {shown(record.getMessage())}"
        if record.exc_info:
            line += "\n" + shown(self.formatException(record.exc_info))
        return line


@contextlib.contextmanager
def _logging_to_stdout(level: str) -> Generator[None, None, None]:
    """The library's log lines (``attempt_kernel`` and below) on stdout while the command runs."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(LogLines())
    logger = logging.getLogger("attempt_kernel")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def _journal_metrics(log: str) -> Callable[[], tuple[bytes, str]] | None:
    """The journal's gauges for `serve`'s ``/metrics``; None without the metrics extra (a 404 there)."""
    try:
        from .. import _metrics
    except ImportError:
        return None
    return _metrics.metrics_app(log)


def _worker(args: argparse.Namespace) -> int:
    url: str = args.url
    if _is_url(url):
        _needs_psycopg(url)
        # Whole, before the metrics server's thread may import a part of it
        # during a scrape (two threads importing one package can each see
        # the other's half-initialized module).
        importlib.import_module("attempt_kernel.postgres")
        from ..postgres._lease import check_timing

        try:  # the worker's own rule, refused here as a wrong argument, before a connection
            check_timing(args.heartbeat, args.dead_after)
        except ValueError:
            raise _Usage(
                f"--dead-after ({args.dead_after:g} s) must be at least three --heartbeat periods"
                f" ({3 * args.heartbeat:g} s): raise --dead-after or shorten --heartbeat"
            ) from None
    else:
        os.close(open_regular(Path(url), os.O_RDONLY, "for reading"))  # a missing file or a FIFO
    # Refused (a log, a workflow) before --metrics-port serves or says a word.
    workflows = [load_target(t) for t in args.workflows]
    exposition = _metrics_served(args)
    if not _is_url(url):
        return _worker_file(args, workflows, exposition)
    from ..postgres._journal import PgConnectFailed
    from ..postgres._worker import WorkerDeclaredDead, run_worker

    try:
        # Its lines (claims, takeovers, each state change) are log lines.
        with _logging_to_stdout(args.log_level):
            closed = run_worker(
                url,
                workflows,
                concurrency=args.concurrency,
                heartbeat=args.heartbeat,
                dead_after=args.dead_after,
                stop_when_idle=args.until_idle,
                stop_on_signals=True,
                observers=() if exposition is None else (exposition.observer,),
                watcher=None if exposition is None else exposition.watcher,
                reconnect_for=args.reconnect_for,
            )
    except WorkerDeclaredDead as error:
        print(f"attempt-kernel worker: {shown(str(error))}", file=sys.stderr)
        return EXIT_NOT_SUCCEEDED
    except PgConnectFailed as error:
        # It gave up reconnecting (its message ends saying for how long): the flag that says so.
        raise PgConnectFailed(f"{error} (--reconnect-for {args.reconnect_for:g})") from error
    print(f"worker stopped; runs closed: {closed}", flush=True)
    return EXIT_OK


def _pool(args: argparse.Namespace) -> int:
    url: str = args.url
    _needs_url(url, "pool")
    from ..postgres._pools import set_pool

    try:
        state = set_pool(url, args.name, args.slots)
    except ValueError as error:
        raise _Usage(str(error)) from None
    if args.json:
        _print_json({"log": _redacted(url), "pool": state.name, "slots": state.slots, "held": state.held})
        return EXIT_OK
    print(f"pool {shown(state.name)}: {state.slots} slots, {state.held} held")
    return EXIT_OK


def _migrate(args: argparse.Namespace) -> int:
    url: str = args.url
    schema: str = args.schema
    _needs_url(url, "migrate")
    from ..postgres._journal import migrate_versions

    try:
        before, after = migrate_versions(url, schema=schema)
    except ValueError as error:  # a schema name that is not an identifier
        raise _Usage(f"--schema: {error}") from None
    if args.json:
        print(json.dumps({"schema": schema, "version_before": before, "version_after": after}))
    elif before == after:
        print(f"schema {shown(schema)}: at version {after}, up to date (nothing changed)")
    else:
        print(f"schema {shown(schema)}: migrated from version {before} to version {after}")
    return EXIT_OK


def _pools(args: argparse.Namespace) -> int:
    url: str = args.url
    _needs_url(url, "pools")
    from ..postgres._pools import list_pools

    states = list_pools(url)
    if args.json:
        pools = [{"pool": state.name, "slots": state.slots, "held": state.held} for state in states]
        _print_json({"log": _redacted(url), "pools": pools})
        return EXIT_OK
    if not states:
        print(f"no pools in {_redacted(url)} (`attempt-kernel pool URL NAME --slots N` makes one)")
    for state in states:
        print(f"pool {shown(state.name)}: {state.slots} slots, {state.held} held")
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    log: str = args.log
    host: str = args.host
    port: int = args.port
    try:
        from .._web import WebView, is_loopback, open_server, serve_until_stopped
    except ImportError as error:
        raise _Usage(f"serve needs Jinja2 ({error}); install attempt-kernel[web]") from None
    if _is_url(log) and args.workflows:
        raise _Usage(
            "--workflows is for a log file: on a PostgreSQL journal, Resume hands a run to the"
            " journal's workers, which load its workflow; serve the URL without it"
        )
    workflows = [load_target(t) for t in args.workflows]
    if not _is_url(log):
        if not os.path.exists(log):
            raise _Usage(f"no run log file {log!r} (serve reads a log that exists)")
        os.close(open_regular(Path(log), os.O_RDONLY, "for reading"))  # a FIFO, a folder: refused
    if _is_url(log):
        journal = _pg_journal(log)
        source: LogSource = journal
        # On the reading connection, which a lost session does not close for good.
        one_run: Callable[[str], Iterable[LogItem]] | None = journal.read_run_snapshot
    else:
        source, one_run = _source(log), None
    view = WebView(
        log, source, shown_as=_redacted(log), workflows=workflows, one_run=one_run,
        metrics=_journal_metrics(log),
    )  # fmt: skip
    try:
        server = open_server(view, host, port)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise _Usage(f"port {port} on {host} is in use; pick another with --port") from None
        raise _Usage(f"cannot listen on {host} port {port}: {error.strerror or error}") from None
    if not is_loopback(host):
        print(
            f"attempt-kernel serve: warning: listening on {shown(host)}, not loopback: anyone who"
            " can reach this address can see the runs and signal, cancel, reconcile and resume"
            " them",
            file=sys.stderr,
            flush=True,
        )

    def announce(url: str) -> None:
        print(f"serve: {url} shows {shown(_redacted(log))}; Ctrl-C stops it", flush=True)

    try:
        number = serve_until_stopped(server, announce)
        # Resumes in flight stop as `resume` stops on a signal: recorded, unfinished.
        stopped = view.stop_resumes(number or signal.SIGTERM)
    finally:
        close = getattr(source, "close", None)  # a PostgreSQL journal's connections
        if callable(close):
            close()
    if stopped and number:
        runs = ", ".join(shown(run) for run in stopped)
        where = _redacted(log)
        loaded = [word for target in args.workflows for word in ("--workflows", target)]
        hints: list[str] = []
        for run in stopped:
            command = _command("resume", where, run, *loaded)
            hints.append(
                f"`{shown(command)}`" if command is not None
                else f"attempt_kernel.resume_run({where!r}, {run!r}, WORKFLOWS) in Python ({_UNTYPABLE})"
            )  # fmt: skip
        print(
            f"attempt-kernel serve: stopped by {signal.Signals(number).name}; the resume of run(s)"
            f" {runs} was stopped, each run unfinished; {', '.join(hints)}"
            f" {'resumes it' if len(hints) == 1 else 'resume them'}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + number
    print("serve: stopped", flush=True)
    return EXIT_OK


class _Terminated(BaseException):
    """SIGTERM, raised where it lands as SIGINT's `KeyboardInterrupt` is, outside a run's
    own handling of both (`_terminating`). A `BaseException`, as `KeyboardInterrupt` is,
    so that no ``except Exception`` on the way takes it for an error and goes on."""


def _raise_terminated(number: int, frame: FrameType | None) -> None:
    raise _Terminated


def _interrupting(stop: KeyboardInterrupt | _Terminated) -> signal.Signals:
    return signal.SIGTERM if isinstance(stop, _Terminated) else signal.SIGINT


@contextlib.contextmanager
def _terminating() -> Generator[None, None, None]:
    """SIGTERM ends a command as Ctrl-C does, with one line and exit 143, wherever no run
    is taking it gracefully: the default action would kill the process without a
    word (a `worker` recovering a log, say, with 143 promised). Left alone where
    SIGTERM is not the default (ignored, or a caller's own handler) or off the main
    thread, where Python takes no signal; the handler that was there is back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``); return the exit code.

    What argparse handles itself raises `SystemExit` with the code instead, as
    argparse does: a wrong or missing argument (2, after the usage line),
    ``--help`` and ``--version`` (0).
    """
    for stream in (sys.stdout, sys.stderr):
        # A name that the terminal's encoding cannot show is escaped, never a crash.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        with _terminating():
            return _main(argv)
    except (KeyboardInterrupt, _Terminated) as stop:
        # SIGINT or SIGTERM before a command began (while its arguments were
        # read): one line, no traceback. A command's own are caught in `_main`.
        number = _interrupting(stop)
        print(f"attempt-kernel: interrupted by {number.name}", file=sys.stderr)
        return 128 + number
    except BrokenPipeError:
        # The reader went away (`demo | head -1`): stop quietly. Python would
        # complain again when it flushes stdout at exit, so point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _table_cmd(args: argparse.Namespace) -> int:
    render = {"markdown": _table.markdown, "mermaid": _table.mermaid, "dot": _table.dot}
    sys.stdout.write(render[args.format]())
    return EXIT_OK


def _replay_cmd(args: argparse.Namespace) -> int:
    log: str = args.log
    with _reading(log) as source:
        report = replay(source)  # a RunLogError is a usage or I/O error: exit 2
    if args.json:
        sys.stdout.write(_report.as_json(report, _redacted(log)))
    elif args.metrics:
        sys.stdout.write(_report.as_metrics(report, _redacted(log)))
        # Violations are a metric here: a scraper's file is updated with them.
        return EXIT_OK
    else:
        sys.stdout.write(_report.as_text(report, _redacted(log)))
    return EXIT_OK if report.valid else EXIT_VIOLATIONS


_HANDLERS: Final[dict[str, Callable[[argparse.Namespace], int]]] = {
    "table": _table_cmd,
    "replay": _replay_cmd,
    "demo": _demo,
    "run": _run,
    "recover": _recover,
    "runs": _runs,
    "show": _show,
    "reconcile": _reconcile,
    "signal": _signal,
    "cancel": _cancel,
    "resume": _resume_cmd,
    "export": _export,
    "submit": _submit,
    "worker": _worker,
    "migrate": _migrate,
    "pool": _pool,
    "pools": _pools,
    "serve": _serve,
}


def _main(argv: Sequence[str] | None) -> int:
    args, extra = _parser().parse_known_args(argv)
    command: str = args.command
    if extra:
        # `attempt-kernel CMD: error: unrecognized arguments: ...`, not the top parser's
        # `attempt-kernel: error:`, which would not say which command refused them.
        command_parser: argparse.ArgumentParser = args.command_parser
        command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    handler = _HANDLERS.get(command)
    if handler is None:  # argparse forbids it
        raise AssertionError(f"unhandled command {command!r}")
    try:
        if (command not in ("run", "demo") and getattr(args, "log", None) == "") or getattr(args, "url", None) == "":
            # Path("") is ".": the message would name a folder the user did not type
            raise _Usage("the log path is empty: give a run log's file name (or a postgresql:// URL)")
        for journal in (getattr(args, "log", None), getattr(args, "url", None)):
            if isinstance(journal, str) and _is_url(journal) and command != "demo":
                _needs_psycopg(journal)  # one message for every command given a URL without the extra
                _utf8_arguments(args)
        return handler(args)
    except (KeyboardInterrupt, _Terminated) as stop:
        # SIGINT or SIGTERM outside a run's own handling (which stops runs
        # gracefully): at start-up, say while a workflow module imports or a log
        # is read, or while `worker` recovers a log or goes from one round of
        # runs to the next. Nothing was half-written: the writer closes
        # (flushing) on the way out, and recovery starts over from what is there.
        number = _interrupting(stop)
        print(f"attempt-kernel {command}: interrupted by {number.name}", file=sys.stderr)
        return 128 + number
    except AttemptKernelError as error:
        # One shape for every error found after parsing, as argparse's own last line:
        # `attempt-kernel CMD: error: MESSAGE` on stderr.
        return _error_exit(command, error)


def _texts(value: object) -> list[str]:
    """An argument's text: itself if it is one, the texts of a list (a repeated flag)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        items: list[object] = [*cast("list[object]", value)]
        return [item for item in items if isinstance(item, str)]
    return []


def _utf8_arguments(args: argparse.Namespace) -> None:
    """A PostgreSQL journal keeps run ids, workflow and pool names as text, which holds
    only UTF-8: an argument with a byte the command line could not decode (``\\udcff``)
    is refused at the door."""
    for field, value in sorted(vars(args).items()):
        for text in _texts(value):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                what = "run id" if field in ("run", "run_id") else "the argument"
                raise _Usage(
                    f"{what} {text!r} is not valid UTF-8 (character {error.start} stands for a byte"
                    f" the command line could not decode): a PostgreSQL journal holds only UTF-8"
                    f" {'run ids' if what == 'run id' else 'text'}"
                ) from None


def _error_exit(command: str, error: AttemptKernelError) -> int:
    """Where an error becomes an exit: its message on stderr, and 3 for an
    unreachable database (`PgConnectFailed`, a worker that gave up), else 2."""
    print(f"attempt-kernel {command}: error: {shown(str(error))}", file=sys.stderr)
    journal = sys.modules.get(_PG_JOURNAL)  # loaded if a URL was opened (psycopg is optional)
    if journal is not None and isinstance(error, journal.PgConnectFailed):
        return EXIT_DB_UNAVAILABLE
    return EXIT_USAGE


_PG_JOURNAL: Final = __name__.rsplit(".", 2)[0] + ".postgres._journal"
