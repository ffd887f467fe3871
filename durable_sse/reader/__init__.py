"""The reader: one SSE connection of a stream, from where it starts to how it ends
(:mod:`.connection`), with its pure parts (:mod:`.session`, :mod:`.intake`,
:mod:`.heartbeat_policy`) apart from its I/O (:mod:`.body`, :mod:`.committer`,
:mod:`.pipeline`, :mod:`.keepalive`, :mod:`.reports`) and its credentials
(:mod:`.credentials`). The read activity runs one per stream
(:class:`durable_sse.activities.read.ReadActivities`).

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = ["connection", "credentials", "heartbeat_policy", "intake", "metrics", "session"]
