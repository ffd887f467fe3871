"""Logging set-up for entry points (library modules only create named loggers)."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with Temporal's activity/workflow context when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("temporal_activity", "temporal_workflow"):
            context = getattr(record, key, None)
            if isinstance(context, dict):
                entry.update({k: v for k, v in context.items() if isinstance(v, str | int)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class RedactingFilter(logging.Filter):
    """Hides credentials in records from libraries that log URLs (httpx logs each request).

    Query values are replaced whole: a library does not know which of them are tokens.
    """

    _QUERY = re.compile(r"(https?://[^\s?\"']*)\?[^\s\"']*")
    _USERINFO = re.compile(r"(https?://)[^/\s@]+@")
    _SECRET_HEADER = re.compile(
        r"((?:set-cookie|cookie|authorization|proxy-authorization)['\"]?,\s*b?['\"])[^'\"]*",
        re.IGNORECASE,
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._USERINFO.sub(r"\1", self._QUERY.sub(r"\1?REDACTED", message))
        redacted = self._SECRET_HEADER.sub(r"\1REDACTED", redacted)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


_REDACTION = RedactingFilter()


HTTP_LOGGERS = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
)
"""A logger's filters only see records logged on it, not its children's: name each."""


def install_redaction() -> None:
    """Attach the redacting filter to the HTTP libraries' loggers (idempotent)."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _REDACTION not in logger.filters:
            logger.addFilter(_REDACTION)


def configure_logging(log_format: str = "plain", level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx logs every request line with its full URL: quiet, and redacted if enabled.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    install_redaction()
