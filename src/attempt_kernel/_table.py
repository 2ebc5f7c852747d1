"""The transition table rendered for people: Markdown, mermaid and Graphviz.

Every cell is computed by calling `transition`, never read from a copy of the
table, so what these renderings show is what the kernel does. No I/O here:
the CLI prints what these functions return.
"""

from __future__ import annotations

from typing import Final

from ._attempt import (
    ALL_CAUSES,
    ALL_STATES,
    PENDING,
    AttemptState,
    IllegalTransition,
    TransitionCause,
    is_terminal,
    transition,
)

REJECTED: Final = "rejected"


def state_label(state: AttemptState) -> str:
    """The state's class name, e.g. ``Running``."""
    return type(state).__name__


def cause_label(cause: TransitionCause) -> str:
    """The cause as the transition table writes it, e.g.
    ``Cancel(intent_dispatched=True)``."""
    text = repr(cause)
    return text[:-2] if text.endswith("()") else text


def legal_moves() -> list[tuple[AttemptState, TransitionCause, AttemptState]]:
    """Every (from, cause, to) that `transition` accepts, in the order of
    `ALL_STATES`."""
    moves: list[tuple[AttemptState, TransitionCause, AttemptState]] = []
    for state in ALL_STATES:
        for cause in ALL_CAUSES:
            try:
                moves.append((state, cause, transition(state, cause)))
            except IllegalTransition:
                pass
    return moves


def markdown() -> str:
    """The full grid: one row per state, one column per cause value."""
    header = ["From \\ Cause", *(cause_label(c) for c in ALL_CAUSES)]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for state in ALL_STATES:
        cells = [state_label(state)]
        for cause in ALL_CAUSES:
            try:
                cells.append(state_label(transition(state, cause)))
            except IllegalTransition:
                cells.append(REJECTED)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def mermaid() -> str:
    """A mermaid ``stateDiagram-v2`` of the legal moves."""
    lines = ["stateDiagram-v2", f"    [*] --> {state_label(PENDING)}"]
    for src, cause, dst in legal_moves():
        lines.append(f"    {state_label(src)} --> {state_label(dst)}: {cause_label(cause)}")
    for state in ALL_STATES:
        if is_terminal(state):
            lines.append(f"    {state_label(state)} --> [*]")
    return "\n".join(lines) + "\n"


def dot() -> str:
    """A Graphviz digraph of the legal moves; terminal states are doubled."""
    lines = ["digraph attempt {", "    rankdir=LR;", "    node [shape=box];"]
    for state in ALL_STATES:
        extra = " peripheries=2" if is_terminal(state) else ""
        lines.append(f'    {state_label(state)} [label="{state_label(state)}"{extra}];')
    for src, cause, dst in legal_moves():
        lines.append(
            f'    {state_label(src)} -> {state_label(dst)} [label="{cause_label(cause)}"];'
        )
    lines.append("}")
    return "\n".join(lines) + "\n"
