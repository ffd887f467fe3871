"""The worker's sharded HTTP transport (durable_sse/sse/transport.py), against the demo
source: long-lived streams spread over its pools, and every one reads."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import httpx
import pytest

from durable_sse.source import SourceStreamConfig, SSESource
from durable_sse.sse.transport import ShardedTransport

GUARD = 20.0  # seconds: only to turn a hang into a failure, never asserted on


def open_connections(transport: ShardedTransport) -> list[int]:
    return [len(pool._pool.connections) for pool in transport.pools]


async def test_open_streams_spread_evenly_over_the_pools_and_each_reads() -> None:
    transport = ShardedTransport(shards=4)
    names = [f"s{i}" for i in range(12)]
    config = SourceStreamConfig(rate=200)
    async with (
        SSESource({name: config for name in names}) as source,
        httpx.AsyncClient(transport=transport, timeout=GUARD) as client,
        AsyncExitStack() as streams,
    ):
        responses = [
            await streams.enter_async_context(client.stream("GET", source.url(name)))
            for name in names
        ]
        assert open_connections(transport) == [3, 3, 3, 3]
        async with asyncio.timeout(GUARD):
            for response in responses:
                assert response.status_code == 200
                received = b""
                async for chunk in response.aiter_raw():
                    received += chunk
                    if b"data:" in received:
                        break
                assert b"data:" in received
    assert open_connections(transport) == [0, 0, 0, 0]  # closed with the client


def test_a_transport_needs_a_pool() -> None:
    with pytest.raises(ValueError, match="at least one pool"):
        ShardedTransport(shards=0)
