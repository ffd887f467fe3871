"""Is a response's ``Content-Type`` an event stream?

httpx-sse checks with a substring test, which accepts ``text/event-stream-bogus`` and
``text/plain;x=text/event-stream``. Here the essence (``type/subtype``) is parsed as the
WHATWG MIME type parser does and compared exactly; parameters such as ``charset`` or a
trailing ``;`` are allowed (and the charset is ignored: the body is always UTF-8).
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_ESSENCE = re.compile(rf"({_TOKEN})/({_TOKEN})")
_HTTP_WHITESPACE = " \t\r\n"


def is_event_stream(content_type: str | None) -> bool:
    """True when ``content_type`` is ``text/event-stream`` (any case), with any parameters."""
    if not content_type:
        return False
    essence = content_type.partition(";")[0].strip(_HTTP_WHITESPACE)
    match = _ESSENCE.fullmatch(essence)
    if match is None:
        return False
    return f"{match.group(1)}/{match.group(2)}".lower() == EVENT_STREAM
