"""Shared fixtures: the real PostgreSQL and Redis every store test runs against.

Other engineers' tests share these servers concurrently: every test uses its own
stream name, nothing is flushed or dropped. An unreachable service fails the run with a
clear message; it never skips. Where they are (the machine's, or throwaway ones started
for the session when none answers) is decided by the tests/services.py plugin.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
import redis
from temporalio.testing import WorkflowEnvironment

from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.source import SSESource
from durable_sse.stores import Stores

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# The machine's services at these defaults, or throwaway ones for the session: see there.
pytest_plugins = ["tests.services"]


def _pg_url() -> str:
    return os.environ.get("TEST_DATABASE_URL", DEFAULT_PG_URL)


def _redis_url() -> str:
    return os.environ.get("TEST_REDIS_URL", DEFAULT_REDIS_URL)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--long``: the chaos suite (tests/chaos) runs >= 100k events per scenario.
    ``--seeds N``: its seeded scenarios run N times, each with a fresh seed (short mode)."""
    parser.addoption("--long", action="store_true", default=False, help="long chaos runs")
    parser.addoption(
        "--seeds", type=int, default=1, help="chaos: run the seeded scenarios with N seeds"
    )


@pytest.fixture(scope="session", autouse=True)
def services_answer() -> None:
    """Fail (not skip) every test up front when PostgreSQL or Redis does not answer."""
    pg_url = _pg_url()
    try:
        with psycopg.connect(pg_url.replace("+psycopg", ""), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        pytest.fail(
            f"PostgreSQL for tests ({pg_url}, override with TEST_DATABASE_URL) does not "
            f"answer: {error}",
            pytrace=False,
        )
    client = redis.Redis.from_url(_redis_url(), socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(
            f"Redis for tests ({_redis_url()}, override with TEST_REDIS_URL) does not "
            f"answer: {error}",
            pytrace=False,
        )
    finally:
        client.close()


@pytest.fixture(scope="session")
def pg_url() -> str:
    return _pg_url()


@contextlib.asynccontextmanager
async def open_stores(url: str) -> AsyncIterator[Stores]:
    """:class:`Stores` at ``url`` with the schema created, closed on the way out: the body
    of every stores fixture, whatever its scope or name."""
    opened = Stores.open(url)
    await opened.create_schema()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _redis_url()


@pytest.fixture
def stream_name() -> str:
    return "t-" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
async def temporal() -> AsyncIterator[WorkflowEnvironment]:
    """A Temporal dev server from the pip-installed binary, one per test module."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(), ui=False
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="module")
def address(temporal: WorkflowEnvironment) -> str:
    return temporal.client.service_client.config.target_host


@pytest.fixture(scope="module")
async def source() -> AsyncIterator[SSESource]:
    """The demo SSE source on a free port; tests add their own uniquely named streams."""
    async with SSESource() as running:
        yield running


@pytest.fixture(params=["postgresql", "sqlite"])
async def stores(
    request: pytest.FixtureRequest, pg_url: str, tmp_path: Path
) -> AsyncIterator[Stores]:
    """:class:`Stores` with the schema, on PostgreSQL and on a fresh SQLite file (no L2)."""
    url = pg_url if request.param == "postgresql" else f"sqlite:///{tmp_path / 'events.db'}"
    async with open_stores(url) as opened:
        yield opened


@pytest.fixture
async def pg_stores(pg_url: str) -> AsyncIterator[Stores]:
    """:class:`Stores` on PostgreSQL, with the schema (no L2)."""
    async with open_stores(pg_url) as opened:
        yield opened


@pytest.fixture
def event_log(stores: Stores) -> Stores:
    """The event log's jobs (``stores.writer``, ``stores.reads`` …), both backends."""
    return stores


@pytest.fixture
def pg_event_log(pg_stores: Stores) -> Stores:
    return pg_stores
