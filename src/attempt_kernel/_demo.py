"""The built-in example agent workflow behind ``attempt-kernel demo`` and ``recover``.

A trip-planning agent with simulated tools and side effects, chosen so one
run shows each ordinary ending: a tool call that fails once and is retried,
a check that passes its step deadline, two effects performed through
intents (a seat reservation, an itinerary email), and a long-running price
watch that is cancelled when the itinerary is out. Nothing here is routed to
`Indeterminate`: that takes a crash in the middle of an effect
(``demo --crash-after N`` then ``recover``).

The simulated tools sleep, so this module imports asyncio; the library's
own modules leave that to the executor.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from typing_extensions import final

from ._context import StepContext
from ._executor import RunControl
from ._records import JSON
from ._workflow import RetryPolicy, Step, Workflow, load_workflow

TRIP_PLANNER: Final = "trip-planner"


@final
class ToolError(Exception):
    """A simulated tool call failed (the flight search's first answer is a 503)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Blueprint:
    """A workflow and the supervisor that plays the outside world's part in a run."""

    workflow: Workflow
    supervise: Callable[[RunControl], Awaitable[None]]


def trip_planner(seed: int = 0) -> Blueprint:
    """The demo workflow; ``seed`` varies the simulated tools' latencies."""
    rng = random.Random(seed)
    itinerary_sent = asyncio.Event()

    async def latency(low: float = 0.01, high: float = 0.04) -> None:
        await asyncio.sleep(rng.uniform(low, high))

    async def fetch_profile(ctx: StepContext) -> JSON:
        await latency()
        return {"traveller": "Ada Lovelace", "home": "LHR", "budget_eur": 400}

    async def search_flights(ctx: StepContext) -> JSON:
        await latency()
        if ctx.attempt == 1:
            raise ToolError("flight search API answered 503 Service Unavailable")
        return [{"flight": "TP1351", "to": "LIS", "price_eur": 212}]

    async def check_visa(ctx: StepContext) -> JSON:
        await asyncio.sleep(10)  # the consulate's service hangs; the deadline ends it
        return {"visa": "not needed"}

    async def book_flight(ctx: StepContext) -> JSON:
        flight = ctx.inputs["search-flights"]

        async def reserve(key: str) -> JSON:
            await latency(0.02, 0.06)
            return {"pnr": "X7K2QD", "idempotency_key": key}

        booking = await ctx.effect("reserve-seat", reserve)
        return {"flight": flight, "booking": booking}

    async def send_itinerary(ctx: StepContext) -> JSON:
        async def email(key: str) -> JSON:
            await latency()
            return {"message_id": f"<{key}@mail.example>"}

        sent = await ctx.effect("email-itinerary", email)
        itinerary_sent.set()
        return sent

    async def watch_prices(ctx: StepContext) -> JSON:
        await asyncio.sleep(3600)  # watches until the run is cancelled
        return None

    async def supervise(control: RunControl) -> None:
        # The traveller closes the app a moment after the itinerary is out
        # (the check-visa deadline has long passed by then): cancel the run.
        await itinerary_sent.wait()
        await asyncio.sleep(0.25)
        control.cancel()

    workflow = load_workflow(
        TRIP_PLANNER,
        [
            Step(name="fetch-profile", run=fetch_profile),
            Step(
                name="search-flights",
                run=search_flights,
                after=("fetch-profile",),
                # The simulated tools answer in tens of milliseconds, so the
                # backoff is scaled down with them (a real API: the default 1 s).
                retry=RetryPolicy(max_attempts=3, initial_interval=0.05),
            ),
            Step(name="check-visa", run=check_visa, after=("fetch-profile",), step_deadline=0.05),
            Step(name="book-flight", run=book_flight, after=("search-flights",)),
            Step(name="send-itinerary", run=send_itinerary, after=("book-flight",)),
            # If the itinerary never goes out (a recovered run that stopped for
            # reconciliation), the watch ends at its deadline instead.
            Step(name="watch-prices", run=watch_prices, after=("fetch-profile",), step_deadline=1.0),
        ],
    )
    return Blueprint(workflow=workflow, supervise=supervise)


WORKFLOWS: Final[Mapping[str, Callable[[int], Blueprint]]] = {TRIP_PLANNER: trip_planner}
"""The workflows this program can run and resume, by name."""
