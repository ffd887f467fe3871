"""A worker's lease, renewed from a thread of its own.

The lease says that the process is alive. Renewed from the event loop, it said something
else too: that the loop was not too busy. At 1,000 streams a survivor opening hundreds of
connections while it stored 1,500 events a second renewed more than a lease late, and the
other worker, as starved, took it for dead; then it took the other for dead in turn, and
the streams moved back and forth for minutes. A thread renews on time however busy the
loop, and a process that is killed or paused (SIGSTOP, a frozen VM, a GC pause that holds
the GIL) stops it with everything else.

A loop that is wedged for good (a blocking call on it, a deadlock) must still lose its
lease, or its streams would never move: the thread renews only while the loop answers it
within :data:`LOOP_STALL_LIMIT`. Kafka's consumer separates the same two things, its
heartbeat thread and ``max.poll.interval.ms``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from durable_sse.errors import StoreError
from durable_sse.log.workers import RENEW_INTERVAL, WorkerLeases

logger = logging.getLogger(__name__)

LOOP_STALL_LIMIT = 15.0
"""Seconds the event loop may go without answering before the lease is left to lapse
(three leases: a burst of starts stalls it for seconds, never this long)."""


class LeaseKeeper:
    """Renews one lease at a time (:meth:`keep`) every ``interval`` seconds, in a daemon
    thread, while the event loop it was started from answers.

    What the loop reads, each a single attribute (set by the thread, read by the loop):
    :attr:`healthy_since` and :meth:`take_lost`.
    """

    def __init__(
        self,
        leases: WorkerLeases,
        *,
        interval: float = RENEW_INTERVAL,
        stall_limit: float = LOOP_STALL_LIMIT,
    ) -> None:
        self.leases = leases
        self.interval = interval
        self.stall_limit = stall_limit
        self.healthy_since: float | None = None
        """Since when every renewal succeeded (monotonic; None: the last one failed, or
        the loop stalled)."""
        self._lock = threading.Lock()
        self._worker_id: str | None = None
        self._lost: str | None = None
        self._answered = self._looked = time.monotonic()
        self._stalled = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def worker_id(self) -> str | None:
        """The lease being renewed (None: none, or it was found revoked)."""
        return self._worker_id

    def keep(self, worker_id: str) -> None:
        """Renew ``worker_id`` from now on, instead of any lease before it."""
        with self._lock:
            self._worker_id, self._lost = worker_id, None
        self.healthy_since = time.monotonic()

    def take_lost(self) -> str | None:
        """A lease the thread found revoked since the last call (the loop ends its
        connections and takes a new one), or None."""
        with self._lock:
            lost, self._lost = self._lost, None
        return lost

    def start(self) -> None:
        """Start renewing, answered by the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._answered = self._looked = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="sse-lease", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop renewing (a renewal under way ends first)."""
        self._stop.set()
        with self._lock:
            self._worker_id = None
        thread, self._thread = self._thread, None
        if thread is not None:
            await asyncio.to_thread(thread.join, self.interval + 10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.leases.database.closed or not self._ask_loop():
                return
            self.renew_once()

    def _ask_loop(self) -> bool:
        """Ask the loop to answer (it does when it next runs its ready callbacks); False
        when it is closed."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._answer)
        except RuntimeError:  # closed: the process is ending
            return False
        return True

    def _answer(self) -> None:
        self._answered = time.monotonic()

    def renew_once(self) -> None:
        """One renewal, unless the loop has not answered within the stall limit."""
        worker_id = self._worker_id
        if worker_id is None:
            return
        now = time.monotonic()
        if now - self._looked > self.stall_limit:
            # This thread did not run either: the whole process was stopped (SIGSTOP, a
            # frozen VM), not only its loop, which gets its chance again from now.
            self._answered = now
        self._looked = now
        silent = now - self._answered
        if silent > self.stall_limit:
            self.healthy_since = None
            if not self._stalled:
                self._stalled = True
                logger.error(
                    "the event loop has not run for %.1f s: leaving worker lease %s to "
                    "lapse, so that the other workers take this worker's streams",
                    silent,
                    worker_id,
                )
            return
        self._stalled = False
        try:
            live = self.leases.renew_here(worker_id)
        except StoreError as error:
            self.healthy_since = None
            logger.warning("worker lease: %s (trying again)", error)
            return
        if not live:
            with self._lock:
                if self._worker_id == worker_id:
                    self._worker_id, self._lost = None, worker_id
            return
        if self.healthy_since is None:
            self.healthy_since = time.monotonic()
