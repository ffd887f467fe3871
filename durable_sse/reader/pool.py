"""The connections one worker runs: how many, under which worker lease, and which end
early when the pool's connections are uneven or the lease is revoked.

The read activity registers each connection for as long as it runs
(:meth:`ConnectionPool.holding`); the worker's liveness asks the pool to end the ones
under a revoked lease (:meth:`ConnectionPool.lease_revoked`) or to hand some over
(:meth:`ConnectionPool.hand_over`). Ending one is cancelling its task: the connection
flushes, commits and returns, and the activity decides what its end means to Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

from durable_sse.contracts import Route
from durable_sse.errors import StoreError
from durable_sse.log.workers import WorkerLeases, WorkerState

logger = logging.getLogger(__name__)

HANDED_OVER = "handed over to spread the pool's connections over its workers"
"""Why a connection the pool hands over ends (:attr:`PooledConnection.moving`)."""


class PooledConnection(Protocol):
    """What the pool needs of a running connection."""

    worker_id: str | None
    """The worker lease it runs and commits under (None: none)."""
    moving: str | None
    """Why its own worker ends it so that it goes on elsewhere (set by the pool)."""

    @property
    def route(self) -> Route:
        """The route it reads on: live connections are handed over first."""
        ...

    @property
    def streaming(self) -> bool:
        """Whether it reads the stream's body (not starting, not ending)."""
        ...


class ConnectionPool:
    """The connections running on this worker, by task."""

    def __init__(self) -> None:
        self.running: dict[asyncio.Task[Any], PooledConnection] = {}
        self.under_lease: dict[str, set[asyncio.Task[Any]]] = {}
        """The tasks of the connections running under each worker lease."""
        self.open_connections = 0
        """Connections running now, starting and ending ones included (the heartbeat
        budget is shared among them)."""
        self.revoked_at: datetime | None = None
        """When this worker last found its lease revoked (None: never)."""
        self.revoked: set[str] = set()
        """The worker leases this worker found revoked."""
        self._asking: dict[str, asyncio.Future[bool]] = {}
        """The store's word on a lease being read now, shared by every connection that
        asks (:meth:`lease_lost`)."""

    @contextlib.contextmanager
    def holding(self, connection: PooledConnection) -> Iterator[None]:
        """Count ``connection`` in, as the current task, for as long as it runs."""
        self.open_connections += 1
        task, worker_id = asyncio.current_task(), connection.worker_id
        if task is not None:
            self.running[task] = connection
            if worker_id is not None:
                self.under_lease.setdefault(worker_id, set()).add(task)
        try:
            yield
        finally:
            if task is not None:
                self.running.pop(task, None)
                if worker_id is not None:
                    self.under_lease.get(worker_id, set()).discard(task)
            self.open_connections -= 1

    def lease_revoked(self, worker_id: str) -> None:
        """This worker's lease was revoked (it was taken for dead): its streams read
        elsewhere and the fence refuses every commit under that lease, so the
        connections still running under it end now rather than at their next batch."""
        self.revoked_at = datetime.now(UTC)
        self.revoked.add(worker_id)
        tasks = self.under_lease.pop(worker_id, set())
        for task in tasks:
            task.cancel()
        if tasks:
            logger.warning(
                "ended %d connection(s) of revoked worker lease %s", len(tasks), worker_id
            )

    async def lease_lost(self, worker_id: str, workers: WorkerLeases) -> bool:
        """Whether ``worker_id`` is revoked, as this worker found or, when it has not found
        out yet (a commit that failed at SIGCONT, before the worker's renewal ran), as the
        store says. A store that does not answer says no.

        At SIGCONT every connection's commit fails at once: one read of the lease answers
        them all (hundreds of reads queued on the leases' one thread), and a connection
        its worker ends meanwhile stops waiting for it at once."""
        if worker_id in self.revoked:
            return True
        asking = self._asking.get(worker_id)
        if asking is None:
            asking = asyncio.ensure_future(self._lease_revoked_in_store(worker_id, workers))
            self._asking[worker_id] = asking
            asking.add_done_callback(lambda _: self._asking.pop(worker_id, None))
        return await asyncio.shield(asking)

    @staticmethod
    async def _lease_revoked_in_store(worker_id: str, workers: WorkerLeases) -> bool:
        try:
            lease = await workers.lease(worker_id)
        except StoreError:
            return False
        return lease is not None and lease.state == WorkerState.REVOKED

    def stale(self, scheduled: datetime) -> bool:
        """Whether an attempt Temporal scheduled at ``scheduled`` came to this worker
        before its lease was revoked: a paused worker's polls take retries while it is
        stopped, which the watchdog has failed again by the time it runs them (they
        would read beside their successors under the worker's new lease)."""
        return self.revoked_at is not None and scheduled <= self.revoked_at

    async def hand_over(self, count: int, seconds: float) -> int:
        """End ``count`` connections cleanly, one every ``seconds / count``, each marked
        :data:`HANDED_OVER` so that it goes on wherever the pool has room. Connections on
        the live route go first; one that is starting or ending is left alone."""
        chosen = sorted(
            (item for item in self.running.items() if item[1].streaming),
            key=lambda item: item[1].route != Route.LIVE,
        )[:count]
        pause = seconds / max(len(chosen), 1)
        done = 0
        for task, connection in chosen:
            if task not in self.running or not connection.streaming:
                # Ended meanwhile, or ending: a cancellation in its clean-up (releasing
                # its registration) would replace the answer it has with a traceback.
                continue
            connection.moving = HANDED_OVER
            task.cancel()
            done += 1
            await asyncio.sleep(pause)
        return done
