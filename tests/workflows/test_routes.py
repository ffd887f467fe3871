"""The pure route decisions (workflows/routes.py): every outcome against the states that
matter. The workflow mirrors the store's gap summary and routes on it; these tests hand
it summaries the way a ReadResult (or a refresh from the store) would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_sse.config.replay import ReplaySignal
from durable_sse.contracts import (
    RECORDED_GAP,
    ConnectionProgress,
    DropReport,
    Outcome,
    ReadCounts,
    ReadResult,
    Route,
)
from durable_sse.gaps.model import GapSummary, GapTotals, GapView
from durable_sse.workflows.routes import (
    BACKOFF_CAP,
    BACKOFF_INITIAL,
    HEALTHY_CONNECTION_SECONDS,
    HOLD_PARKED,
    HOLD_STOPPED_BY_SERVER,
    SCHEDULE_SPREAD,
    ConnectionPlan,
    Decision,
    ReplayRequest,
    StreamState,
    backoff_delay,
    display_state,
    fold_gaps,
    live_view,
    plan_connection,
    record_result,
    schedule_delay,
    seconds_until_repair,
    server_retry_delay,
    should_interrupt,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
INTERVAL = 60.0
ORDER = "numeric"
LIVE = ConnectionPlan(route=Route.LIVE)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def view(gap_id: str = "g1", start: str = "40", end: str | None = "50", resume: str | None = None):
    return GapView(
        gap_id=gap_id,
        kind="comment",
        start_id=start,
        end_id=end,
        resume_from=resume or start,
        announced=None,
        seen_at=NOW.isoformat(),
    )


def summary(*views: GapView, **totals: int) -> GapSummary:
    totals.setdefault("open", len(views))
    return GapSummary(open=list(views), totals=GapTotals(**totals))


NO_GAPS = summary()


def result(
    outcome: Outcome = Outcome.DROPPED,
    last_cursor: str | None = None,
    *,
    gaps: GapSummary | None = NO_GAPS,
    read: int = 0,
    new_rows: int | None = None,
    drop: str | None = None,
    **fields: object,
) -> ReadResult:
    counts = ReadCounts(events_read=read, new_rows=read if new_rows is None else new_rows)
    counts.duplicates = counts.events_read - counts.new_rows
    return ReadResult(
        outcome=outcome,
        last_cursor=last_cursor,
        counts=counts,
        gaps=gaps,
        drop=DropReport(kind=drop) if drop is not None else None,
        **fields,  # type: ignore[arg-type]
    )


def dropped(last_cursor: str, gaps: GapSummary | None, kind: str = "comment") -> ReadResult:
    """A connection that ended on a drop signal of ``kind`` (the reader recorded it)."""
    return result(Outcome.DROP_SIGNAL, last_cursor, gaps=gaps, read=5, drop=kind)


def state(live: str | None = "100", gaps: GapSummary = NO_GAPS, **fields: object) -> StreamState:
    return StreamState(live_cursor=live, gaps=gaps, gaps_stale=False, **fields)  # type: ignore[arg-type]


def plan(s: StreamState, now: datetime = NOW) -> ConnectionPlan:
    return plan_connection(s, now=now, interval=INTERVAL, id_order=ORDER)


def record(
    s: StreamState,
    connection: ConnectionPlan,
    outcome: ReadResult | None,
    *,
    duration: float = 30.0,
    jitter: float = 0.5,
    refused: str | None = None,
) -> Decision:
    return record_result(
        s,
        connection,
        outcome,
        id_order=ORDER,
        jitter=jitter,
        duration=duration,
        refused=refused,
    )


def interrupts(s: StreamState, connection: ConnectionPlan, now: datetime = NOW) -> bool:
    return should_interrupt(s, connection, now=now, interval=INTERVAL)


# --- no gap: live ------------------------------------------------------------------------


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


# --- a lost result ----------------------------------------------------------------------


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


# --- retry later and backoff -------------------------------------------------------------


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


# --- 204, refusals, display --------------------------------------------------------------


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


# --- a gap open: the repair and its throttle ---------------------------------------------


def test_a_gap_open_takes_the_lagged_route_and_counts_a_new_lagged_reconnect() -> None:
    s = state(gaps=summary(view("g1"), view("g2", "60", "70")))
    nxt = plan(s)
    assert nxt == ConnectionPlan(
        route=Route.LAGGED, repairs=True, lagged_started=True, known_gaps=["g1", "g2"]
    )
    assert s.counters.lagged_replays == 1 and s.last_lagged_at == NOW.isoformat()
    assert not interrupts(s, nxt)  # it is the repair


def test_a_drop_signal_on_a_live_connection_starts_a_repair() -> None:
    s = state("90")
    decision = record(s, LIVE, dropped("100", summary(view())))
    assert decision.delay == 0.0 and not decision.refresh_gaps
    assert s.counters.drop_signals == 1 and s.counters.gaps_open == 1
    assert not s.repair_resume
    nxt = plan(s)
    assert (nxt.route, nxt.repairs, nxt.lagged_started, nxt.known_gaps) == (
        Route.LAGGED,
        True,
        True,
        ["g1"],
    )


def test_a_second_drop_signal_inside_the_interval_keeps_reading_live() -> None:
    s = state("90", last_lagged_at=at(-10).isoformat())
    record(s, LIVE, dropped("100", summary(view())))
    assert seconds_until_repair(s, NOW, INTERVAL) == pytest.approx(50.0)
    live = plan(s)
    assert live == ConnectionPlan(route=Route.LIVE, known_gaps=["g1"])
    assert s.counters.lagged_replays == 0
    assert not interrupts(s, live, at(49))
    assert interrupts(s, live, at(50))  # the repair is due: cut the live connection
    assert seconds_until_repair(s, at(50), INTERVAL) == 0.0
    assert seconds_until_repair(s, at(80), INTERVAL) == 0.0
    repair = plan(s, at(50))
    assert repair.route is Route.LAGGED and repair.lagged_started
    assert s.last_lagged_at == at(50).isoformat() and s.counters.lagged_replays == 1


def test_a_repair_cut_short_by_a_disconnect_resumes_at_once() -> None:
    s = state(gaps=summary(view()))
    repair = plan(s)
    record(s, repair, result(Outcome.DROPPED, "45", read=5, gaps=summary(view(resume="45"))))
    assert s.repair_resume and seconds_until_repair(s, at(1), INTERVAL) == pytest.approx(59.0)
    again = plan(s, at(1))  # well inside the interval
    assert (again.route, again.repairs, again.lagged_started) == (Route.LAGGED, True, False)
    assert s.counters.lagged_replays == 1 and s.last_lagged_at == NOW.isoformat()
    assert not s.repair_resume
    # the resumed repair is cut again, by a rotation: still no new lagged reconnect
    record(s, again, result(Outcome.ROTATED, "48", read=3, gaps=summary(view(resume="48"))))
    assert plan(s, at(2)).lagged_started is False
    assert s.counters.lagged_replays == 1


def test_a_repair_whose_result_was_lost_resumes_once_the_store_says_it_is_open() -> None:
    s = state(gaps=summary(view()))
    repair = plan(s)
    s.paused = True
    assert interrupts(s, repair)
    decision = record(s, repair, None)  # cancelled, its result lost with the cancel
    assert decision.refresh_gaps and s.repair_resume
    fold_gaps(s, summary(view(resume="45")))
    assert s.repair_resume
    s.paused = False
    again = plan(s, at(1))
    assert (again.route, again.lagged_started) == (Route.LAGGED, False)
    # ... and when the store says the repair got through, there is nothing to resume
    s = state(gaps=summary(view()))
    repair = plan(s)
    record(s, repair, None)
    fold_gaps(s, summary(repaired=1))
    assert not s.repair_resume and plan(s, at(1)).route is Route.LIVE


def test_a_drop_signal_during_a_repair_is_throttled() -> None:
    s = state(gaps=summary(view()))
    repair = plan(s)
    record(s, repair, dropped("47", summary(view(resume="45"), view("g2", "47", None))))
    assert not s.repair_resume and s.counters.drop_signals == 1
    live = plan(s, at(5))
    assert live.route is Route.LIVE and live.known_gaps == ["g1", "g2"]
    assert interrupts(s, live, at(60)) and not interrupts(s, live, at(59))
    assert plan(s, at(60)).lagged_started and s.counters.lagged_replays == 2


def test_a_repair_that_closed_every_gap_goes_live_and_leaves_nothing_to_resume() -> None:
    s = state(gaps=summary(view()))
    repair = plan(s)
    closed = summary(repaired=1, events_recovered=4)
    record(s, repair, result(Outcome.DROPPED, "120", read=30, gaps=closed))
    assert not s.repair_wanted and not s.repair_resume
    assert (s.counters.gaps_open, s.counters.gaps_repaired, s.counters.events_recovered) == (
        0,
        1,
        4,
    )
    assert plan(s, at(1)).route is Route.LIVE
    # a gap found later (a refresh) waits for the throttle like any other
    fold_gaps(s, summary(view("g2", "130", "140"), repaired=1, events_recovered=4))
    assert plan(s, at(2)).route is Route.LIVE
    assert plan(s, at(60)).lagged_started


def test_a_recorded_gap_ending_a_live_connection_is_not_a_drop_signal() -> None:
    s = state()
    record(s, LIVE, result(Outcome.DROP_SIGNAL, gaps=summary(view()), drop=RECORDED_GAP))
    assert s.counters.drop_signals == 0
    assert plan(s).route is Route.LAGGED
    record(s, LIVE, dropped("101", summary(view()), kind="id_gap"))
    record(s, LIVE, result(Outcome.DROP_SIGNAL, gaps=summary(view())))  # no report
    assert s.counters.drop_signals == 2


def test_should_interrupt_for_signals_whatever_the_route() -> None:
    repair = ConnectionPlan(route=Route.LAGGED, repairs=True)
    for name, value in [
        ("stop_requested", True),
        ("paused", True),
        ("pending_replay", ReplaySignal()),
    ]:
        s = state()
        setattr(s, name, value)
        assert interrupts(s, LIVE) and interrupts(s, repair), name


def test_the_open_gap_count_alone_wants_a_repair() -> None:
    """More gaps open than the summary names: the totals still ask for the repair."""
    s = state(gaps=summary(open=3))
    assert s.repair_wanted and plan(s).route is Route.LAGGED


# --- counters from the store's gap totals ------------------------------------------------


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


# --- requested replays -------------------------------------------------------------------


def test_a_replay_signal_with_no_payload_is_a_lagged_replay_to_the_live_cursor() -> None:
    s = state("90", pending_replay=ReplaySignal(), last_lagged_at=at(-5).isoformat())
    nxt = plan(s)  # a request is not throttled
    assert nxt == ConnectionPlan(
        route=Route.LAGGED,
        repairs=True,
        replay=True,
        lagged_started=True,
        replay_started=True,
        known_gaps=[],
    )
    assert s.pending_replay is None
    assert s.replay == ReplayRequest(from_id=None, target="90")
    assert (s.counters.lagged_replays, s.counters.explicit_replays) == (1, 0)
    assert s.last_lagged_at == NOW.isoformat()


def test_a_replay_signal_from_an_id_is_explicit() -> None:
    s = state("90", pending_replay=ReplaySignal(from_id="12"))
    nxt = plan(s)
    assert nxt == ConnectionPlan(
        route=Route.EXPLICIT, start_id="12", replay=True, replay_started=True, known_gaps=[]
    )
    assert s.replay == ReplayRequest(from_id="12", target="90")
    assert (s.counters.lagged_replays, s.counters.explicit_replays) == (0, 1)
    assert s.last_lagged_at is None  # no throttle spent


def test_a_replay_resumes_from_its_progress_until_it_reaches_its_target() -> None:
    s = state("90", pending_replay=ReplaySignal(from_id="12"))
    first = plan(s)
    decision = record(s, first, result(Outcome.DROPPED, "50", read=38))
    assert not decision.replay_finished and s.replay is not None and s.replay.progress == "50"
    assert s.live_cursor == "90"  # a replay never moves the live cursor back
    nxt = plan(s)
    assert nxt == ConnectionPlan(route=Route.EXPLICIT, start_id="50", replay=True, known_gaps=[])
    assert s.counters.explicit_replays == 1
    # cancelled (a pause): its progress still counts
    record(s, nxt, result(Outcome.CANCELLED, "75", read=25))
    assert plan(s).start_id == "75"
    # a result that lost ground does not move the progress back
    record(s, nxt, result(Outcome.DROPPED, "60", read=1))
    assert s.replay is not None and s.replay.progress == "75"
    decision = record(s, nxt, result(Outcome.ROTATED, "90", read=15))
    assert decision.replay_finished and s.replay is None
    assert plan(s) == ConnectionPlan(route=Route.LIVE, known_gaps=[])


def test_a_replay_past_its_target_is_finished() -> None:
    s = state("90", pending_replay=ReplaySignal(from_id="12"))
    decision = record(s, plan(s), result(Outcome.DROPPED, "130", read=118))
    assert decision.replay_finished and s.replay is None and s.live_cursor == "130"


def test_a_replay_that_could_not_connect_retries_the_same_start() -> None:
    s = state("90", pending_replay=ReplaySignal(from_id="12"))
    first = plan(s)
    decision = record(s, first, result(Outcome.RETRY_LATER, retry_after=5.0, status_code=503))
    assert decision.delay == 5.0 and s.replay is not None and not decision.replay_finished
    assert plan(s).start_id == "12"


def test_a_replay_with_no_target_ends_after_one_connection() -> None:
    s = state(None, pending_replay=ReplaySignal(from_id="12"))
    decision = record(s, plan(s), result(Outcome.DROPPED, "20", read=8))
    assert decision.replay_finished and s.replay is None


def test_a_lagged_replay_resumes_explicitly_from_its_progress() -> None:
    s = state("90", pending_replay=ReplaySignal())
    first = plan(s)
    record(s, first, result(Outcome.DROPPED, "60", read=20))
    nxt = plan(s, at(1))
    assert nxt == ConnectionPlan(route=Route.EXPLICIT, start_id="60", replay=True, known_gaps=[])
    assert s.counters.lagged_replays == 1


def test_a_lagged_replay_that_got_nowhere_retries_lagged_without_counting() -> None:
    s = state("90", pending_replay=ReplaySignal())
    first = plan(s)
    record(s, first, result(Outcome.DROPPED))
    nxt = plan(s, at(1))
    assert nxt == ConnectionPlan(route=Route.LAGGED, repairs=True, replay=True, known_gaps=[])
    assert s.counters.lagged_replays == 1


def test_a_lagged_replay_cut_short_with_a_gap_open_resumes_the_repair() -> None:
    s = state("90", gaps=summary(view()), pending_replay=ReplaySignal())
    first = plan(s)
    record(s, first, result(Outcome.DROPPED, "45", read=5, gaps=summary(view(resume="45"))))
    nxt = plan(s, at(1))
    assert (nxt.route, nxt.repairs, nxt.replay, nxt.lagged_started) == (
        Route.LAGGED,
        True,
        True,
        False,
    )
    assert s.counters.lagged_replays == 1


def test_an_explicit_replay_repairs_only_when_it_starts_before_every_open_gap() -> None:
    gaps = summary(view("g1", "40", "50"), view("g2", "60", "70", resume="65"))
    s = state("90", gaps=gaps, pending_replay=ReplaySignal(from_id="40"))
    covering = plan(s)
    assert covering.repairs and covering.known_gaps == ["g1", "g2"]
    assert not interrupts(s, covering, at(600))
    s = state("90", gaps=gaps, pending_replay=ReplaySignal(from_id="41"))
    partial = plan(s)
    assert not partial.repairs
    assert interrupts(s, partial)  # the repair is due: it takes over
    repair = plan(s)
    assert repair.route is Route.LAGGED and repair.lagged_started
    assert repair.replay is False  # an explicit replay is not the lagged one
    assert s.replay is not None and s.replay.from_id == "41"


def test_a_replay_signal_during_a_repair_interrupts_and_wins() -> None:
    s = state("90", gaps=summary(view()))
    repair = plan(s)
    s.pending_replay = ReplaySignal(from_id="5")
    assert interrupts(s, repair)
    record(s, repair, result(Outcome.CANCELLED, "44", read=4, gaps=summary(view(resume="44"))))
    assert s.repair_resume
    nxt = plan(s, at(1))
    assert (nxt.route, nxt.start_id, nxt.replay_started, nxt.repairs) == (
        Route.EXPLICIT,
        "5",
        True,
        True,
    )
    # the replay re-reads the gap itself; it goes on until it reaches 90
    record(s, nxt, result(Outcome.ROTATED, "30", read=25, gaps=summary(view(resume="44"))))
    assert (plan(s, at(2)).route, s.replay.progress if s.replay else None) == (
        Route.EXPLICIT,
        "30",
    )


def test_a_drop_signal_during_a_requested_replay_keeps_the_replay() -> None:
    s = state("90", pending_replay=ReplaySignal(from_id="12"))
    first = plan(s)
    record(s, first, dropped("40", summary(view("g1", "12", None))))
    assert s.replay is not None and s.replay.progress == "40"
    assert s.counters.drop_signals == 1
    repair = plan(s, at(1))  # never lagged yet: the repair may start now
    assert repair.route is Route.LAGGED and repair.lagged_started
    record(s, repair, result(Outcome.ROTATED, "95", read=80, gaps=summary(repaired=1)))
    assert s.replay is not None  # the repair was not the replay's connection
    assert plan(s, at(2)).start_id == "40"


# --- live view: a running connection's report, folded in for display only -----------------


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


# --- reconnects that cannot resume (issue 24, item 8) ---------------------------------------


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


# --- verify_reconnects: a connection the server ended is re-read from the lagging id -------


def verifying(s: StreamState, connection: ConnectionPlan, outcome: ReadResult) -> Decision:
    return record_result(
        s, connection, outcome, id_order=ORDER, jitter=0.5, duration=30.0, verify_reconnects=True
    )


@pytest.mark.parametrize("outcome", [Outcome.DROPPED, Outcome.DROP_SIGNAL])
def test_a_connection_the_server_ended_makes_the_next_a_verification(outcome: Outcome) -> None:
    s = state("90")
    verifying(s, LIVE, result(outcome, "100", read=10))
    assert s.verify_pending and s.repair_wanted
    nxt = plan(s)
    # The throttle allows: it is a repair from the lagging id, which records the suspicion.
    assert (nxt.route, nxt.repairs, nxt.lagged_started, nxt.verify) == (
        Route.LAGGED,
        True,
        True,
        True,
    )
    assert not interrupts(s, nxt)


def test_a_verification_inside_the_interval_reads_live_and_the_re_read_waits() -> None:
    s = state("90", last_lagged_at=at(-10).isoformat())
    verifying(s, LIVE, result(Outcome.DROPPED, "100", read=10))
    nxt = plan(s)
    assert (nxt.route, nxt.verify) == (Route.LIVE, True)  # the suspicion is recorded live
    assert not interrupts(s, nxt)
    assert interrupts(s, nxt, at(INTERVAL))  # and re-read as soon as the throttle allows


def test_the_verification_s_result_clears_it_and_its_open_suspicion_is_repaired() -> None:
    s = state("90", last_lagged_at=at(-10).isoformat())
    verifying(s, LIVE, result(Outcome.DROPPED, "100", read=10))
    nxt = plan(s)
    suspicion = view("s1", "60", None)
    verifying(s, nxt, result(Outcome.CANCELLED, "120", gaps=summary(suspicion), read=20))
    assert not s.verify_pending and s.repair_wanted
    repair = plan(s, at(INTERVAL))
    assert (repair.route, repair.verify, repair.known_gaps) == (Route.LAGGED, False, ["s1"])


def test_a_verification_whose_result_was_lost_stays_pending() -> None:
    s = state("90")
    verifying(s, LIVE, result(Outcome.DROPPED, "100", read=10))
    nxt = plan(s)
    verifying(s, nxt, None)
    assert s.verify_pending and plan(s).verify


@pytest.mark.parametrize(
    ("outcome", "read"),
    [
        (Outcome.ROTATED, 10),
        (Outcome.CANCELLED, 10),
        (Outcome.RETRY_LATER, 0),
        (Outcome.DROPPED, 0),
    ],
)
def test_our_own_endings_and_connections_that_read_nothing_verify_nothing(
    outcome: Outcome, read: int
) -> None:
    s = state("90")
    verifying(s, LIVE, result(outcome, "100", read=read))
    assert not s.verify_pending and not plan(s).verify


def test_without_the_setting_a_drop_verifies_nothing() -> None:
    s = state("90")
    record(s, LIVE, result(Outcome.DROPPED, "100", read=10))
    assert not s.verify_pending and plan(s) == ConnectionPlan(route=Route.LIVE)


def test_suspicion_totals_are_counted_from_the_store() -> None:
    s = state("90")
    fold_gaps(s, summary(suspicions=3, suspicions_closed=2, suspicions_recovered=17))
    c = s.counters
    assert (c.suspicions, c.suspicions_closed, c.suspicions_recovered) == (3, 2, 17)
