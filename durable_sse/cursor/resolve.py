"""Where a connection resumes: the cursor chains of the three routes.

* live: L1 -> L2 (fills L1) -> lagging id -> floor -> none (connect live only).
  When both caches are gone the deliberately stale lagging id (a replay, absorbed by
  dedupe) comes before the floor.
* lagged (the repair): one stored id before the oldest open gap's resume point, so the
  first event re-delivered shows whether the server's history still reaches the gap; with
  no gap open, the lagging id; with no lagging id yet, the live chain.
* explicit: the id the workflow names (a requested replay, or its continuation).

A *retried* attempt (Temporal re-ran the activity after a crash or a heartbeat timeout)
starts where the attempt that died started, not where it got to: that attempt may have
read a drop notice and died before recording it, and only re-reading what it read brings
such a hole back. On the live route what it had read well past (``log.reads.settled_id``:
as many ids and seconds as a batch needs to count as evidence) bounds that, as the
lagging id bounds every route (for a repair, its gap's
own start does: one stored id before the gap, whatever the lagging id). When the dead attempt
left no heartbeat, a repair starts at its gap again, and anything else at the lagging id,
or at the oldest stored id of a stream younger than one window. The retry of a hand-over
(an attempt its own worker ended, everything it read committed) starts where it got to,
or on the live route at L2 when the old connection read on and committed past that.

The read of the store that answers the chain also tells the connection what it needs to
know about its stream (:class:`~durable_sse.gaps.model.StreamContext`), checks the stream's
``id_order`` against the one its keys were made with, and registers the connection with
the cursor chosen, so retention keeps what it will re-read (``reader``): one round trip.
"""

from __future__ import annotations

import logging

from durable_sse.contracts import ReadProgress, Route
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.cursor.readers import ReaderLease
from durable_sse.cursor.start import ConnectionStart, StartStore
from durable_sse.ids import IdOrder, is_newer

logger = logging.getLogger(__name__)

SOURCES = ("l1", "l2", "gap", "lagging", "floor", "explicit", "retry", "none")


class CursorResolver:
    """Resolves the start cursor of a connection from the worker's stores.

    Cache tiers never raise (L2 misses on error); event-log failures propagate as
    :class:`~durable_sse.errors.StoreError`, since without the log nothing can be persisted.
    """

    def __init__(self, l1: LocalCursors, l2: RedisCursors | None, starts: StartStore) -> None:
        self._l1 = l1
        self._l2 = l2
        self._starts = starts

    async def resolve(
        self,
        stream: str,
        id_order: IdOrder | str,
        route: Route,
        *,
        explicit: str | None = None,
        retry_of: ReadProgress | None = None,
        retried: bool = False,
        reader: ReaderLease | None = None,
    ) -> ConnectionStart:
        """The cursor to send and the stream's context.

        Args:
            explicit: the cursor of an EXPLICIT route.
            retry_of: heartbeat details of the attempt that died (when ``retried``).
            retried: this is not the first attempt of the activity.
            reader: register the connection with the cursor chosen (each read that
                chooses one registers it again, so the last one stands).
        """
        order = IdOrder(id_order)
        if retried:
            return await self._retry(stream, order, route, explicit, retry_of, reader)
        if route is Route.EXPLICIT:
            return await self._context(stream, order, explicit, "explicit", reader)
        if route is Route.LAGGED:
            start = await self._starts.connection_context(
                stream, order, cursor=None, source="none", repair=True, reader=reader
            )
            if start.cursor is not None:
                return start
            # No gap open and no lagging id yet: the live chain (caches, then the floor),
            # with the witness of the cursor it finds.
            cursor, source = await self._caches(stream, order)
            return await self._context(stream, order, cursor, source, reader)
        cursor, source = await self._caches(stream, order)
        return await self._context(stream, order, cursor, source, reader)

    async def _retry(
        self,
        stream: str,
        order: IdOrder,
        route: Route,
        explicit: str | None,
        progress: ReadProgress | None,
        reader: ReaderLease | None,
    ) -> ConnectionStart:
        begun = None
        if progress is not None:
            begun = progress.start_cursor or progress.first_id
        # A hand-over committed everything it read: the floor needs no proof.
        died = progress is None or not progress.handed_over
        # A live death's notice is about what it read last, not what it read long ago.
        settled = died and route is Route.LIVE
        if not died and route is Route.LIVE and begun is not None and self._l2 is not None:
            # A handed-over connection may read on until this retry starts (a stopping
            # worker's, reader.successors): what it committed since moved L2 past where
            # it handed over. A live start from there re-reads none of it.
            cached = await self._l2.get(stream)
            if is_newer(cached, begun, order):
                return await self._context(stream, order, cached, "l2", reader)
        if begun is None:
            # Nothing says where the dead attempt began. A replay begins where its route
            # says, again; a repair or a live one from the oldest open gap, else the
            # lagging id, else the oldest stored id (the stream is younger than a window).
            if route is Route.EXPLICIT:
                return await self._context(stream, order, explicit, "explicit", reader)
            return await self._starts.connection_context(
                stream,
                order,
                cursor=None,
                source="none",
                repair=route is Route.LAGGED,
                from_oldest=True,
                reader=reader,
                retry=died,
                settled=settled,
            )
        start = await self._context(
            stream, order, begun, "retry", reader, retry=died, settled=settled
        )
        lagging = start.context.lagging_id
        if is_newer(lagging, begun, order):
            if route is Route.LAGGED:
                # A repair starts one stored id before its gap, so that its first event
                # shows whether the history still reaches the gap. The lagging id may be
                # the gap's start itself: from there the first stored id after the cursor
                # is the gap's end, and a history that starts inside the gap would look
                # continuous (the gap closed as repaired with ids lost). The repair's own
                # start bounds a retried repair instead.
                # (Asked without registering: ``start`` registered ``begun`` already.)
                repair = await self._starts.connection_context(
                    stream, order, cursor=None, source="none", repair=True
                )
                if repair.source == "gap" and repair.cursor is not None:
                    if is_newer(repair.cursor, begun, order):
                        return await self._context(stream, order, repair.cursor, "gap", reader)
                    return start
            return await self._context(
                stream, order, lagging, "lagging", reader, retry=died, settled=settled
            )
        return start

    async def _caches(self, stream: str, order: IdOrder) -> tuple[str | None, str]:
        cursor = self._l1.get(stream)
        if cursor:
            return cursor, "l1"
        cursor = await self._l2.get(stream) if self._l2 is not None else None
        if cursor:
            self._l1.advance(stream, cursor, order)
            return cursor, "l2"
        return None, "none"

    async def _context(
        self,
        stream: str,
        order: IdOrder,
        cursor: str | None,
        source: str,
        reader: ReaderLease | None = None,
        *,
        retry: bool = False,
        settled: bool = False,
    ) -> ConnectionStart:
        return await self._starts.connection_context(
            stream,
            order,
            cursor=cursor,
            source=source,
            reader=reader,
            retry=retry,
            settled=settled,
        )
