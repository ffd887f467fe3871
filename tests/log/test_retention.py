"""Retention: the rules as plain functions, and the deletes on real PostgreSQL and SQLite.

The running-stream test (a real worker reading the demo source while checkpoint runs
delete) is in tests/system/test_retention_stream.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.activities.retention import RetentionActivities
from durable_sse.config.durations import effective_retention, parse_retention_setting
from durable_sse.config.settings import Settings
from durable_sse.contracts import AdvanceInput, RetentionInput, StreamRef
from durable_sse.cursor.fence import RunningReader, live_starts, retention_fence
from durable_sse.cursor.readers import ReaderLease, reader_expiry
from durable_sse.errors import ConfigError, IdOrderMismatchError
from durable_sse.gaps.model import GapChange, GapRecord
from durable_sse.gaps.transitions import opening_past_horizon
from durable_sse.log.records import EventRecord
from durable_sse.log.retention import (
    HELD_BY_GAP,
    HELD_BY_LAGGING,
    HELD_BY_NO_LAGGING,
    HELD_BY_READER,
    after_horizon,
    check_id_order,
    choose_deletions,
)
from durable_sse.stores import Stores
from tests.log.helpers import event_ids
from tests.sim.stores import MemoryEventLog

T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
FAR = T0 + 1000 * MINUTE
"""A cutoff every row of these tests is older than."""


def lease(name: str = "reader", *, expires_in: timedelta = timedelta(hours=1)) -> ReaderLease:
    return ReaderLease(name, datetime.now(UTC) + expires_in)


def record(event_id: str, at: datetime, ordinal: int | None = 0, data: str = "x") -> EventRecord:
    return EventRecord(
        event_id=event_id, event_ord=ordinal, event_type="message", data=data, received_at=at
    )


def gap(stream: str, gap_id: str, start: str | None, end: str | None = None) -> GapRecord:
    return GapRecord(
        gap_id=gap_id,
        stream=stream,
        kind="comment",
        start_id=start,
        end_id=end,
        seen_at=T0.isoformat(),
    )


async def minutely(log: Stores, stream: str, ids: range, *, start: datetime = T0) -> None:
    """Store ids received one minute apart: id i at ``start + i minutes``."""
    await log.writer.insert_batch(
        stream, "numeric", [record(str(i), start + i * MINUTE) for i in ids]
    )


async def set_lagging(log: Stores, stream: str, lagging: int, *, start: datetime = T0) -> None:
    """Move the lagging id to ``lagging`` (the newest id received a window before now)."""
    result = await log.checkpoints.advance_lagging(
        stream, "numeric", window=60.0, now=start + (lagging + 1) * MINUTE
    )
    assert result.lagging_id == str(lagging)


async def open_gap(log: Stores, stream: str, start: str, end: str) -> None:
    change = GapChange(f"g-{stream}-{start}", opened=gap(stream, f"g-{stream}-{start}", start, end))
    await log.writer.committed(log.writer.submit_batch(stream, "numeric", [], gap_changes=[change]))


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


def test_running_connections_hold_the_fence_at_their_start() -> None:
    fence = retention_fence("50", [gap("s", "a", "40", "45")], "numeric", ["30", "60"])
    assert (fence.keep_from, fence.held_by) == ("30", HELD_BY_READER)
    fence = retention_fence("50", [gap("s", "a", "20", "45")], "numeric", ["30"])
    assert (fence.keep_from, fence.held_by) == ("20", HELD_BY_GAP)
    # A connection with no cursor reads from its first id: it keeps every id.
    fence = retention_fence("50", [], "numeric", [None])
    assert not fence.ids_deletable and fence.held_by == HELD_BY_READER
    # No lagging id: nothing with an id goes anyway.
    assert retention_fence(None, [], "numeric", ["30"]).held_by == HELD_BY_NO_LAGGING
    now = T0
    readers = [
        RunningReader("old", "10", now - MINUTE),
        RunningReader("running", "30", now + MINUTE),
        RunningReader("cursorless", None, now + MINUTE),
    ]
    assert live_starts(readers, now) == ["30", None]


def test_a_registration_outlives_everything_its_attempt_can_write() -> None:
    """The attempt's own timeout, then a heartbeat timeout and the retry's longest wait
    before a retry registers anew, and a margin for the flush of a timed-out attempt."""
    expires = reader_expiry(
        T0,
        attempt_timeout=timedelta(seconds=3715),
        heartbeat_timeout=timedelta(seconds=10),
        retry_interval=timedelta(seconds=30),
    )
    assert T0 + timedelta(seconds=3715 + 10 + 30) < expires <= T0 + timedelta(minutes=70)
    assert reader_expiry(T0, attempt_timeout=timedelta(seconds=5)) > T0 + timedelta(seconds=5)


def test_a_batch_deletes_old_rows_before_the_fence_and_stops_at_a_young_one() -> None:
    def key(n: int) -> bytes:
        return str(n).encode()

    rows = [
        (1, key(1), T0),
        (2, None, T0),  # no id: age alone decides
        (3, key(7), T0),  # at the fence: stays
        (4, key(2), T0),
        (5, key(3), T0 + 10 * MINUTE),  # young: the walk stops here
        (6, key(4), T0),
    ]
    choice = choose_deletions(
        rows, after=None, fence_key=key(7), cutoff=T0 + MINUTE, limit=len(rows)
    )
    assert (choice.last_seq, choice.doomed, choice.newest_key, choice.done) == (4, 3, key(2), True)
    first = choose_deletions(rows[:2], after=None, fence_key=key(7), cutoff=FAR, limit=2)
    assert (first.last_seq, first.doomed, first.done) == (2, 2, False)  # more to look at
    assert choose_deletions([], after=9, fence_key=None, cutoff=FAR, limit=5).last_seq == 9


def test_the_horizon_lets_through_only_ids_after_it_and_rows_without_one() -> None:
    assert after_horizon(b"b", b"a") and after_horizon(None, b"z") and after_horizon(b"a", None)
    assert not after_horizon(b"a", b"a") and not after_horizon(b"a", b"b")


def test_an_opening_behind_the_horizon_is_moved_to_it() -> None:
    behind = GapChange("g", opened=gap("s", "g", "5", "40"), contiguous=True)
    behind.opened.announced = 34  # type: ignore[union-attr]
    moved = opening_past_horizon(behind, "29", "numeric")
    assert moved is not None and moved.opened is not None
    assert (moved.opened.start_id, moved.opened.end_id, moved.opened.announced) == ("29", "40", 10)
    assert behind.opened.start_id == "5"  # type: ignore[union-attr]  # a copy
    # Wholly at or before the horizon: nothing to record.
    assert (
        opening_past_horizon(GapChange("h", opened=gap("s", "h", "5", "20")), "29", "numeric")
        is None
    )
    # After it, without a start, or without a horizon: as it is.
    after = GapChange("i", opened=gap("s", "i", "30", "40"))
    assert opening_past_horizon(after, "29", "numeric") is after
    startless = GapChange("j", opened=gap("s", "j", None, "40"))
    assert opening_past_horizon(startless, "29", "numeric") is startless
    assert opening_past_horizon(behind, None, "numeric") is behind
    plain = GapChange("g", close=True)
    assert opening_past_horizon(plain, "29", "numeric") is plain


def test_another_id_order_is_refused_naming_both_and_what_to_do() -> None:
    check_id_order("s", stored=None, wanted="natural")  # nothing recorded yet: a new stream
    check_id_order("s", stored="numeric", wanted="numeric")
    with pytest.raises(IdOrderMismatchError) as refused:
        check_id_order("ticks", stored="numeric", wanted="natural")
    message = str(refused.value)
    assert "id_order 'natural'" in message and "('numeric')" in message
    assert "start it with id_order = 'numeric'" in message and "new name" in message
    assert isinstance(refused.value, ConfigError)
    assert (refused.value.stored, refused.value.wanted) == ("numeric", "natural")


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


async def test_deletes_in_bounded_batches_and_never_the_lagging_id_nor_the_row_before(
    event_log: Stores, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    cutoff = T0 + 100 * MINUTE  # every row is older than this
    seen: list[int] = []

    async def between(deleted: int) -> None:
        seen.append(deleted)

    first = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=cutoff, batch_rows=10, max_batches=2, between=between
    )
    assert (first.deleted, first.batches, first.complete) == (20, 2, False)
    assert seen == [10]  # awaited between the two batches (the activity heartbeats there)
    assert (first.keep_from, first.held_by) == ("30", HELD_BY_LAGGING)
    assert (await event_ids(event_log, stream_name))[0] == "21"

    second = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=cutoff, batch_rows=10, max_batches=5
    )
    assert (second.deleted, second.complete) == (8, True)
    # The row before the fence stays too: a repair of a gap there would start from it.
    assert await event_ids(event_log, stream_name) == [str(i) for i in range(29, 41)]
    state = second.state
    assert (state.deleted_rows, state.horizon_id, state.oldest_kept_id) == (28, "28", "29")
    assert state.oldest_kept_at == T0 + 29 * MINUTE

    again = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=cutoff)
    assert (again.deleted, again.complete, again.state.deleted_rows) == (0, True, 28)


async def test_rows_younger_than_the_retention_stay(event_log: Stores, stream_name: str) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    run = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=T0 + 12 * MINUTE + timedelta(seconds=30), batch_rows=5
    )
    assert run.deleted == 12 and run.complete
    assert (await event_ids(event_log, stream_name))[0] == "13"


async def test_an_open_gap_keeps_its_start_row_the_row_before_and_everything_after(
    event_log: Stores, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    # A gap recorded late, behind the lagging id: its start row must stay for the repair.
    await open_gap(event_log, stream_name, "8", "12")
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.keep_from, run.held_by) == (6, "8", HELD_BY_GAP)
    assert (await event_ids(event_log, stream_name))[0] == "7"
    # The row before it stays too: the repair starts there, so that its first event
    # shows whether the server's history still reaches the gap (the witness is 8).
    repair = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none", repair=True
    )
    assert (repair.cursor, repair.source, repair.context.witness) == ("7", "gap", "8")

    # The gap repaired: the lagging id holds the rest.
    change = GapChange(f"g-{stream_name}-8", close=True)
    await event_log.writer.committed(
        event_log.writer.submit_batch(stream_name, "numeric", [], gap_changes=[change])
    )
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.keep_from) == (22, "30")


async def test_re_sent_ids_older_than_the_horizon_are_dropped_and_counted_apart(
    event_log: Stores, stream_name: str
) -> None:
    """A server that ignores Last-Event-ID re-sends ids retention deleted: without the
    horizon they would be stored again as new rows after every delete, for as long as
    its history holds them. They are dropped, never new, never recovered, and counted
    apart (``dropped_by_horizon``, not ``duplicates``: an id there may never have been
    stored); ids after the horizon, id-less events and a gap's missing ids are stored as
    ever."""
    await minutely(event_log, stream_name, range(1, 21))
    await set_lagging(event_log, stream_name, 10)
    await open_gap(event_log, stream_name, "15", "18")  # 16 and 17 never came
    await execute_delete(event_log, stream_name, ["16", "17"])
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.state.horizon_id) == (8, "8")

    later = T0 + 200 * MINUTE
    resent = await event_log.writer.insert_batch(
        stream_name, "numeric", [record(str(i), later) for i in range(1, 15)]
    )
    # 9..14 are stored: duplicates; 1..8 were deleted: the horizon drops them.
    assert (resent.new_rows, resent.duplicates, resent.dropped_by_horizon) == (0, 6, 8)
    assert (resent.dropped_id, resent.horizon_id) == ("1", "8")
    # The repair of the gap: its rows are new and recovered, the horizon is far behind.
    gap_id = f"g-{stream_name}-15"
    repair = event_log.writer.submit_batch(
        stream_name,
        "numeric",
        [record("16", later), record("17", later)],
        gap_changes=[GapChange(gap_id, recovered=True, reread_to="17")],
    )
    assert (await event_log.writer.committed(repair)).new_rows == 2
    (open_record,) = [g for g in await event_log.gap_store.gaps(stream_name) if g.gap_id == gap_id]
    assert open_record.recovered == 2
    fresh = await event_log.writer.insert_batch(
        stream_name,
        "numeric",
        [
            record("8", later, ordinal=1, data="late follower"),
            record("", later, None),
            record("21", later),
        ],
    )
    # The id-less event and 21 are new; a follower of the deleted id 8 is dropped.
    assert (fresh.new_rows, fresh.duplicates, fresh.dropped_by_horizon) == (2, 0, 1)
    ids = await event_ids(event_log, stream_name)
    assert ids == [*map(str, range(9, 16)), "18", "19", "20", "16", "17", "", "21"]


async def test_batches_of_one_group_keep_their_order_when_the_horizon_drops_rows(
    event_log: Stores, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 21))
    await set_lagging(event_log, stream_name, 10)
    await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    later = T0 + 200 * MINUTE
    first = [record(str(i), later) for i in [*range(1, 9), *range(100, 180)]]
    second = [record(str(i), later) for i in range(180, 260)]
    jobs = [event_log.writer.submit_batch(stream_name, "numeric", rows) for rows in (first, second)]
    results = [await event_log.writer.committed(job) for job in jobs]
    assert [(r.new_rows, r.duplicates, r.dropped_by_horizon) for r in results] == [
        (80, 0, 8),
        (80, 0, 0),
    ]
    ids = await event_ids(event_log, stream_name)
    assert ids == [str(i) for i in [*range(9, 21), *range(100, 260)]]


async def test_deletes_and_a_busy_writer_do_not_fail_each_other(
    event_log: Stores, stream_name: str
) -> None:
    """A live stream keeps committing while the deletes run, on both databases: neither
    fails the other (SQLite has one writer at a time, and each batch is short)."""
    await event_log.writer.insert_batch(
        stream_name,
        "numeric",
        [record(str(i), T0 + i * timedelta(seconds=1)) for i in range(1, 3001)],
    )
    moment = T0 + timedelta(seconds=2999.5) + MINUTE
    assert (
        await event_log.checkpoints.advance_lagging(stream_name, "numeric", window=60.0, now=moment)
    ).lagging_id == "2999"
    live = stream_name + "-live"

    async def write() -> int:
        stored = 0
        for n in range(40):
            rows = [record(str(n * 50 + i), datetime.now(UTC)) for i in range(50)]
            stored += (await event_log.writer.insert_batch(live, "numeric", rows)).new_rows
            await asyncio.sleep(0)
        return stored

    writer = asyncio.create_task(write())
    run = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=T0 + 100 * MINUTE, batch_rows=100, max_batches=100
    )
    assert (run.deleted, run.complete) == (2997, True)
    assert await writer == 2000


async def execute_delete(log: Stores, stream: str, ids: list[str]) -> None:
    """Remove rows as if never received (the hole a gap stands for)."""

    def run() -> None:
        with log.database.engine.begin() as connection:
            for event_id in ids:
                connection.execute(
                    sa.text("DELETE FROM sse_events WHERE stream = :s AND event_id = :e"),
                    {"s": stream, "e": event_id},
                )

    await asyncio.to_thread(run)


async def test_a_stream_without_a_lagging_id_keeps_its_ids(
    event_log: Stores, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 6))
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert (run.deleted, run.held_by) == (0, HELD_BY_NO_LAGGING)
    assert len(await event_ids(event_log, stream_name)) == 5


async def test_a_stream_without_ids_loses_its_old_rows_only(
    event_log: Stores, stream_name: str
) -> None:
    """Id-less rows are never replayed nor deduplicated: age alone decides."""
    rows = [record("", T0 + i * MINUTE, None, data=f"d{i}") for i in range(10)]
    await event_log.writer.insert_batch(stream_name, "numeric", rows)
    run = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=T0 + 6 * MINUTE, batch_rows=4
    )
    assert (run.deleted, run.batches, run.complete) == (6, 2, True)
    assert len(await event_ids(event_log, stream_name)) == 4


async def test_other_streams_are_untouched(event_log: Stores, stream_name: str) -> None:
    other = stream_name + "-b"
    for name in (stream_name, other):
        await minutely(event_log, name, range(1, 11))
        await set_lagging(event_log, name, 8)
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=T0 + 100 * MINUTE)
    assert run.deleted == 6
    assert len(await event_ids(event_log, other)) == 10
    assert (await event_log.prune.retention_state(other)).deleted_rows == 0
    resent = await event_log.writer.insert_batch(other, "numeric", [record("1", T0)])
    assert resent.duplicates == 1  # the other stream has no horizon: plain dedup


async def test_the_streams_own_retention_overrides_the_workers(
    event_log: Stores, stream_name: str
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


# -- issue 24: the order, running connections, gaps mid-run, what the horizon drops -------


async def retained(log: Stores, stream: str, order: str) -> None:
    """Ids 1..40 stored under ``order``, the lagging id at 30, and 1..28 deleted."""
    await log.writer.insert_batch(
        stream, order, [record(str(i), T0 + i * MINUTE) for i in range(1, 41)]
    )
    moved = await log.checkpoints.advance_lagging(stream, order, window=60.0, now=T0 + 31 * MINUTE)
    assert moved.lagging_id == "30"
    run = await log.prune.apply_retention(stream, order, cutoff=FAR)
    assert (run.deleted, run.state.horizon_id) == (28, "28")


@pytest.mark.parametrize(("stored", "other"), [("numeric", "natural"), ("natural", "numeric")])
async def test_a_stream_under_another_id_order_is_refused_and_nothing_changes(
    event_log: Stores, stream_name: str, stored: str, other: str
) -> None:
    """Issue 24, item 1. numeric -> natural: every digit id keys below the numeric horizon
    and would be dropped as seen; natural -> numeric: the fence keys above every stored
    key and a run would delete from the lagging id on. Neither is ever compared: the
    connection, the checkpoint and the retention run under the other order are refused
    and change nothing."""
    await retained(event_log, stream_name, stored)
    before = (
        await event_ids(event_log, stream_name),
        await event_log.checkpoints.get_checkpoint(stream_name),
        await event_log.prune.retention_state(stream_name),
    )
    with pytest.raises(IdOrderMismatchError) as refused:
        await event_log.starts.connection_context(stream_name, other, cursor=None, source="none")
    assert f"id_order {other!r}" in str(refused.value)
    assert f"start it with id_order = {stored!r}" in str(refused.value)
    with pytest.raises(IdOrderMismatchError):
        await event_log.checkpoints.advance_lagging(stream_name, other, window=60.0, now=FAR)
    with pytest.raises(IdOrderMismatchError):
        await event_log.prune.apply_retention(stream_name, other, cutoff=FAR + 1000 * MINUTE)
    after = (
        await event_ids(event_log, stream_name),
        await event_log.checkpoints.get_checkpoint(stream_name),
        await event_log.prune.retention_state(stream_name),
    )
    assert after == before
    assert before[0] == [str(i) for i in range(29, 41)]
    # Under its own order the stream goes on as ever.
    start = await event_log.starts.connection_context(
        stream_name, stored, cursor=None, source="none"
    )
    assert start.cursor == "30"


async def test_the_checkpoint_activities_refuse_another_order_loudly(
    event_log: Stores, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    await retained(event_log, stream_name, "numeric")
    ref = StreamRef(name=stream_name, id_order="natural")
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as advance:
        await env.run(
            CheckpointActivities(event_log).advance_checkpoint,
            AdvanceInput(stream=ref, replay_window=60.0, now=FAR.isoformat()),
        )
    with pytest.raises(ApplicationError) as retention:
        await env.run(
            RetentionActivities(event_log).apply_retention,
            RetentionInput(stream=ref, replay_window=60.0, retention=60.0, now=FAR.isoformat()),
        )
    for refused in (advance.value, retention.value):
        assert refused.type == "ConfigError" and refused.non_retryable
        assert "'natural'" in refused.message and "'numeric'" in refused.message
    assert "nothing deleted" in retention.value.message
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "refused" in r.getMessage()]
    assert len(errors) == 2
    assert (await event_log.prune.retention_state(stream_name)).deleted_rows == 28
    assert len(await event_ids(event_log, stream_name)) == 12


async def test_the_first_connection_records_the_streams_order(
    event_log: Stores, stream_name: str
) -> None:
    """A stream younger than its first checkpoint run has its order on record too."""
    await event_log.starts.connection_context(stream_name, "numeric", cursor=None, source="none")
    checkpoint = await event_log.checkpoints.get_checkpoint(stream_name)
    assert checkpoint is not None and checkpoint.lagging_id is None
    with pytest.raises(IdOrderMismatchError):
        await event_log.starts.connection_context(
            stream_name, "lexicographic", cursor=None, source="x"
        )


async def test_a_lagged_replay_keeps_what_it_re_reads_while_the_lagging_id_moves_on(
    event_log: Stores, stream_name: str
) -> None:
    """Issue 24, item 2, the lagged-replay race: a repair started one stored id before
    lagging id 10 (at 9) is still re-reading (9, 30) when the checkpoint moves the lagging
    id to 30 and retention
    runs. The connection's start holds the fence: what it re-reads is still stored, and
    the gap it opens there (a drop of its own, 13 and 14 not re-sent) closes repaired,
    not falsely unrecoverable, because its ids were stored all along."""
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 10)
    start = await event_log.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none", repair=True, reader=lease("lagged")
    )
    assert start.cursor == "9"  # one stored id before the lagging id: its witness is 10
    await set_lagging(event_log, stream_name, 30)
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=FAR)
    assert (run.deleted, run.keep_from, run.held_by) == (7, "9", HELD_BY_READER)
    assert run.state.horizon_id == "7"
    later = T0 + 2000 * MINUTE
    replayed = await event_log.writer.insert_batch(
        stream_name, "numeric", [record(str(i), later) for i in (11, 12)]
    )
    assert (replayed.new_rows, replayed.duplicates, replayed.dropped_by_horizon) == (0, 2, 0)
    # Its notice after 12, the next id 15: the gap (10, 15), from its cursor.
    opened = GapChange("own", opened=gap(stream_name, "own", "10", "15"), contiguous=True)
    await event_log.writer.committed(
        event_log.writer.submit_batch(stream_name, "numeric", [], gap_changes=[opened])
    )
    # The repair re-reads 11..14 and passes 15: all of it was stored, nothing is lost.
    repair = event_log.writer.submit_batch(
        stream_name,
        "numeric",
        [record(str(i), later) for i in range(11, 16)],
        gap_changes=[GapChange("own", recovered=True, close=True, contiguous=True)],
    )
    assert (await event_log.writer.committed(repair)).dropped_by_horizon == 0
    (closed,) = await event_log.gap_store.gaps(stream_name)
    assert (closed.state, closed.missing) == ("repaired", 0)
    assert (await event_ids(event_log, stream_name))[0] == "8"
    # The connection ends: the lagging id holds the fence again.
    await event_log.readers.release_reader(stream_name, "lagged")
    assert await event_log.readers.readers(stream_name) == []
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=FAR)
    assert (run.deleted, run.keep_from, run.held_by) == (21, "30", HELD_BY_LAGGING)


async def test_a_registration_moves_with_the_start_and_an_expired_one_holds_nothing(
    event_log: Stores, stream_name: str
) -> None:
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)
    held = lease("dead", expires_in=timedelta(hours=1))
    await event_log.starts.connection_context(
        stream_name, "numeric", cursor="5", source="explicit", reader=held
    )
    # The same reader registering again (its resolution took a second read) moves.
    await event_log.starts.connection_context(
        stream_name, "numeric", cursor="8", source="explicit", reader=held
    )
    (registered,) = await event_log.readers.readers(stream_name)
    assert (registered.reader_id, registered.start_id) == ("dead", "8")
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=FAR)
    assert (run.deleted, run.keep_from, run.held_by) == (6, "8", HELD_BY_READER)
    # A crashed worker's row: expired, it holds nothing (and the next start forgets it).
    await event_log.starts.connection_context(
        stream_name,
        "numeric",
        cursor="8",
        source="explicit",
        reader=lease("dead", expires_in=-timedelta(seconds=1)),
    )
    run = await event_log.prune.apply_retention(stream_name, "numeric", cutoff=FAR)
    assert (run.deleted, run.keep_from, run.held_by) == (22, "30", HELD_BY_LAGGING)
    await event_log.starts.connection_context(
        stream_name, "numeric", cursor="35", source="l1", reader=lease("next")
    )
    assert [r.reader_id for r in await event_log.readers.readers(stream_name)] == ["next"]


async def test_a_gap_committed_mid_run_keeps_its_start_row(
    event_log: Stores, stream_name: str
) -> None:
    """Issue 24, item 2, the gap-opened-mid-run race: the fence is read again in every
    delete transaction, so a gap recorded behind the lagging id between two statements
    of a run keeps its start row, and the horizon never passes its start."""
    await minutely(event_log, stream_name, range(1, 41))
    await set_lagging(event_log, stream_name, 30)

    async def between(deleted: int) -> None:
        if deleted == 5:  # after the first statement
            await open_gap(event_log, stream_name, "12", "16")

    run = await event_log.prune.apply_retention(
        stream_name, "numeric", cutoff=FAR, batch_rows=5, max_batches=20, between=between
    )
    assert (run.deleted, run.keep_from, run.held_by) == (10, "12", HELD_BY_GAP)
    assert run.state.horizon_id == "10"
    assert (await event_ids(event_log, stream_name))[0] == "11"  # the row before it too
    (recorded,) = await event_log.gap_store.gaps(stream_name)
    assert (recorded.start_id, recorded.state) == ("12", "open")


async def test_a_gap_opened_behind_the_horizon_starts_at_it(
    event_log: Stores, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A replay from before the horizon (``replay --from-id 1``) takes a notice: its gap
    would start at 1, where every id re-sent is dropped; it starts at the horizon. One
    wholly at or before the horizon is not recorded (loudly)."""
    await retained(event_log, stream_name, "numeric")
    await open_gap(event_log, stream_name, "1", "35")
    await open_gap(event_log, stream_name, "2", "20")
    (recorded,) = await event_log.gap_store.gaps(stream_name)
    assert (recorded.gap_id, recorded.start_id, recorded.end_id) == (
        f"g-{stream_name}-1",
        "28",
        "35",
    )
    warned = [r.getMessage() for r in caplog.records if "retention horizon '28'" in r.getMessage()]
    assert len(warned) == 2 and "no gap is recorded" in warned[1]


async def test_ids_the_horizon_drops_are_counted_apart_from_duplicates(
    event_log: Stores, stream_name: str
) -> None:
    """Issue 24, item 3: under ``numeric`` an id that is no number sorts before every
    number, so after the first delete the horizon drops every such id, forever. It was
    folded into ``duplicates``; it is counted apart, with the id and the horizon."""
    await retained(event_log, stream_name, "numeric")
    later = T0 + 2000 * MINUTE
    result = await event_log.writer.insert_batch(
        stream_name,
        "numeric",
        [record("tick-a", later), record("35", later), record("41", later), record("7", later)],
    )
    assert (result.new_rows, result.duplicates, result.dropped_by_horizon) == (1, 1, 2)
    assert (result.dropped_id, result.horizon_id) == ("tick-a", "28")
    assert (await event_ids(event_log, stream_name))[-1] == "41"


async def test_the_simulations_store_deletes_what_the_real_one_deletes(
    event_log: Stores, stream_name: str
) -> None:
    """The simulation's memory store (tests/sim) takes retention's decisions from the same
    functions: the same sequence (a running connection, a gap recorded mid-run, a release,
    a replay over the horizon) leaves the same rows, horizon and counts on both."""
    memory = MemoryEventLog(stream_name, "numeric")
    rows = [record(str(i), T0 + i * MINUTE) for i in range(1, 41)]
    await event_log.writer.insert_batch(stream_name, "numeric", rows)
    memory.commit(rows, [], now=T0)
    await set_lagging(event_log, stream_name, 30)
    memory.advance(window=60.0, now=T0 + 31 * MINUTE)
    assert memory.lagging_id == "30"
    for starts in (event_log.starts, memory):
        await starts.connection_context(
            stream_name, "numeric", cursor="12", source="explicit", reader=lease("r")
        )

    def opening() -> GapChange:
        return GapChange("g", opened=gap(stream_name, "g", "8", "11"), contiguous=True)

    async def between(deleted: int) -> None:
        if deleted == 4:
            await event_log.writer.committed(
                event_log.writer.submit_batch(stream_name, "numeric", [], gap_changes=[opening()])
            )

    async def both_run(*, gap_mid_run: bool) -> None:
        await event_log.prune.apply_retention(
            stream_name,
            "numeric",
            cutoff=FAR,
            batch_rows=4,
            max_batches=10,
            between=between if gap_mid_run else None,
        )
        after: int | None = None
        for statement in range(10):
            batch = memory.retention_batch(cutoff=FAR, after=after, limit=4, now=datetime.now(UTC))
            after = batch.last_seq
            if statement == 0 and gap_mid_run:
                memory.commit([], [opening()], now=T0)
            if batch.done:
                break

    async def agree() -> None:
        kept = [row.event_id for row in memory.rows.values()]
        assert await event_ids(event_log, stream_name) == kept
        state = await event_log.prune.retention_state(stream_name)
        horizon = memory.horizon[1] if memory.horizon is not None else None
        assert (state.horizon_id, state.deleted_rows) == (horizon, memory.deleted_rows)

    await both_run(gap_mid_run=True)
    await agree()
    # The row before the gap's start (a repair starts there) and everything after it.
    assert (await event_ids(event_log, stream_name))[0] == "7"
    close = GapChange("g", close=True, contiguous=True)
    await event_log.writer.committed(
        event_log.writer.submit_batch(stream_name, "numeric", [], gap_changes=[close])
    )
    memory.commit([], [close], now=T0)
    await event_log.readers.release_reader(stream_name, "r")
    memory.release_reader("r")
    await both_run(gap_mid_run=False)
    await agree()
    assert (await event_ids(event_log, stream_name))[0] == "29"
    later = [record(str(i), FAR) for i in (*range(5, 35), 41)]
    real = await event_log.writer.insert_batch(stream_name, "numeric", later)
    simulated = memory.commit(later, [], now=FAR)
    assert (real.new_rows, real.duplicates, real.dropped_by_horizon) == (1, 6, 24)
    assert (simulated.new_rows, simulated.duplicates, simulated.dropped_by_horizon) == (1, 6, 24)
    await agree()


def test_the_status_line_names_the_consumer_groups_that_hold_rows() -> None:
    from durable_sse.log.retention import describe

    status = {"retention": 86400.0, "deleted_rows": 3, "held_by_consumers": ["billing"]}
    assert describe(status) == "1d: 3 deleted, held by consumers billing"
