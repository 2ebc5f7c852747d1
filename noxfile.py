"""Sessions for attempt-kernel; versions and dependency groups come from pyproject.toml.

`nox` alone runs the gate: tests on every supported Python found on the
machine, the type check, then mutation testing of the two state machines.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "typecheck", "mutate"]

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
    """Benchmarks: print each cost beside a baseline measured in the same run.

    BENCH_TMP picks the folder for the benchmark logs (default: the system's
    temporary folder); fsync costs depend on the disk under it.
    """
    session.install(".")
    session.run("python", "benchmarks/bench_kernel.py")
    session.run("python", "benchmarks/bench_runlog.py")
    session.run("python", "benchmarks/bench_executor.py")


# Files whose every mutant must be killed (mutmut reads [tool.mutmut]).
MUTATED = ("src/attempt_kernel/_attempt.py", "src/attempt_kernel/_intent.py")


@nox.session(python=PYTHONS[-1])
def mutate(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the kernel and intent modules; any surviving mutant fails."""
    # mutmut runs the tests on its own copy of src/, so the package is not installed.
    session.install(*nox.project.dependency_groups(PYPROJECT, "mutate"))
    shutil.rmtree("mutants", ignore_errors=True)
    session.run("mutmut", "run", silent=True)
    results = session.run("mutmut", "results", "--all", "true", silent=True)
    assert isinstance(results, str)
    outcomes = [line.rsplit(": ", 1) for line in results.splitlines() if ": " in line]
    killed = [name for name, outcome in outcomes if outcome.strip() == "killed"]
    alive = [f"{name}: {outcome}" for name, outcome in outcomes if outcome.strip() != "killed"]
    excluded = sum(Path(f).read_text().count("# pragma: no mutate") for f in MUTATED)
    session.log(f"mutants: {len(outcomes)}, killed: {len(killed)}, not killed: {len(alive)}")
    session.log(f"lines excluded with '# pragma: no mutate': {excluded}")
    if not outcomes or alive:
        session.error("mutants not killed:\n" + "\n".join(alive or ["(mutmut reported none)"]))
