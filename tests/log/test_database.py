"""The event log's database runner (durable_sse/log/database.py), apart from any store."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

from durable_sse.errors import StoreError
from durable_sse.log.database import (
    PING_IDLE_AFTER,
    WORKERS,
    Database,
    make_engine,
    outlast_cancellation,
)


async def test_a_cancelled_caller_waits_for_the_call_and_leaves_no_error_unretrieved() -> None:
    """A paused worker's connections are cancelled while their start is in a database
    thread, which then fails (the lease was revoked): the cancellation wins, quietly."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    release, finished = threading.Event(), threading.Event()

    def failing_call() -> None:
        release.wait(5)
        finished.set()
        raise RuntimeError("the lease was revoked")

    try:
        caller = asyncio.ensure_future(
            outlast_cancellation(loop.run_in_executor(None, failing_call))
        )
        await asyncio.sleep(0.05)
        caller.cancel()
        await asyncio.sleep(0.05)
        assert not caller.done()  # it waits for the call to end
        release.set()
        await asyncio.wait([caller])
        assert caller.cancelled() and finished.is_set()
        del caller
        gc.collect()
        await asyncio.sleep(0)
        assert reported == []
    finally:
        loop.set_exception_handler(previous)


def _backend_pid(database: Database) -> int:
    with database.begin() as connection:
        return int(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def _terminate(pg_url: str, pid: int) -> None:
    with make_engine(pg_url).connect() as admin:
        admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        admin.commit()


async def test_a_session_is_kept_open_and_reused_not_opened_per_call(pg_url: str) -> None:
    """A burst of calls from every thread opens one session per thread, not one per call
    (past the pool's size, sessions were opened and closed per call)."""
    database = Database(pg_url)
    try:
        pids = await asyncio.gather(
            *(database.run("read its session", _backend_pid, database) for _ in range(400))
        )
        assert len(set(pids)) <= WORKERS
    finally:
        await database.close()


async def test_a_session_idle_past_the_ping_age_is_pinged_and_replaced_when_dead(
    pg_url: str,
) -> None:
    database = Database(pg_url, workers=1)
    try:
        first = await database.run("read its session", _backend_pid, database)
        _terminate(pg_url, first)
        for record in _pooled_records(database):
            record.info["durable_sse.idle_since"] -= PING_IDLE_AFTER  # as if idle that long
        second = await database.run("read its session", _backend_pid, database)
        assert second != first  # the ping found it dead: no error, a new session
    finally:
        await database.close()


async def test_a_recently_used_session_found_dead_fails_once_and_the_retry_succeeds(
    pg_url: str,
) -> None:
    """Not pinged (it was in use a moment ago): the one call fails as a StoreError naming
    the database, and the next gets a new session."""
    database = Database(pg_url, workers=1)
    try:
        first = await database.run("read its session", _backend_pid, database)
        _terminate(pg_url, first)
        with pytest.raises(StoreError, match="PostgreSQL at .* read its session"):
            await database.run("read its session", _backend_pid, database)
        second = await database.run("read its session", _backend_pid, database)
        assert second != first
    finally:
        await database.close()


def _pooled_records(database: Database) -> list[Any]:
    pool = database.engine.pool
    return [record for record in pool._pool.queue]  # type: ignore[attr-defined]
