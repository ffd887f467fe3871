"""Declared secrets: a stream's variable names resolve only to declared secrets, only
for the hosts they are bound to; every refusal names the variable and the host, never a
value (plain unit tests; the worker path is in test_security.py)."""

from __future__ import annotations

import pytest

from durable_sse.config.secrets import (
    DeclaredSecrets,
    SecretBinding,
    is_worker_variable,
    parse_secret_bindings,
)
from durable_sse.errors import ConfigError

ENVIRON = {
    "API_TOKEN": "tok-value-1",
    "OTHER": "other-value-2",
    "UNDECLARED": "undeclared-value-3",
    "DATABASE_URL": "postgresql://u:db-password-4@db/sse",
    "DURABLE_SSE_PAYLOAD_KEY": "key-value-5",
}
VALUES = list(ENVIRON.values())


def store(declared: str = "API_TOKEN@events.example.com,OTHER@*.example.org") -> DeclaredSecrets:
    return DeclaredSecrets(parse_secret_bindings(declared), environ=ENVIRON)


def refusal(names: dict[str, str], url: str, secrets: DeclaredSecrets | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        (secrets or store()).resolve(names, url=url, stream="s1", setting="headers_from_env")
    message = str(caught.value)
    assert "'s1'" in message and "headers_from_env" in message and "nothing was sent" in message
    assert not any(value in message for value in VALUES), message
    return message


def test_a_declared_secret_resolves_for_its_host_and_subdomains_only() -> None:
    secrets = store()
    names = {"Authorization": "API_TOKEN"}
    url = "https://events.example.com/s"
    resolved = secrets.resolve(names, url=url, stream="s1", setting="headers_from_env")
    assert resolved == {"Authorization": "tok-value-1"}
    upper = secrets.resolve(
        names, url="https://EVENTS.example.com:8443/s", stream="s1", setting="x"
    )
    assert upper == resolved
    for url in ("https://a.example.org/s", "https://b.a.example.org/s"):
        other = secrets.resolve({"k": "OTHER"}, url=url, stream="s1", setting="query_from_env")
        assert other == {"k": "other-value-2"}


@pytest.mark.parametrize(
    ("names", "url", "fragments"),
    [
        # bound to another host: exact hosts are exact, *.domain is subdomains only
        ({"A": "API_TOKEN"}, "https://evil.example/s", ["API_TOKEN", "evil.example"]),
        ({"A": "API_TOKEN"}, "https://x.events.example.com/s", ["x.events.example.com"]),
        ({"A": "OTHER"}, "https://example.org/s", ["OTHER", "*.example.org", "example.org"]),
        ({"A": "OTHER"}, "https://example.org.evil.net/s", ["example.org.evil.net"]),
        ({"A": "OTHER"}, "https://a.example.org./s", ["a.example.org."]),
        # userinfo does not fool the host check
        ({"A": "API_TOKEN"}, "https://events.example.com@evil.example/s", ["evil.example"]),
        # not declared, though set
        ({"A": "UNDECLARED"}, "https://events.example.com/s", ["UNDECLARED", "SSE_SECRETS"]),
        # the worker's own configuration, never
        ({"k": "DATABASE_URL"}, "https://events.example.com/s", ["DATABASE_URL", "own config"]),
        ({"X": "DURABLE_SSE_PAYLOAD_KEY"}, "https://e.example/s", ["DURABLE_SSE_PAYLOAD_KEY"]),
    ],
)
def test_refusals_name_the_variable_and_the_host(
    names: dict[str, str], url: str, fragments: list[str]
) -> None:
    message = refusal(names, url)
    for fragment in fragments:
        assert fragment in message, message


def test_a_worker_variable_is_refused_even_when_declared() -> None:
    declared = DeclaredSecrets(
        (SecretBinding("DATABASE_URL", "events.example.com"),), environ=ENVIRON
    )
    message = refusal({"k": "DATABASE_URL"}, "https://events.example.com/s", declared)
    assert "own configuration" in message


def test_a_declared_but_unset_variable_is_named_and_reported_at_start() -> None:
    secrets = store("API_TOKEN@events.example.com,MISSING@events.example.com")
    message = refusal({"A": "MISSING"}, "https://events.example.com/s", secrets)
    assert "MISSING" in message and "not set" in message
    assert secrets.unset() == ["MISSING"]


def test_one_refusal_refuses_the_whole_request() -> None:
    refusal({"A": "API_TOKEN", "B": "UNDECLARED"}, "https://events.example.com/s")


def test_nothing_declared_refuses_every_name_and_allows_none() -> None:
    empty = DeclaredSecrets(environ=ENVIRON)
    assert empty.resolve({}, url="https://x/s", stream="s1", setting="headers_from_env") == {}
    refusal({"A": "API_TOKEN"}, "https://events.example.com/s", empty)


def test_a_name_may_be_bound_to_several_hosts() -> None:
    secrets = store("API_TOKEN@a.example,API_TOKEN@b.example")
    for host in ("a.example", "b.example"):
        resolved = secrets.resolve(
            {"A": "API_TOKEN"}, url=f"https://{host}/s", stream="s1", setting="x"
        )
        assert resolved == {"A": "tok-value-1"}
    assert "a.example, b.example" in refusal({"A": "API_TOKEN"}, "https://c.example/s", secrets)


def test_ip_hosts() -> None:
    secrets = store("API_TOKEN@127.0.0.1,OTHER@[::1]")
    assert secrets.resolve({"A": "API_TOKEN"}, url="http://127.0.0.1:8/s", stream="s", setting="x")
    assert secrets.resolve({"A": "OTHER"}, url="http://[::1]:8/s", stream="s", setting="x")
    refusal({"A": "API_TOKEN"}, "http://localhost:8/s", secrets)


def test_worker_variables() -> None:
    for name in (
        "DATABASE_URL",
        "REDIS_URL",
        "REDIS_TIMEOUT",
        "TEMPORAL_ADDRESS",
        "DURABLE_SSE_PAYLOAD_KEY",
        "DURABLE_SSE_CODEC_TOKEN",
        "SSE_ALLOWED_HOSTS",
        "PGPASSWORD",
        "POSTGRES_PASSWORD",
    ):
        assert is_worker_variable(name), name
    for name in ("API_TOKEN", "DATABASE_TOKEN", "MY_SSE_TOKEN"):
        assert not is_worker_variable(name), name
