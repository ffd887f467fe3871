"""A codec server, so the Temporal Web UI (and the CLI) can show encrypted payloads.

Implements the Temporal codec-server protocol: ``POST /encode`` and ``POST /decode``
take and return ``{"payloads": [...]}`` in protobuf-JSON form (the ``Payloads``
message). The UI may prefix the namespace (``/<namespace>/decode``), so only the last
path segment is routed on. ``OPTIONS`` answers the browser's CORS preflight for the
one UI origin given; preflights carry no credentials, so they are never authenticated.

The server decrypts for whoever can reach it. With ``DURABLE_SSE_CODEC_TOKEN`` set,
every ``POST`` must carry ``Authorization: Bearer <token>``; without a token it refuses
to listen on anything but loopback unless told to explicitly.

Plain asyncio with the source's minimal HTTP/1.1 (one request per connection), so the
stack needs no web framework.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from durable_sse.config.temporal import PAYLOAD_KEY_ENV
from durable_sse.errors import ConfigError, DurableSSEError
from durable_sse.ops.codec import EncryptionCodec
from durable_sse.source import http

logger = logging.getLogger(__name__)

TOKEN_ENV = "DURABLE_SSE_CODEC_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8081
DEFAULT_CORS_ORIGIN = "http://localhost:8233"
ALLOWED_HEADERS = "authorization, content-type, x-namespace"
PREFLIGHT_MAX_AGE = "600"


async def serve(
    host: str,
    port: int,
    codec: PayloadCodec,
    *,
    cors_origin: str | None,
    token: str | None,
) -> asyncio.Server:
    """Start listening (port 0 picks a free one) and return the started server.

    Args:
        cors_origin: the Web UI origin allowed to call from a browser (None: no CORS).
        token: the bearer token every POST must carry (None: no check).
    """
    handler = _CodecHandler(codec, cors_origin=cors_origin, token=token or None)
    server = await asyncio.start_server(handler.handle, host, port, limit=http.MAX_HEAD_BYTES)
    for sock in server.sockets:
        logger.info("codec server listening on %s", sock.getsockname()[:2])
    return server


class _CodecHandler:
    def __init__(self, codec: PayloadCodec, *, cors_origin: str | None, token: str | None) -> None:
        self._codec = codec
        self._cors_origin = cors_origin
        self._expected = f"Bearer {token}".encode() if token else None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await http.read_request(reader)
            except http.BadRequest as exc:
                writer.write(self._json(exc.status, {"error": str(exc)}, origin=None))
                await writer.drain()
                return
            writer.write(await self._respond(request))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception:
            logger.exception("codec server: request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, request: http.Request) -> bytes:
        origin = request.headers.get("origin")
        action = request.segments[-1] if request.segments else ""
        if action not in ("encode", "decode"):
            return self._json(404, {"error": "not found; use POST /encode or /decode"}, origin)
        if request.method == "OPTIONS":
            return http.response_head(204, self._cors(origin, preflight=True))
        if request.method != "POST":
            headers = {**self._cors(origin), "Allow": "POST, OPTIONS"}
            return self._json(405, {"error": "method not allowed"}, origin, headers)
        if not self._authorised(request):
            logger.warning("codec server: %s refused: missing or wrong bearer token", action)
            headers = {**self._cors(origin), "WWW-Authenticate": 'Bearer realm="codec"'}
            return self._json(401, {"error": "unauthorized"}, origin, headers)
        try:
            payloads = json_format.Parse(request.body or b"{}", Payloads())
        except json_format.ParseError as exc:
            return self._json(400, {"error": f"body is not a Payloads message: {exc}"}, origin)
        apply = self._codec.encode if action == "encode" else self._codec.decode
        try:
            result = Payloads(payloads=await apply(payloads.payloads))
        except DurableSSEError as exc:
            # Key mismatch or corrupted data: the message names key ids, never keys.
            return self._json(400, {"error": str(exc)}, origin)
        body = json_format.MessageToJson(result).encode()
        headers = {
            **self._cors(origin),
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        }
        return http.response_head(200, headers) + body

    def _authorised(self, request: http.Request) -> bool:
        if self._expected is None:
            return True
        given = request.headers.get("authorization", "").encode("latin-1")
        return hmac.compare_digest(given, self._expected)

    def _cors(self, origin: str | None, *, preflight: bool = False) -> dict[str, str]:
        if self._cors_origin is None or origin != self._cors_origin:
            return {"Vary": "Origin"}
        headers = {
            "Access-Control-Allow-Origin": self._cors_origin,
            "Access-Control-Allow-Credentials": "true",
            "Vary": "Origin",
        }
        if preflight:
            headers["Access-Control-Allow-Methods"] = "POST, OPTIONS"
            headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            headers["Access-Control-Max-Age"] = PREFLIGHT_MAX_AGE
        return headers

    def _json(
        self,
        status: int,
        value: Any,
        origin: str | None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        body = json.dumps(value).encode()
        all_headers = {
            **(headers if headers is not None else self._cors(origin)),
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        }
        return http.response_head(status, all_headers) + body


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-sse codec-server",
        description=(
            "Decrypt payloads for the Temporal Web UI. Reads the key from "
            f"{PAYLOAD_KEY_ENV} and an optional bearer token from {TOKEN_ENV}."
        ),
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument(
        "--cors-origin",
        default=DEFAULT_CORS_ORIGIN,
        help=f"Web UI origin allowed to call from a browser (default {DEFAULT_CORS_ORIGIN})",
    )
    parser.add_argument(
        "--allow-no-token",
        action="store_true",
        help=f"listen on a non-loopback host even though {TOKEN_ENV} is unset",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the codec server until interrupted; 2 on a configuration error."""
    args = _parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        # For display: payloads written before the key (or by a client without it) are
        # shown as they are rather than refused.
        codec = EncryptionCodec.from_env(accept_plaintext=True)
        if codec is None:
            raise ConfigError(f"{PAYLOAD_KEY_ENV} is not set: there is nothing to decode")
    except ConfigError as exc:
        logger.error("%s", exc)
        return 2
    token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and not _is_loopback(args.host) and not args.allow_no_token:
        logger.error(
            "refusing to serve decryption on %s without %s; set it, bind to 127.0.0.1, "
            "or pass --allow-no-token",
            args.host,
            TOKEN_ENV,
        )
        return 2
    logger.info("codec server key id %s, bearer token %s", codec.key_id, "on" if token else "off")

    async def run() -> None:
        server = await serve(
            args.host, args.port, codec, cors_origin=args.cors_origin or None, token=token
        )
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0
