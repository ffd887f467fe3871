"""The database every job of the event log shares: one engine, one thread pool, one way
to run a call and to report its failure.

Each job (:mod:`~durable_sse.log.writer`, :mod:`~durable_sse.log.reads`,
:mod:`~durable_sse.log.prune`, the gap store, the checkpoint and start stores) is a small
class over one :class:`Database`, built once per process (:class:`durable_sse.stores.Stores`).
Blocking SQLAlchemy/driver calls run in the pool's threads, never on the event loop, and
surface as :class:`~durable_sse.errors.StoreError` naming the database (never its
password) and what was being done.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from durable_sse.config.settings import sqlite_path
from durable_sse.errors import StoreError
from durable_sse.log.schema import CREATE_STAGING
from durable_sse.log.sessions import this_process

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT = 5
SQLITE_BUSY_TIMEOUT = 30.0
WORKERS = 16
"""Threads for database calls other than commits: connection starts, checkpoint and
retention reads and writes, leases."""
COMMIT_LANES = 4
"""Group transactions written at once on PostgreSQL (threads of their own, so that a
burst of connection starts never queues the commits behind it): a hot stream's next
batch is written while the previous one commits, and quiet streams' batches gather
behind a busy lane."""
PING_IDLE_AFTER = 10.0
"""Seconds a pooled PostgreSQL session may sit unused before its next use pings it
first. A session in use within that time is not pinged: a ping per transaction was a
quarter of a connection start's round trips. Should such a session turn out dead (the
server restarted), its statement fails once as a :class:`StoreError`, the caller's
retry gets a fresh session, and SQLAlchemy replaces every session older than the
failure."""
IDLE_IN_TRANSACTION_TIMEOUT = 30.0
"""Seconds the event log's PostgreSQL sessions may sit idle inside a transaction. None of
ours does for long (a commit lane waits for the lane before it, a few ms, seconds under a
start-up burst). The backstop for a session paused mid-commit that no watchdog ended
(:mod:`durable_sse.log.sessions`: one whose name was changed, or no worker left to
notice): its locks (its streams' commit order, see ``log.writer``) free up then at the
latest."""


class Database:
    """An engine and the threads that use it.

    The constructor does no I/O; the first call that runs a statement connects.
    """

    def __init__(
        self,
        database_url: str,
        *,
        connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
        workers: int = WORKERS,
    ) -> None:
        self.engine = make_engine(
            database_url,
            connect_timeout=connect_timeout,
            idle_in_transaction=IDLE_IN_TRANSACTION_TIMEOUT,
            sessions=workers + COMMIT_LANES,
        )
        self.where = describe_database(self.engine.url)
        """The database in words, for messages (never the password)."""
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sse-db")
        self.commit_executor = ThreadPoolExecutor(
            max_workers=self.commit_lanes, thread_name_prefix="sse-commit"
        )
        """The commit lanes' threads (:mod:`durable_sse.log.commits`)."""
        self._closed = False

    @property
    def dialect(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        return self.engine.dialect.name

    @property
    def commit_lanes(self) -> int:
        """Group transactions written at once: SQLite has one writer at a time, and a
        second lane would only wait for its lock."""
        return COMMIT_LANES if self.dialect == "postgresql" else 1

    @property
    def closed(self) -> bool:
        return self._closed

    def insert(self, table: sa.Table) -> Any:
        """The dialect's ``INSERT`` (it has ``on_conflict_do_nothing/update``)."""
        module = pg_dialect if self.dialect == "postgresql" else sqlite_dialect
        return module.insert(table)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A connection in a transaction, committed when the block ends."""
        with self.engine.connect() as connection, connection.begin():
            yield connection

    async def run(self, action: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a database thread; ``action`` names it in errors.

        If the caller is cancelled, the call still ends (commits or rolls back) before
        the cancellation moves on, so no transaction outlives :meth:`close`.
        """
        self.refuse_if_closed(action)
        loop = asyncio.get_running_loop()
        call = functools.partial(self.guarded, action, function, *args)
        return await outlast_cancellation(loop.run_in_executor(self.executor, call))

    def guarded(self, action: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` with database errors turned into a :class:`StoreError`."""
        try:
            return function(*args)
        except StoreError:
            raise
        except (sa.exc.SQLAlchemyError, psycopg.Error, sqlite3.Error) as error:
            raise self.store_error(error, action) from error

    def store_error(self, error: BaseException, action: str) -> StoreError:
        if isinstance(error, StoreError):
            return error
        if isinstance(error, sa.exc.DBAPIError) and error.statement is None:
            # Raised while connecting: no statement ran.
            failure = StoreError(f"{self.where} is unreachable: {error_summary(error)}")
        else:
            failure = StoreError(f"{self.where} failed to {action}: {error_summary(error)}")
        failure.__cause__ = error
        return failure

    def refuse_if_closed(self, action: str) -> None:
        if self._closed:
            raise StoreError(f"{self.where}: the event log is closed (while trying to {action})")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.engine.dispose)
        self.executor.shutdown(wait=False)
        self.commit_executor.shutdown(wait=False)


def make_engine(
    database_url: str,
    *,
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT,
    idle_in_transaction: float | None = None,
    sessions: int = WORKERS + COMMIT_LANES,
) -> Engine:
    """Build (without connecting) an engine tuned for the event log.

    PostgreSQL connections get the COPY staging table as they open; SQLite connections
    get WAL mode, ``synchronous=NORMAL`` and a busy timeout so concurrent writers wait
    instead of failing. ``idle_in_transaction``: PostgreSQL ends a session that sits this
    many seconds inside a transaction without a statement (None: never), so a worker
    paused or frozen in the middle of a commit does not hold its streams' locks beside
    the worker that took them over. ``sessions``: PostgreSQL sessions kept open at most,
    one per thread that uses the engine.
    """
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "postgresql":
        engine = sa.create_engine(
            url,
            connect_args={"connect_timeout": max(2, int(connect_timeout))},
            # One session per thread, kept: a thread waiting for a session would hold up
            # a commit lane or a start, and a session opened past the pool's size is
            # closed when returned. In a burst of 1,000 connection starts that opened
            # 255 sessions (a server process and a staging table each), against 18.
            pool_size=sessions,
            max_overflow=0,
            hide_parameters=True,
        )
        event.listen(engine, "connect", _prepare_postgresql)
        _ping_when_idle(engine)
        if idle_in_transaction is not None:
            # A statement on connect, not the ``options`` connect argument: that would
            # replace the URL's own (a ``search_path``, say).
            milliseconds = int(idle_in_transaction * 1000)
            event.listen(
                engine,
                "connect",
                lambda dbapi_connection, _record: _set_session(
                    dbapi_connection, f"SET idle_in_transaction_session_timeout = {milliseconds}"
                ),
            )
        return engine
    if backend == "sqlite":
        options: dict[str, Any] = {
            "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT, "check_same_thread": False},
            "hide_parameters": True,
        }
        if sqlite_path(database_url) is None:
            # In-memory: every connection would get its own empty database.
            options["poolclass"] = StaticPool
        engine = sa.create_engine(url, **options)
        event.listen(engine, "connect", _prepare_sqlite)
        return engine
    raise StoreError(f"unsupported database {backend!r}: use postgresql:// or sqlite:///")


def _prepare_postgresql(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(CREATE_STAGING)
        # Named after this process, so that a watchdog can end this session's transaction
        # if the process is taken for dead while paused in the middle of it.
        cursor.execute("SELECT set_config('application_name', %s, false)", [this_process()])
    dbapi_connection.commit()


_IDLE_SINCE = "durable_sse.idle_since"
"""Where a pooled session's ``info`` keeps when it was last returned to the pool."""


def _ping_when_idle(engine: Engine, idle_after: float = PING_IDLE_AFTER) -> None:
    """Ping a session before its use when it sat unused for ``idle_after`` seconds (a
    server restart, or a network that drops quiet connections, ends such sessions); a
    failed ping makes the pool open a new session instead (SQLAlchemy's
    ``DisconnectionError``)."""

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None or time.monotonic() - idle_since < idle_after:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except psycopg.Error as error:
            raise sa.exc.DisconnectionError(error_summary(error)) from error

    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", checked_out)


def _set_session(dbapi_connection: Any, statement: str) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute(statement)
    dbapi_connection.commit()


def _prepare_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
    finally:
        cursor.close()


def describe_database(url: URL | str) -> str:
    """Where the database is, for error messages: never the password."""
    url = make_url(url) if isinstance(url, str) else url
    if url.get_backend_name() == "postgresql":
        return f"PostgreSQL at {url.host or 'localhost'}:{url.port or 5432}"
    return f"SQLite database {url.database or ':memory:'}"


def error_summary(error: BaseException) -> str:
    """The driver's first message line: no SQL, no parameters (event data), no password."""
    original = getattr(error, "orig", None) or error
    text = str(original).strip()
    return text.splitlines()[0] if text else type(original).__name__


def driver(connection: Connection) -> Any:
    """The psycopg connection under a SQLAlchemy one (COPY and raw statements)."""
    dbapi = connection.connection.driver_connection
    assert dbapi is not None
    return dbapi


async def outlast_cancellation(future: asyncio.Future[T]) -> T:
    """Await work that already runs in a database thread; if the caller is cancelled, let
    the transaction end (commit or roll back) before the cancellation moves on, so it
    never outlives close()."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # The shield no longer looks at the work once it is cancelled: take its error
        # here (the cancellation wins), or asyncio logs it as never retrieved, with a
        # traceback, for every connection a paused worker ends after SIGCONT.
        future.add_done_callback(_take_error)
        await asyncio.wait([future])
        raise


def _take_error(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
