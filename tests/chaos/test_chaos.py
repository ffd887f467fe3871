"""Chaos scenarios on the real stack: faults in, the ground-truth checker out.

Each scenario runs a source stream through Temporal, a worker, PostgreSQL and Redis while
faults are injected, drains the stream, and compares the source's ground truth with
``sse_events`` (:mod:`tests.chaos.checker`). A background sampler watches the Redis cursor
and the checkpoint row for regressions throughout. Seeds are printed (``CHAOS_SEED``).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from durable_sse.contracts import StreamStatus
from durable_sse.ops.binaries import redis_server as redis_binary
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.stores import Stores
from tests import services
from tests.chaos.checker import CursorSampler, Verdict, check, stored
from tests.chaos.harness import (
    Sizes,
    chaos_spec,
    drain_and_stop,
    end_process,
    free_port,
    in_process_worker,
    read_results,
    reader_pid,
    start_stream,
    status_of,
    unique,
    wait_until,
    worker_process,
)
from tests.chaos.proxy import FaultProxy

pytestmark = pytest.mark.slow


def new_stream(source: SSESource, prefix: str, sizes: Sizes, **config: object) -> str:
    name = unique(prefix)
    values: dict[str, object] = {"rate": sizes.rate, "keepalive": 0.5, "retry_ms": None}
    values.update(config)
    source.add_stream(name, SourceStreamConfig(**values))  # type: ignore[arg-type]
    return name


async def verdict_of(
    scenario: str,
    faults: str,
    source: SSESource,
    log: Stores,
    name: str,
    sampler: CursorSampler,
    status: StreamStatus,
    verdicts: list[Verdict],
) -> Verdict:
    verdict = check(
        scenario, source.truth(name), await stored(log, name), await log.gap_store.gaps(name)
    )
    verdict.faults = faults
    verdict.regressions = sampler.regression_count
    verdict.cursor_ahead = len(sampler.ahead)
    verdict.samples = sampler.samples
    verdict.recovered = status.counters.events_recovered
    verdict.reread = status.counters.duplicates
    verdicts.append(verdict)
    print(f"\n{verdict}")
    return verdict


def assert_clean(verdict: Verdict, sampler: CursorSampler) -> None:
    assert verdict.stored > 0, "nothing stored"
    assert verdict.lost == 0, f"{verdict.lost} lost, first {verdict.first_lost}"
    assert verdict.unexpected == 0
    assert verdict.duplicate_rows == 0
    assert sampler.regressions == [], sampler.regressions[:5]
    assert sampler.ahead == [], sampler.ahead[:5]
    assert sampler.samples > 10


async def flowing(log: Stores, name: str, count: int, timeout: float = 60) -> None:
    async def check_count() -> bool:
        return (await stored(log, name)).rows >= count

    await wait_until(check_count, timeout=timeout, what=f"{name} to store {count} events")


async def ready_for_a_gap(log: Stores, name: str) -> None:
    """1,000+ events stored and a lagging id exists (a replay has somewhere to start)."""

    async def ready() -> bool:
        checkpoint = await log.checkpoints.get_checkpoint(name)
        return bool(checkpoint and checkpoint.lagging_id) and (
            (await stored(log, name)).rows >= 1000
        )

    await wait_until(ready, timeout=60, what="1,000 events and a lagging id")


# -- 1. baseline ----------------------------------------------------------------------------


async def test_1_baseline_no_faults(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    verdicts: list[Verdict],
) -> None:
    name = new_stream(source, "base", sizes)
    async with CursorSampler(chaos_log, redis_url, name) as sampler:
        handle = await start_stream(temporal.client, chaos_spec(name, source.url(name)), queue)
        await asyncio.sleep(sizes.seconds)
        status = await drain_and_stop(handle, source, chaos_log, name, min_events=sizes.min_events)
    verdict = await verdict_of(
        "1 baseline", "none", source, chaos_log, name, sampler, status, verdicts
    )
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0 and verdict.reread == 0


# -- 2. proxy resets and stalls -------------------------------------------------------------


async def test_2_random_resets_and_stalls(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    seed: int,
    verdicts: list[Verdict],
) -> None:
    name = new_stream(source, "proxy", sizes)
    faults = max(50, int(sizes.seconds * 4))
    async with (
        FaultProxy("127.0.0.1", source.port) as proxy,
        CursorSampler(chaos_log, redis_url, name) as sampler,
    ):
        spec = chaos_spec(name, proxy.url(source.url(name)))
        handle = await start_stream(temporal.client, spec, queue)
        await flowing(chaos_log, name, 100)
        injected, _ = await asyncio.gather(
            proxy.run_chaos(seed, faults=faults), asyncio.sleep(sizes.seconds)
        )
        status = await drain_and_stop(handle, source, chaos_log, name, min_events=sizes.min_events)
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(injected.items()))
    text = f"{sum(injected.values())} proxy faults ({kinds}), seed {seed}"
    verdict = await verdict_of(
        "2 resets/stalls", text, source, chaos_log, name, sampler, status, verdicts
    )
    assert sum(injected.values()) >= 50
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0


# -- 3 and 4. killing workers ---------------------------------------------------------------


async def kill_readers(
    how: signal.Signals,
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> tuple[Verdict, CursorSampler, list[int]]:
    """Kill whichever worker process runs the reader ``sizes.kills`` times; one replaces it."""
    name = new_stream(source, how.name.lower(), sizes)
    task_queue = unique(how.name.lower())
    processes = [
        worker_process(address, pg_url, redis_url, task_queue, tmp_path / f"w{i}.log")
        for i in range(2)
    ]
    rereads: list[int] = []
    try:
        async with CursorSampler(log, redis_url, name) as sampler:
            handle = await start_stream(
                temporal.client, chaos_spec(name, source.url(name)), task_queue
            )
            await flowing(log, name, 200, timeout=90)
            for kill in range(sizes.kills):
                await asyncio.sleep(max(1.0, sizes.seconds / sizes.kills))
                pid = await _wait_reader(handle)
                victim = next(p for p in processes if p.pid == pid)
                before = await _duplicates(temporal, handle)
                victim.send_signal(how)
                await asyncio.to_thread(victim.wait, 60)
                processes.remove(victim)
                processes.append(
                    worker_process(
                        address, pg_url, redis_url, task_queue, tmp_path / f"r{kill}.log"
                    )
                )
                await _wait_reader(handle, other_than=pid)
                at_kill = (await stored(log, name)).rows
                await flowing(log, name, at_kill + int(sizes.rate), timeout=90)
                rereads.append(await _duplicates(temporal, handle) - before)
            status = await drain_and_stop(handle, source, log, name, min_events=sizes.min_events)
    finally:
        for process in processes:
            end_process(process)
    faults = f"{sizes.kills} x {how.name} of the reading worker (2 workers)"
    scenario = "3 SIGKILL" if how is signal.SIGKILL else "4 SIGTERM"
    verdict = await verdict_of(scenario, faults, source, log, name, sampler, status, verdicts)
    print(f"{scenario}: events re-read per kill: {rereads}")
    return verdict, sampler, rereads


async def _wait_reader(handle: WorkflowHandle, other_than: int | None = None) -> int:
    found: list[int] = []

    async def running() -> bool:
        pid = await reader_pid(handle)
        if pid is None or pid == other_than:
            return False
        found.append(pid)
        return True

    await wait_until(running, timeout=90, what="a worker process to run the reader")
    return found[-1]


async def _duplicates(temporal: WorkflowEnvironment, handle: WorkflowHandle) -> int:
    """Rows re-read so far: the workflow's count plus the running attempt's heartbeat."""
    from durable_sse.ops.control import stream_status

    status = await stream_status(temporal.client, handle.id.split(":", 1)[1])
    in_flight = status.get("in_flight") or {}
    return int(status["counters"]["duplicates"]) + int(in_flight.get("duplicates", 0))


async def test_3_sigkill_worker(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> None:
    verdict, sampler, rereads = await kill_readers(
        signal.SIGKILL,
        temporal,
        address,
        pg_url,
        redis_url,
        source,
        chaos_log,
        sizes,
        tmp_path,
        verdicts,
    )
    assert_clean(verdict, sampler)
    assert len(rereads) == sizes.kills


async def test_4_sigterm_worker(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> None:
    verdict, sampler, rereads = await kill_readers(
        signal.SIGTERM,
        temporal,
        address,
        pg_url,
        redis_url,
        source,
        chaos_log,
        sizes,
        tmp_path,
        verdicts,
    )
    assert_clean(verdict, sampler)
    assert rereads == [0] * sizes.kills, f"re-read after a graceful stop: {rereads}"


# -- 5 and 6. drop notices --------------------------------------------------------------------


async def drop_for_real(source: SSESource, name: str, count: int, *, rate: float) -> int:
    """Make the source skip ``count`` events on the connection it serves, and say so.

    A one-shot drop is taken by the next connection that looks; one that ends before it
    has skipped them all (a repair ending right after its last gap closed) wastes it, so
    when the skip has not shown in the source's truth long after it should have, inject
    again. Returns the size of the skip that happened.
    """
    before = len(source.truth(name).dropped)
    loop = asyncio.get_running_loop()
    patience = max(2.0, 3 * count / rate)
    deadline = loop.time() + 10 * patience
    source.inject(name, action="drop", count=count)
    retry_at = loop.time() + patience
    while len(source.truth(name).dropped) == before:
        now = loop.time()
        if now > retry_at and not source.describe(name)["pending"]:
            source.inject(name, action="drop", count=count)
            retry_at = now + patience
        if now > deadline:
            raise AssertionError(
                f"the source never skipped the {count} events it was asked to: "
                f"{source.describe(name)}"
            )
        await asyncio.sleep(0.05)
    low, high = source.truth(name).dropped[-1]
    return high - low + 1


async def test_5_drop_notices_inside_the_window(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    seed: int,
    verdicts: list[Verdict],
) -> None:
    rng = random.Random(seed)
    name = new_stream(source, "gaps", sizes)
    gaps: list[int] = []
    async with CursorSampler(chaos_log, redis_url, name) as sampler:
        handle = await start_stream(temporal.client, chaos_spec(name, source.url(name)), queue)
        await ready_for_a_gap(chaos_log, name)
        loop = asyncio.get_running_loop()
        until = loop.time() + sizes.seconds
        while len(gaps) < 10 or loop.time() < until:
            count = rng.randint(10, int(sizes.rate / 2))
            gaps.append(await drop_for_real(source, name, count, rate=sizes.rate))

            async def repaired(total: int = sum(gaps)) -> bool:
                summary = await chaos_log.gap_store.gap_summary(name, "numeric")
                return summary.totals.events_recovered >= total and not summary.open

            await wait_until(
                repaired, timeout=60, what=f"gap {len(gaps)} to be repaired", handle=handle
            )
        status = await drain_and_stop(handle, source, chaos_log, name, min_events=sizes.min_events)
    faults = f"{len(gaps)} drop notices, gaps {min(gaps)}..{max(gaps)} (sum {sum(gaps)})"
    verdict = await verdict_of(
        "5 gaps in window", faults, source, chaos_log, name, sampler, status, verdicts
    )
    assert_clean(verdict, sampler)
    assert len(source.truth(name).dropped) == len(gaps) >= 10
    assert status.counters.events_recovered == sum(gaps)
    assert status.counters.drop_signals == len(gaps)
    assert status.counters.events_unrecoverable == 0 and verdict.out_of_window == 0


# -- 12. skips whose notice is lost with the connection ------------------------------------------


async def skip_and_cut(source: SSESource, name: str, count: int, *, late: int, rate: float) -> None:
    """Make the source skip ``count`` events, send ``late`` more, then close the
    connection before its notice goes out: a silent skip, as a plain disconnect.

    A one-shot is taken by the next connection that looks; one that we end before the
    skip is complete (a repair closing its gaps, a verification's interrupt) wastes it, as
    ``drop_for_real`` says: inject again when it has not shown long after it should have.
    """
    before = len(source.truth(name).unannounced)
    loop = asyncio.get_running_loop()
    patience = max(2.0, 3 * (count + late) / rate)
    deadline = loop.time() + 10 * patience
    source.inject(name, action="drop", count=count, late=late, lost=True)
    retry_at = loop.time() + patience
    while len(source.truth(name).unannounced) == before:
        now = loop.time()
        if now > retry_at and not source.describe(name)["pending"]:
            source.inject(name, action="drop", count=count, late=late, lost=True)
            retry_at = now + patience
        if now > deadline:
            raise AssertionError(f"the source never took the silent skip: {source.describe(name)}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("setting", ["verify_reconnects", "contiguous_ids", "neither"])
async def test_12_skips_whose_notice_dies_with_the_connection(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    seed: int,
    verdicts: list[Verdict],
    setting: str,
) -> None:
    """Issue 24: a server that skips events and drops the connection before its notice
    goes out looks like a plain disconnect. ``verify_reconnects`` re-reads from the
    lagging id after it and brings every skipped id back; ``contiguous_ids`` sees the
    hole; with neither, what is lost is lost only inside those never-announced skips."""
    rng = random.Random(f"{seed}:{setting}")
    name = new_stream(source, f"silent-{setting.split('_')[0]}", sizes)
    overrides = {setting: True} if setting != "neither" else {}
    spec = chaos_spec(name, source.url(name), **overrides)
    skips = 0
    async with CursorSampler(chaos_log, redis_url, name) as sampler:
        handle = await start_stream(temporal.client, spec, queue)
        await ready_for_a_gap(chaos_log, name)
        loop = asyncio.get_running_loop()
        until = loop.time() + sizes.seconds
        while skips < 6 or loop.time() < until:
            await skip_and_cut(
                source, name, rng.randint(5, 40), late=rng.randint(1, 5), rate=sizes.rate
            )
            skips += 1
            await asyncio.sleep(rng.uniform(0.2, 1.5))
        status = await drain_and_stop(handle, source, chaos_log, name, min_events=sizes.min_events)
    truth = source.truth(name)
    faults = f"{skips} skips cut before their notice, {setting}"
    verdict = await verdict_of(
        f"12 silent skips ({setting})", faults, source, chaos_log, name, sampler, status, verdicts
    )
    print(
        f"12 {setting}: suspicions {status.counters.suspicions} (closed "
        f"{status.counters.suspicions_closed}, recovered {status.counters.suspicions_recovered}), "
        f"re-read {status.counters.duplicates}, lost {verdict.lost} "
        f"({verdict.lost_unannounced} inside unannounced skips)"
    )
    assert len(truth.unannounced) >= skips  # a wasted one-shot injected again may land twice
    assert verdict.unexpected == 0 and verdict.duplicate_rows == 0
    assert sampler.regressions == [] and sampler.ahead == []
    if setting == "neither":
        # Loss is possible, and only where no signal ever told of a skip.
        assert verdict.lost == verdict.lost_unannounced
    else:
        assert verdict.lost == 0, f"{verdict.lost} lost, first {verdict.first_lost}"
        assert status.counters.gaps_unrecoverable == 0
    if setting == "verify_reconnects":
        assert status.counters.suspicions >= 1
        assert status.counters.suspicions_closed == status.counters.suspicions
        assert status.counters.suspicions_recovered > 0


async def test_6_gap_older_than_the_history_is_reported(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> None:
    """The history holds ~0.75 s; the lagged replay is throttled for 4 s after a harmless
    replay, so when it runs the whole gap (1 s of events) has left the history. The drop
    lands on the signalled replay connection while it streams new ids: its notice counts
    the 400 exactly."""
    name, gap, verdict, status = await _scenario_6(
        "6 gap > history",
        address,
        pg_url,
        redis_url,
        temporal,
        source,
        chaos_log,
        sizes,
        tmp_path,
        verdicts,
        before_first_event=False,
        contiguous=False,
    )
    [(low, high)] = source.truth(name).dropped
    assert high - low + 1 == gap
    assert status.counters.events_unrecoverable == gap
    assert verdict.out_of_window == gap, "the whole gap should have left the history"


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "not-contiguous"])
async def test_6_drop_before_the_replay_s_first_event_is_reported(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
    contiguous: bool,
) -> None:
    """Issue 12's open case from CI: the signalled replay (from the lagging id, behind the
    history: a truncation header) takes the drop before its first event. The live
    connection had stored the start of the dropped range, so only the ids after the newest
    stored one are lost. With ``contiguous_ids`` they are counted exactly; without, the gap
    is unrecoverable of unknown size and the checker counts its ids as announced lost."""
    name, gap, verdict, status = await _scenario_6(
        f"6 drop before the first event ({'contiguous' if contiguous else 'not contiguous'})",
        address,
        pg_url,
        redis_url,
        temporal,
        source,
        chaos_log,
        sizes,
        tmp_path,
        verdicts,
        before_first_event=True,
        contiguous=contiguous,
    )
    [(low, high)] = source.truth(name).dropped
    assert high - low + 1 == gap
    assert 0 < verdict.out_of_window < gap, "the live connection stored the range's start"
    if contiguous:
        assert status.counters.gaps_unknown_size == 0 and verdict.unknown_size == 0
        assert status.counters.events_unrecoverable == verdict.out_of_window
    else:
        assert status.counters.gaps_unknown_size == 1
        assert status.counters.events_unrecoverable == 0
        assert verdict.unknown_size == verdict.out_of_window


async def _scenario_6(
    scenario: str,
    address: str,
    pg_url: str,
    redis_url: str,
    temporal: WorkflowEnvironment,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
    *,
    before_first_event: bool,
    contiguous: bool,
) -> tuple[str, int, Verdict, StreamStatus]:
    """A drop of 1 s of events on the signalled replay, the history 0.75 s: the gap is
    reported unrecoverable in the status, the metric and the log. Returns the stream, the
    drop's size, the verdict (clean) and the final status."""
    history = int(sizes.rate * 0.75)
    gap = int(sizes.rate)
    name = new_stream(source, "lost", sizes, history=history)
    task_queue = unique("lost")
    port = free_port()
    log_file = tmp_path / "worker.log"
    process = worker_process(
        address,
        pg_url,
        redis_url,
        task_queue,
        log_file,
        extra_env={"SSE_METRICS_PORT": str(port)},
    )
    try:
        async with CursorSampler(chaos_log, redis_url, name) as sampler:
            spec = chaos_spec(
                name,
                source.url(name),
                mercure_last_event_id=True,
                lagged_reconnect_interval=4.0,
                contiguous_ids=contiguous,
            )
            handle = await start_stream(temporal.client, spec, task_queue)
            await ready_for_a_gap(chaos_log, name)
            if before_first_event:
                # Taken only by a connection that has sent nothing: the live one streams
                # on untouched, the replay the signal starts takes it first thing.
                source.inject(name, action="drop", count=gap, first=True)
            await handle.signal("replay")  # starts the lagged-reconnect throttle

            async def replay_done() -> bool:
                status = await status_of(handle)
                return status.counters.lagged_replays == 1 and status.route == "lagged"

            await wait_until(replay_done, timeout=30, what="the signalled replay")
            if not before_first_event:
                # The status says "lagged" as soon as the replay is planned, before its
                # connection streams anything: wait until it streams (it lives for the
                # 4 s throttle), so the drop lands on new ids.
                await asyncio.sleep(0.5)
                source.inject(name, action="drop", count=gap)

            async def reported() -> bool:
                summary = await chaos_log.gap_store.gap_summary(name, "numeric")
                return summary.totals.unrecoverable >= 1

            await wait_until(reported, timeout=60, what="the unrecoverable gap report")
            await asyncio.sleep(1)
            metric = _scrape(port, "durable_sse_events_unrecoverable", name)
            status = await drain_and_stop(
                handle, source, chaos_log, name, min_events=sizes.min_events
            )
    finally:
        end_process(process)
    faults = f"1 drop notice of {gap} events, history {history} events"
    verdict = await verdict_of(scenario, faults, source, chaos_log, name, sampler, status, verdicts)
    print(
        f"6: status unrecoverable {status.counters.events_unrecoverable} "
        f"(unknown size {status.counters.gaps_unknown_size}), metric {metric}"
    )
    assert_clean(verdict, sampler)
    assert status.counters.gaps_unrecoverable == 1
    assert metric == status.counters.events_unrecoverable
    assert "UNRECOVERABLE GAP" in log_file.read_text()
    return name, gap, verdict, status


def _scrape(port: int, metric: str, stream: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key.split("{", 1)[0] == metric and f'stream="{stream}"' in key:
            total += float(value)
    return total


# -- 7. Redis down, back empty ----------------------------------------------------------------


async def test_7_redis_down_then_back_empty(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> None:
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"

    def start_redis() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                redis_binary(),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.DEVNULL,
        )

    server = start_redis()
    name = new_stream(source, "redis", sizes)
    task_queue = unique("redis")
    try:
        async with CursorSampler(chaos_log, redis_url, name) as sampler:
            await asyncio.sleep(0.5)
            async with in_process_worker(address, pg_url, redis_url, task_queue):
                handle = await start_stream(
                    temporal.client, chaos_spec(name, source.url(name)), task_queue
                )
                await ready_for_a_gap(chaos_log, name)
                server.terminate()
                await asyncio.to_thread(server.wait)
                before = (await stored(chaos_log, name)).rows
                await asyncio.sleep(sizes.redis_down)
                during = (await stored(chaos_log, name)).rows - before
            # The first worker is gone (its L1 with it); Redis comes back empty.
            server = start_redis()
            await asyncio.sleep(0.5)
            async with in_process_worker(address, pg_url, redis_url, task_queue):
                at_restart = (await stored(chaos_log, name)).rows
                await flowing(chaos_log, name, at_restart + int(sizes.rate))
                status = await drain_and_stop(
                    handle, source, chaos_log, name, min_events=sizes.min_events
                )
    finally:
        end_process(server)
    sources = [r.get("cursor_source") for r in await read_results(handle)]
    faults = f"Redis down {sizes.redis_down:g} s, back empty, worker replaced"
    verdict = await verdict_of(
        "7 Redis down", faults, source, chaos_log, name, sampler, status, verdicts
    )
    print(f"7: stored during the outage {during}; cursor sources {sources}")
    assert during > 0, "ingestion stopped while Redis was down"
    assert_clean(verdict, sampler)
    # After the restart neither L1 (new worker) nor L2 (empty) knew the cursor: a
    # connection that completed after it resumed from the checkpoint or the floor (or a
    # retried attempt's heartbeat). When the stop cancels the only post-restart attempt
    # before it completes, the history holds no result to look at; the verdict above is
    # what proves the resume lost nothing.
    if len(sources) > 1:
        assert any(s in ("lagging", "floor", "heartbeat") for s in sources[1:]), sources


# -- 8. PostgreSQL restarted ------------------------------------------------------------------


def _pg_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _restart_postgresql() -> None:
    """``restart -m immediate`` of the tests' PostgreSQL: the session's embedded cluster
    (tests/services.py) when there is one, else the machine's cluster."""
    embedded = services.embedded_postgres()
    if embedded is not None:
        embedded.restart(immediate=True)
        return
    done = _pg_cluster("restart", "-m", "immediate")
    assert done.returncode == 0, done.stderr


def _ensure_postgresql_running() -> None:
    embedded = services.embedded_postgres()
    if embedded is not None:
        embedded.ensure_running()
    elif _pg_cluster("status").returncode != 0:
        _pg_cluster("start")


async def test_8_postgresql_restarted(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    verdicts: list[Verdict],
) -> None:
    name = new_stream(source, "pg", sizes)
    restarts = 2
    try:
        async with CursorSampler(chaos_log, redis_url, name) as sampler:
            handle = await start_stream(temporal.client, chaos_spec(name, source.url(name)), queue)
            await flowing(chaos_log, name, 500)
            for _ in range(restarts):
                await asyncio.to_thread(_restart_postgresql)
                await asyncio.sleep(sizes.seconds / restarts)
            status = await drain_and_stop(
                handle, source, chaos_log, name, min_events=sizes.min_events
            )
    finally:
        _ensure_postgresql_running()
    faults = f"{restarts} x PostgreSQL restart -m immediate"
    verdict = await verdict_of(
        "8 PostgreSQL restart", faults, source, chaos_log, name, sampler, status, verdicts
    )
    assert_clean(verdict, sampler)


# -- 9. two writers of one cursor -------------------------------------------------------------


async def test_9_paused_worker_comes_back(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    tmp_path: Path,
    verdicts: list[Verdict],
) -> None:
    name = new_stream(source, "stop", sizes)
    task_queue = unique("stop")
    processes = [
        worker_process(address, pg_url, redis_url, task_queue, tmp_path / f"w{i}.log")
        for i in range(2)
    ]
    rounds = 2
    try:
        async with CursorSampler(chaos_log, redis_url, name, every=0.05) as sampler:
            handle = await start_stream(
                temporal.client, chaos_spec(name, source.url(name)), task_queue
            )
            await ready_for_a_gap(chaos_log, name)
            for _ in range(rounds):
                pid = await _wait_reader(handle)
                os.kill(pid, signal.SIGSTOP)
                await _wait_reader(handle, other_than=pid)  # heartbeat timeout: a new attempt
                await asyncio.sleep(2)
                os.kill(pid, signal.SIGCONT)  # the old attempt writes again
                await asyncio.sleep(3)
            status = await drain_and_stop(
                handle, source, chaos_log, name, min_events=sizes.min_events
            )
    finally:
        for process in processes:
            end_process(process)
    faults = f"{rounds} x SIGSTOP past the heartbeat timeout, then SIGCONT"
    verdict = await verdict_of(
        "9 two writers", faults, source, chaos_log, name, sampler, status, verdicts
    )
    assert_clean(verdict, sampler)


# -- 10. slow consumer ------------------------------------------------------------------------


async def test_10_slow_consumer_gaps_recovered(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    verdicts: list[Verdict],
) -> None:
    """A bandwidth-capped link makes the consumer lag; the source then drops half the lag
    from the connection's backlog (a real slow-consumer drop) and says so."""
    name = new_stream(source, "slow", sizes)
    drops: list[int] = []
    async with (
        FaultProxy("127.0.0.1", source.port) as proxy,
        CursorSampler(chaos_log, redis_url, name) as sampler,
    ):
        handle = await start_stream(
            temporal.client, chaos_spec(name, proxy.url(source.url(name))), queue
        )
        await ready_for_a_gap(chaos_log, name)
        proxy.bandwidth = sizes.rate * 50  # ~100 B per event: about half the rate gets through
        loop = asyncio.get_running_loop()
        until = loop.time() + max(sizes.seconds, 10)
        while loop.time() < until:
            await asyncio.sleep(3)
            lag = source.truth(name).ids[-1] - await _newest_stored(chaos_log, name)
            if lag > sizes.rate and not source.describe(name)["pending"]:
                drops.append(min(lag // 2, int(sizes.rate)))
                source.inject(name, action="drop", count=drops[-1])
        await asyncio.sleep(2)  # a skip in progress ends only as events are generated
        proxy.bandwidth = None
        status = await drain_and_stop(
            handle, source, chaos_log, name, timeout=180, min_events=sizes.min_events
        )
    faults = f"link capped at {sizes.rate * 50:g} B/s, {len(drops)} slow-consumer drops"
    verdict = await verdict_of(
        "10 slow consumer", faults, source, chaos_log, name, sampler, status, verdicts
    )
    assert drops, "the consumer never lagged"
    assert_clean(verdict, sampler)
    assert verdict.out_of_window == 0
    # Every id the source skipped is stored: by a replay, or (when the notice died with a
    # connection that was ending anyway) by the next connection resuming before the hole.
    have = set((await stored(chaos_log, name)).ids)
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


# -- 11. seeded mixed faults (``--seeds N`` runs it N times) --------------------------------


async def test_11_seeded_mixed_faults_count_every_loss_exactly(
    temporal: WorkflowEnvironment,
    queue: str,
    source: SSESource,
    chaos_log: Stores,
    redis_url: str,
    sizes: Sizes,
    seed: int,
    verdicts: list[Verdict],
) -> None:
    """Proxy resets, stalls and closes, drop notices of random sizes, and a history that
    may be too short for some repairs, all chosen by the seed: nothing the history still
    holds is lost, and what it no longer holds is counted exactly (contiguous ids)."""
    rng = random.Random(seed)
    # Longer than the replay window (2 s) and a stall with its reconnect, so only drops
    # can outrun it (the checker knows drops, not a history outrun by a slow reconnect),
    # and often short enough that a large drop whose repair waits out the throttle does.
    history = int(sizes.rate * rng.choice([2.5, 3.0, 6.0]))
    name = new_stream(source, "mixed", sizes, history=history)
    drops: list[int] = []
    async with (
        FaultProxy("127.0.0.1", source.port) as proxy,
        CursorSampler(chaos_log, redis_url, name) as sampler,
    ):
        spec = chaos_spec(
            name,
            proxy.url(source.url(name)),
            contiguous_ids=True,
            lagged_reconnect_interval=rng.choice([0.5, 1.0, 3.0]),
        )
        handle = await start_stream(temporal.client, spec, queue)
        await ready_for_a_gap(chaos_log, name)

        async def drops_now_and_then() -> None:
            loop = asyncio.get_running_loop()
            until = loop.time() + sizes.seconds
            while loop.time() < until:
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                count = rng.randint(5, int(sizes.rate * 3))
                drops.append(await drop_for_real(source, name, count, rate=sizes.rate))

        injected, _ = await asyncio.gather(
            proxy.run_chaos(seed, faults=max(10, int(sizes.seconds * 2)), stall=(0.2, 0.6)),
            drops_now_and_then(),
        )
        status = await drain_and_stop(
            handle, source, chaos_log, name, timeout=180, min_events=sizes.min_events
        )
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(injected.items()))
    faults = f"seed {seed}: {len(drops)} drops ({sum(drops)} events), history {history}, {kinds}"
    verdict = await verdict_of(
        "11 seeded mix", faults, source, chaos_log, name, sampler, status, verdicts
    )
    summary = await chaos_log.gap_store.gap_summary(name, "numeric")
    print(
        f"11 seed {seed}: unrecoverable {status.counters.events_unrecoverable} "
        f"(store {summary.totals.events_unrecoverable}), out of window {verdict.out_of_window}"
    )
    assert_clean(verdict, sampler)
    assert summary.open == [] and summary.totals.unknown_size == 0
    assert summary.totals.events_unrecoverable == verdict.out_of_window
    assert status.counters.events_unrecoverable == verdict.out_of_window


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
    temporal: WorkflowEnvironment, queue: str, source: SSESource, chaos_log: Stores
) -> None:
    sizes = Sizes(rate=50, seconds=0, redis_down=0)
    cases: dict[str, tuple[str, WorkflowHandle]] = {}
    for label, fault in [
        ("204", {"code": 204}),
        *((k, v[0]) for k, v in REFUSALS.items()),
        *RECOVERS.items(),
    ]:
        name = new_stream(source, f"http{label}", sizes)
        source.inject(name, action="status", **fault)
        spec = chaos_spec(name, source.url(name))
        cases[label] = (name, await start_stream(temporal.client, spec, queue))

    async def settled(label: str) -> bool:
        name, handle = cases[label]
        status = await status_of(handle)
        if label == "204":
            return status.state == "stopped-by-server"
        if label in REFUSALS:
            return status.state == "parked"
        return status.counters.failures >= 2 and (await stored(chaos_log, name)).rows > 0

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
