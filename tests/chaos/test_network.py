"""Chaos scenarios of the link: none (the baseline), proxy resets and stalls, a capped
link with slow-consumer drops, and bad HTTP answers.

Each scenario runs a source stream through Temporal, a worker, PostgreSQL and Redis while
faults are injected, drains the stream, and compares the source's ground truth with
``sse_events`` (:mod:`tests.chaos.checker`). A background sampler watches the Redis cursor
and the checkpoint row for regressions throughout. Seeds are printed (``CHAOS_SEED``).
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle

from durable_sse.stores import Stores
from tests.chaos.checker import stored
from tests.chaos.harness import Chaos, Sizes, assert_clean, status_of, wait_until
from tests.chaos.proxy import FaultProxy

pytestmark = pytest.mark.slow


# -- 1. baseline ----------------------------------------------------------------------------


async def test_1_baseline_no_faults(chaos: Chaos, queue: str) -> None:
    name = chaos.new_stream("base")
    async with chaos.sampler(name) as sampler:
        handle = await chaos.start(name, queue)
        await asyncio.sleep(chaos.sizes.seconds)
        status = await chaos.drain(handle, name)
    verdict = await chaos.verdict("1 baseline", "none", name, sampler, status)
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0 and verdict.reread == 0


# -- 2. proxy resets and stalls -------------------------------------------------------------


async def test_2_random_resets_and_stalls(chaos: Chaos, queue: str, seed: int) -> None:
    sizes, source = chaos.sizes, chaos.source
    name = chaos.new_stream("proxy")
    faults = max(50, int(sizes.seconds * 4))
    async with (
        FaultProxy("127.0.0.1", source.port) as proxy,
        chaos.sampler(name) as sampler,
    ):
        handle = await chaos.start(name, queue, url=proxy.url(source.url(name)))
        await chaos.flowing(name, 100)
        injected, _ = await asyncio.gather(
            proxy.run_chaos(seed, faults=faults), asyncio.sleep(sizes.seconds)
        )
        status = await chaos.drain(handle, name)
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(injected.items()))
    text = f"{sum(injected.values())} proxy faults ({kinds}), seed {seed}"
    verdict = await chaos.verdict("2 resets/stalls", text, name, sampler, status)
    assert sum(injected.values()) >= 50
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0


# -- 10. slow consumer ------------------------------------------------------------------------


async def test_10_slow_consumer_gaps_recovered(chaos: Chaos, queue: str) -> None:
    """A bandwidth-capped link makes the consumer lag; the source then drops half the lag
    from the connection's backlog (a real slow-consumer drop) and says so."""
    sizes, source = chaos.sizes, chaos.source
    name = chaos.new_stream("slow")
    drops: list[int] = []
    async with (
        FaultProxy("127.0.0.1", source.port) as proxy,
        chaos.sampler(name) as sampler,
    ):
        handle = await chaos.start(name, queue, url=proxy.url(source.url(name)))
        await chaos.ready_for_a_gap(name)
        proxy.bandwidth = sizes.rate * 50  # ~100 B per event: about half the rate gets through
        loop = asyncio.get_running_loop()
        until = loop.time() + max(sizes.seconds, 10)
        while loop.time() < until:
            await asyncio.sleep(3)
            lag = source.truth(name).ids[-1] - await _newest_stored(chaos.log, name)
            if lag > sizes.rate and not source.describe(name)["pending"]:
                drops.append(min(lag // 2, int(sizes.rate)))
                source.inject(name, action="drop", count=drops[-1])
        await asyncio.sleep(2)  # a skip in progress ends only as events are generated
        proxy.bandwidth = None
        status = await chaos.drain(handle, name, timeout=180)
    faults = f"link capped at {sizes.rate * 50:g} B/s, {len(drops)} slow-consumer drops"
    verdict = await chaos.verdict("10 slow consumer", faults, name, sampler, status)
    assert drops, "the consumer never lagged"
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0
    # Every id the source skipped is stored: by a replay, or (when the notice died with a
    # connection that was ending anyway) by the next connection resuming before the hole.
    have = set((await stored(chaos.log, name)).ids)
    skipped = [i for low, high in source.truth(name).dropped for i in range(low, high + 1)]
    assert skipped and all(i in have for i in skipped)
    assert status.counters.events_recovered > 0


async def _newest_stored(log: Stores, name: str) -> int:
    def query() -> int:
        with log.database.engine.connect() as connection:
            value = connection.execute(
                sa.text("SELECT max(CAST(event_id AS BIGINT)) FROM sse_events WHERE stream = :s"),
                {"s": name},
            ).scalar()
        return int(value or 0)

    return await asyncio.to_thread(query)


# -- bad HTTP behaviour -----------------------------------------------------------------------

REFUSALS = {
    "401": ({"code": 401}, "HTTP 401"),
    "403": ({"code": 403}, "HTTP 403"),
    "404": ({"code": 404}, "HTTP 404"),
    "410": ({"code": 410}, "HTTP 410"),
    "ctype": ({"code": 200, "content_type": "text/html"}, "not text/event-stream"),
    "redirect": ({"code": 302}, "another origin"),
}
RECOVERS = {"429": {"code": 429, "retry_after": 1, "times": 2}, "500": {"code": 500, "times": 2}}


async def test_bad_http_follows_the_policy_and_never_fails_the_workflow(
    chaos: Chaos, queue: str
) -> None:
    chaos.sizes = Sizes(rate=50, seconds=0, redis_down=0)
    cases: dict[str, tuple[str, WorkflowHandle]] = {}
    for label, fault in [
        ("204", {"code": 204}),
        *((k, v[0]) for k, v in REFUSALS.items()),
        *RECOVERS.items(),
    ]:
        name = chaos.new_stream(f"http{label}")
        chaos.source.inject(name, action="status", **fault)
        cases[label] = (name, await chaos.start(name, queue))

    async def settled(label: str) -> bool:
        name, handle = cases[label]
        status = await status_of(handle)
        if label == "204":
            return status.state == "stopped-by-server"
        if label in REFUSALS:
            return status.state == "parked"
        return status.counters.failures >= 2 and (await stored(chaos.log, name)).rows > 0

    for label in cases:
        await wait_until(lambda label=label: settled(label), timeout=60, what=f"HTTP {label}")
    for label, (_name, handle) in cases.items():
        status = await status_of(handle)
        description = await handle.describe()
        assert description.status == WorkflowExecutionStatus.RUNNING, label
        if label in REFUSALS:
            assert REFUSALS[label][1] in (status.last_error or ""), (label, status.last_error)
        if label in RECOVERS:
            assert status.state == "reading", (label, status.state)
        await handle.signal("stop")
        final = await asyncio.wait_for(handle.result(), 60)
        assert final.state == "stopped"
