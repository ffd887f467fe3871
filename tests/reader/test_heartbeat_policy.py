"""How often a connection heartbeats, and how many connections a worker takes
(durable_sse/reader/heartbeat_policy.py, issue 13 item 6, issue 25): pure, no server."""

from __future__ import annotations

from datetime import timedelta

from durable_sse.config.spec import DEFAULT_HEARTBEAT_TIMEOUT
from durable_sse.reader.heartbeat_policy import (
    HEARTBEAT_BUDGET,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_SLACK,
    LONG_TIMEOUT,
    MAX_CONNECTIONS_PER_WORKER,
    MAX_HEARTBEAT_INTERVAL,
    NUDGED_HEARTBEAT_INTERVAL,
    connection_heartbeat_interval,
    heartbeat_interval,
)

READ_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""The shortest heartbeat timeout a stream may set (``MIN_HEARTBEAT_TIMEOUT``)."""


def test_the_heartbeat_interval_stretches_but_never_past_half_the_heartbeat_timeout() -> None:
    half = READ_HEARTBEAT_TIMEOUT.total_seconds() / 2
    assert MAX_HEARTBEAT_INTERVAL <= half
    counts = [0, 1, 400, 401, 1000, 2500, 2501, 5000, 10**6]
    intervals = [heartbeat_interval(n) for n in counts]
    assert intervals == sorted(intervals)
    assert all(HEARTBEAT_INTERVAL <= interval <= half for interval in intervals)
    assert heartbeat_interval(0) == heartbeat_interval(400) == HEARTBEAT_INTERVAL
    assert heartbeat_interval(1000) == 2.0  # 1000 connections in a budget of 500/s
    # 5000 connections stretched it to the whole 10 s timeout before.
    assert heartbeat_interval(5000) == heartbeat_interval(10**6) == MAX_HEARTBEAT_INTERVAL


def test_a_worker_that_hears_nudges_heartbeats_only_to_stay_alive() -> None:
    """Nudges bring cancellations (durable_sse/ops/nudge.py): heartbeats only keep the
    attempt alive, at one interval whatever the count, with room for one late one."""
    timeout = READ_HEARTBEAT_TIMEOUT.total_seconds()
    for count in [0, 1, 400, 1000, MAX_CONNECTIONS_PER_WORKER]:
        assert heartbeat_interval(count, nudged=True) == NUDGED_HEARTBEAT_INTERVAL
    assert 2 * NUDGED_HEARTBEAT_INTERVAL < timeout
    assert heartbeat_interval(1000, nudged=True) > heartbeat_interval(1000)  # fewer calls
    # Issue 25: the stream's heartbeat_timeout (5 minutes by default) sets the interval, all
    # but a minute of it, so a running stream costs 15 heartbeats an hour; a short timeout
    # keeps 60 % of itself as slack, and the interval is never under 4 s.
    assert heartbeat_interval(1, nudged=True, timeout=DEFAULT_HEARTBEAT_TIMEOUT) == 240.0
    assert heartbeat_interval(1, nudged=True, timeout=100.0) == 40.0
    assert heartbeat_interval(1, nudged=True, timeout=10.0) == NUDGED_HEARTBEAT_INTERVAL
    for timeout in (10.0, 30.0, 100.0, 300.0, 3600.0):
        slack = timeout - heartbeat_interval(1, nudged=True, timeout=timeout)
        assert slack >= min(HEARTBEAT_SLACK, 0.6 * timeout)
    assert heartbeat_interval(1, timeout=DEFAULT_HEARTBEAT_TIMEOUT) == HEARTBEAT_INTERVAL


def test_a_starting_connection_takes_the_nudged_interval_only_under_a_roomy_timeout() -> None:
    """Issue 25: still resolving its cursor or waiting for a response head, a connection
    heartbeats often under a short timeout (a start-up burst must not time it out) and
    rarely under a long one (a thousand starting connections must not flood the server);
    streaming, it takes the nudged interval whenever nudges reach the worker."""
    short, long = LONG_TIMEOUT - 1, DEFAULT_HEARTBEAT_TIMEOUT
    for timeout in (None, 10.0, short):
        assert connection_heartbeat_interval(
            1, streaming=False, timeout=timeout, nudges_live=True
        ) == heartbeat_interval(1, timeout=timeout)
    assert connection_heartbeat_interval(1, streaming=False, timeout=long, nudges_live=True) == (
        long - HEARTBEAT_SLACK
    )
    assert connection_heartbeat_interval(1, streaming=True, timeout=None, nudges_live=True) == (
        NUDGED_HEARTBEAT_INTERVAL
    )
    for streaming in (False, True):
        for timeout in (None, 10.0, short, long):
            assert connection_heartbeat_interval(
                1000, streaming=streaming, timeout=timeout, nudges_live=False
            ) == heartbeat_interval(1000)


def test_a_worker_takes_no_more_connections_than_it_can_heartbeat_in_time() -> None:
    from durable_sse import worker

    most = MAX_CONNECTIONS_PER_WORKER
    assert most / heartbeat_interval(most) <= HEARTBEAT_BUDGET  # within the budget
    assert heartbeat_interval(most) <= MAX_HEARTBEAT_INTERVAL  # and in time
    assert (most + 1) / MAX_HEARTBEAT_INTERVAL > HEARTBEAT_BUDGET  # one more would not be
    assert worker.MAX_CONNECTIONS_PER_WORKER == most and worker.STORE_SLOTS > 0
