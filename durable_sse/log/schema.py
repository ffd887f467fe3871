"""Tables, engines, schema creation and migrations for the event log, the checkpoint row
and the gap records.

PostgreSQL (psycopg 3) in production, SQLite as the embedded default. Both compare
``bytea``/``BLOB`` bytewise, so the ``*_key`` columns (``durable_sse.ids.sort_key``)
order ids the same way in SQL as in Python and in the Redis script.

Nothing here performs I/O at import or when an engine is built; only
:func:`create_schema` and the queries that use the engine touch the database.

The schema carries a version (table ``sse_schema``); :func:`create_schema` creates a new
database at :data:`SCHEMA_VERSION` and migrates an older one step by step, under an
advisory lock on PostgreSQL (SQLite has one writer at a time anyway).
"""

from __future__ import annotations

import logging
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool
from sqlmodel import Field, SQLModel

from durable_sse.config.settings import sqlite_path
from durable_sse.errors import StoreError
from durable_sse.log.keys import FOLLOWER_WINDOW, data_digest, follower_key

logger = logging.getLogger(__name__)

EVENTS_TABLE = "sse_events"
CHECKPOINTS_TABLE = "sse_checkpoints"
GAPS_TABLE = "sse_gaps"
RETENTION_TABLE = "sse_retention"
READERS_TABLE = "sse_readers"
SCHEMA_TABLE = "sse_schema"
SCHEMA_VERSION = 5
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

_MIGRATION_PAGE = 5000
"""Rows a migration reads and rewrites at a time."""
DEFAULT_CONNECT_TIMEOUT = 5
SQLITE_BUSY_TIMEOUT = 30.0
_SCHEMA_LOCK_ID = zlib.crc32(b"durable-sse:schema")
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
        # each one here is justified by a query that needs it (README, "Storage"):
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


class SSEGap(SQLModel, table=True):
    """One gap: where a stream's server skipped events, and what became of them.

    Rows are written only by :func:`durable_sse.gaps.apply_change` (see that module for
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
    them (see :mod:`durable_sse.consume.reader`)."""
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
    :class:`durable_sse.log.retention.RunningReader`): retention keeps that row and every
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


class SSESchema(SQLModel, table=True):
    """The schema version of this database (one row)."""

    __tablename__ = SCHEMA_TABLE

    version: int = Field(sa_column=sa.Column(sa.Integer, primary_key=True))


events_table: sa.Table = SSEEvent.__table__  # type: ignore[attr-defined]

_LEAN_PRIMARY_KEY = (
    f"ALTER TABLE {EVENTS_TABLE} DROP CONSTRAINT {EVENTS_TABLE}_pkey, "
    f"ADD CONSTRAINT {EVENTS_TABLE}_pkey PRIMARY KEY (stream, seq)"
)
"""PostgreSQL: one b-tree ``(stream, seq)`` both identifies a row and reads a stream in
arrival order, where ``seq`` alone plus a ``(stream, seq)`` index took two. (SQLAlchemy
needs ``seq`` as the declared key to keep it a serial column; the swap follows creation.)"""
event.listen(
    events_table,
    "after_create",
    sa.DDL(_LEAN_PRIMARY_KEY).execute_if(dialect="postgresql"),
)
checkpoints_table: sa.Table = SSECheckpoint.__table__  # type: ignore[attr-defined]
gaps_table: sa.Table = SSEGap.__table__  # type: ignore[attr-defined]
retention_table: sa.Table = SSERetention.__table__  # type: ignore[attr-defined]
readers_table: sa.Table = SSEReader.__table__  # type: ignore[attr-defined]
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
_CREATE_STAGING = f"""
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


def make_engine(database_url: str, *, connect_timeout: int = DEFAULT_CONNECT_TIMEOUT) -> Engine:
    """Build (without connecting) an engine tuned for the event log.

    PostgreSQL connections get the COPY staging table as they open; SQLite connections
    get WAL mode, ``synchronous=NORMAL`` and a busy timeout so concurrent writers wait
    instead of failing.
    """
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        engine = sa.create_engine(
            url,
            connect_args={"connect_timeout": max(2, int(connect_timeout))},
            pool_pre_ping=True,
            pool_size=8,
            max_overflow=8,
            hide_parameters=True,
        )
        event.listen(engine, "connect", _prepare_postgresql)
        return engine
    if backend == "sqlite":
        options: dict[str, Any] = {
            "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False},
            "hide_parameters": True,
        }
        if sqlite_path(database_url) is None:
            # In-memory: every connection would get its own empty database.
            options["poolclass"] = StaticPool
        engine = sa.create_engine(url, **options)
        event.listen(engine, "connect", _prepare_sqlite)
        return engine
    raise StoreError(f"unsupported database {backend!r}: use postgresql:// or sqlite:///")


def _prepare_postgresql(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(_CREATE_STAGING)
    dbapi_connection.commit()


def _prepare_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def describe_database(url: URL | str) -> str:
    """Where the database is, for error messages: never the password."""
    url = make_url(url) if isinstance(url, str) else url
    if url.get_backend_name() == "postgresql":
        return f"PostgreSQL at {url.host or 'localhost'}:{url.port or 5432}"
    return f"SQLite database {url.database or ':memory:'}"


def create_schema(engine: Engine) -> None:
    """Create the schema, or migrate an older one, to :data:`SCHEMA_VERSION`.

    Safe on every start and concurrently: on PostgreSQL the work runs under a
    transaction-scoped advisory lock, and a lost ``CREATE TABLE`` race (two processes
    that both saw no table) is retried once.
    """
    if engine.dialect.name == "sqlite":
        path = sqlite_path(str(engine.url))
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        try:
            with engine.begin() as connection:
                _migrate(connection)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError, sa.exc.OperationalError) as error:
            if attempt == 2:
                raise
            logger.info("schema creation raced another process, retrying: %s", error_summary(error))


def schema_version(connection: Connection) -> int | None:
    """The database's schema version (None: no durable-sse tables at all)."""
    inspector = sa.inspect(connection)
    if inspector.has_table(SCHEMA_TABLE):
        return connection.execute(sa.select(sa.func.max(schema_table.c.version))).scalar()
    if inspector.has_table(EVENTS_TABLE):
        return 1
    return None


def _migrate(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _SCHEMA_LOCK_ID})
    version = schema_version(connection)
    if version is None:
        SQLModel.metadata.create_all(
            connection, tables=[events_table, checkpoints_table, gaps_table, schema_table]
        )
        _set_version(connection, SCHEMA_VERSION)
        _create_side_tables(connection)
        return
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the database has schema version {version}, newer than this durable-sse "
            f"({SCHEMA_VERSION}): upgrade durable-sse before running it on this database"
        )
    for step in range(version, SCHEMA_VERSION):
        logger.info("migrating the schema from version %d to %d", step, step + 1)
        MIGRATIONS[step](connection)
        _set_version(connection, step + 1)
    _create_side_tables(connection)


def _create_side_tables(connection: Connection) -> None:
    """Tables created when missing, whatever the version: older versions ignore them."""
    retention_table.create(connection, checkfirst=True)
    readers_table.create(connection, checkfirst=True)


def _set_version(connection: Connection, version: int) -> None:
    schema_table.create(connection, checkfirst=True)
    connection.execute(sa.delete(schema_table))
    connection.execute(sa.insert(schema_table).values(version=version))


def _migrate_1_to_2(connection: Connection) -> None:
    """Gap records replace the checkpoint's gap fence: an unrepaired fence becomes an
    open gap from the lagging id to the fence, so the repair it stood for still happens."""
    gaps_table.create(connection, checkfirst=True)
    columns = {column["name"] for column in sa.inspect(connection).get_columns(CHECKPOINTS_TABLE)}
    if "fence_id" not in columns:
        return
    rows = connection.execute(
        sa.text(
            f"SELECT stream, lagging_id, fence_id FROM {CHECKPOINTS_TABLE} "
            "WHERE fence_id IS NOT NULL"
        )
    ).all()
    now = datetime.now(UTC)
    for row in rows:
        connection.execute(
            sa.insert(gaps_table).values(
                gap_id=f"migrated-{row.stream}",
                stream=row.stream,
                kind="migrated",
                state="open",
                start_id=row.lagging_id,
                end_id=row.fence_id,
                notice_id=row.fence_id,
                truncated=False,
                short_reads=0,
                recovered=0,
                seen_at=now,
                detail="gap fence of schema version 1",
            )
        )
    for column in ("fence_id", "fence_key"):
        if column in columns:
            connection.exec_driver_sql(f"ALTER TABLE {CHECKPOINTS_TABLE} DROP COLUMN {column}")


def _migrate_2_to_3(connection: Connection) -> None:
    """Add ``data_bytes``, and key id-less followers by content instead of position.

    Rows stored before keep their data as it is (NUL already became U+FFFD when they
    were written, and nothing can bring it back). Each follower gets the key
    :mod:`durable_sse.log.keys` gives it, its identical predecessors counted in
    ordinal order within its id (the connections that stored them are not known), so
    every stored row keeps a key of its own. SQLite cannot swap a unique constraint in
    place: the table is copied. The indexes no query needs go; on PostgreSQL the
    primary key becomes ``(stream, seq)``.
    """
    columns = {column["name"] for column in sa.inspect(connection).get_columns(EVENTS_TABLE)}
    postgresql = connection.dialect.name == "postgresql"
    blob = sa.LargeBinary().compile(dialect=connection.dialect)
    if "data_bytes" not in columns:
        connection.exec_driver_sql(f"ALTER TABLE {EVENTS_TABLE} ADD COLUMN data_bytes {blob}")
    if "follower_key" not in columns:
        # Most rows carry their id: a constant default gives them their (empty) key
        # without rewriting them (both databases store it in the catalogue), and
        # only the other rows are updated.
        empty = "'\\x'::bytea" if postgresql else "X''"
        connection.exec_driver_sql(
            f"ALTER TABLE {EVENTS_TABLE} ADD COLUMN follower_key {blob} DEFAULT {empty}"
        )
        if postgresql:
            connection.exec_driver_sql(
                f"ALTER TABLE {EVENTS_TABLE} ALTER COLUMN follower_key DROP DEFAULT"
            )
    events = events_table
    connection.execute(
        sa.update(events).where(events.c.event_ord.is_(None)).values(follower_key=None)
    )
    _key_migrated_followers(connection)
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(
            f"ALTER TABLE {EVENTS_TABLE} DROP CONSTRAINT uq_sse_events_key, "
            "ADD CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, follower_key)"
        )
        for index in ("ix_sse_events_stream_received_at", "ix_sse_events_stream_seq"):
            connection.exec_driver_sql(f"DROP INDEX IF EXISTS {index}")
        connection.exec_driver_sql(_LEAN_PRIMARY_KEY)
        connection.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS ix_sse_events_stream_id_key "
            f"ON {EVENTS_TABLE} (stream, id_key)"
        )
        return
    _copy_sqlite_events(connection)


def _key_migrated_followers(connection: Connection) -> None:
    """Give every stored follower its content key, a page of rows at a time in
    ``(stream, event_id, event_ord)`` order (the old unique key, so indexed)."""
    events = events_table
    columns = (events.c.stream, events.c.event_id, events.c.event_ord)
    last: tuple[str, str, int] | None = None
    current: tuple[str, str] | None = None
    seen: dict[tuple[int, bytes], int] = {}
    while True:
        query = (
            sa.select(*columns, events.c.event_type, events.c.data, events.c.data_bytes)
            .where(events.c.event_ord > 0)
            .order_by(*columns)
            .limit(_MIGRATION_PAGE)
        )
        if last is not None:
            query = query.where(sa.tuple_(*columns) > sa.tuple_(*last))
        rows = connection.execute(query).all()
        if not rows:
            return
        updates = []
        for row in rows:
            if (row.stream, row.event_id) != current:
                current, seen = (row.stream, row.event_id), {}
            data = row.data if row.data_bytes is None else bytes(row.data_bytes).decode()
            window = (row.event_ord - 1) // FOLLOWER_WINDOW
            counted = (window, data_digest(row.event_type, data))
            repeat = seen.get(counted, 0)
            seen[counted] = repeat + 1
            key = follower_key(row.event_type, data, repeat=repeat, window=window)
            updates.append({"s": row.stream, "e": row.event_id, "o": row.event_ord, "key": key})
        connection.execute(
            sa.update(events)
            .where(
                events.c.stream == sa.bindparam("s"),
                events.c.event_id == sa.bindparam("e"),
                events.c.event_ord == sa.bindparam("o"),
            )
            .values(follower_key=sa.bindparam("key")),
            updates,
        )
        last = (rows[-1].stream, rows[-1].event_id, rows[-1].event_ord)


def _copy_sqlite_events(connection: Connection) -> None:
    """Rebuild ``sse_events`` under today's definition (keys, constraints, indexes)."""
    copy = events_table.to_metadata(sa.MetaData(), name=f"{EVENTS_TABLE}_v3")
    for index in list(copy.indexes):
        copy.indexes.discard(index)
    copy.create(connection)
    # Only the columns the old table has: a later version's (``digest``) stay NULL.
    present = {column["name"] for column in sa.inspect(connection).get_columns(EVENTS_TABLE)}
    names = ", ".join(column.name for column in events_table.columns if column.name in present)
    connection.exec_driver_sql(
        f"INSERT INTO {copy.name} ({names}) SELECT {names} FROM {EVENTS_TABLE} ORDER BY seq"
    )
    connection.exec_driver_sql(f"DROP TABLE {EVENTS_TABLE}")
    connection.exec_driver_sql(f"ALTER TABLE {copy.name} RENAME TO {EVENTS_TABLE}")
    for index in events_table.indexes:
        index.create(connection)


def _migrate_3_to_4(connection: Connection) -> None:
    """Add ``digest``: a nullable column without a default, so no row is rewritten on
    either database (instant however large the log). Rows stored before keep NULL, which
    means "unknown": an event re-sent under their key is a duplicate, as it was."""
    columns = {column["name"] for column in sa.inspect(connection).get_columns(EVENTS_TABLE)}
    if "digest" not in columns:
        blob = sa.LargeBinary().compile(dialect=connection.dialect)
        connection.exec_driver_sql(f"ALTER TABLE {EVENTS_TABLE} ADD COLUMN digest {blob}")


def _migrate_4_to_5(connection: Connection) -> None:
    """Gap markers and retention's deleted-to seq, for consumers of the log.

    Only new nullable columns and two indexes on the small ``sse_gaps``: no row is
    rewritten. Gaps recorded before have no place in the order (NULL marks), so a
    consumer meets only those that close from now on. (``sse_gaps`` may already have
    the columns: a schema-1 database creates it at today's definition in step 1.)
    """
    inspector = sa.inspect(connection)
    big = sa.BigInteger().compile(dialect=connection.dialect)
    columns = {
        GAPS_TABLE: ("opened_seq", "opened_mark", "closed_seq", "closed_mark"),
        RETENTION_TABLE: ("deleted_to_seq",),
    }
    for table, names in columns.items():
        if not inspector.has_table(table):
            continue  # created at today's definition when missing
        present = {column["name"] for column in inspector.get_columns(table)}
        for name in names:
            if name not in present:
                connection.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {big}")
    for column in ("opened_mark", "closed_mark"):
        connection.exec_driver_sql(
            f"CREATE INDEX IF NOT EXISTS ix_sse_gaps_stream_{column} "
            f"ON {GAPS_TABLE} (stream, {column})"
        )


MIGRATIONS = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
}
"""``MIGRATIONS[n]`` takes a database from version n to n + 1, in one transaction."""


def to_utc(moment: datetime) -> datetime:
    """A tz-aware UTC datetime. Naive input is taken as UTC (the house convention):
    refusing it would wedge a stream or a schedule on a caller's slip."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def from_db_time(moment: datetime | None) -> datetime | None:
    """Datetimes read back: SQLite returns them naive (stored as UTC), PostgreSQL aware."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def error_summary(error: BaseException) -> str:
    """The driver's first message line: no SQL, no parameters (event data), no password."""
    original = getattr(error, "orig", None) or error
    text = str(original).strip()
    return text.splitlines()[0] if text else type(original).__name__
