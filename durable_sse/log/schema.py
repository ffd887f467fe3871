"""The tables of the event log, the checkpoint rows, the gap records, retention's horizon
and the running connections: their names, columns and indexes, defined once.

PostgreSQL (psycopg 3) in production, SQLite as the embedded default. Both compare
``bytea``/``BLOB`` bytewise, so the ``*_key`` columns (``durable_sse.ids.sort_key``)
order ids the same way in SQL as in Python and in the Redis script.

Nothing here performs I/O. The schema carries a version (table ``sse_schema``,
:data:`SCHEMA_VERSION`); :mod:`durable_sse.log.migrations` creates and migrates it.
"""

from __future__ import annotations

import zlib
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy import event
from sqlmodel import Field, SQLModel

EVENTS_TABLE = "sse_events"
CHECKPOINTS_TABLE = "sse_checkpoints"
GAPS_TABLE = "sse_gaps"
RETENTION_TABLE = "sse_retention"
READERS_TABLE = "sse_readers"
WORKERS_TABLE = "sse_workers"
SCHEMA_TABLE = "sse_schema"
SCHEMA_VERSION = 6
"""1: events and checkpoints with a gap fence column. 2: gap records (``sse_gaps``)
replace the fence. 3: ``sse_events.data_bytes`` keeps data that ``data`` cannot hold;
id-less followers are keyed by content (``follower_key``), not position; the event log
keeps only the indexes a query needs (PostgreSQL: primary key ``(stream, seq)``).
4: ``sse_events.digest`` tells a reused id from a re-sent event (NULL on older rows).
5: gaps carry their place in the stream's order (``opened_seq``/``opened_mark``,
``closed_seq``/``closed_mark``) and ``sse_retention.deleted_to_seq`` says how far
retention deleted, for consumers of the log (:mod:`durable_sse.consume`)."""
STAGING_TABLE = "sse_events_staging"
"""Per-connection temporary table that PostgreSQL batches are COPYed into."""

EVENTS_CHANNEL = "sse_events"
"""PostgreSQL ``NOTIFY`` channel: every group transaction that writes a stream's rows or
gaps notifies it once, the payload the stream's name (:mod:`durable_sse.consume.wakeup`
listens)."""


def _int4(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


STREAM_LOCK_CLASS = _int4(zlib.crc32(b"durable-sse:stream-order"))
"""First key of the per-stream advisory locks (the two-int4 key space, apart from the
one-bigint space the schema lock and applications use)."""


def stream_lock_key(stream: str) -> int:
    """Second key of a stream's advisory lock: a hash of its name. Two streams that
    collide merely serialise their writers; they never share rows."""
    return _int4(zlib.crc32(stream.encode("utf-8", "surrogatepass")))


class SSEEvent(SQLModel, table=True):
    """One persisted event. The key is ``(stream, event_id, follower_key)``.

    ``event_ord`` is 0 for the event that carries an id and 1, 2, … for the id-less
    events that follow it on its connection (they keep the previous id, WHATWG); it is
    NULL when no id is in force. ``follower_key`` tells the followers apart by content
    (see :mod:`durable_sse.log.keys`): empty for the event carrying the id, a digest
    of type and data for a follower, NULL with no id in force; NULLs never conflict, so
    such events are always stored.

    ``data`` is text, exact for every ordinary row, so plain SQL reads it as it is.
    A WHATWG client can deliver U+0000, which PostgreSQL ``text`` cannot hold (and which
    SQLite's text functions stop at): such a row keeps its exact data, UTF-8 encoded, in
    ``data_bytes``, and ``data`` holds a readable stand-in with U+FFFD for each NUL.
    ``data_bytes`` is NULL on every other row, so the rule is: the exact data is
    ``data_bytes`` decoded when it is not NULL, else ``data``. Why not an escape inside
    ``data``: every row holding the escape character (a backslash, in most JSON) would
    need unescaping too, so plain SQL could trust no row; a NULL column costs ordinary
    rows one bit of the null bitmap and nothing on the write path. (Lone surrogates,
    which no SSE stream can carry, only a caller of the API, are kept the same way with
    the ``surrogatepass`` encoding.)

    ``digest`` (16 bytes, :func:`durable_sse.log.keys.data_digest`) stands for the type
    and data of the event that carried the row's id: a carrier's own, a follower's
    carrier's. It tells a server that reuses an id (a restarted counter) from one that
    re-sends an event: an event whose key is stored under another digest is kept under an
    extended ``follower_key`` (see :mod:`durable_sse.log.keys`). NULL: unknown (rows
    stored before schema 4, id-less events, followers whose connection never read their
    carrier), taken for the same event. No index: it is read only with its row's key.
    """

    __tablename__ = EVENTS_TABLE
    __table_args__ = (
        # Every index costs every insert (the write path is the throughput limit), so
        # each one here is justified by a query that needs it (docs/storage.md, "Indexes"):
        # the event key deduplicates inserts; (stream, id_key) serves the floor, the
        # stored neighbours of an id (repairs), the ids counted between two (gaps) and
        # the newest id received before a time (the lagging id, replays "since": the
        # planner scans it backwards, a (stream, received_at) index went unused);
        # (stream, seq) reads a stream in arrival order. On PostgreSQL (stream, seq) is
        # the primary key (see _lean_primary_key); on SQLite seq is the rowid, free,
        # and (stream, seq) an index.
        sa.UniqueConstraint("stream", "event_id", "follower_key", name="uq_sse_events_key"),
        sa.Index("ix_sse_events_stream_id_key", "stream", "id_key"),
        sa.Index("ix_sse_events_stream_seq", "stream", "seq").ddl_if(dialect="sqlite"),
    )

    seq: int | None = Field(
        default=None,
        sa_column=sa.Column(
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
    )
    stream: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    event_id: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    event_ord: int | None = Field(default=None, sa_column=sa.Column(sa.Integer, nullable=True))
    follower_key: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    id_key: bytes | None = Field(default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True))
    event_type: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    data: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    data_bytes: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    digest: bytes | None = Field(default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True))
    received_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


class SSECheckpoint(SQLModel, table=True):
    """A stream's lagging id: trails the newest by a replay window, never passes a gap."""

    __tablename__ = CHECKPOINTS_TABLE

    stream: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    lagging_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    lagging_key: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    lagging_at: datetime | None = Field(
        default=None, sa_column=sa.Column(sa.DateTime(timezone=True), nullable=True)
    )
    id_order: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    updated_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    resting_since: datetime | None = Field(
        default=None, sa_column=sa.Column(sa.DateTime(timezone=True), nullable=True)
    )
    """Set while the stream's checkpoint schedule rests (see
    :mod:`durable_sse.cursor.rest`): a connection that stores a newer event wakes it."""


class SSEGap(SQLModel, table=True):
    """One gap: where a stream's server skipped events, and what became of them.

    Rows are written only by :func:`durable_sse.gaps.transitions.apply_change` (see that module for
    the meaning of each column); like everything stored, they are keyed by stream.
    ``ix_sse_gaps_stream_state`` serves the two queries on the reconnect path: a
    stream's open gaps, and its totals by state.
    """

    __tablename__ = GAPS_TABLE
    __table_args__ = (
        sa.Index("ix_sse_gaps_stream_state", "stream", "state"),
        # A consumer's read asks for the markers after its position: gaps are few, but a
        # stream that drops often piles up thousands of closed ones over its life.
        sa.Index("ix_sse_gaps_stream_opened_mark", "stream", "opened_mark"),
        sa.Index("ix_sse_gaps_stream_closed_mark", "stream", "closed_mark"),
    )

    stream: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    gap_id: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    kind: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    start_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    end_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    notice_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    reread_to: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    announced: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    truncated: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False))
    short_reads: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False))
    recovered: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False))
    missing: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    seen_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    closed_at: datetime | None = Field(
        default=None, sa_column=sa.Column(sa.DateTime(timezone=True), nullable=True)
    )
    detail: str = Field(default="", sa_column=sa.Column(sa.String, nullable=False))
    opened_seq: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    """The stream's newest ``seq`` when the gap was recorded: a consumer meets the gap
    after that event and before every later one (NULL: recorded before schema 4)."""
    opened_mark: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    """The opening's number among the stream's gap markers (openings and closings, in
    commit order): orders markers at one ``seq`` and lets a consumer's position count
    them (see :mod:`durable_sse.consume.items`)."""
    closed_seq: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    """The stream's newest ``seq`` when the gap closed (NULL: open)."""
    closed_mark: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))


class SSERetention(SQLModel, table=True):
    """What retention has deleted from a stream (see :mod:`durable_sse.log.retention`).

    ``horizon_key`` is the newest id key deleted: the write path drops rows at or before
    it as duplicates, so a server re-sending deleted ids cannot store them again. A table
    of its own (created on every start when missing, no schema version step): older
    versions of durable-sse simply ignore it.
    """

    __tablename__ = RETENTION_TABLE

    stream: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    horizon_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    horizon_key: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    deleted_rows: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False))
    updated_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    deleted_to_seq: int | None = Field(
        default=None, sa_column=sa.Column(sa.BigInteger, nullable=True)
    )
    """The newest ``seq`` retention deleted from the stream: a consumer whose position is
    older learns that rows it had not read are gone (``Truncated``)."""


class SSEReader(SQLModel, table=True):
    """A running connection of a stream and the cursor it started from (see
    :class:`durable_sse.cursor.fence.RunningReader`): retention keeps that row and every
    newer one until the connection ends or ``expires_at`` passes.

    Written when a connection resolves its start, deleted when it ends. A table of its
    own, created on every start when missing, like ``sse_retention``: no schema version
    step, and older versions of durable-sse simply ignore it.
    """

    __tablename__ = READERS_TABLE

    stream: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    reader_id: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    start_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    started_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    expires_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))
    worker_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    """The worker lease the connection runs under (``sse_workers``): a watchdog that finds
    that lease expired moves the connection (NULL: a build before worker leases)."""
    workflow_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    run_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    activity_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    attempt: int | None = Field(default=None, sa_column=sa.Column(sa.Integer, nullable=True))


READER_ACTIVITY_COLUMNS = {
    "worker_id": "VARCHAR",
    "workflow_id": "VARCHAR",
    "run_id": "VARCHAR",
    "activity_id": "VARCHAR",
    "attempt": "INTEGER",
}
"""Columns added to ``sse_readers`` after it first shipped (nullable: added in place,
on every start when missing; older builds ignore them)."""


class SSEWorker(SQLModel, table=True):
    """One worker process's liveness lease (:mod:`durable_sse.log.workers`). Times are
    the database's clock, in seconds since the epoch. A side table like ``sse_readers``:
    created when missing, no schema version step, ignored by older builds."""

    __tablename__ = WORKERS_TABLE

    worker_id: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    pool: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    """The workers that can take each other's streams: ``<namespace>:<task queue>``."""
    host: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    pid: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    boot_id: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    started_at: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    renewed_at: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    expires_at: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    ended_at: float | None = Field(default=None, sa_column=sa.Column(sa.Float, nullable=True))
    revoked_by: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))


class SSESchema(SQLModel, table=True):
    """The schema version of this database (one row), and the oldest build it serves."""

    __tablename__ = SCHEMA_TABLE

    version: int = Field(sa_column=sa.Column(sa.Integer, primary_key=True))
    serves_from: int | None = Field(default=None, sa_column=sa.Column(sa.Integer, nullable=True))
    """The oldest ``SCHEMA_VERSION`` of code that may still run on this database (NULL:
    written before the rule, ``version`` itself): see :mod:`durable_sse.log.migrations`."""


events_table: sa.Table = SSEEvent.__table__  # type: ignore[attr-defined]

LEAN_PRIMARY_KEY = (
    f"ALTER TABLE {EVENTS_TABLE} DROP CONSTRAINT {EVENTS_TABLE}_pkey, "
    f"ADD CONSTRAINT {EVENTS_TABLE}_pkey PRIMARY KEY (stream, seq)"
)
"""PostgreSQL: one b-tree ``(stream, seq)`` both identifies a row and reads a stream in
arrival order, where ``seq`` alone plus a ``(stream, seq)`` index took two. (SQLAlchemy
needs ``seq`` as the declared key to keep it a serial column; the swap follows creation.)"""
event.listen(
    events_table,
    "after_create",
    sa.DDL(LEAN_PRIMARY_KEY).execute_if(dialect="postgresql"),
)
checkpoints_table: sa.Table = SSECheckpoint.__table__  # type: ignore[attr-defined]
gaps_table: sa.Table = SSEGap.__table__  # type: ignore[attr-defined]
retention_table: sa.Table = SSERetention.__table__  # type: ignore[attr-defined]
readers_table: sa.Table = SSEReader.__table__  # type: ignore[attr-defined]
workers_table: sa.Table = SSEWorker.__table__  # type: ignore[attr-defined]
schema_table: sa.Table = SSESchema.__table__  # type: ignore[attr-defined]

STAGING_COLUMNS = (
    "pos",
    "stream",
    "event_id",
    "event_ord",
    "follower_key",
    "id_key",
    "event_type",
    "data",
    "data_bytes",
    "digest",
    "received_at",
)
CREATE_STAGING = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS {STAGING_TABLE} (
    pos integer NOT NULL,
    stream text NOT NULL,
    event_id text NOT NULL,
    event_ord integer,
    follower_key bytea,
    id_key bytea,
    event_type text NOT NULL,
    data text NOT NULL,
    data_bytes bytea,
    digest bytea,
    received_at timestamptz NOT NULL
) ON COMMIT DELETE ROWS
"""
