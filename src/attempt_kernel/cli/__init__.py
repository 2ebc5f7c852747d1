"""The ``attempt-kernel`` command line: ``main`` is its entry point.

Everything the commands do goes through the library's public API and its
operations module; this package only parses arguments and prints results
(text, or JSON with ``--json``). ``python -m attempt_kernel`` runs the same
``main``.
"""

from __future__ import annotations

from ._main import main as main

__all__ = ["main"]
