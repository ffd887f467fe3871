"""When a stream's run ends in continue-as-new: pure decisions, no Temporal, no I/O.

A run continues-as-new for four reasons, checked in this order:

* **the target version changed** (Worker Versioning): the stream is Pinned to the
  Worker Deployment Version it started on; when another version becomes current (or
  ramps onto it) the run ends its connection the way ``pause`` does and continues-as-new
  onto the new version. No code change then needs a ``workflow.patched`` branch.
* **the run is a day old** (``RUN_MAX_AGE``): a parked, paused or waiting run makes no
  history, so without this it could pin old code (and any patch an unversioned
  deployment still carries) forever.
* **the history budget** is spent (the server suggests it, or ``max_history_events``).
* **the connection budget** is spent (``max_connections_per_run``).

A run learns that the target changed only at a workflow task: an idle run has none until
something happens to it, so the new version's workers wake the runs still on an older
version once, when theirs becomes current (:mod:`durable_sse.ops.upgrade`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

RUN_MAX_AGE = 24 * 3600.0
"""Seconds after which an idle run (parked, paused, waiting) continues-as-new: at least
once a day every run starts again on the current code."""

TARGET_CHANGED = "the target worker deployment version changed"
RUN_AGED = "the run is a day old"
HISTORY_FULL = "the run's history budget is spent"
CONNECTIONS_SPENT = "the run's connection budget is spent"


@dataclass(frozen=True)
class RunBudget:
    """What the current run has used, as the workflow sees it at a safe point."""

    target_changed: bool
    """``workflow.info().is_target_worker_deployment_version_changed()``."""
    age: float
    """Seconds since the run started (workflow time)."""
    history_full: bool
    connections: int
    """Connections this run made."""
    max_connections: int
    max_age: float = RUN_MAX_AGE


def continue_reason(budget: RunBudget) -> str | None:
    """Why the run must continue-as-new now (None: it goes on)."""
    if budget.target_changed:
        return TARGET_CHANGED
    if budget.age >= budget.max_age:
        return RUN_AGED
    if budget.history_full:
        return HISTORY_FULL
    if budget.connections >= budget.max_connections:
        return CONNECTIONS_SPENT
    return None


def seconds_until_aged(started: datetime, now: datetime, max_age: float = RUN_MAX_AGE) -> float:
    """Seconds an idle run may still wait before it is a day old (never negative)."""
    return max(0.0, max_age - (now - started).total_seconds())


def bounded_wait(
    remaining: float | None, started: datetime, now: datetime, max_age: float = RUN_MAX_AGE
) -> float:
    """A wait of ``remaining`` seconds (None: until something happens) cut at the run's age
    limit, so that no wait outlives the day a run may last."""
    cap = seconds_until_aged(started, now, max_age)
    return cap if remaining is None else min(remaining, cap)
