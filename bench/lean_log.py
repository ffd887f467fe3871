"""Event log layouts side by side: the write path's rows/s before and after the lean log.

One PostgreSQL database, one private schema per layout (dropped at the end), the same
rows and batch size for each, runs interleaved so that the machine's noise falls on
every layout alike:

* ``schema 2 indexes, staging``: today's columns with schema 2's five b-trees (primary
  key ``seq``, the event key, ``(stream, seq)``, ``(stream, received_at)``,
  ``(stream, id_key)``), written through the staging table (COPY, then ``INSERT …
  SELECT … ON CONFLICT DO NOTHING``): the write path before;
* ``lean, staging``: schema 3 (primary key ``(stream, seq)``, the event key,
  ``(stream, id_key)``), the same path;
* ``lean, optimistic COPY``: schema 3 and today's production path
  (``Writer.insert_batch``: live batches COPYed straight into ``sse_events``);
* ``direct COPY``: ``COPY`` straight into the lean table, no staging, no conflict
  handling, one transaction per batch: the ceiling the issue measures against.

Usage: ``python -m bench.lean_log [--postgres URL] [--events 200000] [--batch 1500]
[--runs 3]``. Every batch is its own committed transaction, as a hot stream's are.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from bench.insert_rate import DEFAULT_PG_URL, make_events, production_insert
from durable_sse.ids import IdOrder
from durable_sse.log.records import EventRecord
from durable_sse.log.rows import event_rows
from durable_sse.log.schema import STAGING_COLUMNS
from durable_sse.stores import Stores

SCHEMA_2_INDEXES = (
    "ALTER TABLE sse_events DROP CONSTRAINT sse_events_pkey, ADD PRIMARY KEY (seq)",
    "CREATE INDEX ix_sse_events_stream_seq ON sse_events (stream, seq)",
    "CREATE INDEX ix_sse_events_stream_received_at ON sse_events (stream, received_at)",
)
_COLUMNS = STAGING_COLUMNS[1:]


def _scoped(url: str, schema: str) -> str:
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{schema}"


async def direct_copy(log: Stores, stream: str, events: Sequence[EventRecord]) -> int:
    return await asyncio.to_thread(_direct_copy_sync, log, stream, events)


def _direct_copy_sync(log: Stores, stream: str, events: Sequence[EventRecord]) -> int:
    rows = event_rows(stream, IdOrder.NATURAL, events)
    with log.database.engine.begin() as connection:
        driver = connection.connection.driver_connection
        assert driver is not None
        with (
            driver.cursor() as cursor,
            cursor.copy(f"COPY sse_events ({', '.join(_COLUMNS)}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row[1:])
    return len(rows)


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=DEFAULT_PG_URL)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    events = make_events(args.events)
    tag = uuid.uuid4().hex[:8]
    admin = sa.create_engine(args.postgres)
    layouts = {"schema 2 indexes": f"wide_{tag}", "lean": f"lean_{tag}"}
    with admin.begin() as connection:
        for schema in layouts.values():
            connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    logs: dict[str, Stores] = {}
    try:
        for label, schema in layouts.items():
            log = Stores.open(_scoped(args.postgres, schema))
            await log.create_schema()
            if label == "schema 2 indexes":
                with log.database.engine.begin() as connection:
                    for statement in SCHEMA_2_INDEXES:
                        connection.exec_driver_sql(statement)
            logs[label] = log
        variants = [
            ("schema 2 indexes, staging", production_insert, logs["schema 2 indexes"], False),
            ("lean, staging", production_insert, logs["lean"], False),
            ("lean, optimistic COPY", production_insert, logs["lean"], True),
            ("direct COPY (lean table)", direct_copy, logs["lean"], False),
        ]
        rates: dict[str, list[float]] = {label: [] for label, *_ in variants}
        for run in range(args.runs):
            for label, technique, log, optimistic in variants:
                log.writer.optimistic_copy = optimistic
                stream = "bench-" + uuid.uuid4().hex[:12]
                started = time.perf_counter()
                stored = 0
                for start in range(0, len(events), args.batch):
                    stored += await technique(log, stream, events[start : start + args.batch])
                elapsed = time.perf_counter() - started
                if stored != len(events):
                    raise RuntimeError(f"{label}: stored {stored} of {len(events)} events")
                rates[label].append(len(events) / elapsed)
                print(f"  run {run + 1} {label}: {len(events) / elapsed:,.0f} rows/s", flush=True)
        ceiling = statistics.median(rates["direct COPY (lean table)"])
        print(f"\n{args.events:,} events, batch {args.batch}, median (min-max) of {args.runs}")
        print("| write path | rows/s | / direct COPY |")
        print("|---|---|---|")
        for label, values in rates.items():
            median = statistics.median(values)
            print(
                f"| {label} | {median:,.0f} ({min(values):,.0f}-{max(values):,.0f}) "
                f"| {median / ceiling:.2f} |"
            )
    finally:
        for log in logs.values():
            await log.close()
        with admin.begin() as connection:
            for schema in layouts.values():
                connection.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.dispose()


if __name__ == "__main__":
    asyncio.run(main())
