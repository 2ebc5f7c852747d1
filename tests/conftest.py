"""Shared test configuration: a fixed-seed hypothesis profile when CI is set,
the throwaway PostgreSQL server the journal tests run against, and the
fixtures they share (a schema or a database of their own, the fake
downstream service's call book)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from pgserver import SEARCHED, ThrowawayServer, find_server_bin
from psycopg import sql

# A shell starts a background job with SIGINT ignored (`nox &`, `nohup`), and a
# command the tests start would inherit that and ignore the SIGINT a test sends
# it. A handler of our own is reset to the default in every child (an ignored
# signal is not): so SIGINT reaches them as it does from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The URL of a real PostgreSQL started for this session, stopped and removed after it.

    Without server binaries the PostgreSQL tests are skipped, except when CI
    is set: there they must run (the gate never skips them), so a missing server fails them.
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


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema name for one test; dropped with its tables after it."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def db(pg_url: str) -> Iterator[str]:
    """The URL of a fresh database on the session's server, dropped afterwards
    (the command line knows only the default schema)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, _ = pg_url.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def downstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake downstream service's call book, for this process and its workers."""
    path = tmp_path / "downstream.txt"
    monkeypatch.setenv("DOWNSTREAM", str(path))
    return path
