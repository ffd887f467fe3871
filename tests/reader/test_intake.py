"""One connection's reading without I/O (durable_sse/reader/intake.py): decoded items in,
batches, gap changes and an outcome out. Batches, drop notices, ids that misbehave."""

from __future__ import annotations

import itertools
import logging

import pytest

from durable_sse.contracts import RECORDED_GAP, Outcome, Route
from durable_sse.gaps.model import MAX_GAPS_IN_SUMMARY, GapKind
from durable_sse.ids import is_newer, newest, sort_key
from durable_sse.log.keys import data_digest
from durable_sse.reader.intake import DROP_GRACE, MAX_BATCH_BYTES, CommitBatch
from durable_sse.sse.decoder import Comment, DecodedEvent
from tests.reader.intake_helpers import (
    NOTICE,
    cut,
    ev,
    events,
    gap,
    ids,
    intake,
    take,
)


def test_batches_are_cut_by_count() -> None:
    i = intake("0")
    take(i, *events(1, 2, 3, 4, 5, 6, 7))
    assert [(ids(b), b.last_id, b.gap_changes) for b in cut(i)] == [
        (["1", "2", "3"], "3", []),
        (["4", "5", "6"], "6", []),
    ]
    assert i.pending_events == 1 and i.counts.events_read == 7
    i.end()
    assert [ids(b) for b in cut(i)] == [["7"]]
    assert i.outcome is None  # the activity says why it ended


def test_batches_are_cut_by_bytes() -> None:
    i = intake("0", batch_max_events=100)
    half = "x" * (MAX_BATCH_BYTES // 2)
    take(i, ev(1, half))
    assert not i.ready
    take(i, ev(2, half))
    assert [ids(b) for b in cut(i)] == [["1", "2"]]
    assert i.pending_events == 0


def test_batches_are_cut_by_age_when_polled() -> None:
    i = intake("0", batch_max_events=100, batch_max_delay=0.5)
    assert i.next_deadline(0.0) is None
    take(i, ev(1), now=10.0)
    take(i, ev(2), now=10.25)
    assert i.next_deadline(10.25) == 0.25  # the oldest pending event decides
    i.poll(10.49)
    assert not i.ready
    i.poll(10.5)
    assert [ids(b) for b in cut(i)] == [["1", "2"]]
    assert i.next_deadline(10.5) is None
    take(i, ev(3), now=20.0)
    assert i.next_deadline(25.0) == 0.0  # overdue: poll at once


def test_ids_without_an_id_field_ride_along_with_ordinals() -> None:
    i = intake("0", batch_max_events=10)
    take(
        i,
        ev(1),
        DecodedEvent(data="a", id="1"),
        DecodedEvent(data="b", id="1"),
        ev(2),
        DecodedEvent(data="c"),
    )
    i.end()
    [batch] = cut(i)
    assert [(r.event_id, r.event_ord) for r in batch.records] == [
        ("1", 0),
        ("1", 1),
        ("1", 2),
        ("2", 0),
        ("", None),
    ]
    assert batch.last_id == "2"


@pytest.mark.parametrize("order", ["numeric", "natural", "lexicographic"])
def test_each_id_is_keyed_once_and_batches_end_at_the_newest_under_the_order(
    order: str,
) -> None:
    # The intake keys each id once and hands the key to the writer with the record;
    # its order decisions are made on those keys, so they must be the store's keys.
    i = intake(None, id_order=order, batch_max_events=10)
    sent = ["a-9", "a-10", "7", "a-10", "é-2", "0012"]
    take(i, *[ev(n) for n in sent], DecodedEvent(data="f", id="0012"), DecodedEvent(data="g"))
    i.end()
    [batch] = cut(i)
    assert [(r.event_id, r.id_key) for r in batch.records] == [
        (r.event_id, sort_key(r.event_id, order) if r.event_id else None) for r in batch.records
    ]
    assert batch.last_id == newest(sent, order)
    expected_out_of_order = sum(
        not is_newer(now, before, order) for before, now in itertools.pairwise(sent)
    )
    assert i.counts.ids_out_of_order == expected_out_of_order > 0


def test_committed_moves_the_cursor_forward_only_and_counts() -> None:
    i = intake("5", batch_max_events=2)
    take(i, *events(6, 7, 3, 4))
    first, second = cut(i)
    assert i.committed(first, new_rows=2) is True and i.cursor == "7"
    assert i.committed(second, new_rows=1) is False and i.cursor == "7"
    assert (i.counts.new_rows, i.counts.duplicates, i.counts.recovered) == (3, 1, 0)
    assert i.committed(CommitBatch(records=[], last_id=None), new_rows=0) is False


def test_a_notice_cuts_what_came_before_and_the_next_id_ends_the_connection() -> None:
    i = intake("0", floor="0", batch_max_events=10)
    take(i, *events(1, 2), NOTICE, now=1.0)
    [before] = cut(i)
    assert ids(before) == ["1", "2"] and before.gap_changes == []  # clean evidence
    assert i.outcome is None and i.drop is not None
    assert (i.drop.kind, i.drop.detail) == ("comment", NOTICE.text)
    # The connection ends at 9; 10, received with it, is taken all the same.
    take(i, ev(9), ev(10), now=1.1)
    assert i.outcome is Outcome.DROP_SIGNAL and i.counts.events_read == 4
    i.end()
    [after] = cut(i)
    assert ids(after) == ["9", "10"]
    opened, ended = after.gap_changes
    assert opened.opened is not None
    assert (opened.opened.start_id, opened.opened.notice_id, opened.opened.announced) == (
        "0",
        "2",
        5,
    )
    assert (ended.gap_id, ended.end_id) == (opened.gap_id, "9")
    assert i.open_gaps_opened == ["new1"]


def test_a_notice_with_no_id_after_it_ends_after_the_grace() -> None:
    i = intake("0", floor="0")
    take(i, ev(1), NOTICE, now=5.0)
    assert i.next_deadline(5.0) == pytest.approx(DROP_GRACE)
    i.poll(5.0 + DROP_GRACE / 2)
    assert i.outcome is None
    i.poll(5.0 + DROP_GRACE)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    batches = cut(i)
    assert [ids(b) for b in batches] == [["1"], []]
    [opened] = batches[1].gap_changes
    assert opened.opened is not None and opened.opened.notice_id == "1"


def test_a_connection_ending_during_the_grace_is_a_drop_signal() -> None:
    i = intake("0", floor="0")
    take(i, ev(1), NOTICE)
    i.end()
    assert i.outcome is Outcome.DROP_SIGNAL
    assert [len(b.gap_changes) for b in cut(i)] == [0, 1]


def test_one_notice_per_connection_and_keepalives_do_not_count() -> None:
    i = intake("0", floor="0", batch_max_events=10)
    take(i, Comment("ping"), Comment(""), ev(1), NOTICE, Comment("dropped 9 events"))
    assert i.drop is not None and i.drop.detail == NOTICE.text
    i.end()
    assert [g.opened.announced for b in cut(i) for g in b.gap_changes if g.opened] == [5]


def test_drop_notices_can_be_disabled() -> None:
    i = intake("0", floor="0", drop_notice=[])
    take(i, ev(1), NOTICE, ev(2))
    assert i.outcome is None and i.drop is None


def test_a_drop_event_records_its_gap_with_its_own_batch() -> None:
    """The drop event is the notice: the batch that stores it carries the gap record,
    so no cursor passes it first, and it is no evidence for a repair."""
    i = intake("0", floor="0", batch_max_events=10, drop_event_types=["events_dropped"])
    take(i, *events(1, 2), ev(3, event="events_dropped"), now=1.0)
    before, notice = cut(i)
    assert ids(before) == ["1", "2"] and before.gap_changes == []
    assert ids(notice) == ["3"]
    [opened] = notice.gap_changes
    assert opened.opened is not None and opened.opened.notice_id == "3"
    assert opened.opened.kind == GapKind.EVENT_TYPE.value
    assert i.drop is not None and i.drop.kind == "event_type"
    assert i.outcome is None
    take(i, ev(7), now=1.1)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    [after] = cut(i)
    assert [(c.gap_id, c.end_id) for c in after.gap_changes] == [("new1", "7")]


def test_a_drop_event_is_no_evidence_for_the_gap_being_repaired() -> None:
    being_repaired = gap("a", "20", "30")
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[being_repaired],
        batch_max_events=10,
        drop_event_types=["events_dropped"],
    )
    take(i, ev(20), ev(21), ev(31, event="events_dropped"))
    i.end()
    changes = [c for b in cut(i) for c in b.gap_changes if c.gap_id == "a"]
    assert [(c.reread_to, c.close) for c in changes] == [("21", False)]
    assert "a" in i.gaps.gaps  # still open: the next repair re-reads it


def test_a_live_connection_ends_at_once_on_gaps_the_workflow_did_not_know_of() -> None:
    i = intake("50", gaps=[gap("a", "20", "30"), gap("b", "30", "40")], known=[])
    assert i.outcome is Outcome.DROP_SIGNAL
    assert i.drop is not None and i.drop.kind == RECORDED_GAP
    assert i.drop.detail == "2 open gap(s) recorded earlier"  # the reader never connects


def test_known_gaps_or_another_route_read_on() -> None:
    gaps = [gap("a", "20", "30")]
    assert intake("50", gaps=gaps, known=["a"]).outcome is None
    assert intake("50", gaps=gaps, known=[], route=Route.LAGGED).outcome is None
    assert intake("50", gaps=gaps, known=[], route=Route.EXPLICIT).outcome is None


def test_a_workflow_that_knows_an_open_gap_is_not_told_of_more() -> None:
    """The workflow names at most MAX_GAPS_IN_SUMMARY open gaps: with more open, a live
    connection (the repair waiting for its throttle) must not end at once each time."""
    gaps = [gap(f"g{n:02d}", str(n * 10), str(n * 10 + 5)) for n in range(25)]
    named = [g.gap_id for g in gaps[:MAX_GAPS_IN_SUMMARY]]
    assert intake("500", gaps=gaps, known=named).outcome is None
    assert intake("500", gaps=gaps, known=["closed-meanwhile"]).outcome is Outcome.DROP_SIGNAL


def test_reused_ids_are_counted_apart_from_duplicates_and_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 24 item 7: the store reports which ids it kept although stored with other
    data; the intake counts them (never as duplicates), warns once per connection, and
    its cursor does not go back. Carriers carry their digest, followers their carrier's."""
    i = intake("5", batch_max_events=10)
    take(
        i,
        DecodedEvent(data="b1", id="1", id_field=True),
        DecodedEvent(data="f", id="1"),
        DecodedEvent(data="b2", id="2", id_field=True),
    )
    i.end()
    [batch] = cut(i)
    carrier, follower, second = batch.records
    assert carrier.digest == follower.digest == data_digest("message", "b1")
    assert second.digest == data_digest("message", "b2")
    with caplog.at_level(logging.WARNING, logger="durable_sse.reader.intake"):
        assert not i.committed(batch, new_rows=3, reused=["1", "2"])
        i.committed(CommitBatch(records=batch.records[:1], last_id="1"), new_rows=1, reused=["1"])
    assert (i.counts.new_rows, i.counts.duplicates, i.counts.ids_reused) == (4, 0, 3)
    assert i.cursor == "5"
    warned = [
        r.getMessage() for r in caplog.records if "restarted its id counter" in r.getMessage()
    ]
    assert len(warned) == 1 and "id '1'" in warned[0] and "stays at the newest id, '5'" in warned[0]
    resumed = intake("1")  # began inside 1's run: the carrier's digest is unknown
    take(resumed, DecodedEvent(data="f", id="1"))
    resumed.end()
    assert cut(resumed)[0].records[0].digest is None


def test_ids_out_of_order_are_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    i = intake("0", batch_max_events=10)
    with caplog.at_level(logging.WARNING, logger="durable_sse.reader.intake"):
        take(i, *events(5, 3, 3, 6, 1))
    assert i.ids_out_of_order == 3
    assert sum("ids_out_of_order" in r.getMessage() for r in caplog.records) == 1
    i.end()
    [batch] = cut(i)
    assert batch.last_id == "6"  # the newest id, not the last one read


def test_contiguous_ids_that_are_not_counters_are_counted_once_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    i = intake("0", contiguous_ids=True, floor="0", batch_max_events=10)
    with caplog.at_level(logging.WARNING, logger="durable_sse.reader.intake"):
        take(i, ev(1), ev("x"), ev(2), ev("+3"), ev(3))
    assert i.ids_not_counters == 2
    assert sum("not a counter" in r.getMessage() for r in caplog.records) == 1
    assert i.outcome is None and i.drop is None  # 1, 2, 3: no hole


def test_a_hole_in_contiguous_ids_over_new_ids_ends_the_connection() -> None:
    i = intake("0", contiguous_ids=True, floor="0", batch_max_events=10)
    take(i, ev(1), ev(2), ev(6), ev(7))
    assert i.outcome is Outcome.DROP_SIGNAL
    assert i.drop is not None and (i.drop.kind, i.drop.detail) == ("id_gap", "3 ids missing")
    assert i.counts.events_read == 4  # 7 came with 6: received, so taken
    i.end()
    [batch] = cut(i)
    assert ids(batch) == ["1", "2", "6", "7"]
    [opened] = batch.gap_changes
    assert opened.opened is not None
    assert (opened.opened.start_id, opened.opened.end_id, opened.opened.announced) == (
        "2",
        "6",
        3,
    )
