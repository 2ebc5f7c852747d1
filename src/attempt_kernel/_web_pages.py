"""The web view's page templates (Jinja2) and its style sheet, as text.

Templates only: what they show is computed by ``_web`` and
``_web_timeline``. The environment that renders them escapes every value
(autoescape), so a name read from a log is text on the page, never markup;
nothing here marks a value safe. The pages carry no script at all.
"""

from __future__ import annotations

from typing import Final

STYLE: Final = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --paper: #ffffff;
  --wash: #f6f8fa; --accent: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--ink); background: var(--wash); }
header { background: #24292f; color: #fff; padding: 10px 24px; display: flex;
  align-items: baseline; gap: 18px; }
header a { color: #fff; text-decoration: none; font-weight: 600; }
header .source { color: #c9d1d9; font-size: 13px; font-family: ui-monospace, monospace; }
main { max-width: 1060px; margin: 18px auto; padding: 0 20px; }
section { background: var(--paper); border: 1px solid var(--line); border-radius: 8px;
  padding: 14px 18px; margin-bottom: 16px; overflow-x: auto; }
h1 { font-size: 22px; margin: 0 0 4px; word-break: break-all; }
h2 { font-size: 16px; margin: 0 0 10px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; color: var(--muted); letter-spacing: .03em; }
td.time { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px;
  white-space: nowrap; }
td.mono, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px;
  word-break: break-all; }
a { color: var(--accent); }
.muted { color: var(--muted); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
  font-weight: 600; border: 1px solid transparent; white-space: nowrap; }
.s-succeeded { background: #dafbe1; color: #116329; }
.s-failed { background: #ffebe9; color: #a40e26; }
.s-needs-reconciliation { background: #fff1e5; color: #953800; border-color: #f0b37e; }
.s-cancelled { background: #eaeef2; color: #424a53; }
.s-running { background: #ddf4ff; color: #0550ae; }
.s-waiting { background: #fbefff; color: #6e40c9; }
.s-interrupted { background: #fff8c5; color: #7d4e00; }
.flash { padding: 10px 14px; border-radius: 6px; margin-bottom: 14px; border: 1px solid; }
.flash.ok { background: #dafbe1; border-color: #4ac26b; }
.flash.refused { background: #ffebe9; border-color: #ff8182; }
form.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: end; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 3px; }
input, select, textarea { font: inherit; font-size: 14px; padding: 5px 7px;
  border: 1px solid var(--line); border-radius: 6px; background: #fff; color: var(--ink); }
textarea { font-family: ui-monospace, monospace; font-size: 13px; }
button { font: inherit; font-size: 14px; padding: 5px 12px; border-radius: 6px; cursor: pointer;
  border: 1px solid #1f883d; background: #1f883d; color: #fff; }
button.secondary { background: #f6f8fa; color: var(--ink); border-color: var(--line); }
button.danger { background: #cf222e; border-color: #cf222e; }
.actions { display: grid; grid-template-columns: repeat(auto-fit, minmax(300px, 1fr)); gap: 14px; }
.actions form, .actions > div { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
  display: flex; flex-direction: column; gap: 8px; }
.actions h3 { margin: 0; font-size: 14px; }
.inline { display: flex; gap: 6px; flex-wrap: wrap; align-items: center; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 8px 0 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.dot { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
td.state { white-space: nowrap; }
td.outcome { min-width: 160px; max-width: 300px; }
td.step { white-space: nowrap; }
td.moves { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
table + table { margin-top: 14px; }
.pager { margin-top: 10px; display: flex; gap: 14px; }
svg.timeline { width: 100%; height: auto; font: 12px system-ui, sans-serif; }
svg.timeline .rowname { fill: var(--ink); }
svg.timeline .rowname.wait { fill: #6e40c9; font-style: italic; }
svg.timeline .grid { stroke: #eaeef2; }
svg.timeline .tick { fill: var(--muted); font-size: 11px; }
svg.timeline .barlabel { fill: var(--ink); font-size: 11px; }
svg.timeline .barlabel.inside { fill: #fff; font-weight: 600; }
svg.timeline g.bar-wait .barlabel.inside { fill: #3b2370; }
svg.timeline .open { stroke-dasharray: 4 3; stroke: #24292f; stroke-width: 1; }
.st-succeeded { fill: #2da44e; background: #2da44e; }
.st-failed { fill: #cf222e; background: #cf222e; }
.st-indeterminate { fill: #fb8500; background: #fb8500; }
.st-cancelled { fill: #8c959f; background: #8c959f; }
.st-timedout { fill: #8250df; background: #8250df; }
.st-running { fill: #0969da; background: #0969da; }
.st-pending { fill: #c8d1da; background: #c8d1da; }
.wait { fill: #d8b9ff; background: #d8b9ff; }
"""
"""The style sheet, served at ``/style.css`` (the pages allow no inline style)."""

BASE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}{% endblock %} · attempt-kernel</title>
<link rel="stylesheet" href="/style.css">
</head>
<body>
<header><a href="/">attempt-kernel runs</a><span class="source">{{ source }}</span></header>
<main>
{% for flash in flashes %}<div class="flash {{ flash.kind }}" role="status">{{ flash.text }}</div>
{% endfor %}
{% block body %}{% endblock %}
</main>
</body>
</html>
"""

RUNS: Final = """{% extends "base.html" %}
{% block title %}Runs{% endblock %}
{% block body %}
<section>
<h1>Runs</h1>
<form class="filters" method="get" action="/">
  <label>Status
    <select name="status">
      <option value="">any</option>
      {% for s in statuses %}<option value="{{ s }}"{% if s == filters.status %} selected{% endif %}>{{ s }}</option>
      {% endfor %}
    </select>
  </label>
  <label>Workflow
    <select name="workflow">
      <option value="">any</option>
      {% for w in workflows %}<option value="{{ w.value | exact }}"{% if w.value == filters.workflow %} selected{% endif %}>{{ w.text }}</option>
      {% endfor %}
    </select>
  </label>
  <label>Started since (UTC)<input type="datetime-local" step="1" name="since" value="{{ filters.since }}"></label>
  <label>Started until (UTC)<input type="datetime-local" step="1" name="until" value="{{ filters.until }}"></label>
  <label>Per page<input type="number" min="1" max="{{ max_limit }}" name="limit" value="{{ filters.limit }}"></label>
  <button type="submit">Filter</button>
  <a href="/">clear</a>
</form>
</section>
<section>
{% if rows %}
<table id="runs">
<thead><tr><th>Run</th><th>Workflow</th><th>Status</th><th>Attempts</th><th>Started (UTC)</th><th>Ended (UTC)</th></tr></thead>
<tbody>
{% for r in rows %}<tr>
<td class="mono"><a href="{{ r.href }}">{{ r.run }}</a></td>
<td>{% if r.workflow_href %}<a href="{{ r.workflow_href }}" title="this workflow's runs only">{{ r.workflow }}</a>{% else %}{{ r.workflow }}{% endif %}</td>
<td><span class="badge s-{{ r.status }}">{{ r.status }}</span>{% if r.waiting %} <span class="muted">{{ r.waiting }}</span>{% endif %}</td>
<td>{{ r.attempts }}</td>
<td class="time">{{ r.started }}</td>
<td class="time">{{ r.ended }}</td>
</tr>
{% endfor %}</tbody>
</table>
{% else %}
<p class="muted">No runs{% if filtered %} match these filters{% endif %}.</p>
{% endif %}
<div class="pager">
{% if newer %}<a href="{{ newer }}">newest</a>{% endif %}
{% if older %}<a href="{{ older }}" rel="next">older</a>{% endif %}
<span class="muted">{{ summary }}</span>
</div>
{% if violations %}<p class="flash refused">The log breaks the kernel's rules {{ violations }} time(s); see <span class="mono">attempt-kernel replay</span>.</p>{% endif %}
</section>
{% endblock %}
"""

RUN: Final = """{% extends "base.html" %}
{% block title %}Run {{ run.run | shown }}{% endblock %}
{% block body %}
<section>
<h1 id="run-id">{{ run.run | shown }}</h1>
<div><span class="badge s-{{ standing }}" id="run-status">{{ standing }}</span>
<span class="muted">workflow</span> {{ run.workflow | shown if run.workflow else "-" }}{% if run.version %} <span class="muted">version</span> {{ run.version | shown }}{% endif %}</div>
<dl class="facts">
{% for name, value in facts %}<dt>{{ name }}</dt><dd class="mono">{{ value }}</dd>
{% endfor %}
</dl>
{% if violations %}<p class="flash refused">The log breaks the kernel's rules {{ violations }} time(s); see <span class="mono">attempt-kernel replay</span>.</p>{% endif %}
</section>

<section>
<h2>Timeline</h2>
{% if tl.empty %}<p class="muted">No attempt and no wait yet.</p>{% else %}
<svg class="timeline" id="timeline" role="img" aria-labelledby="tl-title" viewBox="0 0 {{ tl.width }} {{ tl.height }}" width="{{ tl.width }}" height="{{ tl.height }}" xmlns="http://www.w3.org/2000/svg">
<title id="tl-title">Timeline of run {{ run.run | shown }}: one row per step and per wait, from {{ tl.start }}</title>
{% for t in tl.ticks %}<line class="grid" x1="{{ t.x }}" x2="{{ t.x }}" y1="{{ tl.chart_top }}" y2="{{ tl.chart_bottom }}"/>
<text class="tick" x="{{ t.x }}" y="14" text-anchor="middle">{{ t.text }}</text>
{% endfor %}
{% for row in tl.rows %}<g><title>{{ row.full }}</title><text class="rowname {{ row.kind }}" x="6" y="{{ row.y + 19 }}">{{ row.name }}</text></g>
{% endfor %}
{% for b in tl.bars %}<g class="bar-{{ b.css }}"><title>{{ b.title }}</title>
<rect class="{{ b.css }}{% if b.open %} open{% endif %}" x="{{ b.x }}" y="{{ b.y }}" width="{{ b.width }}" height="{{ b.height }}" rx="3"/>
{% if b.label %}<text class="barlabel{% if b.inside %} inside{% endif %}" x="{{ b.label_x }}" y="{{ b.y + 14 }}">{{ b.label }}</text>{% endif %}</g>
{% endfor %}
<g class="legend" transform="translate({{ tl.label_width }}, {{ tl.legend_y }})">
{% for s in tl.legend %}<rect class="{{ s.css }}" x="{{ s.x }}" y="6" width="16" height="12" rx="2"/><text x="{{ s.x + 20 }}" y="16">{{ s.text }}</text>
{% endfor %}</g>
</svg>
<p class="muted">Axis: time since {{ tl.start }} (UTC). Lighter grey: Pending before admission; dashed outline: not ended.</p>
{% endif %}
</section>

<section>
<h2>Attempts</h2>
<table id="attempts">
<thead><tr><th>Step</th><th>#</th><th>State</th><th>Created</th><th>Moves</th><th>Result / error</th></tr></thead>
<tbody>
{% for a in attempts %}<tr>
<td class="step">{{ a.step }}</td><td>{{ a.number }}</td>
<td class="state"><span class="dot {{ a.css }}"></span>{{ a.state }}</td>
<td class="time">{{ a.created }}</td>
<td class="moves">{% for m in a.moves %}<div>{{ m }}</div>{% endfor %}</td>
<td class="mono outcome">{{ a.outcome }}</td>
</tr>
{% else %}<tr><td colspan="6" class="muted">No attempts.</td></tr>
{% endfor %}</tbody>
</table>
</section>

<section>
<h2>Intents</h2>
{% if intents %}
<table id="intents">
<thead><tr><th>Step</th><th>#</th><th>Intent</th><th>Idempotency key</th><th>State</th><th>Reconcile</th></tr></thead>
<tbody>
{% for i in intents %}<tr>
<td>{{ i.step }}</td><td>{{ i.attempt }}</td><td>{{ i.name }}</td>
<td class="mono">{{ i.key | shown }}</td>
<td>{{ i.state }}{% for e in i.events %}<div class="muted mono">{{ e }}</div>{% endfor %}</td>
<td>{% if i.outstanding %}
<form method="post" action="{{ actions.reconcile }}" class="inline">
<input type="hidden" name="csrf" value="{{ csrf }}">
<input type="hidden" name="key" value="{{ i.key_sent }}">
<input type="text" name="note" placeholder="note (why)" aria-label="note for {{ i.key | shown }}">
<input type="text" name="result" placeholder="result JSON (confirm only)" aria-label="result for {{ i.key | shown }}">
<button type="submit" name="verdict" value="confirmed">Confirm: it happened</button>
<button type="submit" name="verdict" value="rejected" class="secondary">Reject: it did not</button>
</form>
{% else %}<span class="muted">-</span>{% endif %}</td>
</tr>
{% endfor %}</tbody>
</table>
{% else %}<p class="muted">No intents.</p>{% endif %}
</section>

{% if run.waits or run.signals %}
<section>
<h2>Waits and signals</h2>
<table id="waits">
<thead><tr><th>Wait</th><th>For</th><th>Started</th><th>Ended</th></tr></thead>
<tbody>
{% for w in waits %}<tr><td>@{{ w.position }}</td><td>{{ w.what }}</td><td class="mono">{{ w.started }}</td><td>{{ w.ended }}</td></tr>
{% endfor %}</tbody>
</table>
{% if signals %}
<table id="signals">
<thead><tr><th>Signal</th><th>Name</th><th>Payload</th><th>Sent</th><th>Taken by</th></tr></thead>
<tbody>
{% for s in signals %}<tr><td>#{{ s.number }}</td><td>{{ s.name }}</td><td class="mono">{{ s.payload }}</td><td class="mono">{{ s.sent }}</td><td>{{ s.taken }}</td></tr>
{% endfor %}</tbody>
</table>
{% endif %}
</section>
{% endif %}

<section>
<h2>Actions</h2>
{% if finished and standing == "interrupted" %}<p class="muted">This run has finished and was reconciled since: signal and cancel are refused{% if resume_offered %}, and Resume goes on with it{% endif %}.</p>
{% elif finished %}<p class="muted">This run has finished: signal, cancel and resume are refused (reconcile stays open for an outstanding intent).</p>{% endif %}
<div class="actions">
<form method="post" action="{{ actions.signal }}" id="signal-form">
<h3>Send a signal</h3>
<input type="hidden" name="csrf" value="{{ csrf }}">
<label>Name<input type="text" name="name" required value="{{ signal_name }}"></label>
<label>Payload (JSON; empty sends {})<textarea name="payload" rows="2"></textarea></label>
<button type="submit">Send signal</button>
</form>
<form method="post" action="{{ actions.cancel }}" id="cancel-form">
<h3>Cancel the run</h3>
<input type="hidden" name="csrf" value="{{ csrf }}">
<label>Reason<input type="text" name="reason"></label>
<button type="submit" class="danger">Cancel run</button>
</form>
{% if resume_offered %}<form method="post" action="{{ actions.resume }}" id="resume-form">
<h3>Resume</h3>
<input type="hidden" name="csrf" value="{{ csrf }}">
<p class="muted">{{ resume_hint }}</p>
<button type="submit" class="secondary">Resume run</button>
</form>
{% else %}<div id="resume-note">
<h3>Resume</h3>
<p class="muted">{{ resume_hint }}</p>
</div>{% endif %}
</div>
</section>
{% endblock %}
"""

MESSAGE: Final = """{% extends "base.html" %}
{% block title %}{{ heading }}{% endblock %}
{% block body %}
<section>
<h1>{{ heading }}</h1>
<p>{{ message }}</p>
<p><a href="/">All runs</a></p>
</section>
{% endblock %}
"""

TEMPLATES: Final = {"base.html": BASE, "runs.html": RUNS, "run.html": RUN, "message.html": MESSAGE}
"""Every template, by the name the others extend it under."""
