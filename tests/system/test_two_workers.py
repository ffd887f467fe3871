"""Two worker processes on one task queue share the streams (issue 16, item 5).

A real Temporal dev server, PostgreSQL, Redis and two ``worker.py`` processes: the
streams' connections spread over both, every stream persists, and a signal to a stream
read by either worker is nudged through Redis to both (``durable_sse/ops/nudge.py``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import WorkflowHandle

from durable_sse.config.spec import StreamSpec
from durable_sse.cursor.l2 import cursor_key
from durable_sse.source import SourceStreamConfig
from durable_sse.stores import Stores
from tests.chaos.harness import (
    Stack,
    end_process,
    reader_pid,
    start_stream,
    status_of,
    wait_until,
)
from tests.conftest import open_stores
from tests.system.test_portable import machine_paths

pytestmark = pytest.mark.slow

STREAMS = 16
GUARD = 90.0
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@pytest.fixture
async def event_log(pg_url: str) -> AsyncIterator[Stores]:
    """The schema exists before the workers start (each would create it otherwise)."""
    async with open_stores(pg_url) as log:
        yield log


async def nudge_results(handle: WorkflowHandle) -> list[int]:
    """What each ``nudge_reader`` returned: how many workers were subscribed."""
    history = await handle.fetch_history()
    scheduled: dict[int, str] = {}
    results: list[int] = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attributes = event.activity_task_completed_event_attributes
            if scheduled.get(attributes.scheduled_event_id) == "nudge_reader":
                results.append(int(attributes.result.payloads[0].data))
    return results


async def test_two_worker_processes_share_the_streams_and_hear_every_nudge(
    stack: Stack, tmp_path: Path
) -> None:
    task_queue = "two-" + uuid.uuid4().hex[:8]
    names = [f"two-{uuid.uuid4().hex[:8]}-{i}" for i in range(STREAMS)]
    for name in names:
        stack.source.add_stream(name, SourceStreamConfig(rate=5, keepalive=1, retry_ms=None))
    workers = [stack.worker_process(task_queue, tmp_path / f"worker-{i}.log") for i in range(2)]
    handles: list[WorkflowHandle] = []
    redis = Redis.from_url(stack.redis_url)
    try:

        async def both_polling() -> bool:
            request = DescribeTaskQueueRequest(
                namespace=stack.temporal.client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
            described = await stack.temporal.client.workflow_service.describe_task_queue(request)
            return len({poller.identity for poller in described.pollers}) >= 2

        await wait_until(both_polling, timeout=GUARD, what="both workers to poll")
        for name in names:
            spec = StreamSpec(name=name, url=stack.source.url(name), id_order="numeric")
            handles.append(await start_stream(stack.temporal.client, spec, task_queue))

        readers: dict[str, int] = {}

        async def all_reading() -> bool:
            for name, handle in zip(names, handles, strict=True):
                pid = await reader_pid(handle)
                if pid is not None:
                    readers[name] = pid
            return len(readers) == STREAMS

        await wait_until(all_reading, timeout=GUARD, what="every stream to have a reader")
        per_worker = Counter(readers.values())
        assert set(per_worker) == {w.pid for w in workers}, per_worker  # both hold streams

        async def all_persisting() -> bool:
            values = await redis.mget([cursor_key(name) for name in names])
            return all(value is not None for value in values)

        await wait_until(all_persisting, timeout=GUARD, what="every stream to persist")

        # A replay of one stream of each worker: the nudge reaches both workers (2), and
        # the stream reconnects.
        for pid in per_worker:
            name = next(n for n, p in readers.items() if p == pid)
            handle = handles[names.index(name)]
            before = (await status_of(handle)).counters.connections
            await handle.signal("replay")

            async def reconnected(handle: WorkflowHandle = handle, before: int = before) -> bool:
                return (await status_of(handle)).counters.connections > before

            await wait_until(reconnected, timeout=GUARD, what=f"{name} to reconnect")
            await wait_until(
                lambda handle=handle: _nudged(handle),
                timeout=GUARD,
                what=f"{name}'s nudge to complete",
            )
            assert await nudge_results(handle) == [2]
        await handles[0].signal("stop")
        await asyncio.wait_for(handles[0].result(), GUARD)
        await capture_history(handles[0], "stream_nudged_schedule_spread")
    finally:
        for handle in handles[1:]:
            await handle.signal("stop")
        for handle in handles[1:]:
            await asyncio.wait_for(handle.result(), GUARD)
        for process in workers:
            end_process(process)
        await redis.aclose()


async def capture_history(handle: WorkflowHandle, name: str) -> None:
    """With DURABLE_SSE_CAPTURE_HISTORY=1, store the run's history for the Replayer test
    (the ``sse-read-nudge`` and ``sse-schedule-spread`` patches)."""
    if os.environ.get("DURABLE_SSE_CAPTURE_HISTORY"):
        history = await handle.fetch_history()
        text = history.to_json()
        assert not machine_paths(text), "the history names paths of this machine"
        (HISTORIES / f"{name}.json").write_text(text)


async def _nudged(handle: WorkflowHandle) -> bool:
    return bool(await nudge_results(handle))


async def test_a_worker_that_joins_takes_its_share_of_the_connections(
    stack: Stack, tmp_path: Path
) -> None:
    """Issue 34, item 6: every stream starts on the one worker there is; a second one
    joins, and within a few looks of the balancer (10 s each) the first holds at most
    1.25 times its fair share, handing streams over cleanly (nothing lost or doubled)."""
    task_queue = "join-" + uuid.uuid4().hex[:8]
    names = [f"join-{uuid.uuid4().hex[:8]}-{i}" for i in range(STREAMS)]
    for name in names:
        stack.source.add_stream(name, SourceStreamConfig(rate=5, keepalive=1, retry_ms=None))
    first = stack.worker_process(task_queue, tmp_path / "first.log")
    workers = [first]
    handles: list[WorkflowHandle] = []
    try:
        for name in names:
            spec = StreamSpec(name=name, url=stack.source.url(name), id_order="numeric")
            handles.append(await start_stream(stack.temporal.client, spec, task_queue))

        async def readers() -> Counter[int]:
            pids = [await reader_pid(handle) for handle in handles]
            return Counter(pid for pid in pids if pid is not None)

        async def all_on_first() -> bool:
            return (await readers())[first.pid] == STREAMS

        await wait_until(all_on_first, timeout=GUARD, what="every stream to read on one worker")
        workers.append(stack.worker_process(task_queue, tmp_path / "second.log"))
        fair = STREAMS / 2
        seen: list[Counter[int]] = []

        async def spread() -> bool:
            counts = await readers()
            seen.append(counts)
            return sum(counts.values()) == STREAMS and max(counts.values()) <= 1.25 * fair

        await wait_until(spread, timeout=120, what=f"the connections to spread ({seen[-1:]})")
        for handle in handles:
            await handle.signal("stop")
        for handle in handles:
            await asyncio.wait_for(handle.result(), GUARD)
        for name in names:
            ids = [int(row.event_id) for row in await stack.log.reads.events(name, limit=100_000)]
            assert ids and sorted(ids) == list(range(min(ids), max(ids) + 1)), f"{name}: holes"
            assert len(ids) == len(set(ids)), f"{name}: duplicates"
    finally:
        for process in workers:
            end_process(process)
