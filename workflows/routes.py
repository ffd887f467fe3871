"""Where the next connection resumes from: pure decisions, no Temporal, no I/O.

``StreamWorkflow`` keeps everything it knows in one :class:`StreamState`. After every
connection it calls :func:`record_result` (why did it end, what does that mean for the
fence, the replay and the delay), and before every connection :func:`plan_connection`
(which route, which cursor). Side effects the decisions need (persisting or clearing the
gap fence) come back as instructions the workflow carries out with activities.

The rules (DESIGN.md invariant 5):

* a plain drop, a rotation or a cancellation skipped nothing: reconnect live;
* a drop signal fences the gap and asks for a lagged reconnect, at most one per
  ``lagged_reconnect_interval``; a signal inside the interval is deferred (``pending_lagged``),
  never dropped;
* a replay that has not yet re-read past the fence resumes from its own progress
  (``Route.EXPLICIT``), not from the live cursor; once past, the fence is cleared;
* a lagged route that cannot reach back before the fence is an unrecoverable gap: counted,
  reported, and the fence cleared so the checkpoint is not frozen forever.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from durable_sse.contracts import Outcome, ReadResult, ReplaySignal, Route, StreamCounters
from durable_sse.ids import compare_ids, newest

MAX_CONNECTIONS_PER_RUN = 200
"""Connections before the workflow continues-as-new (history stays small)."""
BACKOFF_INITIAL = 1.0
BACKOFF_CAP = 60.0
HEALTHY_CONNECTION_SECONDS = 10.0
"""A DROPPED connection that read nothing and lasted less than this counts as a failure."""

HOLD_PAUSED = "paused"
HOLD_PARKED = "parked"
HOLD_STOPPED_BY_SERVER = "stopped-by-server"


@dataclass
class StreamState:
    """Everything ``StreamWorkflow`` knows; carried whole across continue-as-new."""

    live_cursor: str | None = None
    lagging_id: str | None = None
    """Last lagging id the workflow learned of (checkpoint reads); display only."""
    fence_id: str | None = None
    """The gap fence while a gap is being repaired (also persisted on the checkpoint row)."""
    gap_estimate: int | None = None
    """Sum of ``dropped_estimate`` of the drop signals behind the current fence."""

    replay_active: bool = False
    replay_from: str | None = None
    """Cursor the replay started from (the lagged start cursor or the explicit id)."""
    replay_cursor: str | None = None
    """Newest id the replay has re-read: where an interrupted replay resumes."""
    replay_checked: bool = False
    """The replay's reach-back was verified (or does not need to be)."""
    replay_for_gap: bool = False
    """The replay repairs a signalled gap (not a requested replay): failing to reach
    back is an unrecoverable gap."""

    pending_lagged: bool = False
    last_lagged_at: str | None = None
    """ISO time of the last lagged reconnect (the throttle)."""
    pending_replay: ReplaySignal | None = None
    """A ``replay`` signal not yet acted on (``since`` already resolved into ``from_id``)."""

    paused: bool = False
    hold: str | None = None
    """``parked`` or ``stopped-by-server``: wait for ``resume``."""
    stop_requested: bool = False

    failures: int = 0
    """Consecutive failed connections (backoff)."""
    next_reconnect_at: str | None = None
    route: str | None = None
    last_outcome: str | None = None
    last_error: str | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)

    schedule_ensured: bool = False
    max_connections_per_run: int = MAX_CONNECTIONS_PER_RUN


@dataclass
class ConnectionPlan:
    """What the next connection does, and the fence to persist before it starts."""

    route: Route
    start_id: str | None = None
    fence_id: str | None = None
    """Passed to the reader as ``ReadInput.fence_id`` (only while replaying)."""
    replay: bool = False
    """The connection is part of a replay."""
    persist_fence: str | None = None
    """Fence to persist (activity ``set_fence``) before connecting."""
    replay_started: bool = False


@dataclass
class Decision:
    """What the workflow must do after a connection ended."""

    delay: float = 0.0
    """Seconds before the next connection."""
    persist_fence: str | None = None
    """Fence to persist (activity ``set_fence``)."""
    clear_fence: str | None = None
    """Fence to clear (activity ``clear_fence`` up to this id)."""
    unrecoverable: bool = False
    replay_finished: bool = False


def lagged_due_at(state: StreamState, interval: float) -> datetime | None:
    """When a lagged reconnect is next allowed (None = now)."""
    if state.last_lagged_at is None:
        return None
    return datetime.fromisoformat(state.last_lagged_at) + timedelta(seconds=interval)


def lagged_allowed(state: StreamState, now: datetime, interval: float) -> bool:
    due = lagged_due_at(state, interval)
    return due is None or now >= due


def seconds_until_lagged(state: StreamState, now: datetime, interval: float) -> float | None:
    """Seconds until a pending lagged reconnect may be taken (None = none pending)."""
    if not state.pending_lagged:
        return None
    due = lagged_due_at(state, interval)
    if due is None:
        return 0.0
    return max(0.0, (due - now).total_seconds())


def backoff_delay(failures: int, *, jitter: float, retry_after: float | None = None) -> float:
    """Exponential backoff with jitter, capped, never shorter than the server's Retry-After.

    ``jitter`` is a number in [0, 1) (``workflow.random().random()``); the delay is
    between half and all of ``BACKOFF_INITIAL * 2 ** (failures - 1)`` (capped).
    """
    if failures < 1:
        base = 0.0
    else:
        base = min(BACKOFF_CAP, BACKOFF_INITIAL * 2 ** min(failures - 1, 16))
    delay = base * (0.5 + 0.5 * min(max(jitter, 0.0), 1.0))
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay


def plan_connection(
    state: StreamState, *, now: datetime, interval: float, id_order: str
) -> ConnectionPlan:
    """Choose the next connection's route; updates ``state`` (replay bookkeeping)."""
    if state.pending_replay is not None:
        signal = state.pending_replay
        state.pending_replay = None
        return _begin_replay(state, now=now, id_order=id_order, from_id=signal.from_id)
    if state.pending_lagged and lagged_allowed(state, now, interval):
        state.pending_lagged = False
        if state.replay_active and state.replay_from is not None:
            # A drop during a replay: re-read the whole replay, it covers both gaps.
            state.last_lagged_at = now.isoformat()
            state.counters.lagged_replays += 1
            state.replay_cursor = None
            state.replay_for_gap = True
            return _replay_plan(state, Route.EXPLICIT, state.replay_from, started=True)
        plan = _begin_replay(state, now=now, id_order=id_order, from_id=None, fence_live=False)
        state.replay_for_gap = True
        return plan
    if state.replay_active:
        if state.replay_cursor is not None:
            return _replay_plan(state, Route.EXPLICIT, state.replay_cursor)
        if state.replay_from is not None:
            return _replay_plan(state, Route.EXPLICIT, state.replay_from)
        return _replay_plan(state, Route.LAGGED, None)
    return ConnectionPlan(route=Route.LIVE)


def _begin_replay(
    state: StreamState,
    *,
    now: datetime,
    id_order: str,
    from_id: str | None,
    fence_live: bool = True,
) -> ConnectionPlan:
    persist: str | None = None
    if fence_live and state.live_cursor is not None:
        # A requested replay repairs up to where we are now.
        fence = newest([state.fence_id, state.live_cursor], id_order)
        if fence != state.fence_id:
            persist = fence
        state.fence_id = fence
    state.replay_active = True
    state.replay_cursor = None
    state.replay_for_gap = False
    state.counters.lagged_replays += 1
    if from_id is None:
        state.last_lagged_at = now.isoformat()
        state.replay_from = None
        state.replay_checked = False
        plan = _replay_plan(state, Route.LAGGED, None, started=True)
    else:
        state.replay_from = from_id
        state.replay_checked = True
        plan = _replay_plan(state, Route.EXPLICIT, from_id, started=True)
    plan.persist_fence = persist
    return plan


def _replay_plan(
    state: StreamState, route: Route, start_id: str | None, *, started: bool = False
) -> ConnectionPlan:
    return ConnectionPlan(
        route=route,
        start_id=start_id,
        fence_id=state.fence_id,
        replay=True,
        replay_started=started,
    )


def record_result(
    state: StreamState,
    plan: ConnectionPlan,
    result: ReadResult | None,
    *,
    id_order: str,
    jitter: float,
    duration: float,
    refused: str | None = None,
) -> Decision:
    """Fold one finished connection into ``state`` and say what to do next.

    Args:
        plan: the plan the connection ran with.
        result: what the reader returned; None when it was cancelled without a result
            (or refused).
        jitter: a number in [0, 1) for backoff jitter.
        duration: how long the connection ran (seconds, workflow time).
        refused: the message of a non-retryable refusal (StreamRefusedError/ConfigError).
    """
    decision = Decision()
    if refused is not None:
        state.failures += 1
        state.counters.failures += 1
        state.hold = HOLD_PARKED
        state.last_outcome = "refused"
        state.last_error = refused
        return decision
    reported = result is not None
    if result is None:
        result = ReadResult(outcome=Outcome.CANCELLED)
    outcome = Outcome(result.outcome)
    counters = state.counters
    counters.events_read += result.events_read
    counters.events_persisted += result.new_rows
    counters.duplicates += result.duplicates
    counters.events_recovered += result.recovered_rows
    state.live_cursor = newest([state.live_cursor, result.last_cursor], id_order)
    if result.lagging_id is not None:
        state.lagging_id = result.lagging_id
    state.last_outcome = outcome.value
    if result.error is not None:
        state.last_error = result.error  # the last error seen stays visible until a new one

    if outcome is Outcome.RETRY_LATER:
        state.failures += 1
        counters.failures += 1
        decision.delay = backoff_delay(
            state.failures, jitter=jitter, retry_after=result.retry_after
        )
        return decision

    if plan.replay and state.replay_active and reported:
        _fold_replay(state, plan, result, decision, id_order=id_order)

    healthy = result.events_read > 0 or duration >= HEALTHY_CONNECTION_SECONDS
    retry = result.retry_ms / 1000.0 if result.retry_ms is not None else 0.0
    if outcome is Outcome.DROPPED and not healthy:
        state.failures += 1
        counters.failures += 1
        decision.delay = max(retry, backoff_delay(state.failures, jitter=jitter))
    else:
        state.failures = 0
        if outcome is Outcome.DROPPED:
            decision.delay = retry

    if outcome is Outcome.DROP_SIGNAL:
        counters.drop_signals += 1
        if result.drop_position is not None:
            fence = newest([state.fence_id, result.drop_position], id_order)
            if fence != state.fence_id:
                decision.persist_fence = fence
            state.fence_id = fence
        if result.dropped_estimate is not None:
            state.gap_estimate = (state.gap_estimate or 0) + result.dropped_estimate
        state.pending_lagged = True
    elif outcome is Outcome.NO_CONTENT:
        state.hold = HOLD_STOPPED_BY_SERVER
    return decision


def _fold_replay(
    state: StreamState,
    plan: ConnectionPlan,
    result: ReadResult,
    decision: Decision,
    *,
    id_order: str,
) -> None:
    """Replay bookkeeping: reach-back check, progress, end when past the fence."""
    fence = state.fence_id
    if state.replay_from is None and result.start_cursor is not None:
        state.replay_from = result.start_cursor
    unreachable = result.history_truncated
    # A connection cancelled before it resolved its cursor says nothing about reach.
    resolved = result.outcome != Outcome.CANCELLED or result.cursor_source is not None
    if not state.replay_checked and plan.route is Route.LAGGED and resolved:
        start = result.start_cursor
        if start is None or (fence is not None and compare_ids(start, fence, id_order) >= 0):
            unreachable = True
        state.replay_checked = True
    if unreachable:
        if state.replay_for_gap:
            state.counters.gaps_unrecoverable += 1
            state.counters.events_unrecoverable += state.gap_estimate or 0
            decision.unrecoverable = True
        _end_replay(state, decision)
        return
    state.replay_cursor = newest([state.replay_cursor, result.last_cursor], id_order)
    passed = result.passed_fence or (fence is None and resolved)
    if not passed and state.replay_cursor is not None and fence is not None:
        passed = compare_ids(state.replay_cursor, fence, id_order) >= 0
    if passed:
        _end_replay(state, decision)


def _end_replay(state: StreamState, decision: Decision) -> None:
    if state.fence_id is not None:
        decision.clear_fence = state.fence_id
    decision.persist_fence = None
    decision.replay_finished = True
    state.fence_id = None
    state.gap_estimate = None
    state.replay_active = False
    state.replay_from = None
    state.replay_cursor = None
    state.replay_checked = False
    state.replay_for_gap = False


def display_state(state: StreamState, *, connected: bool, waiting: bool) -> str:
    """The ``status`` query's state word."""
    if state.stop_requested and not connected:
        return "stopped"
    if state.paused:
        return "paused"
    if state.hold is not None:
        return state.hold
    if connected:
        return "reading"
    if waiting:
        return "waiting"
    return "connecting"


def copy_state(state: StreamState) -> StreamState:
    """A deep copy (tests compare before/after)."""
    return copy.deepcopy(state)
