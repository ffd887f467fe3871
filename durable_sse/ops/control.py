"""Client-side operations on streams: start, signal, query. Used by the CLI and the dev stack.

These only talk to Temporal; the worker does the work. Everything the plain Temporal
CLI can do with ``temporal workflow start/signal/query`` is available here too.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_sse.config.durations import format_duration
from durable_sse.config.replay import parse_replay_signal
from durable_sse.config.spec import StreamSpec, parse_spec
from durable_sse.config.temporal import TemporalTarget
from durable_sse.contracts import (
    MOVED_ERRORS,
    STREAM_STATE_ATTRIBUTE,
    StreamStatus,
    stream_workflow_id,
)
from durable_sse.errors import DurableSSEError
from durable_sse.ops import temporal_client
from durable_sse.ops.codec import data_converter_from_env
from durable_sse.ops.live import LiveStores, live_status
from durable_sse.ops.temporal_client import TemporalConnectionError
from durable_sse.ops.upgrade import VERSION_ATTRIBUTE

__all__ = ["TemporalConnectionError", "connect"]

STREAM_WORKFLOW = "StreamWorkflow"


class StreamNotFoundError(DurableSSEError):
    """No running workflow for this stream name."""


async def connect(target: TemporalTarget, *, timeout: float = 5.0) -> Client:
    """A client of ``target`` (see :mod:`durable_sse.ops.temporal_client`); a failure is a
    one-line :class:`TemporalConnectionError` naming the address and the namespace."""
    return await temporal_client.connect(
        target, data_converter=data_converter_from_env(), timeout=timeout
    )


STREAMS_QUERY = f'WorkflowType="{STREAM_WORKFLOW}"'
PARKED_QUERY = f'{STREAMS_QUERY} AND {STREAM_STATE_ATTRIBUTE}="parked"'


def web_ui_links(ui: str, namespace: str) -> dict[str, str]:
    """Web UI lists of the streams only, and of the parked ones only (URL-encoded queries;
    the second needs the ``SseStreamState`` search attribute registered)."""
    base = f"{ui.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows?query="
    return {
        "streams": base + quote(STREAMS_QUERY, safe=""),
        "parked streams": base + quote(PARKED_QUERY, safe=""),
    }


def static_summary(spec: StreamSpec) -> str:
    """What the Web UI shows for a stream: its name and host, never a path or a secret."""
    return f"SSE stream {spec.name} from {urlsplit(spec.url).hostname}"


async def start_stream(client: Client, spec: StreamSpec, *, task_queue: str) -> bool:
    """Start a stream's workflow; False when it is already running (left as it is)."""
    parse_spec(spec)
    try:
        await client.start_workflow(
            STREAM_WORKFLOW,
            spec,
            id=stream_workflow_id(spec.name),
            task_queue=task_queue,
            static_summary=static_summary(spec),
        )
    except WorkflowAlreadyStartedError:
        return False
    return True


async def signal_stream(client: Client, name: str, signal: str, arg: Any = None) -> None:
    handle = client.get_workflow_handle(stream_workflow_id(name))
    try:
        if arg is None:
            await handle.signal(signal)
        else:
            await handle.signal(signal, arg)
    except RPCError as error:
        raise _translate(error, name) from None


async def running_spec(client: Client, name: str) -> StreamSpec:
    """The spec the stream's current run was started with (its history's first event).

    Raises:
        StreamNotFoundError: no workflow for this stream.
        ConfigError: the running input is not a valid spec (the run is parked).
    """
    handle = client.get_workflow_handle(stream_workflow_id(name))
    value: object = None
    try:
        async for event in handle.fetch_history_events(page_size=1):
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            values = await client.data_converter.decode(payloads) if payloads else []
            value = values[0] if values else None
            break
    except RPCError as error:
        raise _translate(error, name) from None
    except (KeyError, ValueError) as error:
        if "encrypted" not in str(error) and "encoding" not in str(error):
            raise
        raise _needs_key(name) from None
    return parse_spec(value, source="running input")


async def restart_stream(
    client: Client, spec: StreamSpec, *, task_queue: str, timeout: float
) -> None:
    """Stop the stream gracefully, wait until its workflow has ended, start ``spec``.

    Nothing is started when the old run does not end within ``timeout`` seconds.
    """
    parse_spec(spec)
    handle = client.get_workflow_handle(stream_workflow_id(spec.name))
    await signal_stream(client, spec.name, "stop")
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except WorkflowFailureError:
        pass  # ended all the same (failed, terminated, timed out)
    except TimeoutError:
        raise DurableSSEError(
            f"stream {spec.name!r} did not stop within {timeout:g} s; nothing was started "
            "(see `durable-sse status`)"
        ) from None
    if not await start_stream(client, spec, task_queue=task_queue):
        raise DurableSSEError(f"stream {spec.name!r} was started again by someone else")


async def replay(
    client: Client, name: str, *, from_id: str | None = None, since: str | None = None
) -> None:
    """Send the ``replay`` signal; a bad ``from_id``/``since`` is refused before sending."""
    signal = parse_replay_signal({"from_id": from_id, "since": since}, stream=name)
    await signal_stream(client, name, "replay", signal)


async def stream_status(
    client: Client, name: str, *, live: LiveStores | None = None
) -> dict[str, Any]:
    """The workflow's ``status``, with the running connection's live progress and the
    store's gaps folded in when ``live`` reaches the deployment's stores
    (:mod:`durable_sse.ops.live`; ``progress_at`` and ``gaps_at`` say how old they are)."""
    handle = client.get_workflow_handle(stream_workflow_id(name))
    try:
        status = await handle.query("status", result_type=StreamStatus)
    except RPCError as error:
        raise _translate(error, name) from None
    except (KeyError, ValueError) as error:
        if "encrypted" not in str(error):
            raise
        raise _needs_key(name) from None
    if live is not None and isinstance(status, StreamStatus):
        status = await live_status(status, live)
    result = asdict(status) if not isinstance(status, dict) else status
    try:
        description: WorkflowExecutionDescription | None = await handle.describe()
    except RPCError:
        description = None
    result["connection_moved"] = moved_in(description)
    result["version"] = version_of(description)
    # The name its workflow id owns: a workflow whose input names another stream is
    # shown under its own name (parked, saying why), not as a second row of that stream.
    result["name"] = name
    return result


async def connection_moved(handle: WorkflowHandle[Any, Any]) -> dict[str, str] | None:
    """When and why the running connection last moved to another worker (its worker died,
    stopped or handed it over: its attempt was retried), from Temporal's view of the
    pending read attempt; None when it did not move (or Temporal cannot say)."""
    try:
        return moved_in(await handle.describe())
    except RPCError:
        return None


def version_of(description: WorkflowExecutionDescription | None) -> str | None:
    """The Worker Deployment Version the stream's run is pinned to, as Temporal writes it
    in ``TemporalWorkerDeploymentVersion`` (``deployment:build``); None: unversioned (or
    Temporal cannot say)."""
    if description is None:
        return None
    info = description.raw_description.workflow_execution_info
    version = info.versioning_info.deployment_version
    if version.deployment_name and version.build_id:
        return f"{version.deployment_name}:{version.build_id}"
    field = info.search_attributes.indexed_fields.get(VERSION_ATTRIBUTE)
    if field is not None and field.data:
        value = json.loads(field.data)
        return value if isinstance(value, str) and value else None
    return None


def moved_in(description: WorkflowExecutionDescription | None) -> dict[str, str] | None:
    """:func:`connection_moved` from a description already fetched."""
    if description is None:
        return None
    for pending in description.raw_description.pending_activities:
        failure = pending.last_failure
        if pending.activity_type.name != "read_stream" or pending.attempt <= 1:
            continue
        if failure.application_failure_info.type not in MOVED_ERRORS:
            continue
        at = pending.last_attempt_complete_time.ToDatetime(tzinfo=UTC)
        return {"at": at.isoformat(), "why": failure.message}
    return None


def moved_text(status: dict[str, Any], *, now: datetime | None = None) -> str:
    """``connection moved 12s ago: <why>``, or empty when it did not move."""
    moved = status.get("connection_moved")
    if not moved:
        return ""
    now = now or datetime.now(UTC)
    seconds = max((now - datetime.fromisoformat(moved["at"])).total_seconds(), 0.0)
    return f"connection moved {format_duration(round(seconds))} ago: {moved['why']}"


def current_counts(status: dict[str, Any]) -> tuple[str | None, int]:
    """(cursor, events persisted), the running connection's last report included."""
    return status.get("live_cursor"), status["counters"]["events_persisted"]


def age_text(status: dict[str, Any], *, now: datetime | None = None) -> str:
    """How old the cursor and counts shown are: the running connection's live progress
    (``progress_at``), else the last connection's end (``counted_at``); ``-``: neither."""
    stamp = status.get("progress_at") or status.get("counted_at")
    if not stamp:
        return "-"
    now = now or datetime.now(UTC)
    seconds = max((now - datetime.fromisoformat(stamp)).total_seconds(), 0.0)
    return format_duration(round(seconds)) if seconds >= 1 else "0s"


def lagging_text(status: dict[str, Any]) -> str:
    """The lagging id, and ``(resting)`` while its checkpoint schedule rests (caught up:
    no run until a newer event wakes it)."""
    lagging = status.get("lagging_id") or "-"
    return f"{lagging} (resting)" if status.get("checkpoint_resting_since") else lagging


def lag_text(status: dict[str, Any]) -> str:
    """The running connection's commit lag (its newest event's arrival to its commit)."""
    lag = status.get("commit_lag")
    return "-" if lag is None else f"{lag:.1f}s"


def open_gaps_text(status: dict[str, Any]) -> str:
    """Open gaps: how many, and after which id the oldest one's repair resumes.

    ``open_gaps`` lists them oldest first (at most 20); ``counters.gaps_open`` counts all.
    E.g. ``0``, ``2 (oldest after 3366, repair pending)``.
    """
    count = status["counters"]["gaps_open"]
    if not count:
        return "0"
    notes = []
    listed = status.get("open_gaps") or []
    if listed:
        resume = listed[0].get("resume_from")
        notes.append(f"oldest after {resume if resume is not None else '-'}")
    if status.get("repair_pending"):
        notes.append("repair pending")
    return f"{count} ({', '.join(notes)})" if notes else str(count)


def lost_text(counters: dict[str, Any]) -> str:
    """Events lost for good, in how many gaps, and how many of those nobody can size.

    E.g. ``0``, ``7 (2 gaps)``, ``7+ (3 gaps, 1 of unknown size)``: a gap of unknown
    size is not in the count, so the count is a floor (``+``).
    """
    gaps = counters["gaps_unrecoverable"]
    if not gaps:
        return "0"
    unknown = counters.get("gaps_unknown_size", 0)
    text = f"{counters['events_unrecoverable']}{'+' if unknown else ''} "
    text += f"({gaps} gap{'' if gaps == 1 else 's'}"
    if unknown:
        text += f", {unknown} of unknown size"
    return text + ")"


async def running_streams(client: Client) -> list[str]:
    names = []
    query = f"WorkflowType = '{STREAM_WORKFLOW}' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        names.append(execution.id.removeprefix("sse-stream:"))
    return sorted(names)


def _needs_key(name: str) -> DurableSSEError:
    return DurableSSEError(
        f"stream {name!r}: its payloads are encrypted; set DURABLE_SSE_PAYLOAD_KEY "
        "to the worker's key to read them"
    )


def _translate(error: RPCError, name: str) -> Exception:
    if error.status is RPCStatusCode.NOT_FOUND:
        return StreamNotFoundError(
            f"no running stream named {name!r} (workflow {stream_workflow_id(name)} not found)"
        )
    return error
