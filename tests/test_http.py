"""The HTTP policy of an SSE connection, as plain functions."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from durable_sse.errors import ConfigError
from durable_sse.http import (
    MAX_RETRY_AFTER,
    StatusPolicy,
    describe_error,
    host_allowed,
    parse_allowed_hosts,
    parse_retry_after,
    query_secrets,
    redact_url,
    request_headers,
    same_origin,
    status_policy,
    with_cursor,
    with_query,
)
from durable_sse.logs import install_redaction
from durable_sse.secrets import DeclaredSecrets, parse_secret_bindings

NONE_DECLARED = DeclaredSecrets()


def declared(value: str, environ: dict[str, str]) -> DeclaredSecrets:
    return DeclaredSecrets(parse_secret_bindings(value), environ=environ)


@pytest.mark.parametrize(
    ("code", "policy"),
    [
        (200, StatusPolicy.STREAM),
        (204, StatusPolicy.STOP),
        (301, StatusPolicy.REDIRECT),
        (307, StatusPolicy.REDIRECT),
        (401, StatusPolicy.REFUSED),
        (403, StatusPolicy.REFUSED),
        (404, StatusPolicy.REFUSED),
        (410, StatusPolicy.REFUSED),
        (400, StatusPolicy.REFUSED),
        (408, StatusPolicy.RETRY_LATER),
        (429, StatusPolicy.RETRY_LATER),
        (500, StatusPolicy.RETRY_LATER),
        (503, StatusPolicy.RETRY_LATER),
    ],
)
def test_status_policy(code: int, policy: StatusPolicy) -> None:
    assert status_policy(code) is policy


def test_retry_after_seconds_date_and_cap() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after("Thu, 01 Jan 2026 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("99999", now=now) == MAX_RETRY_AFTER
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after("-5", now=now) is None
    assert parse_retry_after(None) is None


def test_cursor_goes_to_header_or_query() -> None:
    plain = {"headers_from_env": {}, "secrets": NONE_DECLARED, "url": "http://h/s", "stream": "s"}
    headers = request_headers(cursor="41", cursor_param=None, **plain)
    assert headers["Last-Event-ID"] == "41"
    assert headers["Accept"] == "text/event-stream"
    headers = request_headers(cursor="41", cursor_param="since", **plain)
    assert "Last-Event-ID" not in headers
    assert with_cursor("http://h/s?a=1&since=3", "since", "41") == "http://h/s?a=1&since=41"
    assert with_cursor("http://h/s", "since", None) == "http://h/s"
    assert with_cursor("http://h/s", None, "41") == "http://h/s"


def test_secret_header_read_from_environment_and_missing_variable_named() -> None:
    headers = request_headers(
        cursor=None,
        cursor_param=None,
        headers_from_env={"Authorization": "TOKEN_VAR"},
        secrets=declared("TOKEN_VAR@h.example", {"TOKEN_VAR": "Bearer s3cret"}),
        url="https://h.example/s",
        stream="s",
    )
    assert headers["Authorization"] == "Bearer s3cret"
    with pytest.raises(ConfigError) as raised:
        request_headers(
            cursor=None,
            cursor_param=None,
            headers_from_env={"Authorization": "TOKEN_VAR"},
            secrets=declared("TOKEN_VAR@h.example", {}),
            url="https://h.example/s",
            stream="s",
        )
    assert "TOKEN_VAR" in str(raised.value) and "'s'" in str(raised.value)


def test_same_origin() -> None:
    assert same_origin("http://a.example/x", "http://a.example:80/y")
    assert not same_origin("http://a.example/x", "https://a.example/x")
    assert not same_origin("http://a.example/x", "http://b.example/x")
    assert not same_origin("http://a.example:8000/x", "http://a.example:8001/x")


def test_redaction_removes_credentials_and_tokens() -> None:
    url = "https://user:pw@h.example:8443/s?access_token=abc&x=1&api_key=k&sig=zz"
    redacted = redact_url(url)
    for secret in ("pw", "user", "abc", "=k", "zz"):
        assert secret not in redacted
    assert "x=1" in redacted and "h.example:8443" in redacted
    assert "<url>" in describe_error(RuntimeError("failed for https://h/s?token=abc"))


def test_allowlist_matches_hosts_and_subdomains_only() -> None:
    allowed = parse_allowed_hosts("stream.example.com, *.events.example.org")
    assert host_allowed("https://stream.example.com/s", allowed)
    assert host_allowed("https://a.events.example.org/s", allowed)
    assert not host_allowed("https://events.example.org.evil.net/s", allowed)
    assert not host_allowed("https://example.com/s", allowed)
    assert host_allowed("http://anything/s", None)
    assert parse_allowed_hosts("") is None
    with pytest.raises(ConfigError, match="SSE_ALLOWED_HOSTS"):
        parse_allowed_hosts("good.example, bad host")


def test_query_secrets_come_from_the_environment_and_are_redacted() -> None:
    store = declared("API_KEY@h", {"API_KEY": "s3cret"})
    secrets = query_secrets({"k": "API_KEY"}, store, url="http://h/s", stream="s")
    url = with_query("http://h/s?cursor=5", secrets)
    assert url == "http://h/s?cursor=5&k=s3cret"
    assert "s3cret" not in redact_url(url, frozenset({"k"}))
    with pytest.raises(ConfigError, match="API_KEY"):
        query_secrets({"k": "API_KEY"}, declared("API_KEY@h", {}), url="http://h/s", stream="s")


def test_http_library_log_lines_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install_redaction()
    caplog.set_level(logging.INFO, logger="httpx")
    logging.getLogger("httpx").info(
        'HTTP Request: GET %s "HTTP/1.1 200 OK"', "http://user:pw@h:8/s?k=s3cret&cursor=9"
    )
    assert "s3cret" not in caplog.text and "pw@" not in caplog.text
    assert "http://h:8/s?REDACTED" in caplog.text


def test_http_trace_headers_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install_redaction()
    caplog.set_level(logging.DEBUG, logger="httpcore")
    logging.getLogger("httpcore.http11").debug(
        "receive_response_headers.complete return_value=%r",
        [(b"Set-Cookie", b"sid=c00kie"), (b"Location", b"http://o:1/s?k=s3cret")],
    )
    assert "c00kie" not in caplog.text and "s3cret" not in caplog.text
