"""Sessions for attempt-kernel; versions and dependency groups come from pyproject.toml.

`nox` alone runs the gate: tests on every supported Python found on the
machine, the type checks (mypy and pyright), the distribution check, the
API reference (built, warnings failing it), a smoke run of every
benchmark, then mutation testing of the two state machines. `nox -l` lists the sessions and
runs nothing: importing this file only reads pyproject.toml.
"""

from __future__ import annotations

import glob
import os
import shutil
import zipfile
from pathlib import Path

import nox

nox.needs_version = ">=2025.10.16"  # the oldest that knows nox.options.download_python
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
# The gate tests on the supported Pythons that are installed: a missing one is
# skipped, on CI too (nox would fail it there), and never downloaded. The
# `pythons` session fails the gate when none at all is installed.
nox.options.error_on_missing_interpreters = False
nox.options.download_python = "never"
nox.options.sessions = ["tests", "typecheck", "dist", "docs", "bench-smoke", "mutate"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = nox.project.python_versions(PYPROJECT)

# Files whose every mutant must be killed (mutmut reads [tool.mutmut]).
MUTATED = ("src/attempt_kernel/_attempt.py", "src/attempt_kernel/_intent.py")


@nox.session(python=False)
def pythons(session: nox.Session) -> None:
    """Put pyenv's interpreters on PATH for this nox run; fail unless a supported one is found.

    pyenv's shims answer only for the selected version, and nox looks for
    ``python3.10`` and friends on PATH, so without this a machine with all
    four versions through pyenv would test on one. The `tests` sessions
    require this one, so it runs (once) before them and before nox looks
    for their interpreters; it changes the PATH of the nox process only.
    """
    root = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv")))
    bins = sorted(str(p) for p in root.glob("versions/3.*/bin"))
    os.environ["PATH"] = os.pathsep.join([*bins, os.environ.get("PATH", "")])
    found = [v for v in SUPPORTED if shutil.which(f"python{v}")]
    missing = [v for v in SUPPORTED if v not in found]
    if not found:
        session.error(f"none of the supported Pythons {SUPPORTED} is installed (PATH or pyenv)")
    session.log(f"testing on Python {', '.join(found)}; not installed: {', '.join(missing) or 'none'}")


# The servers and the browser the tests drive for real, by Debian package:
# the binary each installs. PostgreSQL's server comes with the machine.
SYSTEM_PACKAGES = {"prometheus": "/usr/bin/prometheus", "chromium": "/usr/bin/chromium",
                   "chromium-driver": "/usr/bin/chromedriver"}  # fmt: skip


@nox.session(python=False)
def system(session: nox.Session) -> None:
    """Install the Debian packages the tests need (Prometheus, Chromium and its driver) when missing.

    CI starts from a clean machine: the tests that scrape with a real
    Prometheus and drive a real browser must find them, and fail (never
    skip) when CI is set and they are missing. Installs with apt-get, which
    needs root; elsewhere it says what to install and the tests skip.
    """
    missing = [name for name, binary in SYSTEM_PACKAGES.items() if not Path(binary).exists()]
    if not missing:
        session.log(f"found {', '.join(SYSTEM_PACKAGES.values())}")
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        message = f"missing Debian packages {missing}: apt-get install {' '.join(missing)}"
        if os.environ.get("CI"):
            session.error(message)
        session.warn(message + " (the tests that need them skip)")
        return
    environment = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=environment, silent=True)
    session.run("apt-get", "install", "-y", "-q", *missing, external=True, env=environment, silent=True)


# Each Python's suite runs in this many pytest-xdist processes. Most tests
# wait (on subprocesses, fsyncs, a PostgreSQL server), so three processes
# on this 2-core machine took a suite from 10 minutes to 5 (measured: two
# processes 8, four 6); each process starts its own throwaway PostgreSQL.
TEST_PROCESSES = "3"


@nox.session(python=SUPPORTED, requires=["pythons", "system"])
def tests(session: nox.Session) -> None:
    """Run the test suite (pytest + hypothesis) against the installed package, in
    `TEST_PROCESSES` processes (``nox -s tests -- -n 0`` runs it in one)."""
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "test"))
    given = [arg for arg in session.posargs if arg == "-n" or arg.startswith(("-n", "--numprocesses"))]
    processes = [] if given else ["-n", TEST_PROCESSES]
    session.run("pytest", *processes, *session.posargs)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict and pyright strict over src, tests, noxfile.py, docs/build_api.py and benchmarks; the public API fully typed.

    `pyright --verifytypes` checks the installed package, as a user sees it,
    and must find every exported symbol completely typed (it exits 1 below
    100%: checked against a package with one unannotated function).
    """
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "typecheck"))
    session.run("mypy")
    session.run("pyright")
    session.run("pyright", "--verifytypes", "attempt_kernel", "--ignoreexternal")


@nox.session
def dist(session: nox.Session) -> None:
    """Build the sdist and the wheel, `twine check` them, and find py.typed, LICENSE and the alerting rules in the wheel."""
    session.install("build", "twine")
    if session.run("python", "--version", silent=True) is None:
        return  # nox --install-only: nothing runs, so there is nothing to check
    shutil.rmtree("dist", ignore_errors=True)
    session.run("python", "-m", "build")
    files = sorted(glob.glob("dist/*"))
    session.run("twine", "check", "--strict", *files)
    wheels = [f for f in files if f.endswith(".whl")]
    if len(wheels) != 1 or not any(f.endswith(".tar.gz") for f in files):
        session.error(f"expected one sdist and one wheel in dist/, found {files}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        if "attempt_kernel/py.typed" not in names:
            session.error(f"{wheels[0]} has no attempt_kernel/py.typed: type checkers would ignore it")
        if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
            session.error(f"{wheels[0]} has no LICENSE: the MIT license requires its notice to ship")
        if "attempt_kernel/alerts/attempt-kernel.rules.yml" not in names:
            session.error(f"{wheels[0]} has no alerting rules (attempt_kernel/alerts/attempt-kernel.rules.yml)")


@nox.session
def docs(session: nox.Session) -> None:
    """Render the API reference of the public modules into build/api/ with pdoc; any warning fails.

    docs/build_api.py renders `attempt_kernel`, `attempt_kernel.postgres`,
    `attempt_kernel.metrics` and `attempt_kernel.cli`, and exits 1 on any warning pdoc emits or on a
    docstring naming an ``attempt_kernel.`` name that does not exist (checked
    against a copy with a missing ``.. include::`` file and an unknown name).
    tests/test_api_docs.py checks that every public name has a docstring.
    """
    session.install(".", *nox.project.dependency_groups(PYPROJECT, "docs"))
    shutil.rmtree("build/api", ignore_errors=True)
    session.run("python", "docs/build_api.py", "build/api")


@nox.session
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


# Every benchmark, in the order `bench` runs them, with the arguments that
# make it a smoke run: sizes so small that it ends in seconds and its figures
# mean nothing, but every line of it runs.
BENCHMARKS: dict[str, tuple[str, ...]] = {
    "bench_kernel.py": ("--number", "1000", "--repeat", "1"),
    "bench_runlog.py": ("--records", "2000", "--appends", "200"),
    "bench_executor.py": ("--steps", "200"),
    "bench_group_commit.py": ("--runs", "5", "--rounds", "1", "--pairs", "1"),
    "bench_coderun.py": ("--runs", "5", "--chain", "2", "--steps", "100", "--replay-runs", "20", "--recorded", "20"),
    "bench_workers.py": ("--runs", "20", "--samples", "20"),
    "bench_waits.py": ("--runs", "20", "--samples", "2", "--idle", "1"),
    "bench_waits_file.py": ("--samples", "2"),
    "bench_runs_filter.py": ("--runs", "200", "--attempts", "2"),
    "bench_submit.py": ("--samples", "5"),
    "bench_pg_group.py": ("--runs", "10", "--concurrency", "5", "--worker-runs", "20"),
    "bench_metrics.py": ("--runs", "10", "--rounds", "1", "--seconds", "2"),
}


def run_benchmarks(session: nox.Session, smoke: bool) -> None:
    """Each of `BENCHMARKS`, at its own sizes or (``smoke``) at the smoke run's;
    a benchmark in benchmarks/ that `BENCHMARKS` does not name is an error."""
    found = sorted(p.name for p in Path("benchmarks").glob("bench_*.py"))
    unnamed = [name for name in found if name not in BENCHMARKS]
    if unnamed:
        session.error(f"benchmarks/ holds {unnamed}, which BENCHMARKS in noxfile.py does not name")
    session.install(".[postgres,metrics]")
    for script, smoke_args in BENCHMARKS.items():
        session.run("python", f"benchmarks/{script}", *(smoke_args if smoke else ()), silent=smoke)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks: print each cost beside a baseline measured in the same run.

    BENCH_TMP picks the folder for the benchmark logs (default: the system's
    temporary folder); fsync costs depend on the disk under it. The workers'
    benchmark starts a throwaway PostgreSQL of its own (tests/pgserver.py;
    TMPDIR picks the folder of its data).
    """
    run_benchmarks(session, smoke=False)


@nox.session(default=False)
def soak(session: nox.Session) -> None:
    """Many workers on PostgreSQL under chaos (kills, stops past the lease, signals, cancels,
    recover beside them, an operator reconciling), then checks that each effect was sent at
    most once and after its Dispatched, every run ended, and the journal replays valid.

    Not part of the gate: its moments come from a random seed (printed; give
    it again with ``-- --seed N``). Other arguments: ``-- --runs R --seconds S``.
    """
    session.install(".[postgres]")
    session.run("python", "tests/soak.py", *session.posargs)


@nox.session(name="bench-smoke")
def bench_smoke(session: nox.Session) -> None:
    """Every benchmark once, at sizes that take seconds: the gate runs no benchmark
    for its figures, so without this one an API change could break one unseen
    (its figures at these sizes mean nothing; a failing one prints its output)."""
    run_benchmarks(session, smoke=True)
