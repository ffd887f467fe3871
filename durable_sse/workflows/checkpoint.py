"""``CheckpointAdvanceWorkflow``: one advance of a stream's lagging id.

Started every replay window by the Temporal Schedule ``sse-checkpoint:<name>``. The
window is measured from the workflow's own start time (``workflow.now()``), so a late
or retried run still advances to where the schedule meant it to. The event log refuses
to move it past an open gap; this workflow only asks, and only for the stream its id is
bound to (``sse-checkpoint:<name>``, see :mod:`durable_sse.ownership`): a run whose id
names another stream fails at once without touching anything.

A run that leaves the lagging id at the stream's newest id, with no retention to apply,
pauses its own schedule (``rest_checkpoint_schedule``): nothing can move until a newer
event is stored, and the connection that stores one wakes the schedule
(:mod:`durable_sse.cursor.rest`). An idle stream costs no runs at all.

Then retention (:mod:`activities.retention`): the stream's events older than its
retention go, in bounded batches, never one at or after the lagging id just set, the
oldest open gap or what a running connection may still need. Under another ``id_order``
than the stream's keys were made with, both activities refuse (a non-retryable
``ConfigError``; the run fails, nothing moves, nothing is deleted). What it did is
signalled to the stream's workflow (``retention``) for its ``status``. A run of a
schedule built before retention existed skips the step (see
``AdvanceInput.retention_declared``).

Each run is short and Pinned to the Worker Deployment Version it started on; the
schedule starts the next one on the current version, so a change needs no patch.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_sse.contracts import (
        AdvanceInput,
        AdvanceResult,
        RetentionInput,
        RetentionStatus,
        StreamRef,
        stream_workflow_id,
    )
    from durable_sse.cursor.rest import may_rest
    from durable_sse.ownership import checkpoint_owner_error

ADVANCE_TIMEOUT = timedelta(seconds=60)
RETENTION_TIMEOUT = timedelta(minutes=4)
"""Inside the run's own timeout (at least 5 minutes): a run is a few bounded batches."""
RETENTION_HEARTBEAT = timedelta(seconds=30)
QUIET_REPORT_EVERY = 6 * 3600.0
"""A run that deleted nothing reports only when it is the first of a period this long: its
report would repeat the last one but for its time (rows deleted 0, the same oldest row),
and each report is a signal and a workflow task in the stream's history."""
REST_TIMEOUT = timedelta(seconds=30)
STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=["ConfigError"],
)
"""The run's steps after the advance (retention, the rest): a few quick tries, then the
failure is logged and the next run, one window later, tries again."""


@workflow.defn
class CheckpointAdvanceWorkflow:
    @workflow.run
    async def run(self, input: AdvanceInput) -> AdvanceResult:
        problem = checkpoint_owner_error(workflow.info().workflow_id, input.stream.name)
        if problem is not None:
            raise ApplicationError(problem, type="ConfigError", non_retryable=True)
        if input.now is None:
            input = dataclasses.replace(input, now=workflow.now().isoformat())
        result = await workflow.execute_activity(
            "advance_checkpoint",
            input,
            result_type=AdvanceResult,
            start_to_close_timeout=ADVANCE_TIMEOUT,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=1),
                maximum_interval=timedelta(seconds=30),
                maximum_attempts=10,
            ),
        )
        workflow.logger.info(
            "checkpoint %s: lagging id %r moved=%s held_by_gap=%s",
            input.stream.name,
            result.lagging_id,
            result.moved,
            result.held_by_gap,
        )
        if not input.retention_declared:
            return result
        if result.retention_applies is False:
            # No retention anywhere: an activity (an action) less a run, and when nothing
            # is left to advance, no run at all until a newer event comes.
            if may_rest(caught_up=result.caught_up, retention_applies=result.retention_applies):
                result.rested = await self._rest(input.stream)
            return result
        result.retention = await self._retention(input)
        return result

    async def _rest(self, stream: StreamRef) -> bool:
        """Pause the schedule while the stream is caught up (see durable_sse.cursor.rest);
        a failure is logged, never the run's: the schedule simply keeps running."""
        try:
            return await workflow.execute_activity(
                "rest_checkpoint_schedule",
                stream,
                result_type=bool,
                start_to_close_timeout=REST_TIMEOUT,
                retry_policy=STEP_RETRY,
            )
        except ActivityError as error:
            workflow.logger.warning(
                "checkpoint schedule of %s not rested: %s", stream.name, error.cause or error
            )
            return False

    async def _retention(self, input: AdvanceInput) -> RetentionStatus | None:
        """Apply the stream's retention and tell its workflow; a failure is logged, never
        the run's (the next run, one window later, tries again)."""
        try:
            status = await workflow.execute_activity(
                "apply_retention",
                RetentionInput(
                    stream=input.stream,
                    replay_window=input.replay_window,
                    retention=input.retention,
                    now=input.now,
                ),
                result_type=RetentionStatus,
                start_to_close_timeout=RETENTION_TIMEOUT,
                heartbeat_timeout=RETENTION_HEARTBEAT,
                retry_policy=STEP_RETRY,
            )
        except ActivityError as error:
            workflow.logger.warning(
                "retention of %s failed: %s", input.stream.name, error.cause or error
            )
            return None
        if status.retention is None:
            return status  # nothing configured: nothing to tell
        if not status.deleted_last_run and not _first_of_period(
            input.now, input.replay_window, QUIET_REPORT_EVERY
        ):
            return status  # nothing changed: history is not free
        try:
            stream = workflow.get_external_workflow_handle(stream_workflow_id(input.stream.name))
            await stream.signal("retention", status)
        except Exception as error:  # noqa: BLE001 - a stopped stream just misses the news
            workflow.logger.info(
                "retention of %s not reported to its workflow: %s", input.stream.name, error
            )
        return status


def _first_of_period(now: str | None, window: float, period: float) -> bool:
    """Whether a run at ``now`` is the first one (runs ``window`` apart) of its ``period``."""
    if now is None:
        return True
    at = datetime.fromisoformat(now).timestamp()
    return at // period != (at - window) // period
