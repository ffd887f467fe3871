"""A connection's heartbeats: throttled, and kept going while it waits on something slow.

Where the connection runs decides what a heartbeat is (:class:`Heartbeats`: the Temporal
activity sends its progress as heartbeat details, which is also how a cancellation
reaches it); this module decides when one goes out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from durable_sse.contracts import ReadProgress

T = TypeVar("T")


def _nothing() -> None:
    return None


@dataclass
class Heartbeats:
    """How a connection shows it is alive where it runs (a Temporal activity heartbeats;
    a connection run outside one need not)."""

    send: Callable[[ReadProgress], None]
    """Send one heartbeat with these details (a retried attempt gets them back)."""
    interval: Callable[[bool], float]
    """Seconds between heartbeats, given whether the connection is streaming yet."""
    due: Callable[[], None] = _nothing
    """Called at every heartbeat check once the connection has started, sent or not
    (the activity's progress reports)."""


class Keepalive:
    """When one connection heartbeats.

    Args:
        heartbeats: where heartbeats go.
        progress: the details to send (the session's progress).
        started: whether the connection has started (``Heartbeats.due`` waits for it).
    """

    def __init__(
        self,
        heartbeats: Heartbeats,
        *,
        progress: Callable[[], ReadProgress],
        started: Callable[[], bool],
    ) -> None:
        self.heartbeats = heartbeats
        self._progress = progress
        self._started = started
        self.last = time.monotonic()
        self.streaming = False
        """The response head arrived and events are being read."""

    def interval(self) -> float:
        return self.heartbeats.interval(self.streaming)

    def beat(self, *, force: bool = False) -> None:
        """Heartbeat if one is due (or ``force``); the due-check runs every time."""
        now = time.monotonic()
        # Checked on every call, not only when a heartbeat goes out: heartbeats may be
        # far apart, progress reports are due on their own interval.
        if self._started():
            self.heartbeats.due()
        if not force and now - self.last < self.interval():
            return
        self.last = now
        self.heartbeats.send(self._progress())

    async def waiting(self, awaitable: Awaitable[T]) -> T:
        """Await while heartbeating: a server may take up to ``idle_timeout`` to answer
        and a database may stall on a lock, longer than the heartbeat timeout, and a
        silent attempt would be timed out and retried by Temporal while it still works
        (two attempts writing at once). Cancelling the wait cancels ``awaitable``."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                self.beat()
                done, _ = await asyncio.wait([task], timeout=self.interval())
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait([task])
