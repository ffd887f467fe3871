"""Run a durable-sse worker from a checkout: ``python worker.py``, the same as
``durable-sse worker``.

The worker lives in :mod:`durable_sse.worker`, so that an installed durable-sse adds one
name to site-packages (``durable_sse``) and no ``worker`` module that an application's own
could shadow or be shadowed by. This file keeps the repository's layout and the command.
"""

from durable_sse.worker import main

if __name__ == "__main__":
    main()
