"""Renderings of reports: for people, for machines (JSON), for scrapers, for logs.

Pure functions from a report to text; the CLI prints what they return, and
a worker and an executor log the lines made for logs (with their level).
Reports carry typed states; only these functions turn them into words.
Names read from a log (runs, steps, intents, errors) are data, never
markup: `shown` escapes every character that is not printable (control
characters, line breaks, lone surrogates), so a name cannot forge a line of
the report or reach a terminal raw.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Final

from typing_extensions import assert_never

from ._attempt import TransitionCause, is_terminal
from ._codec import cause_name, intent_cause_name, intent_state_name, state_name
from ._outcome import RunReport
from ._findings import EffectFinding, EffectHappened, EffectNotHappened, EffectUnknown
from ._history import AttemptHistory, IntentEvent, IntentHistory, RunHistory, WaitHistory
from ._ledger import OpenAttempt, signals_taken
from ._observe import shown as shown  # its home is the lower layer, where log lines are made
from ._records import JSON
from ._recovery import Asked, Recovery
from ._replay import ReplayReport
from ._store import is_url
from ._runlist import RunRow as RunRow
from ._runlist import WaitOn as WaitOn

SHOWN_VIOLATIONS: Final = 50
"""The text report lists this many violations and counts the rest."""


SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})
"""The connection parameters a URL's query may carry that hold a secret (libpq reads any
parameter there): the password, and the passphrase of the client's key."""


def redacted(url: str) -> str:
    """A URL without its password (after the user's name, or a ``password`` or
    ``sslpassword`` parameter in its query), for messages and labels; a path as it is."""
    head, at, tail = url.rpartition("@")
    if at and "://" in head:
        scheme, _, credentials = head.partition("://")
        user = credentials.split(":", 1)[0]
        url = f"{scheme}://{user}@{tail}"
    base, question, query = url.partition("?")
    if not question or "://" not in base:
        return url
    kept = [
        part for part in query.split("&")
        if urllib.parse.unquote(part.partition("=")[0]).strip() not in SECRET_PARAMETERS
    ]  # fmt: skip
    return base + ("?" + "&".join(kept) if kept else "")


def _attempt_line(entry: OpenAttempt) -> str:
    keys = ", ".join(shown(k) for k in entry.outstanding) if entry.outstanding else "none left (reconciled)"
    return (
        f"  run {shown(entry.run)} / step {shown(entry.step)} / attempt {entry.attempt}"
        f" ({state_name(entry.state)} at line {entry.line}): outstanding intent keys: {keys}"
    )


def as_text(report: ReplayReport, source: str) -> str:
    """The report for people."""
    out = [f"run log: {shown(source)}", f"records: {report.records}"]
    counts = ", ".join(f"{state_name(s)} {n}" for s, n in report.final_states.items())
    out.append(f"attempts by final state: {counts}")
    out.append(f"unresolved intents (Dispatched, no outcome): {report.unresolved_intents}")
    out.append(f"Indeterminate attempts: {len(report.indeterminate)}")
    out += [_attempt_line(e) for e in report.indeterminate]
    out.append(f"Failed/TimedOut attempts with outstanding intents: {len(report.to_reconcile)}")
    out += [_attempt_line(e) for e in report.to_reconcile]
    if report.torn_tail is not None:
        tail = report.torn_tail
        out.append(
            f"torn tail: line {tail.line} ({tail.length} bytes from byte {tail.offset}) is an"
            " unterminated write cut short by a crash; every record before it was checked"
        )
    if report.records == 0:
        out.append("the log holds no complete record: nothing was recorded")
    if report.unfinished:
        # On PostgreSQL, `recover URL` leaves a run that only waits: to the workers if
        # it was submitted, else to a later recover (the journal alone does not say which).
        who = (
            "`attempt-kernel recover` resumes those cut short; of those that wait, a worker takes up"
            " a submitted one, and a later `recover` one that `run` started"
            if is_url(source)
            else "`attempt-kernel recover` resumes them"
        )
        out.append(f"unfinished runs: {len(report.unfinished)} ({who})")
        out += [f"  run {shown(run)}" for run in report.unfinished]
    else:
        out.append("unfinished runs: 0")
    out.append(f"violations: {report.violation_count}")
    for v in report.violations[:SHOWN_VIOLATIONS]:
        out.append(f"  line {v.line}: {shown(v.reason)}")
    hidden = report.violation_count - min(len(report.violations), SHOWN_VIOLATIONS)
    if hidden > 0:
        out.append(f"  ... and {hidden} more (use --json for the kept ones)")
    out.append("verdict: " + ("valid" if report.valid else "INVALID"))
    return "\n".join(out) + "\n"


def _attempt_json(entry: OpenAttempt) -> dict[str, object]:
    return {
        "run": entry.run,
        "step": entry.step,
        "attempt": entry.attempt,
        "state": state_name(entry.state),
        "line": entry.line,
        "outstanding_keys": list(entry.outstanding),
    }


def as_json(report: ReplayReport, source: str) -> str:
    """The report for machines: one JSON object (ASCII; names escaped by JSON)."""
    tail = report.torn_tail
    doc = {
        "log": source,
        "valid": report.valid,
        "records": report.records,
        "final_states": {state_name(s): n for s, n in report.final_states.items()},
        "unresolved_intents": report.unresolved_intents,
        "indeterminate": [_attempt_json(e) for e in report.indeterminate],
        "to_reconcile": [_attempt_json(e) for e in report.to_reconcile],
        "torn_tail": None
        if tail is None
        else {"line": tail.line, "offset": tail.offset, "length": tail.length},
        "unfinished_runs": list(report.unfinished),
        "violation_count": report.violation_count,
        "violations": [{"line": v.line, "reason": v.reason} for v in report.violations],
    }
    return json.dumps(doc, indent=2) + "\n"


def _label(value: str) -> str:
    """A label value as the text exposition writes it: backslash, quote and newline escaped
    (the only escapes the format has: other control characters are `shown` first)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def as_metrics(report: ReplayReport, journal: str) -> str:
    """The log in the Prometheus text format, for a scraper reading a file (node_exporter's
    textfile collector, which reads that format: a counter's TYPE names its ``_total``
    samples). The last line, ``# EOF``, a comment there, shows the file is whole.

    The two gauges a live worker serves under the same names
    (``attempt_kernel_indeterminate_attempts``, ``attempt_kernel_outstanding_intents``)
    mean the same here, so the shipped alerting rules apply to a log file
    too. Counts that only grow as the log grows are counters. Every sample
    carries ``journal``: the log it was read from, as `shown` writes it
    (as the live worker's ``journal`` label does).
    """
    # The name as the rest of the output shows it (an ESC as the text \x1b), then escaped for the format.
    where = f'journal="{_label(shown(journal))}"'
    out = [
        "# TYPE attempt_kernel_log_attempts_total counter",
        "# HELP attempt_kernel_log_attempts_total Attempts in the run log that reached a final state, by state.",
    ]
    for state, n in report.final_states.items():
        if is_terminal(state):
            out.append(f'attempt_kernel_log_attempts_total{{{where},state="{state_name(state)}"}} {n}')
    gauges = [
        ("indeterminate_attempts",
         "Attempts now Indeterminate with an intent still outstanding: what needs a person.",
         sum(1 for entry in report.indeterminate if entry.outstanding)),
        ("outstanding_intents", "Intents Dispatched with no recorded outcome.", report.unresolved_intents),
        ("log_to_reconcile", "Failed or TimedOut attempts with outstanding intents.",
         len(report.to_reconcile)),
        ("log_violations", "Records that break the kernel's rules.", report.violation_count),
        ("log_torn_tail", "1 if the log ends in a torn (crash-cut) line.",
         int(report.torn_tail is not None)),
        ("log_records", "Complete records in the log.", report.records),
    ]  # fmt: skip
    for name, help_text, value in gauges:
        out += [
            f"# TYPE attempt_kernel_{name} gauge",
            f"# HELP attempt_kernel_{name} {help_text}",
            f"attempt_kernel_{name}{{{where}}} {value}",
        ]
    out.append("# EOF")
    return "\n".join(out) + "\n"


def run_text(report: RunReport) -> str:
    """A run's outcome, one line per step, for people."""
    out = [f"run {shown(report.run)} (workflow {shown(report.workflow)}):"]
    names = [shown(s.step) for s in report.steps]
    width = max((len(n) for n in names), default=0)
    for name, s in zip(names, report.steps):
        state = "NotStarted" if s.state is None else state_name(s.state)
        line = f"  {name:<{width}}  {state:<13} attempts {s.attempts}"
        if s.error is not None:
            line += f"  ({shown(s.error)})"
        if s.outstanding:
            line += f"  outstanding intent keys: {', '.join(shown(k) for k in s.outstanding)}"
        out.append(line)
    if report.error is not None:
        out.append(f"run error: {shown(report.error)}")
    elif report.result is not None:
        out.append(f"run result: {shown(short(report.result))}")
    out.append(f"run status: {report.status}")
    return "\n".join(out) + "\n"


_LEFT_WAITING: Final = (
    "once its signal is sent or its wake time passes, a worker takes up a submitted run,"
    " and `attempt-kernel recover` one that `attempt-kernel run` started"
)


def recovery_text(recovery: Recovery, source: str, *, queued: Sequence[str] = ()) -> str:
    """What recovery did to the log, for people. ``queued``: a journal's runs submitted
    and not started yet (recovery sees no record of them)."""
    waiting = ", ".join(shown(run) for run in recovery.left_waiting)
    if recovery.changed_nothing and waiting:
        also = f"; {queued_clause(queued)}" if queued else ""
        return (
            f"recover: nothing to do: no run in {shown(source)} was cut short; run(s) {waiting}"
            f" only wait, left waiting ({_LEFT_WAITING}){also}; the log was not changed\n"
        )
    if recovery.changed_nothing and queued:
        return (
            f"recover: nothing to do: {shown(source)} ends cleanly and every run in it that has"
            f" started has finished; {queued_clause(queued)}; the log was not changed\n"
        )
    if recovery.changed_nothing:
        return (
            f"recover: nothing to do: {shown(source)} ends cleanly and every run in it has"
            " finished; the log was not changed\n"
        )
    out = [f"recover: {shown(source)}"]
    tail = recovery.torn_tail
    if tail is not None:
        out.append(
            f"  cut the torn tail at line {tail.line} ({tail.length} bytes from byte"
            f" {tail.offset}); its bytes are kept in {shown(str(recovery.side_file))}"
        )
    out += _settled_lines(recovery)
    for run in recovery.closed:
        out.append(f"  closed run {shown(run)}: its cancel was decided before the crash; not resumed")
    for r in recovery.runs:
        out.append(f"  resuming run {shown(r.run)} (workflow {shown(r.workflow)})")
    if waiting:
        out.append(f"  left waiting: run(s) {waiting} ({_LEFT_WAITING})")
    if queued:
        out.append(f"  queued: {queued_clause(queued)}")
    return "\n".join(out) + "\n"


def queued_clause(queued: Sequence[str]) -> str:
    """Runs submitted and not started, named (the first five) for people."""
    names = ", ".join(shown(run) for run in queued[:5])
    more = f" and {len(queued) - 5} more" if len(queued) > 5 else ""
    return (
        f"run(s) {names}{more} are queued, for a worker of their workflow to start (anything"
        " sent to them waits in the journal's inbox for it)"
    )


def taken_up_text(recovery: Recovery) -> str:
    """What resuming a code workflow's run did once its code was checked, for people."""
    runs = sorted({a.run for a in recovery.asked} | {o.run for o in recovery.orphans})
    head = ", ".join(shown(run) for run in runs)
    return "\n".join([f"recover: run {head}: its code matches the log", *_settled_lines(recovery)]) + "\n"


def answer_text(finding: EffectFinding) -> str:
    """What a reconciler answered, in words: ``it happened (intent Confirmed)``, ``unknown (why)``."""
    match finding:
        case EffectHappened():
            return "it happened (intent Confirmed)"
        case EffectNotHappened():
            return "it did not happen (intent Rejected)"
        case EffectUnknown():
            return f"unknown ({finding.reason})" if finding.reason else "unknown"
        case _:
            assert_never(finding)


def asked_line(asked: Asked, *, completed: bool = True, by: str = "the takeover") -> tuple[int, str]:
    """The log line saying what a reconciler answered about an outstanding intent, and its
    level: a worker taking a run over and an executor stopping one both log it.

    Like every line of a run's course, it is escaped where it is logged or
    printed (`shown`): a reason with a line break stays one line. WARNING
    for an answer nobody could give (the reconciler said so, raised, or ran
    past its deadline): it is why the attempt ends Indeterminate, and the
    log keeps no record of it; INFO for an answer, which the log records.
    ``completed`` False, the takeover that asked failed once the answers
    came (its lease lost before their records committed, say): WARNING for
    every answer, saying so, since the journal may not hold it (``by`` names
    what failed: a command's own recovery says ``this recover``).
    """
    finding = asked.finding
    match finding:
        case EffectUnknown():
            level = logging.WARNING
        case EffectHappened() | EffectNotHappened():
            level = logging.INFO if completed else logging.WARNING
        case _:
            assert_never(finding)
    line = (
        f"{asked.run} {asked.step}#{asked.attempt}: asked the reconciler about"
        f" {asked.intent!r} ({asked.key}): {answer_text(finding)}"
    )
    if not completed:
        line += f"; {by} did not complete, so the journal may not hold this answer"
    return level, line


def settled_text(recovery: Recovery, command: str) -> str:
    """The reconcilers asked and the orphans ended, a line each after ``command:``
    (what `attempt-kernel resume` says it did to the run it resumes)."""
    return "".join(f"{command}: {line.lstrip()}\n" for line in _settled_lines(recovery))


def _settled_lines(recovery: Recovery) -> list[str]:
    """The reconcilers asked and the orphans ended, one line each."""
    out: list[str] = []
    for asked in recovery.asked:
        out.append(
            f"  asked the reconciler of {shown(asked.run)} / {shown(asked.step)} #{asked.attempt}"
            f" about {shown(asked.intent)} ({shown(asked.key)}): {shown(answer_text(asked.finding))}"
        )
    for o in recovery.orphans:
        keys = (
            f" (outstanding intent keys: {', '.join(shown(k) for k in o.outstanding)})"
            if o.outstanding
            else ""
        )
        out.append(
            f"  ended orphaned attempt {shown(o.run)} / {shown(o.step)} #{o.attempt}:"
            f" {state_name(o.from_state)} -> {state_name(o.to_state)}{keys}"
        )
    return out


# --------------------------------------------------------------------------
# runs and show
# --------------------------------------------------------------------------


_YEAR_10000: Final = 253_402_300_800
"""Seconds from the epoch to 10000-01-01: later times do not fit the format (nor, on some
platforms, ``time.gmtime``)."""


def when(time_us: int | None) -> str:
    """A record's time in UTC, to the millisecond (``-`` when unknown)."""
    if time_us is None:
        return "-"
    seconds, micros = divmod(time_us, 1_000_000)
    if not 0 <= seconds < _YEAR_10000:  # a log may hold any integer: shown, never a crash
        return f"{time_us}us (not a time from 1970 to 9999)"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros // 1000:03d}Z"


SHOWN_DEPTH: Final = 20
"""`short` shows a list or object nested deeper than this as ``[…]`` or ``{…}``."""


def short(value: JSON, limit: int = 80) -> str:
    """A JSON value on one line, cut to ``limit`` characters.

    Compact JSON (as ``json.dumps`` with no spaces writes it) for any value a
    log can hold, however deep: it is written without recursion, a list or
    object nested deeper than `SHOWN_DEPTH` is shown as ``[…]`` or ``{…}``,
    and writing stops once past ``limit`` (a long value costs what is shown).
    """
    pieces: list[str] = []
    size = 0
    # What is left to write, last first: text as it is, or a value at its depth.
    todo: list[str | tuple[JSON, int]] = [(value, 0)]
    while todo and size <= limit:
        item = todo.pop()
        if isinstance(item, str):
            piece = item
        else:
            node, depth = item
            if isinstance(node, (str, int, float)) or node is None:  # bool is an int
                piece = json.dumps(node)
            elif isinstance(node, Mapping):
                piece = "{"
                if node and depth >= SHOWN_DEPTH:
                    piece = "{…}"
                elif node:
                    todo.append("}")
                    for n, (key, inner) in enumerate(reversed(list(node.items()))):
                        todo.append((inner, depth + 1))
                        todo.append(json.dumps(key) + ":")
                        if n < len(node) - 1:
                            todo.append(",")
                else:
                    piece = "{}"
            else:
                piece = "["
                if node and depth >= SHOWN_DEPTH:
                    piece = "[…]"
                elif node:
                    todo.append("]")
                    for n, inner in enumerate(reversed(node)):
                        todo.append((inner, depth + 1))
                        if n < len(node) - 1:
                            todo.append(",")
                else:
                    piece = "[]"
        pieces.append(piece)
        size += len(piece)
    text = "".join(pieces)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cause_text(cause: TransitionCause) -> str:
    text = cause_name(cause)
    flag = getattr(cause, "intent_dispatched", None)
    return text if flag is None else f"{text}(intent_dispatched={flag})"


def wait_text(run: str, wait: WaitOn) -> str:
    """``run a-1 waits for signal 'approve' (until ...)`` or ``run a-1 sleeps until ...``;
    once what it waits for came (`WaitOn.came`), that it goes on when a process takes it up."""
    came = ": it goes on once a process takes the run up" if wait.came else ""
    if wait.signal is None:
        if wait.came:
            return f"run {shown(run)} slept until {when(wait.wake_us)}, which has passed{came}"
        return f"run {shown(run)} sleeps until {when(wait.wake_us)}"
    if wait.signal_came:
        return f"run {shown(run)} waits for signal {shown(repr(wait.signal))}, which came{came}"
    if wait.came:  # its timeout passed, and no signal it takes came: it ends without one
        return (
            f"run {shown(run)} waited for signal {shown(repr(wait.signal))} until {when(wait.wake_us)},"
            " which has passed: it goes on without it once a process takes the run up"
        )
    until = "" if wait.wake_us is None else f" (until {when(wait.wake_us)})"
    return f"run {shown(run)} waits for signal {shown(repr(wait.signal))}{until}"


def cancelled_wait_text(run: str) -> str:
    """A waiting run whose cancel was recorded: it waits for nothing now (`RunRow.cancel_requested`)."""
    return (
        f"run {shown(run)} waits no more: its cancel was recorded, and it ends cancelled once a"
        " process takes the run up"
    )


def _waiting_lines(run: str, waits: Sequence[WaitOn], cancel_requested: bool) -> list[str]:
    """What a waiting run waits for, a line per open wait; one line if its cancel was recorded."""
    if cancel_requested:
        return [cancelled_wait_text(run)]
    return [wait_text(run, wait) for wait in waits]


def _wait_json(wait: WaitOn) -> dict[str, object]:
    if wait.signal is None:
        return {"timer": when(wait.wake_us), "came": wait.came}
    return {"signal": wait.signal, "until": None if wait.wake_us is None else when(wait.wake_us), "came": wait.came}


def violations_warning(violations: int, replay: str) -> str:
    """The line `runs` and `show` end with when what they read breaks the kernel's rules
    (``replay``: the command that lists the violations), whatever rows they printed."""
    return f"warning: the log breaks the kernel's rules {violations} time(s); see `{shown(replay)}`\n"


def runs_text(rows: list[RunRow], source: str, *, filtered: bool = False) -> str:
    """The runs of a log, one line each, for people (``filtered``: only those a filter kept);
    the caller adds `violations_warning` when the log has violations."""
    if not rows:
        return f"no runs in {shown(source)}{' match the filters' if filtered else ''}\n"
    table = [("RUN", "WORKFLOW", "STATUS", "ATTEMPTS", "STARTED", "ENDED", "DOMAIN STATE")]
    for r in rows:
        table.append(
            (
                shown(r.run),
                shown(r.workflow or "-"),
                r.status,
                str(r.attempts),
                when(r.started_us),
                when(r.ended_us),
                shown(r.domain_state or "-"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    out += [line for r in rows for line in _waiting_lines(r.run, r.waiting_on, r.cancel_requested)]
    return "\n".join(out) + "\n"


def runs_json(rows: list[RunRow], source: str, violations: int) -> str:
    """The runs of a log, for machines: ``{"log", "violations", "runs": [...]}``."""
    runs: list[dict[str, object]] = []
    for r in rows:
        row: dict[str, object] = {
            "run": r.run,
            "workflow": r.workflow,
            "status": r.status,
            "attempts": r.attempts,
            "started": None if r.started_us is None else when(r.started_us),
            "ended": None if r.ended_us is None else when(r.ended_us),
            "domain_state": r.domain_state,
        }
        if r.status == "waiting":
            row["waiting_for"] = [_wait_json(wait) for wait in r.waiting_on]
            row["cancel_requested"] = r.cancel_requested
        runs.append(row)
    doc = {"log": source, "violations": violations, "runs": runs}
    return json.dumps(doc, indent=2) + "\n"


def queued_text(run: str, workflow: str | None, submitted_us: int) -> str:
    """A submitted run that no worker has claimed yet, for people."""
    return (
        f"run {shown(run)} (workflow {shown(workflow or '-')}): queued\n"
        f"  {when(submitted_us)}  submitted; no worker has claimed it yet (no record is written)\n"
    )


def queued_json(run: str, workflow: str | None, submitted_us: int) -> str:
    """A submitted run that no worker has claimed yet, for machines."""
    doc = {"run": run, "workflow": workflow, "status": "queued", "submitted": when(submitted_us)}
    return json.dumps(doc, indent=2) + "\n"


def _intent_event(event: IntentEvent) -> str:
    line = (
        f"{when(event.time_us)}  {intent_state_name(event.from_state)} ->"
        f" {intent_state_name(event.to_state)} ({intent_cause_name(event.cause)})"
    )
    if event.by is not None:
        line += f"  reconciled by {shown(event.by)}"
        if event.note:
            line += f": {shown(event.note)}"
    if event.result is not None:
        line += f"  result {shown(short(event.result))}"
    return line


def _attempt_lines(attempt: AttemptHistory) -> list[str]:
    state = "Pending" if attempt.state is None else state_name(attempt.state)
    out = [f"    attempt {attempt.number}  {state}", f"      {when(attempt.created_us)}  created"]
    timeline = [
        (
            move.time_us,
            f"{state_name(move.from_state)} -> {state_name(move.to_state)}"
            f" ({_cause_text(move.cause)})",
        )
        for move in attempt.moves
    ]
    timeline += [(at, f"domain state {shown(name)}") for at, name in attempt.domain_states]
    # sorted is stable: what happened at one microsecond stays in log order
    out += [f"      {when(at)}  {text}" for at, text in sorted(timeline, key=lambda e: e[0])]
    if attempt.returned:
        out.append(f"      result: {shown(short(attempt.result))}")
    elif attempt.error is not None:
        out.append(f"      error: {shown(attempt.error)}")
    for intent in attempt.intents:
        out.append(
            f"      intent {shown(intent.name)}  key {shown(intent.key)}"
            f"  {intent_state_name(intent.state)}"
        )
        out += [f"        {_intent_event(e)}" for e in intent.events]
    return out


def show_text(history: RunHistory, writer_live: bool) -> str:
    """One run step by step, for people."""
    standing = "running" if writer_live else history.standing
    out = [f"run {shown(history.run)} (workflow {shown(history.workflow or '-')}): {standing}"]
    if history.version:
        out.append(f"  version: {shown(history.version)}")
    if history.input is not None:
        out.append(f"  input: {shown(short(history.input))}")
    if history.result is not None:
        out.append(f"  result: {shown(short(history.result))}")
    if history.domain_state is not None:
        out.append(f"  domain state: {shown(history.domain_state)}")
    for event in history.events:
        reason = f" ({shown(event.reason)})" if event.reason else ""
        out.append(f"  {when(event.time_us)}  {event.what}{reason}")
    if standing == "waiting":
        out += [f"  {line}" for line in _waiting_lines(history.run, _open_waits(history), history.cancel_requested)]
    for wait in history.waits:
        out.append(f"  {_wait_history_text(wait)}")
    for sig in history.signals:
        taken = "not taken" if sig.taken_at is None else f"taken by the wait @{sig.taken_at}"
        out.append(
            f"  {when(sig.sent_us)}  signal #{sig.number} {shown(repr(sig.name))} payload"
            f" {shown(short(sig.payload))}: {taken}"
        )
    for step in history.steps:
        out.append(f"  step {shown(step.name)}")
        for attempt in step.attempts:
            out += _attempt_lines(attempt)
    return "\n".join(out) + "\n"


def _open_waits(history: RunHistory) -> list[WaitOn]:
    """The run's open waits, each with whether what it waits for came (as
    `RunView.open_waits_ending`: one signal is taken by one wait)."""
    now_us = time.time_ns() // 1000
    opened = [w for w in history.waits if w.ended_us is None]
    takes = signals_taken(
        [(w.signal, w.wake_us) for w in opened],
        [(s.name, s.sent_us) for s in history.signals if s.taken_at is None],
    )
    return [WaitOn.at(w.signal, w.wake_us, signal_came=took, now_us=now_us) for w, took in zip(opened, takes)]


def _wait_history_text(wait: WaitHistory) -> str:
    what = "sleep" if wait.signal is None else f"wait for signal {shown(repr(wait.signal))}"
    until = "" if wait.wake_us is None else f" until {when(wait.wake_us)}"
    if wait.ended_us is None:
        end = "open"
    elif wait.taken is not None:
        end = f"ended {when(wait.ended_us)} (took signal #{wait.taken})"
    else:
        end = f"ended {when(wait.ended_us)} (its time came)"
    return f"{when(wait.started_us)}  @{wait.position} {what}{until}: {end}"


def _intent_json(intent: IntentHistory) -> dict[str, object]:
    return {
        "intent": intent.name,
        "key": intent.key,
        "state": intent_state_name(intent.state),
        "changes": [
            {
                "time": when(e.time_us),
                "from": intent_state_name(e.from_state),
                "cause": intent_cause_name(e.cause),
                "to": intent_state_name(e.to_state),
                "result": e.result,
                "reconciled_by": e.by,
                "note": e.note,
            }
            for e in intent.events
        ],
    }


def show_json(history: RunHistory, writer_live: bool) -> str:
    """One run step by step, for machines."""
    doc: dict[str, object] = {
        "run": history.run,
        "workflow": history.workflow,
        "status": "running" if writer_live else history.standing,
        "input": history.input,
        "version": history.version,
        "result": history.result,
        "domain_state": history.domain_state,
        "events": [
            {"time": when(e.time_us), "what": e.what, "reason": e.reason} for e in history.events
        ],
        "steps": [
            {
                "step": step.name,
                "attempts": [
                    {
                        "attempt": a.number,
                        "state": "Pending" if a.state is None else state_name(a.state),
                        "created": when(a.created_us),
                        "moves": [
                            {
                                "time": when(m.time_us),
                                "from": state_name(m.from_state),
                                "cause": _cause_text(m.cause),
                                "to": state_name(m.to_state),
                            }
                            for m in a.moves
                        ],
                        "result": a.result if a.returned else None,
                        "error": a.error,
                        "domain_states": [{"time": when(t), "state": n} for t, n in a.domain_states],
                        "intents": [_intent_json(i) for i in a.intents],
                    }
                    for a in step.attempts
                ],
            }
            for step in history.steps
        ],
    }
    if history.standing == "waiting" and not writer_live:
        doc["waiting_for"] = [_wait_json(wait) for wait in _open_waits(history)]
        doc["cancel_requested"] = history.cancel_requested
    if history.code or history.waits or history.signals:  # a code run's, even before its first wait
        doc["waits"] = [
            {
                "position": w.position,
                "signal": w.signal,
                "until": None if w.wake_us is None else when(w.wake_us),
                "started": when(w.started_us),
                "ended": None if w.ended_us is None else when(w.ended_us),
                "took_signal": w.taken,
            }
            for w in history.waits
        ]
        doc["signals"] = [
            {
                "number": s.number,
                "name": s.name,
                "payload": s.payload,
                "sent": when(s.sent_us),
                "taken_by_wait": s.taken_at,
            }
            for s in history.signals
        ]
    return json.dumps(doc, indent=2) + "\n"
