"""Inputs and results that cross the workflow/activity boundary.

Everything here is a plain dataclass of JSON-friendly values: it is stored in Temporal
history and shown in the Web UI, so it carries cursors and counts, never event data
and never secrets. New fields always get defaults so old histories still decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from durable_sse.spec import StreamSpec

WORKFLOW_ID_PREFIX = "sse-stream:"
SCHEDULE_ID_PREFIX = "sse-checkpoint:"


def stream_workflow_id(name: str) -> str:
    return f"{WORKFLOW_ID_PREFIX}{name}"


def checkpoint_schedule_id(name: str) -> str:
    return f"{SCHEDULE_ID_PREFIX}{name}"


class Route(StrEnum):
    """Where a connection resumes from."""

    LIVE = "live"
    """Newest persisted id (L1 -> L2 -> lagging id -> floor -> none)."""
    LAGGED = "lagged"
    """The lagging id, so the replay window re-delivers a hole (falls back to live)."""
    EXPLICIT = "explicit"
    """``ReadInput.start_id`` exactly (replay ``from_id``/``since``, resuming a replay)."""


class Outcome(StrEnum):
    """Why a connection ended. Only non-retryable refusals are raised instead."""

    DROPPED = "dropped"
    """Network error, idle timeout, or a clean end of body: nothing was skipped."""
    DROP_SIGNAL = "drop_signal"
    """The server announced (or the ids show) that events were skipped."""
    NO_CONTENT = "no_content"
    """HTTP 204: the server asks us to stop until resumed."""
    ROTATED = "rotated"
    """``max_connection_age`` reached; reconnect live."""
    CANCELLED = "cancelled"
    """The workflow cancelled the connection (replay/pause/stop); the batch was flushed."""
    RETRY_LATER = "retry_later"
    """429/5xx or a network error before the stream opened; ``retry_after`` says when."""


class DropKind(StrEnum):
    COMMENT = "comment"
    EVENT_TYPE = "event_type"
    MERCURE_HEADER = "mercure_header"
    ID_GAP = "id_gap"


@dataclass
class ReadInput:
    spec: StreamSpec
    route: Route = Route.LIVE
    start_id: str | None = None
    """Cursor to send when ``route`` is EXPLICIT."""
    fence_id: str | None = None
    """Set while a gap is being repaired: the reader reports when it persists past it."""
    connection: int = 0
    """Connection number within the workflow, for logs."""


@dataclass
class ReadProgress:
    """Heartbeat details: the newest committed cursor of this attempt, plus counts."""

    cursor: str | None = None
    events_read: int = 0
    new_rows: int = 0
    duplicates: int = 0


@dataclass
class ReadResult:
    outcome: Outcome
    start_cursor: str | None = None
    """The cursor this connection sent (None = live only)."""
    last_cursor: str | None = None
    """Newest persisted id at the end (the start cursor when nothing new came)."""
    first_id: str | None = None
    """First id read on this connection."""
    events_read: int = 0
    new_rows: int = 0
    duplicates: int = 0
    retry_ms: int | None = None
    """The server's last ``retry:`` value, if it sent one."""
    retry_after: float | None = None
    """Seconds to wait before reconnecting (Retry-After, capped), RETRY_LATER only."""
    status_code: int | None = None
    drop_kind: DropKind | None = None
    drop_detail: str | None = None
    """Short, sanitised description of the drop signal (never event data)."""
    drop_position: str | None = None
    """Newest persisted id when the drop signal arrived: the gap fence."""
    dropped_estimate: int | None = None
    """Number of skipped events when the signal says (``discarded 37 events``) or the id
    gap shows it; None when unknown."""
    passed_fence: bool = False
    """This connection persisted an id at or past ``ReadInput.fence_id``."""
    recovered_rows: int = 0
    """New rows whose ids are at or before ``ReadInput.fence_id``: events a replay recovered
    (batches are split at the fence so this is exact)."""
    history_truncated: bool = False
    """The server said its history no longer reaches the cursor we sent (replay cannot
    repair what lies before it)."""
    lagging_id: str | None = None
    """The checkpoint's lagging id when the connection ended (for the status query)."""
    cursor_source: str | None = None
    """Which store answered the start cursor: l1, l2, lagging, floor, heartbeat, explicit, none."""
    error: str | None = None
    """Why the connection ended, for DROPPED/RETRY_LATER (sanitised, no secrets)."""


@dataclass
class CheckpointState:
    stream: str
    lagging_id: str | None = None
    lagging_at: str | None = None
    """ISO time the lagging id was persisted (received)."""
    fence_id: str | None = None
    updated_at: str | None = None


@dataclass
class StreamRef:
    """Just enough to address one stream's stores."""

    name: str
    id_order: str = "natural"


@dataclass
class FenceInput:
    stream: StreamRef
    fence_id: str | None
    """None clears the fence."""


@dataclass
class AdvanceInput:
    stream: StreamRef
    replay_window: float
    now: str | None = None
    """ISO time to measure the window from (the schedule's action time); None = now."""


@dataclass
class AdvanceResult:
    lagging_id: str | None
    moved: bool = False
    held_by_fence: bool = False
    fence_id: str | None = None


@dataclass
class SinceInput:
    stream: StreamRef
    since: str
    """ISO timestamp; resolved to the newest id persisted at or before it."""


@dataclass
class ScheduleInput:
    spec: StreamSpec


@dataclass
class ReplaySignal:
    """Payload of the ``replay`` signal: nothing = lagged route."""

    from_id: str | None = None
    since: str | None = None


@dataclass
class StreamCounters:
    connections: int = 0
    drop_signals: int = 0
    lagged_replays: int = 0
    events_read: int = 0
    events_persisted: int = 0
    events_recovered: int = 0
    duplicates: int = 0
    events_unrecoverable: int = 0
    gaps_unrecoverable: int = 0
    failures: int = 0


@dataclass
class StreamStatus:
    """The ``status`` query's answer."""

    name: str
    state: str
    route: str | None = None
    live_cursor: str | None = None
    lagging_id: str | None = None
    fence_id: str | None = None
    counters: StreamCounters = field(default_factory=StreamCounters)
    last_outcome: str | None = None
    last_error: str | None = None
    next_reconnect_at: str | None = None
    pending_lagged: bool = False
