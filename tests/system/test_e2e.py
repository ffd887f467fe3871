"""End to end on a real Temporal dev server, with the real activities, PostgreSQL and Redis.

The scenarios of the workflows issue: a gap announced by a drop notice is repaired
(every event stored exactly once, the status counts what the replay recovered), also
when the replay itself is cut; a worker SIGKILLed mid-stream is replaced by another
without loss or duplicates; and the README's Temporal CLI and durable-sse CLI commands
work exactly as written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.workflows.stream import STREAM_STATE
from tests.chaos.harness import Stack, end_process, start_stream, wait_until, worker_process
from tests.conftest import open_stores
from tests.log.helpers import event_ids
from tests.system.test_portable import machine_paths

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TASK_QUEUE = "sse-consumer"
WORKER_SECRETS = "E2E_HEADER@127.0.0.1,E2E_QUERY@127.0.0.1"
"""The ``SSE_SECRETS`` of the module's worker (tests/system/conftest.py)."""
HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[WorkflowEnvironment]:
    """A dev server with the SseStreamState search attribute, as `durable-sse dev` and the
    README's registration command leave it (the README lists streams by it)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(), ui=False, search_attributes=[STREAM_STATE]
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="module")
async def event_log(pg_url: str) -> AsyncIterator[Stores]:
    async with open_stores(pg_url) as log:
        yield log


async def status_of(handle: WorkflowHandle) -> StreamStatus:
    return await handle.query("status", result_type=StreamStatus)


async def stored_ids(log: Stores, stream: str) -> list[int]:
    return [int(event_id) for event_id in await event_ids(log, stream)]


def assert_complete_and_unique(ids: list[int]) -> None:
    assert ids, "nothing stored"
    assert len(ids) == len(set(ids)), "duplicate rows"
    missing = sorted(set(range(min(ids), max(ids) + 1)) - set(ids))
    assert missing == [], f"{len(missing)} events lost, first {missing[:10]}"


async def capture_history(handle: WorkflowHandle, name: str) -> None:
    """With DURABLE_SSE_CAPTURE_HISTORY=1, store the run's history for the Replayer test."""
    if os.environ.get("DURABLE_SSE_CAPTURE_HISTORY"):
        HISTORIES.mkdir(exist_ok=True)
        history = await handle.fetch_history()
        (HISTORIES / f"{name}.json").write_text(portable(history.to_json()))


def portable(text: str) -> str:
    """The history without this machine's paths (tests/system/test_portable.py checks).

    Failures carry stack traces that name files by absolute path: the checkout's (its
    ``.venv`` included) become relative to it, the interpreter's relative to its prefix.
    """
    for prefix in (str(ROOT), sys.base_prefix, sys.prefix):
        text = text.replace(prefix + os.sep, "")
    left = machine_paths(text)
    assert not left, f"the history still names paths of this machine: {left[:5]}"
    return text


async def gaps_closed(log: Stores, stream: str, state: str = "repaired") -> bool:
    """The stream has gap records, and every one is closed in ``state``."""
    records = await log.gap_store.gaps(stream)
    return bool(records) and all(record.state == state for record in records)


def learned_repair(handle: WorkflowHandle) -> Callable[[], Awaitable[bool]]:
    """The workflow knows its gap is repaired: a repair that closed every gap it knew of
    ends soon after, and its result carries the store's totals."""

    async def check() -> bool:
        counters = (await status_of(handle)).counters
        return counters.gaps_repaired >= 1 and counters.gaps_open == 0

    return check


def read_routes(history: object) -> list[str]:
    """The route of every read_stream execution the workflow scheduled, in order."""
    routes = []
    for event in history.events:  # type: ignore[attr-defined]
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            if attributes.activity_type.name == "read_stream":
                routes.append(json.loads(attributes.input.payloads[0].data)["route"])
    return routes


async def start(client: Client, spec: StreamSpec, task_queue: str = TASK_QUEUE) -> WorkflowHandle:
    return await start_stream(client, spec, task_queue)


def gap_spec(source: SSESource, name: str) -> StreamSpec:
    return StreamSpec(
        name=name,
        url=source.url(name),
        id_order="numeric",
        replay_window=2.0,
        lagged_reconnect_interval=1.0,
        batch_max_delay=0.02,
    )


async def ready_for_a_gap(handle: WorkflowHandle, log: Stores, name: str) -> None:
    """1,000+ events stored and a lagging id older than them exists."""

    async def ready() -> bool:
        checkpoint = await log.checkpoints.get_checkpoint(name)
        return (
            checkpoint is not None
            and checkpoint.lagging_id is not None
            and len(await stored_ids(log, name)) >= 1000
        )

    await wait_until(ready, timeout=60, what="1,000 events and a lagging id")


async def started_for_a_gap(
    temporal: WorkflowEnvironment, source: SSESource, log: Stores, prefix: str
) -> tuple[str, WorkflowHandle]:
    """A new 400 ev/s stream on the module's worker, once it is ready for a gap."""
    name = f"{prefix}-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=400, keepalive=1, retry_ms=None))
    handle = await start(temporal.client, gap_spec(source, name))
    await ready_for_a_gap(handle, log, name)
    return name, handle


async def test_drop_notice_gap_is_repaired_exactly_once(
    temporal: WorkflowEnvironment, worker: None, source: SSESource, event_log: Stores
) -> None:
    name, handle = await started_for_a_gap(temporal, source, event_log, "gap")

    source.inject(name, action="drop", count=50)

    await wait_until(learned_repair(handle), timeout=60, what="the repair to close the gap")
    assert await gaps_closed(event_log, name)
    status = await status_of(handle)
    c = status.counters
    assert (c.events_recovered, c.drop_signals, c.lagged_replays, c.explicit_replays) == (
        50,
        1,
        1,
        0,
    )
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable, c.events_unrecoverable) == (
        0,
        1,
        0,
        0,
    )
    assert status.open_gaps == [] and not status.repair_pending
    await handle.signal("stop")
    final = await handle.result()
    assert final.state == "stopped"

    ids = await stored_ids(event_log, name)
    assert_complete_and_unique(ids)
    first, last = source.truth(name).dropped[0]
    assert set(range(first, last + 1)) <= set(ids)
    routes = read_routes(await handle.fetch_history())
    # The repair ended by itself once its gap was closed, and the stream went back live.
    assert routes[routes.index("lagged") + 1] == "live", routes
    await capture_history(handle, "stream_gap_repaired")


async def test_disconnect_during_replay_resumes_the_replay(
    temporal: WorkflowEnvironment, worker: None, source: SSESource, event_log: Stores
) -> None:
    name, handle = await started_for_a_gap(temporal, source, event_log, "cut")

    source.inject(name, slow=0.004)  # the replay now takes seconds: time to cut it
    source.inject(name, action="drop", count=50)

    async def replaying() -> bool:
        status = await status_of(handle)
        return status.route == "lagged" and status.state == "reading"

    await wait_until(replaying, timeout=30, what="the lagged replay to start")
    await asyncio.sleep(0.5)
    source.inject(name, action="disconnect")

    await wait_until(learned_repair(handle), timeout=90, what="the cut repair to close the gap")
    source.inject(name, slow=0.0)
    assert await gaps_closed(event_log, name)
    c = (await status_of(handle)).counters
    assert (c.events_recovered, c.gaps_repaired, c.gaps_open) == (50, 1, 0)
    assert c.lagged_replays == 1  # the resumed repair is not a new lagged reconnect
    await handle.signal("stop")
    await handle.result()

    await capture_history(handle, "stream_replay_cut")
    routes = read_routes(await handle.fetch_history())
    lagged = routes.index("lagged")
    # The cut repair resumed at once on the lagged route, not from the live cursor.
    assert routes[lagged + 1] == "lagged", routes
    assert_complete_and_unique(await stored_ids(event_log, name))


async def test_sigkilled_worker_is_replaced_without_loss_or_duplicates(
    stack: Stack, tmp_path: Path
) -> None:
    name = "kill-" + uuid.uuid4().hex[:8]
    task_queue = "kill-" + uuid.uuid4().hex[:8]
    stack.source.add_stream(name, SourceStreamConfig(rate=300, keepalive=1, retry_ms=None))
    first = stack.worker_process(task_queue, tmp_path / "first.log")
    second = None
    try:
        # A worker that dies is noticed after the heartbeat timeout: 10 s here, so the
        # takeover is watched in seconds (the default, 5 minutes, trades that for cost).
        spec = StreamSpec(
            name=name, url=stack.source.url(name), id_order="numeric", heartbeat_timeout=10.0
        )
        handle = await start(stack.temporal.client, spec, task_queue)

        def flowing(count: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return len(await stored_ids(stack.log, name)) >= count

            return check

        await wait_until(flowing(300), timeout=60, what="the first worker to persist")
        second = stack.worker_process(task_queue, tmp_path / "second.log")
        await asyncio.sleep(3)  # the second worker is polling
        first.send_signal(signal.SIGKILL)
        first.wait()
        at_kill = len(await stored_ids(stack.log, name))
        await wait_until(flowing(at_kill + 1500), timeout=90, what="the second worker to take over")
        await handle.signal("stop")
        await asyncio.wait_for(handle.result(), 60)
    finally:
        for process in (first, second):
            end_process(process)
    assert_complete_and_unique(await stored_ids(stack.log, name))


async def test_readme_temporal_cli_commands_work_as_written(
    temporal: WorkflowEnvironment, address: str, worker: None, event_log: Stores
) -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("The same with the plain Temporal CLI:", 1)[1].split("```sh", 1)[1]
    block = block.split("```", 1)[0].replace("\\\n", " ")
    commands = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(commands) >= 5
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "PATH": f"{BIN}:{os.environ['PATH']}"}
    async with SSESource({"demo": SourceStreamConfig(rate=50, start_id=1150)}, port=8765):
        outputs = []
        for command in commands:
            done = await asyncio.to_thread(
                subprocess.run, command, shell=True, env=env, capture_output=True, text=True
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
            await asyncio.sleep(1)
        assert '"name": "demo"' in outputs[-1] or "demo" in outputs[-1]
        assert len(await stored_ids(event_log, "demo")) > 0
    client = temporal.client
    handle = client.get_workflow_handle(stream_workflow_id("demo"))
    await handle.signal("stop")
    await handle.result()


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_sse.ops.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def test_cli_start_status_replay_stop_and_error_lines(
    temporal: WorkflowEnvironment,
    address: str,
    worker: None,
    source: SSESource,
    tmp_path: Path,
) -> None:
    name = "cli-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=50, keepalive=1))
    config = tmp_path / "streams.toml"
    config.write_text(
        f'[[stream]]\nname = "{name}"\nurl = "{source.url(name)}"\nreplay_window = "5m"\n'
    )
    env = {"TEMPORAL_ADDRESS": address, "SSE_TASK_QUEUE": TASK_QUEUE}

    started = await asyncio.to_thread(cli, "start", "--config", str(config), env=env)
    assert started.returncode == 0 and f"{name}: started" in started.stdout, started.stderr
    again = await asyncio.to_thread(cli, "start", "--config", str(config), env=env)
    assert f"{name}: already running" in again.stdout
    await asyncio.sleep(2)
    table = await asyncio.to_thread(cli, "status", name, env=env)
    assert table.returncode == 0 and name in table.stdout and "persisted" in table.stdout
    assert "open gaps" in table.stdout and "lost" in table.stdout
    as_json = await asyncio.to_thread(cli, "status", name, "--json", env=env)
    assert json.loads(as_json.stdout)[0]["name"] == name
    for command in (
        ["replay", name],
        ["replay", name, "--from-id", "3"],
        ["pause", name],
        ["resume", name],
        ["stop", name],
    ):
        done = await asyncio.to_thread(cli, *command, env=env)
        assert done.returncode == 0, done.stderr
        assert f"{name}: {command[0]} sent" in done.stdout

    def one_error_line(
        done: subprocess.CompletedProcess[str], pattern: str, *, code: int = 1
    ) -> None:
        assert done.returncode == code, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and re.search(pattern, lines[0]), done.stderr

    one_error_line(
        await asyncio.to_thread(cli, "status", "no-such-stream", env=env),
        "no running stream named 'no-such-stream'",
    )
    one_error_line(
        await asyncio.to_thread(cli, "status", env={"TEMPORAL_ADDRESS": "127.0.0.1:1"}),
        "cannot reach Temporal at 127.0.0.1:1",
    )
    bad = tmp_path / "bad.toml"
    bad.write_text('[[stream]]\nname = "x"\nurl = \n')
    one_error_line(
        await asyncio.to_thread(cli, "start", "--config", str(bad), env=env), "line 3", code=2
    )
    one_error_line(
        await asyncio.to_thread(cli, "start", "--config", str(config), "nope", env=env),
        "no stream named 'nope'",
        code=2,
    )


def scrape(port: int) -> dict[str, float]:
    """Prometheus text format -> {'name{labels}': value} for our own metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("durable_sse_"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        if key.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


async def test_metrics_endpoint_counts_what_happened(stack: Stack, tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    name = "metrics-" + uuid.uuid4().hex[:8]
    task_queue = "metrics-" + uuid.uuid4().hex[:8]
    stack.source.add_stream(name, SourceStreamConfig(rate=400, keepalive=1, retry_ms=None))
    process = stack.worker_process(
        task_queue,
        tmp_path / "w.log",
        extra_env={"SSE_METRICS_PORT": str(port)},
    )
    try:
        handle = await start(stack.temporal.client, gap_spec(stack.source, name), task_queue)
        await ready_for_a_gap(handle, stack.log, name)
        stack.source.inject(name, action="drop", count=50)

        async def recovered() -> bool:
            return metric(scrape(port), "durable_sse_events_recovered", stream=name) >= 50

        await wait_until(recovered, timeout=60, what="the recovered counter to reach 50")
        samples = scrape(port)
        assert metric(samples, "durable_sse_events_recovered", stream=name) == 50
        assert metric(samples, "durable_sse_drop_signals", stream=name, kind="comment") == 1
        assert metric(samples, "durable_sse_events_persisted", stream=name) >= 1000
        assert metric(samples, "durable_sse_reconnects", stream=name, route="lagged") == 1
        assert metric(samples, "durable_sse_lagged_replays", stream=name) == 1
        assert metric(samples, "durable_sse_batch_persist_seconds_count", stream=name) > 0
        assert "http" not in "".join(k for k in samples if name in k)  # no URLs in labels
        await handle.signal("stop")
        await asyncio.wait_for(handle.result(), 60)
    finally:
        end_process(process)


async def test_secrets_never_reach_logs_history_or_the_database(
    temporal: WorkflowEnvironment,
    address: str,
    worker: None,
    source: SSESource,
    event_log: Stores,
    caplog: pytest.LogCaptureFixture,
) -> None:
    header_secret, query_secret = "hdr-" + uuid.uuid4().hex, "qry-" + uuid.uuid4().hex
    os.environ["E2E_HEADER"] = f"Bearer {header_secret}"
    os.environ["E2E_QUERY"] = query_secret
    caplog.set_level(logging.DEBUG)
    name = "secret-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=100, keepalive=1, retry_ms=None))
    spec = StreamSpec(
        name=name,
        url=source.url(name),
        headers_from_env={"Authorization": "E2E_HEADER"},
        query_from_env={"access_token": "E2E_QUERY"},
        connect_timeout=2,
    )
    handle = await start(temporal.client, spec)

    def state(expected: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await status_of(handle)).state == expected

        return check

    # Every failure path: refusals park, transient failures back off, then it streams.
    for fault in ({"code": 401}, {"code": 200, "content_type": "text/plain"}, {"code": 307}):
        source.inject(name, action="status", **fault)
        source.inject(name, action="disconnect")
        await wait_until(state("parked"), timeout=30, what=f"parked after {fault}")
        assert (await status_of(handle)).last_error
        await handle.signal("resume")
    source.inject(name, action="status", code=429, retry_after=1)
    source.inject(name, action="disconnect")
    source.inject(name, action="status", code=500)
    source.inject(name, action="drop", count=5)
    source.inject(name, action="malformed")

    async def streaming() -> bool:
        return len(await event_ids(event_log, name)) >= 200

    await wait_until(streaming, timeout=60, what="events after the failures")
    await handle.signal("stop")
    await handle.result()
    await capture_history(handle, "stream_refusals_and_backoff")

    env = {**os.environ, "TEMPORAL_ADDRESS": address, "PATH": f"{BIN}:{os.environ['PATH']}"}
    shown = await asyncio.to_thread(
        subprocess.run,
        [
            temporal_dev_server(),
            "workflow",
            "show",
            "--workflow-id",
            stream_workflow_id(name),
            "-o",
            "json",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    assert "StreamRefusedError" in shown.stdout  # the history does hold the failures
    rows = await asyncio.to_thread(dump_stream_rows, event_log, name)
    for secret in (header_secret, query_secret):
        assert secret not in caplog.text
        assert secret not in shown.stdout
        assert secret not in rows


def dump_stream_rows(log: Stores, stream: str) -> str:
    with log.database.engine.connect() as connection:
        events = connection.execute(
            sa.text("SELECT * FROM sse_events WHERE stream = :s"), {"s": stream}
        ).fetchall()
        checkpoints = connection.execute(
            sa.text("SELECT * FROM sse_checkpoints WHERE stream = :s"), {"s": stream}
        ).fetchall()
    return repr(events) + repr(checkpoints)


async def test_cli_reads_status_of_an_encrypted_stream_only_with_the_key(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    tmp_path: Path,
) -> None:
    from durable_sse.config.temporal import PAYLOAD_KEY_ENV as KEY_ENV
    from durable_sse.ops.codec import data_converter_from_env, generate_key

    key = generate_key()
    name = "sealed-" + uuid.uuid4().hex[:8]
    task_queue = "sealed-" + uuid.uuid4().hex[:8]
    source.add_stream(name, SourceStreamConfig(rate=50, keepalive=1))
    process = worker_process(
        address, pg_url, redis_url, task_queue, tmp_path / "w.log", extra_env={KEY_ENV: key}
    )
    try:
        sealed = await Client.connect(
            address, data_converter=data_converter_from_env({KEY_ENV: key})
        )
        marker_url = source.url(name)
        handle = await start(sealed, StreamSpec(name=name, url=marker_url), task_queue)
        env = {"TEMPORAL_ADDRESS": address}
        done = await asyncio.to_thread(cli, "status", name, "--json", env={**env, KEY_ENV: key})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["name"] == name
        refused = await asyncio.to_thread(cli, "status", name, env=env)
        assert refused.returncode == 1
        assert "DURABLE_SSE_PAYLOAD_KEY" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        history = (await handle.fetch_history()).to_json()
        assert marker_url not in history  # the input (the spec) is sealed
        await handle.signal("stop")
        await asyncio.wait_for(handle.result(), 60)
    finally:
        end_process(process)
