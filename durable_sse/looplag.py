"""How late this worker's event loop runs what is due: the measure of a starved worker.

A ticker sleeps ``TICK`` seconds and records how much later than asked it woke up;
``lag`` is the largest of those overshoots over the last ``WINDOW`` seconds. The reader
heartbeats at its long nudged interval only while the lag is small: a heartbeat that is
due every 4 s arrives 4 s plus the lag apart, and on a starved machine (docs/benchmarks.md,
section 3: the 1,000-stream start-up with the machine shared) the lag reached seconds and
the server timed read attempts out.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK = 0.25
WINDOW = 10.0


class LoopLag:
    """Started once per worker (needs a running loop); never raises."""

    def __init__(self, *, tick: float = TICK, window: float = WINDOW) -> None:
        self._tick = tick
        self._window = window
        self._samples: deque[tuple[float, float]] = deque()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    @property
    def lag(self) -> float:
        """Seconds: the largest overshoot seen in the last ``WINDOW`` (0 before any)."""
        return recent_max(self._samples, time.monotonic(), self._window)

    def record(self, at: float, overshoot: float) -> None:
        self._samples.append((at, overshoot))
        while self._samples and at - self._samples[0][0] > self._window:
            self._samples.popleft()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self._tick)
            woke = time.monotonic()
            self.record(woke, max(0.0, woke - asked - self._tick))


def recent_max(samples: deque[tuple[float, float]], now: float, window: float) -> float:
    """The largest value of ``(time, value)`` samples no older than ``window`` at ``now``."""
    return max((value for at, value in samples if now - at <= window), default=0.0)
