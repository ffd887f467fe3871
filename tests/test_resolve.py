from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from durable_sse.eventlog import EventLog, EventRecord
from durable_sse.l1 import LocalCursors
from durable_sse.l2 import RedisCursors
from durable_sse.resolve import CursorResolver, ResolvedCursor

ORDER = "numeric"


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[RedisCursors]:
    store = RedisCursors(redis_url)
    yield store
    await store.close()


@pytest.fixture
def l1() -> LocalCursors:
    return LocalCursors()


@pytest.fixture
def resolver(l1: LocalCursors, l2: RedisCursors, event_log: EventLog) -> CursorResolver:
    return CursorResolver(l1, l2, event_log)


async def _persist(log: EventLog, stream: str, ids: list[str], received_at: datetime) -> None:
    records = [EventRecord(i, 0, "message", f"data {i}", received_at) for i in ids]
    result = await log.insert_batch(stream, ORDER, records)
    assert result.new_rows == len(ids)


async def _with_lagging(log: EventLog, stream: str) -> None:
    """Events 998..1000 two hours ago (lagging id 1000), then 1001..1003 now (floor 1003)."""
    now = datetime.now(UTC)
    await _persist(log, stream, ["998", "999", "1000"], now - timedelta(hours=2))
    await _persist(log, stream, ["1001", "1002", "1003"], now)
    advanced = await log.advance_lagging(stream, ORDER, window=3600, now=now)
    assert advanced.lagging_id == "1000"


async def test_none_when_every_store_misses(resolver: CursorResolver, stream_name: str) -> None:
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor(None, "none")
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor(None, "none")


async def test_floor_when_caches_and_checkpoint_miss(
    resolver: CursorResolver, event_log: EventLog, stream_name: str
) -> None:
    await _persist(event_log, stream_name, ["9", "10", "8"], datetime.now(UTC))
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("10", "floor")
    # no lagging id yet: the lagged route falls back to the live chain
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor("10", "floor")


async def test_lagging_before_floor(
    resolver: CursorResolver, event_log: EventLog, stream_name: str
) -> None:
    await _with_lagging(event_log, stream_name)
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("1000", "lagging")
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor(
        "1000", "lagging"
    )


async def test_l2_hit_fills_l1(
    resolver: CursorResolver,
    l1: LocalCursors,
    l2: RedisCursors,
    event_log: EventLog,
    stream_name: str,
) -> None:
    await _with_lagging(event_log, stream_name)
    assert await l2.advance(stream_name, "1003", ORDER) is True
    assert l1.get(stream_name) is None
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("1003", "l2")
    assert l1.get(stream_name) == "1003"
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("1003", "l1")
    # the lagged route ignores the caches while a lagging id exists
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor(
        "1000", "lagging"
    )
    await l2.forget(stream_name)


async def test_lagged_route_falls_back_to_caches(
    resolver: CursorResolver, l2: RedisCursors, stream_name: str
) -> None:
    assert await l2.advance(stream_name, "77", ORDER) is True
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor("77", "l2")
    assert await resolver.resolve_lagged_cursor(stream_name, ORDER) == ResolvedCursor("77", "l1")
    await l2.forget(stream_name)


async def test_l1_hit_wins(
    resolver: CursorResolver, l1: LocalCursors, l2: RedisCursors, stream_name: str
) -> None:
    await l2.advance(stream_name, "5", ORDER)
    l1.advance(stream_name, "6", ORDER)
    assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("6", "l1")
    await l2.forget(stream_name)


async def test_redis_down_falls_through(
    l1: LocalCursors, event_log: EventLog, stream_name: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = RedisCursors(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        resolver = CursorResolver(l1, down, event_log)
        await _persist(event_log, stream_name, ["1", "2"], datetime.now(UTC))
        assert await resolver.resolve_cursor(stream_name, ORDER) == ResolvedCursor("2", "floor")
        assert down.read_failures == 1
        assert l1.get(stream_name) is None
    finally:
        await down.close()


async def test_heartbeat_only_moves_forward_live(
    resolver: CursorResolver, l1: LocalCursors, stream_name: str
) -> None:
    assert await resolver.resolve_cursor(stream_name, ORDER, heartbeat="3") == ResolvedCursor(
        "3", "heartbeat"
    )
    l1.advance(stream_name, "1000", ORDER)
    # numerically older (though lexically newer): the stores win
    assert await resolver.resolve_cursor(stream_name, ORDER, heartbeat="999") == ResolvedCursor(
        "1000", "l1"
    )
    assert await resolver.resolve_cursor(stream_name, ORDER, heartbeat="1000") == ResolvedCursor(
        "1000", "l1"
    )
    assert await resolver.resolve_cursor(stream_name, ORDER, heartbeat="1001") == ResolvedCursor(
        "1001", "heartbeat"
    )
    assert await resolver.resolve_cursor(stream_name, ORDER, heartbeat="") == ResolvedCursor(
        "1000", "l1"
    )


async def test_heartbeat_only_moves_forward_lagged(
    resolver: CursorResolver, event_log: EventLog, stream_name: str
) -> None:
    await _with_lagging(event_log, stream_name)
    # a retried replay resumes from its own progress...
    lagged = await resolver.resolve_lagged_cursor(stream_name, ORDER, heartbeat="1002")
    assert lagged == ResolvedCursor("1002", "heartbeat")
    # ...but never from behind the lagging id
    lagged = await resolver.resolve_lagged_cursor(stream_name, ORDER, heartbeat="999")
    assert lagged == ResolvedCursor("1000", "lagging")
    lagged = await resolver.resolve_lagged_cursor(stream_name, ORDER, heartbeat=None)
    assert lagged == ResolvedCursor("1000", "lagging")
