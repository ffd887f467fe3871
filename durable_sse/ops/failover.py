"""Move a dead worker's connection: fail its read attempt by id, so Temporal retries it now.

The attempt's worker is gone (its lease expired, :mod:`durable_sse.ops.liveness`), so
nothing will ever heartbeat or complete it; Temporal would notice only at its heartbeat
timeout (minutes). Failing it by id with a retryable error whose ``next_retry_delay`` is
zero makes Temporal start the next attempt at once, on a live worker, with the dead
attempt's last heartbeat details: the retried connection treats what the dead one may
have read as suspect (``GapTracker.suspect``), exactly as after a heartbeat timeout. No
workflow task is needed for that, and the workflow's sticky task queue (the dead
worker's) is reset, so the connection's end is not held up waiting on it either.

Cost: one activity attempt per stream moved; nothing while no worker dies.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.log.workers import HeldConnection, WorkerLease

logger = logging.getLogger(__name__)

WORKER_LOST = "WorkerLostError"
"""The error type a moved attempt fails with (retryable: the stream reads on)."""
CALL_TIMEOUT = timedelta(seconds=10)


class Failover:
    """Moves dead workers' connections through the Temporal client."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.failed_attempts = 0
        """Attempts this worker failed by id."""

    async def move(self, connection: HeldConnection, dead: WorkerLease) -> None:
        """Fail the connection's attempt by id (retry now), after resetting its workflow's
        sticky task queue. An attempt that already ended is no error."""
        if connection.workflow_id is None or connection.activity_id is None:
            return  # registered by a build that did not record its attempt
        if connection.run_id is not None:
            await self.reset_sticky(connection.workflow_id, connection.run_id)
        handle = self.client.get_async_activity_handle(
            workflow_id=connection.workflow_id,
            run_id=connection.run_id,
            activity_id=connection.activity_id,
        )
        error = ApplicationError(
            f"worker {dead.worker_id} stopped renewing its lease: its connection of stream "
            f"{connection.stream!r} moves to a live worker",
            type=WORKER_LOST,
            next_retry_delay=timedelta(0),
        )
        try:
            await handle.fail(error, rpc_timeout=CALL_TIMEOUT)
        except RPCError as rpc:
            if rpc.status == RPCStatusCode.NOT_FOUND:
                logger.debug("stream %s: its attempt had already ended", connection.stream)
                return
            raise
        self.failed_attempts += 1

    async def reset_sticky(self, workflow_id: str, run_id: str) -> None:
        """The workflow's next task goes to the task queue every worker polls, not to the
        dead worker's own queue (where it would wait for the sticky timeout)."""
        request = ResetStickyTaskQueueRequest(
            namespace=self.client.namespace,
            execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
        )
        try:
            await self.client.workflow_service.reset_sticky_task_queue(
                request, timeout=CALL_TIMEOUT
            )
        except RPCError as rpc:
            if rpc.status != RPCStatusCode.NOT_FOUND:
                logger.debug("could not reset the sticky queue of %s: %s", workflow_id, rpc)
