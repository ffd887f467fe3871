"""PostgreSQL and Redis for the test session: the machine's, or throwaway ones from wheels.

A pytest plugin (``pytest_plugins`` in tests/conftest.py). At session start it decides, per
service, where the tests' stores are:

* ``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` set: that one;
* unset, and the default address answers (``DEFAULT_PG_URL``, ``DEFAULT_REDIS_URL``): it;
* unset and nothing answers: a throwaway server (durable_sse.ops.embedded) for the session;
* ``DURABLE_SSE_EMBEDDED_SERVICES=1``: throwaway servers for both, whatever answers.

The chosen URLs are exported as ``TEST_DATABASE_URL`` / ``TEST_REDIS_URL`` before any
fixture runs, so the ``pg_url`` / ``redis_url`` fixtures and every process the tests
start (workers in the e2e and chaos tests) use them. The same tests run either way; none
is skipped. The throwaway servers are stopped and their folder removed when the session
ends, however it ends (failures, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from durable_sse.errors import DurableSSEError
from durable_sse.ops.binaries import redis_command
from durable_sse.ops.embedded.postgres import EmbeddedPostgres
from durable_sse.ops.embedded.services import EmbeddedServices, start_services
from tests.conftest import DEFAULT_PG_URL, DEFAULT_REDIS_URL

EMBEDDED_FLAG = "DURABLE_SSE_EMBEDDED_SERVICES"

_services: EmbeddedServices | None = None
_saved_env: dict[str, str | None] = {}
_saved_sigterm: object = None


def postgres_answers(url: str) -> bool:
    try:
        with psycopg.connect(url.replace("+psycopg", ""), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def redis_answers(url: str) -> bool:
    client = redis.Redis.from_url(
        url, socket_connect_timeout=3, socket_timeout=3, retry=Retry(NoBackoff(), 0)
    )
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def embedded_requested(env: Mapping[str, str]) -> bool:
    return env.get(EMBEDDED_FLAG, "").strip().lower() in ("1", "true", "yes")


def services_to_embed(
    env: Mapping[str, str],
    *,
    pg_answers: Callable[[str], bool] = postgres_answers,
    redis_answers: Callable[[str], bool] = redis_answers,
) -> tuple[bool, bool]:
    """Whether to start a throwaway (PostgreSQL, Redis) for this session."""
    if embedded_requested(env):
        return True, True
    postgres = not env.get("TEST_DATABASE_URL") and not pg_answers(DEFAULT_PG_URL)
    redis_ = not env.get("TEST_REDIS_URL") and not redis_answers(DEFAULT_REDIS_URL)
    return postgres, redis_


def embedded_postgres() -> EmbeddedPostgres | None:
    """The session's throwaway PostgreSQL, if the tests run on one (chaos scenario 8)."""
    return _services.postgres if _services is not None else None


def _export(name: str, value: str) -> None:
    _saved_env.setdefault(name, os.environ.get(name))
    os.environ[name] = value


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI timeout, ``kill``) ends the session like Ctrl-C: fixtures torn down,
    throwaway servers stopped."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _services, _saved_sigterm
    postgres, redis_ = services_to_embed(os.environ)
    if not (postgres or redis_):
        return
    started = time.monotonic()
    try:
        _services = start_services(postgres=postgres, redis=redis_)
    except DurableSSEError as error:
        pytest.exit(f"cannot start the embedded test services: {error}", returncode=3)
    _saved_sigterm = signal.signal(signal.SIGTERM, _interrupt)
    parts = []
    if _services.postgres is not None:
        _export("TEST_DATABASE_URL", _services.postgres.url)
        parts.append(f"PostgreSQL {_services.postgres.url}")
    if _services.redis is not None:
        _export("TEST_REDIS_URL", _services.redis.url)
        parts.append(f"Redis {_services.redis.url}")
    why = f"{EMBEDDED_FLAG}=1" if embedded_requested(os.environ) else "nothing answered"
    line = (
        f"embedded {' and '.join(parts)} ({why}) started in "
        f"{time.monotonic() - started:.1f} s in {_services.root}"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture is torn down (the runner's own sessionfinish), stop the servers."""
    global _services, _saved_sigterm
    if _services is None:
        return
    try:
        _services.close()
    finally:
        _services = None
        for name, value in _saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _saved_env.clear()
        signal.signal(signal.SIGTERM, _saved_sigterm)  # type: ignore[arg-type]
        _saved_sigterm = None


def throwaway_redis(binary: str | Path, port: int, directory: Path) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:``port`` that persists nothing (it comes back empty)."""
    return subprocess.Popen(
        redis_command(port, directory, binary=binary),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
