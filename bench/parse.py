"""(1) the parse ceiling over real HTTP, and (7) a naive consumer on the same source.

The source runs in its own process (bench/common.py), so this process measures only the
client: httpx + httpx-sse (``aconnect_sse``/``aiter_sse``) against httpx +
``durable_sse.sse.decoder.SSEDecoder`` over ``aiter_bytes``. Rates are measured from the
first to the last of N events (connection set-up excluded), runs alternate the two
clients so load from other processes hits both.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from httpx_sse import aconnect_sse, connect_sse

from bench.common import Figures, Stack, add_source_stream, remove_source_stream
from durable_sse.sse.decoder import DecodedEvent, SSEDecoder

FLUSH_MODES = ("event", "bulk")


@dataclass
class ParseResult:
    httpx_sse: dict[str, Figures] = field(default_factory=dict)
    ours: dict[str, Figures] = field(default_factory=dict)
    ratio: dict[str, Figures] = field(default_factory=dict)


async def read_with_httpx_sse(url: str, count: int) -> float:
    """Events/s of the plain httpx-sse loop over ``count`` events."""
    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        async with aconnect_sse(client, "GET", url) as source:
            seen, first = 0, 0.0
            async for _ in source.aiter_sse():
                seen += 1
                if seen == 1:
                    first = time.perf_counter()
                if seen >= count:
                    break
            return (count - 1) / (time.perf_counter() - first)


async def read_with_ours(url: str, count: int) -> float:
    """Events/s of our decoder fed from httpx's ``aiter_bytes``."""
    decoder = SSEDecoder()
    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        async with client.stream("GET", url) as response:
            seen, first = 0, 0.0
            async for chunk in response.aiter_bytes():
                for item in decoder.feed(chunk):
                    if type(item) is DecodedEvent:
                        seen += 1
                        if seen == 1:
                            first = time.perf_counter()
                        if seen >= count:
                            return (count - 1) / (time.perf_counter() - first)
    raise RuntimeError("the stream ended early")


async def parse_ceiling(running: Stack, *, events: int, runs: int) -> ParseResult:
    result = ParseResult()
    for flush in FLUSH_MODES:
        name = f"parse-{flush}-{uuid.uuid4().hex[:6]}"
        url = await add_source_stream(running, name, rate=0, flush=flush, retry_ms=None)
        theirs, ours = Figures(), Figures()
        ratios = Figures()
        for _ in range(runs):
            a = await read_with_httpx_sse(url, events)
            b = await read_with_ours(url, events)
            theirs.values.append(a)
            ours.values.append(b)
            ratios.values.append(b / a)
        await remove_source_stream(running, name)
        result.httpx_sse[flush], result.ours[flush], result.ratio[flush] = theirs, ours, ratios
    return result


# -- (7) the naive consumer ---------------------------------------------------------------


@dataclass
class NaiveRun:
    rate: float
    received: list[int]


def naive_consume(url: str, count: int, dsn: str, state: Path, stream: str) -> NaiveRun:
    """What a first attempt looks like: httpx-sse, INSERT + commit per event, id in a file.

    It resumes from the id in ``state`` (Last-Event-ID) and never sees comments, so a
    server's drop notice is invisible to it.
    """
    headers = {}
    if state.exists() and state.read_text().strip():
        headers["Last-Event-ID"] = state.read_text().strip()
    received: list[int] = []
    with (
        psycopg.connect(dsn, autocommit=True) as db,
        httpx.Client(timeout=None, trust_env=False) as client,
        connect_sse(client, "GET", url, headers=headers) as source,
    ):
        first = 0.0
        for event in source.iter_sse():
            db.execute(
                "INSERT INTO naive_events (stream, event_id, data) VALUES (%s, %s, %s)",
                (stream, event.id, event.data),
            )
            state.write_text(event.id)
            received.append(int(event.id))
            if len(received) == 1:
                first = time.perf_counter()
            if len(received) >= count:
                break
        rate = (len(received) - 1) / (time.perf_counter() - first)
    return NaiveRun(rate, received)


async def ensure_naive_table(dsn: str) -> None:
    def run() -> None:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS naive_events "
                "(seq bigserial PRIMARY KEY, stream text, event_id text, data text)"
            )

    await asyncio.to_thread(run)


async def naive_throughput(running: Stack, *, events: int, runs: int) -> Figures:
    """Naive events/s on a max-rate, per-event-flush stream."""
    await ensure_naive_table(running.psycopg_url)
    rates = Figures()
    for _ in range(runs):
        name = "naive-" + uuid.uuid4().hex[:8]
        url = await add_source_stream(running, name, rate=0, flush="event", retry_ms=None)
        state = running.workdir / f"{name}.last-event-id"
        run = await asyncio.to_thread(naive_consume, url, events, running.psycopg_url, state, name)
        rates.values.append(run.rate)
        await remove_source_stream(running, name)
    return rates


@dataclass
class NaiveLoss:
    read: int
    lost: int
    """Ids missing between the first and last id read: the events the server skipped."""


async def naive_drop_loss(
    running: Stack, *, events: int, rate: float, drop_every: int, drop_count: int
) -> NaiveLoss:
    """Lost events when the server skips ``drop_count`` of every ``drop_every`` + notices."""
    await ensure_naive_table(running.psycopg_url)
    name = "naive-drop-" + uuid.uuid4().hex[:8]
    url = await add_source_stream(
        running,
        name,
        rate=rate,
        flush="event",
        retry_ms=None,
        drop_every=drop_every,
        drop_count=drop_count,
    )
    state = running.workdir / f"{name}.last-event-id"
    run = await asyncio.to_thread(naive_consume, url, events, running.psycopg_url, state, name)
    await remove_source_stream(running, name)
    received = set(run.received)
    expected = set(range(min(received), max(received) + 1))
    lost = len(expected - received)
    return NaiveLoss(read=len(received), lost=lost)
