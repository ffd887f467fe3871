"""A replay skips what is stored (durable_sse/reader/stored.py, its use in the intake, and
``Reads.stored_keys``): stored events become no rows and count as duplicates, holes are
written, counts and gap evidence stay exact, on real PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
from temporalio.testing import ActivityEnvironment

from durable_sse.activities.read import ReadActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import ReadCounts, ReadInput, Route
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.gaps.model import GapChange, GapRecord, GapState, StreamContext
from durable_sse.gaps.transitions import apply_change
from durable_sse.log.keys import CARRIER_KEY, FollowerKeys, data_digest, reused_key
from durable_sse.log.records import EventRecord, StoredPage
from durable_sse.reader.intake import SKIPPED_PER_ROW, CommitBatch, Intake
from durable_sse.reader.stored import StoredAhead
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.sse.decoder import DecodedEvent
from durable_sse.stores import Stores

RECEIVED = datetime(2026, 1, 1, tzinfo=UTC)


def page(*ids: int, full: bool = True) -> StoredPage:
    return StoredPage(keys=[(str(n), CARRIER_KEY) for n in ids], full=full)


def ev(event_id: int | str, data: str = "d") -> DecodedEvent:
    return DecodedEvent(data=data, event="message", id=str(event_id), id_field=True)


def make_intake(
    cursor: str | None,
    *,
    gaps: list[GapRecord] | None = None,
    floor: str | None = None,
    stored: StoredAhead | None = None,
    **options: object,
) -> Intake:
    settings: dict[str, object] = {
        "name": "s",
        "url": "http://sse.invalid/stream",
        "id_order": "numeric",
        "batch_max_events": 10,
        "batch_max_delay": 0.1,
    }
    settings.update(options)
    numbers = itertools.count(1)
    open_gaps = gaps or []
    made = Intake(
        StreamSpec(**settings),  # type: ignore[arg-type]
        route=Route.LAGGED if open_gaps else Route.EXPLICIT,
        cursor=cursor,
        context=StreamContext(floor=floor, open_gaps=open_gaps),
        known_gaps=[g.gap_id for g in open_gaps],
        new_gap_id=lambda: f"new{next(numbers)}",
        now_iso=lambda: "2026-01-01T00:00:00+00:00",
    )
    made.stored = stored
    return made


def read_all(intake: Intake, items: list[DecodedEvent]) -> list[CommitBatch]:
    intake.take(list(items), received_at=RECEIVED, now=0.0)
    intake.end()
    batches = list(intake.ready)
    intake.ready.clear()
    return batches


def ids(batch: CommitBatch) -> list[str]:
    return [record.event_id for record in batch.records]


# -- the window of stored keys ------------------------------------------------------------


def test_pages_are_fetched_ahead_of_the_reader() -> None:
    ahead = StoredAhead("numeric", start="10", page_rows=4)
    assert ahead.next_fetch(None) == "10"  # the first page starts after the cursor
    ahead.fetching = True
    assert ahead.next_fetch("12") is None  # one fetch at a time
    ahead.add(page(11, 12, 13, 14))
    assert ahead.has("12", CARRIER_KEY) and not ahead.has("15", CARRIER_KEY)
    assert not ahead.has("12", b"follower")
    assert ahead.next_fetch("10") == "14"  # one page held: the next at once
    ahead.add(page(15, 16, 17, 18))
    assert ahead.next_fetch("10") is None  # two ahead of the reader already
    assert ahead.next_fetch("11") == "18"  # inside the page before the newest
    ahead.add(page(19, 20, 21, 22))
    assert ahead.next_fetch("14") is None and ahead.next_fetch("15") == "22"
    ahead.add(page(23, 24, 25, 26))
    assert not ahead.has("12", CARRIER_KEY)  # three pages kept: the oldest went
    assert ahead.has("16", CARRIER_KEY) and ahead.has("25", CARRIER_KEY)
    assert ahead.next_fetch("40") == "40"  # a reader past every page skips ahead
    ahead.add(page(41, full=False))
    assert ahead.done and ahead.next_fetch("41") is None  # nothing more stored


def test_fetching_stops_when_few_events_read_were_stored() -> None:
    ahead = StoredAhead("numeric", start="0", page_rows=4)
    ahead.add(page(1, 2, 3, 4))
    for n in range(1, 9):  # ids not in the stored order: almost nothing is found
        ahead.has(f"x{n}", CARRIER_KEY)
    ahead.has("1", CARRIER_KEY)
    assert ahead.next_fetch("2") is None and ahead.done
    failed = StoredAhead("numeric", start="0")
    failed.fetching = True
    failed.give_up()
    assert failed.done and not failed.fetching and failed.next_fetch("5") is None


def test_a_stored_key_is_skipped_only_under_the_same_digest() -> None:
    """Issue 24 item 7: a key stored under another digest is a reused id, not a copy,
    unless its extended key is stored too; an unknown digest on either side skips."""
    a1, b1, c1 = (data_digest("message", data) for data in ("a1", "b1", "c1"))
    ahead = StoredAhead("numeric", start="0")
    keys = [("1", CARRIER_KEY), ("1", reused_key(b1, CARRIER_KEY)), ("2", CARRIER_KEY)]
    ahead.add(StoredPage(keys=keys, full=False, digests=[a1, b1, None]))
    assert ahead.has("1", CARRIER_KEY, a1)  # a re-send of the first use
    assert ahead.has("1", CARRIER_KEY, b1)  # a re-send of the reused one
    assert not ahead.has("1", CARRIER_KEY, c1)  # a third use: written
    assert ahead.has("1", CARRIER_KEY, None)  # unknown: as ON CONFLICT would
    assert ahead.has("2", CARRIER_KEY, c1)  # stored before digests: unknown
    assert (ahead.checked, ahead.hits) == (5, 4)


# -- the intake: stored events become no rows ---------------------------------------------


def test_stored_events_are_counted_as_duplicates_and_holes_written() -> None:
    ahead = StoredAhead("numeric", start="0")
    ahead.add(page(*[n for n in range(1, 31) if n % 7], full=False))
    intake = make_intake("0", stored=ahead)
    batches = read_all(intake, [ev(n) for n in range(1, 36)])
    assert [ids(b) for b in batches] == [["7", "14", "21", "28", "31", "32", "33", "34", "35"]]
    [batch] = batches
    assert batch.last_id == "35" and batch.skipped == 26
    assert intake.committed(batch, new_rows=9) is True and intake.cursor == "35"
    counts = intake.counts
    assert (counts.events_read, counts.new_rows, counts.duplicates) == (35, 9, 26)


def test_batches_hold_batch_max_events_rows_and_more_events_read() -> None:
    ahead = StoredAhead("numeric", start="0")
    ahead.add(page(*range(1, 1000), full=False))
    intake = make_intake("0", stored=ahead, batch_max_events=5)
    batches = read_all(intake, [ev(n) for n in range(1, 1011)])
    spans = [(b.skipped, ids(b)) for b in batches]
    full = 5 * SKIPPED_PER_ROW  # events read cut a batch of stored events
    assert spans[:-3] == [(full, [])] * (999 // full)
    assert spans[-3:] == [
        (999 % full, ["1000", "1001", "1002", "1003", "1004"]),  # rows cut this one
        (0, ["1005", "1006", "1007", "1008", "1009"]),
        (0, ["1010"]),
    ]


def test_followers_are_skipped_by_their_key_and_idless_events_never() -> None:
    keys = FollowerKeys()
    stored_keys = [("1", keys.carrier()), ("1", keys.follower("message", "a", 1))]
    ahead = StoredAhead("numeric", start="0")
    ahead.add(StoredPage(keys=stored_keys, full=False))
    intake = make_intake("0", stored=ahead)
    items = [
        ev(1),
        DecodedEvent(data="a", id="1"),  # the follower stored
        DecodedEvent(data="b", id="1"),  # a follower not stored
        DecodedEvent(data="no id"),  # never deduplicated, never skipped
    ]
    [batch] = read_all(intake, items)
    assert [(r.event_id, r.event_ord, r.data) for r in batch.records] == [
        ("1", 2, "b"),
        ("", None, "no id"),
    ]
    assert batch.skipped == 2 and batch.last_id == "1"


def test_a_repair_proves_and_counts_the_same_with_or_without_skipping() -> None:
    """Skipping makes a replay's batches fewer and their rows only the holes; the gap
    record they leave behind, the counts and the cursor are those of writing everything."""
    hole = GapRecord(
        gap_id="g",
        stream="s",
        kind="comment",
        start_id="20",
        end_id="61",
        notice_id="61",
        seen_at="2026-01-01T00:00:00+00:00",
    )
    stored_ids = {n for n in range(1, 90) if not (40 <= n <= 45)}

    class Stored:
        """What the log holds once the replay committed (``gaps.StoredIds``)."""

        def stored_numbers_between(self, low: int, high: int) -> int:
            return sum(1 for n in range(low + 1, high) if n in stored_ids or 40 <= n <= 45)

        def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
            return []

    outcomes = []
    for skipping in (False, True):
        ahead = StoredAhead("numeric", start="19")
        ahead.add(page(*sorted(stored_ids), full=False))
        intake = make_intake(
            "19",
            gaps=[hole],
            floor="89",
            stored=ahead if skipping else None,
            contiguous_ids=True,
            batch_max_events=7,
        )
        record: GapRecord | None = hole
        for batch in read_all(intake, [ev(n) for n in range(20, 90)]):
            new_rows = sum(1 for r in batch.records if int(r.event_id) not in stored_ids)
            intake.committed(batch, new_rows=new_rows)
            for change in batch.gap_changes:
                record = apply_change(
                    record,
                    change,
                    order="numeric",
                    lagging_id=None,
                    new_rows=new_rows,
                    now="2026-01-01T00:00:01+00:00",
                    stored=Stored(),
                )
        outcomes.append((record, intake.cursor, intake.counts))
    assert outcomes[0] == outcomes[1]
    record, cursor, counts = outcomes[1]
    assert record is not None and (record.state, record.recovered, record.missing) == (
        GapState.REPAIRED,
        6,
        0,
    )
    assert cursor == "89" and (counts.new_rows, counts.duplicates, counts.recovered) == (6, 64, 6)


# -- the event log: pages of stored keys, and exact counts --------------------------------


async def execute(log: Stores, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with log.database.engine.begin() as connection:
            result = connection.exec_driver_sql(sql, params)
            return [tuple(row) for row in result] if result.returns_rows else []

    return await asyncio.to_thread(run)


def record(event_id: str, ordinal: int = 0, *, follower: bytes | None = None) -> EventRecord:
    return EventRecord(
        event_id=event_id,
        event_ord=ordinal,
        event_type="message",
        data=f"d{event_id}",
        received_at=RECEIVED,
        follower_key=follower,
    )


async def test_stored_keys_come_a_page_at_a_time_in_id_order(
    event_log: Stores, stream_name: str
) -> None:
    keys = FollowerKeys()
    keys.carrier()
    follower = keys.follower("message", "f", 1)
    batch = [record(str(n)) for n in (12, 3, 100, 7)]
    batch += [record("7", 1, follower=follower), EventRecord("", None, "message", "x", RECEIVED)]
    await event_log.writer.insert_batch(stream_name, "numeric", batch)
    await event_log.writer.insert_batch(stream_name + "-other", "numeric", [record("5")])
    first = await event_log.reads.stored_keys(stream_name, "numeric", after=None, limit=1)
    assert first.keys == [("3", CARRIER_KEY)] and first.full
    rest = await event_log.reads.stored_keys(stream_name, "numeric", after="3", limit=10)
    assert sorted(rest.keys) == [
        ("100", CARRIER_KEY),
        ("12", CARRIER_KEY),
        ("7", b""),
        ("7", follower),
    ]
    assert [key[0] for key in rest.keys][-2:] == ["12", "100"] and not rest.full
    assert (
        await event_log.reads.stored_keys(stream_name, "numeric", after="100", limit=5)
    ).keys == []


async def test_a_replay_writes_only_the_holes_and_counts_exactly_beside_another_writer(
    event_log: Stores, stream_name: str
) -> None:
    """A gap over 36..59 of which 1..200 is stored but every tenth id: the replay skips
    what is stored; another attempt writes two of the holes meanwhile (they count for it,
    not for the replay); the gap closes repaired and every id is stored once."""
    order = "numeric"
    holes = [n for n in range(1, 201) if n % 10 == 0]
    await event_log.writer.insert_batch(
        stream_name, order, [record(str(n)) for n in range(1, 201) if n % 10]
    )
    gap = GapRecord(
        gap_id="g1",
        stream=stream_name,
        kind="comment",
        start_id="35",
        end_id="60",
        notice_id="60",
        announced=2,
        seen_at="2026-01-01T00:00:00+00:00",
    )
    opened = event_log.writer.submit_batch(
        stream_name, order, [], gap_changes=[GapChange("g1", opened=gap)]
    )
    await event_log.writer.committed(opened)
    ahead = StoredAhead(order, start="0")
    after = ahead.next_fetch(None)
    ahead.fetching = True
    ahead.add(await event_log.reads.stored_keys(stream_name, order, after=after, limit=1000))
    intake = make_intake("0", gaps=[gap], floor="200", stored=ahead, batch_max_events=25)
    batches = read_all(intake, [ev(n, f"d{n}") for n in range(1, 201)])
    assert sorted(int(r.event_id) for b in batches for r in b.records) == holes
    # Another attempt commits two of the holes (one inside the gap) before the replay does.
    other = await event_log.writer.insert_batch(stream_name, order, [record("50"), record("120")])
    assert other.new_rows == 2
    new_rows = 0
    for batch in batches:
        job = event_log.writer.submit_batch(
            stream_name, order, batch.records, gap_changes=batch.gap_changes
        )
        result = await event_log.writer.committed(job)
        intake.committed(batch, new_rows=result.new_rows)
        new_rows += result.new_rows
    assert new_rows == len(holes) - 2 == intake.counts.new_rows
    assert intake.counts.duplicates == 200 - new_rows and intake.counts.events_read == 200
    assert intake.counts.recovered == 1  # 40 only: 50 came from the other writer
    [record_] = await event_log.gap_store.gaps(stream_name)
    assert (record_.state, record_.recovered, record_.missing) == (GapState.REPAIRED, 1, 0)
    stored_ids = await event_log.reads.stored_keys(stream_name, order, after=None, limit=1000)
    assert [key[0] for key in stored_ids.keys] == [str(n) for n in range(1, 201)]


async def test_a_replay_below_the_newest_id_stores_reused_ids_and_skips_the_rest(
    event_log: Stores, stream_name: str
) -> None:
    """Issue 24 item 7 on the replay path: 1..5 stored with data ``a``; a replay from 0
    reads 1..3 with data ``b`` (the server restarted its counter), then 4 and 5 as
    stored. The stored keys skip 4 and 5 only; 1..3 are written and kept, counted once
    (by the writer) as reused; read again, they are skipped as stored."""
    order = "numeric"
    first = [ev(n, f"a{n}") for n in range(1, 6)]
    replayed = [*(ev(n, f"b{n}") for n in range(1, 4)), *first[3:]]
    await event_log.writer.insert_batch(
        stream_name,
        order,
        [EventRecord(str(n), 0, "message", f"a{n}", RECEIVED) for n in range(1, 6)],
    )
    counts = []
    for _ in range(2):
        ahead = StoredAhead(order, start="0")
        ahead.add(await event_log.reads.stored_keys(stream_name, order, after="0", limit=100))
        intake = make_intake("0", floor="5", stored=ahead)
        [batch] = read_all(intake, replayed)
        result = await event_log.writer.insert_batch(stream_name, order, batch.records)
        intake.committed(batch, new_rows=result.new_rows, reused=result.reused)
        counts.append((ids(batch), intake.counts, intake.cursor))
    assert counts[0] == (
        ["1", "2", "3"],
        ReadCounts(events_read=5, new_rows=3, duplicates=2, ids_reused=3),
        "5",
    )
    assert counts[1] == ([], ReadCounts(events_read=5, new_rows=0, duplicates=5), "5")
    rows = await event_log.reads.events(stream_name)
    assert [(e.event_id, e.data) for e in rows] == [
        *((str(n), f"a{n}") for n in range(1, 6)),
        *((str(n), f"b{n}") for n in range(1, 4)),
    ]


# -- the read activity: a replay writes the holes only -------------------------------------


async def test_a_replay_connection_writes_only_the_rows_missing(
    source: SSESource, pg_event_log: Stores, redis_url: str, stream_name: str
) -> None:
    source.add_stream(stream_name, SourceStreamConfig(rate=0, disconnect_after=2000, keepalive=0))
    spec = StreamSpec(
        name=stream_name, url=source.url(stream_name), id_order="numeric", batch_max_delay=0.02
    )
    l2 = RedisCursors(redis_url)
    written: list[int] = []
    submit = pg_event_log.writer.submit_batch

    def counting_submit(*args: Any, **kwargs: Any) -> Any:
        written.append(len(args[2]))  # the rows of each batch, as handed to the real log
        return submit(*args, **kwargs)

    pg_event_log.writer.submit_batch = counting_submit  # type: ignore[method-assign]
    try:
        async with httpx.AsyncClient(follow_redirects=False) as http:
            reader = ReadActivities(
                http=http, stores=replace(pg_event_log, l1=LocalCursors(), l2=l2)
            )
            env = ActivityEnvironment()
            first = await env.run(reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT))
            assert first.counts.new_rows == 2000 and sum(written) == 2000
            holes = [str(n) for n in range(50, 2001, 100)]
            await execute(
                pg_event_log,
                "DELETE FROM sse_events WHERE stream = %s AND event_id = ANY(%s)",
                (stream_name, holes),
            )
            written.clear()
            replay = await env.run(
                reader.read_stream, ReadInput(spec=spec, route=Route.EXPLICIT, start_id="0")
            )
    finally:
        await l2.close()
    assert replay.counts == ReadCounts(events_read=2000, new_rows=20, duplicates=1980)
    assert replay.last_cursor == "2000"
    assert sum(written) == len(holes)  # the stored 1,980 never became rows
    [(count, distinct)] = await execute(
        pg_event_log,
        "SELECT count(*), count(DISTINCT event_id) FROM sse_events WHERE stream = %s",
        (stream_name,),
    )
    assert count == distinct == 2000
