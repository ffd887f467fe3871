"""Event log insert throughput: the production path against a multi-row INSERT.

PostgreSQL: COPY into the per-connection staging table, then one
``INSERT … SELECT … ON CONFLICT DO NOTHING`` (what ``Writer.insert_batch`` does)
against a single multi-row ``INSERT … VALUES (…), (…) ON CONFLICT DO NOTHING``.
SQLite: ``executemany`` of ``INSERT … ON CONFLICT DO NOTHING`` (production) against
multi-row ``VALUES`` statements. Every batch is its own committed transaction.

Usage: ``python bench/insert_rate.py [--events 200000] [--runs 3]``. Rows are written
under throwaway stream names and deleted afterwards; the tables are never dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from durable_sse.ids import IdOrder  # noqa: E402
from durable_sse.log.records import EventRecord
from durable_sse.log.rows import event_rows
from durable_sse.log.schema import STAGING_COLUMNS  # noqa: E402
from durable_sse.stores import Stores

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
COLUMNS = STAGING_COLUMNS[1:]
SQLITE_MAX_VARIABLES = 32766
ORDER = IdOrder.NATURAL

Technique = Callable[[Stores, str, Sequence[EventRecord]], Awaitable[int]]


def make_events(
    count: int,
    *,
    start: int = 0,
    at: datetime | None = None,
    step: timedelta = timedelta(0),
) -> list[EventRecord]:
    """Events shaped like a busy stream: ``<ms>-<seq>`` ids and a small JSON payload.

    Numbered from ``start``; the first received at ``at`` (default now), each next one
    ``step`` later.
    """
    first = at if at is not None else datetime.now(UTC)
    return [
        EventRecord(
            event_id=f"{1_700_000_000_000 + index}-0",
            event_ord=0,
            event_type="message",
            data=f'{{"n": {index}, "payload": "abcdefghijklmnopqrstuvwxyz0123456789"}}',
            received_at=first + (index - start) * step,
        )
        for index in range(start, start + count)
    ]


async def production_insert(log: Stores, stream: str, events: Sequence[EventRecord]) -> int:
    return (await log.writer.insert_batch(stream, ORDER.value, events)).new_rows


async def multirow_insert(log: Stores, stream: str, events: Sequence[EventRecord]) -> int:
    return await asyncio.to_thread(_multirow_sync, log, stream, events)


def _multirow_sync(log: Stores, stream: str, events: Sequence[EventRecord]) -> int:
    rows = [row[1:] for row in event_rows(stream, ORDER, events)]
    sqlite = log.database.dialect == "sqlite"
    if sqlite:
        rows = [(*row[:-1], row[-1].strftime("%Y-%m-%d %H:%M:%S.%f")) for row in rows]
    placeholder = "(" + ", ".join(["?" if sqlite else "%s"] * len(COLUMNS)) + ")"
    chunk = SQLITE_MAX_VARIABLES // len(COLUMNS) if sqlite else len(rows)
    inserted = 0
    with log.database.engine.begin() as connection:
        cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            sql = (
                f"INSERT INTO sse_events ({', '.join(COLUMNS)}) VALUES "
                + ", ".join([placeholder] * len(part))
                + " ON CONFLICT DO NOTHING"
            )
            params: list[Any] = [value for row in part for value in row]
            cursor.execute(sql, params)
            inserted += cursor.rowcount
        cursor.close()
    return inserted


async def measure(
    log: Stores, technique: Technique, events: list[EventRecord], batch: int, runs: int
) -> float:
    """Median rows/s over ``runs`` fresh streams (every row new)."""
    rates: list[float] = []
    for _ in range(runs):
        stream = "bench-" + uuid.uuid4().hex[:12]
        started = time.perf_counter()
        stored = 0
        for start in range(0, len(events), batch):
            stored += await technique(log, stream, events[start : start + batch])
        elapsed = time.perf_counter() - started
        if stored != len(events):
            raise RuntimeError(f"stored {stored} of {len(events)} events")
        rates.append(len(events) / elapsed)
        await asyncio.to_thread(_delete_stream, log, stream)
    return statistics.median(rates)


def _delete_stream(log: Stores, stream: str) -> None:
    with log.database.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM sse_events WHERE stream = :s"), {"s": stream})


async def bench_backend(
    label: str, url: str, events: list[EventRecord], batches: list[int], runs: int
) -> list[tuple[str, int, float, float]]:
    log = Stores.open(url)
    try:
        await log.create_schema()
        results = []
        for batch in batches:
            fast = await measure(log, production_insert, events, batch, runs)
            plain = await measure(log, multirow_insert, events, batch, runs)
            results.append((label, batch, fast, plain))
            print(f"  {label} batch {batch}: {fast:,.0f} vs {plain:,.0f} rows/s", flush=True)
        return results
    finally:
        await log.close()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", default="500,2000,5000")
    parser.add_argument("--postgres", default=DEFAULT_PG_URL, help="'' to skip PostgreSQL")
    parser.add_argument("--no-sqlite", action="store_true")
    args = parser.parse_args(argv)
    batches = [int(size) for size in args.batches.split(",")]
    events = make_events(args.events)
    rows: list[tuple[str, int, float, float]] = []
    if args.postgres:
        rows += await bench_backend("postgresql", args.postgres, events, batches, args.runs)
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as directory:
            url = f"sqlite:///{directory}/bench.db"
            rows += await bench_backend("sqlite", url, events, batches, args.runs)
    print(f"\n{args.events:,} events, median of {args.runs} runs, rows/s")
    header = f"{'database':<11} {'batch':>6} {'production':>12} {'multi-row':>12} {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for label, batch, fast, plain in rows:
        print(f"{label:<11} {batch:>6} {fast:>12,.0f} {plain:>12,.0f} {fast / plain:>6.2f}")
    print("production = COPY+staging on PostgreSQL, executemany on SQLite")


if __name__ == "__main__":
    asyncio.run(main())
