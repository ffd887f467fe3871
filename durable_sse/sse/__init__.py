"""The wire: Server-Sent Events over HTTP, exact to the WHATWG rules. The decoder
(:mod:`.decoder`: bytes in, :class:`~.decoder.DecodedEvent` and comments out), drop notices
among the comments (:mod:`.drops`), and what a connection sends and makes of the answer
(:mod:`.request`, :mod:`.response`, :mod:`.content_type`, :mod:`.client`).

Nothing is imported here: importing one module never loads the package's others (a
pure module must not reach a driver through its package; tests/layers.py checks it).
"""

__all__ = ["client", "content_type", "decoder", "drops", "request", "response"]
