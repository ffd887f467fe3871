"""The nudge channel carries the deployment's identity (issue 25): deployments that share
one Redis (other task queues, namespaces or databases) never hear each other's nudges."""

from __future__ import annotations

import asyncio

from durable_sse.ops.nudge import Nudges, nudge_channel

GUARD = 10.0


def test_the_channel_names_namespace_task_queue_and_redis_database() -> None:
    assert nudge_channel("default", "sse-consumer", "redis://h:6379/0") == (
        "sse-nudge:default:sse-consumer:0"
    )
    assert nudge_channel("prod", "q", "redis://h:6379/3") == "sse-nudge:prod:q:3"
    assert nudge_channel("prod", "q", "redis://h:6379") == "sse-nudge:prod:q:0"
    channels = {
        nudge_channel(namespace, queue, url)
        for namespace in ("a", "b")
        for queue in ("q1", "q2")
        for url in ("redis://h/0", "redis://h/1")
    }
    assert len(channels) == 8


async def test_a_deployment_hears_its_own_nudges_only(redis_url: str) -> None:
    ours = Nudges(redis_url, channel=nudge_channel("ns", "queue-a", redis_url))
    theirs = Nudges(redis_url, channel=nudge_channel("ns", "queue-b", redis_url))
    heard: list[str] = []
    ours.register("shared-name", lambda: heard.append("ours"))
    theirs.register("shared-name", lambda: heard.append("theirs"))
    ours.start()
    theirs.start()
    try:
        assert await ours.listener.wait_live(GUARD) and await theirs.listener.wait_live(GUARD)
        assert await ours.publish("shared-name") == 1  # one subscriber: this deployment's
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD
        while not heard and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert heard == ["ours"]
    finally:
        await ours.close()
        await theirs.close()
