"""The status is live while one connection lasts, and the history stays still, on a real
dev server.

The real worker (real reader, PostgreSQL, Redis) reads the demo source; the connection
never ends on its own (``max_connection_age`` is an hour). What moves with every batch
(cursor, counts, commit lag) goes to Redis, not through the workflow's history: ``durable-sse
status`` reads it there, and the gaps and lagging id from PostgreSQL, each with its age; the
workflow's own query and the Web UI's details say how old their counts are. A signal still
reaches the connection within a second, though it heartbeats only every four minutes.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.settings import Settings
from durable_sse.config.spec import DEFAULT_HEARTBEAT_TIMEOUT
from durable_sse.contracts import StreamStatus
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.ops import control
from durable_sse.ops.live import LiveStores
from durable_sse.reader.heartbeat_policy import heartbeat_interval
from durable_sse.reader.reports import PROGRESS_INTERVAL
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.worker import WorkerResources, build_worker
from tests.chaos.harness import start_stream, steady_spec
from tests.system.test_e2e import capture_history

pytestmark = pytest.mark.slow

FRESHNESS = 5.0
"""Issue 25's bound: ``durable-sse status`` is at most this many seconds old."""


@dataclass
class Running:
    client: Client
    queue: str
    live: LiveStores


async def _worker(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str, interval: float
) -> AsyncIterator[Running]:
    settings = Settings.from_env({"DATABASE_URL": pg_url, "REDIS_URL": redis_url})
    resources = WorkerResources.from_settings(settings)
    await resources.stores.create_schema()
    queue = f"live-{uuid.uuid4().hex[:8]}"
    worker = build_worker(temporal.client, resources, task_queue=queue, progress_interval=interval)
    live = LiveStores(l2=RedisCursors(redis_url), stores=Stores.open(pg_url))
    try:
        async with worker:
            yield Running(temporal.client, queue, live)
    finally:
        await live.close()
        await resources.close()


@pytest.fixture
async def quick(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[Running]:
    """A worker whose connections write their progress every second (the mechanism)."""
    async for running in _worker(temporal, pg_url, redis_url, 1.0):
        yield running


@pytest.fixture
async def default(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[Running]:
    """A worker with the shipped intervals (the bounds, as users get them)."""
    async for running in _worker(temporal, pg_url, redis_url, PROGRESS_INTERVAL):
        yield running


async def start(
    running: Running, source: SSESource, rate: float, *, replay_window: float = 600.0
) -> WorkflowHandle:
    name = "live-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=rate, keepalive=1, retry_ms=None))
    spec = steady_spec(source, name, replay_window=replay_window)
    return await start_stream(running.client, spec, running.queue)


def name_of(handle: WorkflowHandle) -> str:
    return handle.id.removeprefix("sse-stream:")


async def live(running: Running, handle: WorkflowHandle) -> dict[str, Any]:
    """What ``durable-sse status`` prints as JSON, the deployment's stores reachable."""
    return await control.stream_status(running.client, name_of(handle), live=running.live)


async def poll(running: Running, handle: WorkflowHandle, predicate, *, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await live(running, handle)
        if predicate(status):
            return status
        if loop.time() > deadline:
            raise AssertionError(f"{what}: never happened; last status {status}")
        await asyncio.sleep(0.2)


def age(stamp: str | None) -> float:
    assert stamp is not None
    return (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()


async def history_of(handle: WorkflowHandle) -> tuple[int, int]:
    """(history length, progress signals in it)."""
    history = await handle.fetch_history()
    signals = sum(
        1
        for event in history.events
        if event.HasField("workflow_execution_signaled_event_attributes")
        and event.workflow_execution_signaled_event_attributes.signal_name == "progress"
    )
    return len(history.events), signals


async def stored_rows(log: Stores, stream: str) -> int:
    def query() -> int:
        with log.database.engine.connect() as connection:
            return int(
                connection.execute(
                    sa.text("SELECT count(*) FROM sse_events WHERE stream = :s"), {"s": stream}
                ).scalar_one()
            )

    return await asyncio.to_thread(query)


async def test_the_status_moves_from_the_stores_while_the_history_stays_still(
    quick: Running, source: SSESource
) -> None:
    handle = await start(quick, source, rate=50)
    first = await poll(
        quick,
        handle,
        lambda s: s["progress_at"] is not None and s["counters"]["events_persisted"] > 0,
        timeout=30,
        what="a first live progress",
    )
    assert first["state"] == "reading" and first["connection"] == 1
    assert first["live_cursor"] is not None and first["commit_lag"] is not None
    assert first["gaps_at"] is not None and age(first["gaps_at"]) <= FRESHNESS
    length_before, _ = await history_of(handle)

    later = await poll(
        quick,
        handle,
        lambda s: s["counters"]["events_persisted"] >= first["counters"]["events_persisted"] + 100,
        timeout=30,
        what="the persisted count to move",
    )
    assert later["counters"]["connections"] == 1, "the connection was not kept open"
    assert int(later["live_cursor"]) > int(first["live_cursor"])
    assert age(later["progress_at"]) <= FRESHNESS
    assert control.age_text(later) != "-"

    # None of it went through the workflow's history: no report, no event at all.
    await asyncio.sleep(3)
    length_after, signals = await history_of(handle)
    assert signals == 0 and length_after == length_before, (length_before, length_after)
    # The workflow's own view says it has counted nothing yet (no connection ended).
    query = await handle.query("status", result_type=StreamStatus)
    assert query.counters.events_persisted == 0 and query.counted_at is None
    assert query.state == "reading" and query.connection == 1

    await handle.signal("stop")
    final = await handle.result()
    assert final.counted_at is not None
    details = str((await handle.query("__temporal_workflow_metadata")).current_details)
    assert "cursors and counts as of" in details, details
    assert final.counters.events_persisted == await stored_rows(quick.live.stores, final.name)  # type: ignore[arg-type]


async def test_the_lagging_id_comes_from_the_store_while_the_connection_stays_open(
    quick: Running, source: SSESource
) -> None:
    """The checkpoint schedule moves the lagging id every replay window (here 2 s): the
    status reads it from the store, not from the workflow's history."""
    handle = await start(quick, source, rate=50, replay_window=2.0)
    first = await poll(
        quick, handle, lambda s: s["lagging_id"] is not None, timeout=30, what="a lagging id"
    )
    later = await poll(
        quick,
        handle,
        lambda s: s["lagging_id"] is not None and int(s["lagging_id"]) > int(first["lagging_id"]),
        timeout=30,
        what="the lagging id to move",
    )
    assert first["counters"]["connections"] == later["counters"]["connections"] == 1
    assert int(later["lagging_id"]) <= int(later["live_cursor"])
    await handle.signal("stop")
    await handle.result()


async def test_with_the_shipped_intervals_the_status_is_never_older_than_5_s(
    default: Running, source: SSESource
) -> None:
    handle = await start(default, source, rate=20)
    await poll(
        default,
        handle,
        lambda s: s["progress_at"] is not None,
        timeout=30,
        what="a first live progress",
    )
    loop = asyncio.get_running_loop()
    end = loop.time() + 4 * PROGRESS_INTERVAL + 3
    seen = set()
    while loop.time() < end:
        status = await live(default, handle)
        assert status["counters"]["connections"] == 1
        assert age(status["progress_at"]) <= FRESHNESS, status["progress_at"]
        seen.add(status["progress_at"])
        await asyncio.sleep(0.5)
    assert len(seen) >= 3, "the status did not move"
    _, signals = await history_of(handle)
    assert signals == 0
    await handle.signal("stop")
    await handle.result()


async def test_a_signal_reaches_a_connection_that_heartbeats_every_four_minutes(
    default: Running, source: SSESource
) -> None:
    """Issue 25: heartbeats are 4 minutes apart (the 5-minute heartbeat timeout less a
    minute of slack), so signals must not wait for them: a nudge makes the connection
    heartbeat at once and the cancellation comes back in its answer."""
    assert heartbeat_interval(1, nudged=True, timeout=DEFAULT_HEARTBEAT_TIMEOUT) == 240.0
    handle = await start(default, source, rate=20)
    await poll(default, handle, lambda s: s["progress_at"] is not None, timeout=30, what="reading")
    delays = []
    for _ in range(3):
        began = time.monotonic()
        await handle.signal("pause")
        await poll(
            default,
            handle,
            lambda s: s["state"] == "paused" and s["connection"] is None,  # cancelled, ended
            timeout=10,
            what="the connection cancelled",
        )
        delays.append(time.monotonic() - began)
        await handle.signal("resume")
        await poll(
            default,
            handle,
            lambda s: s["state"] == "reading" and s["progress_at"] is not None,
            timeout=30,
            what="reading again",
        )
    print(f"signal -> connection cancelled and the stream paused: {delays}")
    assert statistics.median(delays) < 1.0, delays
    await handle.signal("stop")
    await handle.result()
    # Pauses nudged to a connection with a four-minute heartbeat, for the Replayer.
    await capture_history(handle, "stream_nudged_pauses")
