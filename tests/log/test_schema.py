"""The event log's schema and database: migrations from older schemas, lean indexes,
repeatable creation, and the errors of a database that cannot be used."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.errors import StoreError
from durable_sse.ids import IdOrder, sort_key
from durable_sse.log.keys import FollowerKeys
from durable_sse.log.records import InsertResult
from durable_sse.log.schema import SCHEMA_VERSION
from durable_sse.stores import Stores
from tests.log.helpers import (
    execute,
    generation,
    query,
    query_commit,
    record,
    stored,
)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SCHEMA_2 = {
    "postgresql": (
        "CREATE TABLE sse_events (seq BIGSERIAL NOT NULL, stream VARCHAR NOT NULL, "
        "event_id VARCHAR NOT NULL, event_ord INTEGER, id_key BYTEA, "
        "event_type VARCHAR NOT NULL, data TEXT NOT NULL, "
        "received_at TIMESTAMP WITH TIME ZONE NOT NULL, PRIMARY KEY (seq), "
        "CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, event_ord))",
    ),
    "sqlite": (
        "CREATE TABLE sse_events (seq INTEGER NOT NULL, stream VARCHAR NOT NULL, "
        "event_id VARCHAR NOT NULL, event_ord INTEGER, id_key BLOB, "
        "event_type VARCHAR NOT NULL, data TEXT NOT NULL, received_at DATETIME NOT NULL, "
        "PRIMARY KEY (seq), CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, event_ord))",
    ),
}


SCHEMA_2_COMMON = (
    "CREATE INDEX ix_sse_events_stream_id_key ON sse_events (stream, id_key)",
    "CREATE INDEX ix_sse_events_stream_received_at ON sse_events (stream, received_at)",
    "CREATE INDEX ix_sse_events_stream_seq ON sse_events (stream, seq)",
    "CREATE TABLE sse_checkpoints (stream VARCHAR PRIMARY KEY, lagging_id VARCHAR, "
    "lagging_key {blob}, lagging_at TIMESTAMP WITH TIME ZONE, id_order VARCHAR NOT NULL, "
    "updated_at TIMESTAMP WITH TIME ZONE NOT NULL)",
    "CREATE TABLE sse_gaps (stream VARCHAR NOT NULL, gap_id VARCHAR NOT NULL, "
    "kind VARCHAR NOT NULL, state VARCHAR NOT NULL, start_id VARCHAR, end_id VARCHAR, "
    "notice_id VARCHAR, reread_to VARCHAR, announced BIGINT, truncated BOOLEAN NOT NULL, "
    "short_reads INTEGER NOT NULL, recovered BIGINT NOT NULL, missing BIGINT, "
    "seen_at TIMESTAMP WITH TIME ZONE NOT NULL, closed_at TIMESTAMP WITH TIME ZONE, "
    "detail VARCHAR NOT NULL, PRIMARY KEY (stream, gap_id))",
    "CREATE INDEX ix_sse_gaps_stream_state ON sse_gaps (stream, state)",
    "CREATE TABLE sse_schema (version INTEGER NOT NULL, PRIMARY KEY (version))",
    "INSERT INTO sse_schema (version) VALUES (2)",
)


SCHEMA_2_ROWS = (
    "INSERT INTO sse_events (stream, event_id, event_ord, id_key, event_type, data, "
    "received_at) VALUES "
    "('old', '1', 0, {key1}, 'message', 'one', '2024-05-01 12:00:00+00'), "
    "('old', '1', 1, {key1}, 'message', 'follower', '2024-05-01 12:00:01+00'), "
    "('old', '1', 2, {key1}, 'message', 'follower', '2024-05-01 12:00:01+00'), "
    "('old', '2', 0, {key2}, 'message', 'was \ufffd', '2024-05-01 12:00:02+00'), "
    "('old', '', NULL, NULL, 'message', 'no id', '2024-05-01 12:00:03+00')",
    "INSERT INTO sse_checkpoints (stream, lagging_id, id_order, updated_at)"
    " VALUES ('old', '1', 'numeric', '2024-05-01 12:00:04+00')",
)


@asynccontextmanager
async def an_empty_database(backend: str, pg_url: str, sqlite_file: Path) -> AsyncIterator[Stores]:
    """An event log on an empty database to build an old schema in: a PostgreSQL schema
    of its own (dropped afterwards), or ``sqlite_file``."""
    admin = Stores.open(pg_url)
    schema = "dsse_" + uuid.uuid4().hex[:10]
    if backend == "postgresql":
        await query_commit(admin, f"CREATE SCHEMA {schema}")
        url = f"{pg_url}?options=-csearch_path%3D{schema}"
    else:
        url = f"sqlite:///{sqlite_file}"
    old = Stores.open(url)
    try:
        yield old
    finally:
        await old.close()
        if backend == "postgresql":
            await query_commit(admin, f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_a_schema_2_database_with_rows_is_migrated(
    backend: str, pg_url: str, tmp_path: Path
) -> None:
    """Version 2 to 3: every row stays, reads back as before and still deduplicates; new
    rows store NUL exactly."""
    key1, key2 = (sort_key(n, IdOrder.NUMERIC).hex() for n in ("1", "2"))
    if backend == "postgresql":
        keys = {"key1": f"'\\x{key1}'::bytea", "key2": f"'\\x{key2}'::bytea", "blob": "BYTEA"}
    else:
        keys = {"key1": f"X'{key1}'", "key2": f"X'{key2}'", "blob": "BLOB"}
    async with an_empty_database(backend, pg_url, tmp_path / "v2.db") as old:
        ddl = [*SCHEMA_2[backend], *(s.format(**keys) for s in SCHEMA_2_COMMON)]
        await execute(old, *ddl, *(s.format(**keys) for s in SCHEMA_2_ROWS))
        await old.create_schema()
        await old.create_schema()  # idempotent once migrated
        assert await query(old, "SELECT version FROM sse_schema") == [(SCHEMA_VERSION,)]
        # Version 5 to 6: the checkpoint row gains its rest, and does not rest.
        assert await old.checkpoints.resting("old") is None
        assert await old.checkpoints.rest("old") is None  # "2" is newer than its "1"
        before = [
            ("1", 0, "one"),
            ("1", 1, "follower"),
            ("1", 2, "follower"),
            ("2", 0, "was \ufffd"),
            ("", None, "no id"),
        ]
        assert await stored(old, "old") == before
        assert [(e.event_id, e.event_ord, e.data) for e in await old.reads.events("old")] == before
        # Followers are keyed by content now: the same run read again is all duplicates
        # (the second identical follower counted as such), a new follower is new.
        keys = FollowerKeys()
        again = [
            record("1", data="one", follower=keys.carrier()),
            record("1", 1, data="follower", follower=keys.follower("message", "follower", 1)),
            record("1", 2, data="follower", follower=keys.follower("message", "follower", 2)),
            record("2"),
        ]
        assert await old.writer.insert_batch("old", "numeric", again) == InsertResult(0, 4)
        fresh = [record("1", 1, data="new", follower=FollowerKeys().follower("message", "new", 1))]
        assert await old.writer.insert_batch("old", "numeric", fresh) == InsertResult(1, 0)
        # The stored id-less row kept a NULL key: another one is stored, never collapsed.
        assert await old.writer.insert_batch(
            "old", "numeric", [record("", None, data="no id")]
        ) == (InsertResult(1, 0))
        assert await old.reads.floor("old") == "2"
        new = [record("3", data="a\x00b")]
        assert await old.writer.insert_batch("old", "numeric", new) == InsertResult(1, 0)
        assert (await old.reads.events("old"))[-1].data == "a\x00b"
        checkpoint = await old.checkpoints.get_checkpoint("old")
        assert checkpoint is not None and checkpoint.lagging_id == "1"
        assert await event_indexes(old) == LEAN_INDEXES[backend]


SCHEMA_3 = {
    "postgresql": (
        "CREATE TABLE sse_events (seq BIGSERIAL NOT NULL, stream VARCHAR NOT NULL, "
        "event_id VARCHAR NOT NULL, event_ord INTEGER, follower_key BYTEA, id_key BYTEA, "
        "event_type VARCHAR NOT NULL, data TEXT NOT NULL, data_bytes BYTEA, "
        "received_at TIMESTAMP WITH TIME ZONE NOT NULL, "
        "CONSTRAINT sse_events_pkey PRIMARY KEY (stream, seq), "
        "CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, follower_key))",
    ),
    "sqlite": (
        "CREATE TABLE sse_events (seq INTEGER NOT NULL, stream VARCHAR NOT NULL, "
        "event_id VARCHAR NOT NULL, event_ord INTEGER, follower_key BLOB, id_key BLOB, "
        "event_type VARCHAR NOT NULL, data TEXT NOT NULL, data_bytes BLOB, "
        "received_at DATETIME NOT NULL, PRIMARY KEY (seq), "
        "CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, follower_key))",
        "CREATE INDEX ix_sse_events_stream_seq ON sse_events (stream, seq)",
    ),
}


SCHEMA_3_ROWS = (
    "INSERT INTO sse_events (stream, event_id, event_ord, follower_key, id_key, event_type, "
    "data, received_at) VALUES "
    "('old', '1', 0, {empty}, {key1}, 'message', 'one', '2024-05-01 12:00:00+00'), "
    "('old', '1', 1, {ping}, {key1}, 'message', 'ping', '2024-05-01 12:00:01+00'), "
    "('old', '2', 0, {empty}, {key2}, 'message', 'two', '2024-05-01 12:00:02+00')",
    "UPDATE sse_schema SET version = 3",
)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_a_schema_3_database_with_rows_is_migrated(
    backend: str, pg_url: str, tmp_path: Path
) -> None:
    """Version 3 to 4: ``digest`` is added, NULL on every stored row, and NULL means
    unknown: those rows' ids sent again with other data are duplicates, as before. Rows
    stored after the migration tell a reused id from a re-sent event."""
    key1, key2 = (sort_key(n, IdOrder.NUMERIC).hex() for n in ("1", "2"))
    ping = FollowerKeys().follower("message", "ping", 1).hex()
    if backend == "postgresql":

        def blob(hexed: str) -> str:
            return f"'\\x{hexed}'::bytea"

        common = [s.format(blob="BYTEA") for s in SCHEMA_2_COMMON[3:]]
    else:

        def blob(hexed: str) -> str:
            return f"X'{hexed}'"

        common = [s.format(blob="BLOB") for s in SCHEMA_2_COMMON[3:]]
    keys = {"key1": blob(key1), "key2": blob(key2), "ping": blob(ping), "empty": blob("")}
    async with an_empty_database(backend, pg_url, tmp_path / "v3.db") as old:
        await execute(
            old,
            *SCHEMA_3[backend],
            "CREATE INDEX ix_sse_events_stream_id_key ON sse_events (stream, id_key)",
            *common,
            *(s.format(**keys) for s in SCHEMA_3_ROWS),
        )
        await old.create_schema()
        await old.create_schema()  # idempotent once migrated
        assert await query(old, "SELECT version FROM sse_schema") == [(SCHEMA_VERSION,)]
        assert await query(old, "SELECT count(*) FROM sse_events WHERE digest IS NULL") == [(3,)]
        assert await stored(old, "old") == [("1", 0, "one"), ("1", 1, "ping"), ("2", 0, "two")]
        # Stored before: unknown, so the same id with other data is taken for it.
        assert await old.writer.insert_batch("old", "numeric", generation("b", 1, 2)) == (
            InsertResult(0, 2)
        )
        followed = generation("b", 1, 1, followers=("ping",))
        assert await old.writer.insert_batch("old", "numeric", followed) == InsertResult(0, 2)
        # Stored after: a reused id is kept, a re-send is a duplicate.
        assert await old.writer.insert_batch("old", "numeric", generation("a", 3, 4)) == (
            InsertResult(2, 0)
        )
        assert await old.writer.insert_batch("old", "numeric", generation("c", 3, 4)) == (
            InsertResult(2, 0, ("3", "4"))
        )
        assert await old.writer.insert_batch("old", "numeric", generation("c", 3, 4)) == (
            InsertResult(0, 2)
        )
        assert await event_indexes(old) == LEAN_INDEXES[backend]


LEAN_INDEXES = {
    # (primary key, unique constraints, other indexes): each justified in db.SSEEvent.
    "postgresql": (
        ["stream", "seq"],
        {"uq_sse_events_key": ["stream", "event_id", "follower_key"]},
        {"ix_sse_events_stream_id_key": ["stream", "id_key"]},
    ),
    "sqlite": (
        ["seq"],
        {"uq_sse_events_key": ["stream", "event_id", "follower_key"]},
        {
            "ix_sse_events_stream_id_key": ["stream", "id_key"],
            "ix_sse_events_stream_seq": ["stream", "seq"],
        },
    ),
}


async def event_indexes(log: Stores) -> tuple[Any, ...]:
    def run() -> tuple[Any, ...]:
        with log.database.engine.connect() as connection:
            inspector = sa.inspect(connection)
            primary = inspector.get_pk_constraint("sse_events")["constrained_columns"]
            uniques = {
                u["name"]: u["column_names"] for u in inspector.get_unique_constraints("sse_events")
            }
            indexes = {
                i["name"]: i["column_names"]
                for i in inspector.get_indexes("sse_events")
                if "duplicates_constraint" not in i
            }
            return primary, uniques, indexes

    return await asyncio.to_thread(run)


async def test_a_new_event_log_has_only_the_indexes_a_query_needs(event_log: Stores) -> None:
    assert await event_indexes(event_log) == LEAN_INDEXES[event_log.database.dialect]


async def test_schema_creation_is_repeatable(event_log: Stores) -> None:
    await event_log.create_schema()
    await event_log.create_schema()
    assert event_log.database.dialect in ("postgresql", "sqlite")


async def test_concurrent_schema_creation_on_a_fresh_postgresql_schema(pg_url: str) -> None:
    schema = "dsse_" + uuid.uuid4().hex[:10]
    admin = Stores.open(pg_url)
    await query_commit(admin, f"CREATE SCHEMA {schema}")
    scoped = f"{pg_url}?options=-csearch_path%3D{schema}"
    logs = [Stores.open(scoped) for _ in range(3)]
    try:
        await asyncio.gather(*(log.create_schema() for log in logs))
        tables = await query(
            admin,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = :s "
            "ORDER BY table_name",
            s=schema,
        )
        assert tables == [
            ("sse_checkpoints",),
            ("sse_events",),
            ("sse_gaps",),
            ("sse_readers",),
            ("sse_retention",),
            ("sse_schema",),
            ("sse_workers",),
        ]
        result = await logs[0].writer.insert_batch("s", "numeric", [record("1")])
        assert result == InsertResult(1, 0)
    finally:
        for log in logs:
            await log.close()
        await query_commit(admin, f"DROP SCHEMA {schema} CASCADE")  # our own schema only
        await admin.close()


async def test_sqlite_creates_its_directory(tmp_path: Path, stream_name: str) -> None:
    log = Stores.open(f"sqlite:///{tmp_path / 'nested' / 'dir' / 'events.db'}")
    try:
        await log.create_schema()
        assert await log.writer.insert_batch(stream_name, "natural", [record("a")]) == InsertResult(
            1, 0
        )
        assert (tmp_path / "nested" / "dir" / "events.db").exists()
    finally:
        await log.close()


async def test_unreachable_postgresql_raises_store_error(stream_name: str) -> None:
    port = closed_port()
    log = Stores.open(f"postgresql+psycopg://sse:s3cret-pw@127.0.0.1:{port}/sse")  # no I/O yet
    try:
        with pytest.raises(StoreError, match=f"PostgreSQL at 127.0.0.1:{port} is unreachable"):
            await log.create_schema()
        with pytest.raises(StoreError) as caught:
            await log.writer.insert_batch(stream_name, "numeric", [record("1")])
        assert "s3cret-pw" not in str(caught.value)
        with pytest.raises(StoreError, match="unreachable"):
            await log.reads.floor(stream_name)
    finally:
        await log.close()


async def test_closed_log_refuses_work(tmp_path: Path, stream_name: str) -> None:
    log = Stores.open(f"sqlite:///{tmp_path / 'events.db'}")
    await log.create_schema()
    await log.close()
    await log.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await log.reads.floor(stream_name)


def test_unsupported_database_is_refused() -> None:
    with pytest.raises(StoreError, match="unsupported database 'mysql'"):
        Stores.open("mysql://root@localhost/db")
