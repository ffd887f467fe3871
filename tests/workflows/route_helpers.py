"""Builders for the route tests: states, results, gap summaries at a fixed clock.

The workflow mirrors the store's gap summary and routes on it; these builders hand it
summaries the way a ReadResult (or a refresh from the store) would.
"""

from __future__ import annotations

from datetime import UTC, datetime

from durable_sse.contracts import (
    DropReport,
    Outcome,
    ReadCounts,
    ReadResult,
    Route,
)
from durable_sse.gaps.model import GapSummary, GapTotals, GapView
from durable_sse.workflows.routes import (
    ConnectionPlan,
    Decision,
    StreamState,
    plan_connection,
    record_result,
    should_interrupt,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


INTERVAL = 60.0


ORDER = "numeric"


LIVE = ConnectionPlan(route=Route.LIVE)


def view(
    gap_id: str = "g1",
    start: str = "40",
    end: str | None = "50",
    resume: str | None = None,
    *,
    seen_at: str = NOW.isoformat(),
) -> GapView:
    """An open comment gap after ``start`` and before ``end``, resuming from ``resume``."""
    return GapView(
        gap_id=gap_id,
        kind="comment",
        start_id=start,
        end_id=end,
        resume_from=resume or start,
        announced=None,
        seen_at=seen_at,
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
