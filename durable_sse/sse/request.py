"""What a connection sends: the URL with its cursor, and the request headers.

Plain functions, so the request side of DESIGN.md ("What the server may send, and what
it gets") is unit-tested without a server. Nothing here performs I/O, and nothing here
reads a secret: the caller resolves the stream's secret headers and query parameters for
the URL's host first (:mod:`durable_sse.config.secrets`) and passes their values in.

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

from collections.abc import Mapping
from urllib.parse import unquote_plus, urlencode, urlsplit, urlunsplit

from durable_sse.errors import UnsendableIdError


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


def request_headers(
    *,
    cursor: str | None,
    cursor_param: str | None,
    secret_headers: Mapping[str, str],
    stream: str,
) -> dict[str, str | bytes]:
    """Headers for one connection.

    ``Last-Event-ID`` is bytes (UTF-8), sent when there is a non-empty cursor and no
    ``cursor_param``. ``secret_headers`` are the stream's ``headers_from_env`` with their
    values, already resolved for this URL's host and checked to be header values (by
    :func:`durable_sse.config.secrets.request_secrets`); a value that is not ASCII is
    sent as UTF-8.

    Raises:
        UnsendableIdError: the cursor cannot be carried by a header.
    """
    headers: dict[str, str | bytes] = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if cursor and cursor_param is None:
        headers["Last-Event-ID"] = last_event_id_header(cursor, stream=stream)
    for name, value in secret_headers.items():
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
