"""StreamWorkflow's routes: the checkpoint schedule's first window, drop signals, repairs
(throttled, cut short, made good from the store) and replays. See helpers.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from durable_sse.config.replay import ReplaySignal
from durable_sse.contracts import (
    RECORDED_GAP,
    DropReport,
    Outcome,
    ReadInput,
    ReadResult,
    Route,
    StreamStatus,
)
from durable_sse.gaps.model import GapChange
from durable_sse.stores import Stores
from durable_sse.workflows.stream import StreamState, StreamWorkflow
from tests.log.helpers import commit, gap_opened, persist
from tests.workflows.stream.helpers import (
    COMMENT,
    Step,
    activity_types,
    counts,
    details_of,
    drop_signal,
    dropped,
    gaps,
    new_spec,
    read_until_cancelled,
    rotated,
    routes,
    run_stream,
    timers,
    view,
    wait_for,
)


async def write_gaps(event_log: Stores, stream: str, *changes: GapChange) -> None:
    """Commit gap changes alone, the way the reader commits them with a batch."""
    await commit(event_log, stream, [], *changes)


def opened(stream: str, gap_id: str, *, start: str, notice: str, end: str | None) -> GapChange:
    return gap_opened(
        stream,
        gap_id,
        start,
        end,
        contiguous=False,
        notice_id=notice,
        seen_at=datetime.now(UTC).isoformat(),
        detail="dropping events",
    )


async def activity_types_but_nudges(handle: WorkflowHandle) -> list[str]:
    return [name for name in await activity_types(handle) if name != "nudge_reader"]


async def test_stop_in_the_first_window_creates_no_schedule_and_nudges_the_reader(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    run = await run_stream(env, event_log, [])
    assert run.status.state == "stopped"
    assert run.status.counters.connections == 1
    # The schedule is due later in the first replay window (SCHEDULE_SPREAD): a stream
    # stopped before then never had one, and deletes none.
    assert run.schedules.ensured == [] and run.schedules.deleted == []
    assert routes(run) == [(Route.LIVE, None)]
    assert run.script.nudged == [run.spec.name]
    # A fresh stream reads its gaps from the store before its first connection.
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",  # once per run: may it set SseStreamState?
        "stream_gaps",
        "read_stream",
        # The stop cancels the reader, then nudges it to notice now. The stop's CANCELLED
        # result carried no gaps, but a stopping workflow reads no more: it ends.
        "nudge_reader",
    ]


async def test_a_stop_waits_for_its_nudge_before_the_run_completes(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """A nudge still running when the run's last task completes it could complete during
    that task, and the server would refuse the task (UnhandledCommand): the run waits for
    its nudges first, as before a continue-as-new."""
    run = await run_stream(env, event_log, [], nudge_seconds=1.0)
    events = list((await run.handle.fetch_history()).events)
    nudge = next(
        event.event_id
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == "nudge_reader"
    )
    assert any(
        event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and event.activity_task_completed_event_attributes.scheduled_event_id == nudge
        for event in events
    ), "the run completed while its nudge still ran"
    types = [event.event_type for event in events]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types
    assert types[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED


async def test_the_schedule_is_created_within_the_first_window_and_deleted_on_stop(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    spec = new_spec()
    # Back off for an hour: time skips past the schedule's due time meanwhile.
    steps = [Step(result=ReadResult(Outcome.RETRY_LATER, retry_after=3600.0))]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert run.schedules.ensured == [spec.name]
    assert run.schedules.deleted == [spec.name]
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",
        "stream_gaps",
        "read_stream",
        "stream_gaps",  # the result carried no gaps
        "ensure_checkpoint_schedule",  # due while the stream backed off
        "read_stream",
        "nudge_reader",
        "delete_checkpoint_schedule",
    ]
    spread = await timers(run.handle, schedule=True)
    assert len(spread) == 1 and 0 <= spread[0] < spec.replay_window


async def test_continue_as_new_before_the_schedule_is_due_hands_its_creation_on(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """A run that continues-as-new before its schedule is due cancels the creation's timer
    in its last task (nothing of the run may complete while that task does: the server
    would refuse it, UnhandledCommand), and the next run creates the schedule."""
    spec = new_spec()
    steps = [
        dropped("1", counts(1)),
        # --- continue-as-new (one connection per run); this run backs off for an hour,
        # past the schedule's due time, and creates it meanwhile
        Step(result=ReadResult(Outcome.RETRY_LATER, retry_after=3600.0)),
        # --- continue-as-new
    ]
    start = StreamState(max_connections_per_run=1)
    run = await run_stream(env, event_log, steps, spec=spec, state=start)
    assert run.schedules.ensured == [spec.name]
    assert run.schedules.deleted == [spec.name]
    first = env.client.get_workflow_handle(run.handle.id, run_id=run.handle.first_execution_run_id)
    events = [event.event_type for event in (await first.fetch_history()).events]
    assert len(await timers(first, schedule=True)) == 1
    assert EventType.EVENT_TYPE_TIMER_CANCELED in events
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in events
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW


async def test_spread_zero_creates_the_schedule_before_connecting(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    run = await run_stream(env, event_log, [], state=StreamState(schedule_spread=0.0))
    assert run.schedules.ensured == [run.spec.name]
    assert run.schedules.deleted == [run.spec.name]
    assert await activity_types(run.handle) == [
        "stream_state_attribute_registered",
        "ensure_checkpoint_schedule",
        "stream_gaps",
        "read_stream",
        "nudge_reader",
        "delete_checkpoint_schedule",
    ]


async def test_drop_signal_repairs_and_a_second_drop_inside_the_interval_is_throttled(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    observed: list[StreamStatus] = []
    details: list[str] = []

    async def look(_: ReadInput) -> None:
        handle = env.client.get_workflow_handle(f"sse-stream:{spec.name}")
        observed.append(await handle.query(StreamWorkflow.status))
        details.append(await details_of(handle))

    spec = new_spec()  # lagged_reconnect_interval = 60 s
    g1, g2 = view("g1", "4", end="11"), view("g2", "15", end="21")
    steps = [
        drop_signal("10", counts(10), gaps(g1)),
        # The repair: re-reads g1, which the store now shows repaired.
        dropped("12", counts(9, new=2), gaps(repaired=1), start="3", retry_ms=58_000),
        # 58 s after the repair started: a second drop signal, inside the interval.
        drop_signal("20", counts(8), gaps(g2, repaired=1)),
        # Live, until the interval allows the next lagged reconnect (~2 s real).
        read_until_cancelled("26", counts(6), gaps(g2, repaired=1), probe=look),
        dropped("30", counts(16, new=4), gaps(repaired=2), start="14"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert [r for r, _ in routes(run)] == [
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
        Route.LIVE,  # throttled: the drop signal came 58 s after the last lagged reconnect
        Route.LAGGED,
        Route.LIVE,
    ]
    assert [i.known_gaps for i in run.script.inputs] == [[], ["g1"], [], ["g2"], ["g2"], []]
    times = run.script.times
    assert times[4] - times[1] >= timedelta(seconds=60)  # at most one per interval
    # While throttled the status says a repair is pending, and which gap it is for.
    assert observed[0].repair_pending and observed[0].route == "live"
    assert [g.gap_id for g in observed[0].open_gaps] == ["g2"]
    assert observed[0].counters.gaps_open == 1 and observed[0].counters.gaps_repaired == 1
    assert "repair pending" in details[0] and "open gap after `15` before `21`" in details[0]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.explicit_replays) == (2, 2, 0)
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (0, 2, 0)
    assert not run.status.repair_pending and run.status.open_gaps == []
    assert run.status.live_cursor == "30"


async def test_a_repair_cut_short_resumes_at_once_and_the_gap_holds_the_checkpoint(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Real gap records: the lagging id stays at the open gap's resume point while the
    repair runs, a disconnect resumes the repair at once (no new lagged reconnect, no
    throttle), and the checkpoint moves on once the gap is closed."""
    spec = new_spec()
    name = spec.name
    now = datetime.now(UTC)
    await persist(event_log, name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, name, range(6, 8), now - timedelta(minutes=1))
    assert (
        await event_log.checkpoints.advance_lagging(name, "numeric", window=3600, now=now)
    ).lagging_id == "5"
    checkpoints: list[tuple[str | None, bool]] = []

    async def checkpoint() -> None:
        advance = await event_log.checkpoints.advance_lagging(
            name, "numeric", window=0, now=datetime.now(UTC)
        )
        checkpoints.append((advance.lagging_id, advance.held_by_gap))

    async def drop_notice(_: ReadInput) -> None:
        # Read 6, 7; the notice; then 11, 12: the gap lies after 5 and before 11.
        await write_gaps(event_log, name, opened(name, "g1", start="5", notice="7", end="11"))
        await persist(event_log, name, range(11, 13), datetime.now(UTC))

    async def repair_cut(_: ReadInput) -> None:
        await checkpoint()
        await persist(event_log, name, range(8, 9), datetime.now(UTC))
        await write_gaps(event_log, name, GapChange("g1", reread_to="8"))

    async def repair_done(_: ReadInput) -> None:
        await checkpoint()
        await persist(event_log, name, range(9, 11), datetime.now(UTC))
        await write_gaps(event_log, name, GapChange("g1", close=True))

    async def live_again(_: ReadInput) -> None:
        await checkpoint()

    steps = [
        Step(
            probe=drop_notice,
            store_gaps=True,
            result=ReadResult(
                Outcome.DROP_SIGNAL, last_cursor="12", counts=counts(4), drop=COMMENT
            ),
        ),
        dropped(
            "8",
            counts(4, new=1),
            start="4",
            error="connection reset",
            probe=repair_cut,
            store_gaps=True,
        ),
        rotated("12", counts(5, new=2), start="7", probe=repair_done, store_gaps=True),
        Step(probe=live_again, hold=True, signal="stop"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)

    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LAGGED, None),  # the cut repair resumes on the lagged route, at once
        (Route.LIVE, None),
    ]
    assert [i.known_gaps for i in run.script.inputs] == [[], ["g1"], ["g1"], []]
    assert checkpoints == [("5", True), ("8", True), ("12", False)]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays) == (1, 1)  # the resumed repair is not new
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (0, 1, 0)
    assert c.events_persisted == 7 and c.failures == 0
    assert run.status.open_gaps == [] and run.status.live_cursor == "12"
    assert run.status.last_error == "connection reset"  # the last error seen stays visible
    (record,) = await event_log.gap_store.gaps(name)
    assert (record.state, record.missing) == ("repaired", 0)


async def test_a_finished_repair_leaves_no_resume_behind(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """Only a repair cut short resumes outside the throttle. One that finished (the
    reader ends it once its gaps are closed) leaves nothing to resume: a gap found later
    (here recorded by an attempt that was then refused) is a new lagged reconnect."""
    spec = new_spec(lagged_reconnect_interval=0.01)  # never in the way: counts only
    name = spec.name

    async def suspect_then_refused(_: ReadInput) -> None:
        await write_gaps(event_log, name, opened(name, "g2", start="12", notice="14", end="15"))

    async def repair(_: ReadInput) -> None:
        await write_gaps(event_log, name, GapChange("g2", close=True))

    async def resume_when_parked(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "parked" and s.open_gaps)
        await handle.signal(StreamWorkflow.resume)

    refusal = ApplicationError("HTTP 403", type="StreamRefusedError", non_retryable=True)
    steps = [
        drop_signal("10", counts(10), gaps(view("g1", "3", end="11"))),
        # The repair closed g1 and ended by itself.
        rotated("12", counts(10, new=3), gaps(repaired=1), start="2"),
        Step(probe=suspect_then_refused, error=refusal),
        dropped("16", counts(5), start="11", probe=repair, store_gaps=True),
    ]
    run = await run_stream(env, event_log, steps, spec=spec, during=resume_when_parked)

    assert [r for r, _ in routes(run)] == [
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
        Route.LAGGED,
        Route.LIVE,
    ]
    assert run.script.inputs[3].known_gaps == ["g2"]
    assert run.status.counters.lagged_replays == 2  # g2's repair is a new lagged reconnect


async def test_a_result_lost_to_a_cancel_is_made_good_from_the_store(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """The reader recorded a gap, then its result was lost (the cancellation was
    re-raised): the workflow reads ``stream_gaps`` before planning, shows the gap, and
    repairs it on resume."""
    spec = new_spec()
    name = spec.name
    paused: list[StreamStatus] = []

    async def gap_then_lost(_: ReadInput) -> None:
        await write_gaps(event_log, name, opened(name, "g1", start="3", notice="9", end="12"))

    async def repair(_: ReadInput) -> None:
        await write_gaps(event_log, name, GapChange("g1", close=True))

    async def resume_when_paused(handle: WorkflowHandle) -> None:
        # Paused, once the lost result was made good: the gap the store holds is shown.
        paused.append(await wait_for(handle, lambda s: s.state == "paused" and s.open_gaps))
        await handle.signal(StreamWorkflow.resume)

    steps = [
        Step(hold=True, probe=gap_then_lost, signal="pause", reraise=True),
        dropped("12", counts(10, new=2), start="2", probe=repair, store_gaps=True),
    ]
    run = await run_stream(env, event_log, steps, spec=spec, during=resume_when_paused)

    status = paused[0]
    assert [g.gap_id for g in status.open_gaps] == ["g1"]
    assert (status.open_gaps[0].start_id, status.open_gaps[0].end_id) == ("3", "12")
    assert status.repair_pending and status.counters.gaps_open == 1
    assert status.last_outcome == "cancelled"
    assert routes(run) == [(Route.LIVE, None), (Route.LAGGED, None), (Route.LIVE, None)]
    assert run.script.inputs[1].known_gaps == ["g1"]
    types = await activity_types_but_nudges(run.handle)
    reads = [i for i, name in enumerate(types) if name == "read_stream"]
    assert types[reads[0] + 1] == "stream_gaps"  # read before the next connection is planned
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.gaps_repaired, c.gaps_open) == (0, 1, 1, 0)


async def test_a_recorded_gap_the_workflow_did_not_know_starts_the_repair(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """A live connection that finds an open gap not in ``known_gaps`` (its result was
    lost earlier) ends with a RECORDED drop: repaired, not counted as a new drop signal."""
    recorded = DropReport(kind=RECORDED_GAP, detail="open gap g7")
    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                start_cursor="40",
                last_cursor="40",
                drop=recorded,
                gaps=gaps(view("g7", "20", end="31")),
            )
        ),
        dropped("45", counts(25, new=10), gaps(repaired=1)),
    ]
    run = await run_stream(env, event_log, steps)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LAGGED, Route.LIVE]
    assert run.script.inputs[1].known_gaps == ["g7"]
    c = run.status.counters
    assert (c.drop_signals, c.lagged_replays, c.gaps_repaired) == (0, 1, 1)


async def test_an_explicit_replay_past_an_open_gap_yields_to_the_repair(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    """``replay(from_id)`` starting past an open gap does not re-read it, so it does not
    claim the repair: once the interval allows, the repair interrupts it, and the replay
    then resumes from its own progress."""
    spec = new_spec(lagged_reconnect_interval=1.0)
    g1 = view("g1", "3")
    steps = [
        drop_signal("10", counts(10), gaps(g1)),
        # The repair, interrupted by the replay signal.
        read_until_cancelled(
            "5",
            counts(3, new=0),
            gaps(view("g1", "3", resume="5")),
            start="2",
            signal="replay",
            signal_arg=ReplaySignal(from_id="8"),
        ),
        # The replay from 8, interrupted when the interval allows the repair.
        read_until_cancelled("9", counts(1, new=0), gaps(view("g1", "3", resume="5")), start="8"),
        dropped("10", counts(6, new=2), gaps(repaired=1), start="4"),
        rotated("11", counts(2, new=1), gaps(repaired=1), start="9"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "8"),
        (Route.LAGGED, None),
        (Route.EXPLICIT, "9"),  # the replay resumes from its progress, up to its target
        (Route.LIVE, None),
    ]
    c = run.status.counters
    assert (c.explicit_replays, c.lagged_replays, c.gaps_repaired) == (1, 2, 1)
    assert run.status.live_cursor == "11" and run.status.open_gaps == []


async def test_replay_signal_variants(env: WorkflowEnvironment, event_log: Stores) -> None:
    spec = new_spec()
    now = datetime.now(UTC)
    await persist(event_log, spec.name, range(1, 6), now - timedelta(hours=2))
    await persist(event_log, spec.name, range(6, 11), now - timedelta(minutes=10))
    since = (now - timedelta(hours=1)).isoformat()
    read_ten = ReadResult(Outcome.CANCELLED, last_cursor="10", counts=counts(10), gaps=gaps())

    steps = [
        # replay with no arguments: the lagged route, up to the live cursor
        Step(hold=True, signal="replay", cancelled=read_ten),
        dropped("10", counts(7, new=0), gaps(), start="3"),
        # from_id, with a reader that re-raises the cancellation (ActivityError path)
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(from_id="4"), reraise=True),
        dropped("7", counts(3, new=0), start="4"),
        rotated("10", counts(3, new=0), start="7"),
        # since: resolved to the newest id persisted at or before it
        Step(hold=True, signal="replay", signal_arg=ReplaySignal(since=since)),
        dropped("10", counts(5, new=0), start="5"),
    ]
    run = await run_stream(env, event_log, steps, spec=spec)
    assert routes(run) == [
        (Route.LIVE, None),
        (Route.LAGGED, None),
        (Route.LIVE, None),
        (Route.EXPLICIT, "4"),
        (Route.EXPLICIT, "7"),  # a replay cut short resumes from its progress
        (Route.LIVE, None),
        (Route.EXPLICIT, "5"),
        (Route.LIVE, None),
    ]
    c = run.status.counters
    assert (c.lagged_replays, c.explicit_replays, c.drop_signals) == (1, 2, 0)
    assert run.status.open_gaps == [] and run.status.live_cursor == "10"
