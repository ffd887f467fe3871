"""Wake a consumer when its streams may have something new.

PostgreSQL: the writer's group transaction queues one ``NOTIFY`` per stream it wrote
(``Writer._order_and_notify``; delivered on commit, never for a rollback). A consumer
process keeps one ``LISTEN`` connection, shared by every consumer in it (psycopg's own
async notifications, no polling), and marks the stream named in each payload.
Notifications are not durable: one sent while the connection was down is gone. So after
every (re)``LISTEN`` every stream is read once (the catch-up), and a slow poll marks every
stream now and then (a safety net for anything else that was missed, e.g. a transaction
that wrote rows without going through the writer). A ``SELECT 1`` as often proves the
connection alive: a connection that died silently (a network partition) would never
raise.

SQLite: no notifications between processes, so a poll; but one that costs nothing when
idle. ``PRAGMA data_version`` changes when another connection commits, and reading it
touches no table: only when it changed does the poller ask which streams got rows after
the newest ``seq`` it saw (a rowid range, so an index-free, instant read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from durable_sse.config.settings import sqlite_path
from durable_sse.log.schema import EVENTS_CHANNEL, EVENTS_TABLE

logger = logging.getLogger(__name__)

RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Seconds between attempts to listen again (the last one repeats)."""
SQLITE_CHECK_INTERVAL = 0.02
"""Seconds between two ``PRAGMA data_version`` reads (each a few microseconds)."""

OnStream = Callable[[str], None]
OnAll = Callable[[], None]


class Wakeups:
    """Calls ``on_stream(name)`` when a stream may have news, ``on_all()`` when any may."""

    def __init__(self, on_stream: OnStream, on_all: OnAll, *, poll_interval: float) -> None:
        self._on_stream = on_stream
        self._on_all = on_all
        self.poll_interval = poll_interval
        self.listening = asyncio.Event()
        """Set while notifications arrive (PostgreSQL) or the poller runs (SQLite)."""
        self.listens = 0
        """(Re)connections so far: a test sees the listener come back."""
        self.notifications = 0

    async def run(self, stop: asyncio.Event) -> None:
        raise NotImplementedError


def wakeups_for(
    database_url: str, on_stream: OnStream, on_all: OnAll, *, poll_interval: float
) -> Wakeups:
    url = make_url(database_url)
    if url.get_backend_name() == "postgresql":
        conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        return Subscription(conninfo, on_stream, on_all, poll_interval=poll_interval)
    return SqlitePoller(sqlite_path(database_url), on_stream, on_all, poll_interval=poll_interval)


class Subscription(Wakeups):
    """One consumer's share of its process's ``LISTEN`` connection.

    Every consumer (and ``tail``) of one database in one event loop shares a single
    :class:`PostgresListener`: one connection per process however many groups it runs.
    The listener starts with its first subscriber and ends with its last; each
    subscriber keeps its own slow poll.
    """

    def __init__(
        self, conninfo: str, on_stream: OnStream, on_all: OnAll, *, poll_interval: float
    ) -> None:
        super().__init__(on_stream, on_all, poll_interval=poll_interval)
        self._conninfo = conninfo
        self._listener: PostgresListener | None = None

    def _attach(self) -> PostgresListener:
        if self._listener is None:
            self._listener = PostgresListener.shared(self._conninfo)
            self._listener.subscribe(self)
        return self._listener

    @property
    def listening(self) -> asyncio.Event:
        """The shared connection's: set while it listens (needs a running loop)."""
        return self._attach().listening

    @listening.setter
    def listening(self, value: asyncio.Event) -> None:
        pass  # the shared listener's event stands

    @property
    def listens(self) -> int:
        return 0 if self._listener is None else self._listener.listens

    @listens.setter
    def listens(self, value: int) -> None:
        pass  # the shared listener counts

    @property
    def backend_pid(self) -> int | None:
        return None if self._listener is None else self._listener.backend_pid

    async def run(self, stop: asyncio.Event) -> None:
        listener = self._attach()
        listener.ensure_running(self.poll_interval)
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval)
                if not stop.is_set():
                    self._on_all()  # the safety net
        finally:
            listener.unsubscribe(self)
            self._listener = None


class PostgresListener:
    """One ``LISTEN`` connection (see the module docstring), shared per event loop and
    database by :class:`Subscription` s."""

    _shared: dict[tuple[int, str], PostgresListener] = {}

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._subscribers: list[Subscription] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._check_interval = 30.0
        self.listening = asyncio.Event()
        self.listens = 0
        self.notifications = 0
        self.backend_pid: int | None = None
        """The listening connection's server process (tests terminate it)."""

    @classmethod
    def shared(cls, conninfo: str) -> PostgresListener:
        key = (id(asyncio.get_running_loop()), conninfo)
        listener = cls._shared.get(key)
        if listener is None:
            listener = cls._shared[key] = cls(conninfo)
        return listener

    def subscribe(self, subscriber: Subscription) -> None:
        self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscription) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(subscriber)
        if not self._subscribers:
            self._stop.set()
            for key, listener in list(self._shared.items()):
                if listener is self:
                    del self._shared[key]

    def ensure_running(self, poll_interval: float) -> None:
        self._check_interval = min(self._check_interval, poll_interval)
        if self._task is None or self._task.done():
            self._stop.clear()
            self._task = asyncio.create_task(self.run(self._stop))

    def _on_stream(self, stream: str) -> None:
        for subscriber in list(self._subscribers):
            subscriber._on_stream(stream)

    def _on_all(self) -> None:
        for subscriber in list(self._subscribers):
            subscriber._on_all()

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                await self._listen(stop)
                return
            except (psycopg.Error, OSError) as error:
                self.listening.clear()
                delay = RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)]
                failures += 1
                logger.warning(
                    "consumer wake-ups: the LISTEN connection failed (%s); listening again "
                    "in %.1f s, and reading every stream then",
                    str(error).strip().splitlines()[0] if str(error).strip() else error,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _listen(self, stop: asyncio.Event) -> None:
        connection = await psycopg.AsyncConnection.connect(
            self._conninfo, autocommit=True, connect_timeout=5
        )
        try:
            await connection.execute(f"LISTEN {EVENTS_CHANNEL}")
            self.backend_pid = connection.info.backend_pid
            self.listens += 1
            self.listening.set()
            self._on_all()  # the catch-up: what was committed while nobody listened
            checked = time.monotonic()
            while not stop.is_set():
                async for notify in connection.notifies(timeout=0.5):
                    self.notifications += 1
                    self._on_stream(notify.payload)
                if time.monotonic() - checked >= self._check_interval:
                    checked = time.monotonic()
                    await connection.execute("SELECT 1")  # alive? raises if not
        finally:
            self.listening.clear()
            with contextlib.suppress(Exception):
                await connection.close()


class SqlitePoller(Wakeups):
    """``PRAGMA data_version`` polling (see the module docstring)."""

    def __init__(
        self, path: Path | None, on_stream: OnStream, on_all: OnAll, *, poll_interval: float
    ) -> None:
        super().__init__(on_stream, on_all, poll_interval=poll_interval)
        self._path = path
        self.checks = 0
        self.queries = 0
        """Reads of ``sse_events`` the poller made (only after a change)."""

    async def run(self, stop: asyncio.Event) -> None:
        if self._path is None:  # in-memory: one connection, nobody else writes
            self.listening.set()
            while not stop.is_set():
                self._on_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval)
            return
        # One thread owns the connection: every call on it, its closing included, runs
        # there in turn (closing it under a query still running would crash the process).
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sse-poll")
        loop = asyncio.get_running_loop()

        def call(function: Callable[..., Any], *args: Any) -> Any:
            return loop.run_in_executor(executor, function, *args)

        connection = await call(self._open)
        try:
            newest = await call(self._newest_seq, connection)
            version = await call(self._data_version, connection)
            self.listens += 1
            self.listening.set()
            self._on_all()
            polled = time.monotonic()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SQLITE_CHECK_INTERVAL)
                self.checks += 1
                current = await call(self._data_version, connection)
                if current != version:
                    version = current
                    streams, newest = await call(self._streams_after, connection, newest)
                    for stream in streams:
                        self._on_stream(stream)
                if time.monotonic() - polled >= self.poll_interval:
                    polled = time.monotonic()
                    self._on_all()
        finally:
            self.listening.clear()
            executor.submit(connection.close)
            executor.shutdown(wait=False)

    def _open(self) -> sqlite3.Connection:
        assert self._path is not None
        connection = sqlite3.connect(self._path, timeout=30, check_same_thread=False)
        connection.isolation_level = None  # autocommit: each read sees the newest commit
        return connection

    @staticmethod
    def _data_version(connection: sqlite3.Connection) -> int:
        return int(connection.execute("PRAGMA data_version").fetchone()[0])

    @staticmethod
    def _newest_seq(connection: sqlite3.Connection) -> int:
        row = connection.execute(f"SELECT max(seq) FROM {EVENTS_TABLE}").fetchone()
        return int(row[0] or 0)

    def _streams_after(self, connection: sqlite3.Connection, newest: int) -> tuple[list[str], int]:
        self.queries += 1
        rows = connection.execute(
            f"SELECT stream, max(seq) FROM {EVENTS_TABLE} WHERE seq > ? GROUP BY stream",
            (newest,),
        ).fetchall()
        top = max((int(seq) for _, seq in rows), default=newest)
        return [stream for stream, _ in rows], top
