"""The read activity on the real PostgreSQL and Redis, for tests/reader and tests/activities."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import httpx
import pytest
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from durable_sse.activities.read import ReadActivities
from durable_sse.config.secrets import DeclaredSecrets, parse_secret_bindings
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.stores import Stores
from tests.reader.helpers import (
    SECRET,
)


@pytest.fixture
async def reader(pg_stores: Stores, redis_url: str) -> AsyncIterator[ReadActivities]:
    l2 = RedisCursors(redis_url)
    async with httpx.AsyncClient(follow_redirects=False) as http:
        yield ReadActivities(
            http=http,
            stores=replace(pg_stores, l2=l2),
            secrets=DeclaredSecrets(
                parse_secret_bindings("TEST_TOKEN@127.0.0.1"), environ={"TEST_TOKEN": SECRET}
            ),
        )
    await l2.close()


@pytest.fixture(scope="module")
def metrics() -> tuple[Runtime, MetricBuffer]:
    """A Temporal runtime whose metrics are buffered for the test to read."""
    buffer = MetricBuffer(10_000)
    return Runtime(telemetry=TelemetryConfig(metrics=buffer)), buffer
