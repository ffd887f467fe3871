"""Consumers of the log: run your code on every stored event, in order, exactly once.

The simple case, exactly once (the handler writes to the same database)::

    from durable_sse.consume import Consumer, Group

    def handle(tx, batch):                      # tx: the open transaction
        for event in batch.events:
            tx.execute(text("INSERT INTO orders ..."), {...})

    await Consumer(DATABASE_URL, Group("orders", streams=["shop"])).run(handle)

``async def handle(tx, batch)`` works the same way (awaited inside the transaction).

At least once (the effect goes elsewhere: make it idempotent on ``(stream, seq)``)::

    async with Consumer(DATABASE_URL, Group("mailer", streams=["shop"])) as consumer:
        async for batch in consumer.batches():
            for event in batch.events:
                await send(event)
            await batch.ack()

See :mod:`durable_sse.consume.consumer` for how, :mod:`.model` for what a batch holds.
"""

from __future__ import annotations

from durable_sse.consume.consumer import Consumer
from durable_sse.consume.handlers import Handler
from durable_sse.consume.metrics import ConsumerMetrics, serve_metrics
from durable_sse.consume.model import (
    Batch,
    Event,
    Gap,
    GapClosed,
    Group,
    Item,
    OnMaxHold,
    OnPoison,
    Position,
    Start,
    Truncated,
)
from durable_sse.consume.retention import retention_holds
from durable_sse.errors import ConsumerError, LeaseLostError

__all__ = [
    "Batch",
    "Consumer",
    "ConsumerError",
    "ConsumerMetrics",
    "Event",
    "Gap",
    "GapClosed",
    "Group",
    "Handler",
    "Item",
    "LeaseLostError",
    "OnMaxHold",
    "OnPoison",
    "Position",
    "Start",
    "Truncated",
    "retention_holds",
    "serve_metrics",
]
