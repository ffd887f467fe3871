"""The worker of build v2 (tests/system/test_versioning.py): worker.py with ``StreamWorkflow``
replaced by :class:`tests.versioning.stream_v2.StreamWorkflowV2` before it builds."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from durable_sse import worker  # noqa: E402 - after the checkout is on the path
from tests.versioning.stream_v2 import StreamWorkflowV2  # noqa: E402

if __name__ == "__main__":
    worker.StreamWorkflow = StreamWorkflowV2  # type: ignore[misc]
    worker.main()
