"""Renderings of reports: for people, for machines (JSON), for scrapers.

Pure functions from a report to text; the CLI prints what they return.
Reports carry typed states; only these functions turn them into words.
Names read from a log (runs, steps, intents, errors) are data, never
markup: `shown` escapes every character that is not printable (control
characters, line breaks, lone surrogates), so a name cannot forge a line of
the report or reach a terminal raw.
"""

from __future__ import annotations

import json
from typing import Final

from ._codec import state_name
from ._executor import RunReport
from ._ledger import OpenAttempt
from ._recovery import Recovery
from ._replay import ReplayReport

SHOWN_VIOLATIONS: Final = 50
"""The text report lists this many violations and counts the rest."""


def shown(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``, ``\\udc80``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _attempt_line(entry: OpenAttempt) -> str:
    keys = ", ".join(shown(k) for k in entry.outstanding) if entry.outstanding else "none recorded"
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
        "violation_count": report.violation_count,
        "violations": [{"line": v.line, "reason": v.reason} for v in report.violations],
    }
    return json.dumps(doc, indent=2) + "\n"


def as_metrics(report: ReplayReport) -> str:
    """OpenMetrics text exposition, for a scraper reading a file."""
    out = [
        "# TYPE attempt_kernel_attempts gauge",
        "# HELP attempt_kernel_attempts Attempts in the run log, by final state.",
    ]
    for state, n in report.final_states.items():
        out.append(f'attempt_kernel_attempts{{state="{state_name(state)}"}} {n}')
    gauges = [
        ("indeterminate", "Attempts that ended Indeterminate (alert when above zero).",
         len(report.indeterminate)),
        ("unresolved_intents", "Intents Dispatched with no recorded outcome.",
         report.unresolved_intents),
        ("to_reconcile", "Failed or TimedOut attempts with outstanding intents.",
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
            f"attempt_kernel_{name} {value}",
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
    out.append(f"run status: {report.status}")
    return "\n".join(out) + "\n"


def recovery_text(recovery: Recovery, source: str) -> str:
    """What recovery did to the log, for people."""
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
    for run in recovery.closed:
        out.append(f"  closed run {shown(run)}: its cancel was decided before the crash; not resumed")
    for r in recovery.runs:
        out.append(f"  resuming run {shown(r.run)} (workflow {shown(r.workflow)})")
    return "\n".join(out) + "\n"
