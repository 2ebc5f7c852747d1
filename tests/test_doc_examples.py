"""Every Python block in README.md and docs/*.md type-checks as user code.

Each ```python block is written to its own file and checked against the
installed package, as a user of the package would check it, with
`mypy --strict` and with pyright in strict mode. (Whether the blocks run is
tested in test_docs.py.) A deliberately wrong snippet is the negative
control: it proves each checker is really run and really reports.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# Hand-written negative control: a wrong argument to the package (found only
# if the installed package is seen, typed) and an unannotated function (an
# error only in strict mode).
WRONG = """\
from attempt_kernel import Admit, transition

transition("Running", Admit())


def double(x):
    return x * 2
"""

pytestmark = pytest.mark.slow


def _blocks() -> list[tuple[str, str]]:
    """(id, code) for every python block, numbered per document from 1."""
    found: list[tuple[str, str]] = []
    for document in DOCUMENTS:
        for number, code in enumerate(BLOCK.findall(document.read_text()), start=1):
            found.append((f"{document.relative_to(ROOT)}#{number}", code))
    return found


BLOCKS = _blocks()


def _write(folder: Path, name: str, code: str) -> Path:
    """The block as a module in its own folder, so no two blocks share a check."""
    folder.mkdir()
    path = folder / f"{re.sub(r'[^a-z0-9]+', '_', name.lower())}.py"
    path.write_text(code)
    return path


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    """`mypy --strict` on one file, run from its folder so no project config applies."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )


def _pyright(path: Path) -> subprocess.CompletedProcess[str]:
    """pyright in strict mode on one file, against this interpreter's packages."""
    config = {"typeCheckingMode": "strict", "include": [path.name]}
    (path.parent / "pyrightconfig.json").write_text(json.dumps(config))
    return subprocess.run(
        [sys.executable, "-m", "pyright", "--pythonpath", sys.executable, path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_documents_have_python_blocks() -> None:
    """The README and docs/executor.md each hold a python block (the list is not empty)."""
    ids = [name for name, _ in BLOCKS]
    assert "README.md#1" in ids
    assert "docs/executor.md#1" in ids


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_block_passes_mypy_strict(name: str, code: str, tmp_path: Path) -> None:
    """The block has no error under `mypy --strict`."""
    result = _mypy(_write(tmp_path / "block", name, code))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_block_passes_pyright_strict(name: str, code: str, tmp_path: Path) -> None:
    """The block has no error under pyright in strict mode."""
    result = _pyright(_write(tmp_path / "block", name, code))
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_check_fails_on_a_wrong_block(tmp_path: Path) -> None:
    """Negative control: mypy, run the same way, sees the package's types and is strict."""
    result = _mypy(_write(tmp_path / "block", "wrong", WRONG))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[arg-type]" in result.stdout
    assert "[no-untyped-def]" in result.stdout


def test_pyright_check_fails_on_a_wrong_block(tmp_path: Path) -> None:
    """Negative control: pyright, run the same way, sees the package's types and is strict."""
    result = _pyright(_write(tmp_path / "block", "wrong", WRONG))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "reportArgumentType" in result.stdout
    assert "reportMissingParameterType" in result.stdout
