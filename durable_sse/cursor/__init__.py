"""Where a stream's reading stands and may start: the L1 and L2 caches of the newest
persisted id (:mod:`.l1`, :mod:`.l2`), the checkpoint row with the lagging id
(:mod:`.checkpoint`), the fence nothing may pass (:mod:`.fence`), the running connections
(:mod:`.readers`), and where a connection resumes (:mod:`.resolve`, :mod:`.start`).

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = ["checkpoint", "fence", "l1", "l2", "readers", "resolve", "rest", "start"]
