"""One owner per stream (DESIGN.md invariant 6): a workflow acts only for the stream its id names.

Temporal keeps workflow ids unique, so binding a stream's name to its workflow id
(``sse-stream:<name>``) makes "who owns this stream" the question Temporal already
answers. A workflow started with another id and a stream's name in its input (by
mistake, or by anyone who can start workflows on the task queue) must touch nothing of
that stream: no schedule, rows, cursor or Redis key. These are pure functions of the id
and the name, called by ``StreamWorkflow`` before it does anything, by
``CheckpointAdvanceWorkflow`` and by the schedule activities.
"""

from __future__ import annotations

import re

from durable_sse.contracts import (
    SCHEDULE_ID_PREFIX,
    checkpoint_schedule_id,
    stream_workflow_id,
)
from durable_sse.errors import ConfigError

STREAM_WORKFLOW_TYPE = "StreamWorkflow"

_SCHEDULED_SUFFIX = re.compile(r"-\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)\Z")
"""What a Temporal Schedule appends to its action's workflow id: ``-<RFC 3339 time>``.
Stream names cannot hold ``:``, so the suffix is never part of a name."""


def stream_owner_error(workflow_id: str, name: str) -> str | None:
    """Why the workflow ``workflow_id`` may not act for stream ``name`` (None: it may)."""
    owner = stream_workflow_id(name)
    if workflow_id == owner:
        return None
    return (
        f"workflow {workflow_id!r} is not the owner of stream {name!r}: only workflow "
        f"{owner!r} may read it or change its rows, cursor and schedule. This workflow "
        "touched nothing; stop it, and start the stream under its own id"
    )


def require_stream_owner(workflow_id: str, name: str) -> None:
    """:func:`stream_owner_error` as a :class:`ConfigError` (parks a ``StreamWorkflow``)."""
    problem = stream_owner_error(workflow_id, name)
    if problem is not None:
        raise ConfigError(problem)


def schedule_caller_error(
    workflow_id: str | None, workflow_type: str | None, name: str
) -> str | None:
    """Why a workflow may not create, change or delete stream ``name``'s schedule."""
    if workflow_type != STREAM_WORKFLOW_TYPE:
        return (
            f"schedule {checkpoint_schedule_id(name)!r} is changed only by its stream's "
            f"{STREAM_WORKFLOW_TYPE}, not by {workflow_type or 'no workflow'} "
            f"{workflow_id!r}; nothing was changed"
        )
    problem = stream_owner_error(workflow_id or "", name)
    return None if problem is None else f"{problem}; its schedule was not changed"


def checkpoint_owner_error(workflow_id: str, name: str) -> str | None:
    """Why a checkpoint run ``workflow_id`` may not advance stream ``name``'s lagging id.

    Its id must be the stream's schedule id (a manual run) or what the schedule makes of
    it (``sse-checkpoint:<name>-<time>``).
    """
    schedule_id = checkpoint_schedule_id(name)
    if workflow_id == schedule_id:
        return None
    if workflow_id.startswith(f"{schedule_id}-") and _SCHEDULED_SUFFIX.fullmatch(
        workflow_id[len(schedule_id) :]
    ):
        return None
    return (
        f"checkpoint workflow {workflow_id!r} is not bound to stream {name!r}: its id must "
        f"be {schedule_id!r} (or that schedule's {SCHEDULE_ID_PREFIX}{name}-<time>); the "
        "lagging id was not touched"
    )
