"""The event log (``sse_events``), the checkpoint row (``sse_checkpoints``) and the gap
records (``sse_gaps``).

The log is the system of record: a batch is committed before any cursor moves past
it (invariant 1), and every event is keyed ``(stream, event_id, follower_key)`` (see
:mod:`durable_sse.log.keys`) so that replays are absorbed by ``ON CONFLICT DO NOTHING``
(invariant 2); an event whose key is stored with another type or data (a server
that restarted its id counter) is no re-send, and is kept under an extended key
(:meth:`EventLog._keep_reused`). A batch carries the
gap changes the reader derived from it (:mod:`durable_sse.gaps`); they are applied in
the batch's own transaction, so no cursor passes a drop signal before its gap record is
durable (invariant 5).

Blocking SQLAlchemy/driver calls run in a small dedicated thread pool, never on the
event loop. Batches are group-committed (``durable_sse.log.commits``): one transaction takes
every batch waiting, from any stream, and commits follow submission order. On PostgreSQL
a large batch is COPYed into a per-connection temporary table and moved with one
``INSERT … SELECT … ON CONFLICT DO NOTHING`` (see ``bench/insert_rate.py``), a small
one is one multi-row ``INSERT``; SQLite uses an ``executemany`` of the same insert. A
large group whose ids all sort after what is stored (the live case) is COPYed straight
into ``sse_events`` instead, and written again through staging should it meet a stored
key (``bench/lean_log.py`` measures both).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
import sqlite3
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection

from durable_sse.contracts import AdvanceResult, CheckpointState
from durable_sse.errors import BatchRefusedError, StoreError
from durable_sse.gaps import (
    Gap,
    GapChange,
    GapKind,
    GapState,
    GapSummary,
    GapTotals,
    StreamContext,
    apply_change,
    choose_start,
    lagging_target,
    numeric_span,
    summarize,
)
from durable_sse.ids import IdOrder, contiguous_number, key_function, sort_key
from durable_sse.log.commits import CommitGroup, CommitJob, CommitQueue
from durable_sse.log.keys import (
    CARRIER_KEY,
    FOLLOWER_WINDOW,
    data_digest,
    follower_key,
    reused_key,
)
from durable_sse.log.retention import (
    BATCH_ROWS,
    HELD_BY_NO_LAGGING,
    MAX_BATCHES,
    ConsumerHold,
    Fence,
    RunningReader,
    after_horizon,
    check_id_order,
    choose_deletions,
    live_starts,
    opening_past_horizon,
    retention_fence,
)
from durable_sse.log.schema import (
    EVENTS_CHANNEL,
    EVENTS_TABLE,
    RETENTION_TABLE,
    STAGING_COLUMNS,
    STAGING_TABLE,
    STREAM_LOCK_CLASS,
    checkpoints_table,
    create_schema,
    describe_database,
    error_summary,
    events_table,
    from_db_time,
    gaps_table,
    make_engine,
    readers_table,
    retention_table,
    stream_lock_key,
    to_utc,
)
from durable_sse.reader.stored import StoredPage

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EVENT_COLUMNS = STAGING_COLUMNS[1:]
_DIGEST = STAGING_COLUMNS.index("digest")
"""Index of ``digest`` in a staging row (``follower_key`` is 4, ``id_key`` 5)."""
_COPY_SQL = f"COPY {STAGING_TABLE} ({', '.join(STAGING_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_MOVE_SQL = (
    f"INSERT INTO {EVENTS_TABLE} ({', '.join(_EVENT_COLUMNS)}) "
    f"SELECT {', '.join(_EVENT_COLUMNS)} FROM {STAGING_TABLE} ORDER BY pos "
    "ON CONFLICT DO NOTHING"
)
_COPY_LOG_SQL = f"COPY {EVENTS_TABLE} ({', '.join(_EVENT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = (
    "int4",  # pos
    "text",  # stream
    "text",  # event_id
    "int4",  # event_ord
    "bytea",  # follower_key
    "bytea",  # id_key
    "text",  # event_type
    "text",  # data
    "bytea",  # data_bytes
    "bytea",  # digest
    "timestamptz",  # received_at
)
"""Binary COPY: a third of text COPY's client time per row (``bench/lean_log.py``)."""
_RETURNING = " RETURNING stream, event_id, follower_key"
_STORED_KEYS_SQL = (
    f"SELECT event_id, follower_key, digest FROM {EVENTS_TABLE} "
    "WHERE stream = %s AND id_key IS NOT NULL AND {after} ORDER BY id_key LIMIT %s"
)
_SQLITE_INSERT_SQL = (
    f"INSERT INTO {EVENTS_TABLE} ({', '.join(_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _EVENT_COLUMNS)}) ON CONFLICT DO NOTHING"
)
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
_HORIZONS_SQL = (
    f"SELECT stream, horizon_key, horizon_id FROM {RETENTION_TABLE} "
    "WHERE horizon_key IS NOT NULL AND "
)
_RETENTION_LOCK = zlib.crc32(b"durable-sse:retention") - 2**31
"""First key of the PostgreSQL advisory lock that retention's deletes take exclusively and
gap openings and connection starts take shared, per stream (the second key is the
stream's; the two-key space is apart from the schema lock's single key)."""
_WORKERS = 16
"""Threads for database calls: the commit lanes plus checkpoint reads and writes."""
POSTGRES_LANES = 4
"""Group transactions written at once on PostgreSQL: a hot stream's next batch is written
while the previous one commits, and quiet streams' batches gather behind a busy lane."""
MAX_GROUP_ROWS = 5000
"""Rows one group transaction takes (a larger batch still goes in whole, alone)."""
SMALL_BATCH = 64
"""Up to this many rows, one multi-row INSERT beats COPY into the staging table (two
statements more per commit); above it COPY wins (see bench/insert_rate.py)."""
ConsumerHolds = Callable[[Connection, str, datetime], Sequence[ConsumerHold]]
"""``(connection, stream, now)`` -> what consumer groups hold of the stream (a hook: the
consumer package sits above the event log)."""
_UNSTORABLE_TEXT = (UnicodeEncodeError, psycopg.DataError)
_BATCH_FAULTS = ("22", "23", "54", "P0")
"""SQLSTATE classes an error of one batch's own making raises: data exception,
integrity constraint, program limit (a key too large for its index), a PL/pgSQL
``RAISE`` (a trigger that refuses rows)."""


@dataclass(slots=True)
class EventRecord:
    """One event as the reader hands it over for persisting; never changed once made.

    Not frozen: a frozen dataclass costs more than twice as much to build, and the
    reader builds one per event.
    """

    event_id: str
    """The id in force ("" when none: such events are never deduplicated)."""
    event_ord: int | None
    """0 for the event carrying the id, 1, 2, … for id-less followers; None when no id."""
    event_type: str
    data: str
    received_at: datetime
    """Tz-aware; stored as UTC."""
    follower_key: bytes | None = None
    """What tells an id-less follower apart (``durable_sse.log.keys.FollowerKeys``, which
    counts identical followers on the connection); None: derived from type and data."""
    id_key: bytes | None = None
    """``sort_key(event_id, order)`` when the reader computed it already (None: computed
    here); the stream's id order is the only one a batch is written with."""
    digest: bytes | None = None
    """``data_digest`` of the event that carried the id (this one's own for a carrier, its
    carrier's for a follower; None: computed here for a carrier, unknown for a follower):
    what tells a reused id from a re-sent event (:mod:`durable_sse.log.keys`)."""


@dataclass(frozen=True)
class BatchPayload:
    """What the writer needs for one batch: its rows and the gap changes it carries."""

    order: IdOrder
    events: Sequence[EventRecord]
    gap_changes: Sequence[GapChange] = ()


@dataclass(frozen=True)
class ConnectionStart:
    """Where a connection resumes, and what it knows of its stream as it connects."""

    cursor: str | None
    source: str
    """Which store answered: l1, l2, gap, lagging, floor, explicit, heartbeat, none."""
    context: StreamContext


@dataclass(frozen=True)
class StoredEvent:
    """One event as stored, its data exact (see :meth:`EventLog.events`)."""

    seq: int
    event_id: str
    event_ord: int | None
    event_type: str
    data: str
    received_at: datetime


@dataclass(frozen=True)
class ReaderLease:
    """A running connection's registration (see :class:`~durable_sse.log.retention.RunningReader`):
    who it is and until when, at most, its start holds retention's fence."""

    reader_id: str
    expires_at: datetime


@dataclass(frozen=True)
class HorizonDrop:
    """What the write path left out of one batch because of the retention horizon."""

    count: int
    first_id: str
    """The first id it dropped (for the log line)."""
    horizon_id: str | None
    """The horizon: the newest id retention deleted."""


@dataclass(frozen=True)
class InsertResult:
    new_rows: int
    duplicates: int
    """Events of the batch that were already stored (or repeated within the batch)."""
    reused: tuple[str, ...] = ()
    """Ids of the batch's events that carried an id stored with another type or data (a
    server that restarted its counter): kept under an extended key, so counted in
    ``new_rows``, never in ``duplicates``."""
    dropped_by_horizon: int = 0
    """Events of the batch whose id sorts at or before the stream's retention horizon:
    neither stored nor duplicates (they may never have been stored; see
    :mod:`durable_sse.log.retention`)."""
    dropped_id: str | None = None
    """The first id the horizon dropped."""
    horizon_id: str | None = None
    """The horizon they were dropped at."""


class EventLog:
    """Async access to the event log and checkpoint rows of one database.

    Build one per process (the worker is the composition root); the constructor does
    no I/O, :meth:`create_schema` is the first call that touches the database.
    Database failures surface as :class:`~durable_sse.errors.StoreError`.
    """

    def __init__(
        self,
        database_url: str,
        *,
        connect_timeout: int = 5,
        consumer_holds: ConsumerHolds | None = None,
    ) -> None:
        """``consumer_holds``: what consumer groups keep of a stream, read in each
        retention delete's transaction (:func:`durable_sse.consume.retention_holds`;
        the worker, which runs retention, passes it). None: retention ignores consumers."""
        self._engine = make_engine(database_url, connect_timeout=connect_timeout)
        self._consumer_holds = consumer_holds
        self._where = describe_database(self._engine.url)
        self._executor = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="sse-db")
        self._closed = False
        self.optimistic_copy = True
        """PostgreSQL: COPY a large group whose ids all sort after what is stored straight
        into ``sse_events`` (see :meth:`_stage`); False: always through the staging table
        (benchmarks compare both)."""
        self._newest: dict[str, bytes | None] = {}
        """Per stream, the newest id key this process saw committed (None: none stored).
        A hint only: a stale one costs one rolled-back attempt, never a row."""
        self.direct_copies = 0
        """Groups COPYed straight into ``sse_events`` and committed."""
        self.order_commits = True
        """PostgreSQL: a group transaction locks its streams before writing their rows, so
        each stream's rows become visible in ``seq`` order even with two writers (see
        :meth:`_order_and_notify`). Only benchmarks turn it off, to measure its cost."""
        self.notify_commits = True
        """PostgreSQL: a group transaction notifies each stream it writes once
        (:data:`~durable_sse.log.schema.EVENTS_CHANNEL`). Only benchmarks turn it off."""
        self.optimistic_fallbacks = 0
        """Optimistic COPYs that met a stored key and were written again through staging."""
        self._commits = CommitQueue(
            self._write_group_guarded,
            self._executor,
            # SQLite has one writer at a time: a second lane would only wait for the lock.
            lanes=POSTGRES_LANES if self.dialect == "postgresql" else 1,
            max_group_rows=MAX_GROUP_ROWS,
        )
        time_type = events_table.c.received_at.type.dialect_impl(self._engine.dialect)
        self._sqlite_time: Callable[[datetime], Any] = (
            time_type.bind_processor(self._engine.dialect) or _identity
        )

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self._engine.dialect.name

    @property
    def engine(self) -> sa.Engine:
        """The underlying engine (benchmarks and ad-hoc queries)."""
        return self._engine

    @property
    def commits(self) -> CommitQueue:
        """The group-commit queue (its counters tell how well batches were grouped)."""
        return self._commits

    async def create_schema(self) -> None:
        await self._run("create the schema", create_schema, self._engine)

    def submit_batch(
        self,
        stream: str,
        id_order: str,
        events: Sequence[EventRecord],
        *,
        after: CommitJob | None = None,
        gap_changes: Sequence[GapChange] = (),
    ) -> CommitJob:
        """Queue a batch (and the gap changes it carries) for the next group commit.

        Batches commit in the order they are submitted; one submitted ``after`` another
        is left out (its future fails) if that one was not committed. Await the result
        with :meth:`committed`. A batch may hold gap changes and no events.
        """
        self._refuse_if_closed("insert events")
        payload = BatchPayload(IdOrder(id_order), events, tuple(gap_changes))
        return self._commits.submit(stream, payload, len(events), after=after)

    async def committed(self, job: CommitJob) -> InsertResult:
        """Wait for a submitted batch to commit; cancelling the wait leaves the batch be."""
        new_rows = await _outlast_cancellation(job.future)
        drop = job.dropped
        reused = tuple(job.reused)
        if not isinstance(drop, HorizonDrop) or not drop.count:
            return InsertResult(new_rows=new_rows, duplicates=job.rows - new_rows, reused=reused)
        return InsertResult(
            new_rows=new_rows,
            duplicates=job.rows - new_rows - drop.count,
            reused=reused,
            dropped_by_horizon=drop.count,
            dropped_id=drop.first_id,
            horizon_id=drop.horizon_id,
        )

    async def insert_batch(
        self, stream: str, id_order: str, events: Sequence[EventRecord]
    ) -> InsertResult:
        """Persist a batch (committed when this returns); already stored events are skipped."""
        if not events:
            return InsertResult(new_rows=0, duplicates=0)
        return await self.committed(self.submit_batch(stream, id_order, events))

    async def floor(self, stream: str) -> str | None:
        """The newest persisted id under the stream's id order (max ``id_key``, not max seq)."""
        return await self._run(f"read the floor of stream {stream!r}", self._newest_sync, stream)

    async def newest_id_at_or_before(self, stream: str, when: datetime) -> str | None:
        """The newest id (under the id order) among events received at or before ``when``."""
        return await self._run(
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
        return await self._run(
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
        return await self._run(
            f"read the stored keys of stream {stream!r}",
            self._stored_keys_sync,
            stream,
            IdOrder(id_order),
            after,
            limit,
        )

    async def get_checkpoint(self, stream: str) -> CheckpointState | None:
        return await self._run(
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
        return await self._run(
            f"advance the lagging id of stream {stream!r}",
            self._advance_sync,
            stream,
            IdOrder(id_order),
            cutoff,
        )

    async def connection_context(
        self,
        stream: str,
        id_order: str,
        *,
        cursor: str | None,
        source: str,
        repair: bool = False,
        from_oldest: bool = False,
        reader: ReaderLease | None = None,
    ) -> ConnectionStart:
        """One transaction as a connection starts: its cursor when the caches had none,
        and the lagging id, floor, open gaps and witness of the cursor (see
        ``StreamContext``).

        ``repair``: the lagged route. Start one stored id before the oldest open gap's
        resume point, so the first event re-delivered shows whether the server's history
        still reaches the gap; with no gap open, start from the lagging id.
        ``from_oldest``: with no cursor and no lagging id, start at the oldest stored id
        rather than the floor (see :func:`durable_sse.gaps.choose_start`).
        ``reader``: register the connection in ``sse_readers`` with the cursor chosen, in
        the same transaction (so no retention delete falls between choosing a cursor and
        holding its rows); registering the same reader again moves its start.

        The stream's ``id_order`` is recorded in ``sse_checkpoints`` by its first
        connection; a later one under another order raises
        :class:`~durable_sse.errors.IdOrderMismatchError` and touches nothing.
        """
        return await self._run(
            f"read the state of stream {stream!r}",
            self._context_sync,
            stream,
            IdOrder(id_order),
            cursor,
            source,
            repair,
            from_oldest,
            reader,
        )

    async def move_reader(self, stream: str, reader_id: str, hold: str | None) -> None:
        """A running connection needs less kept: from ``hold`` on (see
        ``Intake.retention_hold``; it only moves forward). A released reader stays gone."""
        await self._run(
            f"move a reader of stream {stream!r}", self._move_sync, stream, reader_id, hold
        )

    async def release_reader(self, stream: str, reader_id: str) -> None:
        """The connection ended: its start no longer holds retention."""
        await self._run(
            f"release a reader of stream {stream!r}", self._release_sync, stream, reader_id
        )

    async def readers(self, stream: str) -> list[RunningReader]:
        """The stream's registered connections, expired ones included (tests, tools)."""
        return await self._run(f"read the readers of stream {stream!r}", self._readers_sync, stream)

    async def gap_summary(self, stream: str, id_order: str) -> GapSummary:
        """The stream's open gaps by name and all its gaps by count."""
        return await self._run(
            f"read the gaps of stream {stream!r}", self._summary_sync, stream, IdOrder(id_order)
        )

    async def gaps(self, stream: str) -> list[Gap]:
        """Every gap record of the stream, oldest first (tests and the status tools)."""
        return await self._run(f"read the gaps of stream {stream!r}", self._gaps_sync, stream)

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
        one at or after the fence (:func:`durable_sse.log.retention.retention_fence`).

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
        left (:func:`durable_sse.log.retention.opening_past_horizon`).

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
            batch = await self._run(
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
        return await self._run(
            f"read the retention of stream {stream!r}", self._retention_state_sync, stream
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._engine.dispose)
        self._executor.shutdown(wait=False)

    # -- plumbing -------------------------------------------------------------------

    async def _run(self, action: str, function: Callable[..., T], *args: Any) -> T:
        self._refuse_if_closed(action)
        loop = asyncio.get_running_loop()
        call = functools.partial(self._guarded, action, function, *args)
        return await _outlast_cancellation(loop.run_in_executor(self._executor, call))

    def _refuse_if_closed(self, action: str) -> None:
        if self._closed:
            raise StoreError(f"{self._where}: the event log is closed (while trying to {action})")

    def _guarded(self, action: str, function: Callable[..., T], *args: Any) -> T:
        try:
            return function(*args)
        except StoreError:
            raise
        except (sa.exc.SQLAlchemyError, psycopg.Error, sqlite3.Error) as error:
            raise self._store_error(error, action) from error

    def _store_error(self, error: BaseException, action: str) -> StoreError:
        if isinstance(error, StoreError):
            return error
        if isinstance(error, sa.exc.DBAPIError) and error.statement is None:
            # Raised while connecting: no statement ran.
            failure = StoreError(f"{self._where} is unreachable: {error_summary(error)}")
        else:
            failure = StoreError(f"{self._where} failed to {action}: {error_summary(error)}")
        failure.__cause__ = error
        return failure

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        with self._engine.connect() as connection, connection.begin():
            yield connection

    def _insert_stmt(self) -> Any:
        module = pg_dialect if self.dialect == "postgresql" else sqlite_dialect
        return module.insert

    # -- events ---------------------------------------------------------------------

    def _write_group_guarded(self, group: CommitGroup) -> None:
        streams = sorted({job.stream for job in group.jobs})
        what = f"stream {streams[0]!r}" if len(streams) == 1 else f"{len(streams)} streams"
        self._guarded(f"insert events of {what}", self._write_group, group)

    def _write_group(self, group: CommitGroup) -> None:
        """One transaction for every batch of the group that has not been left out.

        Rows are prepared (and COPYed into the staging table) while earlier groups still
        work; they enter ``sse_events`` only after the previous group's rows did, so
        ``seq`` follows submission order, and the commit waits for the previous group's
        commit. When the transaction fails for what one batch holds (invariant 7: a
        trigger, a constraint, a value the database refuses), each batch is written
        again alone: the others commit, the bad one fails with its own error.
        """
        clean = False
        optimistic = self.optimistic_copy and self.dialect == "postgresql"
        while jobs := [job for job in group.jobs if not job.failed]:
            try:
                self._write_jobs(group, jobs, clean=clean, optimistic=optimistic)
            except _Rewrite:
                continue
            except Exception as error:
                if optimistic and isinstance(error, psycopg.errors.UniqueViolation):
                    # A COPY straight into the log met a stored key (two attempts writing
                    # at once, another worker, ids out of order): write the group again
                    # through staging, and look the streams' newest ids up afresh.
                    optimistic = False
                    self.optimistic_fallbacks += 1
                    for job in jobs:
                        self._newest.pop(job.stream, None)
                    continue
                if isinstance(error, _UNSTORABLE_TEXT) and not clean:
                    # Lone surrogates (no SSE stream carries them, a caller of the API
                    # can): data keeps them exactly in data_bytes, ids and types get
                    # U+FFFD rather than wedge the stream on them. Loud, never silent.
                    logger.warning(
                        "a batch holds characters the database cannot store as text, "
                        "writing it again with data in data_bytes and U+FFFD in ids and "
                        "types (%s)",
                        error_summary(error),
                    )
                    clean = True
                    continue
                if not _fault_of_a_batch(error):
                    raise
                if len(jobs) == 1:
                    self._refuse(jobs[0], error)  # the same message as in a group
                else:
                    self._write_alone(group, jobs, error, clean=clean)
            return

    def _refuse(self, job: CommitJob, error: BaseException) -> None:
        """Fail one batch that the database refused for its own data, loudly."""
        logger.warning(
            "stream %s: the database refused a batch (%s); the other batches of its "
            "group, if any, were written without it",
            job.stream,
            error_summary(error),
        )
        job.failed = True
        job.error = BatchRefusedError(
            f"{self._where} refused a batch of stream {job.stream!r}: {error_summary(error)} "
            "(the other streams' batches of its group, if any, committed)"
        )
        job.error.__cause__ = error

    def _write_jobs(
        self,
        group: CommitGroup,
        jobs: list[CommitJob],
        *,
        clean: bool,
        optimistic: bool = False,
        rows_written: bool = True,
    ) -> None:
        """Write ``jobs`` in one transaction (see :data:`durable_sse.log.commits.GroupWriter`);
        raises ``_Rewrite`` when some of them must be left out."""
        newest: dict[str, bytes] = {}
        dropped: list[HorizonDrop | None] = []
        with self._begin() as connection:
            insert = self._stage(
                connection,
                jobs,
                clean=clean,
                optimistic=optimistic,
                newest=newest,
                dropped=dropped,
            )
            group.wait_for_previous_rows()
            self._order_and_notify(connection, jobs)
            counts, reused = insert()
            for job, count in zip(jobs, counts, strict=True):
                if job.payload.gap_changes:
                    self._apply_gap_changes(connection, job.stream, job.payload, count)
            if group.wait_turn():
                raise _Rewrite  # roll back: some batches must not commit
            if rows_written:
                group.rows_written.set()
        for index, (job, count, drop) in enumerate(zip(jobs, counts, dropped, strict=True)):
            job.new_rows = count
            job.dropped = drop
            if reused is not None:
                job.reused = reused[index]
        for stream, key in newest.items():
            # Only streams whose newest id was looked up (and not forgotten since, by a
            # fallback): a hint built from this process's commits alone would miss what
            # another worker wrote.
            known = self._newest.get(stream, _UNKNOWN)  # lanes share it: no check-then-get
            if known is not _UNKNOWN and (known is None or key > known):
                self._newest[stream] = key

    def _order_and_notify(self, connection: Connection, jobs: list[CommitJob]) -> None:
        """PostgreSQL: lock the group's streams, and queue one ``NOTIFY`` per stream.

        Why the lock: ``seq`` comes from one sequence shared by every stream and is taken
        as a row is inserted, long before its commit. Two writers of one stream (a retried
        attempt and its predecessor, two workers during a handover) could otherwise
        commit a later ``seq`` first, and a consumer reading ``seq > position`` would pass
        the earlier one for good. A transaction-scoped advisory lock per stream, taken
        before any row of the stream is inserted and held to the commit, makes a stream's
        rows enter and become visible in ``seq`` order across processes (within one
        process the commit queue already does). Gap markers are placed under it too.

        Why it cannot deadlock: the locks are taken in one statement, in key order, so
        two transactions never wait for each other's locks in a cycle; and they are taken
        only after :meth:`CommitGroup.wait_for_previous_rows`, so while a transaction
        holds them the one in-process wait left (``wait_turn``: the previous group's
        commit) is for a transaction that has taken all its locks, written all its rows
        and is committing, which waits for no lock of anyone's. A cycle through an
        in-process wait, which PostgreSQL could not detect, therefore cannot form.

        The ``NOTIFY`` (delivered on commit, dropped on rollback, deduplicated per
        transaction) wakes consumers (:mod:`durable_sse.consume.wakeup`); it rides the
        same statement, so a group pays one round trip for both.
        """
        if self.dialect != "postgresql" or not (self.order_commits or self.notify_commits):
            return
        streams = sorted(
            {job.stream for job in jobs}, key=lambda name: (stream_lock_key(name), name)
        )
        calls = []
        if self.order_commits:
            calls.append("count(pg_advisory_xact_lock(%s, t.k))")
        if self.notify_commits:
            calls.append("count(pg_notify(%s, t.s))")
        params: list[Any] = []
        if self.order_commits:
            params.append(STREAM_LOCK_CLASS)
        if self.notify_commits:
            params.append(EVENTS_CHANNEL)
        params += [[stream_lock_key(name) for name in streams], streams]
        with _driver(connection).cursor() as cursor:
            # unnest yields the arrays in order: the locks are taken in key order.
            cursor.execute(
                f"SELECT {', '.join(calls)} FROM unnest(%s::int4[], %s::text[]) AS t(k, s)",
                params,
            )

    def _write_alone(
        self, group: CommitGroup, jobs: list[CommitJob], error: Exception, *, clean: bool
    ) -> None:
        """Write each batch of a failed group in a transaction of its own, in order.

        A batch that fails for its own data gets its error and is not committed (nor is
        any batch submitted after it); an error that is no batch's fault (the database
        went away) fails the batches not yet written, and only those.
        """
        logger.warning(
            "a group transaction of %d batches failed (%s): writing each batch alone",
            len(jobs),
            error_summary(error),
        )
        for index, job in enumerate(jobs):
            while not job.failed:
                try:
                    self._write_jobs(group, [job], clean=clean, rows_written=False)
                    break
                except _Rewrite:
                    continue  # a later batch was left out; write this one again
                except Exception as own:
                    if not _fault_of_a_batch(own):
                        failure = self._store_error(own, f"insert events of stream {job.stream!r}")
                        for rest in jobs[index:]:
                            if not rest.failed:
                                rest.failed, rest.error = True, failure
                        return
                    self._refuse(job, own)

    def _stage(
        self,
        connection: Connection,
        jobs: list[CommitJob],
        *,
        clean: bool,
        optimistic: bool = False,
        newest: dict[str, bytes] | None = None,
        dropped: list[HorizonDrop | None] | None = None,
    ) -> Callable[[], _Inserted]:
        """Prepare the rows (a large set goes into the staging table now); returns the
        call that inserts them into the log and counts each batch's new rows and reused
        ids (:meth:`_keep_reused`).

        On PostgreSQL the whole group is one statement: one ``INSERT`` per batch would
        serialise a round trip per quiet stream behind the previous group's rows.
        ``optimistic``: a large group whose every id sorts after its stream's newest
        stored id (the common live case) cannot conflict, so it is COPYed straight into
        ``sse_events``, every row new; should it meet a stored key after all, the
        unique violation rolls it back and the caller writes it through staging.
        ``newest`` receives each stream's newest id key in the group, ``dropped`` what
        the retention horizon left out of each batch (None: nothing), in job order.
        """
        rows: list[tuple[Any, ...]] = []
        spans: list[tuple[int, int]] = []
        horizons = self._horizons(connection, jobs)
        # ``pos`` of the next row: unique and increasing across the group whatever the
        # horizon filter leaves out (``seq`` follows it).
        position = 0
        for job in jobs:
            order, events = job.payload.order, job.payload.events
            start = len(rows)
            batch_rows = _rows(job.stream, order, events, start=position, clean=clean)
            position += len(events)
            drop = None
            if job.stream in horizons:
                horizon, horizon_id = horizons[job.stream]
                kept = _after_horizon(batch_rows, horizon)
                if len(kept) < len(batch_rows):
                    first = next(row[2] for row in batch_rows if not after_horizon(row[5], horizon))
                    drop = HorizonDrop(len(batch_rows) - len(kept), first, horizon_id)
                batch_rows = kept
            if dropped is not None:
                dropped.append(drop)
            rows.extend(batch_rows)
            spans.append((start, len(rows)))
            if newest is not None:
                keys = [row[5] for row in rows[start:] if row[5] is not None]
                if keys:
                    top = max(keys)
                    if job.stream not in newest or top > newest[job.stream]:
                        newest[job.stream] = top
        if self.dialect != "postgresql":

            def insert_sqlite() -> _Inserted:
                counts = [self._insert_sqlite(connection, rows[a:b]) for a, b in spans]
                return counts, self._keep_reused(connection, rows, spans, counts)

            return insert_sqlite
        if not rows:
            return lambda: ([0] * len(spans), None)  # gap changes only
        several = len(spans) > 1  # then count each batch's rows from what was inserted
        staged = False
        if len(rows) <= SMALL_BATCH:
            insert = functools.partial(self._insert_values, connection, rows, several)
        elif optimistic and self._all_new(connection, jobs, rows, spans):
            # Every row new: none can meet a stored key, so no id can be a reused one (a
            # key met after all is a unique violation: the group goes through staging).
            counts = [end - begin for begin, end in spans]

            def copy_into_log() -> _Inserted:
                self._copy_rows(connection, _COPY_LOG_SQL, rows, skip=1)
                self.direct_copies += 1  # not yet committed: tests read it after
                return counts, None

            return copy_into_log
        else:
            self._copy_to_staging(connection, rows)
            insert = functools.partial(self._move_staged, connection, several)
            staged = True

        def insert_and_count() -> _Inserted:
            inserted = insert()
            counts = _new_rows_per_batch(inserted, rows, spans) if several else [inserted]
            return counts, self._keep_reused(connection, rows, spans, counts, staged=staged)

        return insert_and_count

    def _keep_reused(
        self,
        connection: Connection,
        rows: list[tuple[Any, ...]],
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
            reused = self._reused_staged(connection, rows)
        else:
            reused = self._reused_looked_up(connection, rows, spans, met)
        if not reused:
            return None
        extended = [_extended(rows[index]) for index in reused]
        if self.dialect == "postgresql":
            inserted: set[tuple[str, str, bytes]] = set()
            for start in range(0, len(extended), _EXTENDED_CHUNK):
                part = extended[start : start + _EXTENDED_CHUNK]
                returned = self._insert_values(connection, part, True)
                inserted.update(
                    (stream, event_id, bytes(key)) for stream, event_id, key in returned
                )
            kept = []
            for row in extended:
                key = (row[1], row[2], row[4])
                kept.append(key in inserted)
                inserted.discard(key)  # a key repeated in the group went in from its first row
        else:
            kept = [self._insert_sqlite(connection, [row]) == 1 for row in extended]
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

    def _reused_staged(self, connection: Connection, rows: list[tuple[Any, ...]]) -> list[int]:
        """Indexes in ``rows`` of the staged rows whose key is stored under another digest."""
        with _driver(connection).cursor() as cursor:
            cursor.execute(_REUSED_STAGED_SQL)
            positions = [pos for (pos,) in cursor.fetchall()]
        if not positions:
            return []
        index_of = {row[0]: index for index, row in enumerate(rows)}
        return [index_of[pos] for pos in positions]

    def _reused_looked_up(
        self,
        connection: Connection,
        rows: list[tuple[Any, ...]],
        spans: list[tuple[int, int]],
        met: list[int],
    ) -> list[int]:
        """Indexes in ``rows`` (of the batches in ``met``) whose key is stored under
        another digest: the stored digests of their ids, looked up by the event key."""
        candidates = [
            index
            for batch in met
            for index in range(*spans[batch])
            if rows[index][_DIGEST] is not None and rows[index][4] is not None
        ]
        by_stream: dict[str, set[str]] = {}
        for index in candidates:
            by_stream.setdefault(rows[index][1], set()).add(rows[index][2])
        stored: dict[tuple[str, str, bytes], bytes] = {}
        for stream, names in by_stream.items():
            ordered = sorted(names)
            for start in range(0, len(ordered), _DIGEST_CHUNK):
                chunk = ordered[start : start + _DIGEST_CHUNK]
                if self.dialect == "postgresql":
                    sql = _STORED_DIGESTS_SQL.format(
                        stream="%s", ids=", ".join(["%s"] * len(chunk))
                    )
                    with _driver(connection).cursor() as cursor:
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
            digest = stored.get((row[1], row[2], row[4]))
            if digest is not None and digest != row[_DIGEST]:
                reused.append(index)
        return reused

    def _insert_sqlite(self, connection: Connection, rows: list[tuple[Any, ...]]) -> int:
        # Plain driver executemany: SQLAlchemy's per-row bind processing would halve the
        # rate; the one conversion needed (datetime -> text) uses SQLAlchemy's own
        # processor, so stored times compare with those bound by SQLAlchemy queries.
        if not rows:
            return 0
        to_text = self._sqlite_time
        params = [(*row[1:-1], to_text(row[-1])) for row in rows]
        result = connection.exec_driver_sql(_SQLITE_INSERT_SQL, params)
        return max(result.rowcount, 0)

    def _insert_values(
        self, connection: Connection, rows: list[tuple[Any, ...]], returning: bool
    ) -> Any:
        """A small set as one ``INSERT ... VALUES ... ON CONFLICT DO NOTHING``.

        Returns the number of new rows, or with ``returning`` the keys of the new rows.
        """
        width = len(_EVENT_COLUMNS)
        values = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(rows))
        statement = (
            f"INSERT INTO {EVENTS_TABLE} ({', '.join(_EVENT_COLUMNS)}) VALUES {values} "
            f"ON CONFLICT DO NOTHING{_RETURNING if returning else ''}"
        )
        params = [value for row in rows for value in row[1:]]
        with _driver(connection).cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if returning else max(cursor.rowcount, 0)

    def _copy_to_staging(self, connection: Connection, rows: list[tuple[Any, ...]]) -> None:
        self._copy_rows(connection, _COPY_SQL, rows)

    def _copy_rows(
        self, connection: Connection, sql: str, rows: list[tuple[Any, ...]], *, skip: int = 0
    ) -> None:
        with _driver(connection).cursor() as cursor, cursor.copy(sql) as copy:
            copy.set_types(list(_COPY_TYPES[skip:]))
            if skip:
                for row in rows:
                    copy.write_row(row[skip:])
            else:
                for row in rows:
                    copy.write_row(row)

    def _all_new(
        self,
        connection: Connection,
        jobs: list[CommitJob],
        rows: list[tuple[Any, ...]],
        spans: list[tuple[int, int]],
    ) -> bool:
        """Whether every id of the group sorts after its stream's newest stored id, as
        far as this process knows (a stream it has not written yet is looked up once)."""
        unknown = sorted({job.stream for job in jobs} - self._newest.keys())
        if unknown:
            self._newest.update(self._newest_keys(connection, unknown))
        for job, (start, end) in zip(jobs, spans, strict=True):
            floor = self._newest.get(job.stream)
            if floor is None:
                continue
            for row in rows[start:end]:
                key = row[5]
                if key is not None and key <= floor:
                    return False
        return True

    def _newest_keys(self, connection: Connection, streams: list[str]) -> dict[str, bytes | None]:
        events = events_table
        found: dict[str, bytes | None] = {}
        for stream in streams:
            key = connection.execute(_newest_row(stream, events.c.id_key)).scalar_one_or_none()
            found[stream] = None if key is None else bytes(key)
        return found

    def _move_staged(self, connection: Connection, returning: bool) -> Any:
        """``INSERT … SELECT`` the staged rows: the count of new rows, or their keys."""
        with _driver(connection).cursor() as cursor:
            cursor.execute(_MOVE_SQL + (_RETURNING if returning else ""))
            return cursor.fetchall() if returning else max(cursor.rowcount, 0)

    def _newest_sync(self, stream: str, when: datetime | None = None) -> str | None:
        query = _newest_row(stream, events_table.c.event_id)
        if when is not None:
            query = query.where(events_table.c.received_at <= when)
        with self._begin() as connection:
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
        with self._begin() as connection:
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
        with self._begin() as connection:
            if self.dialect == "postgresql":
                # Plain tuples straight from the driver (a page is thousands of rows), and
                # the index's order: with no statistics yet (a young table) PostgreSQL
                # would read every row after the key and sort them, 50 times slower.
                with _driver(connection).cursor() as cursor:
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

    # -- checkpoint -----------------------------------------------------------------

    def _ensure_checkpoint(self, connection: Connection, stream: str, order: IdOrder) -> None:
        statement = (
            self._insert_stmt()(checkpoints_table)
            .values(stream=stream, id_order=order.value, updated_at=datetime.now(UTC))
            .on_conflict_do_nothing(index_elements=["stream"])
        )
        connection.execute(statement)

    def _check_order(self, connection: Connection, stream: str, order: IdOrder) -> str | None:
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

    def _hold_retention(self, connection: Connection, stream: str, *, exclusive: bool) -> None:
        """Order this transaction with the stream's retention deletes (see
        :meth:`apply_retention`): the deletes hold it ``exclusive``, gap openings and
        connection starts shared. On SQLite a write statement is enough: it takes the
        one write lock, so every read after it sees the last commit and nothing commits
        meanwhile (a write that matches no row takes it all the same)."""
        if self.dialect == "postgresql":
            function = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
            key = zlib.crc32(stream.encode("utf-8", "surrogatepass")) - 2**31
            connection.execute(
                sa.text(f"SELECT {function}(:a, :b)"), {"a": _RETENTION_LOCK, "b": key}
            )
        else:
            connection.execute(
                sa.update(retention_table)
                .where(retention_table.c.stream == stream)
                .values(stream=retention_table.c.stream)
            )

    def _get_checkpoint_sync(self, stream: str) -> CheckpointState | None:
        table = checkpoints_table
        with self._begin() as connection:
            row = connection.execute(sa.select(table).where(table.c.stream == stream)).first()
        if row is None:
            return None
        return CheckpointState(
            stream=row.stream,
            lagging_id=row.lagging_id,
            lagging_at=_iso(row.lagging_at),
            updated_at=_iso(row.updated_at),
        )

    def _advance_sync(self, stream: str, order: IdOrder, cutoff: datetime) -> AdvanceResult:
        events, table = events_table, checkpoints_table
        with self._begin() as connection:
            # A write first: on SQLite this takes the write lock before anything is read.
            self._ensure_checkpoint(connection, stream, order)
            self._check_order(connection, stream, order)
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
                self._open_gaps(connection, stream, lock=True),
                order,
            )
            target_at = None
            if target is not None:
                if candidate is not None and target == candidate.event_id:
                    target_at = candidate.received_at
                else:
                    target_at = self._received_at(connection, stream, target)
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
                sa.select(table.c.lagging_id).where(table.c.stream == stream)
            ).scalar_one()
        return AdvanceResult(lagging_id=lagging, moved=moved, held_by_gap=held, cap_id=cap)

    def _received_at(self, connection: Connection, stream: str, event_id: str) -> Any:
        events = events_table
        return connection.execute(
            sa.select(events.c.received_at)
            .where(events.c.stream == stream, events.c.event_id == event_id)
            .order_by(events.c.event_ord)
            .limit(1)
        ).scalar_one_or_none()

    # -- gaps -----------------------------------------------------------------------

    def _open_gaps(self, connection: Connection, stream: str, *, lock: bool = False) -> list[Gap]:
        query = sa.select(gaps_table).where(
            gaps_table.c.stream == stream, gaps_table.c.state == GapState.OPEN.value
        )
        if lock and self.dialect == "postgresql":
            query = query.with_for_update()
        return [_gap_from_row(row) for row in connection.execute(query)]

    def _apply_gap_changes(
        self, connection: Connection, stream: str, payload: BatchPayload, new_rows: int
    ) -> None:
        """Apply a batch's gap changes inside its transaction (see ``gaps.apply_change``).

        In order, each written before the next is applied: a gap closed earlier in the
        batch is among the ranges a later one must not count again
        (``_SqlStoredIds.counted_ranges`` reads them in this transaction). A batch that
        opens a gap takes the retention lock first and opens it after the stream's
        horizon (:func:`durable_sse.log.retention.opening_past_horizon`).
        """
        order = payload.order
        changes: list[GapChange] = list(payload.gap_changes)
        if any(change.opened is not None for change in changes):
            self._hold_retention(connection, stream, exclusive=False)
            changes = self._past_horizon(connection, stream, order, changes)
        ids = sorted({change.gap_id for change in changes})
        if not ids:
            return
        query = sa.select(gaps_table).where(
            gaps_table.c.stream == stream, gaps_table.c.gap_id.in_(ids)
        )
        if self.dialect == "postgresql":
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
        happened (:mod:`durable_sse.consume.reader`).

        The place is the stream's newest ``seq`` now (this transaction's rows included)
        and a *mark*, the next number among the stream's markers. Both only grow: on
        PostgreSQL the group transaction holds the stream's lock
        (:meth:`_order_and_notify`), on SQLite the one write lock, so no other writer of
        the stream is between the read and the commit. A gap marked after a consumer read
        the event at its ``seq`` still reaches it: the position counts marks apart.
        """
        events, table = events_table, gaps_table
        newest = connection.execute(
            sa.select(sa.func.max(events.c.seq)).where(events.c.stream == stream)
        ).scalar_one_or_none()
        marks = [
            connection.execute(
                sa.select(sa.func.max(column)).where(table.c.stream == stream)
            ).scalar_one_or_none()
            for column in (table.c.opened_mark, table.c.closed_mark)
        ]
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

    def _context_sync(
        self,
        stream: str,
        order: IdOrder,
        cursor: str | None,
        source: str,
        repair: bool,
        from_oldest: bool,
        reader: ReaderLease | None = None,
    ) -> ConnectionStart:
        events = events_table
        with self._begin() as connection:
            if reader is not None:
                self._hold_retention(connection, stream, exclusive=False)
            # A write first: on SQLite this takes the write lock before anything is read.
            self._ensure_checkpoint(connection, stream, order)
            lagging = self._check_order(connection, stream, order)
            open_gaps = self._open_gaps(connection, stream)
            floor = connection.execute(_newest_row(stream, events.c.event_id)).scalar_one_or_none()
            cursor, source, witness = choose_start(
                cursor=cursor,
                source=source,
                repair=repair,
                lagging_id=lagging,
                floor=floor,
                open_gaps=open_gaps,
                order=order,
                neighbour=lambda event_id, older: self._neighbour(
                    connection, stream, order, event_id, older=older
                ),
                oldest=(lambda: self._oldest(connection, stream)) if from_oldest else None,
            )
            # Rows without ids only matter to a connection with no cursor: a reconnect
            # of a stream that has read events cannot resume (gaps.no_resume).
            has_rows = floor is not None or (
                cursor is None
                and connection.execute(
                    sa.select(events.c.seq).where(events.c.stream == stream).limit(1)
                ).first()
                is not None
            )
            if reader is not None:
                self._register(connection, stream, reader, cursor)
        context = StreamContext(
            lagging_id=lagging,
            floor=floor,
            witness=witness,
            open_gaps=open_gaps,
            has_rows=has_rows,
        )
        return ConnectionStart(cursor=cursor, source=source, context=context)

    def _register(
        self, connection: Connection, stream: str, reader: ReaderLease, start: str | None
    ) -> None:
        """Upsert the reader's row (and forget the stream's expired ones)."""
        table, now = readers_table, datetime.now(UTC)
        connection.execute(
            sa.delete(table).where(table.c.stream == stream, table.c.expires_at <= now)
        )
        values = {"start_id": start, "started_at": now, "expires_at": to_utc(reader.expires_at)}
        connection.execute(
            self._insert_stmt()(table)
            .values(stream=stream, reader_id=reader.reader_id, **values)
            .on_conflict_do_update(index_elements=["stream", "reader_id"], set_=values)
        )

    def _move_sync(self, stream: str, reader_id: str, hold: str | None) -> None:
        table = readers_table
        with self._begin() as connection:
            connection.execute(
                sa.update(table)
                .where(table.c.stream == stream, table.c.reader_id == reader_id)
                .values(start_id=hold)
            )

    def _release_sync(self, stream: str, reader_id: str) -> None:
        table = readers_table
        with self._begin() as connection:
            connection.execute(
                sa.delete(table).where(table.c.stream == stream, table.c.reader_id == reader_id)
            )

    def _readers_sync(self, stream: str) -> list[RunningReader]:
        with self._begin() as connection:
            return self._running_readers(connection, stream)

    def _running_readers(self, connection: Connection, stream: str) -> list[RunningReader]:
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

    def _oldest(self, connection: Connection, stream: str) -> str | None:
        events = events_table
        return connection.execute(
            sa.select(events.c.event_id)
            .where(events.c.stream == stream, events.c.id_key.is_not(None))
            .order_by(events.c.id_key.asc())
            .limit(1)
        ).scalar_one_or_none()

    def _neighbour(
        self, connection: Connection, stream: str, order: IdOrder, event_id: str, *, older: bool
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

    def _summary_sync(self, stream: str, order: IdOrder) -> GapSummary:
        table = gaps_table
        with self._begin() as connection:
            open_gaps = self._open_gaps(connection, stream)
            rows = connection.execute(
                sa.select(
                    table.c.state,
                    sa.func.count(),
                    sa.func.coalesce(sa.func.sum(table.c.missing), 0),
                    sa.func.sum(sa.case((table.c.missing.is_(None), 1), else_=0)),
                    sa.func.coalesce(sa.func.sum(table.c.recovered), 0),
                )
                .where(table.c.stream == stream)
                .group_by(table.c.state)
            ).all()
        summary = summarize(open_gaps, order)
        totals = GapTotals()
        for state, count, missing, unknown, recovered in rows:
            totals.events_recovered += int(recovered or 0)
            if state == GapState.OPEN:
                totals.open = int(count)
            elif state == GapState.REPAIRED:
                totals.repaired = int(count)
            else:
                totals.unrecoverable = int(count)
                totals.events_unrecoverable = int(missing or 0)
                totals.unknown_size = int(unknown or 0)
        summary.totals = totals
        return summary

    def _gaps_sync(self, stream: str) -> list[Gap]:
        with self._begin() as connection:
            rows = connection.execute(
                sa.select(gaps_table)
                .where(gaps_table.c.stream == stream)
                .order_by(gaps_table.c.seen_at, gaps_table.c.gap_id)
            )
            return [_gap_from_row(row) for row in rows]

    # -- retention ------------------------------------------------------------------

    def _horizons(
        self, connection: Connection, jobs: list[CommitJob]
    ) -> dict[str, tuple[bytes, str | None]]:
        """Each stream's retention horizon, key and id (streams retention never touched:
        absent).

        On the write path, once per group transaction: plain driver SQL, a fifth of what
        the same query costs through SQLAlchemy (about 50 us on PostgreSQL, see
        ``bench/retention.py``).
        """
        streams = sorted({job.stream for job in jobs if job.payload.events})
        if not streams:
            return {}
        if self.dialect == "postgresql":
            with _driver(connection).cursor() as cursor:
                cursor.execute(_HORIZONS_SQL + "stream = ANY(%s)", [streams])
                rows = cursor.fetchall()
        else:
            marks = ", ".join("?" for _ in streams)
            rows = connection.exec_driver_sql(
                _HORIZONS_SQL + f"stream IN ({marks})", tuple(streams)
            ).all()
        return {stream: (bytes(key), horizon_id) for stream, key, horizon_id in rows}

    def _delete_batch_sync(
        self, stream: str, order: IdOrder, cutoff: datetime, after: int | None, limit: int
    ) -> _RetentionBatch:
        """One transaction: read the fence, then the next ``limit`` rows in ``seq`` order
        before the fence row; delete those older than the cutoff and before the fence, and
        count them with the horizon (see :meth:`apply_retention`)."""
        events = events_table
        longest = 0.0
        with self._begin() as connection:
            self._hold_retention(connection, stream, exclusive=True)
            # A write first: on SQLite the batch then reads and deletes under the write
            # lock, one snapshot (the DELETE re-checks every condition all the same).
            self._ensure_retention_row(connection, stream)
            lagging = self._check_order(connection, stream, order)
            readers = self._running_readers(connection, stream)
            fence = retention_fence(
                lagging,
                self._open_gaps(connection, stream),
                order,
                live_starts(readers, datetime.now(UTC)),
            )
            fence_key = end_seq = None
            if fence.ids_deletable:
                assert fence.keep_from is not None
                # The stored id before the fence stays too (see durable_sse.log.retention).
                keep = fence.keep_from
                keep = self._neighbour(connection, stream, order, keep, older=True) or keep
                fence_key = sort_key(keep, order)
                end_seq = self._fence_seq(connection, stream, fence_key)
            else:
                # Only a stream that never stored an id may lose rows without a fence
                # (such rows are never replayed nor deduplicated): keep everything else.
                has_ids = connection.execute(_newest_row(stream, events.c.seq)).scalar_one_or_none()
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
        if self.dialect == "sqlite":
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
            self._insert_stmt()(retention_table)
            .values(stream=stream, deleted_rows=0, updated_at=datetime.now(UTC))
            .on_conflict_do_nothing(index_elements=["stream"])
        )

    def _retention_state_sync(self, stream: str) -> RetentionState:
        events, table = events_table, retention_table
        with self._begin() as connection:
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
class RetentionState:
    """What retention has done to a stream, as the store has it now."""

    deleted_rows: int = 0
    """Rows deleted since the stream's first retention run."""
    horizon_id: str | None = None
    """The newest id deleted: rows re-sent at or before it are dropped as duplicates."""
    oldest_kept_id: str | None = None
    """Id of the oldest row still stored (in arrival order; "" for a row with no id)."""
    oldest_kept_at: datetime | None = None


@dataclass(frozen=True)
class RetentionRun:
    """One :meth:`EventLog.apply_retention`."""

    deleted: int
    batches: int
    complete: bool
    """Nothing more was old enough (False: ``max_batches`` ran out; the next run goes on)."""
    held_by: str
    keep_from: str | None
    """The fence: this id and newer ones stay whatever their age."""
    longest_statement: float
    """Seconds of the longest statement of the run (a select or a delete)."""
    state: RetentionState
    held_by_consumers: tuple[str, ...] = ()
    """Consumer groups that kept rows this run would have deleted (``ConsumerHold``)."""


@dataclass(frozen=True)
class _RetentionBatch:
    deleted: int
    last_seq: int | None
    done: bool
    longest: float
    fence: Fence
    """The fence this statement kept (read inside its transaction)."""
    held_by_consumers: tuple[str, ...] = ()


def _after_horizon(rows: list[tuple[Any, ...]], horizon: bytes) -> list[tuple[Any, ...]]:
    """The staging rows :func:`durable_sse.log.retention.after_horizon` lets through: the
    others sort at or before what retention deleted, and storing them would make them new
    rows. (``pos`` may skip numbers afterwards: it only orders the rows.)"""
    return [row for row in rows if after_horizon(row[5], horizon)]


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


def _gap_from_row(row: Any) -> Gap:
    return Gap(
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


def _gap_values(gap: Gap) -> dict[str, Any]:
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


def _new_rows_per_batch(
    inserted: list[tuple[str, str, bytes | None]],
    rows: list[tuple[Any, ...]],
    spans: list[tuple[int, int]],
) -> list[int]:
    """Attribute the keys one statement inserted to the batches of the group.

    A key in several batches was inserted from the first (rows go in ``pos`` order, the
    rest conflict); rows with no id (NULL follower key) never conflict, so every one of
    them is new and counted where it is.
    """
    counts = [0] * len(spans)
    owner: dict[tuple[str, str, bytes], int] = {}
    for index, (start, end) in enumerate(spans):
        for row in rows[start:end]:
            if row[4] is None:
                counts[index] += 1
            else:
                owner.setdefault((row[1], row[2], bytes(row[4])), index)
    for stream, event_id, key in inserted:
        if key is not None:
            counts[owner[(stream, event_id, bytes(key))]] += 1
    return counts


def _fault_of_a_batch(error: BaseException) -> bool:
    """Whether a failed group transaction may be the doing of one batch's rows (so
    writing each batch alone lets the others commit), not of the database or the
    connection (then every batch would fail alone as well, one timeout after another)."""
    if isinstance(error, sa.exc.DBAPIError):
        if error.connection_invalidated or error.statement is None:
            return False
        error = error.orig
    if isinstance(error, UnicodeEncodeError | sqlite3.IntegrityError | sqlite3.DataError):
        return True
    if isinstance(error, psycopg.Error):
        return (error.sqlstate or "")[:2] in _BATCH_FAULTS
    return False


_UNKNOWN: Any = object()
"""A stream absent from ``EventLog._newest``."""


_Inserted = tuple[list[int], list[list[str]] | None]
"""What a group's insert did: each batch's new rows, and its reused ids (None: none)."""


class _Rewrite(Exception):
    """Roll back a group transaction to write it again without the batches left out."""


async def _outlast_cancellation(future: asyncio.Future[T]) -> T:
    """Await work that already runs in a database thread; if the caller is cancelled, let
    the transaction end (commit or roll back) before the cancellation moves on, so it
    never outlives close()."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise


def _driver(connection: Connection) -> Any:
    """The psycopg connection under a SQLAlchemy one (COPY and raw statements)."""
    driver = connection.connection.driver_connection
    assert driver is not None
    return driver


def _rows(
    stream: str,
    order: IdOrder,
    events: Sequence[EventRecord],
    *,
    start: int = 0,
    clean: bool = False,
) -> list[tuple[Any, ...]]:
    """Staging rows: ``(pos, stream, event_id, event_ord, follower_key, id_key, type, data,
    data_bytes, digest, received_at)``.

    No id in force means no keys and a NULL ordinal, whatever the caller passed: NULLs
    never conflict, so id-less events are always stored, never collapsed. Data holding
    NUL goes into ``data_bytes`` exactly (see ``db.SSEEvent``); ``clean`` (the retry
    after the driver refused a batch) does the same for lone surrogates in data and
    replaces them with U+FFFD in ids and types. A carrier's ``digest`` is computed here
    when the reader did not (it does, once per event).
    """
    rows = []
    keyed = key_function(order)
    received, received_utc = None, None
    for pos, record in enumerate(events, start):
        if record.received_at is not received:  # one timestamp per chunk read, mostly
            received, received_utc = record.received_at, to_utc(record.received_at)
        event_id, event_type = record.event_id, record.event_type
        if clean:
            event_id, event_type = _clean_text(event_id), _clean_text(event_type)
        key: bytes | None = None
        follower: bytes | None = None
        digest: bytes | None = None
        ordinal = None
        if event_id:
            key = record.id_key if record.id_key is not None and not clean else keyed(event_id)
            ordinal = record.event_ord
            if ordinal is not None:
                follower = _follower_key(record)
                digest = record.digest
                if digest is None and ordinal == 0:
                    digest = data_digest(record.event_type, record.data)
        data, data_bytes = _storable_data(record.data, clean=clean)
        rows.append(
            (
                pos,
                stream,
                event_id,
                ordinal,
                follower,
                key,
                event_type,
                data,
                data_bytes,
                digest,
                received_utc,
            )
        )
    return rows


def _extended(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row of a reused id under its extended key (``followers.reused_key``)."""
    return (*row[:4], reused_key(row[_DIGEST], row[4]), *row[5:])


def _follower_key(record: EventRecord) -> bytes:
    if record.follower_key is not None:
        return record.follower_key
    if record.event_ord == 0:
        return CARRIER_KEY
    window = (max(record.event_ord or 1, 1) - 1) // FOLLOWER_WINDOW
    return follower_key(record.event_type, record.data, window=window)


def _storable_data(data: str, *, clean: bool) -> tuple[str, bytes | None]:
    """``(data, data_bytes)`` as stored: the exact bytes beside a readable stand-in when
    ``data`` cannot hold the text (NUL; with ``clean``, lone surrogates too)."""
    if "\x00" in data:
        return _clean_text(data), data.encode("utf-8", "surrogatepass")
    if clean:
        cleaned = _clean_text(data)
        if cleaned != data:
            return cleaned, data.encode("utf-8", "surrogatepass")
    return data, None


def stored_data(data: str, data_bytes: bytes | None) -> str:
    """An event's exact data from its two columns (the rule ``db.SSEEvent`` documents)."""
    if data_bytes is None:
        return data
    return bytes(data_bytes).decode("utf-8", "surrogatepass")


def _clean_text(text: str) -> str:
    """U+FFFD for what a database text column cannot hold: NUL and lone surrogates."""
    text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)


def _identity(value: Any) -> Any:
    return value


def _iso(moment: datetime | None) -> str | None:
    value = from_db_time(moment)
    return None if value is None else value.isoformat()


def _newest_row(stream: str, column: sa.Column[Any]) -> sa.Select[Any]:
    """``column`` of the stream's newest stored row that carries an id (the floor)."""
    events = events_table
    return (
        sa.select(column)
        .where(events.c.stream == stream, events.c.id_key.is_not(None))
        .order_by(events.c.id_key.desc())
        .limit(1)
    )
