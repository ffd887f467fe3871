"""What a running stream costs in Temporal, per stream-hour, by kind.

``python -m bench.cost [--streams 10] [--minutes 12] [--replay-window 120]`` (also
``bench/run --only cost``): a dev server, the production worker (with its probe), ``N``
streams at 1 event/s and ``N`` idle ones (the source paused: keep-alives only). After a
warm-up (every stream connected, its checkpoint schedule made), the window is measured:

* from what the worker sends: activity heartbeats (the probe counts every one handed to
  the SDK's core, which sends it);
* from the histories, the events each stream's workflow gained in the window (signals it
  received, workflow tasks, timers, activity starts, search attribute upserts,
  continue-as-new) and the checkpoint runs its schedule started (each a schedule action,
  a workflow start, its activities and the signals it sent).

*Actions* counts what Temporal Cloud bills (heartbeats, signals, timers, activity starts,
schedule actions and workflow starts, upserts, continue-as-new); workflow tasks are shown
apart (load on the history service, not actions). Heartbeats are the worker's total split
evenly: busy and idle connections heartbeat alike. Checkpoint runs come every replay
window; the bench's window is short so that runs show in minutes, and the table also gives
them at the default window (10 minutes): the per-run cost times six an hour.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_PG_ADMIN, Row, print_table, stack, wait_until  # noqa: E402
from bench.temporal_stack import temporal  # noqa: E402
from durable_sse.config.spec import StreamSpec  # noqa: E402
from durable_sse.contracts import stream_workflow_id  # noqa: E402
from durable_sse.source import SourceStreamConfig, SSESource  # noqa: E402

ROTATION_AGE = 20.0
"""``max_connection_age`` of the streams that measure a connection's end."""
ROTATION_WINDOW = 120.0
MINUTES_HELP = "measured window; a multiple of the 4-minute heartbeat interval"
DEFAULT_WINDOW = 600.0
"""The default ``replay_window`` the figures are also given at."""
STREAM_KINDS = {
    "WorkflowExecutionSignaled": "signals received",
    "WorkflowTaskCompleted": "workflow tasks",
    "TimerStarted": "timers",
    "ActivityTaskScheduled": "activity starts",
    "UpsertWorkflowSearchAttributes": "search attribute upserts",
    "WorkflowExecutionContinuedAsNew": "continue-as-new",
    "MarkerRecorded": "markers",
}
ACTION_KINDS = (
    "heartbeats",
    "signals received",
    "timers",
    "activity starts",
    "search attribute upserts",
    "continue-as-new",
)


@dataclass
class Window:
    began: float
    ended: float

    @property
    def hours(self) -> float:
        return (self.ended - self.began) / 3600.0

    def holds(self, seconds: float) -> bool:
        return self.began <= seconds <= self.ended


def _event_kind(event: Any) -> str | None:
    name = event.WhichOneof("attributes")
    if name is None:
        return None
    for kind, label in STREAM_KINDS.items():
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in kind).lstrip("_")
        if name == f"{snake}_event_attributes":
            return label
    return None


async def _stream_events(client: Any, names: list[str], window: Window) -> Counter[str]:
    """Events of each kind the streams' workflows (every run) gained in the window."""
    found: Counter[str] = Counter()
    for name in names:
        async for execution in client.list_workflows(f'WorkflowId = "{stream_workflow_id(name)}"'):
            handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
            history = await handle.fetch_history()
            for event in history.events:
                if not window.holds(event.event_time.ToDatetime().timestamp()):
                    continue
                kind = _event_kind(event)
                if kind is not None:
                    found[kind] += 1
                if kind == "activity starts" and (
                    event.activity_task_scheduled_event_attributes.activity_type.name
                    == "read_stream"
                ):
                    found["connections"] += 1
    return found


async def _checkpoint_runs(client: Any, names: list[str], window: Window) -> Counter[str]:
    """Checkpoint runs the streams' schedules started in the window, and what each did."""
    found: Counter[str] = Counter()
    wanted = {f"sse-checkpoint:{name}" for name in names}
    async for execution in client.list_workflows('WorkflowType = "CheckpointAdvanceWorkflow"'):
        if not any(execution.id.startswith(prefix) for prefix in wanted):
            continue
        if not window.holds(execution.start_time.timestamp()):
            continue
        found["checkpoint runs"] += 1
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        for event in (await handle.fetch_history()).events:
            name = event.WhichOneof("attributes")
            if name == "activity_task_scheduled_event_attributes":
                found["checkpoint activities"] += 1
            elif name == "signal_external_workflow_execution_initiated_event_attributes":
                found["checkpoint signals sent"] += 1
            elif name == "workflow_task_completed_event_attributes":
                found["checkpoint workflow tasks"] += 1
    return found


async def _connection_cost(stack_t: Any, source: Any, streams: int, tag: str) -> dict[str, float]:
    """What one connection's end costs the history, by kind: ``streams`` streams whose
    connections end every ``ROTATION_AGE`` seconds, measured over ``ROTATION_WINDOW``
    (a stream at the defaults pays it once per ``max_connection_age``, an hour)."""
    names = [f"rotating-{tag}-{i}" for i in range(streams)]
    for name in names:
        source.add_stream(name, SourceStreamConfig(rate=1.0, retry_ms=None, keepalive=15.0))
        spec = StreamSpec(
            name=name,
            url=source.url(name),
            id_order="numeric",
            max_connection_age=ROTATION_AGE,
            replay_window=3600.0,  # no checkpoint run inside the window
        )
        await stack_t.start_stream(spec)
    await asyncio.sleep(ROTATION_AGE + 10)
    began = time.time()
    await asyncio.sleep(ROTATION_WINDOW)
    window = Window(began, time.time())
    await asyncio.sleep(3)
    kinds = await _stream_events(stack_t.client, names, window)
    for name in names:
        await stack_t.client.get_workflow_handle(stream_workflow_id(name)).signal("stop")
    connections = kinds.get("connections", 0)
    return {kind: count / max(connections, 1) for kind, count in kinds.items()}


def _per_hour(count: float, streams: int, window: Window) -> float:
    return count / max(streams, 1) / window.hours


async def cost_rows(
    stack_t: Any, *, streams: int, minutes: float, replay_window: float
) -> list[Row]:
    tag = uuid.uuid4().hex[:6]
    busy = [f"busy-{tag}-{i}" for i in range(streams)]
    idle = [f"idle-{tag}-{i}" for i in range(streams)]
    client = stack_t.client
    async with SSESource(
        {
            **{name: SourceStreamConfig(rate=1.0, retry_ms=None, keepalive=15.0) for name in busy},
            **{
                name: SourceStreamConfig(rate=1.0, retry_ms=None, keepalive=15.0, paused=True)
                for name in idle
            },
        }
    ) as source:
        for name in busy + idle:
            spec = StreamSpec(
                name=name, url=source.url(name), id_order="numeric", replay_window=replay_window
            )
            await stack_t.start_stream(spec)

        async def schedules_made() -> bool:
            made = 0
            async for _ in client.list_workflows('WorkflowType = "CheckpointAdvanceWorkflow"'):
                made += 1
                if made >= 2 * streams:
                    return True
            return False

        # Warm-up: every schedule made and run at least once (within one replay window).
        await wait_until(schedules_made, timeout=replay_window * 2 + 60, what="schedules")
        await asyncio.sleep(5)
        probe_before = stack_t.probe()
        began = time.time()
        await asyncio.sleep(minutes * 60)
        ended = time.time()
        probe_after = stack_t.probe()
        await asyncio.sleep(3)  # events of the window's end reach the histories
        window = Window(began, ended)
        heartbeats = probe_after.get("heartbeats", 0) - probe_before.get("heartbeats", 0)
        figures = {}
        for label, names in (("1 ev/s", busy), ("idle", idle)):
            kinds = await _stream_events(client, names, window)
            runs = await _checkpoint_runs(client, names, window)
            figures[label] = (kinds, runs)
        for name in busy + idle:
            await client.get_workflow_handle(stream_workflow_id(name)).signal("stop")
        per_connection = await _connection_cost(stack_t, source, streams, tag)
    rows: list[Row] = []
    scale = replay_window / DEFAULT_WINDOW
    for label, (kinds, runs) in figures.items():
        per = {
            kind: _per_hour(kinds.get(kind, 0), streams, window) for kind in STREAM_KINDS.values()
        }
        per["heartbeats"] = _per_hour(heartbeats, 2 * streams, window)
        run_rate = _per_hour(runs.get("checkpoint runs", 0), streams, window)
        run_actions = _per_hour(
            2 * runs.get("checkpoint runs", 0)  # the schedule's action and the workflow start
            + runs.get("checkpoint activities", 0)
            + runs.get("checkpoint signals sent", 0),
            streams,
            window,
        )
        stream_actions = sum(per[kind] for kind in ACTION_KINDS)
        prefix = f"{label} stream, per stream-hour"
        for kind in (*ACTION_KINDS, "workflow tasks", "markers"):
            rows.append(Row("9", f"{prefix}: {kind}", f"{per[kind]:.1f}"))
        rows.append(
            Row(
                "9",
                f"{prefix}: checkpoint runs / their actions (replay window {replay_window:g} s)",
                f"{run_rate:.1f} / {run_actions:.1f}",
            )
        )
        connection_actions = sum(per_connection.get(kind, 0.0) for kind in ACTION_KINDS)
        rows.append(
            Row(
                "9",
                f"{prefix}: a connection's end (every max_connection_age, 1 h): actions",
                f"{connection_actions:.1f}",
            )
        )
        total = stream_actions + run_actions
        at_default = stream_actions + run_actions * scale + connection_actions
        goal = "<= 60" if label == "1 ev/s" else "<= 20"
        met = at_default <= (60 if label == "1 ev/s" else 20)
        rows.append(
            Row(
                "9",
                f"{prefix}: actions, all kinds (measured / at a 10-minute replay window)",
                f"{total:.1f} / {at_default:.1f}",
                goal,
                "met" if met else "MISSED",
            )
        )
    return rows


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10, help="of each kind")
    parser.add_argument("--minutes", type=float, default=12.0, help=MINUTES_HELP)
    parser.add_argument("--replay-window", type=float, default=120.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--pg-admin", default=DEFAULT_PG_ADMIN)
    args = parser.parse_args(argv)
    import tempfile

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-cost-"))
    workdir.mkdir(parents=True, exist_ok=True)
    async with stack(workdir, pg_admin=args.pg_admin) as running:
        async with temporal(running, label="cost") as stack_t:
            rows = await cost_rows(
                stack_t,
                streams=args.streams,
                minutes=args.minutes,
                replay_window=args.replay_window,
            )
    print(
        f"what a stream costs in Temporal ({args.streams} busy + {args.streams} idle "
        f"streams, {args.minutes:g} min measured)"
    )
    print(print_table(rows))


if __name__ == "__main__":
    asyncio.run(main())
