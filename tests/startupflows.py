"""A workflow module that is slow to import, for SIGINT during the CLI's start-up.

With ``STARTUP_READY`` set, importing it writes that file and then sleeps in
short naps until a signal ends it: the test sends SIGINT while `run` is still
loading its workflow, before any run began. Without it, it imports at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from attempt_kernel import JSON, RunContext, workflow


@workflow("startup")
async def STARTUP(run: RunContext) -> JSON:
    return 1


_READY = os.environ.get("STARTUP_READY")
if _READY:
    Path(_READY).write_text("importing\n")
    # Not signal.pause(): a SIGINT landing after Python's last check for
    # signals but before pause() blocks is only noted, and pause() then waits
    # for a signal that never comes. A nap is cut short by the signal, or ends
    # by itself, and the interpreter raises KeyboardInterrupt right after.
    while True:
        time.sleep(0.05)
