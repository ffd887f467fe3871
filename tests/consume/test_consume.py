"""Consumers of the log (durable_sse.consume), on real PostgreSQL and real SQLite.

The crash tests (SIGKILL at random moments) are in tests/consume/test_crash.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.consume import (
    Batch,
    Consumer,
    Event,
    Gap,
    GapClosed,
    Group,
    LeaseLostError,
    OnMaxHold,
    OnPoison,
    Start,
    Truncated,
    retention_holds,
)
from durable_sse.consume.items import read_items
from durable_sse.consume.model import Position
from durable_sse.gaps.model import GapChange, GapRecord
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores
from tests.log.helpers import gap_opened
from tests.sim.stores import MemoryEventLog

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def records(first: int, last: int, *, at: datetime | None = None, data: str = "d") -> list:
    moment = at or datetime.now(UTC)
    return [EventRecord(str(n), 0, "message", f"{data}{n}", moment) for n in range(first, last + 1)]


def group_name() -> str:
    return "g-" + uuid.uuid4().hex[:10]


async def stored_seqs(log: Stores, stream: str) -> list[int]:
    return [event.seq for event in await log.reads.events(stream, limit=100_000)]


class Collector:
    """An exactly-once handler that remembers what it was given."""

    def __init__(self, fail: Callable[[Batch], bool] | None = None) -> None:
        self.items: list[Any] = []
        self.batches: list[Batch] = []
        self.fail = fail

    def __call__(self, tx: Any, batch: Batch) -> None:
        if self.fail is not None and self.fail(batch):
            raise RuntimeError("the handler refuses this batch")
        self.batches.append(batch)
        self.items.extend(batch.items)

    @property
    def seqs(self) -> list[int]:
        return [item.seq for item in self.items if isinstance(item, Event)]


@contextlib.asynccontextmanager
async def running(consumer: Consumer, handler: Any) -> AsyncIterator[Consumer]:
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(handler, stop=stop))
    try:
        await consumer.start()
        await asyncio.wait_for(consumer.wait_listening(), 10)
        yield consumer
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await consumer.close()


async def until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


# -- exactly once ----------------------------------------------------------------------


async def test_exactly_once_delivers_every_event_in_order_with_exact_data(
    log: Stores, db_url: str, stream_name: str
) -> None:
    events = records(1, 7)
    events[2] = EventRecord("3", 0, "message", "nul\x00inside", events[2].received_at)
    await log.writer.insert_batch(stream_name, "numeric", events)
    handler = Collector()
    consumer = Consumer(db_url, Group(group_name(), streams=[stream_name], batch_size=3))
    async with running(consumer, handler):
        await until(lambda: len(handler.seqs) == 7)
        await log.writer.insert_batch(stream_name, "numeric", records(8, 9))
        await until(lambda: len(handler.seqs) == 9)
    assert handler.seqs == await stored_seqs(log, stream_name)
    datas = [item.data for item in handler.items]
    assert datas[2] == "nul\x00inside" and datas[0] == "d1" and datas[-1] == "d9"
    assert [len(batch.items) for batch in handler.batches[:3]] == [3, 3, 1]


async def test_the_handler_writes_and_the_position_commit_together(
    log: Stores, db_url: str, stream_name: str
) -> None:
    """A failing handler rolls its own writes back with the batch; the redelivery writes
    them once."""
    table = "consume_sink_" + uuid.uuid4().hex[:8]
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE TABLE {table} (stream TEXT, seq BIGINT)")
    await log.writer.insert_batch(stream_name, "numeric", records(1, 5))
    failures = [2]

    def handler(tx: Any, batch: Batch) -> None:
        for event in batch.events:
            tx.execute(
                sa.text(f"INSERT INTO {table} VALUES (:s, :q)"), {"s": event.stream, "q": event.seq}
            )
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("after writing")

    consumer = Consumer(db_url, Group(group_name(), streams=[stream_name]))
    async with running(consumer, handler):

        def written() -> list[int]:
            with log.database.engine.connect() as connection:
                return [r[0] for r in connection.exec_driver_sql(f"SELECT seq FROM {table}")]

        await until(lambda: len(written()) == 5)
        await asyncio.sleep(0.3)
        assert sorted(written()) == await stored_seqs(log, stream_name)
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE {table}")


async def test_a_group_starts_earliest_latest_at_a_seq_or_a_time(
    log: Stores, db_url: str, stream_name: str
) -> None:
    await log.writer.insert_batch(stream_name, "numeric", records(1, 3, at=T0))
    await log.writer.insert_batch(stream_name, "numeric", records(4, 6, at=T0 + timedelta(hours=1)))
    seqs = await stored_seqs(log, stream_name)
    starts = {
        "earliest": (Start.earliest(), seqs),
        "latest": (Start.latest(), []),
        "seq": (Start.after_seq(seqs[1]), seqs[2:]),
        "time": (Start.at_time(T0 + timedelta(minutes=30)), seqs[3:]),
    }
    for name, (start, expected) in starts.items():
        handler = Collector()
        consumer = Consumer(db_url, Group(group_name(), streams=[stream_name], start=start))
        async with running(consumer, handler):
            await asyncio.sleep(0.5)
            await until(lambda expected=expected, handler=handler: handler.seqs == expected)
        assert handler.seqs == expected, name


# -- item 1: a stream's rows become visible in seq order, also with two writers ---------


async def test_a_consumer_never_skips_a_row_a_slower_writer_commits_later(
    pg_url: str, stream_name: str
) -> None:
    """Two writers of one stream (two processes' event logs): writer A inserts its row
    (taking the smaller seq) and is held before its commit; writer B writes the next
    row. Without the per-stream lock B commits first, a consumer reads past A's seq, and
    A's row, committed a moment later, is never delivered."""
    writer_a, writer_b = Stores.open(pg_url), Stores.open(pg_url)
    await writer_a.create_schema()
    opened = GapRecord(
        gap_id="g",
        stream=stream_name,
        kind="comment",
        start_id="1",
        notice_id="1",
        seen_at=T0.isoformat(),
    )
    await writer_a.writer.committed(
        writer_a.writer.submit_batch(
            stream_name, "numeric", records(1, 1), gap_changes=[GapChange("g", opened=opened)]
        )
    )
    handler = Collector()
    consumer = Consumer(pg_url, Group(group_name(), streams=[stream_name], batch_size=10))
    holder = writer_a.database.engine.connect()
    try:
        async with running(consumer, handler):
            await until(lambda: len(handler.seqs) == 1)
            # Hold A before its commit: its batch updates the gap row, which we lock.
            holder.begin()
            holder.exec_driver_sql(
                "SELECT 1 FROM sse_gaps WHERE stream = %s AND gap_id = 'g' FOR UPDATE",
                (stream_name,),
            )
            job_a = writer_a.writer.submit_batch(
                stream_name, "numeric", records(2, 2), gap_changes=[GapChange("g", reread_to="2")]
            )
            await until(lambda: _waiting_on_gap_row(pg_url, stream_name))
            task_b = asyncio.create_task(
                writer_b.writer.insert_batch(stream_name, "numeric", records(3, 3))
            )
            await asyncio.sleep(1.0)  # B commits now, without the lock; the consumer reads
            holder.rollback()
            await writer_a.writer.committed(job_a)
            await task_b
            stored = await stored_seqs(writer_a, stream_name)
            assert len(stored) == 3
            with contextlib.suppress(AssertionError):
                await until(lambda: len(handler.seqs) >= 3, timeout=3)
            assert handler.seqs == stored
    finally:
        holder.close()
        await writer_a.close()
        await writer_b.close()


def _waiting_on_gap_row(pg_url: str, stream: str) -> bool:
    """Whether a backend waits for a lock while updating the stream's gap rows."""
    import psycopg

    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE '%%FROM sse_gaps%%' "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
        return bool(row and row[0])


# -- item 2: gaps in the stream's order ------------------------------------------------


def gap_change(stream: str, gap_id: str, start: str, end: str | None) -> GapChange:
    return gap_opened(stream, gap_id, start, end, announced=0)


async def submit(log: Stores, stream: str, events: list, *changes: GapChange) -> None:
    await log.writer.committed(
        log.writer.submit_batch(stream, "numeric", events, gap_changes=changes)
    )


async def test_gaps_are_met_between_the_events_where_they_happened(
    log: Stores, db_url: str, stream_name: str
) -> None:
    """A gap comes after the events stored before it was recorded; its closing after
    those stored before it closed, also when it closes in a transaction that stores no
    row, after the consumer consumed the newest event."""
    handler = Collector()
    consumer = Consumer(db_url, Group(group_name(), streams=[stream_name]), poll_interval=0.3)
    async with running(consumer, handler):
        await submit(log, stream_name, records(1, 3))
        await submit(log, stream_name, records(4, 5), gap_change(stream_name, "g", "3", "4"))
        await submit(log, stream_name, records(6, 6))
        await until(lambda: len(handler.seqs) == 6)
        await submit(log, stream_name, [], GapChange("g", close=True, contiguous=True))
        await until(lambda: any(isinstance(item, GapClosed) for item in handler.items))
        await submit(log, stream_name, records(7, 7))
        await until(lambda: len(handler.seqs) == 7)

    def shown(item: Any) -> str:
        if isinstance(item, Event):
            return item.event_id
        return f"{type(item).__name__}:{item.gap_id}"

    assert [shown(item) for item in handler.items] == [
        "1", "2", "3", "4", "5", "Gap:g", "6", "GapClosed:g", "7",
    ]  # fmt: skip
    seqs = await stored_seqs(log, stream_name)
    gap = next(item for item in handler.items if isinstance(item, Gap))
    closed = next(item for item in handler.items if isinstance(item, GapClosed))
    assert (gap.after_seq, gap.start_id, gap.end_id) == (seqs[4], "3", "4")
    assert (closed.after_seq, closed.state, closed.missing, closed.lost) == (
        seqs[5], "repaired", 0, False,
    )  # fmt: skip
    # A group that starts later reads the same order from the store.
    with log.database.engine.connect() as connection:
        read = read_items(connection, stream_name, Position(), limit=100)
    assert [shown(item) for item in read.items] == [shown(item) for item in handler.items]


# -- item 5: poison ----------------------------------------------------------------------


def refuses_data(data: str) -> Callable[[Batch], bool]:
    return lambda batch: any(event.data == data for event in batch.events)


async def test_a_poison_event_parks_the_group_on_its_stream_only(
    log: Stores, db_url: str, stream_name: str
) -> None:
    other = stream_name + "-other"
    await log.writer.insert_batch(stream_name, "numeric", records(1, 5))
    await log.writer.insert_batch(other, "numeric", records(1, 2, data="x"))
    handler = Collector(fail=refuses_data("d3"))
    group = Group(group_name(), streams=[stream_name, other], max_attempts=2)
    consumer = Consumer(db_url, group)
    async with running(consumer, handler):
        await until(lambda: _row(log, group.name, stream_name)["parked_at"] is not None)
        await until(lambda: len(handler.seqs) == 4)
        await asyncio.sleep(0.3)
    delivered = {(event.stream, event.event_id) for event in handler.items}
    assert delivered == {(stream_name, "1"), (stream_name, "2"), (other, "1"), (other, "2")}
    row = _row(log, group.name, stream_name)
    seqs = await stored_seqs(log, stream_name)
    assert row["position_seq"] == seqs[1]
    assert "event seq" in row["parked_reason"] and "refuses this batch" in row["parked_reason"]


async def test_a_poison_event_goes_to_the_dead_letters_and_the_stream_goes_on(
    log: Stores, db_url: str, stream_name: str
) -> None:
    await log.writer.insert_batch(stream_name, "numeric", records(1, 5))
    await log.writer.insert_batch(
        stream_name, "numeric", [EventRecord("6", 0, "message", "nul\x00", datetime.now(UTC))]
    )
    handler = Collector(fail=lambda b: any(e.data in ("d3", "nul\x00") for e in b.events))
    group = Group(
        group_name(), streams=[stream_name], max_attempts=2, on_poison=OnPoison.DEAD_LETTER
    )
    seqs = await stored_seqs(log, stream_name)
    consumer = Consumer(db_url, group)
    async with running(consumer, handler):
        await until(lambda: len(handler.seqs) == 4)
        await until(lambda: _row(log, group.name, stream_name)["position_seq"] == seqs[-1])
    assert handler.seqs == [seqs[0], seqs[1], seqs[3], seqs[4]]
    with log.database.engine.connect() as connection:
        dead = connection.execute(
            sa.text(
                "SELECT seq, kind, event_id, data, data_bytes, error, attempts "
                "FROM sse_dead_letters WHERE group_name = :g ORDER BY seq"
            ),
            {"g": group.name},
        ).all()
    assert [(row.seq, row.kind, row.event_id) for row in dead] == [
        (seqs[2], "event", "3"),
        (seqs[5], "event", "6"),
    ]
    assert dead[0].data == "d3" and dead[0].data_bytes is None and dead[0].attempts == 2
    assert bytes(dead[1].data_bytes).decode() == "nul\x00"
    assert "RuntimeError: the handler refuses this batch" in dead[0].error


def _row(log: Stores, group: str, stream: str) -> dict[str, Any]:
    with log.database.engine.connect() as connection:
        row = connection.execute(
            sa.text("SELECT * FROM sse_consumers WHERE group_name = :g AND stream = :s"),
            {"g": group, "s": stream},
        ).one()
    return dict(row._mapping)


# -- at least once -------------------------------------------------------------------------


async def test_at_least_once_acks_move_the_position_and_a_zombie_ack_is_refused(
    log: Stores, db_url: str, stream_name: str
) -> None:
    await log.writer.insert_batch(stream_name, "numeric", records(1, 6))
    stored = await stored_seqs(log, stream_name)
    group = Group(group_name(), streams=[stream_name], batch_size=2, lease=0.6)
    first, second = Consumer(db_url, group), Consumer(db_url, group)
    stop = asyncio.Event()
    try:
        a = first.batches(stop=stop)
        zombie = await asyncio.wait_for(anext(a), 10)
        assert [e.seq for e in zombie.events] == stored[:2] and zombie.attempt == 1
        # The first process stalls past its lease; the second takes the stream over and
        # is given the same batch again.
        await asyncio.sleep(0.8)
        b = second.batches(stop=stop)
        again = await asyncio.wait_for(anext(b), 10)
        assert [e.seq for e in again.events] == stored[:2] and again.attempt == 2
        with pytest.raises(LeaseLostError):
            await zombie.ack()
        await again.ack()
        got = list(again.events)
        while len(got) < 6:
            batch = await asyncio.wait_for(anext(b), 10)
            got += batch.events
            await batch.ack()
        assert [e.seq for e in got] == stored
        assert _row(log, group.name, stream_name)["position_seq"] == stored[-1]
        # An ack after the lease ran out is refused even when nobody took over.
        await log.writer.insert_batch(stream_name, "numeric", records(7, 7))
        late = await asyncio.wait_for(anext(b), 10)
        await asyncio.sleep(0.8)
        with pytest.raises(LeaseLostError):
            await late.ack()
        redelivered = await asyncio.wait_for(anext(b), 10)
        assert redelivered.events[0].event_id == "7" and redelivered.attempt == 2
        await redelivered.ack()
    finally:
        stop.set()
        await first.close()
        await second.close()


async def test_processes_of_one_group_share_its_streams_each_event_once(
    log: Stores, db_url: str, stream_name: str
) -> None:
    streams = [f"{stream_name}-{n}" for n in range(4)]
    group = Group(group_name(), streams=streams, batch_size=5)
    handlers = [Collector(), Collector()]
    consumers = [Consumer(db_url, group), Consumer(db_url, group)]
    async with running(consumers[0], handlers[0]), running(consumers[1], handlers[1]):
        for round_ in range(3):
            for stream in streams:
                await log.writer.insert_batch(
                    stream, "numeric", records(round_ * 10 + 1, round_ * 10 + 10)
                )
        await until(lambda: sum(len(h.seqs) for h in handlers) >= 120, timeout=30)
        await asyncio.sleep(0.3)
    for stream in streams:
        got = sorted(
            (item for h in handlers for item in h.items if item.stream == stream),
            key=lambda item: item.seq,
        )
        assert [item.seq for item in got] == await stored_seqs(log, stream)
        # in order within each process's share, too
        for h in handlers:
            mine = [item.seq for item in h.items if item.stream == stream]
            assert mine == sorted(mine)


# -- item 4: wake-ups ------------------------------------------------------------------------


async def test_a_killed_listen_connection_comes_back(pg_url: str, stream_name: str) -> None:
    """With the safety-net poll out of the way (an hour), events still arrive within
    moments after the LISTEN connection is terminated: it listens again, and reads every
    stream once."""
    import psycopg

    log = Stores.open(pg_url)
    await log.create_schema()
    handler = Collector()
    consumer = Consumer(pg_url, Group(group_name(), streams=[stream_name]), poll_interval=3600)
    try:
        async with running(consumer, handler):
            await log.writer.insert_batch(stream_name, "numeric", records(1, 2))
            await until(lambda: len(handler.seqs) == 2, timeout=5)
            assert consumer.wakeups.listens == 1
            with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (consumer.wakeups.backend_pid,))
            await log.writer.insert_batch(stream_name, "numeric", records(3, 3))  # while down
            await until(lambda: consumer.wakeups.listens == 2, timeout=10)
            await until(lambda: len(handler.seqs) == 3, timeout=5)  # the catch-up read
            await log.writer.insert_batch(stream_name, "numeric", records(4, 5))
            await until(lambda: len(handler.seqs) == 5, timeout=5)  # notified again
        assert handler.seqs == await stored_seqs(log, stream_name)
    finally:
        await log.close()


async def test_sqlite_polling_costs_nothing_when_idle(tmp_path: Path, stream_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    log = Stores.open(url)
    await log.create_schema()
    handler = Collector()
    consumer = Consumer(url, Group(group_name(), streams=[stream_name]), poll_interval=3600)
    try:
        async with running(consumer, handler):
            await log.writer.insert_batch(stream_name, "numeric", records(1, 3))
            await until(lambda: len(handler.seqs) == 3, timeout=5)
            await asyncio.sleep(0.3)
            poller = consumer.wakeups
            queries, checks = poller.queries, poller.checks  # type: ignore[attr-defined]
            await asyncio.sleep(1.0)
            assert poller.checks > checks + 10  # type: ignore[attr-defined]
            assert poller.queries == queries  # type: ignore[attr-defined]
            await log.writer.insert_batch(stream_name, "numeric", records(4, 4))
            await until(lambda: len(handler.seqs) == 4, timeout=2)
    finally:
        await log.close()


# -- item 6: retention knows consumers -------------------------------------------------------


async def test_retention_keeps_what_a_holding_group_has_not_consumed_up_to_max_hold(
    db_url: str, stream_name: str
) -> None:
    log = Stores.open(db_url, consumer_holds=retention_holds)
    await log.create_schema()
    try:
        await log.writer.insert_batch(stream_name, "numeric", records(1, 6, at=T0))
        await log.writer.insert_batch(
            stream_name, "numeric", records(7, 7)
        )  # new: the table's newest
        seqs = await stored_seqs(log, stream_name)
        await log.checkpoints.advance_lagging(
            stream_name, "numeric", window=0, now=datetime.now(UTC)
        )
        holding = Group(group_name(), streams=[stream_name], hold_retention=True,
                        start=Start.after_seq(seqs[2]))  # fmt: skip
        lapsed = Group(group_name(), streams=[stream_name], hold_retention=True, max_hold=60)
        erring = Group(group_name(), streams=[stream_name], hold_retention=True, max_hold=60,
                       on_max_hold=OnMaxHold.ERROR)  # fmt: skip
        for group in (holding, lapsed, erring):
            consumer = Consumer(db_url, group)
            await consumer.start()
            await consumer.close()
        run = await log.prune.apply_retention(
            stream_name, "numeric", cutoff=datetime.now(UTC) + timedelta(days=1)
        )
        assert run.held_by_consumers == (holding.name,)
        assert await stored_seqs(log, stream_name) == seqs[3:]  # 4, 5 held, 6 and 7 fenced
        handler = Collector()
        async with running(Consumer(db_url, lapsed), handler):
            await until(lambda: len(handler.seqs) == 4)
        first = handler.items[0]
        assert isinstance(first, Truncated) and (first.after_seq, first.through_seq) == (
            0, seqs[2],
        )  # fmt: skip
        assert handler.seqs == seqs[3:]
        # A group that chose to hear of it as an error parks instead.
        async with running(Consumer(db_url, erring), Collector()):
            await until(lambda: _row(log, erring.name, stream_name)["parked_at"] is not None)
    finally:
        await log.close()


# -- the rest: every stream, metrics ---------------------------------------------------------


async def test_a_group_of_every_stream_finds_new_streams(tmp_path: Path, stream_name: str) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    log = Stores.open(url)
    await log.create_schema()
    try:
        await log.writer.insert_batch(stream_name + "-a", "numeric", records(1, 2))
        handler = Collector()
        consumer = Consumer(url, Group(group_name()), poll_interval=0.3)
        async with running(consumer, handler):
            await until(lambda: len(handler.seqs) == 2)
            await log.writer.insert_batch(stream_name + "-b", "numeric", records(1, 3))
            await until(lambda: len(handler.seqs) == 5)
        assert {item.stream for item in handler.items} == {stream_name + "-a", stream_name + "-b"}
    finally:
        await log.close()


async def test_a_consumer_process_serves_its_metrics(pg_url: str, stream_name: str) -> None:
    import socket
    import urllib.request

    from durable_sse.consume import serve_metrics

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    meter = serve_metrics(port, host="127.0.0.1")
    log = Stores.open(pg_url)
    await log.create_schema()
    try:
        await log.writer.insert_batch(stream_name, "numeric", records(1, 4))
        handler = Collector(fail=lambda batch: batch.attempt == 1)  # one redelivery
        group = Group(group_name(), streams=[stream_name])
        async with running(Consumer(pg_url, group, metrics=meter), handler):
            await until(lambda: len(handler.seqs) == 4)

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                return page.read().decode()

        text = await asyncio.to_thread(scrape)
    finally:
        await log.close()
    mine = [line for line in text.splitlines() if group.name in line]
    for name in (
        "durable_sse_consumer_events",
        "durable_sse_consumer_batches",
        "durable_sse_consumer_redeliveries",
        "durable_sse_consumer_handler_latency_seconds_bucket",
        "durable_sse_consumer_lag_seconds",
    ):
        assert any(line.startswith(name) for line in mine), name
    events = next(line for line in mine if line.startswith("durable_sse_consumer_events"))
    assert events.endswith(" 4") and f'stream="{stream_name}"' in events


async def test_consumers_in_one_process_share_one_listen_connection(
    pg_url: str, stream_name: str
) -> None:
    log = Stores.open(pg_url)
    await log.create_schema()
    first, second = Collector(), Collector()
    a = Consumer(pg_url, Group(group_name(), streams=[stream_name]), poll_interval=3600)
    b = Consumer(pg_url, Group(group_name(), streams=[stream_name]), poll_interval=3600)
    try:
        async with running(a, first), running(b, second):
            assert a.wakeups.backend_pid == b.wakeups.backend_pid is not None  # type: ignore[attr-defined]
            await log.writer.insert_batch(stream_name, "numeric", records(1, 3))
            await until(lambda: len(first.seqs) == 3 and len(second.seqs) == 3, timeout=5)
    finally:
        await log.close()


async def test_the_simulations_store_reads_what_the_real_one_reads(
    log: Stores, stream_name: str
) -> None:
    """The simulation suite consumes its memory store through the real merge; the store
    places gap markers and reads rows as the SQL store does. The same commits on both
    read back as the same items, in the same order, from every position."""
    memory = MemoryEventLog(stream_name, "numeric")
    steps: list[tuple[list, tuple[GapChange, ...]]] = [
        (records(1, 3, at=T0), ()),
        (records(4, 5, at=T0), (gap_change(stream_name, "g", "3", "4"),)),
        ([], (gap_change(stream_name, "h", "5", None),)),  # a gap alone, no row
        (records(6, 6, at=T0), ()),
        ([], (GapChange("g", close=True, contiguous=True),)),
        (records(7, 9, at=T0), (GapChange("h", close=True, contiguous=True),)),
        (records(10, 10, at=T0), ()),
    ]
    for events, changes in steps:
        await submit(log, stream_name, events, *changes)
        memory.commit(events, list(changes), now=T0)

    def shown(item: Any) -> str:
        if isinstance(item, Event):
            return item.event_id
        return f"{type(item).__name__}:{item.gap_id}"

    with log.database.engine.connect() as connection:
        real = read_items(connection, stream_name, Position(), limit=100)
        simulated = memory.consumer_read(Position(), limit=100)
        assert [shown(i) for i in real.items] == [shown(i) for i in simulated.items] == [
            "1", "2", "3", "4", "5", "Gap:g", "Gap:h", "6", "GapClosed:g", "7", "8", "9",
            "GapClosed:h", "10",
        ]  # fmt: skip
        # Batch by batch, from every position each store's own batches lead to.
        for limit in (1, 2, 3):
            positions = [(Position(), Position())]
            seen: tuple[list[str], list[str]] = ([], [])
            for _ in range(40):
                (at_real, at_memory) = positions[-1]
                a = read_items(connection, stream_name, at_real, limit=limit)
                b = memory.consumer_read(at_memory, limit=limit)
                seen[0].extend(shown(i) for i in a.items)
                seen[1].extend(shown(i) for i in b.items)
                assert (a.full, len(a.items)) == (b.full, len(b.items))
                positions.append((a.end, b.end))
                if not a.items:
                    break
            assert seen[0] == seen[1] == [shown(i) for i in real.items]
