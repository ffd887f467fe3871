"""The ``durable-sse`` command line.

Every failure is one clear line on stderr and a non-zero exit, never a traceback:
a user's typo (an unknown stream, bad TOML, Temporal down) is not a crash.

Modules: :mod:`.main` (the entry point and the dispatch to each command), :mod:`.parser`
(the arguments, the environment each command reads, exit codes), :mod:`.streams` (the
commands that talk to Temporal), :mod:`.tail` and :mod:`.consumers` (the ones that read
the event log only), :mod:`.tables` (the tables they print).
"""
