"""Chaos scenarios of the stores: Redis down and back empty, PostgreSQL restarted.

Each scenario runs a source stream through Temporal, a worker, PostgreSQL and Redis while
faults are injected, drains the stream, and compares the source's ground truth with
``sse_events`` (:mod:`tests.chaos.checker`), as in tests/chaos/test_network.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from durable_sse.ops.binaries import redis_server as redis_binary
from tests import services
from tests.chaos.checker import stored
from tests.chaos.harness import Chaos, assert_clean, end_process, free_port, read_results, unique
from tests.services import throwaway_redis

pytestmark = pytest.mark.slow


# -- 7. Redis down, back empty ----------------------------------------------------------------


async def test_7_redis_down_then_back_empty(chaos: Chaos, tmp_path: Path) -> None:
    sizes, log = chaos.sizes, chaos.log
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"

    def start_redis() -> subprocess.Popen[bytes]:
        return throwaway_redis(redis_binary(), port, tmp_path)

    server = start_redis()
    name = chaos.new_stream("redis")
    task_queue = unique("redis")
    try:
        async with chaos.sampler(name, redis_url=redis_url) as sampler:
            await asyncio.sleep(0.5)
            async with chaos.in_process_worker(task_queue, redis_url):
                handle = await chaos.start(name, task_queue)
                await chaos.ready_for_a_gap(name)
                server.terminate()
                await asyncio.to_thread(server.wait)
                before = (await stored(log, name)).rows
                await asyncio.sleep(sizes.redis_down)
                during = (await stored(log, name)).rows - before
            # The first worker is gone (its L1 with it); Redis comes back empty.
            server = start_redis()
            await asyncio.sleep(0.5)
            async with chaos.in_process_worker(task_queue, redis_url):
                at_restart = (await stored(log, name)).rows
                await chaos.flowing(name, at_restart + int(sizes.rate))
                status = await chaos.drain(handle, name)
    finally:
        end_process(server)
    sources = [r.get("cursor_source") for r in await read_results(handle)]
    faults = f"Redis down {sizes.redis_down:g} s, back empty, worker replaced"
    verdict = await chaos.verdict("7 Redis down", faults, name, sampler, status)
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


async def test_8_postgresql_restarted(chaos: Chaos, queue: str) -> None:
    name = chaos.new_stream("pg")
    restarts = 2
    try:
        async with chaos.sampler(name) as sampler:
            handle = await chaos.start(name, queue)
            await chaos.flowing(name, 500)
            for _ in range(restarts):
                await asyncio.to_thread(_restart_postgresql)
                await asyncio.sleep(chaos.sizes.seconds / restarts)
            status = await chaos.drain(handle, name)
    finally:
        _ensure_postgresql_running()
    faults = f"{restarts} x PostgreSQL restart -m immediate"
    verdict = await chaos.verdict("8 PostgreSQL restart", faults, name, sampler, status)
    assert_clean(verdict, sampler)
