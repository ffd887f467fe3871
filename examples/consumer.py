"""An exactly-once consumer: every event of the demo's streams lands in a table of its
own, once, in order, whatever crashes in between.

    DATABASE_URL=sqlite:///.durable-sse/durable-sse.db python examples/consumer.py

(``durable-sse dev`` runs it for you.) The handler is given the open transaction; its
insert and the group's position commit together, so a crash, a kill or a failing batch
re-delivers only what did not commit. That holds because the ledger is in the same
database: a handler that calls another system is at least once, and must make its
effect idempotent on ``(stream, seq)`` (see ``Consumer.batches()``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import sqlalchemy as sa

from durable_sse.consume import Batch, Consumer, Group

GROUP = "demo-ledger"
LEDGER = "demo_ledger"
STREAMS = ["ticks", "noisy"]
INSERT = sa.text(
    f"INSERT INTO {LEDGER} (stream, seq, event_id, data, received_at) "
    "VALUES (:stream, :seq, :event_id, :data, :received_at)"
)


def handle(tx: sa.Connection, batch: Batch) -> None:
    """Runs inside the transaction that moves the group's position past ``batch``."""
    rows = [
        {
            "stream": event.stream,
            "seq": event.seq,
            "event_id": event.event_id,
            "data": event.data.replace("\x00", "\ufffd"),  # a text column cannot hold NUL
            "received_at": event.received_at,
        }
        for event in batch.events
    ]
    if rows:
        tx.execute(INSERT, rows)
    # batch.items also holds Gap / GapClosed where the server skipped events (and how
    # that ended), between the events where it happened: a real consumer could record
    # or alert on them here, in the same transaction.


def create_ledger(engine: sa.Engine) -> None:
    # The key is not what makes it exactly once (the transaction is); it only says so.
    with engine.begin() as connection:
        connection.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {LEDGER} (stream TEXT NOT NULL, seq BIGINT NOT NULL, "
            "event_id TEXT NOT NULL, data TEXT NOT NULL, "
            "received_at TIMESTAMP WITH TIME ZONE NOT NULL, PRIMARY KEY (stream, seq))"
        )


async def main(database_url: str, *, stop: asyncio.Event | None = None) -> None:
    consumer = Consumer(database_url, Group(GROUP, streams=STREAMS))
    try:
        await consumer.start()
        await asyncio.to_thread(create_ledger, consumer.engine)
        await consumer.run(handle, stop=stop)
    finally:
        await consumer.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        url = os.environ.get("DATABASE_URL", "sqlite:///.durable-sse/durable-sse.db")
        await main(url, stop=stop)

    asyncio.run(run())
