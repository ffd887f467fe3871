"""One named stream of the source: its id sequence, history window, faults and truth.

Ids are consecutive integers from ``start_id``, and an event's bytes are a pure function
of its id, so nothing per event is stored: the history is the id range
``[oldest, newest]`` and the ground truth is ``[start_id, newest]``. Events are encoded
when a connection sends them. A rate-limited stream has a generator task that moves
``newest`` forward; a max-rate stream (``rate == 0``) moves it forward when a reader
has caught up (``extend``), so it runs exactly as fast as its fastest reader.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from durable_sse.errors import ConfigError
from durable_sse.source.config import SourceStreamConfig, updated

logger = logging.getLogger(__name__)

MAX_RATE_CHUNK = 8192
"""Ids a max-rate stream generates at once when a reader has caught up (at most
``history``, so the reader that asked never finds them already truncated)."""
_MIN_SLEEP = 0.002
_MAX_SLEEP = 0.25


@dataclass
class SourceTruth:
    """Every id the stream ever generated, and the ranges some connection really skipped."""

    ids: list[int]
    dropped: list[tuple[int, int]]
    generated: int
    history_start: int
    """Oldest id still resumable (``newest + 1`` when nothing is)."""
    unavailable: list[tuple[int, int]] = field(default_factory=list)
    """Ranges a connection asked for (its cursor was older) after the history had lost
    them: the server could no longer deliver these ids to anyone."""
    unannounced: list[tuple[int, int]] = field(default_factory=list)
    """Of ``dropped``, the ranges whose notice never went out: the connection was closed
    first (``drop`` with ``lost=true``). Nothing on the wire told of these."""

    def to_json(self) -> dict[str, Any]:
        return {
            "ids": self.ids,
            "dropped": [list(r) for r in self.dropped],
            "generated": self.generated,
            "history_start": self.history_start,
            "unavailable": [list(r) for r in self.unavailable],
            "unannounced": [list(r) for r in self.unannounced],
        }


@dataclass
class OneShot:
    """A fault that the next connection to look consumes (``drop``, ``malformed``, …)."""

    action: str
    params: dict[str, Any] = field(default_factory=dict)


class SourceStream:
    """State shared by every connection to one stream name."""

    def __init__(self, name: str, config: SourceStreamConfig, *, seed: int = 0) -> None:
        self.name = name
        self.config = config
        self.newest = config.start_id - 1
        self.oldest = config.start_id
        self.dropped: list[tuple[int, int]] = []
        self.unavailable: list[tuple[int, int]] = []
        self.unannounced: list[tuple[int, int]] = []
        self.one_shots: deque[OneShot] = deque()
        self.connections = 0
        self.rng = random.Random(f"{seed}:{name}")
        self._batches: deque[tuple[float, int]] = deque()  # (generated at, last id) for age
        self._wakeup = asyncio.Event()
        self._config_changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._template = b""
        self._encode_template()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._generate(), name=f"sse-source:{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    # -- configuration ------------------------------------------------------------

    def reconfigure(self, values: dict[str, Any]) -> None:
        """Apply setting changes at run time (validated as a whole; ``start_id`` is fixed)."""
        if "start_id" in values and int(values["start_id"]) != self.config.start_id:
            raise ConfigError("source stream setting 'start_id' cannot change at run time")
        self.config = updated(self.config, values)
        self._encode_template()
        self._trim()
        self._config_changed.set()
        self._config_changed = asyncio.Event()
        self.notify()

    def push(self, shot: OneShot) -> None:
        self.one_shots.append(shot)
        self.notify()

    def take_status(self) -> SourceStreamConfig | None:
        """The status fault to answer this connection with, consuming one of its times."""
        config = self.config
        if config.status is None:
            return None
        if config.status_times is not None:
            remaining = config.status_times - 1
            self.config = dataclasses.replace(
                config,
                status=config.status if remaining else None,
                status_times=remaining if remaining else 1,
            )
        return config

    # -- ids and events --------------------------------------------------------------

    @property
    def wakeup(self) -> asyncio.Event:
        """Set when events, settings or one-shots change; grab it before checking state."""
        return self._wakeup

    def notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def extend(self) -> bool:
        """Generate a chunk for a caught-up reader of a max-rate stream; False if not one."""
        if self.config.rate > 0 or self.config.paused:
            return False
        self._append(min(MAX_RATE_CHUNK, self.config.history))
        return True

    def encode(self, first: int, last: int) -> bytes:
        """The wire bytes of events ``first..last`` (inclusive)."""
        template = self._template
        if first == last:
            return template % (first, first)
        return b"".join([template % (i, i) for i in range(first, last + 1)])

    @property
    def event_size(self) -> int:
        return len(self._template) + 2 * len(str(max(self.newest, 1)))

    def record_drop(self, first: int, last: int) -> None:
        self.dropped.append((first, last))
        logger.info("stream %s: skipped events %d..%d on a connection", self.name, first, last)

    def record_unannounced(self, first: int, last: int) -> None:
        """The skip ``first..last`` was never announced: its connection closed first."""
        self.unannounced.append((first, last))
        logger.info(
            "stream %s: closed the connection before announcing the skip of %d..%d",
            self.name,
            first,
            last,
        )

    def record_unavailable(self, first: int, last: int) -> None:
        """A connection asked for ``first..last`` after the history had lost them."""
        if first <= last:
            self.unavailable.append((first, last))

    def truth(self) -> SourceTruth:
        self._trim()
        start = self.config.start_id
        return SourceTruth(
            ids=list(range(start, self.newest + 1)),
            dropped=list(self.dropped),
            generated=self.newest - start + 1,
            history_start=self.oldest,
            unavailable=list(self.unavailable),
            unannounced=list(self.unannounced),
        )

    def describe(self) -> dict[str, Any]:
        self._trim()
        return {
            "name": self.name,
            "config": dataclasses.asdict(self.config),
            "pending": [{"action": s.action, **s.params} for s in self.one_shots],
            "newest": self.newest,
            "history_start": self.oldest,
            "generated": self.newest - self.config.start_id + 1,
            "connections": self.connections,
            "dropped": [list(r) for r in self.dropped],
        }

    def oldest_available(self) -> int:
        """Oldest resumable id after applying the age limit now."""
        self._trim()
        return self.oldest

    # -- internals -----------------------------------------------------------------------

    def _encode_template(self) -> None:
        alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789"
        size = self.config.payload_bytes
        payload = (alphabet * (size // len(alphabet) + 1))[:size]
        event_type = self.config.event_type.encode("ascii").replace(b"%", b"%%")
        prefix = self.config.id_prefix.encode("utf-8").replace(b"%", b"%%")
        self._template = (
            b"id: "
            + prefix
            + b"%d\nevent: "
            + event_type
            + b'\ndata: {"id":%d,"payload":"'
            + payload
            + b'"}\n\n'
        )

    def _append(self, count: int) -> None:
        self.newest += count
        if self.config.history_age is not None:
            self._batches.append((asyncio.get_running_loop().time(), self.newest))
        self._trim()
        self.notify()

    def _trim(self) -> None:
        config = self.config
        oldest = max(self.oldest, self.newest - config.history + 1)
        if config.history_age is None:
            self._batches.clear()
        else:
            cutoff = asyncio.get_running_loop().time() - config.history_age
            while self._batches and self._batches[0][0] < cutoff:
                oldest = max(oldest, self._batches.popleft()[1] + 1)
        self.oldest = oldest

    async def _generate(self) -> None:
        """Move ``newest`` forward at ``rate`` events/s (a no-op while paused or max-rate)."""
        loop = asyncio.get_running_loop()
        while True:
            changed = self._config_changed
            rate = self.config.rate
            if rate <= 0 or self.config.paused:
                await changed.wait()
                continue
            began, produced = loop.time(), 0
            while not changed.is_set():
                due = int((loop.time() - began) * rate) - produced
                if due > 0:
                    produced += due
                    self._append(due)
                delay = (produced + 1) / rate - (loop.time() - began)
                try:
                    await asyncio.wait_for(changed.wait(), min(max(delay, _MIN_SLEEP), _MAX_SLEEP))
                except TimeoutError:
                    pass
