"""The workflow of the codec's end-to-end test, in a module of its own.

The sandbox re-imports a workflow's module on every worker start: this one imports only
temporalio, not pytest or the test's helpers, so that nothing a test run has loaded can
break that re-import.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


@activity.defn
async def fail_loudly(marker: str) -> None:
    raise ApplicationError(f"could not reach https://{marker}.example", non_retryable=True)


@workflow.defn
class MarkerWorkflow:
    """Carries the marker as input, through an activity failure, into the result."""

    @workflow.run
    async def run(self, marker: str) -> str:
        try:
            await workflow.execute_activity(
                fail_loudly,
                marker,
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            return f"recovered {marker}: {message}"
        return "unexpected success"
