"""``Consumer``: run the user's code on every stored event of a group's streams, in order.

Two ways, by where the handler's effect goes:

* **Exactly once** (``await consumer.run(handler)``), for a handler that writes to the
  same database: ``handler(tx, batch)`` runs inside the transaction that reads the batch
  with the group's position row locked and moves that row past it. The handler's writes
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

Why a sync handler for exactly once: the transaction is a SQLAlchemy ``Connection`` on a
database thread; a plain function runs right there, with nothing to await. Keep it short:
it holds the stream's position row (and on SQLite the database's write lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import sqlite3
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from temporalio.common import MetricMeter

from durable_sse.consume import positions
from durable_sse.consume.metrics import ConsumerMetrics
from durable_sse.consume.model import (
    Batch,
    Event,
    Group,
    OnMaxHold,
    OnPoison,
    Position,
    Truncated,
    describe_item,
)
from durable_sse.consume.positions import Claim, Refused
from durable_sse.consume.reader import Read, read_items
from durable_sse.consume.schema import create_consumer_tables
from durable_sse.consume.status import lag_events
from durable_sse.consume.wakeup import Wakeups, wakeups_for
from durable_sse.errors import LeaseLostError, StoreError
from durable_sse.log.database import error_summary, make_engine
from durable_sse.log.migrations import create_schema
from durable_sse.log.schema import EVENTS_TABLE

logger = logging.getLogger(__name__)

T = TypeVar("T")

Handler = Callable[[Connection, Batch], None]
"""``handler(tx, batch)``: exactly once; raise to roll the batch back (it is delivered
again, see ``Group.max_attempts``)."""

POLL_INTERVAL = {"postgresql": 30.0, "sqlite": 5.0}
"""Seconds between safety-net reads of every stream (see :mod:`.wakeup`)."""
BACKOFF = (0.05, 0.2, 1.0, 2.0, 5.0, 10.0)
"""Seconds before a stream whose batch failed is delivered again, by attempt."""
LAG_SAMPLE_INTERVAL = 15.0


def normalize_url(database_url: str) -> str:
    """Every PostgreSQL spelling to psycopg 3 (``postgres://``, ``postgresql://``)."""
    scheme, sep, rest = database_url.partition("://")
    if sep and scheme.startswith("postgres") and "+" not in scheme:
        return f"postgresql+psycopg://{rest}"
    return database_url


def default_owner() -> str:
    """``host:pid:random``: unique per process, readable in ``durable-sse consumers``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class HandlerError(Exception):
    """The handler raised (wraps its exception; the batch rolled back)."""


class _Lost(Exception):
    """The lease moved to another process while this one delivered: roll back."""


@dataclass
class _Outcome:
    """What one exactly-once delivery did."""

    batch: Batch | None = None
    next_claim: Claim | None = None
    """This process keeps the stream (the next delivery is already counted)."""
    full: bool = False
    """The stream has more at once."""


@dataclass
class _Pending:
    """An at-least-once batch handed out and not settled yet."""

    claim: Claim
    read: Read
    deadline: float
    """Monotonic time the lease runs out (then the stream is free again)."""


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
        self._engine = make_engine(self.database_url)
        if not durable_commit and self._engine.dialect.name == "postgresql":
            sa.event.listen(self._engine, "connect", _asynchronous_commit)
        self.dialect = self._engine.dialect.name
        self.concurrency = concurrency or (4 if self.dialect == "postgresql" else 1)
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency + 2, thread_name_prefix="sse-consume"
        )
        self.metrics = ConsumerMetrics(metrics, group.name)
        self._streams: set[str] = set(group.streams or ())
        self._dirty: dict[str, None] = {}
        self._busy: set[str] = set()
        self._not_before: dict[str, float] = {}
        self._news = asyncio.Event()
        self._discover = group.streams is None
        self._claims: dict[str, Claim] = {}
        self._pending: dict[int, _Pending] = {}
        self._started = False
        self._closed = False
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.wakeups: Wakeups = wakeups_for(
            self.database_url,
            self._mark,
            self._mark_all,
            poll_interval=poll_interval or POLL_INTERVAL.get(self.dialect, 5.0),
        )
        self.delivered_batches = 0
        self.redelivered_batches = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def engine(self) -> sa.Engine:
        return self._engine

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Create the tables when missing, register the group and its streams, and start
        listening. ``run``/``batches`` call it; call it yourself to fail early."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        await self._db(create_schema, self._engine)
        await self._db(self._register_sync)
        if self._discover:
            await self._discover_streams()
        self._tasks.append(asyncio.create_task(self.wakeups.run(self._stop)))
        if self.metrics.enabled:
            self._tasks.append(asyncio.create_task(self._sample_lag()))
        self._mark_all()

    async def close(self) -> None:
        """Stop listening, give the streams' leases up, close the connections."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._news.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        held = list(self._claims.items()) + [
            (pending.claim.stream, pending.claim) for pending in self._pending.values()
        ]
        with contextlib.suppress(Exception):
            await self._db(self._release_all_sync, held)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._engine.dispose)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def wait_listening(self) -> Any:
        """Awaitable: the wake-ups are listening (tests: nothing committed from now on
        is missed by a notification)."""
        return self.wakeups.listening.wait()

    # -- exactly once ---------------------------------------------------------------

    async def run(self, handler: Handler, *, stop: asyncio.Event | None = None) -> None:
        """Deliver every batch to ``handler(tx, batch)`` exactly once, until ``stop`` is
        set or the task is cancelled (then the batch in hand finishes or rolls back)."""
        await self.start()
        stop = stop or asyncio.Event()
        lanes = [asyncio.create_task(self._lane(handler, stop)) for _ in range(self.concurrency)]
        try:
            done, _ = await asyncio.wait(
                [*lanes, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task in lanes and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop.set()
            self._news.set()
            for lane in lanes:
                with contextlib.suppress(BaseException):
                    await lane

    async def _lane(self, handler: Handler, stop: asyncio.Event) -> None:
        while not stop.is_set():
            stream = await self._take(stop)
            if stream is None:
                return
            try:
                await self._drain_exactly_once(stream, handler, stop)
            except StoreError as error:
                logger.warning(
                    "consumer %s, stream %s: %s; trying again", self.group.name, stream, error
                )
                self._retry_later(stream, 3)
            finally:
                self._busy.discard(stream)
                self._news.set()

    async def _drain_exactly_once(self, stream: str, handler: Handler, stop: asyncio.Event) -> None:
        claim: Claim | None = self._claims.pop(stream, None)
        while True:
            if stop.is_set() or self._stop.is_set():
                if claim is not None:
                    # Stopping with more to deliver: let another process take it now.
                    with contextlib.suppress(StoreError):
                        await self._db(self._release_sync, stream, claim)
                return
            if claim is None:
                claim = await self._db(self._claim_sync, stream)
                if claim is None:
                    return  # another process has it, or it is parked
                if claim.poison(self.group.max_attempts):
                    if not await self._db(self._poison_sync, stream, claim):
                        return
                    claim = None
                    continue
            try:
                outcome = await self._db(self._deliver_sync, stream, claim, handler)
            except HandlerError as error:
                await self._failed(stream, claim, error.__cause__ or error)
                return
            except _Lost:
                self._retry_later(stream, 1)
                return
            if outcome.batch is not None:
                self._count(outcome.batch)
            claim = outcome.next_claim
            if claim is None:
                return
            if not outcome.full:
                self._claims[stream] = claim  # kept for the next wake-up: no claim then
                return

    def _keeps(self, claim: Claim) -> bool:
        """Whether to keep a drained stream (its next delivery then needs no claim) or
        give it back so that every process of the group gets its share: a stream is
        kept for half a lease at most, then goes back to whoever comes first."""
        return time.monotonic() - claim.since < self.group.lease / 2

    def _deliver_sync(self, stream: str, claim: Claim, handler: Handler) -> _Outcome:
        group, now = self.group, _now()
        with self._engine.connect() as connection, connection.begin():
            row = positions.lock_row(connection, group.name, stream)
            if row is None:
                raise _Lost  # a reset holds it
            if row.owner != self.owner or row.epoch != claim.epoch or row.parked_at:
                raise _Lost
            limit = 1 if row.narrow_items else group.batch_size
            read = read_items(connection, stream, row.position, limit=limit)
            if not read.items:
                if self._keeps(claim):
                    return _Outcome(next_claim=claim)
                positions.release(
                    connection, group.name, stream, owner=self.owner, epoch=claim.epoch
                )
                return _Outcome()
            if self._truncation_parks(connection, stream, claim, read, now):
                return _Outcome()
            batch = self._batch(stream, row.position, read, claim.attempts)
            self._record_latency(batch)
            try:
                handler(connection, batch)
            except Exception as error:
                raise HandlerError(str(error)) from error
            keep = read.full or self._keeps(claim)
            if not positions.move(
                connection,
                group,
                stream,
                owner=self.owner,
                epoch=claim.epoch,
                end=read.end,
                items=len(read.items),
                keep=keep,
                narrow_items=row.narrow_items,
                now=now,
                newest_received_at=read.newest_received_at,
            ):
                raise _Lost
        next_claim = None
        if keep:
            narrow = max(row.narrow_items - len(read.items), 0) if row.narrow_items else 0
            next_claim = Claim(stream, claim.epoch, read.end, 1, narrow, since=claim.since)
        return _Outcome(batch=batch, next_claim=next_claim, full=read.full)

    # -- at least once --------------------------------------------------------------

    async def batches(self, *, stop: asyncio.Event | None = None) -> AsyncIterator[Batch]:
        """Yield batches (each stream's in order, streams interleaved) until ``stop`` is
        set. Acknowledge each with ``await batch.ack()`` once its effect is done; a
        stream's next batch comes after its previous one is acknowledged (or nacked, or
        its lease ran out: then it is delivered again)."""
        await self.start()
        stop = stop or asyncio.Event()
        while not stop.is_set() and not self._stop.is_set():
            stream = await self._take(stop)
            if stream is None:
                return
            try:
                batch = await self._next_batch(stream)
            except StoreError as error:
                logger.warning(
                    "consumer %s, stream %s: %s; trying again", self.group.name, stream, error
                )
                batch = None
                self._retry_later(stream, 3)
            if batch is None:
                self._busy.discard(stream)
                continue
            yield batch

    async def _next_batch(self, stream: str) -> Batch | None:
        while True:
            claim = self._claims.pop(stream, None)
            if claim is None:
                claim = await self._db(self._claim_sync, stream)
                if claim is None:
                    return None
            if claim.poison(self.group.max_attempts):
                if not await self._db(self._poison_sync, stream, claim):
                    return None
                continue
            limit = 1 if claim.narrow_items else self.group.batch_size
            read = await self._db(self._read_sync, stream, claim.position, limit)
            if not read.items:
                if self._keeps(claim):
                    self._claims[stream] = claim
                else:
                    await self._db(self._release_sync, stream, claim)
                return None
            if read.items and isinstance(read.items[0], Truncated):
                if await self._db(self._truncation_parks_sync, stream, claim, read):
                    return None
            batch = self._batch(stream, claim.position, read, claim.attempts)
            batch._settle = self._settle
            self._record_latency(batch)
            self._pending[id(batch)] = _Pending(claim, read, time.monotonic() + self.group.lease)
            return batch

    async def _settle(self, batch: Batch, error: BaseException | None) -> None:
        pending = self._pending.pop(id(batch), None)
        if pending is None:
            raise RuntimeError("this batch was acknowledged or nacked already")
        claim, read, stream = pending.claim, pending.read, batch.stream
        try:
            if error is not None:
                batch.settled = "nacked"
                await self._failed(stream, claim, error)
                return
            keep = read.full or self._keeps(claim)
            moved = await self._db(self._ack_sync, stream, claim, read, keep)
            if not moved:
                self._dirty[stream] = None  # delivered again (here, if nobody took it over)
                raise LeaseLostError(
                    f"group {self.group.name!r}, stream {stream!r}: this process "
                    f"({self.owner}) no longer holds the lease (it expired or another "
                    "process took the stream over); the batch is delivered again"
                )
            batch.settled = "acked"
            self._count(batch)
            if keep:
                narrow = max(claim.narrow_items - len(read.items), 0) if claim.narrow_items else 0
                self._claims[stream] = Claim(
                    stream, claim.epoch, read.end, 1, narrow, since=claim.since
                )
            if read.full:
                self._mark(stream)
        finally:
            self._busy.discard(stream)
            self._news.set()

    def _ack_sync(self, stream: str, claim: Claim, read: Read, keep: bool) -> bool:
        with self._engine.begin() as connection:
            return positions.move(
                connection,
                self.group,
                stream,
                owner=self.owner,
                epoch=claim.epoch,
                end=read.end,
                items=len(read.items),
                keep=keep,
                narrow_items=claim.narrow_items,
                now=_now(),
                newest_received_at=read.newest_received_at,
                check_lease=True,
            )

    def _read_sync(self, stream: str, position: Position, limit: int) -> Read:
        with self._engine.connect() as connection:
            return read_items(connection, stream, position, limit=limit)

    # -- shared: claims, failures, poison -------------------------------------------

    def _claim_sync(self, stream: str) -> Claim | None:
        """Claim the stream (and count the delivery); None when it is not this process's
        to deliver now (a retry is scheduled when another process's lease may lapse)."""
        outcome = self._claim_or_refusal_sync(stream)
        if isinstance(outcome, Refused):
            if not outcome.parked:
                # Another process has it: look again once its lease may have lapsed
                # (then it crashed, and this process takes the stream over).
                delay = self.group.lease / 2
                if outcome.until is not None:
                    delay = max((outcome.until - _now()).total_seconds(), 0.0) + 0.05
                self._later(stream, delay)
            return None
        return outcome

    def _claim_or_refusal_sync(self, stream: str) -> Claim | Refused:
        with self._engine.connect() as connection:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    # The count must survive a crash of this process, not of the
                    # database server: an asynchronous commit is enough, and costs no
                    # flush.
                    connection.exec_driver_sql("SET LOCAL synchronous_commit = off")
                if (
                    self._discover
                    and positions.read_row(connection, self.group.name, stream) is None
                ):
                    positions.ensure_positions(connection, self.group, [stream], _now())
                claim = positions.claim(connection, self.group, stream, self.owner, _now())
            if isinstance(claim, Claim) and claim.attempts > 1:
                self.redelivered_batches += 1
                self.metrics.redeliveries.add(1, {"stream": stream})
            return claim

    def _release_sync(self, stream: str, claim: Claim) -> None:
        with self._engine.begin() as connection:
            positions.release(
                connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch
            )

    def _release_all_sync(self, held: list[tuple[str, Claim]]) -> None:
        with self._engine.begin() as connection:
            for stream, claim in held:
                positions.release(
                    connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch
                )

    async def _failed(self, stream: str, claim: Claim, error: BaseException) -> None:
        text = _error_text(error)
        logger.warning(
            "consumer %s, stream %s: the handler failed on the batch after seq %d "
            "(attempt %d of %d%s): %s",
            self.group.name,
            stream,
            claim.position.seq,
            claim.attempts,
            self.group.max_attempts,
            ", one item at a time" if claim.narrow_items else "",
            text.splitlines()[0] if text else type(error).__name__,
        )
        with contextlib.suppress(StoreError):
            await self._db(self._record_failure_sync, stream, claim, text)
        self._claims.pop(stream, None)
        self._retry_later(stream, claim.attempts)

    def _record_failure_sync(self, stream: str, claim: Claim, text: str) -> None:
        with self._engine.begin() as connection:
            positions.record_failure(
                connection, self.group.name, stream, owner=self.owner, epoch=claim.epoch, error=text
            )

    def _poison_sync(self, stream: str, claim: Claim) -> bool:
        """Park the stream on its poison item, or move the item to the dead letters; True
        when the stream goes on (dead letter)."""
        group, now = self.group, _now()
        with self._engine.connect() as connection, connection.begin():
            row = positions.lock_row(connection, group.name, stream)
            if row is None or row.owner != self.owner or row.epoch != claim.epoch:
                return False
            read = read_items(connection, stream, row.position, limit=1)
            if not read.items:
                positions.release(
                    connection, group.name, stream, owner=self.owner, epoch=claim.epoch
                )
                return False
            item = read.items[0]
            tries = claim.attempts - 1
            error = positions.failure_text(claim)
            if group.on_poison is OnPoison.DEAD_LETTER:
                positions.dead_letter(
                    connection, group.name, stream, item, error=error, attempts=tries, now=now
                )
                positions.move(
                    connection,
                    group,
                    stream,
                    owner=self.owner,
                    epoch=claim.epoch,
                    end=read.end,
                    items=1,
                    keep=False,
                    narrow_items=row.narrow_items,
                    now=now,
                    newest_received_at=read.newest_received_at,
                )
                outcome = True
            else:
                reason = f"{describe_item(item)} failed {tries} times alone: {error}"
                positions.park(
                    connection, group.name, stream, epoch=claim.epoch, reason=reason, now=now
                )
                outcome = False
        if outcome:
            self.metrics.dead_letters.add(1, {"stream": stream})
            logger.error(
                "consumer %s, stream %s: %s moved to the dead letters after %d attempts alone: %s",
                group.name,
                stream,
                describe_item(item),
                tries,
                error.splitlines()[0],
            )
        else:
            self.metrics.parked.set(1, {"stream": stream})
            logger.error(
                "consumer %s, stream %s: parked on %s after %d attempts alone (nothing after it "
                "is delivered until `durable-sse consumers reset`): %s",
                group.name,
                stream,
                describe_item(item),
                tries,
                error.splitlines()[0],
            )
        return outcome

    def _truncation_parks(
        self, connection: Connection, stream: str, claim: Claim, read: Read, now: datetime
    ) -> bool:
        """A group that chose ``on_max_hold = error`` parks where rows it had not read were
        deleted, rather than go on past them."""
        first = read.items[0]
        if not isinstance(first, Truncated) or self.group.on_max_hold is not OnMaxHold.ERROR:
            return False
        reason = (
            f"retention deleted rows this group had not read (after seq {first.after_seq} "
            f"through {first.through_seq}); reset the position to go on"
        )
        positions.park(
            connection, self.group.name, stream, epoch=claim.epoch, reason=reason, now=now
        )
        self.metrics.parked.set(1, {"stream": stream})
        logger.error("consumer %s, stream %s: parked: %s", self.group.name, stream, reason)
        return True

    def _truncation_parks_sync(self, stream: str, claim: Claim, read: Read) -> bool:
        if self.group.on_max_hold is not OnMaxHold.ERROR:
            return False
        with self._engine.begin() as connection:
            return self._truncation_parks(connection, stream, claim, read, _now())

    # -- scheduling -----------------------------------------------------------------

    def _mark(self, stream: str) -> None:
        """A stream may have news (a notification, a full batch, a retry due)."""
        if stream not in self._streams:
            if not self._discover:
                return
            self._streams.add(stream)
        self._dirty[stream] = None
        self._news.set()

    def _mark_all(self) -> None:
        if self._discover:
            self._discover_due = True
        for stream in self._streams:
            self._dirty[stream] = None
        self._news.set()

    _discover_due = False

    async def _take(self, stop: asyncio.Event) -> str | None:
        """The next stream with news that no lane is on and whose retry is due."""
        while not stop.is_set() and not self._stop.is_set():
            if self._discover_due:
                self._discover_due = False
                with contextlib.suppress(StoreError):
                    await self._discover_streams()
            now = time.monotonic()
            self._free_expired(now)
            wait: float | None = None
            for stream in self._dirty:
                if stream in self._busy:
                    continue
                due = self._not_before.get(stream, 0.0)
                if due > now:
                    wait = due - now if wait is None else min(wait, due - now)
                    continue
                del self._dirty[stream]
                self._not_before.pop(stream, None)
                self._busy.add(stream)
                return stream
            self._news.clear()
            waiters = [asyncio.ensure_future(self._news.wait()), asyncio.ensure_future(stop.wait())]
            try:
                await asyncio.wait(
                    waiters,
                    timeout=min(wait, 1.0) if wait else 1.0,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for waiter in waiters:
                    waiter.cancel()
        return None

    def _free_expired(self, now: float) -> None:
        """An at-least-once batch never settled: once its lease ran out the stream is
        free again (its next delivery takes the lease over, and the old ack is refused)."""
        for key, pending in list(self._pending.items()):
            if pending.deadline <= now:
                del self._pending[key]
                self._busy.discard(pending.claim.stream)
                self._dirty[pending.claim.stream] = None

    def _retry_later(self, stream: str, attempts: int) -> None:
        self._later(stream, BACKOFF[min(max(attempts, 1), len(BACKOFF)) - 1])

    def _later(self, stream: str, delay: float) -> None:
        """Deliver the stream again in ``delay`` seconds (thread-safe: the claim runs in a
        database thread)."""
        due = time.monotonic() + delay

        def mark() -> None:
            self._not_before[stream] = max(self._not_before.get(stream, 0.0), due)
            self._dirty[stream] = None
            self._news.set()

        if self._loop is not None and _in_thread(self._loop):
            self._loop.call_soon_threadsafe(mark)
        else:
            mark()

    async def _discover_streams(self) -> None:
        streams = await self._db(_all_streams_sync, self._engine)
        for stream in streams:
            if stream not in self._streams:
                self._streams.add(stream)
                self._dirty[stream] = None
        self._news.set()

    # -- plumbing -------------------------------------------------------------------

    def _register_sync(self) -> None:
        with self._engine.begin() as connection:
            create_consumer_tables(connection)
        with self._engine.begin() as connection:
            now = _now()
            positions.register_group(connection, self.group, now)
            if self.group.streams:
                positions.ensure_positions(connection, self.group, list(self.group.streams), now)

    def _batch(self, stream: str, start: Position, read: Read, attempt: int) -> Batch:
        return Batch(
            group=self.group.name,
            stream=stream,
            items=read.items,
            start=start,
            end=read.end,
            attempt=attempt,
        )

    def _record_latency(self, batch: Batch) -> None:
        for item in batch.items:
            if isinstance(item, Event):
                latency = (datetime.now(UTC) - item.received_at).total_seconds()
                self.metrics.handler_latency.record(max(latency, 0.0), {"stream": batch.stream})
                return

    def _count(self, batch: Batch) -> None:
        self.delivered_batches += 1
        events = sum(1 for item in batch.items if isinstance(item, Event))
        attributes = {"stream": batch.stream}
        self.metrics.batches.add(1, attributes)
        self.metrics.events.add(events, attributes)
        newest = next((item for item in reversed(batch.items) if isinstance(item, Event)), None)
        if newest is not None:
            lag = (datetime.now(UTC) - newest.received_at).total_seconds()
            self.metrics.lag_seconds.set(max(lag, 0.0), attributes)

    async def _sample_lag(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(StoreError):
                for stream, lag in (await self._db(self._lag_sync)).items():
                    self.metrics.lag_events.set(lag, {"stream": stream})
                    if lag == 0:
                        self.metrics.lag_seconds.set(0.0, {"stream": stream})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), LAG_SAMPLE_INTERVAL)

    def _lag_sync(self) -> dict[str, int]:
        with self._engine.connect() as connection:
            rows = positions.list_rows(connection, self.group.name)
            return {
                row.stream: lag_events(connection, row.stream, row.position.seq)
                for row in rows
                if row.stream in self._streams
            }

    async def _db(self, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(_guarded, function, *args)
        future = loop.run_in_executor(self._executor, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The transaction runs in a thread: let it end (commit or roll back) first.
            await asyncio.wait([future])
            raise


def _all_streams_sync(engine: sa.Engine) -> list[str]:
    """Every stream in the log, by a skip scan of the ``(stream, …)`` index (one probe
    per stream, not a read of every row)."""
    sql = (
        f"WITH RECURSIVE s(stream) AS ("
        f"SELECT min(stream) FROM {EVENTS_TABLE} "
        f"UNION ALL SELECT (SELECT min(stream) FROM {EVENTS_TABLE} e WHERE e.stream > s.stream) "
        f"FROM s WHERE s.stream IS NOT NULL) SELECT stream FROM s WHERE stream IS NOT NULL"
    )
    with engine.connect() as connection:
        return [row[0] for row in connection.exec_driver_sql(sql)]


def _asynchronous_commit(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    dbapi_connection.commit()


def _in_thread(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the caller runs outside ``loop``'s thread."""
    try:
        return asyncio.get_running_loop() is not loop
    except RuntimeError:
        return True


def _guarded(function: Callable[..., T], *args: Any) -> T:
    try:
        return function(*args)
    except (HandlerError, _Lost, StoreError):
        raise
    except (sa.exc.SQLAlchemyError, psycopg.Error, sqlite3.Error) as error:
        raise StoreError(f"the consumer's database call failed: {error_summary(error)}") from error


def _error_text(error: BaseException) -> str:
    if isinstance(error, HandlerError) and error.__cause__ is not None:
        error = error.__cause__
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip()


def _now() -> datetime:
    return datetime.now(UTC)
