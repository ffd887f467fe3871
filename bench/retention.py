"""Retention on a large backlog: how fast old rows go, and what it costs the writers.

One PostgreSQL database, a private schema (dropped at the end). A stream holds
``--rows`` rows received two days ago and one replay window of fresh rows after them; a
neighbour stream's rows are interleaved with them so the deletes walk a shared table.
Then:

* **drain**: ``Prune.apply_retention`` deletes the whole backlog in batches of
  ``--batch`` rows, as runs of ``MAX_BATCHES`` statements each (what one checkpoint run
  does), back to back; reported: rows/s, runs, the longest single statement;
* **writers meanwhile**: a live stream commits a batch of 500 rows every 20 ms while the
  drain runs, and again alone: its commit times show what the deletes cost it;
* **horizon lookup**: ``insert_batch`` rows/s for a stream with a retention horizon, one
  without, and the write path without the lookup at all (as before retention; the lookup
  runs once per group transaction).

Usage: ``python -m bench.retention [--postgres URL] [--rows 1000000] [--batch 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from bench.insert_rate import DEFAULT_PG_URL, make_events, production_insert
from bench.lean_log import _direct_copy_sync, _scoped
from durable_sse.ids import IdOrder
from durable_sse.log.records import BatchPayload
from durable_sse.log.retention import MAX_BATCHES
from durable_sse.log.staging import RowInserter
from durable_sse.stores import Stores

WINDOW = 600.0


@dataclass
class _Job:
    """What ``RowInserter.horizons`` reads of a commit job."""

    stream: str
    payload: BatchPayload = field(
        default_factory=lambda: BatchPayload(IdOrder.NUMERIC, make_events(1))
    )


FILL_CHUNK = 50_000


async def fill(log: Stores, stream: str, neighbour: str, rows: int, now: datetime) -> None:
    old = now - timedelta(days=2)
    step = timedelta(microseconds=50)
    for start in range(0, rows, FILL_CHUNK):
        count = min(FILL_CHUNK, rows - start)
        at = old + start * step
        await asyncio.to_thread(
            _direct_copy_sync, log, stream, make_events(count, start=start, at=at, step=step)
        )
        await asyncio.to_thread(
            _direct_copy_sync,
            log,
            neighbour,
            make_events(count // 10, start=start, at=at, step=step),
        )
    fresh = make_events(10_000, start=rows, at=now - timedelta(seconds=WINDOW / 2), step=step)
    await asyncio.to_thread(_direct_copy_sync, log, stream, fresh)
    with log.database.engine.begin() as connection:
        connection.exec_driver_sql("ANALYZE sse_events")
    moved = await log.checkpoints.advance_lagging(stream, "natural", window=WINDOW, now=now)
    assert moved.lagging_id == f"{1_700_000_000_000 + rows - 1}-0", moved


async def live_writer(log: Stores, stop: asyncio.Event, latencies: list[float]) -> None:
    stream = "live-" + uuid.uuid4().hex[:8]
    index = 0
    while not stop.is_set():
        batch = make_events(500, start=index, at=datetime.now(UTC), step=timedelta(microseconds=1))
        started = time.perf_counter()
        await log.writer.insert_batch(stream, "natural", batch)
        latencies.append(time.perf_counter() - started)
        index += 500
        await asyncio.sleep(0.02)


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[int(len(ordered) * 0.99) - 1] if len(ordered) >= 100 else ordered[-1]
    return (
        f"{len(ordered)} commits, median {statistics.median(ordered) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"
    )


async def drain(log: Stores, stream: str, cutoff: datetime, batch: int) -> dict[str, float]:
    deleted = runs = statements = 0
    longest = 0.0
    started = time.perf_counter()
    while True:
        run = await log.prune.apply_retention(
            stream, "natural", cutoff=cutoff, batch_rows=batch, max_batches=MAX_BATCHES
        )
        runs += 1
        deleted += run.deleted
        statements += run.batches
        longest = max(longest, run.longest_statement)
        if run.complete:
            break
    elapsed = time.perf_counter() - started
    return {
        "deleted": deleted,
        "runs": runs,
        "statements": statements,
        "seconds": elapsed,
        "longest": longest,
    }


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=DEFAULT_PG_URL)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args(argv)
    schema = f"retention_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(args.postgres)
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    log = Stores.open(_scoped(args.postgres, schema))
    try:
        await log.create_schema()
        now = datetime.now(UTC)
        stream, neighbour = "old-" + uuid.uuid4().hex[:8], "nb-" + uuid.uuid4().hex[:8]
        started = time.perf_counter()
        await fill(log, stream, neighbour, args.rows, now)
        print(f"filled {args.rows:,} old rows in {time.perf_counter() - started:.1f} s")

        alone: list[float] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(live_writer(log, stop, alone))
        await asyncio.sleep(10)
        stop.set()
        await writer

        during: list[float] = []
        stop = asyncio.Event()
        writer = asyncio.create_task(live_writer(log, stop, during))
        result = await drain(log, stream, now - timedelta(days=1), args.batch)
        stop.set()
        await writer
        kept = (await log.prune.retention_state(stream)).oldest_kept_id
        print(
            f"drain: {result['deleted']:,.0f} rows in {result['seconds']:.1f} s = "
            f"{result['deleted'] / result['seconds']:,.0f} rows/s; {result['runs']:.0f} runs "
            f"of <= {MAX_BATCHES} statements of <= {args.batch:,} rows "
            f"({result['statements']:.0f} batches); longest statement "
            f"{result['longest'] * 1000:.0f} ms; oldest kept {kept}"
        )
        print(f"live writer alone:        {summary(alone)}")
        print(f"live writer during drain: {summary(during)}")

        # The write path's horizon lookup: a stream with a horizon against one without.
        events = make_events(100_000)
        rates: dict[str, list[float]] = {
            "without the lookup (as before)": [],
            "no horizon": [],
            "with horizon": [],
        }
        lookup = RowInserter.horizons
        for _ in range(3):
            for label in rates:
                target = "w-" + uuid.uuid4().hex[:8]
                if label.startswith("without"):
                    RowInserter.horizons = lambda self, connection, jobs: {}  # type: ignore[method-assign]
                else:
                    RowInserter.horizons = lookup  # type: ignore[method-assign]
                if label == "with horizon":
                    with log.database.engine.begin() as connection:
                        connection.execute(
                            sa.text(
                                "INSERT INTO sse_retention (stream, horizon_id, horizon_key, "
                                "deleted_rows, updated_at) VALUES (:s, '0', :k, 1, now())"
                            ),
                            {"s": target, "k": b"\x00"},
                        )
                begin = time.perf_counter()
                for start in range(0, len(events), 1500):
                    await production_insert(log, target, events[start : start + 1500])
                rates[label].append(len(events) / (time.perf_counter() - begin))
        inserter = RowInserter(log.database)
        with log.database.engine.begin() as connection:
            lookups = []
            for _ in range(2000):
                begin = time.perf_counter()
                lookup(inserter, connection, [_Job(target)])  # type: ignore[list-item]
                lookups.append(time.perf_counter() - begin)
        print(
            f"horizon lookup alone: median {statistics.median(lookups) * 1e6:.0f} us, "
            f"p99 {sorted(lookups)[1979] * 1e6:.0f} us per group transaction (2000 lookups)"
        )
        for label, values in rates.items():
            print(
                f"insert_batch, {label}: {statistics.median(values):,.0f} rows/s "
                f"({min(values):,.0f}-{max(values):,.0f}, 3 runs of 100,000 in batches of 1500)"
            )
    finally:
        await log.close()
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.dispose()


if __name__ == "__main__":
    asyncio.run(main())
