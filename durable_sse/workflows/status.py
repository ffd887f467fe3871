"""What ``StreamWorkflow`` shows: its ``status`` answer and its Web UI details.

Pure functions of the workflow's :class:`~workflows.routes.StreamState` (no Temporal, no
I/O), so the wording is tested without a server (tests/test_stream_status.py). A running
connection's cursors and counts are not here: the reader writes them to Redis and
``durable-sse status`` folds them in (:mod:`durable_sse.ops.live`).
"""

from __future__ import annotations

import copy

from durable_sse.config.durations import format_duration
from durable_sse.config.spec import StreamSpec
from durable_sse.contracts import StreamStatus
from durable_sse.workflows.routes import StreamState, display_state


def stream_status(
    spec: StreamSpec,
    state: StreamState,
    *,
    connected: bool,
    waiting: bool,
    repairing: bool,
    running: int | None,
) -> StreamStatus:
    """The ``status`` query's answer: a copy, never a view of ``state``.

    ``repairing``: the running connection re-reads the open gaps (no repair is pending
    behind it). ``running``: its number (None: no connection runs).
    """
    s = copy.deepcopy(state)
    return StreamStatus(
        name=spec.name,
        state=display_state(s, connected=connected, waiting=waiting),
        route=s.route,
        live_cursor=s.live_cursor,
        lagging_id=s.lagging_id,
        open_gaps=s.gaps.open,
        counters=s.counters,
        last_outcome=s.last_outcome,
        last_error=s.last_error,
        next_reconnect_at=s.next_reconnect_at,
        repair_pending=s.repair_wanted and not repairing,
        retention=s.retention,
        retry_capped_from_ms=s.retry_capped_from_ms,
        id_order=spec.id_order,
        connection=running,
        counted_at=s.counted_at,
    )


def render_details(status: StreamStatus, *, max_retry_delay: float) -> str:
    """The Web UI's current details (markdown) for ``status``."""
    c = status.counters
    lines = [
        f"**{status.name}**: {status.state}",
        f"route: {status.route or '-'} · live: `{shown(status.live_cursor)}` · "
        f"lagging: `{shown(status.lagging_id)}`",
        f"connections {c.connections} · persisted {c.events_persisted} · "
        f"drop signals {c.drop_signals} · lagged replays {c.lagged_replays} · "
        f"explicit replays {c.explicit_replays} · recovered {c.events_recovered}",
        f"gaps: open {c.gaps_open} · repaired {c.gaps_repaired} · unrecoverable "
        f"{c.gaps_unrecoverable} ({c.events_unrecoverable} events"
        + (f", {c.gaps_unknown_size} of unknown size" if c.gaps_unknown_size else "")
        + ")",
    ]
    for gap in status.open_gaps[:5]:
        lines.append(
            f"open gap after `{shown(gap.start_id)}` before `{shown(gap.end_id)}` "
            f"({gap.kind}, seen {gap.seen_at}, repair resumes after "
            f"`{shown(gap.resume_from)}`)"
        )
    if c.ids_reused:
        lines.append(
            f"ids reused {c.ids_reused}: stored ids sent again with other data (the "
            "server restarted its id counter?), kept beside the earlier events"
        )
    if c.reconnects_without_cursor:
        lines.append(
            f"reconnects without a cursor {c.reconnects_without_cursor} (the server sends "
            "no ids: each lost what was sent meanwhile)"
        )
    if c.suspicions:
        lines.append(
            f"verified reconnects {c.suspicions} (closed {c.suspicions_closed}): "
            f"{c.suspicions_recovered} events the server skipped without a notice that "
            "arrived were read again and stored"
        )
    if status.repair_pending:
        lines.append("repair pending (lagged reconnects are throttled)")
    if status.counted_at is not None:
        lines.append(
            f"cursors and counts as of {status.counted_at} (the last connection's end; "
            "`durable-sse status` shows them live)"
        )
    r = status.retention
    if r is not None and r.retention is not None:
        lines.append(
            f"retention {format_duration(r.retention)} ({r.source}): deleted "
            f"{r.deleted_rows} · oldest kept `{shown(r.oldest_kept_id)}` at "
            f"{r.oldest_kept_at or '-'} · kept from `{shown(r.keep_from)}` ({r.held_by})"
        )
    if c.dropped_by_horizon:
        lines.append(
            f"dropped by the retention horizon {c.dropped_by_horizon} (ids at or before "
            "the newest id retention deleted: not stored)"
        )
    if status.next_reconnect_at:
        lines.append(f"next reconnect: {status.next_reconnect_at}")
    if status.retry_capped_from_ms is not None:
        lines.append(
            f"server's retry: {status.retry_capped_from_ms} ms, cut to "
            f"max_retry_delay ({format_duration(max_retry_delay)})"
        )
    if status.last_error:
        lines.append(f"last error: {status.last_error}")
    return "\n\n".join(lines)


def shown(value: str | None) -> str:
    return "-" if value is None else value
