"""The gate's own configuration stays in step with the source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Hand-written: the two state machines are mutation-tested, nothing else.
MUTATED = {"src/attempt_kernel/_attempt.py", "src/attempt_kernel/_intent.py"}


@pytest.mark.source
def test_every_module_is_either_mutated_or_excluded() -> None:
    """A new module must be listed: mutated (and killed) or in do_not_mutate."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib arrived in Python 3.11")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    excluded = set(config["do_not_mutate"])
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "src" / "attempt_kernel").rglob("*.py")}
    assert modules - excluded == MUTATED
    assert excluded <= modules  # no stale entries
    nox_text = (ROOT / "noxfile.py").read_text()
    for path in MUTATED:
        assert f'"{path}"' in nox_text  # the session counts its pragmas
