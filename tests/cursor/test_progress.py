"""Issue 25: a running connection's live progress lives in Redis, not in history.

The value's format and its fold into the status are plain functions, tested here; the
path from a running connection to ``durable-sse status`` is tests/system/test_live_views.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from durable_sse.contracts import (
    ConnectionProgress,
    ReadCounts,
    StreamCounters,
    StreamStatus,
    add_counts,
    parse_progress,
    progress_json,
)
from durable_sse.cursor.l2 import PROGRESS_TTL_MS, RedisCursors, progress_key
from durable_sse.ops.live import LiveStores, live_status
from durable_sse.workflows.checkpoint import QUIET_REPORT_EVERY, _first_of_period


@pytest.fixture
async def l2(redis_url: str) -> AsyncIterator[RedisCursors]:
    store = RedisCursors(redis_url)
    yield store
    await store.close()


def progress(connection: int = 3, **counts: int) -> ConnectionProgress:
    return ConnectionProgress(
        connection=connection,
        cursor="41",
        counts=ReadCounts(**counts),
        commit_lag=0.25,
        at="2026-12-04T10:00:00+00:00",
    )


def test_a_progress_value_reads_back_as_written() -> None:
    written = progress(events_read=9, new_rows=7, duplicates=2)
    assert parse_progress(progress_json(written)) == written


@pytest.mark.parametrize(
    "text", ["", "not json", "[]", '{"connection": "x"}', '{"counts": {"events_read": "many"}}']
)
def test_a_value_that_does_not_parse_is_a_lost_view_never_an_error(text: str) -> None:
    assert parse_progress(text) is None


def test_a_value_of_another_version_keeps_the_counts_it_knows() -> None:
    text = '{"connection": 2, "counts": {"events_read": 5, "invented_later": 1}, "new": 1}'
    parsed = parse_progress(text)
    assert parsed is not None and parsed.connection == 2 and parsed.counts.events_read == 5


def test_progress_adds_to_counters_as_a_result_does() -> None:
    counters = StreamCounters(events_read=10, events_persisted=8)
    add_counts(counters, ReadCounts(events_read=5, new_rows=4, duplicates=1, ids_reused=2))
    assert (counters.events_read, counters.events_persisted) == (15, 12)
    assert (counters.duplicates, counters.ids_reused) == (1, 2)


async def test_progress_is_written_with_an_expiry_and_read_back(
    l2: RedisCursors, redis_url: str, stream_name: str
) -> None:
    l2.submit_progress(stream_name, progress_json(progress(events_read=1)))
    l2.submit_progress(stream_name, progress_json(progress(events_read=2)))  # newest wins
    await l2.flush()
    text = await l2.get_progress(stream_name)
    assert text is not None
    parsed = parse_progress(text)
    assert parsed is not None and parsed.counts.events_read == 2
    raw = Redis.from_url(redis_url)
    try:
        ttl = await raw.pttl(progress_key(stream_name))
    finally:
        await raw.aclose()
    assert 0 < ttl <= PROGRESS_TTL_MS


async def test_the_status_folds_in_only_the_running_connections_progress(
    l2: RedisCursors, stream_name: str
) -> None:
    """A value left by an earlier connection (it ended, its worker died) is not counted
    twice: the workflow already folded that connection's result in."""
    base = StreamStatus(
        name=stream_name,
        state="reading",
        route="live",
        live_cursor="30",
        counters=StreamCounters(events_read=100, events_persisted=100),
        id_order="numeric",
        connection=4,
    )
    l2.submit_progress(stream_name, progress_json(progress(connection=3, events_read=7)))
    await l2.flush()
    stale = await live_status(base, LiveStores(l2=l2))
    assert stale.counters.events_read == 100 and stale.progress_at is None

    l2.submit_progress(stream_name, progress_json(progress(connection=4, events_read=7)))
    await l2.flush()
    live = await live_status(base, LiveStores(l2=l2))
    assert live.counters.events_read == 107 and live.live_cursor == "41"
    assert live.progress_at == "2026-12-04T10:00:00+00:00" and live.commit_lag == 0.25
    assert base.counters.events_read == 100  # the workflow's view is left as it was


async def test_without_redis_the_status_is_the_workflows_own(stream_name: str) -> None:
    base = StreamStatus(name=stream_name, state="reading", route="live", connection=1)
    down = RedisCursors("redis://127.0.0.1:1/0", timeout=0.2)
    try:
        assert await live_status(base, LiveStores(l2=down)) == base
    finally:
        await down.close()


def test_a_quiet_checkpoint_run_reports_once_a_period() -> None:
    """Runs ``window`` apart: exactly one per ``QUIET_REPORT_EVERY`` is the first of it."""
    window = 600.0
    start = datetime(2026, 12, 4, 0, 3, 17, tzinfo=UTC)
    runs = [start + timedelta(seconds=window * i) for i in range(6 * 24)]  # a day
    firsts = [at for at in runs if _first_of_period(at.isoformat(), window, QUIET_REPORT_EVERY)]
    assert len(firsts) == 24 * 3600 / QUIET_REPORT_EVERY
    assert _first_of_period(None, window, QUIET_REPORT_EVERY)  # no time: report
