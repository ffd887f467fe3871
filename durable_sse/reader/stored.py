"""What is already stored just ahead of a replaying connection, so it is not written again.

A replay (the ``replay`` signal, a repair on the lagged route, a retried attempt) re-reads
ids that are mostly stored already. Writing them costs a row each through the staging
table and an ``ON CONFLICT`` probe, only to be discarded; building their records costs the
event loop as much again. Instead the reader fetches the stored keys of the next id range,
a page at a time with one indexed query (:meth:`durable_sse.log.reads.Reads.stored_keys`),
and the intake drops an event whose key is in it before it becomes a record: it counts
as a duplicate, exactly what ``ON CONFLICT DO NOTHING`` would have made of it.

A key here is only ever one that was committed when its page was read, so a skipped
event was stored (retention may delete it meanwhile, only before the lagging id: the
skip leaves it where a write just before the delete would have left it). Everything else
(holes, ids past the last page, a page still being fetched) is written as before, with
``ON CONFLICT`` the backstop, so two attempts writing at once still count each new row
once. Gap evidence does not change: the intake reads and weighs every event as before;
only the rows it hands over are fewer.

A stored key means "skip" only for the same event: the page carries each row's digest
(:mod:`durable_sse.log.keys`), and an event whose key is stored under another digest (a
server that restarted its id counter) is skipped only if its extended key is stored too;
otherwise it is written, and the writer keeps it under the extended key and counts it
(``ids_reused``, counted there only). A NULL digest on either side is "unknown": skipped,
as ``ON CONFLICT`` would have made a duplicate of it.
"""

from __future__ import annotations

from collections import deque

from durable_sse.ids import IdOrder, compare_ids, is_newer
from durable_sse.log.keys import reused_key
from durable_sse.log.records import StoredKey, StoredPage

PAGE_ROWS = 8192
"""Stored keys one query fetches: a few ms of PostgreSQL, ~0.1 s of reading at 100k ev/s;
the pages held (:data:`KEEP_PAGES`) are ~4 MB per replaying connection."""
KEEP_PAGES = 3
"""Pages held at once: the one the reader is in and two fetched ahead of it (a fetch
competes with the reading for the interpreter, so it may take as long as a page's read)."""

MIN_HIT_SHARE = 4
"""Fetching stops when fewer than one in this many events read since the last page was
asked for were found stored."""

_ABSENT: object = object()


class StoredAhead:
    """Stored keys ahead of one replaying connection, page by page.

    The reader asks :meth:`next_fetch` after each chunk it hands to the intake, fetches
    the page it names in the background, and gives it to :meth:`add`; the intake asks
    :meth:`has` for every event that carries an id.

    Args:
        order: the stream's id order.
        start: the connection's cursor (the first page starts after it).
        page_rows: keys one page holds at most.
    """

    def __init__(self, order: IdOrder | str, *, start: str, page_rows: int = PAGE_ROWS) -> None:
        self.order = IdOrder(order)
        self.start = start
        self.page_rows = page_rows
        self.fetching = False
        """A page is being fetched (no second one is asked for meanwhile)."""
        self.done = False
        """Nothing more is stored ahead (a page came back short), or fetching failed."""
        self.pages_fetched = 0
        self.checked = 0
        """Events looked up since the last page was asked for."""
        self.hits = 0
        """Of those, how many were stored."""
        self._pages: deque[StoredPage] = deque()
        self._keys: dict[StoredKey, bytes | None] = {}
        """Each key held, with its row's digest."""

    def has(self, event_id: str, follower_key: bytes, digest: bytes | None = None) -> bool:
        """Whether this event was stored (and committed) when its page was read: its key
        under the same digest (or an unknown one), or else its extended key."""
        self.checked += 1
        keys = self._keys
        stored = keys.get((event_id, follower_key), _ABSENT)
        if stored is _ABSENT:
            return False
        if (
            stored is None
            or digest is None
            or stored == digest
            or (event_id, reused_key(digest, follower_key)) in keys
        ):
            self.hits += 1
            return True
        return False  # a reused id: written, and kept by the writer

    def next_fetch(self, last_read: str | None) -> str | None:
        """The id after which the next page starts, or None: no page to fetch now.

        The next page is asked for as soon as the reader is inside the page before the
        newest one, so it has one to two pages of reading to arrive in; a reader already
        past the newest page (it outran the fetches) skips ahead to where it reads.
        """
        if self.fetching or self.done:
            return None
        position = last_read or self.start
        if not self._pages:
            return position
        newest_page = self._pages[-1]
        if not newest_page.full:
            self.done = True
            return None
        last = newest_page.last_id
        assert last is not None  # a full page is not empty
        if len(self._pages) > 1:
            first = self._pages[-2].first_id
            if first is not None and compare_ids(position, first, self.order) < 0:
                return None
        outran = is_newer(position, last, self.order)
        if (
            not outran
            and self.checked >= self.page_rows // 2
            and self.hits * MIN_HIT_SHARE < self.checked
        ):
            # Inside the pages, few events read were stored: the ids do not come in the
            # stored order, or the replay is mostly new rows. Fetching more would cost
            # more than it saves. (A reader that outran the pages missed for that.)
            self.done = True
            return None
        self.checked = self.hits = 0
        return position if outran else last

    def add(self, page: StoredPage) -> None:
        """A page fetched (after the one before it): its keys count from now on."""
        self.fetching = False
        self.pages_fetched += 1
        self._pages.append(page)
        if page.digests is None:
            self._keys.update(dict.fromkeys(page.keys))
        else:
            self._keys.update(zip(page.keys, page.digests, strict=True))
        while len(self._pages) > KEEP_PAGES:
            keys = self._keys
            for key in self._pages.popleft().keys:
                keys.pop(key, None)
        if not page.full:
            self.done = True

    def give_up(self) -> None:
        """Fetching failed: write everything from here on (correct, only slower)."""
        self.fetching = False
        self.done = True
