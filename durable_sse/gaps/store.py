"""The gap records (``sse_gaps``): written in a batch's transaction, read by everyone.

The one job of the log that knows the gap: the writer calls :meth:`GapStore.apply_changes`
for each batch that carries gap changes, inside the batch's transaction (the hook
:class:`durable_sse.stores.Stores` wires), so a gap record is durable before any cursor
passes its signal (invariant 5). Changes are applied in order, each seeing the records
the ones before it wrote; a batch that opens a gap takes the stream's retention lock and
opens it after the horizon (:func:`~durable_sse.gaps.transitions.opening_past_horizon`);
gaps that open or close get their place in the stream's order for consumers.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.gaps.model import (
    GapChange,
    GapKind,
    GapRecord,
    GapState,
    GapSummary,
    GapTotals,
    numeric_span,
    summarize,
)
from durable_sse.gaps.transitions import apply_change, changes_nothing, opening_past_horizon
from durable_sse.ids import IdOrder, contiguous_number, sort_key
from durable_sse.log.database import Database
from durable_sse.log.locks import hold_retention
from durable_sse.log.records import BatchPayload, from_db_time, to_utc
from durable_sse.log.schema import (
    checkpoints_table,
    events_table,
    gaps_table,
    retention_table,
)

logger = logging.getLogger(__name__)


class GapStore:
    """Reads and writes ``sse_gaps`` over the shared database."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def gap_summary(self, stream: str, id_order: str) -> GapSummary:
        """The stream's open gaps by name and all its gaps by count (tests; the workers
        read it with the checkpoint, ``CheckpointStore.gaps_and_checkpoint``)."""
        return await self._database.run(
            f"read the gaps of stream {stream!r}", self._summary_sync, stream, IdOrder(id_order)
        )

    async def gaps(self, stream: str) -> list[GapRecord]:
        """Every gap record of the stream, oldest first (tests and the status tools)."""
        return await self._database.run(
            f"read the gaps of stream {stream!r}", self._gaps_sync, stream
        )

    def open_gaps(
        self, connection: Connection, stream: str, *, lock: bool = False
    ) -> list[GapRecord]:
        query = sa.select(gaps_table).where(
            gaps_table.c.stream == stream, gaps_table.c.state == GapState.OPEN.value
        )
        if lock and connection.dialect.name == "postgresql":
            query = query.with_for_update()
        return [_gap_from_row(row) for row in connection.execute(query)]

    def apply_changes(
        self, connection: Connection, stream: str, payload: BatchPayload, new_rows: int
    ) -> None:
        """Apply a batch's gap changes inside its transaction (the writer's hook, see
        :func:`~durable_sse.gaps.transitions.apply_change`).

        In order, each written before the next is applied: a gap closed earlier in the
        batch is among the ranges a later one must not count again
        (``_SqlStoredIds.counted_ranges`` reads them in this transaction). A batch that
        opens a gap takes the retention lock first and opens it after the stream's
        horizon (:func:`~durable_sse.gaps.transitions.opening_past_horizon`).
        """
        order = payload.order
        changes = [
            change
            for change in payload.gap_changes
            if isinstance(change, GapChange) and not changes_nothing(change, new_rows)
        ]
        if not changes:
            return
        if any(change.opened is not None for change in changes):
            hold_retention(connection, stream, exclusive=False)
            changes = self._past_horizon(connection, stream, order, changes)
        ids = sorted({change.gap_id for change in changes})
        if not ids:
            return
        query = sa.select(gaps_table).where(
            gaps_table.c.stream == stream, gaps_table.c.gap_id.in_(ids)
        )
        if connection.dialect.name == "postgresql":
            query = query.with_for_update()
        records = {row.gap_id: _gap_from_row(row) for row in connection.execute(query)}
        existing = set(records)
        found = set(existing)
        was_open = {gap_id for gap_id, record in records.items() if record.is_open}
        lagging = connection.execute(
            sa.select(checkpoints_table.c.lagging_id).where(checkpoints_table.c.stream == stream)
        ).scalar_one_or_none()
        stored = _SqlStoredIds(connection, stream, order)
        now = datetime.now(UTC).isoformat()
        for change in changes:
            before = records.get(change.gap_id)
            record = apply_change(
                before,
                change,
                order=order,
                lagging_id=lagging,
                new_rows=new_rows,
                now=now,
                stored=stored,
            )
            if record is None or record == before:
                continue
            records[change.gap_id] = record
            values = _gap_values(record)
            if change.gap_id in existing:
                connection.execute(
                    sa.update(gaps_table)
                    .where(gaps_table.c.stream == stream, gaps_table.c.gap_id == change.gap_id)
                    .values(**values)
                )
            else:
                connection.execute(sa.insert(gaps_table).values(gap_id=change.gap_id, **values))
                existing.add(change.gap_id)
            if record.state != GapState.OPEN and (before is None or before.is_open):
                loud = record.state == GapState.UNRECOVERABLE and record.kind != GapKind.NO_RESUME
                logger.log(
                    logging.WARNING if loud else logging.INFO,  # no_resume: warned once
                    "stream %s: gap %s after %r before %r is %s (missing %s, recovered %d)",
                    stream,
                    record.gap_id,
                    record.start_id,
                    record.end_id,
                    record.state,
                    "unknown" if record.missing is None else record.missing,
                    record.recovered,
                )
        opened = [gap_id for gap_id in ids if gap_id in records and gap_id not in found]
        closed = [
            gap_id
            for gap_id in ids
            if gap_id in records
            and not records[gap_id].is_open
            and (gap_id not in found or gap_id in was_open)
        ]
        if opened or closed:
            self._place_gap_markers(connection, stream, opened=opened, closed=closed)

    def _past_horizon(
        self, connection: Connection, stream: str, order: IdOrder, changes: list[GapChange]
    ) -> list[GapChange]:
        """The batch's changes with its gap openings moved after the retention horizon."""
        horizon_id = connection.execute(
            sa.select(retention_table.c.horizon_id).where(retention_table.c.stream == stream)
        ).scalar_one_or_none()
        if horizon_id is None:
            return changes
        kept = []
        for change in changes:
            moved = opening_past_horizon(change, horizon_id, order)
            if moved is not change:
                opened = change.opened
                assert opened is not None
                logger.warning(
                    "stream %s: a drop signal (%s) over ids after %r, at or before the "
                    "retention horizon %r: %s",
                    stream,
                    opened.kind,
                    opened.start_id,
                    horizon_id,
                    "the gap starts at the horizon (what lies before it was deleted by "
                    "retention, or lost before anyone recorded it)"
                    if moved is not None
                    else "nothing of it lies after the horizon, no gap is recorded",
                )
            if moved is not None:
                kept.append(moved)
        return kept

    def _place_gap_markers(
        self, connection: Connection, stream: str, *, opened: list[str], closed: list[str]
    ) -> None:
        """Give gaps that open or close in this transaction their place in the stream's
        order, so a consumer meets ``Gap`` and ``GapClosed`` between the events where they
        happened (:mod:`durable_sse.consume.items`).

        The place is the stream's newest ``seq`` now (this transaction's rows included)
        and a *mark*, the next number among the stream's markers. Both only grow: on
        PostgreSQL the group transaction holds the stream's lock
        (``Writer._order_and_notify``), on SQLite the one write lock, so no other writer of
        the stream is between the read and the commit. A gap marked after a consumer read
        the event at its ``seq`` still reaches it: the position counts marks apart.
        """
        events, table = events_table, gaps_table
        # One round trip: this runs inside the group transaction, which holds up the
        # commits queued behind it (a failover places two markers per stream moved).
        newest, *marks = connection.execute(
            sa.select(
                sa.select(sa.func.max(events.c.seq))
                .where(events.c.stream == stream)
                .scalar_subquery(),
                *(
                    sa.select(sa.func.max(column)).where(table.c.stream == stream).scalar_subquery()
                    for column in (table.c.opened_mark, table.c.closed_mark)
                ),
            )
        ).one()
        mark = max((value for value in marks if value is not None), default=0)
        at = int(newest or 0)
        for names, seq_column, mark_column in (
            (opened, "opened_seq", "opened_mark"),
            (closed, "closed_seq", "closed_mark"),
        ):
            for gap_id in names:
                mark += 1
                connection.execute(
                    sa.update(table)
                    .where(table.c.stream == stream, table.c.gap_id == gap_id)
                    .values({seq_column: at, mark_column: mark})
                )

    def _summary_sync(self, stream: str, order: IdOrder) -> GapSummary:
        with self._database.begin() as connection:
            return self.summary_in(connection, stream, order)

    def summary_in(self, connection: Connection, stream: str, order: IdOrder) -> GapSummary:
        """The stream's open gaps and totals, read in ``connection``'s transaction."""
        table = gaps_table
        open_gaps = self.open_gaps(connection, stream)
        suspected = table.c.kind == GapKind.SUSPECTED.value
        rows = connection.execute(
            sa.select(
                table.c.state,
                suspected,
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(table.c.missing), 0),
                sa.func.sum(sa.case((table.c.missing.is_(None), 1), else_=0)),
                sa.func.coalesce(sa.func.sum(table.c.recovered), 0),
            )
            .where(table.c.stream == stream)
            .group_by(table.c.state, suspected)
        ).all()
        summary = summarize(open_gaps, order)
        totals = GapTotals()
        for state, is_suspicion, count, missing, unknown, recovered in rows:
            count, recovered = int(count), int(recovered or 0)
            totals.events_recovered += recovered
            if is_suspicion:
                totals.suspicions += count
                totals.suspicions_recovered += recovered
                if state != GapState.OPEN:
                    totals.suspicions_closed += count
            if state == GapState.OPEN:
                totals.open += count
            elif state == GapState.REPAIRED:
                totals.repaired += count
            else:
                totals.unrecoverable += count
                totals.events_unrecoverable += int(missing or 0)
                totals.unknown_size += int(unknown or 0)
        summary.totals = totals
        return summary

    def _gaps_sync(self, stream: str) -> list[GapRecord]:
        with self._database.begin() as connection:
            rows = connection.execute(
                sa.select(gaps_table)
                .where(gaps_table.c.stream == stream)
                .order_by(gaps_table.c.seen_at, gaps_table.c.gap_id)
            )
            return [_gap_from_row(row) for row in rows]


class _SqlStoredIds:
    """``gaps.StoredIds`` over one transaction: what a closing gap counts exactly."""

    def __init__(self, connection: Connection, stream: str, order: IdOrder) -> None:
        self._connection = connection
        self._stream = stream
        self._order = order

    def stored_numbers_between(self, low: int, high: int) -> int:
        events = events_table
        if high - low <= 1:
            return 0
        if self._order is IdOrder.LEXICOGRAPHIC:
            # Byte order is not numeric order here: ask for the ids themselves.
            found: set[int] = set()
            for chunk_start in range(low + 1, high, 1000):
                names = [str(n) for n in range(chunk_start, min(chunk_start + 1000, high))]
                rows = self._connection.execute(
                    sa.select(events.c.event_id).where(
                        events.c.stream == self._stream,
                        events.c.event_ord == 0,
                        events.c.event_id.in_(names),
                    )
                )
                found.update(int(row.event_id) for row in rows)
            return len(found)
        rows = self._connection.execute(
            sa.select(events.c.event_id).where(
                events.c.stream == self._stream,
                events.c.event_ord == 0,
                events.c.id_key > sort_key(str(low), self._order),
                events.c.id_key < sort_key(str(high), self._order),
            )
        )
        numbers = {contiguous_number(row.event_id) for row in rows}
        return sum(1 for n in numbers if n is not None and low < n < high)

    def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
        rows = self._connection.execute(
            sa.select(gaps_table).where(
                gaps_table.c.stream == self._stream,
                gaps_table.c.state == GapState.UNRECOVERABLE.value,
                gaps_table.c.gap_id != except_gap,
            )
        )
        spans = (numeric_span(_gap_from_row(row)) for row in rows)
        return [span for span in spans if span is not None]


def _gap_from_row(row: Any) -> GapRecord:
    return GapRecord(
        gap_id=row.gap_id,
        stream=row.stream,
        kind=row.kind,
        start_id=row.start_id,
        end_id=row.end_id,
        notice_id=row.notice_id,
        announced=row.announced,
        state=row.state,
        reread_to=row.reread_to,
        truncated=bool(row.truncated),
        short_reads=int(row.short_reads),
        recovered=int(row.recovered),
        missing=row.missing,
        seen_at=_iso(row.seen_at) or "",
        closed_at=_iso(row.closed_at),
        detail=row.detail,
    )


def _gap_values(gap: GapRecord) -> dict[str, Any]:
    return {
        "stream": gap.stream,
        "kind": gap.kind,
        "state": gap.state,
        "start_id": gap.start_id,
        "end_id": gap.end_id,
        "notice_id": gap.notice_id,
        "reread_to": gap.reread_to,
        "announced": gap.announced,
        "truncated": gap.truncated,
        "short_reads": gap.short_reads,
        "recovered": gap.recovered,
        "missing": gap.missing,
        "seen_at": _parse_iso(gap.seen_at),
        "closed_at": _parse_iso(gap.closed_at) if gap.closed_at else None,
        "detail": gap.detail,
    }


def _parse_iso(value: str) -> datetime:
    return to_utc(datetime.fromisoformat(value))


def _iso(moment: datetime | None) -> str | None:
    value = from_db_time(moment)
    return None if value is None else value.isoformat()
