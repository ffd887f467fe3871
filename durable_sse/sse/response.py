"""What a connection makes of the server's answer: status policy, ``Retry-After``, the
truncation header, and secret-free error descriptions.

Plain functions, so the response side of DESIGN.md ("What the server may send, and what
it gets") is unit-tested without a server. Nothing here performs I/O.
"""

from __future__ import annotations

import email.utils
import re
from datetime import UTC, datetime
from enum import StrEnum

import httpx

MAX_RETRY_AFTER = 300.0
"""A server cannot make us wait longer than this per Retry-After (seconds)."""


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


_INVALID_TOKEN = re.compile(r'(?:^|[\s,])error\s*=\s*"?invalid_token"?', re.IGNORECASE)


def is_auth_failure(status_code: int, www_authenticate: str | None = None) -> bool:
    """Whether the server refused the credentials sent (not the client): ``401``, or a
    ``403`` whose ``WWW-Authenticate`` says ``error="invalid_token"`` (RFC 6750 section
    3.1; some servers answer an expired bearer token so). Such a refusal is worth one
    retry with credentials read or minted again (:mod:`durable_sse.config.credentials`)."""
    if status_code == 401:
        return True
    return status_code == 403 and bool(_INVALID_TOKEN.search(www_authenticate or ""))


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


def truncation_header(headers: httpx.Headers) -> str | None:
    """The id a Mercure hub says it resumed after, or None when it did not say.

    Current hubs send ``Mercure-Last-Event-ID``; older ones send ``Last-Event-ID`` on the
    response. The first is preferred when both are present. The value is read as UTF-8
    (an undecodable byte becomes U+FFFD, so it can never equal a cursor by accident).
    """
    found: dict[bytes, bytes] = {}
    for name, value in headers.raw:
        found.setdefault(name.lower(), value)
    for name in (b"mercure-last-event-id", b"last-event-id"):
        raw = found.get(name)
        if raw is not None:
            return raw.decode("utf-8", "replace")
    return None


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of a network error."""
    text = str(error).strip()
    # httpx messages may embed the request URL; drop anything that looks like one.
    text = re.sub(r"https?://\S+", "<url>", text)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
