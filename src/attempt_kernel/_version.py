"""The package's version, read by the build (pyproject's ``[tool.hatch.version]``) and by ``--version``."""

__version__ = "0.2.0"
"""The version of this release; the installed distribution's metadata says the same."""
