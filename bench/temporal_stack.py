"""A throwaway Temporal dev server plus probe worker subprocesses (the production worker):
one by default, or several polling the same task queue.

Each worker runs in its own process so its CPU and RSS can be read from /proc and the
benchmark driver never competes with it for the GIL.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from bench.common import (
    PYTHON,
    Stack,
    free_port,
    read_probe,
    spawn,
    stop_process,
    wait_until,
)
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.ops.binaries import temporal_dev_server


@dataclass
class Temporal:
    env: WorkflowEnvironment
    workers: list[subprocess.Popen]
    probe_files: list[Path]
    task_queue: str
    metrics_ports: list[int]

    @property
    def worker(self) -> subprocess.Popen:
        """The first worker (the only one unless several were asked for)."""
        return self.workers[0]

    @property
    def pids(self) -> list[int]:
        return [worker.pid for worker in self.workers]

    @property
    def client(self) -> Client:
        return self.env.client

    def probe(self) -> dict[str, float]:
        """Every worker's counters, added up."""
        total: dict[str, float] = {}
        for path in self.probe_files:
            for key, value in read_probe(path).items():
                total[key] = total.get(key, 0) + value
        return total

    async def histogram(self, name: str) -> tuple[float, float]:
        """(sum, count) of one of the workers' Prometheus histograms, over all labels and
        workers."""
        total = count = 0.0
        async with httpx.AsyncClient(trust_env=False) as client:
            for port in self.metrics_ports:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                for line in text.splitlines():
                    metric, _, value = line.rpartition(" ")
                    if metric.startswith(name + "_sum"):
                        total += float(value)
                    elif metric.startswith(name + "_count"):
                        count += float(value)
        return total, count

    async def start_stream(self, spec: StreamSpec) -> WorkflowHandle:
        return await self.client.start_workflow(
            "StreamWorkflow",
            spec,
            id=stream_workflow_id(spec.name),
            task_queue=self.task_queue,
            result_type=StreamStatus,
        )


@contextlib.asynccontextmanager
async def temporal(running: Stack, *, label: str, workers: int = 1) -> AsyncIterator[Temporal]:
    """A dev server (in-memory) and ``workers`` probe workers polling a fresh task queue."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(),
        ui=False,
        dev_server_log_level="error",
    )
    task_queue = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    address = env.client.service_client.config.target_host
    probe_files: list[Path] = []
    ports: list[int] = []
    processes: list[subprocess.Popen] = []
    try:
        for index in range(workers):
            suffix = "" if index == 0 else f"-{index + 1}"
            probe_file = running.workdir / f"probe-{task_queue}{suffix}.json"
            metrics_port = free_port()
            processes.append(
                spawn(
                    [PYTHON, "bench/probe_worker.py"],
                    env={
                        **running.worker_env(address, task_queue),
                        "BENCH_PROBE_FILE": str(probe_file),
                        "SSE_METRICS_PORT": str(metrics_port),
                    },
                    log=running.workdir / f"worker-{label}{suffix}.log",
                )
            )
            probe_files.append(probe_file)
            ports.append(metrics_port)
        for probe_file, worker in zip(probe_files, processes, strict=True):
            await wait_until(
                lambda p=probe_file, w=worker: _probing(p, w),
                timeout=60,
                what="the worker to start",
            )
        yield Temporal(env, processes, probe_files, task_queue, ports)
    finally:
        for worker in processes:
            stop_process(worker)
        await env.shutdown()


async def _probing(probe_file: Path, worker: subprocess.Popen) -> bool:
    if worker.poll() is not None:
        raise RuntimeError(f"the worker exited with {worker.returncode}; see its log")
    return _exists(probe_file)


def _exists(path: Path) -> bool:
    return path.exists()
