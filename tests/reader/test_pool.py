"""The worker's connection pool, with plain tasks standing in for read activities."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from durable_sse.contracts import Route
from durable_sse.log.workers import WorkerLease
from durable_sse.reader.pool import HANDED_OVER, ConnectionPool
from durable_sse.stores import Stores


@dataclass
class Held:
    route: Route = Route.LIVE
    worker_id: str | None = "w1"
    moving: str | None = None
    streaming: bool = True


async def _run(pool: ConnectionPool, connection: Held, ended: list[Held]) -> None:
    with pool.holding(connection):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append(connection)


async def _start(pool: ConnectionPool, held: list[Held], ended: list[Held]) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(_run(pool, connection, ended)) for connection in held]
    await asyncio.sleep(0)
    return tasks


async def test_a_connection_is_counted_while_it_runs_and_not_after() -> None:
    pool, ended = ConnectionPool(), []
    tasks = await _start(pool, [Held(), Held(worker_id=None)], ended)
    assert pool.open_connections == 2 and len(pool.running) == 2
    assert set(pool.under_lease) == {"w1"} and len(pool.under_lease["w1"]) == 1
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks)
    assert pool.open_connections == 0 and pool.running == {} and pool.under_lease["w1"] == set()


async def test_a_revoked_lease_ends_only_the_connections_running_under_it() -> None:
    pool, ended = ConnectionPool(), []
    old, new = Held(worker_id="old"), Held(worker_id="new")
    tasks = await _start(pool, [old, new], ended)
    pool.lease_revoked("old")
    await asyncio.sleep(0)
    assert ended == [old] and old.moving is None  # revoked, not handed over
    tasks[1].cancel()
    await asyncio.gather(*tasks)


async def test_a_hand_over_takes_live_streaming_connections_first_and_marks_them() -> None:
    pool, ended = ConnectionPool(), []
    repair = Held(route=Route.LAGGED)
    starting = Held(streaming=False)
    live = Held()
    tasks = await _start(pool, [repair, starting, live], ended)
    assert await pool.hand_over(2, 0.0) == 2
    await asyncio.sleep(0)
    assert ended == [live, repair]
    assert live.moving == repair.moving == HANDED_OVER and starting.moving is None
    tasks[1].cancel()
    await asyncio.gather(*tasks)


async def test_a_hand_over_leaves_alone_a_connection_that_ended_meanwhile() -> None:
    """A hand-over spreads its cancellations over seconds; one chosen connection that
    ended in the meantime and is still cleaning up (out of the pool, its task not done)
    is not cancelled: the cancellation would replace its answer with a traceback."""
    pool, ended = ConnectionPool(), []
    first, second = Held(), Held()
    releasing = asyncio.Event()
    cleaned: list[Held] = []

    async def ends_on_its_own() -> None:
        with pool.holding(second):
            await releasing.wait()
        await asyncio.sleep(0.05)  # its clean-up, out of the pool
        cleaned.append(second)

    tasks = [*(await _start(pool, [first], ended)), asyncio.create_task(ends_on_its_own())]
    await asyncio.sleep(0)
    handing = asyncio.create_task(pool.hand_over(2, 0.04))
    await asyncio.sleep(0)
    releasing.set()
    assert await handing == 1
    await asyncio.gather(*tasks)
    assert ended == [first] and cleaned == [second] and second.moving is None


async def test_a_hand_over_leaves_alone_a_connection_that_stopped_streaming() -> None:
    pool, ended = ConnectionPool(), []
    first, second = Held(), Held()
    tasks = await _start(pool, [first, second], ended)
    handing = asyncio.create_task(pool.hand_over(2, 0.02))
    await asyncio.sleep(0)
    second.streaming = False  # ending on its own, flushing
    assert await handing == 1
    assert ended == [first] and second.moving is None
    tasks[1].cancel()
    await asyncio.gather(*tasks)


def test_an_attempt_scheduled_before_a_revocation_is_stale() -> None:
    """A paused worker's polls take retries while it is stopped; the watchdog has failed
    them again by the time it runs them, under the new lease it takes after SIGCONT."""
    pool = ConnectionPool()
    before = datetime.now(UTC)
    assert not pool.stale(before)  # never revoked: nothing is stale
    pool.lease_revoked("w1")
    assert pool.stale(before)
    assert not pool.stale(datetime.now(UTC) + timedelta(seconds=1))


async def test_connections_asking_about_their_lease_at_once_share_one_read(
    pg_stores: Stores,
) -> None:
    """At SIGCONT every connection's commit fails at once and asks the store whether the
    lease was revoked: one read answers them all, and one that its worker ends while it
    waits stops waiting at once."""
    leases, revoked = pg_stores.workers, f"w-{uuid.uuid4().hex[:8]}"
    await leases.acquire(revoked, pool="p", host="h", pid=1, boot_id="b")
    assert await leases.revoke(revoked, by="watchdog", expired_only=False)
    pool, release = ConnectionPool(), threading.Event()
    holding = asyncio.ensure_future(leases.database.run("hold", release.wait))
    reads = 0
    lease = leases.lease

    async def counted(worker_id: str) -> WorkerLease | None:
        nonlocal reads
        reads += 1
        return await lease(worker_id)

    leases.lease = counted  # type: ignore[method-assign]
    askers = [asyncio.create_task(pool.lease_lost(revoked, leases)) for _ in range(200)]
    try:
        await asyncio.sleep(0.1)
        askers[0].cancel()  # ended by its worker meanwhile
        await asyncio.sleep(0)
        assert askers[0].cancelled()
    finally:
        release.set()
        await holding
    assert await asyncio.gather(*askers[1:]) == [True] * 199
    assert reads == 1
