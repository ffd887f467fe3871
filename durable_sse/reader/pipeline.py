"""A connection's batches in flight: submitted in reading order, applied in commit order.

Why a pipeline: the next batch is written while the previous one commits (group commit,
:mod:`durable_sse.log.commits`), so a busy stream keeps the database and the reader both
busy. Why the order: a cursor may never point past an event that is not committed, nor
past a drop signal whose gap is not recorded (invariants 1 and 5). So each batch is
submitted *after* the one before it (the writer never commits it if that one failed), and
what a commit moves (the intake's cursor, then L1, then L2) is applied batch by batch in
submission order, however the commits interleave with the reading.

The pipeline does no waiting of its own: :meth:`CommitPipeline.settle` applies every
finished batch at the head of the line, and the caller decides when to wait. The read
activity settles as each commit lands and waits when too many are in flight; the
simulation commits them one at a time at moments its scheduler picks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from durable_sse.log.records import EventRecord, InsertResult
from durable_sse.reader.intake import CommitBatch
from durable_sse.reader.session import Committed, ReadSession

MAX_BATCHES_IN_FLIGHT = 3
"""Batches of one connection committing at once (they commit in order): the next batch
is written while the previous one commits."""


class BatchWriter(Protocol):
    """Where batches go (:class:`durable_sse.log.writer.Writer`, or the simulation's
    memory store): a submitted batch commits after the one it comes ``after``, or not at
    all."""

    def submit_batch(
        self,
        stream: str,
        id_order: str,
        events: Sequence[EventRecord],
        *,
        after: Any = None,
        gap_changes: Sequence[object] = (),
        worker_id: str | None = None,
    ) -> Any: ...

    def finished(self, job: Any) -> bool:
        """Whether the job committed or failed."""
        ...

    def result(self, job: Any) -> InsertResult:
        """What a finished job did; raises its failure."""
        ...


CursorSink = Callable[[str, str, str], object]
"""``(stream, cursor, id_order)``: a cursor cache a commit moves (L1's ``advance``, then
L2's ``submit``, which coalesces and never blocks the stream)."""


@dataclass(frozen=True)
class Settled:
    """One batch whose commit the pipeline applied."""

    batch: CommitBatch
    inserted: InsertResult
    moved: Committed
    seconds: float | None
    """From its submission to its commit being applied (None: nothing was written)."""


@dataclass(eq=False)
class _InFlight:
    batch: CommitBatch
    job: Any
    """The writer's job (None: nothing to write, the batch only moves the cursor)."""
    submitted: float = field(default_factory=time.monotonic)


class CommitPipeline:
    """The batches one connection has submitted and not yet applied.

    Args:
        session: the connection whose intake cut the batches.
        writer: where they are written.
        cursors: where a moved cursor goes, in this order (L1, then L2).
        on_settled: told of every batch applied (metrics, heartbeats, the simulation's
            checks), after the cursors moved.
    """

    def __init__(
        self,
        session: ReadSession,
        writer: BatchWriter,
        *,
        cursors: Sequence[CursorSink] = (),
        on_settled: Callable[[Settled], None] | None = None,
        max_in_flight: int = MAX_BATCHES_IN_FLIGHT,
        worker_id: str | None = None,
    ) -> None:
        self.session = session
        self.writer = writer
        self.worker_id = worker_id
        """The worker lease every batch is written under (the fence; None: none)."""
        self.cursors = tuple(cursors)
        self.on_settled = on_settled
        self.max_in_flight = max_in_flight
        self.in_flight: deque[_InFlight] = deque()
        self.failure: BaseException | None = None
        """The first batch that failed (nothing after it is applied)."""
        self._last_job: Any = None

    @property
    def full(self) -> bool:
        """As many batches in flight as allowed: wait for the oldest before submitting."""
        return len(self.in_flight) >= self.max_in_flight

    @property
    def oldest_job(self) -> Any:
        """The writer's job at the head of the line (None: nothing written there)."""
        return self.in_flight[0].job if self.in_flight else None

    def submit(self, batch: CommitBatch) -> None:
        """Queue a batch for commit now; it commits after the ones before it.

        A batch with nothing to write (a replay's stored events, skipped) has no
        transaction of its own: its cursor moves once the batches before it committed.
        """
        job = None
        if batch.records or batch.gap_changes:
            job = self.writer.submit_batch(
                self.session.stream,
                self.session.order,
                batch.records,
                after=self._last_job,
                gap_changes=batch.gap_changes,
                worker_id=self.worker_id,
            )
            self._last_job = job
        self.in_flight.append(_InFlight(batch, job))

    def submit_ready(self) -> None:
        """Submit every batch the intake has cut, whatever is in flight (the flush)."""
        ready = self.session.started.ready
        while ready:
            self.submit(ready.popleft())

    def settle(self) -> list[Settled]:
        """Apply every finished batch at the head of the line, in order; returns them.

        Stops at a batch that failed and keeps its error in :attr:`failure` (raised by
        :meth:`check`): no cursor moves past it, and the writer fails every batch
        submitted after it.
        """
        applied: list[Settled] = []
        while self.in_flight and self.failure is None:
            head = self.in_flight[0]
            if head.job is not None and not self.writer.finished(head.job):
                break
            try:
                inserted = (
                    self.writer.result(head.job)
                    if head.job is not None
                    else InsertResult(new_rows=0, duplicates=0)
                )
            except BaseException as error:  # noqa: BLE001 - kept, raised by check()
                self.failure = error
                break
            self.in_flight.popleft()
            moved = self.session.committed(head.batch, inserted)
            if moved.cursor is not None:
                for advance in self.cursors:
                    advance(self.session.stream, moved.cursor, self.session.order)
            seconds = time.monotonic() - head.submitted if head.job is not None else None
            settled = Settled(head.batch, inserted, moved, seconds)
            applied.append(settled)
            if self.on_settled is not None:
                self.on_settled(settled)
        return applied

    def check(self) -> None:
        """Raise the first failure, if a batch failed."""
        if self.failure is not None:
            raise self.failure

    def abandon(self) -> None:
        """The process died: what is in flight is never applied (its jobs may still
        commit in the store, as a dead worker's last transaction may)."""
        self.in_flight.clear()
