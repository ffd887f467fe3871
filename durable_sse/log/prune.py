"""Retention's deletes: a stream's old rows go, in bounded statements, never past the fence.

The decisions are plain functions in :mod:`durable_sse.log.retention`; this job carries
them out. What must stay whatever its age (the *fence*: the lagging id, the open gaps'
starts, the running connections' starts) is not the log's to know: it is read, inside
every delete transaction, through the :data:`FenceReader` hook :class:`durable_sse.stores.Stores`
builds this job with (the cursor package owns the fence), and what consumer groups keep
through the :data:`ConsumerHolds` hook (the consumer package sits above the log).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.ids import IdOrder, sort_key
from durable_sse.log.database import Database
from durable_sse.log.locks import hold_retention
from durable_sse.log.reads import neighbour, newest_row
from durable_sse.log.records import RetentionRun, RetentionState, from_db_time, to_utc
from durable_sse.log.retention import (
    BATCH_ROWS,
    HELD_BY_NO_LAGGING,
    MAX_BATCHES,
    ConsumerHold,
    Fence,
    choose_deletions,
)
from durable_sse.log.schema import events_table, retention_table

FenceReader = Callable[[Connection, str, IdOrder], Fence]
"""``(connection, stream, order)`` -> the fence, read in the delete's transaction; raises
:class:`~durable_sse.errors.IdOrderMismatchError` when ``order`` is not the stream's."""
ConsumerHolds = Callable[[Connection, str, datetime], Sequence[ConsumerHold]]
"""``(connection, stream, now)`` -> what consumer groups hold of the stream."""


class Prune:
    """Deletes a stream's rows older than its retention, and says what it deleted."""

    def __init__(
        self,
        database: Database,
        *,
        fence: FenceReader,
        consumer_holds: ConsumerHolds | None = None,
    ) -> None:
        """``consumer_holds``: what consumer groups keep of a stream, read in each delete's
        transaction (:func:`durable_sse.consume.retention_holds`; the worker, which runs
        retention, passes it). None: retention ignores consumers."""
        self._database = database
        self._fence = fence
        self._consumer_holds = consumer_holds

    async def apply_retention(
        self,
        stream: str,
        id_order: str,
        *,
        cutoff: datetime,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
        between: Callable[[int], Awaitable[None]] | None = None,
    ) -> RetentionRun:
        """Delete the stream's rows received before ``cutoff``, in bounded batches, never
        one at or after the fence (:func:`durable_sse.cursor.fence.retention_fence`).

        At most ``max_batches`` transactions of at most ``batch_rows`` rows each;
        ``between(deleted so far)`` is awaited between them (the activity heartbeats).
        Rows go in ``seq`` order from the oldest and the run stops at the first row
        received at or after ``cutoff``: the primary key ``(stream, seq)`` (PostgreSQL),
        ``ix_sse_events_stream_seq`` (SQLite) serves every statement, and no statement
        reads more than ``batch_rows`` rows. ``received_at`` has no index of its own (it
        would cost every insert); arrival order is time order to within a batch, and a
        row received out of that order merely waits for a later run.

        Each transaction reads the fence again (the lagging id, the open gaps, the
        running connections' start cursors) under the stream's retention lock, which a
        batch that opens a gap and a connection that registers its start take too
        (PostgreSQL: an advisory lock, exclusive here, shared there; SQLite: its one
        writer, taken by each transaction's first statement, a write). So a gap or a
        connection that appears while a run goes on holds the very next statement, and
        one that appears during a statement is written after it, against the horizon it
        left (:func:`durable_sse.gaps.transitions.opening_past_horizon`).

        Raises :class:`~durable_sse.errors.IdOrderMismatchError` (nothing deleted) when
        ``id_order`` is not the one the stream's keys were made with.
        """
        order = IdOrder(id_order)
        cutoff = to_utc(cutoff)
        deleted = statements = 0
        longest = 0.0
        after: int | None = None
        complete = False
        fence = Fence(None, HELD_BY_NO_LAGGING)
        held_by_consumers: tuple[str, ...] = ()
        while not complete and statements < max_batches:
            if statements and between is not None:
                await between(deleted)
            batch = await self._database.run(
                f"delete old events of stream {stream!r}",
                self._delete_batch_sync,
                stream,
                order,
                cutoff,
                after,
                batch_rows,
            )
            statements += 1
            deleted += batch.deleted
            longest = max(longest, batch.longest)
            after = batch.last_seq
            complete = batch.done
            fence = batch.fence
            held_by_consumers = batch.held_by_consumers
        state = await self.retention_state(stream)
        return RetentionRun(
            deleted=deleted,
            batches=statements,
            complete=complete,
            held_by=fence.held_by,
            keep_from=fence.keep_from,
            longest_statement=longest,
            state=state,
            held_by_consumers=held_by_consumers,
        )

    async def retention_state(self, stream: str) -> RetentionState:
        """What retention has deleted from the stream so far, and its oldest row kept."""
        return await self._database.run(
            f"read the retention of stream {stream!r}", self._retention_state_sync, stream
        )

    def _delete_batch_sync(
        self, stream: str, order: IdOrder, cutoff: datetime, after: int | None, limit: int
    ) -> _RetentionBatch:
        """One transaction: read the fence, then the next ``limit`` rows in ``seq`` order
        before the fence row; delete those older than the cutoff and before the fence, and
        count them with the horizon (see :meth:`apply_retention`)."""
        events = events_table
        longest = 0.0
        with self._database.begin() as connection:
            hold_retention(connection, stream, exclusive=True)
            # A write first: on SQLite the batch then reads and deletes under the write
            # lock, one snapshot (the DELETE re-checks every condition all the same).
            self._ensure_retention_row(connection, stream)
            fence = self._fence(connection, stream, order)
            fence_key = end_seq = None
            if fence.ids_deletable:
                assert fence.keep_from is not None
                # The stored id before the fence stays too (see durable_sse.log.retention).
                keep = fence.keep_from
                keep = neighbour(connection, stream, order, keep, older=True) or keep
                fence_key = sort_key(keep, order)
                end_seq = self._fence_seq(connection, stream, fence_key)
            else:
                # Only a stream that never stored an id may lose rows without a fence
                # (such rows are never replayed nor deduplicated): keep everything else.
                has_ids = connection.execute(newest_row(stream, events.c.seq)).scalar_one_or_none()
                if has_ids is not None or fence.held_by != HELD_BY_NO_LAGGING:
                    return _RetentionBatch(0, after, True, longest, fence)
            where = [events.c.stream == stream]
            if after is not None:
                where.append(events.c.seq > after)
            lower = list(where)
            if end_seq is not None:
                where.append(events.c.seq < end_seq)
            started = time.monotonic()
            rows = connection.execute(
                sa.select(events.c.seq, events.c.id_key, events.c.received_at)
                .where(*where)
                .order_by(events.c.seq)
                .limit(limit)
            ).all()
            longest = time.monotonic() - started
            holds = self._holds_of_consumers(connection, stream)
            choice = choose_deletions(
                (
                    (
                        row.seq,
                        None if row.id_key is None else bytes(row.id_key),
                        from_db_time(row.received_at) or cutoff,
                    )
                    for row in rows
                ),
                after=after,
                fence_key=fence_key,
                cutoff=cutoff,
                limit=limit,
                holds=holds,
            )
            if not choice.doomed:
                return _RetentionBatch(
                    0, choice.last_seq, choice.done, longest, fence, choice.held_by_consumers
                )
            assert choice.last_seq is not None
            horizon_id = None
            if choice.newest_key is not None:
                horizon_id = connection.execute(
                    sa.select(events.c.event_id)
                    .where(events.c.stream == stream, events.c.id_key == choice.newest_key)
                    .limit(1)
                ).scalar_one()
            kept = (
                events.c.id_key.is_(None)
                if fence_key is None
                else sa.or_(events.c.id_key.is_(None), events.c.id_key < fence_key)
            )
            started = time.monotonic()
            result = connection.execute(
                sa.delete(events).where(
                    *lower,
                    events.c.seq <= choice.last_seq,
                    events.c.received_at < cutoff,
                    kept,
                )
            )
            longest = max(longest, time.monotonic() - started)
            deleted = max(result.rowcount, 0)
            self._count_deleted(connection, stream, deleted, choice.newest_key, horizon_id)
            self._record_deleted_to(connection, stream, choice.deleted_to)
        return _RetentionBatch(
            deleted, choice.last_seq, choice.done, longest, fence, choice.held_by_consumers
        )

    def _fence_seq(self, connection: Connection, stream: str, key: bytes) -> int | None:
        """The ``seq`` of the fence id's row (else of the first id after it): rows from
        there on in arrival order stay (None: no such row, no bound)."""
        events = events_table
        end_seq = connection.execute(
            sa.select(sa.func.min(events.c.seq)).where(
                events.c.stream == stream, events.c.id_key == key
            )
        ).scalar_one_or_none()
        if end_seq is None:  # the fence id is not stored: the first id after it
            end_seq = connection.execute(
                sa.select(events.c.seq)
                .where(events.c.stream == stream, events.c.id_key > key)
                .order_by(events.c.id_key)
                .limit(1)
            ).scalar_one_or_none()
        return end_seq

    def _holds_of_consumers(self, connection: Connection, stream: str) -> list[ConsumerHold]:
        """The consumer groups' term of the fence, read in the delete's own transaction:
        what groups that hold retention have not consumed yet (see ``ConsumerHold``)."""
        holds = []
        if self._database.dialect == "sqlite":
            # SQLite gives a new row the largest rowid + 1: were the table's newest row
            # deleted, the next row would take its seq again, and a consumer positioned
            # at that seq would pass it. The newest row of the whole table stays.
            newest = connection.execute(sa.select(sa.func.max(events_table.c.seq))).scalar()
            if newest is not None:
                holds.append(ConsumerHold("(newest row of the table)", newest - 1))
        if self._consumer_holds is not None:
            holds += self._consumer_holds(connection, stream, datetime.now(UTC))
        return holds

    def _record_deleted_to(self, connection: Connection, stream: str, seq: int | None) -> None:
        """Remember the newest ``seq`` deleted, in the delete's transaction: a consumer
        whose position is older learns that rows it never read are gone."""
        if seq is None:
            return
        table = retention_table
        connection.execute(
            sa.update(table)
            .where(
                table.c.stream == stream,
                sa.or_(table.c.deleted_to_seq.is_(None), table.c.deleted_to_seq < seq),
            )
            .values(deleted_to_seq=seq)
        )

    def _count_deleted(
        self,
        connection: Connection,
        stream: str,
        deleted: int,
        newest_key: bytes | None,
        horizon_id: str | None,
    ) -> None:
        table, now = retention_table, datetime.now(UTC)
        connection.execute(
            sa.update(table)
            .where(table.c.stream == stream)
            .values(deleted_rows=table.c.deleted_rows + deleted, updated_at=now)
        )
        if newest_key is not None:
            connection.execute(
                sa.update(table)
                .where(
                    table.c.stream == stream,
                    sa.or_(table.c.horizon_key.is_(None), table.c.horizon_key < newest_key),
                )
                .values(horizon_key=newest_key, horizon_id=horizon_id)
            )

    def _ensure_retention_row(self, connection: Connection, stream: str) -> None:
        connection.execute(
            self._database.insert(retention_table)
            .values(stream=stream, deleted_rows=0, updated_at=datetime.now(UTC))
            .on_conflict_do_nothing(index_elements=["stream"])
        )

    def _retention_state_sync(self, stream: str) -> RetentionState:
        events, table = events_table, retention_table
        with self._database.begin() as connection:
            row = connection.execute(
                sa.select(table.c.deleted_rows, table.c.horizon_id).where(table.c.stream == stream)
            ).first()
            oldest = connection.execute(
                sa.select(events.c.event_id, events.c.received_at)
                .where(events.c.stream == stream)
                .order_by(events.c.seq)
                .limit(1)
            ).first()
        return RetentionState(
            deleted_rows=int(row.deleted_rows) if row is not None else 0,
            horizon_id=row.horizon_id if row is not None else None,
            oldest_kept_id=oldest.event_id if oldest is not None else None,
            oldest_kept_at=from_db_time(oldest.received_at) if oldest is not None else None,
        )


@dataclass(frozen=True)
class _RetentionBatch:
    deleted: int
    last_seq: int | None
    done: bool
    longest: float
    fence: Fence
    """The fence this statement kept (read inside its transaction)."""
    held_by_consumers: tuple[str, ...] = ()
