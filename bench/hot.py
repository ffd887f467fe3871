"""(2) one hot stream durable end to end, (5) a replay that repairs 1% holes, (6) costs.

A ``StreamWorkflow`` on the dev server, the production worker in its own process,
PostgreSQL (a private database) and Redis (a throwaway server), the source in its own
process generating as fast as the reader reads (``rate=0``). Throughput is
``(N - 1) / (received_at of row N - received_at of row 1)`` over the first N rows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from bench.common import (
    Figures,
    Stack,
    add_source_stream,
    control_source_stream,
    cpu_by_cmdline,
    cpu_delta,
    cpu_seconds,
    machine_busy_seconds,
    pg_query,
    wait_until,
)
from bench.temporal_stack import Temporal
from durable_sse.config.replay import ReplaySignal
from durable_sse.config.spec import StreamSpec
from durable_sse.cursor.l2 import cursor_key
from durable_sse.ids import IdOrder
from durable_sse.log.records import EventRecord
from durable_sse.log.rows import event_rows
from durable_sse.log.staging import COPY_LOG_SQL, RowInserter
from durable_sse.stores import Stores

PERSIST_HISTOGRAM = "durable_sse_batch_persist_seconds"


@dataclass
class Cost:
    """Per 1,000 persisted events, over whole runs (start to stop)."""

    statements: Figures = field(default_factory=Figures)
    transactions: Figures = field(default_factory=Figures)
    redis_round_trips: Figures = field(default_factory=Figures)
    history_events: Figures = field(default_factory=Figures)
    """History events of the run's workflow, per run."""
    connections: Figures = field(default_factory=Figures)


@dataclass
class HotResult:
    rate: Figures = field(default_factory=Figures)
    worker_cpu: Figures = field(default_factory=Figures)
    """Cores the worker process used while the stream ran (1.0 = one core)."""
    postgres_cpu: Figures = field(default_factory=Figures)
    """Cores used by the PostgreSQL backends of our database."""
    source_cpu: Figures = field(default_factory=Figures)
    temporal_cpu: Figures = field(default_factory=Figures)
    machine_busy: Figures = field(default_factory=Figures)
    commit_busy: Figures = field(default_factory=Figures)
    """Share of the wall time a batch commit was in flight (1.0 = always)."""
    commit_ms: Figures = field(default_factory=Figures)
    batch_size: Figures = field(default_factory=Figures)
    """Cores busy machine-wide over the same interval (everything: PG, Temporal, source)."""
    cost: Cost = field(default_factory=Cost)
    streams: list[str] = field(default_factory=list)
    """The runs' stream names (their rows are the direct-COPY ceiling's input)."""


async def _cursor(redis: aioredis.Redis, name: str) -> int:
    value = await redis.get(cursor_key(name))
    if value is None:
        return 0
    return int(value.decode().split("#", 1)[1])


async def _xact_commit(running: Stack) -> int:
    rows = await pg_query(
        running.pg_admin,
        "SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
        (running.database,),
    )
    return int(rows[0][0])


async def hot_run(
    running: Stack,
    temporal: Temporal,
    redis: aioredis.Redis,
    *,
    flush: str,
    events: int,
    batch_max_events: int,
    batch_max_delay: float,
    result: HotResult,
) -> None:
    name = f"hot-{flush}-{uuid.uuid4().hex[:8]}"
    url = await add_source_stream(
        running, name, rate=0, flush=flush, retry_ms=None, history=max(events, 100_000)
    )
    probe_before, xact_before = temporal.probe(), await _xact_commit(running)
    spec = StreamSpec(
        name=name,
        url=url,
        id_order="numeric",
        batch_max_events=batch_max_events,
        batch_max_delay=batch_max_delay,
    )
    handle = await temporal.start_stream(spec)

    async def started() -> bool:
        return await _cursor(redis, name) > 0

    await wait_until(started, timeout=60, what=f"the first event of {name}", every=0.05)
    cpu_before, busy_before, began = (
        cpu_seconds(temporal.worker.pid),
        machine_busy_seconds(),
        time.monotonic(),
    )
    persist_before = await temporal.histogram(PERSIST_HISTOGRAM)
    cursor_before = await _cursor(redis, name)
    pg_before = cpu_by_cmdline(f" {running.database} ")
    source_before = cpu_seconds(running.source_process.pid)
    temporal_before = cpu_by_cmdline("start-dev")

    async def enough() -> bool:
        return await _cursor(redis, name) >= events

    await wait_until(enough, timeout=600, what=f"{events} events of {name}", every=0.25)
    elapsed = time.monotonic() - began
    persist_after = await temporal.histogram(PERSIST_HISTOGRAM)
    commit_seconds = persist_after[0] - persist_before[0]
    commits = max(persist_after[1] - persist_before[1], 1)
    result.commit_busy.values.append(commit_seconds / elapsed)
    result.commit_ms.values.append(1000 * commit_seconds / commits)
    persisted_in_window = await _cursor(redis, name) - cursor_before
    result.worker_cpu.values.append((cpu_seconds(temporal.worker.pid) - cpu_before) / elapsed)
    result.machine_busy.values.append((machine_busy_seconds() - busy_before) / elapsed)
    pg_cpu = cpu_delta(pg_before, cpu_by_cmdline(f" {running.database} "))
    result.postgres_cpu.values.append(pg_cpu / elapsed)
    result.source_cpu.values.append(
        (cpu_seconds(running.source_process.pid) - source_before) / elapsed
    )
    result.temporal_cpu.values.append(
        cpu_delta(temporal_before, cpu_by_cmdline("start-dev")) / elapsed
    )
    await control_source_stream(running, name, paused=True)
    await handle.signal("stop")
    final = await handle.result()
    await asyncio.sleep(0.6)  # the probe file is rewritten every 0.25 s
    probe_after, xact_after = temporal.probe(), await _xact_commit(running)

    result.streams.append(name)
    first, nth, rows = await _first_and_nth(running, name, events)
    result.rate.values.append((events - 1) / (nth - first))
    result.batch_size.values.append(persisted_in_window / commits)
    cost = result.cost
    cost.statements.values.append(
        1000 * (probe_after.get("sql", 0) - probe_before.get("sql", 0)) / rows
    )
    cost.transactions.values.append(1000 * (xact_after - xact_before) / rows)
    cost.redis_round_trips.values.append(
        1000 * (probe_after.get("redis", 0) - probe_before.get("redis", 0)) / rows
    )
    history = await handle.fetch_history()
    cost.history_events.values.append(len(history.events))
    cost.connections.values.append(final.counters.connections)


async def _first_and_nth(running: Stack, name: str, n: int) -> tuple[float, float, int]:
    rows = await pg_query(
        running.psycopg_url,
        "SELECT extract(epoch FROM received_at) FROM sse_events WHERE stream = %s "
        "ORDER BY seq LIMIT 1",
        (name,),
    )
    nth = await pg_query(
        running.psycopg_url,
        "SELECT extract(epoch FROM received_at) FROM sse_events WHERE stream = %s "
        "ORDER BY seq OFFSET %s LIMIT 1",
        (name, n - 1),
    )
    total = await pg_query(
        running.psycopg_url, "SELECT count(*) FROM sse_events WHERE stream = %s", (name,)
    )
    return float(rows[0][0]), float(nth[0][0]), int(total[0][0])


async def copy_ceiling(running: Stack, stream: str, *, events: int, batch: int) -> float:
    """Rows/s of COPY straight into ``sse_events``: the write path's ceiling.

    The hot run's own first ``events`` rows, read back, are written again under a new
    stream name the way the production writer writes a live batch (``_rows`` and binary
    COPY, in a database thread), ``batch`` rows per committed transaction, one after
    another: no decoding, no staging, no conflict handling, no cursors.
    """
    stored = await pg_query(
        running.psycopg_url,
        "SELECT event_id, event_ord, follower_key, event_type, data, received_at "
        "FROM sse_events WHERE stream = %s ORDER BY seq LIMIT %s",
        (stream, events),
    )
    records = [
        EventRecord(
            event_id=event_id,
            event_ord=ordinal,
            event_type=event_type,
            data=data,
            received_at=received_at,
            follower_key=bytes(follower) if follower is not None else None,
        )
        for event_id, ordinal, follower, event_type, data, received_at in stored
    ]
    target = f"ceiling-{uuid.uuid4().hex[:8]}"
    log = Stores.open(running.database_url)
    inserter = RowInserter(log.database)
    try:

        def write(chunk: list[EventRecord]) -> None:
            rows = event_rows(target, IdOrder.NUMERIC, chunk)
            with log.database.engine.begin() as connection:
                inserter.copy_rows(connection, COPY_LOG_SQL, rows, skip=1)

        started = time.perf_counter()
        for start in range(0, len(records), batch):
            await asyncio.to_thread(write, records[start : start + batch])
        elapsed = time.perf_counter() - started
    finally:
        await log.close()
    return len(records) / elapsed


# -- (5) replay ---------------------------------------------------------------------------


@dataclass
class ReplayResult:
    window: int
    missing: int
    seconds: float
    """Signal -> every deleted row of the window is stored again."""
    recovered: int
    """Deleted rows the replay stored again."""
    complete: bool

    @property
    def rate(self) -> float:
        return self.window / self.seconds


async def replay_run(
    running: Stack,
    temporal: Temporal,
    redis: aioredis.Redis,
    *,
    window: int,
    batch_max_events: int,
    batch_max_delay: float,
) -> ReplayResult:
    """Persist ``window``+ events, delete every 100th, then replay from before the window."""
    name = f"replay-{uuid.uuid4().hex[:8]}"
    url = await add_source_stream(
        running, name, rate=0, flush="bulk", retry_ms=None, history=window * 3
    )
    spec = StreamSpec(
        name=name,
        url=url,
        id_order="numeric",
        batch_max_events=batch_max_events,
        batch_max_delay=batch_max_delay,
    )
    handle = await temporal.start_stream(spec)

    async def enough() -> bool:
        return await _cursor(redis, name) >= window + 1000

    await wait_until(enough, timeout=600, what=f"{window} events of {name}", every=0.25)
    await control_source_stream(running, name, paused=True)
    settled = -1
    while (cursor := await _cursor(redis, name)) != settled:
        settled = cursor
        await asyncio.sleep(1.0)
    start = settled - window + 1
    holes = [str(i) for i in range(start, settled + 1, 100)]
    await pg_query(
        running.psycopg_url,
        "DELETE FROM sse_events WHERE stream = %s AND event_id = ANY(%s) RETURNING 1",
        (name, holes),
    )
    began = time.monotonic()
    await handle.signal("replay", ReplaySignal(from_id=str(start - 1)))

    async def holes_back() -> int:
        rows = await pg_query(
            running.psycopg_url,
            "SELECT count(*) FROM sse_events WHERE stream = %s AND event_id = ANY(%s)",
            (name, holes),
        )
        return int(rows[0][0])

    # An explicit replay (from_id) records no gap, so no gap record closes: the replay
    # is done when every deleted row is stored again (polled in the database).
    async def repaired() -> bool:
        return await holes_back() == len(holes)

    await wait_until(repaired, timeout=600, what="the replay to store the holes", every=0.05)
    seconds = time.monotonic() - began
    await handle.signal("stop")
    await handle.result()
    count = await pg_query(
        running.psycopg_url,
        "SELECT count(*) FROM sse_events WHERE stream = %s AND event_id::bigint BETWEEN %s AND %s",
        (name, start, settled),
    )
    return ReplayResult(
        window=window,
        missing=len(holes),
        seconds=seconds,
        recovered=await holes_back(),
        complete=int(count[0][0]) == window,
    )
