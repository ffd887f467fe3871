"""StreamWorkflow's status: unrecoverable gaps counted and exported, open gaps and
counters in the status, the Web UI's details. See helpers.py.
"""

from __future__ import annotations

from temporalio.client import WorkflowHandle
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import WorkflowEnvironment

from durable_sse.contracts import (
    Outcome,
    ReadResult,
    Route,
    StreamStatus,
)
from durable_sse.ops.metrics import WorkflowMetrics
from durable_sse.stores import Stores
from durable_sse.workflows.stream import StreamWorkflow
from tests.reader.helpers import metric_total
from tests.workflows.stream.helpers import (
    COMMENT,
    Step,
    counts,
    details_of,
    drop_signal,
    dropped,
    gaps,
    new_spec,
    read_until_cancelled,
    routes,
    run_stream,
    view,
    wait_for,
)


async def test_unrecoverable_gap_is_counted_and_exported_as_metrics(
    env: WorkflowEnvironment, event_log: Stores, metrics: MetricBuffer
) -> None:
    steps = [
        drop_signal("10", counts(10), gaps(view("g1", "2", end="11"))),
        # The history no longer reaches the gap: the store closed it, 7 events lost.
        dropped("15", counts(5), gaps(unrecoverable=1, events_unrecoverable=7), start="1"),
    ]
    run = await run_stream(env, event_log, steps)
    c = run.status.counters
    assert (c.gaps_unrecoverable, c.events_unrecoverable, c.gaps_open) == (1, 7, 0)
    assert [r for r, _ in routes(run)] == [Route.LIVE, Route.LAGGED, Route.LIVE]
    assert run.status.open_gaps == []
    updates = list(metrics.retrieve_updates())
    by_name = {
        name: sum(
            u.value
            for u in updates
            if u.metric.name == name and u.attributes.get("stream") == run.spec.name
        )
        for name in (
            "durable_sse_gaps_unrecoverable",
            "durable_sse_events_unrecoverable",
            "durable_sse_lagged_replays",
        )
    }
    assert by_name == {
        "durable_sse_gaps_unrecoverable": 1,
        "durable_sse_events_unrecoverable": 7,
        "durable_sse_lagged_replays": 1,
    }


def test_workflow_metrics_export_unrecoverable_gaps() -> None:
    """``gaps_unrecoverable`` is a metric of its own, so alerts can see it."""
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    recorded = WorkflowMetrics(runtime.metric_meter, "s1")
    recorded.gaps_unrecoverable.add(2)
    recorded.events_unrecoverable.add(9)
    updates = list(buffer.retrieve_updates())
    assert {(u.metric.name, u.attributes["stream"], u.value) for u in updates} == {
        ("durable_sse_gaps_unrecoverable", "s1", 2),
        ("durable_sse_events_unrecoverable", "s1", 9),
    }


async def test_status_shows_open_gaps_counters_and_details(
    env: WorkflowEnvironment, event_log: Stores, metrics: MetricBuffer
) -> None:
    seen: list[tuple[StreamStatus, str]] = []

    async def look_then_stop(handle: WorkflowHandle) -> None:
        status = await wait_for(handle, lambda s: s.route == "lagged" and s.state == "reading")
        seen.append((status, await details_of(handle)))
        await handle.signal(StreamWorkflow.pause)
        # Paused, and the cancelled connection's result folded in.
        status = await wait_for(
            handle, lambda s: s.state == "paused" and s.last_outcome == "cancelled"
        )
        seen.append((status, await details_of(handle)))
        await handle.signal(StreamWorkflow.stop)

    steps = [
        Step(
            result=ReadResult(
                Outcome.DROP_SIGNAL,
                last_cursor="10",
                counts=counts(10),
                drop=COMMENT,
                gaps=gaps(
                    view("g1", "5"),  # its end is not known yet
                    repaired=3,
                    unrecoverable=2,
                    events_unrecoverable=7,
                    unknown_size=1,
                    events_recovered=12,
                ),
            )
        ),
        read_until_cancelled(
            "8",
            counts(4, new=0),
            gaps(
                view("g1", "5", resume="8"),
                repaired=3,
                unrecoverable=3,
                events_unrecoverable=9,
                unknown_size=1,
                events_recovered=14,
            ),
            start="4",
        ),
    ]
    spec = new_spec()
    run = await run_stream(env, event_log, steps, spec=spec, during=look_then_stop)

    (repairing, repairing_details), (paused, paused_details) = seen
    # Repairing: the gap is open, its repair is running (not pending).
    assert [g.gap_id for g in repairing.open_gaps] == ["g1"]
    assert repairing.open_gaps[0].end_id is None and not repairing.repair_pending
    c = repairing.counters
    assert (c.gaps_open, c.gaps_repaired, c.gaps_unrecoverable) == (1, 3, 2)
    assert (c.events_unrecoverable, c.gaps_unknown_size, c.events_recovered) == (7, 1, 12)
    assert "route: lagged · live: `10` · lagging: `-`" in repairing_details
    assert "open gap after `5` before `-`" in repairing_details
    assert "repair resumes after `5`" in repairing_details
    assert "unrecoverable 2 (7 events, 1 of unknown size)" in repairing_details
    assert "None" not in repairing_details
    # Paused with the gap still open: the repair waits.
    assert paused.repair_pending and paused.open_gaps[0].resume_from == "8"
    c = paused.counters
    assert (c.gaps_unrecoverable, c.events_unrecoverable, c.events_recovered) == (3, 9, 14)
    assert "repair pending" in paused_details and "repair resumes after `8`" in paused_details
    assert "None" not in paused_details
    assert run.status.state == "stopped" and run.status.counters.gaps_open == 1
    assert metric_total(metrics, "durable_sse_gaps_unrecoverable", spec.name) == 3


async def test_details_render_none_as_a_dash_before_the_first_connection(
    env: WorkflowEnvironment, event_log: Stores
) -> None:
    seen: list[str] = []

    async def look_then_stop(handle: WorkflowHandle) -> None:
        await wait_for(handle, lambda s: s.state == "reading")
        seen.append(await details_of(handle))
        await handle.signal(StreamWorkflow.stop)

    run = await run_stream(env, event_log, [Step(hold=True)], during=look_then_stop)
    assert f"**{run.spec.name}**: reading" in seen[0]
    assert "route: live · live: `-` · lagging: `-`" in seen[0]
    assert "None" not in seen[0]
