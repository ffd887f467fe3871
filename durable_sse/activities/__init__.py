"""The activities, one class per job, each built with what it needs (stores, clients) and
registered by :func:`durable_sse.worker.build_worker`.
"""

from durable_sse.activities.attributes import SearchAttributeActivities
from durable_sse.activities.checkpoint import CheckpointActivities
from durable_sse.activities.nudge import NudgeActivities
from durable_sse.activities.read import ReadActivities
from durable_sse.activities.retention import RetentionActivities
from durable_sse.activities.schedule import ScheduleActivities

__all__ = [
    "CheckpointActivities",
    "NudgeActivities",
    "ReadActivities",
    "RetentionActivities",
    "ScheduleActivities",
    "SearchAttributeActivities",
]
