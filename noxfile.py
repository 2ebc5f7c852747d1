"""Sessions for attempt-kernel; versions and dependency groups come from pyproject.toml.

`nox` alone runs the gate: tests on every supported Python found on the
machine, then the type check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "typecheck"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = nox.project.python_versions(PYPROJECT)


def _expose_pyenv_interpreters() -> None:
    """Put pyenv's installed interpreters on PATH under their ``pythonX.Y`` names.

    pyenv's shims answer only for the selected version; nox looks up
    ``python3.10`` and friends on PATH, so without this a machine that has
    all four versions through pyenv would test on one.
    """
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    bins = sorted(str(p) for p in Path(root).glob("versions/3.*/bin"))
    os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])


def _present(versions: list[str]) -> list[str]:
    """The supported versions whose interpreter exists here (the gate tests each)."""
    found = [v for v in versions if shutil.which(f"python{v}")]
    if not found:
        raise RuntimeError(f"none of the supported Pythons {versions} is installed")
    return found


_expose_pyenv_interpreters()
PYTHONS = _present(SUPPORTED)


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest + hypothesis) against the installed package."""
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "test"))
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHONS[-1])
def typecheck(session: nox.Session) -> None:
    """mypy --strict (mypy.ini) over src, tests and noxfile.py."""
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    session.run("mypy")


@nox.session(python=PYTHONS[-1])
def bench(session: nox.Session) -> None:
    """Benchmarks: print each cost beside a baseline measured in the same run."""
    session.install(".")
    session.run("python", "benchmarks/bench_kernel.py")
    session.run("python", "benchmarks/bench_runlog.py", *session.posargs)
