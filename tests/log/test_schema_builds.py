"""Two builds on one database across a migration (expand-then-contract).

During a deploy the new build's first worker migrates the schema while the old build's
workers still read and write. The older build is simulated by a lower
``SCHEMA_VERSION`` (the code that reads it is the same): it must keep writing and
reading beside the new one after the migration, and a build the schema no longer
serves must be refused in one line. SQLite files of their own: the shared PostgreSQL
database's schema is never touched.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.errors import StoreError
from durable_sse.log import migrations
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores

NEW = 6
OLD = 5


async def query(log: Stores, sql: str) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with log.database.engine.begin() as connection:
            return [tuple(row) for row in connection.execute(sa.text(sql))]

    return await asyncio.to_thread(run)


async def execute(log: Stores, sql: str) -> None:
    def run() -> None:
        with log.database.engine.begin() as connection:
            connection.exec_driver_sql(sql)

    await asyncio.to_thread(run)


async def write(log: Stores, stream: str, ids: range) -> None:
    now = datetime.now(UTC)
    records = [
        EventRecord(event_id=str(i), event_ord=0, event_type="m", data=f"e{i}", received_at=now)
        for i in ids
    ]
    await log.writer.insert_batch(stream, "numeric", records)


async def read(log: Stores, stream: str) -> list[str]:
    rows = await query(
        log, f"SELECT event_id FROM sse_events WHERE stream = '{stream}' ORDER BY seq"
    )
    return [row[0] for row in rows]


async def start(build: int, url: str, monkeypatch: pytest.MonkeyPatch) -> Stores:
    """A worker of ``build`` starting on ``url``: it creates or migrates the schema."""
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", build)
    log = Stores.open(url)
    await log.create_schema()
    return log


async def test_the_old_build_runs_beside_the_new_one_across_an_expanding_migration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    old = await start(OLD, url, monkeypatch)
    try:
        # A schema-5 database as the old build left it: no ``resting_since`` yet.
        await execute(old, "ALTER TABLE sse_checkpoints DROP COLUMN resting_since")
        assert await query(old, "SELECT version, serves_from FROM sse_schema") == [(OLD, 4)]
        await write(old, "s", range(1, 4))

        new = await start(NEW, url, monkeypatch)  # the first new worker migrates
        try:
            assert await query(new, "SELECT version, serves_from FROM sse_schema") == [(NEW, OLD)]
            columns = await query(new, "SELECT name FROM pragma_table_info('sse_checkpoints')")
            assert ("resting_since",) in columns

            # An old worker that restarts meanwhile runs on the newer schema, untouched.
            monkeypatch.setattr(migrations, "SCHEMA_VERSION", OLD)
            await old.create_schema()
            assert await query(old, "SELECT version, serves_from FROM sse_schema") == [(NEW, OLD)]

            # Both write and read the same log: the old build's rows, the new one's, once.
            await write(old, "s", range(4, 7))
            await write(new, "s", range(7, 10))
            await write(old, "s", range(8, 11))  # re-sent: idempotent across builds
            expected = [str(i) for i in range(1, 11)]
            assert await read(old, "s") == expected and await read(new, "s") == expected
        finally:
            await new.close()
    finally:
        await old.close()


async def test_a_build_the_schema_no_longer_serves_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    new = await start(NEW, url, monkeypatch)
    await new.close()
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", OLD - 1)
    older = Stores.open(url)
    try:
        with pytest.raises(StoreError) as refused:
            await older.create_schema()
        message = str(refused.value)
        assert "schema version 6, which serves durable-sse schema 5 and later" in message
        assert "\n" not in message
    finally:
        await older.close()


async def test_a_database_from_before_the_rule_serves_its_own_build_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    new = await start(NEW, url, monkeypatch)
    try:
        await execute(new, "ALTER TABLE sse_schema DROP COLUMN serves_from")
    finally:
        await new.close()
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", OLD)
    older = Stores.open(url)
    try:
        with pytest.raises(StoreError, match="serves durable-sse schema 6 and later"):
            await older.create_schema()
    finally:
        await older.close()


def test_every_migration_says_which_builds_its_schema_serves() -> None:
    assert set(migrations.SERVES_FROM) == {*migrations.MIGRATIONS, NEW}
    for version, oldest in migrations.SERVES_FROM.items():
        assert oldest <= version
        # An expanding step serves the build before it at most; never an older one.
        assert oldest >= version - 1
