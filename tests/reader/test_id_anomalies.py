"""Ids that misbehave, through the read activity: out of order, a restarted counter, reused
ids, ids past the retention horizon. Through ``ReadActivities.read_stream`` on the real
stores: see tests/reader/helpers.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from temporalio.runtime import MetricBuffer, Runtime
from temporalio.testing import ActivityEnvironment

from durable_sse.activities.read import ReadActivities
from durable_sse.contracts import (
    ReadCounts,
    Route,
)
from durable_sse.stores import Stores
from tests.reader.helpers import (
    CannedServer,
    events,
    make_spec,
    metric_total,
    read,
    retained,
    stored_ids,
)


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
    assert metric_total(buffer, "durable_sse_ids_out_of_order", stream_name) == out_of_order
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
    assert metric_total(buffer, "durable_sse_ids_reused", stream_name) == 5


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
    assert metric_total(buffer, "durable_sse_dropped_by_horizon", stream_name) == 3
    assert await pg_event_log.readers.readers(stream_name) == []
