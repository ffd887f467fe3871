"""Running the service: the CLI (:mod:`.cli`), client-side control of streams
(:mod:`.control`, :mod:`.live`), connecting to Temporal (:mod:`.temporal_client`), the
demo stack (:mod:`.dev`), workers' liveness and failover (:mod:`.liveness`,
:mod:`.failover`), payload encryption (:mod:`.codec`, :mod:`.codec_server`), metrics and
logs.

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = [
    "cli",
    "codec",
    "codec_server",
    "control",
    "dev",
    "failover",
    "live",
    "liveness",
    "logs",
    "metrics",
    "temporal_client",
    "upgrade",
]
