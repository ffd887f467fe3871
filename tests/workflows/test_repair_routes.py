"""The pure route decisions (durable_sse/workflows/routes.py) with a gap open or a replay
requested: the repair and its throttle, replays, and verified reconnects."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from durable_sse.config.replay import ReplaySignal
from durable_sse.contracts import (
    RECORDED_GAP,
    Outcome,
    ReadResult,
    Route,
)
from durable_sse.gaps.model import GapSummary
from durable_sse.workflows.routes import (
    ConnectionPlan,
    Decision,
    ReplayRequest,
    StreamState,
    fold_gaps,
    record_result,
    seconds_until_repair,
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


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def dropped(last_cursor: str, gaps: GapSummary | None, kind: str = "comment") -> ReadResult:
    """A connection that ended on a drop signal of ``kind`` (the reader recorded it)."""
    return result(Outcome.DROP_SIGNAL, last_cursor, gaps=gaps, read=5, drop=kind)


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


def verifying(s: StreamState, connection: ConnectionPlan, outcome: ReadResult) -> Decision:
    return record_result(
        s, connection, outcome, id_order=ORDER, jitter=0.5, duration=30.0, verify_reconnects=True
    )


@pytest.mark.parametrize("outcome", [Outcome.DROPPED, Outcome.DROP_SIGNAL, Outcome.CANCELLED])
def test_a_connection_ended_mid_read_makes_the_next_a_verification(outcome: Outcome) -> None:
    """Ended by the server, or cancelled by the workflow (a repair due, a signal): either
    way a notice the server was about to send is lost with it."""
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
    verifying(s, nxt, result(Outcome.ROTATED, "120", gaps=summary(suspicion), read=20))
    assert not s.verify_pending and s.repair_wanted
    repair = plan(s, at(INTERVAL))
    assert (repair.route, repair.verify, repair.known_gaps) == (Route.LAGGED, False, ["s1"])


def test_a_verification_cancelled_for_its_re_read_is_verified_again() -> None:
    """The live connection that recorded the suspicion is cancelled once the throttle
    allows the re-read: what it read after the suspicion's end is suspected in turn."""
    s = state("90", last_lagged_at=at(-10).isoformat())
    verifying(s, LIVE, result(Outcome.DROPPED, "100", read=10))
    nxt = plan(s)
    assert interrupts(s, nxt, at(INTERVAL))
    suspicion = view("s1", "60", None)
    verifying(s, nxt, result(Outcome.CANCELLED, "120", gaps=summary(suspicion), read=20))
    assert s.verify_pending
    repair = plan(s, at(INTERVAL))
    assert (repair.route, repair.verify, repair.known_gaps) == (Route.LAGGED, True, ["s1"])
    assert not interrupts(s, repair, at(INTERVAL))


def test_a_verification_starts_where_the_connection_it_verifies_began() -> None:
    """Seed 615092678: before the stream has a lagging id, the suspicion starts where the
    cut connection began, not at the next one's cursor (the newest stored id). Of two cut
    connections before one verifies, the older start stands."""
    s = state("90")
    verifying(s, LIVE, result(Outcome.DROPPED, "100", read=10, start_cursor="44"))
    assert s.verify_from == "44"
    verifying(s, LIVE, None)  # its result lost: still pending, from 44
    verifying(s, LIVE, result(Outcome.DROPPED, "110", read=10, start_cursor="100"))
    nxt = plan(s)
    assert (nxt.verify, nxt.verify_from) == (True, "44")
    verifying(s, nxt, result(Outcome.ROTATED, "120", read=5, start_cursor="110"))
    assert not s.verify_pending and s.verify_from is None
    assert plan(s).verify_from is None


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
        (Outcome.RETRY_LATER, 0),
        (Outcome.DROPPED, 0),
        (Outcome.CANCELLED, 0),
    ],
)
def test_the_reader_s_own_endings_and_connections_that_read_nothing_verify_nothing(
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
