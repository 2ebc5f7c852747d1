"""Workflows whose names are not plain file names, for `run`'s default log (`test_cli_inputs`).

`UPWARD` is named ``../escaped`` and `NESTED` is named ``a/b``: each returns 1.
"""

from __future__ import annotations

from attempt_kernel import JSON, RunContext, workflow


@workflow("../escaped")
async def UPWARD(run: RunContext) -> JSON:
    return 1


@workflow("a/b")
async def NESTED(run: RunContext) -> JSON:
    return 1
