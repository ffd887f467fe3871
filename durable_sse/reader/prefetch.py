"""Fetching the stored keys ahead of a replaying connection, in the background.

What to fetch and when is :class:`~durable_sse.reader.stored.StoredAhead`'s decision
(asked through the session); this module runs the fetch as a task and hands its page
back. It is an optimisation only: a fetch that fails is logged, and everything is written
(``ON CONFLICT`` absorbing the duplicates) from then on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from durable_sse.log.reads import Reads
from durable_sse.log.records import StoredPage
from durable_sse.reader.session import ReadSession


class StoredPrefetch:
    """The stored-key fetches of one connection (one at a time)."""

    def __init__(
        self,
        session: ReadSession,
        reads: Reads,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        self.session = session
        self.reads = reads
        self.log = log
        self.task: asyncio.Task[StoredPage] | None = None

    def fetch(self) -> None:
        """Fetch the next page in the background, if one is due."""
        session = self.session
        after = session.stored_fetch_due()
        if after is None:
            return
        task = asyncio.create_task(
            self.reads.stored_keys(
                session.stream, session.order, after=after, limit=session.page_rows
            )
        )
        task.add_done_callback(self._fetched)
        self.task = task

    def _fetched(self, task: asyncio.Task[StoredPage]) -> None:
        if task.cancelled():
            self.session.stored_page(None)
        elif (error := task.exception()) is not None:
            self.log.info("stream %s: stored keys not read: %s", self.session.stream, error)
            self.session.stored_page(None)
        else:
            self.session.stored_page(task.result())

    async def stop(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
