"""Helpers of the read activity's tests: the activity on real stores, a canned server, and
reads of what it wrote (``sse_events``, ``sse_gaps``) and heartbeated.

Each test runs ``ReadActivities.read_stream`` in temporalio's ``ActivityEnvironment`` (no
Temporal server): heartbeats are recorded, a retry is an attempt number with the dead
attempt's heartbeat details, as Temporal hands them over, and cancellation comes as a
workflow's would. What was written is read back from ``sse_events`` and ``sse_gaps``.
Bytes the demo source never sends (an oversized event or id, ids that are no counters,
a comment built to make a backtracking regex explode) come from a small canned server.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from temporalio.runtime import MetricBuffer
from temporalio.testing import ActivityEnvironment

from durable_sse.activities.read import ReadActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    ReadInput,
    ReadResult,
)
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores

"""The shortest heartbeat timeout a stream may set (``MIN_HEARTBEAT_TIMEOUT``)."""


SECRET = "Bearer sup3r-s3cret-t0ken"


GUARD = 30.0


"""Seconds a test waits at most for something to happen before it fails."""


"""The demo source's drop notice for ``drop_count=7``, as the decoder hands it over."""


def make_spec(url: str, name: str, **settings: object) -> StreamSpec:
    defaults: dict[str, object] = {"id_order": "numeric", "batch_max_delay": 0.02}
    defaults.update(settings)
    return StreamSpec(name=name, url=url, **defaults)  # type: ignore[arg-type]


class Heartbeats(list[dict[str, Any]]):
    """Heartbeat details as the activity sent them (``on_heartbeat``); tests wait on them."""

    def __init__(self) -> None:
        super().__init__()
        self._more = asyncio.Event()

    def __call__(self, *details: Any) -> None:
        self.append(details[0])
        self._more.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(GUARD):
            while len(self) < count:
                self._more.clear()
                await self._more.wait()


def watched(env: ActivityEnvironment | None = None) -> tuple[ActivityEnvironment, Heartbeats]:
    """An activity environment (``env``, or a new one) whose heartbeats are kept."""
    beats = Heartbeats()
    env = env or ActivityEnvironment()
    env.on_heartbeat = beats
    return env, beats


async def read(
    reader: ReadActivities,
    spec: StreamSpec,
    *,
    env: ActivityEnvironment | None = None,
    **fields: Any,
) -> tuple[ReadResult, Heartbeats]:
    env, beats = watched(env)
    result = await env.run(reader.read_stream, ReadInput(spec=spec, **fields))
    return result, beats


def metric_total(buffer: MetricBuffer, name: str, stream: str) -> float:
    """The sum of the stream's updates of metric ``name`` that ``buffer`` holds."""
    return sum(
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == name and update.attributes.get("stream") == stream
    )


async def query(log: Stores, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with log.database.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(sa.text(sql), params)]

    return await asyncio.to_thread(run)


async def stored(log: Stores, stream: str) -> list[tuple[str, int | None]]:
    """``(event_id, event_ord)`` of the stream's rows, in the order they were inserted."""
    rows = await query(
        log, "SELECT event_id, event_ord FROM sse_events WHERE stream = :s ORDER BY seq", s=stream
    )
    return [(row[0], row[1]) for row in rows]


async def stored_ids(log: Stores, stream: str) -> list[str]:
    return [event_id for event_id, _ in await stored(log, stream)]


GAP_COLUMNS = (
    "gap_id",
    "kind",
    "state",
    "start_id",
    "end_id",
    "notice_id",
    "reread_to",
    "announced",
    "truncated",
    "recovered",
    "missing",
)


async def gap_rows(log: Stores, stream: str) -> list[dict[str, Any]]:
    """The stream's rows of ``sse_gaps``, oldest first."""
    rows = await query(
        log,
        f"SELECT {', '.join(GAP_COLUMNS)}, closed_at FROM sse_gaps WHERE stream = :s "
        "ORDER BY seen_at, gap_id",
        s=stream,
    )
    return [
        {**dict(zip(GAP_COLUMNS, row, strict=False)), "closed": row[-1] is not None} for row in rows
    ]


def numbers(first: int, last: int, prefix: str = "") -> list[str]:
    return [f"{prefix}{n}" for n in range(first, last + 1)]


class CannedServer:
    """An HTTP server that answers every request with 200, ``text/event-stream`` and one
    fixed body, in one write, then closes: for bytes the demo source never sends.
    ``then``: whole responses (head and body) for the requests after the first, in
    order; the last one repeats."""

    def __init__(self, body: bytes, *, then: list[bytes] | None = None) -> None:
        self.body = body
        self.then = then or []
        self.delay = 0.0
        """Seconds between the response head and the body (of the first response)."""
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CannedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/events"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            if len(self.requests) > 1 and self.then:
                writer.write(self.then[min(len(self.requests) - 1, len(self.then)) - 1])
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Connection: close\r\n\r\n"
                )
                if self.delay:
                    await writer.drain()
                    await asyncio.sleep(self.delay)
                writer.write(self.body)
            await writer.drain()
        finally:
            writer.close()


def events(*ids: str, data: str = "x") -> bytes:
    return b"".join(f"id: {event_id}\ndata: {data}\n\n".encode() for event_id in ids)


async def retained(log: Stores, stream: str) -> None:
    """Ids 1..40 stored under ``numeric`` an hour ago, the lagging id 30, 1..28 deleted."""
    start = datetime.now(UTC) - timedelta(hours=1)
    rows = [
        EventRecord(str(i), 0, "message", "x", start + timedelta(seconds=i)) for i in range(1, 41)
    ]
    await log.writer.insert_batch(stream, "numeric", rows)
    moved = await log.checkpoints.advance_lagging(
        stream, "numeric", window=1.0, now=start + timedelta(seconds=31)
    )
    assert moved.lagging_id == "30"
    run = await log.prune.apply_retention(stream, "numeric", cutoff=datetime.now(UTC))
    assert (run.deleted, run.state.horizon_id) == (28, "28")
