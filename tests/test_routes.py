"""The pure route decisions: every outcome against every state that matters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_sse.contracts import Outcome, ReadResult, ReplaySignal, Route
from workflows.routes import (
    BACKOFF_CAP,
    HOLD_PARKED,
    HOLD_STOPPED_BY_SERVER,
    ConnectionPlan,
    StreamState,
    backoff_delay,
    display_state,
    plan_connection,
    record_result,
    seconds_until_lagged,
)

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
INTERVAL = 60.0
ORDER = "natural"
LIVE = ConnectionPlan(route=Route.LIVE)


def plan(state: StreamState, now: datetime = NOW) -> ConnectionPlan:
    return plan_connection(state, now=now, interval=INTERVAL, id_order=ORDER)


def record(
    state: StreamState,
    connection: ConnectionPlan,
    result: ReadResult | None,
    *,
    duration: float = 30.0,
    jitter: float = 0.5,
    refused: str | None = None,
):
    return record_result(
        state,
        connection,
        result,
        id_order=ORDER,
        jitter=jitter,
        duration=duration,
        refused=refused,
    )


def drop_signal(position: str | None, *, estimate: int | None = None) -> ReadResult:
    return ReadResult(
        outcome=Outcome.DROP_SIGNAL,
        last_cursor=position,
        events_read=5,
        new_rows=5,
        drop_position=position,
        dropped_estimate=estimate,
    )


def replaying(fence: str = "100", cursor: str | None = None) -> StreamState:
    """A state in the middle of a lagged replay that has already been reach-checked."""
    return StreamState(
        live_cursor=fence,
        fence_id=fence,
        replay_active=True,
        replay_from="40",
        replay_cursor=cursor,
        replay_checked=True,
        replay_for_gap=True,
        last_lagged_at=NOW.isoformat(),
    )


# --- plain outcomes on a live stream -----------------------------------------------------


@pytest.mark.parametrize("outcome", [Outcome.DROPPED, Outcome.ROTATED, Outcome.CANCELLED])
def test_plain_end_reconnects_live_immediately(outcome: Outcome) -> None:
    state = StreamState(live_cursor="10")
    result = ReadResult(outcome=outcome, start_cursor="10", last_cursor="25", events_read=15)
    decision = record(state, LIVE, result)
    assert decision.delay == 0.0
    assert decision.persist_fence is None and decision.clear_fence is None
    assert state.live_cursor == "25"
    assert state.counters.events_read == 15
    assert plan(state) == ConnectionPlan(route=Route.LIVE)


def test_live_cursor_only_moves_forward_numerically() -> None:
    state = StreamState(live_cursor="1000")
    record(state, LIVE, ReadResult(outcome=Outcome.DROPPED, last_cursor="999", events_read=1))
    assert state.live_cursor == "1000"


def test_server_retry_sets_the_delay_after_a_plain_drop() -> None:
    state = StreamState()
    result = ReadResult(outcome=Outcome.DROPPED, last_cursor="3", events_read=3, retry_ms=2500)
    assert record(state, LIVE, result).delay == 2.5
    assert state.failures == 0


def test_rotation_ignores_retry_and_reconnects_now() -> None:
    state = StreamState()
    result = ReadResult(outcome=Outcome.ROTATED, last_cursor="3", events_read=3, retry_ms=2500)
    assert record(state, LIVE, result).delay == 0.0


def test_unhealthy_drop_backs_off_and_counts_a_failure() -> None:
    state = StreamState(live_cursor="9")
    result = ReadResult(outcome=Outcome.DROPPED, last_cursor="9", error="connection reset")
    first = record(state, LIVE, result, duration=0.2, jitter=0.0)
    second = record(state, LIVE, result, duration=0.2, jitter=0.0)
    assert state.failures == 2 and state.counters.failures == 2
    assert 0 < first.delay < second.delay
    healthy = ReadResult(outcome=Outcome.DROPPED, last_cursor="12", events_read=3)
    assert record(state, LIVE, healthy).delay == 0.0
    assert state.failures == 0


def test_cancelled_without_result_keeps_the_state() -> None:
    state = StreamState(live_cursor="7")
    decision = record(state, LIVE, None)
    assert state.live_cursor == "7" and state.last_outcome == "cancelled"
    assert decision.delay == 0.0
    assert plan(state).route is Route.LIVE


# --- retry later and backoff -------------------------------------------------------------


def test_retry_later_honours_retry_after_and_backs_off() -> None:
    state = StreamState(live_cursor="5")
    result = ReadResult(outcome=Outcome.RETRY_LATER, retry_after=30.0, status_code=429)
    assert record(state, LIVE, result, jitter=0.0).delay == 30.0
    decisions = [
        record(state, LIVE, ReadResult(outcome=Outcome.RETRY_LATER), jitter=0.99).delay
        for _ in range(10)
    ]
    assert decisions == sorted(decisions)
    assert max(decisions) <= BACKOFF_CAP
    assert state.failures == 11
    assert plan(state).route is Route.LIVE


@pytest.mark.parametrize("failures", [1, 2, 3, 5, 8, 30, 1000])
@pytest.mark.parametrize("jitter", [0.0, 0.3, 0.999])
def test_backoff_bounds(failures: int, jitter: float) -> None:
    base = min(BACKOFF_CAP, 2.0 ** (failures - 1))
    delay = backoff_delay(failures, jitter=jitter)
    assert base / 2 <= delay <= base
    assert delay <= BACKOFF_CAP


def test_backoff_never_undercuts_retry_after_and_zero_failures_is_immediate() -> None:
    assert backoff_delay(1, jitter=0.5, retry_after=120.0) == 120.0
    assert backoff_delay(0, jitter=0.9) == 0.0


def test_retry_later_in_a_replay_retries_the_same_replay_connection() -> None:
    state = replaying(cursor="70")
    result = ReadResult(outcome=Outcome.RETRY_LATER, retry_after=5.0)
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    record(state, connection, result)
    assert state.replay_active
    nxt = plan(state)
    assert (nxt.route, nxt.start_id, nxt.fence_id) == (Route.EXPLICIT, "70", "100")


# --- 204 and refusals ----------------------------------------------------------------------


def test_no_content_stops_until_resumed() -> None:
    state = StreamState(live_cursor="5")
    record(state, LIVE, ReadResult(outcome=Outcome.NO_CONTENT, status_code=204))
    assert state.hold == HOLD_STOPPED_BY_SERVER
    assert display_state(state, connected=False, waiting=False) == "stopped-by-server"


def test_refusal_parks_with_the_message() -> None:
    state = StreamState(live_cursor="5")
    record(state, LIVE, None, refused="StreamRefusedError: HTTP 401")
    assert state.hold == HOLD_PARKED
    assert state.last_error == "StreamRefusedError: HTTP 401"
    assert display_state(state, connected=False, waiting=False) == "parked"
    assert state.live_cursor == "5"


def test_display_state_precedence() -> None:
    state = StreamState()
    assert display_state(state, connected=True, waiting=False) == "reading"
    assert display_state(state, connected=False, waiting=True) == "waiting"
    assert display_state(state, connected=False, waiting=False) == "connecting"
    state.paused = True
    assert display_state(state, connected=True, waiting=False) == "paused"
    state.stop_requested = True
    assert display_state(state, connected=False, waiting=False) == "stopped"


# --- drop signals and the throttle -------------------------------------------------------


def test_drop_signal_fences_and_takes_the_lagged_route() -> None:
    state = StreamState(live_cursor="50")
    decision = record(state, LIVE, drop_signal("60", estimate=7))
    assert decision.persist_fence == "60"
    assert state.fence_id == "60" and state.pending_lagged
    assert state.counters.drop_signals == 1 and state.gap_estimate == 7
    nxt = plan(state)
    assert (nxt.route, nxt.fence_id, nxt.replay, nxt.replay_started) == (
        Route.LAGGED,
        "60",
        True,
        True,
    )
    assert not state.pending_lagged and state.last_lagged_at == NOW.isoformat()
    assert state.counters.lagged_replays == 1


def test_drop_signal_without_position_has_nothing_to_fence() -> None:
    state = StreamState()
    decision = record(state, LIVE, drop_signal(None))
    assert decision.persist_fence is None and state.fence_id is None
    assert plan(state).route is Route.LAGGED


def test_drop_signal_inside_the_interval_is_deferred_not_dropped() -> None:
    state = StreamState(live_cursor="50", last_lagged_at=(NOW - timedelta(seconds=10)).isoformat())
    record(state, LIVE, drop_signal("60"))
    assert state.pending_lagged
    assert seconds_until_lagged(state, NOW, INTERVAL) == pytest.approx(50.0)
    assert plan(state).route is Route.LIVE
    assert state.pending_lagged  # still owed
    later = NOW + timedelta(seconds=50)
    assert seconds_until_lagged(state, later, INTERVAL) == 0.0
    nxt = plan(state, later)
    assert nxt.route is Route.LAGGED and nxt.fence_id == "60"
    assert not state.pending_lagged


def test_no_pending_lagged_means_no_timer() -> None:
    assert seconds_until_lagged(StreamState(), NOW, INTERVAL) is None


def test_second_drop_moves_the_fence_forward_only() -> None:
    state = StreamState(live_cursor="50", fence_id="60", pending_lagged=True)
    decision = record(state, LIVE, drop_signal("55"))
    assert state.fence_id == "60" and decision.persist_fence is None
    decision = record(state, LIVE, drop_signal("80", estimate=3))
    assert state.fence_id == "80" and decision.persist_fence == "80"


# --- replays -----------------------------------------------------------------------------


def test_replay_interrupted_by_a_drop_resumes_from_its_progress() -> None:
    state = StreamState(live_cursor="100")
    record(state, LIVE, drop_signal("100"))
    lagged = plan(state)
    result = ReadResult(
        outcome=Outcome.DROPPED,
        start_cursor="40",
        last_cursor="70",
        events_read=30,
        recovered_rows=4,
        cursor_source="lagging",
    )
    decision = record(state, lagged, result)
    assert decision.clear_fence is None and state.replay_active
    assert state.counters.events_recovered == 4
    assert state.live_cursor == "100"  # a replay never moves the live cursor back
    nxt = plan(state)
    assert (nxt.route, nxt.start_id, nxt.fence_id) == (Route.EXPLICIT, "70", "100")
    # interrupted again: resume from the newer progress
    record(state, nxt, ReadResult(outcome=Outcome.ROTATED, start_cursor="70", last_cursor="90"))
    assert plan(state).start_id == "90"


def test_replay_cancelled_for_pause_resumes_the_replay() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    record(state, connection, ReadResult(outcome=Outcome.CANCELLED, last_cursor="75"))
    assert plan(state).start_id == "75"


def test_lagged_connection_that_never_connected_retries_lagged() -> None:
    state = StreamState(live_cursor="100", fence_id="100", pending_lagged=True)
    lagged = plan(state)
    record(state, lagged, None)
    assert state.replay_active
    assert plan(state).route is Route.LAGGED


def test_passed_fence_clears_it_and_goes_live() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    result = ReadResult(
        outcome=Outcome.DROPPED,
        start_cursor="70",
        last_cursor="130",
        events_read=60,
        passed_fence=True,
        recovered_rows=3,
    )
    decision = record(state, connection, result)
    assert decision.clear_fence == "100" and decision.replay_finished
    assert not decision.unrecoverable
    assert state.fence_id is None and not state.replay_active
    assert state.live_cursor == "130" and state.counters.events_recovered == 3
    assert plan(state).route is Route.LIVE


def test_replay_progress_at_the_fence_counts_as_passed() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    decision = record(state, connection, ReadResult(outcome=Outcome.DROPPED, last_cursor="100"))
    assert decision.clear_fence == "100" and not state.replay_active


@pytest.mark.parametrize("start_cursor", [None, "100", "120"])
def test_lagged_route_that_cannot_reach_back_is_unrecoverable(start_cursor: str | None) -> None:
    state = StreamState(live_cursor="100")
    record(state, LIVE, drop_signal("100", estimate=12))
    lagged = plan(state)
    result = ReadResult(outcome=Outcome.DROPPED, start_cursor=start_cursor, last_cursor="130")
    decision = record(state, lagged, result)
    assert decision.unrecoverable and decision.clear_fence == "100"
    assert state.counters.gaps_unrecoverable == 1
    assert state.counters.events_unrecoverable == 12
    assert state.fence_id is None and not state.replay_active
    assert plan(state).route is Route.LIVE


def test_unknown_estimate_counts_the_gap_only() -> None:
    state = StreamState(live_cursor="100")
    record(state, LIVE, drop_signal("100"))
    decision = record(state, plan(state), ReadResult(outcome=Outcome.DROPPED, start_cursor=None))
    assert decision.unrecoverable
    assert state.counters.gaps_unrecoverable == 1 and state.counters.events_unrecoverable == 0


def test_history_truncated_during_a_gap_replay_is_unrecoverable() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    result = ReadResult(outcome=Outcome.DROPPED, last_cursor="110", history_truncated=True)
    decision = record(state, connection, result)
    assert decision.unrecoverable and decision.clear_fence == "100"
    assert state.counters.gaps_unrecoverable == 1


def test_drop_signal_during_a_replay_restarts_it_from_its_origin_when_allowed() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    decision = record(state, connection, drop_signal("80"))
    assert state.fence_id == "100" and decision.persist_fence is None
    assert state.pending_lagged
    # inside the interval: keep replaying from the progress
    nxt = plan(state, NOW + timedelta(seconds=5))
    assert (nxt.route, nxt.start_id) == (Route.EXPLICIT, "80")
    # once allowed: re-read the whole replay
    nxt = plan(state, NOW + timedelta(seconds=INTERVAL))
    assert (nxt.route, nxt.start_id, nxt.replay_started) == (Route.EXPLICIT, "40", True)
    assert not state.pending_lagged


def test_drop_signal_in_the_connection_that_passed_the_fence_starts_a_new_gap() -> None:
    state = replaying(cursor="70")
    connection = ConnectionPlan(route=Route.EXPLICIT, start_id="70", fence_id="100", replay=True)
    result = drop_signal("140")
    result.passed_fence = True
    decision = record(state, connection, result)
    assert decision.clear_fence == "100" and decision.persist_fence == "140"
    assert state.fence_id == "140" and state.pending_lagged and not state.replay_active


# --- replay signals ------------------------------------------------------------------------


def test_replay_signal_without_arguments_is_lagged_fenced_at_the_live_cursor() -> None:
    state = StreamState(live_cursor="90", pending_replay=ReplaySignal())
    nxt = plan(state)
    assert (nxt.route, nxt.fence_id, nxt.persist_fence) == (Route.LAGGED, "90", "90")
    assert state.pending_replay is None and state.counters.lagged_replays == 1


def test_replay_signal_from_id_is_explicit() -> None:
    state = StreamState(live_cursor="90", pending_replay=ReplaySignal(from_id="12"))
    nxt = plan(state)
    assert (nxt.route, nxt.start_id, nxt.fence_id) == (Route.EXPLICIT, "12", "90")
    record(state, nxt, ReadResult(outcome=Outcome.DROPPED, start_cursor="12", last_cursor="50"))
    assert plan(state).start_id == "50"


def test_requested_replay_that_cannot_reach_back_is_not_a_lost_gap() -> None:
    state = StreamState(pending_replay=ReplaySignal())
    nxt = plan(state)
    assert nxt.fence_id is None
    decision = record(state, nxt, ReadResult(outcome=Outcome.DROPPED, start_cursor=None))
    assert not decision.unrecoverable and state.counters.gaps_unrecoverable == 0
    assert not state.replay_active


def test_replay_signal_wins_over_a_pending_lagged_reconnect() -> None:
    state = StreamState(live_cursor="90", pending_lagged=True, pending_replay=ReplaySignal("5"))
    assert plan(state).start_id == "5"
    assert state.pending_lagged


def test_lagged_connection_cancelled_before_resolving_its_cursor_says_nothing() -> None:
    state = StreamState(live_cursor="100", fence_id="100", pending_lagged=True)
    lagged = plan(state)
    decision = record(state, lagged, ReadResult(outcome=Outcome.CANCELLED))
    assert not decision.unrecoverable and state.replay_active
    assert plan(state).route is Route.LAGGED
