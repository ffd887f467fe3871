"""Incremental decoder for ``text/event-stream`` bodies, exact to the WHATWG rules.

Why not httpx-sse's parser: it discards comment lines (so a ``: dropping events`` notice
is invisible), turns every keep-alive or extra blank line after an ``id`` into an event
with empty data, loses the first event behind a leading BOM, decodes with the charset the
server declares instead of UTF-8, and accepts ``retry: -5``. A durable consumer cannot
live with any of these, so this module implements
https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
itself.

Why our own bytes-level splitter instead of httpx-sse's text line splitter: CR and LF are
single bytes that never occur inside a multi-byte UTF-8 sequence, so the stream can be cut
into lines on bytes (``bytes.split``, C speed, no per-character loop) and only *complete*
lines are decoded, in one ``decode`` call per chunk. That makes the result independent of
where the transport splits chunks (a multi-byte character or a CRLF split across chunks
decodes the same) and it is faster than decoding text first.

Memory is bounded whatever the server sends. Two buffers grow with the input: the pending,
unterminated line (capped by ``max_line_bytes``; a comment, an ``id`` or an ``event``
value is one line, so it is capped too) and the data of an event whose blank line has not
come yet (capped by ``max_event_bytes``). An event's data that spans chunks is held as
UTF-8 bytes in one ``bytearray``, not as a list of line strings, so a server sending
millions of short ``data:`` lines costs their bytes, not an object per line. The data is
measured as the UTF-8 bytes of the decoded text, the ``\n`` between lines included; the
check runs once per chunk and at dispatch, so an endless event raises after at most
``max_event_bytes`` + one chunk. An id over ``max_id_bytes`` raises when its event is
dispatched, before it can become the cursor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from durable_sse.errors import EventTooLargeError, IdTooLongError, LineTooLongError

logger = logging.getLogger(__name__)

BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_LINE_BYTES = 1024 * 1024
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ID_BYTES = 1024


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    """One dispatched event."""

    data: str
    event: str = "message"
    """The event type; ``message`` when the event had no (or an empty) ``event`` field."""
    id: str = ""
    """The last event id in force at dispatch (``""`` = none)."""
    id_field: bool = False
    """This event itself carried an ``id`` field that was not ignored."""


@dataclass(frozen=True, slots=True)
class Comment:
    """A comment line; drop notices and keep-alives arrive this way."""

    text: str
    """The text after ``:`` with one leading space stripped (``": ping"`` -> ``"ping"``)."""


class SSEDecoder:
    """Turns the bytes of one connection's body into events and comments, in stream order.

    One decoder per connection: ``feed`` each chunk as it arrives, then ``close`` at the
    end of the body. A little over the house's ~300 lines for a class: it is the hot
    loop (about 2 us an event), and its state lives in one object's slots so the loop
    reads locals, not attributes of helpers. ``last_event_id`` is the id the connection
    resumed from (the one sent as ``Last-Event-ID``): as in a browser it stays in force
    for events without an id until the stream sets another.

    Args:
        max_line_bytes: longest line (``LineTooLongError`` past it).
        max_event_bytes: most data one event may carry, as UTF-8 bytes of the decoded
            lines and the LFs between them (``EventTooLargeError`` past it; default 8 MiB).
        max_id_bytes: longest id, as UTF-8 bytes, an event may commit as the cursor
            (``IdTooLongError`` past it; default 1024, below PostgreSQL's index row limit).

    Attributes:
        last_event_id: the stream's last event id string. Like a browser's ``lastEventId``
            it is committed when an event is dispatched (a blank line), also for events
            that are not dispatched for lack of data; an ``id`` of an event that never
            completed does not count. This is the cursor to resume from.
        retry: the last valid ``retry`` value in milliseconds, None if none was seen.
    """

    def __init__(
        self,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_id_bytes: int = DEFAULT_MAX_ID_BYTES,
        last_event_id: str = "",
    ) -> None:
        for name, value in (
            ("max_line_bytes", max_line_bytes),
            ("max_event_bytes", max_event_bytes),
            ("max_id_bytes", max_id_bytes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.max_id_bytes = max_id_bytes
        # Text of at most limit // 4 characters is at most limit bytes of UTF-8: only
        # longer text pays for an exact measure.
        self._event_chars_ok = max_event_bytes // 4
        self._id_chars_ok = max_id_bytes // 4
        self._last_event_id = last_event_id
        self.retry: int | None = None
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._skip_lf = False
        self._at_start = True
        self._carry: bytearray | None = None
        """Data of the current event from earlier chunks: UTF-8, lines joined by LF."""
        self._event_type = ""
        self._id_buffer = last_event_id
        self._id_field = False

    @property
    def last_event_id(self) -> str:
        return self._last_event_id

    @last_event_id.setter
    def last_event_id(self, value: str) -> None:
        """Set the id resumed from (before feeding): it also becomes the id in force."""
        self._last_event_id = value
        self._id_buffer = value

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the current unterminated line (never above ``max_line_bytes``)."""
        return self._pending_len

    @property
    def event_bytes(self) -> int:
        """Bytes of data held for an event still open after the last chunk (never above
        ``max_event_bytes``)."""
        return len(self._carry) if self._carry is not None else 0

    def feed(self, chunk: bytes) -> list[DecodedEvent | Comment]:
        """Consume one chunk; return the events and comments it completed, in stream order.

        Raises:
            LineTooLongError: a line grew past ``max_line_bytes``.
            EventTooLargeError: an event's data grew past ``max_event_bytes``.
            IdTooLongError: an event being dispatched has an id over ``max_id_bytes``.
                For each the decoder drops what it held, ``last_event_id`` is the id in
                force before the event that held the bad line, data or id, and the
                error's ``items`` are what this chunk completed before it (received: the
                caller stores them). After any of these errors, end the connection: the
                decoder is not fed again.
        """
        if (
            chunk[-1:] == b"\n"
            and not self._pending
            and not self._skip_lf
            and not self._at_start
            and b"\r" not in chunk
            and len(chunk) <= self.max_line_bytes
        ):
            # Fast path, the usual case: whole LF-terminated lines, nothing held over.
            lines = chunk.decode("utf-8", "replace").split("\n")
            lines.pop()
            return self._process(lines)
        return self._feed_general(chunk)

    def _feed_general(self, chunk: bytes) -> list[DecodedEvent | Comment]:
        """Every case: CR line ends, held-over partial lines, a BOM, long lines."""
        if not chunk:
            return []
        if self._skip_lf:
            # A CR ended the previous chunk: an LF right after it is the same line end.
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if self._at_start:
            chunk = self._strip_bom(chunk)
            if not chunk:
                return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if self._pending_len > self.max_line_bytes:
                self._too_long([])
            return []
        if self._pending:
            self._pending.append(chunk)
            data = b"".join(self._pending)
            self._pending.clear()
        else:
            data = chunk
        if b"\r" in data:
            if data[-1] == 0x0D:
                self._skip_lf = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n")
        rest = data[end + 1 :]
        self._pending_len = len(rest)
        if rest:
            self._pending.append(rest)
        if len(data) > self.max_line_bytes:
            lines = data[:end].split(b"\n")
            limit = self.max_line_bytes
            long_at = next((i for i, line in enumerate(lines) if len(line) > limit), None)
            if long_at is not None or self._pending_len > limit:
                # The lines before the long one are whole: what they complete is kept.
                before = lines if long_at is None else lines[:long_at]
                self._too_long(self._process([line.decode("utf-8", "replace") for line in before]))
        return self._process(data[:end].decode("utf-8", "replace").split("\n"))

    def close(self) -> list[DecodedEvent | Comment]:
        """End of stream: process a final unterminated line, discard an incomplete event.

        The last line is still interpreted (so a trailing ``: dropping events`` comment or
        ``retry`` field without a line end is seen), but the event it belongs to has no
        closing blank line and is not dispatched, as the spec requires.
        """
        items: list[DecodedEvent | Comment] = []
        if self._pending:
            items = self._process([b"".join(self._pending).decode("utf-8", "replace")])
        self._pending.clear()
        self._pending_len = 0
        self._skip_lf = False
        self._carry = None
        self._event_type = ""
        self._id_buffer = self._last_event_id
        self._id_field = False
        return items

    def _strip_bom(self, chunk: bytes) -> bytes:
        """Strip one UTF-8 BOM at stream start, even when it is split across chunks."""
        head = b"".join(self._pending) + chunk if self._pending else chunk
        if len(head) < len(BOM) and BOM.startswith(head):
            # Held until the next chunk says whether it is a BOM. Not a line's bytes yet
            # (the next feed takes them back here), so the line cap does not count them.
            self._pending = [head]
            self._pending_len = 0
            return b""
        self._pending.clear()
        self._pending_len = 0
        self._at_start = False
        return head[len(BOM) :] if head.startswith(BOM) else head

    def _too_long(self, items: list[DecodedEvent | Comment]) -> None:
        self._pending.clear()
        self._pending_len = 0
        self._carry = None
        self._event_type = ""
        self._id_buffer = self._last_event_id
        self._id_field = False
        raise LineTooLongError(
            f"an SSE line exceeded max_line_bytes={self.max_line_bytes} bytes; "
            "ending the connection to bound memory",
            items=items,
        )

    def _process(self, lines: list[str]) -> list[DecodedEvent | Comment]:
        """Interpret complete lines.

        This is the hot loop: state lives in locals and is written back once, and events
        are built through their slot descriptors (a frozen dataclass's ``__init__`` costs
        a third of the per-event budget; the result is an ordinary, equal ``DecodedEvent``).
        """
        out: list[DecodedEvent | Comment] = []
        data: list[str] = []
        carry = self._carry
        event_type = self._event_type
        id_buffer = self._id_buffer
        id_field = self._id_field
        last_event_id = self._last_event_id
        id_chars_ok = self._id_chars_ok
        event_chars_ok = self._event_chars_ok
        for line in lines:
            if not line:
                # Blank line: dispatch. The id is committed even when nothing is dispatched.
                if id_field and len(id_buffer) > id_chars_ok:
                    self._check_id(id_buffer, out, last_event_id)
                if data or carry is not None:
                    if carry is None:
                        text = "\n".join(data)
                        if len(text) > event_chars_ok:
                            self._check_event_size(_utf8_len(text), out, last_event_id)
                    else:
                        text = self._join_carried(carry, data, out, last_event_id)
                        carry = None
                    event = _new_event(DecodedEvent)
                    _set_data(event, text)
                    _set_type(event, event_type or "message")
                    _set_id(event, id_buffer)
                    _set_id_field(event, id_field)
                    out.append(event)
                    data = []
                last_event_id = id_buffer
                event_type = ""
                id_field = False
                continue
            name, colon, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
            elif not name and colon:
                out.append(Comment(value))
            elif name == "id":
                if "\0" not in value:
                    id_buffer = value
                    id_field = True
            elif name == "event":
                event_type = value
            elif name == "retry":
                if value.isdigit() and value.isascii():
                    try:
                        self.retry = int(value)
                    except ValueError:  # more digits than int() will parse: ignore it
                        logger.debug("ignoring a retry field of %d digits", len(value))
            # Any other field name is ignored, as the spec requires.
        if data:
            # The event goes on in the next chunk: hold its lines as one bytes buffer.
            piece = "\n".join(data).encode("utf-8", "surrogatepass")
            if carry is None:
                carry = bytearray(piece)
            else:
                carry += b"\n"
                carry += piece
            if len(carry) > self.max_event_bytes:
                self._check_event_size(len(carry), out, last_event_id)
        self._carry = carry
        self._event_type = event_type
        self._id_buffer = id_buffer
        self._id_field = id_field
        self._last_event_id = last_event_id
        return out

    def _join_carried(
        self,
        carry: bytearray,
        data: list[str],
        out: list[DecodedEvent | Comment],
        last_event_id: str,
    ) -> str:
        """The data of an event that spanned chunks: what was carried, then this chunk's."""
        if data:
            carry += b"\n"
            carry += "\n".join(data).encode("utf-8", "surrogatepass")
        self._check_event_size(len(carry), out, last_event_id)
        return carry.decode("utf-8", "surrogatepass")

    def _check_event_size(
        self, size: int, out: list[DecodedEvent | Comment], last_event_id: str
    ) -> None:
        if size > self.max_event_bytes:
            self._fail(
                EventTooLargeError(
                    f"an SSE event's data exceeded max_event_bytes={self.max_event_bytes} "
                    "bytes; ending the connection to bound memory (the cursor stays before "
                    "this event)",
                    items=out,
                ),
                last_event_id,
            )

    def _check_id(
        self, event_id: str, out: list[DecodedEvent | Comment], last_event_id: str
    ) -> None:
        size = _utf8_len(event_id)
        if size > self.max_id_bytes:
            self._fail(
                IdTooLongError(
                    f"an SSE event id of {size} bytes exceeded max_id_bytes="
                    f"{self.max_id_bytes} (it starts {event_id[:32]!r}); such an id cannot "
                    "become a cursor (the cursor stays before this event)",
                    items=out,
                ),
                last_event_id,
            )

    def _fail(self, error: Exception, last_event_id: str) -> None:
        """Release every buffer, keep the id in force before the bad event, raise."""
        self._pending.clear()
        self._pending_len = 0
        self._carry = None
        self._event_type = ""
        self._last_event_id = last_event_id
        self._id_buffer = last_event_id
        self._id_field = False
        raise error


def _utf8_len(text: str) -> int:
    """UTF-8 length of ``text``; O(1) for ASCII (CPython knows a str is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


_new_event = object.__new__
# The slots' own setters (a frozen dataclass refuses plain assignment), read from the
# class dict: ``vars(DecodedEvent)["data"]`` is the very descriptor ``DecodedEvent.data`` is, but a
# type checker takes ``DecodedEvent.data`` for the instance attribute, a str.
_slots = vars(DecodedEvent)
_set_data = _slots["data"].__set__
_set_type = _slots["event"].__set__
_set_id = _slots["id"].__set__
_set_id_field = _slots["id_field"].__set__
