"""Opening an SSE stream with httpx, and pumping its bytes ahead of the parser.

The rules (what a status code means, which redirect is followed, what a content type
must be) live in :mod:`durable_sse.sse.response` and :mod:`durable_sse.sse.request`;
this module applies them to one request. It knows nothing of the cursor stores or of
Temporal: the caller passes the URL and headers (secrets already resolved), and a
``waiting`` wrapper that keeps its own heartbeat going while a slow server thinks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from durable_sse.errors import CredentialsRefusedError, StreamRefusedError
from durable_sse.sse.content_type import is_event_stream
from durable_sse.sse.request import same_origin
from durable_sse.sse.response import (
    REFUSAL_HINTS,
    StatusPolicy,
    describe_error,
    is_auth_failure,
    parse_retry_after,
    status_policy,
    truncation_header,
)

T = TypeVar("T")

MAX_REDIRECTS = 5
READ_AHEAD_CHUNKS = 64
"""Chunks (up to 64 KiB each) read ahead while a batch commits: bounds memory."""
EOF: Any = object()
"""The pump's last item when the body ended."""


@dataclass
class Answer:
    """How the server answered the request for the stream."""

    url: str
    """The URL that answered (after same-origin redirects)."""
    status_code: int | None = None
    response: httpx.Response | None = None
    """An event stream, open: read it (it is closed when the ``open_stream`` block ends)."""
    truncation_header: str | None = None
    """The response's ``Mercure-Last-Event-ID`` (see ``http.truncation_header``)."""
    stop: bool = False
    """``204``: the server asks its clients to stop."""
    retry_later: bool = False
    """A network error, a ``5xx``, ``429``: try again later (``error`` says why)."""
    retry_after: float | None = None
    """Seconds the server asked to wait (``Retry-After``, capped)."""
    error: str | None = None


async def _as_is(awaitable: Awaitable[T]) -> T:
    return await awaitable


@asynccontextmanager
async def open_stream(
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str | bytes],
    *,
    timeout: httpx.Timeout,
    stream: str,
    redact: Callable[[str], str],
    waiting: Callable[[Awaitable[httpx.Response]], Awaitable[httpx.Response]] = _as_is,
) -> AsyncIterator[Answer]:
    """Request the stream, following same-origin redirects, and yield the answer.

    Raises :class:`~durable_sse.errors.StreamRefusedError` for what retrying cannot fix
    (``401``/``403``/``404``/``410``, a content type that is not ``text/event-stream``, a
    cross-origin redirect, too many redirects): the stream parks until resumed. A refusal
    of the credentials (:func:`~durable_sse.sse.response.is_auth_failure`) is its subclass
    :class:`~durable_sse.errors.CredentialsRefusedError`, which the caller may answer with
    new credentials once.
    """
    # As bytes: a value the request rules made bytes (UTF-8) goes as it is, the others
    # are ASCII (httpx would encode them the same way).
    wire = [
        (name.encode("ascii"), value if isinstance(value, bytes) else value.encode("ascii"))
        for name, value in headers.items()
    ]
    for _ in range(MAX_REDIRECTS + 1):
        request = http.build_request("GET", url, headers=wire, timeout=timeout)
        try:
            response = await waiting(http.send(request, stream=True))
        except httpx.TransportError as error:
            yield Answer(
                url,
                retry_later=True,
                error=f"cannot connect to {redact(url)}: {describe_error(error)}",
            )
            return
        try:
            code = response.status_code
            policy = status_policy(code)
            if policy is StatusPolicy.REDIRECT:
                target = str(response.url.join(response.headers.get("location", "")))
                if not same_origin(target, url):
                    raise StreamRefusedError(
                        f"stream {stream!r}: {redact(url)} redirects to another origin "
                        f"({redact(target)}); cross-origin redirects are never followed"
                    )
                url = target
                continue
            if policy is StatusPolicy.STOP:
                yield Answer(url, status_code=code, stop=True)
                return
            if policy is StatusPolicy.RETRY_LATER:
                yield Answer(
                    url,
                    status_code=code,
                    retry_later=True,
                    retry_after=parse_retry_after(response.headers.get("retry-after")),
                    error=f"HTTP {code} from {redact(url)}",
                )
                return
            if policy is StatusPolicy.REFUSED:
                hint = REFUSAL_HINTS.get(code, "the server refused the request")
                if is_auth_failure(code, response.headers.get("www-authenticate")):
                    raise CredentialsRefusedError(
                        f"stream {stream!r}: HTTP {code} from {redact(url)}", status_code=code
                    )
                raise StreamRefusedError(
                    f"stream {stream!r}: HTTP {code} from {redact(url)}: {hint}; "
                    "the stream is parked until resumed"
                )
            content_type = response.headers.get("content-type")
            if not is_event_stream(content_type):
                raise StreamRefusedError(
                    f"stream {stream!r}: {redact(url)} answered with content type "
                    f"{content_type!r}, not text/event-stream; the stream is parked until "
                    "resumed"
                )
            yield Answer(
                url,
                status_code=code,
                response=response,
                truncation_header=truncation_header(response.headers),
            )
            return
        finally:
            await response.aclose()
    raise StreamRefusedError(f"stream {stream!r}: more than {MAX_REDIRECTS} redirects")


async def pump(response: httpx.Response, queue: asyncio.Queue[Any], held: list[bytes]) -> None:
    """Read bytes ahead of the parser; ends the queue with :data:`EOF` or the error.

    ``held`` holds the chunk read from the socket while it waits for room in a full
    queue: a pump cancelled there leaves it in ``held`` (``Queue.put`` adds nothing once
    cancelled), and the reader takes it after the queued ones."""
    try:
        async for chunk in response.aiter_bytes():
            held.append(chunk)
            await queue.put(chunk)
            held.pop()
        await queue.put(EOF)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - every read error ends the connection
        await queue.put(error)


def read_error(error: BaseException, idle_timeout: float) -> str:
    """Why reading the body stopped, in words."""
    if isinstance(error, httpx.ReadTimeout):
        return f"idle timeout: no bytes for {idle_timeout:g} s"
    return f"connection lost: {describe_error(error)}"
