"""The exhaustiveness claim, tested: mypy rejects an unhandled state or cause.

These tests copy the package and the project's mypy.ini into a temporary
folder, add an eighth state (or a seventh cause) to the copy, and run mypy
there. They also check the source itself for wildcard ``case`` arms.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.source

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "attempt_kernel"
KERNEL = "_attempt.py"

SIXTH_INTENT_STATE = '''

@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Expired:
    """A sixth intent state that no match handles."""
'''
EIGHTH_STATE = '''

@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Paused:
    """An eighth state that no match handles."""
'''
SEVENTH_CAUSE = '''

@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """A seventh cause that no match handles."""
'''


def _copy_package(tmp: Path, module: str = KERNEL) -> Path:
    shutil.copytree(SRC, tmp / "src" / "attempt_kernel")
    shutil.copy(ROOT / "mypy.ini", tmp / "mypy.ini")
    return tmp / "src" / "attempt_kernel" / module


def _mypy(cwd: Path) -> subprocess.CompletedProcess[str]:
    # The project's own config, but only the package (tests import the real one).
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "src"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _function_span(path: Path, name: str) -> range:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            assert node.end_lineno is not None
            return range(node.lineno, node.end_lineno + 1)
    raise AssertionError(f"{name} not found in {path}")


def _error_lines(output: str, path_suffix: str) -> list[int]:
    pattern = re.compile(rf"{re.escape(path_suffix)}:(\d+): error:")
    return [int(m.group(1)) for m in pattern.finditer(output)]


def _add_member(kernel: Path, union: str, new_class: str, new_name: str) -> None:
    text = kernel.read_text()
    anchor = f"{union}: TypeAlias = Union["
    assert anchor in text
    text = text.replace(anchor, new_class + "\n\n" + anchor + f"\n    {new_name},", 1)
    kernel.write_text(text)


@pytest.mark.slow
def test_unmodified_copy_passes_mypy(tmp_path: Path) -> None:
    """The control: the package as it is type-checks cleanly under mypy.ini."""
    _copy_package(tmp_path)
    result = _mypy(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


@pytest.mark.slow
def test_eighth_state_fails_mypy_in_transition(tmp_path: Path) -> None:
    """Adding a state to AttemptState is a type error at transition's state match."""
    kernel = _copy_package(tmp_path)
    _add_member(kernel, "AttemptState", EIGHTH_STATE, "Paused")
    result = _mypy(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = _error_lines(result.stdout, f"{KERNEL}")
    assert set(lines) & set(_function_span(kernel, "transition")), result.stdout
    assert '"Paused"' in result.stdout
    assert set(lines) & set(_function_span(kernel, "is_terminal")), result.stdout


@pytest.mark.slow
def test_seventh_cause_fails_mypy_in_transition(tmp_path: Path) -> None:
    """Adding a cause to TransitionCause is a type error at transition's cause matches."""
    kernel = _copy_package(tmp_path)
    _add_member(kernel, "TransitionCause", SEVENTH_CAUSE, "Pause")
    result = _mypy(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    span = set(_function_span(kernel, "transition"))
    in_transition = [n for n in _error_lines(result.stdout, KERNEL) if n in span]
    # one error per nested cause match: the Pending arm and the Running arm
    assert len(in_transition) >= 2, result.stdout
    assert '"Pause"' in result.stdout


@pytest.mark.slow
def test_sixth_intent_state_fails_mypy_in_intent_transition(tmp_path: Path) -> None:
    """Adding a state to IntentState is a type error at intent_transition and the codec."""
    module = _copy_package(tmp_path, "_intent.py")
    _add_member(module, "IntentState", SIXTH_INTENT_STATE, "Expired")
    result = _mypy(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = set(_error_lines(result.stdout, "_intent.py"))
    assert lines & set(_function_span(module, "intent_transition")), result.stdout
    codec = tmp_path / "src" / "attempt_kernel" / "_codec.py"
    codec_lines = set(_error_lines(result.stdout, "_codec.py"))
    assert codec_lines & set(_function_span(codec, "intent_state_name")), result.stdout


@pytest.mark.slow
def test_eighth_state_also_breaks_the_codec(tmp_path: Path) -> None:
    """The run-log encoder of attempt states is exhaustive too."""
    kernel = _copy_package(tmp_path)
    _add_member(kernel, "AttemptState", EIGHTH_STATE, "Paused")
    result = _mypy(tmp_path)
    codec = tmp_path / "src" / "attempt_kernel" / "_codec.py"
    codec_lines = set(_error_lines(result.stdout, "_codec.py"))
    assert codec_lines & set(_function_span(codec, "state_name")), result.stdout


LEDGER_RULES = ("counts_as_try", "needs_reconciliation", "may_run_again", "has_succeeded")


@pytest.mark.slow
def test_eighth_state_fails_mypy_in_every_ledger_rule(tmp_path: Path) -> None:
    """The derived rules of the ledger (docs/design.md, "The ledger") are exhaustive too: each one fails."""
    kernel = _copy_package(tmp_path)
    _add_member(kernel, "AttemptState", EIGHTH_STATE, "Paused")
    result = _mypy(tmp_path)
    ledger = tmp_path / "src" / "attempt_kernel" / "_ledger.py"
    lines = set(_error_lines(result.stdout, "_ledger.py"))
    for rule in LEDGER_RULES:
        assert lines & set(_function_span(ledger, rule)), (rule, result.stdout)


def _pyright(cwd: Path) -> subprocess.CompletedProcess[str]:
    # Strict, on the copied package only, with the project's Python floor.
    (cwd / "pyrightconfig.json").write_text(
        '{"include": ["src"], "typeCheckingMode": "strict", "pythonVersion": "3.10"}'
    )
    return subprocess.run(
        [sys.executable, "-m", "pyright", "--pythonpath", sys.executable],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_unmodified_copy_passes_pyright(tmp_path: Path) -> None:
    """The control: the package as it is has no pyright strict error."""
    _copy_package(tmp_path)
    result = _pyright(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors" in result.stdout


@pytest.mark.slow
def test_eighth_state_fails_pyright_in_the_kernel_and_every_ledger_rule(tmp_path: Path) -> None:
    """pyright strict, like mypy, reports the unhandled state at each match."""
    kernel = _copy_package(tmp_path)
    _add_member(kernel, "AttemptState", EIGHTH_STATE, "Paused")
    result = _pyright(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    pattern = re.compile(r"(_\w+\.py):(\d+):\d+ - error")
    found = [(m.group(1), int(m.group(2))) for m in pattern.finditer(result.stdout)]
    in_kernel = {n for f, n in found if f == KERNEL}
    assert in_kernel & set(_function_span(kernel, "transition")), result.stdout
    ledger = tmp_path / "src" / "attempt_kernel" / "_ledger.py"
    in_ledger = {n for f, n in found if f == "_ledger.py"}
    for rule in LEDGER_RULES:
        assert in_ledger & set(_function_span(ledger, rule)), (rule, result.stdout)


# ---------------------------------------------------------------- structure


def wildcard_violations(source: str, filename: str = "<src>") -> list[str]:
    """Every match arm that is irrefutable but is not a final assert_never(subject)."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Match):
            continue
        subject = ast.unparse(node.subject)
        for index, case in enumerate(node.cases):
            pattern = case.pattern
            irrefutable = isinstance(pattern, ast.MatchAs) and pattern.pattern is None
            if not irrefutable and index < len(node.cases) - 1:
                continue
            where = f"{filename}:{case.pattern.lineno}"
            if not irrefutable:
                problems.append(f"{where}: match on {subject} does not end in case _")
                continue
            ok = (
                index == len(node.cases) - 1
                and isinstance(pattern, ast.MatchAs)
                and pattern.name is None
                and case.guard is None
                and len(case.body) == 1
                and ast.unparse(case.body[0]) == f"assert_never({subject})"
            )
            if not ok:
                problems.append(f"{where}: wildcard arm other than assert_never({subject})")
    return problems


def test_no_wildcard_in_src_other_than_assert_never() -> None:
    """Every match in src/ ends in `case _: assert_never(subject)` and has no other."""
    sources = sorted(SRC.rglob("*.py"))
    matches = 0
    problems: list[str] = []
    for path in sources:
        text = path.read_text()
        matches += text.count("match ")
        problems += wildcard_violations(text, path.name)
    assert matches > 0
    assert problems == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("match s:\n case A(): pass\n case _: return 1\n", "wildcard arm other than"),
        ("match s:\n case _: assert_never(s)\n case A(): pass\n", "wildcard arm other than"),
        ("match s:\n case A(): pass\n case other: assert_never(other)\n", "wildcard arm"),
        ("match s:\n case A(): pass\n case _: assert_never(t)\n", "wildcard arm"),
        ("match s:\n case A(): pass\n case B(): pass\n", "does not end in case _"),
    ],
)
def test_wildcard_checker_catches_each_bad_shape(source: str, expected: str) -> None:
    """The structural check is not vacuous: each bad shape is reported."""
    problems = wildcard_violations(source)
    assert problems and expected in problems[0], problems


def test_wildcard_checker_accepts_the_good_shape() -> None:
    """`case _: assert_never(s)` as the last arm is accepted."""
    source = "match s:\n case A(): pass\n case _: assert_never(s)\n"
    assert wildcard_violations(source) == []
