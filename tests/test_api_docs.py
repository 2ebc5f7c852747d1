"""Every public name carries a docstring of its own, so the API reference (`nox -s docs`) has no blanks.

The names are those of the three public modules' ``__all__``. A class,
function or method must have its own ``__doc__``: not one inherited from a
base, and not the signature a dataclass or named tuple writes when the
class has none. A value that cannot carry a docstring at run time (a type
alias such as ``AttemptState``, a constant such as ``MAX_RECORD_BYTES``) is
documented the way pdoc reads it: a string literal right after the
assignment in the module that defines it, which this test finds in the
source (and docs/build_api.py copies onto the public module's page).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

PUBLIC_MODULES = ("attempt_kernel", "attempt_kernel.postgres", "attempt_kernel.metrics", "attempt_kernel.cli")
# What the standard library writes into __doc__ when a class has none.
ENUM_DEFAULT_DOC = "An enumeration."


def _public() -> Iterator[tuple[str, str]]:
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        names: list[str] = module.__all__
        for name in names:
            yield module_name, name


def _defining_module(doorway: str, name: str) -> str:
    """The private module ``doorway`` imports ``name`` from, read from the doorway's source."""
    source = Path(importlib.import_module(doorway).__file__ or "").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is not None:
            if any((alias.asname or alias.name) == name for alias in node.names):
                return f"{doorway}.{node.module}"
    raise AssertionError(f"{doorway} binds {name} by no `from .module import {name}`")


def _assigned_docstring(source: str, name: str) -> str | None:
    """The string literal right after the module-level assignment of ``name`` in ``source``.

    ``""`` when nothing follows the assignment, None when ``source`` assigns no ``name``.
    """
    body = ast.parse(source).body
    for node, following in zip(body, [*body[1:], None]):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            return following.value.value.strip()
        return ""
    return None


def _generated_doc(cls: type, doc: str) -> bool:
    """Whether ``doc`` is what dataclasses, named tuples or enums write for a class without one."""
    return doc == ENUM_DEFAULT_DOC or re.fullmatch(rf"{re.escape(cls.__name__)}\(.*\)", doc, re.DOTALL) is not None


def _own_class_doc(cls: type) -> str:
    doc = vars(cls).get("__doc__")
    if not isinstance(doc, str) or _generated_doc(cls, doc.strip()):
        return ""
    return doc.strip()


def _undocumented_members(cls: type) -> list[str]:
    """Public methods and properties of ``cls`` and of its bases in this package that have no docstring."""
    missing: list[str] = []
    seen: set[str] = set()
    for owner in cls.__mro__:
        if not owner.__module__.startswith("attempt_kernel"):
            continue
        for member, value in vars(owner).items():
            if member.startswith("_") or member in seen:
                continue
            seen.add(member)
            # A property's __doc__ is its getter's; a staticmethod's or classmethod's its function's.
            if not isinstance(value, (types.FunctionType, property, staticmethod, classmethod)):
                continue  # a field, an enum member, a constant: not a method
            if not (value.__doc__ or "").strip():
                missing.append(f"{owner.__qualname__}.{member}")
    return missing


@pytest.mark.source
@pytest.mark.parametrize(("module_name", "name"), list(_public()))
def test_public_name_has_a_docstring_of_its_own(module_name: str, name: str) -> None:
    """A public name has a docstring: its own ``__doc__``, or a string literal after its assignment."""
    value: object = getattr(importlib.import_module(module_name), name)
    # On Python 3.10 an alias such as Callable[[str], X] passes isinstance(_, type).
    alias = isinstance(value, types.GenericAlias)
    if isinstance(value, type) and not alias:
        assert _own_class_doc(value), f"{module_name}.{name}: the class has no docstring of its own"
        missing = _undocumented_members(value)
        assert not missing, f"{module_name}.{name}: no docstring on {', '.join(missing)}"
    elif inspect.isfunction(value):
        assert (value.__doc__ or "").strip(), f"{module_name}.{name}: the function has no docstring"
    else:
        where = _defining_module(module_name, name)
        source = Path(importlib.import_module(where).__file__ or "").read_text()
        docstring = _assigned_docstring(source, name)
        assert docstring is not None, f"{module_name}.{name}: {where} assigns no {name} at module level"
        assert docstring, f"{module_name}.{name}: no string literal right after `{name} = ...` in {where}"


@pytest.mark.source
def test_a_class_without_a_docstring_is_caught() -> None:
    """The checks see through what Python writes itself: a dataclass's signature, an enum's default."""

    @dataclasses.dataclass
    class Bare:
        size: int

        def grow(self) -> None:
            pass

        def shrink(self) -> None:
            """Documented, so not reported."""

        @staticmethod
        def unit() -> int:
            return 1

        @property
        def area(self) -> int:
            return self.size

    class Colour(enum.Enum):
        RED = 1

    assert (Bare.__doc__ or "").startswith("Bare(size: ")  # what dataclasses wrote
    assert _own_class_doc(Bare) == ""
    assert _own_class_doc(Colour) == ""
    assert _undocumented_members(Bare) == []  # defined outside the package: not looked at
    Bare.__module__ = "attempt_kernel._scratch"
    where = "test_a_class_without_a_docstring_is_caught.<locals>.Bare"
    assert _undocumented_members(Bare) == [f"{where}.grow", f"{where}.unit", f"{where}.area"]


@pytest.mark.source
def test_an_alias_without_a_string_after_it_is_caught() -> None:
    """The source check finds the string right after the assignment, and nothing further away."""
    source = (
        "from typing import Union\n"
        "Documented = Union[int, str]\n"
        '"""An int or a str."""\n'
        "Annotated: int = 3\n"
        '"""Three."""\n'
        "Bare = Union[int, str]\n"
        "x = 1\n"
        '"""Not about Bare."""\n'
    )
    assert _assigned_docstring(source, "Documented") == "An int or a str."
    assert _assigned_docstring(source, "Annotated") == "Three."
    assert _assigned_docstring(source, "Bare") == ""
    assert _assigned_docstring(source, "Missing") is None
