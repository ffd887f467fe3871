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

**Reused ids.** A server that restarts its id counter sends ids already stored, with
other data: "same key" is then not "same event". So a row also keeps a ``digest``
(:func:`data_digest`) of the event that *carried* its id: a carrier its own, a follower
its carrier's (as read on the same connection; NULL when the connection began inside the
id's run and never saw the carrier, and on rows stored before schema 4). An event whose
key is stored under another digest is kept under an *extended key*, :func:`reused_key`:
``REUSED_MARK``, its carrier's digest, then its ordinary key (17 bytes for a carrier,
41 for a follower, so it never equals an ordinary key: 0 or 24 bytes). A true re-send
(same id, same carrier, same follower) meets its own row, extended or not, and is a
duplicate; a third use of the id with other data gets an extended key of its own. A
NULL digest on either side means "unknown": the event is taken for the stored one, as
before schema 4. So followers of a reused id are kept apart from the earlier use's
followers even where their content is identical (``ping`` after ``id: 1`` of both
uses), as long as their connection read their carrier. What the digest cannot tell
apart: a new use of an id whose carrier has the very same type and data as the stored
one (its followers are then keyed as the earlier use's followers, as above), and, on a
connection that began inside an id's run, a follower of a reused id identical to one the
earlier use stored.
"""

from __future__ import annotations

import hashlib
import struct

CARRIER_KEY = b""
"""``follower_key`` of the event that carries its id."""
FOLLOWER_WINDOW = 65_536
"""Followers of one id whose identical repeats one count table covers."""
REUSED_MARK = b"r"
"""First byte of an extended key (:func:`reused_key`)."""
_SUFFIX = struct.Struct(">II")
_blake2b = hashlib.blake2b
_TYPE_PREFIX: dict[str, bytes] = {}
"""Per event type, the bytes the digest starts with (a stream has a handful of types)."""
_MAX_TYPES = 1024


def data_digest(event_type: str, data: str) -> bytes:
    """16 bytes that stand for an event's type and data (BLAKE2b of the type's UTF-8
    length, 4 bytes big-endian, the type, then the data). On the write path once per
    event: the type's prefix is built once per type."""
    prefix = _TYPE_PREFIX.get(event_type)
    if prefix is None:
        kind = event_type.encode("utf-8", "surrogatepass")
        prefix = len(kind).to_bytes(4, "big") + kind
        if len(_TYPE_PREFIX) < _MAX_TYPES:
            _TYPE_PREFIX[event_type] = prefix
    digest = _blake2b(prefix, digest_size=16)
    digest.update(data.encode("utf-8", "surrogatepass"))
    return digest.digest()


def reused_key(digest: bytes, key: bytes) -> bytes:
    """The extended key of an event whose id is stored with another carrier: the mark,
    its carrier's digest, its ordinary key (see the module docstring)."""
    return REUSED_MARK + digest + key


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
