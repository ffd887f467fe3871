"""The web-platform-tests ``eventsource/format-*`` vectors, ported to the decoder.

Source: https://github.com/web-platform-tests/wpt/tree/master/eventsource (each test cites
its file). The WPT server script ``eventsource/resources/message.py`` (``message.php`` in
older trees) answers ``message + ("\\n\\n" unless newline=none) + "\\n"`` with the given
``mime`` as Content-Type; :func:`message_body` rebuilds exactly that body. Every vector
runs twice: fed whole, and one byte at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from durable_sse.sse.content_type import is_event_stream
from durable_sse.sse.decoder import Comment, DecodedEvent, SSEDecoder


def message_body(message: bytes, *, newline: bool = True) -> bytes:
    """The body eventsource/resources/message.py sends for ``message``."""
    return message + (b"\n\n" if newline else b"") + b"\n"


@dataclass
class Decoded:
    events: list[DecodedEvent]
    comments: list[str]
    last_event_id: str
    retry: int | None


def decode(body: bytes, *, bytewise: bool, last_event_id: str = "") -> Decoded:
    decoder = SSEDecoder(last_event_id=last_event_id)
    items: list[DecodedEvent | Comment] = []
    chunks = [body[i : i + 1] for i in range(len(body))] if bytewise else [body]
    for chunk in chunks:
        items += decoder.feed(chunk)
    items += decoder.close()
    return Decoded(
        events=[item for item in items if isinstance(item, DecodedEvent)],
        comments=[item.text for item in items if isinstance(item, Comment)],
        last_event_id=decoder.last_event_id,
        retry=decoder.retry,
    )


def datas(decoded: Decoded) -> list[str]:
    return [event.data for event in decoded.events]


bytewise = pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])


@bytewise
def test_format_bom(bytewise: bool) -> None:
    # eventsource/format-bom.js: only the first BOM is stripped; the second makes the
    # field name "\ufeffdata", an unknown field, so event "2" never fires.
    body = message_body(b"\xef\xbb\xbfdata:1\n\n\xef\xbb\xbfdata:2\n\ndata:3")
    assert datas(decode(body, bytewise=bytewise)) == ["1", "3"]


@bytewise
def test_format_bom_2(bytewise: bool) -> None:
    # eventsource/format-bom-2.any.js: a double BOM loses the first event, not the second.
    body = message_body(b"\xef\xbb\xbf\xef\xbb\xbfdata:1\n\ndata:2\n\ndata:3")
    assert datas(decode(body, bytewise=bytewise)) == ["2", "3"]


@bytewise
def test_format_comments(bytewise: bool) -> None:
    # eventsource/format-comments.js (newline=none): comments end with CR, LF and CRLF,
    # one is 2 KiB long, one looks like a field; none of them disturbs the data lines.
    longstring = "x" * 2048
    message = (
        f"data:1\r:\0\n:\r\ndata:2\n:{longstring}\rdata:3\n:data:fail\r:{longstring}\ndata:4\n"
    )
    decoded = decode(message_body(message.encode(), newline=False), bytewise=bytewise)
    assert datas(decoded) == ["1\n2\n3\n4"]
    assert decoded.comments == ["\0", "", longstring, "data:fail", longstring]


@bytewise
def test_format_data_before_final_empty_line(bytewise: bool) -> None:
    # eventsource/format-data-before-final-empty-line.js (newline=none): the second event
    # has no closing blank line, so it is discarded and its id never becomes the last
    # event id (the reconnect sends none: lastEventId "" on the re-delivered test1).
    body = message_body(b"retry:1000\ndata:test1\n\nid:test\ndata:test2", newline=False)
    decoded = decode(body, bytewise=bytewise)
    assert decoded.events == [DecodedEvent("test1", "message", "", False)]
    assert decoded.last_event_id == ""
    assert decoded.retry == 1000


@bytewise
def test_format_field_data(bytewise: bool) -> None:
    # eventsource/format-field-data.js: "data:" gives "", two bare "data" lines give "\n".
    body = message_body(b"data:\n\ndata\ndata\n\ndata:test")
    assert datas(decode(body, bytewise=bytewise)) == ["", "\n", "test"]


@bytewise
def test_format_field_event(bytewise: bool) -> None:
    # eventsource/format-field-event.htm: a custom type, then the default "message".
    body = message_body(b"event:test\ndata:x\n\ndata:x")
    decoded = decode(body, bytewise=bytewise)
    assert [(event.event, event.data) for event in decoded.events] == [
        ("test", "x"),
        ("message", "x"),
    ]


@bytewise
def test_format_field_event_empty(bytewise: bool) -> None:
    # eventsource/format-field-event-empty.htm: an empty event type means "message".
    decoded = decode(message_body(b"event: \ndata:data"), bytewise=bytewise)
    assert [(event.event, event.data) for event in decoded.events] == [("message", "data")]


LAST_EVENT_ID_FIRST = "id: \u2026\nretry: 200\ndata: hello\n\n".encode()
"""eventsource/resources/last-event-id.py without a Last-Event-ID request header."""


def last_event_id_echo(last_event_id: str) -> bytes:
    """eventsource/resources/last-event-id.py when the request carries Last-Event-ID."""
    return f"data: {last_event_id}\n\n".encode()


@bytewise
def test_format_field_id(bytewise: bool) -> None:
    # eventsource/format-field-id.htm: the id "…" (U+2026) is the last event id, sent back
    # on reconnect, and stays in force for the echoed event that has no id field.
    first = decode(LAST_EVENT_ID_FIRST, bytewise=bytewise)
    assert first.events == [DecodedEvent("hello", "message", "\u2026", True)]
    assert (first.last_event_id, first.retry) == ("\u2026", 200)
    again = decode(
        last_event_id_echo(first.last_event_id),
        bytewise=bytewise,
        last_event_id=first.last_event_id,
    )
    assert again.events == [DecodedEvent("\u2026", "message", "\u2026", False)]


@bytewise
def test_format_field_id_2(bytewise: bool) -> None:
    # eventsource/format-field-id-2.any.js: the id persists over two reconnects.
    cursor = decode(LAST_EVENT_ID_FIRST, bytewise=bytewise).last_event_id
    for _ in range(2):
        again = decode(last_event_id_echo(cursor), bytewise=bytewise, last_event_id=cursor)
        assert [(event.data, event.id) for event in again.events] == [("\u2026", "\u2026")]
        cursor = again.last_event_id
    assert cursor == "\u2026"


@bytewise
@pytest.mark.parametrize(
    ("body", "ids"),
    [
        # eventsource/resources/last-event-id2.py, type=1 (ID_PERSISTS)
        (b"id: 1\ndata: 1\n\ndata:2\n\n", ["1", "1"]),
        # type=2 (ID_CHANGES_AND_PERSISTS)
        (b"id: 1\ndata: 1\n\nid: 2\ndata:2\n\ndata:3\n\n", ["1", "2", "2"]),
        # type=3 (ID_RESETS): an empty id field resets the last event id to ""
        (b"id: 1\ndata: 1\n\nid:\ndata:2\n\ndata:3\n\n", ["1", "", ""]),
    ],
    ids=["persists", "changes-and-persists", "resets"],
)
def test_format_field_id_3(body: bytes, ids: list[str], bytewise: bool) -> None:
    # eventsource/format-field-id-3.htm
    decoded = decode(body, bytewise=bytewise)
    assert [event.id for event in decoded.events] == ids
    assert decoded.last_event_id == ids[-1]


@bytewise
def test_format_field_id_null(bytewise: bool) -> None:
    # eventsource/format-field-id-null.htm (last-event-id.py?idvalue=%00%00): an id that
    # contains U+0000 is ignored, so no Last-Event-ID is sent and "hello" comes again with
    # lastEventId "". (One old revision of the file asserted "\0\0" for the first event,
    # contradicting its own second assertion and the spec; we follow the spec.)
    decoded = decode(b"id: \0\0\nretry: 200\ndata: hello\n\n", bytewise=bytewise)
    assert decoded.events == [DecodedEvent("hello", "message", "", False)]
    assert decoded.last_event_id == ""


@bytewise
def test_format_field_parsing(bytewise: bool) -> None:
    # eventsource/format-field-parsing.any.js (newline=none): field names are exact
    # ("Data", "data\0", "da-ta", "data_5", " data" are unknown) and only one space goes.
    message = (
        "data:\0\ndata:  2\rData:1\ndata\0:2\ndata:1\r\0data:4\nda-ta:3\rdata_5\ndata:3\r"
        "data:\r\n data:32\ndata:4\n"
    )
    decoded = decode(message_body(message.encode(), newline=False), bytewise=bytewise)
    assert datas(decoded) == ["\0\n 2\n1\n3\n\n4"]


@bytewise
@pytest.mark.parametrize(
    ("message", "retry"),
    [
        # eventsource/format-field-retry.htm: "02000" is decimal 2000, not octal
        (b"retry:02000\ndata:x", 2000),
        # eventsource/format-field-retry-bogus.htm: "1000x" is ignored, 2000 stays
        (b"retry:2000\nretry:1000x\ndata:x", 2000),
        # eventsource/format-field-retry-empty.any.js: a bare "retry" is ignored
        (b"retry\ndata:test", None),
    ],
    ids=["retry", "retry-bogus", "retry-empty"],
)
def test_format_field_retry(message: bytes, retry: int | None, bytewise: bool) -> None:
    decoded = decode(message_body(message), bytewise=bytewise)
    assert decoded.retry == retry
    assert len(decoded.events) == 1


@bytewise
def test_format_field_unknown(bytewise: bool) -> None:
    # eventsource/format-field-unknown.any.js: unknown fields, a line with no colon that
    # is not a known field, and a comment are all ignored; bare "data" adds "".
    body = message_body(
        b"data:test\n data\ndata\nfoobar:xxx\njustsometext\n:thisisacommentyay\ndata:test"
    )
    decoded = decode(body, bytewise=bytewise)
    assert datas(decoded) == ["test\n\ntest"]
    assert decoded.comments == ["thisisacommentyay"]


@bytewise
def test_format_leading_space(bytewise: bool) -> None:
    # eventsource/format-leading-space.any.js: only a space (not a tab) after the colon is
    # stripped; a CR ends the first line.
    decoded = decode(message_body(b"data:\ttest\rdata: \ndata:test"), bytewise=bytewise)
    assert datas(decoded) == ["\ttest\n\ntest"]


@bytewise
def test_format_newlines(bytewise: bool) -> None:
    # eventsource/format-newlines.any.js (newline=none): CRLF, LF, and a final CR + LF.
    body = message_body(b"data:test\r\ndata\ndata:test\r\n\r", newline=False)
    assert datas(decode(body, bytewise=bytewise)) == ["test\n\ntest"]


@bytewise
def test_format_null_character(bytewise: bool) -> None:
    # eventsource/format-null-character.html: U+0000 in data is kept.
    assert datas(decode(message_body(b"data:\0\n\n"), bytewise=bytewise)) == ["\0"]


@bytewise
def test_format_utf_8(bytewise: bool) -> None:
    # eventsource/format-utf-8.any.js: served as text/event-stream;charset=windows-1252,
    # the body is still decoded as UTF-8.
    assert is_event_stream("text/event-stream;charset=windows-1252")
    decoded = decode(message_body(b"data:ok\xe2\x80\xa6"), bytewise=bytewise)
    assert datas(decoded) == ["ok\u2026"]


def test_format_mime_bogus() -> None:
    # eventsource/format-mime-bogus.any.js: "x bogus" is not even a MIME type.
    assert is_event_stream("x bogus") is False


def test_format_mime_valid_bogus() -> None:
    # eventsource/format-mime-valid-bogus.htm: a valid MIME type, but not an event stream.
    assert is_event_stream("text/x-bogus") is False


def test_format_mime_trailing_semicolon() -> None:
    # eventsource/format-mime-trailing-semicolon.any.js: a trailing ";" is accepted.
    assert is_event_stream("text/event-stream;") is True
