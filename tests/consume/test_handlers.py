"""What a consumer is told must be true (issue #33): an ``async def`` handler is awaited
in its batch's transaction, a callable that returns an awaitable is refused (never
called and dropped), and an at-least-once stream kept past its lease is claimed again
before its next batch. On real PostgreSQL and real SQLite.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.consume import Batch, Consumer, Group
from durable_sse.stores import Stores
from tests.consume.test_consume import group_name, records, running, stored_seqs, until


@pytest.fixture
def sink(log: Stores) -> Iterator[str]:
    """A table the handlers write to through ``tx``."""
    table = "consume_sink_" + uuid.uuid4().hex[:8]
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE TABLE {table} (stream TEXT, seq BIGINT)")
    yield table
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE {table}")


def written(log: Stores, table: str) -> list[int]:
    with log.database.engine.connect() as connection:
        return sorted(r[0] for r in connection.exec_driver_sql(f"SELECT seq FROM {table}"))


def position(log: Stores, group: str, stream: str) -> dict[str, Any]:
    with log.database.engine.connect() as connection:
        row = connection.execute(
            sa.text("SELECT * FROM sse_consumers WHERE group_name = :g AND stream = :s"),
            {"g": group, "s": stream},
        ).one()
    return dict(row._mapping)


def insert(tx: Any, table: str, batch: Batch) -> None:
    for event in batch.events:
        tx.execute(
            sa.text(f"INSERT INTO {table} VALUES (:s, :q)"), {"s": event.stream, "q": event.seq}
        )


# -- async handlers ---------------------------------------------------------------------


async def test_an_async_handler_is_awaited_in_its_batchs_transaction(
    log: Stores, db_url: str, stream_name: str, sink: str
) -> None:
    """Its writes through ``tx`` land exactly once; its raise rolls them back."""
    await log.writer.insert_batch(stream_name, "numeric", records(1, 5))
    failures = [2]

    async def handle(tx: Any, batch: Batch) -> None:
        insert(tx, sink, batch)
        await asyncio.sleep(0.01)  # the loop runs while the transaction stays open
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("after writing")

    group = Group(group_name(), streams=[stream_name], batch_size=2)
    consumer = Consumer(db_url, group)
    async with running(consumer, handle):
        await until(lambda: len(written(log, sink)) >= 5)
        await asyncio.sleep(0.3)
    stored = await stored_seqs(log, stream_name)
    assert written(log, sink) == stored
    assert position(log, group.name, stream_name)["position_seq"] == stored[-1]
    assert failures == [0]


async def test_a_callable_returning_a_coroutine_is_refused(
    log: Stores, db_url: str, stream_name: str, sink: str
) -> None:
    """Not awaited and dropped: run() raises TypeError, nothing is written, the position
    does not move."""
    await log.writer.insert_batch(stream_name, "numeric", records(1, 3))
    ran = []

    async def effect(tx: Any, batch: Batch) -> None:
        ran.append(batch)
        insert(tx, sink, batch)

    group = Group(group_name(), streams=[stream_name])
    consumer = Consumer(db_url, group)
    try:
        with pytest.raises(TypeError, match="async def"):
            await asyncio.wait_for(consumer.run(lambda tx, batch: effect(tx, batch)), 10)
    finally:
        await consumer.close()
    assert ran == [] and written(log, sink) == []
    row = position(log, group.name, stream_name)
    assert row["position_seq"] == 0 and row["owner"] is None


async def test_cancelling_run_rolls_an_async_handlers_batch_back(
    log: Stores, db_url: str, stream_name: str, sink: str
) -> None:
    await log.writer.insert_batch(stream_name, "numeric", records(1, 3))
    inside, cancelled = asyncio.Event(), asyncio.Event()

    async def handle(tx: Any, batch: Batch) -> None:
        insert(tx, sink, batch)
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    group = Group(group_name(), streams=[stream_name])
    consumer = Consumer(db_url, group)
    task = asyncio.create_task(consumer.run(handle))
    try:
        await asyncio.wait_for(inside.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    finally:
        await consumer.close()
    assert cancelled.is_set()
    assert written(log, sink) == []
    assert position(log, group.name, stream_name)["position_seq"] == 0


def test_async_handlers_are_recognised_up_front() -> None:
    from durable_sse.consume.handlers import is_async_handler

    async def coroutine_function(tx: Any, batch: Batch) -> None: ...

    def function(tx: Any, batch: Batch) -> None: ...

    class AsyncCallable:
        async def __call__(self, tx: Any, batch: Batch) -> None: ...

    class SyncCallable:
        def __call__(self, tx: Any, batch: Batch) -> None: ...

    for handler in (
        coroutine_function,
        functools.partial(coroutine_function),
        AsyncCallable(),
        functools.partial(AsyncCallable()),
    ):
        assert is_async_handler(handler), handler
    for handler in (function, functools.partial(function), SyncCallable(), lambda tx, b: None):
        assert not is_async_handler(handler), handler


# -- at least once: a kept stream and its lease ------------------------------------------


async def test_a_kept_stream_whose_lease_lapsed_is_not_handed_out_beside_its_new_owner(
    log: Stores, db_url: str, stream_name: str
) -> None:
    """The first member acks (and keeps the stream), stalls past its lease; the second
    takes the stream over. The first must not be handed the stream's next batch."""
    await log.writer.insert_batch(stream_name, "numeric", records(1, 4))
    stored = await stored_seqs(log, stream_name)
    group = Group(group_name(), streams=[stream_name], batch_size=2, lease=0.6)
    first, second = Consumer(db_url, group), Consumer(db_url, group)
    stop = asyncio.Event()
    try:
        a = first.batches(stop=stop)
        batch = await asyncio.wait_for(anext(a), 10)
        await batch.ack()  # a full batch: the first member keeps the stream
        await asyncio.sleep(0.8)
        b = second.batches(stop=stop)
        taken = await asyncio.wait_for(anext(b), 10)
        assert [e.seq for e in taken.events] == stored[2:]
        await taken.ack()
        with pytest.raises(TimeoutError):
            duplicate = await asyncio.wait_for(anext(a), 1.5)
            pytest.fail(f"handed out beside its new owner: {[e.seq for e in duplicate.events]}")
    finally:
        stop.set()
        await first.close()
        await second.close()


async def test_a_kept_stream_nobody_took_over_goes_on_after_a_stall(
    log: Stores, db_url: str, stream_name: str
) -> None:
    """Past its lease with nobody else there, the kept stream's lease is renewed: the
    next batch is a first attempt, and its ack moves the position."""
    await log.writer.insert_batch(stream_name, "numeric", records(1, 4))
    stored = await stored_seqs(log, stream_name)
    group = Group(group_name(), streams=[stream_name], batch_size=2, lease=0.6)
    consumer = Consumer(db_url, group)
    stop = asyncio.Event()
    try:
        a = consumer.batches(stop=stop)
        await (await asyncio.wait_for(anext(a), 10)).ack()
        await asyncio.sleep(0.8)
        batch = await asyncio.wait_for(anext(a), 10)
        assert [e.seq for e in batch.events] == stored[2:] and batch.attempt == 1
        await batch.ack()
        assert position(log, group.name, stream_name)["position_seq"] == stored[-1]
    finally:
        stop.set()
        await consumer.close()
