"""Chaos scenarios of the worker: the reading worker SIGKILLed or SIGTERMed and replaced,
and a paused worker that comes back to write again (two writers of one cursor).

Each scenario runs a source stream through Temporal, worker processes, PostgreSQL and
Redis while faults are injected, drains the stream, and compares the source's ground
truth with ``sse_events`` (:mod:`tests.chaos.checker`), as in tests/chaos/test_network.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import WorkflowHandle

from durable_sse.contracts import WORKER_LOST, WORKFLOW_ID_PREFIX
from durable_sse.cursor.readers import ReaderLease
from durable_sse.log.locks import hold_retention
from durable_sse.stores import Stores
from tests.chaos.checker import CursorSampler, Verdict, stored
from tests.chaos.harness import (
    Chaos,
    assert_clean,
    drop_for_real,
    end_process,
    reader_pid,
    unique,
    wait_until,
)

pytestmark = pytest.mark.slow

LOCK_GAPS = "LOCK TABLE sse_gaps IN ACCESS EXCLUSIVE MODE"


# -- 3 and 4. killing workers ---------------------------------------------------------------


async def kill_readers(
    how: signal.Signals, chaos: Chaos, tmp_path: Path, *, after_notice: int | None = None
) -> tuple[Verdict, CursorSampler, list[int]]:
    """Kill whichever worker process runs the reader ``sizes.kills`` times; one replaces it.

    ``after_notice`` (a seed): kill six times instead, each 0-0.3 s after the source
    skipped events and said so (the reader may have read the notice and written nothing
    of it)."""
    sizes, source = chaos.sizes, chaos.source
    rng = random.Random(after_notice)
    kills = sizes.kills if after_notice is None else 6
    name = chaos.new_stream(how.name.lower())
    task_queue = unique(how.name.lower())
    logs = {tmp_path / f"w{i}.log" for i in range(2)}
    processes = [chaos.worker_process(task_queue, log) for log in sorted(logs)]
    rereads: list[int] = []
    skipped: list[int] = []
    try:
        async with chaos.sampler(name) as sampler:
            handle = await chaos.start(name, task_queue)
            if after_notice is None:
                await chaos.flowing(name, 200, timeout=90)
            else:
                await chaos.ready_for_a_gap(name)
            for kill in range(kills):
                if after_notice is None:
                    await asyncio.sleep(max(1.0, sizes.seconds / kills))
                pid = await _wait_reader(handle)
                victim = next(p for p in processes if p.pid == pid)
                before = await _duplicates(chaos, handle)
                if after_notice is not None:
                    count = rng.randint(10, int(sizes.rate / 4))
                    skipped.append(await drop_for_real(source, name, count, rate=sizes.rate))
                    await asyncio.sleep(rng.uniform(0.0, 0.3))
                victim.send_signal(how)
                await asyncio.to_thread(victim.wait, 60)
                processes.remove(victim)
                logs.add(tmp_path / f"r{kill}.log")
                processes.append(chaos.worker_process(task_queue, tmp_path / f"r{kill}.log"))
                await _wait_reader(handle, other_than=pid)
                at_kill = (await stored(chaos.log, name)).rows
                await chaos.flowing(name, at_kill + int(sizes.rate), timeout=60)
                rereads.append(await _duplicates(chaos, handle) - before)
            status = await chaos.drain(handle, name)
    finally:
        for process in processes:
            end_process(process)
    faults = f"{kills} x {how.name} of the reading worker (2 workers)"
    scenario = "3 SIGKILL" if how is signal.SIGKILL else "4 SIGTERM"
    if after_notice is not None:
        faults += f", each 0-0.3 s after a drop notice ({sum(skipped)} skipped)"
        scenario += " after a notice"
        assert len(source.truth(name).dropped) == len(skipped) == kills
    verdict = await chaos.verdict(scenario, faults, name, sampler, status)
    print(f"{scenario}: events re-read per kill: {rereads}")
    if how is signal.SIGTERM:
        # Make before break (reader.successors): the stopping worker's connection read on
        # until its retry started on the other worker.
        read_on = sum(
            log.read_text(errors="replace").count("reading on until its retry starts")
            for log in logs
        )
        assert read_on == kills, f"{read_on} of {kills} stops read on"
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


async def _duplicates(chaos: Chaos, handle: WorkflowHandle) -> int:
    """Rows re-read so far: the workflow's count plus the running attempt's heartbeat."""
    from durable_sse.ops.control import stream_status

    status = await stream_status(chaos.temporal.client, handle.id.split(":", 1)[1])
    in_flight = status.get("in_flight") or {}
    return int(status["counters"]["duplicates"]) + int(in_flight.get("duplicates", 0))


async def test_3_sigkill_worker(chaos: Chaos, tmp_path: Path) -> None:
    verdict, sampler, rereads = await kill_readers(signal.SIGKILL, chaos, tmp_path)
    assert_clean(verdict, sampler)
    assert len(rereads) == chaos.sizes.kills


async def test_4_sigterm_worker(chaos: Chaos, tmp_path: Path) -> None:
    verdict, sampler, rereads = await kill_readers(signal.SIGTERM, chaos, tmp_path)
    assert_clean(verdict, sampler)
    assert rereads == [0] * chaos.sizes.kills, f"re-read after a graceful stop: {rereads}"


async def test_3_sigkill_a_moment_after_each_drop_notice(
    chaos: Chaos, tmp_path: Path, seed: int
) -> None:
    """The issue's kill-after-notice check: each next attempt must start on a live worker
    within seconds (not at the heartbeat timeout), suspect what its dead predecessor read,
    and repair every skip: 0 lost, 0 duplicate rows, nothing out of the window."""
    verdict, sampler, rereads = await kill_readers(
        signal.SIGKILL, chaos, tmp_path, after_notice=seed
    )
    assert_clean(verdict, sampler)
    assert len(rereads) == 6 and verdict.out_of_window == 0


@pytest.mark.parametrize(
    ("activity", "hold"),
    [
        # Retention's lock: the connection's start waits for it before it registers.
        ("read_stream", lambda held, name: hold_retention(held, name, exclusive=True)),
        # The gaps' read, a short activity before the first connection.
        ("stream_gaps", lambda held, name: held.execute(sa.text(LOCK_GAPS))),
    ],
    ids=["connection-start", "gaps-read"],
)
async def test_a_worker_killed_in_an_attempt_no_connection_row_names_is_moved_too(
    chaos: Chaos, tmp_path: Path, activity: str, hold: Callable[[Connection, str], None]
) -> None:
    """Temporal handed the worker an attempt, and the worker died before any row named
    it: a connection whose start had not registered yet (it waits its turn for the
    database, seconds in a burst of starts), or one of the workflow's short activities.
    Only its timeout (five minutes for a read, 30 s for the gaps' read) would end it; the
    watchdog asks Temporal for it instead, even when a worker that died before left a row
    for the stream (kills a second apart, CI seed 2875886649)."""
    name = chaos.new_stream("unregistered")
    task_queue = unique("unregistered")
    await _left_by_a_dead_worker(chaos.log, name)
    processes = [chaos.worker_process(task_queue, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        with chaos.log.database.engine.connect() as held, held.begin():
            hold(held, name)
            handle = await chaos.start(name, task_queue)
            pid = await _wait_runner(handle, activity)
            victim = next(p for p in processes if p.pid == pid)
            await asyncio.sleep(1)  # the attempt is waiting for the lock
            victim.kill()
            await asyncio.to_thread(victim.wait, 60)
        await chaos.flowing(name, 2 * int(chaos.sizes.rate), timeout=90)
        # A retried attempt still running is in the description, an ended one in the
        # history (its started event is written when it ends).
        description = await handle.describe()
        retried = [
            (pending.attempt, pending.last_failure.application_failure_info.type)
            for pending in description.raw_description.pending_activities
            if pending.attempt > 1
        ] + [
            (started.attempt, started.last_failure.application_failure_info.type)
            async for event in handle.fetch_history_events()
            if (started := event.activity_task_started_event_attributes).attempt > 1
        ]
        assert retried == [(2, WORKER_LOST)], retried
        await handle.terminate("done")
    finally:
        for process in processes:
            end_process(process)


async def _left_by_a_dead_worker(log: Stores, name: str) -> None:
    """The row of a connection of ``name`` whose worker was taken for dead: it stays until
    it expires."""
    dead = unique("dead-worker")
    await log.workers.acquire(dead, pool="elsewhere", host="gone", pid=1, boot_id="b")
    reader = ReaderLease(
        reader_id="1.1.dead",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        worker_id=dead,
        workflow_id=f"{WORKFLOW_ID_PREFIX}{name}",
        run_id="an-earlier-run",
        activity_id="1",
        attempt=1,
    )
    await log.starts.connection_context(name, "numeric", cursor=None, source="none", reader=reader)
    assert await log.workers.revoke(dead, by="test", expired_only=False)


async def _wait_runner(handle: WorkflowHandle, activity: str) -> int:
    """The pid of the worker running the workflow's pending ``activity``."""
    found: list[int] = []

    async def running() -> bool:
        description = await handle.describe()
        for pending in description.raw_description.pending_activities:
            if (
                pending.activity_type.name == activity
                and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            ):
                found.append(int(pending.last_worker_identity.split("@", 1)[0]))
                return True
        return False

    await wait_until(running, timeout=90, what=f"a worker process to run {activity}")
    return found[-1]


# -- 9. two writers of one cursor -------------------------------------------------------------


async def test_9_paused_worker_comes_back(chaos: Chaos, tmp_path: Path) -> None:
    name = chaos.new_stream("stop")
    task_queue = unique("stop")
    processes = [chaos.worker_process(task_queue, tmp_path / f"w{i}.log") for i in range(2)]
    rounds = 2
    try:
        async with chaos.sampler(name, every=0.05) as sampler:
            handle = await chaos.start(name, task_queue)
            await chaos.ready_for_a_gap(name)
            for _ in range(rounds):
                pid = await _wait_reader(handle)
                os.kill(pid, signal.SIGSTOP)
                await _wait_reader(handle, other_than=pid)  # heartbeat timeout: a new attempt
                await asyncio.sleep(2)
                os.kill(pid, signal.SIGCONT)  # the old attempt writes again
                await asyncio.sleep(3)
            status = await chaos.drain(handle, name)
    finally:
        for process in processes:
            end_process(process)
    faults = f"{rounds} x SIGSTOP past the heartbeat timeout, then SIGCONT"
    verdict = await chaos.verdict("9 two writers", faults, name, sampler, status)
    assert_clean(verdict, sampler)
