"""durable-sse: consume Server-Sent Events streams durably, orchestrated by Temporal.

What an application uses:

* :mod:`durable_sse.consume`: ``Consumer`` and ``Group``, to run code on every stored
  event, in order (exactly once in the log's database, or at least once elsewhere);
* :class:`durable_sse.config.spec.StreamSpec`: a stream's settings, as the
  ``StreamWorkflow`` takes them;
* :mod:`durable_sse.ops.control`: start, signal, replay and query streams from Python
  (what the ``durable-sse`` CLI runs);
* :mod:`durable_sse.workflows` and :mod:`durable_sse.worker`: the workflows, and a worker
  process to run them (``durable-sse worker``), for a deployment that builds its own;
* :mod:`durable_sse.source`: the demo SSE server with injectable faults, for tests.

Everything else is the service's inside; each subpackage's docstring says what it holds.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
