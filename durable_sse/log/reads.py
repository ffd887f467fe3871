"""Reading the event log: the floor, a stream's events, the keys a replay may skip.

:class:`Reads` answers on its own transactions; the functions below answer inside a
transaction another job holds (a connection's start, a checkpoint move, a retention
statement), so what they read is consistent with what that job writes.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.ids import IdOrder, sort_key
from durable_sse.log.database import Database, driver
from durable_sse.log.records import StoredEvent, StoredPage, from_db_time, to_utc
from durable_sse.log.rows import stored_data
from durable_sse.log.schema import EVENTS_TABLE, events_table

_STORED_KEYS_SQL = (
    f"SELECT event_id, follower_key, digest FROM {EVENTS_TABLE} "
    "WHERE stream = %s AND id_key IS NOT NULL AND {after} ORDER BY id_key LIMIT %s"
)


class Reads:
    """Reads of ``sse_events`` that need no other job's transaction."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def floor(self, stream: str) -> str | None:
        """The newest persisted id under the stream's id order (max ``id_key``, not max seq)."""
        return await self._database.run(
            f"read the floor of stream {stream!r}", self._newest_sync, stream
        )

    async def newest_id_at_or_before(self, stream: str, when: datetime) -> str | None:
        """The newest id (under the id order) among events received at or before ``when``."""
        return await self._database.run(
            f"find the newest id of stream {stream!r} before {when.isoformat()}",
            self._newest_sync,
            stream,
            to_utc(when),
        )

    async def events(
        self, stream: str, *, after_seq: int | None = None, limit: int = 1000
    ) -> list[StoredEvent]:
        """A stream's stored events in arrival (``seq``) order, after ``after_seq``, with
        their exact data (``data_bytes`` where ``data`` could not hold it)."""
        return await self._database.run(
            f"read the events of stream {stream!r}",
            self._events_sync,
            stream,
            after_seq,
            limit,
        )

    async def stored_keys(
        self, stream: str, id_order: str, *, after: str | None, limit: int
    ) -> StoredPage:
        """The keys of the first ``limit`` stored rows after ``after`` in id order, in one
        indexed query (``(stream, id_key)``): what a replay need not write again
        (:mod:`durable_sse.reader.stored`)."""
        return await self._database.run(
            f"read the stored keys of stream {stream!r}",
            self._stored_keys_sync,
            stream,
            IdOrder(id_order),
            after,
            limit,
        )

    def _newest_sync(self, stream: str, when: datetime | None = None) -> str | None:
        query = newest_row(stream, events_table.c.event_id)
        if when is not None:
            query = query.where(events_table.c.received_at <= when)
        with self._database.begin() as connection:
            return connection.execute(query).scalar_one_or_none()

    def _events_sync(self, stream: str, after_seq: int | None, limit: int) -> list[StoredEvent]:
        events = events_table
        query = (
            sa.select(
                events.c.seq,
                events.c.event_id,
                events.c.event_ord,
                events.c.event_type,
                events.c.data,
                events.c.data_bytes,
                events.c.received_at,
            )
            .where(events.c.stream == stream)
            .order_by(events.c.seq)
            .limit(limit)
        )
        if after_seq is not None:
            query = query.where(events.c.seq > after_seq)
        with self._database.begin() as connection:
            rows = connection.execute(query).all()
        return [
            StoredEvent(
                seq=row.seq,
                event_id=row.event_id,
                event_ord=row.event_ord,
                event_type=row.event_type,
                data=stored_data(row.data, row.data_bytes),
                received_at=from_db_time(row.received_at) or row.received_at,
            )
            for row in rows
        ]

    def _stored_keys_sync(
        self, stream: str, order: IdOrder, after: str | None, limit: int
    ) -> StoredPage:
        after_key = None if after is None else sort_key(after, order)
        with self._database.begin() as connection:
            if self._database.dialect == "postgresql":
                # Plain tuples straight from the driver (a page is thousands of rows), and
                # the index's order: with no statistics yet (a young table) PostgreSQL
                # would read every row after the key and sort them, 50 times slower.
                with driver(connection).cursor() as cursor:
                    cursor.execute("SET LOCAL enable_sort = off")
                    if after_key is None:
                        cursor.execute(_STORED_KEYS_SQL.format(after="TRUE"), (stream, limit))
                    else:
                        cursor.execute(
                            _STORED_KEYS_SQL.format(after="id_key > %s"),
                            (stream, after_key, limit),
                        )
                    rows: list[Any] = cursor.fetchall()
            else:
                events = events_table
                query = (
                    sa.select(events.c.event_id, events.c.follower_key, events.c.digest)
                    .where(events.c.stream == stream, events.c.id_key.is_not(None))
                    .order_by(events.c.id_key)
                    .limit(limit)
                )
                if after_key is not None:
                    query = query.where(events.c.id_key > after_key)
                rows = [tuple(row) for row in connection.execute(query)]
        return StoredPage(
            keys=[(row[0], row[1]) for row in rows],
            full=len(rows) >= limit,
            digests=[row[2] for row in rows],
        )


def newest_row(stream: str, column: sa.Column[Any]) -> sa.Select[Any]:
    """``column`` of the stream's newest stored row that carries an id (the floor)."""
    events = events_table
    return (
        sa.select(column)
        .where(events.c.stream == stream, events.c.id_key.is_not(None))
        .order_by(events.c.id_key.desc())
        .limit(1)
    )


def floor_in(connection: Connection, stream: str) -> str | None:
    """The floor, read in the caller's transaction."""
    return connection.execute(newest_row(stream, events_table.c.event_id)).scalar_one_or_none()


def settled_id(connection: Connection, stream: str, *, ids: int, seconds: float) -> str | None:
    """The newest stored id with at least ``ids`` stored ids after it and received at
    least ``seconds`` before the floor: what the connection that stored the floor had
    read on past by then, with no drop signal (see ``gaps.tracker.CONFIRM_IDS``)."""
    events = events_table
    floor = connection.execute(newest_row(stream, events.c.received_at)).scalar_one_or_none()
    if floor is None:
        return None
    before = connection.execute(
        newest_row(stream, events.c.id_key).offset(ids)
    ).scalar_one_or_none()
    if before is None:
        return None
    cutoff = to_utc(floor) - timedelta(seconds=seconds)
    return connection.execute(
        sa.select(events.c.event_id)
        .where(
            events.c.stream == stream,
            events.c.id_key.is_not(None),
            events.c.id_key <= before,
            events.c.received_at <= cutoff,
        )
        .order_by(events.c.id_key.desc())
        .limit(1)
    ).scalar_one_or_none()


def has_rows(connection: Connection, stream: str) -> bool:
    """Whether the stream has stored any row at all (with an id or without)."""
    events = events_table
    row = connection.execute(
        sa.select(events.c.seq).where(events.c.stream == stream).limit(1)
    ).first()
    return row is not None


def oldest_id(connection: Connection, stream: str) -> str | None:
    """The oldest stored id under the stream's id order."""
    events = events_table
    return connection.execute(
        sa.select(events.c.event_id)
        .where(events.c.stream == stream, events.c.id_key.is_not(None))
        .order_by(events.c.id_key.asc())
        .limit(1)
    ).scalar_one_or_none()


def neighbour(
    connection: Connection, stream: str, order: IdOrder, event_id: str, *, older: bool
) -> str | None:
    """The stored id just before (``older``) or just after ``event_id``."""
    events, key = events_table, sort_key(event_id, order)
    condition = events.c.id_key < key if older else events.c.id_key > key
    ordering = events.c.id_key.desc() if older else events.c.id_key.asc()
    return connection.execute(
        sa.select(events.c.event_id)
        .where(events.c.stream == stream, events.c.id_key.is_not(None), condition)
        .order_by(ordering)
        .limit(1)
    ).scalar_one_or_none()


def received_at(connection: Connection, stream: str, event_id: str) -> Any:
    """When the row carrying ``event_id`` was received (as the driver returns it)."""
    events = events_table
    return connection.execute(
        sa.select(events.c.received_at)
        .where(events.c.stream == stream, events.c.event_id == event_id)
        .order_by(events.c.event_ord)
        .limit(1)
    ).scalar_one_or_none()
