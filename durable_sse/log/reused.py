"""Reused ids: an event whose key is stored under another digest is kept, not dropped.

A server that restarts its id counter sends new events under ids already stored; the
event key ``(stream, event_id, follower_key)`` would take them for re-sent copies and
``ON CONFLICT DO NOTHING`` would drop them. After a group's insert, the rows that met a
stored key are compared by digest (:mod:`durable_sse.log.keys`); those whose digest
differs are stored again under their extended key in the same transaction and counted as
``reused`` (never as duplicates).
"""

from __future__ import annotations

import bisect
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from durable_sse.log.database import driver
from durable_sse.log.rows import DIGEST, EVENT_ID, FOLLOWER_KEY, STREAM, Row, extended_row
from durable_sse.log.schema import EVENTS_TABLE, STAGING_TABLE

_REUSED_STAGED_SQL = (
    f"SELECT s.pos FROM {STAGING_TABLE} s WHERE s.digest IS NOT NULL AND s.follower_key IS NOT "
    f"NULL AND (SELECT e.digest FROM {EVENTS_TABLE} e WHERE e.stream = s.stream AND "
    "e.event_id = s.event_id AND e.follower_key = s.follower_key) <> s.digest ORDER BY s.pos"
)
"""The staged rows whose key is stored under another digest (reused ids): one probe of
the event key per staged row, on the server, and only after a move that met stored keys."""
_STORED_DIGESTS_SQL = (
    f"SELECT event_id, follower_key, digest FROM {EVENTS_TABLE} "
    "WHERE stream = {stream} AND digest IS NOT NULL AND event_id IN ({ids})"
)
_DIGEST_CHUNK = 500
"""Ids one digest lookup names (SQLite binds at most 32,766 values)."""
_EXTENDED_CHUNK = 1000
"""Rows one INSERT of extended keys holds (PostgreSQL binds at most 65,535 values)."""

Inserted = tuple[list[int], list[list[str]] | None]
"""What a group's insert did: each batch's new rows, and its reused ids (None: none)."""


class Inserts(Protocol):
    """The inserts :func:`keep_reused` writes extended keys with."""

    dialect: str

    def insert_values(self, connection: Connection, rows: list[Row], returning: bool) -> Any: ...

    def insert_sqlite(self, connection: Connection, rows: list[Row]) -> int: ...


def keep_reused(
    inserter: Inserts,
    connection: Connection,
    rows: list[Row],
    spans: list[tuple[int, int]],
    counts: list[int],
    *,
    staged: bool = False,
) -> list[list[str]] | None:
    """After the insert: store the events whose key was already stored under another
    digest (a reused id, see :mod:`durable_sse.log.keys`) under their extended keys,
    in the same transaction, and add them to ``counts``.

    Returns each batch's reused ids (carriers kept under an extended key), or None
    when no batch met a stored key (the live case: nothing is looked up) or none of
    the keys met was a reused one. A row inserted by this very statement reads back
    its own digest, so only keys met (stored before, or earlier in the group) can
    differ. Extended keys are inserted ``ON CONFLICT DO NOTHING`` too: a reused event
    re-sent is a duplicate. They go in after the group's other rows, so their ``seq``
    follows those rows of the same transaction.
    """
    met = [index for index, (start, end) in enumerate(spans) if counts[index] < end - start]
    if not met:
        return None
    if staged:
        reused = _reused_staged(connection, rows)
    else:
        reused = _reused_looked_up(inserter.dialect, connection, rows, spans, met)
    if not reused:
        return None
    extended = [extended_row(rows[index]) for index in reused]
    if inserter.dialect == "postgresql":
        inserted: set[tuple[str, str, bytes]] = set()
        for start in range(0, len(extended), _EXTENDED_CHUNK):
            part = extended[start : start + _EXTENDED_CHUNK]
            returned = inserter.insert_values(connection, part, True)
            inserted.update((stream, event_id, bytes(key)) for stream, event_id, key in returned)
        kept = []
        for row in extended:
            key = (row[1], row[2], row[4])
            kept.append(key in inserted)
            inserted.discard(key)  # a key repeated in the group went in from its first row
    else:
        kept = [inserter.insert_sqlite(connection, [row]) == 1 for row in extended]
    starts = [start for start, _ in spans]
    ids: list[list[str]] = [[] for _ in spans]
    for index, row, new in zip(reused, extended, kept, strict=True):
        if not new:
            continue
        batch = bisect.bisect_right(starts, index) - 1
        counts[batch] += 1
        if row[3] == 0:
            ids[batch].append(row[2])
    return ids


def _reused_staged(connection: Connection, rows: list[Row]) -> list[int]:
    """Indexes in ``rows`` of the staged rows whose key is stored under another digest."""
    with driver(connection).cursor() as cursor:
        cursor.execute(_REUSED_STAGED_SQL)
        positions = [pos for (pos,) in cursor.fetchall()]
    if not positions:
        return []
    index_of = {row[0]: index for index, row in enumerate(rows)}
    return [index_of[pos] for pos in positions]


def _reused_looked_up(
    dialect: str,
    connection: Connection,
    rows: list[Row],
    spans: list[tuple[int, int]],
    met: list[int],
) -> list[int]:
    """Indexes in ``rows`` (of the batches in ``met``) whose key is stored under
    another digest: the stored digests of their ids, looked up by the event key."""
    candidates = [
        index
        for batch in met
        for index in range(*spans[batch])
        if rows[index][DIGEST] is not None and rows[index][FOLLOWER_KEY] is not None
    ]
    by_stream: dict[str, set[str]] = {}
    for index in candidates:
        by_stream.setdefault(rows[index][STREAM], set()).add(rows[index][EVENT_ID])
    stored: dict[tuple[str, str, bytes], bytes] = {}
    for stream, names in by_stream.items():
        ordered = sorted(names)
        for start in range(0, len(ordered), _DIGEST_CHUNK):
            chunk = ordered[start : start + _DIGEST_CHUNK]
            if dialect == "postgresql":
                sql = _STORED_DIGESTS_SQL.format(stream="%s", ids=", ".join(["%s"] * len(chunk)))
                with driver(connection).cursor() as cursor:
                    cursor.execute(sql, [stream, *chunk])
                    found = cursor.fetchall()
            else:
                sql = _STORED_DIGESTS_SQL.format(stream="?", ids=", ".join(["?"] * len(chunk)))
                found = connection.exec_driver_sql(sql, (stream, *chunk)).all()
            for event_id, key, digest in found:
                stored[(stream, event_id, bytes(key))] = bytes(digest)
    reused = []
    for index in candidates:
        row = rows[index]
        digest = stored.get((row[STREAM], row[EVENT_ID], row[FOLLOWER_KEY]))
        if digest is not None and digest != row[DIGEST]:
            reused.append(index)
    return reused
