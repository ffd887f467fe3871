"""Log formatting: JSON lines carry Temporal's context (stream's workflow id) when present."""

from __future__ import annotations

import json
import logging

from durable_sse.ops.logs import JsonFormatter


def test_json_lines_carry_workflow_and_activity_context() -> None:
    record = logging.LogRecord("activities.read", logging.INFO, __file__, 1, "read %d", (3,), None)
    record.temporal_activity = {  # what temporalio's activity.logger attaches
        "workflow_id": "sse-stream:demo",
        "activity_type": "read_stream",
        "attempt": 2,
    }
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "read 3"
    assert line["level"] == "INFO" and line["logger"] == "activities.read"
    assert line["workflow_id"] == "sse-stream:demo" and line["attempt"] == 2
