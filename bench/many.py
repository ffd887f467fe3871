"""(3) many low-rate streams on ONE worker process: cursor lag, CPU and RSS per stream.

The source runs in this (driver) process so it can stamp every id with the wall-clock
time it was generated (``SourceStream._append`` is wrapped here, in the benchmark only);
the worker is a separate process. Cursor lag of an event = the first time a sample of
Redis ``cursor:<stream>`` (one MGET of every key every ``SAMPLE_EVERY`` s) reached its
id, minus the time the source generated it; the sampling period bounds the resolution.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis

from bench.common import (
    Figures,
    Row,
    Stack,
    cpu_by_cmdline,
    cpu_seconds,
    machine_busy_seconds,
    percentile,
    rss_bytes,
    verdict,
    wait_until,
)
from bench.hot import PERSIST_HISTOGRAM
from bench.temporal_stack import temporal
from durable_sse.config.spec import StreamSpec
from durable_sse.cursor.l2 import cursor_key
from durable_sse.log.database import COMMIT_LANES
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.source.stream import SourceStream

SAMPLE_EVERY = 0.05
START_CONCURRENCY = 50
START_TIMEOUT = 150.0
"""Seconds to wait for every stream's first persisted event before measuring anyway."""
RATE = 1.0
"""Events per second per stream."""

GENERATED: dict[str, dict[int, float]] = defaultdict(dict)
"""stream -> id -> wall-clock time the source generated it."""


def stamp_generation() -> None:
    """Record in :data:`GENERATED` when the in-process source generates each id."""
    original = SourceStream._append
    if getattr(original, "_stamped", False):
        return

    def append(self: SourceStream, count: int) -> None:
        original(self, count)
        now = time.time()
        times = GENERATED[self.name]
        for event_id in range(self.newest - count + 1, self.newest + 1):
            times[event_id] = now

    append._stamped = True  # type: ignore[attr-defined]
    SourceStream._append = append  # type: ignore[method-assign]


def _cursor_id(value: Any) -> int:
    return int(value.decode().split("#", 1)[1]) if value is not None else 0


async def many_rows(
    running: Stack,
    redis: aioredis.Redis,
    count: int,
    seconds: float,
    *,
    workers: int = 1,
    settle: float = 2.0,
) -> list[Row]:
    """``settle``: seconds from the last stream's first event to the measured window (the
    start-up backlog drains; schedules are still being made for a replay window)."""
    stamp_generation()
    tag = uuid.uuid4().hex[:6]
    names = [f"m{count}-{tag}-{i}" for i in range(count)]
    keys = [cursor_key(name) for name in names]
    config = SourceStreamConfig(rate=RATE, retry_ms=None, keepalive=5.0)
    rows: list[Row] = []
    async with SSESource({name: config for name in names}) as source:
        async with temporal(running, label=f"many{count}", workers=workers) as stack_t:
            pids = stack_t.pids
            await asyncio.sleep(2.0)
            idle_rss = sum(rss_bytes(pid) for pid in pids)
            semaphore = asyncio.Semaphore(START_CONCURRENCY)

            async def start(name: str) -> None:
                spec = StreamSpec(name=name, url=source.url(name), id_order="numeric")
                async with semaphore:
                    await stack_t.start_stream(spec)

            began, cpu_before = time.monotonic(), _start_cpu(stack_t)
            await asyncio.gather(*(start(name) for name in names))

            async def all_persisting() -> bool:
                values = await redis.mget(keys)
                return all(value is not None for value in values)

            try:
                await wait_until(
                    all_persisting,
                    timeout=START_TIMEOUT,
                    what=f"{count} streams to persist",
                    every=0.5,
                )
                startup = f"{time.monotonic() - began:.1f}"
                start_cpu = _cpu_per_start(cpu_before, _start_cpu(stack_t), count)
            except TimeoutError:
                # Report what did not converge instead of losing the whole table.
                persisting = sum(value is not None for value in await redis.mget(keys))
                startup = f"> {START_TIMEOUT:g} ({persisting}/{count} streams persisting)"
                start_cpu = "(not all started)"
            await asyncio.sleep(settle)  # let the start-up backlog drain out of the window

            persist_before = await stack_t.histogram(PERSIST_HISTOGRAM)
            lags, probe, cpu, wall = await _sample(stack_t, redis, names, keys, seconds, pids)
            persist_after = await stack_t.histogram(PERSIST_HISTOGRAM)
            commit_seconds = persist_after[0] - persist_before[0]
            commits = max(persist_after[1] - persist_before[1], 1)
            rss = sum(rss_bytes(pid) for pid in pids)
            spread = await _streams_per_worker(stack_t, names) if workers > 1 else None
            persisted = len(lags)
            sql = 1000 * probe.get("sql", 0) / max(persisted, 1)
            redis_rt = 1000 * probe.get("redis", 0) / max(persisted, 1)
            history = await _history_growth(stack_t, names[:5], seconds=10.0)

    for stream in names:
        GENERATED.pop(stream, None)
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    label = f"{count} streams @ {RATE:g} ev/s"
    if settle != 2.0:
        label += f", measured {settle:g} s after"
    if workers > 1:
        label += f", {workers} workers"
    cores = cpu / wall
    rows.append(Row("3", f"{label}: start all + first event persisted (s)", startup))
    rows.append(Row("3", f"{label}: start, CPU ms per stream: {START_CPU_PARTS}", start_cpu))
    rows.append(Row("3", f"{label}: cursor lag p50 (ms)", f"{p50 * 1000:.0f}"))
    goal, met = "", None
    if count >= 1000:
        goal, met = "p99 < 1 s at 1,000", p99 < 1.0
    rows.append(Row("3", f"{label}: cursor lag p99 (ms)", f"{p99 * 1000:.0f}", goal, verdict(met)))
    rows.append(
        Row(
            "3",
            f"{label}: ms from batch queued to committed / batches committing "
            f"(mean; {COMMIT_LANES} commit lanes)",
            f"{1000 * commit_seconds / commits:.0f} / {commit_seconds / (wall + 3.6):.1f}",
        )
    )
    if spread is not None:
        rows.append(Row("3", f"{label}: streams per worker (running connections)", spread))
    rows.append(
        Row(
            "3",
            f"{label}: worker CPU total / per stream",
            f"{cores * 100:.0f}% of a core / {cores / count * 1000:.2f} ms CPU per s",
        )
    )
    rows.append(
        Row(
            "3",
            f"{label}: worker RSS total / per stream",
            f"{rss / 2**20:.0f} MiB / {(rss - idle_rss) / count / 1024:.0f} KiB",
        )
    )
    rows.append(
        Row(
            "3",
            f"{label}: heartbeats the workers sent per second (to the Temporal server)",
            f"{probe.get('heartbeats', 0) / max(wall, 1e-9):.0f}",
        )
    )
    rows.append(
        Row(
            "6",
            f"{label}: SQL statements / Redis round trips per 1k events",
            f"{sql:.0f} / {redis_rt:.0f}",
        )
    )
    rows.append(
        Row("6", f"{label}: history events per stream-hour, steady state", history.fmt(digits=0))
    )
    return rows


START_CPU_PARTS = "worker / Temporal dev server / whole machine"


def _start_cpu(stack_t: Any) -> list[float]:
    """CPU seconds so far of the parts a start burst keeps busy (START_CPU_PARTS): the
    work per start, which the start's wall time (bound by whatever else the machine does)
    hides. PostgreSQL's share is in the machine's only: its sessions' processes may end
    before they can be read."""
    port = stack_t.client.service_client.config.target_host.rsplit(":", 1)[1]
    return [
        sum(cpu_seconds(pid) for pid in stack_t.pids),
        sum(cpu_by_cmdline(f"start-dev --port {port}").values()),
        machine_busy_seconds(),
    ]


def _cpu_per_start(before: list[float], after: list[float], count: int) -> str:
    return " / ".join(f"{1000 * (b - a) / count:.1f}" for a, b in zip(before, after, strict=True))


async def _sample(
    stack_t: Any,
    redis: aioredis.Redis,
    names: list[str],
    keys: list[str],
    seconds: float,
    pids: list[int],
) -> tuple[list[float], dict[str, float], float, float]:
    """Lags of every event generated in the window, probe deltas, worker CPU s, wall s."""
    window_start = time.time()
    seen = [_cursor_id(v) for v in await redis.mget(keys)]
    arrived: dict[tuple[int, int], float] = {}
    probe_before, cpu_before = stack_t.probe(), sum(cpu_seconds(pid) for pid in pids)
    began = time.monotonic()
    cpu = wall = 0.0
    probe: dict[str, float] = {}
    end = began + seconds
    drain_until = end + 3.0
    while True:
        now_m = time.monotonic()
        if now_m >= end and not wall:
            wall = now_m - began
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
            await asyncio.sleep(0.6)
            after = stack_t.probe()
            probe = {k: after.get(k, 0) - probe_before.get(k, 0) for k in after}
        if now_m >= drain_until:
            break
        values = await redis.mget(keys)
        now = time.time()
        for index, value in enumerate(values):
            current = _cursor_id(value)
            if current > seen[index]:
                for event_id in range(seen[index] + 1, current + 1):
                    arrived[(index, event_id)] = now
                seen[index] = current
        await asyncio.sleep(SAMPLE_EVERY)
    window_end = window_start + seconds
    lags: list[float] = []
    final = time.time()
    for index, name in enumerate(names):
        for event_id, generated in GENERATED[name].items():
            if window_start <= generated <= window_end:
                lags.append(arrived.get((index, event_id), final) - generated)
    return lags, probe, cpu, wall


async def _streams_per_worker(stack_t: Any, names: list[str]) -> str:
    """How many of the streams' running connections each worker holds (Temporal's
    pending-activity view; a stream between connections counts for none)."""
    from collections import Counter

    from durable_sse.contracts import stream_workflow_id

    held: Counter[str] = Counter()
    semaphore = asyncio.Semaphore(50)

    async def one(name: str) -> None:
        async with semaphore:
            handle = stack_t.client.get_workflow_handle(stream_workflow_id(name))
            description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name == "read_stream" and pending.last_worker_identity:
                held[pending.last_worker_identity] += 1

    await asyncio.gather(*(one(name) for name in names))
    return " / ".join(str(n) for _, n in held.most_common()) or "-"


async def _history_growth(stack_t: Any, names: list[str], *, seconds: float) -> Figures:
    """History events added per hour to a few stream workflows while they just stream."""
    from durable_sse.contracts import stream_workflow_id

    handles = [stack_t.client.get_workflow_handle(stream_workflow_id(n)) for n in names]
    before = [len((await h.fetch_history()).events) for h in handles]
    await asyncio.sleep(seconds)
    after = [len((await h.fetch_history()).events) for h in handles]
    return Figures([(a - b) * 3600 / seconds for a, b in zip(after, before, strict=True)])
