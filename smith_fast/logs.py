"""Structured logging to stderr (stdout is the protocol channel in stdio mode).

Each record is one JSON object per line: ``{"ts": ..., "level": ..., "logger": ..., "event": ..., ...}``
plus whatever was passed in ``extra={"fields": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from typing import IO, Any

__all__ = ["TickStreamHandler", "conceal", "configure", "direct_handlers", "encode_json", "get_logger", "log_fields"]

# json.dumps(default=...) builds a new encoder per call; the same encoder, built once
_ENCODER = json.JSONEncoder(default=str)

try:  # several times faster than json for the audit line of every request (optional dependency)
    import orjson
except ImportError:  # pragma: no cover - the v0 and MCP extras install it
    orjson = None  # type: ignore[assignment]  # the stdlib encoder serves alone


_secrets: tuple[str, ...] = ()  # replaced in every line written (conceal)
_REDACTED = "<redacted>"


def conceal(secret: str | None) -> None:
    """Never write ``secret`` (the service's token) in a log line, whatever carries it (a command's
    text in the audit line, a peer's message quoted in an error): replaced by ``<redacted>`` as it
    appears in the JSON, escaped or not. One substring search per written batch of lines."""
    global _secrets
    if not secret:
        return
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    _secrets = tuple(dict.fromkeys((*_secrets, *sorted(forms, key=len, reverse=True))))


def encode_json(out: Any) -> str:
    """``out`` as the JSON of a log line (orjson's, else the stdlib's for what orjson refuses)."""
    if orjson is not None:
        try:
            return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:
            pass  # what orjson refuses (an int beyond 64 bits): the stdlib encoder takes it
    return _ENCODER.encode(out)


def _ts(seconds: float) -> float:
    """A line's ``ts``: seconds to the millisecond (``round(seconds, 3)``'s value without its trip
    through a decimal string, a tenth of the audit line's cost)."""
    return int(seconds * 1000 + 0.5) / 1000


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return encode_json(out)


LINGER = 0.05
"""Seconds a line given to :meth:`TickStreamHandler.add_line` with ``linger`` (the audit line of
every request) may wait to be written with the lines after it."""
LINGER_BYTES = 16 * 1024
"""Lines waiting past this many characters are written at the end of the loop's tick."""


class TickStreamHandler(logging.Handler):
    """Writes records to ``stream``, many lines in one write.

    The service writes a line per request (the audit trail, service/audit.py): one ``write`` per
    line cost the server more than the request itself, and one per event-loop tick still cost a
    sequential caller a write and a wake of whoever reads the log, on every call. Lines emitted while
    an event loop runs in the emitting thread are kept until the end of that loop's tick
    (``call_soon``); the audit lines (``add_line(..., linger=True)``) for at most :data:`LINGER`
    seconds (``call_later``), unless another line or :data:`LINGER_BYTES` of them end the wait
    sooner; then all are written together, in order. Records from other threads, or with no loop
    running, are written at once (after whatever was kept, so lines stay in order).
    ``logging.shutdown`` (at exit) writes what a stopped loop left.
    """

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self._pending: list[str] = []
        self._size = 0  # characters in _pending
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop a write is scheduled on
        self._soon = False  # at the end of its tick (else after LINGER)
        self._thread = threading.get_ident()  # only that loop's thread defers its lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._add(line, False)

    def add_line(self, line: str, linger: bool = False) -> None:
        """Write ``line`` (one JSON line, ``\\n`` included) as :meth:`emit` writes a record's;
        with ``linger``, within :data:`LINGER` seconds rather than at the end of this tick."""
        # acquire and release, not ``with``: every request's audit line comes here, and the
        # context manager's lookups and calls cost twice the lock itself
        lock = self.lock
        lock.acquire()  # type: ignore[union-attr]  # Handler.createLock made it
        try:
            self._add(line, linger)
        finally:
            lock.release()  # type: ignore[union-attr]  # likewise

    def _add(self, line: str, linger: bool) -> None:
        loop = self._loop
        # A write is scheduled on a loop running in this thread: that is the running loop (and
        # asyncio._get_running_loop, which calls getpid(), is not needed).
        if loop is None or not loop.is_running() or threading.get_ident() != self._thread:
            loop = asyncio._get_running_loop()
            if self._pending and self._loop is not loop:
                self._write()  # a former loop's lines, which it stopped before writing
            if loop is None or threading.get_ident() != self._thread:
                self._pending.append(line)
                self._write()
                self._loop = None
                return
            self._loop, self._soon = loop, False
            self._pending.append(line)
            self._size += len(line)
            if not linger or self._size >= LINGER_BYTES:
                self._soon = True
                loop.call_soon(self._tick)
            else:
                loop.call_later(LINGER, self._tick)
            return
        self._pending.append(line)
        self._size += len(line)
        if (not linger or self._size >= LINGER_BYTES) and not self._soon:
            self._soon = True
            loop.call_soon(self._tick)  # the lingering write's timer then finds nothing to write

    def _tick(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            if self._pending:
                self._write()
            self._loop = None

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            self._loop = None
            self._write()

    def _write(self) -> None:
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        self._size = 0
        for secret in _secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or gone: nobody is left to tell


def configure(level: str = "info") -> None:
    """Send every ``smith_fast`` log record to stderr as JSON lines."""
    handler = TickStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    # The JSON lines name no source line, thread or process: skip finding them per record
    # (the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger("smith_fast")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.Formatter.converter = time.gmtime


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("smith_fast") else f"smith_fast.{name}")


_LEVELS = {level: logging.getLevelName(level).lower() for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)}


def log_fields(logger: logging.Logger, level: int, event: str, fields: dict[str, Any], *, linger: bool = False) -> None:
    """``logger.log(level, event, extra={"fields": fields})``, the same line, for hot paths (the
    audit line of every request).

    Where only :func:`configure`'s handler listens (no filters on the way), the line is built and
    handed to it directly, without a ``LogRecord`` and the dispatch through the logger tree;
    otherwise (tests capturing records, another handler) it goes through ``logging`` as usual.
    """
    if not logger.isEnabledFor(level):
        return
    handlers = direct_handlers(logger, level)
    if handlers is None:
        logger.log(level, event, extra={"fields": fields})
        return
    out: dict[str, Any] = {
        "ts": _ts(time.time()),
        "level": _LEVELS.get(level) or logging.getLevelName(level).lower(),
        "logger": logger.name,
        "event": event,
    }
    out.update(fields)
    line = encode_json(out) + "\n"
    for handler in handlers:
        handler.add_line(line, linger)


def direct_handlers(logger: logging.Logger, level: int) -> list[TickStreamHandler] | None:
    """The handlers a record of ``logger`` at ``level`` reaches, if all are plain JSON-line
    :class:`TickStreamHandler` s and nothing filters on the way; None otherwise."""
    out: list[TickStreamHandler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if type(handler) is not TickStreamHandler or handler.filters or type(handler.formatter) is not JsonFormatter:
                return None
            if level >= handler.level:
                out.append(handler)
        if not current.propagate:
            break
        current = current.parent
    return out or None
