"""Settings, validated in one place each: a stream's (:mod:`.spec`, :mod:`.streams`), the
worker process's (:mod:`.settings`), where Temporal is (:mod:`.temporal`), secrets and the
hosts they may go to (:mod:`.secrets`, :mod:`.hosts`, :mod:`.credentials`), a Worker
Deployment (:mod:`.deployment`), the ``replay`` signal (:mod:`.replay`), durations.

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = [
    "credentials",
    "deployment",
    "durations",
    "hosts",
    "replay",
    "secrets",
    "settings",
    "spec",
    "streams",
    "temporal",
]
