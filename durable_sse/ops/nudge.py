"""Nudges: make the worker holding a stream's connection heartbeat now.

Temporal delivers an activity's cancellation only in the answer to one of its heartbeats,
so without help a signal (``replay``, ``pause``, ``stop``) acts only as fast as the
connection heartbeats, and heartbeats are the Temporal server's biggest load at a
thousand streams (docs/benchmarks.md, section 3). A nudge makes cancellation independent
of the heartbeat rate: once the workflow has requested the cancellation it runs the short
``nudge_reader`` activity, which publishes the stream's name on the deployment's Redis
channel (:func:`nudge_channel`: its namespace, task queue and Redis database); every
worker of the deployment subscribes, and the one holding the connection heartbeats at
once, so the cancellation comes back in that heartbeat's answer.

Redis pub/sub delivers at most once and only to subscribers connected at that moment: a
lost nudge only means the cancellation waits for the connection's next regular heartbeat.
While a worker is not subscribed (:attr:`NudgeListener.live` is False) its connections
heartbeat at the short interval they used before nudges existed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from redis.asyncio import Redis

logger = logging.getLogger(__name__)

CHANNEL = "sse-nudge"
"""The channel's prefix; a message is a stream's name."""


def nudge_channel(namespace: str, task_queue: str, redis_url: str) -> str:
    """The channel of one deployment: ``sse-nudge:<namespace>:<task queue>:<db>``.

    Redis pub/sub ignores the database number, so deployments that share one Redis (two
    task queues, two namespaces, or two databases of one server) would hear each other's
    nudges on one channel; every worker of a deployment names the same one."""
    return f"{CHANNEL}:{namespace}:{task_queue}:{_database(redis_url)}"


def _database(redis_url: str) -> int:
    path = urlsplit(redis_url).path.strip("/")
    return int(path) if path.isdigit() else 0


RECONNECT_DELAY = (0.5, 10.0)
"""First and longest wait between attempts to subscribe again after Redis failed."""
POLL_TIMEOUT = 1.0
"""Seconds one wait for a message lasts (a PING checks the connection between waits)."""


class NudgeListener:
    """One subscription per worker: calls ``on_nudge(stream)`` for every nudge.

    Never raises: while Redis fails it logs once per outage, is not :attr:`live`, and
    subscribes again with backoff.
    """

    def __init__(
        self,
        redis_url: str,
        on_nudge: Callable[[str], None],
        *,
        channel: str = CHANNEL,
        timeout: float = 0.5,
    ) -> None:
        self.channel = channel
        self._redis = Redis.from_url(
            redis_url, socket_connect_timeout=timeout, health_check_interval=POLL_TIMEOUT * 5
        )
        self._on_nudge = on_nudge
        self._task: asyncio.Task[None] | None = None
        self.live = False
        """Subscribed now: a nudge published now reaches this worker."""
        self.received = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def wait_live(self, timeout: float) -> bool:
        """Wait (bounded) for the first subscription; True when subscribed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.live and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return self.live

    async def close(self) -> None:
        self.live = False
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])
            self._task = None
        await self._redis.aclose()

    async def _run(self) -> None:
        delay = RECONNECT_DELAY[0]
        failing = False
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.live = True
                if failing:
                    logger.info("nudges: subscribed again to Redis channel %s", self.channel)
                failing = False
                delay = RECONNECT_DELAY[0]
                while True:
                    message = await pubsub.get_message(timeout=POLL_TIMEOUT)
                    if message is None or message.get("type") != "message":
                        continue
                    data = message["data"]
                    self.received += 1
                    self._on_nudge(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - Redis down: heartbeats cover it
                self.live = False
                if not failing:
                    logger.warning(
                        "nudges: Redis channel %s lost (%s); connections heartbeat more "
                        "often until it is back",
                        self.channel,
                        error,
                    )
                failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_DELAY[1])
            finally:
                self.live = False
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001, S110 - a dead connection closes anyway
                    pass


class Nudges:
    """A worker's end of the channel: publishes nudges, and hands each one it hears to
    the callbacks registered for that stream (its connections)."""

    def __init__(self, redis_url: str, *, channel: str = CHANNEL, timeout: float = 0.5) -> None:
        """``channel``: the deployment's (:func:`nudge_channel`); the worker names it."""
        self._publisher = Redis.from_url(
            redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.channel = channel
        self.listener = NudgeListener(redis_url, self._deliver, channel=channel, timeout=timeout)
        self._targets: dict[str, set[Callable[[], None]]] = {}
        self.delivered = 0

    @property
    def live(self) -> bool:
        """A nudge published now reaches this worker."""
        return self.listener.live

    def start(self) -> None:
        """Subscribe (in the background; idempotent). Needs a running event loop."""
        self.listener.start()

    def register(self, stream: str, callback: Callable[[], None]) -> None:
        self._targets.setdefault(stream, set()).add(callback)

    def unregister(self, stream: str, callback: Callable[[], None]) -> None:
        targets = self._targets.get(stream)
        if targets is not None:
            targets.discard(callback)
            if not targets:
                del self._targets[stream]

    async def publish(self, stream: str) -> int:
        """Nudge ``stream``'s connection; returns how many workers were subscribed."""
        return int(await self._publisher.publish(self.channel, stream))

    async def close(self) -> None:
        await self.listener.close()
        await self._publisher.aclose()

    def _deliver(self, stream: str) -> None:
        for callback in list(self._targets.get(stream, ())):
            self.delivered += 1
            try:
                callback()
            except Exception as error:  # noqa: BLE001 - one bad target never stops the rest
                logger.warning("nudge for stream %s not delivered: %s", stream, error)
