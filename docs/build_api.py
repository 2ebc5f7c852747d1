"""Render the API reference of the public modules with pdoc; exit 1 on any warning pdoc emits.

Run by ``nox -s docs`` (docs/api.md): ``python docs/build_api.py OUTPUT``.

pdoc reads a value's docstring (the string literal right after its
assignment) from the source of the module it documents. The public
modules only re-export, with ``from ._private import NAME as NAME``, so for
the values that cannot carry a ``__doc__`` (type aliases such as
``AttemptState``, constants such as ``MAX_RECORD_BYTES``) this script takes
the docstring from the module that assigns them, as pdoc's maintainers
suggest for re-exported variables. Classes and functions need nothing: pdoc
reads their ``__doc__``.

pdoc warns about what it cannot read (an ``.. include::`` of a missing
file, an annotation it cannot resolve) but renders a reference to a name
that does not exist as plain code. So this script also warns, and fails,
when a rendered docstring names ``attempt_kernel.SOMETHING`` (in backticks)
that cannot be imported or looked up.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path
from typing import Any

PUBLIC_MODULES = ("attempt_kernel", "attempt_kernel.postgres", "attempt_kernel.metrics", "attempt_kernel.cli")
# A qualified reference in a docstring: `attempt_kernel.X.y` or ``attempt_kernel.X.y()``.
REFERENCE = re.compile(r"`+(attempt_kernel(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`+")


def reexported_from(doorway: str) -> dict[str, str]:
    """Each name ``doorway`` binds with ``from .module import name``, mapped to that module's full name."""
    path = importlib.import_module(doorway).__file__
    assert path is not None, doorway
    sources: dict[str, str] = {}
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is not None:
            for alias in node.names:
                sources[alias.asname or alias.name] = f"{doorway}.{node.module}"
    return sources


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute (a dataclass field included) reached from one."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            fields = {**getattr(found, "__dataclass_fields__", {}), **getattr(found, "__annotations__", {})}
            if not hasattr(found, part) and part not in fields:
                return False
            found = getattr(found, part, None)
        return True
    return False


def build(output: Path) -> None:
    """Write the HTML reference of `PUBLIC_MODULES` (and an index and a search index) under ``output``."""
    import pdoc
    import pdoc.doc
    import pdoc.doc_ast

    modules = {name: pdoc.doc.Module.from_name(name) for name in PUBLIC_MODULES}
    for name, module in modules.items():
        sources = reexported_from(name)
        # pdoc's members are dict[str, Doc] with Doc unparametrized: typed here once.
        members: dict[str, pdoc.doc.Doc[Any]] = getattr(module, "members")  # noqa: B009
        for member in members.values():
            if isinstance(member, pdoc.doc.Variable) and not member.docstring and member.name in sources:
                origin = importlib.import_module(sources[member.name])
                member.docstring = pdoc.doc_ast.walk_tree(origin).var_docstrings.get(member.name, "")
    pending: list[pdoc.doc.Doc[Any]] = [*modules.values()]
    seen: set[str] = set()
    while pending:
        doc = pending.pop()
        if doc.fullname in seen:
            continue
        seen.add(doc.fullname)
        for reference in REFERENCE.findall(doc.docstring):
            if not resolves(reference):
                warnings.warn(f"{doc.fullname}: the docstring refers to {reference}, which does not exist")
        if isinstance(doc, (pdoc.doc.Module, pdoc.doc.Class)):
            inner: dict[str, pdoc.doc.Doc[Any]] = getattr(doc, "members")  # noqa: B009
            pending.extend(inner.values())
    # pdoc.pdoc finds the same (cached) Module objects, docstrings filled in.
    pdoc.pdoc(*PUBLIC_MODULES, output_directory=output)


def main(argv: list[str]) -> int:
    """Build the reference into ``argv[0]``; print every warning and return 1 if there was any."""
    if len(argv) != 1:
        print("usage: python docs/build_api.py OUTPUT_DIRECTORY", file=sys.stderr)
        return 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(Path(argv[0]))
    for warning in caught:
        print(f"warning: {warning.filename}:{warning.lineno}: {warning.message}", file=sys.stderr)
    if caught:
        print(f"{len(caught)} warning(s): the API reference must build without any", file=sys.stderr)
        return 1
    print(f"API reference of {', '.join(PUBLIC_MODULES)} written to {argv[0]}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
