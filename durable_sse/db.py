"""Tables, engines and schema creation for the event log and the checkpoint row.

PostgreSQL (psycopg 3) in production, SQLite as the embedded default. Both compare
``bytea``/``BLOB`` bytewise, so the ``*_key`` columns (``durable_sse.ids.sort_key``)
order ids the same way in SQL as in Python and in the Redis script.

Nothing here performs I/O at import or when an engine is built; only
:func:`create_schema` and the queries that use the engine touch the database.
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

from durable_sse.errors import StoreError
from durable_sse.settings import sqlite_path

logger = logging.getLogger(__name__)

EVENTS_TABLE = "sse_events"
CHECKPOINTS_TABLE = "sse_checkpoints"
STAGING_TABLE = "sse_events_staging"
"""Per-connection temporary table that PostgreSQL batches are COPYed into."""

DEFAULT_CONNECT_TIMEOUT = 5
SQLITE_BUSY_TIMEOUT = 30.0
_SCHEMA_LOCK_ID = zlib.crc32(b"durable-sse:schema")


class SSEEvent(SQLModel, table=True):
    """One persisted event. The key is ``(stream, event_id, event_ord)``.

    ``event_ord`` is 0 for the event that carries an id and 1, 2, … for the id-less
    events that follow it (they keep the previous id, WHATWG); it is NULL when no id is
    in force, and NULLs never conflict, so such events are always stored.
    """

    __tablename__ = EVENTS_TABLE
    __table_args__ = (
        sa.UniqueConstraint("stream", "event_id", "event_ord", name="uq_sse_events_key"),
        sa.Index("ix_sse_events_stream_seq", "stream", "seq"),
        sa.Index("ix_sse_events_stream_received_at", "stream", "received_at"),
        sa.Index("ix_sse_events_stream_id_key", "stream", "id_key"),
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
    id_key: bytes | None = Field(default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True))
    event_type: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    data: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    received_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


class SSECheckpoint(SQLModel, table=True):
    """A stream's lagging id (trails the newest by a replay window) and its gap fence."""

    __tablename__ = CHECKPOINTS_TABLE

    stream: str = Field(sa_column=sa.Column(sa.String, primary_key=True))
    lagging_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    lagging_key: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    lagging_at: datetime | None = Field(
        default=None, sa_column=sa.Column(sa.DateTime(timezone=True), nullable=True)
    )
    fence_id: str | None = Field(default=None, sa_column=sa.Column(sa.String, nullable=True))
    fence_key: bytes | None = Field(
        default=None, sa_column=sa.Column(sa.LargeBinary, nullable=True)
    )
    id_order: str = Field(sa_column=sa.Column(sa.String, nullable=False))
    updated_at: datetime = Field(sa_column=sa.Column(sa.DateTime(timezone=True), nullable=False))


events_table: sa.Table = SSEEvent.__table__  # type: ignore[attr-defined]
checkpoints_table: sa.Table = SSECheckpoint.__table__  # type: ignore[attr-defined]

STAGING_COLUMNS = (
    "pos",
    "stream",
    "event_id",
    "event_ord",
    "id_key",
    "event_type",
    "data",
    "received_at",
)
_CREATE_STAGING = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS {STAGING_TABLE} (
    pos integer NOT NULL,
    stream text NOT NULL,
    event_id text NOT NULL,
    event_ord integer,
    id_key bytea,
    event_type text NOT NULL,
    data text NOT NULL,
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
    """Create the tables and indexes if missing; safe on every start and concurrently.

    On PostgreSQL the DDL runs under a transaction-scoped advisory lock, and a lost
    ``CREATE TABLE`` race (two processes that both saw no table) is retried once.
    """
    if engine.dialect.name == "sqlite":
        path = sqlite_path(str(engine.url))
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        try:
            with engine.begin() as connection:
                _create_tables(connection)
            return
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError) as error:
            if attempt == 2:
                raise
            logger.info("schema creation raced another process, retrying: %s", error_summary(error))


def _create_tables(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _SCHEMA_LOCK_ID})
    SQLModel.metadata.create_all(connection, tables=[events_table, checkpoints_table])


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
