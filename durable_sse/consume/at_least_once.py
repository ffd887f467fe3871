"""At least once: batches handed out, acknowledged later under the stream's lease.

A batch handed out holds its stream (no other batch of it is handed out) until it is
acknowledged, nacked, or its lease runs out; then the stream is free again and the
batch is delivered again (an acknowledgement after that is refused: the position moves
under the lease only, :meth:`.StreamTransactions.ack`).

An acknowledgement that keeps the stream renews its lease, and the next batch needs no
claim. Unless that batch is handed out within half a lease, the kept lease is renewed
in the database first: after a long stall it may have lapsed and another process may
own the stream, and this one must not hand out a batch beside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from durable_sse.consume.delivery import StreamDelivery
from durable_sse.consume.items import Read
from durable_sse.consume.model import Batch, Truncated
from durable_sse.consume.positions import Claim
from durable_sse.consume.transactions import keeps, lease_deadline, make_batch, next_claim
from durable_sse.errors import LeaseLostError, StoreError

logger = logging.getLogger(__name__)


@dataclass
class _Pending:
    """An at-least-once batch handed out and not settled yet."""

    claim: Claim
    read: Read
    deadline: float
    """Monotonic time the lease runs out (then the stream is free again)."""


class AtLeastOnce:
    """The batches of ``Consumer.batches``."""

    def __init__(self, delivery: StreamDelivery) -> None:
        self._delivery = delivery
        self._pending: dict[int, _Pending] = {}

    def held(self) -> list[tuple[str, Claim]]:
        """The streams of the batches handed out and not settled (released on close)."""
        return [(pending.claim.stream, pending.claim) for pending in self._pending.values()]

    async def batches(self, stop: asyncio.Event) -> AsyncIterator[Batch]:
        """Yield batches until ``stop`` is set or the consumer closes."""
        delivery = self._delivery
        while not stop.is_set() and not delivery.closing.is_set():
            stream = await delivery.scheduler.take(stop)
            if stream is None:
                return
            try:
                batch = await self._next_batch(stream)
            except StoreError as error:
                logger.warning(
                    "consumer %s, stream %s: %s; trying again", delivery.group.name, stream, error
                )
                batch = None
                delivery.scheduler.retry_later(stream, 3)
            if batch is None:
                delivery.scheduler.done(stream)
                continue
            yield batch

    async def _next_batch(self, stream: str) -> Batch | None:
        delivery = self._delivery
        group, call, transactions = delivery.group, delivery.database.call, delivery.transactions
        while True:
            claim = await self._kept(stream)
            if claim is None:
                claim = await delivery.claim(stream)
                if claim is None:
                    return None
            if claim.poison(group.max_attempts):
                if not await delivery.poison(stream, claim):
                    return None
                continue
            limit = 1 if claim.narrow_items else group.batch_size
            read = await call(transactions.read, stream, claim.position, limit)
            if not read.items:
                if keeps(group, claim):
                    delivery.kept[stream] = claim
                else:
                    await delivery.release(stream, claim)
                return None
            if read.items and isinstance(read.items[0], Truncated):
                if await call(transactions.truncation_parks, stream, claim, read):
                    return None
            batch = make_batch(group, stream, claim.position, read, claim.attempts)
            batch._settle = self._settle
            delivery.metrics.record_handler_latency(batch)
            self._pending[id(batch)] = _Pending(claim, read, time.monotonic() + group.lease)
            return batch

    async def _kept(self, stream: str) -> Claim | None:
        """The claim kept for ``stream`` when this process still owns it: as kept while
        at least half its lease is left (no transaction), else renewed in the database;
        None when nothing is kept or another process owns the stream now."""
        delivery = self._delivery
        claim = delivery.kept.pop(stream, None)
        if claim is None or time.monotonic() < claim.lease_deadline - delivery.group.lease / 2:
            return claim
        return await delivery.database.call(delivery.transactions.renew, stream, claim)

    async def _settle(self, batch: Batch, error: BaseException | None) -> None:
        """``batch.ack()`` (``error`` None) and ``batch.nack(error)``."""
        pending = self._pending.pop(id(batch), None)
        if pending is None:
            raise RuntimeError("this batch was acknowledged or nacked already")
        delivery = self._delivery
        claim, read, stream = pending.claim, pending.read, batch.stream
        try:
            if error is not None:
                batch.settled = "nacked"
                await delivery.failed(stream, claim, error)
                return
            keep = read.full or keeps(delivery.group, claim)
            transactions = delivery.transactions
            deadline = lease_deadline(delivery.group)
            moved = await delivery.database.call(transactions.ack, stream, claim, read, keep)
            if not moved:
                delivery.scheduler.mark(stream)  # delivered again (here, if nobody took it over)
                raise LeaseLostError(
                    f"group {delivery.group.name!r}, stream {stream!r}: this process "
                    f"({delivery.owner}) no longer holds the lease (it expired or another "
                    "process took the stream over); the batch is delivered again"
                )
            batch.settled = "acked"
            delivery.count(batch)
            if keep:
                delivery.kept[stream] = next_claim(claim, read, claim.narrow_items, deadline)
            if read.full:
                delivery.scheduler.mark(stream)
        finally:
            delivery.scheduler.done(stream)

    def expire(self, now: float) -> list[str]:
        """A batch never settled: once its lease ran out the stream is free again (its
        next delivery takes the lease over, and the old ack is refused); those streams."""
        expired = []
        for key, pending in list(self._pending.items()):
            if pending.deadline <= now:
                del self._pending[key]
                expired.append(pending.claim.stream)
        return expired
