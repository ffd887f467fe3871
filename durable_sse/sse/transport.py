"""The worker's HTTP transport: several connection pools in turn, not one.

httpcore's pool walks every connection it holds each time a request starts or a
response ends. An SSE connection stays open for hours, so one pool holds every stream
of the worker, and a burst of starts (a deploy, a failover) walks a thousand
connections for each of a thousand requests. :class:`ShardedTransport` spreads the
requests over ``shards`` pools in turn: each walk is ``shards`` times shorter. A
stream's next request may go to another pool than its last; that only loses the reuse
of an idle keep-alive connection, which an SSE reconnect rarely has (the server closed
the last one).
"""

from __future__ import annotations

import itertools

import httpx

SHARDS = 16
"""Pools of a worker's transport: about 60 connections each at 1,000 streams."""
KEEPALIVE_CONNECTIONS = 20
"""Idle keep-alive connections kept (httpx's default for one pool), shared out over the
pools, at least one each: 16 in all with 16 pools."""


class ShardedTransport(httpx.AsyncBaseTransport):
    """``shards`` :class:`httpx.AsyncHTTPTransport` used in turn, sharing one TLS context
    (each would otherwise load the CA bundle)."""

    def __init__(self, shards: int = SHARDS, *, trust_env: bool = False) -> None:
        if shards < 1:
            raise ValueError("a transport needs at least one pool")
        tls = httpx.create_ssl_context(trust_env=trust_env)
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=max(1, KEEPALIVE_CONNECTIONS // shards),
        )
        self.pools = [
            httpx.AsyncHTTPTransport(verify=tls, trust_env=trust_env, limits=limits)
            for _ in range(shards)
        ]
        self._turn = itertools.cycle(self.pools)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await next(self._turn).handle_async_request(request)

    async def aclose(self) -> None:
        for pool in self.pools:
            await pool.aclose()
