"""HTTP decisions for an SSE connection: request headers, status policy.

Plain functions, so the policy in DESIGN.md ("What the server may send") is unit-tested
without a server. Nothing here performs I/O.

Ids go back to the server as a browser sends them: ``Last-Event-ID`` carries the id's
UTF-8 bytes (``café`` -> ``caf\xc3\xa9``; httpx would encode a ``str`` header as ASCII
and raise), and a query-parameter cursor is percent-encoded UTF-8 (``caf%C3%A9``). An id
a header cannot carry exactly (:func:`id_header_problem`: NUL, CR, LF, VT or FF anywhere,
a space or tab at either end; h11 refuses these, and trimming them would resume from
another id) raises :class:`~durable_sse.errors.UnsendableIdError` naming the stream and
``cursor_param``, which can carry any id. Other control characters are sent as they are,
as a browser does; a server that refuses them answers 400, and the stream parks with it.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import unquote_plus, urlencode, urlsplit, urlunsplit

import httpx

from durable_sse.errors import ConfigError, UnsendableIdError

if TYPE_CHECKING:
    from durable_sse.config.secrets import DeclaredSecrets

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


def with_cursor(
    url: str, cursor_param: str | None, cursor: str | None, *, stream: str | None = None
) -> str:
    """The URL to request: the cursor goes into ``cursor_param`` when the stream uses one,
    percent-encoded as UTF-8 (an empty cursor is no cursor).

    Raises:
        UnsendableIdError: the cursor is not valid Unicode (a lone surrogate).
    """
    if cursor_param is None or not cursor:
        return url
    if not _is_utf8_encodable(cursor):
        raise UnsendableIdError(
            f"{_where(stream)}cannot resume from id {_shown(cursor)}: it is not valid "
            "Unicode (a lone surrogate), so it has no UTF-8 form to send; replay from "
            "another id"
        )
    return with_query(url, {cursor_param: cursor})


def with_query(url: str, values: Mapping[str, str]) -> str:
    """``url`` with ``values`` set as query parameters (replacing any of the same name).

    The other parameters are kept byte for byte (re-encoding them could change a token).
    """
    if not values:
        return url
    parts = urlsplit(url)
    kept = [
        item
        for item in parts.query.split("&")
        if item and unquote_plus(item.partition("=")[0]) not in values
    ]
    kept.append(urlencode(list(values.items())))
    return urlunsplit(parts._replace(query="&".join(kept)))


_HEADER_FORBIDDEN = {"\0": "NUL", "\n": "LF", "\r": "CR", "\x0b": "VT", "\x0c": "FF"}
_HEADER_EDGES = {" ": "a space", "\t": "a tab"}


def id_header_problem(event_id: str) -> str | None:
    """Why ``Last-Event-ID`` cannot carry ``event_id`` exactly, or None if it can.

    A header value (RFC 9110, h11) cannot hold NUL, CR, LF, VT or FF, nor begin or end
    with a space or tab (they would be trimmed). The reader may call this when an id
    arrives, to learn early what :func:`last_event_id_header` will refuse.
    """
    for char, name in _HEADER_FORBIDDEN.items():
        if char in event_id:
            return f"it contains {name} (U+{ord(char):04X})"
    for char, name in _HEADER_EDGES.items():
        if event_id.startswith(char):
            return f"it begins with {name}"
        if event_id.endswith(char):
            return f"it ends with {name}"
    if not _is_utf8_encodable(event_id):
        return "it is not valid Unicode (a lone surrogate)"
    return None


def last_event_id_header(cursor: str, *, stream: str | None = None) -> bytes:
    """The ``Last-Event-ID`` value for ``cursor``: its UTF-8 bytes, as a browser sends.

    Raises:
        UnsendableIdError: a header cannot carry the id exactly (:func:`id_header_problem`);
            the message names the stream and the ``cursor_param`` setting.
    """
    problem = id_header_problem(cursor)
    if problem is not None:
        raise UnsendableIdError(
            f"{_where(stream)}cannot resume from id {_shown(cursor)} with a Last-Event-ID "
            f"header: {problem}, which an HTTP header cannot carry. If the server takes "
            "the cursor as a query parameter, set 'cursor_param'; otherwise replay from "
            "another id"
        )
    return cursor.encode("utf-8")


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
        value = found.get(name)
        if value is not None:
            return value.decode("utf-8", "replace")
    return None


def _is_utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _where(stream: str | None) -> str:
    return f"stream {stream!r}: " if stream is not None else ""


def _shown(event_id: str) -> str:
    """An id for a message: quoted, escaped, and cut (ids can be long)."""
    return repr(event_id[:64]) + ("…" if len(event_id) > 64 else "")


def query_secrets(
    query_from_env: Mapping[str, str], secrets: DeclaredSecrets, *, url: str, stream: str
) -> dict[str, str]:
    """Query parameters whose values are secrets the worker declares for ``url``'s host."""
    return secrets.resolve(query_from_env, url=url, stream=stream, setting="query_from_env")


def request_headers(
    *,
    cursor: str | None,
    cursor_param: str | None,
    headers_from_env: Mapping[str, str],
    secrets: DeclaredSecrets,
    url: str,
    stream: str,
) -> dict[str, str | bytes]:
    """Headers for one connection to ``url``; secrets are resolved here, inside the
    worker, for that URL's host only.

    ``Last-Event-ID`` is bytes (UTF-8), sent when there is a non-empty cursor and no
    ``cursor_param``; a secret header value that is not ASCII is sent as UTF-8 too.

    Raises:
        UnsendableIdError: the cursor cannot be carried by a header.
        ConfigError: a ``headers_from_env`` variable is not declared for this host or not
            set, or its value cannot be a header value (named by variable, never shown).
    """
    headers: dict[str, str | bytes] = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if cursor and cursor_param is None:
        headers["Last-Event-ID"] = last_event_id_header(cursor, stream=stream)
    values = secrets.resolve(headers_from_env, url=url, stream=stream, setting="headers_from_env")
    for name, value in values.items():
        problem = id_header_problem(value)
        if problem is not None:
            raise ConfigError(
                f"stream {stream!r}: setting 'headers_from_env': the value of environment "
                f"variable {headers_from_env[name]} for {name} cannot be a header value: "
                f"{problem.replace('it ', '', 1)}"
            )
        headers[name] = value if value.isascii() else value.encode("utf-8")
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


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of a network error."""
    text = str(error).strip()
    # httpx messages may embed the request URL; drop anything that looks like one.
    text = re.sub(r"https?://\S+", "<url>", text)
    name = type(error).__name__
    return f"{name}: {text}" if text else name
