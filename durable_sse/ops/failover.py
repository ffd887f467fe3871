"""Move a dead worker's connection: fail its read attempt by id, so Temporal retries it now.

The attempt's worker is gone (its lease expired, :mod:`durable_sse.ops.liveness`), so
nothing will ever heartbeat or complete it; Temporal would notice only at its heartbeat
timeout (minutes). Failing it by id with a retryable error whose ``next_retry_delay`` is
:data:`~durable_sse.contracts.RETRY_NOW` makes Temporal start the next attempt at once,
on a live worker, with the dead attempt's last heartbeat details: the retried connection
treats what the dead one may have read as suspect (``GapTracker.suspect``), exactly as
after a heartbeat timeout. No workflow task is needed for that, and the workflow's
sticky task queue (the dead worker's) is reset, so the connection's end is not held up
waiting on it either.

A worker may die between starting an attempt and registering its connection (a start
waits its turn for the database, seconds in a burst), or while it runs one of the
workflow's short activities (the gaps' read, the search attribute check): no row names
that attempt, so :meth:`Failover.unregistered` asks Temporal for it, among the pool's
running streams with no connection a running worker registered (a dead worker's row stays
until it expires, and names an older attempt). Each of those activities is a read or an
idempotent write that its retry policy retries after a timeout anyway; failed by id, it
is retried at once instead of after its ``start_to_close`` timeout (30-60 s).

Cost: one activity attempt per stream moved; nothing while no worker dies (a list and
describe calls, which are not billed actions, when one does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import AsyncActivityHandle, Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.contracts import RETRY_NOW, WORKER_LOST, WORKFLOW_ID_PREFIX
from durable_sse.log.workers import HeldConnection, WorkerLease
from durable_sse.ops.liveness import ended_here

logger = logging.getLogger(__name__)

CALL_TIMEOUT = timedelta(seconds=10)
VERIFY_AFTER = 2.0
"""Seconds after failing an attempt before looking where its retry went."""
MAX_FAILS = 8
"""Times one connection's attempt is failed at most (more than a worker's polls)."""
MAX_LOOKS = 30
"""Looks at where a moved connection's retry went, :data:`VERIFY_AFTER` apart."""
DESCRIBES_AT_ONCE = 16
"""Workflows described at once while looking for a dead worker's unregistered attempts."""
STREAMS_QUERY = (
    "WorkflowType = 'StreamWorkflow' AND ExecutionStatus = 'Running' AND TaskQueue = '{queue}'"
)
"""The pool's running streams (Temporal's visibility)."""


def worker_identity(lease: WorkerLease) -> str:
    """The Temporal worker identity of the lease's process (the SDK's default,
    ``pid@host``): what a pending activity names as the worker that runs it."""
    return f"{lease.pid}@{lease.host}"


class Failover:
    """Moves dead workers' connections through the Temporal client."""

    def __init__(self, client: Client, *, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue
        self.failed_attempts = 0
        """Attempts this worker failed by id."""
        self._following: set[asyncio.Task[None]] = set()

    async def move(self, connection: HeldConnection, dead: WorkerLease) -> None:
        """Fail the connection's attempt by id (retry now), after resetting its workflow's
        sticky task queue; then make sure the retry did not land on the dead worker.

        A worker that is only paused still has activity polls open at the server, which
        may hand it the retry: it would sit there until the worker comes back. So the
        attempt is looked at again after :data:`VERIFY_AFTER`, and an attempt that the
        dead worker took is failed again (each paused poll takes one task at most, so
        this ends); not when the dead worker's process is known to be gone
        (:func:`~durable_sse.ops.liveness.ended_here`), which spares the survivor a
        describe call per moved stream every few seconds while its retries wait to start.
        An attempt that already ended is no error."""
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
            f"worker {dead.worker_id} stopped renewing its lease: its attempt for stream "
            f"{connection.stream!r} moves to a live worker",
            type=WORKER_LOST,
            next_retry_delay=RETRY_NOW,
        )
        if await self._fail(handle, error, connection.stream) and not ended_here(dead):
            check = asyncio.create_task(self._follow(connection, dead, handle, error))
            self._following.add(check)
            check.add_done_callback(self._following.discard)

    async def _fail(
        self, handle: AsyncActivityHandle, error: ApplicationError, stream: str
    ) -> bool:
        """Fail the attempt by id; False when it had already ended."""
        try:
            await handle.fail(error, rpc_timeout=CALL_TIMEOUT)
        except RPCError as rpc:
            if rpc.status == RPCStatusCode.NOT_FOUND:
                logger.debug("stream %s: its attempt had already ended", stream)
                return False
            raise
        self.failed_attempts += 1
        return True

    async def _follow(
        self,
        connection: HeldConnection,
        dead: WorkerLease,
        handle: AsyncActivityHandle,
        error: ApplicationError,
    ) -> None:
        """In the background (the next stream's move does not wait): fail the retry again
        while the dead worker is the one that took it. A retry not started yet is looked
        at again (under load matching may take longer than :data:`VERIFY_AFTER`): it may
        still go to one of the dead worker's polls."""
        identity = worker_identity(dead)
        fails = 0
        try:
            for _ in range(MAX_LOOKS):
                await asyncio.sleep(VERIFY_AFTER)
                where = await self._retry_of(connection)
                if where is None:
                    continue  # scheduled, not started yet
                if where != identity:
                    return
                logger.info(
                    "stream %s: its retry went to paused worker %s; failing it again",
                    connection.stream,
                    dead.worker_id,
                )
                fails += 1
                if fails > MAX_FAILS or not await self._fail(handle, error, connection.stream):
                    return
        except RPCError as rpc:
            logger.warning("stream %s: could not follow its retry: %s", connection.stream, rpc)

    async def _retry_of(self, connection: HeldConnection) -> str | None:
        """The identity of the worker that runs the connection's attempt; None while it
        waits to start; ``""`` when it ended (or cannot be looked at)."""
        assert connection.workflow_id is not None
        handle = self.client.get_workflow_handle(connection.workflow_id, run_id=connection.run_id)
        try:
            description = await handle.describe(rpc_timeout=CALL_TIMEOUT)
        except RPCError:
            return ""
        for pending in description.raw_description.pending_activities:
            if pending.activity_id != connection.activity_id:
                continue
            if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                return pending.last_worker_identity
            if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
                return None
        return ""

    async def unregistered(
        self, dead: WorkerLease, registered: Collection[str]
    ) -> list[HeldConnection]:
        """The attempts ``dead`` started that no connection row names: those of the pool's
        running streams whose workflow id is not in ``registered`` (no connection a
        running worker registered) and whose pending activity ``dead`` runs, by its identity (a
        read not registered yet, or a short activity of the workflow)."""
        identity = worker_identity(dead)
        query = STREAMS_QUERY.format(queue=self.task_queue.replace("'", "''"))
        candidates = [
            execution
            async for execution in self.client.list_workflows(query, rpc_timeout=CALL_TIMEOUT)
            if execution.id not in registered
        ]
        gate = asyncio.Semaphore(DESCRIBES_AT_ONCE)

        async def started_by_dead(workflow_id: str, run_id: str) -> list[HeldConnection]:
            async with gate:
                handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
                try:
                    description = await handle.describe(rpc_timeout=CALL_TIMEOUT)
                except RPCError:
                    return []  # ended meanwhile
            return [
                HeldConnection(
                    stream=workflow_id.removeprefix(WORKFLOW_ID_PREFIX),
                    reader_id="",
                    workflow_id=workflow_id,
                    run_id=run_id,
                    activity_id=pending.activity_id,
                    attempt=pending.attempt,
                )
                for pending in description.raw_description.pending_activities
                if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                and pending.last_worker_identity == identity
            ]

        found = await asyncio.gather(
            *(started_by_dead(execution.id, execution.run_id) for execution in candidates)
        )
        return [attempt for attempts in found for attempt in attempts]

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
