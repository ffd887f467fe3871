"""A plain reconnect loop without Temporal: httpx-sse, Last-Event-ID, reconnect at once.

Run: ``python bench/plain_loop.py URL SECONDS`` (the reconnect baseline of bench/reconnect.py).
"""

from __future__ import annotations

import asyncio
import sys
import time

import httpx
from httpx_sse import aconnect_sse


async def main(url: str, seconds: float) -> None:
    last_id: str | None = None
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30, trust_env=False) as client:
        while time.monotonic() < deadline:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                async with aconnect_sse(client, "GET", url, headers=headers) as source:
                    async for event in source.aiter_sse():
                        last_id = event.id or last_id
            except httpx.HTTPError:
                await asyncio.sleep(0.01)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
