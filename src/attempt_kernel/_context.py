"""The step context: what a step's function is handed, its only door outside.

`StepContext` is a protocol: the executor hands a step its own
implementation, and a user's unit test can hand the same step any object
with these members (a small fake that performs effects directly), without
importing anything private. No asyncio or I/O here: only the contract.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

from ._records import JSON

T = TypeVar("T")

Perform = Callable[[str], Awaitable[JSON]]
"""An effect: an async function of the idempotency key that sends it."""


class StepContext(Protocol):
    """Handed to a step's function: its identity, its inputs, and effects.

    The executor's context makes every effect write-ahead logged
    (docs/contracts.md, "The write-ahead rule"): ``effect`` records the intent
    `Planned`, then `Dispatched`, makes the log durable, and only then awaits
    ``perform(idempotency_key)``. If that returns, the intent is `Confirmed`
    with the value as its result; if it raises `EffectRejected`, the intent is
    `Rejected` and the error propagates; anything else (another exception, a
    deadline, a cancellation) leaves it `Dispatched`: the effect may have
    happened, and the run log says so. (A deadline, cancel or stop that lands
    before ``perform`` was called, while the log is made durable, records it
    `Rejected`: that send never began; unless an earlier attempt left the same
    key outstanding.) An effect that an earlier attempt of the
    step confirmed is not sent again: ``effect`` returns its recorded result.
    """

    @property
    def run(self) -> str:
        """The run's id."""
        ...

    @property
    def step(self) -> str:
        """The step's name."""
        ...

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        ...

    @property
    def input(self) -> JSON:
        """The run's input (recorded in its run_started record); None if it has none."""
        ...

    @property
    def inputs(self) -> Mapping[str, JSON]:
        """Results of the steps this one runs after, by step name."""
        ...

    def idempotency_key(self, name: str) -> str:
        """The key effect ``name`` of this step carries, the same in every attempt."""
        ...

    async def effect(self, name: str, perform: Perform) -> JSON:
        """Perform one external side effect, write-ahead logged as intent ``name``."""
        ...

    def set_state(self, name: str) -> None:
        """Set the run's domain step state (docs/contracts.md, "Domain step
        states") to ``name``, a state the workflow declares; the executor logs
        it, and an undeclared name fails the attempt (`StepError`)."""
        ...

    async def run_blocking(self, function: Callable[[], T]) -> T:
        """Run a blocking call in a thread of its own so the event loop (and deadlines) go on.

        The thread is a daemon: a call still blocked does not keep a stopped
        process alive past its grace."""
        ...
