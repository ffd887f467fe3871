"""A stopping worker's connections read on until their retries start elsewhere.

At SIGTERM a connection fails its attempt through the client (Temporal retries it at once
on another worker) and keeps reading and committing until that retry has registered in
``sse_readers``: make before break, so a deploy pauses no stream. The survivors start
their handed-over connections at a few dozen a second, and until then the stopping
worker still stores the streams' events. Two readers of one stream for that moment are
as safe as after a pause (idempotent rows, monotonic cursors, gap records); the retry
resumes at the cursor handed over and skips what the old connection stored since.

One query per :data:`POLL_INTERVAL` answers for all of a worker's connections.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from durable_sse.cursor.readers import Readers, RegisteredAttempt
from durable_sse.errors import StoreError

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.25
"""Seconds between looks at the registrations of the connections handed over."""
OVERLAP_LIMIT = 6.0
"""Seconds a handed-over connection reads on at most while its retry has not started:
with no retry started by then the connection ends anyway, so that the worker stops within
a container's usual grace period (``docker stop`` waits 10 s)."""

Attempt = tuple[str, str]
"""``(stream, activity_id)``: one connection's activity, whatever its attempt."""


def successors_started(
    registered: Iterable[RegisteredAttempt], waiting: Mapping[Attempt, int]
) -> set[Attempt]:
    """The activities of ``waiting`` (each with the attempt that handed over) that have a
    later attempt registered."""
    started = set()
    for row in registered:
        if row.activity_id is None:
            continue
        key = (row.stream, row.activity_id)
        attempt = waiting.get(key)
        if attempt is not None and row.attempt > attempt:
            started.add(key)
    return started


class Successors:
    """Waits, for each connection its worker handed over, until the retry that replaces
    it has started somewhere."""

    def __init__(
        self,
        readers: Readers,
        *,
        peers: Callable[[], Awaitable[bool]],
        limit: float = OVERLAP_LIMIT,
        interval: float = POLL_INTERVAL,
    ) -> None:
        """``peers``: whether another live worker polls the pool (asked once): with none,
        no retry can start until one comes, and a connection does not wait for it."""
        self._readers = readers
        self._peers = peers
        self._expected: asyncio.Task[bool] | None = None
        self.limit = limit
        self._interval = interval
        self._waiting: dict[Attempt, tuple[int, asyncio.Future[None]]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def expected(self) -> bool:
        """Whether another worker can take the connections over (asked once)."""
        if self._expected is None:
            self._expected = asyncio.create_task(self._ask_peers())
        return await asyncio.shield(self._expected)

    async def wait(self, stream: str, activity_id: str, attempt: int) -> bool:
        """Until a later attempt of the activity registered (True) or :attr:`limit`
        seconds passed (False)."""
        key = (stream, activity_id)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = (attempt, future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            await asyncio.wait_for(future, self.limit)
        except TimeoutError:
            return False
        finally:
            entry = self._waiting.get(key)
            if entry is not None and entry[1] is future:  # not a later wait's
                del self._waiting[key]
        return True

    async def _ask_peers(self) -> bool:
        try:
            return await self._peers()
        except StoreError as error:
            logger.warning("could not tell whether other workers run: %s", error)
            return False

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(self._interval)
            waiting = {key: attempt for key, (attempt, _) in self._waiting.items()}
            if not waiting:
                return
            try:
                registered = await self._readers.attempts({stream for stream, _ in waiting})
            except StoreError as error:
                logger.warning("could not read the readers of handed-over streams: %s", error)
                continue
            for key in successors_started(registered, waiting):
                _, future = self._waiting.pop(key)
                if not future.done():
                    future.set_result(None)
