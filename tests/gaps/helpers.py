"""Helpers of the gap tests: a gap record, ids under an order, a tracker on a fake store.

Ids are small integers under ``numeric`` (``natural`` where the order matters); a gap
``(20, 30)`` is the hole strictly after 20 and strictly before 30.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

from durable_sse.cursor.fence import choose_start
from durable_sse.gaps.model import (
    GapChange,
    GapKind,
    GapRecord,
    StreamContext,
)
from durable_sse.gaps.tracker import GapTracker
from durable_sse.gaps.transitions import apply_change

ORDER = "numeric"


NOW = "2026-01-01T00:00:00+00:00"


LATER = "2026-01-01T00:05:00+00:00"


def gap(
    gap_id: str = "g",
    start: str | None = "20",
    end: str | None = "30",
    *,
    notice: str | None = None,
    **fields: object,
) -> GapRecord:
    fields.setdefault("seen_at", NOW)
    fields.setdefault("kind", GapKind.COMMENT.value)
    return GapRecord(
        gap_id=gap_id,
        stream="s",
        start_id=start,
        end_id=end,
        notice_id=notice if notice is not None else end,
        **fields,  # type: ignore[arg-type]
    )


class Ids:
    """An in-memory ``gaps.StoredIds``: stored integers, and other gaps' counted ranges."""

    def __init__(self, stored: Iterable[int] = (), counted: Iterable[tuple[str, int, int]] = ()):
        self.stored = set(stored)
        self.counted = list(counted)

    def stored_numbers_between(self, low: int, high: int) -> int:
        return sum(1 for n in self.stored if low < n < high)

    def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
        return [(low, high) for gap_id, low, high in self.counted if gap_id != except_gap]


def apply(
    record: GapRecord | None,
    change: GapChange,
    *,
    lagging: str | None = None,
    new_rows: int = 0,
    stored: Ids | None = None,
    order: str = ORDER,
) -> GapRecord | None:
    return apply_change(
        record,
        change,
        order=order,
        lagging_id=lagging,
        new_rows=new_rows,
        now=LATER,
        stored=stored,
    )


STORED = ["10", "20", "30", "40", "50"]


def neighbour(event_id: str, older: bool) -> str | None:
    """The stored id just before (older) or after ``event_id`` among STORED."""
    value = int(event_id)
    if older:
        before = [i for i in STORED if int(i) < value]
        return before[-1] if before else None
    after = [i for i in STORED if int(i) > value]
    return after[0] if after else None


def start(
    cursor: str | None = None,
    source: str = "none",
    *,
    repair: bool = False,
    lagging: str | None = None,
    floor: str | None = "50",
    gaps: Iterable[GapRecord] = (),
) -> tuple[str | None, str, str | None]:
    return choose_start(
        cursor=cursor,
        source=source,
        repair=repair,
        lagging_id=lagging,
        floor=floor,
        open_gaps=list(gaps),
        order=ORDER,
        neighbour=neighbour,
    )


def tracker(
    cursor: str | None,
    *,
    lagging: str | None = None,
    floor: str | None = None,
    witness: str | None = None,
    gaps: Iterable[GapRecord] = (),
    contiguous: bool = False,
    confirm_ids: int = 0,
) -> GapTracker:
    """A connection's tracker; by default what a batch proves counts at once (these tests
    are about what it proves; how long it is held back is tested apart)."""
    numbers = itertools.count(1)
    return GapTracker(
        stream="s",
        order=ORDER,
        cursor=cursor,
        context=StreamContext(
            lagging_id=lagging,
            floor=floor,
            witness=witness,
            open_gaps=[dataclasses.replace(g) for g in gaps],
        ),
        contiguous=contiguous,
        new_gap_id=lambda: f"new{next(numbers)}",
        now=lambda: NOW,
        confirm_ids=confirm_ids,
    )


def read(t: GapTracker, *ids: int) -> None:
    for n in ids:
        t.id_read(str(n))
