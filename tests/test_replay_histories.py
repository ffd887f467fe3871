"""Every stored history of a real run replays against today's workflow code.

A change that makes the workflows non-deterministic (reordered commands, a new
activity on an old path) fails here before it can break running streams. Refresh
the histories with ``DURABLE_SSE_CAPTURE_HISTORY=1 pytest tests/test_e2e.py`` only
when a change is *meant* to be incompatible (and then version the workflow).
``stream_progress_reports`` (tests/test_live_views.py) and ``stream_state_attribute``
(tests/test_search_attribute.py) are captured the same way by those modules; the three
older histories predate both and replay through the ``sse-stream-state-attribute`` patch.
``stream_heartbeat_timeout`` (also tests/test_live_views.py) is a run of today's reader:
the ``sse-heartbeat-timeout`` patch, nudged pauses, no progress signal.
``checkpoint_rest`` (tests/test_checkpoint_rest.py) is a checkpoint run that rests its
schedule (the ``sse-checkpoint-rest`` patch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from workflows.checkpoint import CheckpointAdvanceWorkflow
from workflows.stream import StreamWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
TEXTS = {path.stem: path.read_text() for path in HISTORIES}


def test_histories_are_stored() -> None:
    assert len(HISTORIES) >= 3, "the Replayer test needs captured histories"


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_history_replays(path: Path) -> None:
    # The recorded workflow id: the workflow checks that its id owns the stream it reads.
    started = json.loads(TEXTS[path.stem])["events"][0]
    workflow_id = started["workflowExecutionStartedEventAttributes"]["workflowId"]
    history = WorkflowHistory.from_json(workflow_id, TEXTS[path.stem])
    replayer = Replayer(workflows=[StreamWorkflow, CheckpointAdvanceWorkflow])
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
