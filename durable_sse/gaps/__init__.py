"""The gap: where invariant 5 ("the gap is repaired, or counted exactly") lives.

:mod:`~durable_sse.gaps.model` (the record and its summaries),
:mod:`~durable_sse.gaps.tracker` (one connection's view),
:mod:`~durable_sse.gaps.transitions` (how a record changes) are pure;
:mod:`~durable_sse.gaps.store` keeps the records in ``sse_gaps``.
"""

__all__ = ["model", "store", "tracker", "transitions"]
