"""The activities of durable-sse, as the repository's layout names them.

They live in :mod:`durable_sse.activities` (an installed durable-sse adds no ``activities``
package to site-packages, where an application's own would collide with it); this folder
is not installed and re-exports them for code that runs from a checkout.
"""

from durable_sse.activities import (
    CheckpointActivities,
    NudgeActivities,
    ReadActivities,
    RetentionActivities,
    ScheduleActivities,
    SearchAttributeActivities,
)

__all__ = [
    "CheckpointActivities",
    "NudgeActivities",
    "ReadActivities",
    "RetentionActivities",
    "ScheduleActivities",
    "SearchAttributeActivities",
]
