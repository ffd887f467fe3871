"""What the event log reads back: the floor, the newest id at or before another, and a
connection's context, on real PostgreSQL and real SQLite."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta, timezone
from pathlib import Path

import pytest

from durable_sse.log.reads import settled_id
from durable_sse.log.schema import SCHEMA_VERSION
from durable_sse.stores import Stores
from tests.log.helpers import (
    T0,
    commit,
    execute,
    gap_opened,
    query,
    query_commit,
    record,
    stored,
)

FLOOR_CASES = {
    # order: (first batch, late replay of older ids, expected floor)
    "numeric": (["999", "1000", "1001"], ["7", "998", "99"], "1001"),
    "lexicographic": (
        ["01HZ0000000000000000000002", "01HZ0000000000000000000003"],
        ["01HZ0000000000000000000001"],
        "01HZ0000000000000000000003",
    ),
    "natural": (
        ["1700000000-9", "1700000000-10"],
        ["1700000000-2", "169999999-99"],
        "1700000000-10",
    ),
}


@pytest.mark.parametrize("order", sorted(FLOOR_CASES))
async def test_floor_is_the_newest_id_under_the_order_not_the_last_inserted(
    event_log: Stores, stream_name: str, order: str
) -> None:
    first, late, expected = FLOOR_CASES[order]
    assert await event_log.reads.floor(stream_name) is None
    await event_log.writer.insert_batch(stream_name, order, [record(i) for i in first])
    await event_log.writer.insert_batch(stream_name, order, [record(i) for i in late])
    await event_log.writer.insert_batch(stream_name, order, [record("", None)])
    assert await event_log.reads.floor(stream_name) == expected


async def test_newest_id_at_or_before(event_log: Stores, stream_name: str) -> None:
    events = [
        record("1", at=T0),
        record("3", at=T0 + timedelta(seconds=10)),
        record("2", at=T0 + timedelta(seconds=20)),
        record("", None, at=T0 + timedelta(seconds=30)),
        record("9", at=T0 + timedelta(seconds=40)),
    ]
    await event_log.writer.insert_batch(stream_name, "numeric", events)
    lookup = event_log.reads.newest_id_at_or_before
    assert await lookup(stream_name, T0 - timedelta(seconds=1)) is None
    assert await lookup(stream_name, T0) == "1"
    assert await lookup(stream_name, T0 + timedelta(seconds=10)) == "3"  # inclusive
    assert await lookup(stream_name, T0 + timedelta(seconds=35)) == "3"  # 3 > 2 numerically
    assert await lookup(stream_name, T0 + timedelta(hours=1)) == "9"
    # Another zone, same instant.
    plus_two = timezone(timedelta(hours=2))
    assert await lookup(stream_name, (T0 + timedelta(seconds=5)).astimezone(plus_two)) == "1"


async def test_connection_context_starts_a_repair_before_the_oldest_gap(
    event_log: Stores, stream_name: str
) -> None:
    await commit(event_log, stream_name, [record(str(i)) for i in (3, 7, 8, 20, 30)])
    await commit(event_log, stream_name, [], gap_opened(stream_name, "late", "20", "30"))
    await commit(event_log, stream_name, [], gap_opened(stream_name, "early", "8", "20"))
    start = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none", repair=True
    )
    assert (start.cursor, start.source, start.context.witness) == ("7", "gap", "8")
    assert start.context.floor == "30"
    assert sorted(gap.gap_id for gap in start.context.open_gaps) == ["early", "late"]
    live = await event_log.starts.connection_context(
        stream_name, "numeric", cursor="30", source="l1"
    )
    assert (live.cursor, live.source, live.context.witness) == ("30", "l1", None)
    fallback = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none"
    )
    assert (fallback.cursor, fallback.source) == ("30", "floor")


async def test_connection_context_says_whether_a_stream_without_ids_has_rows(
    event_log: Stores, stream_name: str
) -> None:
    """A connection with no cursor learns whether the stream has stored anything: rows
    without ids make it a reconnect that cannot resume (gaps.model.no_resume)."""
    fresh = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none"
    )
    assert (fresh.cursor, fresh.context.has_rows) == (None, False)
    await commit(event_log, stream_name, [record("", None, data="a"), record("", None, data="b")])
    idless = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none"
    )
    assert (idless.cursor, idless.context.floor, idless.context.has_rows) == (None, None, True)
    await commit(event_log, stream_name, [record("4")])
    ids = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none"
    )
    assert (ids.cursor, ids.source, ids.context.has_rows) == ("4", "floor", True)


SCHEMA_1 = (
    "CREATE TABLE sse_events (seq INTEGER PRIMARY KEY {autoincrement}, stream VARCHAR NOT NULL, "
    "event_id VARCHAR NOT NULL, event_ord INTEGER, id_key {blob}, event_type VARCHAR NOT NULL, "
    "data TEXT NOT NULL, received_at TIMESTAMP WITH TIME ZONE NOT NULL, "
    "CONSTRAINT uq_sse_events_key UNIQUE (stream, event_id, event_ord))",
    "CREATE TABLE sse_checkpoints (stream VARCHAR PRIMARY KEY, lagging_id VARCHAR, "
    "lagging_key {blob}, lagging_at TIMESTAMP WITH TIME ZONE, fence_id VARCHAR, "
    "fence_key {blob}, id_order VARCHAR NOT NULL, updated_at TIMESTAMP WITH TIME ZONE NOT NULL)",
)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
async def test_a_schema_1_database_with_rows_and_a_fence_is_migrated(
    backend: str, pg_url: str, tmp_path: Path
) -> None:
    """The worker migrates at start: rows stay, the fence becomes an open gap record."""
    admin = Stores.open(pg_url)
    schema = "dsse_" + uuid.uuid4().hex[:10]
    if backend == "postgresql":
        await query_commit(admin, f"CREATE SCHEMA {schema}")
        url = f"{pg_url}?options=-csearch_path%3D{schema}"
        kinds = {"autoincrement": "GENERATED BY DEFAULT AS IDENTITY", "blob": "BYTEA"}
        kinds["autoincrement"] = ""
        ddl = [
            s.format(**kinds).replace("seq INTEGER PRIMARY KEY ", "seq BIGSERIAL PRIMARY KEY")
            for s in SCHEMA_1
        ]
    else:
        url = f"sqlite:///{tmp_path / 'old.db'}"
        ddl = [s.format(autoincrement="AUTOINCREMENT", blob="BLOB") for s in SCHEMA_1]
    old = Stores.open(url)
    try:
        await execute(
            old,
            *ddl,
            "INSERT INTO sse_events (stream, event_id, event_ord, event_type, data, received_at)"
            " VALUES ('old', '1', 0, 'message', 'one', '2024-05-01 12:00:00+00'),"
            " ('old', '2', 0, 'message', 'two', '2024-05-01 12:00:01+00')",
            "INSERT INTO sse_checkpoints (stream, lagging_id, fence_id, id_order, updated_at)"
            " VALUES ('old', '1', '2', 'numeric', '2024-05-01 12:00:02+00')",
        )
        await old.create_schema()
        await old.create_schema()  # idempotent once migrated
        assert [row[:3] for row in await stored(old, "old")] == [("1", 0, "one"), ("2", 0, "two")]
        (gap,) = await old.gap_store.gaps("old")
        assert (gap.kind, gap.state, gap.start_id, gap.end_id) == ("migrated", "open", "1", "2")
        assert await query(old, "SELECT version FROM sse_schema") == [(SCHEMA_VERSION,)]
        checkpoint = await old.checkpoints.get_checkpoint("old")
        assert checkpoint is not None and checkpoint.lagging_id == "1"
        columns = await query(old, "SELECT * FROM sse_checkpoints")
        assert len(columns[0]) == 7  # fence_id and fence_key are gone, resting_since came
    finally:
        await old.close()
        if backend == "postgresql":
            await query_commit(admin, f"DROP SCHEMA {schema} CASCADE")
        await admin.close()


async def test_the_settled_id_is_as_far_back_as_a_batch_needs_to_count_as_evidence(
    event_log: Stores, stream_name: str
) -> None:
    """``settled_id``: at least ``ids`` stored ids before the floor and received at least
    ``seconds`` before it (a live retry starts no further back: log.reads)."""

    def settled(ids: int, seconds: float) -> str | None:
        with event_log.database.engine.connect() as connection:
            return settled_id(connection, stream_name, ids=ids, seconds=seconds)

    assert await asyncio.to_thread(settled, 3, 1.0) is None  # nothing stored
    # 1..10, one a second
    events = [record(str(n), at=T0 + timedelta(seconds=n)) for n in range(1, 11)]
    await event_log.writer.insert_batch(stream_name, "numeric", events)
    assert await asyncio.to_thread(settled, 3, 1.0) == "7"  # three ids after it
    assert await asyncio.to_thread(settled, 3, 5.0) == "5"  # and received 5 s before 10
    assert await asyncio.to_thread(settled, 3, 0.0) == "7"
    assert await asyncio.to_thread(settled, 10, 0.0) is None  # not that many stored
    assert await asyncio.to_thread(settled, 2, 60.0) is None  # none that old
