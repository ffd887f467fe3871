"""One connection's reading without I/O (durable_sse/reader/intake.py): decoded items in,
batches, gap changes and an outcome out. Items are built by hand, as the SSE decoder
would hand them over; clocks are plain numbers."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from datetime import UTC, datetime

import pytest

from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import RECORDED_GAP, Outcome, Route
from durable_sse.gaps.model import MAX_GAPS_IN_SUMMARY, GapKind, GapRecord, GapState, StreamContext
from durable_sse.gaps.transitions import apply_change
from durable_sse.ids import is_newer, newest, sort_key
from durable_sse.log.keys import data_digest
from durable_sse.reader.intake import DROP_GRACE, MAX_BATCH_BYTES, CommitBatch, Intake
from durable_sse.sse.decoder import Comment, DecodedEvent

RECEIVED = datetime(2026, 1, 1, tzinfo=UTC)
NOTICE = Comment("dropped 5 events (slow consumer)")


def spec(**options: object) -> StreamSpec:
    settings: dict[str, object] = {
        "name": "s",
        "url": "http://sse.invalid/stream",
        "id_order": "numeric",
        "batch_max_events": 3,
        "batch_max_delay": 0.1,
    }
    settings.update(options)
    return StreamSpec(**settings)  # type: ignore[arg-type]


def gap(gap_id: str, start: str, end: str | None, *, notice: str | None = None) -> GapRecord:
    return GapRecord(
        gap_id=gap_id,
        stream="s",
        kind="comment",
        start_id=start,
        end_id=end,
        notice_id=notice or end,
        seen_at="2026-01-01T00:00:00+00:00",
    )


def intake(
    cursor: str | None = None,
    *,
    route: Route = Route.LIVE,
    lagging: str | None = None,
    floor: str | None = None,
    witness: str | None = None,
    gaps: Iterable[GapRecord] = (),
    known: Iterable[str] | None = None,
    retried: bool = False,
    has_rows: bool = False,
    read_before: bool = False,
    verify: bool = False,
    confirm_ids: int = 0,
    **options: object,
) -> Intake:
    """An intake; by default what a batch proves about a gap counts at once (the hold
    before it counts, ``GapTracker.confirm_ids``, is tested apart)."""
    open_gaps = list(gaps)
    numbers = itertools.count(1)
    made = Intake(
        spec(**options),
        route=route,
        cursor=cursor,
        context=StreamContext(
            lagging_id=lagging,
            floor=floor,
            witness=witness,
            open_gaps=open_gaps,
            has_rows=has_rows or floor is not None,
        ),
        read_before=read_before,
        known_gaps=[g.gap_id for g in open_gaps] if known is None else known,
        new_gap_id=lambda: f"new{next(numbers)}",
        now_iso=lambda: "2026-01-01T00:00:00+00:00",
        retried=retried,
        verify=verify,
    )
    made.gaps.confirm_ids = confirm_ids
    return made


def ev(event_id: int | str, data: str = "d", event: str = "message") -> DecodedEvent:
    return DecodedEvent(data=data, event=event, id=str(event_id), id_field=True)


def take(i: Intake, *items: DecodedEvent | Comment, now: float = 0.0) -> None:
    i.take(list(items), received_at=RECEIVED, now=now)


def events(*ids: int) -> list[DecodedEvent]:
    return [ev(n) for n in ids]


def cut(i: Intake) -> list[CommitBatch]:
    """The batches ready so far (taken out, as the activity submits them)."""
    batches = list(i.ready)
    i.ready.clear()
    return batches


def ids(batch: CommitBatch) -> list[str]:
    return [record.event_id for record in batch.records]


# -- batch cuts ---------------------------------------------------------------------------


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


# -- drop notices ---------------------------------------------------------------------------


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


# -- open gaps the workflow did not know of -----------------------------------------------


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


# -- ids ----------------------------------------------------------------------------------


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


def test_a_hole_in_contiguous_ids_over_stored_ids_reads_on() -> None:
    i = intake("0", contiguous_ids=True, floor="100", batch_max_events=10)
    take(i, ev(1), ev(2), ev(6), ev(7))
    assert i.outcome is None and i.drop is None


def test_a_contiguous_first_id_past_the_cursor_over_new_ids_ends_after_a_grace() -> None:
    """Often a history that no longer reaches the cursor: what comes is stored for a
    grace (a stream behind a short history still makes progress), then the repair."""
    i = intake("10", contiguous_ids=True, floor="10", batch_max_events=10)
    take(i, ev(14), ev(15), now=1.0)
    assert i.drop is not None and i.drop.detail == "ids missing after the cursor"
    assert i.outcome is None and i.counts.events_read == 2
    i.poll(1.0 + DROP_GRACE)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    opened = [c.opened for b in cut(i) for c in b.gap_changes if c.opened]
    assert [(g.start_id, g.end_id, g.announced) for g in opened] == [("10", "14", 3)]


def test_a_notice_and_the_hole_it_announced_make_one_gap() -> None:
    i = intake("0", contiguous_ids=True, floor="0", batch_max_events=10)
    take(i, ev(1), ev(2), NOTICE, ev(6))
    assert i.outcome is Outcome.DROP_SIGNAL
    assert i.drop is not None and i.drop.kind == "comment"
    i.end()
    changes = [c for b in cut(i) for c in b.gap_changes]
    assert [(c.gap_id, c.opened is not None, c.end_id) for c in changes] == [
        ("new1", True, None),
        ("new1", False, "6"),
    ]


def test_a_repair_that_starts_past_its_gap_ends_after_the_grace() -> None:
    i = intake("19", route=Route.LAGGED, floor="40", witness="20", gaps=[gap("a", "20", "30")])
    take(i, ev(25), now=3.0)
    assert i.drop is not None and i.drop.kind == "history_short"
    assert i.outcome is None
    i.poll(3.0 + DROP_GRACE)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    strikes = [c for b in cut(i) for c in b.gap_changes if c.short_to]
    assert [(c.gap_id, c.short_to) for c in strikes] == [("a", "25")]


# -- the truncation header ------------------------------------------------------------------


def test_a_truncation_header_unlike_the_cursor_loses_what_the_history_no_longer_has() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        gaps=[gap("a", "20", "30")],
        mercure_last_event_id=True,
        contiguous_ids=True,
    )
    i.head(truncation_header="earliest")
    assert i.history_short
    take(i, ev(25), ev(26))
    assert i.outcome is None
    i.end()
    changes = [c for b in cut(i) for c in b.gap_changes]
    assert [(c.gap_id, c.lost_to) for c in changes if c.lost_to] == [("a", "25")]


@pytest.mark.parametrize(
    ("enabled", "cursor", "header"),
    [(True, "19", "19"), (True, "19", None), (True, None, "x"), (False, "19", "x")],
)
def test_a_truncation_header_that_says_nothing(
    enabled: bool, cursor: str | None, header: str | None
) -> None:
    i = intake(cursor, mercure_last_event_id=enabled)
    i.head(truncation_header=header)
    assert not i.history_short


# -- segments: batches never straddle a gap's bounds --------------------------------------


def test_batches_are_cut_where_the_gaps_an_id_would_fill_change() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
    )
    take(i, *events(20, 21, 22, 30, 31))
    i.end()
    batches = cut(i)
    assert [(ids(b), b.recovered) for b in batches] == [
        (["20"], False),
        (["21", "22"], True),
        (["30", "31"], False),
    ]
    assert [[(c.recovered, c.reread_to, c.close) for c in b.gap_changes] for b in batches] == [
        [],
        [(True, "22", False)],
        [(False, None, True)],
    ]
    assert i.committed(batches[1], new_rows=2) and i.counts.recovered == 2


def test_rows_inside_a_gap_this_connection_opened_are_not_recovered_rows() -> None:
    """An id older than the notice, read after it, lies inside the new gap: it was
    never missing as far as that gap is concerned."""
    i = intake("0", floor="0", batch_max_events=10)
    take(i, ev(5), NOTICE, ev(3))
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    before, after = cut(i)
    assert ids(after) == ["3"] and not after.recovered
    assert not any(c.recovered for c in after.gap_changes)
    i.committed(before, new_rows=1)
    i.committed(after, new_rows=1)
    assert i.counts.recovered == 0 and i.ids_out_of_order == 1


def test_a_repair_that_closes_its_gap_is_repaired_in_the_store() -> None:
    """End to end through apply_change: the changes the intake cuts close the record."""
    record: GapRecord | None = gap("a", "20", "30")
    i = intake("19", route=Route.LAGGED, floor="40", witness="20", gaps=[gap("a", "20", "30")])
    take(i, *events(20, 21, 22, 23, 29, 30, 31))
    i.end()
    for batch in cut(i):
        for change in batch.gap_changes:
            record = apply_change(
                record,
                change,
                order="numeric",
                lagging_id="10",
                new_rows=len(batch.records),
                now="2026-01-01T00:01:00+00:00",
            )
    assert record is not None
    assert (record.state, record.missing, record.recovered) == (GapState.REPAIRED, 0, 4)


def test_a_repair_that_closed_every_gap_it_knew_ends_after_the_grace() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
        batch_max_delay=0.5,
    )
    take(i, *events(20, 21, 30, 31), now=2.0)
    i.poll(2.5)  # the batch past the gap's end is cut: the gap closes
    assert any(c.close for b in cut(i) for c in b.gap_changes)
    assert i.next_deadline(2.5) == DROP_GRACE
    i.poll(2.5 + DROP_GRACE / 2)
    assert i.outcome is None
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED


def test_a_repair_with_gaps_behind_its_start_ends_once_it_has_nothing_to_re_read() -> None:
    """Issue 33 item 2: a verified reconnect's repair started before its gap (84), its
    suspicion at the lagging id (72). The workflow does not interrupt a repair: once its
    own gap is closed it ends, so that the repair resumes from the suspicion's start,
    instead of reading live for hours with the suspicion open and the lagging id held."""
    i = intake(
        "84",
        route=Route.LAGGED,
        lagging="72",
        floor="98",
        witness="85",
        gaps=[gap("g10", "85", "97")],
        verify=True,
        batch_max_events=50,
        batch_max_delay=0.5,
    )
    take(i, *events(*range(85, 100)), now=2.0)
    i.poll(2.5)
    closed = [c.gap_id for b in cut(i) for c in b.gap_changes if c.close]
    assert closed == ["g10"]  # the suspicion stays open: this connection cannot prove it
    assert i.gaps.stranded()
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED  # the workflow resumes the repair at once
    # On the live route the workflow interrupts for the repair when the throttle allows.
    live = intake(
        "84", lagging="72", floor="98", witness="85", known=[], verify=True, batch_max_delay=0.5
    )
    take(live, *events(*range(85, 100)), now=2.0)
    live.poll(2.5)
    live.poll(2.5 + DROP_GRACE)
    assert live.outcome is None


def test_a_retried_attempt_records_what_the_dead_one_read_with_its_first_batch() -> None:
    i = intake("39", route=Route.LIVE, lagging="40", floor="90", witness="40", retried=True)
    assert i.outcome is None  # its own suspicion is no unknown gap
    take(i, *events(40, 50, 60, 70))
    first, then = cut(i)  # 40 lies before the span: a batch of its own
    [opened], [reread] = first.gap_changes, then.gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.RETRY.value
    gap = opened.opened
    assert (gap.start_id, gap.end_id, gap.notice_id) == ("40", None, "90")
    # it re-reads the suspected span itself (from its start, the witness): the batch
    # inside it moves its resume point
    assert (reread.gap_id, reread.reread_to, reread.close) == (opened.gap_id, "70", False)


def test_a_retry_whose_first_row_lies_inside_its_own_span_proves_nothing_of_it() -> None:
    """Where the dead attempt began (40), the first row stored after it (50) is one it may
    have read past a skip it never recorded: no witness. The retry reads on as evidence
    from 50 and ends after the grace, so that a repair from before the span re-reads it."""
    i = intake("40", route=Route.LIVE, floor="90", witness="50", retried=True)
    take(i, *events(50, 60, 70))
    [batch] = cut(i)
    opened, *others = batch.gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.RETRY.value
    assert not any(c.reread_to or c.close for c in others)
    i.poll(100.0)
    assert i.outcome is Outcome.DROP_SIGNAL


# -- what a connection received as it ends (issue 24, item 5) -------------------------------


def apply_all(batches: list[CommitBatch], *, lagging: str | None = None) -> dict[str, GapRecord]:
    """The gap records the batches' changes leave in a store, applied in commit order."""
    records: dict[str, GapRecord] = {}
    for batch in batches:
        for change in batch.gap_changes:
            record = apply_change(
                records.get(change.gap_id),
                change,
                order="numeric",
                lagging_id=lagging,
                new_rows=len(batch.records),
                now="2026-01-01T00:01:00+00:00",
            )
            if record is not None:
                records[change.gap_id] = record
    return records


def test_events_that_came_with_a_notice_are_all_taken_though_the_connection_ends() -> None:
    """The issue's sequence: a fresh stream reads, in one write, a notice and events
    1..20. The first id ends the connection; the 19 after it were received and are
    stored, not dropped unseen."""
    i = intake(None, batch_max_events=8)
    take(i, Comment("dropping events (slow consumer)"), *events(*range(1, 21)), now=1.0)
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    batches = cut(i)
    assert [eid for b in batches for eid in ids(b)] == [str(n) for n in range(1, 21)]
    assert i.counts.events_read == 20
    # Nothing stored before the notice and no cursor: a gap no repair can reach, of a
    # size nobody knows, committed with the batch that holds 1 (the first past it).
    first = next(b for b in batches if b.records)
    assert any(c.opened is not None for c in first.gap_changes)
    [record] = apply_all(batches).values()
    assert (record.state, record.start_id, record.end_id, record.missing) == (
        GapState.UNRECOVERABLE,
        None,
        "1",
        None,
    )


def test_a_notice_taken_while_the_connection_ends_opens_a_gap_of_its_own() -> None:
    """Taking what came after the id that ended the connection, a second notice speaks of
    another hole: it gets its own gap, committed with the batch that first passes it."""
    i = intake("0", floor="0", batch_max_events=10)
    take(
        i,
        ev(1),
        NOTICE,
        ev(7),
        ev(8),
        Comment("dropped 2 events (slow consumer)"),
        ev(11),
        ev(12),
        now=1.0,
    )
    assert i.outcome is Outcome.DROP_SIGNAL
    i.end()
    batches = [b for b in cut(i) if b.records or b.gap_changes]
    assert [ids(b) for b in batches] == [["1"], ["7", "8"], ["11", "12"]]
    assert batches[0].gap_changes == []
    first = [c.opened for c in batches[1].gap_changes if c.opened is not None]
    second = [c.opened for c in batches[2].gap_changes if c.opened is not None]
    assert [(g.notice_id, g.announced) for g in first] == [("1", 5)]
    assert [(g.notice_id, g.announced) for g in second] == [("8", 2)]
    records = apply_all(batches)
    assert sorted((g.end_id, g.state) for g in records.values()) == [
        ("11", GapState.OPEN),
        ("7", GapState.OPEN),
    ]
    assert len(i.open_gaps_opened) == 2


def test_two_notices_before_the_next_id_are_one_hole() -> None:
    i = intake("0", floor="0", batch_max_events=10)
    take(i, ev(1), NOTICE, Comment("dropped 9 events"), ev(20), ev(21))
    i.end()
    opened = [c.opened for b in cut(i) for c in b.gap_changes if c.opened is not None]
    assert [(g.notice_id, g.announced) for g in opened] == [("1", 5)]


def test_a_notice_taken_as_a_finished_repair_ends_makes_it_a_drop_signal() -> None:
    i = intake(
        "19",
        route=Route.LAGGED,
        floor="40",
        witness="20",
        gaps=[gap("a", "20", "30")],
        batch_max_events=10,
        batch_max_delay=0.5,
    )
    take(i, *events(20, 21, 30, 31), now=2.0)
    i.poll(2.5)
    i.poll(2.5 + DROP_GRACE)
    assert i.outcome is Outcome.ROTATED  # every gap it knew is closed
    cut(i)
    # What the reader had read ahead by then: a notice, and the id that bounds it.
    take(i, ev(32), NOTICE, ev(40), now=2.6)
    i.end()
    assert i.outcome is Outcome.DROP_SIGNAL
    batches = cut(i)
    assert [eid for b in batches for eid in ids(b)] == ["32", "40"]
    opened = [c.opened for b in batches for c in b.gap_changes if c.opened is not None]
    assert [(g.notice_id, g.end_id) for g in opened] == [("32", "40")]


def test_the_outcome_reported_for_an_ending_with_a_drop_signal_in_it() -> None:
    """A notice whose grace had not passed when the connection rotated (or the server
    closed it): the gap is recorded, so the workflow must hear of a drop signal."""
    i = intake("0", floor="0")
    take(i, ev(1), NOTICE)
    assert i.outcome is None
    i.end()
    assert i.ending(Outcome.ROTATED) is Outcome.DROP_SIGNAL
    assert i.ending(Outcome.DROPPED) is Outcome.DROP_SIGNAL
    assert i.ending(Outcome.CANCELLED) is Outcome.CANCELLED
    quiet = intake("0", floor="0")
    take(quiet, ev(1))
    quiet.end()
    assert quiet.ending(Outcome.ROTATED) is Outcome.ROTATED


# -- a reconnect that cannot resume (issue 24, item 8) ---------------------------------------


def idless(*data: str) -> list[DecodedEvent]:
    return [DecodedEvent(data=d) for d in data]


def test_a_reconnect_with_no_id_records_its_loss_window_with_its_first_batch() -> None:
    i = intake(None, has_rows=True, batch_max_events=2)
    assert i.cannot_resume
    i.head(truncation_header=None)
    take(i, *idless("a", "b", "c"))
    i.end()
    batches = cut(i)
    assert [len(b.records) for b in batches] == [2, 1]
    [opened] = batches[0].gap_changes
    assert opened.opened is not None and opened.opened.kind == GapKind.NO_RESUME
    assert (opened.close, opened.truncated, opened.opened.start_id) == (True, True, None)
    assert batches[1].gap_changes == []
    assert i.counts.reconnects_without_cursor == 0  # counted once its gap is committed
    for batch in batches:
        i.committed(batch, new_rows=len(batch.records))
    assert i.counts.reconnects_without_cursor == 1
    assert i.outcome is None and i.drop is None  # nothing to repair: it reads on


def test_a_reconnect_with_no_id_reads_on_after_its_window_is_recorded() -> None:
    """Its gap closes as it opens: that is no finished repair, and ending the connection
    would only lose more (each reconnect of such a stream is a loss window)."""
    i = intake(None, has_rows=True, batch_max_events=1)
    i.head(truncation_header=None)
    for n in range(5):
        take(i, *idless(f"e{n}"), now=float(n))
        i.poll(n + DROP_GRACE)
        cut(i)
    assert i.outcome is None and i.next_deadline(10.0) is None


def test_a_reconnect_with_no_id_that_reads_nothing_records_its_window_alone() -> None:
    i = intake(None, read_before=True)
    i.head(truncation_header=None)
    i.end()
    [batch] = cut(i)
    assert batch.records == [] and [c.opened.kind for c in batch.gap_changes if c.opened] == [
        GapKind.NO_RESUME
    ]
    i.committed(batch, new_rows=0)
    assert i.counts.reconnects_without_cursor == 1


def test_only_an_opened_stream_ends_a_loss_window() -> None:
    """No head, no window closed: a refused or failed attempt records nothing; the next
    one that opens the stream does."""
    i = intake(None, has_rows=True)
    i.end()
    assert cut(i) == []


def test_the_first_connection_and_a_resuming_one_are_no_loss_window() -> None:
    for i in (intake(None), intake("5", floor="5", read_before=True)):
        assert not i.cannot_resume
        i.head(truncation_header=None)
        take(i, *idless("a"))
        i.end()
        assert [c for b in cut(i) for c in b.gap_changes] == []


def test_a_loss_window_ends_before_the_first_id_read() -> None:
    i = intake(None, read_before=True, batch_max_events=10)
    i.head(truncation_header=None)
    take(i, ev(41), ev(42))
    i.end()
    records = apply_all(cut(i))
    [record] = records.values()
    assert (record.kind, record.state, record.start_id, record.end_id, record.missing) == (
        GapKind.NO_RESUME.value,
        GapState.UNRECOVERABLE,
        None,
        "41",
        None,
    )
