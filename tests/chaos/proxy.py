"""A loopback TCP fault proxy between the worker and the SSE source.

Faults act on the byte stream the reader sees, below HTTP: ``reset`` (an RST, via
``SO_LINGER`` 0), ``stall`` (no bytes for N s), ``slow`` (a bandwidth cap) and
``close_after`` (close after N bytes). They are applied by hand or by a seeded random
schedule (:meth:`FaultProxy.run_chaos`), so a failing run can be replayed from its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import Counter
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CHUNK = 16 * 1024


@dataclass
class _Link:
    """One proxied connection: client side, upstream side, and its own faults."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    stalled_until: float = 0.0
    close_after: int | None = None
    sent: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def reset(self) -> None:
        """Abort with an RST on the client side (SO_LINGER 0), close upstream."""
        sock = self.client.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.transport.abort()
        self.upstream.transport.abort()


class FaultProxy:
    """``async with FaultProxy(host, port) as proxy:``; point clients at ``proxy.port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.links: list[_Link] = []
        self.bandwidth: float | None = None
        """Bytes per second towards the client (None = uncapped)."""
        self.close_after: int | None = None
        """Bytes after which each new connection is closed (None = never)."""
        self.injected: Counter[str] = Counter()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for link in list(self.links):
            link.reset()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, source_url: str) -> str:
        """``source_url`` with its origin replaced by this proxy."""
        host = f"{self.target[0]}:{self.target[1]}"
        return source_url.replace(host, f"127.0.0.1:{self.port}", 1)

    # -- faults ------------------------------------------------------------------------

    def reset_all(self) -> int:
        links = list(self.links)
        for link in links:
            link.reset()
        self.injected["reset"] += len(links)
        return len(links)

    def stall_all(self, seconds: float) -> int:
        until = asyncio.get_running_loop().time() + seconds
        for link in self.links:
            link.stalled_until = until
        self.injected["stall"] += len(self.links)
        return len(self.links)

    def close_all_after(self, rng: random.Random, most: int = 4096) -> int:
        """Close each open connection after a random 1..``most`` further bytes."""
        for link in self.links:
            link.close_after = link.sent + rng.randint(1, most)
        return len(self.links)

    async def run_chaos(
        self,
        seed: int,
        *,
        faults: int,
        interval: tuple[float, float] = (0.1, 0.5),
        stall: tuple[float, float] = (0.3, 3.0),
        kinds: tuple[str, ...] = ("reset", "stall", "close"),
    ) -> Counter[str]:
        """Inject ``faults`` random faults on live connections; returns what was injected.

        A fault only counts when a connection was there to take it.
        """
        rng = random.Random(seed)
        done: Counter[str] = Counter()
        while sum(done.values()) < faults:
            await asyncio.sleep(rng.uniform(*interval))
            kind = rng.choice(kinds)
            if kind == "reset":
                hit = self.reset_all()
            elif kind == "stall":
                hit = self.stall_all(rng.uniform(*stall))
            else:
                hit = self.close_all_after(rng)
            if hit:
                done[kind] += 1
        return done

    # -- plumbing ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(client=writer, upstream=up_writer, close_after=self.close_after)
        self.links.append(link)
        link.tasks = [
            asyncio.create_task(self._pipe(reader, up_writer, link, towards_client=False)),
            asyncio.create_task(self._pipe(up_reader, writer, link, towards_client=True)),
        ]
        try:
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)
            self.links.remove(link)
            writer.transport.abort()
            up_writer.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        towards_client: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = CHUNK
                if towards_client and self.bandwidth:
                    size = max(1, min(CHUNK, int(self.bandwidth / 20)))
                data = await reader.read(size)
                if not data:
                    return
                if towards_client:
                    while (wait := link.stalled_until - loop.time()) > 0:
                        await asyncio.sleep(wait)
                    if link.close_after is not None:
                        data = data[: max(0, link.close_after - link.sent)]
                    if self.bandwidth:
                        await asyncio.sleep(len(data) / self.bandwidth)
                    link.sent += len(data)
                writer.write(data)
                await writer.drain()
                if towards_client and link.close_after is not None:
                    if link.sent >= link.close_after:
                        self.injected["close_after"] += 1
                        return
