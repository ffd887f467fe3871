"""Reused ids in the event log (an id stored with other data), on real PostgreSQL and SQLite."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.ids import IdOrder, sort_key
from durable_sse.log.keys import FOLLOWER_WINDOW, FollowerKeys, data_digest
from durable_sse.log.records import EventRecord, InsertResult
from durable_sse.log.staging import SMALL_BATCH
from durable_sse.stores import Stores
from tests.log.helpers import (
    T0,
    generation,
    hold_the_lanes,
    stored,
)


def data_of(rows: list[tuple[Any, ...]]) -> list[str]:
    return [row[2] for row in rows]


@pytest.mark.parametrize("count", [5, SMALL_BATCH + 5])
async def test_an_id_stored_with_other_data_is_kept_and_a_resend_is_a_duplicate(
    event_log: Stores, stream_name: str, count: int
) -> None:
    """A server restarts its counter: ids 1..n again with new data are new events, kept
    beside the old ones and reported as reused, never as duplicates; either use re-sent
    is a duplicate, and a third use gets rows of its own. (PostgreSQL: ``count`` 5 goes
    through one multi-row INSERT, the larger one through the staging table.)"""
    log, order = event_log, "numeric"
    ids = tuple(str(n) for n in range(1, count + 1))
    assert await log.writer.insert_batch(stream_name, order, generation("a", 1, count)) == (
        InsertResult(count, 0)
    )
    restarted = generation("b", 1, count)
    assert await log.writer.insert_batch(stream_name, order, restarted) == InsertResult(
        count, 0, ids
    )
    assert await log.writer.insert_batch(stream_name, order, restarted) == InsertResult(0, count)
    assert await log.writer.insert_batch(stream_name, order, generation("a", 1, count)) == (
        InsertResult(0, count)
    )
    third = generation("c", 1, 2)
    assert await log.writer.insert_batch(stream_name, order, third) == InsertResult(
        2, 0, ("1", "2")
    )
    assert await log.writer.insert_batch(stream_name, order, third) == InsertResult(0, 2)
    # Reused ids beside new ones in one batch: the reused rows go in after the others.
    mixed = [*generation("d", 1, 1), *generation("d", count + 1, count + 2)]
    assert await log.writer.insert_batch(stream_name, order, mixed) == InsertResult(3, 0, ("1",))
    assert data_of(await stored(log, stream_name)) == [
        *(f"a{n}" for n in range(1, count + 1)),
        *(f"b{n}" for n in range(1, count + 1)),
        "c1",
        "c2",
        f"d{count + 1}",
        f"d{count + 2}",
        "d1",
    ]
    assert await log.reads.floor(stream_name) == str(count + 2)
    page = await log.reads.stored_keys(stream_name, order, after=None, limit=10)
    assert [key[0] for key in page.keys][:4] == ["1"] * 4  # a1, b1, c1 and d1


@pytest.mark.parametrize("large", [False, True])
async def test_reused_ids_are_counted_per_batch_in_a_group_of_streams(
    event_log: Stores, stream_name: str, large: bool
) -> None:
    """One group transaction of several streams' batches: each batch gets its own new
    rows and reused ids, a reused event repeated by a later batch of the group is that
    batch's duplicate. ``large``: the group goes through the staging table (PostgreSQL)."""
    log, order, other = event_log, "numeric", f"{stream_name}-other"
    await log.writer.insert_batch(stream_name, order, generation("a", 1, 5))
    await log.writer.insert_batch(other, order, generation("a", 1, 3))
    filler = generation("f", 1, SMALL_BATCH + 1) if large else generation("f", 1, 1)
    before = log.writer.commits.transactions
    fillers = hold_the_lanes(log)
    jobs = [
        log.writer.submit_batch(stream_name, order, generation("b", 1, 2)),
        log.writer.submit_batch(other, order, generation("a", 1, 4)),
        log.writer.submit_batch(stream_name, order, generation("b", 2, 3)),
        log.writer.submit_batch(f"{stream_name}-filler", order, filler),
        log.writer.submit_batch(other, order, generation("z", 3, 3)),
        log.writer.submit_batch(
            stream_name, order, [*generation("a", 5, 5), *generation("b", 6, 6)]
        ),
    ]
    results = [await log.writer.committed(job) for job in jobs]
    await asyncio.gather(*(log.writer.committed(job) for job in fillers))
    assert log.writer.commits.transactions - before == len(fillers) + 1  # the six: one group
    assert results == [
        InsertResult(2, 0, ("1", "2")),
        InsertResult(1, 3),
        InsertResult(1, 1, ("3",)),
        InsertResult(len(filler), 0),
        InsertResult(1, 0, ("3",)),
        InsertResult(1, 1),
    ]
    assert sorted(data_of(await stored(log, stream_name))) == sorted(
        ["a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3", "b6"]
    )
    assert sorted(data_of(await stored(log, other))) == ["a1", "a2", "a3", "a4", "z3"]


async def test_followers_of_a_reused_id_are_kept_apart_from_the_earlier_uses(
    event_log: Stores, stream_name: str
) -> None:
    """A follower identical to one the earlier use of its id stored (``ping``) is kept
    with its carrier; a connection that never read the carrier cannot tell (see
    ``durable_sse.log.keys``)."""
    log, order = event_log, "numeric"
    first = generation("a", 1, 1, followers=("ping", "x"))
    reused = generation("b", 1, 1, followers=("ping", "y"))
    assert await log.writer.insert_batch(stream_name, order, first) == InsertResult(3, 0)
    assert await log.writer.insert_batch(stream_name, order, reused) == InsertResult(3, 0, ("1",))
    assert await log.writer.insert_batch(stream_name, order, reused) == InsertResult(0, 3)
    assert await log.writer.insert_batch(stream_name, order, first) == InsertResult(0, 3)
    keys = FollowerKeys()
    inside = EventRecord(
        event_id="1",
        event_ord=1,
        event_type="message",
        data="ping",
        received_at=T0,
        follower_key=keys.follower("message", "ping", 1),
    )
    assert await log.writer.insert_batch(stream_name, order, [inside]) == InsertResult(0, 1)
    assert data_of(await stored(log, stream_name)) == ["a1", "ping", "x", "y", "b1", "ping"]


async def test_a_reused_id_at_or_below_the_retention_horizon_is_left_to_the_horizon(
    event_log: Stores, stream_name: str
) -> None:
    """Retention deleted up to 3: ids 1..3 sent again are dropped by the horizon filter
    before the insert (its own count), never kept as reused; 4 and 5 are kept."""
    log, order = event_log, "numeric"
    await log.writer.insert_batch(stream_name, order, generation("a", 1, 5))

    def set_horizon() -> None:
        with log.database.engine.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO sse_retention (stream, horizon_id, horizon_key, deleted_rows, "
                    "updated_at) VALUES (:s, '3', :k, 3, :t)"
                ),
                {"s": stream_name, "k": sort_key("3", IdOrder.NUMERIC), "t": T0},
            )

    await asyncio.to_thread(set_horizon)
    result = await log.writer.insert_batch(stream_name, order, generation("b", 1, 5))
    assert (result.new_rows, result.reused) == (2, ("4", "5"))
    assert data_of(await stored(log, stream_name)) == ["a1", "a2", "a3", "a4", "a5", "b4", "b5"]


def test_the_digest_is_the_one_stored_follower_keys_were_made_with() -> None:
    """``data_digest`` builds each type's prefix once; the bytes it hashes (and so every
    follower key stored by schema 3) are unchanged."""
    assert data_digest("message", "a1").hex() == "9ab1627d7c1410871453ce8d131c006c"
    for _ in range(2):  # the type's prefix built, then reused
        assert data_digest("ü", "x\x00y").hex() == "f19fe5afb77ee0a36ead75c4282a1f86"


def test_follower_counts_restart_each_window() -> None:
    """Memory per connection is bounded: counts cover FOLLOWER_WINDOW followers, and the
    window's number is in the key, so the next window never collides with this one."""
    keys = FollowerKeys()
    first = keys.follower("message", "p", 1)
    assert keys.follower("message", "p", 2) != first
    later = keys.follower("message", "p", FOLLOWER_WINDOW + 1)
    assert later not in (first, keys.follower("message", "p", 3))
    assert len(keys._seen) == 1
