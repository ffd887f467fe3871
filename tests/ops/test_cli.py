"""The command line against a real Temporal dev server: refusals change nothing.

Each bad input is refused with one line on stderr and its exit code, and the server
shows that nothing happened: no workflow started, no schedule created, no signal in a
stream's history. ``start`` on a running stream with other settings lists them and
applies them only with ``--restart``. The CLI runs as a user runs it (a subprocess).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from durable_sse.activities.attributes import SearchAttributeActivities
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import (
    CheckpointState,
    Outcome,
    ReadInput,
    ReadResult,
    ScheduleInput,
    StreamRef,
    checkpoint_schedule_id,
    stream_workflow_id,
)
from durable_sse.ops import control
from durable_sse.ops.cli.parser import ENVIRONMENT, EXIT_ERROR, EXIT_USAGE
from durable_sse.ops.cli.tables import format_status_table
from durable_sse.ops.dev import summary_line
from durable_sse.workflows.stream import StreamWorkflow

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "DURABLE_SSE_PAYLOAD_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "durable_sse.ops.cli", *args],
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a refusal with ``code`` (and nothing on stdout)."""
    assert done.returncode == code, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("durable-sse: ")
    return lines[0]


async def workflow_absent(client: Client, name: str) -> bool:
    try:
        await client.get_workflow_handle(stream_workflow_id(name)).describe()
    except RPCError as error:
        return error.status == RPCStatusCode.NOT_FOUND
    return False


async def schedule_absent(client: Client, name: str) -> bool:
    try:
        await client.get_schedule_handle(checkpoint_schedule_id(name)).describe()
    except RPCError as error:
        return error.status == RPCStatusCode.NOT_FOUND
    return False


async def signals_in_history(client: Client, name: str) -> int:
    handle = client.get_workflow_handle(stream_workflow_id(name))
    history = await handle.fetch_history()
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    )


# --- no server needed ------------------------------------------------------------------


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip().startswith("durable-sse ") and done.stdout.strip() != "durable-sse"


@pytest.mark.parametrize(
    ("command", "variables"),
    [
        ("worker", list(ENVIRONMENT)),
        ("start", ["TEMPORAL_ADDRESS", "SSE_TASK_QUEUE", "SSE_ALLOWED_HOSTS"]),
        ("status", ["TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "DURABLE_SSE_PAYLOAD_KEY"]),
        ("replay", ["TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "DURABLE_SSE_PAYLOAD_KEY"]),
        ("pause", ["TEMPORAL_ADDRESS"]),
        ("resume", ["TEMPORAL_ADDRESS"]),
        ("stop", ["TEMPORAL_ADDRESS"]),
        ("dev", ["TEMPORAL_ADDRESS", "REDIS_URL", "DATABASE_URL"]),
        ("codec-server", ["DURABLE_SSE_PAYLOAD_KEY", "DURABLE_SSE_CODEC_TOKEN"]),
    ],
)
def test_each_command_help_lists_the_environment_it_reads(
    command: str, variables: list[str]
) -> None:
    done = cli(command, "--help")
    assert done.returncode == 0, done.stderr
    for variable in variables:
        assert variable in done.stdout, (command, variable)


def test_help_explains_replay_positions_and_dev_ports() -> None:
    replay = " ".join(cli("replay", "--help").stdout.split())
    assert "--from-id ID" in replay and "must not be empty" in replay
    assert "ISO 8601 with Z or an offset" in replay and "No time zone is assumed" in replay
    dev = cli("dev", "--help").stdout
    for port in ("7233", "8233", "8765", "6390"):
        assert port in dev


def status_row(name: str, **changes: Any) -> dict[str, Any]:
    """A ``status`` answer as ``control.stream_status`` returns it (a dict)."""
    counters = {
        "events_persisted": 3277,
        "drop_signals": 4,
        "events_recovered": 100,
        "gaps_open": 0,
        "gaps_unrecoverable": 0,
        "events_unrecoverable": 0,
        "gaps_unknown_size": 0,
    }
    counters.update(changes.pop("counters", {}))
    status: dict[str, Any] = {
        "name": name,
        "state": "reading",
        "route": "live",
        "live_cursor": "3305",
        "lagging_id": None,
        "open_gaps": [],
        "repair_pending": False,
        "last_error": None,
        "progress_at": None,
        "commit_lag": None,
        "counters": counters,
    }
    status.update(changes)
    return status


REFUSAL = (
    "StreamRefusedError: HTTP 401 from https://example.org/events: the server refused "
    "the credentials the worker sent for this host; check SSE_SECRETS and the token's scope"
)


def test_status_shows_open_gaps_and_what_is_lost() -> None:
    gap = {"gap_id": "g1", "resume_from": "3366", "start_id": "3366", "end_id": None}
    assert control.open_gaps_text(status_row("s")) == "0"
    assert (
        control.open_gaps_text(
            status_row("s", open_gaps=[gap], repair_pending=True, counters={"gaps_open": 2})
        )
        == "2 (oldest after 3366, repair pending)"
    )
    assert control.open_gaps_text(status_row("s", open_gaps=[gap], counters={"gaps_open": 1})) == (
        "1 (oldest after 3366)"
    )
    lost = status_row("s")["counters"]
    assert control.lost_text(lost) == "0"
    assert control.lost_text({**lost, "gaps_unrecoverable": 2, "events_unrecoverable": 7}) == (
        "7 (2 gaps)"
    )
    unknown = {**lost, "gaps_unrecoverable": 1, "gaps_unknown_size": 1}
    assert control.lost_text(unknown) == "0+ (1 gap, 1 of unknown size)"


def test_status_table_never_cuts_the_reason_a_stream_is_parked() -> None:
    parked = status_row(
        "noisy",
        state="parked",
        last_error=REFUSAL,
        open_gaps=[{"resume_from": "3366"}],
        repair_pending=True,
        counters={"gaps_open": 1, "gaps_unrecoverable": 3, "events_unrecoverable": 7},
        retention={
            "retention": 7 * 86400.0,
            "deleted_rows": 1204,
            "oldest_kept_at": "2026-12-01T10:00:00.250000+00:00",
        },
    )
    statuses = [parked, status_row("ticks")]
    for width in (80, 120, 400, None):  # None: --wide
        table = format_status_table(statuses, width=width)
        header, *lines = table.splitlines()
        assert header.split() == [
            "stream", "state", "version", "route", "cursor", "lagging", "id", "persisted",
            "lag",
            "as", "of", "drops",
            "open", "gaps", "recovered", "lost", "retention", "credentials", "last",
            "error",
        ]  # fmt: skip
        assert "7d: 1204 deleted, oldest kept 2026-12-01T10:00:00Z" in lines[0]
        assert " ".join(table.split()).count(REFUSAL) == 1, table  # whole, wrapped or not
        assert "1 (oldest after 3366, repair pending)" in lines[0]
        assert "7 (3 gaps)" in lines[0]
        if width is None or width >= 400:
            assert len(lines) == 2 and lines[0].endswith(REFUSAL)  # one line per stream
        else:
            assert all(len(line) <= width for line in lines if "last error" in line)
            assert lines[1].startswith("    last error: StreamRefusedError")
    assert format_status_table([]) == "no streams running"


def test_dev_summary_line_shows_gaps_and_losses() -> None:
    parked = status_row(
        "noisy",
        open_gaps=[{"resume_from": "3366"}],
        counters={"gaps_open": 1, "gaps_unrecoverable": 2, "gaps_unknown_size": 1},
    )
    line = summary_line([parked, status_row("ticks")])
    assert "noisy: reading cursor=3305 persisted=3277 drops=4" in line
    assert "gaps=1 (oldest after 3366) recovered=100 lost=0+ (2 gaps, 1 of unknown size)" in line
    assert "ticks: reading" in line and "gaps=0 recovered=100 lost=0" in line


# --- refusals change nothing -----------------------------------------------------------


def stream_file(tmp_path: Path, name: str, extra: str) -> Path:
    path = tmp_path / "streams.toml"
    path.write_text(f'[[stream]]\nname = "{name}"\nurl = "http://127.0.0.1:9/events"\n{extra}\n')
    return path


BAD_FILES = [
    ('headers_from_env = "TOKEN"', "setting 'headers_from_env' = 'TOKEN': expected a table"),
    ('drop_notice = "dropping"', "setting 'drop_notice' = 'dropping': expected a list"),
    ('mercure_last_event_id = "no"', "'mercure_last_event_id' = 'no': expected true or false"),
    (
        'replay_window = "99999999999d"',
        "setting 'replay_window' = '99999999999d': expected a duration between 1s and 30d",
    ),
    ("replay_window = inf", "setting 'replay_window' = inf: expected a duration"),
    ("replay_window = -5", "setting 'replay_window' = -5: expected a duration"),
    ('headers_from_env = { X = "DATABASE_URL" }', "'headers_from_env.X' = 'DATABASE_URL'"),
    ('drop_notice = ["(?<=x)dropped"]', "'drop_notice[0]' = '(?<=x)dropped': expected an RE2"),
    ("batch_max_events = 0", "'batch_max_events' = 0: expected an integer between 1 and"),
    ("replay_windw = 5", "'replay_windw' = 5: not a stream setting; did you mean"),
]


@pytest.mark.parametrize(("extra", "fragment"), BAD_FILES)
async def test_start_refuses_a_bad_setting_and_starts_nothing(
    temporal: WorkflowEnvironment, address: str, tmp_path: Path, extra: str, fragment: str
) -> None:
    name = "bad-" + uuid.uuid4().hex[:8]
    path = stream_file(tmp_path, name, extra)
    done = await asyncio.to_thread(
        cli, "start", "--config", str(path), env={"TEMPORAL_ADDRESS": address}
    )
    line = one_line(done, EXIT_USAGE)
    assert f"stream '{name}': " in line and fragment in line, line
    assert done.stdout == ""
    assert await workflow_absent(temporal.client, name)
    assert await schedule_absent(temporal.client, name)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no streams declared in {path}"),
        ("# streams come later\n", "no streams declared in {path}"),
        ('[[stream]]\nurl = "http://127.0.0.1:9/"\n', "setting 'name' is missing"),
    ],
)
async def test_start_refuses_a_file_without_streams(
    temporal: WorkflowEnvironment, address: str, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "streams.toml"
    path.write_text(text)
    before = [w.id async for w in temporal.client.list_workflows()]
    done = await asyncio.to_thread(
        cli, "start", "--config", str(path), env={"TEMPORAL_ADDRESS": address}
    )
    assert message.format(path=path) in one_line(done, EXIT_USAGE)
    assert [w.id async for w in temporal.client.list_workflows()] == before


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--from-id", ""], "replay 'from_id' = '': expected a non-empty event id"),
        (["--since", "yesterday"], "replay 'since' = 'yesterday': expected an ISO 8601 time"),
        (["--since", "2026-05-01T12:00:00"], "no time zone is assumed"),
        (["--from-id", "a\nb"], "expected an event id without line breaks"),
    ],
)
async def test_replay_refuses_a_bad_position_and_sends_nothing(
    temporal: WorkflowEnvironment, address: str, flags: list[str], fragment: str
) -> None:
    name = "rp-" + uuid.uuid4().hex[:8]
    # A stream workflow that no worker runs: its history shows every signal it is sent.
    await control.start_stream(
        temporal.client, StreamSpec(name=name, url="http://127.0.0.1:9/"), task_queue="idle"
    )
    try:
        done = await asyncio.to_thread(
            cli, "replay", name, *flags, env={"TEMPORAL_ADDRESS": address}
        )
        line = one_line(done, EXIT_USAGE)
        assert line.startswith(f"durable-sse: stream '{name}': ") and fragment in line, line
        assert await signals_in_history(temporal.client, name) == 0

        good = await asyncio.to_thread(
            cli,
            "replay",
            name,
            "--since",
            "2026-05-01T14:00:00+02:00",
            env={"TEMPORAL_ADDRESS": address},
        )
        assert good.returncode == 0 and f"{name}: replay sent" in good.stdout, good.stderr
        assert await signals_in_history(temporal.client, name) == 1
    finally:
        await temporal.client.get_workflow_handle(stream_workflow_id(name)).terminate()


# --- start on a running stream with other settings -------------------------------------


@activity.defn(name="read_stream")
async def read_until_cancelled(input: ReadInput) -> ReadResult:
    try:
        while True:
            activity.heartbeat()
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        return ReadResult(outcome=Outcome.CANCELLED)


@activity.defn(name="ensure_checkpoint_schedule")
async def ensure_schedule(input: ScheduleInput) -> None:
    """Stand-in: the schedule's own behaviour is tested in test_checkpoint_workflow."""


@activity.defn(name="delete_checkpoint_schedule")
async def delete_schedule(input: StreamRef) -> None:
    """Stand-in, as above."""


@activity.defn(name="get_checkpoint")
async def no_checkpoint(input: StreamRef) -> CheckpointState | None:
    return None


@pytest.fixture
async def stream_worker(temporal: WorkflowEnvironment) -> AsyncIterator[str]:
    queue = "cli-" + uuid.uuid4().hex[:8]
    async with Worker(
        temporal.client,
        task_queue=queue,
        workflows=[StreamWorkflow],
        activities=[
            read_until_cancelled,
            ensure_schedule,
            delete_schedule,
            no_checkpoint,
            *SearchAttributeActivities(temporal.client).activities(),
        ],
        max_heartbeat_throttle_interval=timedelta(milliseconds=100),
        default_heartbeat_throttle_interval=timedelta(milliseconds=100),
    ):
        yield queue


async def test_start_lists_changed_settings_and_applies_them_only_with_restart(
    temporal: WorkflowEnvironment, address: str, stream_worker: str, tmp_path: Path
) -> None:
    name = "chg-" + uuid.uuid4().hex[:8]
    env = {"TEMPORAL_ADDRESS": address, "SSE_TASK_QUEUE": stream_worker}
    path = stream_file(tmp_path, name, 'replay_window = "2m"')
    started = await asyncio.to_thread(cli, "start", "--config", str(path), env=env)
    assert started.returncode == 0 and f"{name}: started" in started.stdout, started.stderr
    handle = temporal.client.get_workflow_handle(stream_workflow_id(name))
    first_run = (await handle.describe()).run_id

    same = await asyncio.to_thread(cli, "start", "--config", str(path), env=env)
    assert same.returncode == 0 and f"{name}: already running (same settings)" in same.stdout

    path = stream_file(
        tmp_path,
        name,
        'replay_window = "5m"\nid_order = "numeric"\n'
        'headers_from_env = { Authorization = "API_TOKEN" }',
    )
    differs = await asyncio.to_thread(cli, "start", "--config", str(path), env=env)
    line = one_line(differs, EXIT_ERROR)
    assert (
        f"stream '{name}' is running with other settings: id_order 'natural' → 'numeric', "
        "replay_window 2m → 5m, headers_from_env {} → {'Authorization': 'API_TOKEN'}; "
        f"`durable-sse start --restart {name}` applies them"
    ) in line, line
    description = await handle.describe()
    assert description.run_id == first_run and description.status == WorkflowExecutionStatus.RUNNING
    assert await signals_in_history(temporal.client, name) == 0  # not even asked to stop
    assert (await control.running_spec(temporal.client, name)).replay_window == 120.0

    restarted = await asyncio.to_thread(cli, "start", "--config", str(path), "--restart", env=env)
    assert restarted.returncode == 0, restarted.stderr
    assert f"{name}: restarted: id_order 'natural' → 'numeric'" in restarted.stdout
    old = temporal.client.get_workflow_handle(stream_workflow_id(name), run_id=first_run)
    assert (await old.describe()).status == WorkflowExecutionStatus.COMPLETED
    new = await handle.describe()
    assert new.run_id != first_run and new.status == WorkflowExecutionStatus.RUNNING
    running = await control.running_spec(temporal.client, name)
    assert (running.replay_window, running.id_order) == (300.0, "numeric")
    assert running.headers_from_env == {"Authorization": "API_TOKEN"}

    await handle.signal("stop")
    await handle.result()
