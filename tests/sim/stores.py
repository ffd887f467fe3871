"""In-memory stand-ins for the event log and Redis, with the same semantics.

The memory event log applies batches exactly as :class:`~durable_sse.stores.Stores`
does: rows deduplicated on ``(event_id, follower_key)``, an event whose key is stored under
another digest (a reused id) kept under its extended key, the batch's gap changes applied in
the same step with :func:`durable_sse.gaps.transitions.apply_change`, the start of a connection
chosen with :func:`durable_sse.cursor.fence.choose_start`, the lagging id moved with
:func:`durable_sse.cursor.fence.lagging_target`. Retention takes the same decisions from
:mod:`durable_sse.log.retention`: the fence (lagging id, open gaps, running connections'
starts) read for every delete statement, the rows one statement deletes, the horizon the
write path drops rows at, and where a gap opened behind it starts. Only the storage is
different.

What retention deletes stays in the oracle's view (:meth:`MemoryEventLog.stored_numbers`:
stored once, then deleted and counted); storing such an id again, or counting it as
missing, is recorded in :attr:`MemoryEventLog.anomalies` for the oracle.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from durable_sse.consume.items import Read, cap_markers, merge_items
from durable_sse.consume.model import Event as ConsumedEvent
from durable_sse.consume.model import Gap as GapItem
from durable_sse.consume.model import GapClosed as GapClosedItem
from durable_sse.consume.model import Position
from durable_sse.contracts import CheckpointState
from durable_sse.cursor.fence import (
    RunningReader,
    choose_start,
    lagging_target,
    live_starts,
    retention_fence,
)
from durable_sse.cursor.readers import ReaderLease
from durable_sse.cursor.start import ConnectionStart
from durable_sse.gaps.model import (
    GapChange,
    GapRecord,
    GapSummary,
    StreamContext,
    numeric_span,
    summarize,
)
from durable_sse.gaps.tracker import CONFIRM_IDS, CONFIRM_SECONDS
from durable_sse.gaps.transitions import apply_change, changes_nothing, opening_past_horizon
from durable_sse.ids import IdOrder, contiguous_number, is_newer, sort_key
from durable_sse.log.keys import CARRIER_KEY, reused_key
from durable_sse.log.records import EventRecord, InsertResult, StoredPage
from durable_sse.log.retention import (
    HELD_BY_NO_LAGGING,
    after_horizon,
    choose_deletions,
    row_deletable,
)
from durable_sse.log.workers import WorkerState


@dataclass
class Row:
    seq: int
    received_at: datetime
    digest: bytes | None = None
    key: bytes | None = None
    """``id_key``: the id's sort key (None: no id)."""
    event_id: str = ""
    carrier: bool = False
    """The row carries its id (``event_ord`` 0) under the plain key (``_keys`` lists it)."""


@dataclass
class RetentionBatch:
    """One delete statement (``Prune._delete_batch_sync``)."""

    deleted: int
    last_seq: int | None
    done: bool


class MemoryEventLog:
    """One stream's event log, checkpoint row and gap records."""

    def __init__(self, stream: str, order: str) -> None:
        self.stream = stream
        self.order = IdOrder(order)
        self.rows: dict[tuple[str, int | bytes | None], Row] = {}
        self._keys: list[tuple[bytes, str]] = []
        """Sorted ``(sort key, id)`` of rows carrying an id (ord 0)."""
        self.gaps: dict[str, GapRecord] = {}
        self.lagging_id: str | None = None
        self.seq = 0
        self.commits = 0
        self.counted_missing: dict[str, set[int]] = {}
        """Per gap closed as unrecoverable, the ids it counted (the oracle's view)."""
        self.readers: dict[str, RunningReader] = {}
        """``sse_readers``: running connections and their start cursors."""
        self.horizon: tuple[bytes, str] | None = None
        """``sse_retention``: the newest id key retention deleted, and its id."""
        self.deleted: set[int] = set()
        """Ids whose carrier row retention deleted."""
        self.deleted_rows = 0
        self.dropped_by_horizon = 0
        self.anomalies: list[str] = []
        """What retention must never cause: an id stored again after it was deleted, or
        counted as missing by a gap although it was stored (and then deleted)."""
        self.opened_markers: dict[str, tuple[int, int]] = {}
        self.closed_markers: dict[str, tuple[int, int]] = {}
        """Per gap, ``(after_seq, mark)`` of its opening and closing markers: the place a
        consumer meets them in the stream's order (``GapStore._place_gap_markers``)."""
        self.deleted_to: int | None = None
        """``sse_retention.deleted_to_seq``: the newest ``seq`` retention deleted."""
        self.deleted_seqs: set[int] = set()
        """Every ``seq`` retention deleted (the oracle's view)."""
        self.first_seq: dict[int, int] = {}
        """Per integer id, the ``seq`` of the row that first stored it (kept when
        retention deletes it): where a consumer met it (the oracle's view)."""

    # -- the write path ------------------------------------------------------------

    def commit(
        self, records: list[EventRecord], changes: list[GapChange], *, now: datetime
    ) -> InsertResult:
        """One transaction: insert the rows (dedupe, reused ids kept under their extended
        keys, the horizon), apply the gap changes."""
        new_rows = dropped = 0
        reused: list[str] = []
        horizon = self.horizon[0] if self.horizon is not None else None
        for record in records:
            id_key = sort_key(record.event_id, self.order) if record.event_id else None
            if not after_horizon(id_key, horizon):
                dropped += 1
                continue
            # Carriers as (id, 0); followers by their content key, as the real log does.
            follower = 0 if record.event_ord == 0 else record.follower_key
            key: tuple[str, int | bytes | None] = (record.event_id, follower)
            if record.event_id and key in self.rows:
                stored = self.rows[key].digest
                if stored is None or record.digest is None or stored == record.digest:
                    continue
                plain = record.follower_key if record.event_ord else CARRIER_KEY
                key = (record.event_id, reused_key(record.digest, plain or CARRIER_KEY))
                if key in self.rows:
                    continue
                if record.event_ord == 0:
                    reused.append(record.event_id)
            self.seq += 1
            carrier = bool(record.event_id) and key == (record.event_id, 0)
            self.rows[key if record.event_id else ("", -self.seq)] = Row(
                self.seq,
                record.received_at,
                record.digest,
                key=id_key,
                event_id=record.event_id,
                carrier=carrier,
            )
            new_rows += 1
            if carrier:
                assert id_key is not None
                bisect.insort(self._keys, (id_key, record.event_id))
                number = contiguous_number(record.event_id)
                if number is not None and number in self.deleted:
                    self.anomalies.append(f"{number} stored again after retention deleted it")
                if number is not None:
                    self.first_seq.setdefault(number, self.seq)
        self.dropped_by_horizon += dropped
        changes = [change for change in changes if not changes_nothing(change, new_rows)]
        if self.horizon is not None and any(change.opened is not None for change in changes):
            moved = (opening_past_horizon(c, self.horizon[1], self.order) for c in changes)
            changes = [change for change in moved if change is not None]
        found = set(self.gaps)
        was_open = {gap_id for gap_id, gap in self.gaps.items() if gap.is_open}
        for change in changes:
            updated = apply_change(
                self.gaps.get(change.gap_id),
                change,
                order=self.order,
                lagging_id=self.lagging_id,
                new_rows=new_rows,
                now=now.isoformat(),
                stored=self,
            )
            if updated is not None:
                before = self.gaps.get(change.gap_id)
                self.gaps[change.gap_id] = updated
                placed = (
                    before is not None
                    and before.start_id is None
                    and before.end_id is None
                    and updated.end_id is not None
                )  # a gap closed as it opened, placed when its end comes
                if updated.state == "unrecoverable" and (
                    before is None or before.is_open or placed
                ):
                    self._note_counted(updated)
        self._place_markers(sorted({change.gap_id for change in changes}), found, was_open)
        self.commits += 1
        return InsertResult(
            new_rows=new_rows,
            duplicates=len(records) - new_rows - dropped,
            reused=tuple(reused),
            dropped_by_horizon=dropped,
        )

    def _place_markers(self, ids: list[str], found: set[str], was_open: set[str]) -> None:
        """Gaps that opened or closed in this commit get their place in the stream's
        order: the newest ``seq`` now, and the next marker numbers, openings first."""
        opened = [gap_id for gap_id in ids if gap_id in self.gaps and gap_id not in found]
        closed = [
            gap_id
            for gap_id in ids
            if gap_id in self.gaps
            and not self.gaps[gap_id].is_open
            and (gap_id not in found or gap_id in was_open)
        ]
        if not opened and not closed:
            return
        at = max((row.seq for row in self.rows.values()), default=0)
        marks = [mark for _, mark in (*self.opened_markers.values(), *self.closed_markers.values())]
        mark = max(marks, default=0)
        for gap_id in opened:
            mark += 1
            self.opened_markers[gap_id] = (at, mark)
        for gap_id in closed:
            mark += 1
            self.closed_markers[gap_id] = (at, mark)

    def consumer_read(self, position: Position, *, limit: int) -> Read:
        """What a consumer reads after ``position`` (``consume.items.read_items``): the
        rows and markers as the SQL store selects them, merged by the real merge."""
        events = [
            ConsumedEvent(
                self.stream,
                row.seq,
                row.event_id,
                "message",
                f"d{row.event_id}",
                row.received_at,
                0 if row.carrier else None,
            )
            for row in sorted(self.rows.values(), key=lambda row: row.seq)
            if row.seq > position.seq
        ][:limit]
        bound = events[-1].seq if events else position.seq
        found: list[GapItem | GapClosedItem] = []
        counts = {"o": 0, "c": 0}
        last = {"o": 0, "c": 0}
        for kind, markers in (("o", self.opened_markers), ("c", self.closed_markers)):
            chosen = sorted(
                (mark, gap_id, at)
                for gap_id, (at, mark) in markers.items()
                if mark > position.mark and at <= bound
            )[:limit]
            counts[kind] = len(chosen)
            for mark, gap_id, at in chosen:
                last[kind] = mark
                found.append(self._marker(kind, gap_id, at, mark))
        markers, full = cap_markers(found, counts, last, limit)
        return merge_items(
            self.stream,
            position,
            events,
            markers,
            markers_full=full,
            deleted_to=self.deleted_to,
            limit=limit,
        )

    def _marker(self, kind: str, gap_id: str, at: int, mark: int) -> GapItem | GapClosedItem:
        gap = self.gaps[gap_id]
        if kind == "o":
            return GapItem(
                stream=self.stream,
                gap_id=gap_id,
                kind=gap.kind,
                start_id=gap.start_id,
                end_id=gap.end_id,
                announced=gap.announced,
                seen_at=None,
                detail=gap.detail,
                after_seq=at,
                mark=mark,
            )
        return GapClosedItem(
            stream=self.stream,
            gap_id=gap_id,
            state=gap.state,
            recovered=gap.recovered,
            missing=gap.missing,
            closed_at=None,
            after_seq=at,
            mark=mark,
        )

    def _note_counted(self, gap: GapRecord) -> None:
        if gap.missing is None:
            return
        if gap.start_id is None:
            end = contiguous_number(gap.end_id) if gap.end_id else None
            if end is not None:
                # Before anything was stored: the announced ids right before the end.
                self.counted_missing[gap.gap_id] = set(range(end - gap.missing, end))
            return
        span = numeric_span(gap)
        if span is None:
            return
        counted = set()
        for other in self.counted_missing.values():
            counted |= other
        low, high = span
        self.counted_missing[gap.gap_id] = {
            n for n in range(low + 1, high) if (str(n), 0) not in self.rows and n not in counted
        }
        retained = self.counted_missing[gap.gap_id] & self.deleted
        if retained:
            self.anomalies.append(
                f"gap {gap.gap_id} counted {sorted(retained)[:10]} as missing; they were "
                "stored and retention deleted them"
            )

    # -- gaps.StoredIds ------------------------------------------------------------

    def stored_numbers_between(self, low: int, high: int) -> int:
        return sum(1 for n in range(low + 1, high) if (str(n), 0) in self.rows)

    def counted_ranges(self, *, except_gap: str) -> list[tuple[int, int]]:
        spans = (
            numeric_span(gap)
            for gap in self.gaps.values()
            if gap.state == "unrecoverable" and gap.gap_id != except_gap
        )
        return [span for span in spans if span is not None]

    # -- what the reader and the workflow read -------------------------------------

    @property
    def floor(self) -> str | None:
        return self._keys[-1][1] if self._keys else None

    def settled_id(self) -> str | None:
        """As :func:`durable_sse.log.reads.settled_id`, with the tracker's defaults."""
        if len(self._keys) <= CONFIRM_IDS:
            return None
        floor = self.rows[(self._keys[-1][1], 0)].received_at
        cutoff = floor - timedelta(seconds=CONFIRM_SECONDS)
        for _, event_id in reversed(self._keys[: len(self._keys) - CONFIRM_IDS]):
            if self.rows[(event_id, 0)].received_at <= cutoff:
                return event_id
        return None

    def neighbour(self, event_id: str, older: bool) -> str | None:
        key = sort_key(event_id, self.order)
        if older:
            index = bisect.bisect_left(self._keys, (key, "")) - 1
            return self._keys[index][1] if index >= 0 else None
        index = bisect.bisect_right(self._keys, (key, "\U0010ffff"))
        return self._keys[index][1] if index < len(self._keys) else None

    def stored_page(self, after: str | None, limit: int) -> StoredPage:
        """``Reads.stored_keys``: the first ``limit`` stored keys after ``after``."""
        low = None if after is None else sort_key(after, self.order)
        ahead = sorted(
            (
                sort_key(event_id, self.order),
                event_id,
                key if isinstance(key, bytes) else CARRIER_KEY,
                row.digest,
            )
            for (event_id, key), row in self.rows.items()
            if event_id and (low is None or sort_key(event_id, self.order) > low)
        )[:limit]
        keys = [(event_id, key) for _, event_id, key, _ in ahead]
        digests = [digest for *_, digest in ahead]
        return StoredPage(keys=keys, full=len(keys) >= limit, digests=digests)

    def open_gaps(self) -> list[GapRecord]:
        return [gap for gap in self.gaps.values() if gap.is_open]

    async def connection_context(
        self,
        stream: str,
        id_order: str,
        *,
        cursor: str | None,
        source: str,
        repair: bool = False,
        from_oldest: bool = False,
        reader: ReaderLease | None = None,
        retry: bool = False,
        settled: bool = False,
    ) -> ConnectionStart:
        open_gaps = self.open_gaps()
        cursor, source, witness = choose_start(
            cursor=cursor,
            source=source,
            repair=repair,
            lagging_id=self.lagging_id,
            floor=self.floor,
            open_gaps=open_gaps,
            order=self.order,
            neighbour=self.neighbour,
            oldest=(lambda: self._keys[0][1] if self._keys else None) if from_oldest else None,
            retry=retry,
            settled=self.settled_id if settled else None,
        )
        context = StreamContext(
            lagging_id=self.lagging_id,
            floor=self.floor,
            witness=witness,
            open_gaps=[GapRecord(**vars(gap)) for gap in open_gaps],
            has_rows=bool(self.rows),
        )
        if reader is not None:
            self.readers[reader.reader_id] = RunningReader(
                reader.reader_id, cursor, reader.expires_at
            )
        return ConnectionStart(cursor=cursor, source=source, context=context)

    def move_reader(self, reader_id: str, hold: str | None) -> None:
        reader = self.readers.get(reader_id)
        if reader is not None:
            self.readers[reader_id] = RunningReader(reader_id, hold, reader.expires_at)

    def release_reader(self, reader_id: str) -> None:
        self.readers.pop(reader_id, None)

    # -- retention -------------------------------------------------------------------

    def retention_batch(
        self, *, cutoff: datetime, after: int | None, limit: int, now: datetime
    ) -> RetentionBatch:
        """One delete statement, as ``Prune._delete_batch_sync`` takes it: the fence
        read now, the next ``limit`` rows before the fence row's in ``seq`` order."""
        fence = retention_fence(
            self.lagging_id,
            self.open_gaps(),
            self.order,
            live_starts(self.readers.values(), now),
        )
        fence_key = end_seq = None
        if fence.ids_deletable:
            assert fence.keep_from is not None
            keep = self.neighbour(fence.keep_from, True) or fence.keep_from
            fence_key = sort_key(keep, self.order)
            end_seq = self._fence_seq(fence_key)
        elif fence.held_by != HELD_BY_NO_LAGGING or any(r.key for r in self.rows.values()):
            return RetentionBatch(0, after, True)
        rows = [
            (row.seq, row.key, row.received_at)
            for row in self.rows.values()
            if (after is None or row.seq > after) and (end_seq is None or row.seq < end_seq)
        ][:limit]
        choice = choose_deletions(
            rows, after=after, fence_key=fence_key, cutoff=cutoff, limit=limit
        )
        if not choice.doomed:
            return RetentionBatch(0, choice.last_seq, choice.done)
        assert choice.last_seq is not None
        doomed = [
            (name, row)
            for name, row in self.rows.items()
            if (after is None or row.seq > after)
            and row.seq <= choice.last_seq
            and row_deletable(row.key, row.received_at, fence_key=fence_key, cutoff=cutoff)
        ]
        for name, row in doomed:
            del self.rows[name]
            self.deleted_seqs.add(row.seq)
            if row.carrier:
                self._keys.remove((row.key, row.event_id))  # type: ignore[arg-type]
                number = contiguous_number(row.event_id)
                if number is not None:
                    self.deleted.add(number)
        if choice.newest_key is not None and (
            self.horizon is None or choice.newest_key > self.horizon[0]
        ):
            newest = next(row for _, row in doomed if row.key == choice.newest_key)
            self.horizon = (choice.newest_key, newest.event_id)
        self.deleted_rows += len(doomed)
        if choice.deleted_to is not None:
            self.deleted_to = max(self.deleted_to or 0, choice.deleted_to)
        return RetentionBatch(len(doomed), choice.last_seq, choice.done)

    def _fence_seq(self, key: bytes) -> int | None:
        """``Prune._fence_seq``: the fence id's row, else the first id after it."""
        at = [row.seq for row in self.rows.values() if row.key == key]
        if at:
            return min(at)
        after = [row for row in self.rows.values() if row.key is not None and row.key > key]
        if not after:
            return None
        first = min(row.key for row in after)  # type: ignore[type-var]
        return min(row.seq for row in after if row.key == first)

    async def gap_summary(self, stream: str, id_order: str) -> GapSummary:
        return summarize(list(self.gaps.values()), self.order)

    async def get_checkpoint(self, stream: str) -> CheckpointState | None:
        return CheckpointState(stream=stream, lagging_id=self.lagging_id)

    def advance(self, *, window: float, now: datetime) -> None:
        """The checkpoint schedule's run: newest id received a window ago, gap-capped."""
        cutoff = now - timedelta(seconds=window)
        candidate = None
        for _, event_id in reversed(self._keys):  # newest first
            if self.rows[(event_id, 0)].received_at <= cutoff:
                candidate = event_id
                break
        target, _, _ = lagging_target(candidate, self.open_gaps(), self.order)
        if is_newer(target, self.lagging_id, self.order):
            self.lagging_id = target

    def newest_at_or_before(self, when: datetime) -> str | None:
        best = None
        for (event_id, ordinal), row in self.rows.items():
            if event_id and ordinal == 0 and row.received_at <= when:
                if is_newer(event_id, best, self.order):
                    best = event_id
        return best

    def stored_numbers(self) -> set[int]:
        """Ids stored once: still stored, or deleted by retention after."""
        numbers = set(self.deleted)
        for event_id, ordinal in self.rows:
            number = contiguous_number(event_id)
            if number is not None and ordinal == 0:
                numbers.add(number)
        return numbers


class MemoryRedis:
    """L2 as the Lua script keeps it: forward-only per stream (faults may rewind it)."""

    def __init__(self, order: str) -> None:
        self.order = order
        self.values: dict[str, str] = {}

    async def get(self, stream: str) -> str | None:
        return self.values.get(stream)

    def submit(self, stream: str, event_id: str, id_order: str) -> None:
        if is_newer(event_id, self.values.get(stream), self.order):
            self.values[stream] = event_id


class MemoryWorkers:
    """``sse_workers`` (:mod:`durable_sse.log.workers`): each attempt's worker lease, live
    until the watchdog takes that worker for dead and revokes it (``World.crash``)."""

    def __init__(self) -> None:
        self.states: dict[str, WorkerState] = {}

    def acquire(self, worker_id: str) -> None:
        self.states[worker_id] = WorkerState.LIVE

    def revoke(self, worker_id: str) -> None:
        self.states[worker_id] = WorkerState.REVOKED

    def is_revoked(self, worker_id: str | None) -> bool:
        """The oracle's view (whatever the fence answers)."""
        return worker_id is not None and self.states.get(worker_id) == WorkerState.REVOKED

    def revoked_among(self, worker_ids: Iterable[str]) -> set[str]:
        """The fence every commit reads last, as :func:`durable_sse.log.workers.revoked_among`
        answers it: the workers that may not commit (revoked, or holding no lease)."""
        live = (WorkerState.LIVE, WorkerState.LEFT)
        return {w for w in set(worker_ids) if self.states.get(w) not in live}
