"""Inputs and results that cross the workflow/activity boundary.

Everything here is a plain dataclass of JSON-friendly values: it is stored in Temporal
history and shown in the Web UI, so it carries cursors and counts, never event data
and never secrets. New fields always get defaults so old histories still decode.
"""

# No `from __future__ import annotations`: Temporal decodes these dataclasses, and
# string annotations make each decode several times dearer (tests/test_payload_types.py).

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from durable_sse.config.spec import StreamSpec
from durable_sse.gaps.model import GapSummary, GapTotals, GapView

WORKFLOW_ID_PREFIX = "sse-stream:"
SCHEDULE_ID_PREFIX = "sse-checkpoint:"
WORKER_LOST = "WorkerLostError"
"""The error type of a read attempt failed by a watchdog because its worker died (retried
at once elsewhere: :mod:`durable_sse.ops.failover`)."""
CONNECTION_MOVED = "ConnectionMovedError"
"""The error type of a read attempt its own worker ended cleanly to go on elsewhere (the
worker stops, or hands connections over): retried at once, from its last cursor."""
MOVED_ERRORS = (WORKER_LOST, CONNECTION_MOVED)
RETRY_NOW = timedelta(milliseconds=1)
"""The ``next_retry_delay`` of a moved attempt: Temporal retries it at once. Not zero:
the SDK leaves a zero delay out of the failure, and the server then waits the retry
policy's backoff (1 s, 2 s, 4 s, ... by attempt), which was most of a SIGTERM's
hand-over time."""

STREAM_STATE_ATTRIBUTE = "SseStreamState"
"""Keyword search attribute a stream's workflow keeps set to its state (``reading``,
``waiting``, ``paused``, ``parked``, ``stopped-by-server``, ``stopped``) where the namespace
has it registered (activities/attributes.py)."""


def stream_workflow_id(name: str) -> str:
    return f"{WORKFLOW_ID_PREFIX}{name}"


def checkpoint_schedule_id(name: str) -> str:
    return f"{SCHEDULE_ID_PREFIX}{name}"


class Route(StrEnum):
    """Where a connection resumes from."""

    LIVE = "live"
    """Newest persisted id (L1 -> L2 -> lagging id -> floor -> none)."""
    LAGGED = "lagged"
    """The repair: one stored id before the oldest open gap, so the replay window
    re-delivers it; with no gap open, the lagging id (falls back to live)."""
    EXPLICIT = "explicit"
    """``ReadInput.start_id`` exactly: a requested replay (``from_id``/``since``), or its
    continuation after a disconnect."""


class Outcome(StrEnum):
    """Why a connection ended. Only non-retryable refusals are raised instead."""

    DROPPED = "dropped"
    """Network error, idle timeout, or a clean end of body: nothing was skipped."""
    DROP_SIGNAL = "drop_signal"
    """A gap was recorded (or found open) that the workflow must have repaired."""
    NO_CONTENT = "no_content"
    """HTTP 204: the server asks us to stop until resumed."""
    ROTATED = "rotated"
    """``max_connection_age`` reached; reconnect live."""
    CANCELLED = "cancelled"
    """The workflow cancelled the connection (replay/pause/stop); the batch was flushed."""
    RETRY_LATER = "retry_later"
    """429/5xx or a network error before the stream opened; ``retry_after`` says when."""


RECORDED_GAP = "recorded"
"""``DropReport.kind`` when a connection found open gaps the workflow did not know of
(a result lost to a crash or a cancel): it ends at once so the repair can start."""


@dataclass
class ReadInput:
    spec: StreamSpec
    route: Route = Route.LIVE
    start_id: str | None = None
    """Cursor to send when ``route`` is EXPLICIT."""
    known_gaps: list[str] = field(default_factory=list)
    """Open gaps the workflow knows of; a live connection that finds open gaps and knows
    none of them ends at once (``RECORDED_GAP``)."""
    connection: int = 0
    """Connection number within the workflow, for logs."""
    events_read_before: int = 0
    """Events the stream's earlier connections read (the workflow's counter): a connection
    with no id to send on a stream that has read events is a reconnect that cannot
    resume, a loss window (``GapKind.NO_RESUME``)."""
    verify: bool = False
    """Suspect what was read since the lagging id and re-read it (``verify_reconnects``:
    the connection before ended mid-read, and the server may have skipped events whose
    notice was still to come; ``GapKind.SUSPECTED``)."""
    verify_from: str | None = None
    """With ``verify``: where the oldest connection the suspicion covers started (its
    ``ReadResult.start_cursor``), the suspicion's start while the stream has no lagging
    id yet."""


@dataclass
class ReadCounts:
    events_read: int = 0
    new_rows: int = 0
    duplicates: int = 0
    recovered: int = 0
    """New rows that filled part of an open gap."""
    ids_out_of_order: int = 0
    """Ids not newer than the id read before them under the stream's ``id_order`` (a
    wrong ``id_order``: the cursors would not follow such ids)."""
    ids_reused: int = 0
    """Events carrying an id stored already with another type or data (a server that
    restarted its id counter): kept as new rows, not duplicates."""
    reconnects_without_cursor: int = 0
    """Reconnects that could not resume (no id to send), each recorded as a gap of kind
    ``no_resume``; counted once its gap is committed."""
    dropped_by_horizon: int = 0
    """Events whose id sorts at or before the stream's retention horizon (the newest id
    retention deleted): not stored, and not counted in ``duplicates`` either, since they
    may never have been stored (see durable_sse/log/retention.py)."""


@dataclass
class ReadProgress:
    """Heartbeat details: a hint for a retried attempt (the stores are the truth)."""

    cursor: str | None = None
    """Newest committed cursor of this attempt."""
    start_cursor: str | None = None
    """The cursor the attempt started from. A retried attempt starts there again: the
    one that died may have read a drop notice it could not record."""
    first_id: str | None = None
    """The first id the attempt committed, when it started with no cursor: a retry starts
    from it instead."""
    counts: ReadCounts = field(default_factory=ReadCounts)
    handed_over: bool = False
    """The attempt ended by its own worker with everything it read committed (a
    hand-over, not a death): its retry resumes at ``cursor`` with nothing to suspect."""


@dataclass
class CredentialView:
    """One secret a stream uses, as ``durable-sse status`` shows it: names, forms and
    times, never a value (:mod:`durable_sse.reader.credentials`)."""

    variable: str
    form: str = "env"
    """``env``, ``file`` (``NAME_FILE``) or ``oauth2`` (``NAME_TOKEN_URL``)."""
    refreshed_at: str | None = None
    """ISO time the worker last read a changed file or minted a token."""
    refreshes: int = 0
    failure: str | None = None
    """Why the last read or token request failed (None: it did not)."""
    auth_failure: str | None = None
    """The last refusal of this credential by a server (``HTTP 401 ...``), with its time."""


@dataclass
class ConnectionProgress:
    """What the running connection has done so far: its live progress in Redis
    (``progress:<stream>``, :func:`progress_json`), which ``durable-sse status`` folds in.

    The reader writes it every ``PROGRESS_INTERVAL`` when something changed. Workers of
    earlier versions sent it as the ``progress`` signal, which the workflow still takes
    (display only: the workflow routes on results, never on a report); it is no longer
    sent because every report cost the history four events (docs/benchmarks.md).
    """

    connection: int = 0
    """``ReadInput.connection`` of the reporting connection (a late report of another
    connection is ignored)."""
    cursor: str | None = None
    """Newest committed cursor."""
    counts: ReadCounts = field(default_factory=ReadCounts)
    """The execution's counts so far (earlier attempts included), as ``ReadResult.counts``."""
    lagging_id: str | None = None
    gaps: GapSummary | None = None
    """The stream's gaps as the store has them now (None: it could not be read)."""
    commit_lag: float | None = None
    """Seconds from the newest committed event's arrival to its commit."""
    at: str | None = None
    """ISO time of the report (the worker's clock)."""
    credentials: list[CredentialView] = field(default_factory=list)
    """The stream's secrets as the worker holds them (names and times, no values)."""


@dataclass
class DropReport:
    """The drop signal that ended a connection (short, sanitised: never event data)."""

    kind: str
    detail: str = ""


@dataclass
class ReadResult:
    outcome: Outcome
    start_cursor: str | None = None
    """The cursor this connection sent (None = live only)."""
    cursor_source: str | None = None
    """Which store answered it: l1, l2, gap, lagging, floor, explicit, heartbeat, none."""
    last_cursor: str | None = None
    """Newest persisted id at the end (the start cursor when nothing new came)."""
    counts: ReadCounts = field(default_factory=ReadCounts)
    drop: DropReport | None = None
    gaps: GapSummary | None = None
    """The stream's gaps as the connection ended (read from the store)."""
    lagging_id: str | None = None
    """The checkpoint's lagging id when the connection ended (for the status query)."""
    retry_ms: int | None = None
    """The server's last ``retry:`` value, if it sent one."""
    retry_after: float | None = None
    """Seconds to wait before reconnecting (Retry-After, capped), RETRY_LATER only."""
    status_code: int | None = None
    error: str | None = None
    """Why the connection ended, for DROPPED/RETRY_LATER (sanitised, no secrets)."""


@dataclass
class CheckpointState:
    stream: str
    lagging_id: str | None = None
    lagging_at: str | None = None
    """ISO time the lagging id was persisted (received)."""
    updated_at: str | None = None
    resting_since: str | None = None
    """ISO time the stream's checkpoint schedule began to rest (None: it runs)."""


@dataclass
class StreamRef:
    """Just enough to address one stream's stores."""

    name: str
    id_order: str = "natural"


@dataclass
class AdvanceInput:
    stream: StreamRef
    replay_window: float
    now: str | None = None
    """ISO time to measure the window from (the schedule's action time); None = now."""
    retention: float | None = None
    """The stream's own ``retention`` (None: the worker's ``DURABLE_SSE_RETENTION``)."""
    retention_declared: bool = False
    """The schedule was built by a version that knows retention, so ``retention`` None
    means "not set". A schedule from before leaves retention alone (deleting is
    irreversible: a stream's own setting must never be mistaken for unset); it is brought
    up to date when its stream starts again."""


@dataclass
class RetentionInput:
    stream: StreamRef
    replay_window: float
    retention: float | None = None
    """The stream's own ``retention`` (None: the worker's)."""
    now: str | None = None
    """ISO time the retention is measured back from (the checkpoint run's start)."""


@dataclass
class RetentionStatus:
    """What retention did to a stream (the ``retention`` activity's result, the
    ``retention`` signal's payload, part of ``status``)."""

    retention: float | None = None
    """Seconds kept (None: forever, nothing is deleted)."""
    source: str | None = None
    """``stream`` (its own ``retention``) or ``worker`` (``DURABLE_SSE_RETENTION``)."""
    deleted_rows: int = 0
    """Rows deleted since the stream's first retention run."""
    deleted_last_run: int = 0
    complete: bool = True
    """The last run deleted everything old enough (False: it stopped at its batch limit
    and the next run goes on)."""
    held_by: str | None = None
    """What keeps younger rows: ``lagging`` (the lagging id), ``gap`` (the oldest open
    gap's start), ``reader`` (what a running connection may still need), ``no-lagging-id``."""
    keep_from: str | None = None
    """The fence: this id and every newer one stay whatever their age."""
    horizon_id: str | None = None
    """The newest id deleted: re-sent ids at or before it are duplicates."""
    oldest_kept_id: str | None = None
    oldest_kept_at: str | None = None
    """ISO receive time of the oldest row still stored."""
    run_at: str | None = None
    held_by_consumers: list[str] = field(default_factory=list)
    """Consumer groups that kept rows old enough to go (they hold retention and have not
    consumed them yet, see ``durable_sse.consume``)."""


@dataclass
class AdvanceResult:
    lagging_id: str | None
    moved: bool = False
    held_by_gap: bool = False
    """An open gap keeps the lagging id at or before its resume point."""
    cap_id: str | None = None
    retention: RetentionStatus | None = None
    """What the run's retention step did (None: it did not run)."""
    retention_applies: bool | None = None
    """Whether the stream has a retention to apply, its own or the worker's (decided where
    the worker's setting is known); None: a worker from before this field, run the step."""
    caught_up: bool = False
    """The lagging id is the stream's newest id: no run can move it before a newer event is
    stored (see :mod:`durable_sse.cursor.rest`)."""
    rested: bool | None = None
    """The run paused its schedule to rest (None: it did not try)."""


@dataclass
class StreamGaps:
    """The stream's gaps and lagging id, read by the workflow when a result had none."""

    gaps: GapSummary
    lagging_id: str | None = None


@dataclass
class SinceInput:
    stream: StreamRef
    since: str
    """ISO timestamp; resolved to the newest id persisted at or before it."""


@dataclass
class ScheduleInput:
    spec: StreamSpec


@dataclass
class StreamCounters:
    connections: int = 0
    drop_signals: int = 0
    lagged_replays: int = 0
    """New lagged reconnects: repairs of gaps, and ``replay`` signals with no payload."""
    explicit_replays: int = 0
    """``replay`` signals with ``from_id`` or ``since``."""
    events_read: int = 0
    events_persisted: int = 0
    events_recovered: int = 0
    """Rows stored inside gaps after they were recorded (from the gap records)."""
    duplicates: int = 0
    ids_out_of_order: int = 0
    """Ids not newer than the one before under the stream's ``id_order``: a wrong order
    setting (ULIDs need ``lexicographic``), or a server that reorders."""
    events_unrecoverable: int = 0
    """Exact counts of unrecoverable gaps (from the gap records)."""
    gaps_open: int = 0
    gaps_repaired: int = 0
    gaps_unrecoverable: int = 0
    gaps_unknown_size: int = 0
    """Unrecoverable gaps whose size nobody can know: not in ``events_unrecoverable``."""
    failures: int = 0
    ids_reused: int = 0
    """Events whose id was stored already with another type or data (a server that
    restarted its id counter, or reuses ids): kept beside the earlier event, never
    counted as duplicates (docs/storage.md, "Event keys")."""
    reconnects_without_cursor: int = 0
    """Reconnects that could not resume (no id to send, on a stream that had read
    events): each lost what the server sent meanwhile, recorded as a ``no_resume`` gap
    of unknown size (so also in ``gaps_unknown_size``)."""
    dropped_by_horizon: int = 0
    """Events not stored because their id sorts at or before the retention horizon
    (``ReadCounts.dropped_by_horizon``); never in ``duplicates``."""
    suspicions: int = 0
    """Reconnects suspected of silent skips and re-read (``verify_reconnects``: gaps of
    kind ``suspected``)."""
    suspicions_closed: int = 0
    suspicions_recovered: int = 0
    """Events re-reading the suspicions stored that were missing."""


@dataclass
class StreamStatus:
    """The ``status`` query's answer."""

    name: str
    state: str
    route: str | None = None
    live_cursor: str | None = None
    lagging_id: str | None = None
    open_gaps: list[GapView] = field(default_factory=list)
    """Open gaps (oldest first, at most 20 by name; ``counters.gaps_open`` counts all)."""
    counters: StreamCounters = field(default_factory=StreamCounters)
    last_outcome: str | None = None
    last_error: str | None = None
    next_reconnect_at: str | None = None
    repair_pending: bool = False
    """A gap is open and its repair waits for the lagged-reconnect throttle."""
    progress_at: str | None = None
    """When the running connection's progress folded in was written (None: none): its
    live progress in Redis (``durable-sse status``), or a report of a worker of an
    earlier version; cursor, counters, gaps and lagging id include it."""
    commit_lag: float | None = None
    """The running connection's last reported commit lag, seconds."""
    id_order: str = "natural"
    """The stream's id order (how its cursors compare)."""
    connection: int | None = None
    """The running connection's number (None: none running)."""
    counted_at: str | None = None
    """When the workflow last folded a connection's result into the counters (what the
    query and the Web UI show of cursors and counts is this old, beyond a live view)."""
    gaps_at: str | None = None
    """When the gaps shown were read from the store by ``durable-sse status`` (None: the
    workflow's view, as of the last connection's result)."""
    retention: RetentionStatus | None = None
    """The last checkpoint run's retention report (None: none yet, or none configured)."""
    checkpoint_resting_since: str | None = None
    """Since when the stream's checkpoint schedule rests, read by ``durable-sse status``
    (None: it runs, or the store was not read)."""
    retry_capped_from_ms: int | None = None
    """The server's last ``retry:`` (ms) when it asked for more than the stream's
    ``max_retry_delay`` and the wait was cut to that bound (None: honoured, or none)."""
    credentials: list[CredentialView] = field(default_factory=list)
    """The stream's secrets as the worker reading it holds them (read by ``durable-sse
    status`` from the running connection's live progress; names and times, no values)."""


def add_counts(counters: StreamCounters, counts: ReadCounts) -> None:
    """What a connection read, added to the stream's counters: one rule for a result, a
    running connection's progress and the live status, so they never disagree on how
    counts add up."""
    counters.events_read += counts.events_read
    counters.events_persisted += counts.new_rows
    counters.duplicates += counts.duplicates
    counters.ids_out_of_order += counts.ids_out_of_order
    counters.ids_reused += counts.ids_reused
    counters.reconnects_without_cursor += counts.reconnects_without_cursor
    counters.dropped_by_horizon += counts.dropped_by_horizon


def progress_json(progress: ConnectionProgress) -> str:
    """A running connection's progress as its live value in Redis (``progress:<stream>``)."""
    return json.dumps(dataclasses.asdict(progress), separators=(",", ":"))


def parse_progress(text: str) -> ConnectionProgress | None:
    """A live progress value read back; None when it does not parse (a value of another
    version is a view lost, never an error). Gaps are not part of it: they are read from
    the store."""
    try:
        data = json.loads(text)
        counts = data.get("counts") or {}
        known = {
            f.name: int(counts[f.name]) for f in dataclasses.fields(ReadCounts) if f.name in counts
        }
        return ConnectionProgress(
            connection=int(data.get("connection", 0)),
            cursor=data.get("cursor"),
            counts=ReadCounts(**known),
            lagging_id=data.get("lagging_id"),
            commit_lag=data.get("commit_lag"),
            at=data.get("at"),
            credentials=[
                CredentialView(
                    **{
                        f.name: view[f.name]
                        for f in dataclasses.fields(CredentialView)
                        if f.name in view
                    }
                )
                for view in data.get("credentials") or []
                if isinstance(view, dict) and isinstance(view.get("variable"), str)
            ],
        )
    except (ValueError, TypeError, AttributeError):
        return None


def fold_gap_totals(counters: StreamCounters, totals: GapTotals) -> None:
    """The store's gap totals as the stream's counters (the workflow's fold and the live
    status both use it)."""
    counters.gaps_open = totals.open
    counters.gaps_repaired = totals.repaired
    counters.gaps_unrecoverable = totals.unrecoverable
    counters.gaps_unknown_size = totals.unknown_size
    counters.events_unrecoverable = totals.events_unrecoverable
    counters.events_recovered = totals.events_recovered
    counters.suspicions = totals.suspicions
    counters.suspicions_closed = totals.suspicions_closed
    counters.suspicions_recovered = totals.suspicions_recovered
