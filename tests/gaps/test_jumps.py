"""The gap tracker (durable_sse/gaps/tracker.py) on jumps over ids, the suspicions of
retried attempts and reconnects, and when a repair's evidence counts. Plain tests.
"""

from __future__ import annotations

from durable_sse.gaps.model import (
    GapKind,
    GapState,
    StreamContext,
    no_resume,
    summarize,
)
from durable_sse.gaps.tracker import CONFIRM_IDS, CONFIRM_SECONDS, GapTracker
from durable_sse.gaps.transitions import apply_change
from tests.gaps.helpers import (
    ORDER,
    gap,
    read,
    tracker,
)


def test_a_jump_over_new_ids_opens_a_gap_and_ends_the_connection() -> None:
    t = tracker("40", floor="40", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is True
    assert not t.clean
    opened = t.gaps["new1"]
    assert (opened.start_id, opened.end_id, opened.announced, opened.detail) == (
        "42",
        "46",
        3,
        "3 ids skipped",
    )
    [change] = t.batch_changes(last_id="46", segment=frozenset())
    assert change.opened is opened and not change.close


def test_a_jump_that_straddles_the_floor_opens_a_gap_over_the_new_part_only() -> None:
    t = tracker("40", floor="44", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "47") is True
    opened = t.gaps["new1"]
    assert (opened.start_id, opened.end_id, opened.announced) == ("44", "47", 2)


def test_a_jump_over_stored_ids_is_harmless() -> None:
    t = tracker("40", floor="50", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is False
    assert t.clean and t.opened == [] and t.pending_changes() == []


def test_a_jump_through_an_open_gap_ends_the_connection_without_a_new_record() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 57, 58, 59, 60, 61)
    assert t.jump("61", "65") is True
    assert not t.clean and t.opened == [] and "a" in t.gaps
    read(t, 65, 75)
    changes = t.batch_changes(last_id="75", segment=frozenset())
    assert [c for c in changes if c.close or c.reread_to] == []


def test_a_jump_next_to_an_open_gap_is_not_through_it() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 70, 71)
    assert t.jump("71", "75") is False  # stored ids after the gap
    assert t.jump("56", "60") is False  # stored ids before it
    assert t.clean


def test_a_repair_that_skips_the_newest_stored_id_proves_nothing_past_it() -> None:
    """Ids that are not counters show no hole, but the newest stored id does: a server
    that passes it by skipped it (seed 1268022177: 2, 3, 4, then 11, floor 10)."""
    t = tracker("1", floor="10", witness="2", gaps=[gap("a", "1", "10")])
    read(t, 2, 3, 4)
    assert t.passed_floor("4", "11") is True
    assert not t.clean
    read(t, 11, 12)
    changes = t.batch_changes(last_id="12", segment=frozenset())
    assert [c for c in changes if c.close or c.reread_to] == []


def test_passing_the_floor_outside_any_gap_or_reading_it_is_no_skip() -> None:
    t = tracker("1", floor="10", witness="2", gaps=[gap("a", "1", "5")])
    read(t, 2, 3, 4, 5, 6)
    assert t.passed_floor("6", "11") is False  # stored ids only, past the gap
    assert t.passed_floor("10", "11") is False  # the floor itself was read
    assert t.passed_floor("3", "9") is False  # not past the floor: nothing shows a skip
    assert t.clean


def test_a_repair_from_the_resume_point_itself_is_this_connection_s_to_repair() -> None:
    """Nothing stored before the gap: the repair sends its resume point as the cursor."""
    t = tracker("20", floor="40", witness="21", gaps=[gap("a", "20", "30")])
    t.first_event("25")
    assert t.short_history and [c.short_to for c in t.pending_changes()] == ["25"]
    contiguous = tracker("20", floor="40", gaps=[gap("a", "20", "30")], contiguous=True)
    contiguous.first_event("21")
    assert (contiguous.covered_from, contiguous.short_history) == ("20", False)
    assert contiguous.pending_changes() == []


def test_a_first_event_at_the_resume_point_still_reaches_the_gap() -> None:
    """Past the witness (stored ids before the gap were skipped) but not past the gap."""
    t = tracker("10", floor="40", witness="15", gaps=[gap("a", "20", "30")])
    t.first_event("20")
    assert (t.covered_from, t.short_history) == ("20", False)
    assert t.pending_changes() == []
    read(t, 21, 30)
    [change] = t.batch_changes(last_id="30", segment=frozenset())
    assert change.close  # re-read from 20, its start


def test_a_gap_this_connection_opened_is_not_its_to_repair() -> None:
    t = tracker("19", floor="40", gaps=[gap("a", "20", "30")])
    opened = t.drop_signal(GapKind.COMMENT)  # before the first event
    t.first_event("25", history_short=True)
    changes = t.pending_changes()
    assert [(c.gap_id, c.lost_to) for c in changes] == [(opened.gap_id, None), ("a", "25")]
    assert opened.gap_id in t.gaps


def test_a_contiguous_stream_with_a_text_cursor_falls_back_to_the_witness() -> None:
    t = tracker("x", floor="40", witness="20", contiguous=True)
    t.first_event("25")
    assert (t.covered_from, t.clean, t.opened) == ("25", True, [])


def test_a_short_history_of_text_ids_opens_no_empty_gap() -> None:
    at_floor = tracker("x05", floor="x20")
    at_floor.first_event("x20", history_short=True)
    assert at_floor.pending_changes() == []
    past = tracker("x05", floor="x20")
    past.first_event("x30", history_short=True)
    [opened] = past.pending_changes()
    assert opened.opened is not None and opened.close
    assert (opened.opened.start_id, opened.opened.end_id, opened.opened.announced) == (
        "x20",
        "x30",
        None,
    )
    # a counter after text ids (numeric order puts text first): counted as unknown
    mixed = tracker("x05", floor="x06")
    mixed.first_event("30", history_short=True)
    [opened] = mixed.pending_changes()
    assert opened.opened is not None and opened.opened.announced is None


def test_a_jump_that_ends_right_after_the_floor_is_no_hole() -> None:
    t = tracker("40", floor="45", contiguous=True)
    read(t, 41, 42)
    assert t.jump("42", "46") is False  # 43..45 are stored
    assert t.clean and t.opened == []


def test_a_jump_from_a_gap_s_end_is_not_through_it() -> None:
    t = tracker("55", floor="80", witness="56", gaps=[gap("a", "60", "70")], contiguous=True)
    read(t, 56, 70)
    assert t.jump("70", "74") is False
    assert t.clean


def test_a_retried_attempt_suspects_what_the_dead_one_read() -> None:
    t = tracker("40", lagging="30", floor="90")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None
    # Through the floor and one id past it (a late notice may be about the next ids).
    assert (suspicion.kind, suspicion.start_id, suspicion.end_id, suspicion.notice_id) == (
        "retry",
        "40",
        None,
        "90",
    )
    assert suspicion.gap_id in t.gaps and t.opened == []  # this connection may prove it
    [change] = t.pending_changes()
    assert change.opened is suspicion and not change.close
    # nothing stored past its start: nothing to suspect
    assert tracker("90", floor="90").suspect("x") is None
    assert tracker(None, floor="90").suspect("x") is None
    assert tracker(None, lagging="30", floor="90").suspect("x") is not None


def test_a_retried_attempt_that_re_reads_continuously_clears_the_suspicion() -> None:
    """From one stored id before the span (its start is the witness) the retry's continuous
    read proves it."""
    t = tracker("39", lagging="40", floor="90", witness="40")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None and suspicion.start_id == "40"
    read(t, 40, 50, 60, 90, 91)
    changes = t.batch_changes(last_id="91", segment=frozenset())
    assert [(c.gap_id, c.opened is not None, c.close) for c in changes] == [
        (suspicion.gap_id, True, False),
        (suspicion.gap_id, False, True),
    ]


def test_a_retry_from_before_the_floor_suspects_what_the_dead_one_read_past_it() -> None:
    """Simulation seed 729818868: the dead attempt stored 1..14 and read 15 on, never
    stored; the history no longer held 15 when the retry came. Nothing was stored past
    the start (14), so nothing was suspected, and ids that are not contiguous could not
    show the loss: 15 was gone, uncounted. A retry at the floor starts one stored id
    before it (``choose_start``): its first event shows whether the history reaches the
    floor, and the span past the floor is suspected like any dead attempt's."""
    t = tracker("40", lagging="50", floor="50", witness="50")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None
    assert (suspicion.start_id, suspicion.end_id, suspicion.notice_id) == ("50", None, "50")
    read(t, 50, 57)  # the history reaches the floor: read on past it, the span is proven
    changes = t.batch_changes(last_id="57", segment=frozenset())
    assert [(c.gap_id, c.close) for c in changes][-1] == (suspicion.gap_id, True)

    short = tracker("40", lagging="50", floor="50", witness="50")
    suspicion = short.suspect("an attempt died")
    assert suspicion is not None
    read(short, 70)  # the history starts past the floor: a strike, the span may be lost
    assert short.covered_from == "70" and short.short_history
    assert [c.short_to for c in short.pending_changes() if c.gap_id == suspicion.gap_id] == [
        None,
        "70",
    ]


def test_a_retry_from_its_span_s_start_has_no_witness_inside_the_span() -> None:
    """Simulation seed 708179435: a retry from 40 (where the dead attempt began) met 44
    first, the first row stored after 40, and took it for a witness. The dead attempt may
    have skipped ids before it with a notice it never wrote, and the history may have lost
    them since (41..43 were gone): the span is a hole like any gap. Evidence from the
    first id on, a strike for the span; the next repair starts one stored id before it."""
    t = tracker("40", floor="90", witness="44")
    suspicion = t.suspect("an attempt died")
    assert suspicion is not None and suspicion.start_id == "40"
    read(t, 44, 60, 90, 91)
    assert t.covered_from == "44" and t.short_history
    changes = t.batch_changes(last_id="91", segment=frozenset())
    assert not any(c.close for c in changes)
    assert [c.short_to for c in t.pending_changes()] == ["44"]


def test_a_verified_reconnect_suspects_what_was_read_since_the_lagging_id() -> None:
    t = tracker("90", lagging="30", floor="90")
    suspicion = t.verify("a reconnect")
    assert suspicion is not None
    assert (suspicion.kind, suspicion.start_id, suspicion.end_id, suspicion.notice_id) == (
        "suspected",
        "30",
        "90",
        "90",
    )
    assert suspicion.gap_id in t.gaps and t.opened == []  # a re-read from 30 may prove it
    [change] = t.pending_changes()
    assert change.opened is suspicion and not change.close
    # No lagging id yet, or nothing stored after it: nothing to suspect.
    assert tracker("90", floor="90").verify("x") is None
    assert tracker("30", lagging="30", floor="30").verify("x") is None


def test_with_no_lagging_id_a_repair_suspects_from_its_cursor() -> None:
    """Simulation seed 19597293: a repair cut before the stream had a lagging id lost a
    late notice about an id past every open gap's end; the next (verified) repair must
    suspect what was read from its cursor on, or that skip is never counted."""
    open_gap = gap("g1", "16", "84")
    t = tracker("15", floor="88", gaps=[open_gap])
    suspicion = t.verify("a reconnect")
    assert suspicion is not None
    assert (suspicion.start_id, suspicion.end_id) == ("15", "88")


def test_with_no_lagging_id_a_reconnect_suspects_from_where_the_cut_connection_began() -> None:
    """Simulation seed 615092678: a live reconnect from 44 met 50 first (45..49 skipped,
    their notice lost). The verified reconnect after it starts at 52, the newest stored
    id: the suspicion starts where the cut connection began, never after the cursor."""
    t = tracker("52", floor="52")
    suspicion = t.verify("a reconnect", since="44")
    assert suspicion is not None and (suspicion.start_id, suspicion.end_id) == ("44", "52")
    # A repair's own cursor, older than where the cut connection began, stands.
    suspicion = tracker("15", floor="88").verify("a reconnect", since="44")
    assert suspicion is not None and suspicion.start_id == "15"
    # The lagging id, once there is one, bounds every suspicion.
    suspicion = tracker("52", lagging="48", floor="52").verify("x", since="44")
    assert suspicion is not None and suspicion.start_id == "48"


def test_a_suspicion_starts_where_an_open_one_ends() -> None:
    older = gap("s1", "30", "70", kind=GapKind.SUSPECTED.value)
    t = tracker("90", lagging="30", floor="90", gaps=[older])
    suspicion = t.verify("again")
    assert suspicion is not None and (suspicion.start_id, suspicion.notice_id) == ("70", "90")
    # Everything read since is suspected already: no second record.
    covered = gap("s1", "30", "90", kind=GapKind.SUSPECTED.value)
    assert tracker("90", lagging="30", floor="90", gaps=[covered]).verify("x") is None


def test_a_re_read_from_the_lagging_id_clears_the_suspicion() -> None:
    """The repair starts one stored id before the lagging id, the suspicion's start."""
    t = tracker("29", lagging="30", floor="90", witness="30")
    suspicion = t.verify("a reconnect")
    assert suspicion is not None
    read(t, 30, 31, 60, 90)  # through the newest stored id: nothing newer is needed
    changes = t.batch_changes(last_id="90", segment=frozenset())
    assert [(c.gap_id, c.opened is not None, c.close) for c in changes] == [
        (suspicion.gap_id, True, False),
        (suspicion.gap_id, False, True),
    ]
    # From the lagging id itself, the first row after it lies inside the suspicion: no
    # witness, a strike ...
    t = tracker("30", lagging="30", floor="90", witness="35")
    t.verify("a reconnect")
    read(t, 35, 60, 90)
    assert t.covered_from == "35" and t.short_history
    # ... unless it is the lagging id's successor: no numeric id lies between the two.
    t = tracker("30", lagging="30", floor="90", witness="31")
    suspicion = t.verify("a reconnect")
    read(t, 31, 60, 90)
    assert t.covered_from == "30" and not t.short_history
    changes = t.batch_changes(last_id="90", segment=frozenset())
    assert suspicion is not None and changes[-1].close


def test_suspicions_are_summed_apart_in_the_totals() -> None:
    records = [
        gap("s1", "30", None, notice="70", kind=GapKind.SUSPECTED.value, recovered=4),
        gap(
            "s2",
            "70",
            None,
            notice="90",
            kind=GapKind.SUSPECTED.value,
            state=GapState.REPAIRED.value,
            recovered=3,
        ),
        gap("g", "90", "95", recovered=5, state=GapState.REPAIRED.value),
    ]
    totals = summarize(records, ORDER).totals
    assert (totals.suspicions, totals.suspicions_closed, totals.suspicions_recovered) == (2, 1, 7)
    assert totals.events_recovered == 12 and totals.open == 1


def test_a_reconnect_with_no_id_to_send_on_a_stream_that_read_events_cannot_resume() -> None:
    nothing = StreamContext()
    idless_rows = StreamContext(has_rows=True)
    with_ids = StreamContext(floor="7", has_rows=True)
    assert not no_resume(None, nothing, read_before=False)  # the stream's first connection
    assert no_resume(None, idless_rows, read_before=False)  # rows of an earlier connection
    assert no_resume(None, nothing, read_before=True)  # read, then nothing stored (yet)
    assert not no_resume("7", with_ids, read_before=True)  # a cursor: it resumes
    assert not no_resume("7", nothing, read_before=True)


def test_a_no_resume_gap_is_lost_of_unknown_size_and_ends_at_the_first_id() -> None:
    tracker = GapTracker(
        stream="s",
        order="numeric",
        cursor=None,
        context=StreamContext(has_rows=True),
        contiguous=True,
        new_gap_id=lambda: "blind",
        now=lambda: "2026-01-01T00:00:00+00:00",
    )
    tracker.no_resume()
    tracker.id_read("40")
    opened, ended = tracker.batch_changes(last_id="40", segment=frozenset())
    assert opened.opened is not None and opened.opened.kind == GapKind.NO_RESUME
    assert (opened.close, opened.truncated) == (True, True)
    assert tracker.gaps == {} and tracker.clean  # nothing to repair, no evidence lost
    record = None
    for change in (opened, ended):
        record = apply_change(record, change, order="numeric", lagging_id=None, new_rows=1, now="t")
    assert record is not None
    assert (record.state, record.start_id, record.end_id, record.missing) == (
        GapState.UNRECOVERABLE,
        None,
        "40",
        None,
    )
    assert summarize([record], "numeric").totals.unknown_size == 1


def test_a_repair_is_evidence_only_once_it_read_on_past_the_batch() -> None:
    """Issue 33 item 3: a repair passed its gap's end and closed it as ``repaired``; the
    notice saying the repair itself had skipped the gap's ids came a few events later.
    Without contiguous ids, what a batch proves waits for CONFIRM_IDS more ids."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    changes = t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    assert not any(c.close or c.reread_to for c in changes)  # read past the end, not yet proof
    assert "a" in t.gaps and not t.proof_due(0.5)
    read(t, *range(32, 30 + CONFIRM_IDS))  # 15 ids after 30, the gap's end
    assert not any(c.close for c in t.batch_changes(last_id="45", segment=frozenset(), now=0.5))
    read(t, 30 + CONFIRM_IDS)  # the 16th
    [change] = t.batch_changes(last_id="46", segment=frozenset(), now=0.6)
    assert (change.gap_id, change.close, change.end_id) == ("a", True, None)
    assert "a" not in t.gaps


def test_a_late_notice_drops_the_evidence_held_back() -> None:
    """The notice comes after the batch that passed the gap's end: the gap stays open (its
    repair resumes where the evidence held), never ``repaired`` with its ids missing."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    t.drop_signal(GapKind.COMMENT, announced=5, detail="dropped 5 events")
    read(t, *range(32, 60))
    changes = t.batch_changes(last_id="59", segment=frozenset(), now=CONFIRM_SECONDS * 2)
    assert not any(c.gap_id == "a" and (c.close or c.reread_to) for c in changes)
    assert "a" in t.gaps and not t.proof_due(CONFIRM_SECONDS * 3)
    assert t.next_proof_at() is None


def test_a_quiet_source_confirms_the_evidence_by_time() -> None:
    """No more events come: the gap still closes, CONFIRM_SECONDS after the batch."""
    t = tracker(
        "10", floor="40", witness="20", gaps=[gap("a", "20", "30")], confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    assert t.batch_changes(last_id="31", segment=frozenset(), now=5.0) == []
    assert t.next_proof_at() == 5.0 + CONFIRM_SECONDS
    assert not t.proof_due(5.0 + CONFIRM_SECONDS / 2)
    assert t.proof_due(5.0 + CONFIRM_SECONDS)
    [change] = t.batch_changes(last_id=None, segment=frozenset(), now=5.0 + CONFIRM_SECONDS)
    assert (change.gap_id, change.close) == ("a", True)
    assert t.next_proof_at() is None


def test_contiguous_ids_are_evidence_at_once() -> None:
    """A skip in contiguous ids shows at the next id, before the batch is cut."""
    t = tracker(
        "19", floor="40", gaps=[gap("a", "20", "30")], contiguous=True, confirm_ids=CONFIRM_IDS
    )
    read(t, *range(20, 32))
    [change] = t.batch_changes(last_id="31", segment=frozenset(), now=0.0)
    assert (change.gap_id, change.close) == ("a", True)


def test_a_repair_left_with_gaps_behind_its_start_is_stranded() -> None:
    """Issue 33 item 2 (seed 1160 of the simulation): a verified reconnect's repair started
    one id before its gap (84), its suspicion starts at the lagging id (72). Once the gap
    it can re-read is closed, reading on proves nothing about the suspicion: stranded."""
    t = tracker("84", lagging="72", floor="98", witness="85", gaps=[gap("g10", "85", "97")])
    suspicion = t.verify("a reconnect")
    assert suspicion is not None and suspicion.start_id == "72"
    assert not t.stranded()  # nothing read yet
    read(t, 85, 86)
    assert not t.stranded()  # still re-reading g10
    read(t, *range(87, 99))
    changes = t.batch_changes(last_id="98", segment=frozenset())
    assert [(c.gap_id, c.close) for c in changes if c.close] == [("g10", True)]
    assert t.stranded()
    # A repair that starts before the suspicion re-reads it: not stranded.
    t = tracker("71", lagging="72", floor="98", witness="72", gaps=[gap("g10", "85", "97")])
    t.verify("a reconnect")
    read(t, 72, 73)
    assert not t.stranded()


def test_a_witness_a_repair_stored_inside_the_hole_does_not_show_the_history_reaches() -> None:
    """Simulation seed 2865: a replay from a gap's start (28) met first 59, the first row
    stored after 28, which a repair had stored inside the gap past a truncation. 59 is no
    witness that the history reaches 28: the first ids of the gap may be gone."""
    holed = gap("a", "28", "69", recovered=2, short_reads=2)
    t = tracker("28", floor="90", witness="59", gaps=[holed])
    read(t, 59)
    assert t.covered_from == "59"  # evidence from its first id on only
    assert t.short_history or t.has_queued  # the third strike: the history starts past it
    # Rows inside the bounds read before the notice are no witness either (the skip the
    # notice announced may lie before them).
    t = tracker("28", floor="90", witness="59", gaps=[gap("a", "28", "69")])
    read(t, 59)
    assert t.covered_from == "59" and t.short_history


def test_a_repair_with_nothing_stored_before_its_gap_has_no_witness() -> None:
    """Simulation seed 708180304: the stream's first connection read 1, 3, 4, then "dropped
    1 events" (2 was skipped); the gap is 1..5 and 1 the oldest stored id, so its repair
    sends 1 itself. The history no longer held 2 and the repair met 3 first, the row stored
    after 1: no witness, since the hole lies between. Evidence from 3 on, and a strike."""
    t = tracker("1", floor="6", witness="3", gaps=[gap("g1", "1", "5", notice="4")])
    read(t, 3, 4, 5, 6)
    assert t.covered_from == "3" and t.short_history
    assert not any(c.close for c in t.batch_changes(last_id="6", segment=frozenset()))
    assert [c.short_to for c in t.pending_changes()] == ["3"]


def test_a_notice_before_any_event_leaves_no_witness_after_its_cursor() -> None:
    """Simulation seed 20781: a notice came before the first event of a connection at 1
    ("dropped 16 events"): the gap starts at 1, its notice at 1, its end unknown. A repair
    from 1 met 13 first, the row stored after 1: the hole lies past the notice, up to an
    end nobody read yet, so 13 is no witness (2..12 were gone)."""
    t = tracker("1", floor="20", witness="13", gaps=[gap("g1", "1", None, notice="1")])
    read(t, 13, 14)
    assert t.covered_from == "13" and t.short_history
    assert [c.short_to for c in t.pending_changes()] == ["13"]


def test_a_repair_from_its_gap_s_start_with_nothing_stored_after_it_gets_a_strike() -> None:
    """Simulation seed 212111628: the gap starts at the stream's only stored id (18), so
    its repair sends 18 and has no witness at all. It met 32 first: nothing shows the
    history reaches 18, and no repair can ever start before it. A strike (three lose the
    hole, counted), where it used to read on with the gap open for good."""
    t = tracker("18", floor="18", gaps=[gap("g1", "18", None, notice="18")])
    read(t, 32, 33)
    assert t.covered_from == "32" and t.short_history
    assert [c.short_to for c in t.pending_changes()] == ["32"]
    # A gap after the cursor, with no witness: it waits for a repair from before it.
    t = tracker("18", floor="18", gaps=[gap("g2", "20", None, notice="20")])
    read(t, 32)
    assert t.covered_from == "32" and not t.short_history


def test_a_hole_outside_the_cursor_to_witness_span_keeps_the_witness() -> None:
    """Only a hole between the cursor and the witness takes the witness away: one wholly
    before the cursor, or one that resumes at the witness or after it, does not."""
    # (Cursor 18, not 19: 20 right after 19 would show the history reaching the cursor
    # without any witness, as no numeric id lies between the two.)
    gaps = [gap("before", "5", "10"), gap("a", "20", "30"), gap("later", "50", "60")]
    t = tracker("18", floor="90", witness="20", gaps=gaps)
    read(t, 20)
    assert t.covered_from == "18" and not t.short_history
    # A gap that resumes before the cursor, its hole reaching past it: evidence from the
    # first id on; the gap resuming at the witness is still re-read from its start.
    wide = gap("wide", "5", "25")
    t = tracker("18", floor="90", witness="20", gaps=[wide, gap("a", "20", "30")])
    read(t, 20, *range(21, 31))
    assert t.covered_from == "20"
    closed = [c.gap_id for c in t.batch_changes(last_id="30", segment=frozenset()) if c.close]
    assert closed == ["a"]
