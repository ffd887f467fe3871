"""The gap: where invariant 5 ("the gap is repaired, or counted exactly") lives.

The package's pure parts (types, the per-connection tracker, the transitions) are
re-exported here, so callers name the concept, not the module; the store of
``sse_gaps`` rows is :mod:`durable_sse.gaps.store` and is not re-exported (it imports
the database layer, which the pure parts never do).
"""

from durable_sse.gaps.model import (
    MAX_GAPS_IN_SUMMARY,
    SHORT_READS_TO_LOSE,
    Gap,
    GapChange,
    GapKind,
    GapState,
    GapSummary,
    GapTotals,
    GapTracker,
    GapView,
    StoredIds,
    StreamContext,
    apply_change,
    attribute_early_notice,
    choose_start,
    count_missing,
    lagging_cap,
    lagging_target,
    no_resume,
    numeric_span,
    oldest_open,
    summarize,
)

__all__ = [
    "MAX_GAPS_IN_SUMMARY",
    "SHORT_READS_TO_LOSE",
    "Gap",
    "GapChange",
    "GapKind",
    "GapState",
    "GapSummary",
    "GapTotals",
    "GapTracker",
    "GapView",
    "StoredIds",
    "StreamContext",
    "apply_change",
    "attribute_early_notice",
    "choose_start",
    "count_missing",
    "lagging_cap",
    "lagging_target",
    "no_resume",
    "numeric_span",
    "oldest_open",
    "summarize",
]
