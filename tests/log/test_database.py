"""The event log's database runner (durable_sse/log/database.py), apart from any store."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from durable_sse.log.database import outlast_cancellation


async def test_a_cancelled_caller_waits_for_the_call_and_leaves_no_error_unretrieved() -> None:
    """A paused worker's connections are cancelled while their start is in a database
    thread, which then fails (the lease was revoked): the cancellation wins, quietly."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    release, finished = threading.Event(), threading.Event()

    def failing_call() -> None:
        release.wait(5)
        finished.set()
        raise RuntimeError("the lease was revoked")

    try:
        caller = asyncio.ensure_future(
            outlast_cancellation(loop.run_in_executor(None, failing_call))
        )
        await asyncio.sleep(0.05)
        caller.cancel()
        await asyncio.sleep(0.05)
        assert not caller.done()  # it waits for the call to end
        release.set()
        await asyncio.wait([caller])
        assert caller.cancelled() and finished.is_set()
        del caller
        gc.collect()
        await asyncio.sleep(0)
        assert reported == []
    finally:
        loop.set_exception_handler(previous)
