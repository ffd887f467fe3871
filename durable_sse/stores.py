"""``Stores``: every store a worker (or a test, or a tool) needs, built once.

The composition root of the storage side. Each job of the event log is a small class over
one shared :class:`~durable_sse.log.database.Database`; the jobs whose work must share a
transaction with another's are wired here, by hook, so that a lower job never imports a
higher one:

* the writer (:mod:`durable_sse.log.writer`) applies a batch's gap changes through the
  gap store's :meth:`~durable_sse.gaps.store.GapStore.apply_changes`, in the batch's
  transaction (invariant 5);
* retention's deletes (:mod:`durable_sse.log.prune`) read the fence through the
  checkpoint store's :meth:`~durable_sse.cursor.checkpoint.CheckpointStore.fence_in`,
  in the delete's transaction, and what consumer groups hold through ``consumer_holds``.

The cursor caches (L1 in the process, L2 in Redis) sit beside them, so the reader and the
resolver take one object.
"""

from __future__ import annotations

from dataclasses import dataclass

from durable_sse.contracts import CheckpointState
from durable_sse.cursor.checkpoint import CheckpointStore
from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.cursor.readers import Readers
from durable_sse.cursor.start import StartStore
from durable_sse.gaps.model import GapSummary
from durable_sse.gaps.store import GapStore
from durable_sse.log.database import DEFAULT_CONNECT_TIMEOUT, Database
from durable_sse.log.migrations import create_schema
from durable_sse.log.prune import ConsumerHolds, Prune
from durable_sse.log.reads import Reads
from durable_sse.log.workers import WorkerLeases
from durable_sse.log.writer import Writer


@dataclass(eq=False)
class Stores:
    """The event log's jobs over one database, and the cursor caches."""

    database: Database
    writer: Writer
    reads: Reads
    prune: Prune
    gap_store: GapStore
    checkpoints: CheckpointStore
    readers: Readers
    starts: StartStore
    workers: WorkerLeases
    l1: LocalCursors
    l2: RedisCursors | None = None

    @classmethod
    def open(
        cls,
        database_url: str,
        *,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        consumer_holds: ConsumerHolds | None = None,
        l1: LocalCursors | None = None,
        l2: RedisCursors | None = None,
    ) -> Stores:
        """Build every job (no I/O: :meth:`create_schema` is the first call that
        touches the database).

        ``consumer_holds``: what consumer groups keep of a stream
        (:func:`durable_sse.consume.retention_holds`; the worker, which runs retention,
        passes it). None: retention ignores consumers.
        """
        database = Database(database_url, connect_timeout=connect_timeout)
        gap_store = GapStore(database)
        readers = Readers(database)
        checkpoints = CheckpointStore(database, gaps=gap_store, readers=readers)
        return cls(
            database=database,
            writer=Writer(database, in_transaction=gap_store.apply_changes),
            reads=Reads(database),
            prune=Prune(database, fence=checkpoints.fence_in, consumer_holds=consumer_holds),
            gap_store=gap_store,
            checkpoints=checkpoints,
            readers=readers,
            starts=StartStore(database, checkpoints=checkpoints, gaps=gap_store, readers=readers),
            # Its own engine and thread: a lease is renewed on time even while a burst of
            # commits holds every connection and thread of the event log's.
            workers=WorkerLeases(
                Database(database_url, connect_timeout=connect_timeout, workers=1)
            ),
            l1=l1 or LocalCursors(),
            l2=l2,
        )

    async def gaps_and_checkpoint(
        self, stream: str, id_order: str
    ) -> tuple[GapSummary, CheckpointState | None]:
        """The stream's gaps and checkpoint row (lagging id, rest), read now: what the
        workflow asks for when a result did not say, and what the live status shows."""
        return await self.checkpoints.gaps_and_checkpoint(stream, id_order)

    async def create_schema(self) -> None:
        """Create the schema, or migrate an older one (:mod:`durable_sse.log.migrations`)."""
        await self.database.run("create the schema", create_schema, self.database.engine)

    async def close(self) -> None:
        """Flushes and closes L2 when there is one, then the database."""
        if self.l2 is not None:
            await self.l2.flush()
            await self.l2.close()
        await self.workers.database.close()
        await self.database.close()
