"""How a connection that its own worker ends goes on on another worker, at once.

A worker ends connections of its own at its shutdown (SIGTERM) and when it spreads them
over the pool's workers (:meth:`durable_sse.reader.pool.ConnectionPool.hand_over`). Either
way the attempt is failed through the client with a retryable
:data:`~durable_sse.contracts.CONNECTION_MOVED` and the committed cursor as its last
heartbeat details: Temporal retries it at once wherever there is room, with no workflow
task in between, and the retry starts where this one got to. At shutdown a streaming
connection goes further, make before break: it is handed over first and reads on until
its retry has started elsewhere (:mod:`durable_sse.reader.successors`).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError

from durable_sse.contracts import CONNECTION_MOVED, RETRY_NOW, ReadProgress
from durable_sse.reader.connection import Connection
from durable_sse.reader.successors import Successors

SHUTTING_DOWN = "its worker is shutting down: the connection goes on on another worker"
"""Why a connection of a stopping worker moves."""


class HandOver:
    """One connection's way to another worker: why it moves, and whether Temporal has
    its attempt's answer already."""

    def __init__(self, connection: Connection, *, successors: Successors | None) -> None:
        self.connection = connection
        self.successors = successors
        """At the worker's shutdown the stream is handed over at once and read on until
        its retry starts elsewhere (None: the connection ends first)."""
        self.info = activity.info()
        self.moving: str | None = None
        """Why its worker cancels it to go on elsewhere, if it does."""
        self.handed_over = False
        """Failed through the client while it reads on: it sends no more heartbeats, and
        whatever it ends with, Temporal has its answer already."""
        self._failing: asyncio.Task[bool] | None = None

    def watch(self, task: asyncio.Task[Any]) -> asyncio.Task[None] | None:
        """Hand over at the worker's shutdown, and then end ``task`` (None: this worker
        has no successors to wait for: its connections end first at shutdown)."""
        if self.successors is None:
            return None
        return asyncio.create_task(self._read_on_until_replaced(task))

    async def settle(self) -> None:
        """The connection ended: a hand-over still being sent decides its answer."""
        if self._failing is not None:
            self.handed_over = await self._failing

    async def _read_on_until_replaced(self, task: asyncio.Task[Any]) -> None:
        """Hand the stream over now, at the committed cursor, and read on until the retry
        has started on another worker; then end ``task``. A connection that is not
        reading yet, or with no other worker to take it, ends first and hands over after
        (:meth:`move`)."""
        successors = self.successors
        assert successors is not None
        await activity.wait_for_worker_shutdown()
        progress = self.connection.session.progress()
        streaming = self.connection.keepalive.streaming
        if not streaming or progress.cursor is None or not await successors.expected():
            self.moving = SHUTTING_DOWN
            task.cancel()
            return
        self.handed_over = True  # no heartbeat from here on: it would race the failure
        self._failing = asyncio.create_task(self._fail(SHUTTING_DOWN, handed(progress)))
        if not await asyncio.shield(self._failing):
            self._failing = None
            self.handed_over = False
            self.moving = SHUTTING_DOWN
            task.cancel()
            return
        self._failing = None
        name = self.connection.stream
        activity.logger.info(
            "stream %s handed over at %s: reading on until its retry starts elsewhere",
            name,
            progress.cursor,
        )
        await successors.wait(name, self.info.activity_id, self.info.attempt)
        task.cancel()

    async def move(self, why: str) -> bool:
        """Fail this attempt, flushed and committed, through the client (see :meth:`_fail`),
        so that the retry resumes from this cursor (nothing read twice, nothing to
        suspect). False: the attempt could not be failed (it is routed as a cancelled
        result)."""
        progress = self.connection.session.progress()
        if progress.cursor is not None:
            # Everything read is committed: the retry starts where this one got to, not
            # where it began (as after a death), so it has nothing to re-read or suspect.
            progress = handed(progress)
        return await self._fail(why, progress)

    async def _fail(self, why: str, progress: ReadProgress) -> bool:
        """Fail this attempt with a retryable error and ``progress`` as its last heartbeat
        details, through the client: Temporal retries it at once wherever there is room,
        with no workflow task in between. A heartbeat sent just before would race the
        failure and could be lost."""
        handle = activity.client().get_async_activity_handle(task_token=self.info.task_token)
        try:
            await handle.fail(moved(why), last_heartbeat_details=[asdict(progress)])
        except RPCError as rpc:
            activity.logger.warning("could not hand the connection over: %s", rpc)
            return False
        return True


def handed(progress: ReadProgress) -> ReadProgress:
    """``progress`` as a hand-over's: its retry starts at the committed cursor."""
    return replace(progress, start_cursor=progress.cursor, first_id=None, handed_over=True)


def moved(why: str, *, expected: bool = False) -> ApplicationError:
    """The failure of an attempt that goes on as a retry elsewhere, at once
    (:data:`~durable_sse.contracts.CONNECTION_MOVED`). ``expected``: the benign kind,
    which the SDK logs at debug (a paused worker that comes back ends a hundred
    connections so)."""
    return ApplicationError(
        why,
        type=CONNECTION_MOVED,
        next_retry_delay=RETRY_NOW,
        category=(
            ApplicationErrorCategory.BENIGN if expected else ApplicationErrorCategory.UNSPECIFIED
        ),
    )
