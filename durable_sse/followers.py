"""The key that tells id-less followers apart: a re-sent one from a new one.

Per the WHATWG rules an event with no ``id`` field keeps the id in force, so several
events share an id: the one that carried it, then its *followers*. The event log keys
an event ``(stream, event_id, follower_key)``:

* the event that carries the id: ``follower_key`` is empty (``b""``);
* a follower: a digest of its type and data, then how many followers of the same id
  with the same type and data came before it on the same connection;
* no id in force at all: NULL (never conflicts, always stored).

Why not the follower's position (the ordinal, ``event_ord``): positions restart with
each connection. A connection that resumes after id 5 and reads a *new* id-less event
``c`` would give it position 1, the key of the follower ``b`` an earlier connection
stored after 5, and ``c`` would be discarded as a duplicate; a later replay from 4
would re-deliver ``5, b, c`` and store ``c`` again at position 2. Keyed by content,
``b`` re-sent is a duplicate wherever it comes, ``c`` is new wherever it comes, and a
replay re-delivers both as duplicates.

What the rule cannot tell apart: two followers of one id with the same type and data
read by *different* connections (a re-sent ``ping`` and a new ``ping`` look alike; the
second is taken for the first). On one connection identical followers are counted, so
each is kept. The counts are kept for :data:`FOLLOWER_WINDOW` followers at a time (the
memory a connection spends on them is bounded): the window's number is part of the key,
so past that many followers of one id, an identical follower is never lost, only, on a
connection that resumed inside such a run, possibly stored twice.
"""

from __future__ import annotations

import hashlib
import struct

CARRIER_KEY = b""
"""``follower_key`` of the event that carries its id."""
FOLLOWER_WINDOW = 65_536
"""Followers of one id whose identical repeats one count table covers."""
_SUFFIX = struct.Struct(">II")


def data_digest(event_type: str, data: str) -> bytes:
    """16 bytes that stand for a follower's type and data (BLAKE2b)."""
    digest = hashlib.blake2b(digest_size=16)
    kind = event_type.encode("utf-8", "surrogatepass")
    digest.update(len(kind).to_bytes(4, "big"))
    digest.update(kind)
    digest.update(data.encode("utf-8", "surrogatepass"))
    return digest.digest()


def follower_key(event_type: str, data: str, *, repeat: int = 0, window: int = 0) -> bytes:
    """The key of a follower: its digest, the count window, and the identical followers
    of its id before it in that window (see the module docstring)."""
    return data_digest(event_type, data) + _SUFFIX.pack(window, repeat)


class FollowerKeys:
    """Counts one connection's followers of the id in force, to key each of them."""

    def __init__(self) -> None:
        self._seen: dict[bytes, int] = {}

    def carrier(self) -> bytes:
        """An event carrying an id: counting starts again for its followers."""
        self._seen.clear()
        return CARRIER_KEY

    def follower(self, event_type: str, data: str, ordinal: int) -> bytes:
        """The key of the follower at ``ordinal`` (1, 2, … after the id's carrier, or
        after the cursor when the connection began inside an id's run)."""
        window, position = divmod(ordinal - 1, FOLLOWER_WINDOW)
        if position == 0:
            self._seen.clear()
        digest = data_digest(event_type, data)
        repeat = self._seen.get(digest, 0)
        self._seen[digest] = repeat + 1
        return digest + _SUFFIX.pack(window, repeat)
