"""Shared plumbing of the benchmarks: figures, the throwaway stack, subprocesses, /proc.

Every benchmark runs against real services: a throwaway Temporal dev server, a private
PostgreSQL database (created for the run and dropped after it, so ``pg_stat_database``
counts only our statements), a throwaway ``redis-server`` (so ``INFO commandstats`` and
key scans see only ours) and the demo SSE source in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from durable_sse.ops.binaries import redis_command

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"

logger = logging.getLogger(__name__)


# -- figures ---------------------------------------------------------------------------


@dataclass
class Figures:
    """Median of several values with their range (the machine is noisy)."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def fmt(self, unit: str = "", scale: float = 1.0, digits: int = 0) -> str:
        if not self.values:
            return "n/a"
        low, high = min(self.values) * scale, max(self.values) * scale
        median = self.median * scale
        if len(self.values) == 1:
            return f"{median:,.{digits}f}{unit}"
        return f"{median:,.{digits}f}{unit} ({low:,.{digits}f}-{high:,.{digits}f})"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[rank]


@dataclass
class Row:
    """One line of the final table."""

    section: str
    metric: str
    value: str
    goal: str = ""
    verdict: str = ""


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "MISSED")


def print_table(rows: list[Row]) -> str:
    header = ("#", "metric", "value: median (min-max)", "goal", "")
    widths = [
        max(len(header[0]), *(len(r.section) for r in rows)),
        max(len(header[1]), *(len(r.metric) for r in rows)),
        max(len(header[2]), *(len(r.value) for r in rows)),
        max(len(header[3]), *(len(r.goal) for r in rows)),
        max(len(header[4]), *(len(r.verdict) for r in rows)),
    ]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line((r.section, r.metric, r.value, r.goal, r.verdict)) for r in rows]
    return "\n".join(out)


# -- ports and processes -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, every: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)


def spawn(args: list[str], *, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen:
    """A child process whose output goes to ``log`` (never to our table)."""
    handle = log.open("ab")
    return subprocess.Popen(
        args, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=handle, stderr=handle
    )


def stop_process(process: subprocess.Popen, *, timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds (all cores) the whole machine spent not idle, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def cpu_by_cmdline(needle: str) -> dict[int, float]:
    """CPU seconds of every process whose command line contains ``needle``."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if needle in cmdline:
                found[int(entry.name)] = cpu_seconds(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# -- the stack ---------------------------------------------------------------------------


@dataclass
class Stack:
    """Addresses of the throwaway services of one benchmark run."""

    workdir: Path
    pg_admin: str
    database: str
    redis_port: int
    redis_process: subprocess.Popen
    source_port: int
    source_process: subprocess.Popen

    @property
    def database_url(self) -> str:
        base = self.pg_admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
        return f"{base}/{self.database}"

    @property
    def psycopg_url(self) -> str:
        return self.pg_admin.rsplit("/", 1)[0] + "/" + self.database

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def source_url(self) -> str:
        return f"http://127.0.0.1:{self.source_port}"

    def stream_url(self, name: str) -> str:
        return f"{self.source_url}/streams/{name}"

    def worker_env(self, temporal_address: str, task_queue: str) -> dict[str, str]:
        return {
            "TEMPORAL_ADDRESS": temporal_address,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "SSE_TASK_QUEUE": task_queue,
            "PYTHONPATH": str(ROOT),
        }


@contextlib.asynccontextmanager
async def stack(workdir: Path, *, pg_admin: str = DEFAULT_PG_ADMIN) -> AsyncIterator[Stack]:
    """A private database, a throwaway redis-server and the SSE source in its own process."""
    database = "bench_" + uuid.uuid4().hex[:10]
    await _pg_admin(pg_admin, f"CREATE DATABASE {database}")
    redis_port = free_port()
    redis_process = spawn(redis_command(redis_port), log=workdir / "redis.log")
    source_port = free_port()
    source_process = spawn(
        [PYTHON, "-m", "durable_sse.source", "--port", str(source_port), "--log-level", "WARNING"],
        log=workdir / "source.log",
    )
    running = Stack(
        workdir, pg_admin, database, redis_port, redis_process, source_port, source_process
    )
    try:
        await wait_until(lambda: _healthy(running), timeout=30, what="the SSE source and Redis")
        yield running
    finally:
        stop_process(source_process)
        stop_process(redis_process)
        with contextlib.suppress(Exception):
            await _pg_admin(pg_admin, f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


async def _healthy(running: Stack) -> bool:
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            await client.get(running.source_url + "/healthz", timeout=1)
        with socket.create_connection(("127.0.0.1", running.redis_port), timeout=1):
            pass
        return True
    except (httpx.HTTPError, OSError):
        return False


async def _pg_admin(url: str, statement: str) -> None:
    def run() -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(statement)  # type: ignore[arg-type]

    await asyncio.to_thread(run)


async def pg_query(url: str, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
    def run() -> list[Any]:
        with psycopg.connect(url, autocommit=True) as connection:
            return list(connection.execute(sql, params).fetchall())  # type: ignore[arg-type]

    return await asyncio.to_thread(run)


async def add_source_stream(running: Stack, name: str, **config: Any) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(f"{running.source_url}/streams/{name}", json=config)
        response.raise_for_status()
    return running.stream_url(name)


async def control_source_stream(running: Stack, name: str, **settings: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.post(f"{running.source_url}/control/{name}", json=settings)
        response.raise_for_status()
        return dict(response.json())


async def remove_source_stream(running: Stack, name: str) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        await client.delete(f"{running.source_url}/streams/{name}")


def read_probe(path: Path) -> dict[str, float]:
    """The counters the probe worker writes (see bench/probe_worker.py)."""
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
