"""A worker's liveness lease, and its watchdog over the other workers' leases.

Each worker process holds one lease (:mod:`durable_sse.log.workers`), renewed every
:data:`~durable_sse.log.workers.RENEW_INTERVAL` seconds with one ``UPDATE`` and no
Temporal action, so a thousand quiet streams cost nothing more to keep alive. Every
:data:`WATCH_INTERVAL` the same loop looks for leases that expired: the first live worker
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
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from secrets import token_hex

from durable_sse.errors import StoreError
from durable_sse.log.workers import RENEW_INTERVAL, HeldConnection, WorkerLease, WorkerLeases

logger = logging.getLogger(__name__)

WATCH_INTERVAL = 1.0
"""Seconds between two looks at the other workers' leases: with a lease of
:data:`~durable_sse.log.workers.LEASE_TTL` seconds, a dead worker is found at most
``LEASE_TTL + WATCH_INTERVAL`` after its last renewal."""
MOVES_AT_ONCE = 32
"""Connections of a dead worker moved at once (each a few Temporal calls)."""

MoveConnection = Callable[[HeldConnection, WorkerLease], Awaitable[None]]
"""Makes one connection of a dead worker read again elsewhere."""
Revoked = Callable[[str], None]
"""Told the worker id of this worker's own lease when it finds it revoked."""


def boot_id() -> str:
    """This host's boot (Linux): two hosts with one name, or a host that rebooted, never
    pass for the same. Empty where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this host (a zombie counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def predecessors(leases: list[WorkerLease], *, me: str, pid: int) -> list[WorkerLease]:
    """Leases of this host whose process is gone: a worker that ran here before this one
    (a restarted container keeps its host name; its new process may even have the old
    pid, which is then no other worker's)."""
    return [
        lease
        for lease in leases
        if lease.worker_id != me and (lease.pid == pid or not process_alive(lease.pid))
    ]


class WorkerLiveness:
    """This worker's lease and watchdog (see the module docstring).

    Args:
        leases: the ``sse_workers`` rows.
        move: makes a dead worker's connection read again elsewhere.
        on_revoked: told when this worker's own lease was revoked (it ends the
            connections that run under it).
    """

    def __init__(
        self,
        leases: WorkerLeases,
        *,
        move: MoveConnection,
        on_revoked: Revoked | None = None,
        host: str | None = None,
        pid: int | None = None,
        renew_interval: float = RENEW_INTERVAL,
        watch_interval: float = WATCH_INTERVAL,
    ) -> None:
        self.leases = leases
        self.move = move
        self.on_revoked = on_revoked
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.boot_id = boot_id()
        self.renew_interval = renew_interval
        self.watch_interval = watch_interval
        self.worker_id: str | None = None
        """The lease held now (None: none yet)."""
        self.moved = 0
        """Connections of dead workers this worker moved."""
        self.revocations = 0
        """Times this worker found its own lease revoked."""
        self._next_renewal = 0.0
        self._healthy_since: float | None = None
        """Since when every renewal succeeded (monotonic; None: the last one failed)."""

    def _new_id(self) -> str:
        return f"{self.host}:{self.pid}:{token_hex(4)}"

    async def start(self) -> None:
        """Take a lease, then the streams of a predecessor on this host, if any."""
        worker_id = self._new_id()
        await self.leases.acquire(worker_id, host=self.host, pid=self.pid, boot_id=self.boot_id)
        self.worker_id = worker_id
        now = time.monotonic()
        self._healthy_since, self._next_renewal = now, now + self.renew_interval
        logger.info("worker lease %s taken", worker_id)
        on_host = await self.leases.on_host(self.host, self.boot_id)
        for lease in predecessors(on_host, me=worker_id, pid=self.pid):
            if await self.leases.revoke(lease.worker_id, by=worker_id, expired_only=False):
                logger.warning(
                    "worker %s ran on this host before this one and is gone: moving its "
                    "connections now",
                    lease.worker_id,
                )
                await self._move_all(lease)

    async def run(self, stop: asyncio.Event) -> None:
        """Renew the lease and watch the others' until ``stop``; a store that fails is
        logged and tried again (the lease may lapse meanwhile: the others move this
        worker's streams, and the fence keeps it from writing beside them)."""
        while not stop.is_set():
            try:
                await self.tick()
            except StoreError as error:
                logger.warning("worker lease: %s (trying again)", error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.watch_interval)

    async def tick(self) -> None:
        """One renewal (when due) and one look at the other leases.

        A worker judges the others only after its own lease has been renewed without a
        failure for a whole lease: after a database outage every lease looks expired, and
        the live workers must have had their chance to renew before anyone is moved.
        """
        now = time.monotonic()
        if now >= self._next_renewal:
            try:
                await self.renew()
            except StoreError:
                self._healthy_since = None
                raise
            if self._healthy_since is None:
                self._healthy_since = now
        healthy = self._healthy_since
        if healthy is None or now - healthy < self.leases.ttl:
            return
        for dead in await self.leases.expired():
            if dead.worker_id == self.worker_id:
                continue  # ours lapsed (a slow renewal): renewing tells whether it was taken
            if await self.leases.revoke(dead.worker_id, by=self.worker_id or "?"):
                logger.warning(
                    "worker %s stopped renewing its lease %.1f s ago: moving its connections",
                    dead.worker_id,
                    max(time.time() - dead.renewed_at, 0.0),
                )
                await self._move_all(dead)

    async def renew(self) -> None:
        worker_id = self.worker_id
        if worker_id is None:
            return
        self._next_renewal = time.monotonic() + self.renew_interval
        if await self.leases.renew(worker_id):
            return
        self.revocations += 1
        logger.error(
            "worker lease %s was revoked: this worker was taken for dead (paused or cut off "
            "for longer than the lease) and its streams moved to others; ending the "
            "connections it still runs and taking a new lease",
            worker_id,
        )
        if self.on_revoked is not None:
            self.on_revoked(worker_id)
        fresh = self._new_id()
        await self.leases.acquire(fresh, host=self.host, pid=self.pid, boot_id=self.boot_id)
        self.worker_id = fresh

    async def leave(self) -> None:
        """A clean shutdown: the lease ends and nothing is moved."""
        worker_id, self.worker_id = self.worker_id, None
        if worker_id is not None:
            with contextlib.suppress(StoreError):
                await self.leases.leave(worker_id)

    async def _move_all(self, dead: WorkerLease) -> None:
        held = await self.leases.connections(dead.worker_id)
        gate = asyncio.Semaphore(MOVES_AT_ONCE)

        async def move(connection: HeldConnection) -> None:
            async with gate:
                try:
                    await self.move(connection, dead)
                    self.moved += 1
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
