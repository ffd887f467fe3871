"""The ``apply_retention`` activity: delete a stream's events older than its retention.

Run by ``CheckpointAdvanceWorkflow`` right after it moves the lagging id, so the fence
(the lagging id, the oldest open gap) is as fresh as it gets. The decisions are in
:mod:`durable_sse.log.retention`, the statements in
:meth:`~durable_sse.log.prune.Prune.apply_retention`; this activity picks the
retention (the stream's own, else the worker's), heartbeats between the bounded
batches, and records the metrics. A stream whose ``id_order`` is not the one its keys
were made with is refused (nothing deleted, logged as an error, a non-retryable failure).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from temporalio import activity

from durable_sse.activities.checkpoint import _parse_time, refused
from durable_sse.config.durations import effective_retention
from durable_sse.contracts import RetentionInput, RetentionStatus
from durable_sse.errors import IdOrderMismatchError
from durable_sse.log.retention import BATCH_ROWS, MAX_BATCHES
from durable_sse.ops.metrics import RetentionMetrics
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)


class RetentionActivities:
    """``apply_retention`` over the worker's stores and its retention setting."""

    def __init__(
        self,
        stores: Stores,
        *,
        worker_retention: float | None = None,
        batch_rows: int = BATCH_ROWS,
        max_batches: int = MAX_BATCHES,
    ) -> None:
        self._stores = stores
        self._worker_retention = worker_retention
        self._batch_rows = batch_rows
        self._max_batches = max_batches

    @activity.defn
    async def apply_retention(self, input: RetentionInput) -> RetentionStatus:
        """Delete what the stream's retention lets go; report what is deleted and kept."""
        name = input.stream.name
        retention, source = effective_retention(
            input.retention, self._worker_retention, input.replay_window
        )
        now = _parse_time(input.now) if input.now else datetime.now(UTC)
        if retention is None:
            return RetentionStatus(run_at=now.isoformat())

        async def beat(deleted: int) -> None:
            if activity.in_activity():
                activity.heartbeat(deleted)

        try:
            run = await self._stores.prune.apply_retention(
                name,
                input.stream.id_order,
                cutoff=now - timedelta(seconds=retention),
                batch_rows=self._batch_rows,
                max_batches=self._max_batches,
                between=beat,
            )
        except IdOrderMismatchError as error:
            raise refused(name, "nothing deleted", error) from None
        state = run.state
        status = RetentionStatus(
            retention=retention,
            source=source,
            deleted_rows=state.deleted_rows,
            deleted_last_run=run.deleted,
            complete=run.complete,
            held_by=run.held_by,
            keep_from=run.keep_from,
            horizon_id=state.horizon_id,
            oldest_kept_id=state.oldest_kept_id,
            oldest_kept_at=state.oldest_kept_at.isoformat() if state.oldest_kept_at else None,
            run_at=now.isoformat(),
            held_by_consumers=list(run.held_by_consumers),
        )
        if activity.in_activity():
            RetentionMetrics(activity.metric_meter(), name).record(
                run.deleted, state.oldest_kept_at
            )
        logger.log(
            logging.INFO if run.deleted else logging.DEBUG,
            "retention %s: deleted %d rows in %d statements (longest %.3f s, %s), kept from "
            "%r (%s), oldest kept %s",
            name,
            run.deleted,
            run.batches,
            run.longest_statement,
            "done" if run.complete else "more next run",
            run.keep_from,
            run.held_by,
            status.oldest_kept_at,
        )
        return status

    def activities(self) -> list:
        return [self.apply_retention]
