"""Drop notices and the gaps a connection records, through the read activity. Through
``ReadActivities.read_stream`` on the real stores: see tests/reader/helpers.py.
"""

from __future__ import annotations

import logging

import pytest
from temporalio.runtime import MetricBuffer, Runtime
from temporalio.testing import ActivityEnvironment

from durable_sse.activities.read import ReadActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    RECORDED_GAP,
    DropReport,
    Outcome,
    ReadCounts,
    ReadResult,
    Route,
)
from durable_sse.gaps.model import GapTotals
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests.reader.helpers import (
    CannedServer,
    events,
    gap_rows,
    make_spec,
    metric_total,
    numbers,
    query,
    read,
    stored,
    stored_ids,
)

NOTICE = "dropping events: discarded 7 events (slow consumer)"


NO_CONTENT = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


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
    # stored before it, so the repair starts at the gap's start itself; the first id it
    # meets (2) is that id's successor, and no numeric id lies between the two: the
    # history reaches the gap. The source's standing drops only hit the live tail.
    source.inject(stream_name, drop_every=None, disconnect_after=150)
    repair, _ = await read(reader, spec, route=Route.LAGGED, known_gaps=[gap_id])
    assert (repair.cursor_source, repair.start_cursor, repair.last_cursor) == ("gap", "1", "151")
    assert repair.outcome is Outcome.DROPPED and repair.drop is None
    # 2..151 read: 101..107 recovered, 109..151 new, 2..100 and 108 already stored.
    assert repair.counts == ReadCounts(events_read=150, new_rows=50, duplicates=100, recovered=7)
    assert repair.gaps is not None and repair.gaps.open_ids == []
    assert repair.gaps.totals == GapTotals(repaired=1, events_recovered=7)
    [row] = await gap_rows(pg_event_log, stream_name)
    assert (row["state"], row["recovered"], row["missing"], row["closed"]) == (
        "repaired",
        7,
        0,
        True,
    )
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
    assert metric_total(buffer, "durable_sse_reconnects_without_cursor", stream_name) == 2


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
