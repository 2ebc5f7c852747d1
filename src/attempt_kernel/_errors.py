"""The root of the library's error family; every error it raises derives here."""

from __future__ import annotations


class AttemptKernelError(Exception):
    """Base class of every error attempt-kernel raises on purpose."""
