"""What a reconciler can find out about an effect (docs/contracts.md,
"Recovery"), as closed values.

A reconciler is an async function of an idempotency key that asks the
downstream system whether the effect under that key happened. It answers
`EffectHappened` (with the effect's result, if it knows it),
`EffectNotHappened`, or `EffectUnknown`. No I/O here: the values, and
`ask_all`, which awaits reconcilers under a deadline (whatever they do
outside is theirs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Union

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

RECONCILER_DEADLINE: Final = 10.0
"""Seconds a reconciler may take before its answer counts as unknown."""


async def ask_all(
    questions: Sequence[tuple[Reconciler, str]], deadline: float = RECONCILER_DEADLINE
) -> list[EffectFinding]:
    """Ask each reconciler about its key, all at once; one answer per question.

    A reconciler that raises, or runs past ``deadline`` seconds, answered
    `EffectUnknown` (with the reason): it never decides for anyone.
    """

    async def ask(reconciler: Reconciler, key: str) -> EffectFinding:
        try:
            return await asyncio.wait_for(reconciler(key), deadline)
        except asyncio.TimeoutError:
            return EffectUnknown(reason=f"the reconciler ran past its {deadline:g} s deadline")
        except Exception as error:  # noqa: BLE001  # a reconciler may raise anything: unknown
            return EffectUnknown(reason=f"the reconciler raised {type(error).__name__}: {error}")

    return list(await asyncio.gather(*(ask(r, k) for r, k in questions)))
