"""The import layers of the package, checked: imports flow one way.

Each module of ``src/attempt_kernel`` belongs to one layer, written out by
hand below in the order docs/design.md gives them. A module may import from
its own layer or a lower one, never a higher one; every import counts,
including those inside functions and under ``TYPE_CHECKING``. A new module
must be placed in a layer here (and named in docs/design.md) before the gate
passes, so "imports flow one way" stays a test rather than a claim.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "attempt_kernel"
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"

# Lowest first. Module names are dotted below attempt_kernel.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel", ("_errors", "_version", "_attempt", "_intent", "_table")),
    ("records and codec", ("_records", "_codec", "_context", "_findings", "_workflow")),
    ("stores", ("_store", "_logfile")),
    ("ledger", ("_ledger", "_runlist", "_history", "_outcome", "_operate", "_observe", "_tracing")),
    ("runtime", ("_inbox", "_coderun", "_executor", "_recovery", "_replay", "_resume", "_report", "_demo")),
    ("postgres", ("postgres", "postgres._journal", "postgres._lease", "postgres._pools",
                  "postgres._deliver", "postgres._worker")),
    ("operations and command line", ("_operations", "_metrics", "metrics", "_web", "_web_pages", "_web_timeline",
                                     "cli", "cli._main", "__main__")),
)  # fmt: skip
# The public doorway re-exports from every layer and holds no logic.
DOORWAY = ""

LEVEL = {module: level for level, (_, modules) in enumerate(LAYERS) for module in modules}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(name: str, *, is_package: bool) -> list[str]:
    parts = name.split(".") if name else []
    return parts if is_package else parts[:-1]


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module below attempt_kernel) for every import of the package in one file."""
    return imported_by(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def imported_by(source: str, name: str, *, is_package: bool) -> list[tuple[int, str]]:
    """The imports of the package in `source`, the text of module `name`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(name, is_package=is_package)
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module is not None and node.module.split(".")[0] == "attempt_kernel":
                target = node.module.removeprefix("attempt_kernel").lstrip(".")
            else:
                continue
            if node.module is None or target == "":
                # `from . import x` or `from attempt_kernel import x`: x may be a module
                for alias in node.names:
                    sub = f"{target}.{alias.name}".lstrip(".")
                    found.append((node.lineno, sub if sub in LEVEL else target))
            else:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "attempt_kernel":
                    found.append((node.lineno, alias.name.removeprefix("attempt_kernel").lstrip(".")))
    return found


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_every_module_is_placed_in_exactly_one_layer() -> None:
    names = {module_name(path) for path in sources()} - {DOORWAY}
    placed = [module for _, modules in LAYERS for module in modules]
    assert len(placed) == len(set(placed)), "a module is placed in two layers"
    assert names - set(placed) == set(), "modules not placed in a layer (add them to LAYERS)"
    assert set(placed) - names == set(), "LAYERS names modules that do not exist"


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_flow_one_way(path: Path) -> None:
    name = module_name(path)
    wrong: list[str] = []
    for line, target in imported(path):
        if target == DOORWAY:
            if name != DOORWAY:
                wrong.append(f"line {line}: imports the package's doorway (import the module itself)")
            continue
        assert target in LEVEL, f"{path}:{line}: imports {target!r}, which is not a module of the package"
        if name != DOORWAY and LEVEL[target] > LEVEL[name]:
            wrong.append(
                f"line {line}: {name} ({LAYERS[LEVEL[name]][0]}) imports {target} ({LAYERS[LEVEL[target]][0]})"
            )
    assert wrong == [], f"{path.relative_to(SRC)} imports upward:\n" + "\n".join(wrong)


def test_a_forged_upward_import_is_caught() -> None:
    """The checker itself can fail: imports hidden in a function, written three ways, are found."""
    forged = (
        "def _late() -> None:\n"
        "    from .._executor import Executor\n"
        "    from ..cli import main\n"
        "    import attempt_kernel.postgres._worker\n"
        "    from attempt_kernel import _web\n"
    )
    assert imported_by(forged, "postgres._lease", is_package=False) == [
        (2, "_executor"), (3, "cli"), (4, "postgres._worker"), (5, "_web"),
    ]  # fmt: skip
    assert imported_by(forged.replace("..cli", ".cli"), "_attempt", is_package=False)[1] == (3, "cli")
    assert LEVEL["_executor"] > LEVEL["_attempt"]


def test_design_names_every_layer_and_module() -> None:
    text = DESIGN.read_text()
    for layer, modules in LAYERS:
        assert f"**{layer}**" in text, f"docs/design.md does not name the layer {layer!r}"
        for module in modules:
            shown = module.replace(".", "/")
            assert f"`{shown}`" in text, f"docs/design.md does not name the module `{shown}`"
