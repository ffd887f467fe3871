"""The checkpoint schedule and CheckpointAdvanceWorkflow on a real Temporal dev server.

The time-skipping test server has no Schedules, so this module starts the local dev
server. The event log is the real one on PostgreSQL (unique stream names).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import (
    ScheduleActionExecutionStartWorkflow,
    ScheduleActionStartWorkflow,
    ScheduleHandle,
    ScheduleOverlapPolicy,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.activities.retention import RetentionActivities
from durable_sse.activities.schedule import ScheduleActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    AdvanceInput,
    AdvanceResult,
    ScheduleInput,
    SinceInput,
    StreamRef,
    checkpoint_schedule_id,
)
from durable_sse.cursor.rest import REST_NOTE, WAKE_NOTE
from durable_sse.gaps.model import GapChange, GapRecord
from durable_sse.ops.binaries import temporal_dev_server
from durable_sse.stores import Stores
from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from tests.conftest import open_stores
from tests.log.helpers import persist

POLL_LIMIT = 30.0
"""Safety bound on polling (a hang guard, not a timing assertion)."""


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_dev_server(), ui=False
    ) as environment:
        yield environment


@pytest.fixture(scope="module")
async def event_log(pg_url: str) -> AsyncIterator[Stores]:
    async with open_stores(pg_url) as log:
        yield log


async def record_gap(event_log: Stores, stream: str, gap: GapChange) -> None:
    """Commit a gap change alone (as the reader commits one with a batch)."""
    await event_log.writer.committed(
        event_log.writer.submit_batch(stream, "numeric", [], gap_changes=[gap])
    )


def opened(stream: str, gap_id: str, start: str, end: str) -> GapChange:
    seen = datetime.now(UTC).isoformat()
    gap = GapRecord(gap_id=gap_id, stream=stream, kind="comment", start_id=start, end_id=end)
    gap.seen_at = seen
    return GapChange(gap_id, opened=gap)


async def lagging_id(event_log: Stores, stream: str) -> str | None:
    checkpoint = await event_log.checkpoints.get_checkpoint(stream)
    return checkpoint.lagging_id if checkpoint else None


def checkpoint_worker(
    env: WorkflowEnvironment, log: Stores, queue: str, *, worker_retention: float | None = None
) -> Worker:
    """The checkpoint workflow and its activities, with one retention setting for both
    (as ``worker.build_worker`` gives them)."""
    return Worker(
        env.client,
        task_queue=queue,
        workflows=[CheckpointAdvanceWorkflow],
        activities=[
            *CheckpointActivities(log, worker_retention=worker_retention).activities(),
            *RetentionActivities(log, worker_retention=worker_retention).activities(),
            *ScheduleActivities(env.client, queue, log).activities(),
        ],
    )


async def run_scheduled(env: WorkflowEnvironment, handle: ScheduleHandle) -> AdvanceResult:
    """Trigger the schedule and return the result of a run it started after the trigger."""
    before = (await handle.describe()).info.num_actions
    await handle.trigger()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_LIMIT
    while (info := (await handle.describe()).info).num_actions <= before:
        if loop.time() > deadline:
            raise AssertionError("the schedule never started a run")
        await asyncio.sleep(0.1)
    started = info.recent_actions[-1].action
    assert isinstance(started, ScheduleActionExecutionStartWorkflow)
    run = env.client.get_workflow_handle(
        started.workflow_id, run_id=started.first_execution_run_id, result_type=AdvanceResult
    )
    return await run.result()


async def test_schedule_advances_and_an_open_gap_holds_it(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    name = f"ck-{uuid.uuid4().hex[:16]}"
    spec = StreamSpec(name=name, url="http://127.0.0.1:9/events", id_order="numeric")
    spec.replay_window = 2.0
    ref = StreamRef(name=name, id_order="numeric")
    queue = f"tq-{uuid.uuid4().hex}"
    checkpoints = CheckpointActivities(event_log)
    schedules = ScheduleActivities(env.client, queue)
    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    await persist(event_log, name, range(1, 4), long_ago)

    async with checkpoint_worker(env, event_log, queue):
        # Created, then updated in place (idempotent; the interval follows the window).
        spec.replay_window = 3.0
        await schedules.ensure_checkpoint_schedule(ScheduleInput(spec=spec))
        spec.replay_window = 2.0
        await schedules.ensure_checkpoint_schedule(ScheduleInput(spec=spec))
        handle = env.client.get_schedule_handle(checkpoint_schedule_id(name))
        description = await handle.describe()
        assert description.schedule.spec.intervals[0].every == timedelta(seconds=2)
        assert description.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
        action = description.schedule.action
        assert isinstance(action, ScheduleActionStartWorkflow)
        assert action.workflow == "CheckpointAdvanceWorkflow"
        assert action.task_queue == queue
        # Built from the spec: the stream's retention, and the flag that lets runs apply it.
        spec.retention = 3600.0
        (built,) = schedules.build_schedule(spec).action.args  # type: ignore[attr-defined]
        assert (built.retention, built.retention_declared) == (3600.0, True)
        spec.retention = None

        moved = await run_scheduled(env, handle)
        assert moved.lagging_id == "3" and not moved.held_by_gap
        assert await lagging_id(event_log, name) == "3"

        # An open gap after 3: newer events are old enough, yet the lagging id must not
        # pass the gap's start.
        await persist(event_log, name, range(4, 7), long_ago)
        await record_gap(event_log, name, opened(name, "g-" + name, "3", "5"))
        held = await env.client.execute_workflow(
            CheckpointAdvanceWorkflow.run,
            AdvanceInput(stream=ref, replay_window=2.0),
            id=checkpoint_schedule_id(name),  # a manual run, bound to its stream
            task_queue=queue,
            result_type=AdvanceResult,
        )
        assert held == AdvanceResult(
            lagging_id="3", moved=False, held_by_gap=True, cap_id="3", retention_applies=False
        )
        scheduled = await run_scheduled(env, handle)
        assert (scheduled.lagging_id, scheduled.held_by_gap) == ("3", True)
        assert await lagging_id(event_log, name) == "3"

        # A repair re-read up to 4: the lagging id may follow it, not further.
        await record_gap(event_log, name, GapChange("g-" + name, reread_to="4"))
        partial = await run_scheduled(env, handle)
        assert (partial.lagging_id, partial.held_by_gap, partial.cap_id) == ("4", True, "4")

        # Repaired: the gap closes and the lagging id moves on.
        await record_gap(event_log, name, GapChange("g-" + name, close=True))
        advanced = await run_scheduled(env, handle)
        assert (advanced.lagging_id, advanced.held_by_gap) == ("6", False)
        gaps = await checkpoints.stream_gaps(ref)
        assert gaps.gaps.totals.repaired == 1 and gaps.gaps.open == []

        await schedules.delete_checkpoint_schedule(ref)
        await schedules.delete_checkpoint_schedule(ref)  # missing is fine
        with pytest.raises(RPCError) as missing:
            await handle.describe()
        assert missing.value.status == RPCStatusCode.NOT_FOUND


async def test_resolve_since_and_get_checkpoint(event_log: Stores) -> None:
    name = f"ck-{uuid.uuid4().hex[:16]}"
    ref = StreamRef(name=name, id_order="numeric")
    checkpoints = CheckpointActivities(event_log)
    now = datetime.now(UTC)
    await persist(event_log, name, range(998, 1001), now - timedelta(hours=2))
    await persist(event_log, name, range(1001, 1004), now - timedelta(minutes=1))
    since = (now - timedelta(hours=1)).isoformat()
    assert await checkpoints.resolve_since(SinceInput(stream=ref, since=since)) == "1000"
    before = (now - timedelta(days=1)).isoformat()
    assert await checkpoints.resolve_since(SinceInput(stream=ref, since=before)) is None
    assert await checkpoints.get_checkpoint(ref) is None
    gaps = await checkpoints.stream_gaps(ref)
    assert gaps.lagging_id is None and gaps.gaps.open == []


async def test_a_checkpoint_run_applies_retention_without_its_stream_running(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """A run built with retention deletes behind the lagging id it just set, and returns
    what it did even when the stream's workflow is gone (its signal has nowhere to go)."""
    name = f"ck-{uuid.uuid4().hex[:16]}"
    ref = StreamRef(name=name, id_order="numeric")
    queue = f"tq-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    await persist(event_log, name, range(1, 11), now - timedelta(hours=3))
    await persist(event_log, name, range(11, 16), now - timedelta(minutes=30))
    await persist(event_log, name, range(16, 21), now)
    async with checkpoint_worker(env, event_log, queue, worker_retention=86400.0):
        result = await env.client.execute_workflow(
            CheckpointAdvanceWorkflow.run,
            AdvanceInput(
                stream=ref, replay_window=600.0, retention=3600.0, retention_declared=True
            ),
            id=checkpoint_schedule_id(name),
            task_queue=queue,
            result_type=AdvanceResult,
        )
        assert result.lagging_id == "15"
        report = result.retention
        assert report is not None and (report.retention, report.source) == (3600.0, "stream")
        assert (report.deleted_last_run, report.oldest_kept_id, report.keep_from) == (
            10,
            "11",
            "15",
        )
        # A schedule from before retention existed: the lagging id moves, nothing is deleted.
        await persist(event_log, name, range(21, 23), now - timedelta(minutes=20))
        legacy = await env.client.execute_workflow(
            CheckpointAdvanceWorkflow.run,
            AdvanceInput(stream=ref, replay_window=600.0),
            id=checkpoint_schedule_id(name),
            task_queue=queue,
            result_type=AdvanceResult,
        )
        assert legacy.retention is None
        assert (await event_log.prune.retention_state(name)).deleted_rows == 10


async def test_a_run_with_no_retention_anywhere_schedules_no_retention_step(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Issue 25: every activity is an action. A stream with no retention of its own on a
    worker with none has nothing to delete: its runs schedule ``advance_checkpoint`` alone;
    the worker's retention (known only where the activity runs) brings the step back."""
    name = f"ck-{uuid.uuid4().hex[:16]}"
    ref = StreamRef(name=name, id_order="numeric")
    await persist(event_log, name, range(1, 4), datetime.now(UTC) - timedelta(hours=1))
    scheduled: dict[float | None, list[str]] = {}
    for worker_retention in (None, 86400.0):
        queue = f"tq-{uuid.uuid4().hex}"
        async with checkpoint_worker(env, event_log, queue, worker_retention=worker_retention):
            handle = await env.client.start_workflow(
                CheckpointAdvanceWorkflow.run,
                AdvanceInput(stream=ref, replay_window=600.0, retention_declared=True),
                id=checkpoint_schedule_id(name),
                task_queue=queue,
                result_type=AdvanceResult,
            )
            result = await handle.result()
            assert result.retention_applies is (worker_retention is not None)
            history = await handle.fetch_history()
            scheduled[worker_retention] = [
                event.activity_task_scheduled_event_attributes.activity_type.name
                for event in history.events
                if event.HasField("activity_task_scheduled_event_attributes")
            ]
    # Caught up (its newest id is an hour old), the first run also rests its schedule.
    assert scheduled == {
        None: ["advance_checkpoint", "rest_checkpoint_schedule"],
        86400.0: ["advance_checkpoint", "apply_retention"],
    }


async def schedule_state(handle: ScheduleHandle) -> tuple[bool, str | None]:
    state = (await handle.describe()).schedule.state
    return state.paused, state.note


async def test_a_caught_up_stream_rests_its_schedule_until_a_newer_event_wakes_it(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Issue 25: an idle stream's runs are billed and move nothing. A run that leaves the
    lagging id at the newest id pauses its schedule; storing a newer event wakes it; an
    operator's pause is never lifted, nor taken over."""
    name = f"ck-{uuid.uuid4().hex[:16]}"
    spec = StreamSpec(name=name, url="http://127.0.0.1:9/events", id_order="numeric")
    ref = StreamRef(name=name, id_order="numeric")
    queue = f"tq-{uuid.uuid4().hex}"
    schedules = ScheduleActivities(env.client, queue, event_log)
    now = datetime.now(UTC)
    await persist(event_log, name, range(1, 4), now - timedelta(hours=1))
    await persist(event_log, name, range(4, 5), now)

    async def advance_at(moment: datetime) -> AdvanceResult:
        """A run as the schedule would start it at ``moment``."""
        return await env.client.execute_workflow(
            CheckpointAdvanceWorkflow.run,
            AdvanceInput(
                stream=ref, replay_window=600.0, retention_declared=True, now=moment.isoformat()
            ),
            id=checkpoint_schedule_id(name),
            task_queue=queue,
            result_type=AdvanceResult,
        )

    async with checkpoint_worker(env, event_log, queue):
        await schedules.ensure_checkpoint_schedule(ScheduleInput(spec=spec))
        handle = env.client.get_schedule_handle(checkpoint_schedule_id(name))

        # 4 is newer than a window: the lagging id stops at 3, the schedule keeps running.
        busy = await advance_at(now)
        assert (busy.lagging_id, busy.caught_up, busy.rested) == ("3", False, None)
        assert (await schedule_state(handle))[0] is False

        # A window later 4 is the lagging id and the newest id: the run rests its schedule.
        rested = await advance_at(now + timedelta(minutes=11))
        assert (rested.lagging_id, rested.caught_up, rested.rested) == ("4", True, True)
        assert await schedule_state(handle) == (True, REST_NOTE)
        checkpoint = await event_log.checkpoints.get_checkpoint(name)
        assert checkpoint is not None and checkpoint.resting_since is not None
        # Kept by an update of the schedule (a restarted stream workflow ensures it).
        await schedules.ensure_checkpoint_schedule(ScheduleInput(spec=spec))
        assert await schedule_state(handle) == (True, REST_NOTE)

        # A newer event: the connection that stores it wakes the schedule, once.
        await persist(event_log, name, range(5, 6), datetime.now(UTC))
        assert await schedules.wake(name) is True
        assert await schedule_state(handle) == (False, WAKE_NOTE)
        assert await event_log.checkpoints.resting(name) is None
        assert await schedules.wake(name) is False

        # An operator's pause: a caught-up run leaves it (and its note) alone, and a wake
        # does not lift it.
        await handle.pause(note="maintenance")
        theirs = await advance_at(datetime.now(UTC) + timedelta(minutes=11))
        assert (theirs.lagging_id, theirs.caught_up, theirs.rested) == ("5", True, False)
        assert await schedule_state(handle) == (True, "maintenance")
        assert await event_log.checkpoints.resting(name) is None
        assert await event_log.checkpoints.rest(name) is not None
        assert await schedules.wake(name) is False
        assert await schedule_state(handle) == (True, "maintenance")
        assert await event_log.checkpoints.resting(name) is None
        await schedules.delete_checkpoint_schedule(ref)


async def test_an_event_stored_while_the_schedule_pauses_wakes_it(
    env: WorkflowEnvironment, event_log: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a connection cannot see: it stores a newer event and reads the flag before
    the rest records it. The run looks again after pausing, and wakes its own schedule."""
    name = f"ck-{uuid.uuid4().hex[:16]}"
    spec = StreamSpec(name=name, url="http://127.0.0.1:9/events", id_order="numeric")
    queue = f"tq-{uuid.uuid4().hex}"
    schedules = ScheduleActivities(env.client, queue, event_log)
    await persist(event_log, name, range(1, 4), datetime.now(UTC) - timedelta(hours=1))
    advanced = await event_log.checkpoints.advance_lagging(
        name, "numeric", window=600.0, now=datetime.now(UTC)
    )
    assert (advanced.lagging_id, advanced.caught_up) == ("3", True)
    await schedules.ensure_checkpoint_schedule(ScheduleInput(spec=spec))
    handle = env.client.get_schedule_handle(checkpoint_schedule_id(name))
    look_again = event_log.checkpoints.still_resting

    async def an_event_arrives_first(stream: str, since: datetime) -> bool:
        await persist(event_log, name, range(4, 5), datetime.now(UTC))
        return await look_again(stream, since)

    monkeypatch.setattr(event_log.checkpoints, "still_resting", an_event_arrives_first)
    assert await schedules.rest(name) is False
    assert await schedule_state(handle) == (False, WAKE_NOTE)
    assert await event_log.checkpoints.resting(name) is None
    # Not caught up any more: a rest records nothing.
    assert await event_log.checkpoints.rest(name) is None
    assert await event_log.checkpoints.resting(name) is None
    await schedules.delete_checkpoint_schedule(StreamRef(name=name, id_order="numeric"))
