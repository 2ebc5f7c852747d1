"""One run's timeline as geometry for a picture: rows, bars, ticks, a legend.

Pure: a `RunHistory` (and the time to draw open bars up to) in, numbers
and plain text out; the web view's template turns them into SVG and
escapes every text there. One row per step and per wait, in the order
they began; a bar per attempt, from its creation (Pending) through its
admission (Running) to its last recorded move, coloured by the state
that move reached; a bar per wait, from its start to its end. No I/O, no
clock: the caller says what "now" is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Union

from typing_extensions import TypeAlias, assert_never, final

from ._attempt import (
    CANCELLED,
    FAILED,
    INDETERMINATE,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
    AttemptState,
    is_terminal,
)
from ._codec import state_name
from ._history import AttemptHistory, RunHistory, StepHistory, WaitHistory
from ._report import shown, when

LABEL_WIDTH: Final = 190
"""Pixels left of the chart for the row names."""
CHART_WIDTH: Final = 600
ROW_HEIGHT: Final = 30
TOP: Final = 28
"""Pixels above the first row, for the time axis."""
LEGEND_HEIGHT: Final = 34
MIN_BAR: Final = 3
"""The narrowest bar drawn, in pixels, so an instant attempt still shows."""
NAME_LIMIT: Final = 26
"""Row names longer than this are cut (the full name is the row's tooltip)."""
TICKS: Final = 5
CHAR_WIDTH: Final = 6.2
"""About how wide a character of a bar's label is drawn, in pixels."""

_Item: TypeAlias = Union[StepHistory, WaitHistory]
"""What a row shows: a step (its attempts) or a wait."""

LEGEND_STATES: Final[tuple[AttemptState, ...]] = (
    SUCCEEDED, FAILED, INDETERMINATE, CANCELLED, TIMED_OUT, RUNNING, PENDING,
)  # fmt: skip
"""Every attempt state, in the order the legend lists them."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Bar:
    """One rectangle: an attempt's part (``pending`` or its state) or a wait."""

    x: float
    y: float
    width: float
    height: float
    css: str
    """``st-<state>`` for an attempt, ``st-pending`` for its time before admission, ``wait``."""
    label: str
    """Drawn beside the bar (``#2 Failed``, ``took #1``)."""
    title: str
    """The tooltip: what the bar is, with its times."""
    open: bool = False
    """It has not ended: drawn up to "now"."""
    inside: bool = False
    """The label is drawn inside the bar (it is wide enough), else after it."""

    @property
    def label_x(self) -> float:
        return round(self.x + 5 if self.inside else self.x + self.width + 4, 1)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """A row's name (cut to fit) and where it is drawn."""

    name: str
    full: str
    kind: str
    """``step`` or ``wait``."""
    y: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    x: float
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Swatch:
    """A legend entry: a colour and the word for it."""

    x: float
    css: str
    text: str


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Everything the picture draws, in pixels; texts are plain (escape them)."""

    width: float
    height: float
    label_width: float
    chart_top: float
    chart_bottom: float
    rows: tuple[Row, ...]
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    legend: tuple[Swatch, ...]
    legend_y: float
    start: str
    """The time the axis starts at (UTC)."""
    empty: bool
    """Nothing to draw: the run has no attempt and no wait."""


def duration(seconds: float) -> str:
    """``0 s``, ``+250 ms``, ``+1.5 s``, ``+3 min``, ``+2.0 h``: an axis label."""
    if seconds <= 0:
        return "0 s"
    if seconds < 1:
        return f"+{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"+{seconds:.3g} s"
    if seconds < 3600:
        return f"+{seconds / 60:.3g} min"
    return f"+{seconds / 3600:.3g} h"


def _cut(name: str) -> str:
    text = shown(name)
    return text if len(text) <= NAME_LIMIT else text[: NAME_LIMIT - 1] + "…"


def _last_us(history: RunHistory) -> int | None:
    """The latest time any record of the run carries."""
    times = [e.time_us for e in history.events]
    for step in history.steps:
        for a in step.attempts:
            times.append(a.created_us)
            times += [m.time_us for m in a.moves]
            times += [e.time_us for i in a.intents for e in i.events]
    for w in history.waits:
        times.append(w.started_us if w.ended_us is None else w.ended_us)
    times += [s.sent_us for s in history.signals]
    return max(times, default=None)


def _attempt_end(attempt: AttemptHistory) -> int | None:
    """When the attempt reached a terminal state (None: it has not)."""
    for move in attempt.moves:
        if is_terminal(move.to_state):
            return move.time_us
    return None


def _admitted(attempt: AttemptHistory) -> int | None:
    for move in attempt.moves:
        if move.to_state == RUNNING:
            return move.time_us
    return None


def timeline(history: RunHistory, *, open_until_us: int) -> Timeline:
    """The picture of ``history``; bars that have not ended are drawn to ``open_until_us``
    (the caller's "now" for a live or waiting run, the run's last record otherwise)."""
    # (when it began, log order, what): a step not yet attempted sorts last
    starts: list[tuple[int | None, int, _Item]] = []
    for index, step in enumerate(history.steps):
        first = min((a.created_us for a in step.attempts), default=None)
        starts.append((first, index, step))
    for index, wait in enumerate(history.waits):
        starts.append((wait.started_us, len(history.steps) + index, wait))
    starts.sort(key=lambda s: (s[0] is None, s[0] or 0, s[1]))
    last = _last_us(history)
    began = [e.time_us for e in history.events if e.what == "started"]
    t0 = min([*began, *(s[0] for s in starts if s[0] is not None)], default=last or 0)
    t1 = max(open_until_us if any(_is_open(s[2]) for s in starts) else 0, last or t0, t0 + 1)
    axis = _Axis(t0=t0, t1=t1)
    rows: list[Row] = []
    bars: list[Bar] = []
    for number, (_, _, item) in enumerate(starts):
        y = TOP + number * ROW_HEIGHT
        match item:
            case WaitHistory():
                name = _wait_name(item)
                rows.append(Row(name=_cut(name), full=shown(name), kind="wait", y=y))
                bars.append(_wait_bar(item, axis, y))
            case StepHistory():
                rows.append(Row(name=_cut(item.name), full=shown(item.name), kind="step", y=y))
                row_bars = [bar for attempt in item.attempts for bar in _attempt_bars(item.name, attempt, axis, y)]
                bars += _labels_apart(row_bars)
            case _:
                assert_never(item)
    bottom = TOP + len(starts) * ROW_HEIGHT
    span = t1 - t0
    ticks = tuple(
        Tick(x=axis.x(t0 + span * i // (TICKS - 1)), text=duration(span * i / (TICKS - 1) / 1e6))
        for i in range(TICKS)
    )
    legend: list[Swatch] = []
    x = 0.0
    for state in LEGEND_STATES:
        word = state_name(state)
        legend.append(Swatch(x=x, css=f"st-{word.lower()}", text=word))
        x += 22 + 7.5 * len(word) + 14
    legend.append(Swatch(x=x, css="wait", text="wait"))
    return Timeline(
        width=LABEL_WIDTH + CHART_WIDTH + 200,
        height=bottom + 12 + LEGEND_HEIGHT,
        label_width=LABEL_WIDTH,
        chart_top=TOP - 6,
        chart_bottom=bottom,
        rows=tuple(rows),
        bars=tuple(bars),
        ticks=ticks,
        legend=tuple(legend),
        legend_y=bottom + 12,
        start=when(t0),
        empty=not starts,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _Axis:
    t0: int
    t1: int

    def x(self, time_us: int) -> float:
        return round(LABEL_WIDTH + CHART_WIDTH * (time_us - self.t0) / (self.t1 - self.t0), 1)

    def bar(self, start_us: int, end_us: int, y: float, css: str, label: str, title: str, open: bool) -> Bar:
        x0, x1 = self.x(start_us), self.x(end_us)
        return Bar(
            x=x0, y=y + 5, width=round(max(x1 - x0, MIN_BAR), 1), height=ROW_HEIGHT - 10,
            css=css, label=label, title=title, open=open,
        )  # fmt: skip


def _wait_name(wait: WaitHistory) -> str:
    what = "sleep" if wait.signal is None else f"wait for {wait.signal!r}"
    return f"@{wait.position} {what}"


def _wait_bar(wait: WaitHistory, axis: _Axis, y: float) -> Bar:
    if wait.ended_us is None:
        label = "waiting"
    elif wait.taken is not None:
        label = f"took signal #{wait.taken}"
    else:
        label = "its time came"
    until = "" if wait.wake_us is None else f", until {when(wait.wake_us)}"
    ended = "now (open)" if wait.ended_us is None else when(wait.ended_us)
    title = f"{shown(_wait_name(wait))}{until}: {when(wait.started_us)} to {ended}"
    end = axis.t1 if wait.ended_us is None else wait.ended_us
    return axis.bar(wait.started_us, end, y, "wait", label, title, wait.ended_us is None)


def _attempt_bars(step: str, attempt: AttemptHistory, axis: _Axis, y: float) -> list[Bar]:
    """A lighter bar while it was Pending, then one in the colour of its state."""
    state = PENDING if attempt.state is None else attempt.state
    name = state_name(state)
    ended = _attempt_end(attempt)
    admitted = _admitted(attempt)
    title = (
        f"{shown(step)} attempt {attempt.number}: {name}; created {when(attempt.created_us)}"
        + ("" if admitted is None else f", running {when(admitted)}")
        + (", not ended" if ended is None else f", ended {when(ended)}")
    )
    end = axis.t1 if ended is None else ended
    out: list[Bar] = []
    begin = attempt.created_us
    if admitted is not None and admitted > attempt.created_us:
        out.append(axis.bar(begin, admitted, y, "st-pending", "", f"{title} (Pending until admitted)", False))
        begin = admitted
    out.append(axis.bar(begin, end, y, f"st-{name.lower()}", f"#{attempt.number} {name}", title, ended is None))
    return out


def _labels_apart(bars: list[Bar]) -> list[Bar]:
    """The row's bars, each label inside its bar where it fits; when a label after
    its bar would run into the next one, the labels that do not fit are said once,
    together, after the last of them (``#1 Failed · #2 Succeeded``)."""
    bars = [replace(bar, inside=True) if _fits(bar) else bar for bar in bars]
    labelled = [bar for bar in bars if bar.label and not bar.inside]
    clash = any(
        bar.x + bar.width + 4 + CHAR_WIDTH * len(bar.label) > after.x
        for bar, after in zip(labelled, labelled[1:])
    )
    if not clash:
        return bars
    together = " · ".join(bar.label for bar in labelled)
    last = labelled[-1]
    return [
        replace(bar, label=together if bar is last else "") if bar in labelled else bar for bar in bars
    ]


def _fits(bar: Bar) -> bool:
    return bool(bar.label) and bar.width >= CHAR_WIDTH * len(bar.label) + 10


def _is_open(item: _Item) -> bool:
    match item:
        case WaitHistory():
            return item.ended_us is None
        case StepHistory():
            return any(_attempt_end(a) is None for a in item.attempts)
        case _:
            assert_never(item)
