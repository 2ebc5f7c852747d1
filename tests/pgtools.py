"""Helpers of the PostgreSQL tests: one statement run outside the journal under test."""

from __future__ import annotations

import psycopg
from psycopg import sql
from typing_extensions import LiteralString


def sql_in(url: str, schema: str, statement: LiteralString, *params: object) -> list[tuple[object, ...]]:
    """Run one statement (``{s}`` is the schema) on a connection of its own; return its rows."""
    query = sql.SQL(statement).format(s=sql.Identifier(schema))
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params or None)
        return cursor.fetchall() if cursor.description is not None else []


def expire_heartbeats(url: str, schema: str, worker: str | None = None) -> list[str]:
    """Age the last heartbeat of every live worker (or of ``worker`` only) by an hour; their ids, sorted.

    Another worker judges a heartbeat by the database's clock
    (``heartbeat_at`` against ``now()``), so the next one that looks finds
    these dead whatever its ``dead_after``: a takeover that happens because
    the test says so, not because the machine was fast or slow. Call it once
    those workers are killed or frozen (a running one would beat again).
    """
    rows = sql_in(
        url,
        schema,
        "UPDATE {s}.workers SET heartbeat_at = heartbeat_at - interval '1 hour'"
        " WHERE NOT dead AND (%s::text IS NULL OR id = %s) RETURNING id",
        worker,
        worker,
    )
    return sorted(str(id_) for (id_,) in rows)
