"""(4) reconnect overhead: the server ends a connection -> first event of the next one.

Measured at the source (in this driver process, so one clock): the time a connection's
handler ended, and the time the next connection of the same stream wrote its first
event. Four loops on the same source, one after the other:

* durable-sse, live route: ``disconnect_after`` ends every connection after N events;
* durable-sse, lagged route: ``drop_every``/``drop_count`` announce drops, the workflow
  reconnects from the lagging id (``replay_window`` 1 s keeps one fresh);
* plain: an httpx-sse loop without Temporal (bench/plain_loop.py, its own process);
* bare Temporal: a workflow looping over a trivial read activity (bench/bare_temporal.py).

Plus signal -> cancelled -> reconnect: a ``replay`` signal to a streaming workflow, to
the first event of the replay connection.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from bench.common import (
    PYTHON,
    Row,
    Stack,
    percentile,
    spawn,
    stop_process,
    verdict,
    wait_until,
)
from bench.temporal_stack import Temporal, temporal
from durable_sse.config.replay import ReplaySignal
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.source.connection import EventConnection

RATE = 500.0
EVENTS_PER_CONNECTION = 50


@dataclass
class Connection:
    start_id: int
    opened: float
    first_event: float | None = None
    closed: float | None = None


CONNECTIONS: dict[str, list[Connection]] = defaultdict(list)


def _instrument() -> None:
    if getattr(EventConnection.run, "_instrumented", False):
        return
    original_run, original_flush = EventConnection.run, EventConnection._flush

    async def run(self: EventConnection, preamble: bytes) -> None:
        record = Connection(start_id=self.next_id, opened=time.time())
        CONNECTIONS[self.stream.name].append(record)
        self._bench_record = record  # type: ignore[attr-defined]
        try:
            await original_run(self, preamble)
        finally:
            record.closed = time.time()

    async def flush(self: EventConnection) -> None:
        await original_flush(self)
        record = getattr(self, "_bench_record", None)
        if record is not None and record.first_event is None and self.sent > 0:
            record.first_event = time.time()

    run._instrumented = True  # type: ignore[attr-defined]
    EventConnection.run = run  # type: ignore[method-assign]
    EventConnection._flush = flush  # type: ignore[method-assign]


def gaps(name: str, *, lagged: bool | None = None) -> list[float]:
    """Seconds from each connection's end to the next one's first event.

    ``lagged`` filters on the next connection's start: True = it went back before the
    previous connection's start (the lagged route), False = it did not, None = all.
    """
    records = [c for c in CONNECTIONS[name] if c.first_event is not None and c.closed]
    found = []
    for previous, current in zip(records, records[1:], strict=False):
        went_back = current.start_id < previous.start_id
        if lagged is None or went_back == lagged:
            found.append(current.first_event - previous.closed)  # type: ignore[operator]
    return found


def _row(label: str, values: list[float], goal: str = "", met: bool | None = None) -> Row:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return Row(
        "4",
        f"{label} (n={len(values)}): p50 / p99 ms",
        f"{p50 * 1000:.1f} / {p99 * 1000:.1f}",
        goal,
        verdict(met),
    )


async def reconnect_rows(running: Stack, *, samples: int) -> list[Row]:
    _instrument()
    tag = uuid.uuid4().hex[:6]
    live, lagged, plain, bare, signal = (f"rc-{kind}-{tag}" for kind in "lapbs")
    reconnecting = SourceStreamConfig(
        rate=RATE, retry_ms=None, disconnect_after=EVENTS_PER_CONNECTION
    )
    dropping = SourceStreamConfig(rate=RATE, retry_ms=None, drop_every=200, drop_count=5)
    steady = SourceStreamConfig(rate=200, retry_ms=None)
    rows: list[Row] = []
    async with SSESource() as source:
        async with temporal(running, label="reconnect") as stack_t:
            address = stack_t.client.service_client.config.target_host

            # Durable, live route.
            source.add_stream(live, reconnecting)
            handle = await stack_t.start_stream(
                StreamSpec(name=live, url=source.url(live), id_order="numeric")
            )
            await _collect(live, samples + 1)
            await handle.signal("stop")
            status = await handle.result()
            live_history = await handle.fetch_history()
            durable_live = gaps(live)

            # Durable, lagged route.
            source.add_stream(lagged, dropping)
            handle = await stack_t.start_stream(
                StreamSpec(
                    name=lagged,
                    url=source.url(lagged),
                    id_order="numeric",
                    replay_window=1.0,
                    lagged_reconnect_interval=0.01,
                )
            )
            await _collect(
                lagged, 2 * samples + 4, lambda: len(gaps(lagged, lagged=True)) > samples
            )
            await handle.signal("stop")
            await handle.result()
            durable_lagged = gaps(lagged, lagged=True)
            checkpoint_events = await _checkpoint_history(stack_t)

            # Plain loop, no Temporal.
            source.add_stream(plain, reconnecting)
            process = spawn(
                [PYTHON, "bench/plain_loop.py", source.url(plain), "600"],
                log=running.workdir / "plain-loop.log",
            )
            try:
                await _collect(plain, samples + 1)
            finally:
                stop_process(process)
            plain_gaps = gaps(plain)

            # Bare Temporal loop.
            source.add_stream(bare, reconnecting)
            queue = f"bare-{tag}"
            process = spawn(
                [PYTHON, "bench/bare_temporal.py"],
                env={"TEMPORAL_ADDRESS": address, "BARE_TASK_QUEUE": queue},
                log=running.workdir / "bare-worker.log",
            )
            try:
                bare_handle = await stack_t.client.start_workflow(
                    "BareLoopWorkflow",
                    {"url": source.url(bare), "last_id": None},
                    id=f"bare-{tag}",
                    task_queue=queue,
                )
                await _collect(bare, samples + 1)
                await bare_handle.terminate()
            finally:
                stop_process(process)
            bare_gaps = gaps(bare)

            # Signal -> cancelled -> reconnect on the new route.
            source.add_stream(signal, steady)
            signal_latency = await _signal_latency(stack_t, source, signal, max(samples // 10, 5))

    bare_p50 = percentile(bare_gaps, 50)
    ratio = percentile(durable_live, 50) / bare_p50 if bare_p50 else float("nan")
    rows.append(_row("plain httpx-sse reconnect loop, no Temporal", plain_gaps))
    rows.append(_row("bare Temporal loop (trivial workflow + read activity)", bare_gaps))
    p50, p99 = percentile(durable_live, 50), percentile(durable_live, 99)
    rows.append(
        _row(
            "durable-sse, live route",
            durable_live,
            "p50 <= 60, p99 <= 250",
            p50 <= 0.060 and p99 <= 0.250,
        )
    )
    lag50, lag99 = percentile(durable_lagged, 50), percentile(durable_lagged, 99)
    rows.append(
        _row(
            "durable-sse, lagged route",
            durable_lagged,
            "p50 <= 60, p99 <= 250",
            lag50 <= 0.060 and lag99 <= 0.250,
        )
    )
    rows.append(
        Row(
            "4",
            "durable live p50 / bare Temporal p50",
            f"{ratio:.2f}",
            "<= 1.3",
            verdict(ratio <= 1.3),
        )
    )
    rows.append(
        _row(
            "replay signal -> first event of the new connection",
            signal_latency,
            "p50 < 1000",
            percentile(signal_latency, 50) < 1.0,
        )
    )
    reads = sum(
        1
        for e in live_history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "read_stream"
    )
    rows.append(
        Row(
            "6",
            "history events per connection (StreamWorkflow, last run)",
            f"{len(live_history.events) / max(reads, 1):.1f} ({status.counters.connections} "
            "connections in all)",
        )
    )
    rows.append(
        Row("6", "history events per checkpoint advance (one schedule run)", checkpoint_events)
    )
    return rows


async def _collect(name: str, count: int, done: Any = None) -> None:
    async def enough() -> bool:
        if done is not None:
            return bool(done())
        return len(gaps(name)) >= count

    await wait_until(enough, timeout=300, what=f"{count} reconnects of {name}", every=0.2)


async def _checkpoint_history(stack_t: Temporal) -> str:
    query = "WorkflowType = 'CheckpointAdvanceWorkflow' AND ExecutionStatus = 'Completed'"
    async for execution in stack_t.client.list_workflows(query, limit=1):
        handle = stack_t.client.get_workflow_handle(execution.id, run_id=execution.run_id)
        return str(len((await handle.fetch_history()).events))
    return "n/a (no run completed)"


async def _signal_latency(
    stack_t: Temporal, source: SSESource, name: str, samples: int
) -> list[float]:
    handle = await stack_t.start_stream(
        StreamSpec(name=name, url=source.url(name), id_order="numeric")
    )
    await _collect(name, 0, lambda: len(CONNECTIONS[name]) >= 1)
    await asyncio.sleep(1.0)
    latencies = []
    for sample in range(samples):
        before = len(CONNECTIONS[name])
        newest = source.describe(name)["newest"]
        sent = time.time()
        await handle.signal("replay", ReplaySignal(from_id=str(newest - 100)))

        def reconnected(before: int = before) -> bool:
            return any(c.first_event for c in CONNECTIONS[name][before:])

        await _collect(name, 0, reconnected)
        first = next(c.first_event for c in CONNECTIONS[name][before:] if c.first_event)
        latencies.append(first - sent)

        async def replay_counted(sample: int = sample) -> bool:
            status = await handle.query("status", result_type=StreamStatus)
            return status.counters.explicit_replays > sample

        await wait_until(replay_counted, timeout=60, what="the replay to be counted", every=0.1)
        await asyncio.sleep(0.5)
    await handle.signal("stop")
    await handle.result()
    return latencies
