"""What both ways of consuming share: claiming a stream, keeping it, failing, counting.

A delivery starts with a *claim* (a committed transaction that takes the stream's lease
and counts the attempt, see :mod:`.positions`), unless this process kept the stream
after its previous delivery (then that transaction already counted this one). A handler
that fails schedules the stream again after a backoff; an item that failed alone too
often is poison (parked on, or moved to the dead letters). The exactly-once lanes
(:mod:`.exactly_once`) and the at-least-once batches (:mod:`.at_least_once`) are built
on one :class:`StreamDelivery` per consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from datetime import UTC, datetime

from durable_sse.consume.database import ConsumerDatabase
from durable_sse.consume.metrics import ConsumerMetrics
from durable_sse.consume.model import Batch, Group
from durable_sse.consume.positions import Claim, Refused
from durable_sse.consume.scheduler import StreamScheduler
from durable_sse.consume.transactions import HandlerError, StreamTransactions
from durable_sse.errors import StoreError

logger = logging.getLogger(__name__)


class StreamDelivery:
    """One consumer's streams: its database, its scheduler, the streams it keeps.

    Args:
        closing: set when the consumer closes (every delivery then stops).
    """

    def __init__(
        self,
        database: ConsumerDatabase,
        transactions: StreamTransactions,
        scheduler: StreamScheduler,
        metrics: ConsumerMetrics,
        *,
        closing: asyncio.Event,
    ) -> None:
        self.database = database
        self.transactions = transactions
        self.scheduler = scheduler
        self.metrics = metrics
        self.closing = closing
        self.group: Group = transactions.group
        self.owner = transactions.owner
        self.kept: dict[str, Claim] = {}
        """Streams kept after a delivery: their next delivery is already counted."""
        self.delivered_batches = 0
        self.redelivered_batches = 0

    async def claim(self, stream: str) -> Claim | None:
        """Claim the stream (and count the delivery); None when it is not this process's
        to deliver now (a retry is scheduled when another process's lease may lapse)."""
        claim = await self.database.call(self.transactions.claim, stream, self.scheduler.discovers)
        if isinstance(claim, Refused):
            if not claim.parked:
                # Another process has it: look again once its lease may have lapsed
                # (then it crashed, and this process takes the stream over).
                delay = self.group.lease / 2
                if claim.until is not None:
                    delay = max((claim.until - datetime.now(UTC)).total_seconds(), 0.0) + 0.05
                self.scheduler.later(stream, delay)
            return None
        if claim.attempts > 1:
            self.redelivered_batches += 1
            self.metrics.redeliveries.add(1, {"stream": stream})
        return claim

    async def poison(self, stream: str, claim: Claim) -> bool:
        """Park on the poison item or move it to the dead letters; True: the stream goes
        on (dead letter)."""
        return await self.database.call(self.transactions.poison, stream, claim)

    async def release(self, stream: str, claim: Claim) -> None:
        """Give the stream's lease up (another process may take it now)."""
        await self.database.call(self.transactions.release, stream, claim)

    async def failed(self, stream: str, claim: Claim, error: BaseException) -> None:
        """The handler failed on the batch: record why, deliver it again after a backoff."""
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
            await self.database.call(self.transactions.record_failure, stream, claim, text)
        self.kept.pop(stream, None)
        self.scheduler.retry_later(stream, claim.attempts)

    def count(self, batch: Batch) -> None:
        """The batch is consumed (committed, or acknowledged)."""
        self.delivered_batches += 1
        self.metrics.record_consumed(batch)


def _error_text(error: BaseException) -> str:
    if isinstance(error, HandlerError) and error.__cause__ is not None:
        error = error.__cause__
    lines = traceback.format_exception_only(type(error), error)
    return "".join(lines).strip()
