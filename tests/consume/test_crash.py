"""Consumers under SIGKILL: a writer at ~2k ev/s over 20 streams, a consumer process
killed at random moments (the seed is printed; ``CONSUME_CRASH_SEED=n`` replays it).

Exactly once: the handler inserts each event into a table with no unique key, inside
the consumer's transaction: every ``(stream, seq)`` must be there exactly once, each
stream's in ``seq`` order. At least once: the handler writes in a transaction of its own
and then acknowledges: nothing may be lost, and a kill may cost at most one batch again.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import random
import signal
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durable_sse.consume import Group
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores
from tests.consume import victim as consume_victim

STREAMS = 20
RATE = 2000
"""Events per second the writer stores, over all streams."""
KILLS = {("postgresql", "exactly"): 50, ("sqlite", "exactly"): 10}
KILLS_AT_LEAST_ONCE = {"postgresql": 15, "sqlite": 5}
BATCH = 50
LEASE = {"exactly": 0.3, "at_least": 1.0}
"""A killed consumer's streams are taken over once its lease lapses: short here, so that
the next consumer works in most of its short life. Exactly once, nothing but a handover
depends on the lease (the position row's lock and epoch decide); at least once, a
batch must be acknowledged within it."""


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.consume.victim"])
    return context


async def _write(log: Stores, streams: list[str], stop: asyncio.Event) -> int:
    """Store ``RATE`` events a second until ``stop``; the number stored."""
    loop = asyncio.get_running_loop()
    interval = 0.05
    per_batch = max(1, round(RATE * interval / len(streams)))
    counts = dict.fromkeys(streams, 0)
    jobs = []
    while not stop.is_set():
        started = loop.time()
        now = datetime.now(UTC)
        for stream in streams:
            first = counts[stream] + 1
            counts[stream] += per_batch
            events = [
                EventRecord(str(n), 0, "tick", f'{{"n": {n}}}', now)
                for n in range(first, first + per_batch)
            ]
            jobs.append(log.writer.submit_batch(stream, "numeric", events))
        await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
    for job in jobs:
        await log.writer.committed(job)
    return sum(counts.values())


def _sink_rows(engine: sa.Engine, table: str) -> list[tuple[str, int]]:
    with engine.connect() as connection:
        return [
            (row[0], int(row[1]))
            for row in connection.exec_driver_sql(f"SELECT stream, seq FROM {table} ORDER BY n")
        ]


def _stored(engine: sa.Engine, streams: list[str]) -> list[tuple[str, int]]:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT stream, seq FROM sse_events WHERE stream IN :s ORDER BY seq"
            ).bindparams(sa.bindparam("s", expanding=True)),
            {"s": streams},
        )
        return [(row[0], int(row[1])) for row in rows]


async def _crash_run(url: str, mode: str, kills: int, seed: int) -> tuple[Any, ...]:
    """Write, kill the consumer ``kills`` times, let a last one catch up; returns
    ``(stored, sink rows, sink table, engine-owning log)``."""
    rng = random.Random(seed)
    prefix = "crash-" + uuid.uuid4().hex[:8]
    streams = [f"{prefix}-{n}" for n in range(STREAMS)]
    table = "consume_sink_" + uuid.uuid4().hex[:8]
    log = Stores.open(url)
    await log.create_schema()
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql(consume_victim.sink_ddl(log.database.dialect, table))
    group = Group(prefix, streams=streams, batch_size=BATCH, lease=LEASE[mode])
    context = _context()

    def start() -> Any:
        process = context.Process(
            target=consume_victim.run, args=(url, group, table, mode), daemon=True
        )
        process.start()
        return process

    stop = asyncio.Event()
    writer = asyncio.create_task(_write(log, streams, stop))
    behind = progressed = 0
    consumed = 0
    try:
        for _ in range(kills):
            process = start()
            await asyncio.sleep(rng.uniform(0.1, 1.0))
            _kill(process)
            await asyncio.to_thread(process.join, 10)
            sunk = len(_sink_rows(log.database.engine, table))
            behind += sunk < len(_stored(log.database.engine, streams))
            progressed += sunk > consumed
            consumed = sunk
        stop.set()
        written = await writer
        assert written >= RATE * 0.5 * kills * 0.1, "the writer fell far behind its rate"
        process = start()
        try:
            deadline = time.monotonic() + 90
            expected = len(_stored(log.database.engine, streams))
            while len(set(_sink_rows(log.database.engine, table))) < expected:
                assert time.monotonic() < deadline, "the last consumer did not catch up"
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.3)  # anything more it would (wrongly) write
        finally:
            _kill(process)
            await asyncio.to_thread(process.join, 10)
        print(
            f"{mode} once, {kills} kills (seed {seed}): the consumer was behind at {behind}, "
            f"had consumed more since the last kill at {progressed}"
        )
        return (
            _stored(log.database.engine, streams),
            _sink_rows(log.database.engine, table),
            table,
            log,
        )
    finally:
        stop.set()
        if not writer.done():
            writer.cancel()


def _kill(process: Any) -> None:
    """SIGKILL the consumer; it must still be running (it never ends on its own)."""
    assert process.exitcode is None, f"the consumer died on its own ({process.exitcode})"
    os.kill(process.pid, signal.SIGKILL)


def _seed() -> int:
    seed = int(os.environ.get("CONSUME_CRASH_SEED") or random.randrange(1 << 30))
    print(f"CONSUME_CRASH_SEED={seed}")
    return seed


def _in_order(sink: list[tuple[str, int]]) -> dict[str, list[int]]:
    by_stream: dict[str, list[int]] = collections.defaultdict(list)
    for stream, seq in sink:
        by_stream[stream].append(seq)
    return by_stream


@pytest.fixture(params=["postgresql", "sqlite"])
def crash_url(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> str:
    return pg_url if request.param == "postgresql" else f"sqlite:///{tmp_path / 'events.db'}"


async def test_exactly_once_under_sigkill(crash_url: str) -> None:
    dialect = "postgresql" if crash_url.startswith("postgresql") else "sqlite"
    seed = _seed()
    stored, sink, table, log = await _crash_run(
        crash_url, "exactly", KILLS[(dialect, "exactly")], seed
    )
    try:
        counts = collections.Counter(sink)
        duplicates = {key: n for key, n in counts.items() if n > 1}
        missing = set(stored) - set(counts)
        assert not duplicates, f"seed {seed}: delivered more than once: {list(duplicates)[:5]}"
        assert not missing, f"seed {seed}: never delivered: {sorted(missing)[:5]}"
        assert len(sink) == len(stored)
        for stream, seqs in _in_order(sink).items():
            assert seqs == sorted(seqs), f"seed {seed}: stream {stream} out of order"
    finally:
        with log.database.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE {table}")
        await log.close()


async def test_at_least_once_under_sigkill(crash_url: str) -> None:
    dialect = "postgresql" if crash_url.startswith("postgresql") else "sqlite"
    seed = _seed()
    kills = KILLS_AT_LEAST_ONCE[dialect]
    stored, sink, table, log = await _crash_run(crash_url, "at_least", kills, seed)
    try:
        counts = collections.Counter(sink)
        missing = set(stored) - set(counts)
        assert not missing, f"seed {seed}: lost: {sorted(missing)[:5]}"
        extra = len(sink) - len(counts)
        # The consumer handles one batch at a time: a kill repeats at most that batch.
        assert extra <= kills * BATCH, f"seed {seed}: {extra} duplicates for {kills} kills"
        for stream, seqs in _in_order(sink).items():
            first_seen = list(dict.fromkeys(seqs))
            assert first_seen == sorted(first_seen), f"seed {seed}: {stream} out of order"
    finally:
        with log.database.engine.begin() as connection:
            connection.exec_driver_sql(f"DROP TABLE {table}")
        await log.close()
