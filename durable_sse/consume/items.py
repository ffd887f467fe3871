"""Read a stream's items after a position, in the stream's order: events by ``seq``, gap
markers between them, a truncation first.

Why this is safe to read with ``seq > position``: the writer makes each stream's rows
visible in ``seq`` order (``Writer._order_and_notify`` on PostgreSQL; SQLite has one
writer), so once a row is visible every row of its stream with a smaller ``seq`` is too,
and a reader that moved past a ``seq`` can never meet a smaller one later.

Gap markers carry ``(after_seq, mark)``: the stream's newest ``seq`` when the gap opened
(or closed) and the marker's number among the stream's markers; both only grow
(``GapStore._place_gap_markers``). A marker comes after the events up to its
``after_seq`` and before the later ones. The events and the markers are two statements
(two snapshots on PostgreSQL's READ COMMITTED): a marker committed between them has an
``after_seq`` at or past the newest event the first statement saw, so only markers up to
that event are taken now (``bound``), the others with the events they follow.

Functions here take an open SQLAlchemy connection and do no transaction handling: the
caller decides (the exactly-once handler's transaction, or a plain read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
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
from durable_sse.log.rows import stored_data
from durable_sse.log.schema import (
    EVENTS_TABLE,
    GAPS_TABLE,
    RETENTION_TABLE,
    events_table,
    gaps_table,
    retention_table,
)

_EVENTS_SQL = (
    "SELECT seq, event_id, event_ord, event_type, data, data_bytes, received_at "
    f"FROM {EVENTS_TABLE} WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?"
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
    events = read_events(connection, stream, position.seq, limit)
    bound = events[-1].seq if events else position.seq
    markers, markers_full, deleted_to = read_markers(
        connection, stream, position.mark, bound, limit
    )
    return merge_items(
        stream,
        position,
        events,
        markers,
        markers_full=markers_full,
        deleted_to=deleted_to,
        limit=limit,
    )


def merge_items(
    stream: str,
    position: Position,
    events: list[Event],
    markers: list[Gap | GapClosed],
    *,
    markers_full: bool,
    deleted_to: int | None,
    limit: int,
) -> Read:
    """The items after ``position``: a truncation first, then the events (by ``seq``, as
    read after ``position.seq``) and the markers (by mark, those after no event past the
    last one read) merged, a marker before the first event past its ``after_seq``.

    Pure: the simulation suite (``tests/sim``) feeds it its store's rows.
    """
    items: list[Item] = []
    truncated = position.truncated
    if deleted_to is not None and deleted_to > max(position.seq, position.truncated):
        items.append(Truncated(stream=stream, after_seq=position.seq, through_seq=deleted_to))
        truncated = deleted_to
    end_seq, end_mark = position.seq, position.mark
    i = j = 0
    if not markers and events:  # the common case: no merge, one slice
        i = min(len(events), limit - len(items))
        items.extend(events[:i])
        end_seq = events[i - 1].seq if i else end_seq
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


def _driver_rows(connection: Connection, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """Plain tuples from the driver: a batch is hundreds of rows, and SQLAlchemy's row
    processing (and statement building) would cost more than the read itself. ``sql``
    is written with ``?`` and becomes ``%s`` for psycopg."""
    driver = connection.connection.driver_connection
    assert driver is not None
    if connection.dialect.name == "postgresql":
        with driver.cursor() as cursor:
            cursor.execute(sql.replace("?", "%s"), params)
            return cursor.fetchall()
    cursor = driver.cursor()
    try:
        return cursor.execute(sql, params).fetchall()
    finally:
        cursor.close()


def _utc(value: Any) -> datetime:
    """A stored time as a tz-aware datetime: PostgreSQL's driver returns one already
    (in the session's zone: a conversion per row would cost more than the row), SQLite's
    the text SQLAlchemy stored, UTC."""
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def read_events(connection: Connection, stream: str, after: int, limit: int) -> list[Event]:
    """Events after ``seq`` ``after``, by ``seq``, their data exact."""
    rows = _driver_rows(connection, _EVENTS_SQL, (stream, after, limit))
    times: Callable[[Any], datetime] = (
        _SqliteTimes() if connection.dialect.name == "sqlite" else _same
    )
    return [
        Event(
            stream,
            seq,
            event_id,
            event_type,
            data if data_bytes is None else stored_data(data, data_bytes),
            times(received_at),
            event_ord,
        )
        for seq, event_id, event_ord, event_type, data, data_bytes, received_at in rows
    ]


def _same(value: Any) -> Any:
    return value


class _SqliteTimes:
    """SQLite's stored text to datetimes, the last one remembered: the reader stamps one
    time per chunk it reads, so a batch's rows mostly repeat the time before them."""

    def __init__(self) -> None:
        self._text: str | None = None
        self._time: datetime | None = None

    def __call__(self, value: str) -> datetime:
        if value != self._text:
            self._text, self._time = value, _utc(value)
        assert self._time is not None
        return self._time


def read_markers(
    connection: Connection, stream: str, after_mark: int, bound: int, limit: int
) -> tuple[list[Gap | GapClosed], bool, int | None]:
    """Gap markers after ``after_mark`` that come after no event past ``bound``, by mark;
    whether there may be more (a limit was reached); and the newest ``seq`` retention
    deleted from the stream. One round trip: it runs once per batch."""
    rows = _driver_rows(
        connection,
        _MARKERS_SQL,
        (stream, after_mark, bound, limit, stream, after_mark, bound, limit, stream),
    )
    found: list[Gap | GapClosed] = []
    counts = {"o": 0, "c": 0}
    last = {"o": 0, "c": 0}
    deleted_to: int | None = None
    for row in rows:
        kind = row[0]
        if kind == "t":
            deleted_to = None if row[12] is None else int(row[12])
            continue
        counts[kind] += 1
        last[kind] = int(row[13])
        found.append(_opened(stream, row) if kind == "o" else _closed(stream, row))
    capped, full = cap_markers(found, counts, last, limit)
    return capped, full, deleted_to


def cap_markers(
    found: list[Gap | GapClosed], counts: dict[str, int], last: dict[str, int], limit: int
) -> tuple[list[Gap | GapClosed], bool]:
    """Openings and closings read as two lists of at most ``limit`` each, by mark, merged:
    a full list may leave out markers numbered below the other list's last ones, so the
    merge stops at the lower of the full lists' last marks. ``counts`` and ``last``: each
    list's (``"o"``, ``"c"``) length and last mark. Returns the markers and whether more
    may follow."""
    found = sorted(found, key=lambda marker: marker.mark)
    caps = [last[kind] for kind in ("o", "c") if counts[kind] >= limit]
    if caps:
        found = [marker for marker in found if marker.mark <= min(caps)]
    return found, bool(caps)


_GAP_COLUMNS = (
    "gap_id, kind, state, start_id, end_id, announced, seen_at, detail, recovered, missing, "
    "closed_at"
)
_MARKERS_SQL = (
    f"SELECT * FROM (SELECT 'o' AS k, {_GAP_COLUMNS}, opened_seq AS at, opened_mark AS mark "
    f"FROM {GAPS_TABLE} WHERE stream = ? AND opened_mark > ? AND opened_seq <= ? "
    "ORDER BY opened_mark LIMIT ?) AS o "
    f"UNION ALL SELECT * FROM (SELECT 'c' AS k, {_GAP_COLUMNS}, closed_seq, closed_mark "
    f"FROM {GAPS_TABLE} WHERE stream = ? AND closed_mark > ? AND closed_seq <= ? "
    "ORDER BY closed_mark LIMIT ?) AS c "
    "UNION ALL SELECT 't', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
    f"deleted_to_seq, NULL FROM {RETENTION_TABLE} WHERE stream = ?"
)
"""The stream's gap openings and closings after a mark (each list in mark order, each
served by its ``(stream, …_mark)`` index), and retention's deleted-to seq."""


def _opened(stream: str, row: Any) -> Gap:
    return Gap(
        stream=stream,
        gap_id=row[1],
        kind=row[2],
        start_id=row[4],
        end_id=row[5],
        announced=row[6],
        seen_at=None if row[7] is None else _utc(row[7]),
        detail=row[8],
        after_seq=int(row[12]),
        mark=int(row[13]),
    )


def _closed(stream: str, row: Any) -> GapClosed:
    return GapClosed(
        stream=stream,
        gap_id=row[1],
        state=row[3],
        recovered=int(row[9]),
        missing=row[10],
        closed_at=None if row[11] is None else _utc(row[11]),
        after_seq=int(row[12]),
        mark=int(row[13]),
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


def all_streams(connection: Connection) -> list[str]:
    """Every stream in the log, by a skip scan of the ``(stream, …)`` index (one probe
    per stream, not a read of every row)."""
    sql = (
        f"WITH RECURSIVE s(stream) AS ("
        f"SELECT min(stream) FROM {EVENTS_TABLE} "
        f"UNION ALL SELECT (SELECT min(stream) FROM {EVENTS_TABLE} e WHERE e.stream > s.stream) "
        f"FROM s WHERE s.stream IS NOT NULL) SELECT stream FROM s WHERE stream IS NOT NULL"
    )
    return [row[0] for row in connection.exec_driver_sql(sql)]


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
