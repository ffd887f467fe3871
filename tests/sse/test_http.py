"""The HTTP policy of an SSE connection, as plain functions."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import h11
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_sse.config.hosts import host_allowed, parse_allowed_hosts
from durable_sse.config.secrets import DeclaredSecrets, parse_secret_bindings, request_secrets
from durable_sse.errors import ConfigError, UnsendableIdError
from durable_sse.ops.logs import install_redaction
from durable_sse.redact import redact_url
from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.sse.decoder import DecodedEvent, SSEDecoder
from durable_sse.sse.request import (
    id_header_problem,
    last_event_id_header,
    request_headers,
    same_origin,
    with_cursor,
    with_query,
)
from durable_sse.sse.response import (
    MAX_RETRY_AFTER,
    StatusPolicy,
    describe_error,
    parse_retry_after,
    status_policy,
    truncation_header,
)

GUARD = 20.0  # seconds: only to turn a hang into a failure, never asserted on


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
    headers = request_headers(cursor="41", cursor_param=None, secret_headers={}, stream="s")
    assert headers["Last-Event-ID"] == b"41"
    assert headers["Accept"] == "text/event-stream"
    headers = request_headers(cursor="41", cursor_param="since", secret_headers={}, stream="s")
    assert "Last-Event-ID" not in headers
    assert with_cursor("http://h/s?a=1&since=3", "since", "41") == "http://h/s?a=1&since=41"
    assert with_cursor("http://h/s", "since", None) == "http://h/s"
    assert with_cursor("http://h/s", None, "41") == "http://h/s"


def test_secret_header_read_from_environment_and_missing_variable_named() -> None:
    resolved = request_secrets(
        declared("TOKEN_VAR@h.example", {"TOKEN_VAR": "Bearer s3cret"}),
        headers_from_env={"Authorization": "TOKEN_VAR"},
        query_from_env={},
        url="https://h.example/s",
        stream="s",
    )
    headers = request_headers(
        cursor=None, cursor_param=None, secret_headers=resolved.headers, stream="s"
    )
    assert headers["Authorization"] == "Bearer s3cret"
    with pytest.raises(ConfigError) as raised:
        request_secrets(
            declared("TOKEN_VAR@h.example", {}),
            headers_from_env={"Authorization": "TOKEN_VAR"},
            query_from_env={},
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
    secrets = request_secrets(
        store, headers_from_env={}, query_from_env={"k": "API_KEY"}, url="http://h/s", stream="s"
    ).query
    url = with_query("http://h/s?cursor=5", secrets)
    assert url == "http://h/s?cursor=5&k=s3cret"
    assert "s3cret" not in redact_url(url, frozenset({"k"}))
    with pytest.raises(ConfigError, match="API_KEY"):
        request_secrets(
            declared("API_KEY@h", {}),
            headers_from_env={},
            query_from_env={"k": "API_KEY"},
            url="http://h/s",
            stream="s",
        )


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


# -- any id goes back to the server, as a browser sends it (issue #13, case 2) -----------

NON_ASCII_IDS = ["café", "日本-7", "😀", "ü\u0085x", "a\x01b\x7f", "in between", "a\tb"]


@pytest.mark.parametrize("event_id", NON_ASCII_IDS)
def test_last_event_id_is_the_ids_utf8_bytes(event_id: str) -> None:
    headers = request_headers(
        cursor=event_id,
        cursor_param=None,
        secret_headers={},
        stream="s",
    )
    assert headers["Last-Event-ID"] == event_id.encode("utf-8")
    assert last_event_id_header(event_id) == event_id.encode("utf-8")


def test_mock_transport_sees_the_utf8_header_and_percent_encoded_query() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        headers = request_headers(
            cursor="café",
            cursor_param=None,
            secret_headers={},
            stream="s",
        )
        client.get("http://sse.test/s", headers=headers)
        url = with_cursor("http://sse.test/s?tok=%FF%2F", "since", "café +&=", stream="s")
        client.get(url)
    assert (b"Last-Event-ID", b"caf\xc3\xa9") in seen[0].headers.raw
    assert seen[1].url.raw_path == b"/s?tok=%FF%2F&since=caf%C3%A9+%2B%26%3D"
    assert seen[1].url.params["since"] == "café +&="
    assert "last-event-id" not in seen[1].headers


async def test_the_bytes_on_the_wire_are_utf8() -> None:
    """A raw socket server records the request head exactly as httpx (h11) wrote it."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            headers = request_headers(
                cursor="café-😀",
                cursor_param=None,
                secret_headers={},
                stream="s",
            )
            await client.get(f"http://127.0.0.1:{port}/s", headers=headers)
            await client.get(with_cursor(f"http://127.0.0.1:{port}/s", "c", "café"))
    finally:
        server.close()
        await server.wait_closed()
    assert b"\r\nLast-Event-ID: caf\xc3\xa9-\xf0\x9f\x98\x80\r\n" in heads[0]
    assert heads[1].startswith(b"GET /s?c=caf%C3%A9 HTTP/1.1\r\n")


async def test_resume_by_a_non_ascii_id_end_to_end_with_the_demo_source() -> None:
    """The source serves ids ``café-<n>``; resuming from ``café-5`` by header and by query
    parameter continues at ``café-6``, and the server echoes the id it resumed after."""
    async with SSESource(seed=1) as source, httpx.AsyncClient(timeout=GUARD) as client:
        source.add_stream("cafe", SourceStreamConfig(rate=500, id_prefix="café-"))
        async with asyncio.timeout(GUARD):
            while source.describe("cafe")["newest"] < 10:
                await asyncio.sleep(0.01)
        by_header = request_headers(
            cursor="café-5",
            cursor_param=None,
            secret_headers={},
            stream="s",
        )
        by_query = with_cursor(source.url("cafe"), "cursor", "café-5", stream="s")
        for url, headers in ((source.url("cafe"), by_header), (by_query, {})):
            decoder = SSEDecoder()
            events: list[DecodedEvent] = []
            async with client.stream("GET", url, headers=headers) as response:
                assert response.status_code == 200
                assert truncation_header(response.headers) == "café-5"
                async for chunk in response.aiter_raw():
                    events += [i for i in decoder.feed(chunk) if isinstance(i, DecodedEvent)]
                    if len(events) >= 3:
                        break
            assert [e.id for e in events[:3]] == ["café-6", "café-7", "café-8"]


@pytest.mark.parametrize(
    ("event_id", "problem"),
    [
        ("a\x00b", "NUL"),
        ("a\nb", "LF"),
        ("a\rb", "CR"),
        ("a\x0bb", "VT"),
        ("a\x0cb", "FF"),
        (" a", "begins with a space"),
        ("a ", "ends with a space"),
        ("\ta", "begins with a tab"),
        ("a\t", "ends with a tab"),
        ("a\ud800", "lone surrogate"),
    ],
)
def test_ids_a_header_cannot_carry_are_refused_clearly(event_id: str, problem: str) -> None:
    assert problem in (id_header_problem(event_id) or "")
    with pytest.raises(UnsendableIdError) as caught:
        request_headers(
            cursor=event_id,
            cursor_param=None,
            secret_headers={},
            stream="orders",
        )
    message = str(caught.value)
    assert "stream 'orders'" in message and problem in message and "'cursor_param'" in message
    # the query parameter carries all of them but the surrogate
    if "surrogate" in problem:
        with pytest.raises(UnsendableIdError, match="lone surrogate"):
            with_cursor("http://h/s", "c", event_id, stream="orders")
    else:
        url = with_cursor("http://h/s", "c", event_id, stream="orders")
        assert httpx.URL(url).params["c"] == event_id


@settings(max_examples=500)
@given(st.text(max_size=12))
def test_id_header_problem_is_exactly_what_h11_refuses(event_id: str) -> None:
    """An id is sendable exactly when h11 (httpx's HTTP/1.1) accepts it as a header."""
    problem = id_header_problem(event_id)
    try:
        value = event_id.encode("utf-8")
    except UnicodeEncodeError:
        assert problem is not None
        return
    try:
        h11.Request(method="GET", target="/", headers=[("Host", "h"), ("Last-Event-ID", value)])
        accepted = True
    except h11.LocalProtocolError:
        accepted = False
    assert (problem is None) is (accepted or value == b"")


def test_empty_cursor_sends_nothing() -> None:
    headers = request_headers(
        cursor="",
        cursor_param=None,
        secret_headers={},
        stream="s",
    )
    assert "Last-Event-ID" not in headers
    assert with_cursor("http://h/s", "c", "") == "http://h/s"


def test_with_query_keeps_other_parameters_byte_for_byte() -> None:
    url = "http://h/s?sig=%FF%2Fx&a=1+2&flag&since=3"
    assert with_query(url, {"since": "4"}) == "http://h/s?sig=%FF%2Fx&a=1+2&flag&since=4"


def test_secret_header_values_are_utf8_or_refused_by_variable_name() -> None:
    resolved = request_secrets(
        declared("NAME_VAR@h", {"NAME_VAR": "zoë"}),
        headers_from_env={"X-Name": "NAME_VAR"},
        query_from_env={},
        url="http://h/s",
        stream="s",
    )
    headers = request_headers(
        cursor=None, cursor_param=None, secret_headers=resolved.headers, stream="s"
    )
    assert headers["X-Name"] == "zoë".encode()
    with pytest.raises(ConfigError) as caught:
        request_secrets(
            declared("TOKEN_VAR@h", {"TOKEN_VAR": "Bearer s3cret\n"}),
            headers_from_env={"Authorization": "TOKEN_VAR"},
            query_from_env={},
            url="http://h/s",
            stream="s",
        )
    assert "TOKEN_VAR" in str(caught.value) and "LF" in str(caught.value)
    assert "s3cret" not in str(caught.value)


# -- the truncation header under both spellings (issue #13, case 10) ---------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([(b"Mercure-Last-Event-ID", b"41")], "41"),
        ([(b"Last-Event-ID", b"41")], "41"),  # older Mercure hubs
        ([(b"last-event-id", b"40"), (b"MERCURE-LAST-EVENT-ID", b"41")], "41"),
        ([(b"Last-Event-ID", "café".encode())], "café"),
        ([(b"Last-Event-ID", b"caf\xe9")], "caf\ufffd"),  # not UTF-8: never equals a cursor
        ([(b"Last-Event-ID", b"")], ""),
        ([(b"Content-Type", b"text/event-stream")], None),
    ],
)
def test_truncation_header(raw: list[tuple[bytes, bytes]], expected: str | None) -> None:
    assert truncation_header(httpx.Headers(raw)) == expected
