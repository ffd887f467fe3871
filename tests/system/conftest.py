"""Fixtures of the system tests. Each module that asks for ``stack`` gives its own
``event_log`` (and may give its own ``temporal``): the stack is built from those. A
module that asks for ``worker`` names the secrets it declares in ``WORKER_SECRETS``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_sse.source import SSESource
from durable_sse.stores import Stores
from tests.chaos.harness import Stack, in_process_worker


@pytest.fixture
def stack(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    event_log: Stores,
) -> Stack:
    return Stack(temporal, address, pg_url, redis_url, source, event_log)


@pytest.fixture(scope="module")
async def worker(
    request: pytest.FixtureRequest,
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
) -> AsyncIterator[None]:
    """One in-process worker on the default task queue, like a user's, declaring the
    module's ``WORKER_SECRETS``."""
    secrets: str = request.module.WORKER_SECRETS
    async with in_process_worker(address, pg_url, redis_url, tune_gc=False, SSE_SECRETS=secrets):
        yield
