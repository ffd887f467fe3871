"""Running the real stack in chaos scenarios: workers, streams, waiting, draining, verdicts.

Small helpers copied in spirit from tests/system/test_e2e.py (a test module is not imported).
``Chaos`` bundles what every scenario works with (the ``chaos`` fixture), so a scenario
reads as its steps: a new stream, a sampler, start, faults, drain, the verdict.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse import worker as worker_module
from durable_sse.config.settings import Settings
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests.chaos.checker import CursorSampler, Verdict, check, stored

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Sizes:
    """Scenario sizes: the default keeps the module near 10 minutes, ``--long`` >= 100k."""

    rate: float
    """Source events per second."""
    seconds: float
    """How long faults run (events ~ rate x seconds)."""
    redis_down: float
    kills: int = 5
    min_events: int = 0
    """Every scenario keeps the source running until this many events are stored."""


DEFAULT = Sizes(rate=400, seconds=12, redis_down=10)
LONG = Sizes(rate=1500, seconds=70, redis_down=30, min_events=100_000)
SHORT = Sizes(rate=300, seconds=10, redis_down=5, kills=3)
"""``--seeds N``: many short runs of the seeded scenarios."""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    handle: WorkflowHandle | None = None,
) -> None:
    """Poll ``check``; on timeout fail naming ``what`` (and the stream's status)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            detail = f"; status {await status_of(handle)}" if handle is not None else ""
            if handle is not None:
                pending = (await handle.describe()).raw_description.pending_activities
                detail += f"; pending {[(p.activity_type.name, p.state) for p in pending]}"
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        await asyncio.sleep(0.25)


async def status_of(handle: WorkflowHandle) -> StreamStatus:
    return await handle.query("status", result_type=StreamStatus)


async def start_stream(client: Client, spec: StreamSpec, task_queue: str) -> WorkflowHandle:
    return await client.start_workflow(
        "StreamWorkflow",
        spec,
        id=stream_workflow_id(spec.name),
        task_queue=task_queue,
        result_type=StreamStatus,
    )


def chaos_spec(name: str, url: str, **overrides: object) -> StreamSpec:
    """Short windows and intervals so gaps are repaired within seconds."""
    values: dict[str, object] = {
        "id_order": "numeric",
        "replay_window": 2.0,
        "lagged_reconnect_interval": 1.0,
        "batch_max_delay": 0.02,
        "idle_timeout": 2.0,
        "connect_timeout": 2.0,
        # The default heartbeat timeout (minutes): a killed or paused worker's streams
        # move when its liveness lease expires (durable_sse/ops/liveness.py), in seconds.
    }
    values.update(overrides)
    return StreamSpec(name=name, url=url, **values)  # type: ignore[arg-type]


def steady_spec(source: SSESource, name: str, **overrides: object) -> StreamSpec:
    """A stream of the demo source that keeps one connection (no rotation) and commits
    small batches quickly, numeric ids."""
    values: dict[str, object] = {
        "id_order": "numeric",
        "max_connection_age": 3600.0,
        "batch_max_delay": 0.05,
    }
    values.update(overrides)
    return StreamSpec(name=name, url=source.url(name), **values)  # type: ignore[arg-type]


@asynccontextmanager
async def in_process_worker(
    address: str,
    pg_url: str,
    redis_url: str,
    task_queue: str | None = None,
    *,
    tune_gc: bool = True,
    **env: str,
) -> AsyncIterator[None]:
    """A worker in this process on ``task_queue`` (the default one when None); ``env``
    adds worker variables (``SSE_SECRETS``, ...)."""
    variables = {"TEMPORAL_ADDRESS": address, "DATABASE_URL": pg_url, "REDIS_URL": redis_url}
    if task_queue is not None:
        variables["SSE_TASK_QUEUE"] = task_queue
    settings = Settings.from_env({**variables, **env})
    stop = asyncio.Event()
    task = asyncio.create_task(
        worker_module.run_worker(settings, stop=stop, handle_signals=False, tune_gc=tune_gc)
    )
    try:
        yield
    finally:
        stop.set()
        await task


def worker_process(
    address: str,
    pg_url: str,
    redis_url: str,
    task_queue: str,
    log: Path,
    *,
    extra_env: dict[str, str] | None = None,
    script: Path | None = None,
) -> subprocess.Popen[bytes]:
    """A worker process (``worker.py``, or ``script``) on ``task_queue``, logging to ``log``."""
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": address,
        "DATABASE_URL": pg_url,
        "REDIS_URL": redis_url,
        "SSE_TASK_QUEUE": task_queue,
        **(extra_env or {}),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(script or ROOT / "worker.py")],
            env=env,
            stdout=out,
            stderr=out,
            cwd=ROOT,
        )


def end_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    os.kill(process.pid, signal.SIGCONT)
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def reader_pid(handle: WorkflowHandle) -> int | None:
    """The pid of the worker that runs (or last ran) the read activity, from its identity."""
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name == "read_stream" and pending.last_worker_identity:
            head = pending.last_worker_identity.split("@", 1)[0]
            if head.isdigit() and pending.state == 2:  # PENDING_ACTIVITY_STATE_STARTED
                return int(head)
    return None


async def drain_and_stop(
    handle: WorkflowHandle,
    source: SSESource,
    log: Stores,
    name: str,
    *,
    timeout: float = 120,
    min_events: int = 0,
) -> StreamStatus:
    """Stop generating, wait until every emitted id is stored and no gap is open, stop.

    With ``min_events`` (``--long``), first let the stream run until that many are stored.
    """
    if min_events:

        async def enough() -> bool:
            return (await stored(log, name)).rows >= min_events

        await wait_until(enough, timeout=min_events / 100, what=f"{min_events} events")
    source.inject(name, action="clear")
    source.inject(name, paused=True)
    newest = source.truth(name).ids[-1]

    async def caught_up() -> bool:
        rows = await stored(log, name)
        if not rows.ids or max(rows.ids) < newest:
            return False
        # The store, not the status: a repair connection closes gaps as it reads on, and
        # the workflow hears of it only when that connection ends.
        return not (await log.gap_store.gap_summary(name, "numeric")).open

    await wait_until(
        caught_up, timeout=timeout, what=f"{name} to store up to {newest}", handle=handle
    )
    await handle.signal("stop")
    return await asyncio.wait_for(handle.result(), 60)


async def read_results(handle: WorkflowHandle) -> list[dict[str, object]]:
    """Every completed read_stream result in the workflow's history, in order."""
    history = await handle.fetch_history()
    scheduled: dict[int, bool] = {}
    results = []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = attributes.activity_type.name == "read_stream"
        elif event.HasField("activity_task_completed_event_attributes"):
            attributes = event.activity_task_completed_event_attributes
            if scheduled.get(attributes.scheduled_event_id) and attributes.result.payloads:
                results.append(json.loads(attributes.result.payloads[0].data))
    return results


def assert_clean(verdict: Verdict, sampler: CursorSampler) -> None:
    assert verdict.stored > 0, "nothing stored"
    assert verdict.lost == 0, f"{verdict.lost} lost, first {verdict.first_lost}"
    assert verdict.unexpected == 0
    assert verdict.duplicate_rows == 0
    assert sampler.regressions == [], sampler.regressions[:5]
    assert sampler.ahead == [], sampler.ahead[:5]
    assert sampler.samples > 10


@dataclass
class Stack:
    """The real stack a test runs on: Temporal, PostgreSQL, Redis, the demo source, and the
    event log (the system tests' ``stack`` fixture; ``Chaos`` adds the scenario's sizes)."""

    temporal: WorkflowEnvironment
    address: str
    pg_url: str
    redis_url: str
    source: SSESource
    log: Stores

    def in_process_worker(
        self, task_queue: str, redis_url: str
    ) -> AbstractAsyncContextManager[None]:
        return in_process_worker(self.address, self.pg_url, redis_url, task_queue)

    def worker_process(
        self,
        task_queue: str,
        log: Path,
        *,
        extra_env: dict[str, str] | None = None,
        script: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """A worker process on ``task_queue`` against this stack, logging to ``log``."""
        return worker_process(
            self.address,
            self.pg_url,
            self.redis_url,
            task_queue,
            log,
            extra_env=extra_env,
            script=script,
        )


@dataclass
class Chaos(Stack):
    """The stack a scenario runs on, its sizes, and the report it adds a row to."""

    sizes: Sizes
    verdicts: list[Verdict]

    def new_stream(self, prefix: str, **config: object) -> str:
        """A fresh source stream at the scenario's rate; ``config`` overrides its settings."""
        name = unique(prefix)
        values: dict[str, object] = {"rate": self.sizes.rate, "keepalive": 0.5, "retry_ms": None}
        values.update(config)
        self.source.add_stream(name, SourceStreamConfig(**values))  # type: ignore[arg-type]
        return name

    def sampler(
        self, name: str, *, redis_url: str | None = None, every: float = 0.1
    ) -> CursorSampler:
        """Watch the stream's Redis cursor and checkpoint for regressions."""
        return CursorSampler(self.log, redis_url or self.redis_url, name, every=every)

    async def start(
        self, name: str, task_queue: str, *, url: str | None = None, **overrides: object
    ) -> WorkflowHandle:
        """Start the stream's workflow on ``task_queue``, reading ``url`` (the source's)."""
        spec = chaos_spec(name, url or self.source.url(name), **overrides)
        return await start_stream(self.temporal.client, spec, task_queue)

    async def flowing(self, name: str, count: int, timeout: float = 60) -> None:
        """Wait until ``count`` events of the stream are stored."""

        async def check_count() -> bool:
            return (await stored(self.log, name)).rows >= count

        await wait_until(check_count, timeout=timeout, what=f"{name} to store {count} events")

    async def ready_for_a_gap(self, name: str) -> None:
        """1,000+ events stored and a lagging id exists (a replay has somewhere to start)."""

        async def ready() -> bool:
            checkpoint = await self.log.checkpoints.get_checkpoint(name)
            return bool(checkpoint and checkpoint.lagging_id) and (
                (await stored(self.log, name)).rows >= 1000
            )

        await wait_until(ready, timeout=60, what="1,000 events and a lagging id")

    async def drain(
        self, handle: WorkflowHandle, name: str, *, timeout: float = 120
    ) -> StreamStatus:
        """``drain_and_stop`` at the scenario's sizes."""
        return await drain_and_stop(
            handle, self.source, self.log, name, timeout=timeout, min_events=self.sizes.min_events
        )

    async def verdict(
        self, scenario: str, faults: str, name: str, sampler: CursorSampler, status: StreamStatus
    ) -> Verdict:
        """Check the stream against the source's truth, add the row to the report, print it."""
        log = self.log
        verdict = check(
            scenario,
            self.source.truth(name),
            await stored(log, name),
            await log.gap_store.gaps(name),
        )
        verdict.faults = faults
        verdict.regressions = sampler.regression_count
        verdict.cursor_ahead = len(sampler.ahead)
        verdict.samples = sampler.samples
        verdict.recovered = status.counters.events_recovered
        verdict.reread = status.counters.duplicates
        self.verdicts.append(verdict)
        print(f"\n{verdict}")
        return verdict


# -- the source's one-shot faults -----------------------------------------------------------


async def inject_until_taken(
    source: SSESource,
    name: str,
    taken: Callable[[], bool],
    *,
    patience: float,
    never: str,
    **fault: object,
) -> None:
    """Inject a one-shot ``fault`` until ``taken()`` says it happened.

    A one-shot is taken by the next connection that looks; one that ends before the fault
    is complete (a repair ending right after its last gap closed, a verification's
    interrupt) wastes it, so when it has not shown long after it should have (``patience``
    seconds), inject again; after ten times that, fail saying the source ``never`` did.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10 * patience
    source.inject(name, **fault)
    retry_at = loop.time() + patience
    while not taken():
        now = loop.time()
        if now > retry_at and not source.describe(name)["pending"]:
            source.inject(name, **fault)
            retry_at = now + patience
        if now > deadline:
            raise AssertionError(f"{never}: {source.describe(name)}")
        await asyncio.sleep(0.05)


async def drop_for_real(source: SSESource, name: str, count: int, *, rate: float) -> int:
    """Make the source skip ``count`` events on the connection it serves, and say so.

    Injected again while the skip has not shown in the source's truth
    (``inject_until_taken``). Returns the size of the skip that happened.
    """
    before = len(source.truth(name).dropped)
    await inject_until_taken(
        source,
        name,
        lambda: len(source.truth(name).dropped) != before,
        patience=max(2.0, 3 * count / rate),
        never=f"the source never skipped the {count} events it was asked to",
        action="drop",
        count=count,
    )
    low, high = source.truth(name).dropped[-1]
    return high - low + 1
