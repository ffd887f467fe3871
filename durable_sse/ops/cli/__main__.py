"""``python -m durable_sse.ops.cli``: the ``durable-sse`` command."""

from durable_sse.ops.cli.main import entry

entry()
