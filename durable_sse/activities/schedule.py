"""The per-stream Temporal Schedule that advances the lagging id.

``sse-checkpoint:<name>`` starts :class:`CheckpointAdvanceWorkflow` every replay window.
Creating it is idempotent (create, or update when it exists) so a restarted or
continued-as-new ``StreamWorkflow`` may ensure it any number of times.

A stream with nothing to advance lets its schedule rest (paused, with a note), and a
connection that stores a newer event wakes it: see :mod:`durable_sse.cursor.rest` for
the rules and why nothing is lost; here are the Temporal calls.

Only the stream's own workflow (``sse-stream:<name>``, see :mod:`durable_sse.ownership`)
may create, change or delete the schedule of ``<name>``, and a delete removes only a
schedule whose action is this stream's checkpoint run: a workflow that names another
stream changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from datetime import datetime, timedelta
from typing import TypeVar

from temporalio import activity
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleDescription,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import AdvanceInput, ScheduleInput, StreamRef, checkpoint_schedule_id
from durable_sse.cursor.checkpoint import CheckpointStore
from durable_sse.cursor.rest import REST_NOTE, WAKE_NOTE, paused_by_rest
from durable_sse.ownership import checkpoint_owner_error, schedule_caller_error
from durable_sse.stores import Stores
from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow

logger = logging.getLogger(__name__)

MIN_CATCHUP_WINDOW = timedelta(minutes=1)
T = TypeVar("T")


class ScheduleActivities:
    """Activities that manage checkpoint schedules through one shared client."""

    def __init__(self, client: Client, task_queue: str, stores: Stores | None = None) -> None:
        """``stores``: where a rest is recorded (None: schedules never rest)."""
        self._client = client
        self._task_queue = task_queue
        self._stores = stores

    def build_schedule(self, spec: StreamSpec) -> Schedule:
        """The schedule for ``spec``: every replay window, one advance at a time."""
        window = timedelta(seconds=spec.replay_window)
        schedule_id = checkpoint_schedule_id(spec.name)
        advance = AdvanceInput(
            stream=StreamRef(name=spec.name, id_order=spec.id_order),
            replay_window=spec.replay_window,
            retention=spec.retention,
            retention_declared=True,
        )
        return Schedule(
            action=ScheduleActionStartWorkflow(
                CheckpointAdvanceWorkflow.run,
                advance,
                id=schedule_id,
                task_queue=self._task_queue,
                execution_timeout=max(window, timedelta(minutes=5)),
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=window)]),
            policy=SchedulePolicy(
                overlap=ScheduleOverlapPolicy.SKIP,
                catchup_window=max(window, MIN_CATCHUP_WINDOW),
            ),
        )

    @activity.defn
    async def ensure_checkpoint_schedule(self, input: ScheduleInput) -> None:
        """Create the stream's schedule, or bring an existing one up to date."""
        _require_owner(input.spec.name)
        schedule_id = checkpoint_schedule_id(input.spec.name)
        schedule = self.build_schedule(input.spec)
        try:
            await self._client.create_schedule(schedule_id, schedule)
            logger.info("created checkpoint schedule %s", schedule_id)
            return
        except ScheduleAlreadyRunningError:
            pass

        def update(current: ScheduleUpdateInput) -> ScheduleUpdate:
            # Keep the schedule's pause state (an operator may have paused it).
            schedule.state = current.description.schedule.state
            return ScheduleUpdate(schedule=schedule)

        await self._client.get_schedule_handle(schedule_id).update(update)
        logger.info("updated checkpoint schedule %s", schedule_id)

    @activity.defn
    async def delete_checkpoint_schedule(self, input: StreamRef) -> None:
        """Delete the stream's schedule; a missing schedule is fine."""
        _require_owner(input.name)
        schedule_id = checkpoint_schedule_id(input.name)
        handle = self._client.get_schedule_handle(schedule_id)
        try:
            if not _is_checkpoint_schedule(await handle.describe(), schedule_id):
                logger.warning(
                    "schedule %s does not start this stream's checkpoint runs: left alone",
                    schedule_id,
                )
                return
            await handle.delete()
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
            logger.info("checkpoint schedule %s was already gone", schedule_id)
            return
        logger.info("deleted checkpoint schedule %s", schedule_id)

    # -- rest and wake (durable_sse.cursor.rest) ------------------------------------------

    @activity.defn
    async def rest_checkpoint_schedule(self, input: StreamRef) -> bool:
        """Pause the stream's schedule while it is caught up; whether it rests."""
        _require_checkpoint_run(input.name)
        return await self.rest(input.name)

    async def rest(self, stream: str) -> bool:
        """Record the rest, pause, then look again: an event stored meanwhile wakes the
        schedule here (a connection that read the flag before it was set would not)."""
        if self._stores is None:
            return False
        checkpoints = self._stores.checkpoints
        since = await checkpoints.rest(stream)
        if since is None:
            return False
        handle = self._client.get_schedule_handle(checkpoint_schedule_id(stream))
        if await _unless_gone(_pause(handle, checkpoints, stream, since)):
            logger.info("checkpoint schedule of %s rests: nothing to advance", stream)
            return True
        await checkpoints.woken(stream, since)
        return False

    async def wake(self, stream: str) -> bool:
        """Wake the stream's schedule if it rests (a connection stored a newer event);
        whether it did. The flag is cleared only once the schedule runs again (or is
        gone: the stream was stopped)."""
        if self._stores is None:
            return False
        checkpoints = self._stores.checkpoints
        since = await checkpoints.resting(stream)
        if since is None:
            return False
        handle = self._client.get_schedule_handle(checkpoint_schedule_id(stream))
        woke = bool(await _unless_gone(_unpause_rest(handle)))
        await checkpoints.woken(stream, since)
        if woke:
            logger.info("checkpoint schedule of %s woken: a newer event was stored", stream)
        return woke

    def activities(self) -> list:
        return [
            self.ensure_checkpoint_schedule,
            self.delete_checkpoint_schedule,
            self.rest_checkpoint_schedule,
        ]


async def _unless_gone(call: Awaitable[T]) -> T | None:
    """``call``'s result, or None when the schedule does not exist."""
    try:
        return await call
    except RPCError as error:
        if error.status != RPCStatusCode.NOT_FOUND:
            raise
        return None


async def _pause(
    handle: ScheduleHandle, checkpoints: CheckpointStore, stream: str, since: datetime
) -> bool:
    """Pause for the rest recorded at ``since``, then look again; whether it rests."""
    state = (await handle.describe()).schedule.state
    if state.paused and not paused_by_rest(state.paused, state.note):
        return False  # an operator's pause: theirs
    if not state.paused:
        await handle.pause(note=REST_NOTE)
    if await checkpoints.still_resting(stream, since):
        return True
    await _unpause_rest(handle)
    return False


async def _unpause_rest(handle: ScheduleHandle) -> bool:
    """Unpause a schedule paused by a rest (an operator's pause stays); whether it did."""
    state = (await handle.describe()).schedule.state
    if not paused_by_rest(state.paused, state.note):
        return False
    await handle.unpause(note=WAKE_NOTE)
    return True


def _require_owner(name: str) -> None:
    """Refuse a call from any workflow but stream ``name``'s own ``StreamWorkflow``.

    Python callers outside an activity (tools, tests) are not reachable through
    Temporal, so only activity calls are checked.
    """
    if not activity.in_activity():
        return
    info = activity.info()
    problem = schedule_caller_error(info.workflow_id, info.workflow_type, name)
    if problem is not None:
        raise ApplicationError(problem, type="ConfigError", non_retryable=True)


def _require_checkpoint_run(name: str) -> None:
    """Refuse a call from any workflow but a checkpoint run bound to stream ``name``."""
    if not activity.in_activity():
        return
    info = activity.info()
    problem = checkpoint_owner_error(info.workflow_id or "", name)
    if problem is None and info.workflow_type != CheckpointAdvanceWorkflow.__name__:
        problem = f"only a checkpoint run may rest stream {name!r}'s schedule"
    if problem is not None:
        raise ApplicationError(problem, type="ConfigError", non_retryable=True)


def _is_checkpoint_schedule(description: ScheduleDescription, schedule_id: str) -> bool:
    action = description.schedule.action
    return (
        isinstance(action, ScheduleActionStartWorkflow)
        and action.workflow == CheckpointAdvanceWorkflow.__name__
        and action.id == schedule_id
    )
