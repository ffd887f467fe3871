"""Build v2 of ``StreamWorkflow`` for tests/system/test_versioning.py: today's workflow with a
timer before its first command. A v1 history replayed by this code fails its workflow
task (non-determinism), so a test that sees none knows that no v1 run ever ran on v2.

Registered under the same name, only by the test's v2 workers (tests/versioning/worker_v2.py).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

# Imported as the worker imports it (not passed through): its own pass-through block
# puts the modules whose dataclasses cross the boundary in the sandbox's module table.
from durable_sse.workflows.stream import StreamState, StreamStatus, StreamWorkflow

V2_TIMER = 0.05


@workflow.defn(name="StreamWorkflow")
class StreamWorkflowV2(StreamWorkflow):
    @workflow.run
    async def run(self, spec: Any, state: StreamState | None = None) -> StreamStatus:
        await workflow.sleep(V2_TIMER, summary="build v2")
        return await super().run(spec, state)
