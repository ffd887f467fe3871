"""Retention: the rules as plain functions, and the deletes on real PostgreSQL and SQLite.

The running-stream test (a real worker reading the demo source while checkpoint runs
delete) is in tests/test_retention_stream.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from activities.retention import RetentionActivities
from durable_sse.contracts import RetentionInput, StreamRef
from durable_sse.errors import ConfigError
from durable_sse.eventlog import EventLog, EventRecord
from durable_sse.gaps import Gap, GapChange
from durable_sse.retention import (
    HELD_BY_GAP,
    HELD_BY_LAGGING,
    HELD_BY_NO_LAGGING,
    effective_retention,
    parse_retention_setting,
    retention_fence,
)
from durable_sse.settings import Settings

T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def record(event_id: str, at: datetime, ordinal: int | None = 0, data: str = "x") -> EventRecord:
    return EventRecord(
        event_id=event_id, event_ord=ordinal, event_type="message", data=data, received_at=at
    )


def gap(stream: str, gap_id: str, start: str | None, end: str | None = None) -> Gap:
    return Gap(
        gap_id=gap_id,
        stream=stream,
        kind="comment",
        start_id=start,
        end_id=end,
        seen_at=T0.isoformat(),
    )


async def stored_ids(log: EventLog, stream: str) -> list[str]:
    def run() -> list[str]:
        with log.engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT event_id FROM sse_events WHERE stream = :s ORDER BY seq"),
                {"s": stream},
            )
            return [row[0] for row in rows]

    return await asyncio.to_thread(run)


async def minutely(log: EventLog, stream: str, ids: range, *, start: datetime = T0) -> None:
    """Store ids received one minute apart: id i at ``start + i minutes``."""
    await log.insert_batch(stream, "numeric", [record(str(i), start + i * MINUTE) for i in ids])


async def set_lagging(log: EventLog, stream: str, lagging: int, *, start: datetime = T0) -> None:
    """Move the lagging id to ``lagging`` (the newest id received a window before now)."""
    result = await log.advance_lagging(
        stream, "numeric", window=60.0, now=start + (lagging + 1) * MINUTE
    )
    assert result.lagging_id == str(lagging)


async def open_gap(log: EventLog, stream: str, start: str, end: str) -> None:
    change = GapChange(f"g-{stream}-{start}", opened=gap(stream, f"g-{stream}-{start}", start, end))
    await log.committed(log.submit_batch(stream, "numeric", [], gap_changes=[change]))


# -- the rules --------------------------------------------------------------------------


def test_a_streams_own_retention_wins_over_the_workers() -> None:
    assert effective_retention(7200.0, 3600.0, 600.0) == (7200.0, "stream")
    assert effective_retention(None, 3600.0, 600.0) == (3600.0, "worker")
    assert effective_retention(None, None, 600.0) == (None, None)
    # The worker's setting never undercuts a stream's replay window.
    assert effective_retention(None, 60.0, 600.0) == (600.0, "worker")


def test_the_fence_is_the_older_of_the_lagging_id_and_the_open_gaps() -> None:
    fence = retention_fence("50", [], "numeric")
    assert (fence.keep_from, fence.held_by) == ("50", HELD_BY_LAGGING)
    newer = gap("s", "a", "70", "80")
    fence = retention_fence("50", [newer], "numeric")
    assert (fence.keep_from, fence.held_by) == ("50", HELD_BY_LAGGING)
    older = gap("s", "b", "9", "12")  # numeric order: 9 < 50 although "9" > "50"
    fence = retention_fence("50", [newer, older], "numeric")
    assert (fence.keep_from, fence.held_by) == ("9", HELD_BY_GAP)
    closed = gap("s", "c", "1", "3")
    closed.state = "repaired"
    assert retention_fence("50", [closed], "numeric").keep_from == "50"
    startless = gap("s", "d", None)
    fence = retention_fence("50", [startless], "numeric")
    assert not fence.ids_deletable and fence.held_by == HELD_BY_GAP
    fence = retention_fence(None, [], "numeric")
    assert not fence.ids_deletable and fence.held_by == HELD_BY_NO_LAGGING


def test_the_worker_setting_is_validated_like_a_streams() -> None:
    assert parse_retention_setting(None) is None
    assert parse_retention_setting("  ") is None
    assert parse_retention_setting("7d") == 7 * 86400.0
    assert parse_retention_setting("3600") == 3600.0
    assert Settings.from_env({"DURABLE_SSE_RETENTION": "36h"}).retention == 36 * 3600.0
    assert Settings.from_env({}).retention is None
    for bad in ("30s", "0", "-1", "7 days", "forever", "true", "nan", "36501d"):
        with pytest.raises(ConfigError) as refused:
            Settings.from_env({"DURABLE_SSE_RETENTION": bad})
        message = str(refused.value)
        assert message.startswith(f"DURABLE_SSE_RETENTION = {bad!r}: expected a duration")
        assert "between 1m and 36500d" in message and "\n" not in message


# -- the deletes, on both databases -----------------------------------------------------


async def test_deletes_in_bounded_batches_and_never_at_or_after_the_lagging_id(
    event_log: EventLog, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    cutoff = T0 + 100 * MINUTE  # every row is older than this
    seen: list[int] = []

    async def between(deleted: int) -> None:
        seen.append(deleted)

    first = await event_log.apply_retention(
        stream_name, "numeric", cutoff=cutoff, batch_rows=10, max_batches=2, between=between
    )
    assert (first.deleted, first.batches, first.complete) == (20, 2, False)
    assert seen == [10]  # awaited between the two batches (the activity heartbeats there)
    assert (first.keep_from, first.held_by) == ("30", HELD_BY_LAGGING)
    assert (await stored_ids(event_log, stream_name))[0] == "21"

    second = await event_log.apply_retention(
        stream_name, "numeric", cutoff=cutoff, batch_rows=10, max_batches=5
    )
    assert (second.deleted, second.complete) == (9, True)
    assert await stored_ids(event_log, stream_name) == [str(i) for i in range(30, 41)]
    state = second.state
    assert (state.deleted_rows, state.horizon_id, state.oldest_kept_id) == (29, "29", "30")
    assert state.oldest_kept_at == T0 + 30 * MINUTE

    again = await event_log.apply_retention(stream_name, "numeric", cutoff=cutoff)
    assert (again.deleted, again.complete, again.state.deleted_rows) == (0, True, 29)


async def test_rows_younger_than_the_retention_stay(event_log: EventLog, stream_name: str) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    run = await event_log.apply_retention(
        stream_name, "numeric", cutoff=T0 + 12 * MINUTE + timedelta(seconds=30), batch_rows=5
    )
    assert run.deleted == 12 and run.complete
    assert (await stored_ids(event_log, stream_name))[0] == "13"


async def test_an_open_gap_keeps_its_start_row_and_everything_after(
    event_log: EventLog, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    # A gap recorded late, behind the lagging id: its start row must stay for the repair.
    await open_gap(event_log, stream_name, "8", "12")
    run = await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.keep_from, run.held_by) == (7, "8", HELD_BY_GAP)
    assert (await stored_ids(event_log, stream_name))[0] == "8"

    # The gap repaired: the lagging id holds the rest.
    change = GapChange(f"g-{stream_name}-8", close=True)
    await event_log.committed(
        event_log.submit_batch(stream_name, "numeric", [], gap_changes=[change])
    )
    run = await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.keep_from) == (22, "30")


async def test_re_sent_ids_older_than_the_horizon_stay_duplicates(
    event_log: EventLog, stream_name: str
) -> None:
    """A server that ignores Last-Event-ID re-sends ids retention deleted: without the
    horizon they would be stored again as new rows after every delete, for as long as
    its history holds them. They are duplicates, never new, never recovered; ids after
    the horizon, id-less events and a gap's missing ids are stored as ever."""
    await minutely(event_log, stream_name, range(1, 21))
    await set_lagging(event_log, stream_name, 10)
    await open_gap(event_log, stream_name, "15", "18")  # 16 and 17 never came
    await execute_delete(event_log, stream_name, ["16", "17"])
    run = await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.state.horizon_id) == (9, "9")

    later = T0 + 200 * MINUTE
    resent = await event_log.insert_batch(
        stream_name, "numeric", [record(str(i), later) for i in range(1, 15)]
    )
    assert (resent.new_rows, resent.duplicates) == (0, 14)
    # The repair of the gap: its rows are new and recovered, the horizon is far behind.
    gap_id = f"g-{stream_name}-15"
    repair = event_log.submit_batch(
        stream_name,
        "numeric",
        [record("16", later), record("17", later)],
        gap_changes=[GapChange(gap_id, recovered=True, reread_to="17")],
    )
    assert (await event_log.committed(repair)).new_rows == 2
    (open_record,) = [g for g in await event_log.gaps(stream_name) if g.gap_id == gap_id]
    assert open_record.recovered == 2
    fresh = await event_log.insert_batch(
        stream_name,
        "numeric",
        [
            record("9", later, ordinal=1, data="late follower"),
            record("", later, None),
            record("21", later),
        ],
    )
    assert (fresh.new_rows, fresh.duplicates) == (2, 1)  # the id-less event and 21
    ids = await stored_ids(event_log, stream_name)
    assert ids == [*map(str, range(10, 16)), "18", "19", "20", "16", "17", "", "21"]


async def test_batches_of_one_group_keep_their_order_when_the_horizon_drops_rows(
    event_log: EventLog, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 21))
    await set_lagging(event_log, stream_name, 10)
    await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    later = T0 + 200 * MINUTE
    first = [record(str(i), later) for i in [*range(1, 9), *range(100, 180)]]
    second = [record(str(i), later) for i in range(180, 260)]
    jobs = [event_log.submit_batch(stream_name, "numeric", rows) for rows in (first, second)]
    results = [await event_log.committed(job) for job in jobs]
    assert [(r.new_rows, r.duplicates) for r in results] == [(80, 8), (80, 0)]
    ids = await stored_ids(event_log, stream_name)
    assert ids == [str(i) for i in [*range(10, 21), *range(100, 260)]]


async def test_deletes_and_a_busy_writer_do_not_fail_each_other(
    event_log: EventLog, stream_name: str
) -> None:
    """A live stream keeps committing while the deletes run, on both databases: neither
    fails the other (SQLite has one writer at a time, and each batch is short)."""
    await event_log.insert_batch(
        stream_name,
        "numeric",
        [record(str(i), T0 + i * timedelta(seconds=1)) for i in range(1, 3001)],
    )
    moment = T0 + timedelta(seconds=2999.5) + MINUTE
    assert (
        await event_log.advance_lagging(stream_name, "numeric", window=60.0, now=moment)
    ).lagging_id == "2999"
    live = stream_name + "-live"

    async def write() -> int:
        stored = 0
        for n in range(40):
            rows = [record(str(n * 50 + i), datetime.now(UTC)) for i in range(50)]
            stored += (await event_log.insert_batch(live, "numeric", rows)).new_rows
            await asyncio.sleep(0)
        return stored

    writer = asyncio.create_task(write())
    run = await event_log.apply_retention(
        stream_name, "numeric", cutoff=T0 + 100 * MINUTE, batch_rows=100, max_batches=100
    )
    assert (run.deleted, run.complete) == (2998, True)
    assert await writer == 2000


async def execute_delete(log: EventLog, stream: str, ids: list[str]) -> None:
    """Remove rows as if never received (the hole a gap stands for)."""

    def run() -> None:
        with log.engine.begin() as connection:
            for event_id in ids:
                connection.execute(
                    sa.text("DELETE FROM sse_events WHERE stream = :s AND event_id = :e"),
                    {"s": stream, "e": event_id},
                )

    await asyncio.to_thread(run)


async def test_a_stream_without_a_lagging_id_keeps_its_ids(
    event_log: EventLog, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 6))
    run = await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.held_by) == (0, HELD_BY_NO_LAGGING)
    assert len(await stored_ids(event_log, stream_name)) == 5


async def test_a_stream_without_ids_loses_its_old_rows_only(
    event_log: EventLog, stream_name: str
) -> None:
    """Id-less rows are never replayed nor deduplicated: age alone decides."""
    rows = [record("", T0 + i * MINUTE, None, data=f"d{i}") for i in range(10)]
    await event_log.insert_batch(stream_name, "numeric", rows)
    run = await event_log.apply_retention(
        stream_name, "numeric", cutoff=T0 + 6 * MINUTE, batch_rows=4
    )
    assert (run.deleted, run.batches, run.complete) == (6, 2, True)
    assert len(await stored_ids(event_log, stream_name)) == 4


async def test_other_streams_are_untouched(event_log: EventLog, stream_name: str) -> None:
    other = stream_name + "-b"
    for name in (stream_name, other):
        await minutely(event_log, name, range(1, 11))
        await set_lagging(event_log, name, 8)
    run = await event_log.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert run.deleted == 7
    assert len(await stored_ids(event_log, other)) == 10
    assert (await event_log.retention_state(other)).deleted_rows == 0
    resent = await event_log.insert_batch(other, "numeric", [record("1", T0)])
    assert resent.duplicates == 1  # the other stream has no horizon: plain dedup


async def test_the_streams_own_retention_overrides_the_workers(
    event_log: EventLog, stream_name: str
) -> None:
    now = datetime.now(UTC)
    start = now - 300 * MINUTE
    await minutely(event_log, stream_name, range(1, 301), start=start)
    await set_lagging(event_log, stream_name, 280, start=start)
    worker = RetentionActivities(event_log, worker_retention=3 * 3600.0)
    ref = StreamRef(name=stream_name, id_order="numeric")

    own = await worker.apply_retention(
        RetentionInput(stream=ref, replay_window=600.0, retention=4 * 3600.0, now=now.isoformat())
    )
    # Kept: what arrived in the last 4 hours (ids 60 on).
    assert (own.retention, own.source, own.deleted_last_run) == (4 * 3600.0, "stream", 59)
    assert own.oldest_kept_id == "60"

    inherited = await worker.apply_retention(
        RetentionInput(stream=ref, replay_window=600.0, now=now.isoformat())
    )
    assert (inherited.retention, inherited.source) == (3 * 3600.0, "worker")
    assert (inherited.deleted_last_run, inherited.deleted_rows) == (60, 119)
    assert inherited.oldest_kept_id == "120" and inherited.keep_from == "280"
    assert inherited.horizon_id == "119" and inherited.complete

    forever = await RetentionActivities(event_log).apply_retention(
        RetentionInput(stream=ref, replay_window=600.0, now=now.isoformat())
    )
    assert forever.retention is None and forever.deleted_rows == 0


def test_the_status_line_names_the_consumer_groups_that_hold_rows() -> None:
    from durable_sse.retention import describe

    status = {"retention": 86400.0, "deleted_rows": 3, "held_by_consumers": ["billing"]}
    assert describe(status) == "1d: 3 deleted, held by consumers billing"
