"""The event log (``sse_events``) and the tables beside it: the schema and its migrations,
the write path (:mod:`.writer`, group-committed by :mod:`.commits`), the reads
(:mod:`.reads`), retention (:mod:`.retention`, :mod:`.prune`) and the workers' liveness
leases (:mod:`.workers`). :class:`durable_sse.stores.Stores` builds them together.

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = [
    "commits",
    "database",
    "keys",
    "locks",
    "migrations",
    "prune",
    "reads",
    "records",
    "retention",
    "schema",
    "workers",
    "writer",
]
