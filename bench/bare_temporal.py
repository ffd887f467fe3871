"""The bare Temporal loop the reconnect overhead is compared with.

``BareLoopWorkflow`` runs ``bare_read`` in a loop; ``bare_read`` opens one SSE
connection (httpx-sse, ``Last-Event-ID``), reads until the server ends it and returns
the last id. No cursor stores, no persistence, no routing: what is left is Temporal's
own cost of one loop iteration plus the HTTP connect.

Run: ``TEMPORAL_ADDRESS=host:port BARE_TASK_QUEUE=q python bench/bare_temporal.py``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import httpx
    from httpx_sse import aconnect_sse

ITERATIONS_PER_RUN = 200
_http: httpx.AsyncClient | None = None
"""One client per worker process, as the real worker has (creating one costs an SSL context)."""


@dataclass
class BareInput:
    url: str
    last_id: str | None = None


@activity.defn
async def bare_read(input: BareInput) -> str | None:
    headers = {"Last-Event-ID": input.last_id} if input.last_id else {}
    last_id = input.last_id
    global _http
    if _http is None:
        _http = httpx.AsyncClient(timeout=30, trust_env=False)
    try:
        async with aconnect_sse(_http, "GET", input.url, headers=headers) as source:
            async for event in source.aiter_sse():
                last_id = event.id or last_id
    except httpx.HTTPError:
        pass
    return last_id


@workflow.defn
class BareLoopWorkflow:
    @workflow.run
    async def run(self, input: BareInput) -> None:
        for _ in range(ITERATIONS_PER_RUN):
            input.last_id = await workflow.execute_activity(
                bare_read, input, start_to_close_timeout=timedelta(seconds=60)
            )
        workflow.continue_as_new(input)


async def main() -> None:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    worker = Worker(
        client,
        task_queue=os.environ["BARE_TASK_QUEUE"],
        workflows=[BareLoopWorkflow],
        activities=[bare_read],
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
