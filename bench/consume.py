"""Consumers of the log (issue 23): what they deliver, how fast, and what the writer pays.

Three figures, each a ratio or a percentile measured in one run on one machine:

* **writer cost**: ``insert_batch`` (what ``bench/insert_rate.py`` measures) with the
  per-stream commit-order lock and the ``NOTIFY`` on, against the same with both off
  (``Stores.order_commits`` / ``notify_commits``), runs interleaved; and a hot stream's
  pipelined batches (``submit_batch`` without waiting, the reader's shape), where the lock
  serialises a stream's consecutive group transactions.
* **throughput**: an exactly-once consumer with a no-op handler over ``--rows`` rows in
  100 streams, against a raw keyset ``SELECT`` of the same rows (one connection, plain
  tuples, the same page size): goal >= 0.5.
* **latency**: from an event's ``received_at`` (stamped as the writer submits it) to the
  handler, under a 10k ev/s writer: p99 < 100 ms on PostgreSQL.

Usage: ``python -m bench.consume --postgres URL [--rows 1000000] [--runs 3]`` (``''`` skips
PostgreSQL; ``--no-sqlite``). ``bench/run --only consume`` runs it in the suite. Rows go
under throwaway stream names and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Figures, Row, percentile, print_table, verdict  # noqa: E402
from bench.insert_rate import make_events  # noqa: E402
from durable_sse.consume import Consumer, Group, Start  # noqa: E402
from durable_sse.log.records import EventRecord
from durable_sse.stores import Stores

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test_consume"
STREAMS = 100
PAGE = 1000
"""Rows per consumer batch and per keyset page."""
BIG_PAGE = 5000
"""A larger consumer batch (fewer transactions), against the same keyset read."""
LATENCY_RATE = 10_000
LATENCY_SECONDS = 15.0
ROOT = str(Path(__file__).resolve().parent.parent)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f}) on {len(os.sched_getaffinity(0))} cores"


# -- writer cost ---------------------------------------------------------------------


async def _timed_inserts(log: Stores, events: list[EventRecord], batch: int) -> float:
    stream = "bench-" + uuid.uuid4().hex[:12]
    started = time.perf_counter()
    for start in range(0, len(events), batch):
        await log.writer.insert_batch(stream, "natural", events[start : start + batch])
    rate = len(events) / (time.perf_counter() - started)
    await asyncio.to_thread(_delete_streams, log, [stream])
    return rate


async def _timed_pipeline(
    log: Stores, events: list[EventRecord], batch: int, streams: int
) -> float:
    """``submit_batch`` without waiting (the reader pipelines a stream's batches)."""
    names = ["bench-" + uuid.uuid4().hex[:12] for _ in range(streams)]
    started = time.perf_counter()
    jobs = []
    for index, start in enumerate(range(0, len(events), batch)):
        name = names[index % streams]
        jobs.append(log.writer.submit_batch(name, "natural", events[start : start + batch]))
    for job in jobs:
        await log.writer.committed(job)
    rate = len(events) / (time.perf_counter() - started)
    await asyncio.to_thread(_delete_streams, log, names)
    return rate


def _delete_streams(log: Stores, streams: list[str]) -> None:
    with log.database.engine.begin() as connection:
        connection.execute(
            sa.text("DELETE FROM sse_events WHERE stream IN :s").bindparams(
                sa.bindparam("s", expanding=True)
            ),
            {"s": streams},
        )


async def writer_cost(url: str, *, events: int, runs: int) -> list[Row]:
    """On against off, interleaved: the ratio is what item 1 and the NOTIFY cost."""
    log = Stores.open(url)
    await log.create_schema()
    rows: list[Row] = []
    data = make_events(events)
    spent = [0.0]
    order_and_notify = log.writer._order_and_notify

    def timed(*args: Any) -> None:
        """The lock + NOTIFY statement's time, its waits for the stream's lock included."""
        started = time.perf_counter()
        try:
            order_and_notify(*args)
        finally:
            spent[0] += time.perf_counter() - started

    log.writer._order_and_notify = timed  # type: ignore[method-assign]
    try:
        shapes = [
            ("insert_batch, batch 500", lambda: _timed_inserts(log, data, 500)),
            ("insert_batch, batch 2000", lambda: _timed_inserts(log, data, 2000)),
            ("hot stream, 500-event batches pipelined", lambda: _timed_pipeline(log, data, 500, 1)),
            (
                "100 streams, 20-event batches pipelined",
                lambda: _timed_pipeline(log, data[: events // 4], 20, 100),
            ),
        ]
        for label, measure in shapes:
            on, off, ratio, share = Figures(), Figures(), Figures(), Figures()
            await measure()  # warm up
            for _ in range(runs):
                for enabled in (True, False):
                    log.writer.order_commits = log.writer.notify_commits = enabled
                    spent[0] = 0.0
                    started = time.perf_counter()
                    (on if enabled else off).values.append(await measure())
                    if enabled:
                        share.values.append(spent[0] / (time.perf_counter() - started))
                ratio.values.append(on.values[-1] / off.values[-1])
            log.writer.order_commits = log.writer.notify_commits = True
            rows.append(
                Row("8", f"writer {label}: with / without (ev/s)", f"{on.fmt()} / {off.fmt()}")
            )
            rows.append(
                Row(
                    "8",
                    f"writer {label}: ratio",
                    ratio.fmt(digits=3),
                    ">= 0.95",
                    verdict(ratio.median >= 0.95),
                )
            )
            rows.append(
                Row(
                    "8",
                    f"writer {label}: in the lock + NOTIFY statement (its waits included)",
                    share.fmt(unit=" % of the time", scale=100, digits=1),
                )
            )
            print(rows[-3].value, rows[-2].value, rows[-1].value, flush=True)
    finally:
        await log.close()
    return rows


# -- throughput ----------------------------------------------------------------------


async def _fill(url: str, rows: int) -> tuple[Stores, list[str]]:
    log = Stores.open(url)
    await log.create_schema()
    prefix = "bench-c-" + uuid.uuid4().hex[:8]
    streams = [f"{prefix}-{n:03d}" for n in range(STREAMS)]
    per_stream = rows // STREAMS
    events = make_events(per_stream)
    for stream in streams:
        for start in range(0, per_stream, 5000):
            await log.writer.insert_batch(stream, "natural", events[start : start + 5000])
    with log.database.engine.begin() as connection:
        if log.database.dialect == "postgresql":
            connection.exec_driver_sql("ANALYZE sse_events")
    return log, streams


def _raw_keyset(url: str, streams: list[str]) -> int:
    """A raw keyset read of every row, one connection, plain tuples (the ceiling)."""
    engine = sa.create_engine(url)
    total = 0
    try:
        with engine.connect() as connection:
            driver = connection.connection.driver_connection
            sqlite = engine.dialect.name == "sqlite"
            mark = "?" if sqlite else "%s"
            sql = (
                "SELECT seq, event_id, event_ord, event_type, data, data_bytes, received_at "
                f"FROM sse_events WHERE stream = {mark} AND seq > {mark} ORDER BY seq LIMIT {mark}"
            )
            cursor = driver.cursor()
            for stream in streams:
                after = 0
                while True:
                    cursor.execute(sql, (stream, after, PAGE))
                    page = cursor.fetchall()
                    if not page:
                        break
                    total += len(page)
                    after = page[-1][0]
            cursor.close()
    finally:
        engine.dispose()
    return total


async def _consume_all(
    url: str,
    streams: list[str],
    total: int,
    concurrency: int | None,
    *,
    durable: bool = True,
    page: int = PAGE,
) -> float:
    """Seconds an exactly-once consumer with a no-op handler takes for every row."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    seen = [0]
    lock = threading.Lock()

    def handle(tx: Any, batch: Any) -> None:
        with lock:
            seen[0] += len(batch.items)
            if seen[0] >= total:
                loop.call_soon_threadsafe(done.set)

    group = Group("bench-" + uuid.uuid4().hex[:8], streams=streams, batch_size=page)
    consumer = Consumer(url, group, concurrency=concurrency, durable_commit=durable)
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(consumer.run(handle, stop=stop))
    await asyncio.wait_for(done.wait(), 3600)
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    await consumer.close()
    return elapsed


async def throughput(url: str, label: str, *, rows: int, runs: int) -> list[Row]:
    log, streams = await _fill(url, rows)
    total = (rows // STREAMS) * STREAMS
    out: list[Row] = []
    try:
        raw, ours, ours_one, ours_async = Figures(), Figures(), Figures(), Figures()
        ours_big = Figures()
        postgresql = log.database.dialect == "postgresql"
        for _ in range(runs):
            started = time.perf_counter()
            assert await asyncio.to_thread(_raw_keyset, url, streams) == total
            raw.values.append(total / (time.perf_counter() - started))
            ours.values.append(total / await _consume_all(url, streams, total, None))
            ours_big.values.append(
                total / await _consume_all(url, streams, total, None, page=BIG_PAGE)
            )
            if postgresql:
                ours_one.values.append(total / await _consume_all(url, streams, total, 1))
                ours_async.values.append(
                    total / await _consume_all(url, streams, total, None, durable=False)
                )
        ratio = Figures([a / b for a, b in zip(ours.values, raw.values, strict=True)])
        out.append(Row("8", f"{label}: raw keyset SELECT, {total:,} rows (rows/s)", raw.fmt()))
        out.append(
            Row("8", f"{label}: exactly-once consumer, no-op, batch {PAGE} (ev/s)", ours.fmt())
        )
        out.append(
            Row(
                "8",
                f"{label}: consumer / raw SELECT",
                ratio.fmt(digits=2),
                ">= 0.5",
                verdict(ratio.median >= 0.5),
            )
        )
        big = Figures([a / b for a, b in zip(ours_big.values, raw.values, strict=True)])
        out.append(Row("8", f"{label}: the same, batch {BIG_PAGE} (ev/s)", ours_big.fmt()))
        out.append(
            Row(
                "8",
                f"{label}: batch {BIG_PAGE} / raw SELECT",
                big.fmt(digits=2),
                ">= 0.5",
                verdict(big.median >= 0.5),
            )
        )
        if postgresql:
            out.append(Row("8", f"{label}: the same, one stream at a time (ev/s)", ours_one.fmt()))
            fast = Figures([a / b for a, b in zip(ours_async.values, raw.values, strict=True)])
            out.append(
                Row("8", f"{label}: the same, durable_commit=False (ev/s)", ours_async.fmt())
            )
            out.append(Row("8", f"{label}: durable_commit=False / raw SELECT",
                           fast.fmt(digits=2)))  # fmt: skip
        for row in out:
            print(row.metric, row.value, flush=True)
    finally:
        await asyncio.to_thread(_delete_streams, log, streams)
        await log.close()
    return out


# -- latency -------------------------------------------------------------------------


async def write_at_rate(
    url: str, streams: list[str], rate: int, seconds: float
) -> tuple[int, list[tuple[int, int, float]]]:
    """Store ``rate`` events a second over ``streams`` for ``seconds`` (as the reader
    does: batches submitted without waiting, stamped ``received_at`` as submitted).
    Returns the events written and, per batch, ``(first id, last id, commit time)``."""
    log = Stores.open(url)
    await log.create_schema()
    interval = 0.02
    per_batch = max(1, int(rate * interval / len(streams)))
    written = 0
    jobs: list[Any] = []
    commits: list[tuple[int, int, float]] = []
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            tick = time.perf_counter()
            now = datetime.now(UTC)
            for stream in streams:
                events = [
                    EventRecord(str(written + n), 0, "tick", '{"n": 1}', now)
                    for n in range(per_batch)
                ]
                job = log.writer.submit_batch(stream, "numeric", events)
                job.future.add_done_callback(
                    lambda _f, first=written, last=written + per_batch - 1: commits.append(
                        (first, last, time.time())
                    )
                )
                jobs.append(job)
                written += per_batch
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - tick)))
        for job in jobs:
            await log.writer.committed(job)
    finally:
        await log.close()
    return written, commits


async def latency(url: str, label: str) -> list[Row]:
    """received_at -> handler under a ``LATENCY_RATE`` writer (10 streams) in a process of
    its own, as a worker would be; and the part of it that is the consumer's: from the
    writer's commit to the handler."""
    prefix = "bench-l-" + uuid.uuid4().hex[:8]
    streams = [f"{prefix}-{n}" for n in range(10)]
    handled: list[tuple[int, float, float]] = []  # (event id, at handler, received_at)

    def handle(tx: Any, batch: Any) -> None:
        now = time.time()
        handled.extend(
            (int(event.event_id), now, event.received_at.timestamp()) for event in batch.events
        )

    consumer = Consumer(url, Group(prefix, streams=streams, start=Start.latest()))
    await consumer.start()
    await consumer.wait_listening()
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(handle, stop=stop))
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        writer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.consume", "--write", url, "--write-prefix", prefix,
            "--write-report", report.name, cwd=ROOT,
        )  # fmt: skip
        started = time.perf_counter()
        await writer.wait()
        elapsed = time.perf_counter() - started
        text = await asyncio.to_thread(Path(report.name).read_text)
        written, commits = json.loads(text)
    await asyncio.sleep(1.0)
    stop.set()
    await task
    await consumer.close()
    log = Stores.open(url)
    await asyncio.to_thread(_delete_streams, log, streams)
    await log.close()
    committed_at = {n: at for first, last, at in commits for n in range(first, last + 1)}
    skip = written // 5  # the first fifth: start-up of the writer and the consumer
    total = [(at - received) for n, at, received in handled if n >= skip]
    ours = [(at - committed_at[n]) for n, at, _ in handled if n >= skip and n in committed_at]
    writer_side = [committed_at[n] - received for n, _, received in handled if n >= skip]
    goal = label == "PostgreSQL"

    def ms(values: list[float]) -> str:
        return " / ".join(f"{percentile(values, q) * 1000:.1f}" for q in (50, 99))

    rows = [
        Row("8", f"{label}: writer (own process), ev/s during the latency run",
            f"{written / elapsed:,.0f}"),
        Row("8", f"{label}: received_at -> committed (the writer), p50 / p99 (ms)",
            ms(writer_side)),
        Row("8", f"{label}: committed -> handler (the consumer), p50 / p99 (ms)", ms(ours),
            "p99 < 100 ms" if goal else "",
            verdict(percentile(ours, 99) < 0.1) if goal else ""),
        Row("8", f"{label}: received_at -> handler, p50 / p99 (ms), {len(total):,} events",
            ms(total), "p99 < 100 ms" if goal else "",
            verdict(percentile(total, 99) < 0.1) if goal else ""),
    ]  # fmt: skip
    for row in rows:
        print(row.metric, row.value, flush=True)
    return rows


# -- all -------------------------------------------------------------------------------


async def consume_rows(
    postgres: str | None, sqlite_dir: Path | None, *, rows: int, runs: int, writer_events: int
) -> list[Row]:
    out = [Row("8", "machine", load())]
    if postgres:
        out += await writer_cost(postgres, events=writer_events, runs=runs)
        out += await throughput(postgres, "PostgreSQL", rows=rows, runs=runs)
        out += await latency(postgres, "PostgreSQL")
    if sqlite_dir is not None:
        url = f"sqlite:///{sqlite_dir / 'consume.db'}"
        out += await throughput(url, "SQLite", rows=rows, runs=max(1, runs - 1))
        out += await latency(url, "SQLite")
    out.append(Row("8", "machine, at the end", load()))
    return out


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=DEFAULT_PG_URL, help="'' to skip PostgreSQL")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--writer-events", type=int, default=100_000)
    parser.add_argument("--write", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--write-prefix", help=argparse.SUPPRESS)
    parser.add_argument("--write-report", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:  # the latency run's writer process
        streams = [f"{args.write_prefix}-{n}" for n in range(10)]
        written, commits = await write_at_rate(args.write, streams, LATENCY_RATE, LATENCY_SECONDS)
        await asyncio.to_thread(Path(args.write_report).write_text, json.dumps([written, commits]))
        return
    with tempfile.TemporaryDirectory(prefix="bench-consume-") as directory:
        rows = await consume_rows(
            args.postgres or None,
            None if args.no_sqlite else Path(directory),
            rows=args.rows,
            runs=args.runs,
            writer_events=args.writer_events,
        )
    print(print_table(rows))


if __name__ == "__main__":
    asyncio.run(main())
