"""Read a stream's items after a position, in the stream's order: events by ``seq``, gap
markers between them, a truncation first.

Why this is safe to read with ``seq > position``: the writer makes each stream's rows
visible in ``seq`` order (``EventLog._order_and_notify`` on PostgreSQL; SQLite has one
writer), so once a row is visible every row of its stream with a smaller ``seq`` is too,
and a reader that moved past a ``seq`` can never meet a smaller one later.

Gap markers carry ``(after_seq, mark)``: the stream's newest ``seq`` when the gap opened
(or closed) and the marker's number among the stream's markers; both only grow
(``EventLog._place_gap_markers``). A marker comes after the events up to its
``after_seq`` and before the later ones. The events and the markers are two statements
(two snapshots on PostgreSQL's READ COMMITTED): a marker committed between them has an
``after_seq`` at or past the newest event the first statement saw, so only markers up to
that event are taken now (``bound``), the others with the events they follow.

Functions here take an open SQLAlchemy connection and do no transaction handling: the
caller decides (the exactly-once handler's transaction, or a plain read).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.consume.model import (
    Event,
    Gap,
    GapClosed,
    Item,
    Position,
    Start,
    StartKind,
    Truncated,
)
from durable_sse.db import EVENTS_TABLE, events_table, from_db_time, gaps_table, retention_table
from durable_sse.eventlog import stored_data

_EVENTS_SQL = (
    "SELECT seq, event_id, event_ord, event_type, data, data_bytes, received_at "
    f"FROM {EVENTS_TABLE} WHERE stream = %s AND seq > %s ORDER BY seq LIMIT %s"
)


@dataclass
class Read:
    """What one read found after a position."""

    items: list[Item]
    end: Position
    """The position once these items are consumed."""
    full: bool
    """More items may follow at once (the read stopped at its limit)."""
    newest_received_at: datetime | None = None
    """Receive time of the newest event among the items."""
    oldest_received_at: datetime | None = None


def read_items(connection: Connection, stream: str, position: Position, *, limit: int) -> Read:
    """The first ``limit`` items after ``position``, in the stream's order."""
    items: list[Item] = []
    truncated = position.truncated
    deleted_to = deleted_through(connection, stream)
    if deleted_to is not None and deleted_to > max(position.seq, position.truncated):
        items.append(Truncated(stream=stream, after_seq=position.seq, through_seq=deleted_to))
        truncated = deleted_to
    events = read_events(connection, stream, position.seq, limit)
    bound = events[-1].seq if events else position.seq
    markers, markers_full = read_markers(connection, stream, position.mark, bound, limit)
    end_seq, end_mark = position.seq, position.mark
    i = j = 0
    while len(items) < limit and (i < len(events) or j < len(markers)):
        if j < len(markers) and (i >= len(events) or markers[j].after_seq < events[i].seq):
            marker = markers[j]
            items.append(marker)
            end_mark = marker.mark
            j += 1
        else:
            event = events[i]
            items.append(event)
            end_seq = event.seq
            i += 1
    full = len(events) >= limit or markers_full or i < len(events) or j < len(markers)
    delivered = events[:i]
    return Read(
        items=items,
        end=Position(end_seq, end_mark, truncated),
        full=full,
        newest_received_at=delivered[-1].received_at if delivered else None,
        oldest_received_at=delivered[0].received_at if delivered else None,
    )


def read_events(connection: Connection, stream: str, after: int, limit: int) -> list[Event]:
    """Events after ``seq`` ``after``, by ``seq``, their data exact."""
    if connection.dialect.name == "postgresql":
        # Plain tuples from the driver: a batch is hundreds of rows, and SQLAlchemy's
        # row processing would cost more than the read itself.
        driver = connection.connection.driver_connection
        assert driver is not None
        with driver.cursor() as cursor:
            cursor.execute(_EVENTS_SQL, (stream, after, limit))
            rows: list[Any] = cursor.fetchall()
    else:
        events = events_table
        rows = connection.execute(
            sa.select(
                events.c.seq,
                events.c.event_id,
                events.c.event_ord,
                events.c.event_type,
                events.c.data,
                events.c.data_bytes,
                events.c.received_at,
            )
            .where(events.c.stream == stream, events.c.seq > after)
            .order_by(events.c.seq)
            .limit(limit)
        ).all()
    return [
        Event(
            stream,
            seq,
            event_id,
            event_type,
            data if data_bytes is None else stored_data(data, data_bytes),
            from_db_time(received_at),  # type: ignore[arg-type]
            event_ord,
        )
        for seq, event_id, event_ord, event_type, data, data_bytes, received_at in rows
    ]


def read_markers(
    connection: Connection, stream: str, after_mark: int, bound: int, limit: int
) -> tuple[list[Gap | GapClosed], bool]:
    """Gap markers after ``after_mark`` that come after no event past ``bound``, by mark;
    and whether there may be more (a limit was reached)."""
    gaps = gaps_table
    found: list[Gap | GapClosed] = []
    caps: list[int] = []
    for seq_column, mark_column, opened in (
        (gaps.c.opened_seq, gaps.c.opened_mark, True),
        (gaps.c.closed_seq, gaps.c.closed_mark, False),
    ):
        rows = connection.execute(
            sa.select(gaps)
            .where(gaps.c.stream == stream, mark_column > after_mark, seq_column <= bound)
            .order_by(mark_column)
            .limit(limit)
        ).all()
        found += [_opened(row) if opened else _closed(row) for row in rows]
        if len(rows) >= limit:
            caps.append(rows[-1].opened_mark if opened else rows[-1].closed_mark)
    found.sort(key=lambda marker: marker.mark)
    if caps:
        # A full list may leave out markers numbered below the other list's last ones.
        found = [marker for marker in found if marker.mark <= min(caps)]
    return found, bool(caps)


def _opened(row: Any) -> Gap:
    return Gap(
        stream=row.stream,
        gap_id=row.gap_id,
        kind=row.kind,
        start_id=row.start_id,
        end_id=row.end_id,
        announced=row.announced,
        seen_at=from_db_time(row.seen_at),
        detail=row.detail,
        after_seq=int(row.opened_seq),
        mark=int(row.opened_mark),
    )


def _closed(row: Any) -> GapClosed:
    return GapClosed(
        stream=row.stream,
        gap_id=row.gap_id,
        state=row.state,
        recovered=int(row.recovered),
        missing=row.missing,
        closed_at=from_db_time(row.closed_at),
        after_seq=int(row.closed_seq),
        mark=int(row.closed_mark),
    )


def deleted_through(connection: Connection, stream: str) -> int | None:
    """The newest ``seq`` retention deleted from the stream (None: nothing)."""
    table = retention_table
    return connection.execute(
        sa.select(table.c.deleted_to_seq).where(table.c.stream == stream)
    ).scalar_one_or_none()


def newest_seq(connection: Connection, stream: str) -> int:
    events = events_table
    value = connection.execute(
        sa.select(sa.func.max(events.c.seq)).where(events.c.stream == stream)
    ).scalar_one_or_none()
    return int(value or 0)


def newest_mark(connection: Connection, stream: str, *, up_to_seq: int | None = None) -> int:
    """The newest marker number of the stream (of markers after events up to
    ``up_to_seq``, when given)."""
    gaps = gaps_table
    best = 0
    for seq_column, mark_column in (
        (gaps.c.opened_seq, gaps.c.opened_mark),
        (gaps.c.closed_seq, gaps.c.closed_mark),
    ):
        query = sa.select(sa.func.max(mark_column)).where(gaps.c.stream == stream)
        if up_to_seq is not None:
            query = query.where(seq_column <= up_to_seq)
        value = connection.execute(query).scalar_one_or_none()
        best = max(best, int(value or 0))
    return best


def seq_before(connection: Connection, stream: str, moment: datetime) -> int:
    """The ``seq`` of the newest row received before ``moment`` (0: none): reading after
    it gives every row received at or after ``moment`` (to within a batch, arrival order
    being time order to within a batch). Scans back from the newest row, so a recent
    time is quick."""
    events = events_table
    value = connection.execute(
        sa.select(events.c.seq)
        .where(events.c.stream == stream, events.c.received_at < moment)
        .order_by(events.c.seq.desc())
        .limit(1)
    ).scalar_one_or_none()
    return int(value or 0)


def start_position(connection: Connection, stream: str, start: Start) -> Position:
    """Where a group that has no position in ``stream`` yet starts (see :class:`Start`).

    Truncations up to now are no loss of the group's (the rows went before it existed).
    """
    truncated = deleted_through(connection, stream) or 0
    if start.kind is StartKind.EARLIEST:
        return Position(0, 0, truncated)
    if start.kind is StartKind.LATEST:
        seq = newest_seq(connection, stream)
        return Position(seq, newest_mark(connection, stream), truncated)
    if start.kind is StartKind.SEQ:
        seq = int(start.seq or 0)
    else:
        assert start.time is not None
        seq = seq_before(connection, stream, start.time)
    return Position(seq, newest_mark(connection, stream, up_to_seq=seq), truncated)


def event_row_values(event: Event) -> dict[str, Any]:
    """Columns of ``sse_dead_letters`` for an event (the data split as ``sse_events``
    splits it)."""
    data, data_bytes = event.data, None
    if "\x00" in data:
        data, data_bytes = data.replace("\x00", "\ufffd"), data.encode("utf-8", "surrogatepass")
    return {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "data": data,
        "data_bytes": data_bytes,
        "received_at": event.received_at,
    }
