"""What a connection had read, when: how far back a drop notice may speak.

A notice speaks of what the server discarded lately, and it may come late: after more
events (see :data:`durable_sse.gaps.tracker.CONFIRM_IDS`) or, on a quiet stream, long
after the skip in time. So the gap a notice opens, and the retention hold that keeps what
such a gap would re-read from, start at the newest id read both one replay window and
``CONFIRM_IDS`` ids ago: far enough back in time *and* in ids. Bounded by time alone, a
notice one event late on a quiet stream started its gap after the skip it announced
(simulation seed 102888770: ``13, 15`` read, a second of silence, ``57``, then
"dropped 1 events": the gap began at 15, and the skipped 14 was in none).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple


class ReadMark(NamedTuple):
    at: float
    """Monotonic seconds when a batch was cut."""
    ids_read: int
    """The connection's count of ids read by then."""
    last_id: str
    """The newest id in that batch."""


class ReadMarks:
    """The marks of one connection's batches, pruned to one beyond the reach."""

    def __init__(self, *, window: float, ids: int) -> None:
        self.window = window
        self.ids = ids
        self._marks: deque[ReadMark] = deque()

    def add(self, mark: ReadMark) -> None:
        self._marks.append(mark)
        self._prune(mark.at, mark.ids_read)

    def reach(self, now: float, ids_read: int) -> str | None:
        """The newest id read at least a window and ``ids`` ids before ``now`` (None: the
        connection is younger than that, in time or in ids)."""
        self._prune(now, ids_read)
        marks = self._marks
        return marks[0].last_id if marks and self._beyond(marks[0], now, ids_read) else None

    def _beyond(self, mark: ReadMark, now: float, ids_read: int) -> bool:
        return mark.at <= now - self.window and ids_read - mark.ids_read >= self.ids

    def _prune(self, now: float, ids_read: int) -> None:
        """Keep one mark beyond the reach, the newest, and those after it."""
        marks = self._marks
        while len(marks) > 1 and self._beyond(marks[1], now, ids_read):
            marks.popleft()
