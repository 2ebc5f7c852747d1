"""An adversarial worker process: ``python -c 'from workerflows.adv import main; main()' URL SCHEMA``.

Like ``workerflows.start`` (heartbeat 0.2 s, dead after 300 s, SIGUSR1
moves its clock an hour on, stops when idle, SIGINT/SIGTERM stop it
gracefully), with hooks on the moments a
worker's view of a run holds records back (``ADV_HOOK``):

- ``kill-held-start`` / ``kill-held-end``: SIGKILL right after the view
  held the run's start (nothing in the journal yet) / its end.
- ``stop-held-start`` / ``stop-before-close``: SIGSTOP itself there (the
  test sends SIGCONT later).
``KILL_AFTER=N`` as in ``workerflows.start``.

- ``term-held-start`` / ``term-held-end``: SIGTERM itself there (a
  graceful stop, as an operator's kill would).
- ``refuse-dispatch-once``: the worker's journal refuses the first
  ``Dispatched`` with `HeartbeatLate`, as when the heartbeat is late.

``WORKFLOWS``: ``pay`` (default), ``pooled`` (think, hurry), ``failing``
(boom: one step that raises, twice; allfail: two independent steps that
raise).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from workerflows.pay import PAY
from workerflows.pooled import HURRY, THINK
from workerflows.start import DEAD_AFTER, HEARTBEAT, clock, jump_on_sigusr1
from workerflows.start import _kill_after  # pyright: ignore[reportPrivateUsage]

from attempt_kernel import JSON, Dispatched, RetryPolicy, Step, StepContext, load_workflow
from attempt_kernel._records import Change, IntentChanged, RunFinished, RunStarted
from attempt_kernel.postgres._worker import HeartbeatLate, WorkerDeclaredDead, run_worker
from attempt_kernel.postgres._worker import _OneRun, _WorkerJournal  # pyright: ignore[reportPrivateUsage]  # the hooks patch them


async def _boom(ctx: StepContext) -> JSON:
    raise RuntimeError(f"boom in {ctx.step}#{ctx.attempt}")


BOOM = load_workflow("boom", [Step(name="boom", run=_boom, retry=RetryPolicy(initial_interval=0, max_attempts=2))])
ALLFAIL = load_workflow("allfail", [Step(name="a", run=_boom), Step(name="b", run=_boom)])


def _say(text: str) -> None:
    print(text, flush=True)


def _refuse_dispatch_once() -> None:
    # append_all: the Dispatched goes in with its Planned (and append calls append_all)
    original = _WorkerJournal.append_all
    refused = [False]

    def append_all(self: _WorkerJournal, run: str, changes: Sequence[Change]) -> int:
        for change in changes:
            if isinstance(change, IntentChanged) and change.to_state == Dispatched() and not refused[0]:
                refused[0] = True
                _say(f"hook refuse-dispatch-once at {run}/{change.step}#{change.attempt}")
                raise HeartbeatLate("the test's hook says the heartbeat is late")
        return original(self, run, changes)

    setattr(_WorkerJournal, "append_all", append_all)


def _hook(hook: str) -> None:
    if hook == "refuse-dispatch-once":
        _refuse_dispatch_once()
        return
    original = _OneRun.append_all
    done = [False]

    def act(where: str) -> None:
        if done[0]:
            return
        done[0] = True
        verb = hook.partition("-")[0]
        _say(f"hook {hook} at {where}")
        if verb == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif verb == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif verb == "term":
            os.kill(os.getpid(), signal.SIGTERM)

    def append_all(self: _OneRun, run: str, changes: Sequence[Change]) -> int:
        seq = original(self, run, changes)
        if hook.endswith("held-start") and isinstance(changes[-1], RunStarted) and self._held:  # pyright: ignore[reportPrivateUsage]
            act(f"start of {run} held (seq {seq})")
        if hook.endswith("held-end") and isinstance(changes[-1], RunFinished) and self.end:
            # What went before the end was handed over to the journal's
            # writer: written first, so that only the end is held.
            self._journal.settle(run)  # pyright: ignore[reportPrivateUsage]
            act(f"end of {run} held (seq {seq})")
        return seq

    setattr(_OneRun, "append_all", append_all)

    if hook == "stop-before-close":
        complete = _WorkerJournal.complete

        async def before_close(self: _WorkerJournal, run: str, changes: Sequence[Change], *, outcome: str) -> None:
            act(f"close of {run}")
            await complete(self, run, changes, outcome=outcome)

        setattr(_WorkerJournal, "complete", before_close)


def main() -> None:
    url, schema = sys.argv[1], sys.argv[2]
    hook = os.environ.get("ADV_HOOK", "")
    if hook:
        _hook(hook)
    kill_after = int(os.environ.get("KILL_AFTER", "0"))
    if kill_after:
        _kill_after(kill_after)
    jump_on_sigusr1()
    chosen = os.environ.get("WORKFLOWS", "pay")
    workflows = {"pay": [PAY], "pooled": [THINK, HURRY], "failing": [BOOM, ALLFAIL]}[chosen]
    try:
        closed = run_worker(
            url,
            workflows,
            schema=schema,
            heartbeat=HEARTBEAT,
            dead_after=DEAD_AFTER,
            stop_when_idle=True,
            progress=_say,
            stop_on_signals=True,
            clock=clock,
        )
    except WorkerDeclaredDead as error:
        _say(f"declared dead: {error}")
        sys.exit(3)
    _say(f"closed {closed}")
