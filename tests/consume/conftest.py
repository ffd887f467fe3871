"""The event log the consumer tests read, on PostgreSQL and on a fresh SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_sse.stores import Stores
from tests.conftest import open_stores


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> str:
    return pg_url if request.param == "postgresql" else f"sqlite:///{tmp_path / 'events.db'}"


@pytest.fixture
async def log(db_url: str) -> AsyncIterator[Stores]:
    async with open_stores(db_url) as event_log:
        yield event_log
