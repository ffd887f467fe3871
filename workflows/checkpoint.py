"""``CheckpointAdvanceWorkflow``: one advance of a stream's lagging id.

Started every replay window by the Temporal Schedule ``sse-checkpoint:<name>``. The
window is measured from the workflow's own start time (``workflow.now()``), so a late
or retried run still advances to where the schedule meant it to. The event log refuses
to move it past an open gap; this workflow only asks, and only for the stream its id is
bound to (``sse-checkpoint:<name>``, see :mod:`durable_sse.ownership`): a run whose id
names another stream fails at once without touching anything.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_sse.contracts import AdvanceInput, AdvanceResult
    from durable_sse.ownership import checkpoint_owner_error

ADVANCE_TIMEOUT = timedelta(seconds=60)


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
        return result
