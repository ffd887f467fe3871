"""A connection through the read activity: where it resumes, what each HTTP answer does,
secrets, allowed hosts, and the limits on lines, events and ids. Through
``ReadActivities.read_stream`` on the real stores: see tests/reader/helpers.py.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from durable_sse.activities.read import ReadActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    DropReport,
    Outcome,
    ReadCounts,
    Route,
)
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.gaps.model import GapTotals
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests.reader.helpers import (
    CannedServer,
    events,
    gap_rows,
    make_spec,
    numbers,
    read,
    retained,
    stored,
    stored_ids,
)


def assert_progress(beats: list[dict[str, Any]], *, start: str | None, last: str) -> None:
    """Heartbeats carry ReadProgress: the start cursor, committed cursors only (never past
    the result's), moving forward, and counts that only grow."""
    assert beats, "no heartbeat"
    fields = {"cursor", "start_cursor", "first_id", "counts", "handed_over"}
    assert all(set(beat) == fields for beat in beats)
    assert not any(beat["handed_over"] for beat in beats)  # only a hand-over says so
    assert all(beat["start_cursor"] == start for beat in beats)
    assert beats[0]["cursor"] == start  # the connection heartbeats its start at once
    cursors = [int(beat["cursor"]) for beat in beats if beat["cursor"] is not None]
    assert cursors == sorted(cursors)
    assert all(int(start or 0) <= cursor <= int(last) for cursor in cursors)
    rows = [beat["counts"]["new_rows"] for beat in beats]
    assert rows == sorted(rows)


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
