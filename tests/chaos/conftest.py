"""Fixtures of the chaos suite: one Temporal dev server, one source, one worker per module.

``--long`` (registered in tests/conftest.py, which pytest loads at start-up) switches
every scenario to >= 100k events.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from durable_sse.source import SSESource
from durable_sse.stores import Stores
from tests.chaos.checker import Verdict
from tests.chaos.harness import DEFAULT, LONG, SHORT, Chaos, Sizes, in_process_worker, unique
from tests.conftest import open_stores

HEADER = (
    "| scenario | events | faults injected | lost | duplicates | regressions | recovered "
    "| out-of-window |\n|---|---|---|---|---|---|---|---|"
)


@pytest.fixture(scope="module")
def sizes(request: pytest.FixtureRequest) -> Sizes:
    if request.config.getoption("--long"):
        return LONG
    return SHORT if request.config.getoption("--seeds") > 1 else DEFAULT


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``--seeds N`` runs every scenario that takes a ``seed`` N times."""
    if "seed" in metafunc.fixturenames:
        count = max(1, metafunc.config.getoption("--seeds"))
        metafunc.parametrize("seed_index", range(count), ids=lambda i: f"seed{i}")


@pytest.fixture
def seed(seed_index: int) -> int:
    """``CHAOS_SEED`` replays a failing run; otherwise a fresh seed, printed."""
    fixed = os.environ.get("CHAOS_SEED")
    value = int(fixed) + seed_index if fixed else int.from_bytes(os.urandom(4), "big")
    print(f"\nchaos seed: {value} (replay with CHAOS_SEED={value})", file=sys.stderr)
    return value


@pytest.fixture(scope="module")
async def chaos_log(pg_url: str) -> AsyncIterator[Stores]:
    async with open_stores(pg_url) as log:
        yield log


@pytest.fixture(scope="module")
async def queue(address: str, pg_url: str, redis_url: str) -> AsyncIterator[str]:
    """A task queue served by one in-process worker (shared Redis)."""
    name = unique("chaos")
    async with in_process_worker(address, pg_url, redis_url, name):
        await asyncio.sleep(0)
        yield name


@pytest.fixture(scope="module")
def verdicts() -> Iterator[list[Verdict]]:
    """Every scenario's row; printed at the end, and appended to ``$CHAOS_REPORT``."""
    rows: list[Verdict] = []
    yield rows
    table = "\n".join([HEADER, *(v.row() for v in rows)])
    print("\n" + table, file=sys.stderr)
    target = os.environ.get("CHAOS_REPORT")
    if target:
        with Path(target).open("a") as out:
            out.write(table + "\n")


@pytest.fixture
def chaos(
    temporal: WorkflowEnvironment,
    address: str,
    pg_url: str,
    redis_url: str,
    source: SSESource,
    chaos_log: Stores,
    sizes: Sizes,
    verdicts: list[Verdict],
) -> Chaos:
    """What every scenario works with, in one place."""
    return Chaos(temporal, address, pg_url, redis_url, source, chaos_log, sizes, verdicts)
