"""Retention: how long a stream's events are kept, and which old rows must stay anyway.

Deleting is irreversible, so the decisions are plain functions here and the store only
carries them out (:meth:`durable_sse.eventlog.EventLog.apply_retention`):

* **How long.** A stream's own ``retention`` wins; a stream without one takes the
  worker's ``DURABLE_SSE_RETENTION``, raised to the stream's ``replay_window`` if it is
  shorter (a stream's own setting is refused below its window already); with neither,
  nothing is deleted. A stream opts out of a worker-wide setting with a retention of its
  own (``36500d`` is a century).
* **What stays whatever its age** (the *fence*): the lagging id's row and every row at or
  after it, and the start row of the oldest open gap and everything after it. The lagged
  route and every repair start at or after the fence, so no connection the workflow
  makes asks the server for anything older; a gap's start row stays so a replay can be
  attributed to the gap and the gap counted. A stream with no lagging id yet keeps every
  row that carries an id.
* **Deduplication after a delete.** Deleted keys can no longer conflict, so a server
  that re-sends ids older than the fence (one that ignores ``Last-Event-ID``, or an
  explicit ``replay --from-id`` that far back) would have them stored again as new rows,
  after every delete, for as long as its history holds them. The store therefore keeps a
  per-stream *horizon*, the newest id key it has deleted, and the write path drops rows
  whose id sorts at or before it as duplicates (never as new, never as recovered).
  Everything the fence protects sorts after the horizon, so no row a repair can bring
  back is ever dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

import pydantic

from durable_sse.errors import ConfigError
from durable_sse.gaps import Gap
from durable_sse.ids import IdOrder, compare_ids
from durable_sse.spec import DAY, MINUTE, format_duration, seconds

RETENTION_ENV = "DURABLE_SSE_RETENTION"
MIN_RETENTION = MINUTE
MAX_RETENTION = 36_500 * DAY
BATCH_ROWS = 10_000
"""Rows one DELETE statement takes at most: short statements (tens of milliseconds on
PostgreSQL, see docs/benchmarks.md) that never hold the stream's writers back for long."""
MAX_BATCHES = 20
"""Statements one run issues at most (heartbeating between them); a larger backlog is
worked off over the next runs, one replay window apart."""

HELD_BY_LAGGING = "lagging"
HELD_BY_GAP = "gap"
HELD_BY_NO_LAGGING = "no-lagging-id"

_SETTING = pydantic.TypeAdapter(Annotated[float, seconds(MIN_RETENTION, MAX_RETENTION)])


def parse_retention_setting(value: str | None, *, name: str = RETENTION_ENV) -> float | None:
    """The worker's retention in seconds (None: unset or empty, keep forever).

    Validated like a stream's ``retention`` (the same duration forms and bounds, strict:
    ``"7d"``, ``"36h"``, ``604800``), and refused in one line naming the variable.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return _SETTING.validate_python(float(text) if _is_number(text) else text)
    except pydantic.ValidationError as error:
        problem = error.errors(include_url=False)[0]
        reason = problem.get("ctx", {}).get("reason") or problem["msg"]
        raise ConfigError(f"{name} = {value!r}: {reason}") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def effective_retention(
    stream_retention: float | None, worker_retention: float | None, replay_window: float
) -> tuple[float | None, str | None]:
    """``(seconds, source)``: the stream's own setting, else the worker's (never shorter
    than the replay window), else ``(None, None)``: keep forever."""
    if stream_retention is not None:
        return max(stream_retention, replay_window), "stream"
    if worker_retention is not None:
        return max(worker_retention, replay_window), "worker"
    return None, None


@dataclass(frozen=True)
class Fence:
    """The oldest id that must stay, and why (see the module docstring)."""

    keep_from: str | None
    """Rows with this id or a newer one stay; None with ``ids_deletable`` False: every row
    that carries an id stays."""
    held_by: str
    """``lagging``, ``gap`` (the oldest open gap's start is older than the lagging id),
    or ``no-lagging-id``."""

    @property
    def ids_deletable(self) -> bool:
        return self.keep_from is not None


def retention_fence(
    lagging_id: str | None, open_gaps: Iterable[Gap], order: IdOrder | str
) -> Fence:
    """The fence: the older of the lagging id and the open gaps' start ids."""
    if lagging_id is None:
        return Fence(None, HELD_BY_NO_LAGGING)
    fence, held_by = lagging_id, HELD_BY_LAGGING
    for gap in open_gaps:
        if not gap.is_open:
            continue
        if gap.start_id is None:
            return Fence(None, HELD_BY_GAP)  # no start to keep from: keep every id
        if compare_ids(gap.start_id, fence, order) < 0:
            fence, held_by = gap.start_id, HELD_BY_GAP
    return Fence(fence, held_by)


@dataclass(frozen=True)
class ConsumerHold:
    """One consumer group's term of the fence (a separate term: the fence above is the
    reader's, this one the consumers' of the log; see :mod:`durable_sse.consume`).

    A group that holds retention keeps every row it has not consumed (``seq`` after its
    position), until the row is older than the group's ``max_hold``: then it goes, and
    the group meets ``Truncated`` (or an error) instead, so one stuck consumer cannot
    fill the disk forever.
    """

    group: str
    position: int
    """The group's position in the stream: rows up to this ``seq`` are consumed."""
    until: datetime | None = None
    """Rows received before this time go all the same (now - ``max_hold``; None: kept
    for as long as the group needs them)."""

    def keeps(self, seq: int, received_at: datetime) -> bool:
        return seq > self.position and (self.until is None or received_at >= self.until)


def held_by_consumers(holds: Iterable[ConsumerHold], seq: int, received_at: datetime) -> bool:
    """Whether a group keeps this row (retention deletes in ``seq`` order and stops at the
    first row kept, like at the first row younger than the cutoff)."""
    return any(hold.keeps(seq, received_at) for hold in holds)


def describe(status: Mapping[str, object] | None) -> str:
    """One line for ``durable-sse status``: ``7d: 1204 deleted, oldest kept …``."""
    if not status or status.get("retention") is None:
        return "-"
    retention = format_duration(float(status["retention"]))  # type: ignore[arg-type]
    text = f"{retention}: {status.get('deleted_rows', 0)} deleted"
    oldest = status.get("oldest_kept_at")
    if oldest:
        text += f", oldest kept {str(oldest)[:19]}Z"
    groups = status.get("held_by_consumers")
    if groups:
        text += f", held by consumers {', '.join(map(str, groups))}"  # type: ignore[call-overload]
    return text
