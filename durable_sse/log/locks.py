"""The lock that orders a stream's retention deletes with what they must not pass.

Retention's deletes read the fence (the lagging id, the open gaps, the running
connections' starts) and delete before it. A batch that opens a gap and a connection that
registers its start change the fence; taking this lock (shared) orders them with the
deletes (exclusive), so one that appears while a run goes on holds the very next
statement, and one that appears during a statement is written after it, against the
horizon it left (see :mod:`durable_sse.log.prune`).
"""

from __future__ import annotations

import zlib

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.log.schema import retention_table

RETENTION_LOCK = zlib.crc32(b"durable-sse:retention") - 2**31
"""First key of the PostgreSQL advisory lock that retention's deletes take exclusively and
gap openings and connection starts take shared, per stream (the second key is the
stream's; the two-key space is apart from the schema lock's single key)."""


def hold_retention(connection: Connection, stream: str, *, exclusive: bool) -> None:
    """Order this transaction with the stream's retention deletes: the deletes hold it
    ``exclusive``, gap openings and connection starts shared. On SQLite a write statement
    is enough: it takes the one write lock, so every read after it sees the last commit
    and nothing commits meanwhile (a write that matches no row takes it all the same)."""
    if connection.dialect.name == "postgresql":
        function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        key = zlib.crc32(stream.encode("utf-8", "surrogatepass")) - 2**31
        connection.execute(sa.text(f"SELECT {function}(:a, :b)"), {"a": RETENTION_LOCK, "b": key})
    else:
        connection.execute(
            sa.update(retention_table)
            .where(retention_table.c.stream == stream)
            .values(stream=retention_table.c.stream)
        )
