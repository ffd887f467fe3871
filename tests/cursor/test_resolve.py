"""Where a connection resumes (durable_sse/cursor/resolve.py), against the real stores: the
event log on PostgreSQL and SQLite, Redis for L2, an in-process L1."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from durable_sse.contracts import ReadProgress, Route
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.cursor.resolve import CursorResolver
from durable_sse.cursor.start import ConnectionStart
from durable_sse.gaps.model import GapChange, GapKind, GapRecord
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores

ORDER = "numeric"
NOW = datetime.now(UTC)
OLD = NOW - timedelta(hours=2)


@pytest.fixture
async def l2(redis_url: str, stream_name: str) -> AsyncIterator[RedisCursors]:
    store = RedisCursors(redis_url)
    yield store
    await store.forget(stream_name)
    await store.close()


@pytest.fixture
def l1() -> LocalCursors:
    return LocalCursors()


@pytest.fixture
def resolver(l1: LocalCursors, l2: RedisCursors, event_log: Stores) -> CursorResolver:
    return CursorResolver(l1, l2, event_log.starts)


async def persist(log: Stores, stream: str, ids: list[int], received_at: datetime) -> None:
    records = [EventRecord(str(i), 0, "message", f"data {i}", received_at) for i in ids]
    assert (await log.writer.insert_batch(stream, ORDER, records)).new_rows == len(ids)


async def timeline(log: Stores, stream: str) -> None:
    """10..40 two hours ago (the lagging id: 40), 50..90 now (the floor: 90)."""
    await persist(log, stream, [10, 20, 30, 40], OLD)
    await persist(log, stream, [50, 60, 70, 80, 90], NOW)
    advanced = await log.checkpoints.advance_lagging(stream, ORDER, window=3600, now=NOW)
    assert advanced.lagging_id == "40"


async def commit_changes(log: Stores, stream: str, *changes: GapChange) -> None:
    """Gap changes alone in one batch, as the reader commits them."""
    await log.writer.committed(log.writer.submit_batch(stream, ORDER, [], gap_changes=changes))


def gid(stream: str, name: str) -> str:
    """Gap ids are unique across streams (random in the reader): so are the tests'."""
    return f"{stream}-{name}"


async def open_gap(log: Stores, stream: str, name: str, start: str, end: str) -> None:
    gap_id = gid(stream, name)
    opened = GapRecord(
        gap_id=gap_id,
        stream=stream,
        kind=GapKind.COMMENT.value,
        start_id=start,
        end_id=end,
        notice_id=end,
        seen_at=NOW.isoformat(),
    )
    await commit_changes(log, stream, GapChange(gap_id, opened=opened))


def where(start: ConnectionStart) -> tuple[str | None, str, str | None]:
    return start.cursor, start.source, start.context.witness


async def resolve(
    resolver: CursorResolver,
    stream: str,
    route: Route = Route.LIVE,
    **options: object,
) -> ConnectionStart:
    return await resolver.resolve(stream, ORDER, route, **options)  # type: ignore[arg-type]


# -- the live chain: L1 -> L2 -> lagging -> floor -> none ---------------------------------


async def test_none_when_every_store_misses(resolver: CursorResolver, stream_name: str) -> None:
    for route in (Route.LIVE, Route.LAGGED):
        start = await resolve(resolver, stream_name, route)
        assert where(start) == (None, "none", None)
        context = start.context
        assert (context.lagging_id, context.floor, context.open_gaps) == (None, None, [])


async def test_floor_when_caches_and_checkpoint_miss(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await persist(event_log, stream_name, [9, 10, 8], NOW)
    start = await resolve(resolver, stream_name)
    assert where(start) == ("10", "floor", None)
    assert (start.context.floor, start.context.lagging_id) == ("10", None)


async def test_lagged_route_with_no_lagging_id_takes_the_floor(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    """A fresh stream's repair (or ``replay`` signal) still resumes from what is stored:
    connecting live only would skip everything since the floor, unseen."""
    await persist(event_log, stream_name, [9, 10, 8], NOW)
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("10", "floor", None)


async def test_lagging_before_floor(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    start = await resolve(resolver, stream_name)
    assert where(start) == ("40", "lagging", "50")
    assert (start.context.lagging_id, start.context.floor) == ("40", "90")


async def test_l2_hit_fills_l1(
    resolver: CursorResolver,
    l1: LocalCursors,
    l2: RedisCursors,
    event_log: Stores,
    stream_name: str,
) -> None:
    await timeline(event_log, stream_name)
    assert await l2.advance(stream_name, "80", ORDER) is True
    assert l1.get(stream_name) is None
    assert where(await resolve(resolver, stream_name)) == ("80", "l2", "90")
    assert l1.get(stream_name) == "80"
    assert where(await resolve(resolver, stream_name)) == ("80", "l1", "90")


async def test_l1_hit_wins(
    resolver: CursorResolver, l1: LocalCursors, l2: RedisCursors, stream_name: str
) -> None:
    await l2.advance(stream_name, "5", ORDER)
    l1.advance(stream_name, "6", ORDER)
    assert where(await resolve(resolver, stream_name)) == ("6", "l1", None)


async def test_redis_down_falls_through(
    l1: LocalCursors, event_log: Stores, stream_name: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = RedisCursors(f"redis://127.0.0.1:{port}/0", timeout=0.3)
    try:
        resolver = CursorResolver(l1, down, event_log.starts)
        await persist(event_log, stream_name, [1, 2], NOW)
        assert where(await resolve(resolver, stream_name)) == ("2", "floor", None)
        assert down.read_failures == 1
        assert l1.get(stream_name) is None
    finally:
        await down.close()


# -- the lagged route: the repair --------------------------------------------------------


async def test_lagged_route_without_a_gap_starts_one_stored_id_before_the_lagging_id(
    resolver: CursorResolver, l2: RedisCursors, event_log: Stores, stream_name: str
) -> None:
    """As a repair starts one stored id before its gap: a verified reconnect's suspicion
    starts at the lagging id, and the first row after the cursor must lie outside it to
    show that the server's history reaches the cursor (its witness)."""
    await timeline(event_log, stream_name)
    await l2.advance(stream_name, "90", ORDER)  # the caches do not matter here
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("30", "lagging", "40")


async def test_lagged_route_with_no_lagging_id_falls_back_to_the_caches(
    resolver: CursorResolver, l2: RedisCursors, event_log: Stores, stream_name: str
) -> None:
    await persist(event_log, stream_name, [5, 6, 7], NOW)
    assert await l2.advance(stream_name, "5", ORDER) is True  # rewound: older than the floor
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("5", "l2", "6")
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("5", "l1", "6")


async def test_a_repair_starts_one_stored_id_before_the_oldest_open_gap(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    await open_gap(event_log, stream_name, "g-late", "80", "90")
    await open_gap(event_log, stream_name, "g-early", "50", "60")
    start = await resolve(resolver, stream_name, Route.LAGGED)
    assert where(start) == ("40", "gap", "50")
    assert sorted(gap.gap_id for gap in start.context.open_gaps) == [
        gid(stream_name, "g-early"),
        gid(stream_name, "g-late"),
    ]
    # the live route does not repair
    assert where(await resolve(resolver, stream_name)) == ("40", "lagging", "50")


async def test_a_repair_resumes_from_what_was_re_read(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    await open_gap(event_log, stream_name, "g1", "50", "60")
    await open_gap(event_log, stream_name, "g2", "80", "90")
    await commit_changes(event_log, stream_name, GapChange(gid(stream_name, "g1"), reread_to="55"))
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("50", "gap", "60")
    # g1 re-read past g2's start: g2 is now the oldest resume point
    await commit_changes(event_log, stream_name, GapChange(gid(stream_name, "g1"), reread_to="85"))
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("70", "gap", "80")
    # both closed: back to the lagging id (one stored id before it)
    await commit_changes(
        event_log,
        stream_name,
        GapChange(gid(stream_name, "g1"), close=True),
        GapChange(gid(stream_name, "g2"), close=True),
    )
    start = await resolve(resolver, stream_name, Route.LAGGED)
    assert where(start) == ("30", "lagging", "40") and start.context.open_gaps == []


async def test_a_gap_opened_behind_the_lagging_id_is_repaired_from_its_start(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    """A late notice can open a gap behind the lagging id: it keeps its start, the
    repair goes back to it, and the lagging id does not move until it is closed."""
    await timeline(event_log, stream_name)
    await open_gap(event_log, stream_name, "g1", "20", "60")
    start = await resolve(resolver, stream_name, Route.LAGGED)
    assert [gap.start_id for gap in start.context.open_gaps] == ["20"]
    assert where(start) == ("10", "gap", "20")
    held = await event_log.checkpoints.advance_lagging(
        stream_name, ORDER, window=0, now=NOW + timedelta(hours=1)
    )
    assert (held.lagging_id, held.moved, held.held_by_gap) == ("40", False, True)


async def test_a_gap_at_the_oldest_stored_id_starts_at_its_resume_point(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await persist(event_log, stream_name, [10, 20, 30], NOW)  # no lagging id yet
    await open_gap(event_log, stream_name, "g1", "10", "20")
    assert where(await resolve(resolver, stream_name, Route.LAGGED)) == ("10", "gap", "20")


# -- explicit ----------------------------------------------------------------------------


async def test_explicit_sends_the_named_id_with_its_witness(
    resolver: CursorResolver, l1: LocalCursors, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    l1.advance(stream_name, "90", ORDER)
    explicit = Route.EXPLICIT
    assert where(await resolve(resolver, stream_name, explicit, explicit="25")) == (
        "25",
        "explicit",
        "30",
    )
    assert where(await resolve(resolver, stream_name, explicit, explicit="5")) == (
        "5",
        "explicit",
        "10",
    )
    # at or past the floor nothing stored follows it
    assert where(await resolve(resolver, stream_name, explicit, explicit="90")) == (
        "90",
        "explicit",
        None,
    )
    assert where(await resolve(resolver, stream_name, explicit, explicit="1000")) == (
        "1000",
        "explicit",
        None,
    )


async def test_the_witness_is_the_stored_id_after_any_cursor(
    resolver: CursorResolver, l1: LocalCursors, event_log: Stores, stream_name: str
) -> None:
    """A cache cursor older than the floor (another worker stored more) has one too."""
    await timeline(event_log, stream_name)
    l1.advance(stream_name, "65", ORDER)
    assert where(await resolve(resolver, stream_name)) == ("65", "l1", "70")


# -- retried attempts ---------------------------------------------------------------------


async def test_a_retry_restarts_where_the_dead_attempt_started(
    resolver: CursorResolver, l1: LocalCursors, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    l1.advance(stream_name, "90", ORDER)  # where the dead attempt got to
    progress = ReadProgress(cursor="90", start_cursor="60", first_id="70")
    for route in (Route.LIVE, Route.LAGGED, Route.EXPLICIT):
        start = await resolve(
            resolver, stream_name, route, explicit="50", retry_of=progress, retried=True
        )
        assert where(start) == ("60", "retry", "70"), route


async def test_a_retry_of_an_attempt_that_started_live_only_restarts_at_its_first_id(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    progress = ReadProgress(cursor="90", start_cursor=None, first_id="70")
    start = await resolve(resolver, stream_name, retry_of=progress, retried=True)
    assert where(start) == ("70", "retry", "80")


async def test_a_retry_never_starts_behind_the_lagging_id(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    progress = ReadProgress(cursor="60", start_cursor="20")
    start = await resolve(resolver, stream_name, retry_of=progress, retried=True)
    assert where(start) == ("40", "lagging", "50")
    at_lagging = ReadProgress(cursor="60", start_cursor="40")
    start = await resolve(resolver, stream_name, retry_of=at_lagging, retried=True)
    assert where(start) == ("40", "retry", "50")


async def test_a_retry_at_the_floor_starts_one_stored_id_before_it(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    """Quiet for a window: the lagging id is the floor (40), and the dead attempt may have
    read past it without storing (simulation seed 729818868)."""
    await persist(event_log, stream_name, [10, 20, 30, 40], OLD)
    advanced = await event_log.checkpoints.advance_lagging(stream_name, ORDER, window=3600, now=NOW)
    assert advanced.lagging_id == "40"
    progress = ReadProgress(cursor="40", start_cursor="20")
    start = await resolve(resolver, stream_name, retry_of=progress, retried=True)
    assert where(start) == ("30", "lagging", "40")
    start = await resolve(resolver, stream_name, retry_of=None, retried=True)
    assert where(start) == ("30", "lagging", "40")
    start = await resolve(resolver, stream_name)  # not a retry
    assert where(start) == ("40", "lagging", None)
    # a hand-over committed everything it read: it resumes at its cursor, the floor
    handed = ReadProgress(cursor="40", start_cursor="40", handed_over=True)
    start = await resolve(resolver, stream_name, retry_of=handed, retried=True)
    assert where(start) == ("40", "retry", None)


async def test_a_live_hand_over_s_retry_starts_where_the_old_connection_read_on_to(
    resolver: CursorResolver, l2: RedisCursors, event_log: Stores, stream_name: str
) -> None:
    """A stopping worker's connection handed over at 60 and read on to 80 until its retry
    started: on the live route the retry starts at L2, re-reading none of it; a repair or
    a replay goes on from where it handed over (L2 is the live cursor, not theirs)."""
    await timeline(event_log, stream_name)
    await l2.advance(stream_name, "80", ORDER)
    handed = ReadProgress(cursor="60", start_cursor="60", handed_over=True)
    start = await resolve(resolver, stream_name, Route.LIVE, retry_of=handed, retried=True)
    assert where(start) == ("80", "l2", "90")
    for route in (Route.LAGGED, Route.EXPLICIT):
        start = await resolve(resolver, stream_name, route, retry_of=handed, retried=True)
        assert where(start) == ("60", "retry", "70"), route
    behind = ReadProgress(cursor="90", start_cursor="90", handed_over=True)
    start = await resolve(resolver, stream_name, Route.LIVE, retry_of=behind, retried=True)
    assert where(start) == ("90", "retry", None)  # L2 older: where it handed over


async def test_a_retried_repair_keeps_its_witness_when_the_lagging_id_is_the_gaps_start(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    """The lagging id (40) may be an open gap's start. The repair began one stored id
    before it (30), so that its first event, at or before 40, shows the history reaches
    the gap. A retry moved to the lagging id would compare with the gap's end (50): a
    history that starts inside the gap would look continuous and close it as repaired
    (simulation seeds 257946024 and 7938971: ids lost, no gap counting them)."""
    await timeline(event_log, stream_name)
    await open_gap(event_log, stream_name, "g1", "40", "50")
    began = ReadProgress(cursor="40", start_cursor="30")
    start = await resolve(resolver, stream_name, Route.LAGGED, retry_of=began, retried=True)
    assert where(start) == ("30", "retry", "40")
    earlier = ReadProgress(cursor="40", start_cursor="10")  # bounded by the repair's start
    start = await resolve(resolver, stream_name, Route.LAGGED, retry_of=earlier, retried=True)
    assert where(start) == ("30", "gap", "40")
    live = await resolve(resolver, stream_name, Route.LIVE, retry_of=began, retried=True)
    assert where(live) == ("40", "lagging", "50")  # not a repair: the lagging id bounds it


async def test_a_retry_without_details_takes_the_lagging_id_or_the_oldest_stored_id(
    resolver: CursorResolver, l1: LocalCursors, event_log: Stores, stream_name: str
) -> None:
    """A stream younger than one window has no lagging id: the dead attempt began at or
    after its oldest stored id, never before."""
    await persist(event_log, stream_name, [10, 20, 30], NOW)
    l1.advance(stream_name, "30", ORDER)  # the caches are where the dead attempt got to
    for route in (Route.LIVE, Route.LAGGED):
        for progress in (None, ReadProgress()):
            start = await resolve(resolver, stream_name, route, retry_of=progress, retried=True)
            assert where(start) == ("10", "oldest", "20"), route
    await persist(event_log, stream_name, [5], OLD)
    await event_log.checkpoints.advance_lagging(stream_name, ORDER, window=3600, now=NOW)
    for route in (Route.LIVE, Route.LAGGED):
        start = await resolve(resolver, stream_name, route, retry_of=None, retried=True)
        assert where(start) == ("5", "lagging", "10"), route


async def test_a_retried_repair_without_details_restarts_at_its_gap(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    await open_gap(event_log, stream_name, "g1", "60", "70")
    start = await resolve(resolver, stream_name, Route.LAGGED, retry_of=None, retried=True)
    assert where(start) == ("50", "gap", "60")
    live = await resolve(resolver, stream_name, Route.LIVE, retry_of=None, retried=True)
    assert where(live) == ("40", "lagging", "50")


async def test_a_retried_explicit_replay_without_details_restarts_at_its_id(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    for explicit, witness in (("60", "70"), ("30", "40")):
        start = await resolve(
            resolver, stream_name, Route.EXPLICIT, explicit=explicit, retry_of=None, retried=True
        )
        assert where(start) == (explicit, "explicit", witness)


async def test_a_first_attempt_ignores_stale_heartbeat_details(
    resolver: CursorResolver, event_log: Stores, stream_name: str
) -> None:
    await timeline(event_log, stream_name)
    progress = ReadProgress(cursor="90", start_cursor="60")
    start = await resolve(resolver, stream_name, retry_of=progress, retried=False)
    assert where(start) == ("40", "lagging", "50")
