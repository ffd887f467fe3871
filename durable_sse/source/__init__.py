"""The demo/test SSE source: real HTTP event streams with exact, injectable faults.

Used by the demo, the tests and the benchmarks; run it alone with
``python -m durable_sse.source --stream demo:rate=20,start_id=990``.
"""

from __future__ import annotations

from durable_sse.source.config import SourceStreamConfig, parse_stream_arg
from durable_sse.source.server import SSESource
from durable_sse.source.stream import SourceTruth

__all__ = ["SSESource", "SourceStreamConfig", "SourceTruth", "parse_stream_arg"]
