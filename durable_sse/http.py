"""HTTP decisions for an SSE connection: request headers, status policy, redaction.

Plain functions, so the policy in DESIGN.md ("What the server may send") is unit-tested
without a server. Nothing here performs I/O.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from durable_sse.errors import ConfigError

if TYPE_CHECKING:
    from durable_sse.secrets import DeclaredSecrets

MAX_RETRY_AFTER = 300.0
"""A server cannot make us wait longer than this per Retry-After (seconds)."""

_TOKENISH = re.compile(r"(token|key|secret|password|passwd|auth|signature|sig|session|jwt)", re.I)


class StatusPolicy(StrEnum):
    STREAM = "stream"
    STOP = "stop"
    """204: the server asks the client to stop reconnecting."""
    RETRY_LATER = "retry_later"
    REFUSED = "refused"
    """Retrying cannot help until someone changes something: park the stream."""
    REDIRECT = "redirect"


def status_policy(status_code: int) -> StatusPolicy:
    if status_code == 200:
        return StatusPolicy.STREAM
    if status_code == 204:
        return StatusPolicy.STOP
    if status_code in (301, 302, 303, 307, 308):
        return StatusPolicy.REDIRECT
    if status_code in (408, 425, 429) or status_code >= 500:
        return StatusPolicy.RETRY_LATER
    return StatusPolicy.REFUSED


REFUSAL_HINTS = {
    401: "the server wants credentials: check headers_from_env and the token on the worker",
    403: "the server refuses these credentials",
    404: "no stream at this URL",
    410: "the stream is gone",
}


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date), capped."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(delta, 0.0), MAX_RETRY_AFTER)


def with_cursor(url: str, cursor_param: str | None, cursor: str | None) -> str:
    """The URL to request: the cursor goes into ``cursor_param`` when the stream uses one."""
    if cursor_param is None or cursor is None:
        return url
    return with_query(url, {cursor_param: cursor})


def with_query(url: str, values: Mapping[str, str]) -> str:
    """``url`` with ``values`` set as query parameters (replacing any of the same name)."""
    if not values:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in values]
    query.extend(values.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def query_secrets(
    query_from_env: Mapping[str, str], secrets: DeclaredSecrets, *, url: str, stream: str
) -> dict[str, str]:
    """Query parameters whose values are secrets the worker declares for ``url``'s host."""
    return secrets.resolve(query_from_env, url=url, stream=stream, setting="query_from_env")


def parse_allowed_hosts(value: str | None) -> tuple[str, ...] | None:
    """``SSE_ALLOWED_HOSTS``: comma-separated hosts, ``*.example.com`` for subdomains."""
    if value is None or not value.strip():
        return None
    hosts = tuple(host.strip().lower() for host in value.split(",") if host.strip())
    for host in hosts:
        if not re.fullmatch(r"(\*\.)?[a-z0-9.:\[\]-]+", host):
            raise ConfigError(f"SSE_ALLOWED_HOSTS: {host!r} is not a host name or *.domain")
    return hosts


def host_allowed(url: str, allowed: tuple[str, ...] | None) -> bool:
    """Whether ``url``'s host is in the allowlist (no allowlist: every host)."""
    if allowed is None:
        return True
    host = (urlsplit(url).hostname or "").lower()
    for pattern in allowed:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


def request_headers(
    *,
    cursor: str | None,
    cursor_param: str | None,
    headers_from_env: Mapping[str, str],
    secrets: DeclaredSecrets,
    url: str,
    stream: str,
) -> dict[str, str]:
    """Headers for one connection to ``url``; secrets are resolved here, inside the worker,
    for that URL's host only."""
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if cursor is not None and cursor_param is None:
        headers["Last-Event-ID"] = cursor
    headers.update(
        secrets.resolve(headers_from_env, url=url, stream=stream, setting="headers_from_env")
    )
    return headers


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port or _default_port(pa.scheme)) == (
        pb.scheme,
        pb.hostname,
        pb.port or _default_port(pb.scheme),
    )


def _default_port(scheme: str) -> int | None:
    return {"http": 80, "https": 443}.get(scheme)


def redact_url(url: str, secret_params: frozenset[str] = frozenset()) -> str:
    """The URL with credentials and token-like query values removed: safe for logs and UI.

    ``secret_params`` names further parameters to hide (a stream's ``query_from_env``).
    """
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    query = [
        (k, "REDACTED" if k in secret_params or _TOKENISH.search(k) else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of a network error."""
    text = str(error).strip()
    # httpx messages may embed the request URL; drop anything that looks like one.
    text = re.sub(r"https?://\S+", "<url>", text)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
