"""The workflows: one :class:`StreamWorkflow` per stream, and the checkpoint workflow that
moves a stream's lagging id.

Workflow code: deterministic, no I/O (the sandbox re-imports these modules for each run).
"""

from durable_sse.workflows.checkpoint import CheckpointAdvanceWorkflow
from durable_sse.workflows.stream import StreamWorkflow

__all__ = ["CheckpointAdvanceWorkflow", "StreamWorkflow"]
