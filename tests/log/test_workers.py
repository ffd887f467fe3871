"""Worker liveness leases and the fence (``sse_workers``), on PostgreSQL and SQLite.

What a watchdog relies on: a lease expires by the database's clock, exactly one of two
watchdogs revokes it, a revoked worker can neither start a connection nor commit a batch
(the fence), its registered connections name their Temporal attempts, and a worker
restarted on the same host takes over from its dead predecessor at once.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from durable_sse.cursor.readers import ReaderLease
from durable_sse.errors import StoreError
from durable_sse.log.records import EventRecord
from durable_sse.log.schema import STREAM_LOCK_CLASS, stream_lock_key
from durable_sse.log.sessions import end_open_transactions, session_name, this_process
from durable_sse.log.workers import (
    SESSIONS_GRACE,
    HeldConnection,
    WorkerLease,
    WorkerLeaseLostError,
    WorkerLeases,
    WorkerState,
)
from durable_sse.ops.lease_keeper import LeaseKeeper
from durable_sse.ops.liveness import WorkerLiveness, predecessors, to_shed
from durable_sse.stores import Stores
from tests.conftest import open_stores

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
POOL = f"default:test-workers-{uuid.uuid4().hex[:8]}"


def record(event_id: str) -> EventRecord:
    return EventRecord(
        event_id=event_id, event_ord=0, event_type="message", data="x", received_at=T0
    )


def worker_name() -> str:
    return f"test-worker-{uuid.uuid4().hex[:8]}"


def reader(worker_id: str | None, *, stream: str, activity_id: str = "7") -> ReaderLease:
    return ReaderLease(
        reader_id=f"{activity_id}.1.{uuid.uuid4().hex[:6]}",
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
        worker_id=worker_id,
        workflow_id=f"sse-stream:{stream}",
        run_id="run-1",
        activity_id=activity_id,
        attempt=1,
    )


async def hold_connections(stores: Stores, worker_id: str, prefix: str, count: int) -> None:
    """Register ``count`` connections of ``worker_id``, one per stream ``<prefix>-<i>``."""
    for index in range(count):
        await stores.starts.connection_context(
            f"{prefix}-{index}",
            "numeric",
            cursor=None,
            source="none",
            reader=reader(worker_id, stream=f"{prefix}-{index}"),
        )


async def expired_ids(leases: WorkerLeases, pool: str = POOL) -> set[str]:
    """The workers a watchdog of ``pool`` would take for dead now."""
    return {lease.worker_id for lease in await leases.expired(pool)}


async def nothing_to_move(connection: HeldConnection, lease: WorkerLease) -> None:
    raise AssertionError("nothing to move")


async def stored_ids(stores: Stores, stream: str) -> list[str]:
    return [row.event_id for row in await stores.reads.events(stream)]


async def test_a_lease_expires_by_the_database_clock_and_one_watchdog_revokes_it(
    stores: Stores,
) -> None:
    leases = WorkerLeases(stores.database, ttl=0.3)
    dead = worker_name()
    await leases.acquire(dead, pool=POOL, host="h", pid=1, boot_id="b")
    assert await asyncio.to_thread(leases.renew_here, dead)
    assert dead not in await expired_ids(leases)
    await asyncio.sleep(0.5)
    assert dead in await expired_ids(leases)
    won = await asyncio.gather(*(leases.revoke(dead, by=f"w{i}") for i in range(4)))
    assert sorted(won) == [False, False, False, True]
    # the dead worker, back, learns it was taken over
    assert not await asyncio.to_thread(leases.renew_here, dead)
    lease = await leases.lease(dead)
    assert lease is not None and lease.state == WorkerState.REVOKED


async def test_a_live_lease_is_not_revoked_by_a_watchdog(stores: Stores) -> None:
    leases = stores.workers
    alive = worker_name()
    await leases.acquire(alive, pool=POOL, host="h", pid=1, boot_id="b")
    assert not await leases.revoke(alive, by="other")
    assert await leases.revoke(alive, by="successor", expired_only=False)


async def test_a_draining_worker_shares_no_load_but_runs_until_it_leaves(
    stores: Stores, stream_name: str
) -> None:
    """At SIGTERM a worker drains: the others stop counting it among the workers that
    share the pool (counted while it emptied, it made them hand over the connections it
    was handing to them), while its connections still renew, commit, and move if it dies."""
    leases = WorkerLeases(stores.database, ttl=0.3)
    pool = f"default:drain-{uuid.uuid4().hex[:8]}"
    busy, stopping = worker_name(), worker_name()
    for worker in (busy, stopping):
        await leases.acquire(worker, pool=pool, host="h", pid=1, boot_id="b")
    await hold_connections(stores, busy, stream_name, 3)
    assert to_shed(await leases.connection_counts(pool), busy) == 1
    await leases.drain(stopping)
    assert await leases.connection_counts(pool) == {busy: 3}
    assert to_shed(await leases.connection_counts(pool), busy) == 0
    assert await asyncio.to_thread(leases.renew_here, stopping)
    job = stores.writer.submit_batch(
        f"{stream_name}-draining", "numeric", [record("1")], worker_id=stopping
    )
    assert (await stores.writer.committed(job)).new_rows == 1
    await asyncio.sleep(0.5)
    assert await expired_ids(leases, pool) == {busy, stopping}
    assert await leases.revoke(stopping, by=busy)
    await leases.leave(busy)
    assert await leases.connection_counts(pool) == {}


async def test_the_fence_fails_a_revoked_workers_batch_and_commits_the_others(
    stores: Stores, stream_name: str
) -> None:
    leases = stores.workers
    old, new = worker_name(), worker_name()
    for worker in (old, new):
        await leases.acquire(worker, pool=POOL, host="h", pid=1, boot_id="b")
    await leases.revoke(old, by=new, expired_only=False)
    writer = stores.writer
    other = f"{stream_name}-other"
    stale = writer.submit_batch(stream_name, "numeric", [record("1")], worker_id=old)
    later = writer.submit_batch(stream_name, "numeric", [record("2")], after=stale, worker_id=old)
    fresh = writer.submit_batch(other, "numeric", [record("1")], worker_id=new)
    with pytest.raises(WorkerLeaseLostError, match="revoked"):
        await writer.committed(stale)
    with pytest.raises(StoreError):
        await writer.committed(later)  # after a batch that did not commit: left out
    assert (await writer.committed(fresh)).new_rows == 1
    assert await stored_ids(stores, stream_name) == []
    assert await stored_ids(stores, other) == ["1"]


async def test_a_batch_of_an_unknown_lease_is_fenced_too(stores: Stores, stream_name: str) -> None:
    job = stores.writer.submit_batch(stream_name, "numeric", [record("1")], worker_id="nobody")
    with pytest.raises(WorkerLeaseLostError):
        await stores.writer.committed(job)


async def test_a_revoked_worker_cannot_start_a_connection(stores: Stores, stream_name: str) -> None:
    leases = stores.workers
    worker = worker_name()
    await leases.acquire(worker, pool=POOL, host="h", pid=1, boot_id="b")
    start = await stores.starts.connection_context(
        stream_name,
        "numeric",
        cursor=None,
        source="none",
        reader=reader(worker, stream=stream_name),
    )
    assert start.cursor is None
    assert [c.stream for c in await leases.connections(worker)] == [stream_name]
    await leases.revoke(worker, by="successor", expired_only=False)
    with pytest.raises(WorkerLeaseLostError, match="revoked"):
        await stores.starts.connection_context(
            stream_name,
            "numeric",
            cursor=None,
            source="none",
            reader=reader(worker, stream=stream_name, activity_id="8"),
        )


async def test_registered_connections_name_their_temporal_attempts(
    stores: Stores, stream_name: str
) -> None:
    leases = stores.workers
    worker = worker_name()
    await leases.acquire(worker, pool=POOL, host="h", pid=1, boot_id="b")
    lease = reader(worker, stream=stream_name, activity_id="12")
    await stores.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none", reader=lease
    )
    (held,) = await leases.connections(worker)
    assert held == HeldConnection(
        stream=stream_name,
        reader_id=lease.reader_id,
        workflow_id=f"sse-stream:{stream_name}",
        run_id="run-1",
        activity_id="12",
        attempt=1,
    )
    await stores.readers.release_reader(stream_name, lease.reader_id)
    assert await leases.connections(worker) == []


async def test_only_a_running_workers_connection_counts_as_registered(
    stores: Stores, stream_name: str
) -> None:
    """A dead worker's row stays until it expires: its workflow's next attempt, on a worker
    that dies before registering, must still be looked for (CI seed 2875886649 stalled
    five minutes on such a row). A draining worker still runs its connections."""
    leases, pool = stores.workers, f"default:registered-{uuid.uuid4().hex[:8]}"
    live, draining, dead = worker_name(), worker_name(), worker_name()
    for worker in (live, draining, dead):
        await leases.acquire(worker, pool=pool, host="h", pid=1, boot_id="b")
    await leases.drain(draining)
    streams = {who: f"{stream_name}-{who}" for who in ("live", "draining", "dead", "none")}
    for who, worker in (("live", live), ("draining", draining), ("dead", dead), ("none", None)):
        await stores.starts.connection_context(
            streams[who],
            "numeric",
            cursor=None,
            source="none",
            reader=reader(worker, stream=streams[who]),
        )
    assert await leases.revoke(dead, by=live, expired_only=False)
    registered = await leases.workflows_read_by_running_workers()
    assert f"sse-stream:{streams['live']}" in registered
    assert f"sse-stream:{streams['draining']}" in registered
    assert f"sse-stream:{streams['none']}" in registered
    assert f"sse-stream:{streams['dead']}" not in registered


def test_predecessors_are_leases_of_this_host_whose_process_is_gone() -> None:
    def lease(worker_id: str, pid: int, host: str = "h", boot: str = "b") -> WorkerLease:
        return WorkerLease(worker_id, POOL, host, pid, boot, "live", 0.0, 0.0)

    me, alive = os.getpid(), os.getppid()
    leases = [
        lease("mine", me),
        lease("same-pid", me),
        lease("alive", alive),
        lease("gone", 0),
        lease("elsewhere", 0, host="other"),  # maybe only paused: never known to be gone
        lease("before-a-reboot", alive, boot="earlier"),
    ]
    found = predecessors(leases, me="mine", host="h", boot="b", pid=me)
    assert [p.worker_id for p in found] == ["same-pid", "gone"]


async def test_watchdogs_move_a_dead_workers_connections_exactly_once(
    stores: Stores, stream_name: str
) -> None:
    leases = WorkerLeases(stores.database, ttl=0.3)
    dead = worker_name()
    await leases.acquire(dead, pool=POOL, host="dead-host", pid=1, boot_id="b")
    await hold_connections(stores, dead, stream_name, 3)
    moved: list[tuple[str, str]] = []

    async def move(connection: HeldConnection, lease: WorkerLease) -> None:
        moved.append((connection.stream, lease.worker_id))

    watchers = [
        WorkerLiveness(leases, pool=POOL, move=move, host=f"watcher-{i}", pid=1000 + i)
        for i in range(2)
    ]
    for watcher in watchers:
        await watcher.start()
    await asyncio.sleep(0.5)
    await asyncio.gather(*(watcher.tick() for watcher in watchers))
    await asyncio.gather(*(watcher.moves_done() for watcher in watchers))
    assert sorted(moved) == [(f"{stream_name}-{i}", dead) for i in range(3)]
    assert sum(watcher.moved for watcher in watchers) == 3


async def test_a_watchdog_renews_its_own_lease_while_it_moves_a_dead_workers_streams(
    stores: Stores, stream_name: str
) -> None:
    """Moving hundreds of connections through Temporal takes seconds on a loaded worker:
    a watchdog whose renewal waited for them let its own lease lapse, and was taken for
    dead in turn (seen at 1,000 streams)."""
    leases = WorkerLeases(stores.database, ttl=0.3)
    dead = worker_name()
    await leases.acquire(dead, pool=POOL, host="dead-host", pid=1, boot_id="b")
    await hold_connections(stores, dead, stream_name, 2)
    release = asyncio.Event()
    moved: list[str] = []

    async def slow_move(connection: HeldConnection, lease: WorkerLease) -> None:
        await release.wait()
        moved.append(connection.stream)

    watcher = WorkerLiveness(
        leases, pool=POOL, move=slow_move, host="watcher", pid=7, renew_interval=0.1
    )
    await watcher.start()
    await asyncio.sleep(0.5)
    # Revokes the dead lease and starts moving its streams, without waiting for them.
    await asyncio.wait_for(watcher.tick(), timeout=5)
    assert moved == []
    for _ in range(10):  # a second of the move: more than three leases of 0.3 s
        await asyncio.sleep(0.1)
        await asyncio.wait_for(watcher.tick(), timeout=5)
        expired = await expired_ids(leases)
        assert watcher.worker_id not in expired
    assert watcher.revocations == 0
    release.set()
    await watcher.moves_done()
    assert sorted(moved) == [f"{stream_name}-{i}" for i in range(2)]


async def test_a_worker_that_finds_its_lease_revoked_ends_its_connections_and_takes_a_new_one(
    stores: Stores,
) -> None:
    revoked: list[str] = []

    async def move(connection: HeldConnection, lease: WorkerLease) -> None:
        raise AssertionError("nothing to move")

    paused = WorkerLiveness(
        stores.workers,
        pool=POOL,
        move=move,
        on_revoked=revoked.append,
        host="p",
        renew_interval=0.05,
    )
    await paused.start()
    first = paused.worker_id
    assert first is not None
    await stores.workers.revoke(first, by="watchdog", expired_only=False)
    for _ in range(100):  # the keeper's next renewal finds it revoked; the tick acts
        await asyncio.sleep(0.05)
        await paused.tick()
        if revoked:
            break
    assert revoked == [first]
    assert paused.worker_id not in (None, first)
    assert paused.revocations == 1
    assert paused.keeper.worker_id == paused.worker_id
    await paused.leave()


async def test_a_busy_event_loop_keeps_its_lease(stores: Stores) -> None:
    """A loop starved for longer than a lease (a burst of starts beside 1,500 events a
    second) is not a dead worker: taken for dead, its streams would move onto another
    starved worker, which it would take for dead in turn."""
    leases = WorkerLeases(stores.database, ttl=0.5)
    busy = WorkerLiveness(leases, pool=POOL, move=nothing_to_move, renew_interval=0.1)
    await busy.start()
    time.sleep(1.5)  # noqa: ASYNC251 - blocks the loop for three leases
    assert busy.worker_id not in await expired_ids(leases)
    await busy.tick()
    assert busy.revocations == 0
    await busy.leave()


async def test_a_wedged_event_loop_lets_its_lease_lapse(stores: Stores) -> None:
    """A loop that does not run at all for longer than the stall limit (a blocking call,
    a deadlock) runs none of its streams: they must move."""
    leases = WorkerLeases(stores.database, ttl=0.3)
    wedged = WorkerLiveness(
        leases, pool=POOL, move=nothing_to_move, renew_interval=0.05, stall_limit=0.4
    )
    await wedged.start()
    time.sleep(1.5)  # noqa: ASYNC251 - the loop does not run
    assert wedged.worker_id in await expired_ids(leases)
    assert wedged.keeper.healthy_since is None
    await asyncio.sleep(0.3)  # answering again, it renews again
    assert wedged.worker_id not in await expired_ids(leases)
    await wedged.leave()


async def test_a_restarted_worker_takes_its_dead_predecessors_streams_at_once(
    stores: Stores, stream_name: str
) -> None:
    host = worker_name()
    gone = f"{host}:0:old"
    await stores.workers.acquire(gone, pool=POOL, host=host, pid=0, boot_id="b")
    await stores.starts.connection_context(
        stream_name, "numeric", cursor=None, source="none", reader=reader(gone, stream=stream_name)
    )
    moved: list[str] = []

    async def move(connection: HeldConnection, lease: WorkerLease) -> None:
        moved.append(connection.stream)

    successor = WorkerLiveness(stores.workers, pool=POOL, move=move, host=host)
    successor.boot_id = "b"
    await successor.start()  # the old lease has not expired: taken over all the same
    await successor.moves_done()
    assert moved == [stream_name]
    lease = await stores.workers.lease(gone)
    assert lease is not None and lease.state == WorkerState.REVOKED


@pytest.mark.parametrize(
    ("counts", "shed"),
    [
        ({"a": 40, "b": 0}, 20),  # a worker joined: the excess over the fair share moves
        ({"a": 30, "b": 10}, 10),
        ({"a": 25, "b": 15}, 0),  # within 1.25 times the fair share: left alone
        ({"a": 2, "b": 0}, 0),  # one over the fair share: never worth a reconnect
        ({"a": 3, "b": 0, "c": 0}, 2),
        ({"a": 5000, "b": 0}, 100),  # at most MAX_SHED per look
        ({"b": 10}, 0),  # not a live worker of the pool (yet)
    ],
)
def test_a_worker_hands_over_only_what_it_holds_beyond_its_share(
    counts: dict[str, int], shed: int
) -> None:
    assert to_shed(counts, "a") == shed


async def test_a_hand_over_under_way_stops_at_shutdown(stores: Stores, stream_name: str) -> None:
    """At SIGTERM every connection hands over and reads on until its retry starts; a
    balancing hand-over still under way would cancel some of those early (and one in its
    clean-up with a traceback). It stops, and no later look starts another."""
    pool = f"default:shutdown-{uuid.uuid4().hex[:8]}"
    shed: list[int] = []
    handing = asyncio.Event()

    async def hand_over(count: int, seconds: float) -> int:
        shed.append(count)
        handing.set()
        await asyncio.sleep(30)
        return count

    async def move(connection: HeldConnection, lease: WorkerLease) -> None:
        raise AssertionError("nothing to move")

    busy = WorkerLiveness(stores.workers, pool=pool, move=move, shed=hand_over, host="busy")
    idle = WorkerLiveness(stores.workers, pool=pool, move=move, host="idle")
    await busy.start()
    await idle.start()
    assert busy.worker_id is not None
    await hold_connections(stores, busy.worker_id, stream_name, 4)
    await busy.balance()
    await asyncio.wait_for(handing.wait(), 10)
    shedding = busy._shedding
    assert shedding is not None and shed == [2]
    await busy.drain()
    await asyncio.sleep(0)
    assert shedding.cancelled()
    await busy.balance()
    assert shed == [2] and busy._shedding is shedding
    await busy.leave()
    await idle.leave()


async def test_connection_counts_are_per_live_worker_of_the_pool(
    stores: Stores, stream_name: str
) -> None:
    pool = f"default:counts-{uuid.uuid4().hex[:8]}"
    busy, idle, elsewhere = worker_name(), worker_name(), worker_name()
    for worker, its_pool in ((busy, pool), (idle, pool), (elsewhere, POOL)):
        await stores.workers.acquire(worker, pool=its_pool, host="h", pid=1, boot_id="b")
    await hold_connections(stores, busy, stream_name, 3)
    assert await stores.workers.connection_counts(pool) == {busy: 3, idle: 0}


def paused_session(pg_url: str, name: str) -> psycopg.Connection:
    """A session named like another process's, standing in for a worker paused in it."""
    url = sa.make_url(pg_url).set(drivername="postgresql")
    return psycopg.connect(url.render_as_string(hide_password=False), application_name=name)


def lock_is_free(pg_url: str, key: int) -> bool:
    with paused_session(pg_url, "probe") as probe:
        row = probe.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s)", [STREAM_LOCK_CLASS, key]
        ).fetchone()
        return bool(row and row[0])


async def test_this_processs_sessions_carry_its_name(pg_stores: Stores) -> None:
    def name() -> str:
        with pg_stores.database.begin() as connection:
            return connection.exec_driver_sql(
                "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).scalar_one()

    assert await asyncio.to_thread(name) == this_process()
    with pg_stores.database.begin() as connection:
        assert end_open_transactions(connection, this_process()) == 0  # never our own


async def test_revoking_a_paused_worker_ends_its_open_transactions(
    pg_stores: Stores, pg_url: str, stream_name: str
) -> None:
    leases = pg_stores.workers
    paused, host = worker_name(), f"host-{uuid.uuid4().hex[:6]}"
    await leases.acquire(paused, pool=POOL, host=host, pid=4242, boot_id="b")
    name = session_name(host, 4242, "b")
    key = stream_lock_key(stream_name)
    committing = paused_session(pg_url, name)  # paused in the middle of a commit
    committing.execute("SELECT pg_advisory_xact_lock(%s, %s)", [STREAM_LOCK_CLASS, key])
    idle = paused_session(pg_url, name)  # paused between two commits: holds nothing
    idle.execute("SELECT 1")
    idle.commit()
    assert not await asyncio.to_thread(lock_is_free, pg_url, key)

    assert await leases.revoke(paused, by="watchdog", expired_only=False)
    # pg_terminate_backend signals; the lock is free once the backend has gone.
    deadline = time.monotonic() + 5
    while not await asyncio.to_thread(lock_is_free, pg_url, key):
        assert time.monotonic() < deadline, "the paused transaction still holds its lock"
        await asyncio.sleep(0.05)
    with pytest.raises(psycopg.OperationalError):
        committing.execute("SELECT 1")  # back from the pause: its session is gone
    assert idle.execute("SELECT 1").fetchone() == (1,)
    committing.close()
    idle.close()


async def test_a_worker_paused_in_its_renewal_is_revoked_at_the_next_look(
    pg_stores: Stores, pg_url: str
) -> None:
    leases = pg_stores.workers
    paused, host = worker_name(), f"host-{uuid.uuid4().hex[:6]}"
    await leases.acquire(paused, pool=POOL, host=host, pid=4242, boot_id="b")
    renewing = paused_session(pg_url, session_name(host, 4242, "b"))
    renewing.execute(
        "UPDATE sse_workers SET renewed_at = renewed_at WHERE worker_id = %s", [paused]
    )  # holds the lease's row, as a renewal does until it commits

    assert not await leases.revoke(paused, by="watchdog", expired_only=False)  # lock_timeout
    assert await leases.revoke(paused, by="watchdog", expired_only=False)
    lease = await leases.lease(paused)
    assert lease is not None and lease.state == WorkerState.REVOKED
    renewing.close()


async def test_a_revocation_holds_when_the_sessions_cannot_be_ended(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role that may not end sessions (some managed PostgreSQL): the lease is revoked
    and the caller moves the streams all the same; the idle timeout ends them later."""

    def refused(connection: object, name: str) -> int:
        raise psycopg.errors.InsufficientPrivilege("must be a member of the role")

    monkeypatch.setattr("durable_sse.log.workers.end_open_transactions", refused)
    leases = pg_stores.workers
    paused = worker_name()
    await leases.acquire(paused, pool=POOL, host="elsewhere", pid=4242, boot_id="b")
    assert await leases.revoke(paused, by="watchdog", expired_only=False)
    lease = await leases.lease(paused)
    assert lease is not None and lease.state == WorkerState.REVOKED


async def test_a_process_that_was_stopped_renews_as_soon_as_it_runs_again(
    stores: Stores,
) -> None:
    """SIGSTOP stops the keeper's thread with the loop: the loop's silence is no stall
    of its own, and the lease is renewed at once (if no other worker revoked it)."""
    leases, stopped = WorkerLeases(stores.database, ttl=0.5), worker_name()
    keeper = LeaseKeeper(leases, interval=3600, stall_limit=1.0)
    await leases.acquire(stopped, pool=POOL, host="h", pid=1, boot_id="b")
    keeper.keep(stopped)
    keeper.start()
    keeper._looked = keeper._answered = time.monotonic() - 20  # both slept through it
    await asyncio.sleep(0.6)  # the lease expired meanwhile
    await asyncio.to_thread(keeper.renew_once)
    assert stopped not in await expired_ids(leases)
    assert keeper.healthy_since is not None
    await keeper.stop()


def unrenewed_for(stores: Stores, worker_id: str, seconds: float) -> None:
    """Backdate a lease's last renewal (its expiry stays a minute away)."""
    with stores.database.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE sse_workers SET renewed_at = renewed_at - :s, expires_at = renewed_at + 60"
                " WHERE worker_id = :w"
            ),
            {"s": seconds, "w": worker_id},
        )


async def test_a_worker_whose_process_is_gone_is_dead_before_its_lease_expires(
    pg_stores: Stores, pg_url: str
) -> None:
    """SIGKILL: the kernel closes the process's sockets and PostgreSQL ends its sessions
    at once. A lease unrenewed for SESSIONS_GRACE with no session of its process left is
    dead then, a minute before it would expire; while one session is left, it is not."""
    leases = pg_stores.workers
    worker, host = worker_name(), f"host-{uuid.uuid4().hex[:6]}"
    await leases.acquire(worker, pool=POOL, host=host, pid=4242, boot_id="b")
    session = paused_session(pg_url, session_name(host, 4242, "b"))
    session.execute("SELECT 1")
    await asyncio.to_thread(unrenewed_for, pg_stores, worker, SESSIONS_GRACE + 0.5)
    assert worker not in await expired_ids(leases)
    assert not await leases.revoke(worker, by="watchdog")

    session.close()  # the process dies
    (dead,) = [lease for lease in await leases.expired(POOL) if lease.worker_id == worker]
    assert dead.sessions_gone
    assert await leases.revoke(worker, by="watchdog")


async def test_a_worker_renewed_within_the_grace_is_not_asked_about(pg_stores: Stores) -> None:
    """A process between two renewals may be reconnecting its sessions (a pool replacing
    a dead one): no session is no verdict until SESSIONS_GRACE has passed."""
    leases = pg_stores.workers
    worker = worker_name()
    await leases.acquire(worker, pool=POOL, host=f"h-{uuid.uuid4().hex[:6]}", pid=1, boot_id="b")
    assert worker not in await expired_ids(leases)
    assert not await leases.revoke(worker, by="watchdog")


async def test_a_lease_renewed_before_the_server_started_waits_for_its_expiry(
    pg_stores: Stores,
) -> None:
    """After a restart of PostgreSQL no process has its old sessions: a lease not renewed
    since is judged by its expiry alone, so live workers get to reconnect."""
    leases = pg_stores.workers
    worker = worker_name()
    await leases.acquire(worker, pool=POOL, host=f"h-{uuid.uuid4().hex[:6]}", pid=1, boot_id="b")
    with pg_stores.database.begin() as connection:
        started = connection.exec_driver_sql(
            "SELECT extract(epoch FROM pg_postmaster_start_time())"
        ).scalar_one()
        connection.execute(
            sa.text("UPDATE sse_workers SET renewed_at = :r, expires_at = :e WHERE worker_id = :w"),
            {"r": float(started) - 1, "e": time.time() + 60, "w": worker},
        )
    assert worker not in await expired_ids(leases)
    assert not await leases.revoke(worker, by="watchdog")


async def test_sqlite_judges_a_lease_by_its_expiry_alone(tmp_path: Path) -> None:
    async with open_stores(f"sqlite:///{tmp_path / 'events.db'}") as sqlite:
        leases = sqlite.workers
        worker = worker_name()
        await leases.acquire(worker, pool=POOL, host="h", pid=1, boot_id="b")
        await asyncio.to_thread(unrenewed_for, sqlite, worker, SESSIONS_GRACE + 0.5)
        assert worker not in await expired_ids(leases)
        assert not await leases.revoke(worker, by="watchdog")
