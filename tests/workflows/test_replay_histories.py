"""Every stored history of a real run replays against today's workflow code.

A change that makes the workflows non-deterministic (reordered commands, a new
activity on an old path) fails here. On a versioned deployment such a change is safe
(runs are Pinned and move at a continue-as-new, docs/deploys.md); on an unversioned one
it needs a patch. Each history is written by the test that runs it, with
``DURABLE_SSE_CAPTURE_HISTORY=1``: ``stream_gap_repaired``, ``stream_replay_cut`` and
``stream_refusals_and_backoff`` (tests/system/test_e2e.py), ``stream_nudged_pauses``
(tests/system/test_live_views.py), ``stream_state_attribute``
(tests/system/test_search_attribute.py), ``stream_nudged_schedule_spread``
(tests/system/test_two_workers.py), ``stream_retention_reports`` and
``checkpoint_retention`` (tests/system/test_retention_stream.py), ``checkpoint_rest``
(tests/system/test_checkpoint_rest.py). All were recaptured when the nine patches of 0.1.0
were retired: refresh them the same way when a change is *meant* to be incompatible.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from durable_sse.workflows.stream import StreamWorkflow

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "histories").glob("*.json"))
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
