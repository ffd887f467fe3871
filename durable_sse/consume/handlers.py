"""The user's exactly-once handler, run inside its batch's transaction on a database thread.

A plain function runs right there. An ``async def`` handler (a coroutine function, an
object whose ``__call__`` is one, or a ``functools.partial`` of either) is known up
front: its coroutine is sent to the consumer's event loop and the database thread waits
for it with the transaction open, so what it writes through ``tx`` commits with the
position or not at all. Any other callable that returns an awaitable is refused: the
awaitable is closed unrun, the transaction rolls back, and ``run()`` raises
:class:`HandlerRefused` (never called and dropped).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sqlalchemy.engine import Connection

from durable_sse.consume.model import Batch

Handler = Callable[[Connection, Batch], None] | Callable[[Connection, Batch], Awaitable[None]]
"""``handler(tx, batch)``, a plain function or an ``async def``: exactly once; raise to
roll the batch back (it is delivered again, see ``Group.max_attempts``)."""


class HandlerRefused(TypeError):
    """The handler returned an awaitable without being an ``async def`` (rolled back)."""


class HandlerCancelled(Exception):
    """``run()`` was cancelled while an ``async def`` handler ran (rolled back)."""


def is_async_handler(handler: object) -> bool:
    """Whether ``handler`` is an ``async def`` (itself, its ``__call__``, or what a
    ``functools.partial`` wraps)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(type(handler), "__call__", None)  # noqa: B004 - the method itself
    return inspect.iscoroutinefunction(call)


class HandlerCall:
    """``handler(tx, batch)`` as a plain function of the database thread.

    Args:
        handler: the user's handler.
        loop: the consumer's event loop (an ``async def`` handler runs there).
    """

    def __init__(self, handler: Handler, loop: asyncio.AbstractEventLoop) -> None:
        self._handler = handler
        self._loop = loop
        self.is_async = is_async_handler(handler)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cancelled = False

    def __call__(self, tx: Connection, batch: Batch) -> None:
        """Run on a database thread, inside the batch's transaction.

        Raises:
            HandlerRefused: a callable that is not an ``async def`` returned an awaitable.
            HandlerCancelled: :meth:`cancel` was called while it ran.
        """
        if self.is_async:
            self._await(tx, batch)
            return
        result = self._handler(tx, batch)
        if inspect.isawaitable(result):
            _discard(result)
            raise HandlerRefused(
                f"the handler {self._handler!r} returned {type(result).__name__} instead of "
                "running: the consumer cannot tell it would be awaited. Write it as "
                "`async def handle(tx, batch)` (awaited inside the batch's transaction) or "
                "as a plain function; the batch was rolled back"
            )

    def cancel(self) -> None:
        """``run()`` is cancelled: cancel the handlers running, refuse new ones (their
        batches roll back). Call it on the event loop."""
        self._cancelled = True
        for task in self._tasks:
            task.cancel()

    def _await(self, tx: Connection, batch: Batch) -> None:
        coroutine = self._handler(tx, batch)
        if not inspect.iscoroutine(coroutine):
            raise HandlerRefused(f"the async handler {self._handler!r} returned no coroutine")
        future = asyncio.run_coroutine_threadsafe(self._run(coroutine), self._loop)
        try:
            future.result()
        except (concurrent.futures.CancelledError, asyncio.CancelledError):
            raise HandlerCancelled from None
        if self._cancelled:
            # The handler caught its cancellation and returned: roll back all the same.
            raise HandlerCancelled

    async def _run(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """On the loop: the handler, cancellable by :meth:`cancel` (the database thread
        waits until it has ended, so ``tx`` is never used from two threads at once)."""
        if self._cancelled:
            coroutine.close()
            raise asyncio.CancelledError
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await coroutine
        finally:
            self._tasks.discard(task)


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close an awaitable that will not be awaited (no "never awaited" warning, nothing
    of it runs)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()
    elif isinstance(awaitable, asyncio.Future):
        awaitable.get_loop().call_soon_threadsafe(awaitable.cancel)
