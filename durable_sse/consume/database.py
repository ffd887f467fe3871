"""A consumer's database: its engine, the threads its transactions run on, their errors.

Every transaction of a consumer is synchronous SQLAlchemy on a thread of its own pool, so
that an exactly-once handler given the open transaction runs right there (a plain
function) or is awaited on the event loop while the thread waits (``async def``). A
driver error leaves this module as :class:`~durable_sse.errors.StoreError`, which the
consumer retries; anything else (the handler's own exceptions, wrapped by the caller)
passes through unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa

from durable_sse.errors import StoreError
from durable_sse.log.database import error_summary, make_engine

T = TypeVar("T")


def normalize_url(database_url: str) -> str:
    """Every PostgreSQL spelling to psycopg 3 (``postgres://``, ``postgresql://``)."""
    scheme, sep, rest = database_url.partition("://")
    if sep and scheme.startswith("postgres") and "+" not in scheme:
        return f"postgresql+psycopg://{rest}"
    return database_url


def consumer_engine(database_url: str, *, durable_commit: bool) -> sa.Engine:
    """The engine of ``database_url`` (already normalized, :func:`normalize_url`).

    ``durable_commit=False`` turns ``synchronous_commit`` off for every connection
    (PostgreSQL; see ``Consumer``).
    """
    engine = make_engine(database_url)
    if not durable_commit and engine.dialect.name == "postgresql":
        sa.event.listen(engine, "connect", _asynchronous_commit)
    return engine


class ConsumerDatabase:
    """One consumer's engine and the threads its transactions run on."""

    def __init__(self, engine: sa.Engine, *, threads: int) -> None:
        self.engine = engine
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sse-consume")

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on a database thread; cancelling waits for it to end."""
        loop = asyncio.get_running_loop()
        call = functools.partial(_guarded, function, *args)
        future = loop.run_in_executor(self._executor, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # The transaction runs in a thread: let it end (commit or roll back) first.
            await asyncio.wait([future])
            raise

    async def close(self) -> None:
        """Close the connections, then let the threads go."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.dispose)
        self._executor.shutdown(wait=False)


def _guarded(function: Callable[..., T], *args: Any) -> T:
    try:
        return function(*args)
    except (sa.exc.SQLAlchemyError, psycopg.Error, sqlite3.Error) as error:
        raise StoreError(f"the consumer's database call failed: {error_summary(error)}") from error


def _asynchronous_commit(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    dbapi_connection.commit()
