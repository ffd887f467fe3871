"""The live status: the workflow's view, with what moves every second read from the stores.

A stream's workflow keeps in its history what changes its course (state, route, gaps,
errors) and learns cursors and counts when a connection ends: a connection can last an
hour, and reporting every batch through history is what a stream would pay for all day
(docs/benchmarks.md). ``durable-sse status`` therefore folds in, when it can reach them:

* the running connection's live progress from Redis (``progress:<stream>``, written every
  couple of seconds by the reader: cursor, counts, commit lag, and when);
* the stream's gaps, lagging id and whether its checkpoint schedule rests, from
  PostgreSQL (read now).

Each figure says its age (``progress_at``, ``gaps_at``); without the stores the status is
the workflow's alone, as of ``counted_at``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

from durable_sse.contracts import StreamStatus, add_counts, fold_gap_totals, parse_progress
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.errors import StoreError
from durable_sse.ids import newest
from durable_sse.stores import Stores


@dataclass
class LiveStores:
    """The deployment's stores, as far as the caller can reach them."""

    l2: RedisCursors | None = None
    stores: Stores | None = None

    async def close(self) -> None:
        if self.l2 is not None:
            await self.l2.close()
        if self.stores is not None:
            await self.stores.close()


async def live_status(status: StreamStatus, live: LiveStores) -> StreamStatus:
    """``status`` with the running connection's live progress and the store's gaps."""
    status = dataclasses.replace(status, counters=dataclasses.replace(status.counters))
    if live.l2 is not None and status.connection is not None and status.progress_at is None:
        text = await live.l2.get_progress(status.name)
        progress = parse_progress(text) if text is not None else None
        if progress is not None and progress.connection == status.connection:
            add_counts(status.counters, progress.counts)
            status.live_cursor = newest([status.live_cursor, progress.cursor], status.id_order)
            status.commit_lag = progress.commit_lag
            status.progress_at = progress.at
            status.credentials = progress.credentials
    if live.stores is not None:
        try:
            gaps, checkpoint = await live.stores.gaps_and_checkpoint(status.name, status.id_order)
        except StoreError:
            return status  # the workflow's view, as of its last result
        fold_gap_totals(status.counters, gaps.totals)
        status.open_gaps = gaps.open
        if checkpoint is not None:
            status.lagging_id = checkpoint.lagging_id or status.lagging_id
            status.checkpoint_resting_since = checkpoint.resting_since
        status.gaps_at = datetime.now(UTC).isoformat()
    return status
