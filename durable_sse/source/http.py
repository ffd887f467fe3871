"""Just enough HTTP/1.1 for the source: one request per connection, then ``Connection: close``.

Event streams are sent without ``Content-Length`` or chunking: the body ends when the
connection closes. That is the cheapest framing for both ends (h11 reads the body as
plain bytes instead of parsing chunk headers), and it makes an injected disconnect
exactly a TCP close.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
REQUEST_TIMEOUT = 10.0

REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    301: "Moved Permanently",
    302: "Found",
    303: "See Other",
    307: "Temporary Redirect",
    308: "Permanent Redirect",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    410: "Gone",
    413: "Content Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class BadRequest(Exception):
    """The request cannot be parsed; answered with 400 (or the given status)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its last value. Values are decoded as
    latin-1 (one character per byte): ``.encode("latin-1")`` gives the bytes back."""
    body: bytes = b""
    segments: list[str] = field(default_factory=list)

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None

    def json(self) -> dict[str, Any]:
        if not self.body.strip():
            return {}
        try:
            value = json.loads(self.body)
        except ValueError as exc:
            raise BadRequest(f"body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise BadRequest("body must be a JSON object")
        return value


async def read_request(reader: asyncio.StreamReader) -> Request:
    """Read one request head (and body, by ``Content-Length``)."""
    async with asyncio.timeout(REQUEST_TIMEOUT):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise BadRequest("request head too large", 413) from None
        lines = head[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(f"bad request line {lines[0]!r}")
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest(f"bad header line {line!r}")
            headers[name.lower()] = value.strip()
        body = b""
        if "transfer-encoding" in headers:
            raise BadRequest("chunked request bodies are not supported", 400)
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise BadRequest(f"bad Content-Length {length_text!r}")
        length = int(length_text)
        if length > MAX_BODY_BYTES:
            raise BadRequest("request body too large", 413)
        if length:
            body = await reader.readexactly(length)
    url = urlsplit(target)
    segments = [unquote(s) for s in url.path.split("/") if s]
    return Request(
        method=method.upper(),
        path=url.path,
        query=parse_qs(url.query, keep_blank_values=True),
        headers=headers,
        body=body,
        segments=segments,
    )


def response_head(status: int, headers: dict[str, str] | None = None) -> bytes:
    """Status line and headers of a response that ends when the connection closes."""
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")  # a non-ASCII id as UTF-8


def json_response(status: int, value: Any) -> bytes:
    body = json.dumps(value).encode()
    head = response_head(
        status, {"Content-Type": "application/json", "Content-Length": str(len(body))}
    )
    return head + body
