"""Where a connection starts, read in one transaction with what it must know.

As a connection starts, one transaction of the store answers the cursor chain's last
links (the lagging id, the floor, a repair's start before its gap: see
:func:`~durable_sse.cursor.fence.choose_start`), tells the connection what it needs to
know of its stream (:class:`~durable_sse.gaps.model.StreamContext`), checks the stream's
``id_order`` against the one its keys were made with, and registers the connection with
the cursor chosen, so that no retention delete falls between choosing a cursor and
holding its rows (:mod:`durable_sse.cursor.readers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sse.cursor.checkpoint import CheckpointStore
from durable_sse.cursor.fence import choose_start
from durable_sse.cursor.readers import ReaderLease, Readers
from durable_sse.gaps.model import StreamContext
from durable_sse.gaps.store import GapStore
from durable_sse.gaps.tracker import CONFIRM_IDS, CONFIRM_SECONDS
from durable_sse.ids import IdOrder
from durable_sse.log.database import Database
from durable_sse.log.locks import hold_retention
from durable_sse.log.reads import floor_in, has_rows, neighbour, oldest_id, settled_id


@dataclass(frozen=True)
class ConnectionStart:
    """Where a connection resumes, and what it knows of its stream as it connects."""

    cursor: str | None
    source: str
    """Which store answered: l1, l2, gap, lagging, floor, explicit, heartbeat, none."""
    context: StreamContext


class StartStore:
    """Answers a connection's start, over the shared database."""

    def __init__(
        self,
        database: Database,
        *,
        checkpoints: CheckpointStore,
        gaps: GapStore,
        readers: Readers,
    ) -> None:
        self._database = database
        self._checkpoints = checkpoints
        self._gaps = gaps
        self._readers = readers

    async def connection_context(
        self,
        stream: str,
        id_order: str,
        *,
        cursor: str | None,
        source: str,
        repair: bool = False,
        from_oldest: bool = False,
        reader: ReaderLease | None = None,
        retry: bool = False,
        settled: bool = False,
    ) -> ConnectionStart:
        """One transaction as a connection starts: its cursor when the caches had none,
        and the lagging id, floor, open gaps and witness of the cursor (see
        ``StreamContext``).

        ``repair``: the lagged route. Start one stored id before the oldest open gap's
        resume point, so the first event re-delivered shows whether the server's history
        still reaches the gap; with no gap open, start from the lagging id.
        ``from_oldest``: with no cursor and no lagging id, start at the oldest stored id
        rather than the floor (see :func:`~durable_sse.cursor.fence.choose_start`).
        ``retry``: the attempt replaces one that died; at the floor it starts one stored
        id before it (see :func:`~durable_sse.cursor.fence.choose_start`). ``settled``:
        a live retry, which starts no further back than what the dead attempt had read
        well past (:func:`~durable_sse.log.reads.settled_id`).
        ``reader``: register the connection in ``sse_readers`` with the cursor chosen, in
        the same transaction (so no retention delete falls between choosing a cursor and
        holding its rows); registering the same reader again moves its start.

        The stream's ``id_order`` is recorded in ``sse_checkpoints`` by its first
        connection; a later one under another order raises
        :class:`~durable_sse.errors.IdOrderMismatchError` and touches nothing.
        """
        return await self._database.run(
            f"read the state of stream {stream!r}",
            self._context_sync,
            stream,
            IdOrder(id_order),
            cursor,
            source,
            repair,
            from_oldest,
            reader,
            retry,
            settled,
        )

    def _context_sync(
        self,
        stream: str,
        order: IdOrder,
        cursor: str | None,
        source: str,
        repair: bool,
        from_oldest: bool,
        reader: ReaderLease | None = None,
        retry: bool = False,
        settled: bool = False,
    ) -> ConnectionStart:
        with self._database.begin() as connection:
            if reader is not None:
                hold_retention(connection, stream, exclusive=False)
            # A write first: on SQLite this takes the write lock before anything is read.
            self._checkpoints.ensure(connection, stream, order)
            lagging = self._checkpoints.check_order(connection, stream, order)
            open_gaps = self._gaps.open_gaps(connection, stream)
            floor = floor_in(connection, stream)
            cursor, source, witness = choose_start(
                cursor=cursor,
                source=source,
                repair=repair,
                lagging_id=lagging,
                floor=floor,
                open_gaps=open_gaps,
                order=order,
                neighbour=lambda event_id, older: neighbour(
                    connection, stream, order, event_id, older=older
                ),
                oldest=(lambda: oldest_id(connection, stream)) if from_oldest else None,
                retry=retry,
                settled=(
                    (
                        lambda: settled_id(
                            connection, stream, ids=CONFIRM_IDS, seconds=CONFIRM_SECONDS
                        )
                    )
                    if settled
                    else None
                ),
            )
            # Rows without ids only matter to a connection with no cursor: a reconnect
            # of a stream that has read events cannot resume (gaps.model.no_resume).
            any_rows = floor is not None or (cursor is None and has_rows(connection, stream))
            if reader is not None:
                self._readers.register(connection, stream, reader, cursor)
        context = StreamContext(
            lagging_id=lagging,
            floor=floor,
            witness=witness,
            open_gaps=open_gaps,
            has_rows=any_rows,
        )
        return ConnectionStart(cursor=cursor, source=source, context=context)
