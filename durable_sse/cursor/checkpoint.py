"""The checkpoint row (``sse_checkpoints``): the lagging id, and the stream's id order.

The lagging id is the newest id persisted at least one replay window ago, moved forward
by each checkpoint run and never past an open gap
(:func:`~durable_sse.cursor.fence.lagging_target`): the only store that can answer
"where was I before the last few hours happened". The
row also records the ``id_order`` the stream's keys are made with; work under another
order is refused (:func:`~durable_sse.log.retention.check_id_order`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.contracts import AdvanceResult, CheckpointState
from durable_sse.cursor.fence import lagging_target, live_starts, retention_fence
from durable_sse.cursor.readers import Readers
from durable_sse.cursor.rest import caught_up
from durable_sse.gaps.model import GapSummary
from durable_sse.gaps.store import GapStore
from durable_sse.ids import IdOrder, sort_key
from durable_sse.log.database import Database
from durable_sse.log.reads import newest_row, received_at
from durable_sse.log.records import from_db_time, to_utc
from durable_sse.log.retention import Fence, check_id_order
from durable_sse.log.schema import checkpoints_table, events_table


class CheckpointStore:
    """Reads and moves the lagging id, over the shared database."""

    def __init__(self, database: Database, *, gaps: GapStore, readers: Readers) -> None:
        self._database = database
        self._gaps = gaps
        self._readers = readers

    async def get_checkpoint(self, stream: str) -> CheckpointState | None:
        return await self._database.run(
            f"read the checkpoint of stream {stream!r}", self._get_checkpoint_sync, stream
        )

    async def advance_lagging(
        self, stream: str, id_order: str, *, window: float, now: datetime
    ) -> AdvanceResult:
        """Move the lagging id to the newest id received at least ``window`` s before ``now``.

        One transaction: creates the row if missing, then a conditional UPDATE that only
        moves forward under the id order and never past an open gap's resume point.
        """
        cutoff = to_utc(now) - timedelta(seconds=window)
        return await self._database.run(
            f"advance the lagging id of stream {stream!r}",
            self._advance_sync,
            stream,
            IdOrder(id_order),
            cutoff,
        )

    def ensure(self, connection: Connection, stream: str, order: IdOrder) -> None:
        statement = (
            self._database.insert(checkpoints_table)
            .values(stream=stream, id_order=order.value, updated_at=datetime.now(UTC))
            .on_conflict_do_nothing(index_elements=["stream"])
        )
        connection.execute(statement)

    def check_order(self, connection: Connection, stream: str, order: IdOrder) -> str | None:
        """The stream's lagging id, after making sure its keys are made under ``order``
        (raises :class:`~durable_sse.errors.IdOrderMismatchError` otherwise)."""
        table = checkpoints_table
        row = connection.execute(
            sa.select(table.c.lagging_id, table.c.id_order).where(table.c.stream == stream)
        ).first()
        if row is None:
            return None
        check_id_order(stream, stored=row.id_order, wanted=order.value)
        return row.lagging_id

    def _get_checkpoint_sync(self, stream: str) -> CheckpointState | None:
        with self._database.begin() as connection:
            return self.checkpoint_in(connection, stream)

    async def gaps_and_checkpoint(
        self, stream: str, id_order: str
    ) -> tuple[GapSummary, CheckpointState | None]:
        """The stream's gaps and checkpoint row, read in one transaction."""
        return await self._database.run(
            f"read the gaps and checkpoint of stream {stream!r}",
            self._gaps_and_checkpoint_sync,
            stream,
            IdOrder(id_order),
        )

    def _gaps_and_checkpoint_sync(
        self, stream: str, order: IdOrder
    ) -> tuple[GapSummary, CheckpointState | None]:
        with self._database.begin() as connection:
            gaps = self._gaps.summary_in(connection, stream, order)
            return gaps, self.checkpoint_in(connection, stream)

    def checkpoint_in(self, connection: Connection, stream: str) -> CheckpointState | None:
        """The stream's checkpoint row, read in ``connection``'s transaction."""
        table = checkpoints_table
        row = connection.execute(sa.select(table).where(table.c.stream == stream)).first()
        if row is None:
            return None
        return CheckpointState(
            stream=row.stream,
            lagging_id=row.lagging_id,
            lagging_at=_iso(row.lagging_at),
            updated_at=_iso(row.updated_at),
            resting_since=_iso(row.resting_since),
        )

    def _advance_sync(self, stream: str, order: IdOrder, cutoff: datetime) -> AdvanceResult:
        events, table = events_table, checkpoints_table
        with self._database.begin() as connection:
            # A write first: on SQLite this takes the write lock before anything is read.
            self.ensure(connection, stream, order)
            self.check_order(connection, stream, order)
            candidate = connection.execute(
                sa.select(events.c.event_id, events.c.received_at)
                .where(
                    events.c.stream == stream,
                    events.c.id_key.is_not(None),
                    events.c.received_at <= cutoff,
                )
                .order_by(events.c.id_key.desc(), events.c.received_at.desc())
                .limit(1)
            ).first()
            target, held, cap = lagging_target(
                candidate.event_id if candidate is not None else None,
                self._gaps.open_gaps(connection, stream, lock=True),
                order,
            )
            target_at = None
            if target is not None:
                if candidate is not None and target == candidate.event_id:
                    target_at = candidate.received_at
                else:
                    target_at = received_at(connection, stream, target)
            moved = False
            if target is not None:
                key = sort_key(target, order)
                result = connection.execute(
                    sa.update(table)
                    .where(
                        table.c.stream == stream,
                        sa.or_(table.c.lagging_key.is_(None), table.c.lagging_key < key),
                    )
                    .values(
                        lagging_id=target,
                        lagging_key=key,
                        lagging_at=from_db_time(target_at),
                        id_order=order.value,
                        updated_at=datetime.now(UTC),
                    )
                )
                moved = result.rowcount == 1
            lagging = connection.execute(
                sa.select(table.c.lagging_id, table.c.lagging_key).where(table.c.stream == stream)
            ).one()
            level = caught_up(lagging.lagging_key, _newest_key(connection, stream))
        return AdvanceResult(
            lagging_id=lagging.lagging_id,
            moved=moved,
            held_by_gap=held,
            cap_id=cap,
            caught_up=level,
        )

    # -- the schedule's rest (durable_sse.cursor.rest) -----------------------------------

    async def rest(self, stream: str) -> datetime | None:
        """Record that the stream's schedule rests, if it is caught up: since when it rests
        (None: it is not caught up, nothing recorded). One transaction, so an event stored
        before it commits is seen."""
        return await self._database.run(
            f"record the checkpoint rest of stream {stream!r}", self._rest_sync, stream
        )

    async def resting(self, stream: str) -> datetime | None:
        """Since when the stream's schedule rests (None: it does not, or no row)."""
        return await self._database.run(
            f"read the checkpoint rest of stream {stream!r}", self._resting_sync, stream
        )

    async def still_resting(self, stream: str, since: datetime) -> bool:
        """Whether the rest that began at ``since`` stands and the stream is still caught
        up (read after the pause)."""
        return await self._database.run(
            f"check the checkpoint rest of stream {stream!r}",
            self._still_resting_sync,
            stream,
            since,
        )

    async def woken(self, stream: str, since: datetime) -> None:
        """Clear the rest that began at ``since``, once its schedule runs again (a later
        rest is left alone: it is another pause, with its own checks)."""
        await self._database.run(
            f"clear the checkpoint rest of stream {stream!r}", self._woken_sync, stream, since
        )

    def _level(self, connection: Connection, stream: str) -> tuple[bool, datetime | None]:
        table = checkpoints_table
        row = connection.execute(
            sa.select(table.c.lagging_key, table.c.resting_since).where(table.c.stream == stream)
        ).first()
        lagging_key, since = (None, None) if row is None else row
        return caught_up(lagging_key, _newest_key(connection, stream)), since

    def _rest_sync(self, stream: str) -> datetime | None:
        table = checkpoints_table
        with self._database.begin() as connection:
            # A write first: on SQLite this takes the write lock before anything is read.
            began = connection.execute(
                sa.update(table)
                .where(table.c.stream == stream, table.c.resting_since.is_(None))
                .values(resting_since=datetime.now(UTC))
            )
            level, since = self._level(connection, stream)
            if level:
                return from_db_time(since)
            if began.rowcount == 1:
                # Not caught up: no pause follows this rest. (A rest recorded before stays
                # until a wake clears it: its schedule may still be paused.)
                connection.execute(
                    sa.update(table).where(table.c.stream == stream).values(resting_since=None)
                )
            return None

    def _resting_in(self, connection: Connection, stream: str) -> datetime | None:
        table = checkpoints_table
        return connection.execute(
            sa.select(table.c.resting_since).where(table.c.stream == stream)
        ).scalar()

    def _resting_sync(self, stream: str) -> datetime | None:
        with self._database.begin() as connection:
            return from_db_time(self._resting_in(connection, stream))

    def _still_resting_sync(self, stream: str, since: datetime) -> bool:
        with self._database.begin() as connection:
            level, current = self._level(connection, stream)
        return level and from_db_time(current) == since

    def _woken_sync(self, stream: str, since: datetime) -> None:
        table = checkpoints_table
        with self._database.begin() as connection:
            current = from_db_time(self._resting_in(connection, stream))
            if current is not None and current == since:
                connection.execute(
                    sa.update(table).where(table.c.stream == stream).values(resting_since=None)
                )

    def fence_in(self, connection: Connection, stream: str, order: IdOrder) -> Fence:
        """Retention's fence, read in the caller's transaction (the prune job's hook):
        the lagging id (after checking ``order``), the open gaps' starts and the live
        connections' starts."""
        lagging = self.check_order(connection, stream, order)
        readers = self._readers.running(connection, stream)
        return retention_fence(
            lagging,
            self._gaps.open_gaps(connection, stream),
            order,
            live_starts(readers, datetime.now(UTC)),
        )


def _newest_key(connection: Connection, stream: str) -> bytes | None:
    """The stream's highest id key: the floor's."""
    return connection.execute(newest_row(stream, events_table.c.id_key)).scalar()


def _iso(moment: datetime | None) -> str | None:
    value = from_db_time(moment)
    return None if value is None else value.isoformat()
