"""Temporal's own views stay current while one connection lasts, on a real dev server.

The real worker (real reader, PostgreSQL, Redis) reads the demo source; the connection
never ends on its own (``max_connection_age`` is an hour). The ``status`` query, the Web
UI's current details (the ``__temporal_workflow_metadata`` query) and the CLI's status
must move anyway, from the reader's ``progress`` reports, and each report must cost the
history no more than docs/benchmarks.md says.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.read import PROGRESS_INTERVAL
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.ops import control
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests.test_e2e import capture_history
from worker import WorkerResources, build_worker

pytestmark = pytest.mark.slow

FRESHNESS = 30.0
"""The issue's bound: a view is at most this many seconds old while a connection runs."""
EVENTS_PER_REPORT = 4
"""What docs/benchmarks.md states one progress report costs the history."""


@dataclass
class Running:
    client: Client
    queue: str


async def _worker(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str, interval: float
) -> AsyncIterator[Running]:
    settings = Settings.from_env({"DATABASE_URL": pg_url, "REDIS_URL": redis_url})
    resources = WorkerResources.from_settings(settings)
    await resources.stores.create_schema()
    queue = f"live-{uuid.uuid4().hex[:8]}"
    worker = build_worker(temporal.client, resources, task_queue=queue, progress_interval=interval)
    try:
        async with worker:
            yield Running(temporal.client, queue)
    finally:
        await resources.close()


@pytest.fixture
async def quick(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[Running]:
    """A worker whose connections report every second (the mechanism, fast)."""
    async for running in _worker(temporal, pg_url, redis_url, 1.0):
        yield running


@pytest.fixture
async def default(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[Running]:
    """A worker with the shipped report interval (the bound, as users get it)."""
    async for running in _worker(temporal, pg_url, redis_url, PROGRESS_INTERVAL):
        yield running


async def start(
    running: Running, source: SSESource, rate: float, *, replay_window: float = 600.0
) -> WorkflowHandle:
    name = "live-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=rate, keepalive=1, retry_ms=None))
    spec = StreamSpec(
        name=name,
        url=source.url(name),
        id_order="numeric",
        max_connection_age=3600.0,
        batch_max_delay=0.05,
        replay_window=replay_window,
    )
    return await running.client.start_workflow(
        "StreamWorkflow",
        spec,
        id=stream_workflow_id(name),
        task_queue=running.queue,
        result_type=StreamStatus,
    )


async def status_of(handle: WorkflowHandle) -> StreamStatus:
    return await handle.query("status", result_type=StreamStatus)


async def poll(handle: WorkflowHandle, predicate, *, timeout: float, what: str) -> StreamStatus:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await status_of(handle)
        if predicate(status):
            return status
        if loop.time() > deadline:
            raise AssertionError(f"{what}: never happened; last status {status}")
        await asyncio.sleep(0.2)


async def stored_rows(log: Stores, stream: str) -> int:
    def query() -> int:
        with log.database.engine.connect() as connection:
            return int(
                connection.execute(
                    sa.text("SELECT count(*) FROM sse_events WHERE stream = :s"), {"s": stream}
                ).scalar_one()
            )

    return await asyncio.to_thread(query)


async def progress_signals(handle: WorkflowHandle) -> tuple[int, int]:
    """(history length, progress signals in it)."""
    history = await handle.fetch_history()
    signals = sum(
        1
        for event in history.events
        if event.HasField("workflow_execution_signaled_event_attributes")
        and event.workflow_execution_signaled_event_attributes.signal_name == "progress"
    )
    return len(history.events), signals


@pytest.fixture(scope="module")
async def event_log(pg_url: str) -> AsyncIterator[Stores]:
    log = Stores.open(pg_url)
    await log.create_schema()
    yield log
    await log.close()


async def test_status_details_and_cli_move_while_the_connection_stays_open(
    quick: Running, source: SSESource, event_log: Stores
) -> None:
    handle = await start(quick, source, rate=50)
    first = await poll(
        handle,
        lambda s: s.progress_at is not None and s.counters.events_persisted > 0,
        timeout=30,
        what="a first progress report",
    )
    assert first.state == "reading" and first.counters.connections == 1
    assert first.live_cursor is not None and first.commit_lag is not None
    length_before, signals_before = await progress_signals(handle)

    later = await poll(
        handle,
        lambda s: s.counters.events_persisted >= first.counters.events_persisted + 100,
        timeout=30,
        what="the persisted count to move",
    )
    assert later.counters.connections == 1, "the connection was not kept open"
    assert int(later.live_cursor) > int(first.live_cursor)
    assert later.progress_at > first.progress_at
    # The lagging id and gaps come with reports too: none yet on a fresh stream.
    assert later.lagging_id is None and later.counters.gaps_open == 0

    details = str((await handle.query("__temporal_workflow_metadata")).current_details)
    assert "as of " in details and "commit lag" in details
    assert "live: `-`" not in details, details

    row = await control.stream_status(quick.client, handle.id.removeprefix("sse-stream:"))
    cursor, persisted = control.current_counts(row)
    assert persisted >= later.counters.events_persisted and int(cursor) >= int(later.live_cursor)

    # What a report costs the history: the signal and the workflow task it wakes.
    length_after, signals_after = await progress_signals(handle)
    reports = signals_after - signals_before
    print(f"history cost: {reports} reports added {length_after - length_before} events")
    assert reports >= 2
    assert length_after - length_before <= EVENTS_PER_REPORT * reports + 3, (
        length_before,
        length_after,
        reports,
    )
    await handle.signal("stop")
    final = await handle.result()
    await capture_history(handle, "stream_progress_reports")
    # The result, not the reports, is what the state keeps: nothing counted twice.
    assert final.counters.events_persisted == await stored_rows(event_log, final.name)


async def test_the_lagging_id_moves_in_the_views_while_the_connection_stays_open(
    quick: Running, source: SSESource
) -> None:
    """The checkpoint schedule moves the lagging id every replay window (here 2 s); the
    views learn it from the next report, not when the connection ends."""
    handle = await start(quick, source, rate=50, replay_window=2.0)
    first = await poll(
        handle, lambda s: s.lagging_id is not None, timeout=30, what="a lagging id in the view"
    )
    later = await poll(
        handle,
        lambda s: s.lagging_id is not None and int(s.lagging_id) > int(first.lagging_id),
        timeout=30,
        what="the lagging id to move in the view",
    )
    assert first.counters.connections == later.counters.connections == 1
    assert int(later.lagging_id) <= int(later.live_cursor)
    details = str((await handle.query("__temporal_workflow_metadata")).current_details)
    assert "lagging: `-`" not in details, details
    await handle.signal("stop")
    await handle.result()


async def test_quiet_streams_send_no_reports(quick: Running, source: SSESource) -> None:
    """Nothing changed, nothing sent: an idle stream costs no history."""
    handle = await start(quick, source, rate=20)
    await poll(
        handle, lambda s: s.progress_at is not None, timeout=30, what="a first progress report"
    )
    source.inject(handle.id.removeprefix("sse-stream:"), action="pause")
    await asyncio.sleep(3)  # the events already sent commit and are reported
    _, settled = await progress_signals(handle)
    await asyncio.sleep(5)  # five report intervals, keep-alives only
    _, later = await progress_signals(handle)
    assert later == settled, "an idle connection kept reporting"
    status = await status_of(handle)
    assert status.counters.connections == 1 and status.state == "reading"
    await handle.signal("stop")
    await handle.result()


async def test_with_the_shipped_interval_views_are_never_older_than_30_s(
    default: Running, source: SSESource
) -> None:
    handle = await start(default, source, rate=20)
    started = datetime.now(UTC)
    await poll(
        handle,
        lambda s: s.progress_at is not None,
        timeout=FRESHNESS,
        what=f"a report within {FRESHNESS:g} s of the start",
    )
    loop = asyncio.get_running_loop()
    end = loop.time() + 2 * PROGRESS_INTERVAL + 5
    reports = set()
    while loop.time() < end:
        status = await status_of(handle)
        assert status.counters.connections == 1
        assert status.progress_at is not None
        age = (datetime.now(UTC) - datetime.fromisoformat(status.progress_at)).total_seconds()
        assert age <= FRESHNESS, f"the view is {age:.1f} s old"
        reports.add(status.progress_at)
        await asyncio.sleep(1)
    assert len(reports) >= 2, "the view did not move"
    assert (datetime.now(UTC) - started).total_seconds() > PROGRESS_INTERVAL
    await handle.signal("stop")
    await handle.result()
