"""Retention under running streams, on a real Temporal dev server.

The real worker (reader, PostgreSQL, Redis, the checkpoint schedule) reads the demo
source while the checkpoint runs delete behind it: nothing at or after the lagging id is
lost, every row stored is either still there or counted as deleted, and the counts in
``status``, the database and the Prometheus metrics agree. A second stream with its own,
longer retention shows the stream's setting overriding the worker's.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.client import (
    Client,
    ScheduleActionExecutionStartWorkflow,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, checkpoint_schedule_id
from durable_sse.ops.live import LiveStores, live_status
from durable_sse.ops.metrics import prometheus_runtime
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.worker import WorkerResources, build_worker
from tests.chaos.harness import start_stream
from tests.log.helpers import event_ids
from tests.system.test_e2e import capture_history, metric, scrape

pytestmark = pytest.mark.slow

WINDOW = 2.0
"""The streams' replay window, so also the checkpoint schedule's interval."""
WORKER_RETENTION = 6.0
"""The worker's retention, in seconds: far below what ``DURABLE_SSE_RETENTION`` accepts
(1m), so that a test sees several deletes; the activity takes any number of seconds."""
RATE = 50.0


@dataclass
class Running:
    client: Client
    queue: str
    log: Stores
    metrics_port: int


@pytest.fixture
async def running(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[Running]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = await Client.connect(
        temporal.client.service_client.config.target_host,
        namespace=temporal.client.namespace,
        runtime=prometheus_runtime(port, host="127.0.0.1"),
    )
    settings = Settings.from_env({"DATABASE_URL": pg_url, "REDIS_URL": redis_url})
    resources = WorkerResources.from_settings(settings)
    await resources.stores.create_schema()
    queue = f"retention-{uuid.uuid4().hex[:8]}"
    worker = build_worker(
        client, resources, task_queue=queue, progress_interval=1.0, retention=WORKER_RETENTION
    )
    try:
        async with worker:
            yield Running(client, queue, resources.stores, port)
    finally:
        await resources.close()


async def start(
    running: Running,
    source: SSESource,
    *,
    retention: float | None = None,
    name: str | None = None,
    id_order: str | None = "numeric",
) -> WorkflowHandle:
    """Start a stream of the demo source (a new one unless ``name`` is given); with
    ``id_order`` None the spec leaves it out (the default, ``natural``)."""
    if name is None:
        name = "ret-" + uuid.uuid4().hex[:8]
        source.add_stream(name, SourceStreamConfig(rate=RATE, keepalive=1, retry_ms=None))
    settings: dict[str, object] = {} if id_order is None else {"id_order": id_order}
    spec = StreamSpec(
        name=name,
        url=source.url(name),
        max_connection_age=3600.0,
        batch_max_delay=0.05,
        replay_window=WINDOW,
        retention=retention,
        **settings,  # type: ignore[arg-type]
    )
    return await start_stream(running.client, spec, running.queue)


async def stored(log: Stores, stream: str) -> list[int]:
    return [int(event_id) for event_id in await event_ids(log, stream)]


async def capture_checkpoint_run(client: Client, name: str) -> None:
    """With DURABLE_SSE_CAPTURE_HISTORY=1, store a finished checkpoint run with retention."""
    if not os.environ.get("DURABLE_SSE_CAPTURE_HISTORY"):
        return
    schedule = await client.get_schedule_handle(checkpoint_schedule_id(name)).describe()
    action = schedule.info.recent_actions[-2].action  # the last one may still run
    assert isinstance(action, ScheduleActionExecutionStartWorkflow)
    run = client.get_workflow_handle(action.workflow_id, run_id=action.first_execution_run_id)
    await run.result()
    await capture_history(run, "checkpoint_retention")


async def replay_what_was_deleted(
    running: Running, handle: WorkflowHandle, log: Stores, name: str
) -> int:
    """``replay --from-id 1``: the source re-sends everything from its first id, rows
    retention deleted included. Returns how many ids it re-sent that were stored once.

    The checkpoint schedule is paused meanwhile, so no delete runs during the replay
    (a row deleted in the very milliseconds a replay re-sends it could be stored again:
    the write path reads the horizon as its transaction starts).
    """
    schedule = running.client.get_schedule_handle(checkpoint_schedule_id(name))
    await schedule.pause()
    await asyncio.sleep(1.0)  # a run already started ends
    before = await status_of(running, handle)
    oldest_kept = (await stored(log, name))[0]
    assert before.live_cursor is not None and oldest_kept > 1
    await handle.signal("replay", {"from_id": "1"})
    resent = int(before.live_cursor) - 1

    def seen(status: StreamStatus) -> int:
        return status.counters.duplicates + status.counters.dropped_by_horizon

    async def replayed() -> bool:
        status = await status_of(running, handle)
        return seen(status) - seen(before) >= resent

    await wait_for(replayed, timeout=60, what="the replay of every id from 2 on")
    ids = await stored(log, name)
    assert min(ids) == oldest_kept  # nothing retention deleted came back
    status = await status_of(running, handle)
    assert status.counters.events_recovered == 0
    # What retention deleted (2 up to the horizon, just before the oldest kept) is
    # counted as dropped by the horizon; the rest as duplicates.
    dropped = status.counters.dropped_by_horizon - before.counters.dropped_by_horizon
    assert dropped == oldest_kept - 2
    await schedule.unpause()
    return resent


async def status_of(running: Running, handle: WorkflowHandle) -> StreamStatus:
    """The status ``durable-sse status`` shows: the workflow's, with the running
    connection's live progress (Redis) and the store's gaps folded in (the workflow
    itself learns cursors and counts when a connection ends)."""
    status = await handle.query("status", result_type=StreamStatus)
    return await live_status(status, LiveStores(l2=running.log.l2, stores=running.log))


async def wait_for(check, *, timeout: float, what: str) -> None:  # noqa: ANN001
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: never happened")
        await asyncio.sleep(0.25)


async def test_retention_deletes_behind_a_running_stream_and_loses_nothing_newer(
    running: Running, source: SSESource
) -> None:
    inherits = await start(running, source)  # the worker's retention
    own = await start(running, source, retention=3600.0)  # its own: nothing is old enough
    log = running.log
    name = inherits.id.removeprefix("sse-stream:")
    own_name = own.id.removeprefix("sse-stream:")

    async def deleted_three_times() -> bool:
        status = await inherits.query("status", result_type=StreamStatus)
        report = status.retention
        return report is not None and report.deleted_rows >= 3 * RATE * WINDOW

    # Several deletes while the stream reads on (each run at most one window's rows).
    await wait_for(deleted_three_times, timeout=90, what="three windows of rows deleted")
    await capture_checkpoint_run(running.client, name)
    resent = await replay_what_was_deleted(running, inherits, log, name)
    for handle in (inherits, own):
        await handle.signal("stop")
    finals = [await asyncio.wait_for(h.result(), 60) for h in (inherits, own)]
    await asyncio.sleep(2 * WINDOW)  # a checkpoint run still in flight ends

    await capture_history(inherits, "stream_retention_reports")
    final = finals[0]
    state = await log.prune.retention_state(name)
    ids = await stored(log, name)
    checkpoint = await log.checkpoints.get_checkpoint(name)
    assert checkpoint is not None and checkpoint.lagging_id is not None
    lagging = int(checkpoint.lagging_id)
    # Nothing lost: the ids stored run without a hole from the oldest kept to the cursor,
    # every id from the lagging id on is among them, and what is not is counted deleted.
    assert ids == list(range(ids[0], ids[-1] + 1))
    assert ids[0] <= lagging <= ids[-1] and str(ids[-1]) == final.live_cursor
    assert len(ids) + state.deleted_rows == final.counters.events_persisted
    assert final.counters.events_recovered == 0 and final.counters.gaps_open == 0
    assert final.counters.duplicates + final.counters.dropped_by_horizon >= resent

    # Status: the last report the stream got (later runs can only have deleted more).
    report = final.retention
    assert report is not None
    assert (report.retention, report.source) == (WORKER_RETENTION, "worker")
    assert 3 * RATE * WINDOW <= report.deleted_rows <= state.deleted_rows
    # The lagging id holds the fence, or the running connection's hold when that is
    # older (the id it read a window ago, moved with its reports).
    assert report.oldest_kept_at is not None and report.held_by in ("lagging", "reader")
    # Metrics: every run's deletes, and the oldest row kept, as the database has them.
    samples = scrape(running.metrics_port)
    assert metric(samples, "durable_sse_retention_deleted_rows", stream=name) == (
        state.deleted_rows
    )
    assert state.oldest_kept_at is not None
    oldest = metric(samples, "durable_sse_retention_oldest_kept_timestamp_seconds", stream=name)
    assert oldest == pytest.approx(state.oldest_kept_at.timestamp(), abs=1e-3)

    # The stream with its own retention (an hour) kept everything it read.
    own_ids = await stored(log, own_name)
    assert own_ids == list(range(own_ids[0], own_ids[-1] + 1))
    assert len(own_ids) == finals[1].counters.events_persisted
    assert (await log.prune.retention_state(own_name)).deleted_rows == 0
    assert metric(samples, "durable_sse_retention_deleted_rows", stream=own_name) == 0


async def test_a_stream_started_again_under_another_id_order_parks_and_loses_nothing(
    running: Running, source: SSESource
) -> None:
    """Issue 24, item 1, from outside: a ``numeric`` stream with retention, stopped and
    started again without ``id_order`` (so ``natural``), used to store none of its new
    events while its status said ``reading``. It parks, naming both orders and what to
    do; its checkpoint runs refuse too; nothing stored, deleted or moved changes. Started
    again with ``numeric`` it reads on without a hole."""
    handle = await start(running, source)
    log = running.log
    name = handle.id.removeprefix("sse-stream:")

    async def deleted() -> bool:
        report = (await handle.query("status", result_type=StreamStatus)).retention
        return report is not None and report.deleted_rows > 0

    await wait_for(deleted, timeout=90, what="retention deleting rows")
    await handle.signal("stop")
    first = await asyncio.wait_for(handle.result(), 60)
    await asyncio.sleep(2 * WINDOW)  # a checkpoint run still in flight ends

    async def snapshot() -> tuple[object, ...]:
        return (
            await stored(log, name),
            await log.prune.retention_state(name),
            await log.checkpoints.get_checkpoint(name),
        )

    before = await snapshot()
    handle = await start(running, source, name=name, id_order=None)

    async def parked() -> bool:
        status = await handle.query("status", result_type=StreamStatus)
        return status.state == "parked"

    await wait_for(parked, timeout=60, what="the stream parking")
    status = await handle.query("status", result_type=StreamStatus)
    message = status.last_error or ""
    assert "id_order 'natural'" in message and "('numeric')" in message, message
    assert "start it with id_order = 'numeric'" in message
    # Its schedule (created under natural within a window) fires every window: refused.
    schedule = running.client.get_schedule_handle(checkpoint_schedule_id(name))

    async def refused_run() -> bool:
        try:
            actions = (await schedule.describe()).info.recent_actions
        except Exception:  # noqa: BLE001 - not created yet
            return False
        for taken in actions:
            action = taken.action
            assert isinstance(action, ScheduleActionExecutionStartWorkflow)
            run = running.client.get_workflow_handle(
                action.workflow_id, run_id=action.first_execution_run_id
            )
            try:
                await asyncio.wait_for(run.result(), 10)
            except WorkflowFailureError as failure:
                return "'natural'" in str(failure.cause.cause) and "'numeric'" in str(
                    failure.cause.cause
                )
        return False

    await wait_for(refused_run, timeout=60, what="a checkpoint run refusing the order")
    await asyncio.sleep(2 * WINDOW)
    assert await snapshot() == before
    await handle.signal("stop")
    await asyncio.wait_for(handle.result(), 60)

    handle = await start(running, source, name=name)
    last = int(first.live_cursor or 0)

    async def read_on() -> bool:
        status = await status_of(running, handle)
        return status.live_cursor is not None and int(status.live_cursor) > last + 2 * RATE

    await wait_for(read_on, timeout=60, what="the stream reading on under numeric")
    await handle.signal("stop")
    final = await asyncio.wait_for(handle.result(), 60)
    ids = await stored(log, name)
    assert ids == list(range(ids[0], ids[-1] + 1)) and str(ids[-1]) == final.live_cursor
    assert final.counters.dropped_by_horizon == 0 and final.counters.gaps_open == 0
