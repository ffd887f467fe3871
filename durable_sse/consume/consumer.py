"""``Consumer``: run the user's code on every stored event of a group's streams, in order.

Two ways, by where the handler's effect goes:

* **Exactly once** (``await consumer.run(handler)``), for a handler that writes to the
  same database: ``handler(tx, batch)`` (a plain function or an ``async def``) runs
  inside the transaction that reads the batch with the group's position row locked and
  moves that row past it. The handler's writes
  and the move commit together or not at all, so a crash anywhere re-delivers only what
  did not commit (pyeventsourcing's tracking record, in the consumer's own transaction).
* **At least once** (``async for batch in consumer.batches(): …; await batch.ack()``),
  for a handler whose effect goes elsewhere (an HTTP call, a queue, another database).
  The acknowledgement moves the position under the process's lease of the stream; a
  crash between the effect and the ack delivers the batch again, so the effect must be
  idempotent on ``(stream, seq)``.

A stream is the unit of order: one process at a time consumes it (a lease, taken with
``SKIP LOCKED``), so several processes of one group share its streams, and a crashed
process's streams go to the others once its lease expires. Within a process up to
``concurrency`` streams are consumed at once (PostgreSQL; SQLite has one writer).

How the handler runs: the transaction is a sync SQLAlchemy ``Connection`` on a database
thread. A plain function runs right there. An ``async def`` handler (also an object with
an ``async def __call__``, or a ``functools.partial`` of one) is awaited on the event loop
while the thread waits with the transaction open; it gets the same sync ``tx``.
Any other callable that returns an awaitable is refused: its batch rolls back and
``run()`` raises ``TypeError`` (see :mod:`.handlers`). Keep the handler short: it holds
the stream's position row (and on SQLite the database's write lock), and ``tx.execute``
blocks the loop while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import sqlalchemy as sa
from temporalio.common import MetricMeter

from durable_sse.consume.at_least_once import AtLeastOnce
from durable_sse.consume.database import ConsumerDatabase, consumer_engine, normalize_url
from durable_sse.consume.delivery import StreamDelivery
from durable_sse.consume.exactly_once import ExactlyOnce
from durable_sse.consume.handlers import Handler
from durable_sse.consume.metrics import ConsumerMetrics
from durable_sse.consume.model import Batch, Group
from durable_sse.consume.positions import default_owner
from durable_sse.consume.scheduler import StreamScheduler
from durable_sse.consume.transactions import StreamTransactions
from durable_sse.consume.wakeup import Wakeups, wakeups_for
from durable_sse.errors import StoreError
from durable_sse.log.migrations import create_schema

POLL_INTERVAL = {"postgresql": 30.0, "sqlite": 5.0}
"""Seconds between safety-net reads of every stream (see :mod:`.wakeup`)."""
LAG_SAMPLE_INTERVAL = 15.0


class Consumer:
    """One process's share of a consumer group (see the module docstring).

    Args:
        database_url: the event log's database (``postgresql://…`` or ``sqlite:///…``).
        group: the group and its settings.
        owner: this process's name in leases (default ``host:pid:random``).
        concurrency: streams consumed at once (default 4 on PostgreSQL, 1 on SQLite).
        poll_interval: seconds between safety-net reads of every stream.
        metrics: where to record (see :mod:`durable_sse.consume.metrics`).
        durable_commit: PostgreSQL: each batch's transaction waits for its WAL flush
            (``synchronous_commit``). False saves that wait (a few ms a batch, most of
            a no-op handler's cost) and keeps exactly once: the handler's writes and
            the position are one transaction, so a database crash loses the newest few
            batches' writes and position together, and they are delivered again. What
            it gives up is that a batch the handler finished is durable the moment the
            next one starts.
    """

    def __init__(
        self,
        database_url: str,
        group: Group,
        *,
        owner: str | None = None,
        concurrency: int | None = None,
        poll_interval: float | None = None,
        metrics: MetricMeter | None = None,
        durable_commit: bool = True,
    ) -> None:
        self.database_url = normalize_url(database_url)
        self.group = group
        self.owner = owner or default_owner()
        engine = consumer_engine(self.database_url, durable_commit=durable_commit)
        self.dialect = engine.dialect.name
        self.concurrency = concurrency or (4 if self.dialect == "postgresql" else 1)
        self.metrics = ConsumerMetrics(metrics, group.name)
        self._database = ConsumerDatabase(engine, threads=self.concurrency + 2)
        self._transactions = StreamTransactions(engine, group, self.owner, self.metrics)
        self._stop = asyncio.Event()
        self._scheduler = StreamScheduler(
            group.streams,
            list_streams=lambda: self._database.call(self._transactions.all_streams),
            expire=lambda now: self._at_least_once.expire(now),
            closing=self._stop,
        )
        self._delivery = StreamDelivery(
            self._database, self._transactions, self._scheduler, self.metrics, closing=self._stop
        )
        self._exactly_once = ExactlyOnce(self._delivery)
        self._at_least_once = AtLeastOnce(self._delivery)
        self._started = False
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self.wakeups: Wakeups = wakeups_for(
            self.database_url,
            self._scheduler.mark,
            self._scheduler.mark_all,
            poll_interval=poll_interval or POLL_INTERVAL.get(self.dialect, 5.0),
        )

    @property
    def engine(self) -> sa.Engine:
        return self._database.engine

    @property
    def delivered_batches(self) -> int:
        """Batches consumed (committed or acknowledged) by this consumer."""
        return self._delivery.delivered_batches

    @property
    def redelivered_batches(self) -> int:
        """Batches this consumer delivered again (a failure, a crash, a lost lease)."""
        return self._delivery.redelivered_batches

    async def start(self) -> None:
        """Create the tables when missing, register the group and its streams, and start
        listening. ``run``/``batches`` call it; call it yourself to fail early."""
        if self._started:
            return
        self._started = True
        await self._database.call(create_schema, self.engine)
        await self._database.call(self._transactions.register)
        if self._scheduler.discovers:
            await self._scheduler.discover()
        self._tasks.append(asyncio.create_task(self.wakeups.run(self._stop)))
        if self.metrics.enabled:
            self._tasks.append(asyncio.create_task(self._sample_lag()))
        self._scheduler.mark_all()

    async def close(self) -> None:
        """Stop listening, give the streams' leases up, close the connections."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._scheduler.news.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        held = list(self._delivery.kept.items()) + self._at_least_once.held()
        with contextlib.suppress(Exception):
            await self._database.call(self._transactions.release_all, held)
        await self._database.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def wait_listening(self) -> Any:
        """Awaitable: the wake-ups are listening (tests: nothing committed from now on
        is missed by a notification)."""
        return self.wakeups.listening.wait()

    async def run(self, handler: Handler, *, stop: asyncio.Event | None = None) -> None:
        """Deliver every batch to ``handler(tx, batch)`` exactly once, until ``stop`` is
        set (the batch in hand finishes) or the task is cancelled (an ``async def``
        handler's batch in hand rolls back, a plain function's finishes).

        Raises:
            TypeError: the handler returned an awaitable without being an ``async def``
                (that batch rolled back).
        """
        await self.start()
        await self._exactly_once.run(handler, stop or asyncio.Event(), lanes=self.concurrency)

    async def batches(self, *, stop: asyncio.Event | None = None) -> AsyncIterator[Batch]:
        """Yield batches (each stream's in order, streams interleaved) until ``stop`` is
        set. Acknowledge each with ``await batch.ack()`` once its effect is done; a
        stream's next batch comes after its previous one is acknowledged (or nacked, or
        its lease ran out: then it is delivered again)."""
        await self.start()
        async for batch in self._at_least_once.batches(stop or asyncio.Event()):
            yield batch

    async def _sample_lag(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(StoreError):
                streams = set(self._scheduler.streams)
                lags = await self._database.call(self._transactions.lags, streams)
                for stream, lag in lags.items():
                    self.metrics.lag_events.set(lag, {"stream": stream})
                    if lag == 0:
                        self.metrics.lag_seconds.set(0.0, {"stream": stream})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), LAG_SAMPLE_INTERVAL)
