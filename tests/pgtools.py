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
