"""Secrets stay home, plaintext input is refused, a stream has one owner (issue 14).

End to end on a real Temporal dev server with the real worker in process, PostgreSQL and
Redis. Each test plays the attack the issue describes as a client with access to the
task queue would (a plain JSON input, a workflow id of its choosing) and checks that
the target is untouched:

* a loopback listener records every request: no undeclared variable and no variable of
  the worker's own configuration ever reaches it, a declared secret reaches only the
  host it is bound to, and no secret value is in the history, the logs or the database;
* a worker with a payload key fails a workflow started with plaintext input, at once
  and for good, before any activity runs;
* a workflow whose id names another stream changes none of that stream's rows, cursor
  or schedule, and stopping it leaves the real stream's schedule in place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from durable_sse import worker as worker_module
from durable_sse.activities.schedule import ScheduleActivities
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.config.temporal import PAYLOAD_KEY_ENV as KEY_ENV
from durable_sse.contracts import (
    AdvanceInput,
    ScheduleInput,
    StreamRef,
    StreamStatus,
    checkpoint_schedule_id,
    stream_workflow_id,
)
from durable_sse.cursor.l2 import KEY_PREFIX
from durable_sse.ops import control
from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.ops.codec import data_converter_from_env, generate_key
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.workflows.routes import StreamState
from tests.chaos.harness import wait_until
from tests.conftest import open_stores

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASK_QUEUE = "sse-consumer"
DECLARED = WORKER_SECRETS = "LOOP_TOKEN@127.0.0.1,ELSEWHERE_TOKEN@localhost"
"""The worker's ``SSE_SECRETS``: the listener answers on both names, so the binding is
tested by host name alone."""


# -- a loopback listener that records every request -----------------------------------------


@dataclass
class Request:
    target: str
    headers: dict[str, str]
    raw: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)


@dataclass
class Listener:
    """Records each request's target and headers; answers one SSE event, then holds on."""

    requests: list[Request] = field(default_factory=list)
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        target = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        self.requests.append(Request(target=target, headers=headers, raw=head))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"\r\nid: 1\ndata: hello\n\n"
        )
        try:
            await writer.drain()
            await reader.read()  # hold the stream open until the reader goes away
        except ConnectionError:
            pass
        finally:
            writer.close()

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/s/{name}"

    def to(self, name: str) -> list[Request]:
        return [request for request in self.requests if request.path == f"/s/{name}"]


@pytest.fixture(scope="module")
async def listener() -> AsyncIterator[Listener]:
    recorder = Listener()
    server = await asyncio.start_server(recorder.handle, "127.0.0.1", 0)
    recorder.port = server.sockets[0].getsockname()[1]
    async with server:
        yield recorder
        server.close()


# -- the worker, stores and CLI -------------------------------------------------------------


def worker_settings(address: str, pg_url: str, redis_url: str, **extra: str) -> Settings:
    return Settings.from_env(
        {"TEMPORAL_ADDRESS": address, "DATABASE_URL": pg_url, "REDIS_URL": redis_url, **extra}
    )


@pytest.fixture(scope="module")
async def event_log(pg_url: str) -> AsyncIterator[Stores]:
    async with open_stores(pg_url) as log:
        yield log


def temporal_cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEMPORAL_ADDRESS": address}
    return subprocess.run(
        [temporal_dev_server(), *args], env=env, capture_output=True, text=True, check=False
    )


async def status_of(handle: WorkflowHandle) -> StreamStatus:
    return await handle.query("status", result_type=StreamStatus)


def state_is(handle: WorkflowHandle, *states: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await status_of(handle)).state in states

    return check


async def stream_tables(log: Stores) -> list[str]:
    """Every ``sse_*`` table that has a ``stream`` column (whatever the schema version)."""

    def query() -> list[str]:
        with log.database.engine.connect() as connection:
            rows = connection.execute(
                sa.text(
                    "SELECT DISTINCT table_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name LIKE 'sse%' "
                    "AND column_name = 'stream' ORDER BY table_name"
                )
            )
            return [row[0] for row in rows]

    return await asyncio.to_thread(query)


async def rows_of(log: Stores, stream: str) -> dict[str, list[str]]:
    """Each table's rows of ``stream``, every column, as PostgreSQL prints them."""
    tables = await stream_tables(log)

    def query() -> dict[str, list[str]]:
        with log.database.engine.connect() as connection:
            return {
                table: [
                    row[0]
                    for row in connection.execute(
                        sa.text(f"SELECT t::text FROM {table} t WHERE stream = :s ORDER BY 1"),
                        {"s": stream},
                    )
                ]
                for table in tables
            }

    return await asyncio.to_thread(query)


async def database_hits(log: Stores, value: str) -> int:
    """Rows of any ``sse_*`` table (all streams) whose text holds ``value``."""
    tables = await stream_tables(log)

    def query() -> int:
        with log.database.engine.connect() as connection:
            return sum(
                connection.execute(
                    sa.text(f"SELECT count(*) FROM {table} t WHERE strpos(t::text, :v) > 0"),
                    {"v": value},
                ).scalar_one()
                for table in tables
            )

    return await asyncio.to_thread(query)


# -- 1. secrets stay home -------------------------------------------------------------------


async def test_only_declared_secrets_reach_only_the_hosts_they_are_bound_to(
    temporal: WorkflowEnvironment,
    address: str,
    worker: None,
    listener: Listener,
    event_log: Stores,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    tag = uuid.uuid4().hex[:8]
    values = {
        KEY_ENV: generate_key(),
        "DATABASE_URL": f"postgresql://owner:pw-{uuid.uuid4().hex}@127.0.0.1:5432/db",
        "UNDECLARED_TOKEN": f"undeclared-{uuid.uuid4().hex}",
        "ELSEWHERE_TOKEN": f"elsewhere-{uuid.uuid4().hex}",
        "LOOP_TOKEN": f"loop-{uuid.uuid4().hex}",
    }
    for variable, value in values.items():
        # The worker's process environment: what the old reader read any name from.
        monkeypatch.setenv(variable, value)
    refused = {
        # The example: the worker's payload key and database URL.
        f"config-{tag}": (
            {"X": KEY_ENV},
            {"k": "DATABASE_URL"},
            [KEY_ENV, "DATABASE_URL"],
        ),
        f"undeclared-{tag}": ({"Authorization": "UNDECLARED_TOKEN"}, {}, ["UNDECLARED_TOKEN"]),
        # Declared, but bound to localhost: the same listener under another name.
        f"elsewhere-{tag}": ({}, {"token": "ELSEWHERE_TOKEN"}, ["ELSEWHERE_TOKEN"]),
    }
    allowed = f"declared-{tag}"
    handles: dict[str, WorkflowHandle] = {}
    for name, (headers, query, _) in refused.items():
        # Started as anyone on the task queue would: a plain JSON input.
        handles[name] = await temporal.client.start_workflow(
            "StreamWorkflow",
            {
                "name": name,
                "url": listener.url(name),
                "headers_from_env": headers,
                "query_from_env": query,
            },
            id=stream_workflow_id(name),
            task_queue=TASK_QUEUE,
        )
    handles[allowed] = await temporal.client.start_workflow(
        "StreamWorkflow",
        {
            "name": allowed,
            "url": listener.url(allowed),
            "headers_from_env": {"Authorization": "LOOP_TOKEN"},
            "query_from_env": {"access_token": "LOOP_TOKEN"},
        },
        id=stream_workflow_id(allowed),
        task_queue=TASK_QUEUE,
    )

    async def declared_arrived() -> bool:
        return bool(listener.to(allowed))

    await wait_until(declared_arrived, timeout=60, what="the declared secret's request")
    [request] = listener.to(allowed)[:1]
    assert request.headers["authorization"] == values["LOOP_TOKEN"]
    assert request.query["access_token"] == [values["LOOP_TOKEN"]]

    for name, (_, _, variables) in refused.items():
        handle = handles[name]

        async def parked_or_sent(handle: WorkflowHandle = handle, name: str = name) -> bool:
            return bool(listener.to(name)) or await state_is(handle, "parked")()

        await wait_until(parked_or_sent, timeout=60, what=f"{name} to park", handle=handle)
        assert listener.to(name) == [], f"{name}: a request was sent"
        status = await status_of(handle)
        assert status.state == "parked"
        error = status.last_error or ""
        # A variable of the worker's own configuration is refused with the workflow's
        # input (strict settings); any other undeclared or misbound one by the reader,
        # which names the host. Either way: a one-line reason naming the variable.
        assert any(variable in error for variable in variables), error
        assert "127.0.0.1" in error or "worker's own configuration" in error, error
    for request in listener.requests:
        for variable, value in values.items():
            if variable != "LOOP_TOKEN":
                assert value.encode() not in request.raw, f"{variable} reached the listener"

    for handle in handles.values():
        await handle.signal("stop")
        await asyncio.wait_for(handle.result(), 60)

    shown = ""
    for handle in handles.values():
        history = await asyncio.to_thread(
            temporal_cli, address, "workflow", "show", "--workflow-id", handle.id, "-o", "json"
        )
        assert history.returncode == 0, history.stderr
        shown += history.stdout
    assert "ConfigError" in shown  # the refusals are in the histories, by name
    for variable, value in values.items():
        secret = value if variable != "DATABASE_URL" else value.split(":")[2].split("@")[0]
        assert shown.count(secret) == 0, f"{variable} is in a workflow history"
        assert caplog.text.count(secret) == 0, f"{variable} is in the worker's logs"
        assert await database_hits(event_log, secret) == 0, f"{variable} is in the database"


# -- 2. plaintext input is refused ------------------------------------------------------------


async def test_a_worker_with_a_key_fails_a_workflow_started_with_plaintext_input(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    listener: Listener,
    event_log: Stores,
) -> None:
    key = generate_key()
    keyed = await Client.connect(address, data_converter=data_converter_from_env({KEY_ENV: key}))
    task_queue = f"sealed-{uuid.uuid4().hex[:8]}"
    resources = worker_module.WorkerResources.from_settings(
        worker_settings(address, pg_url, redis_url)
    )
    name = f"plain-{uuid.uuid4().hex[:8]}"
    try:
        async with worker_module.build_worker(keyed, resources, task_queue=task_queue):
            # A client without the key, e.g. `temporal workflow start --input '{…}'`.
            await temporal.client.start_workflow(
                "StreamWorkflow",
                {"name": name, "url": listener.url(name)},
                id=stream_workflow_id(name),
                task_queue=task_queue,
            )
            handle = keyed.get_workflow_handle(stream_workflow_id(name))
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), 30)
            cause = failed.value.cause
            assert isinstance(cause, ApplicationError), cause
            assert cause.non_retryable and cause.type == "PlaintextPayloadError"
            assert KEY_ENV in cause.message and "\n" not in cause.message
            assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED

            # The same start with the key runs (the worker is fine, only the input was not).
            sealed = f"sealed-{uuid.uuid4().hex[:8]}"
            ok = await keyed.start_workflow(
                "StreamWorkflow",
                StreamSpec(name=sealed, url=listener.url(sealed)),
                id=stream_workflow_id(sealed),
                task_queue=task_queue,
                result_type=StreamStatus,
            )

            async def connected() -> bool:
                return bool(listener.to(sealed))

            await wait_until(connected, timeout=60, what="the sealed stream's request")

            # A plaintext signal is dropped (logged), and the stream goes on: the replay
            # from 0 it asked for never happens, the keyed signals after it still work.
            plain_handle = temporal.client.get_workflow_handle(ok.id)
            await plain_handle.signal("replay", {"from_id": "0"})
            await ok.signal("pause")
            await wait_until(state_is(ok, "paused"), timeout=30, what="paused", handle=ok)
            await ok.signal("resume")

            async def reconnected() -> bool:
                return len(listener.to(sealed)) >= 2

            await wait_until(reconnected, timeout=60, what="the reconnect after resume")
            assert listener.to(sealed)[1].headers.get("last-event-id") == "1"  # live, not 0
            await ok.signal("stop")
            await asyncio.wait_for(ok.result(), 60)
    finally:
        await resources.close()
    # The refused workflow touched nothing: no request, no schedule, no rows.
    assert listener.to(name) == []
    described = await asyncio.to_thread(
        temporal_cli, address, "schedule", "describe", "--schedule-id", checkpoint_schedule_id(name)
    )
    assert described.returncode != 0 and "not found" in described.stderr.lower()
    assert all(rows == [] for rows in (await rows_of(event_log, name)).values())


def durable_sse_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    return subprocess.run(
        [sys.executable, "-m", "durable_sse.ops.cli", *args],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


async def test_the_cli_with_a_key_refuses_a_plaintext_answer_in_one_line(
    temporal: WorkflowEnvironment, address: str, worker: None, listener: Listener
) -> None:
    name = f"unsealed-{uuid.uuid4().hex[:8]}"
    handle = await temporal.client.start_workflow(  # a worker and a client without a key
        "StreamWorkflow",
        StreamSpec(name=name, url=listener.url(name)),
        id=stream_workflow_id(name),
        task_queue=TASK_QUEUE,
    )
    try:
        env = {"TEMPORAL_ADDRESS": address, KEY_ENV: generate_key()}
        refused = await asyncio.to_thread(durable_sse_cli, "status", name, env=env)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and KEY_ENV in refused.stderr, refused.stderr
        assert "unencrypted" in refused.stderr
    finally:
        await handle.signal("stop")
        await asyncio.wait_for(handle.result(), 60)


@pytest.mark.parametrize("command", [["worker"], ["status"]])
def test_required_encryption_without_a_key_refuses_to_start(command: list[str]) -> None:
    # Nothing answers at this address: the refusal comes before any connection.
    env = {"DURABLE_SSE_REQUIRE_ENCRYPTION": "1", "TEMPORAL_ADDRESS": "127.0.0.1:9"}
    refused = durable_sse_cli(*command, env=env)
    # A refused environment is refused input: exit 2 from the CLI, 1 from the worker.
    assert refused.returncode == (1 if command == ["worker"] else 2), refused
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "DURABLE_SSE_REQUIRE_ENCRYPTION" in refused.stderr and KEY_ENV in refused.stderr


# -- 3. one owner per stream ------------------------------------------------------------------

VOLATILE_SCHEDULE_INFO = (
    "recentActions",
    "futureActionTimes",
    "runningWorkflows",
    "actionCount",
    "missedCatchupWindow",
    "overlapSkipped",
    "bufferDropped",
    "bufferSize",
)
"""Fields of ``schedule describe``'s ``info`` that move with time and actions, not with
changes to the schedule: stripped before comparing (everything else, the spec, action,
policies, state, create/update times and conflict token, must be byte-identical)."""


async def schedule_json(address: str, name: str) -> str | None:
    described = await asyncio.to_thread(
        temporal_cli,
        address,
        "schedule",
        "describe",
        "--schedule-id",
        checkpoint_schedule_id(name),
        "-o",
        "json",
    )
    if described.returncode != 0:
        assert "not found" in described.stderr.lower(), described.stderr
        return None
    document = json.loads(described.stdout)
    for key in VOLATILE_SCHEDULE_INFO:
        document.get("info", {}).pop(key, None)
    return json.dumps(document, sort_keys=True)


@dataclass
class Snapshot:
    rows: dict[str, list[str]]
    cursor: bytes | None
    schedule: str | None


async def snapshot(address: str, log: Stores, redis_url: str, name: str) -> Snapshot:
    client = aioredis.Redis.from_url(redis_url)
    try:
        cursor = await client.get(f"{KEY_PREFIX}{name}")
    finally:
        await client.aclose()
    return Snapshot(await rows_of(log, name), cursor, await schedule_json(address, name))


async def settled(address: str, log: Stores, redis_url: str, name: str) -> Snapshot:
    """A snapshot once two in a row agree (the paused reader's last L2 write has landed)."""
    previous = await snapshot(address, log, redis_url, name)
    for _ in range(40):
        await asyncio.sleep(0.5)
        current = await snapshot(address, log, redis_url, name)
        if current == previous:
            return current
        previous = current
    raise AssertionError(f"{name}'s stores never settled")


async def test_a_workflow_whose_id_names_another_stream_touches_nothing(
    temporal: WorkflowEnvironment,
    address: str,
    worker: None,
    source: SSESource,
    event_log: Stores,
    redis_url: str,
) -> None:
    client = temporal.client
    victim = f"ticks-{uuid.uuid4().hex[:8]}"
    intruder_name = f"x-{uuid.uuid4().hex[:8]}"
    source.add_stream(victim, SourceStreamConfig(rate=50, keepalive=1))
    # A month-long window: the schedule does not fire while the test looks at it.
    spec = StreamSpec(
        name=victim, url=source.url(victim), id_order="numeric", replay_window=30 * 86400.0
    )
    # Its schedule at once (no spread over the first window): the takeover must leave
    # an existing schedule alone.
    handle = await client.start_workflow(
        "StreamWorkflow",
        args=[spec, StreamState(schedule_spread=0.0)],
        id=stream_workflow_id(victim),
        task_queue=TASK_QUEUE,
        result_type=StreamStatus,
    )

    async def stored_some() -> bool:
        return len((await rows_of(event_log, victim)).get("sse_events", [])) >= 50

    await wait_until(stored_some, timeout=60, what="the victim's rows", handle=handle)
    await handle.signal("pause")
    await wait_until(state_is(handle, "paused"), timeout=30, what="paused", handle=handle)
    before = await settled(address, event_log, redis_url, victim)
    assert before.cursor is not None and before.schedule is not None

    # The intruder: its own id, the victim's name, another window.
    intruder = await client.start_workflow(
        "StreamWorkflow",
        dataclasses.replace(spec, replay_window=60.0),
        id=stream_workflow_id(intruder_name),
        task_queue=TASK_QUEUE,
        result_type=StreamStatus,
    )

    async def parked_or_changed() -> bool:
        if await snapshot(address, event_log, redis_url, victim) != before:
            return True
        return await state_is(intruder, "parked")()

    await wait_until(parked_or_changed, timeout=60, what="the intruder to park")
    assert await snapshot(address, event_log, redis_url, victim) == before
    status = await status_of(intruder)
    assert status.state == "parked"
    assert stream_workflow_id(intruder_name) in (status.last_error or "")
    assert stream_workflow_id(victim) in (status.last_error or "")
    listed = await control.stream_status(client, intruder_name)
    assert listed["name"] == intruder_name  # `durable-sse status` shows no second victim row

    # A checkpoint run whose id names another stream does not move the victim's lagging id.
    with pytest.raises(WorkflowFailureError) as refused:
        await client.execute_workflow(
            "CheckpointAdvanceWorkflow",
            AdvanceInput(stream=StreamRef(name=victim, id_order="numeric"), replay_window=0.001),
            id=checkpoint_schedule_id(intruder_name),
            task_queue=TASK_QUEUE,
        )
    assert isinstance(refused.value.cause, ApplicationError)
    assert refused.value.cause.type == "ConfigError"

    await intruder.signal("stop")
    await asyncio.wait_for(intruder.result(), 60)
    after = await snapshot(address, event_log, redis_url, victim)
    assert after == before
    assert after.schedule is not None  # stopping the intruder left the victim's schedule

    # The victim is still the owner: it reads on, and its own stop removes its schedule.
    await handle.signal("resume")

    async def reading_again() -> bool:
        rows = await rows_of(event_log, victim)
        return len(rows.get("sse_events", [])) > len(before.rows.get("sse_events", []))

    await wait_until(reading_again, timeout=60, what="the victim to read on", handle=handle)
    await handle.signal("stop")
    await asyncio.wait_for(handle.result(), 60)
    assert await schedule_json(address, victim) is None


async def test_schedule_activities_act_only_for_the_stream_that_calls_them(
    temporal: WorkflowEnvironment, address: str
) -> None:
    name = f"owned-{uuid.uuid4().hex[:8]}"
    schedules = ScheduleActivities(temporal.client, TASK_QUEUE)
    spec = StreamSpec(name=name, url="http://127.0.0.1:9/s", replay_window=30 * 86400.0)

    def called_by(workflow_id: str, workflow_type: str = "StreamWorkflow") -> ActivityEnvironment:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, workflow_id=workflow_id, workflow_type=workflow_type
        )
        return env

    stranger = called_by(stream_workflow_id(f"x-{name}"))
    with pytest.raises(ApplicationError) as refused:
        await stranger.run(schedules.ensure_checkpoint_schedule, ScheduleInput(spec=spec))
    assert refused.value.non_retryable and refused.value.type == "ConfigError"
    assert await schedule_json(address, name) is None

    owner = called_by(stream_workflow_id(name))
    await owner.run(schedules.ensure_checkpoint_schedule, ScheduleInput(spec=spec))
    created = await schedule_json(address, name)
    assert created is not None
    for env in (stranger, called_by(stream_workflow_id(name), "SomeOtherWorkflow")):
        with pytest.raises(ApplicationError):
            await env.run(schedules.delete_checkpoint_schedule, StreamRef(name=name))
    assert await schedule_json(address, name) == created
    await owner.run(schedules.delete_checkpoint_schedule, StreamRef(name=name))
    assert await schedule_json(address, name) is None
