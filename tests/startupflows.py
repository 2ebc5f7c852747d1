"""A workflow module that is slow to import, for SIGINT during the CLI's start-up.

With ``STARTUP_READY`` set, importing it writes that file and then waits for a
signal (``signal.pause``): the test sends SIGINT while `run` is still loading
its workflow, before any run began. Without it, it imports at once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from attempt_kernel import JSON, RunContext, workflow


@workflow("startup")
async def STARTUP(run: RunContext) -> JSON:
    return 1


_READY = os.environ.get("STARTUP_READY")
if _READY:
    Path(_READY).write_text("importing\n")
    signal.pause()
