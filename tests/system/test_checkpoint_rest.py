"""An idle stream's checkpoint schedule rests, and its next event wakes it: on a real dev
server, with the real worker (reader, PostgreSQL, Redis) reading the demo source.

Issue 25: every checkpoint run is billed, and a stream with nothing new has nothing to
advance. Here a 2 s replay window makes the schedule run every 2 s: while the source
sends, the runs go on; once it goes quiet the lagging id reaches the newest id and a run
pauses the schedule; when the source sends again, the connection (still the same one)
wakes it, and the lagging id follows the new events a window later.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.settings import Settings
from durable_sse.contracts import checkpoint_schedule_id
from durable_sse.cursor.rest import REST_NOTE, WAKE_NOTE
from durable_sse.ops import control
from durable_sse.ops.live import LiveStores
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.worker import WorkerResources, build_worker
from tests.chaos.harness import start_stream, steady_spec
from tests.system.test_e2e import capture_history

pytestmark = pytest.mark.slow

POLL_LIMIT = 60.0
"""Safety bound on each wait (a hang guard, not a timing assertion)."""

T = TypeVar("T")


@pytest.fixture
async def running(
    temporal: WorkflowEnvironment, pg_url: str, redis_url: str
) -> AsyncIterator[tuple[Client, str, Stores]]:
    settings = Settings.from_env({"DATABASE_URL": pg_url, "REDIS_URL": redis_url})
    resources = WorkerResources.from_settings(settings)
    await resources.stores.create_schema()
    queue = f"rest-{uuid.uuid4().hex[:8]}"
    try:
        async with build_worker(temporal.client, resources, task_queue=queue):
            yield temporal.client, queue, resources.stores
    finally:
        await resources.close()


async def until(what: str, probe: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_LIMIT
    while not done(value := await probe()):
        if loop.time() > deadline:
            raise AssertionError(f"{what}: never happened; last {value!r}")
        await asyncio.sleep(0.2)
    return value


async def state(handle: ScheduleHandle) -> tuple[bool, str | None, int]:
    description = await handle.describe()
    return (
        description.schedule.state.paused,
        description.schedule.state.note,
        description.info.num_actions,
    )


async def test_an_idle_stream_rests_its_schedule_and_its_next_event_wakes_it(
    running: tuple[Client, str, Stores], source: SSESource
) -> None:
    client, queue, stores = running
    name = "rest-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=20, keepalive=0.5, retry_ms=None))
    spec = steady_spec(source, name, replay_window=2.0)
    stream = await start_stream(client, spec, queue)
    schedule = client.get_schedule_handle(checkpoint_schedule_id(name))

    async def lagging() -> str | None:
        checkpoint = await stores.checkpoints.get_checkpoint(name)
        return None if checkpoint is None else checkpoint.lagging_id

    try:
        # Busy: runs follow one another and the lagging id trails the stream.
        await until("a lagging id", lagging, lambda lag: lag is not None)
        paused, _, runs = await until("runs", lambda: state(schedule), lambda s: s[2] >= 2)
        assert not paused

        # Quiet: the lagging id reaches the newest id and a run lets the schedule rest.
        source.inject(name, action="pause")
        paused, note, runs = await until("a rest", lambda: state(schedule), lambda s: s[0])
        assert note == REST_NOTE
        newest = max(source.truth(name).ids)
        assert await lagging() == str(newest)
        checkpoint = await stores.checkpoints.get_checkpoint(name)
        assert checkpoint is not None and checkpoint.resting_since is not None
        status = await control.stream_status(client, name, live=LiveStores(stores=stores))
        assert status["checkpoint_resting_since"] == checkpoint.resting_since
        assert control.lagging_text(status) == f"{newest} (resting)"
        await asyncio.sleep(5.0)  # two and a half windows: no run starts while it rests
        assert await state(schedule) == (True, REST_NOTE, runs)
        started = (await schedule.describe()).info.recent_actions[-1].action
        assert isinstance(started, ScheduleActionExecutionStartWorkflow)
        run = client.get_workflow_handle(started.workflow_id, run_id=started.first_execution_run_id)
        assert (await run.result())["rested"] is True
        await capture_history(run, "checkpoint_rest")

        # Events again: the connection that stores the first wakes the schedule, and the
        # lagging id moves past the rest a window later.
        source.inject(name, action="resume")
        await until("a wake", lambda: state(schedule), lambda s: not s[0])
        assert (await state(schedule))[1] == WAKE_NOTE
        await until("the lagging id moving on", lagging, lambda lag: int(lag or 0) > newest)
        assert (await stores.checkpoints.get_checkpoint(name)).resting_since is None  # type: ignore[union-attr]
    finally:
        await stream.signal("stop")
        await stream.result()
