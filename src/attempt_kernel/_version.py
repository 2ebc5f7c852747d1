"""The package's version, read by the build (pyproject's ``[tool.hatch.version]``) and by ``--version``."""

__version__ = "0.2.0"
