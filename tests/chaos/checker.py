"""The ground-truth checker: what the source emitted versus what ``sse_events`` holds.

``check`` compares a stream's :class:`SourceTruth` with its stored rows; the
:class:`CursorSampler` runs in the background during a scenario and counts regressions
of the Redis cursor and the checkpoint row's lagging id, and Redis cursors naming a row
that is not committed (a cursor past the last committed row).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import sqlalchemy as sa

from durable_sse.cursor.l2 import cursor_key, parse_value
from durable_sse.gaps.model import GapRecord, GapState
from durable_sse.ids import compare_ids
from durable_sse.source import SourceTruth
from durable_sse.stores import Stores

logger = logging.getLogger(__name__)

ORDER = "numeric"


@dataclass
class Stored:
    ids: list[int]
    rows: int
    duplicate_rows: int


async def stored(log: Stores, stream: str) -> Stored:
    """Every stored id of ``stream`` and the duplicate row count (same event id twice)."""

    def query() -> Stored:
        with log.database.engine.connect() as connection:
            ids = [
                int(row[0])
                for row in connection.execute(
                    sa.text("SELECT event_id FROM sse_events WHERE stream = :s"), {"s": stream}
                )
            ]
        return Stored(ids=ids, rows=len(ids), duplicate_rows=len(ids) - len(set(ids)))

    return await asyncio.to_thread(query)


@dataclass
class Verdict:
    """One scenario's numbers; :meth:`row` is its line in docs/reliability.md."""

    scenario: str
    emitted: int = 0
    stored: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicate_rows: int = 0
    out_of_window: int = 0
    unknown_size: int = 0
    """Of ``out_of_window``: ids inside unrecoverable gaps of unknown size (announced lost,
    in no exact count): ``events_unrecoverable`` should be ``out_of_window`` less these."""
    regressions: int = 0
    cursor_ahead: int = 0
    samples: int = 0
    recovered: int = 0
    reread: int = 0
    faults: str = ""
    first_lost: list[int] = field(default_factory=list)
    lost_unannounced: int = 0
    """Of ``lost``: ids inside a skip the source never announced (its connection closed
    first, ``truth.unannounced``): no drop signal on the wire told of them."""

    def row(self) -> str:
        unknown = f" ({self.unknown_size} of unknown size)" if self.unknown_size else ""
        return (
            f"| {self.scenario} | {self.emitted} | {self.faults} | {self.lost} | "
            f"{self.duplicate_rows} rows / {self.reread} re-read | {self.regressions} "
            f"({self.samples} samples, {self.cursor_ahead} ahead) | {self.recovered} | "
            f"{self.out_of_window}{unknown} |"
        )


def check(
    scenario: str, truth: SourceTruth, rows: Stored, gaps: Sequence[GapRecord] = ()
) -> Verdict:
    """Lost / unexpected / duplicate / out-of-window, from the first id the stream stored.

    A stream connects live-only the first time, so ids generated before its first stored
    id were never expected. A missing id is *out of window* only if the source really
    skipped it (a dropped range) and the history no longer held it: it is older than
    every id of that range a replay recovered, or a connection asked for it after the
    history had lost it (``truth.unavailable``: a drop taken before a replay's first
    event skips the ids after the newest stored one, and the repair finds them gone).
    A skipped id inside an unrecoverable gap record of *unknown size* (``gaps``, from
    ``sse_gaps``: no count was announced and ids are not contiguous) was announced lost:
    out of window too, and counted in ``unknown_size`` since no exact figure includes it.
    A skip the source never announced (``truth.unannounced``: its connection closed
    first) that the history still holds is no excuse: its missing ids are *lost*, and
    counted in ``lost_unannounced`` (only ``contiguous_ids`` or ``verify_reconnects`` can
    bring them back). Every other missing id is *lost* (silently).
    """
    verdict = Verdict(scenario=scenario, stored=rows.rows, duplicate_rows=rows.duplicate_rows)
    if not rows.ids:
        verdict.lost = truth.generated
        return verdict
    have = set(rows.ids)
    first = min(have)
    newest = truth.ids[-1] if truth.ids else first - 1
    emitted = set(range(first, newest + 1))
    verdict.emitted = len(emitted)
    verdict.unexpected = len(have - set(truth.ids))
    missing = emitted - have
    skipped = {i for i in missing if any(low <= i <= high for low, high in truth.dropped)}
    out_of_window: set[int] = set()
    for low, high in truth.dropped:
        if (low, high) in truth.unannounced and low >= truth.history_start:
            continue  # still in the history: lost unless re-read (counted apart below)
        recovered = [i for i in range(low, high + 1) if i in have]
        bound = min(recovered) if recovered else high + 1
        out_of_window |= {i for i in missing if low <= i < bound}
    out_of_window |= {
        i for i in skipped if any(low <= i <= high for low, high in truth.unavailable)
    }
    unknown = [g for g in gaps if g.state == GapState.UNRECOVERABLE.value and g.missing is None]
    announced = {i for i in skipped if any(g.contains(str(i), ORDER) for g in unknown)}
    lost = sorted(missing - out_of_window - announced)
    verdict.lost = len(lost)
    verdict.first_lost = lost[:10]
    verdict.lost_unannounced = sum(
        1 for i in lost if any(low <= i <= high for low, high in truth.unannounced)
    )
    verdict.out_of_window = len(out_of_window | announced)
    verdict.unknown_size = len(announced)
    return verdict


class CursorSampler:
    """Samples ``cursor:<stream>`` and the checkpoint row while a scenario runs.

    A regression is a value older than the previous one under the stream's id order. A
    Redis key that disappears (Redis restarted empty) starts a new baseline. ``ahead``
    counts Redis cursors with no committed row behind them (read the cursor first, then
    look the row up: the cursor is written after the commit, so the row must be there).
    Errors (a store down on purpose) skip the sample.
    """

    def __init__(self, log: Stores, redis_url: str, stream: str, *, every: float = 0.1):
        self.log = log
        self.stream = stream
        self.every = every
        self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=0.5)
        self.samples = 0
        self.regressions: list[str] = []
        self.ahead: list[str] = []
        self._l2: str | None = None
        self._lagging: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def __aenter__(self) -> CursorSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop sampling. The flag ends the loop even when a client library swallows the
        cancellation (a chaos run once hung here for minutes, sampling on), and the wait is
        bounded; a cancellation of the test itself is never suppressed."""
        assert self._task is not None
        self._stopping = True
        self._task.cancel()
        await asyncio.wait({self._task}, timeout=10)
        if not self._task.done():
            raise RuntimeError("the cursor sampler did not stop within 10 s")
        if not self._task.cancelled() and self._task.exception() is not None:
            raise self._task.exception()  # type: ignore[misc]
        await self.redis.aclose()

    def set_redis(self, redis_url: str) -> None:
        self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=0.5)

    @property
    def regression_count(self) -> int:
        return len(self.regressions)

    async def _run(self) -> None:
        while not self._stopping:
            await self.sample()
            await asyncio.sleep(self.every)

    async def sample(self) -> None:
        self.samples += 1
        try:
            raw = await self.redis.get(cursor_key(self.stream))
        except Exception:  # noqa: BLE001 - Redis down on purpose: skip
            raw = b"?"
        if raw != b"?":
            value = parse_value(self.stream, raw)
            if value is None:
                self._l2 = None  # gone: Redis restarted empty, a new baseline
            else:
                if self._l2 is not None and compare_ids(value, self._l2, ORDER) < 0:
                    self.regressions.append(f"l2 {self._l2} -> {value}")
                self._l2 = value
                with contextlib.suppress(Exception):
                    if not await self._committed(value):
                        self.ahead.append(value)
        try:
            checkpoint = await self.log.checkpoints.get_checkpoint(self.stream)
        except Exception:  # noqa: BLE001 - PostgreSQL down on purpose: skip
            return
        lagging = checkpoint.lagging_id if checkpoint else None
        if lagging is not None:
            if self._lagging is not None and compare_ids(lagging, self._lagging, ORDER) < 0:
                self.regressions.append(f"lagging {self._lagging} -> {lagging}")
            self._lagging = lagging

    async def _committed(self, event_id: str) -> bool:
        def query() -> bool:
            with self.log.database.engine.connect() as connection:
                row = connection.execute(
                    sa.text("SELECT 1 FROM sse_events WHERE stream = :s AND event_id = :e LIMIT 1"),
                    {"s": self.stream, "e": event_id},
                ).first()
            return row is not None

        return await asyncio.to_thread(query)
