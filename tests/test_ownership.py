"""One owner per stream, as pure functions of a workflow id and a stream name."""

from __future__ import annotations

import pytest

from durable_sse.errors import ConfigError
from durable_sse.ownership import (
    checkpoint_owner_error,
    require_stream_owner,
    schedule_caller_error,
    stream_owner_error,
)


def test_a_stream_is_owned_by_its_own_workflow_id_only() -> None:
    assert stream_owner_error("sse-stream:ticks", "ticks") is None
    for intruder in ("sse-stream:x", "sse-stream:ticks2", "sse-stream:Ticks", "ticks", ""):
        problem = stream_owner_error(intruder, "ticks")
        assert problem is not None
        assert repr(intruder) in problem and "'sse-stream:ticks'" in problem
        assert "touched nothing" in problem
    require_stream_owner("sse-stream:ticks", "ticks")
    with pytest.raises(ConfigError, match="not the owner of stream 'ticks'"):
        require_stream_owner("sse-stream:x", "ticks")


def test_only_the_streams_own_workflow_may_change_its_schedule() -> None:
    assert schedule_caller_error("sse-stream:ticks", "StreamWorkflow", "ticks") is None
    assert "not changed" in (schedule_caller_error("sse-stream:x", "StreamWorkflow", "ticks") or "")
    other_type = schedule_caller_error("sse-stream:ticks", "CheckpointAdvanceWorkflow", "ticks")
    assert other_type is not None and "CheckpointAdvanceWorkflow" in other_type
    assert schedule_caller_error(None, None, "ticks") is not None


@pytest.mark.parametrize(
    "workflow_id",
    [
        "sse-checkpoint:ticks",
        "sse-checkpoint:ticks-2026-12-03T07:15:00Z",
        "sse-checkpoint:ticks-2026-12-03T07:15:00.123Z",
        "sse-checkpoint:ticks-2026-12-03T07:15:00+00:00",
    ],
)
def test_checkpoint_runs_of_the_streams_schedule_are_bound(workflow_id: str) -> None:
    assert checkpoint_owner_error(workflow_id, "ticks") is None


@pytest.mark.parametrize(
    "workflow_id",
    [
        "sse-checkpoint:x",
        "sse-checkpoint:x-2026-12-03T07:15:00Z",
        "sse-checkpoint:ticks2",
        "sse-checkpoint:ticks-extra",
        "sse-checkpoint:ticks-2026-12-03T07:15:00Z-more",
        "sse-checkpoint:ticks-2026-12-03",
        "sse-stream:ticks",
        "advance-1234",
    ],
)
def test_checkpoint_runs_for_another_stream_are_not(workflow_id: str) -> None:
    problem = checkpoint_owner_error(workflow_id, "ticks")
    assert problem is not None and repr(workflow_id) in problem and "not touched" in problem


def test_a_name_that_looks_like_a_schedule_suffix_is_not_confused() -> None:
    # "a-2026-12-03T07" is a valid stream name; its runs are not runs of stream "a".
    assert checkpoint_owner_error("sse-checkpoint:a-2026-12-03T07-2026-12-03T07:15:00Z", "a")
    assert (
        checkpoint_owner_error(
            "sse-checkpoint:a-2026-12-03T07-2026-12-03T07:15:00Z", "a-2026-12-03T07"
        )
        is None
    )
