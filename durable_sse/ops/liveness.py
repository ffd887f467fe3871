"""A worker's liveness lease, and its watchdog over the other workers' leases.

Each worker process holds one lease (:mod:`durable_sse.log.workers`), renewed every
:data:`~durable_sse.log.workers.RENEW_INTERVAL` seconds with one ``UPDATE`` and no
Temporal action, so a thousand quiet streams cost nothing more to keep alive; a thread of
its own renews it (:mod:`durable_sse.ops.lease_keeper`), so a busy event loop is not
taken for a dead worker. Every :data:`WATCH_INTERVAL` the watchdog, on the loop, looks
for leases that expired, or whose process is gone (on PostgreSQL its sessions end with
it, a few seconds before its lease would expire): the first live worker
to revoke one (an atomic ``UPDATE``; exactly one succeeds) moves the dead worker's
connections (:class:`~durable_sse.ops.failover.Failover`). Temporal's heartbeat timeout
stays the backstop for a deployment where every worker died.

A worker that finds its own lease revoked was taken for dead (paused, partitioned, or a
GC pause longer than the lease): its streams already read elsewhere, the fence refuses
its commits, and it ends the connections it still runs, then takes a new lease for the
connections it starts from then on.

A worker restarted on the same host takes its predecessor's streams at once: a live
lease of this host (same boot) whose process is gone is revoked without waiting for it
to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from secrets import token_hex

from durable_sse.errors import StoreError
from durable_sse.log.sessions import boot_id
from durable_sse.log.workers import RENEW_INTERVAL, HeldConnection, WorkerLease, WorkerLeases
from durable_sse.ops.lease_keeper import LOOP_STALL_LIMIT, LeaseKeeper
from durable_sse.ops.metrics import LivenessMetrics
from durable_sse.ops.processes import process_alive

logger = logging.getLogger(__name__)

WATCH_INTERVAL = 0.5
"""Seconds between two looks at the other workers' leases: with a lease of
:data:`~durable_sse.log.workers.LEASE_TTL` seconds, a dead worker is found at most
``LEASE_TTL + WATCH_INTERVAL`` after its last renewal; one whose process is gone, and
so its database sessions, ``SESSIONS_GRACE + WATCH_INTERVAL`` after it (on PostgreSQL)."""
MOVES_AT_ONCE = 32
"""Connections of a dead worker moved at once (each a few Temporal calls)."""

BALANCE_INTERVAL = 10.0
"""Seconds between two looks at how the pool's connections are spread."""
BALANCE_TOLERANCE = 1.25
"""A worker holding more than this times its fair share hands the excess over."""
MAX_SHED = 100
"""Connections one worker hands over per look, spread over the interval: never a burst."""

MoveConnection = Callable[[HeldConnection, WorkerLease], Awaitable[None]]
"""Makes one connection of a dead worker read again elsewhere."""
FindUnregistered = Callable[[WorkerLease, set[str]], Awaitable[list[HeldConnection]]]
"""The attempts a dead worker started that no connection row names (a read not
registered yet, a short activity), given the workflow ids of the connections that
running workers registered or that were just moved off it."""
Revoked = Callable[[str], None]
"""Told the worker id of this worker's own lease when it finds it revoked."""
Shed = Callable[[int, float], Awaitable[int]]
"""Hands ``n`` of this worker's connections over to the pool within ``seconds``;
returns how many it did."""


def to_shed(
    counts: Mapping[str, int],
    me: str,
    *,
    tolerance: float = BALANCE_TOLERANCE,
    most: int = MAX_SHED,
) -> int:
    """How many connections worker ``me`` hands over, given every live worker's count:
    none while it holds at most ``tolerance`` times the fair share (or one more than it),
    else its excess over the fair share, at most ``most``. A connection handed over
    lands on any worker, this one included, so a few looks converge."""
    if me not in counts:
        return 0
    fair = sum(counts.values()) / len(counts)
    mine = counts[me]
    if mine <= max(fair * tolerance, fair + 1):
        return 0
    return min(math.floor(mine - fair), most)


def ended_here(
    lease: WorkerLease,
    *,
    host: str | None = None,
    boot: str | None = None,
    pid: int | None = None,
) -> bool:
    """Whether the lease's worker is known to be gone: it ran on this host (this boot)
    and its process runs no more. A restarted container keeps its host name, and its new
    process may even have the old pid, which is then no other worker's. Elsewhere a worker
    may be only paused: never known to be gone. ``host``, ``boot`` and ``pid`` are this
    process's unless given."""
    return (
        lease.host == (socket.gethostname() if host is None else host)
        and lease.boot_id == (boot_id() if boot is None else boot)
        and (lease.pid == (os.getpid() if pid is None else pid) or not process_alive(lease.pid))
    )


def predecessors(
    leases: list[WorkerLease], *, me: str, host: str, boot: str, pid: int
) -> list[WorkerLease]:
    """Leases of workers that ran on this host before this one and are gone
    (:func:`ended_here`)."""
    return [
        lease
        for lease in leases
        if lease.worker_id != me and ended_here(lease, host=host, boot=boot, pid=pid)
    ]


class WorkerLiveness:
    """This worker's lease and watchdog (see the module docstring).

    Args:
        leases: the ``sse_workers`` rows.
        pool: the workers that can take each other's streams (``<namespace>:<queue>``).
        move: makes a dead worker's connection read again elsewhere.
        unregistered: finds the attempts of a dead worker that no connection row names,
            to move them too (None: they wait for their timeouts).
        on_revoked: told when this worker's own lease was revoked (it ends the
            connections that run under it).
        shed: hands some of this worker's connections over, when it holds more than
            its share of the pool's (None: connections stay where they start).
    """

    def __init__(
        self,
        leases: WorkerLeases,
        *,
        pool: str,
        move: MoveConnection,
        unregistered: FindUnregistered | None = None,
        on_revoked: Revoked | None = None,
        shed: Shed | None = None,
        balance_interval: float = BALANCE_INTERVAL,
        metrics: LivenessMetrics | None = None,
        host: str | None = None,
        pid: int | None = None,
        renew_interval: float = RENEW_INTERVAL,
        watch_interval: float = WATCH_INTERVAL,
        stall_limit: float = LOOP_STALL_LIMIT,
    ) -> None:
        self.leases = leases
        self.pool = pool
        self.move = move
        self.unregistered = unregistered
        self.on_revoked = on_revoked
        self.shed = shed
        self.metrics = metrics
        self.balance_interval = balance_interval
        self.handed_over = 0
        """Connections this worker handed over to spread the pool's load."""
        self._shedding: asyncio.Task[None] | None = None
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.boot_id = boot_id()
        self.keeper = LeaseKeeper(leases, interval=renew_interval, stall_limit=stall_limit)
        self.watch_interval = watch_interval
        self.worker_id: str | None = None
        """The lease held now (None: none yet)."""
        self.moved = 0
        """Connections of dead workers this worker moved."""
        self._moves: set[asyncio.Task[None]] = set()
        """Dead workers' connections being moved (:meth:`_move_off`)."""
        self.revocations = 0
        """Times this worker found its own lease revoked."""
        self._next_balance = 0.0

    def _new_id(self) -> str:
        return f"{self.host}:{self.pid}:{token_hex(4)}"

    async def start(self) -> None:
        """Take a lease and keep renewing it, then take the streams of a predecessor on
        this host, if any."""
        worker_id = self._new_id()
        await self._acquire(worker_id)
        self.worker_id = worker_id
        self.keeper.keep(worker_id)
        self.keeper.start()
        self._next_balance = time.monotonic() + self.balance_interval
        logger.info("worker lease %s taken", worker_id)
        on_host = await self.leases.on_host(self.pool, self.host, self.boot_id)
        for lease in predecessors(
            on_host, me=worker_id, host=self.host, boot=self.boot_id, pid=self.pid
        ):
            if await self.leases.revoke(lease.worker_id, by=worker_id, expired_only=False):
                logger.warning(
                    "worker %s ran on this host before this one and is gone: moving its "
                    "connections now",
                    lease.worker_id,
                )
                self._move_off(lease)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the others' leases until ``stop``; a store that fails is logged and tried
        again (this worker's own lease may lapse meanwhile: the others move its streams,
        and the fence keeps it from writing beside them)."""
        while not stop.is_set():
            try:
                await self.tick()
            except StoreError as error:
                logger.warning("worker lease: %s (trying again)", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.watch_interval)

    async def tick(self) -> None:
        """Act on this worker's own lease if the keeper found it revoked, then look at
        the other leases.

        A worker judges the others only after its own lease has been renewed without a
        failure for a whole lease: after a database outage every lease looks expired, and
        the live workers must have had their chance to renew before anyone is moved.
        """
        lost = self.keeper.take_lost()
        if lost is not None:
            self._lost(lost)
        if self.keeper.worker_id is None and self.worker_id is not None:
            await self._renew_identity()
        now = time.monotonic()
        healthy = self.keeper.healthy_since
        if healthy is None or now - healthy < self.leases.ttl:
            return
        for dead in await self.leases.expired(self.pool):
            if dead.worker_id == self.worker_id:
                continue  # ours lapsed (a slow renewal): renewing tells whether it was taken
            if await self.leases.revoke(dead.worker_id, by=self.worker_id or "?"):
                silent = max(time.time() - dead.renewed_at, 0.0)
                logger.warning(
                    "worker %s stopped renewing its lease %.1f s ago%s: moving its connections",
                    dead.worker_id,
                    silent,
                    " and its process is gone (no database session left)"
                    if dead.sessions_gone
                    else "",
                )
                if self.metrics is not None:
                    self.metrics.failover_detect_seconds.record(silent)
                self._move_off(dead)
        if self.shed is not None and now >= self._next_balance:
            self._next_balance = now + self.balance_interval
            await self.balance()

    async def balance(self) -> None:
        """Hand over what this worker holds beyond its share of the pool's connections,
        spread over the next interval (in the background; one hand-over at a time)."""
        if self.shed is None or self.worker_id is None:
            return
        if self._shedding is not None and not self._shedding.done():
            return
        counts = await self.leases.connection_counts(self.pool)
        count = to_shed(counts, self.worker_id)
        if count:
            logger.info(
                "worker %s holds %d of the pool's %d connections over %d workers: handing %d over",
                self.worker_id,
                counts[self.worker_id],
                sum(counts.values()),
                len(counts),
                count,
            )
            self._shedding = asyncio.create_task(self._shed(count))

    async def _shed(self, count: int) -> None:
        assert self.shed is not None
        try:
            done = await self.shed(count, self.balance_interval * 0.8)
            self.handed_over += done
            if self.metrics is not None:
                self.metrics.handovers.add(done)
        except Exception as error:  # noqa: BLE001 - the next look tries again
            logger.warning("could not hand connections over: %s", error)

    def _lost(self, worker_id: str) -> None:
        """This worker's lease ``worker_id`` was revoked: end what runs under it (the next
        tick takes a new one)."""
        self.revocations += 1
        if self.metrics is not None:
            self.metrics.lease_revocations.add(1)
        logger.error(
            "worker lease %s was revoked: this worker was taken for dead (paused or cut off "
            "for longer than the lease) and its streams moved to others; ending the "
            "connections it still runs and taking a new lease",
            worker_id,
        )
        if self.on_revoked is not None:
            self.on_revoked(worker_id)

    async def _renew_identity(self) -> None:
        """Take a new lease for the connections this worker starts from now on (a store
        that fails leaves it for the next tick)."""
        fresh = self._new_id()
        await self._acquire(fresh)
        self.worker_id = fresh
        self.keeper.keep(fresh)

    async def _acquire(self, worker_id: str) -> None:
        await self.leases.acquire(
            worker_id, pool=self.pool, host=self.host, pid=self.pid, boot_id=self.boot_id
        )

    async def has_peers(self) -> bool:
        """Whether another live worker of the pool could take this one's connections."""
        counts = await self.leases.connection_counts(self.pool)
        return any(worker != self.worker_id for worker in counts)

    def stop_balancing(self) -> None:
        """At shutdown every connection hands over anyway: a hand-over under way would
        cancel some that are reading on until their retries start."""
        self.shed = None
        if self._shedding is not None:
            self._shedding.cancel()

    async def drain(self) -> None:
        """This worker is stopping: stop balancing, and say so in the lease, so that the
        others stop counting it among the workers that share the pool's connections
        (counted, its emptying made them hand over the connections it was handing to
        them: a 200-stream SIGTERM's longest wait p99 went from 0.3 s to 3.2 s). A store
        that fails leaves it counted, as before."""
        self.stop_balancing()
        if self.worker_id is not None:
            with contextlib.suppress(StoreError):
                await self.leases.drain(self.worker_id)

    async def leave(self) -> None:
        """A clean shutdown: the moves under way end (no other worker will move what this
        one revoked), then the lease ends and nothing of this worker's is moved."""
        self.stop_balancing()
        await self.moves_done()
        await self.keeper.stop()
        worker_id, self.worker_id = self.worker_id, None
        if worker_id is not None:
            with contextlib.suppress(StoreError):
                await self.leases.leave(worker_id)

    def _move_off(self, dead: WorkerLease) -> None:
        """Move ``dead``'s connections in the background. The renewal must not wait for
        them: at 1,000 streams a survivor's 62 moves took 6.5 s, its own lease lapsed
        meanwhile, and the worker it had just judged took it for dead in turn."""
        task = asyncio.create_task(self._move_all(dead))
        self._moves.add(task)
        task.add_done_callback(self._moves.discard)

    async def moves_done(self) -> None:
        """Wait until the dead workers' connections being moved have moved."""
        while self._moves:
            await asyncio.gather(*self._moves, return_exceptions=True)

    async def _move_all(self, dead: WorkerLease) -> None:
        try:
            held = await self.leases.connections(dead.worker_id)
        except StoreError as error:
            logger.warning(
                "could not read the connections of worker %s to move them: %s (Temporal's "
                "heartbeat timeout will)",
                dead.worker_id,
                error,
            )
            return
        gate = asyncio.Semaphore(MOVES_AT_ONCE)

        async def move(connection: HeldConnection) -> None:
            async with gate:
                try:
                    await self.move(connection, dead)
                    self.moved += 1
                    if self.metrics is not None:
                        self.metrics.failovers.add(1)
                except Exception as error:  # noqa: BLE001 - one stream's failure is its own
                    logger.warning(
                        "could not move stream %s off worker %s: %s (Temporal's heartbeat "
                        "timeout will)",
                        connection.stream,
                        dead.worker_id,
                        error,
                    )

        await asyncio.gather(*(move(connection) for connection in held))
        logger.info("moved %d connection(s) off worker %s", len(held), dead.worker_id)
        if self.unregistered is None:
            return
        try:
            registered = await self.leases.workflows_read_by_running_workers()
            registered.update(c.workflow_id for c in held if c.workflow_id is not None)
            late = await self.unregistered(dead, registered)
        except Exception as error:  # noqa: BLE001 - Temporal's heartbeat timeout is the backstop
            logger.warning(
                "could not look for attempts worker %s had not registered: %s (Temporal's "
                "heartbeat timeout will end them)",
                dead.worker_id,
                error,
            )
            return
        if late:
            await asyncio.gather(*(move(connection) for connection in late))
            logger.info(
                "moved %d attempt(s) of worker %s that no connection row named (a start "
                "not registered yet, or a short activity)",
                len(late),
                dead.worker_id,
            )
