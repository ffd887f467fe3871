"""Process settings from the environment: good values parse, bad ones name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_sse.config.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    Settings,
    sqlite_path,
)
from durable_sse.errors import ConfigError


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings.temporal_address == "localhost:7233"
    assert settings.temporal_namespace == "default"
    assert settings.task_queue == "sse-consumer"
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.redis_url == DEFAULT_REDIS_URL
    assert settings.metrics_port is None


def test_good_values() -> None:
    settings = Settings.from_env(
        {
            "TEMPORAL_ADDRESS": "temporal:7233",
            "TEMPORAL_NAMESPACE": " sse ",
            "SSE_TASK_QUEUE": "sse-q",
            "DATABASE_URL": "postgres://sse:pw@db:5432/sse",
            "REDIS_URL": "rediss://cache:6380/1",
            "REDIS_CURSOR_TTL_DAYS": "2.5",
            "REDIS_TIMEOUT": "0.25",
            "SSE_METRICS_PORT": "9100",
        }
    )
    assert settings.temporal_address == "temporal:7233"
    assert settings.temporal_namespace == "sse"
    assert settings.task_queue == "sse-q"
    assert settings.database_url == "postgresql+psycopg://sse:pw@db:5432/sse"
    assert settings.redis_url == "rediss://cache:6380/1"
    assert (settings.redis_cursor_ttl_days, settings.redis_timeout) == (2.5, 0.25)
    assert settings.metrics_port == 9100


@pytest.mark.parametrize(
    "url",
    ["postgresql://u@h/db", "postgresql+psycopg2://u@h/db", "postgres://u@h/db"],
)
def test_every_postgresql_spelling_uses_psycopg3(url: str) -> None:
    assert Settings.from_env({"DATABASE_URL": url}).database_url == "postgresql+psycopg://u@h/db"


def test_sqlite_url_is_kept() -> None:
    url = "sqlite:////var/lib/sse/events.db"
    assert Settings.from_env({"DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("TEMPORAL_ADDRESS", "temporal", "TEMPORAL_ADDRESS must be host:port"),
        ("TEMPORAL_ADDRESS", "temporal:0", "TEMPORAL_ADDRESS must be host:port"),
        ("TEMPORAL_ADDRESS", ":7233", "TEMPORAL_ADDRESS must be host:port"),
        ("TEMPORAL_NAMESPACE", "   ", "TEMPORAL_NAMESPACE is set but empty"),
        ("SSE_TASK_QUEUE", "", "SSE_TASK_QUEUE is set but empty"),
        ("DATABASE_URL", "mysql://root@db/sse", "DATABASE_URL must be a postgresql"),
        ("REDIS_URL", "http://cache:6379", "REDIS_URL must be a redis://"),
        ("REDIS_CURSOR_TTL_DAYS", "a week", "REDIS_CURSOR_TTL_DAYS must be a number"),
        ("REDIS_TIMEOUT", "0", "REDIS_TIMEOUT must be positive"),
        ("REDIS_TIMEOUT", "-1", "REDIS_TIMEOUT must be positive"),
        ("SSE_METRICS_PORT", "70000", "SSE_METRICS_PORT must be a TCP port"),
        ("SSE_METRICS_PORT", "http", "SSE_METRICS_PORT must be a TCP port"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: value})
    assert fragment in str(caught.value)


def test_sqlite_path() -> None:
    assert sqlite_path("sqlite:///relative/events.db") == Path("relative/events.db")
    assert sqlite_path("sqlite:////abs/events.db") == Path("/abs/events.db")
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("postgresql+psycopg://u@h/db") is None


def test_secrets_are_declared_by_name_and_host() -> None:
    settings = Settings.from_env(
        {"SSE_SECRETS": " API_TOKEN@Events.Example.com, OTHER@*.example.org,API_TOKEN@[::1] "}
    )
    assert [str(binding) for binding in settings.secrets] == [
        "API_TOKEN@events.example.com",
        "OTHER@*.example.org",
        "API_TOKEN@[::1]",  # bracketed, as written: a port may follow (NAME@[::1]:8443)
    ]
    assert Settings.from_env({}).secrets == ()


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("API_TOKEN", "is not NAME@host"),
        ("API_TOKEN@", "is not NAME@host"),
        ("API_TOKEN@*", "is not NAME@host"),
        ("API_TOKEN@*.*.example.org", "is not NAME@host"),
        ("API TOKEN@h.example", "is not NAME@host"),
        ("API_TOKEN@h.example/path", "is not NAME@host"),
        ("DATABASE_URL@h.example", "worker's own configuration"),
        ("DURABLE_SSE_PAYLOAD_KEY@h.example", "worker's own configuration"),
        ("TEMPORAL_TLS_KEY@h.example", "worker's own configuration"),
        ("REDIS_URL@h.example", "worker's own configuration"),
        ("SSE_SECRETS@h.example", "worker's own configuration"),
        ("PGPASSWORD@h.example", "worker's own configuration"),
    ],
)
def test_bad_or_forbidden_secret_declarations_are_refused(value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"SSE_SECRETS": value})
    assert "SSE_SECRETS" in str(caught.value) and fragment in str(caught.value)


def test_required_encryption_refuses_to_start_without_a_key() -> None:
    for on in ("1", "true", "yes"):
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({"DURABLE_SSE_REQUIRE_ENCRYPTION": on})
        assert "DURABLE_SSE_PAYLOAD_KEY" in str(caught.value)
        with pytest.raises(ConfigError):
            Settings.from_env(
                {"DURABLE_SSE_REQUIRE_ENCRYPTION": on, "DURABLE_SSE_PAYLOAD_KEY": " "}
            )
        settings = Settings.from_env(
            {"DURABLE_SSE_REQUIRE_ENCRYPTION": on, "DURABLE_SSE_PAYLOAD_KEY": "k" * 64}
        )
        assert settings.require_encryption
    assert not Settings.from_env({"DURABLE_SSE_REQUIRE_ENCRYPTION": "0"}).require_encryption
    with pytest.raises(ConfigError, match="DURABLE_SSE_REQUIRE_ENCRYPTION must be"):
        Settings.from_env({"DURABLE_SSE_REQUIRE_ENCRYPTION": "maybe"})
