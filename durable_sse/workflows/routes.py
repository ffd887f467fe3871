"""Where the next connection resumes from: pure decisions, no Temporal, no I/O.

``StreamWorkflow`` keeps everything it knows in one :class:`StreamState`. After every
connection it calls :func:`record_result` (what the connection did, what the stream's
gaps are now, how long to wait), and before every connection :func:`plan_connection`
(which route, which cursor). While a connection runs, :func:`should_interrupt` says when
to cancel it.

The workflow does not own the gaps: they are durable records the reader writes with its
batches (:mod:`durable_sse.gaps.tracker`). It mirrors their summary, read back from the store
after each connection, and routes on it:

* no gap open: live;
* a gap open: the lagged route repairs it, at most one *new* lagged reconnect per
  ``lagged_reconnect_interval`` (a second drop signal inside the interval keeps reading
  live until the interval allows), but a repair cut short by a disconnect resumes at
  once, from where it got to (the gap's ``reread_to``);
* a requested replay (``replay`` signal) reads from its ``from_id`` (or the lagging id)
  up to the live cursor of the time it was asked for, resuming from its own progress
  after a disconnect; it closes the gaps it re-reads and no other;
* with ``verify_reconnects``, a connection ended mid-read (a drop, a drop signal, a
  cancel) may have lost a notice with it: the next connection suspects what was read
  since the lagging id (a gap of kind ``suspected``, recorded by the reader) and that
  span is re-read like a repair, under the same throttle.
"""

# No `from __future__ import annotations`: Temporal decodes these dataclasses, and
# string annotations make each decode several times dearer (tests/test_payload_types.py).

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from durable_sse.config.replay import ReplaySignal
from durable_sse.config.spec import DEFAULT_MAX_RETRY_DELAY
from durable_sse.contracts import (
    RECORDED_GAP,
    ConnectionProgress,
    Outcome,
    ReadCounts,
    ReadResult,
    RetentionStatus,
    Route,
    StreamCounters,
    add_counts,
    fold_gap_totals,
)
from durable_sse.gaps.model import GapSummary
from durable_sse.ids import compare_ids, newest

MAX_CONNECTIONS_PER_RUN = 200
"""Connections before the workflow continues-as-new (history stays small)."""
MAX_HISTORY_EVENTS_PER_RUN = 10_000
"""History events after which a run continues-as-new even when the server does not
suggest it yet (it suggests at 4,096 by default): progress reports add history while one
connection lasts, so a long connection is cut short to continue-as-new."""
SCHEDULE_SPREAD = 0.9
"""A new stream creates its checkpoint schedule at a random time within this fraction of
its replay window, not before its first connection: a thousand streams started at once
no longer create a thousand schedules at once (60-90 s of a saturated Temporal server,
docs/benchmarks.md section 3). Nothing is lost: the schedule fires on the window's
epoch-aligned ticks, and no tick in a new stream's first window can move its lagging id
(nothing was persisted a window before it). A stream started again over rows of an
earlier life keeps its older lagging id up to this much longer: a lagged replay then
re-reads more, never less."""
BACKOFF_INITIAL = 1.0
BACKOFF_CAP = 60.0
HEALTHY_CONNECTION_SECONDS = 10.0
"""A DROPPED connection that read nothing and lasted less than this counts as a failure."""

HOLD_PAUSED = "paused"
HOLD_PARKED = "parked"
HOLD_STOPPED_BY_SERVER = "stopped-by-server"


@dataclass
class ReplayRequest:
    """A requested replay being carried out."""

    from_id: str | None
    """Where it started (None: the lagging id, the lagged route)."""
    target: str | None
    """The live cursor when it was asked for: it is done once it re-read that far."""
    progress: str | None = None
    """Newest id it committed: where it resumes after a disconnect."""


@dataclass
class StreamState:
    """Everything ``StreamWorkflow`` knows; carried whole across continue-as-new."""

    live_cursor: str | None = None
    lagging_id: str | None = None
    """Last lagging id the workflow learned of (display only)."""
    gaps: GapSummary = field(default_factory=GapSummary)
    """The stream's gaps as last read from the store."""
    gaps_stale: bool = True
    """A connection ended without telling what the gaps are now: read them first."""
    repair_resume: bool = False
    """The last repair was cut short without a drop signal of its own: resume it now,
    outside the throttle."""
    last_lagged_at: str | None = None
    """ISO time of the last new lagged reconnect (the throttle)."""

    replay: ReplayRequest | None = None
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
    schedule_due_at: str | None = None
    """ISO time the checkpoint schedule is to be created (kept across continue-as-new)."""
    schedule_spread: float = SCHEDULE_SPREAD
    """Fraction of the replay window over which a new stream's schedule creation is
    spread (0: create it before the first connection, as before the spread existed)."""
    retention: RetentionStatus | None = None
    """The last retention report of the checkpoint runs (display only)."""
    max_connections_per_run: int = MAX_CONNECTIONS_PER_RUN
    max_history_events: int = MAX_HISTORY_EVENTS_PER_RUN
    retry_capped_from_ms: int | None = None
    """The server's last ``retry:`` (ms) when it asked for more than ``max_retry_delay``
    and the wait was cut to that bound (None: the last one was honoured, or none came)."""
    verify_pending: bool = False
    """``verify_reconnects``: a connection ended mid-read after reading events, and no
    connection has recorded the suspicion yet (the next one does, and re-reads it)."""
    verify_from: str | None = None
    """Where the oldest connection the pending suspicion covers started."""
    counted_at: str | None = None
    """ISO time the last connection's result was folded in (the counters' age)."""

    @property
    def repair_wanted(self) -> bool:
        return bool(self.gaps.open) or self.gaps.totals.open > 0 or self.verify_pending


@dataclass
class ConnectionPlan:
    """What the next connection does."""

    route: Route
    start_id: str | None = None
    """The cursor of an EXPLICIT route."""
    repairs: bool = False
    """The connection sets out to re-read the open gaps (no need to interrupt it for a
    repair)."""
    replay: bool = False
    """The connection carries out a requested replay."""
    lagged_started: bool = False
    """A new lagged reconnect (counted, and throttled)."""
    replay_started: bool = False
    known_gaps: list[str] = field(default_factory=list)
    verify: bool = False
    """The connection records a suspicion of what was read since the lagging id
    (``StreamState.verify_pending``)."""
    verify_from: str | None = None
    """With ``verify``: ``StreamState.verify_from``."""


@dataclass
class Decision:
    """What the workflow must do after a connection ended."""

    delay: float = 0.0
    """Seconds before the next connection."""
    refresh_gaps: bool = False
    """Read the stream's gaps from the store before planning (the result had none)."""
    new_unrecoverable_events: int = 0
    new_unrecoverable_gaps: int = 0
    replay_finished: bool = False
    retry_capped_from_ms: int | None = None
    """The server's ``retry:`` (ms) asked for more than ``max_retry_delay`` (log it)."""
    reconnects_without_cursor: int = 0
    """Reconnects of this connection that could not resume (``no_resume`` gaps)."""
    first_without_cursor: bool = False
    """The stream's first reconnect that could not resume: warn, once per stream."""


def schedule_delay(replay_window: float, spread: float, jitter: float) -> float:
    """Seconds a new stream waits before creating its checkpoint schedule: ``jitter``
    (0 <= jitter < 1) of ``spread`` of its replay window, never past the window."""
    return replay_window * min(max(spread, 0.0), 1.0) * min(max(jitter, 0.0), 1.0)


def lagged_due_at(state: StreamState, interval: float) -> datetime | None:
    """When a new lagged reconnect is next allowed (None = now)."""
    if state.last_lagged_at is None:
        return None
    return datetime.fromisoformat(state.last_lagged_at) + timedelta(seconds=interval)


def lagged_allowed(state: StreamState, now: datetime, interval: float) -> bool:
    due = lagged_due_at(state, interval)
    return due is None or now >= due


def seconds_until_repair(state: StreamState, now: datetime, interval: float) -> float | None:
    """Seconds until a pending repair may interrupt a connection (None = none pending)."""
    if not state.repair_wanted:
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


def server_retry_delay(retry_ms: int | None, max_delay: float | None) -> tuple[float, int | None]:
    """Seconds to wait for the server's ``retry:`` field, and the field (ms) when it asked
    for more than ``max_delay`` and was cut to it (None: honoured as sent, or none sent).

    ``max_delay`` is the stream's ``max_retry_delay``; None honours any value (runs from
    before the bound replay as they ran).
    """
    if retry_ms is None:
        return 0.0, None
    asked = retry_ms / 1000.0
    if max_delay is None or asked <= max_delay:
        return asked, None
    return max_delay, retry_ms


def plan_connection(
    state: StreamState, *, now: datetime, interval: float, id_order: str
) -> ConnectionPlan:
    """Choose the next connection's route; updates ``state`` (throttle, replay, counts).

    A pending verification (``verify_reconnects``) rides on whatever route comes out: it
    counts as a repair (the lagged route when the throttle allows, else live, and the
    suspicion waits for the next allowed re-read), and the connection records it.
    """
    plan = _plan(state, now=now, interval=interval, id_order=id_order)
    plan.verify = state.verify_pending
    plan.verify_from = state.verify_from if plan.verify else None
    return plan


def _plan(state: StreamState, *, now: datetime, interval: float, id_order: str) -> ConnectionPlan:
    known = state.gaps.open_ids
    if state.pending_replay is not None:
        signal = state.pending_replay
        state.pending_replay = None
        state.replay = ReplayRequest(from_id=signal.from_id, target=state.live_cursor)
        if signal.from_id is None:
            state.counters.lagged_replays += 1
            state.last_lagged_at = now.isoformat()
            return ConnectionPlan(
                route=Route.LAGGED,
                repairs=True,
                replay=True,
                lagged_started=True,
                replay_started=True,
                known_gaps=known,
            )
        state.counters.explicit_replays += 1
        return ConnectionPlan(
            route=Route.EXPLICIT,
            start_id=signal.from_id,
            repairs=_covers(state, signal.from_id, id_order),
            replay=True,
            replay_started=True,
            known_gaps=known,
        )
    if state.repair_wanted and (state.repair_resume or lagged_allowed(state, now, interval)):
        started = not state.repair_resume
        state.repair_resume = False
        if started:
            state.last_lagged_at = now.isoformat()
            state.counters.lagged_replays += 1
        return ConnectionPlan(
            route=Route.LAGGED,
            repairs=True,
            replay=state.replay is not None and state.replay.from_id is None,
            lagged_started=started,
            known_gaps=known,
        )
    if state.replay is not None:
        resume = state.replay.progress or state.replay.from_id
        if resume is None:
            return ConnectionPlan(route=Route.LAGGED, repairs=True, replay=True, known_gaps=known)
        return ConnectionPlan(
            route=Route.EXPLICIT,
            start_id=resume,
            repairs=_covers(state, resume, id_order),
            replay=True,
            known_gaps=known,
        )
    return ConnectionPlan(route=Route.LIVE, known_gaps=known)


def _covers(state: StreamState, start_id: str, id_order: str) -> bool:
    """Whether a connection from ``start_id`` re-reads every open gap the workflow knows."""
    if not state.gaps.open:
        return False
    for gap in state.gaps.open:
        if gap.resume_from is None or compare_ids(start_id, gap.resume_from, id_order) > 0:
            return False
    return True


def should_interrupt(
    state: StreamState, plan: ConnectionPlan, *, now: datetime, interval: float
) -> bool:
    """Whether the running connection must be cancelled (a signal, or a repair is due)."""
    if state.stop_requested or state.paused or state.pending_replay is not None:
        return True
    if plan.repairs or not state.repair_wanted:
        return False
    return lagged_allowed(state, now, interval)


def may_have_lost_a_notice(outcome: Outcome, counts: ReadCounts) -> bool:
    """Whether a connection that ended so may have taken a drop notice with it: it read
    events, and the server ended it (a drop, a drop signal) or the workflow did (a
    cancel): a server that skipped events and announces them a few events later never
    gets to, either way. A rotation is the reader's own end, after a grace once it
    repaired (``DROP_GRACE``); a refusal or a retry read nothing. With
    ``verify_reconnects`` the next connection re-reads such a connection's span (chaos 12,
    seed 498927536: a live connection cancelled for a repair between a skip and its notice
    lost 40 ids, the repair ending before it re-read them)."""
    return (
        outcome in (Outcome.DROPPED, Outcome.DROP_SIGNAL, Outcome.CANCELLED)
        and counts.events_read > 0
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
    max_retry_delay: float | None = DEFAULT_MAX_RETRY_DELAY,
    verify_reconnects: bool = False,
) -> Decision:
    """Fold one finished connection into ``state`` and say what to do next.

    Args:
        plan: the plan the connection ran with.
        result: what the reader returned; None when it was cancelled without a result
            (or refused): its gaps are then read from the store.
        jitter: a number in [0, 1) for backoff jitter.
        duration: how long the connection ran (seconds, workflow time).
        refused: the message of a non-retryable refusal (StreamRefusedError/ConfigError).
        max_retry_delay: the stream's bound on the server's ``retry:`` (None: none, see
            :func:`server_retry_delay`).
        verify_reconnects: the stream's setting: a connection ended mid-read after
            reading events makes the next one a verification.
    """
    decision = Decision()
    if refused is not None:
        state.failures += 1
        state.counters.failures += 1
        state.hold = HOLD_PARKED
        state.last_outcome = "refused"
        state.last_error = refused
        state.gaps_stale = decision.refresh_gaps = True
        return decision
    unknown = result is None
    if result is None:
        result = ReadResult(outcome=Outcome.CANCELLED)  # the suspicion, if any, stays pending
    elif plan.verify:
        state.verify_pending = False  # recorded with the connection's first batch or flush
        state.verify_from = None
    outcome = Outcome(result.outcome)
    if verify_reconnects and (unknown or may_have_lost_a_notice(outcome, result.counts)):
        if not state.verify_pending:
            # Where the connection to verify began: before the stream has a lagging id,
            # the suspicion starts there (the next connection's own cursor is the newest
            # stored id, past everything this one read). Simulation seed 615092678.
            state.verify_from = result.start_cursor
        state.verify_pending = True
    counters = state.counters
    blind_before = counters.reconnects_without_cursor
    _add_reading(state, result.counts, result.last_cursor, result.lagging_id, id_order)
    decision.reconnects_without_cursor = counters.reconnects_without_cursor - blind_before
    decision.first_without_cursor = blind_before == 0 and decision.reconnects_without_cursor > 0
    state.last_outcome = outcome.value
    if result.error is not None:
        state.last_error = result.error  # the last error seen stays visible until a new one
    if result.gaps is not None:
        fold_gaps(state, result.gaps, decision)
    else:
        state.gaps_stale = decision.refresh_gaps = True

    if plan.replay and state.replay is not None:
        replay = state.replay
        replay.progress = newest([replay.progress, result.last_cursor], id_order)
        reached = replay.target is None or (
            replay.progress is not None
            and compare_ids(replay.progress, replay.target, id_order) >= 0
        )
        if reached and outcome is not Outcome.RETRY_LATER:
            state.replay = None
            decision.replay_finished = True

    drop_signal = outcome is Outcome.DROP_SIGNAL
    # Only a repair cut short (a gap still open) resumes: one that finished leaves no
    # resume behind for a gap found later, which is a new, throttled lagged reconnect.
    state.repair_resume = (
        plan.route is Route.LAGGED and plan.repairs and not drop_signal and state.repair_wanted
    )
    if drop_signal and (result.drop is None or result.drop.kind != RECORDED_GAP):
        counters.drop_signals += 1

    if outcome is Outcome.RETRY_LATER:
        state.failures += 1
        counters.failures += 1
        decision.delay = backoff_delay(
            state.failures, jitter=jitter, retry_after=result.retry_after
        )
        return decision
    healthy = result.counts.events_read > 0 or duration >= HEALTHY_CONNECTION_SECONDS
    retry, capped = server_retry_delay(result.retry_ms, max_retry_delay)
    if outcome is Outcome.DROPPED and result.retry_ms is not None:
        # The only outcome that waits for the server's retry: say whether it was cut.
        state.retry_capped_from_ms = decision.retry_capped_from_ms = capped
    if outcome is Outcome.DROPPED and not healthy:
        state.failures += 1
        counters.failures += 1
        decision.delay = max(retry, backoff_delay(state.failures, jitter=jitter))
    else:
        state.failures = 0
        if outcome is Outcome.DROPPED:
            decision.delay = retry
    if outcome is Outcome.NO_CONTENT:
        state.hold = HOLD_STOPPED_BY_SERVER
    return decision


def fold_gaps(state: StreamState, gaps: GapSummary, decision: Decision | None = None) -> None:
    """Adopt the store's view of the stream's gaps, and count what became unrecoverable."""
    counters = state.counters
    totals = gaps.totals
    if decision is not None:
        decision.new_unrecoverable_events = max(
            totals.events_unrecoverable - counters.events_unrecoverable, 0
        )
        decision.new_unrecoverable_gaps = max(totals.unrecoverable - counters.gaps_unrecoverable, 0)
    state.gaps = gaps
    state.gaps_stale = False
    fold_gap_totals(counters, totals)
    if not state.repair_wanted:
        state.repair_resume = False


def live_view(
    state: StreamState, progress: ConnectionProgress | None, *, id_order: str
) -> StreamState:
    """What the stream looks like with the running connection's last report folded in.

    A copy: ``state`` itself learns a connection's work only from its result (the report's
    counts are the same running totals the result will carry), so nothing is counted
    twice and no decision ever rests on a report.
    """
    view = copy.deepcopy(state)
    if progress is None:
        return view
    _add_reading(view, progress.counts, progress.cursor, progress.lagging_id, id_order)
    if progress.gaps is not None:
        fold_gaps(view, progress.gaps)
    return view


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


def attribute_state(display: str) -> str:
    """The ``SseStreamState`` search attribute for a ``status`` state word.

    ``connecting`` (between two connections, usually within one workflow task) counts as
    ``reading``: the attribute changes when the stream's condition does, not on every
    reconnect, and each change costs a history event.
    """
    return "reading" if display == "connecting" else display


def copy_state(state: StreamState) -> StreamState:
    """A deep copy (tests compare before/after)."""
    return copy.deepcopy(state)


def _add_reading(
    state: StreamState,
    counts: ReadCounts,
    cursor: str | None,
    lagging_id: str | None,
    id_order: str,
) -> None:
    """What a connection read, from its result or its latest report (the counting rule is
    :func:`durable_sse.contracts.add_counts`, which the live status uses too)."""
    add_counts(state.counters, counts)
    state.live_cursor = newest([state.live_cursor, cursor], id_order)
    if lagging_id is not None:
        state.lagging_id = lagging_id
