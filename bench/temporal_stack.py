"""A throwaway Temporal dev server plus one probe worker subprocess (the production worker).

The worker runs in its own process so its CPU and RSS can be read from /proc and the
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
from durable_sse.binaries import temporal_dev_server
from durable_sse.contracts import StreamStatus, stream_workflow_id
from durable_sse.spec import StreamSpec


@dataclass
class Temporal:
    env: WorkflowEnvironment
    worker: subprocess.Popen
    probe_file: Path
    task_queue: str
    metrics_port: int

    @property
    def client(self) -> Client:
        return self.env.client

    def probe(self) -> dict[str, float]:
        return read_probe(self.probe_file)

    async def histogram(self, name: str) -> tuple[float, float]:
        """(sum, count) of one of the worker's Prometheus histograms, over all labels."""
        async with httpx.AsyncClient(trust_env=False) as client:
            text = (await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")).text
        total = count = 0.0
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
async def temporal(running: Stack, *, label: str) -> AsyncIterator[Temporal]:
    """A dev server (in-memory) and a probe worker polling a fresh task queue."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(),
        ui=False,
        dev_server_log_level="error",
    )
    task_queue = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    probe_file = running.workdir / f"probe-{task_queue}.json"
    address = env.client.service_client.config.target_host
    metrics_port = free_port()
    worker = spawn(
        [PYTHON, "bench/probe_worker.py"],
        env={
            **running.worker_env(address, task_queue),
            "BENCH_PROBE_FILE": str(probe_file),
            "SSE_METRICS_PORT": str(metrics_port),
        },
        log=running.workdir / f"worker-{label}.log",
    )
    try:
        await wait_until(
            lambda: _probing(probe_file, worker), timeout=60, what="the worker to start"
        )
        yield Temporal(env, worker, probe_file, task_queue, metrics_port)
    finally:
        stop_process(worker)
        await env.shutdown()


async def _probing(probe_file: Path, worker: subprocess.Popen) -> bool:
    if worker.poll() is not None:
        raise RuntimeError(f"the worker exited with {worker.returncode}; see its log")
    return _exists(probe_file)


def _exists(path: Path) -> bool:
    return path.exists()
