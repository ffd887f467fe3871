"""Builders for the intake tests: a spec, an Intake, decoded items by hand.

Items are built as the SSE decoder would hand them over; clocks are plain numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from datetime import UTC, datetime

from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import Route
from durable_sse.gaps.model import GapRecord, StreamContext
from durable_sse.reader.intake import CommitBatch, Intake
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
