"""Follow one stream from a position, read-only: what ``durable-sse tail`` prints.

Reads in batches until the stream is drained; with ``forever`` it then waits for a
wake-up (a ``NOTIFY`` of this stream, a catch-up after listening again, the slow poll;
see :mod:`.wakeup`) and reads again. Nothing is written: a group's position moves only
when the caller commits it (``tail --group G --commit``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import sqlalchemy as sa

from durable_sse.consume.items import Read, read_items
from durable_sse.consume.model import Position
from durable_sse.consume.wakeup import wakeups_for

POLL_INTERVAL = 5.0


async def follow(
    engine: sa.Engine,
    database_url: str,
    stream: str,
    position: Position,
    *,
    forever: bool,
    limit: int = 500,
    poll_interval: float = POLL_INTERVAL,
) -> AsyncIterator[Read]:
    """Yield the stream's reads after ``position``, in order (see the module docstring)."""
    news = asyncio.Event()
    stop = asyncio.Event()
    listener: asyncio.Task[None] | None = None
    if forever:
        wakeups = wakeups_for(
            database_url,
            lambda name: news.set() if name == stream else None,
            news.set,
            poll_interval=poll_interval,
        )
        listener = asyncio.create_task(wakeups.run(stop))
    try:
        while True:
            news.clear()
            read = await asyncio.to_thread(_read, engine, stream, position, limit)
            if read.items:
                yield read
            position = read.end
            if read.full:
                continue
            if not forever:
                return
            await news.wait()
    finally:
        stop.set()
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(BaseException):
                await listener


def _read(engine: sa.Engine, stream: str, position: Position, limit: int) -> Read:
    with engine.connect() as connection:
        return read_items(connection, stream, position, limit=limit)
