"""Reading one response body: bytes pumped ahead, decoded, taken, batches submitted.

However the connection ends (a drop signal, a finished repair, its age, a cancellation),
the chunks already read from the socket are decoded and taken before the flush: an event
received is stored, or it lies in a recorded gap, never dropped unseen. Only what ends the
body itself (its end, a read error, a line or event the decoder refuses) leaves nothing
to take.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from durable_sse.contracts import Outcome
from durable_sse.errors import LineTooLongError, StreamError, StreamRefusedError
from durable_sse.reader.committer import Committer
from durable_sse.reader.keepalive import Keepalive
from durable_sse.reader.prefetch import StoredPrefetch
from durable_sse.reader.session import ReadSession
from durable_sse.sse.client import EOF, READ_AHEAD_CHUNKS, pump, read_error


class BodyReader:
    """Reads one response body into a session until an outcome."""

    def __init__(
        self,
        session: ReadSession,
        *,
        committer: Committer,
        prefetch: StoredPrefetch,
        keepalive: Keepalive,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.session = session
        self.committer = committer
        self.prefetch = prefetch
        self.keepalive = keepalive
        self.log = log

    async def read(self, response: httpx.Response) -> Outcome:
        """Read until an outcome; then stop reading new bytes and take what was read."""
        session = self.session
        spec, intake = session.spec, session.started
        queue: asyncio.Queue[Any] = asyncio.Queue(READ_AHEAD_CHUNKS)
        held: list[bytes] = []
        pumping = asyncio.create_task(pump(response, queue, held))
        self.keepalive.streaming = True
        rotate_at = time.monotonic() + spec.max_connection_age
        try:
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    # Not asyncio.wait_for: on Python 3.11 it returns the item and swallows
                    # a cancellation that lands as queue.get() completes, so a busy stream
                    # could ignore replay/pause/stop and worker shutdown (chaos scenarios 4
                    # and 5). asyncio.timeout re-raises the cancellation.
                    try:
                        async with asyncio.timeout(self._wait_budget(rotate_at)):
                            item = await queue.get()
                    except TimeoutError:
                        item = None
                now = time.monotonic()
                if item is None:
                    intake.poll(now)
                    await self.committer.submit_ready()
                    self.keepalive.beat()
                    if intake.outcome is not None:
                        return self._stop(pumping, queue, held, intake.outcome)
                    if now >= rotate_at:
                        return self._stop(pumping, queue, held, Outcome.ROTATED)
                    continue
                if item is EOF:
                    session.close_body(received_at=datetime.now(UTC), now=now)
                    session.result.error = "the server ended the stream"
                    return session.ended()
                if isinstance(item, BaseException):
                    session.body_done = True
                    session.result.error = read_error(item, spec.idle_timeout)
                    return session.ended()
                try:
                    session.feed(item, received_at=datetime.now(UTC), now=now)
                except LineTooLongError as error:
                    # What the chunk completed before the long line is kept; the cursor
                    # stays before the event that holds it, and the reconnect resumes there.
                    session.result.error = str(error)
                    self.log.warning("stream %s: %s", session.stream, error)
                    return session.ended()
                except StreamError as error:
                    # An event or id over its limit: keep what came before it (the cursor
                    # stays before the bad event), then park with the setting named.
                    self.log.warning("stream %s: %s", session.stream, error)
                    raise StreamRefusedError(
                        f"{error}; the stream is parked until resumed"
                    ) from None
                if intake.stored is not None:
                    self.prefetch.fetch()
                    if intake.stored.fetching:
                        # Reading chunk after chunk from the queue never yields to the
                        # event loop: let the page being fetched land before it is needed.
                        await asyncio.sleep(0)
                intake.poll(now)
                await self.committer.submit_ready()
                # Here too, not only when the queue stays empty for an interval: bytes that
                # commit nothing (keep-alive comments, events stored already) may come more
                # often than a heartbeat is due, and Temporal would time the attempt out.
                self.keepalive.beat()
                if intake.outcome is not None:
                    return self._stop(pumping, queue, held, intake.outcome)
        except asyncio.CancelledError:
            # A signal or the worker's shutdown: what was read is taken, then flushed.
            self._stop(pumping, queue, held, Outcome.CANCELLED)
            raise
        finally:
            pumping.cancel()

    def _stop(
        self,
        pumping: asyncio.Task[None],
        queue: asyncio.Queue[Any],
        held: list[bytes],
        outcome: Outcome,
    ) -> Outcome:
        """Read no more bytes, and take every chunk already read from the socket: those
        queued and the one the pump held for a full queue (bounded by the queue,
        ``READ_AHEAD_CHUNKS``); ``outcome``."""
        pumping.cancel()
        session = self.session
        if session.body_done:
            return outcome
        chunks: list[Any] = []
        while not queue.empty():
            chunks.append(queue.get_nowait())
        chunks.extend(held)
        held.clear()
        read_before = session.started.counts.events_read
        refused = session.take_read_ahead(
            chunks, received_at=datetime.now(UTC), now=time.monotonic()
        )
        if refused is not None:
            self.log.warning(
                "stream %s: %s (read ahead as the connection ended)", session.stream, refused
            )
        if chunks:
            self.log.debug(
                "stream %s: %d chunk(s) read ahead taken as the connection ended (%d events)",
                session.stream,
                len(chunks),
                session.started.counts.events_read - read_before,
            )
        return outcome

    def _wait_budget(self, rotate_at: float) -> float:
        now = time.monotonic()
        budget = min(self.keepalive.interval(), rotate_at - now)
        deadline = self.session.started.next_deadline(now)
        if deadline is not None:
            budget = min(budget, deadline)
        return max(budget, 0.0)
