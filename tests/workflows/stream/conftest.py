"""StreamWorkflow's test server (one per module), its metrics, and an event log on SQLite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment

from durable_sse.ops.binaries import temporal_test_server
from durable_sse.stores import Stores
from tests.conftest import open_stores


@pytest.fixture(scope="module")
def metrics() -> MetricBuffer:
    """Every metric the module's workers record (drained before each test)."""
    return MetricBuffer(1_000_000)


@pytest.fixture(scope="module")
async def env(metrics: MetricBuffer) -> AsyncIterator[WorkflowEnvironment]:
    runtime = Runtime(telemetry=TelemetryConfig(metrics=metrics))
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=temporal_test_server(), runtime=runtime
    ) as environment:
        yield environment


@pytest.fixture(autouse=True)
def drain_metrics(metrics: MetricBuffer) -> None:
    metrics.retrieve_updates()


@pytest.fixture
async def event_log(tmp_path: Path) -> AsyncIterator[Stores]:
    async with open_stores(f"sqlite:///{tmp_path / 'events.db'}") as log:
        yield log
