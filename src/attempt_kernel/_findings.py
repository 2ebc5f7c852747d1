"""What a reconciler can find out about an effect (spec §9), as closed values.

A reconciler is an async function of an idempotency key that asks the
downstream system whether the effect under that key happened. It answers
`EffectHappened` (with the effect's result, if it knows it),
`EffectNotHappened`, or `EffectUnknown`. No I/O here: only the values.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Union

from typing_extensions import TypeAlias, final

from ._records import JSON


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EffectHappened:
    """The downstream system has the effect under this key (the intent is Confirmed)."""

    result: JSON = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EffectNotHappened:
    """The downstream system has no effect under this key (the intent is Rejected)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EffectUnknown:
    """Nobody could tell (the reconciler said so, raised, or ran past its deadline)."""

    reason: str = ""


EffectFinding: TypeAlias = Union[EffectHappened, EffectNotHappened, EffectUnknown]
"""The closed union of a reconciler's answers."""

Reconciler: TypeAlias = Callable[[str], Awaitable[EffectFinding]]
"""Asks the downstream system about one idempotency key."""
