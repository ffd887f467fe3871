"""Running connections (``sse_readers``): each holds retention back from its start.

A connection registers, with the cursor it chose, in the same transaction as the read
that chose it (:mod:`durable_sse.cursor.start`), moves its hold forward as it reads,
and deletes its row when it ends; retention's fence keeps every row from the oldest live
start on (:func:`durable_sse.cursor.fence.retention_fence`). A worker that dies leaves
its row, whose expiry (:func:`reader_expiry`) ends the hold.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.cursor.fence import RunningReader
from durable_sse.log.database import Database
from durable_sse.log.records import from_db_time, to_utc
from durable_sse.log.schema import readers_table
from durable_sse.log.workers import WorkerLeaseLostError, revoked_among

READER_MARGIN = timedelta(minutes=2)
"""Added to a running connection's expiry: a timed-out attempt still flushes what it read
(its gaps included) before it returns, and clocks of two workers may differ a little."""


@dataclass(frozen=True)
class ReaderLease:
    """A running connection's registration (see :class:`~durable_sse.cursor.fence.RunningReader`):
    who it is and until when, at most, its start holds retention's fence."""

    reader_id: str
    expires_at: datetime
    worker_id: str | None = None
    """The worker lease it runs under: the start refuses a revoked one, and every commit
    checks it (:mod:`durable_sse.log.workers`). None: no lease (tests, tools)."""
    workflow_id: str | None = None
    run_id: str | None = None
    activity_id: str | None = None
    attempt: int | None = None
    """The Temporal activity attempt that runs the connection, for a watchdog that fails
    it by id when its worker's lease expires (None: not run by an activity)."""


@dataclass(frozen=True)
class RegisteredAttempt:
    """A running connection's activity attempt, as its registration names it."""

    stream: str
    activity_id: str | None
    attempt: int


class Readers:
    """The ``sse_readers`` rows of every stream, over the shared database."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def move_reader(self, stream: str, reader_id: str, hold: str | None) -> None:
        """A running connection needs less kept: from ``hold`` on (see
        ``Intake.retention_hold``; it only moves forward). A released reader stays gone."""
        await self._database.run(
            f"move a reader of stream {stream!r}", self._move_sync, stream, reader_id, hold
        )

    async def release_reader(self, stream: str, reader_id: str) -> None:
        """The connection ended: its start no longer holds retention."""
        await self._database.run(
            f"release a reader of stream {stream!r}", self._release_sync, stream, reader_id
        )

    async def readers(self, stream: str) -> list[RunningReader]:
        """The stream's registered connections, expired ones included (tests, tools)."""
        return await self._database.run(
            f"read the readers of stream {stream!r}", self._readers_sync, stream
        )

    async def attempts(self, streams: Collection[str]) -> list[RegisteredAttempt]:
        """The activity attempts registered as readers of ``streams`` (one query for all
        of them: a stopping worker asks it for every connection it handed over)."""
        return await self._database.run(
            f"read the readers of {len(streams)} stream(s)", self._attempts_sync, list(streams)
        )

    def register(
        self, connection: Connection, stream: str, reader: ReaderLease, start: str | None
    ) -> None:
        """Upsert the reader's row (and forget the stream's expired ones).

        Raises:
            WorkerLeaseLostError: the reader's worker lease was revoked: its worker was
                taken for dead, and what it starts now would read beside its replacement.
        """
        if reader.worker_id is not None and revoked_among(connection, [reader.worker_id]):
            raise WorkerLeaseLostError(
                f"stream {stream!r}: worker lease {reader.worker_id} was revoked (the worker "
                "was taken for dead); the connection does not start under it"
            )
        table, now = readers_table, datetime.now(UTC)
        connection.execute(
            sa.delete(table).where(table.c.stream == stream, table.c.expires_at <= now)
        )
        values = {
            "start_id": start,
            "started_at": now,
            "expires_at": to_utc(reader.expires_at),
            "worker_id": reader.worker_id,
            "workflow_id": reader.workflow_id,
            "run_id": reader.run_id,
            "activity_id": reader.activity_id,
            "attempt": reader.attempt,
        }
        connection.execute(
            self._database.insert(table)
            .values(stream=stream, reader_id=reader.reader_id, **values)
            .on_conflict_do_update(index_elements=["stream", "reader_id"], set_=values)
        )

    def _move_sync(self, stream: str, reader_id: str, hold: str | None) -> None:
        table = readers_table
        with self._database.begin() as connection:
            connection.execute(
                sa.update(table)
                .where(table.c.stream == stream, table.c.reader_id == reader_id)
                .values(start_id=hold)
            )

    def _release_sync(self, stream: str, reader_id: str) -> None:
        table = readers_table
        with self._database.begin() as connection:
            connection.execute(
                sa.delete(table).where(table.c.stream == stream, table.c.reader_id == reader_id)
            )

    def _attempts_sync(self, streams: list[str]) -> list[RegisteredAttempt]:
        table = readers_table
        with self._database.begin() as connection:
            rows = connection.execute(
                sa.select(table.c.stream, table.c.activity_id, table.c.attempt).where(
                    table.c.stream.in_(streams), table.c.attempt.is_not(None)
                )
            )
            return [RegisteredAttempt(row.stream, row.activity_id, row.attempt) for row in rows]

    def _readers_sync(self, stream: str) -> list[RunningReader]:
        with self._database.begin() as connection:
            return self.running(connection, stream)

    def running(self, connection: Connection, stream: str) -> list[RunningReader]:
        table = readers_table
        rows = connection.execute(
            sa.select(table.c.reader_id, table.c.start_id, table.c.expires_at)
            .where(table.c.stream == stream)
            .order_by(table.c.started_at, table.c.reader_id)
        )
        return [
            RunningReader(
                reader_id=row.reader_id,
                start_id=row.start_id,
                expires_at=from_db_time(row.expires_at) or row.expires_at,
            )
            for row in rows
        ]


def reader_expiry(
    started: datetime,
    *,
    attempt_timeout: timedelta,
    heartbeat_timeout: timedelta | None = None,
    retry_interval: timedelta | None = None,
) -> datetime:
    """When a running connection's row stops holding retention, should nobody delete it.

    What bounds a connection's life is its attempt's ``start_to_close`` timeout
    (``max_connection_age + connect_timeout + idle_timeout`` and a margin, see
    ``workflows/stream.py``): the SDK cancels an attempt then, even one whose heartbeats
    no longer reach Temporal, and the attempt flushes what it read (the gaps it opens
    included) before it returns, hence :data:`READER_MARGIN`. A worker that dies is
    noticed after ``heartbeat_timeout``, and its retry starts after at most the retry
    policy's longest interval; the retry starts where the dead attempt began, or at the
    lagging id if that moved past it (what lies between is no longer the fence's to
    keep), and registers a row of its own as it starts. So a row that outlives the
    attempt's own timeout by those two and the margin has covered everything that attempt
    can still write, and a crashed worker's row holds retention for one connection's
    life at most (65 minutes with the default settings), never for ever.
    """
    margin = READER_MARGIN
    if heartbeat_timeout is not None:
        margin += heartbeat_timeout
    if retry_interval is not None:
        margin += retry_interval
    return started + attempt_timeout + margin
