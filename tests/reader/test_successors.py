"""A handed-over connection reads on until its retry registers (reader.successors)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from durable_sse.cursor.readers import ReaderLease, RegisteredAttempt
from durable_sse.reader.successors import Successors, successors_started
from durable_sse.stores import Stores


def test_a_later_attempt_of_the_same_activity_is_the_successor() -> None:
    waiting = {("a", "7"): 1, ("b", "9"): 2}
    registered = [
        RegisteredAttempt("a", "7", 1),  # the connection itself
        RegisteredAttempt("b", "9", 3),  # its retry
        RegisteredAttempt("c", "7", 2),  # another stream's activity of the same id
        RegisteredAttempt("a", None, 5),  # registered by a build that did not say
    ]
    assert successors_started(registered, waiting) == {("b", "9")}
    assert successors_started([RegisteredAttempt("a", "7", 2)], waiting) == {("a", "7")}


def lease(stream: str, attempt: int) -> ReaderLease:
    return ReaderLease(
        reader_id=f"7.{attempt}.{uuid.uuid4().hex[:6]}",
        expires_at=datetime.now(UTC) + timedelta(minutes=5),
        workflow_id=f"sse-stream:{stream}",
        activity_id="7",
        attempt=attempt,
    )


async def register(stores: Stores, stream: str, attempt: int) -> None:
    await stores.starts.connection_context(
        stream, "numeric", cursor=None, source="none", reader=lease(stream, attempt)
    )


async def no_peers() -> bool:
    return False


async def test_the_wait_ends_when_the_retry_registers_or_at_the_limit(
    stores: Stores, stream_name: str
) -> None:
    successors = Successors(stores.readers, peers=no_peers, limit=10.0, interval=0.05)
    await register(stores, stream_name, 1)
    waiting = asyncio.create_task(successors.wait(stream_name, "7", 1))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # only the connection itself is registered
    await register(stores, stream_name, 2)
    assert await asyncio.wait_for(waiting, 5.0) is True

    short = Successors(stores.readers, peers=no_peers, limit=0.3, interval=0.05)
    assert await short.wait(stream_name, "7", 2) is False  # no third attempt came
    assert not short._waiting  # nothing left behind


async def test_with_no_other_worker_no_successor_is_expected(stores: Stores) -> None:
    asked = 0

    async def peers() -> bool:
        nonlocal asked
        asked += 1
        return False

    successors = Successors(stores.readers, peers=peers)
    assert not any(await asyncio.gather(*(successors.expected() for _ in range(50))))
    assert asked == 1  # one question for all of the worker's connections
