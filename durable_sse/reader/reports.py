"""What a running connection tells others while it reads, on timers of its own.

* every ``PROGRESS_INTERVAL`` its cursor, counts and commit lag go to Redis
  (``progress:<stream>``, :meth:`durable_sse.cursor.l2.RedisCursors.submit_progress`),
  where ``durable-sse status`` reads them: what moves with every batch stays out of the
  workflow's history, which learns it from the connection's result (docs/benchmarks.md,
  the cost of a stream);
* every ``HOLD_INTERVAL`` its retention hold moves forward, when a retention applies to
  the stream (else its start holds, and nothing is deleted);
* the first commit that stores rows, and any after a pause, wakes the stream's checkpoint
  schedule if it rests (:mod:`durable_sse.cursor.rest`), in the background.

:class:`ConnectionReports` is checked at every heartbeat check
(:attr:`durable_sse.reader.keepalive.Heartbeats.due`) and after every commit that stored
rows (the connection's ``on_stored``); where the connection runs (the read activity) builds
it and stops it when the connection ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from durable_sse.config.durations import effective_retention
from durable_sse.contracts import ConnectionProgress, progress_json
from durable_sse.cursor.rest import WAKE_RETRY, wake_check_due
from durable_sse.reader.connection import Connection

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL = 2.0
"""Seconds between writes of a connection's live progress to Redis, when it changed
(checked whenever the connection wakes: a batch, a keep-alive, a heartbeat). Unchanged,
it is written again every ``PROGRESS_REFRESH``, so its ``at`` says the connection lives."""
PROGRESS_REFRESH = 60.0
HOLD_INTERVAL = 20.0
"""Seconds between moves of the connection's retention hold (a database write)."""
HOLD_TIMEOUT = 5.0
"""Seconds one move of the hold may take; a late one is dropped (retention keeps more)."""
WAKE_TIMEOUT = 10.0
"""Bound on one wake of a resting schedule (a flag read, and at most two Temporal calls)."""


class ConnectionReports:
    """One connection's live progress, retention hold moves and checkpoint wakes.

    Args:
        connection: the connection reported on (its stores' L2 takes the progress).
        connection_id: the connection's id in the progress (``ReadInput.connection``).
        progress_interval: seconds between progress writes (``PROGRESS_INTERVAL``).
        retention: the worker's retention, for streams without their own: the hold moves
            only when one applies.
        wake_checkpoint: wakes a stream's resting checkpoint schedule (None: never woken
            from here).
        log: the logger to use (the activity's carries its context).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        connection_id: int,
        progress_interval: float = PROGRESS_INTERVAL,
        retention: float | None = None,
        wake_checkpoint: Callable[[str], Awaitable[bool]] | None = None,
        log: logging.Logger | logging.LoggerAdapter[Any] = logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connection = connection
        self.connection_id = connection_id
        self.progress_interval = progress_interval
        self.wake_checkpoint = wake_checkpoint
        self.log = log
        self.clock = clock
        now = clock()
        self.next_progress = now + progress_interval
        self.refresh_at = now
        self.published: ConnectionProgress | None = None
        """The last live progress written (its ``at`` left out)."""
        self.next_hold = now + HOLD_INTERVAL
        spec = connection.spec
        retention, _ = effective_retention(spec.retention, retention, spec.replay_window)
        self.moves_hold = retention is not None
        """No retention, nothing deleted: the start's hold is enough, and a thousand
        connections spare the database a write every ``HOLD_INTERVAL`` each. (A worker
        configured otherwise keeps more, never less: the hold only ever moves forward.)"""
        self.holding: asyncio.Task[None] | None = None
        self.last_move: float | None = None
        """When a commit last stored rows (monotonic; None: not yet on this connection)."""
        self.wake_retry_at: float | None = None
        self.waking: asyncio.Task[None] | None = None

    # -- live progress and the retention hold ---------------------------------------

    def due(self) -> None:
        """Checked at every heartbeat check (heartbeats may be minutes apart): the live
        progress when it is due and changed, the retention hold every ``HOLD_INTERVAL``."""
        now = self.clock()
        if now >= self.next_progress:
            self.next_progress = now + self.progress_interval
            self._publish(now)
        if self.moves_hold and now >= self.next_hold and self.holding is None:
            self.next_hold = now + HOLD_INTERVAL
            self.holding = asyncio.create_task(self._move_hold())

    def _publish(self, now: float) -> None:
        """Write the connection's progress to Redis (non-blocking, coalesced): a view for
        ``durable-sse status``, never the truth, and never in the workflow's history."""
        l2 = self.connection.stores.l2
        if l2 is None:
            return
        session = self.connection.session
        progress = ConnectionProgress(
            connection=self.connection_id,
            cursor=session.started.cursor,
            counts=session.counts(),
            commit_lag=self.connection.commit_lag,
            credentials=self.connection.credential_views(),
        )
        if progress == self.published and now < self.refresh_at:
            return
        self.published = progress
        self.refresh_at = now + PROGRESS_REFRESH
        stamped = replace(progress, at=datetime.now(UTC).isoformat())
        l2.submit_progress(self.connection.stream, progress_json(stamped))

    async def _move_hold(self) -> None:
        try:
            async with asyncio.timeout(HOLD_TIMEOUT):
                await self.connection.move_hold()
        except TimeoutError:
            self.log.debug("stream %s: retention hold not moved in time", self.connection.stream)
        finally:
            self.holding = None

    # -- a resting checkpoint schedule (durable_sse.cursor.rest) -------------------------

    def stored(self) -> None:
        """A commit stored new rows: after a pause (or first), make sure the stream's
        checkpoint schedule is not resting, in the background (commits never wait). Only
        commits that store count: a replay of stored events moves the cursor all along,
        and would hide the pause before a newer event."""
        now = self.clock()
        due = wake_check_due(
            last_move=self.last_move,
            retry_at=self.wake_retry_at,
            now=now,
            replay_window=self.connection.spec.replay_window,
        )
        self.last_move = now
        if due and self.wake_checkpoint is not None and self.waking is None:
            self.wake_retry_at = None
            self.waking = asyncio.create_task(self._wake())

    async def _wake(self) -> None:
        wake, stream = self.wake_checkpoint, self.connection.stream
        assert wake is not None
        try:
            async with asyncio.timeout(WAKE_TIMEOUT):
                await wake(stream)
        except Exception as error:  # noqa: BLE001 - tried again later, never the stream's end
            self.wake_retry_at = self.clock() + WAKE_RETRY
            self.log.warning(
                "stream %s: could not check its checkpoint schedule's rest (again in %.0f s): %s",
                stream,
                WAKE_RETRY,
                error,
            )
        finally:
            self.waking = None

    async def stop(self) -> None:
        """The connection ended: no hold move outlives it; its last progress is written
        (its result says the rest to the workflow)."""
        if self.connection.session.intake is not None:
            self.published = None
            self._publish(self.clock())
        for task in (self.holding, self.waking):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.wait([task])
