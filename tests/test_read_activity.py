"""The read activity against the real demo SSE source, the real event log and Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.read as read_module
from activities.read import StreamReader
from durable_sse.contracts import DropKind, Outcome, ReadInput, ReadResult, Route
from durable_sse.eventlog import EventLog
from durable_sse.l1 import LocalCursors
from durable_sse.l2 import RedisCursors
from durable_sse.secrets import DeclaredSecrets, parse_secret_bindings
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.spec import StreamSpec

SECRET = "Bearer sup3r-s3cret-t0ken"


@pytest.fixture
async def source() -> AsyncIterator[SSESource]:
    async with SSESource() as running:
        yield running


@pytest.fixture
async def reader(pg_event_log: EventLog, redis_url: str) -> AsyncIterator[StreamReader]:
    l2 = RedisCursors(redis_url)
    async with httpx.AsyncClient(follow_redirects=False) as http:
        yield StreamReader(
            http=http,
            event_log=pg_event_log,
            l1=LocalCursors(),
            l2=l2,
            secrets=DeclaredSecrets(
                parse_secret_bindings("TEST_TOKEN@127.0.0.1"), environ={"TEST_TOKEN": SECRET}
            ),
        )
    await l2.close()


def make_spec(source: SSESource, name: str, **settings: object) -> StreamSpec:
    defaults: dict[str, object] = {"id_order": "numeric", "batch_max_delay": 0.02}
    defaults.update(settings)
    return StreamSpec(name=name, url=source.url(name), **defaults)  # type: ignore[arg-type]


async def read(
    reader: StreamReader, spec: StreamSpec, **fields: object
) -> tuple[ReadResult, list[dict]]:
    heartbeats: list[dict] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: heartbeats.append(details[0])
    result = await env.run(reader.read_stream, ReadInput(spec=spec, **fields))  # type: ignore[arg-type]
    return result, heartbeats


async def stored(log: EventLog, stream: str) -> list[tuple[str, int | None]]:
    def query() -> list[tuple[str, int | None]]:
        with log.engine.connect() as connection:
            rows = connection.execute(
                sa.text(
                    "SELECT event_id, event_ord FROM sse_events WHERE stream = :s ORDER BY seq"
                ),
                {"s": stream},
            )
            return [(row[0], row[1]) for row in rows]

    return await asyncio.to_thread(query)


def ids(rows: list[tuple[str, int | None]]) -> list[int]:
    return [int(event_id) for event_id, _ in rows]


async def test_resume_by_header_then_by_query_parameter(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=50, keepalive=0))
    spec = make_spec(source, stream_name)

    first, heartbeats = await read(reader, spec, route=Route.EXPLICIT, start_id="10")
    assert first.outcome is Outcome.DROPPED
    assert (first.start_cursor, first.first_id, first.last_cursor) == ("10", "11", "60")
    assert (first.events_read, first.new_rows, first.duplicates) == (50, 50, 0)
    # Heartbeats carry committed cursors only (none closes the connection: the result
    # carries the last one).
    assert heartbeats and all(10 <= int(beat["cursor"]) <= 60 for beat in heartbeats)

    by_query = dataclasses.replace(spec, cursor_param="cursor")
    second, _ = await read(reader, by_query, route=Route.LIVE)
    assert second.cursor_source == "l1"
    assert (second.start_cursor, second.first_id, second.last_cursor) == ("60", "61", "110")
    assert ids(await stored(pg_event_log, stream_name)) == list(range(11, 111))
    assert await reader.l2.get(stream_name) in ("60", "110")  # L2 is asynchronous
    await reader.l2.flush()
    assert await reader.l2.get(stream_name) == "110"


async def test_replayed_events_are_stored_once(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=30, keepalive=0))
    spec = make_spec(source, stream_name)
    await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    again, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="10", fence_id="40")
    assert (again.new_rows, again.duplicates) == (10, 20)
    assert again.passed_fence and again.recovered_rows == 10
    assert ids(await stored(pg_event_log, stream_name)) == list(range(1, 41))


async def test_drop_notice_ends_connection_with_position_and_loses_nothing(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(
        stream_name,
        SourceStreamConfig(rate=0, drop_every=100, drop_count=7, keepalive=0),
    )
    spec = make_spec(source, stream_name)
    result, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.outcome is Outcome.DROP_SIGNAL
    assert result.drop_kind is DropKind.COMMENT
    assert result.dropped_estimate == 7
    # The connection reads on to the first event after the notice: it bounds the hole.
    assert result.drop_position == "108" == result.last_cursor
    assert ids(await stored(pg_event_log, stream_name)) == [*range(1, 101), 108]
    assert source.truth(stream_name).dropped[0] == (101, 107)

    # The replay from before the hole re-delivers it; the batch split makes the count exact.
    source.inject(stream_name, drop_every=None, disconnect_after=100_000)
    replay, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="90", fence_id="108")
    assert replay.passed_fence
    assert replay.outcome is Outcome.ROTATED  # ends once past the fence: the workflow clears it
    assert replay.recovered_rows == 7
    stored_ids = sorted(ids(await stored(pg_event_log, stream_name)))
    assert stored_ids == list(range(1, stored_ids[-1] + 1)) and stored_ids[-1] >= 108


async def test_keepalives_do_not_end_the_connection_and_cancel_flushes(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=5, keepalive=0.1))
    spec = make_spec(source, stream_name, idle_timeout=1.0, batch_max_delay=30.0)
    source.inject(stream_name, action="pause")
    env = ActivityEnvironment()
    task = asyncio.create_task(
        env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0"))
    )
    await asyncio.sleep(2.0)  # twice the idle timeout: only keep-alives arrive
    assert not task.done()
    env.cancel()
    result = await task
    assert result.outcome is Outcome.CANCELLED
    assert result.events_read == 0


async def test_cancel_mid_batch_loses_nothing(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=200, keepalive=0))
    spec = make_spec(source, stream_name, batch_max_events=100_000, batch_max_delay=60.0)
    env = ActivityEnvironment()
    task = asyncio.create_task(env.run(reader.read_stream, ReadInput(spec=spec, route=Route.LIVE)))
    while (
        not (await stored(pg_event_log, stream_name)) and source.truth(stream_name).generated < 50
    ):
        await asyncio.sleep(0.1)
    assert await stored(pg_event_log, stream_name) == []  # nothing flushed yet: batch pending
    env.cancel()
    result = await task
    assert result.outcome is Outcome.CANCELLED
    rows = await stored(pg_event_log, stream_name)
    assert result.events_read > 0
    assert len(rows) == result.events_read == result.new_rows
    assert str(ids(rows)[-1]) == result.last_cursor


async def test_idle_timeout_is_a_plain_drop(
    source: SSESource, reader: StreamReader, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, keepalive=0, paused=True))
    result, _ = await read(reader, make_spec(source, stream_name, idle_timeout=0.5))
    assert result.outcome is Outcome.DROPPED
    assert "idle timeout" in (result.error or "")


async def test_204_stops(source: SSESource, reader: StreamReader, stream_name: str) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", code=204)
    result, _ = await read(reader, make_spec(source, stream_name))
    assert result.outcome is Outcome.NO_CONTENT


async def test_429_honours_retry_after(
    source: SSESource, reader: StreamReader, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", code=429, retry_after=7)
    result, _ = await read(reader, make_spec(source, stream_name))
    assert result.outcome is Outcome.RETRY_LATER
    assert (result.status_code, result.retry_after) == (429, 7.0)


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
    reader: StreamReader,
    stream_name: str,
    caplog: pytest.LogCaptureFixture,
    fault: dict,
    expected: str,
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    source.inject(stream_name, action="status", **fault)
    spec = make_spec(source, stream_name, headers_from_env={"Authorization": "TEST_TOKEN"})
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert raised.value.non_retryable
    assert raised.value.type == "StreamRefusedError"
    assert expected in raised.value.message
    assert "sup3r" not in raised.value.message
    assert "sup3r" not in caplog.text


async def test_missing_secret_variable_is_named(
    source: SSESource, reader: StreamReader, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    spec = make_spec(source, stream_name, headers_from_env={"Authorization": "NOT_SET_VAR"})
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert raised.value.non_retryable and raised.value.type == "ConfigError"
    assert "NOT_SET_VAR" in raised.value.message


async def test_secret_header_is_sent_but_never_returned(
    source: SSESource, reader: StreamReader, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=3))
    spec = make_spec(source, stream_name, headers_from_env={"Authorization": "TEST_TOKEN"})
    caplog.set_level(logging.DEBUG)
    result, heartbeats = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.events_read == 3
    assert "sup3r" not in repr(result) + repr(heartbeats) + caplog.text


async def test_unreachable_server_is_retry_later(reader: StreamReader, stream_name: str) -> None:
    spec = StreamSpec(
        name=stream_name, url="http://127.0.0.1:9/streams/x?token=abc", connect_timeout=2
    )
    result, _ = await read(reader, spec)
    assert result.outcome is Outcome.RETRY_LATER
    assert "127.0.0.1:9" in (result.error or "") and "abc" not in (result.error or "")


async def test_a_huge_line_ends_at_the_cap(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=10, keepalive=0))
    spec = make_spec(source, stream_name)
    source.inject(stream_name, action="oversized", bytes=64 * 1024 * 1024)
    result, _ = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.outcome is Outcome.DROPPED
    assert "max_line_bytes" in (result.error or "") or "1048576" in (result.error or "")
    rows = await stored(pg_event_log, stream_name)
    assert result.last_cursor == (str(ids(rows)[-1]) if rows else "0")


async def test_malformed_bytes_do_not_crash_and_lose_nothing(
    source: SSESource, reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=20, keepalive=0))
    source.inject(stream_name, action="malformed")
    result, _ = await read(
        reader, make_spec(source, stream_name), route=Route.EXPLICIT, start_id="0"
    )
    assert result.outcome is Outcome.DROPPED
    stored_ids = [event_id for event_id, _ in await stored(pg_event_log, stream_name)]
    assert [int(i) for i in stored_ids if i.isdigit()][-1] == 20
    assert set(range(1, 21)) <= {int(i) for i in stored_ids if i.isdigit()}


async def test_events_without_ids_are_kept_apart(
    reader: StreamReader, pg_event_log: EventLog, stream_name: str
) -> None:
    body = b"id: 7\ndata: a\n\ndata: b\n\ndata: c\n\nid\ndata: d\n\ndata: e\n\n"

    async def handle(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader_.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    spec = StreamSpec(name=stream_name, url=f"http://127.0.0.1:{port}/", batch_max_delay=0.01)
    async with server:
        await read(reader, spec)
        await read(reader, spec)  # delivered twice: id-carrying events dedupe, id-less ones do not
    rows = await stored(pg_event_log, stream_name)
    assert rows[:5] == [("7", 0), ("7", 1), ("7", 2), ("", None), ("", None)]
    assert rows[5:] == [("", None), ("", None)]


async def test_query_secret_is_sent_from_the_environment_and_never_returned(
    source: SSESource, reader: StreamReader, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=3))
    spec = make_spec(source, stream_name, query_from_env={"access": "TEST_TOKEN"})
    caplog.set_level(logging.DEBUG)
    result, heartbeats = await read(reader, spec, route=Route.EXPLICIT, start_id="0")
    assert result.events_read == 3
    assert "sup3r" not in repr(result) + repr(heartbeats) + caplog.text
    source.inject(stream_name, action="status", code=401)
    with pytest.raises(ApplicationError) as raised:
        await read(reader, spec)
    assert "sup3r" not in raised.value.message + caplog.text


async def test_hosts_outside_the_allowlist_are_refused(
    source: SSESource, reader: StreamReader, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0))
    guarded = StreamReader(
        http=reader.http,
        event_log=reader.event_log,
        l1=reader.l1,
        l2=reader.l2,
        allowed_hosts=("events.example.com",),
    )
    with pytest.raises(ApplicationError) as raised:
        await read(guarded, make_spec(source, stream_name))
    assert raised.value.non_retryable and raised.value.type == "ConfigError"
    assert "SSE_ALLOWED_HOSTS" in raised.value.message and "'url'" in raised.value.message


async def test_a_server_slow_to_answer_does_not_silence_heartbeats(
    reader: StreamReader, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Response headers may take up to idle_timeout, longer than the heartbeat timeout:
    without heartbeats meanwhile Temporal would time the attempt out and retry it."""
    monkeypatch.setattr(read_module, "HEARTBEAT_INTERVAL", 0.1)

    async def answer_late(reader_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader_.readuntil(b"\r\n\r\n")
        await asyncio.sleep(1.0)
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
        result, heartbeats = await read(reader, spec)
    finally:
        server.close()
        await server.wait_closed()
    assert result.outcome == Outcome.DROPPED and result.new_rows == 1
    waiting = [beat for beat in heartbeats if beat["events_read"] == 0]
    assert len(waiting) >= 5, heartbeats
