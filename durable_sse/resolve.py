"""Where a connection resumes: the cursor chains of the live and the lagged route.

* live: L1 -> L2 (fills L1) -> lagging id -> floor -> none (connect live only).
  When both caches are gone we cannot know whether a gap was pending, so the
  deliberately stale lagging id (a replay, absorbed by dedupe) comes before the floor.
* lagged: lagging id -> the live chain (a fresh stream has no lagging id yet).

A retried attempt also passes its heartbeat (the newest cursor it committed); the
heartbeat can only move the answer forward, never behind what the stores say.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from durable_sse.eventlog import EventLog
from durable_sse.ids import IdOrder, is_newer
from durable_sse.l1 import LocalCursors
from durable_sse.l2 import RedisCursors

logger = logging.getLogger(__name__)

SOURCES = ("l1", "l2", "lagging", "floor", "heartbeat", "none")


@dataclass
class ResolvedCursor:
    cursor: str | None
    """The id to send (None = connect live, without a cursor)."""
    source: str
    """Which store answered: one of :data:`SOURCES`."""


class CursorResolver:
    """Resolves the start cursor of a connection from the worker's stores.

    Cache tiers never raise (L2 misses on error); event-log failures propagate as
    :class:`~durable_sse.errors.StoreError`, since without the log nothing can be persisted.
    """

    def __init__(self, l1: LocalCursors, l2: RedisCursors, event_log: EventLog) -> None:
        self._l1 = l1
        self._l2 = l2
        self._event_log = event_log

    async def resolve_cursor(
        self, stream: str, id_order: IdOrder | str, *, heartbeat: str | None = None
    ) -> ResolvedCursor:
        """The live route: resume from the newest persisted id."""
        found = await self._live_chain(stream, id_order)
        return self._with_heartbeat(stream, found, heartbeat, id_order)

    async def resolve_lagged_cursor(
        self, stream: str, id_order: IdOrder | str, *, heartbeat: str | None = None
    ) -> ResolvedCursor:
        """The lagged route: resume from the lagging id so the replay window re-delivers a hole.

        A retried attempt of a replay passes its heartbeat and resumes from its own
        progress when that is newer.
        """
        lagging = await self._lagging_id(stream)
        if lagging is not None:
            found = ResolvedCursor(lagging, "lagging")
        else:
            found = await self._live_chain(stream, id_order)
        return self._with_heartbeat(stream, found, heartbeat, id_order)

    async def _live_chain(self, stream: str, id_order: IdOrder | str) -> ResolvedCursor:
        cursor = self._l1.get(stream)
        if cursor:
            return ResolvedCursor(cursor, "l1")
        cursor = await self._l2.get(stream)
        if cursor:
            self._l1.advance(stream, cursor, id_order)
            return ResolvedCursor(cursor, "l2")
        cursor = await self._lagging_id(stream)
        if cursor is not None:
            return ResolvedCursor(cursor, "lagging")
        cursor = await self._event_log.floor(stream)
        if cursor:
            return ResolvedCursor(cursor, "floor")
        return ResolvedCursor(None, "none")

    async def _lagging_id(self, stream: str) -> str | None:
        checkpoint = await self._event_log.get_checkpoint(stream)
        if checkpoint is None or not checkpoint.lagging_id:
            return None
        return checkpoint.lagging_id

    @staticmethod
    def _with_heartbeat(
        stream: str, found: ResolvedCursor, heartbeat: str | None, id_order: IdOrder | str
    ) -> ResolvedCursor:
        if is_newer(heartbeat, found.cursor, id_order):
            logger.debug(
                "stream %s resumes from its heartbeat %r (stores said %r from %s)",
                stream,
                heartbeat,
                found.cursor,
                found.source,
            )
            return ResolvedCursor(heartbeat, "heartbeat")
        return found
