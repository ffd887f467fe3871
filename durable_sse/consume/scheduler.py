"""Which stream a consumer's lane takes next.

A stream is *marked* when it may have news (a notification, the safety-net poll, a full
batch, a retry that is due). A lane *takes* a marked stream that no other lane is on and
whose retry is due; it hands the stream back (``done``) when its delivery ends. Nothing
here touches the database: discovering new streams and freeing expired at-least-once
batches are the consumer's, called back from :meth:`StreamScheduler.take`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable

from durable_sse.errors import StoreError

BACKOFF = (0.05, 0.2, 1.0, 2.0, 5.0, 10.0)
"""Seconds before a stream whose batch failed is delivered again, by attempt."""


class StreamScheduler:
    """The streams of one consumer, and which of them have news.

    Args:
        streams: the group's streams; None: every stream in the log (discovered).
        list_streams: every stream in the log (a database read), when discovering.
        expire: called with the monotonic time on every turn of :meth:`take`; the streams
            whose handed-out batch ran out of lease (they are free again).
        closing: set when the consumer closes (every :meth:`take` then ends).
    """

    def __init__(
        self,
        streams: Iterable[str] | None,
        *,
        list_streams: Callable[[], Awaitable[list[str]]],
        expire: Callable[[float], Iterable[str]],
        closing: asyncio.Event,
    ) -> None:
        self.streams: set[str] = set(streams or ())
        self.discovers = streams is None
        self._list_streams = list_streams
        self._expire = expire
        self._closing = closing
        self._dirty: dict[str, None] = {}
        self._busy: set[str] = set()
        self._not_before: dict[str, float] = {}
        self._discover_due = False
        self.news = asyncio.Event()
        """Set when something may be taken (or the consumer is stopping)."""

    def mark(self, stream: str) -> None:
        """A stream may have news (a notification, a full batch, a retry due)."""
        if stream not in self.streams:
            if not self.discovers:
                return
            self.streams.add(stream)
        self._dirty[stream] = None
        self.news.set()

    def mark_all(self) -> None:
        """Every stream may have news (and, when discovering, new streams may exist)."""
        if self.discovers:
            self._discover_due = True
        for stream in self.streams:
            self._dirty[stream] = None
        self.news.set()

    async def discover(self) -> None:
        """Add the log's streams this consumer does not know yet, marked."""
        for stream in await self._list_streams():
            if stream not in self.streams:
                self.streams.add(stream)
                self._dirty[stream] = None
        self.news.set()

    async def take(self, stop: asyncio.Event) -> str | None:
        """The next stream with news that no lane is on and whose retry is due; None once
        ``stop`` is set or the consumer closes."""
        while not stop.is_set() and not self._closing.is_set():
            if self._discover_due:
                self._discover_due = False
                with contextlib.suppress(StoreError):
                    await self.discover()
            now = time.monotonic()
            for stream in self._expire(now):
                self._busy.discard(stream)
                self._dirty[stream] = None
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
            self.news.clear()
            waiters = [asyncio.ensure_future(self.news.wait()), asyncio.ensure_future(stop.wait())]
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

    def done(self, stream: str) -> None:
        """A lane is off the stream (it may be taken again once marked)."""
        self._busy.discard(stream)
        self.news.set()

    def retry_later(self, stream: str, attempts: int) -> None:
        """Deliver the stream again after the backoff of its ``attempts``."""
        self.later(stream, BACKOFF[min(max(attempts, 1), len(BACKOFF)) - 1])

    def later(self, stream: str, delay: float) -> None:
        """Deliver the stream again in ``delay`` seconds."""
        self._not_before[stream] = max(self._not_before.get(stream, 0.0), time.monotonic() + delay)
        self._dirty[stream] = None
        self.news.set()
