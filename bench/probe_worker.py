"""The production worker (``worker.run_worker``) with statement and round-trip counters.

Counts every PostgreSQL statement the worker's driver sends (``psycopg`` cursor
``execute``/``executemany``/``copy``: SQLAlchemy and the COPY path both end there) and
every Redis round trip (``send_packed_command``: one per command or per pipeline), every
activity heartbeat handed to the SDK's core (which sends it to the server), and
writes them as JSON to ``$BENCH_PROBE_FILE`` every 0.25 s. The counting is a locked
integer increment; nothing else about the worker changes.

Run: ``BENCH_PROBE_FILE=probe.json TEMPORAL_ADDRESS=... python bench/probe_worker.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import temporalio.bridge.worker  # noqa: E402
from redis.asyncio.connection import AbstractConnection  # noqa: E402

from durable_sse import worker as worker_module  # noqa: E402
from durable_sse.config.settings import Settings  # noqa: E402
from durable_sse.ops.logs import configure_logging  # noqa: E402

COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()


def _count(name: str, original: Any) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            COUNTS[name] += 1
        return original(*args, **kwargs)

    return counted


def install() -> None:
    psycopg.Cursor.execute = _count("sql", psycopg.Cursor.execute)  # type: ignore[method-assign]
    psycopg.Cursor.executemany = _count("sql", psycopg.Cursor.executemany)  # type: ignore[method-assign]
    psycopg.Cursor.copy = _count("sql", psycopg.Cursor.copy)  # type: ignore[method-assign]
    original = AbstractConnection.send_packed_command

    async def send(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS["redis"] += 1
        return await original(self, *args, **kwargs)

    AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
    bridge = temporalio.bridge.worker.Worker
    bridge.record_activity_heartbeat = _count(  # type: ignore[method-assign]
        "heartbeats", bridge.record_activity_heartbeat
    )


async def _report(path: Path) -> None:
    while True:
        with _LOCK:
            snapshot = dict(COUNTS)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(snapshot))
        tmp.replace(path)
        await asyncio.sleep(0.25)


async def main() -> None:
    path = Path(os.environ["BENCH_PROBE_FILE"])
    reporter = asyncio.create_task(_report(path))
    try:
        await worker_module.run_worker(Settings.from_env())
    finally:
        reporter.cancel()


if __name__ == "__main__":
    configure_logging("plain")
    install()
    asyncio.run(main())
