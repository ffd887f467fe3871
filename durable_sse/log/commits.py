"""Group commit: many batches, few transactions, and commits in submission order.

Why: at 1 ev/s a thousand streams each commit a one-event batch, and a transaction per
event (a pool checkout, a thread hop and an fsync each) queues behind the database
threads; a hot stream that waits for its previous commit before writing the next batch
leaves the worker idle while PostgreSQL maintains the indexes, and the reverse.

Here a *lane* (one database thread holding one transaction) takes every batch waiting
when it becomes free, writes them all and commits once. Several lanes write at the same
time, but each commits only after the lane dispatched before it has finished, so what is
durable is always a prefix of what was submitted. A batch submitted ``after`` another
(the previous batch of the same connection) is never committed if that one failed: the
newest id in the log (the floor) must never point past a batch that is missing.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from durable_sse.errors import StoreError


@dataclass(eq=False)
class CommitJob:
    """One batch waiting for (or in) a group transaction."""

    stream: str
    payload: Any
    """What the writer needs to write the batch (opaque here)."""
    rows: int
    after: CommitJob | None
    """Must commit first (same transaction or an earlier one), or this job fails."""
    future: asyncio.Future[int]
    failed: bool = False
    error: BaseException | None = None
    """Why this job alone failed while the rest of its group committed (None: it did
    not, or the whole group failed)."""
    new_rows: int = 0
    reused: list[str] = field(default_factory=list)
    """Ids of the batch kept although stored with other data (a reused id: see
    ``durable_sse.log.keys``); their rows are in ``new_rows``."""
    dropped: Any = None
    """What the writer left out of the batch on purpose, and why (opaque here)."""


@dataclass(eq=False)
class CommitGroup:
    """The jobs one lane writes in one transaction."""

    jobs: list[CommitJob]
    previous: CommitGroup | None
    finished: threading.Event = field(default_factory=threading.Event)
    """Set when this group and every earlier one have committed or failed."""
    rows_written: threading.Event = field(default_factory=threading.Event)
    """Set when this group's rows are in the log, for good (to be committed), or it failed."""

    def wait_for_previous_rows(self) -> None:
        """Block until the previous group's rows are in: rows (and their ``seq``) enter
        the log in submission order, so a stream's events keep their order."""
        if self.previous is not None:
            self.previous.rows_written.wait()

    def wait_turn(self) -> list[CommitJob]:
        """Block until every earlier group has finished; returns the jobs that must be
        left out because a batch they come after was not committed.

        Called by the writer inside its transaction, just before it commits.
        """
        if self.previous is not None:
            self.previous.finished.wait()
            self.previous = None  # let finished groups be collected
        left_out = []
        for job in self.jobs:
            if not job.failed and job.after is not None and job.after.failed:
                job.failed = True  # transitively: later jobs that come after this one
                left_out.append(job)
        return left_out


GroupWriter = Callable[[CommitGroup], None]
"""Writes the group's jobs that have not failed in one transaction: prepares them, calls
``group.wait_for_previous_rows()``, inserts, calls ``group.wait_turn()`` (if that leaves
jobs out: roll back and write the rest again), sets ``group.rows_written`` and commits.
Sets ``new_rows`` (and ``reused``) on each committed job; raises if the transaction fails
(every job of the group then fails), or sets ``failed`` and ``error`` on the jobs that
failed while the others committed (a batch that fails for its own data is retried alone)."""


class CommitQueue:
    """Dispatches submitted batches to at most ``lanes`` concurrent group transactions.

    Lives on one event loop; the writer runs in ``executor`` (which needs at least
    ``lanes`` threads, as lanes wait for each other).
    """

    def __init__(
        self,
        writer: GroupWriter,
        executor: Executor,
        *,
        lanes: int,
        max_group_rows: int,
    ) -> None:
        self._writer = writer
        self._executor = executor
        self._lanes = lanes
        self._max_group_rows = max_group_rows
        self._waiting: deque[CommitJob] = deque()
        self._busy = 0
        self._last_group: CommitGroup | None = None
        self.transactions = 0
        """Group transactions finished so far (committed or not): batches / this = the
        grouping achieved."""

    @property
    def waiting(self) -> int:
        """Batches not yet taken by a lane."""
        return len(self._waiting)

    def submit(
        self, stream: str, payload: Any, rows: int, *, after: CommitJob | None = None
    ) -> CommitJob:
        """Queue a batch now (submission order is commit order); await ``job.future``."""
        loop = asyncio.get_running_loop()
        if after is not None and after.future.done() and not after.failed:
            after = None  # committed: nothing left to wait for
        job = CommitJob(
            stream=stream, payload=payload, rows=rows, after=after, future=loop.create_future()
        )
        self._waiting.append(job)
        self._dispatch()
        return job

    def _dispatch(self) -> None:
        while self._waiting and self._busy < self._lanes:
            jobs = [self._waiting.popleft()]
            rows = jobs[0].rows
            while self._waiting and rows + self._waiting[0].rows <= self._max_group_rows:
                job = self._waiting.popleft()
                rows += job.rows
                jobs.append(job)
            group = CommitGroup(jobs=jobs, previous=self._last_group)
            self._last_group = group
            self._busy += 1
            done = asyncio.wrap_future(self._executor.submit(self._write, group))
            done.add_done_callback(functools.partial(self._finished, group))

    def _write(self, group: CommitGroup) -> None:
        try:
            self._writer(group)
        except BaseException:
            for job in group.jobs:
                job.failed = True  # nothing of the group committed
            raise
        finally:
            # "finished" means this group and every earlier one: a group that failed
            # early still waits, so no later group commits ahead of an earlier one.
            previous = group.previous
            if previous is not None:
                previous.finished.wait()
                group.previous = None
            group.rows_written.set()
            group.finished.set()

    def _finished(self, group: CommitGroup, done: asyncio.Future[None]) -> None:
        self._busy -= 1
        self.transactions += 1
        if self._last_group is group:
            self._last_group = None
        error = done.exception() if not done.cancelled() else StoreError("commit cancelled")
        for job in group.jobs:
            job.after = None
            if job.future.done():
                continue
            if error is not None:
                job.future.set_exception(error)
            elif job.error is not None:
                job.future.set_exception(job.error)
            elif job.failed:
                job.future.set_exception(_left_out(job))
            else:
                job.future.set_result(job.new_rows)
        self._dispatch()


def _left_out(job: CommitJob) -> StoreError:
    return StoreError(
        f"a batch of stream {job.stream!r} was not committed because the batch before it "
        "failed; it is read again from the last committed cursor"
    )
