"""The chaos checker's arithmetic (tests/chaos/checker.py): plain, no services.

The case from chaos scenario 6 (CI, 2026-12-03): the live connection stored 1..500; a
replay from the lagging id 100 was told the history starts at 401 and took a drop of 400
events before its first event: 401..800 were skipped, 801 came next. 401..500 are stored
(the live connection read them), 501..800 are missing for good.
"""

from __future__ import annotations

from durable_sse.gaps.model import GapRecord, GapState
from durable_sse.source import SourceTruth
from tests.chaos.checker import Stored, check

NEWEST = 1000


def truth(dropped: list[tuple[int, int]], unavailable: list[tuple[int, int]] = ()) -> SourceTruth:
    return SourceTruth(
        ids=list(range(1, NEWEST + 1)),
        dropped=dropped,
        generated=NEWEST,
        history_start=NEWEST - 299,
        unavailable=list(unavailable),
    )


def rows(ids: set[int]) -> Stored:
    return Stored(ids=sorted(ids), rows=len(ids), duplicate_rows=0)


def gap(start: str, end: str, *, state: str, missing: int | None) -> GapRecord:
    return GapRecord(
        gap_id="g",
        stream="s",
        kind="comment",
        start_id=start,
        end_id=end,
        notice_id=start,
        state=state,
        missing=missing,
    )


SCENARIO_6 = set(range(1, 501)) | set(range(801, NEWEST + 1))
UNKNOWN = gap("100", "801", state=GapState.UNRECOVERABLE.value, missing=None)


def test_scenario_6_before_the_first_event_was_counted_lost_by_the_old_rule() -> None:
    """What CI saw: part of the dropped range is stored (not recovered, read before the
    drop), so the range's oldest stored id bounds nothing: 300 "lost"."""
    verdict = check("6", truth([(401, 800)]), rows(SCENARIO_6))
    assert (verdict.lost, verdict.out_of_window, verdict.first_lost[0]) == (300, 0, 501)


def test_ids_inside_an_unknown_size_gap_are_announced_lost() -> None:
    verdict = check("6", truth([(401, 800)]), rows(SCENARIO_6), [UNKNOWN])
    assert (verdict.lost, verdict.out_of_window, verdict.unknown_size) == (0, 300, 300)
    assert "300 (300 of unknown size)" in verdict.row()


def test_ids_asked_for_after_the_history_lost_them_are_out_of_window() -> None:
    """The source's own truth: the repair asked from 99 when the history started at 901."""
    exact = gap("500", "801", state=GapState.UNRECOVERABLE.value, missing=300)
    verdict = check("6", truth([(401, 800)], [(100, 900)]), rows(SCENARIO_6), [exact])
    assert (verdict.lost, verdict.out_of_window, verdict.unknown_size) == (0, 300, 0)


def test_an_unknown_size_gap_excuses_only_ids_the_source_skipped_inside_its_bounds() -> None:
    # 950 was never dropped by the source: missing it is a loss, gap or no gap
    stored = SCENARIO_6 - {950}
    wide = gap("100", "1001", state=GapState.UNRECOVERABLE.value, missing=None)
    verdict = check("6", truth([(401, 800)]), rows(stored), [wide])
    assert (verdict.lost, verdict.first_lost, verdict.out_of_window) == (1, [950], 300)
    # a gap that ends before the hole does: the rest is lost
    short = gap("100", "701", state=GapState.UNRECOVERABLE.value, missing=None)
    verdict = check("6", truth([(401, 800)]), rows(SCENARIO_6), [short])
    assert (verdict.lost, verdict.first_lost[0], verdict.out_of_window) == (100, 701, 200)


def test_only_unrecoverable_gaps_of_unknown_size_announce_a_loss() -> None:
    for other in (
        gap("100", "801", state=GapState.OPEN.value, missing=None),
        gap("100", "801", state=GapState.REPAIRED.value, missing=0),
        gap("100", "801", state=GapState.UNRECOVERABLE.value, missing=300),
    ):
        verdict = check("6", truth([(401, 800)]), rows(SCENARIO_6), [other])
        assert (verdict.lost, verdict.out_of_window) == (300, 0), other.state
    unavailable_but_not_dropped = check("6", truth([], [(100, 900)]), rows(SCENARIO_6))
    assert unavailable_but_not_dropped.lost == 300  # the source never skipped them


def test_the_oldest_part_of_a_partly_recovered_drop_is_out_of_window() -> None:
    """The rule the other scenarios use, unchanged: the repair recovered 601..800."""
    stored = set(range(1, 401)) | set(range(601, NEWEST + 1))
    verdict = check("5", truth([(401, 800)]), rows(stored))
    assert (verdict.lost, verdict.out_of_window, verdict.unknown_size) == (0, 200, 0)
    stored.discard(700)  # a hole after the recovered start is lost
    verdict = check("5", truth([(401, 800)]), rows(stored))
    assert (verdict.lost, verdict.first_lost) == (1, [700])


def test_a_skip_never_announced_and_still_in_the_history_is_lost_and_said_so() -> None:
    """Chaos scenario 12: the source skipped 801..810 and closed the connection before its
    notice went out; the history still holds them. Missing, they are lost (no excuse), and
    counted as lost inside an unannounced skip."""
    source = truth([(801, 810)])
    source.unannounced = [(801, 810)]
    verdict = check("12", source, rows(set(range(1, NEWEST + 1)) - set(range(801, 811))))
    assert (verdict.lost, verdict.lost_unannounced, verdict.out_of_window) == (10, 10, 0)
    recovered = check("12", source, rows(set(range(1, NEWEST + 1))))
    assert (recovered.lost, recovered.lost_unannounced) == (0, 0)
