"""Writing batches to the event log, on real PostgreSQL and real SQLite: idempotence, order,
events without ids, shared transactions, and a bad batch that costs no other."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from durable_sse.errors import StoreError
from durable_sse.log.database import WORKERS
from durable_sse.log.keys import FollowerKeys
from durable_sse.log.records import EventRecord, InsertResult
from durable_sse.log.staging import SMALL_BATCH
from durable_sse.stores import Stores
from tests.log.helpers import (
    execute,
    gap_opened,
    hold_the_lanes,
    query,
    record,
    refuse_inserts,
    stored,
)


async def test_same_batch_twice_is_stored_once(event_log: Stores, stream_name: str) -> None:
    batch = [record("1"), record("2"), record("3")]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(3, 0)
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(0, 3)
    assert await stored(event_log, stream_name) == [("1", 0, "x"), ("2", 0, "x"), ("3", 0, "x")]


@pytest.mark.parametrize("size", [SMALL_BATCH, SMALL_BATCH + 1, 2000])
async def test_both_insert_paths_are_idempotent_and_keep_order(
    event_log: Stores, stream_name: str, size: int
) -> None:
    """Small batches go through one multi-row INSERT, larger ones through COPY."""
    batch = [record(str(i), data=f"d{i}") for i in range(size, 0, -1)]
    overlap = batch[size // 2 :] + [record(str(size + 1))]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(
        size, 0
    )
    result = await event_log.writer.insert_batch(stream_name, "numeric", overlap)
    assert result == InsertResult(1, len(overlap) - 1)
    rows = await stored(event_log, stream_name)
    assert [row[0] for row in rows] == [str(i) for i in range(size, 0, -1)] + [str(size + 1)]
    assert rows[0][2] == f"d{size}"


def numbered(first: int, last: int) -> list[EventRecord]:
    return [record(str(n), data=f"d{n}") for n in range(first, last + 1)]


async def test_live_batches_are_copied_straight_into_the_log(
    pg_event_log: Stores, stream_name: str, pg_url: str
) -> None:
    """Issue 16 item 2: a large batch whose ids all sort after the stream's newest stored
    id is COPYed into sse_events; one that meets a stored key (ids out of order, another
    worker writing the same stream) falls back to staging, with exact counts."""
    log = pg_event_log
    copies, fallbacks = log.writer.direct_copies, log.writer.optimistic_fallbacks
    assert await log.writer.insert_batch(stream_name, "numeric", numbered(1, 100)) == InsertResult(
        100, 0
    )
    assert await log.writer.insert_batch(
        stream_name, "numeric", numbered(101, 200)
    ) == InsertResult(100, 0)
    assert log.writer.direct_copies == copies + 2
    # Ids at or before the newest: straight to staging, no attempt wasted.
    assert await log.writer.insert_batch(
        stream_name, "numeric", numbered(150, 250)
    ) == InsertResult(50, 51)
    assert (log.writer.direct_copies, log.writer.optimistic_fallbacks) == (copies + 2, fallbacks)
    # Another worker moved the stream on: this log's hint is stale, the COPY meets a
    # stored key, rolls back, and the batch goes through staging.
    other = Stores.open(pg_url)
    try:
        assert await other.writer.insert_batch(stream_name, "numeric", numbered(300, 400)) == (
            InsertResult(101, 0)
        )
    finally:
        await other.close()
    assert await log.writer.insert_batch(
        stream_name, "numeric", numbered(350, 450)
    ) == InsertResult(50, 51)
    assert log.writer.optimistic_fallbacks == fallbacks + 1
    # A key repeated inside one fresh batch: the same (a true re-send is a duplicate, an
    # id sent again with other data is kept: issue 24 item 7).
    repeated = [*numbered(500, 600), record("550", data="d550")]
    assert await log.writer.insert_batch(stream_name, "numeric", repeated) == InsertResult(101, 1)
    assert log.writer.optimistic_fallbacks == fallbacks + 2
    reused = [*numbered(601, 700), record("650", data="again")]
    assert await log.writer.insert_batch(stream_name, "numeric", reused) == InsertResult(
        101, 0, ("650",)
    )
    assert log.writer.optimistic_fallbacks == fallbacks + 3
    rows = await stored(log, stream_name)
    ids = [int(row[0]) for row in rows]
    assert ids == [*range(1, 251), *range(300, 451), *range(500, 601), *range(601, 701), 650]
    assert ("550", 0, "d550") in rows and ("650", 0, "again") in rows


async def test_a_fallback_keeps_the_other_streams_of_its_group(
    pg_event_log: Stores, stream_name: str
) -> None:
    log = pg_event_log
    await log.writer.insert_batch(stream_name, "numeric", numbered(1, 100))
    fillers = hold_the_lanes(log)
    await asyncio.sleep(0)
    live = log.writer.submit_batch(f"{stream_name}-live", "numeric", numbered(1, 100))
    clash = log.writer.submit_batch(
        stream_name, "numeric", [*numbered(101, 200), record("101", data="d101")]
    )
    await asyncio.gather(*(log.writer.committed(job) for job in fillers))
    assert await log.writer.committed(live) == InsertResult(100, 0)
    assert await log.writer.committed(clash) == InsertResult(100, 1)
    assert len(await stored(log, f"{stream_name}-live")) == 100
    assert len(await stored(log, stream_name)) == 200


async def test_key_repeated_within_a_batch_counts_as_duplicate(
    event_log: Stores, stream_name: str
) -> None:
    batch = [record("1", data="first"), record("2"), record("1", data="first")]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(2, 1)
    assert await stored(event_log, stream_name) == [("1", 0, "first"), ("2", 0, "x")]


async def test_seq_keeps_batch_order(event_log: Stores, stream_name: str) -> None:
    ids = ["b", "a", "d", "c"]
    await event_log.writer.insert_batch(stream_name, "lexicographic", [record(i) for i in ids])
    assert [row[0] for row in await stored(event_log, stream_name)] == ids


async def test_idless_followers_are_kept_apart_and_deduplicated(
    event_log: Stores, stream_name: str
) -> None:
    batch = [
        record("5", 0, data="carries id"),
        record("5", 1, data="follower one"),
        record("5", 2, data="follower two"),
    ]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(3, 0)
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(0, 3)
    assert await stored(event_log, stream_name) == [
        ("5", 0, "carries id"),
        ("5", 1, "follower one"),
        ("5", 2, "follower two"),
    ]


async def test_idless_followers_are_told_apart_by_content_across_connections(
    event_log: Stores, stream_name: str
) -> None:
    """Issue 13 case 8, at the store: positions restart per connection, keys do not."""

    def connection(*events: tuple[str, int, str]) -> list[EventRecord]:
        keys = FollowerKeys()
        return [
            record(
                event_id,
                ordinal,
                data=data,
                follower=keys.carrier()
                if ordinal == 0
                else keys.follower("message", data, ordinal),
            )
            for event_id, ordinal, data in events
        ]

    first = connection(("5", 0, "a"), ("5", 1, "b"))
    assert await event_log.writer.insert_batch(stream_name, "numeric", first) == InsertResult(2, 0)
    resumed = connection(("5", 1, "c"))  # after 5: a new event at b's position
    assert await event_log.writer.insert_batch(stream_name, "numeric", resumed) == InsertResult(
        1, 0
    )
    resent = connection(("5", 1, "b"), ("5", 2, "c"))
    assert await event_log.writer.insert_batch(stream_name, "numeric", resent) == InsertResult(0, 2)
    replay = connection(("5", 0, "a"), ("5", 1, "b"), ("5", 2, "c"))
    assert await event_log.writer.insert_batch(stream_name, "numeric", replay) == InsertResult(0, 3)
    twins = connection(("6", 0, "p"), ("6", 1, "p"), ("6", 2, "p"))
    assert await event_log.writer.insert_batch(stream_name, "numeric", twins) == InsertResult(3, 0)
    assert await stored(event_log, stream_name) == [
        ("5", 0, "a"),
        ("5", 1, "b"),
        ("5", 1, "c"),
        ("6", 0, "p"),
        ("6", 1, "p"),
        ("6", 2, "p"),
    ]


async def test_stream_without_ids_stores_every_event_every_time(
    event_log: Stores, stream_name: str
) -> None:
    # NULL event_ord never conflicts, on either database: nothing may be collapsed.
    batch = [record("", None, data="same"), record("", None, data="same")]
    assert await event_log.writer.insert_batch(stream_name, "natural", batch) == InsertResult(2, 0)
    assert await event_log.writer.insert_batch(stream_name, "natural", batch) == InsertResult(2, 0)
    # Even a caller that numbers id-less events cannot make them collide.
    numbered = [record("", 1, data="same"), record("", 1, data="same")]
    assert await event_log.writer.insert_batch(stream_name, "natural", numbered) == InsertResult(
        2, 0
    )
    rows = await stored(event_log, stream_name)
    assert rows == [("", None, "same")] * 6
    assert await event_log.reads.floor(stream_name) is None


async def test_ids_are_namespaced_by_stream(event_log: Stores, stream_name: str) -> None:
    other = stream_name + "-other"
    await event_log.writer.insert_batch(other, "numeric", [record("1"), record("99")])
    assert await event_log.writer.insert_batch(
        stream_name, "numeric", [record("1")]
    ) == InsertResult(1, 0)
    assert await event_log.reads.floor(stream_name) == "1"


async def test_text_the_database_cannot_hold_is_stored_replaced(
    event_log: Stores, stream_name: str
) -> None:
    batch = [
        record("1", data="a\x00b"),
        record("2", data="lone \ud800 surrogate"),
        record("3\udc00", data="odd id"),
    ]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(3, 0)
    rows = await stored(event_log, stream_name)
    data = [row[2] for row in rows]
    assert data[1] == "lone \ufffd surrogate"
    assert rows[2][0] == "3\ufffd"
    assert data[0] in ("a\x00b", "a\ufffdb")  # SQLite keeps NUL, PostgreSQL cannot
    if event_log.database.dialect == "postgresql":
        assert data[0] == "a\ufffdb"


async def test_empty_batch_is_a_no_op(event_log: Stores, stream_name: str) -> None:
    assert await event_log.writer.insert_batch(stream_name, "numeric", []) == InsertResult(0, 0)
    assert await stored(event_log, stream_name) == []


async def test_concurrent_batches_of_many_streams_share_transactions(
    event_log: Stores, stream_name: str
) -> None:
    streams = [f"{stream_name}-{i}" for i in range(100)]
    before = event_log.writer.commits.transactions
    results = await asyncio.gather(
        *(
            event_log.writer.insert_batch(stream, "numeric", [record(str(n)), record(str(n + 1))])
            for n in (1, 3)
            for stream in streams
        )
    )
    assert results == [InsertResult(2, 0)] * 200
    transactions = event_log.writer.commits.transactions - before
    assert transactions <= 10, f"200 batches took {transactions} transactions"
    for stream in streams:
        assert [row[0] for row in await stored(event_log, stream)] == ["1", "2", "3", "4"]


async def test_pipelined_batches_of_one_stream_keep_their_order(
    event_log: Stores, stream_name: str
) -> None:
    """Batches written by several lanes at once still enter the log (``seq``) in the
    order they were submitted, small and large alike."""
    sizes = [SMALL_BATCH * 3, 1, SMALL_BATCH * 2, 5, SMALL_BATCH + 1, 2, SMALL_BATCH * 4, 3]
    jobs, previous, n = [], None, 0
    for size in sizes:
        batch = [record(str(i)) for i in range(n, n + size)]
        n += size
        previous = event_log.writer.submit_batch(stream_name, "numeric", batch, after=previous)
        jobs.append(previous)
    results = [await event_log.writer.committed(job) for job in jobs]
    assert [result.new_rows for result in results] == sizes
    assert [int(row[0]) for row in await stored(event_log, stream_name)] == list(range(n))


async def test_counts_stay_per_batch_inside_one_transaction(
    event_log: Stores, stream_name: str
) -> None:
    """The same key in two batches of one group: the first batch stores it."""
    fillers = hold_the_lanes(event_log)
    first = event_log.writer.submit_batch(stream_name, "numeric", [record("1"), record("2")])
    second = event_log.writer.submit_batch(stream_name, "numeric", [record("2"), record("3")])
    idless = [record("", None), record("3", 1), record("", None)]
    third = event_log.writer.submit_batch(stream_name, "numeric", idless)
    assert await event_log.writer.committed(first) == InsertResult(2, 0)
    assert await event_log.writer.committed(second) == InsertResult(1, 1)
    assert await event_log.writer.committed(third) == InsertResult(3, 0)
    await asyncio.gather(*(event_log.writer.committed(job) for job in fillers))
    rows = await stored(event_log, stream_name)
    assert [row[:2] for row in rows] == [
        ("1", 0),
        ("2", 0),
        ("3", 0),
        ("", None),
        ("3", 1),
        ("", None),
    ]


async def test_large_batches_share_the_staging_table_in_one_transaction(
    event_log: Stores, stream_name: str
) -> None:
    """COPY batches of one transaction: the staging table empties only at commit."""
    fillers = hold_the_lanes(event_log)
    size = SMALL_BATCH + 10
    first = [record(str(i)) for i in range(size)]
    second = [record(str(i)) for i in range(size - 5, 2 * size)]
    jobs = [
        event_log.writer.submit_batch(stream_name, "numeric", first),
        event_log.writer.submit_batch(stream_name, "numeric", second),
        event_log.writer.submit_batch(stream_name, "numeric", [record("x1", data="small")]),
    ]
    results = [await event_log.writer.committed(job) for job in jobs]
    assert results == [InsertResult(size, 0), InsertResult(size, 5), InsertResult(1, 0)]
    await asyncio.gather(*(event_log.writer.committed(job) for job in fillers))
    assert len(await stored(event_log, stream_name)) == 2 * size + 1


async def test_bad_text_in_one_batch_does_not_cost_the_others(
    event_log: Stores, stream_name: str
) -> None:
    fillers = hold_the_lanes(event_log)
    good = event_log.writer.submit_batch(f"{stream_name}-good", "numeric", [record("1", data="ok")])
    bad = event_log.writer.submit_batch(stream_name, "numeric", [record("1", data="lone \ud800")])
    assert await event_log.writer.committed(good) == InsertResult(1, 0)
    assert await event_log.writer.committed(bad) == InsertResult(1, 0)
    await asyncio.gather(*(event_log.writer.committed(job) for job in fillers))
    assert await stored(event_log, f"{stream_name}-good") == [("1", 0, "ok")]
    assert await stored(event_log, stream_name) == [("1", 0, "lone \ufffd")]
    (event,) = await event_log.reads.events(stream_name)
    assert event.data == "lone \ud800"  # kept exactly in data_bytes


EXACT_BYTES_SQL = {
    # The README's plain-SQL rule: the exact UTF-8 of every row's data.
    "postgresql": "SELECT COALESCE(data_bytes, convert_to(data, 'UTF8')) FROM sse_events "
    "WHERE stream = :s ORDER BY seq",
    "sqlite": "SELECT COALESCE(data_bytes, CAST(data AS BLOB)) FROM sse_events "
    "WHERE stream = :s ORDER BY seq",
}


@pytest.mark.parametrize("size", [1, SMALL_BATCH + 1])
async def test_nul_in_data_is_stored_losslessly(
    event_log: Stores, stream_name: str, size: int
) -> None:
    """Issue 13 case 7: a WHATWG client can deliver U+0000; ``a\\0b`` reads back exactly,
    through the API and with plain SQL, on both insert paths."""
    fillers = [record(str(i), data=f"plain {i}") for i in range(2, size + 1)]
    batch = [record("1", data="a\x00b"), *fillers]
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(
        size, 0
    )
    assert await event_log.writer.insert_batch(stream_name, "numeric", batch) == InsertResult(
        0, size
    )
    events = await event_log.reads.events(stream_name)
    assert [event.data for event in events] == [r.data for r in batch]
    assert events[0].data == "a\x00b" and events[0].event_id == "1"
    exact = await query(event_log, EXACT_BYTES_SQL[event_log.database.dialect], s=stream_name)
    assert [bytes(row[0]) for row in exact] == [r.data.encode() for r in batch]
    # Ordinary rows read as they are from data; the NUL row says where its data is.
    rows = await query(
        event_log,
        "SELECT data, data_bytes IS NULL FROM sse_events WHERE stream = :s ORDER BY seq",
        s=stream_name,
    )
    assert rows[0] == ("a\ufffdb", False)
    assert rows[1:] == [(r.data, True) for r in fillers]
    later = await event_log.reads.events(stream_name, after_seq=events[0].seq, limit=2)
    assert [event.data for event in later] == [r.data for r in batch[1:3]]


async def test_a_batch_after_a_failed_one_is_never_committed(
    pg_event_log: Stores, stream_name: str
) -> None:
    """The floor (newest id in the log) must not point past a missing batch: a batch
    submitted after one that failed is left out, even in a later transaction, while the
    other batches of that transaction commit."""
    log = pg_event_log
    refused = f"{stream_name}-refused"
    trigger = f"refuse_{stream_name.replace('-', '_')}"
    drop = await refuse_inserts(log, trigger, f"NEW.stream = '{refused}' AND NEW.event_id = '1'")
    try:
        broken = log.writer.submit_batch(refused, "numeric", [record("1")])  # a lane of its own
        fillers = hold_the_lanes(log, taken=1)
        following = log.writer.submit_batch(refused, "numeric", [record("2")], after=broken)
        other = log.writer.submit_batch(stream_name, "numeric", [record("2")])
        await asyncio.gather(*(log.writer.committed(job) for job in fillers))
        with pytest.raises(StoreError, match="refused by the test"):
            await log.writer.committed(broken)
        with pytest.raises(StoreError, match="batch before it failed"):
            await log.writer.committed(following)
        assert await log.writer.committed(other) == InsertResult(1, 0)
    finally:
        await execute(log, drop)
    assert await stored(log, refused) == []
    assert await log.reads.floor(refused) is None


async def refuse_rows(log: Stores, name: str, stream: str) -> str:
    """A trigger that refuses every row of ``stream``; returns the statement dropping it."""
    if log.database.dialect == "postgresql":
        return await refuse_inserts(log, name, f"NEW.stream = '{stream}'")
    await execute(
        log,
        f"CREATE TRIGGER {name} BEFORE INSERT ON sse_events FOR EACH ROW "
        f"WHEN NEW.stream = '{stream}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END",
    )
    return f"DROP TRIGGER {name}"


@pytest.mark.parametrize("size", [1, SMALL_BATCH + 1])
async def test_one_streams_bad_batch_does_not_fail_the_others_in_its_group(
    event_log: Stores, stream_name: str, size: int
) -> None:
    """Invariant 7 / issue 13 case 4: a trigger refuses one stream's rows. The group
    transaction that holds them fails; every other stream's batch of that group commits
    (each written alone), the bad one fails with the database's own message, and the
    batch submitted after it on the same stream is left out."""
    log = event_log
    bad = f"{stream_name}-bad"
    drop = await refuse_rows(log, f"refuse_{stream_name.replace('-', '_')}", bad)
    try:
        fillers = hold_the_lanes(log)
        await asyncio.sleep(0)
        before = log.writer.commits.transactions
        batches = {name: [record(str(n)) for n in range(1, size + 1)] for name in "abc"}
        first = log.writer.submit_batch(f"{stream_name}-a", "numeric", batches["a"])
        refused = log.writer.submit_batch(bad, "numeric", [record("1")])
        second = log.writer.submit_batch(f"{stream_name}-b", "numeric", batches["b"])
        following = log.writer.submit_batch(bad, "numeric", [record("2")], after=refused)
        gap = gap_opened(f"{stream_name}-c", "g", "0", "9")
        third = log.writer.submit_batch(
            f"{stream_name}-c", "numeric", batches["c"], gap_changes=[gap]
        )
        assert log.writer.commits.waiting == 5  # all five wait for one group transaction
        await asyncio.gather(*(log.writer.committed(job) for job in fillers))
        assert await log.writer.committed(first) == InsertResult(size, 0)
        assert await log.writer.committed(second) == InsertResult(size, 0)
        assert await log.writer.committed(third) == InsertResult(size, 0)
        with pytest.raises(StoreError, match=f"refused a batch of stream '{bad}'.*refused by"):
            await log.writer.committed(refused)
        with pytest.raises(StoreError, match="batch before it failed"):
            await log.writer.committed(following)
        assert log.writer.commits.transactions == before + len(fillers) + 1
    finally:
        await execute(log, drop)
    for name in "abc":
        assert len(await stored(log, f"{stream_name}-{name}")) == size
    assert [gap.gap_id for gap in await log.gap_store.gaps(f"{stream_name}-c")] == ["g"]
    assert await stored(log, bad) == []
    assert await log.reads.floor(bad) is None
    # The stream's next attempt, with the database willing again, is written.
    assert await log.writer.insert_batch(bad, "numeric", [record("1")]) == InsertResult(1, 0)


async def test_an_id_too_large_for_the_index_fails_its_batch_alone(
    pg_event_log: Stores, stream_name: str
) -> None:
    """Issue 13 case 4: an id past PostgreSQL's b-tree row limit (~2.7 KB; the reader
    refuses ids over ``max_id_bytes`` first) fails its own batch, not its group."""
    log = pg_event_log
    huge = os.urandom(4000).hex()  # 8,000 characters that do not compress
    fillers = hold_the_lanes(log)
    await asyncio.sleep(0)
    good = log.writer.submit_batch(f"{stream_name}-good", "numeric", [record("1")])
    bad = log.writer.submit_batch(stream_name, "lexicographic", [record(huge)])
    await asyncio.gather(*(log.writer.committed(job) for job in fillers))
    assert await log.writer.committed(good) == InsertResult(1, 0)
    with pytest.raises(StoreError, match=f"refused a batch of stream '{stream_name}'"):
        await log.writer.committed(bad)
    assert await stored(log, stream_name) == []


async def test_a_commit_is_not_queued_behind_other_database_calls(
    event_log: Stores, stream_name: str
) -> None:
    """A burst of connection starts (a failover moves a hundred) fills the database
    threads; the commit lanes have threads of their own, so storing goes on meanwhile."""
    database = event_log.database
    release = threading.Event()
    busy = [
        asyncio.ensure_future(database.run("stand in for a start", release.wait, 30))
        for _ in range(WORKERS * 2)
    ]
    try:
        result = await asyncio.wait_for(
            event_log.writer.insert_batch(stream_name, "numeric", [record("1")]), 10
        )
        assert result == InsertResult(1, 0)
    finally:
        release.set()
        await asyncio.gather(*busy)
