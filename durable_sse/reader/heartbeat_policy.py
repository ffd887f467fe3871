"""How often a connection heartbeats, and how many connections one worker takes — pure.

Heartbeats are how a Temporal activity shows it is alive and how a cancellation reaches
it, and they are a running stream's main cost in Temporal (docs/benchmarks.md). While the
worker hears nudges (:mod:`durable_sse.ops.nudge`) cancellations do not wait for them, and
a connection heartbeats only to stay alive; else it heartbeats often, within the worker's
budget. :class:`durable_sse.reader.keepalive.Keepalive` asks for the interval; the read
activity (``activities/read.py``) says how many connections its worker holds.
"""

from __future__ import annotations

from durable_sse.config.spec import MIN_HEARTBEAT_TIMEOUT

HEARTBEAT_INTERVAL = 0.8
"""Seconds between heartbeats, busy or quiet: cancellation arrives on heartbeats, so a
signal acts within about a second, and a busy stream heartbeats per interval, not per
batch."""
HEARTBEAT_BUDGET = 500.0
"""Heartbeats per second one worker sends at most, all connections together: past
``HEARTBEAT_BUDGET * HEARTBEAT_INTERVAL`` connections (400) the interval stretches, so a
thousand quiet streams cost 500 calls a second (signals act within ~2 s) instead of
flooding the Temporal server. The stretch stops at ``MAX_HEARTBEAT_INTERVAL``: past
``HEARTBEAT_BUDGET * MAX_HEARTBEAT_INTERVAL`` connections (2,500) a worker heartbeats over
budget rather than late."""
MAX_HEARTBEAT_INTERVAL = 5.0
"""Half the read activity's heartbeat timeout (``READ_HEARTBEAT_TIMEOUT``, 10 s, in
workflows/stream.py): however many connections a worker holds, one slow heartbeat call
does not time a live attempt out (Temporal would start a duplicate)."""
NUDGED_SHARE = 0.4
HEARTBEAT_SLACK = 60.0
"""While the worker hears nudges (durable_sse/ops/nudge.py), a connection heartbeats
every ``heartbeat_timeout - HEARTBEAT_SLACK`` seconds, or ``NUDGED_SHARE`` of the timeout
when that is longer (the stream's ``heartbeat_timeout``, 5 minutes by default: every
4 minutes, 15 an hour). A signal's cancellation comes with the heartbeat its nudge asks
for, so the regular heartbeats only show the attempt is alive: a minute (or 60 % of a
short timeout) of slack means a starved event loop never times a live attempt out, and a
lost nudge leaves a cancellation at most one interval late. Heartbeats are a running
stream's main cost in Temporal (docs/benchmarks.md)."""
LONG_TIMEOUT = 100.0
"""A heartbeat timeout from which the nudged interval leaves a full ``HEARTBEAT_SLACK``."""
NUDGED_HEARTBEAT_INTERVAL = 4.0
"""The shortest nudged interval (a heartbeat timeout of 10 s, the shortest allowed)."""

MAX_CONNECTIONS_PER_WORKER = int(HEARTBEAT_BUDGET * MAX_HEARTBEAT_INTERVAL)
"""Connections one worker takes (2,500): more could not each heartbeat every
``MAX_HEARTBEAT_INTERVAL`` within the budget. ``worker.py`` sizes its activity slots by it."""


def heartbeat_interval(
    open_connections: int, *, nudged: bool = False, timeout: float | None = None
) -> float:
    """Seconds between one connection's heartbeats when the worker holds
    ``open_connections`` and its heartbeat timeout is ``timeout``: all but
    ``HEARTBEAT_SLACK`` of the timeout while nudges reach the worker (cancellations do not
    wait for heartbeats), else short for prompt cancellations, stretched to stay within
    ``HEARTBEAT_BUDGET``, never past ``MAX_HEARTBEAT_INTERVAL``."""
    if nudged:
        timeout = timeout or MIN_HEARTBEAT_TIMEOUT
        return max(NUDGED_HEARTBEAT_INTERVAL, NUDGED_SHARE * timeout, timeout - HEARTBEAT_SLACK)
    stretched = max(HEARTBEAT_INTERVAL, open_connections / HEARTBEAT_BUDGET)
    return min(stretched, MAX_HEARTBEAT_INTERVAL)


def connection_heartbeat_interval(
    open_connections: int, *, streaming: bool, timeout: float | None, nudges_live: bool
) -> float:
    """Seconds between the heartbeats of one connection of a worker that holds
    ``open_connections``, when the worker hears nudges or not (``nudges_live``).

    A connection still resolving its cursor or waiting for a response head takes the
    long nudged interval only when its timeout leaves ``HEARTBEAT_SLACK`` or more to
    spare: under a short timeout a start-up burst that starves the event loop would
    time its attempts out, under a long one a thousand starting connections must not
    flood the server with heartbeats while it is busiest (issue 25)."""
    roomy = timeout is not None and timeout >= LONG_TIMEOUT
    nudged = (streaming or roomy) and nudges_live
    return heartbeat_interval(open_connections, nudged=nudged, timeout=timeout)
