"""``SSESource``: a real HTTP server of named event streams with injectable faults.

Routes (every response closes the connection):

* ``GET /streams`` lists streams; ``POST /streams/<name>`` creates one from a JSON config;
  ``DELETE /streams/<name>`` removes one.
* ``GET /streams/<name>`` is the event stream. Resume with ``Last-Event-ID`` or the query
  parameter ``cursor`` (the stream's ``cursor_param``) or ``lastEventId``; no cursor = live
  only. Ids are ``id_prefix`` + a number; a non-ASCII prefix is read from the header as
  UTF-8 bytes and from the query as percent-encoded UTF-8, as browsers send it. When the
  cursor is older than the history reaches, the stream starts at the oldest kept event
  with the comment ``: history truncated``; whenever a cursor is given the response
  carries ``Mercure-Last-Event-ID`` = the id the stream really resumes after (the cursor,
  or ``oldest kept - 1`` when truncated).
* ``GET|POST /control/<name>`` shows the stream / changes settings or injects an action
  (same as :meth:`SSESource.inject`); ``GET /truth/<name>`` is the ground truth
  (``?ids=0`` leaves out the id list).
* ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode

from durable_sse.errors import ConfigError
from durable_sse.source import http
from durable_sse.source.config import (
    SourceStreamConfig,
    check_stream_name,
    config_from_dict,
)
from durable_sse.source.connection import EventConnection
from durable_sse.source.stream import OneShot, SourceStream, SourceTruth

logger = logging.getLogger(__name__)

STOP_GRACE = 2.0
"""Seconds ``stop`` waits for connections to end after their sockets are aborted."""
ONE_SHOTS = ("drop", "malformed", "oversized", "disconnect")
ACTIONS = (*ONE_SHOTS, "status", "pause", "resume", "clear")
_CLEARED: dict[str, Any] = {
    "paused": False,
    "drop_every": None,
    "drop_count": 0,
    "disconnect_after": None,
    "disconnect_probability": 0.0,
    "slow": 0.0,
    "status": None,
    "status_times": 1,
    "retry_after": None,
    "content_type": None,
    "location": None,
}


class SSESource:
    """The demo/test SSE server. Use as ``async with SSESource({...}) as source:``."""

    def __init__(
        self,
        streams: dict[str, SourceStreamConfig] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        token_clients: dict[str, str] | None = None,
        token_lifetime: float = 5.0,
    ) -> None:
        """``token_clients``: client id -> secret that ``POST /oauth/token`` issues tokens
        to (client credentials, ``client_secret_basic`` or ``client_secret_post``), each
        living ``token_lifetime`` seconds; a stream with ``oauth=True`` takes only those."""
        self.token_clients = dict(token_clients or {})
        self.token_lifetime = token_lifetime
        self.token_endpoint_down = False
        """While True the token endpoint answers 503 (an outage, for tests)."""
        self.token_requests = 0
        self.issued: dict[str, float] = {}
        """Token -> expiry (``time.monotonic()``)."""
        self.issued_log: list[str] = []
        """Every token issued (tests look for them where they must never be)."""
        self.auth_refusals: dict[str, int] = {}
        """Stream -> connections answered 401."""
        self._file_tokens: dict[str, tuple[str | None, str | None]] = {}
        """Stream -> (current, previous) token of its ``token_file``."""
        self.host = host
        self._requested_port = port
        self._seed = seed
        self._streams: dict[str, SourceStream] = {}
        self._server: asyncio.Server | None = None
        self._handlers: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        for name, config in (streams or {}).items():
            self.add_stream(name, config)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, self.host, self._requested_port, limit=http.MAX_HEAD_BYTES
        )
        for stream in self._streams.values():
            stream.start()
        logger.info("SSE source listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Abort the sockets rather than cancel the handlers: each handler then ends on its
        # own (EOF / connection lost), and Python 3.11's stream callback does not choke on
        # a cancelled task. Cancelling is only the fallback.
        for writer in self._handlers.values():
            writer.transport.abort()
        if self._handlers:
            _, stuck = await asyncio.wait(self._handlers.keys(), timeout=STOP_GRACE)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in self._streams.values()))
        await server.wait_closed()

    async def __aenter__(self) -> SSESource:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("SSESource is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    def url(self, name: str) -> str:
        """The event-stream URL of ``name``."""
        return f"{self.base_url}/streams/{name}"

    # -- streams ----------------------------------------------------------------------

    @property
    def streams(self) -> list[str]:
        return sorted(self._streams)

    def add_stream(self, name: str, config: SourceStreamConfig | None = None) -> None:
        """Create a stream (generation starts now if the server runs)."""
        check_stream_name(name)
        if name in self._streams:
            raise ConfigError(f"source stream {name!r} already exists")
        stream = SourceStream(name, config or SourceStreamConfig(), seed=self._seed)
        self._streams[name] = stream
        if self._server is not None:
            stream.start()

    async def remove_stream(self, name: str) -> None:
        await self._stream(name).stop()
        del self._streams[name]

    def truth(self, name: str) -> SourceTruth:
        """Every id ever generated, and the ranges a drop really skipped on some connection."""
        return self._stream(name).truth()

    def describe(self, name: str) -> dict[str, Any]:
        """What ``GET /control/<name>`` shows: settings, pending one-shots, counters."""
        return self._stream(name).describe()

    def inject(self, name: str, **action: Any) -> dict[str, Any]:
        """Change settings (``inject(n, rate=5)``) or act (``inject(n, action="drop", count=3)``).

        Actions: ``drop`` (``count``; ``first`` = True: taken only by a connection that
        has sent no event yet, before its first event; ``late`` = N: announced after N
        more events; ``lost`` = True: never announced, the connection closes ``late``
        (at least 1) events after the skip, its notice lost with it), ``malformed``, ``oversized``
        (``bytes``, ``close`` = True), ``disconnect``: one-shots consumed by the next
        connection that looks (an open one, else the next to connect); ``status``
        (``code``, ``times`` = 1, ``retry_after``, ``content_type``, ``location``): the
        next ``times`` connections get that response; ``pause``, ``resume``; ``clear``
        (all faults off). Returns :meth:`describe`.
        """
        stream = self._stream(name)
        verb = action.pop("action", None)
        if verb is None:
            stream.reconfigure(action)
        elif verb in ONE_SHOTS:
            stream.push(OneShot(verb, _one_shot_params(verb, action)))
        elif verb == "status":
            stream.reconfigure(_status_settings(action))
        elif verb in ("pause", "resume") and not action:
            stream.reconfigure({"paused": verb == "pause"})
        elif verb == "clear" and not action:
            stream.one_shots.clear()
            stream.reconfigure(dict(_CLEARED))
        else:
            raise ConfigError(f"unknown action {verb!r} with {action!r}; actions: {ACTIONS}")
        return stream.describe()

    def _stream(self, name: str) -> SourceStream:
        try:
            return self._streams[name]
        except KeyError:
            raise KeyError(f"no source stream named {name!r}") from None

    # -- HTTP ------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers[task] = writer
        try:
            try:
                request = await http.read_request(reader)
            except http.BadRequest as exc:
                writer.write(http.json_response(exc.status, {"error": str(exc)}))
                await writer.drain()
                return
            await self._route(request, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception:
            logger.exception("SSE source: request failed")
        finally:
            if task is not None:
                self._handlers.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _route(
        self, request: http.Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        method, segments = request.method, request.segments
        response: bytes
        try:
            if segments == ["healthz"] and method == "GET":
                response = http.json_response(200, {"ok": True})
            elif segments == ["oauth", "token"] and method == "POST":
                response = self._token_response(request)
            elif segments == ["streams"] and method == "GET":
                response = http.json_response(200, {"streams": self.streams})
            elif len(segments) == 2 and segments[0] == "streams":
                name = segments[1]
                if method == "GET":
                    await self._serve_events(name, request, reader, writer)
                    return
                if method == "POST":
                    self.add_stream(name, config_from_dict(request.json()))
                    body = {"name": name, "url": self.url(name), **self.describe(name)}
                    response = http.json_response(201, body)
                elif method == "DELETE":
                    await self.remove_stream(name)
                    response = http.json_response(200, {"removed": name})
                else:
                    response = http.json_response(405, {"error": "method not allowed"})
            elif len(segments) == 2 and segments[0] == "control" and method in ("GET", "POST"):
                if method == "POST":
                    response = http.json_response(200, self.inject(segments[1], **request.json()))
                else:
                    response = http.json_response(200, self.describe(segments[1]))
            elif len(segments) == 2 and segments[0] == "truth" and method == "GET":
                truth = self.truth(segments[1]).to_json()
                if request.param("ids") in ("0", "false", "no"):
                    del truth["ids"]  # a long stream's id list is large; counts suffice
                response = http.json_response(200, truth)
            else:
                response = http.json_response(404, {"error": f"no route {method} {request.path}"})
        except KeyError as exc:
            response = http.json_response(404, {"error": exc.args[0]})
        except ConfigError as exc:
            status = 409 if "already exists" in str(exc) else 400
            response = http.json_response(status, {"error": str(exc)})
        except http.BadRequest as exc:
            response = http.json_response(exc.status, {"error": str(exc)})
        writer.write(response)
        await writer.drain()

    async def _serve_events(
        self,
        name: str,
        request: http.Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        stream = self._stream(name)
        if not self._authorized(name, stream.config, request):
            self.auth_refusals[name] = self.auth_refusals.get(name, 0) + 1
            body = b'{"error": "invalid_token"}'
            writer.write(
                http.response_head(
                    401,
                    {
                        "WWW-Authenticate": 'Bearer error="invalid_token"',
                        "Content-Type": "application/json",
                        "Content-Length": str(len(body)),
                    },
                )
                + body
            )
            await writer.drain()
            return
        fault = stream.take_status()
        if fault is not None:
            writer.write(self._status_response(fault, request))
            await writer.drain()
            return
        config = stream.config
        header = request.headers.get("last-event-id")
        cursor = _cursor(
            config.id_prefix,
            # a browser sends the id's UTF-8 bytes; the head was decoded one char per byte
            None if header is None else header.encode("latin-1").decode("utf-8", "replace"),
            request.param(config.cursor_param),
            request.param("lastEventId"),
        )
        headers = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
        if cursor is None:
            next_id = stream.newest + 1
        else:
            next_id = cursor + 1
            oldest = stream.oldest_available()
            truncated = next_id < oldest and oldest > config.start_id
            resumed_after = oldest - 1 if truncated else cursor
            headers["Mercure-Last-Event-ID"] = f"{config.id_prefix}{resumed_after}"
        preamble = http.response_head(200, headers)
        if config.retry_ms is not None:
            preamble += b"retry: %d\n\n" % config.retry_ms
        stream.connections += 1
        try:
            await EventConnection(stream, reader, writer, next_id).run(preamble)
        finally:
            stream.connections -= 1

    # -- tokens ------------------------------------------------------------------------

    def _authorized(self, name: str, config: SourceStreamConfig, request: http.Request) -> bool:
        if config.token_file is None and not config.oauth:
            return True
        token = request.param("access_token")
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, rest = header.partition(" ")
            token = rest.strip() if scheme.lower() == "bearer" and rest else header.strip()
        if not token:
            return False
        if config.oauth and self.issued.get(token, 0.0) > time.monotonic():
            return True
        if config.token_file is not None:
            current, previous = self.file_tokens(name, config.token_file)
            return token in (current, previous)
        return False

    def file_tokens(self, name: str, path: str) -> tuple[str | None, str | None]:
        """The current and the previous token of ``name``'s ``token_file``, as read now."""
        try:
            with open(path, encoding="utf-8") as handle:
                now: str | None = handle.read().rstrip("\r\n") or None
        except OSError:
            now = None
        current, previous = self._file_tokens.get(name, (None, None))
        if now != current:
            current, previous = now, current
            self._file_tokens[name] = (current, previous)
        return current, previous

    def _token_response(self, request: http.Request) -> bytes:
        """``POST /oauth/token``: an RFC 6749 client-credentials grant."""
        self.token_requests += 1
        if self.token_endpoint_down:
            return http.json_response(503, {"error": "temporarily_unavailable"})
        form = {
            key: values[-1]
            for key, values in parse_qs(request.body.decode("utf-8", "replace")).items()
        }
        client_id, secret = form.get("client_id"), form.get("client_secret")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(header[6:].strip()).decode("utf-8")
            except ValueError:
                decoded = ""
            user, _, password = decoded.partition(":")
            client_id, secret = unquote(user), unquote(password)
        if form.get("grant_type") != "client_credentials":
            return http.json_response(400, {"error": "unsupported_grant_type"})
        if client_id is None or self.token_clients.get(client_id) != secret:
            return http.json_response(401, {"error": "invalid_client"})
        token = secrets.token_urlsafe(24)
        now = time.monotonic()
        self.issued = {t: until for t, until in self.issued.items() if until > now}
        self.issued[token] = now + self.token_lifetime
        self.issued_log.append(token)
        return http.json_response(
            200,
            {"access_token": token, "token_type": "Bearer", "expires_in": self.token_lifetime},
        )

    def _status_response(self, fault: SourceStreamConfig, request: http.Request) -> bytes:
        code = fault.status or 200
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            headers["Retry-After"] = str(fault.retry_after)
        if code == 204:
            return http.response_head(204, headers)
        if 300 <= code < 400:
            headers["Location"] = fault.location or self._other_origin(request)
            headers["Content-Length"] = "0"
            return http.response_head(code, headers)
        if code == 200:
            body = b"this is not an event stream\n"
            headers["Content-Type"] = fault.content_type or "text/plain; charset=utf-8"
        else:
            body = b'{"error": "%s"}' % http.REASONS.get(code, "error").encode()
            headers["Content-Type"] = fault.content_type or "application/json"
        headers["Content-Length"] = str(len(body))
        return http.response_head(code, headers) + body

    def _other_origin(self, request: http.Request) -> str:
        """The same path on another origin: ``localhost`` <-> ``127.0.0.1``, same port."""
        host = request.headers.get("host", f"127.0.0.1:{self.port}")
        other = "localhost" if host.startswith("127.0.0.1") else "127.0.0.1"
        query = urlencode(request.query, doseq=True)
        target = request.path + ("?" + query if query else "")
        return f"http://{other}:{self.port}{target}"


def _cursor(prefix: str, *candidates: str | None) -> int | None:
    """The first present resume id; one that is not ``prefix`` + an integer means live
    only."""
    for value in candidates:
        if value is None:
            continue
        text = value.strip()
        if not text.startswith(prefix):
            logger.info(
                "SSE source: ignoring cursor %r without prefix %r (live only)", value, prefix
            )
            return None
        try:
            return int(text[len(prefix) :])
        except ValueError:
            logger.info("SSE source: ignoring non-integer cursor %r (live only)", value)
            return None
    return None


def _one_shot_params(verb: str, params: dict[str, Any]) -> dict[str, Any]:
    allowed = {
        "drop": {"count", "first", "late", "lost"},
        "oversized": {"bytes", "close"},
    }.get(verb, set())
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"action {verb!r} takes {sorted(allowed)}, got {sorted(unknown)}")
    for key in ("first", "lost"):
        if key in params and not isinstance(params[key], bool):
            raise ConfigError(f"action {verb!r}: {key!r} must be true or false")
    if "late" in params:
        value = params["late"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"action {verb!r}: 'late' must be an integer >= 0")
    for key in ("count", "bytes"):
        if key in params:
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"action {verb!r}: {key!r} must be an integer >= 1")
    return dict(params)


def _status_settings(params: dict[str, Any]) -> dict[str, Any]:
    allowed = {"code", "times", "retry_after", "content_type", "location"}
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"action 'status' takes {sorted(allowed)}, got {sorted(unknown)}")
    code = params.get("code")
    retry_after = params.get("retry_after")
    if code == 429 and retry_after is None:
        retry_after = 1
    return {
        "status": code,
        "status_times": params.get("times", 1),
        "retry_after": retry_after,
        "content_type": params.get("content_type"),
        "location": params.get("location"),
    }
