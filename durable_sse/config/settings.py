"""Process settings, read from the environment in one place.

Only entry points (the worker, the CLI, the dev stack) call :func:`Settings.from_env`;
everything else receives the values it needs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from durable_sse.config.credentials import CredentialSource, declare_credentials
from durable_sse.config.deployment import DeploymentVersion, parse_deployment
from durable_sse.config.durations import RETENTION_ENV, parse_retention_setting
from durable_sse.config.hosts import parse_allowed_hosts
from durable_sse.config.secrets import SecretBinding, parse_secret_bindings
from durable_sse.config.temporal import PAYLOAD_KEY_ENV, TemporalTarget, load_target
from durable_sse.errors import ConfigError

DEFAULT_TASK_QUEUE = "sse-consumer"
DEFAULT_DATABASE_URL = "sqlite:///.durable-sse/durable-sse.db"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Settings:
    temporal: TemporalTarget = field(default_factory=TemporalTarget)
    """Where Temporal is and how to authenticate: ``TEMPORAL_*`` and temporal.toml, the
    way the ``temporal`` CLI reads them (:mod:`durable_sse.config.temporal`)."""
    task_queue: str = DEFAULT_TASK_QUEUE
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    redis_cursor_ttl_days: float = 7.0
    redis_timeout: float = 0.5
    metrics_port: int | None = None
    allowed_hosts: tuple[str, ...] | None = None
    """``SSE_ALLOWED_HOSTS``: stream URLs must name one of these hosts (None = any)."""
    secrets: tuple[SecretBinding, ...] = ()
    """``SSE_SECRETS``: the variables streams may name as secrets, each bound to hosts.
    Names and hosts only: values stay in the environment until a connection needs them."""
    credentials: tuple[CredentialSource, ...] = ()
    """Where each declared secret's value comes from: the environment, ``NAME_FILE`` or
    ``NAME_TOKEN_URL`` (:mod:`durable_sse.config.credentials`). Paths and URLs, no values."""
    require_encryption: bool = False
    """``DURABLE_SSE_REQUIRE_ENCRYPTION``: refuse to start without a payload key."""
    retention: float | None = None
    """``DURABLE_SSE_RETENTION``: seconds the worker keeps the events of streams that set
    no ``retention`` of their own (None: forever). See :mod:`durable_sse.log.retention`."""
    deployment: DeploymentVersion | None = None
    """``TEMPORAL_DEPLOYMENT_NAME`` and ``TEMPORAL_WORKER_BUILD_ID``: the Worker Deployment
    Version the worker polls as (None: unversioned). See :mod:`durable_sse.config.deployment`."""

    @property
    def temporal_address(self) -> str:
        return self.temporal.address

    @property
    def temporal_namespace(self) -> str:
        return self.temporal.namespace

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, profile: str | None = None
    ) -> Settings:
        """Read and validate settings; a bad value raises :class:`ConfigError` naming it.

        ``profile``: the temporal.toml profile (``--profile``; else ``TEMPORAL_PROFILE``).
        """
        env = dict(os.environ if environ is None else environ)
        # Refused here with the variable's name; then read (stripped) with the profile.
        for name, value in (
            ("TEMPORAL_ADDRESS", _host_port("TEMPORAL_ADDRESS", env.get("TEMPORAL_ADDRESS"))),
            ("TEMPORAL_NAMESPACE", _non_empty("TEMPORAL_NAMESPACE", env.get("TEMPORAL_NAMESPACE"))),
        ):
            if value is not None:
                env[name] = value
        bindings = parse_secret_bindings(env.get("SSE_SECRETS"))
        credentials = declare_credentials((binding.variable for binding in bindings), env)
        settings = cls(
            temporal=load_target(env, profile=profile),
            task_queue=_non_empty("SSE_TASK_QUEUE", env.get("SSE_TASK_QUEUE"))
            or DEFAULT_TASK_QUEUE,
            database_url=_database_url(env.get("DATABASE_URL")) or DEFAULT_DATABASE_URL,
            redis_url=_redis_url(env.get("REDIS_URL")) or DEFAULT_REDIS_URL,
            redis_cursor_ttl_days=_positive_float(
                "REDIS_CURSOR_TTL_DAYS", env.get("REDIS_CURSOR_TTL_DAYS"), 7.0
            ),
            redis_timeout=_positive_float("REDIS_TIMEOUT", env.get("REDIS_TIMEOUT"), 0.5),
            metrics_port=_port("SSE_METRICS_PORT", env.get("SSE_METRICS_PORT")),
            allowed_hosts=parse_allowed_hosts(env.get("SSE_ALLOWED_HOSTS")),
            secrets=bindings,
            credentials=tuple(credentials.values()),
            require_encryption=_flag(
                "DURABLE_SSE_REQUIRE_ENCRYPTION", env.get("DURABLE_SSE_REQUIRE_ENCRYPTION")
            ),
            retention=parse_retention_setting(env.get(RETENTION_ENV)),
            deployment=parse_deployment(env),
        )
        if settings.require_encryption and not (env.get(PAYLOAD_KEY_ENV) or "").strip():
            # Checked here, before any client exists: a deployment that lost its key must
            # not come up and accept (or write) plaintext payloads.
            raise ConfigError(
                f"DURABLE_SSE_REQUIRE_ENCRYPTION is on but {PAYLOAD_KEY_ENV} is not set: "
                "refusing to start without payload encryption"
            )
        return settings


def database_url_from_env(environ: Mapping[str, str] | None = None) -> str:
    """``DATABASE_URL`` alone, validated like :meth:`Settings.from_env` does (for the
    commands that need only the database: ``tail``, ``consumers``)."""
    env = os.environ if environ is None else environ
    return _database_url(env.get("DATABASE_URL")) or DEFAULT_DATABASE_URL


def sqlite_path(database_url: str) -> Path | None:
    """The file behind a ``sqlite:///`` URL (None for other databases or in-memory)."""
    if not database_url.startswith("sqlite:///"):
        return None
    path = database_url.removeprefix("sqlite:///")
    return None if path in ("", ":memory:") else Path(path)


def _non_empty(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{name} is set but empty")
    return value.strip()


def _host_port(name: str, value: str | None) -> str | None:
    value = _non_empty(name, value)
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{name} must be host:port, got {value!r}")
    return value


def _database_url(value: str | None) -> str | None:
    value = _non_empty("DATABASE_URL", value)
    if value is None:
        return None
    scheme = urlsplit(value).scheme
    if scheme.startswith("postgres"):
        # Normalise every PostgreSQL spelling to the psycopg 3 driver.
        rest = value.split("://", 1)[1]
        return f"postgresql+psycopg://{rest}"
    if scheme in ("sqlite", "sqlite+pysqlite"):
        return value
    raise ConfigError(
        f"DATABASE_URL must be a postgresql:// or sqlite:/// URL, got scheme {scheme!r}"
    )


def _redis_url(value: str | None) -> str | None:
    value = _non_empty("REDIS_URL", value)
    if value is None:
        return None
    scheme = urlsplit(value).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(f"REDIS_URL must be a redis://, rediss:// or unix:// URL, got {scheme!r}")
    return value


def _positive_float(name: str, value: str | None, default: float) -> float:
    if value is None or not value.strip():
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not number > 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    return number


def _flag(name: str, value: str | None) -> bool:
    if value is None or not value.strip():
        return False
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


def _port(name: str, value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    if not value.strip().isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(f"{name} must be a TCP port (1-65535), got {value!r}")
    return int(value)
