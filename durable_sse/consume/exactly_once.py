"""Exactly once: ``handler(tx, batch)`` in the transaction that moves the position.

Up to ``concurrency`` lanes each take a stream with news and drain it: every batch is
read with the stream's position row locked, handed to the handler in that transaction,
and the position moved past it there too (:meth:`.StreamTransactions.deliver`). The
handler's writes and the move commit together or not at all. An ``async def`` handler is
awaited on the event loop while its transaction waits open (:mod:`.handlers`);
cancelling ``run()`` cancels it and rolls its batch back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from durable_sse.consume.delivery import StreamDelivery
from durable_sse.consume.handlers import Handler, HandlerCall, HandlerCancelled, HandlerRefused
from durable_sse.consume.positions import Claim
from durable_sse.consume.transactions import HandlerError, LeaseMoved
from durable_sse.errors import StoreError

logger = logging.getLogger(__name__)


class ExactlyOnce:
    """The lanes of ``Consumer.run``."""

    def __init__(self, delivery: StreamDelivery) -> None:
        self._delivery = delivery

    async def run(self, handler: Handler, stop: asyncio.Event, *, lanes: int) -> None:
        """Deliver until ``stop`` is set or a lane fails (its error is raised). Cancelled,
        an ``async def`` handler's batch rolls back (a plain function's finishes)."""
        call = HandlerCall(handler, asyncio.get_running_loop())
        tasks = [asyncio.create_task(self._lane(call, stop)) for _ in range(lanes)]
        try:
            done, _ = await asyncio.wait(
                [*tasks, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task in tasks and (error := task.exception()) is not None:
                    raise error
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            stop.set()
            self._delivery.scheduler.news.set()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task

    async def _lane(self, handler: HandlerCall, stop: asyncio.Event) -> None:
        scheduler = self._delivery.scheduler
        while not stop.is_set():
            stream = await scheduler.take(stop)
            if stream is None:
                return
            try:
                await self._drain(stream, handler, stop)
            except StoreError as error:
                logger.warning(
                    "consumer %s, stream %s: %s; trying again",
                    self._delivery.group.name,
                    stream,
                    error,
                )
                scheduler.retry_later(stream, 3)
            finally:
                scheduler.done(stream)

    async def _drain(self, stream: str, handler: HandlerCall, stop: asyncio.Event) -> None:
        delivery = self._delivery
        claim: Claim | None = delivery.kept.pop(stream, None)
        while True:
            if stop.is_set() or delivery.closing.is_set():
                if claim is not None:
                    # Stopping with more to deliver: let another process take it now.
                    with contextlib.suppress(StoreError):
                        await delivery.release(stream, claim)
                return
            if claim is None:
                claim = await delivery.claim(stream)
                if claim is None:
                    return  # another process has it, or it is parked
                if claim.poison(delivery.group.max_attempts):
                    if not await delivery.poison(stream, claim):
                        return
                    claim = None
                    continue
            try:
                delivered = await delivery.database.call(
                    delivery.transactions.deliver, stream, claim, handler
                )
            except HandlerError as error:
                await delivery.failed(stream, claim, error.__cause__ or error)
                return
            except (HandlerCancelled, HandlerRefused):
                # Rolled back: give the stream up (and forget the attempt) for whoever
                # consumes it next.
                with contextlib.suppress(StoreError):
                    await delivery.release(stream, claim)
                raise
            except LeaseMoved:
                delivery.scheduler.retry_later(stream, 1)
                return
            if delivered.batch is not None:
                delivery.count(delivered.batch)
            claim = delivered.next_claim
            if claim is None:
                return
            if not delivered.full:
                delivery.kept[stream] = claim  # kept for the next wake-up: no claim then
                return
