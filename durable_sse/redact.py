"""Redaction: what of a URL or a value may be shown in logs, messages and the Web UI.

A leaf module (it imports nothing of the package): the settings' error messages, the
reader and the CLI all show URLs and values, and each must hide the same things, by one
rule.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

TOKENISH_PARAM = re.compile(
    r"(token|key|secret|password|passwd|auth|signature|sig|session|jwt)", re.I
)
"""A query parameter whose name contains one of these words carries a credential: its
value is never shown, whether or not the stream declared it a secret."""


def redact_url(url: str, secret_params: frozenset[str] = frozenset()) -> str:
    """The URL with credentials and token-like query values removed: safe for logs and UI.

    ``secret_params`` names further parameters to hide (a stream's ``query_from_env``).
    """
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    query = [
        (k, "REDACTED" if k in secret_params or TOKENISH_PARAM.search(k) else v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def show_value(value: object, *, url: bool = False, limit: int = 80) -> str:
    """A value for a one-line message: repr (escapes line breaks), URLs redacted, cut."""
    if url and isinstance(value, str):
        try:
            value = redact_url(value)
        except ValueError:
            value = re.sub(r"[?#].*", "", value)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
