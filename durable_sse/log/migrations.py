"""Creating the schema, and migrating an older one to the current version.

The worker runs :func:`create_schema` at every start: it creates a new database at
:data:`~durable_sse.log.schema.SCHEMA_VERSION` and migrates an older one step by step
(``MIGRATIONS[n]`` takes version n to n + 1), under an advisory lock on PostgreSQL
(SQLite has one writer at a time anyway).

Migrations are expand-then-contract, so that two builds run at once during a deploy
(docs/deploys.md): the new build's first worker migrates while the old
build's workers still read and write. A migration that only adds (a nullable column, a
table, an index) leaves a schema the previous build still serves; one that removes or
changes what an older build uses (a column it writes, a constraint it relies on)
comes in a later version, once no build that needs it runs. ``SERVES_FROM[v]`` says
which builds a schema at version v serves, and the database records it
(``sse_schema.serves_from``): a build older than the database starts when the
database still serves it, and is refused in one line when it does not.
"""

from __future__ import annotations

import logging
import zlib
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from durable_sse.config.settings import sqlite_path
from durable_sse.errors import StoreError
from durable_sse.log.database import error_summary
from durable_sse.log.keys import FOLLOWER_WINDOW, data_digest, follower_key
from durable_sse.log.schema import (
    CHECKPOINTS_TABLE,
    EVENTS_TABLE,
    GAPS_TABLE,
    LEAN_PRIMARY_KEY,
    READER_ACTIVITY_COLUMNS,
    READERS_TABLE,
    RETENTION_TABLE,
    SCHEMA_TABLE,
    SCHEMA_VERSION,
    checkpoints_table,
    events_table,
    gaps_table,
    readers_table,
    retention_table,
    schema_table,
    workers_table,
)

logger = logging.getLogger(__name__)

_MIGRATION_PAGE = 5000
"""Rows a migration reads and rewrites at a time."""
_SCHEMA_LOCK_ID = zlib.crc32(b"durable-sse:schema")


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
        serves_from = _serves_from(connection, version)
        if serves_from > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}, which serves durable-sse "
                f"schema {serves_from} and later, newer than this build's ({SCHEMA_VERSION}): "
                "upgrade durable-sse before running it on this database"
            )
        logger.info(
            "the database's schema version %d still serves this build (%d): running on it",
            version,
            SCHEMA_VERSION,
        )
        _create_side_tables(connection)
        return
    for step in range(version, SCHEMA_VERSION):
        logger.info("migrating the schema from version %d to %d", step, step + 1)
        MIGRATIONS[step](connection)
        _set_version(connection, step + 1)
    _create_side_tables(connection)


def _create_side_tables(connection: Connection) -> None:
    """Tables created when missing, whatever the version: older versions ignore them."""
    retention_table.create(connection, checkfirst=True)
    readers_table.create(connection, checkfirst=True)
    workers_table.create(connection, checkfirst=True)
    present = {column["name"] for column in sa.inspect(connection).get_columns(READERS_TABLE)}
    for name, kind in READER_ACTIVITY_COLUMNS.items():
        if name not in present:
            connection.exec_driver_sql(f"ALTER TABLE {READERS_TABLE} ADD COLUMN {name} {kind}")


def _serves_from(connection: Connection, version: int) -> int:
    """The oldest build the database serves, as recorded (a database written before the
    rule serves its own version only)."""
    present = {column["name"] for column in sa.inspect(connection).get_columns(SCHEMA_TABLE)}
    if "serves_from" not in present:
        return version
    recorded = connection.execute(sa.select(sa.func.max(schema_table.c.serves_from))).scalar()
    return version if recorded is None else int(recorded)


def _set_version(connection: Connection, version: int) -> None:
    schema_table.create(connection, checkfirst=True)
    present = {column["name"] for column in sa.inspect(connection).get_columns(SCHEMA_TABLE)}
    if "serves_from" not in present:
        connection.exec_driver_sql(f"ALTER TABLE {SCHEMA_TABLE} ADD COLUMN serves_from INTEGER")
    connection.execute(sa.delete(schema_table))
    serves_from = SERVES_FROM.get(version, version)
    connection.execute(sa.insert(schema_table).values(version=version, serves_from=serves_from))


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
        connection.exec_driver_sql(LEAN_PRIMARY_KEY)
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


def _migrate_5_to_6(connection: Connection) -> None:
    """Add ``resting_since`` to ``sse_checkpoints``: nullable, no default, no row
    rewritten. NULL is "not resting", what every schedule was before."""
    columns = {column["name"] for column in sa.inspect(connection).get_columns(CHECKPOINTS_TABLE)}
    if "resting_since" not in columns:
        moment = sa.DateTime(timezone=True).compile(dialect=connection.dialect)
        connection.exec_driver_sql(
            f"ALTER TABLE {CHECKPOINTS_TABLE} ADD COLUMN resting_since {moment}"
        )


MIGRATIONS = {
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
    3: _migrate_3_to_4,
    4: _migrate_4_to_5,
    5: _migrate_5_to_6,
}
"""``MIGRATIONS[n]`` takes a database from version n to n + 1, in one transaction."""

SERVES_FROM = {1: 1, 2: 2, 3: 3, 4: 3, 5: 4, 6: 5}
"""``SERVES_FROM[v]``: the oldest build (its ``SCHEMA_VERSION``) a database at schema v
still serves. An expanding step serves the build before it (4: ``digest`` is nullable,
an older writer leaves it NULL, "unknown"; 5: gap marks are nullable; 6:
``resting_since`` is nullable); a contracting one does not (2 drops the fence columns;
3 changes the events' unique key). A new migration adds its entry: the build before it
when it only adds, itself when it contracts (and a contraction ships only after a
release that no longer needs what it removes)."""
