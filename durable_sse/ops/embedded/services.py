"""The throwaway servers of one run, all under one temporary folder (see the package)."""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from durable_sse.ops.embedded.leftovers import (
    OWNER_FILE,
    TEMP_PREFIX,
    remove_folder,
    stop_leftovers,
    sweep_stale,
)
from durable_sse.ops.embedded.postgres import EmbeddedPostgres
from durable_sse.ops.embedded.redis import EmbeddedRedis


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
                remove_folder(self.root)


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
