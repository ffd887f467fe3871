"""The ``SseStreamState`` search attribute on real dev servers: with it, and without it.

Where the namespace has it registered (as ``durable-sse dev`` does), Temporal's own list
(``temporal workflow list --query``, the Web UI) can show only parked streams; where it is
not, the very same worker and workflow run as before and never try to set it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from durable_sse.activities.attributes import ANSWER_TTL, SearchAttributeActivities, answer_fresh
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import STREAM_STATE_ATTRIBUTE, StreamStatus, stream_workflow_id
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.ops.live import LiveStores, live_status
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.worker import WorkerResources, build_worker
from durable_sse.workflows.stream import STREAM_STATE
from tests.system.test_e2e import capture_history

pytestmark = pytest.mark.slow

POLL_LIMIT = 30.0
"""A hang guard (visibility is eventually consistent), not a timing assertion."""


@pytest.fixture(scope="module")
async def registered() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server started the way ``durable-sse dev`` starts it: attribute registered."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(), ui=False, search_attributes=[STREAM_STATE]
    )
    yield env
    await env.shutdown()


async def running_worker(client: Client, pg_url: str, redis_url: str) -> AsyncIterator[str]:
    settings = Settings.from_env({"DATABASE_URL": pg_url, "REDIS_URL": redis_url})
    resources = WorkerResources.from_settings(settings)
    await resources.stores.create_schema()
    queue = f"sa-{uuid.uuid4().hex[:8]}"
    try:
        async with build_worker(client, resources, task_queue=queue, progress_interval=1.0):
            yield queue
    finally:
        await resources.close()


async def start(client: Client, queue: str, name: str, url: str) -> WorkflowHandle:
    spec = StreamSpec(name=name, url=url, id_order="numeric", batch_max_delay=0.05)
    return await client.start_workflow(
        "StreamWorkflow",
        spec,
        id=stream_workflow_id(name),
        task_queue=queue,
        result_type=StreamStatus,
    )


async def listed(client: Client, query: str) -> set[str]:
    return {execution.id async for execution in client.list_workflows(query)}


async def until_listed(client: Client, query: str, wanted: set[str]) -> set[str]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_LIMIT
    while True:
        found = await listed(client, query)
        if wanted <= found:
            return found
        if loop.time() > deadline:
            raise AssertionError(f"{query!r} lists {found}, not {wanted}")
        await asyncio.sleep(0.3)


def state_query(state: str) -> str:
    return f'WorkflowType = "StreamWorkflow" AND {STREAM_STATE_ATTRIBUTE} = "{state}"'


async def upserts(handle: WorkflowHandle) -> list[str]:
    """The SseStreamState values the run set, in order."""
    history = await handle.fetch_history()
    values = []
    for event in history.events:
        if event.HasField("upsert_workflow_search_attributes_event_attributes"):
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes
            if STREAM_STATE_ATTRIBUTE in fields.indexed_fields:  # not the SDK's patch marker
                values.append(
                    fields.indexed_fields[STREAM_STATE_ATTRIBUTE].data.decode().strip('"')
                )
    return values


async def test_the_list_shows_parked_streams_apart_where_the_attribute_is_registered(
    registered: WorkflowEnvironment, source: SSESource, pg_url: str, redis_url: str
) -> None:
    client = registered.client
    healthy, refused = ("sa-ok-" + uuid.uuid4().hex[:8], "sa-404-" + uuid.uuid4().hex[:8])
    source.add_stream(healthy, SourceStreamConfig(rate=20, keepalive=1, retry_ms=None))
    async for queue in running_worker(client, pg_url, redis_url):
        ok = await start(client, queue, healthy, source.url(healthy))
        parked = await start(client, queue, refused, source.url(refused))  # no such stream
        ids = {"ok": ok.id, "parked": parked.id}

        assert ids["parked"] in await until_listed(client, state_query("parked"), {ids["parked"]})
        assert ids["ok"] not in await listed(client, state_query("parked"))
        await until_listed(client, state_query("reading"), {ids["ok"]})
        assert ids["parked"] not in await listed(client, state_query("reading"))

        await ok.signal("pause")
        await until_listed(client, state_query("paused"), {ids["ok"]})
        await ok.signal("resume")
        await until_listed(client, state_query("reading"), {ids["ok"]})
        for handle in (ok, parked):
            await handle.signal("stop")
            await handle.result()
        await until_listed(client, state_query("stopped"), set(ids.values()))

    await capture_history(ok, "stream_state_attribute")
    # One upsert per change of condition, not per reconnect or report.
    assert await upserts(ok) == ["reading", "paused", "reading", "stopped"]
    assert await upserts(parked) == ["reading", "parked", "stopped"]


async def test_streams_run_without_the_attribute_where_it_is_not_registered(
    temporal: WorkflowEnvironment, source: SSESource, pg_url: str, redis_url: str
) -> None:
    client = temporal.client
    name = "sa-none-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=50, keepalive=1, retry_ms=None))
    live = LiveStores(l2=RedisCursors(redis_url))
    async for queue in running_worker(client, pg_url, redis_url):
        handle = await start(client, queue, name, source.url(name))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POLL_LIMIT
        while True:  # the running connection's progress is live in Redis, not the workflow
            status = await live_status(await handle.query("status", result_type=StreamStatus), live)
            if status.counters.events_persisted > 0:
                break
            assert loop.time() < deadline, f"nothing persisted: {status}"
            await asyncio.sleep(0.2)
        assert status.state == "reading" and status.last_error is None
        await handle.signal("pause")
        await handle.signal("resume")
        await handle.signal("stop")
        final = await handle.result()
    await live.close()
    assert final.state == "stopped" and final.counters.events_persisted > 0
    assert await upserts(handle) == []


def test_a_listing_answers_for_a_while_then_is_asked_again() -> None:
    listed = (100.0, True)
    assert not answer_fresh(None, 100.0)
    assert answer_fresh(listed, 100.0) and answer_fresh(listed, 100.0 + ANSWER_TTL - 0.01)
    assert not answer_fresh(listed, 100.0 + ANSWER_TTL)
    assert not answer_fresh(listed, 99.0)  # a clock that went back: ask again


async def test_streams_started_at_once_share_one_listing(
    registered: WorkflowEnvironment,
) -> None:
    activities = SearchAttributeActivities(registered.client)
    env = ActivityEnvironment()
    answers = await asyncio.gather(
        *(env.run(activities.stream_state_attribute_registered) for _ in range(50))
    )
    assert answers == [True] * 50
    assert activities.listings == 1


async def test_an_old_listing_answers_while_a_new_one_is_made(
    registered: WorkflowEnvironment,
) -> None:
    """Past ``ANSWER_TTL`` the worker lists again in the background: the runs that ask
    meanwhile get the last answer at once, not a wait on the server (a start burst slowed
    one listing past the check's 10 s timeout, 311 times, twice each)."""
    activities = SearchAttributeActivities(registered.client)
    env = ActivityEnvironment()
    assert await env.run(activities.stream_state_attribute_registered)
    listed_at, answer = activities._answer or (0.0, False)
    activities._answer = (listed_at - ANSWER_TTL - 1, answer)
    renewed = asyncio.Event()
    listing = activities._list

    async def slow_list() -> bool | None:
        await renewed.wait()
        return await listing()

    activities._list = slow_list  # type: ignore[method-assign]
    answers = await asyncio.wait_for(
        asyncio.gather(*(env.run(activities.stream_state_attribute_registered) for _ in range(20))),
        5,
    )
    assert answers == [True] * 20
    renewed.set()
    assert activities._renewal is not None and await activities._renewal
    assert activities.listings == 2
    assert activities._answer is not None and activities._answer[0] > listed_at
