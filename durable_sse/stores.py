"""``Stores``: every store a worker (or a test, or a tool) needs, built once.

TRANSITIONAL (layout branch only, never landed like this): every job attribute is the same
``EventLog``; the log split replaces each with its own class over one shared ``Database``,
keeping these attribute names and the method names listed beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from durable_sse.cursor.l1 import LocalCursors
from durable_sse.cursor.l2 import RedisCursors
from durable_sse.log.eventlog import EventLog


@dataclass(eq=False)
class Stores:
    log: EventLog
    l1: LocalCursors
    l2: RedisCursors | None = None

    @classmethod
    def open(
        cls,
        database_url: str,
        *,
        connect_timeout: int = 5,
        consumer_holds: Any = None,
        l1: LocalCursors | None = None,
        l2: RedisCursors | None = None,
    ) -> Stores:
        log = EventLog(database_url, connect_timeout=connect_timeout, consumer_holds=consumer_holds)
        return cls(log=log, l1=l1 or LocalCursors(), l2=l2)

    @property
    def database(self) -> EventLog:
        """dialect, engine, create_schema(), close()"""
        return self.log

    @property
    def writer(self) -> EventLog:
        """submit_batch, committed, insert_batch, commits, optimistic_copy, direct_copies,
        order_commits, notify_commits, optimistic_fallbacks"""
        return self.log

    @property
    def reads(self) -> EventLog:
        """floor, newest_id_at_or_before, events, stored_keys"""
        return self.log

    @property
    def checkpoints(self) -> EventLog:
        """get_checkpoint, advance_lagging"""
        return self.log

    @property
    def starts(self) -> EventLog:
        """connection_context, move_reader, release_reader, readers"""
        return self.log

    @property
    def gap_store(self) -> EventLog:
        """gap_summary, gaps"""
        return self.log

    @property
    def prune(self) -> EventLog:
        """apply_retention, retention_state"""
        return self.log

    async def create_schema(self) -> None:
        await self.log.create_schema()

    async def close(self) -> None:
        """Flushes and closes L2 when there is one, then the database."""
        if self.l2 is not None:
            await self.l2.flush()
            await self.l2.close()
        await self.log.close()
