"""The write path: a connection's batches into ``sse_events``, group-committed.

The log is the system of record: a batch is committed before any cursor moves past it
(invariant 1), and every event is keyed ``(stream, event_id, follower_key)`` (see
:mod:`durable_sse.log.keys`) so that replays are absorbed by ``ON CONFLICT DO NOTHING``
(invariant 2); an event whose key is stored with another type or data (a server that
restarted its id counter) is no re-send, and is kept under an extended key
(:mod:`durable_sse.log.reused`). Batches are group-committed
(:mod:`durable_sse.log.commits`): one transaction takes every batch waiting, from any
stream, and commits follow submission order; how the rows go in is
:mod:`durable_sse.log.staging`'s business.

A batch may carry work that must commit with it (the gap changes a reader derived from
it, invariant 5): the writer hands it to the :data:`BatchHook` it was built with, inside
the batch's own transaction, so no cursor passes a drop signal before its gap record is
durable, and the log never imports the gap.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from durable_sse.errors import BatchRefusedError
from durable_sse.ids import IdOrder
from durable_sse.log.commits import CommitGroup, CommitJob, CommitQueue
from durable_sse.log.database import Database, driver, error_summary, outlast_cancellation
from durable_sse.log.records import BatchPayload, EventRecord, HorizonDrop, InsertResult
from durable_sse.log.schema import EVENTS_CHANNEL, STREAM_LOCK_CLASS, stream_lock_key
from durable_sse.log.staging import RowInserter
from durable_sse.log.workers import WorkerLeaseLostError, revoked_among

logger = logging.getLogger(__name__)

MAX_GROUP_ROWS = 5000
"""Rows one group transaction takes (a larger batch still goes in whole, alone)."""
BatchHook = Callable[[Connection, str, BatchPayload, int], None]
"""``(connection, stream, payload, new_rows)``: work a batch carries that must commit in
its transaction (the gap store applies the batch's gap changes), called after its rows
are inserted, for each batch that carries gap changes."""
_UNSTORABLE_TEXT = (UnicodeEncodeError, psycopg.DataError)
_BATCH_FAULTS = ("22", "23", "54", "P0")
"""SQLSTATE classes an error of one batch's own making raises: data exception,
integrity constraint, program limit (a key too large for its index), a PL/pgSQL
``RAISE`` (a trigger that refuses rows)."""


class Writer:
    """Persists batches of events, in submission order, a group transaction at a time.

    Lives on one event loop (batches are submitted from it); the transactions run in the
    database's threads. Failures surface as :class:`~durable_sse.errors.StoreError` on the
    batch's wait, or :class:`~durable_sse.errors.BatchRefusedError` for a batch the
    database refused for its own data (the other batches of its group commit).
    """

    def __init__(self, database: Database, *, in_transaction: BatchHook | None = None) -> None:
        self._database = database
        self._in_transaction = in_transaction
        self._inserter = RowInserter(database)
        self.optimistic_copy = True
        """PostgreSQL: COPY a large group whose ids all sort after what is stored straight
        into ``sse_events`` (see :meth:`RowInserter.stage`); False: always through the
        staging table (benchmarks compare both)."""
        self.order_commits = True
        """PostgreSQL: a group transaction locks its streams before writing their rows, so
        each stream's rows become visible in ``seq`` order even with two writers (see
        :meth:`_order_and_notify`). Only benchmarks turn it off, to measure its cost."""
        self.notify_commits = True
        """PostgreSQL: a group transaction notifies each stream it writes once
        (:data:`~durable_sse.log.schema.EVENTS_CHANNEL`). Only benchmarks turn it off."""
        self.optimistic_fallbacks = 0
        """Optimistic COPYs that met a stored key and were written again through staging."""
        self._commits = CommitQueue(
            self._write_group_guarded,
            database.commit_executor,
            lanes=database.commit_lanes,
            max_group_rows=MAX_GROUP_ROWS,
        )

    @property
    def dialect(self) -> str:
        return self._database.dialect

    @property
    def commits(self) -> CommitQueue:
        """The group-commit queue (its counters tell how well batches were grouped)."""
        return self._commits

    @property
    def direct_copies(self) -> int:
        """Groups COPYed straight into ``sse_events`` and committed."""
        return self._inserter.direct_copies

    def submit_batch(
        self,
        stream: str,
        id_order: str,
        events: Sequence[EventRecord],
        *,
        after: CommitJob | None = None,
        gap_changes: Sequence[object] = (),
        worker_id: str | None = None,
    ) -> CommitJob:
        """Queue a batch (and the gap changes it carries) for the next group commit.

        Batches commit in the order they are submitted; one submitted ``after`` another
        is left out (its future fails) if that one was not committed. Await the result
        with :meth:`committed`. A batch may hold gap changes and no events. ``worker_id``:
        the worker lease the batch is written under; a revoked one fails the batch with
        :class:`~durable_sse.log.workers.WorkerLeaseLostError`.
        """
        self._database.refuse_if_closed("insert events")
        payload = BatchPayload(IdOrder(id_order), events, tuple(gap_changes), worker_id)
        return self._commits.submit(stream, payload, len(events), after=after)

    async def committed(self, job: CommitJob) -> InsertResult:
        """Wait for a submitted batch to commit; cancelling the wait leaves the batch be."""
        await outlast_cancellation(job.future)
        return self.result(job)

    def finished(self, job: CommitJob) -> bool:
        """Whether the batch committed or failed (its :meth:`result` is known)."""
        return job.future.done()

    def result(self, job: CommitJob) -> InsertResult:
        """What a batch whose wait is over did (raises its failure, if it failed)."""
        new_rows = job.future.result()
        drop = job.dropped
        reused = tuple(job.reused)
        if not isinstance(drop, HorizonDrop) or not drop.count:
            return InsertResult(new_rows=new_rows, duplicates=job.rows - new_rows, reused=reused)
        return InsertResult(
            new_rows=new_rows,
            duplicates=job.rows - new_rows - drop.count,
            reused=reused,
            dropped_by_horizon=drop.count,
            dropped_id=drop.first_id,
            horizon_id=drop.horizon_id,
        )

    async def insert_batch(
        self, stream: str, id_order: str, events: Sequence[EventRecord]
    ) -> InsertResult:
        """Persist a batch (committed when this returns); already stored events are skipped."""
        if not events:
            return InsertResult(new_rows=0, duplicates=0)
        return await self.committed(self.submit_batch(stream, id_order, events))

    def _write_group_guarded(self, group: CommitGroup) -> None:
        streams = sorted({job.stream for job in group.jobs})
        what = f"stream {streams[0]!r}" if len(streams) == 1 else f"{len(streams)} streams"
        self._database.guarded(f"insert events of {what}", self._write_group, group)

    def _write_group(self, group: CommitGroup) -> None:
        """One transaction for every batch of the group that has not been left out.

        Rows are prepared (and COPYed into the staging table) while earlier groups still
        work; they enter ``sse_events`` only after the previous group's rows did, so
        ``seq`` follows submission order, and the commit waits for the previous group's
        commit. When the transaction fails for what one batch holds (invariant 7: a
        trigger, a constraint, a value the database refuses), each batch is written
        again alone: the others commit, the bad one fails with its own error.
        """
        clean = False
        optimistic = self.optimistic_copy and self.dialect == "postgresql"
        while jobs := [job for job in group.jobs if not job.failed]:
            try:
                self._write_jobs(group, jobs, clean=clean, optimistic=optimistic)
            except _Rewrite:
                continue
            except Exception as error:
                if optimistic and isinstance(error, psycopg.errors.UniqueViolation):
                    # A COPY straight into the log met a stored key (two attempts writing
                    # at once, another worker, ids out of order): write the group again
                    # through staging, and look the streams' newest ids up afresh.
                    optimistic = False
                    self.optimistic_fallbacks += 1
                    for job in jobs:
                        self._inserter.newest.pop(job.stream, None)
                    continue
                if isinstance(error, _UNSTORABLE_TEXT) and not clean:
                    # Lone surrogates (no SSE stream carries them, a caller of the API
                    # can): data keeps them exactly in data_bytes, ids and types get
                    # U+FFFD rather than wedge the stream on them. Loud, never silent.
                    logger.warning(
                        "a batch holds characters the database cannot store as text, "
                        "writing it again with data in data_bytes and U+FFFD in ids and "
                        "types (%s)",
                        error_summary(error),
                    )
                    clean = True
                    continue
                if not _fault_of_a_batch(error):
                    raise
                if len(jobs) == 1:
                    self._refuse(jobs[0], error)  # the same message as in a group
                else:
                    self._write_alone(group, jobs, error, clean=clean)
            return

    def _refuse(self, job: CommitJob, error: BaseException) -> None:
        """Fail one batch that the database refused for its own data, loudly."""
        logger.warning(
            "stream %s: the database refused a batch (%s); the other batches of its "
            "group, if any, were written without it",
            job.stream,
            error_summary(error),
        )
        job.failed = True
        job.error = BatchRefusedError(
            f"{self._database.where} refused a batch of stream {job.stream!r}: "
            f"{error_summary(error)} (the other streams' batches of its group, if any, committed)"
        )
        job.error.__cause__ = error

    def _write_jobs(
        self,
        group: CommitGroup,
        jobs: list[CommitJob],
        *,
        clean: bool,
        optimistic: bool = False,
        rows_written: bool = True,
    ) -> None:
        """Write ``jobs`` in one transaction (see :data:`durable_sse.log.commits.GroupWriter`);
        raises ``_Rewrite`` when some of them must be left out."""
        newest: dict[str, bytes] = {}
        dropped: list[HorizonDrop | None] = []
        with self._database.begin() as connection:
            insert = self._inserter.stage(
                connection,
                jobs,
                clean=clean,
                optimistic=optimistic,
                newest=newest,
                dropped=dropped,
            )
            group.wait_for_previous_rows()
            self._order_and_notify(connection, jobs)
            counts, reused = insert()
            for job, count in zip(jobs, counts, strict=True):
                payload = job.payload
                if payload.gap_changes and self._in_transaction is not None:
                    self._in_transaction(connection, job.stream, payload, count)
            if self._fenced(connection, jobs):
                # Read last, right before the commit, so that a worker paused in the
                # middle of this transaction is the only way a revoked one commits.
                raise _Rewrite  # roll back: batches of a revoked worker must not commit
            if group.wait_turn():
                raise _Rewrite  # roll back: some batches must not commit
            if rows_written:
                group.rows_written.set()
        for index, (job, count, drop) in enumerate(zip(jobs, counts, dropped, strict=True)):
            job.new_rows = count
            job.dropped = drop
            if reused is not None:
                job.reused = reused[index]
        for stream, key in newest.items():
            # Only streams whose newest id was looked up (and not forgotten since, by a
            # fallback): a hint built from this process's commits alone would miss what
            # another worker wrote.
            hints = self._inserter.newest
            known = hints.get(stream, _UNKNOWN)  # lanes share it: no check-then-get
            if known is not _UNKNOWN and (known is None or key > known):
                hints[stream] = key

    def _fenced(self, connection: Connection, jobs: list[CommitJob]) -> bool:
        """Fail the jobs whose worker lease was revoked (the fence); True if any."""
        revoked = revoked_among(connection, {j.payload.worker_id for j in jobs} - {None})
        if not revoked:
            return False
        for job in jobs:
            if job.payload.worker_id in revoked:
                job.failed = True
                job.error = WorkerLeaseLostError(
                    f"stream {job.stream!r}: a batch was not committed because worker lease "
                    f"{job.payload.worker_id} was revoked (the worker was taken for dead and "
                    "its streams moved to others)"
                )
        return True

    def _order_and_notify(self, connection: Connection, jobs: list[CommitJob]) -> None:
        """PostgreSQL: lock the group's streams, and queue one ``NOTIFY`` per stream.

        Why the lock: ``seq`` comes from one sequence shared by every stream and is taken
        as a row is inserted, long before its commit. Two writers of one stream (a retried
        attempt and its predecessor, two workers during a handover) could otherwise
        commit a later ``seq`` first, and a consumer reading ``seq > position`` would pass
        the earlier one for good. A transaction-scoped advisory lock per stream, taken
        before any row of the stream is inserted and held to the commit, makes a stream's
        rows enter and become visible in ``seq`` order across processes (within one
        process the commit queue already does). Gap markers are placed under it too.

        Why it cannot deadlock: the locks are taken in one statement, in key order, so
        two transactions never wait for each other's locks in a cycle; and they are taken
        only after :meth:`CommitGroup.wait_for_previous_rows`, so while a transaction
        holds them the one in-process wait left (``wait_turn``: the previous group's
        commit) is for a transaction that has taken all its locks, written all its rows
        and is committing, which waits for no lock of anyone's. A cycle through an
        in-process wait, which PostgreSQL could not detect, therefore cannot form.

        The ``NOTIFY`` (delivered on commit, dropped on rollback, deduplicated per
        transaction) wakes consumers (:mod:`durable_sse.consume.wakeup`); it rides the
        same statement, so a group pays one round trip for both.
        """
        if self.dialect != "postgresql" or not (self.order_commits or self.notify_commits):
            return
        streams = sorted(
            {job.stream for job in jobs}, key=lambda name: (stream_lock_key(name), name)
        )
        calls = []
        if self.order_commits:
            calls.append("count(pg_advisory_xact_lock(%s, t.k))")
        if self.notify_commits:
            calls.append("count(pg_notify(%s, t.s))")
        params: list[Any] = []
        if self.order_commits:
            params.append(STREAM_LOCK_CLASS)
        if self.notify_commits:
            params.append(EVENTS_CHANNEL)
        params += [[stream_lock_key(name) for name in streams], streams]
        with driver(connection).cursor() as cursor:
            # unnest yields the arrays in order: the locks are taken in key order.
            cursor.execute(
                f"SELECT {', '.join(calls)} FROM unnest(%s::int4[], %s::text[]) AS t(k, s)",
                params,
            )

    def _write_alone(
        self, group: CommitGroup, jobs: list[CommitJob], error: Exception, *, clean: bool
    ) -> None:
        """Write each batch of a failed group in a transaction of its own, in order.

        A batch that fails for its own data gets its error and is not committed (nor is
        any batch submitted after it); an error that is no batch's fault (the database
        went away) fails the batches not yet written, and only those.
        """
        logger.warning(
            "a group transaction of %d batches failed (%s): writing each batch alone",
            len(jobs),
            error_summary(error),
        )
        for index, job in enumerate(jobs):
            while not job.failed:
                try:
                    self._write_jobs(group, [job], clean=clean, rows_written=False)
                    break
                except _Rewrite:
                    continue  # a later batch was left out; write this one again
                except Exception as own:
                    if not _fault_of_a_batch(own):
                        failure = self._database.store_error(
                            own, f"insert events of stream {job.stream!r}"
                        )
                        for rest in jobs[index:]:
                            if not rest.failed:
                                rest.failed, rest.error = True, failure
                        return
                    self._refuse(job, own)


def _fault_of_a_batch(error: BaseException) -> bool:
    """Whether a failed group transaction may be the doing of one batch's rows (so
    writing each batch alone lets the others commit), not of the database or the
    connection (then every batch would fail alone as well, one timeout after another)."""
    if isinstance(error, sa.exc.DBAPIError):
        if error.connection_invalidated or error.statement is None:
            return False
        if error.orig is None:
            return False
        error = error.orig
    if isinstance(error, UnicodeEncodeError | sqlite3.IntegrityError | sqlite3.DataError):
        return True
    if isinstance(error, psycopg.Error):
        return (error.sqlstate or "")[:2] in _BATCH_FAULTS
    return False


_UNKNOWN: Any = object()
"""A stream absent from ``RowInserter.newest``."""


class _Rewrite(Exception):
    """Roll back a group transaction to write it again without the batches left out."""
