"""Secrets kept out of log lines.

The terminal route takes ``?api_key=`` (a browser's WebSocket cannot send headers), and
uvicorn logs each WebSocket's path with its query string; at debug level, libraries log
request headers (``authorization``, ``x-api-key``); a traceback may quote a URL. The
server's log handlers format through ``RedactingFormatter``, which writes every such
value as ``***`` in the finished line, traceback included, whoever logged it.
"""

from __future__ import annotations

import logging
import re

# A query parameter (its name also percent-encoded: api%5Fkey) or a header line.
_SECRET_PARAM = re.compile(
    r"(\b(?:api(?:_|%5f)key|token|access(?:_|%5f)token)=)[^&\s\"']+", re.IGNORECASE
)
_SECRET_HEADER = re.compile(
    r"(\b(?:authorization|proxy-authorization|x-api-key|cookie|set-cookie)\b['\"]?\s*[:,=]\s*['\"]?)"
    r"(?:(?:bearer|basic)\s+)?[^\s'\",)]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the values of secret query parameters and headers as ``***``."""
    return _SECRET_HEADER.sub(r"\1***", _SECRET_PARAM.sub(r"\1***", text))


class RedactingFormatter(logging.Formatter):
    """A formatter whose every line, traceback included, passes through ``redact``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def redact_handlers(fmt: str, logger: logging.Logger | None = None) -> None:
    """Format every handler of ``logger`` (default: the root logger) with ``fmt`` through
    ``RedactingFormatter``, so records propagated from any library's logger are covered."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(RedactingFormatter(fmt))
