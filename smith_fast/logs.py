"""Structured logging to stderr (stdout is the protocol channel in stdio mode).

Each record is one JSON object per line: ``{"ts": ..., "level": ..., "logger": ..., "event": ..., ...}``
plus whatever was passed in ``extra={"fields": {...}}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["configure", "get_logger"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "info") -> None:
    """Send every ``smith_fast`` log record to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("smith_fast")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.Formatter.converter = time.gmtime


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("smith_fast") else f"smith_fast.{name}")
