"""The read activity against the real demo SSE source, PostgreSQL and Redis.

Each test runs ``ReadActivities.read_stream`` in temporalio's ``ActivityEnvironment`` (no
Temporal server): heartbeats are recorded, a retry is an attempt number with the dead
attempt's heartbeat details, as Temporal hands them over, and cancellation comes as a
workflow's would. What was written is read back from ``sse_events`` and ``sse_gaps``.
Bytes the demo source never sends (an oversized event or id, ids that are no counters,
a comment built to make a backtracking regex explode) come from a small canned server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from temporalio.exceptions import ApplicationError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

import durable_sse.reader.heartbeat_policy as heartbeat_policy
import durable_sse.reader.reports as reports_module
from durable_sse.activities.read import ReadActivities
from durable_sse.config.secrets import DeclaredSecrets, parse_secret_bindings
from durable_sse.config.spec import DEFAULT_HEARTBEAT_TIMEOUT, StreamSpec
from durable_sse.contracts import (
    RECORDED_GAP,
    DropReport,
    Outcome,
    ReadCounts,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.gaps.model import GapTotals
from durable_sse.ids import sort_key
from durable_sse.log.records import EventRecord
from durable_sse.ops.nudge import Nudges
from durable_sse.reader.committer import Committer
from durable_sse.reader.heartbeat_policy import (
    HEARTBEAT_INTERVAL,
    HEARTBEAT_SLACK,
    LONG_TIMEOUT,
    NUDGED_HEARTBEAT_INTERVAL,
)
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from durable_sse.workflows.stream import READ_MARGIN, READ_RETRY

READ_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""The shortest heartbeat timeout a stream may set (``MIN_HEARTBEAT_TIMEOUT``)."""

SECRET = "Bearer sup3r-s3cret-t0ken"
GUARD = 30.0
"""Seconds a test waits at most for something to happen before it fails."""
NOTICE = "dropping events: discarded 7 events (slow consumer)"
"""The demo source's drop notice for ``drop_count=7``, as the decoder hands it over."""


@pytest.fixture
async def reader(pg_stores: Stores, redis_url: str) -> AsyncIterator[ReadActivities]:
    l2 = RedisCursors(redis_url)
    async with httpx.AsyncClient(follow_redirects=False) as http:
        yield ReadActivities(
            http=http,
            stores=replace(pg_stores, l2=l2),
            secrets=DeclaredSecrets(
                parse_secret_bindings("TEST_TOKEN@127.0.0.1"), environ={"TEST_TOKEN": SECRET}
            ),
        )
    await l2.close()


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


async def read(
    reader: ReadActivities,
    spec: StreamSpec,
    *,
    env: ActivityEnvironment | None = None,
    **fields: Any,
) -> tuple[ReadResult, Heartbeats]:
    beats = Heartbeats()
    env = env or ActivityEnvironment()
    env.on_heartbeat = beats
    result = await env.run(reader.read_stream, ReadInput(spec=spec, **fields))
    return result, beats


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


def assert_progress(beats: list[dict[str, Any]], *, start: str | None, last: str) -> None:
    """Heartbeats carry ReadProgress: the start cursor, committed cursors only (never past
    the result's), moving forward, and counts that only grow."""
    assert beats, "no heartbeat"
    assert all(set(beat) == {"cursor", "start_cursor", "first_id", "counts"} for beat in beats)
    assert all(beat["start_cursor"] == start for beat in beats)
    assert beats[0]["cursor"] == start  # the connection heartbeats its start at once
    cursors = [int(beat["cursor"]) for beat in beats if beat["cursor"] is not None]
    assert cursors == sorted(cursors)
    assert all(int(start or 0) <= cursor <= int(last) for cursor in cursors)
    rows = [beat["counts"]["new_rows"] for beat in beats]
    assert rows == sorted(rows)


NO_CONTENT = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


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


# -- live connections, cursors and heartbeats ------------------------------------------------


async def test_live_connections_resume_from_l1_then_l2_and_heartbeat_their_progress(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=50, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)

    first, beats = await read(reader, spec)
    assert first.outcome is Outcome.DROPPED and first.error == "the server ended the stream"
    assert (first.cursor_source, first.start_cursor, first.last_cursor) == ("none", None, "50")
    assert first.counts == ReadCounts(events_read=50, new_rows=50)
    assert first.drop is None and first.gaps is not None and first.gaps.totals == GapTotals()
    assert_progress(beats, start=None, last="50")
    # With no cursor, the first committed batch is heartbeaten at once with its first id:
    # a retry of this attempt starts there.
    assert any(beat["first_id"] == "1" and beat["cursor"] is not None for beat in beats)
    assert reader.stores.l1.get(stream_name) == "50"

    # From L1, the cursor sent as a query parameter.
    by_query = dataclasses.replace(spec, cursor_param="cursor")
    second, beats = await read(reader, by_query)
    assert (second.cursor_source, second.start_cursor, second.last_cursor) == ("l1", "50", "100")
    assert second.counts == ReadCounts(events_read=50, new_rows=50)
    assert_progress(beats, start="50", last="100")

    # A worker that never saw the stream (L1 empty) resumes from L2, by header.
    await reader.stores.l2.flush()
    assert await reader.stores.l2.get(stream_name) == "100"
    fresh = ReadActivities(http=reader.http, stores=replace(reader.stores, l1=LocalCursors()))
    third, beats = await read(fresh, spec)
    assert (third.cursor_source, third.start_cursor, third.last_cursor) == ("l2", "100", "150")
    assert_progress(beats, start="100", last="150")
    assert fresh.stores.l1.get(stream_name) == "150"
    await reader.stores.l2.flush()
    assert await reader.stores.l2.get(stream_name) == "150"

    assert await stored(pg_event_log, stream_name) == [(str(n), 0) for n in range(1, 151)]
    assert await gap_rows(pg_event_log, stream_name) == []


async def test_only_commits_that_store_rows_check_for_a_resting_checkpoint_schedule(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    """A connection wakes a resting schedule from its first commit that stores rows, and
    after a pause between such commits (durable_sse/cursor/rest.py). A replay of stored
    events moves the cursor all along yet stores nothing: it must not check (nothing is
    newer), nor count as activity that would hide the pause before a newer event."""
    woken: list[str] = []

    async def wake(stream: str) -> bool:
        woken.append(stream)
        return False

    reader.wake_checkpoint = wake
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=30, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    first, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert first.counts.new_rows == 30 and woken == [stream_name]  # once: no pause
    stored_only, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert stored_only.counts.new_rows == 0 and stored_only.last_cursor == "30"
    assert woken == [stream_name]
    newer, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="20")
    assert newer.counts.new_rows == 20 and woken == [stream_name] * 2


async def test_replayed_events_are_stored_once(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=30, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    first, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert first.counts == ReadCounts(events_read=30, new_rows=30)
    again, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="10")
    assert (again.cursor_source, again.start_cursor, again.last_cursor) == (
        "explicit",
        "10",
        "40",
    )
    # No gap was open: nothing counts as recovered.
    assert again.counts == ReadCounts(events_read=30, new_rows=10, duplicates=20)
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 40)
    assert await gap_rows(pg_event_log, stream_name) == []


# -- gaps --------------------------------------------------------------------------------------


async def read_past_a_drop_notice(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> tuple[StreamSpec, ReadResult]:
    """A live connection: 1..100, then the source skips 101..107 and says so, then 108,
    and closes (what a connection read ahead as it ended is stored too: an endless
    source would make the rows stored a matter of timing)."""
    source.add_stream(
        stream_name,
        SourceStreamConfig(rate=0, drop_every=100, drop_count=7, disconnect_after=101, keepalive=0),
    )
    spec = make_spec(source.url(stream_name), stream_name)
    result, _ = await read(reader, spec)
    assert source.truth(stream_name).dropped[0] == (101, 107)
    return spec, result


async def test_a_drop_notice_opens_a_gap_with_its_batch_and_a_repair_brings_its_ids_back(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    spec, result = await read_past_a_drop_notice(source, reader, stream_name)

    # The connection reads on to the first id after the notice (it bounds the hole), then
    # ends for the repair.
    assert result.outcome is Outcome.DROP_SIGNAL
    assert result.drop == DropReport(kind="comment", detail=NOTICE)
    assert result.last_cursor == "108" == reader.stores.l1.get(stream_name)
    assert await stored_ids(pg_event_log, stream_name) == [*numbers(1, 100), "108"]
    [gap] = await gap_rows(pg_event_log, stream_name)
    gap_id = gap.pop("gap_id")
    assert gap == {
        "kind": "comment",
        "state": "open",
        "start_id": "1",  # conservative: a notice does not say where the hole begins
        "end_id": "108",
        "notice_id": "100",
        "reread_to": None,
        "announced": 7,
        "truncated": False,
        "recovered": 0,
        "missing": None,
        "closed": False,
    }
    # The gap record was written by the transaction that stored 108, the first event past
    # the notice: no cursor could pass the notice before the gap was durable.
    [(gap_xid,)] = await query(
        pg_event_log, "SELECT xmin::text FROM sse_gaps WHERE gap_id = :g", g=gap_id
    )
    [(row_xid,)] = await query(
        pg_event_log,
        "SELECT xmin::text FROM sse_events WHERE stream = :s AND event_id = '108'",
        s=stream_name,
    )
    assert gap_xid == row_xid
    assert result.gaps is not None and result.gaps.open_ids == [gap_id]
    assert (result.gaps.open[0].end_id, result.gaps.open[0].announced) == ("108", 7)
    assert result.gaps.totals == GapTotals(open=1)

    # The repair: the lagged route starts one stored id before the gap, re-reads it and
    # brings the skipped ids back. This gap starts at the stream's first id, with nothing
    # stored before it: the first row the repair meets (2) lies inside the hole, so a
    # history that lost ids between 1 and 2 would look the same. The ids are stored, but
    # the gap is not called repaired on that (a strike: GapClosed(repaired) promises the
    # whole hole). The source's standing drops only hit the live tail.
    source.inject(stream_name, drop_every=None, disconnect_after=150)
    repair, _ = await read(reader, spec, route=Route.LAGGED, known_gaps=[gap_id])
    assert (repair.cursor_source, repair.start_cursor, repair.last_cursor) == ("gap", "1", "151")
    assert repair.outcome is Outcome.DROP_SIGNAL
    assert repair.drop == DropReport(
        kind="history_short", detail="the replay started past an open gap"
    )
    # 2..151 read: 101..107 recovered, 109..151 new, 2..100 and 108 already stored.
    assert repair.counts == ReadCounts(events_read=150, new_rows=50, duplicates=100, recovered=7)
    assert repair.gaps is not None and repair.gaps.open_ids == [gap_id]
    assert repair.gaps.totals == GapTotals(open=1, events_recovered=7)
    assert await gap_rows(pg_event_log, stream_name) == [
        {
            "gap_id": gap_id,
            "kind": "comment",
            "state": "open",
            "start_id": "1",
            "end_id": "108",
            "notice_id": "100",
            "reread_to": None,
            "announced": 7,
            "truncated": False,
            "recovered": 7,
            "missing": None,
            "closed": False,
        }
    ]
    assert await stored_ids(pg_event_log, stream_name) == [
        *numbers(1, 100),
        "108",
        *numbers(101, 107),
        *numbers(109, 151),
    ]


async def test_a_live_connection_ends_at_once_on_an_open_gap_it_was_not_told_of(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    spec, first = await read_past_a_drop_notice(source, reader, stream_name)
    assert first.gaps is not None
    [gap_id] = first.gaps.open_ids
    gaps_before = await gap_rows(pg_event_log, stream_name)
    # A 503 waits for the next request that reaches the source.
    source.inject(stream_name, action="status", code=503, retry_after=2)

    # The workflow lost the result that named the gap (a crash, a cancel): the store has it.
    lost, beats = await read(reader, spec, route=Route.LIVE)
    assert lost.outcome is Outcome.DROP_SIGNAL
    assert lost.drop == DropReport(kind=RECORDED_GAP, detail="1 open gap(s) recorded earlier")
    assert lost.gaps is not None and lost.gaps.open_ids == [gap_id]
    assert lost.counts == ReadCounts() and lost.status_code is None
    assert (lost.start_cursor, lost.last_cursor) == ("108", "108")
    assert {beat["cursor"] for beat in beats} == {"108"}
    assert source.describe(stream_name)["config"]["status"] == 503  # it never connected

    told, _ = await read(reader, spec, route=Route.LIVE, known_gaps=[gap_id])
    assert (told.outcome, told.status_code, told.retry_after) == (Outcome.RETRY_LATER, 503, 2.0)
    assert told.drop is None
    assert await stored_ids(pg_event_log, stream_name) == [*numbers(1, 100), "108"]
    assert await gap_rows(pg_event_log, stream_name) == gaps_before


async def test_a_retried_attempt_restarts_from_where_the_dead_one_started(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=10, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    # 1..10 stored first: a connection starts from a stored id, with others before it.
    first, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert first.last_cursor == "10"
    source.inject(stream_name, disconnect_after=50)
    dead, beats = await read(reader, spec, route=Route.EXPLICIT, start_id="10")
    assert dead.last_cursor == "60" == reader.stores.l1.get(stream_name)
    last = beats[-1]
    assert last["start_cursor"] == "10"

    # The attempt "died" after its last heartbeat (it may have read a drop notice it never
    # wrote): Temporal retries the same input, attempt 2, with those details. L1 says 60,
    # but the retry re-reads from where the dead attempt began.
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[last])
    retry, retry_beats = await read(reader, spec, env=env, route=Route.LIVE)
    assert (retry.cursor_source, retry.start_cursor, retry.last_cursor) == ("retry", "10", "60")
    carried = ReadCounts(**last["counts"])
    assert retry.counts == ReadCounts(
        events_read=carried.events_read + 50,
        new_rows=carried.new_rows,
        duplicates=carried.duplicates + 50,
    )
    assert retry_beats[0]["start_cursor"] == "10"  # a third attempt would start there too
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 60)
    # What the dead attempt read is a gap to re-read (it may hide a notice it never
    # wrote), recorded by the retry. The retry re-read it from the gap's own start, so the
    # first row it met lies inside the gap: no proof that the history reached the start
    # (a server that lost 11 would look the same). A repair proves it, from one stored id
    # before the gap, and closes it once it reads one id past it.
    (suspect,) = await gap_rows(pg_event_log, stream_name)
    assert (suspect["kind"], suspect["start_id"], suspect["notice_id"]) == ("retry", "10", "60")
    assert (suspect["state"], suspect["reread_to"]) == ("open", None)
    known = [suspect["gap_id"]]
    source.inject(stream_name, disconnect_after=100)
    repair, _ = await read(reader, spec, route=Route.LAGGED, known_gaps=known)
    assert (repair.cursor_source, repair.start_cursor, repair.last_cursor) == ("gap", "9", "109")
    (closed,) = await gap_rows(pg_event_log, stream_name)
    assert (closed["state"], closed["missing"], closed["closed"]) == ("repaired", 0, True)

    # Never from before the lagging id: what lies before it is past the replay window.
    await pg_event_log.checkpoints.advance_lagging(
        stream_name, "numeric", window=0, now=datetime.now(UTC)
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=3, heartbeat_details=[last])
    bounded, _ = await read(reader, spec, env=env, route=Route.LIVE)
    assert (bounded.cursor_source, bounded.start_cursor, bounded.last_cursor) == (
        "lagging",
        "109",
        "209",
    )
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 209)


async def test_a_retried_attempt_that_had_no_cursor_restarts_from_its_first_id(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=50, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    _, beats = await read(reader, spec)
    last = beats[-1]
    assert (last["start_cursor"], last["first_id"]) == (None, "1")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[last])
    retry, _ = await read(reader, spec, env=env)
    assert (retry.cursor_source, retry.start_cursor, retry.last_cursor) == ("retry", "1", "51")
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 51)


async def test_a_retry_takes_heartbeat_details_of_another_version(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """During a rolling deploy the attempt that died may have run a newer or older
    version: counts it does not know are left out, missing ones are 0."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=20, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    details = {
        "cursor": "25",
        "start_cursor": "10",
        "first_id": None,
        "counts": {"events_read": 15, "new_rows": 15, "counted_by_a_newer_version": 4},
    }
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[details])
    retry, _ = await read(reader, spec, env=env)
    assert (retry.cursor_source, retry.start_cursor, retry.last_cursor) == ("retry", "10", "30")
    assert retry.counts == ReadCounts(events_read=35, new_rows=35)
    assert await stored_ids(pg_event_log, stream_name) == numbers(11, 30)


# -- cancellation ------------------------------------------------------------------------------


async def test_keepalives_do_not_end_the_connection_and_cancel_returns_cancelled(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    source.add_stream(
        stream_name, SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0.1, paused=True)
    )
    spec = make_spec(source.url(stream_name), stream_name, idle_timeout=1.0)
    env = ActivityEnvironment()
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0"))
    )
    await asyncio.sleep(2.0)  # twice the idle timeout: only keep-alives arrive
    assert not task.done()
    env.cancel()
    result = await task
    assert result.outcome is Outcome.CANCELLED
    assert result.counts == ReadCounts() and result.last_cursor == "0"


async def test_keepalives_more_frequent_than_heartbeats_do_not_silence_them(
    source: SSESource, reader: ReadActivities, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: an idle stream's keep-alives (every 15 s) come more often than a heartbeat
    is due (every 4 minutes): the connection must heartbeat between them, or Temporal
    times the attempt out after the heartbeat timeout and starts it again."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.3)
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0.03, paused=True))
    spec = make_spec(source.url(stream_name), stream_name)
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0"))
    )
    try:
        await beats.wait_for(1)  # the start's heartbeat
        began, first = time.monotonic(), len(beats)
        await asyncio.sleep(2.0)
        sent = len(beats) - first
        elapsed = time.monotonic() - began
    finally:
        env.cancel()
        result = await task
    assert result.outcome is Outcome.CANCELLED
    assert sent >= elapsed / 0.3 - 2, f"{sent} heartbeats in {elapsed:.1f} s"


async def test_cancel_mid_batch_flushes_and_loses_nothing(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=200, keepalive=0))
    spec = make_spec(
        source.url(stream_name), stream_name, batch_max_events=100_000, batch_max_delay=60.0
    )
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(reader.read_stream, ReadInput(spec=spec, route=Route.LIVE)))
    async with asyncio.timeout(GUARD):
        while source.truth(stream_name).generated < 50:
            await asyncio.sleep(0.05)
    assert await stored(pg_event_log, stream_name) == []  # the batch is still pending
    env.cancel()
    result = await task
    assert result.outcome is Outcome.CANCELLED
    rows = await stored_ids(pg_event_log, stream_name)
    assert result.counts.events_read > 0
    assert len(rows) == result.counts.events_read == result.counts.new_rows
    assert rows == numbers(int(rows[0]), int(rows[-1])) and rows[-1] == result.last_cursor


async def test_a_cancel_while_a_connection_that_ended_flushes_ends_it_as_cancelled(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server ended the connection and its last batch is committing when the
    cancellation comes (a signal, the worker stopping): the flush finishes and the
    connection returns as cancelled, never a failed activity."""
    flushing = asyncio.Event()
    original = Committer.flush

    async def slow_flush(self: Committer) -> None:
        flushing.set()
        await asyncio.sleep(0.3)  # the cancellation lands here
        await original(self)

    monkeypatch.setattr(Committer, "flush", slow_flush)
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0))
    spec = make_spec(
        source.url(stream_name), stream_name, batch_max_events=100_000, batch_max_delay=60.0
    )
    env = ActivityEnvironment()
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0"))
    )
    async with asyncio.timeout(GUARD):
        await flushing.wait()
    env.cancel()
    result = await task
    assert result.outcome is Outcome.CANCELLED
    assert result.counts.events_read == result.counts.new_rows == 5
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 5)
    assert result.last_cursor == "5" and result.gaps is not None


# -- what the server answers ---------------------------------------------------------------


async def test_204_stops(source: SSESource, reader: ReadActivities, stream_name: str) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", code=204)
    result, _ = await read(reader, make_spec(source.url(stream_name), stream_name))
    assert (result.outcome, result.status_code) == (Outcome.NO_CONTENT, 204)


@pytest.mark.parametrize("code", [429, 503])
async def test_a_busy_server_is_retry_later_with_its_retry_after(
    source: SSESource, reader: ReadActivities, stream_name: str, code: int
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", code=code, retry_after=7)
    result, _ = await read(reader, make_spec(source.url(stream_name), stream_name))
    assert (result.outcome, result.status_code, result.retry_after) == (
        Outcome.RETRY_LATER,
        code,
        7.0,
    )
    assert result.error == f"HTTP {code} from {source.url(stream_name)}"


async def test_idle_timeout_is_a_plain_drop_with_a_message(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0, paused=True))
    spec = make_spec(source.url(stream_name), stream_name, idle_timeout=0.5)
    result, _ = await read(reader, spec)
    assert result.outcome is Outcome.DROPPED and result.drop is None
    assert result.error == "idle timeout: no bytes for 0.5 s"


async def test_the_servers_retry_field_is_returned(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    source.add_stream(
        stream_name, SourceStreamConfig(rate=0, disconnect_after=3, keepalive=0, retry_ms=2500)
    )
    spec = make_spec(source.url(stream_name), stream_name)
    result, _ = await read(reader, spec)
    assert result.retry_ms == 2500
    source.inject(stream_name, retry_ms=None)
    result, _ = await read(reader, spec)
    assert result.retry_ms is None and result.counts.events_read == 3


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"code": 401}, "HTTP 401"),
        ({"code": 403}, "HTTP 403"),
        ({"code": 404}, "HTTP 404"),
        ({"code": 410}, "HTTP 410"),
        ({"code": 200, "content_type": "text/plain"}, "not text/event-stream"),
        ({"code": 307}, "another origin"),
    ],
)
async def test_refusals_are_non_retryable_and_never_leak_the_secret(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
    fault: dict[str, Any],
    expected: str,
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", **fault)
    spec = make_spec(
        source.url(stream_name), stream_name, headers_from_env={"Authorization": "TEST_TOKEN"}
    )
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert raised.value.non_retryable
    assert raised.value.type == "StreamRefusedError"
    assert expected in raised.value.message
    assert "sup3r" not in raised.value.message
    assert "sup3r" not in caplog.text
    assert await stored(pg_event_log, stream_name) == []


async def test_missing_secret_variable_is_named(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    spec = make_spec(
        source.url(stream_name), stream_name, headers_from_env={"Authorization": "NOT_SET_VAR"}
    )
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert raised.value.non_retryable and raised.value.type == "ConfigError"
    assert "NOT_SET_VAR" in raised.value.message


async def test_secret_header_is_sent_but_never_returned(
    source: SSESource, reader: ReadActivities, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=3))
    spec = make_spec(
        source.url(stream_name), stream_name, headers_from_env={"Authorization": "TEST_TOKEN"}
    )
    caplog.set_level(logging.DEBUG)
    result, beats = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.counts.events_read == 3
    assert "sup3r" not in repr(result) + repr(beats) + caplog.text


async def test_query_secret_is_sent_from_the_environment_and_never_returned(
    source: SSESource, reader: ReadActivities, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=3))
    spec = make_spec(source.url(stream_name), stream_name, query_from_env={"access": "TEST_TOKEN"})
    caplog.set_level(logging.DEBUG)
    result, beats = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.counts.events_read == 3
    assert "sup3r" not in repr(result) + repr(beats) + caplog.text
    source.inject(stream_name, action="status", code=401)
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert "HTTP 401" in raised.value.message
    assert "sup3r" not in raised.value.message + caplog.text


async def test_hosts_outside_the_allowlist_are_refused(
    source: SSESource, reader: ReadActivities, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    guarded = ReadActivities(
        http=reader.http,
        stores=reader.stores,
        allowed_hosts=("events.example.com",),
    )
    with pytest.raises(ApplicationError) as raised:
        await read(guarded, make_spec(source.url(stream_name), stream_name))
    assert raised.value.non_retryable and raised.value.type == "ConfigError"
    assert "SSE_ALLOWED_HOSTS" in raised.value.message and "'url'" in raised.value.message


async def test_unreachable_server_is_retry_later(reader: ReadActivities, stream_name: str) -> None:
    spec = StreamSpec(
        name=stream_name, url="http://127.0.0.1:9/streams/x?token=abc", connect_timeout=2
    )
    result, _ = await read(reader, spec)
    assert result.outcome is Outcome.RETRY_LATER
    assert "127.0.0.1:9" in (result.error or "") and "abc" not in (result.error or "")


async def test_malformed_bytes_do_not_crash_and_lose_nothing(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=20, keepalive=0))
    source.inject(stream_name, action="malformed")
    spec = make_spec(source.url(stream_name), stream_name)
    result, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.outcome is Outcome.DROPPED
    # The malformed block dispatches one event that keeps the id in force (the cursor, 0)
    # as its first id-less follower; then 1..20.
    assert await stored(pg_event_log, stream_name) == [
        ("0", 1),
        *((str(n), 0) for n in range(1, 21)),
    ]
    assert result.last_cursor == "20"


async def test_events_without_ids_are_kept_apart(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    body = b"id: 7\ndata: a\n\ndata: b\n\ndata: c\n\nid\ndata: d\n\ndata: e\n\n"
    async with CannedServer(body) as server:
        spec = StreamSpec(name=stream_name, url=server.url, batch_max_delay=0.01)
        await read(reader, spec)
        # Delivered twice: id-carrying events dedupe, id-less ones (no id in force) do not.
        await read(reader, spec)
    rows = await stored(pg_event_log, stream_name)
    assert rows == [("7", 0), ("7", 1), ("7", 2), ("", None), ("", None), ("", None), ("", None)]


async def test_an_idless_event_after_a_reconnect_is_new_and_a_resent_one_is_not(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """Issue 13 case 8: connection 1 stores ``5: a`` and its id-less follower ``b``;
    connection 2 resumes after 5 and reads a new id-less ``c`` (position 1, like ``b``):
    it is stored. ``b`` re-sent after 5, or all of 5's run replayed from 4, is not."""

    async def connect(body: bytes, **fields: Any) -> None:
        async with CannedServer(body) as server:
            spec = StreamSpec(name=stream_name, url=server.url, batch_max_delay=0.01)
            await read(reader, spec, **fields)

    async def rows() -> list[tuple[str, int | None, str]]:
        return [
            (e.event_id, e.event_ord, e.data) for e in await pg_event_log.reads.events(stream_name)
        ]

    await connect(b"id: 5\ndata: a\n\ndata: b\n\n")
    assert await rows() == [("5", 0, "a"), ("5", 1, "b")]
    await connect(b"data: c\n\n", route=Route.EXPLICIT, start_id="5")
    assert await rows() == [("5", 0, "a"), ("5", 1, "b"), ("5", 1, "c")]
    await connect(b"data: b\n\ndata: c\n\n", route=Route.EXPLICIT, start_id="5")
    await connect(b"id: 4\ndata: z\n\nid: 5\ndata: a\n\ndata: b\n\ndata: c\n\n")
    assert await rows() == [("5", 0, "a"), ("5", 1, "b"), ("5", 1, "c"), ("4", 0, "z")]
    # Identical followers on one connection are each kept (and each deduplicated).
    await connect(b"id: 6\ndata: p\n\ndata: p\n\ndata: p\n\n")
    await connect(b"id: 6\ndata: p\n\ndata: p\n\ndata: p\n\n")
    assert (await rows())[4:] == [("6", 0, "p"), ("6", 1, "p"), ("6", 2, "p")]


async def test_a_server_slow_to_answer_does_not_silence_heartbeats(
    reader: ReadActivities, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Response headers may take up to idle_timeout, longer than the heartbeat timeout:
    without heartbeats meanwhile Temporal would time the attempt out and retry it."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.05)
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats

    async def answer_late(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader_.readuntil(b"\r\n\r\n")
        await beats.wait_for(5)  # the start's heartbeat, then 4 while the server says nothing
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            b"id: 1\ndata: late\n\n"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_late, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        spec = StreamSpec(name=stream_name, url=f"http://127.0.0.1:{port}/late", id_order="numeric")
        result = await env.run(reader.read_stream, ReadInput(spec=spec))
    finally:
        server.close()
        await server.wait_closed()
    assert result.outcome is Outcome.DROPPED and result.counts.new_rows == 1
    assert [beat["counts"]["events_read"] for beat in beats[:5]] == [0] * 5


# -- hostile servers (issue 13) --------------------------------------------------------------


async def test_a_line_over_max_line_bytes_ends_the_connection_with_the_error(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=10, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name, max_line_bytes=4096)
    await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    source.inject(stream_name, action="oversized", bytes=100_000)
    result, _ = await read(reader, spec)
    assert result.outcome is Outcome.DROPPED
    assert result.error == (
        "an SSE line exceeded max_line_bytes=4096 bytes; ending the connection to bound memory"
    )
    assert (result.start_cursor, result.last_cursor) == ("10", "10")
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 10)


@pytest.mark.parametrize(
    ("bad_event", "settings", "named"),
    [
        (b"id: 6\ndata: " + b"x" * 2000 + b"\n\n", {"max_event_bytes": 1024}, "max_event_bytes"),
        (b"id: " + b"7" * 200 + b"\ndata: x\n\n", {"max_id_bytes": 100}, "max_id_bytes"),
        # 5000 digits: beyond what int() parses, and beyond any max_id_bytes (2048 at most).
        (
            b"id: " + b"9" * 5000 + b"\ndata: x\n\n",
            {"max_id_bytes": 2048, "contiguous_ids": True},
            "max_id_bytes",
        ),
    ],
    ids=["event", "id", "5000-digit id"],
)
async def test_an_event_or_id_over_its_limit_parks_the_stream_before_it(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    bad_event: bytes,
    settings: dict[str, Any],
    named: str,
) -> None:
    body = events("1", "2", "3", "4", "5") + bad_event + events("8")
    async with CannedServer(body) as server:
        spec = make_spec(server.url, stream_name, **settings)
        with pytest.raises(ApplicationError) as raised:
            await read(reader, spec)
    assert raised.value.non_retryable and raised.value.type == "StreamRefusedError"
    assert f"{named}=" in raised.value.message
    assert raised.value.message.endswith("the stream is parked until resumed")
    # What came before the bad event is stored and the cursor stands there: a resume
    # starts right before the bad event.
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 5)
    assert reader.stores.l1.get(stream_name) == "5"


async def test_a_non_ascii_id_resumes_by_header_bytes_and_by_query_parameter(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(
        stream_name,
        SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0, id_prefix="café-"),
    )
    spec = make_spec(source.url(stream_name), stream_name, id_order="natural")
    first, _ = await read(reader, spec)
    assert first.last_cursor == "café-5"
    # Last-Event-ID carries the UTF-8 bytes, as browsers send them; the source decodes them
    # and resumes after café-5 (a cursor it could not read would mean live only: 8193 on).
    by_header, _ = await read(reader, spec)
    assert (by_header.start_cursor, by_header.last_cursor) == ("café-5", "café-10")
    by_query, _ = await read(reader, dataclasses.replace(spec, cursor_param="cursor"))
    assert (by_query.start_cursor, by_query.last_cursor) == ("café-10", "café-15")
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 15, prefix="café-")


async def test_a_comment_built_to_make_a_regex_backtrack_is_a_drop_notice(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """With Python's ``re`` the old default patterns took ~20 s on this comment, on the
    event loop, and then missed it; RE2 matches it in linear time."""
    text = "dropped " + ",".join(str(i) for i in range(100, 140)) + " (backpressure)"
    body = events("1", "2", "3") + f": {text}\n".encode() + events("4", "5")
    async with CannedServer(body) as server:
        result, _ = await read(reader, make_spec(server.url, stream_name))
    assert result.outcome is Outcome.DROP_SIGNAL
    assert result.drop == DropReport(kind="comment", detail=text)
    # 4 ends the connection; 5 came in the same write and is stored too.
    assert await stored_ids(pg_event_log, stream_name) == ["1", "2", "3", "4", "5"]
    [gap] = await gap_rows(pg_event_log, stream_name)
    assert (gap["kind"], gap["state"], gap["start_id"], gap["end_id"], gap["notice_id"]) == (
        "comment",
        "open",
        "1",
        "4",
        "3",
    )
    assert gap["announced"] is None  # the notice lists ids, it gives no count


# -- what a connection received as it ends (issue 24, item 5) -------------------------------


async def test_events_that_came_with_a_notice_are_stored_though_the_server_cannot_resend(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """The issue's sequence: in one write a drop notice, then events 1..20; the next
    connection gets 204. The first id after the notice ends the connection; the 19 after
    it were received with it: stored, not dropped (the server could never send them again)."""
    body = b": dropping events (slow consumer)\n" + events(*numbers(1, 20))
    async with CannedServer(body, then=[NO_CONTENT]) as server:
        spec = make_spec(server.url, stream_name)
        first, _ = await read(reader, spec)
        second, _ = await read(reader, spec, route=Route.LAGGED)
    assert first.outcome is Outcome.DROP_SIGNAL
    assert first.drop is not None and first.drop.kind == "comment"
    assert first.counts == ReadCounts(events_read=20, new_rows=20)
    assert first.last_cursor == "20" == reader.stores.l1.get(stream_name)
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 20)
    # Nothing stored before the notice and no cursor sent: what it announced lies before
    # event 1, where no repair can reach, and how much nobody knows. Loud, not silent.
    [gap] = await gap_rows(pg_event_log, stream_name)
    assert (gap["kind"], gap["state"], gap["start_id"], gap["end_id"], gap["missing"]) == (
        "comment",
        "unrecoverable",
        None,
        "1",
        None,
    )
    assert (second.outcome, second.status_code) == (Outcome.NO_CONTENT, 204)
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 20)


async def test_a_notice_among_what_is_taken_as_the_connection_ends_records_its_own_gap(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """A second notice after the id that ended the connection is another hole: the
    cursor passes it only once its gap is recorded."""
    body = (
        events("1", "2")
        + b": dropped 3 events (slow consumer)\n"
        + events("6", "7")
        + b": dropped 2 events (slow consumer)\n"
        + events("10", "11")
    )
    async with CannedServer(body) as server:
        result, _ = await read(reader, make_spec(server.url, stream_name))
    assert result.outcome is Outcome.DROP_SIGNAL
    assert await stored_ids(pg_event_log, stream_name) == ["1", "2", "6", "7", "10", "11"]
    rows = await gap_rows(pg_event_log, stream_name)
    assert sorted((g["notice_id"], g["end_id"], g["announced"], g["state"]) for g in rows) == [
        ("2", "6", 3, "open"),
        ("7", "10", 2, "open"),
    ]


async def test_a_long_line_keeps_the_events_its_chunk_brought_before_it(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    body = events("1", "2", "3") + b"id: 4\ndata: " + b"x" * 2000 + b"\n\n" + events("5")
    async with CannedServer(body) as server:
        result, _ = await read(reader, make_spec(server.url, stream_name, max_line_bytes=1024))
    assert result.outcome is Outcome.DROPPED
    assert result.error is not None and "max_line_bytes=1024" in result.error
    # The cursor stays before the event that holds the long line: a reconnect resumes there.
    assert (result.last_cursor, reader.stores.l1.get(stream_name)) == ("3", "3")
    assert await stored_ids(pg_event_log, stream_name) == ["1", "2", "3"]


# -- reconnects that cannot resume (issue 24, item 8) ----------------------------------------


async def test_a_reconnect_of_a_stream_without_ids_records_its_loss_window(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    metrics: tuple[Runtime, MetricBuffer],
) -> None:
    """A server that sends id-less events and closes each connection: every reconnect is
    live only, and what it sent meanwhile is lost. Each reconnect that opens the stream
    records that as a gap of kind ``no_resume`` (unrecoverable, unknown size); the first
    connection, and an attempt the server turns away, do not."""
    runtime, buffer = metrics
    buffer.retrieve_updates()
    busy = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    body = b"data: a\n\ndata: b\n\n"
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    async with CannedServer(body, then=[busy, ok + body]) as server:
        spec = make_spec(server.url, stream_name)
        first, _ = await read(reader, spec, env=env)
        turned_away, _ = await read(reader, spec, env=env, events_read_before=2)
        second, _ = await read(reader, spec, env=env, events_read_before=2)
        # A workflow started again (counters at zero) over the rows of its earlier life.
        restarted, _ = await read(reader, spec, env=env)
    assert first.counts == ReadCounts(events_read=2, new_rows=2)
    assert first.gaps is not None and first.gaps.totals == GapTotals()
    assert turned_away.outcome is Outcome.RETRY_LATER
    assert turned_away.counts.reconnects_without_cursor == 0
    for result in (second, restarted):
        assert result.start_cursor is None and result.counts.new_rows == 2
        assert result.counts.reconnects_without_cursor == 1
        assert result.outcome is Outcome.DROPPED and result.drop is None
    assert second.gaps is not None and second.gaps.totals == GapTotals(
        unrecoverable=1, unknown_size=1
    )
    rows = await gap_rows(pg_event_log, stream_name)
    assert [(g["kind"], g["state"], g["start_id"], g["missing"]) for g in rows] == [
        ("no_resume", "unrecoverable", None, None)
    ] * 2
    assert len(await stored(pg_event_log, stream_name)) == 6
    exported = [
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == "durable_sse_reconnects_without_cursor"
        and update.attributes.get("stream") == stream_name
    ]
    assert sum(exported) == 2


async def test_contiguous_ids_that_are_no_counters_are_counted_not_fatal(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises; a 2048-digit id is a number no
    counter reaches. Both are counted (``Intake.ids_not_counters``) and logged once; the
    stream reads on and no gap opens."""
    big = "1" + "0" * 2047
    body = events("1", "2", "²", "3", "4", big)
    caplog.set_level(logging.WARNING)
    async with CannedServer(body) as server:
        spec = make_spec(server.url, stream_name, contiguous_ids=True, max_id_bytes=2048)
        result, _ = await read(reader, spec)
    assert result.outcome is Outcome.DROPPED and result.drop is None
    assert result.error == "the server ended the stream"
    # Under numeric order "²" (not a number) sorts before every number.
    assert result.counts == ReadCounts(events_read=6, new_rows=6, ids_out_of_order=1)
    assert result.last_cursor == big == reader.stores.l1.get(stream_name)
    assert await stored_ids(pg_event_log, stream_name) == ["1", "2", "²", "3", "4", big]
    assert await gap_rows(pg_event_log, stream_name) == []
    warnings = [r.getMessage() for r in caplog.records if "is not a counter" in r.getMessage()]
    assert len(warnings) == 1 and "'²'" in warnings[0]


@pytest.fixture(scope="module")
def metrics() -> tuple[Runtime, MetricBuffer]:
    """A Temporal runtime whose metrics are buffered for the test to read."""
    buffer = MetricBuffer(10_000)
    return Runtime(telemetry=TelemetryConfig(metrics=buffer)), buffer


@pytest.mark.parametrize(
    ("id_order", "out_of_order", "cursor"),
    [("natural", 2, "AA10"), ("lexicographic", 0, "AA9B")],
)
async def test_ids_out_of_order_under_the_id_order_are_counted_and_exported(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
    metrics: tuple[Runtime, MetricBuffer],
    id_order: str,
    out_of_order: int,
    cursor: str,
) -> None:
    """ULID-like ids, in the server's (byte) order: ``natural`` reads 9A after 10A and
    AA9B after AA10 as going back; ``lexicographic`` is the order that suits them."""
    runtime, buffer = metrics
    buffer.retrieve_updates()
    body = events("10A", "9A", "AA10", "AA9B")
    caplog.set_level(logging.WARNING)
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    async with CannedServer(body) as server:
        result, _ = await read(
            reader, make_spec(server.url, stream_name, id_order=id_order), env=env
        )
    assert result.counts == ReadCounts(events_read=4, new_rows=4, ids_out_of_order=out_of_order)
    assert result.last_cursor == cursor
    assert await stored_ids(pg_event_log, stream_name) == ["10A", "9A", "AA10", "AA9B"]
    exported = [
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == "durable_sse_ids_out_of_order"
        and update.attributes.get("stream") == stream_name
    ]
    assert sum(exported) == out_of_order
    warned = [r for r in caplog.records if "ids_out_of_order" in r.getMessage()]
    assert len(warned) == min(out_of_order, 1)  # once per connection


def generation(prefix: str, first: int, last: int) -> bytes:
    """Events ``first..last`` whose data is ``<prefix><id>``."""
    return b"".join(f"id: {n}\ndata: {prefix}{n}\n\n".encode() for n in range(first, last + 1))


async def test_a_server_that_restarts_its_id_counter_loses_nothing(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
    metrics: tuple[Runtime, MetricBuffer],
) -> None:
    """Issue 24 item 7, the issue's sequence: ids 1..5 (``a1``..``a5``), a close, then,
    after a reconnect with ``Last-Event-ID: 5``, ids 1..3 again with new data. The new
    events are kept and counted as reused, with one warning; the cursor stays at 5. The
    server, its counter at 3, gets 5 again and re-sends 1..3: duplicates. Once its
    counter passes the old ids, 4 and 5 are reused too and 6 moves the cursor on."""
    runtime, buffer = metrics
    buffer.retrieve_updates()
    caplog.set_level(logging.WARNING)
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    async with CannedServer(generation("a", 1, 5)) as server:
        spec = make_spec(server.url, stream_name)
        first, _ = await read(reader, spec, env=env)
        server.body = generation("b", 1, 3)
        restarted, _ = await read(reader, spec, env=env)
        resent, _ = await read(reader, spec, env=env)
        server.body = generation("b", 1, 6)
        passed, _ = await read(reader, spec, env=env)
    rows = [(e.event_id, e.data) for e in await pg_event_log.reads.events(stream_name)]
    assert rows[:8] == [
        *((str(n), f"a{n}") for n in range(1, 6)),
        ("1", "b1"),
        ("2", "b2"),
        ("3", "b3"),
    ]
    assert first.counts == ReadCounts(events_read=5, new_rows=5)
    assert restarted.counts == ReadCounts(events_read=3, new_rows=3, ids_reused=3)
    assert restarted.last_cursor == "5"
    assert [b"last-event-id: 5" in request.lower() for request in server.requests] == [
        False,
        True,
        True,
        True,
    ]
    assert resent.counts == ReadCounts(events_read=3, duplicates=3)
    assert passed.counts == ReadCounts(events_read=6, new_rows=3, duplicates=3, ids_reused=2)
    assert passed.last_cursor == "6"
    assert rows[8:] == [("6", "b6"), ("4", "b4"), ("5", "b5")]
    warned = [
        r.getMessage() for r in caplog.records if "restarted its id counter" in r.getMessage()
    ]
    assert len(warned) == 2  # once per connection that met reused ids
    assert "id '1'" in warned[0] and "'5'" in warned[0]
    exported = [
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == "durable_sse_ids_reused"
        and update.attributes.get("stream") == stream_name
    ]
    assert sum(exported) == 5


async def test_a_replay_over_reused_ids_stores_them_and_skips_what_is_stored(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """Issue 24 item 7 on the replay path: a replay from 0, below the newest stored id,
    skips stored keys before they become rows, but not a key stored with other data."""
    written: list[int] = []
    submit = pg_event_log.writer.submit_batch

    def counting_submit(*args: Any, **kwargs: Any) -> Any:
        written.append(len(args[2]))
        return submit(*args, **kwargs)

    async with CannedServer(generation("a", 1, 5)) as server:
        spec = make_spec(server.url, stream_name)
        await read(reader, spec)
        server.body = generation("b", 1, 3) + generation("a", 4, 5)
        server.delay = 0.3  # the stored keys are read before the first event arrives
        pg_event_log.writer.submit_batch = counting_submit  # type: ignore[method-assign]
        try:
            replay, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
        finally:
            pg_event_log.writer.submit_batch = submit  # type: ignore[method-assign]
    assert [e.data for e in await pg_event_log.reads.events(stream_name)] == [
        "a1",
        "a2",
        "a3",
        "a4",
        "a5",
        "b1",
        "b2",
        "b3",
    ]
    assert sum(written) == 3  # 4 and 5 were skipped as stored, 1..3 written
    assert replay.counts == ReadCounts(events_read=5, new_rows=3, duplicates=2, ids_reused=3)
    assert replay.last_cursor == "5"


# -- retention (issue 24) ---------------------------------------------------------------------


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


async def test_ids_the_horizon_drops_are_counted_logged_once_and_exported(
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
    metrics: tuple[Runtime, MetricBuffer],
) -> None:
    """Issue 24, item 3: under ``numeric`` an id that is no number sorts before every
    number, so after a delete the horizon drops it; so it does a re-sent deleted id. Both
    are counted as dropped_by_horizon (not duplicates), logged once with the id and the
    horizon, and exported; the connection's registration is gone when it ends."""
    await retained(pg_event_log, stream_name)
    runtime, buffer = metrics
    buffer.retrieve_updates()
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    caplog.set_level(logging.WARNING)
    async with CannedServer(events("tick-a", "5", "41", "tick-b", "42")) as server:
        result, _ = await read(reader, make_spec(server.url, stream_name), env=env)
    assert result.start_cursor == "30"  # the lagging id: the caches know nothing
    assert result.counts == ReadCounts(
        events_read=5, new_rows=2, dropped_by_horizon=3, ids_out_of_order=1
    )
    assert (await stored_ids(pg_event_log, stream_name))[-2:] == ["41", "42"]
    logged = [r.getMessage() for r in caplog.records if "retention horizon" in r.getMessage()]
    assert len(logged) == 1 and "'tick-a'" in logged[0] and "'28'" in logged[0]
    exported = [
        update.value
        for update in buffer.retrieve_updates()
        if update.metric.name == "durable_sse_dropped_by_horizon"
        and update.attributes.get("stream") == stream_name
    ]
    assert sum(exported) == 3
    assert await pg_event_log.readers.readers(stream_name) == []


async def test_a_running_connection_is_registered_from_its_start_until_it_ends(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0.1, paused=True))
    spec = make_spec(source.url(stream_name), stream_name)
    env = ActivityEnvironment()
    # The timeouts StreamWorkflow gives the read activity.
    lifetime = timedelta(seconds=spec.max_connection_age + spec.connect_timeout + spec.idle_timeout)
    env.info = dataclasses.replace(
        env.info,
        start_to_close_timeout=lifetime + READ_MARGIN,
        heartbeat_timeout=READ_HEARTBEAT_TIMEOUT,
        retry_policy=READ_RETRY,
    )
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="7"))
    )
    async with asyncio.timeout(GUARD):
        while not (registered := await pg_event_log.readers.readers(stream_name)):
            await asyncio.sleep(0.05)
    (running,) = registered
    assert running.start_id == "7"
    # Past the attempt's own life, and the wait before a retry would register anew.
    assert running.expires_at > datetime.now(UTC) + lifetime + READ_MARGIN
    assert running.expires_at < datetime.now(UTC) + lifetime + timedelta(minutes=5)
    env.cancel()
    assert (await task).outcome is Outcome.CANCELLED
    assert await pg_event_log.readers.readers(stream_name) == []


@pytest.mark.parametrize("retention", [3600.0, None])
async def test_a_connection_moves_its_retention_hold_only_when_a_retention_applies(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
    retention: float | None,
) -> None:
    """Issue 25: a hold moved every 20 s is a database write per connection (50 a second
    at a thousand streams); with no retention anywhere nothing is deleted, and the start's
    hold is all the fence needs."""
    monkeypatch.setattr(reports_module, "HOLD_INTERVAL", 0.1)
    source.add_stream(stream_name, SourceStreamConfig(rate=50, retry_ms=None))
    spec = make_spec(source.url(stream_name), stream_name, replay_window=1.0, retention=retention)
    env = ActivityEnvironment()
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0"))
    )
    try:
        await asyncio.sleep(3.0)  # reading for over a replay window: a hold could move
        (running,) = await pg_event_log.readers.readers(stream_name)
    finally:
        env.cancel()
        await task
    if retention is None:
        assert running.start_id == "0"
    else:
        assert int(running.start_id) > 0


async def test_a_stream_under_another_id_order_parks_before_it_connects(
    reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """Issue 24, item 1: its keys were made under ``numeric``; read under ``natural``
    (the default) every new id would key below the horizon and be dropped. The stream
    parks, naming both orders and what to do; nothing is asked of the server."""
    await retained(pg_event_log, stream_name)
    before = await stored_ids(pg_event_log, stream_name)
    async with CannedServer(events("41", "42")) as server:
        with pytest.raises(ApplicationError) as refused:
            await read(reader, make_spec(server.url, stream_name, id_order="natural"))
        assert server.requests == []
    error = refused.value
    assert error.type == "ConfigError" and error.non_retryable
    assert "id_order 'natural'" in error.message and "('numeric')" in error.message
    assert "start it with id_order = 'numeric'" in error.message
    assert await stored_ids(pg_event_log, stream_name) == before
    assert await pg_event_log.readers.readers(stream_name) == []


# -- heartbeats (issue 13, item 6) -----------------------------------------------------------


async def test_a_nudge_makes_a_quiet_connection_heartbeat_at_once(
    source: SSESource, pg_stores: Stores, redis_url: str, stream_name: str
) -> None:
    """A connection between its (4 s) heartbeats heartbeats as soon as a nudge for its
    stream arrives through Redis, which is when a requested cancellation reaches it."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0.1, paused=True))
    spec = make_spec(source.url(stream_name), stream_name)
    l2 = RedisCursors(redis_url)
    nudges, other_worker = Nudges(redis_url), Nudges(redis_url)
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats
    try:
        async with httpx.AsyncClient(follow_redirects=False) as http:
            reader = ReadActivities(http=http, stores=replace(pg_stores, l2=l2), nudges=nudges)
            task = asyncio.create_task(
                env.run(
                    reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0")
                )
            )
            assert await nudges.listener.wait_live(GUARD)
            assert reader.heartbeat_interval() == NUDGED_HEARTBEAT_INTERVAL
            # A connection still starting (no response head yet) keeps the short one
            # under a short timeout, and takes the long one when the timeout has room.
            assert reader.heartbeat_interval(streaming=False) == HEARTBEAT_INTERVAL
            assert reader.heartbeat_interval(streaming=False, timeout=LONG_TIMEOUT - 1) == (
                HEARTBEAT_INTERVAL
            )
            long = DEFAULT_HEARTBEAT_TIMEOUT
            assert reader.heartbeat_interval(streaming=False, timeout=long) == (
                long - HEARTBEAT_SLACK
            )
            await beats.wait_for(1)  # the start's heartbeat
            await asyncio.sleep(1.0)
            quiet = len(beats)
            assert await other_worker.publish(f"{stream_name}-other") >= 1  # not this stream
            assert await other_worker.publish(stream_name) >= 1
            async with asyncio.timeout(NUDGED_HEARTBEAT_INTERVAL / 2):
                await beats.wait_for(quiet + 1)
            assert nudges.delivered == 1
            env.cancel()
            result = await task
        assert result.outcome is Outcome.CANCELLED
    finally:
        await nudges.close()
        await other_worker.close()
        await l2.close()


async def test_without_redis_a_worker_hears_no_nudges_and_heartbeats_often() -> None:
    """Nudges are a shortcut: while they cannot arrive, cancellations come with the
    short heartbeats, as before nudges existed."""
    nudges = Nudges("redis://127.0.0.1:1/0", timeout=0.2)
    nudges.start()
    try:
        await asyncio.sleep(0.5)
        assert not nudges.live
        l2 = RedisCursors("redis://127.0.0.1:1/0")
        stores = Stores.open("sqlite://", l2=l2)
        async with httpx.AsyncClient() as http:
            reader = ReadActivities(http=http, stores=stores, nudges=nudges)
            assert reader.heartbeat_interval() == HEARTBEAT_INTERVAL
        await stores.close()
    finally:
        await nudges.close()


class Blocker:
    """A transaction kept open by the test so that the reader's database calls wait on its
    locks; ``waiting()`` counts the sessions that wait for it (asked on another
    connection: ``pg_stat_activity`` is a snapshot within a transaction)."""

    def __init__(self, pg_url: str) -> None:
        self.url = pg_url.replace("+psycopg", "")

    async def __aenter__(self) -> Blocker:
        self.holder = await psycopg.AsyncConnection.connect(self.url)
        self.watcher = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.holder.rollback()
        await self.holder.close()
        await self.watcher.close()

    async def hold(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        await self.holder.execute(sql, params)

    async def waiting(self) -> int:
        cursor = await self.watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
            (self.holder.info.backend_pid,),
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    async def until_waited_on(self) -> None:
        async with asyncio.timeout(GUARD):
            while not await self.waiting():
                await asyncio.sleep(0.02)


async def test_heartbeats_go_on_while_a_commit_waits_on_the_database(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    pg_url: str,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit stuck longer than the heartbeat timeout must not let Temporal start a
    second attempt while the first still holds the stream."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.05)
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=300, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name, batch_max_events=10)
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats
    task: asyncio.Task[ReadResult] | None = None
    try:
        async with Blocker(pg_url) as blocker:
            # Id 25 inserted and not committed: the reader's insert of the batch holding 25
            # waits for this transaction, and so do the batches after it.
            await blocker.hold(
                "INSERT INTO sse_events (stream, event_id, event_ord, follower_key, id_key, "
                "event_type, data, received_at) "
                "VALUES (%s, '25', 0, '', %s, 'tick', 'held', now())",
                (stream_name, sort_key("25", "numeric")),
            )
            task = asyncio.create_task(
                env.run(
                    reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0")
                )
            )
            await blocker.until_waited_on()
            blocked_at = len(beats)
            await beats.wait_for(blocked_at + 3)
            assert await blocker.waiting()  # those heartbeats came while the commit waited
            during = beats[blocked_at:]
        result = await task  # the transaction rolled back: the reader stores 25 itself
    finally:
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=GUARD)
    # They carry committed cursors only: never the batch that waits, nor any after it.
    assert all(beat["start_cursor"] == "0" and int(beat["cursor"]) < 25 for beat in during)
    assert result.outcome is Outcome.DROPPED
    assert result.counts == ReadCounts(events_read=300, new_rows=300)
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 300)


async def test_a_retried_attempt_heartbeats_its_start_while_the_store_is_slow(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    pg_url: str,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heartbeats while the start is read from the store repeat the dead attempt's
    details: a third attempt still starts where the first one did."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.05)
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=20, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    dead = asdict(
        ReadProgress(cursor="25", start_cursor="10", counts=ReadCounts(events_read=15, new_rows=15))
    )
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=[dead])
    task: asyncio.Task[ReadResult] | None = None
    try:
        async with Blocker(pg_url) as blocker:
            await blocker.hold("LOCK TABLE sse_checkpoints IN ACCESS EXCLUSIVE MODE")
            task = asyncio.create_task(
                env.run(reader.read_stream, ReadInput(spec=spec, route=Route.LIVE))
            )
            await blocker.until_waited_on()
            await beats.wait_for(3)
            assert await blocker.waiting()
            during = list(beats)
        result = await task
    finally:
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=GUARD)
    assert during == [dead] * len(during)
    assert (result.cursor_source, result.start_cursor, result.last_cursor) == ("retry", "10", "30")
    assert result.counts == ReadCounts(events_read=35, new_rows=35)
    assert await stored_ids(pg_event_log, stream_name) == numbers(11, 30)


async def test_a_cancelled_connection_stores_what_it_had_read_ahead(
    reader: ReadActivities,
    pg_event_log: Stores,
    pg_url: str,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, item 5: while a commit waits on the database the reader reads ahead, up
    to ``READ_AHEAD_CHUNKS``. A cancellation (a signal, the worker shutting down) stops
    reading; what was read from the socket by then is received, and is stored."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.05)
    sent = asyncio.Event()

    async def serve(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for first in range(1, 201, 20):
            writer.write(events(*numbers(first, first + 19)))
            await writer.drain()
            await asyncio.sleep(0.05)  # one chunk per write
        sent.set()
        with contextlib.suppress(Exception):
            await asyncio.sleep(GUARD)  # and stays open: nothing more
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/events"
    spec = make_spec(url, stream_name, batch_max_events=10)
    beats = Heartbeats()
    env = ActivityEnvironment()
    env.on_heartbeat = beats
    task: asyncio.Task[ReadResult] | None = None
    try:
        async with Blocker(pg_url) as blocker:
            # Id 25 inserted and not committed: the batch holding 25 waits, and with it
            # the reader once MAX_BATCHES_IN_FLIGHT batches wait; the rest is read ahead.
            await blocker.hold(
                "INSERT INTO sse_events (stream, event_id, event_ord, follower_key, id_key, "
                "event_type, data, received_at) "
                "VALUES (%s, '25', 0, '', %s, 'tick', 'held', now())",
                (stream_name, sort_key("25", "numeric")),
            )
            task = asyncio.create_task(
                env.run(reader.read_stream, ReadInput(spec=spec, route=Route.LIVE))
            )
            await blocker.until_waited_on()
            async with asyncio.timeout(GUARD):
                await sent.wait()
            await asyncio.sleep(0.5)  # the pump reads the last writes into its queue
            await beats.wait_for(len(beats) + 2)
            taken = beats[-1]["counts"]["events_read"]
            assert taken < 200, "nothing was left in the read-ahead queue: no test"
            env.cancel()
            await asyncio.sleep(0.3)
        result = await task  # the transaction rolled back: the reader stores 25 itself
    finally:
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=GUARD)
        server.close()
    assert result.outcome is Outcome.CANCELLED
    assert result.counts == ReadCounts(events_read=200, new_rows=200)
    assert result.last_cursor == "200"
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 200)
