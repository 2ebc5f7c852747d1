"""Shared test configuration: a fixed-seed hypothesis profile when CI is set,
and the throwaway PostgreSQL server the journal tests run against."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings
from pgserver import SEARCHED, ThrowawayServer, find_server_bin

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The URL of a real PostgreSQL started for this session, stopped and removed after it.

    Without server binaries the PostgreSQL tests are skipped, except when CI
    is set: there they must run (issue 9), so a missing server fails them.
    """
    bindir = find_server_bin()
    if bindir is None:
        reason = (
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in"
            f" {' or '.join(SEARCHED)}; install postgresql (Debian: apt-get install postgresql-15)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so the PostgreSQL tests must run: {reason}", pytrace=False)
        pytest.skip(reason)
    server = ThrowawayServer(bindir)
    try:
        yield server.start()
    finally:
        server.stop()
