"""When a stream's checkpoint schedule may rest, and when a connection must wake it.

Every checkpoint run is billed (a schedule action, a workflow start, an activity), yet a
stream that receives nothing has nothing to advance: once its lagging id is its newest id,
no run can move it until an event with a higher key is stored. So a run that finds the
stream *caught up* (and no retention to apply) pauses the schedule, with a note that says
who paused it and why, and records the rest in the checkpoint row (``resting_since``).

Nothing is lost by resting: the lagging id is already where every run would leave it.
What must not happen is resting on while events arrive, which would leave the lagging
id behind and send the next lagged route further back than one window. Two checks close
every interleaving (see ``activities/schedule.py``):

* the run re-reads the stream after pausing and wakes the schedule itself when an event
  with a higher key was stored meanwhile;
* a connection reads the flag on its first commit that stores rows and moves its cursor,
  and on any such commit that follows a pause of ``wake_check_after`` or more: a run can
  rest only when the stream's newest key was received a whole replay window ago, so the
  commit that stores a newer event always follows such a pause (with a margin of three
  quarters of the window for commit lag and clocks). Commits that store nothing (a replay
  of stored events) do not count: they would hide the pause.

These are the plain rules; the stores and Temporal do the rest.
"""

from __future__ import annotations

REST_NOTE = "durable-sse: resting, the stream's lagging id is its newest id"
"""The note a resting schedule is paused with. Only a schedule paused with it is woken: an
operator's pause (any other note) is left alone."""
WAKE_NOTE = "durable-sse: woken, the stream stored a newer event"
WAKE_CHECK_SHARE = 0.25
"""A connection checks the flag after a pause of this share of the replay window..."""
WAKE_CHECK_CAP = 60.0
"""...or of this many seconds, whichever is shorter (a flag read is one primary-key row)."""
WAKE_RETRY = 30.0
"""Seconds before a connection tries again after a wake that failed."""


def caught_up(lagging_key: bytes | None, newest_key: bytes | None) -> bool:
    """Whether no checkpoint run can move the lagging id before a newer event is stored.

    ``newest_key`` is the highest id key stored for the stream (None: no event with an id).
    """
    if newest_key is None:
        return True
    return lagging_key is not None and lagging_key >= newest_key


def may_rest(*, caught_up: bool, retention_applies: bool | None) -> bool:
    """Whether a checkpoint run may pause its schedule: caught up, and nothing to delete
    (retention ages rows out whether or not events arrive; None: a worker that does not
    say, so the run keeps going)."""
    return caught_up and retention_applies is False


def wake_check_after(replay_window: float) -> float:
    """Seconds without a cursor move after which a connection's next move reads the flag."""
    return min(replay_window * WAKE_CHECK_SHARE, WAKE_CHECK_CAP)


def wake_check_due(
    *, last_move: float | None, retry_at: float | None, now: float, replay_window: float
) -> bool:
    """Whether the commit at ``now`` (monotonic seconds), which stored rows and moved the
    cursor, must check for a rest.

    ``last_move``: the connection's previous such commit (None: this is its first).
    ``retry_at``: when a failed wake may be tried again (None: none failed).
    """
    if retry_at is not None:
        return now >= retry_at
    return last_move is None or now - last_move >= wake_check_after(replay_window)


def paused_by_rest(paused: bool, note: str | None) -> bool:
    """Whether a schedule is paused by a rest (and so may be woken by a connection)."""
    return paused and note == REST_NOTE
