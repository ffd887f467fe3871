"""L1: the in-process cursor cache (stream -> newest persisted id).

One per worker process. It is the fast path of the live route, and only the worker
that owns a stream keeps refreshing its entry; the short TTL bounds how long a stale
value can survive on a worker after ownership of the stream moved elsewhere.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cachetools import TTLCache

from durable_sse.ids import IdOrder, is_newer

logger = logging.getLogger(__name__)

DEFAULT_MAXSIZE = 100_000
DEFAULT_TTL = 30.0


class LocalCursors:
    """A forward-only TTL cache of cursors. Not thread-safe: use it from one event loop."""

    def __init__(
        self,
        maxsize: int = DEFAULT_MAXSIZE,
        ttl: float = DEFAULT_TTL,
        *,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache: TTLCache[str, str] = TTLCache(maxsize=maxsize, ttl=ttl, timer=timer)

    def get(self, stream: str) -> str | None:
        """The cached newest persisted id, or None when absent or expired."""
        return self._cache.get(stream)

    def advance(self, stream: str, event_id: str, id_order: IdOrder | str) -> bool:
        """Move the stream's cursor to ``event_id`` if that is newer; True when it moved.

        Every call refreshes the entry's TTL, moved or not: only the owner calls this, and
        an owner that is still persisting keeps its entry alive.
        """
        current = self._cache.get(stream)
        if is_newer(event_id, current, id_order):
            self._cache[stream] = event_id
            return True
        if current is not None:
            self._cache[stream] = current  # re-setting restarts the TTL
        return False

    def forget(self, stream: str) -> None:
        """Drop the stream's entry (ownership released, stream stopped)."""
        self._cache.pop(stream, None)

    def __len__(self) -> int:
        return len(self._cache)
