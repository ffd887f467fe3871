"""Serving one event-stream connection: tail the stream's history and apply its faults.

A connection keeps its own position (``next_id``) and fault counters; the stream keeps
what every connection shares. Events go out in *segments*: runs of ids with no fault
boundary inside, encoded in one go, so bulk mode costs one write per 64 KiB.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from durable_sse.source.stream import OneShot, SourceStream

logger = logging.getLogger(__name__)

BULK_BYTES = 64 * 1024
KEEPALIVE = b": keep-alive\n"
TRUNCATED = b": history truncated\n"
DROP_NOTICE = b": dropping events: discarded %d events (slow consumer)\n"
MALFORMED = (
    b": malformed block follows\n"
    b"data: \xff\xfe\xfd not utf-8\n"
    b"this line has no colon\n"
    b"id: 12\x0034\n"
    b"data: nul\x00inside\n"
    b"\n"
)
"""Invalid UTF-8, a line without a colon, an ``id`` with NUL (ignored by the WHATWG rules)
and data with NUL. A conforming parser dispatches one ``message`` event and keeps the
previous id."""


class EventConnection:
    """One client reading ``GET /streams/<name>``."""

    def __init__(
        self,
        stream: SourceStream,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        next_id: int,
    ) -> None:
        self.stream = stream
        self.writer = writer
        self._reader = reader
        self.next_id = next_id
        self.opened = asyncio.get_running_loop().time()
        self.live_from = stream.newest + 1
        """Standing drops (``drop_every``) hit only the live tail, as a real server drops a
        slow consumer's live events, never the history a replay asks for."""
        self.sent = 0
        self.since_drop = 0
        self.skip_remaining = 0
        self.skip_total = 0
        self.skip_from: int | None = None
        self.notice_lost = False
        """The drop being taken is never announced: ``notice_after`` events after the skip
        the connection closes, its notice lost with it (``drop`` with ``lost=true``)."""
        self.notice_after = 0
        """Events still to send after the skip before its notice (or the close)."""
        self.pending_notice: tuple[int, int, int] | None = None
        """``(first, last, count)`` of a completed skip whose notice waits."""
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._loop = asyncio.get_running_loop()
        self._last_write = self._loop.time()
        self._eof: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1))

    async def run(self, preamble: bytes) -> None:
        """Send ``preamble`` (head and ``retry:``), then events until a fault or the client ends."""
        self._emit(preamble)
        await self._flush()
        try:
            while not await self._step():
                pass
            await self._flush()
        finally:
            self._eof.cancel()
            if self.pending_notice is not None:
                # The connection ends (either side) before the skip was announced: its
                # notice is lost with it.
                first, last, _ = self.pending_notice
                self.stream.record_unannounced(first, last)
                self.pending_notice = None

    async def _step(self) -> bool:
        """One round: one-shots, then a batch of events or an idle wait. True = close."""
        stream = self.stream
        if stream.one_shots and await self._one_shots():
            return True
        limit = stream.config.max_connection_seconds
        if limit is not None and asyncio.get_running_loop().time() - self.opened >= limit:
            return True
        wakeup = stream.wakeup
        oldest = stream.oldest_available()
        if self.next_id < oldest:
            if oldest > stream.config.start_id:
                self._emit(TRUNCATED)
                stream.record_unavailable(max(self.next_id, stream.config.start_id), oldest - 1)
            self.next_id = oldest
        if self.next_id <= stream.newest:
            return await self._send(stream.newest)
        if stream.extend():
            return False
        await self._flush()
        return await self._idle(wakeup)

    async def _send(self, newest: int) -> bool:
        stream = self.stream
        while self.next_id <= newest:
            config = stream.config
            # Standing drops apply here: every ``drop_every`` events (None: not here).
            drop_every = (
                config.drop_every
                if config.drop_count > 0 and self.next_id >= self.live_from
                else None
            )
            if drop_every is not None and not self.skip_remaining and self.since_drop >= drop_every:
                self.since_drop = 0
                self.skip_remaining = self.skip_total = config.drop_count
            if self.skip_remaining:
                self._skip(newest)
                if config.flush == "event":
                    await self._flush()
                continue
            if config.disconnect_after is not None and self.sent >= config.disconnect_after:
                return True
            count = newest - self.next_id + 1
            if config.disconnect_after is not None:
                count = min(count, config.disconnect_after - self.sent)
            if drop_every is not None:
                count = min(count, drop_every - self.since_drop)
            if config.flush == "event" or config.disconnect_probability > 0:
                count = 1
            else:
                count = min(count, max(1, BULK_BYTES // stream.event_size))
            if self.pending_notice is not None:
                count = min(count, max(self.notice_after, 1))
            first = self.next_id
            self._emit(stream.encode(first, first + count - 1))
            self.next_id += count
            self.sent += count
            if self.pending_notice is not None and self._notice_due(count):
                return True
            if drop_every is not None:
                self.since_drop += count
            if config.flush == "event" or self._buffered >= BULK_BYTES:
                await self._flush()
            if config.disconnect_after is not None and self.sent >= config.disconnect_after:
                return True
            if config.disconnect_probability > 0:
                if stream.rng.random() < config.disconnect_probability:
                    return True
            if stream.one_shots:
                return False
        return False

    def _skip(self, newest: int) -> None:
        """Really skip events: they stay in history and truth but never reach this client."""
        count = min(self.skip_remaining, newest - self.next_id + 1)
        if self.skip_from is None:
            self.skip_from = self.next_id
        self.next_id += count
        self.skip_remaining -= count
        if not self.skip_remaining:
            self.stream.record_drop(self.skip_from, self.next_id - 1)
            self.pending_notice = (self.skip_from, self.next_id - 1, self.skip_total)
            self.skip_from = None
            self.skip_total = 0
            if not self.notice_after and not self.notice_lost:
                self._announce()

    def _announce(self) -> None:
        assert self.pending_notice is not None
        self._emit(DROP_NOTICE % self.pending_notice[2])
        self.pending_notice = None

    def _notice_due(self, sent: int) -> bool:
        """``sent`` events went out after a skip whose notice waits: announce it once its
        delay is over, or, for a notice that is to be lost, close. True = close."""
        self.notice_after = max(self.notice_after - sent, 0)
        if self.notice_after:
            return False
        if not self.notice_lost:
            self._announce()
            return False
        assert self.pending_notice is not None
        first, last, _ = self.pending_notice
        self.stream.record_unannounced(first, last)
        self.pending_notice = None
        self.notice_lost = False
        return True

    async def _one_shots(self) -> bool:
        stream = self.stream
        later: list[OneShot] = []
        try:
            while stream.one_shots:
                shot = stream.one_shots.popleft()
                if shot.params.get("first") and self.sent:
                    later.append(shot)  # for a connection that has sent nothing yet
                    continue
                if await self._one_shot(shot):
                    return True
            return False
        finally:
            stream.one_shots.extendleft(reversed(later))

    async def _one_shot(self, shot: OneShot) -> bool:
        """Apply one one-shot fault; True = close the connection."""
        stream = self.stream
        logger.info("stream %s: one-shot %s %s", stream.name, shot.action, shot.params)
        if shot.action == "drop":
            count = int(shot.params.get("count", 1))
            self.skip_remaining += count
            self.skip_total += count
            self.notice_after = int(shot.params.get("late", 0))
            self.notice_lost = bool(shot.params.get("lost", False))
            if self.notice_lost and not self.notice_after:
                self.notice_after = 1  # a skip the cursor never passes loses nothing
        elif shot.action == "malformed":
            self._emit(MALFORMED)
            await self._flush()
        elif shot.action == "oversized":
            size = int(shot.params.get("bytes", 1024 * 1024))
            self._emit((b"data: " + b"x" * max(size - 6, 0))[:size])
            await self._flush()
            if shot.params.get("close", True):
                return True
        elif shot.action == "disconnect":
            return True
        return False

    async def _idle(self, wakeup: asyncio.Event) -> bool:
        """Wait for news; a keep-alive after ``keepalive`` s of silence. True = client left."""
        keepalive = self.stream.config.keepalive
        timeout = None
        if keepalive > 0:
            timeout = keepalive - (self._loop.time() - self._last_write)
            if timeout <= 0:
                self._emit(KEEPALIVE)
                await self._flush()
                return False
        waiter = asyncio.ensure_future(wakeup.wait())
        waiting: set[asyncio.Future[Any]] = {waiter, self._eof}
        try:
            done, _ = await asyncio.wait(
                waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if self._eof in done:
            if self._eof.exception() is not None or self._eof.result() == b"":
                return True
            self._eof = asyncio.ensure_future(self._reader.read(1))  # stray bytes: ignore
        if not done:
            self._emit(KEEPALIVE)
            await self._flush()
        return False

    def _emit(self, data: bytes) -> None:
        self._buffer.append(data)
        self._buffered += len(data)

    async def _flush(self) -> None:
        if not self._buffer:
            return
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer.clear()
        self._buffered = 0
        slow = self.stream.config.slow
        if slow > 0:
            await asyncio.sleep(slow)
        self.writer.write(data)
        await self.writer.drain()
        self._last_write = self._loop.time()
