"""``nudge_reader``: the workflow's way to make a cancelled connection notice it now.

See :mod:`durable_sse.ops.nudge`. The activity may run on any worker: the nudge goes to all
of them and only the one holding the stream's connection acts on it.
"""

from __future__ import annotations

from temporalio import activity

from durable_sse.contracts import StreamRef
from durable_sse.ops.nudge import Nudges


class NudgeActivities:
    """Publishes nudges through the worker's channel."""

    def __init__(self, nudges: Nudges) -> None:
        self._nudges = nudges

    @activity.defn
    async def nudge_reader(self, input: StreamRef) -> int:
        """Nudge the connection of ``input.name``; returns the workers that heard it."""
        return await self._nudges.publish(input.name)

    def activities(self) -> list:
        return [self.nudge_reader]
