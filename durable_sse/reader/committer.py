"""The commit pipeline, driven by the event loop: a connection's batches committing while
it reads on.

:class:`~durable_sse.reader.pipeline.CommitPipeline` keeps the order and applies what each
commit moves; here its batches go to the real writer, each commit is applied the moment
it lands (so the cursor, L1, L2 and the heartbeat follow the commits however quiet the
stream), the reader waits when too many are in flight, and what a commit did is recorded
(metrics, the commit lag, the retention horizon's drops logged once).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from durable_sse.reader.intake import CommitBatch
from durable_sse.reader.keepalive import Keepalive
from durable_sse.reader.metrics import ReaderMetrics
from durable_sse.reader.pipeline import CommitPipeline, Settled
from durable_sse.reader.session import ReadSession
from durable_sse.stores import Stores


class Committer:
    """One connection's batches, from the intake to committed cursors."""

    def __init__(
        self,
        session: ReadSession,
        stores: Stores,
        keepalive: Keepalive,
        *,
        metrics: ReaderMetrics | None,
        log: logging.Logger | logging.LoggerAdapter[Any],
        on_stored: Callable[[], None] | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.session = session
        self.on_stored = on_stored
        self.keepalive = keepalive
        self.metrics = metrics
        self.log = log
        self.pipeline = CommitPipeline(
            session,
            stores.writer,
            cursors=[stores.l1.advance, *([stores.l2.submit] if stores.l2 is not None else [])],
            on_settled=self._settled,
            worker_id=worker_id,
        )
        self.commit_lag: float | None = None
        """Seconds from the newest committed event's arrival to its commit."""
        self.horizon_logged = False
        """An id dropped at the retention horizon was logged (once per connection)."""

    async def submit_ready(self) -> None:
        """Submit the batches the intake cut, first waiting while too many commit."""
        pipeline, ready = self.pipeline, self.session.started.ready
        while ready:
            pipeline.settle()
            pipeline.check()  # a batch that failed fails the connection here
            if pipeline.full:
                await self.keepalive.waiting(self._settled_oldest())
            self._submit(ready.popleft())

    async def flush(self) -> None:
        """Commit everything read so far; called before any outcome is returned."""
        session = self.session
        session.stop()
        intake = session.started
        while intake.ready:
            self._submit(intake.ready.popleft())
        # No closing heartbeat unless the commit is slow: the result carries the cursor,
        # and a heartbeat in flight would hold the completion back by one more call.
        await self.keepalive.waiting(self._drained())

    def _submit(self, batch: CommitBatch) -> None:
        self.pipeline.submit(batch)
        job = self.pipeline.in_flight[-1].job
        if job is not None:
            job.future.add_done_callback(self._landed)

    def _landed(self, future: asyncio.Future[int]) -> None:
        """A commit landed: apply it now (in order), not at the next chunk. Its failure is
        taken here and raised by the pipeline's ``check`` (for the first that failed)."""
        if not future.cancelled():
            future.exception()
        self.pipeline.settle()

    async def _settled_oldest(self) -> None:
        """Wait until the oldest batch in flight is applied (or one has failed)."""
        pipeline = self.pipeline
        waiting_for = len(pipeline.in_flight)
        while pipeline.in_flight and len(pipeline.in_flight) >= waiting_for:
            if pipeline.failure is not None:
                break
            job = pipeline.oldest_job
            if job is not None and not job.future.done():
                await asyncio.wait([job.future])
            pipeline.settle()
        pipeline.check()

    async def _drained(self) -> None:
        pipeline = self.pipeline
        while pipeline.in_flight and pipeline.failure is None:
            await self._settled_oldest()
        pipeline.check()

    def _settled(self, settled: Settled) -> None:
        """One batch's commit applied: metrics, and a heartbeat when it gave the first id."""
        metrics, inserted, batch = self.metrics, settled.inserted, settled.batch
        if inserted.dropped_by_horizon:
            self._dropped_by_horizon(settled)
        if metrics is not None:
            if settled.seconds is not None:
                metrics.batch_persist.record(settled.seconds)
            # Only what moved: at a thousand streams each metric call is a crossing into
            # the SDK's core (nearly 5 % of the worker's loop when every batch made three).
            if inserted.new_rows:
                metrics.events_persisted.add(inserted.new_rows)
            if inserted.duplicates + batch.skipped:
                metrics.duplicates.add(inserted.duplicates + batch.skipped)
            if inserted.reused:
                metrics.ids_reused.add(len(inserted.reused))
            if inserted.dropped_by_horizon:
                metrics.dropped_by_horizon.add(inserted.dropped_by_horizon)
            if batch.recovered and inserted.new_rows:
                metrics.events_recovered.add(inserted.new_rows)
            if settled.moved.blind:
                metrics.reconnects_without_cursor.add(1)
        if batch.records:
            lag = (datetime.now(UTC) - batch.records[-1].received_at).total_seconds()
            if metrics is not None:
                metrics.cursor_lag.set(lag)
            self.commit_lag = round(lag, 2)
        self.keepalive.beat(force=settled.moved.first)
        if settled.moved.cursor is not None and inserted.new_rows and self.on_stored:
            self.on_stored()

    def _dropped_by_horizon(self, settled: Settled) -> None:
        """Logged once per connection (counted in the intake and the metric)."""
        if self.horizon_logged:
            return
        self.horizon_logged = True
        inserted = settled.inserted
        self.log.warning(
            "stream %s: id %r sorts at or before the retention horizon %r (the newest id "
            "retention deleted) under id_order %r: not stored, counted as "
            "dropped_by_horizon (this connection logs it once)",
            self.session.stream,
            (inserted.dropped_id or "")[:64],
            (inserted.horizon_id or "")[:64],
            self.session.order,
        )
