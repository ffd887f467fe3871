"""A consumer process for tests/consume/test_crash.py, killed with SIGKILL at random moments.

Started from a forkserver that has imported it (and durable_sse.consume) once, so a
restart costs a fork, not seconds of imports. Its handler writes every event it is given
to a sink table that has no unique key: a duplicate would show, so would a loss.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa

from durable_sse.consume import Batch, Consumer, Group


def sink_ddl(dialect: str, table: str) -> str:
    """The sink: no unique key on (stream, seq); ``n`` keeps the order rows went in."""
    if dialect == "postgresql":
        return f"CREATE TABLE {table} (n BIGSERIAL PRIMARY KEY, stream TEXT, seq BIGINT)"
    return f"CREATE TABLE {table} (n INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT, seq INTEGER)"


def run(url: str, group: Group, table: str, mode: str) -> None:
    """The victim's whole life: consume until killed."""
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(_consume(url, group, table, mode))


async def _consume(url: str, group: Group, table: str, mode: str) -> None:
    insert = sa.text(f"INSERT INTO {table} (stream, seq) VALUES (:stream, :seq)")
    consumer = Consumer(url, group, poll_interval=0.5)
    if mode == "exactly":

        def handle(tx: Any, batch: Batch) -> None:
            rows = [{"stream": event.stream, "seq": event.seq} for event in batch.events]
            if rows:
                tx.execute(insert, rows)

        await consumer.run(handle)
        return
    async for batch in consumer.batches():
        rows = [{"stream": event.stream, "seq": event.seq} for event in batch.events]
        if rows:
            # The effect goes elsewhere (here: its own transaction), then the ack.
            await asyncio.to_thread(_write, consumer.engine, insert, rows)
        await batch.ack()


def _write(engine: sa.Engine, insert: Any, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as connection:
        connection.execute(insert, rows)
