"""The read activity as Temporal runs it: heartbeats and their details, retried attempts,
cancellation, nudges, and a connection's registration. Through
``ReadActivities.read_stream`` on the real stores: see tests/reader/helpers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

import durable_sse.reader.heartbeat_policy as heartbeat_policy
import durable_sse.reader.reports as reports_module
from durable_sse.activities.read import ReadActivities
from durable_sse.config.spec import DEFAULT_HEARTBEAT_TIMEOUT, StreamSpec, attempt_timeout
from durable_sse.contracts import (
    CONNECTION_MOVED,
    Outcome,
    ReadCounts,
    ReadInput,
    ReadProgress,
    ReadResult,
    Route,
)
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.ids import sort_key
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
from durable_sse.workflows.stream import READ_RETRY
from tests.reader.helpers import (
    GUARD,
    events,
    gap_rows,
    make_spec,
    numbers,
    query,
    read,
    stored,
    stored_ids,
    watched,
)

READ_HEARTBEAT_TIMEOUT = timedelta(seconds=10)


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
    # wrote), recorded by the retry. The retry re-read it from the gap's own start, and
    # the first id it met, 11, is the start's successor: no numeric id lies between, so
    # the history reaches the start. The retry re-read it continuously up to 44 (the last
    # CONFIRM_IDS ids wait for a late notice that never came, as the connection ended).
    # A repair resumes there, from one stored id before, and closes it once it reads one
    # id past it.
    (suspect,) = await gap_rows(pg_event_log, stream_name)
    assert (suspect["kind"], suspect["start_id"], suspect["notice_id"]) == ("retry", "10", "60")
    assert (suspect["state"], suspect["reread_to"]) == ("open", "44")
    known = [suspect["gap_id"]]
    source.inject(stream_name, disconnect_after=100)
    repair, _ = await read(reader, spec, route=Route.LAGGED, known_gaps=known)
    assert (repair.cursor_source, repair.start_cursor, repair.last_cursor) == ("gap", "43", "143")
    (closed,) = await gap_rows(pg_event_log, stream_name)
    assert (closed["state"], closed["missing"], closed["closed"]) == ("repaired", 0, True)

    # Never from before the lagging id: what lies before it is past the replay window.
    # The lagging id is the floor (143): one stored id before it, so that the first event
    # shows the history reaches it (simulation seed 729818868).
    await pg_event_log.checkpoints.advance_lagging(
        stream_name, "numeric", window=0, now=datetime.now(UTC)
    )
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=3, heartbeat_details=[last])
    bounded, _ = await read(reader, spec, env=env, route=Route.LIVE)
    assert (bounded.cursor_source, bounded.start_cursor, bounded.last_cursor) == (
        "lagging",
        "142",
        "242",
    )
    assert await stored_ids(pg_event_log, stream_name) == numbers(1, 242)


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
    env, beats = watched()
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


async def test_a_server_slow_to_answer_does_not_silence_heartbeats(
    reader: ReadActivities, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Response headers may take up to idle_timeout, longer than the heartbeat timeout:
    without heartbeats meanwhile Temporal would time the attempt out and retry it."""
    monkeypatch.setattr(heartbeat_policy, "HEARTBEAT_INTERVAL", 0.05)
    env, beats = watched()

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
        start_to_close_timeout=attempt_timeout(spec),
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
    assert running.expires_at > datetime.now(UTC) + attempt_timeout(spec)
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


async def test_a_nudge_makes_a_quiet_connection_heartbeat_at_once(
    source: SSESource, pg_stores: Stores, redis_url: str, stream_name: str
) -> None:
    """A connection between its (4 s) heartbeats heartbeats as soon as a nudge for its
    stream arrives through Redis, which is when a requested cancellation reaches it."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0.1, paused=True))
    spec = make_spec(source.url(stream_name), stream_name)
    l2 = RedisCursors(redis_url)
    nudges, other_worker = Nudges(redis_url), Nudges(redis_url)
    env, beats = watched()
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

    async def insert_uncommitted(self, stream: str, event_id: str) -> None:
        """Insert ``event_id`` and keep the transaction open: the reader's insert of the
        batch holding that id waits for it, and so do the batches after it."""
        await self.hold(
            "INSERT INTO sse_events (stream, event_id, event_ord, follower_key, id_key, "
            "event_type, data, received_at) "
            "VALUES (%s, %s, 0, '', %s, 'tick', 'held', now())",
            (stream, event_id, sort_key(event_id, "numeric")),
        )

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
    env, beats = watched()
    task: asyncio.Task[ReadResult] | None = None
    try:
        async with Blocker(pg_url) as blocker:
            # Id 25 inserted and not committed: the reader's insert of the batch holding 25
            # waits for this transaction, and so do the batches after it.
            await blocker.insert_uncommitted(stream_name, "25")
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
    env, beats = watched()
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
    env, beats = watched()
    task: asyncio.Task[ReadResult] | None = None
    try:
        async with Blocker(pg_url) as blocker:
            # Id 25 inserted and not committed: the batch holding 25 waits, and with it
            # the reader once MAX_BATCHES_IN_FLIGHT batches wait; the rest is read ahead.
            await blocker.insert_uncommitted(stream_name, "25")
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


async def test_a_connection_under_a_revoked_lease_ends_as_moved_without_a_traceback(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """The fence refuses a worker taken for dead (here at the connection's start): the
    attempt ends as a retry at once, and as a benign failure, which the SDK logs in one
    line (at SIGCONT a paused worker ends a hundred connections this way)."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    leases = pg_event_log.workers
    revoked = f"revoked-{uuid.uuid4().hex[:8]}"
    await leases.acquire(revoked, pool="test", host="elsewhere", pid=1, boot_id="b")
    assert await leases.revoke(revoked, by="watchdog", expired_only=False)
    before, reader.worker_lease = reader.worker_lease, lambda: revoked
    try:
        with pytest.raises(ApplicationError) as raised:
            await read(reader, spec)
    finally:
        reader.worker_lease = before
    error = raised.value
    assert error.type == CONNECTION_MOVED and not error.non_retryable
    assert error.category == ApplicationErrorCategory.BENIGN
    assert await stored_ids(pg_event_log, stream_name) == []


async def test_a_connection_starting_when_its_lease_is_revoked_ends_as_moved(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """At SIGCONT the pool ends the connections of the revoked lease by cancelling their
    tasks. One still starting (here: registering itself, the table locked, its lease
    still live as the registration reads it) escaped as a bare ``CancelledError``, a
    traceback in the worker's log each; it ends as moved, a benign retry, like one the
    fence stops at a commit."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    # Live in the database as the registration reads it: the revocation lands after.
    await pg_event_log.workers.acquire(lease, pool="test", host="here", pid=1, boot_id="b")
    before, reader.worker_lease = reader.worker_lease, lambda: lease
    blocker = await asyncio.to_thread(pg_event_log.database.engine.connect)
    try:
        await asyncio.to_thread(
            blocker.execute, sa.text("LOCK TABLE sse_readers IN ACCESS EXCLUSIVE MODE")
        )
        attempt = asyncio.create_task(read(reader, spec))
        await wait_until_a_session_waits_for(pg_event_log, "sse_readers")
        reader.pool.lease_revoked(lease)
        await asyncio.to_thread(blocker.rollback)
        with pytest.raises(ApplicationError) as raised:
            await asyncio.wait_for(attempt, GUARD)
    finally:
        reader.worker_lease = before
        await asyncio.to_thread(blocker.close)
    error = raised.value
    assert error.type == CONNECTION_MOVED and not error.non_retryable
    assert error.category == ApplicationErrorCategory.BENIGN


@pytest.mark.parametrize("known", ["renewal-found-out", "store-says", "ended-while-asking"])
async def test_a_commit_whose_session_the_revoker_ended_ends_as_moved(
    source: SSESource,
    reader: ReadActivities,
    pg_event_log: Stores,
    pg_url: str,
    stream_name: str,
    known: str,
) -> None:
    """At SIGCONT a paused worker's open transactions are gone: the worker that revoked
    its lease ended them (``log.sessions``). Each connection whose commit was among them
    failed with a ``StoreError``, a traceback in the log each (88 in one failover run);
    with its lease revoked it ends as moved, a benign retry, like a refused commit. Its
    worker's renewal may find out first, or not yet (the store says), or while the
    connection asks the store: its worker ends it then (615 tracebacks in one run)."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=40, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name, batch_max_events=10)
    lease = f"lease-{uuid.uuid4().hex[:8]}"
    await pg_event_log.workers.acquire(lease, pool="test", host="here", pid=1, boot_id="b")
    before, reader.worker_lease = reader.worker_lease, lambda: lease
    try:
        async with Blocker(pg_url) as blocker:
            await blocker.insert_uncommitted(stream_name, "5")
            attempt = asyncio.create_task(read(reader, spec))
            await blocker.until_waited_on()
            assert await pg_event_log.workers.revoke(lease, by="watchdog", expired_only=False)
            if known == "renewal-found-out":
                reader.pool.lease_revoked(lease)
            asking = threading.Event()
            if known == "ended-while-asking":  # the lease check waits for the store
                busy = asyncio.ensure_future(
                    reader.stores.workers.database.run("hold", asking.wait)
                )
            await blocker.hold(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE %s = ANY(pg_blocking_pids(pid))",
                (blocker.holder.info.backend_pid,),
            )
            if known == "ended-while-asking":
                await asyncio.sleep(1)
                assert not attempt.done()
                reader.pool.lease_revoked(lease)
                asking.set()
                await busy
            with pytest.raises(ApplicationError) as raised:
                await asyncio.wait_for(attempt, GUARD)
    finally:
        reader.worker_lease = before
    error = raised.value
    assert error.type == CONNECTION_MOVED and not error.non_retryable
    assert error.category == ApplicationErrorCategory.BENIGN
    assert "was revoked" in str(error)


async def wait_until_a_session_waits_for(log: Stores, table: str) -> None:
    """Until some session waits for a lock on ``table``."""
    statement = (
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = CAST(:t AS regclass)"
    )
    async with asyncio.timeout(GUARD):
        while not (await query(log, statement, t=table))[0][0]:
            await asyncio.sleep(0.01)


async def test_an_attempt_that_reached_a_revoked_worker_earlier_does_not_start(
    source: SSESource, reader: ReadActivities, pg_event_log: Stores, stream_name: str
) -> None:
    """A paused worker's polls took this retry while it was stopped, and the watchdog
    failed it again meanwhile; run after SIGCONT under the worker's new lease, it would
    read beside its successor. It goes on as a retry instead, having touched nothing."""
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0))
    spec = make_spec(source.url(stream_name), stream_name)
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, current_attempt_scheduled_time=datetime.now(UTC) - timedelta(seconds=30)
    )
    reader.pool.lease_revoked("revoked-worker")
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec, env=env)
    assert raised.value.type == CONNECTION_MOVED and not raised.value.non_retryable
    assert raised.value.category == ApplicationErrorCategory.BENIGN
    assert await pg_event_log.readers.readers(stream_name) == []
    assert await stored_ids(pg_event_log, stream_name) == []
    # one scheduled after the revocation starts as usual
    later = ActivityEnvironment()
    later.info = dataclasses.replace(
        later.info, current_attempt_scheduled_time=datetime.now(UTC) + timedelta(seconds=1)
    )
    result, _ = await read(reader, spec, env=later)
    assert result.last_cursor == "5"
