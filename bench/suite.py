"""Run every benchmark and print one table (``bench/run``; ``bench/run --quick``).

Sections: 1 parse ceiling, 2 hot stream end to end, 3 many streams, 4 reconnect
overhead, 5 replay, 6 cost per event, 7 naive consumer, 8 consumers of the log
(``--only consume``: bench/consume.py), 9 what a stream costs in Temporal per stream-hour
(``--only cost``: bench/cost.py; not in the default run, it measures for minutes), 10
failover: a worker of two SIGKILLed, then one SIGSTOPped for 20 s, then one SIGTERMed,
under N streams (``--only failover``: bench/failover.py; not in the default run: it
takes minutes).
Each figure is the median of several runs with min-max; each ratio is against a baseline
measured in this run.
Children's logs and the probe counters go to a work directory (``--workdir``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import consume, cost, failover, hot, many, parse, reconnect  # noqa: E402
from bench.common import Figures, Row, print_table, stack, verdict  # noqa: E402
from bench.temporal_stack import temporal  # noqa: E402

logger = logging.getLogger(__name__)

SECTIONS = ("parse", "hot", "many", "reconnect", "replay", "naive", "consume", "cost", "failover")
DEFAULT_SECTIONS = SECTIONS[:-2]
"""``cost`` and ``failover`` run only when asked for: each takes minutes."""


@dataclass
class Sizes:
    parse_events: int
    hot_events: int
    runs: int
    streams: list[int]
    many_seconds: float
    reconnects: int
    replay_window: int
    naive_events: int
    consume_rows: int = 1_000_000
    writer_events: int = 100_000


QUICK = Sizes(
    parse_events=50_000,
    hot_events=50_000,
    runs=2,
    streams=[100],
    many_seconds=10,
    reconnects=30,
    replay_window=20_000,
    naive_events=2_000,
    consume_rows=100_000,
    writer_events=30_000,
)
DEFAULT = Sizes(
    parse_events=200_000,
    hot_events=200_000,
    runs=3,
    streams=[100, 500, 1000],
    many_seconds=20,
    reconnects=50,
    replay_window=100_000,
    naive_events=5_000,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1-2 minute smoke run")
    parser.add_argument("--only", default=",".join(DEFAULT_SECTIONS), help=f"subset of {SECTIONS}")
    parser.add_argument("--cost-streams", type=int, default=10, help="busy and idle, each")
    parser.add_argument("--cost-minutes", type=float, default=12.0, help=cost.MINUTES_HELP)
    parser.add_argument(
        "--cost-replay-window", type=float, default=120.0, help="seconds, for the cost section"
    )
    parser.add_argument(
        "--failover-streams", type=int, default=200, help="streams of the failover section"
    )
    parser.add_argument(
        "--failover-herd",
        action="store_true",
        help="failover: every stream on one worker, SIGKILLed beside an idle one (kill only)",
    )
    parser.add_argument(
        "--failover-rate",
        type=float,
        default=failover.RATE,
        help="failover: events per second per stream",
    )
    parser.add_argument(
        "--failover-timeout",
        type=float,
        default=400.0,
        help="seconds each failover mode waits for the streams to come back",
    )
    parser.add_argument("--runs", type=int, help="runs per figure")
    parser.add_argument("--parse-events", type=int)
    parser.add_argument("--hot-events", type=int)
    parser.add_argument("--streams", help="comma-separated stream counts, e.g. 100,500,1000")
    parser.add_argument("--many-seconds", type=float, help="measured window per stream count")
    parser.add_argument(
        "--many-settle",
        type=float,
        default=2.0,
        help="seconds from the last stream's first event to the measured window",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes on the task queue for the many-streams figures",
    )
    parser.add_argument("--reconnects", type=int, help="reconnect samples per route")
    parser.add_argument("--replay-window", type=int)
    parser.add_argument("--naive-events", type=int)
    parser.add_argument("--consume-rows", type=int, help="rows the consumer benchmark reads")
    parser.add_argument("--batch-events", type=int, default=1000, help="StreamSpec setting")
    parser.add_argument("--batch-delay", type=float, default=0.05, help="StreamSpec setting")
    parser.add_argument(
        "--bulk-batch-events", type=int, help="batch_max_events for the bulk hot run"
    )
    parser.add_argument("--workdir", help="keep logs here (default: a temporary directory)")
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/test")
    return parser.parse_args(argv)


def sizes_from(args: argparse.Namespace) -> Sizes:
    base = QUICK if args.quick else DEFAULT
    return Sizes(
        parse_events=args.parse_events or base.parse_events,
        hot_events=args.hot_events or base.hot_events,
        runs=args.runs or base.runs,
        streams=[int(n) for n in args.streams.split(",")] if args.streams else base.streams,
        many_seconds=args.many_seconds or base.many_seconds,
        reconnects=args.reconnects or base.reconnects,
        replay_window=args.replay_window or base.replay_window,
        naive_events=args.naive_events or base.naive_events,
        consume_rows=args.consume_rows or base.consume_rows,
        writer_events=base.writer_events,
    )


async def run(args: argparse.Namespace, workdir: Path) -> list[Row]:
    sizes = sizes_from(args)
    only = set(args.only.split(","))
    rows: list[Row] = []
    ceiling: dict[str, float] = {}
    async with stack(workdir, pg_admin=args.pg_admin) as running:
        redis = aioredis.Redis.from_url(running.redis_url)
        if "parse" in only or "hot" in only:
            result = await parse.parse_ceiling(running, events=sizes.parse_events, runs=sizes.runs)
            for flush in parse.FLUSH_MODES:
                label = "per-event flush" if flush == "event" else "bulk writes"
                ceiling[flush] = result.httpx_sse[flush].median
                rows.append(Row("1", f"httpx-sse, {label} (ev/s)", result.httpx_sse[flush].fmt()))
                rows.append(Row("1", f"our decoder, {label} (ev/s)", result.ours[flush].fmt()))
                rows.append(
                    Row("1", f"ours / httpx-sse, {label}", result.ratio[flush].fmt(digits=2))
                )
            _progress(rows)
        if "hot" in only or "replay" in only:
            async with temporal(running, label="hot") as stack_t:
                if "hot" in only:
                    rows += await _hot_rows(running, stack_t, redis, sizes, args, ceiling)
                    _progress(rows)
                if "replay" in only:
                    rows += await _replay_rows(running, stack_t, redis, sizes, args)
                    _progress(rows)
        if "many" in only:
            for count in sizes.streams:
                rows += await many.many_rows(
                    running,
                    redis,
                    count,
                    sizes.many_seconds,
                    workers=args.workers,
                    settle=args.many_settle,
                )
                _progress(rows)
        if "reconnect" in only:
            rows += await reconnect.reconnect_rows(running, samples=sizes.reconnects)
            _progress(rows)
        if "naive" in only:
            rows += await _naive_rows(running, sizes, ceiling)
            _progress(rows)
        if "consume" in only:
            sqlite_dir = workdir / "consume-sqlite"
            sqlite_dir.mkdir(exist_ok=True)
            rows += await consume.consume_rows(
                running.database_url,
                sqlite_dir,
                rows=sizes.consume_rows,
                runs=sizes.runs,
                writer_events=sizes.writer_events,
            )
            _progress(rows)
        if "cost" in only:
            async with temporal(running, label="cost") as stack_t:
                rows += await cost.cost_rows(
                    stack_t,
                    streams=args.cost_streams,
                    minutes=args.cost_minutes,
                    replay_window=args.cost_replay_window,
                )
            _progress(rows)
        if "failover" in only:
            rows += await failover.failover_rows(
                running,
                streams=args.failover_streams,
                timeout=args.failover_timeout,
                herd=args.failover_herd,
                rate=args.failover_rate,
            )
            _progress(rows)
        await redis.aclose()
    return rows


async def _hot_rows(
    running: object,
    stack_t: object,
    redis: aioredis.Redis,
    sizes: Sizes,
    args: argparse.Namespace,
    ceiling: dict[str, float],
) -> list[Row]:
    rows: list[Row] = []
    for flush in parse.FLUSH_MODES:
        batch = args.batch_events
        if flush == "bulk" and args.bulk_batch_events:
            batch = args.bulk_batch_events
        result = hot.HotResult()
        for _ in range(sizes.runs):
            await hot.hot_run(
                running,  # type: ignore[arg-type]
                stack_t,  # type: ignore[arg-type]
                redis,
                flush=flush,
                events=sizes.hot_events,
                batch_max_events=batch,
                batch_max_delay=args.batch_delay,
                result=result,
            )
        label = "per-event flush" if flush == "event" else "bulk writes"
        settings = f"batch {batch}/{args.batch_delay * 1000:g} ms"
        rows.append(Row("2", f"durable e2e, {label}, {settings} (ev/s)", result.rate.fmt()))
        # The write path's ceiling in this run: the same rows, COPYed straight into the
        # same schema in transactions of the size the hot runs committed, one per run.
        copy_batch = max(1, round(result.batch_size.median))
        copy = Figures()
        for stream in result.streams:
            copy.values.append(
                await hot.copy_ceiling(
                    running,  # type: ignore[arg-type]
                    stream,
                    events=sizes.hot_events,
                    batch=copy_batch,
                )
            )
        rows.append(
            Row(
                "2", f"direct COPY ceiling, same rows, {copy_batch:,} per commit (ev/s)", copy.fmt()
            )
        )
        copy_ratio = Figures([v / copy.median for v in result.rate.values])
        rows.append(
            Row(
                "2",
                f"durable / direct-COPY ceiling, {label}",
                copy_ratio.fmt(digits=2),
                ">= 0.8",
                verdict(copy_ratio.median >= 0.8),
            )
        )
        base = ceiling.get(flush)
        if base:
            ratio = Figures([v / base for v in result.rate.values])
            rows.append(
                Row(
                    "2",
                    f"durable / httpx-sse, {label}",
                    ratio.fmt(digits=2),
                    ">= 0.5",
                    verdict(ratio.median >= 0.5),
                )
            )
        if flush == "bulk":
            rows.append(
                Row(
                    "2",
                    "bulk goal",
                    result.rate.fmt(),
                    ">= 120,000 ev/s",
                    verdict(result.rate.median >= 120_000),
                )
            )
        rows.append(
            Row(
                "2",
                f"cores used: worker / PG backend / source / Temporal / machine, {label}",
                " / ".join(
                    f.fmt(digits=2)
                    for f in (
                        result.worker_cpu,
                        result.postgres_cpu,
                        result.source_cpu,
                        result.temporal_cpu,
                        result.machine_busy,
                    )
                ),
            )
        )
        rows.append(
            Row(
                "2",
                f"batches committing (mean) / ms from batch queued to committed / events per "
                f"batch, {label}",
                f"{result.commit_busy.fmt(digits=2)} / {result.commit_ms.fmt(digits=1)}"
                f" / {result.batch_size.fmt()}",
            )
        )
        cost = result.cost
        rows.append(
            Row("6", f"SQL statements / 1k events, hot {label}", cost.statements.fmt(digits=1))
        )
        rows.append(
            Row("6", f"PG transactions / 1k events, hot {label}", cost.transactions.fmt(digits=1))
        )
        rows.append(
            Row(
                "6",
                f"Redis round trips / 1k events, hot {label}",
                cost.redis_round_trips.fmt(digits=1),
            )
        )
        rows.append(
            Row(
                "6",
                f"history events per run ({sizes.hot_events:,} ev), hot {label}",
                cost.history_events.fmt(),
            )
        )
    return rows


async def _replay_rows(
    running: object, stack_t: object, redis: aioredis.Redis, sizes: Sizes, args: argparse.Namespace
) -> list[Row]:
    rates, seconds = Figures(), Figures()
    complete = True
    missing = recovered = 0
    for _ in range(max(1, sizes.runs - 1)):
        result = await hot.replay_run(
            running,  # type: ignore[arg-type]
            stack_t,  # type: ignore[arg-type]
            redis,
            window=sizes.replay_window,
            batch_max_events=args.bulk_batch_events or args.batch_events,
            batch_max_delay=args.batch_delay,
        )
        rates.values.append(result.rate)
        seconds.values.append(result.seconds)
        complete = complete and result.complete
        missing, recovered = result.missing, result.recovered
    label = f"window {sizes.replay_window:,}, 1% missing"
    return [
        Row("5", f"replay re-read rate, {label} (ev/s)", rates.fmt()),
        Row("5", f"signal -> every hole stored again, {label} (s)", seconds.fmt(digits=2)),
        Row(
            "5",
            "holes / rows stored again / window complete",
            f"{missing} / {recovered} / {complete}",
        ),
    ]


async def _naive_rows(running: object, sizes: Sizes, ceiling: dict[str, float]) -> list[Row]:
    rates = await parse.naive_throughput(
        running,
        events=sizes.naive_events,
        runs=sizes.runs,  # type: ignore[arg-type]
    )
    rows = [Row("7", "naive consumer, per-event flush (ev/s)", rates.fmt())]
    if ceiling.get("event"):
        ratio = Figures([v / ceiling["event"] for v in rates.values])
        rows.append(Row("7", "naive / httpx-sse, per-event flush", ratio.fmt(digits=2)))
    loss = await parse.naive_drop_loss(
        running,  # type: ignore[arg-type]
        events=min(sizes.naive_events, 3000),
        rate=500,
        drop_every=500,
        drop_count=10,
    )
    rows.append(
        Row(
            "7",
            "naive consumer: events lost with drop notices (2% dropped)",
            f"{loss.lost} of {loss.read + loss.lost}",
        )
    )
    return rows


def _progress(rows: list[Row]) -> None:
    if rows:
        logger.info("so far:\n%s", print_table(rows))


def _quietly(args: argparse.Namespace, workdir: Path) -> list[Row]:
    """Run with fd 1 pointed at a log: the Temporal dev server prints a banner to stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    with (workdir / "stdout.log").open("ab") as log:
        os.dup2(log.fileno(), 1)
        try:
            return asyncio.run(run(args, workdir))
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "durable_sse.source"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.monotonic()
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        rows = _quietly(args, workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="durable-sse-bench-") as directory:
            rows = _quietly(args, Path(directory))
    elapsed = time.monotonic() - started
    print(
        f"durable-sse benchmarks ({'quick' if args.quick else 'default'} sizes), "
        f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"{elapsed:.0f} s"
    )
    print(print_table(rows))


if __name__ == "__main__":
    main()
