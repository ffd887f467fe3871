"""Small store activities the workflows call: the lagging id, the gaps, ``since``.

Each is one short call on the :class:`~durable_sse.stores.Stores` built once in the
worker (the composition root). Store failures surface as retryable activity failures;
the workflow's retry policy rides them out.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_sse.config.durations import effective_retention
from durable_sse.contracts import (
    AdvanceInput,
    AdvanceResult,
    CheckpointState,
    SinceInput,
    StreamGaps,
    StreamRef,
)
from durable_sse.errors import IdOrderMismatchError
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)


class CheckpointActivities:
    """Activities over the worker's :class:`~durable_sse.stores.Stores`."""

    def __init__(self, stores: Stores, *, worker_retention: float | None = None) -> None:
        self._stores = stores
        self._worker_retention = worker_retention

    @activity.defn
    async def advance_checkpoint(self, input: AdvanceInput) -> AdvanceResult:
        """Move the lagging id to the newest id persisted a replay window ago, never past
        an open gap; refused (nothing moves) under another ``id_order`` than the stream's
        keys were made with."""
        now = _parse_time(input.now) if input.now else datetime.now(UTC)
        try:
            result = await self._stores.checkpoints.advance_lagging(
                input.stream.name,
                input.stream.id_order,
                window=input.replay_window,
                now=now,
            )
        except IdOrderMismatchError as error:
            raise refused(input.stream.name, "the lagging id not moved", error) from None
        logger.info(
            "checkpoint %s: lagging id %r (moved=%s, held by a gap=%s)",
            input.stream.name,
            result.lagging_id,
            result.moved,
            result.held_by_gap,
        )
        retention, _ = effective_retention(
            input.retention, self._worker_retention, input.replay_window
        )
        result.retention_applies = retention is not None
        return result

    @activity.defn
    async def stream_gaps(self, input: StreamRef) -> StreamGaps:
        """The stream's gaps and lagging id (when a connection's result did not say)."""
        gaps, checkpoint = await self._stores.gaps_and_checkpoint(input.name, input.id_order)
        return StreamGaps(gaps=gaps, lagging_id=checkpoint.lagging_id if checkpoint else None)

    @activity.defn
    async def resolve_since(self, input: SinceInput) -> str | None:
        """The newest id persisted at or before ``since`` (None when there is none)."""
        return await self._stores.reads.newest_id_at_or_before(
            input.stream.name, _parse_time(input.since)
        )

    @activity.defn
    async def get_checkpoint(self, input: StreamRef) -> CheckpointState | None:
        return await self._stores.checkpoints.get_checkpoint(input.name)

    def activities(self) -> list:
        return [
            self.advance_checkpoint,
            self.stream_gaps,
            self.resolve_since,
            self.get_checkpoint,
        ]


def refused(stream: str, what: str, error: IdOrderMismatchError) -> ApplicationError:
    """Log a refusal loudly and make it the activity's non-retryable failure."""
    logger.error("checkpoint %s refused, %s: %s", stream, what, error)
    return ApplicationError(f"{what}: {error}", type="ConfigError", non_retryable=True)


def _parse_time(value: str) -> datetime:
    """ISO time; a naive value is UTC (``Z`` suffixes are accepted).

    A malformed time cannot get better by retrying: it fails the activity for good.
    """
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ApplicationError(
            f"{value!r} is not an ISO time", type="ConfigError", non_retryable=True
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
