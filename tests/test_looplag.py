"""The event-loop lag measure the reader's heartbeat interval depends on."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from durable_sse.looplag import LoopLag, recent_max


def test_the_lag_is_the_largest_recent_overshoot() -> None:
    samples = deque([(0.0, 3.0), (5.0, 0.2), (9.0, 0.5)])
    assert recent_max(samples, 9.0, 10.0) == 3.0
    assert recent_max(samples, 10.5, 10.0) == 0.5  # the 3 s overshoot is 10.5 s old
    assert recent_max(deque(), 1.0, 10.0) == 0.0


async def test_a_blocked_loop_shows_as_lag_and_then_ages_out() -> None:
    lag = LoopLag(tick=0.05, window=1.0)
    lag.start()
    try:
        await asyncio.sleep(0.2)
        assert lag.lag < 0.2
        time.sleep(0.6)  # noqa: ASYNC251 - the loop is blocked on purpose: the ticker wakes late
        await asyncio.sleep(0.2)
        assert lag.lag >= 0.4
        await asyncio.sleep(1.3)
        assert lag.lag < 0.4
    finally:
        await lag.close()
