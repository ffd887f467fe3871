"""Workers' liveness leases (``sse_workers``): who is alive, who is fenced off.

Temporal notices a dead worker only when each of its read attempts misses a heartbeat,
and every heartbeat is a billed action: at the default five-minute heartbeat timeout a
SIGKILLed worker's streams would stall for minutes. So each worker process holds one
short lease here instead, renewed every :data:`RENEW_INTERVAL` by a plain ``UPDATE``
(no Temporal action), and any live worker that finds a lease expired revokes it and moves
that worker's connections (:mod:`durable_sse.ops.liveness`).

Why the database and not Redis: the lease is also the *fence*. Every commit of a
connection checks, in its own transaction, that the lease it started under is not
revoked (:func:`revoked_among`). A worker that was only paused (SIGSTOP, a long GC
pause, a partition) and comes back cannot write beside its replacement, even when it
cannot reach Redis; and the watchdog that revokes its lease ends the transactions it was
paused in (:mod:`durable_sse.log.sessions`), so their locks do not hold up the streams
that moved.

A process that dies (SIGKILL, an OOM kill, a crash) is found sooner than its lease
expires: the kernel closes its sockets, PostgreSQL ends its sessions at once, and every
session this package opens is named after its process (:mod:`durable_sse.log.sessions`).
A lease unrenewed for :data:`SESSIONS_GRACE` whose process has no session left is taken
as dead then. What keeps its sessions open without renewing (a pause, a frozen VM, a host
that lost power and sent nothing) waits for the expiry; so does a lease last renewed
before the server started (after a restart of PostgreSQL, no one's sessions survive), and
SQLite, which has no sessions to ask about.

Time is the database's clock (seconds since the epoch, :func:`db_now`), so two workers'
clocks never have to agree. Rows are kept for a day after a worker leaves or is revoked
(``durable-sse status`` and tests read them), then deleted by the next revocation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.errors import StoreError
from durable_sse.log.database import Database, error_summary
from durable_sse.log.schema import readers_table, workers_table
from durable_sse.log.sessions import end_open_transactions, session_name

logger = logging.getLogger(__name__)

LEASE_TTL = 5.0
"""Seconds a lease lasts past its last renewal: two renewals may be lost, or the process
paused for 3.5 s, before a live worker is taken for dead (its streams then move, nothing
is lost). Short, since a dead worker's streams wait this long. A busy event loop does not
delay renewals (:mod:`durable_sse.ops.lease_keeper`)."""
RENEW_INTERVAL = 1.5
"""Seconds between renewals of a worker's lease."""
SESSIONS_GRACE = RENEW_INTERVAL + 0.5
"""Seconds a lease may go unrenewed before a watchdog asks PostgreSQL whether its
process still has a session (:func:`gone_clause`): a renewal's time, and half a second."""
REVOKE_LOCK_WAIT_MS = 2000
"""Milliseconds a revocation waits for the lease's row (PostgreSQL ``lock_timeout``)."""
LOCK_NOT_AVAILABLE = "55P03"
"""PostgreSQL's SQLSTATE for a ``lock_timeout`` that ran out."""
KEEP_ENDED = 86_400.0
"""Seconds an ended lease's row is kept (then deleted by the next revocation)."""


class WorkerState(StrEnum):
    LIVE = "live"
    DRAINING = "draining"
    """Stopping: its connections read on until their retries start elsewhere. It still
    renews, commits and can be taken for dead, but no longer shares the pool's load: a
    balancer that counted it would hand connections over in the middle of a deploy."""
    REVOKED = "revoked"
    """Expired and taken over (or a predecessor on the same host): fenced off for good."""
    LEFT = "left"
    """Shut down cleanly: nothing to move."""


HOLDING = (WorkerState.LIVE.value, WorkerState.DRAINING.value)
"""The states of a lease whose worker may run connections: renewed, fenced, and moved
when it dies."""


class WorkerLeaseLostError(StoreError):
    """A connection's worker lease was revoked: the worker was taken for dead and its
    streams moved to others, so nothing it still reads may commit. The attempt ends;
    its stream already reads elsewhere."""


@dataclass(frozen=True)
class WorkerLease:
    """One worker process's lease row."""

    worker_id: str
    pool: str
    host: str
    pid: int
    boot_id: str
    state: str
    renewed_at: float
    expires_at: float
    sessions_gone: bool = False
    """Found dead before its expiry: unrenewed, and its process has no session left."""


@dataclass(frozen=True)
class HeldConnection:
    """A connection a worker registered in ``sse_readers``, with the Temporal activity
    attempt that runs it (None: registered by a build that did not record it)."""

    stream: str
    reader_id: str
    workflow_id: str | None
    run_id: str | None
    activity_id: str | None
    attempt: int | None


def db_now(connection: Connection) -> sa.ColumnElement[Any]:
    """The database's clock in seconds since the epoch, as a SQL expression."""
    if connection.dialect.name == "postgresql":
        return sa.func.extract("epoch", sa.func.clock_timestamp())
    return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)")


def gone_clause(connection: Connection, table: sa.Table, name: str) -> sa.ColumnElement[bool]:
    """A lease whose process is gone, as a SQL condition: unrenewed for
    :data:`SESSIONS_GRACE`, renewed since the server started, and no session named
    ``name`` (its process's :func:`~durable_sse.log.sessions.session_name`). Always false
    on SQLite."""
    if connection.dialect.name != "postgresql":
        return sa.false()
    activity = sa.table("pg_stat_activity", sa.column("application_name"))
    started = sa.func.extract("epoch", sa.func.pg_postmaster_start_time())
    return sa.and_(
        table.c.renewed_at < db_now(connection) - SESSIONS_GRACE,
        table.c.renewed_at > started,
        ~sa.exists().where(activity.c.application_name == name),
    )


def revoked_among(connection: Connection, worker_ids: Iterable[str]) -> set[str]:
    """The fence, inside a commit's transaction: which of ``worker_ids`` may not commit
    (revoked, or no lease at all).

    A plain read, no row lock: a worker paused in the middle of a commit would hold such
    a lock, and its revocation (the watchdog's ``UPDATE``) would wait for it to come
    back. So a transaction that read the fence before the revocation may still commit
    after it (on PostgreSQL, only if it was not paused: the revocation ends a paused
    worker's open transactions); every later one fails. Such a batch is as harmless as
    any two writers of one stream (idempotent rows, monotone gap records and cursors).
    """
    wanted = sorted(set(worker_ids))
    if not wanted:
        return set()
    table = workers_table
    query = sa.select(table.c.worker_id, table.c.state).where(table.c.worker_id.in_(wanted))
    states = {row.worker_id: row.state for row in connection.execute(query)}
    return {w for w in wanted if states.get(w) not in (*HOLDING, WorkerState.LEFT)}


class WorkerLeases:
    """The ``sse_workers`` rows, over the shared database."""

    def __init__(self, database: Database, *, ttl: float = LEASE_TTL) -> None:
        self.database = self._database = database
        self.ttl = ttl

    async def acquire(
        self, worker_id: str, *, pool: str, host: str, pid: int, boot_id: str
    ) -> None:
        """Take a new lease (a worker's identity changes with every lease it takes)."""
        await self._database.run(
            "take a worker lease", self._acquire, worker_id, pool, host, pid, boot_id
        )

    def renew_here(self, worker_id: str) -> bool:
        """Extend the lease; False when it is not live any more (revoked: the worker was
        taken for dead and its streams moved). Runs in the calling thread: the lease
        keeper's own (:mod:`durable_sse.ops.lease_keeper`), which no other call queues
        behind."""
        self._database.refuse_if_closed("renew a worker lease")
        return self._database.guarded("renew a worker lease", self._renew, worker_id)

    async def drain(self, worker_id: str) -> None:
        """The worker is stopping: it no longer counts among the pool's workers that share
        its connections (:meth:`connection_counts`)."""
        await self._database.run("mark a worker lease draining", self._drain, worker_id)

    async def leave(self, worker_id: str) -> None:
        """A clean shutdown: the lease ends, and nobody moves anything."""
        await self._database.run("end a worker lease", self._leave, worker_id)

    async def expired(self, pool: str) -> list[WorkerLease]:
        """Leases of the pool's running workers (live or draining) that are dead: past
        their expiry, or (PostgreSQL) their process gone (:func:`gone_clause`)."""
        return await self._database.run("read expired worker leases", self._expired, pool)

    async def on_host(self, pool: str, host: str, boot_id: str) -> list[WorkerLease]:
        """Leases of the pool's running workers on this host (since its last boot)."""
        return await self._database.run("read worker leases", self._on_host, pool, host, boot_id)

    async def connection_counts(self, pool: str) -> dict[str, int]:
        """Connections each live worker of the pool runs now (0 for one that runs none); a
        draining one is not among them: it shares no load any more."""
        return await self._database.run(
            "count the workers' connections", self._connection_counts, pool
        )

    async def revoke(self, worker_id: str, *, by: str, expired_only: bool = True) -> bool:
        """Revoke a running worker's lease; True for exactly one caller. ``expired_only``:
        only once it is dead (a watchdog); False: whatever its expiry (a successor on its
        host)."""
        return await self._database.run(
            "revoke a worker lease", self._revoke, worker_id, by, expired_only
        )

    async def lease(self, worker_id: str) -> WorkerLease | None:
        return await self._database.run("read a worker lease", self._lease, worker_id)

    async def connections(self, worker_id: str) -> list[HeldConnection]:
        """The connections a worker registered and has not released."""
        return await self._database.run("read a worker's connections", self._connections, worker_id)

    async def workflows_read_by_running_workers(self) -> set[str]:
        """The workflow ids of the connections that a running worker registered (or none:
        tests, tools). A dead worker's row stays until it expires (an hour and more), and
        a workflow whose read was moved off it may run its next attempt on a worker that
        dies before registering: that attempt must still be looked for."""
        return await self._database.run(
            "read the registered connections", self._workflows_read_by_running_workers
        )

    # -- in a database thread ----------------------------------------------------------

    def _acquire(self, worker_id: str, pool: str, host: str, pid: int, boot_id: str) -> None:
        table = workers_table
        with self._database.begin() as connection:
            now = db_now(connection)
            connection.execute(
                sa.insert(table).values(
                    worker_id=worker_id,
                    pool=pool,
                    host=host,
                    pid=pid,
                    boot_id=boot_id,
                    state=WorkerState.LIVE.value,
                    started_at=now,
                    renewed_at=now,
                    expires_at=now + self.ttl,
                )
            )

    def _renew(self, worker_id: str) -> bool:
        table = workers_table
        with self._database.begin() as connection:
            now = db_now(connection)
            result = connection.execute(
                sa.update(table)
                .where(table.c.worker_id == worker_id, table.c.state.in_(HOLDING))
                .values(renewed_at=now, expires_at=now + self.ttl)
            )
            return result.rowcount == 1

    def _drain(self, worker_id: str) -> None:
        table = workers_table
        with self._database.begin() as connection:
            connection.execute(
                sa.update(table)
                .where(table.c.worker_id == worker_id, table.c.state == WorkerState.LIVE.value)
                .values(state=WorkerState.DRAINING.value)
            )

    def _leave(self, worker_id: str) -> None:
        table = workers_table
        with self._database.begin() as connection:
            connection.execute(
                sa.update(table)
                .where(table.c.worker_id == worker_id, table.c.state.in_(HOLDING))
                .values(state=WorkerState.LEFT.value, ended_at=db_now(connection))
            )

    def _expired(self, pool: str) -> list[WorkerLease]:
        table = workers_table
        with self._database.begin() as connection:
            now = db_now(connection)
            # Past its expiry, or unrenewed long enough for :func:`gone_clause` to ask.
            rows = connection.execute(
                sa.select(table, (table.c.expires_at < now).label("expired")).where(
                    table.c.pool == pool,
                    table.c.state.in_(HOLDING),
                    table.c.renewed_at < now - min(SESSIONS_GRACE, self.ttl),
                )
            ).all()
            dead = []
            for row in rows:
                lease = _lease(row)
                if row.expired:
                    dead.append(lease)
                    continue
                gone = sa.select(gone_clause(connection, table, _session_of(lease)))
                if connection.execute(gone.where(table.c.worker_id == lease.worker_id)).scalar():
                    dead.append(replace(lease, sessions_gone=True))
            return dead

    def _on_host(self, pool: str, host: str, boot_id: str) -> list[WorkerLease]:
        table = workers_table
        with self._database.begin() as connection:
            rows = connection.execute(
                sa.select(table).where(
                    table.c.pool == pool,
                    table.c.state.in_(HOLDING),
                    table.c.host == host,
                    table.c.boot_id == boot_id,
                )
            )
            return [_lease(row) for row in rows]

    def _connection_counts(self, pool: str) -> dict[str, int]:
        workers, readers = workers_table, readers_table
        with self._database.begin() as connection:
            rows = connection.execute(
                sa.select(workers.c.worker_id, sa.func.count(readers.c.reader_id))
                .select_from(workers.outerjoin(readers, readers.c.worker_id == workers.c.worker_id))
                .where(
                    workers.c.pool == pool,
                    workers.c.state == WorkerState.LIVE.value,
                    workers.c.expires_at >= db_now(connection),
                )
                .group_by(workers.c.worker_id)
            )
            return {worker_id: count for worker_id, count in rows}

    def _revoke(self, worker_id: str, by: str, expired_only: bool) -> bool:
        table = workers_table
        try:
            with self._database.begin() as connection:
                if connection.dialect.name == "postgresql":
                    # A worker paused in the middle of its renewal holds its row: give up
                    # for now rather than hang the watchdog (below).
                    connection.exec_driver_sql(f"SET LOCAL lock_timeout = {REVOKE_LOCK_WAIT_MS}")
                now = db_now(connection)
                conditions = [
                    table.c.worker_id == worker_id,
                    table.c.state.in_(HOLDING),
                ]
                if expired_only:
                    lease = self._lease_in(connection, worker_id)
                    if lease is None:
                        return False
                    conditions.append(
                        sa.or_(
                            table.c.expires_at < now,
                            gone_clause(connection, table, _session_of(lease)),
                        )
                    )
                result = connection.execute(
                    sa.update(table)
                    .where(*conditions)
                    .values(state=WorkerState.REVOKED.value, ended_at=now, revoked_by=by)
                )
                connection.execute(
                    sa.delete(table).where(
                        table.c.state.not_in(HOLDING),
                        table.c.ended_at < now - KEEP_ENDED,
                    )
                )
                revoked = result.rowcount == 1
        except sa.exc.OperationalError as error:
            if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            # Its renewal's transaction holds the row: ending it frees the row for the
            # next look, which revokes the lease.
            self._end_transactions(worker_id)
            return False
        if revoked:
            self._end_transactions(worker_id)
        return revoked

    def _end_transactions(self, worker_id: str) -> None:
        """End the open transactions of a worker taken for dead, so that the locks they
        hold (its streams' commit order) free up now (:mod:`durable_sse.log.sessions`).

        Never raises: the lease is revoked already, and its streams must move whether or
        not this works (a role that may not end sessions, say; PostgreSQL's idle timeout
        ends them later)."""
        try:
            with self._database.begin() as connection:
                lease = self._lease_in(connection, worker_id)
                if lease is None:
                    return
                ended = end_open_transactions(connection, _session_of(lease))
        except (sa.exc.SQLAlchemyError, psycopg.Error) as error:
            logger.warning(
                "could not end the open database transactions of worker %s (%s): the "
                "streams that moved may wait for their locks until PostgreSQL ends them",
                worker_id,
                error_summary(error),
            )
            return
        if ended:
            logger.warning(
                "ended %d open database transaction(s) of worker %s, taken for dead while "
                "in the middle of them: their locks held up the streams that moved",
                ended,
                worker_id,
            )

    def _lease(self, worker_id: str) -> WorkerLease | None:
        with self._database.begin() as connection:
            return self._lease_in(connection, worker_id)

    @staticmethod
    def _lease_in(connection: Connection, worker_id: str) -> WorkerLease | None:
        table = workers_table
        row = connection.execute(
            sa.select(table).where(table.c.worker_id == worker_id)
        ).one_or_none()
        return None if row is None else _lease(row)

    def _connections(self, worker_id: str) -> list[HeldConnection]:
        table = readers_table
        with self._database.begin() as connection:
            rows = connection.execute(
                sa.select(
                    table.c.stream,
                    table.c.reader_id,
                    table.c.workflow_id,
                    table.c.run_id,
                    table.c.activity_id,
                    table.c.attempt,
                )
                .where(table.c.worker_id == worker_id)
                .order_by(table.c.stream, table.c.reader_id)
            )
            return [
                HeldConnection(
                    stream=row.stream,
                    reader_id=row.reader_id,
                    workflow_id=row.workflow_id,
                    run_id=row.run_id,
                    activity_id=row.activity_id,
                    attempt=row.attempt,
                )
                for row in rows
            ]

    def _workflows_read_by_running_workers(self) -> set[str]:
        table, workers = readers_table, workers_table
        live = sa.select(workers.c.worker_id).where(workers.c.state.in_(HOLDING))
        query = sa.select(table.c.workflow_id).where(
            table.c.workflow_id.is_not(None),
            sa.or_(table.c.worker_id.is_(None), table.c.worker_id.in_(live)),
        )
        with self._database.begin() as connection:
            return {row.workflow_id for row in connection.execute(query.distinct())}


def _session_of(lease: WorkerLease) -> str:
    return session_name(lease.host, lease.pid, lease.boot_id)


def _lease(row: sa.Row[object]) -> WorkerLease:
    values = row._mapping
    return WorkerLease(
        worker_id=values["worker_id"],
        pool=values["pool"],
        host=values["host"],
        pid=values["pid"],
        boot_id=values["boot_id"],
        state=values["state"],
        renewed_at=float(values["renewed_at"]),
        expires_at=float(values["expires_at"]),
    )
