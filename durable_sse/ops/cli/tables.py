"""The tables ``status`` and ``consumers`` print."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from durable_sse.config.durations import format_duration
from durable_sse.consume.status import LAG_CAP, ConsumerStatus
from durable_sse.log.retention import describe as retention_text
from durable_sse.ops import control

STATUS_COLUMNS = (
    ("stream", lambda s: s["name"]),
    ("state", lambda s: s["state"]),
    ("version", lambda s: s.get("version") or "-"),
    ("route", lambda s: s.get("route") or "-"),
    ("cursor", lambda s: control.current_counts(s)[0] or "-"),
    ("lagging id", lambda s: control.lagging_text(s)),
    ("persisted", lambda s: control.current_counts(s)[1]),
    ("lag", lambda s: control.lag_text(s)),
    ("as of", lambda s: control.age_text(s)),
    ("drops", lambda s: s["counters"]["drop_signals"]),
    ("open gaps", control.open_gaps_text),
    ("recovered", lambda s: s["counters"]["events_recovered"]),
    ("lost", lambda s: control.lost_text(s["counters"])),
    ("retention", lambda s: retention_text(s.get("retention"))),
    ("credentials", lambda s: credentials_text(s.get("credentials"))),
    ("last error", lambda s: s.get("last_error") or control.moved_text(s)),
)
ERROR_INDENT = "    "


def credentials_text(views: list[dict[str, Any]] | None) -> str:
    """``NAME file 08:12:01`` per secret: its form, when last read or minted, and its last
    failure or refusal (``401 08:11:59``); ``-`` without a running connection."""
    if not views:
        return "-"
    parts = []
    for view in views:
        text = f"{view['variable']} {view.get('form', 'env')}"
        refreshed = view.get("refreshed_at")
        if refreshed:
            text += f" {refreshed[11:19]}"
        if view.get("failure"):
            text += " (failing)"
        refused = view.get("auth_failure")
        if refused:
            text += f" {refused.split()[1]} {refused.rsplit(' at ', 1)[-1][11:19]}"
        parts.append(text)
    return ", ".join(parts)


def format_status_table(statuses: list[dict[str, Any]], *, width: int | None = None) -> str:
    """The status table; the last error (why a stream is parked) is never cut short.

    Args:
        width: the terminal's width. A last error that does not fit after its row goes
            on the lines below it, wrapped to this width; None writes every row on one
            line however long (``--wide``).
    """
    if not statuses:
        return "no streams running"
    rows = [[name for name, _ in STATUS_COLUMNS]]
    rows += [[str(value(status)) for _, value in STATUS_COLUMNS] for status in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(STATUS_COLUMNS) - 1)]
    room = None if width is None else width - sum(widths) - 2 * len(widths)
    lines = []
    for number, row in enumerate(rows):
        head = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
        last = row[-1]
        if number == 0 or width is None or room is None or len(last) <= room:
            lines.append(f"{head}  {last}".rstrip())
            continue
        lines.append(head.rstrip())
        lines += textwrap.wrap(
            f"last error: {last}",
            max(width - len(ERROR_INDENT), 20),
            initial_indent=ERROR_INDENT,
            subsequent_indent=ERROR_INDENT,
            break_long_words=True,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


def _hold_text(status: ConsumerStatus) -> str:
    if not status.holds_retention:
        return "-"
    if status.max_hold is None:
        return "yes"
    return f"up to {format_duration(status.max_hold)}"


CONSUMER_COLUMNS: tuple[tuple[str, Callable[[ConsumerStatus], object]], ...] = (
    ("group", lambda s: s.group),
    ("stream", lambda s: s.stream),
    ("state", lambda s: s.state),
    ("position", lambda s: s.position),
    ("lag", lambda s: f"{s.lag_events}+" if s.lag_events >= LAG_CAP else s.lag_events),
    ("lag s", lambda s: f"{s.lag_seconds:.1f}"),
    ("owner", lambda s: s.owner or "-"),
    ("dead letters", lambda s: s.dead_letters),
    ("holds retention", _hold_text),
)


def format_consumers_table(statuses: list[ConsumerStatus]) -> str:
    """One row per group and stream; why a stream is parked on the line below it."""
    if not statuses:
        return "no consumer groups"
    rows = [[name for name, _ in CONSUMER_COLUMNS]]
    rows += [[str(value(status)) for _, value in CONSUMER_COLUMNS] for status in statuses]
    widths = [max(len(row[i]) for row in rows) for i in range(len(CONSUMER_COLUMNS))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        status = statuses[number - 1] if number else None
        if status is not None and status.parked_reason:
            lines.append(f"{ERROR_INDENT}parked: {status.parked_reason}")
        elif status is not None and status.last_error:
            lines.append(f"{ERROR_INDENT}last error: {status.last_error.splitlines()[0]}")
    return "\n".join(lines)
