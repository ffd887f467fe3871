"""Group commit ordering and failure rules, with a plain writer (no database).

The writer stands in for a transaction: it "writes" its jobs, waits its turn, and then
records the commit; the real transactions are tested in tests/log/test_writes.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from durable_sse.errors import StoreError
from durable_sse.log.commits import CommitGroup, CommitJob, CommitQueue


class RecordingWriter:
    """Commits groups into ``committed`` (a list of payloads, in commit order)."""

    def __init__(self) -> None:
        self.committed: list[str] = []
        self.inserted: list[str] = []
        self.groups: list[list[str]] = []
        self.fail: set[str] = set()
        """Payloads whose transaction raises before committing."""
        self.delay: dict[str, float] = {}
        """Seconds a payload takes to write (before the group waits its turn)."""
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, group: CommitGroup) -> None:
        self.gate.wait()
        while jobs := [job for job in group.jobs if not job.failed]:
            with self.lock:
                self.groups.append([job.payload for job in jobs])
            time.sleep(sum(self.delay.get(job.payload, 0.0) for job in jobs))
            if any(job.payload in self.fail for job in jobs):
                raise RuntimeError("transaction failed")
            group.wait_for_previous_rows()
            with self.lock:
                self.inserted.extend(job.payload for job in jobs)
            if group.wait_turn():
                with self.lock:  # rolled back: write the rest again
                    del self.inserted[-len(jobs) :]
                continue
            group.rows_written.set()
            with self.lock:
                self.committed.extend(job.payload for job in jobs)
            for job in jobs:
                job.new_rows = job.rows
            return


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=8)
    yield pool
    pool.shutdown(wait=True)


async def outcome(job: CommitJob) -> int | str:
    try:
        return await job.future
    except Exception as error:  # noqa: BLE001 - the error is the outcome under test
        return type(error).__name__


async def test_batches_waiting_for_a_lane_share_one_transaction(
    executor: ThreadPoolExecutor,
) -> None:
    writer = RecordingWriter()
    queue = CommitQueue(writer, executor, lanes=1, max_group_rows=1000)
    writer.gate.clear()
    jobs = [queue.submit(f"s{i}", f"s{i}", 1) for i in range(50)]
    assert queue.waiting == 49  # the first one holds the only lane
    writer.gate.set()
    assert await asyncio.gather(*(job.future for job in jobs)) == [1] * 50
    assert writer.groups == [["s0"], [f"s{i}" for i in range(1, 50)]]
    assert writer.committed == [f"s{i}" for i in range(50)]


async def test_a_group_takes_at_most_max_group_rows_but_a_big_batch_goes_whole(
    executor: ThreadPoolExecutor,
) -> None:
    writer = RecordingWriter()
    queue = CommitQueue(writer, executor, lanes=1, max_group_rows=10)
    writer.gate.clear()
    sizes = {"a": 1, "b": 6, "c": 6, "big": 25, "d": 2}
    jobs = [queue.submit("s", name, rows) for name, rows in sizes.items()]
    writer.gate.set()
    await asyncio.gather(*(job.future for job in jobs))
    assert writer.groups == [["a"], ["b"], ["c"], ["big"], ["d"]]


async def test_commits_follow_submission_order_whatever_the_lane_speed(
    executor: ThreadPoolExecutor,
) -> None:
    """A fast lane dispatched later waits for a slow lane dispatched earlier."""
    writer = RecordingWriter()
    writer.delay = {"slow": 0.3}
    queue = CommitQueue(writer, executor, lanes=3, max_group_rows=1)
    jobs = [queue.submit("s", name, 1) for name in ("slow", "fast1", "fast2")]
    await asyncio.gather(*(job.future for job in jobs))
    assert writer.inserted == ["slow", "fast1", "fast2"]
    assert writer.committed == ["slow", "fast1", "fast2"]


async def test_a_batch_after_a_failed_one_is_left_out_and_others_commit(
    executor: ThreadPoolExecutor,
) -> None:
    writer = RecordingWriter()
    writer.fail = {"s:1"}
    writer.delay = {"s:1": 0.1}
    queue = CommitQueue(writer, executor, lanes=2, max_group_rows=1000)
    first = queue.submit("s", "s:1", 1)
    # Both wait behind the first lane's group and share the second lane's transaction.
    writer.gate.clear()
    second = queue.submit("s", "s:2", 1, after=first)
    other = queue.submit("t", "t:1", 1)
    third = queue.submit("s", "s:3", 1, after=second)
    writer.gate.set()
    results = [await outcome(job) for job in (first, second, other, third)]
    assert results == ["RuntimeError", "StoreError", 1, "StoreError"]
    assert writer.committed == ["t:1"]
    with pytest.raises(StoreError, match="batch before it failed"):
        await second.future


async def test_a_failed_group_still_finishes_after_the_groups_before_it(
    executor: ThreadPoolExecutor,
) -> None:
    """Otherwise a group dispatched after the failed one could commit ahead of an
    earlier, slower group."""
    writer = RecordingWriter()
    writer.delay = {"slow": 0.3}
    writer.fail = {"broken"}
    queue = CommitQueue(writer, executor, lanes=2, max_group_rows=1)
    slow = queue.submit("a", "slow", 1)
    broken = queue.submit("b", "broken", 1)
    await asyncio.sleep(0.05)
    assert not broken.future.done()  # failed, but waits for "slow" to finish
    later = queue.submit("c", "later", 1)
    assert await outcome(broken) == "RuntimeError"
    assert slow.future.done()
    await later.future
    assert writer.committed == ["slow", "later"]


async def test_after_a_committed_batch_is_no_dependency(executor: ThreadPoolExecutor) -> None:
    writer = RecordingWriter()
    queue = CommitQueue(writer, executor, lanes=1, max_group_rows=10)
    first = queue.submit("s", "s:1", 1)
    await first.future
    second = queue.submit("s", "s:2", 1, after=first)
    assert second.after is None
    assert await second.future == 1
