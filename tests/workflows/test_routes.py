"""The pure route decisions (durable_sse/workflows/routes.py) with no gap open: live
reads, lost results, retries and backoff, 204 and refusals, the counters and the live
view. Every outcome against the states that matter."""

from __future__ import annotations

import pytest

from durable_sse.contracts import (
    ConnectionProgress,
    Outcome,
    ReadCounts,
    Route,
)
from durable_sse.gaps.model import GapSummary, GapTotals
from durable_sse.workflows.routes import (
    BACKOFF_CAP,
    BACKOFF_INITIAL,
    HEALTHY_CONNECTION_SECONDS,
    HOLD_PARKED,
    HOLD_STOPPED_BY_SERVER,
    SCHEDULE_SPREAD,
    ConnectionPlan,
    Decision,
    StreamState,
    backoff_delay,
    display_state,
    fold_gaps,
    live_view,
    record_result,
    schedule_delay,
    seconds_until_repair,
    server_retry_delay,
)
from tests.workflows.route_helpers import (
    INTERVAL,
    LIVE,
    NOW,
    ORDER,
    interrupts,
    plan,
    record,
    result,
    state,
    summary,
    view,
)


def test_a_stream_with_no_gap_reads_live() -> None:
    s = state()
    assert plan(s) == ConnectionPlan(route=Route.LIVE, known_gaps=[])
    assert s.counters.lagged_replays == 0 and s.last_lagged_at is None
    assert seconds_until_repair(s, NOW, INTERVAL) is None
    assert not interrupts(s, LIVE)


@pytest.mark.parametrize("outcome", [Outcome.DROPPED, Outcome.ROTATED, Outcome.CANCELLED])
def test_plain_end_reconnects_live_immediately(outcome: Outcome) -> None:
    s = state("10")
    decision = record(s, LIVE, result(outcome, "25", read=15, new_rows=12, start_cursor="10"))
    assert decision == Decision()
    assert s.live_cursor == "25" and s.last_outcome == outcome.value
    assert (s.counters.events_read, s.counters.events_persisted, s.counters.duplicates) == (
        15,
        12,
        3,
    )
    assert plan(s).route is Route.LIVE


def test_a_connection_its_worker_ended_reconnects_now_however_short_and_after_failures() -> None:
    """A worker that stops (SIGTERM) or hands a connection over ends it as CANCELLED,
    perhaps a moment after it began and before it read anything: the next connection
    starts at once, live, on another worker, with no backoff left from earlier failures
    (issue 34: the hand-over waits for no timer)."""
    s = state("10", failures=3)
    decision = record(s, LIVE, result(Outcome.CANCELLED, "10"), duration=0.05, jitter=0.99)
    assert decision == Decision()
    assert s.failures == 0 and s.next_reconnect_at is None
    assert plan(s).route is Route.LIVE


def test_live_cursor_only_moves_forward_by_the_id_order() -> None:
    s = state("1000")
    record(s, LIVE, result(Outcome.DROPPED, "999", read=1))
    assert s.live_cursor == "1000"
    record(s, LIVE, result(Outcome.DROPPED, None, read=1))
    assert s.live_cursor == "1000"
    record(s, LIVE, result(Outcome.DROPPED, "1001", read=1))
    assert s.live_cursor == "1001"


def test_the_result_s_lagging_id_and_error_are_kept_for_the_status() -> None:
    s = state()
    record(s, LIVE, result(Outcome.DROPPED, read=1, lagging_id="70", error="connection reset"))
    assert (s.lagging_id, s.last_error) == ("70", "connection reset")
    record(s, LIVE, result(Outcome.ROTATED, read=1))
    assert (s.lagging_id, s.last_error) == ("70", "connection reset")


def test_server_retry_sets_the_delay_after_a_plain_drop() -> None:
    s = state()
    assert record(s, LIVE, result(Outcome.DROPPED, "3", read=3, retry_ms=2500)).delay == 2.5
    assert s.failures == 0


def test_rotation_ignores_retry_and_reconnects_now() -> None:
    s = state()
    assert record(s, LIVE, result(Outcome.ROTATED, "3", read=3, retry_ms=2500)).delay == 0.0


def test_unhealthy_drop_backs_off_and_counts_a_failure() -> None:
    s = state("9")
    failed = result(Outcome.DROPPED, "9", error="connection reset")
    first = record(s, LIVE, failed, duration=0.2, jitter=0.0)
    second = record(s, LIVE, failed, duration=0.2, jitter=0.0)
    assert s.failures == 2 and s.counters.failures == 2
    assert (first.delay, second.delay) == (BACKOFF_INITIAL / 2, BACKOFF_INITIAL)
    # the server's retry wins when it is longer
    third = record(s, LIVE, result(Outcome.DROPPED, retry_ms=9000), duration=0.2, jitter=0.0)
    assert third.delay == 9.0 and s.failures == 3
    assert record(s, LIVE, result(Outcome.DROPPED, "12", read=3)).delay == 0.0
    assert s.failures == 0


def test_the_servers_retry_is_honoured_up_to_the_bound() -> None:
    assert server_retry_delay(None, 300.0) == (0.0, None)
    assert server_retry_delay(2500, 300.0) == (2.5, None)
    assert server_retry_delay(300_000, 300.0) == (300.0, None)  # the bound itself is honoured
    assert server_retry_delay(300_001, 300.0) == (300.0, 300_001)
    assert server_retry_delay(99_999_999_999, 300.0) == (300.0, 99_999_999_999)
    assert server_retry_delay(2500, 0.0) == (0.0, 2500)  # 0: backoff only
    # No bound: a run from before it existed replays as it ran.
    assert server_retry_delay(99_999_999_999, None) == (99_999_999.999, None)


def test_a_retry_of_years_waits_the_bound_and_says_so() -> None:
    """Issue 24, item 6: a server sends ``retry: 99999999999`` and closes."""
    s = state()
    huge = result(Outcome.DROPPED, retry_ms=99_999_999_999)
    decision = record_result(
        s, LIVE, huge, id_order=ORDER, jitter=0.5, duration=0.2, max_retry_delay=300.0
    )
    assert decision.delay == 300.0  # not 99,999,999 s
    assert decision.retry_capped_from_ms == s.retry_capped_from_ms == 99_999_999_999
    # Unhealthy (it read nothing): still at least the backoff, never past the bound.
    assert s.failures == 1
    # A later retry within the bound is honoured, and the status no longer says capped.
    honoured = record(s, LIVE, result(Outcome.DROPPED, "3", read=3, retry_ms=2500))
    assert honoured.delay == 2.5 and honoured.retry_capped_from_ms is None
    assert s.retry_capped_from_ms is None


def test_the_bound_applies_only_where_the_retry_is_waited_for() -> None:
    s = state()
    rotated = record(s, LIVE, result(Outcome.ROTATED, "3", read=3, retry_ms=99_999_999_999))
    assert rotated.delay == 0.0 and rotated.retry_capped_from_ms is None
    assert s.retry_capped_from_ms is None


def test_a_long_connection_that_read_nothing_is_healthy() -> None:
    s = state()
    decision = record(s, LIVE, result(Outcome.DROPPED), duration=HEALTHY_CONNECTION_SECONDS)
    assert decision.delay == 0.0 and s.failures == 0


def test_a_lost_result_reads_the_gaps_from_the_store() -> None:
    s = state("7")
    decision = record(s, LIVE, None)
    assert decision.refresh_gaps and s.gaps_stale
    assert decision.delay == 0.0
    assert (s.live_cursor, s.last_outcome) == ("7", "cancelled")
    # the workflow then folds what the store says, and the repair starts
    fold_gaps(s, summary(view()))
    assert not s.gaps_stale and s.repair_wanted
    assert plan(s).route is Route.LAGGED


def test_a_result_without_gaps_also_reads_them_from_the_store() -> None:
    s = state()
    decision = record(s, LIVE, result(Outcome.DROPPED, "101", read=1, gaps=None))
    assert decision.refresh_gaps and s.gaps_stale and s.live_cursor == "101"


def test_a_result_with_gaps_needs_no_refresh() -> None:
    s = state()
    s.gaps_stale = True
    decision = record(s, LIVE, result(Outcome.DROPPED, "101", read=1))
    assert not decision.refresh_gaps and not s.gaps_stale


def test_retry_later_honours_retry_after_and_backs_off() -> None:
    s = state("5")
    first = record(s, LIVE, result(Outcome.RETRY_LATER, retry_after=30.0, status_code=429))
    assert first.delay == 30.0
    delays = [record(s, LIVE, result(Outcome.RETRY_LATER), jitter=0.99).delay for _ in range(10)]
    assert delays == sorted(delays)
    assert delays[-1] == pytest.approx(BACKOFF_CAP * (0.5 + 0.5 * 0.99))
    assert s.failures == 11 and s.counters.failures == 11
    assert plan(s).route is Route.LIVE


@pytest.mark.parametrize("failures", [1, 2, 3, 5, 8, 30, 1000])
@pytest.mark.parametrize("jitter", [0.0, 0.3, 0.999])
def test_backoff_bounds(failures: int, jitter: float) -> None:
    base = min(BACKOFF_CAP, BACKOFF_INITIAL * 2.0 ** min(failures - 1, 16))
    delay = backoff_delay(failures, jitter=jitter)
    assert delay == pytest.approx(base * (0.5 + 0.5 * jitter))
    assert base / 2 <= delay <= base <= BACKOFF_CAP


def test_backoff_never_undercuts_retry_after_and_zero_failures_is_immediate() -> None:
    assert backoff_delay(1, jitter=0.5, retry_after=120.0) == 120.0
    assert backoff_delay(5, jitter=0.5, retry_after=1.0) == 12.0
    assert backoff_delay(0, jitter=0.9) == 0.0
    assert backoff_delay(1, jitter=-3.0) == 0.5  # jitter is clamped to [0, 1]
    assert backoff_delay(1, jitter=7.0) == 1.0


def test_no_content_stops_until_resumed() -> None:
    s = state("5")
    decision = record(s, LIVE, result(Outcome.NO_CONTENT, status_code=204))
    assert s.hold == HOLD_STOPPED_BY_SERVER and decision.delay == 0.0 and s.failures == 0
    assert display_state(s, connected=False, waiting=False) == "stopped-by-server"


def test_refusal_parks_with_the_message_and_rereads_the_gaps() -> None:
    s = state("5")
    decision = record(s, LIVE, None, refused="StreamRefusedError: HTTP 401")
    assert s.hold == HOLD_PARKED and s.last_outcome == "refused"
    assert s.last_error == "StreamRefusedError: HTTP 401"
    assert s.failures == 1 and s.counters.failures == 1
    assert decision.refresh_gaps and s.gaps_stale
    assert display_state(s, connected=False, waiting=False) == "parked"
    assert s.live_cursor == "5"


def test_display_state_precedence() -> None:
    s = state()
    assert display_state(s, connected=True, waiting=False) == "reading"
    assert display_state(s, connected=False, waiting=True) == "waiting"
    assert display_state(s, connected=False, waiting=False) == "connecting"
    s.hold = HOLD_PARKED
    assert display_state(s, connected=False, waiting=True) == "parked"
    s.paused = True
    assert display_state(s, connected=True, waiting=False) == "paused"
    stopping = state(stop_requested=True)
    assert display_state(stopping, connected=True, waiting=False) == "reading"  # flushing
    assert display_state(stopping, connected=False, waiting=False) == "stopped"


def test_gap_totals_drive_the_counters_and_the_new_unrecoverable_deltas() -> None:
    s = state()
    first = summary(
        view(),
        repaired=2,
        unrecoverable=2,
        events_unrecoverable=5,
        unknown_size=1,
        events_recovered=9,
    )
    decision = record(s, LIVE, result(Outcome.DROPPED, "101", read=1, gaps=first))
    c = s.counters
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable, c.gaps_unknown_size) == (1, 2, 2, 1)
    assert (c.events_unrecoverable, c.events_recovered) == (5, 9)
    assert (decision.new_unrecoverable_events, decision.new_unrecoverable_gaps) == (5, 2)
    # the same totals again: nothing new
    decision = record(s, LIVE, result(Outcome.DROPPED, "102", read=1, gaps=first))
    assert (decision.new_unrecoverable_events, decision.new_unrecoverable_gaps) == (0, 0)
    # a gap of unknown size: a new gap, no new events
    more = summary(unrecoverable=3, events_unrecoverable=5, unknown_size=2, repaired=3)
    decision = record(s, LIVE, result(Outcome.DROPPED, "103", read=1, gaps=more))
    assert (decision.new_unrecoverable_events, decision.new_unrecoverable_gaps) == (0, 1)
    assert (c.gaps_open, c.gaps_unknown_size) == (0, 2)
    most = summary(unrecoverable=4, events_unrecoverable=12, unknown_size=2, repaired=3)
    decision = record(s, LIVE, result(Outcome.DROPPED, "104", read=1, gaps=most))
    assert (decision.new_unrecoverable_events, decision.new_unrecoverable_gaps) == (7, 1)
    assert c.events_unrecoverable == 12


def test_totals_that_shrink_report_no_negative_deltas() -> None:
    s = state()
    fold_gaps(s, summary(unrecoverable=2, events_unrecoverable=8))
    decision = Decision()
    fold_gaps(s, summary(unrecoverable=1, events_unrecoverable=3), decision)
    assert (decision.new_unrecoverable_events, decision.new_unrecoverable_gaps) == (0, 0)
    assert (s.counters.gaps_unrecoverable, s.counters.events_unrecoverable) == (1, 3)


def test_fold_gaps_without_a_decision_still_adopts_the_totals() -> None:
    s = state()
    s.gaps_stale = True
    fold_gaps(s, summary(view(), unrecoverable=1, events_unrecoverable=4))
    assert not s.gaps_stale and s.gaps.open_ids == ["g1"]
    assert (s.counters.gaps_open, s.counters.events_unrecoverable) == (1, 4)


def test_counters_sum_over_connections_but_gap_counters_mirror_the_store() -> None:
    s = state()
    gaps = summary(repaired=1, events_recovered=3)
    record(s, LIVE, result(Outcome.DROPPED, "101", read=10, new_rows=8, gaps=gaps))
    record(s, LIVE, result(Outcome.DROPPED, "105", read=4, new_rows=4, gaps=gaps))
    c = s.counters
    assert (c.events_read, c.events_persisted, c.duplicates) == (14, 12, 2)
    assert (c.gaps_repaired, c.events_recovered) == (1, 3)


def test_reused_ids_are_summed_beside_duplicates_never_into_them() -> None:
    """Issue 24 item 7: ``ids_reused`` reaches the status (and the live view) as its own
    counter."""
    s = state()
    restarted = result(Outcome.DROPPED, "5", read=3, new_rows=3)
    restarted.counts.ids_reused = 3
    record(s, LIVE, restarted)
    record(s, LIVE, result(Outcome.DROPPED, "5", read=3, new_rows=0))
    c = s.counters
    assert (c.events_persisted, c.duplicates, c.ids_reused) == (3, 3, 3)
    shown = live_view(
        s, ConnectionProgress(cursor="6", counts=ReadCounts(ids_reused=2)), id_order=ORDER
    )
    assert shown.counters.ids_reused == 5 and s.counters.ids_reused == 3


def test_a_report_is_folded_into_a_copy_and_never_into_the_state() -> None:
    state = StreamState(live_cursor="900", lagging_id="100")
    state.counters.events_persisted = 900
    report = ConnectionProgress(
        connection=3,
        cursor="1000",
        counts=ReadCounts(events_read=120, new_rows=100, duplicates=20),
        lagging_id="400",
        gaps=GapSummary(open=[view()], totals=GapTotals(open=1, repaired=2)),
    )
    shown = live_view(state, report, id_order=ORDER)
    assert (shown.live_cursor, shown.lagging_id) == ("1000", "400")
    c = shown.counters
    assert (c.events_persisted, c.events_read, c.duplicates) == (1000, 120, 20)
    assert (c.gaps_open, c.gaps_repaired) == (1, 2) and shown.repair_wanted
    # The state learns the connection's work from its result only.
    assert (state.live_cursor, state.lagging_id, state.counters.events_persisted) == (
        "900",
        "100",
        900,
    )
    assert state.counters.gaps_open == 0 and not state.repair_wanted


def test_a_report_without_store_reads_keeps_what_the_state_knows() -> None:
    state = StreamState(live_cursor="1000", lagging_id="100")
    state.counters.gaps_open = 1
    shown = live_view(state, ConnectionProgress(cursor="999"), id_order=ORDER)
    assert (shown.live_cursor, shown.lagging_id, shown.counters.gaps_open) == ("1000", "100", 1)
    assert live_view(state, None, id_order=ORDER) == state


def test_schedule_creation_is_spread_within_the_first_replay_window() -> None:
    window = 600.0
    delays = [schedule_delay(window, SCHEDULE_SPREAD, j / 100) for j in range(100)]
    assert delays == sorted(delays) and delays[0] == 0.0
    assert delays[-1] < SCHEDULE_SPREAD * window < window  # due before the window ends
    assert schedule_delay(window, 0.0, 0.99) == 0.0  # no spread: before connecting
    # Out-of-range inputs never push it past the window (or before now).
    assert schedule_delay(window, 5.0, 0.999) < window
    assert schedule_delay(window, -1.0, 0.5) == schedule_delay(window, 0.5, -1.0) == 0.0


def test_reconnects_without_a_cursor_are_counted_and_warned_of_once_per_stream() -> None:
    s = state(None)
    blind = result(Outcome.DROPPED, read=10, gaps=summary(unrecoverable=1, unknown_size=1))
    blind.counts.reconnects_without_cursor = 1
    first = record(s, LIVE, result(Outcome.DROPPED, read=10))
    assert (first.reconnects_without_cursor, first.first_without_cursor) == (0, False)
    second = record(s, LIVE, blind)
    assert (second.reconnects_without_cursor, second.first_without_cursor) == (1, True)
    assert second.new_unrecoverable_gaps == 1
    blind.gaps = summary(unrecoverable=2, unknown_size=2)
    third = record(s, LIVE, blind)
    assert (third.reconnects_without_cursor, third.first_without_cursor) == (1, False)
    c = s.counters
    assert (c.reconnects_without_cursor, c.gaps_unknown_size, c.gaps_unrecoverable) == (2, 2, 2)
