"""Session recording and replay (the ``replay`` capability, ``serve --record DIR``).

* :class:`SessionRecorder` appends every envelope of a session, in and out, to a log file
  (format: :mod:`smith_fast.replay.format`);
* :func:`read_log` / :class:`LogReader` read one back, stopping quietly at a torn tail;
* :class:`Replayer` re-sends the recorded input, bad input included, to a service and diffs the
  events (:mod:`smith_fast.replay.diff` says what is normalised away);
* :mod:`smith_fast.replay.cli` is ``smith-fast replay``.

Recording a session in the service: open a recorder when the session starts (``serve --record DIR``)
or when ``replay`` is granted, with ``on_error`` reporting a write failure to the client as a
LogEvent; then, on a v1 connection, ``record_in(frame)`` for every frame that is an Envelope,
``record_malformed(frame)`` for every one that is not, ``record_discarded(...)`` for a length
prefix that broke the framing, and ``record_out_frame(data)`` for every frame the sink writes (or
``record_out`` with the bare Envelope, e.g. from ``events.encode_*(..., framed=False)``); on a v0
connection ``record_line(line, malformed=...)`` for every line as it arrived,
``record_discarded(...)`` for an oversize one, and ``record_event(event)`` for every event (the v1
equivalent; from a line the sink wrote, ``record_event(codec.decode_event(line))``). The token
must be taken out first (``smith_fast.service.redact``). ``close()`` when the session ends. Records are written once per loop tick by the recorder itself;
no flush call is needed.
"""

from __future__ import annotations

from .format import (
    DIRECTION_IN,
    DIRECTION_OUT,
    FILE_SUFFIX,
    FORMAT_VERSION,
    RECORD_IN,
    RECORD_IN_DISCARDED,
    RECORD_IN_LINE,
    RECORD_IN_MALFORMED,
    RECORD_OUT,
    LogFormatError,
    LogHeader,
)
from .store import RecordingStore
from .writer import SessionRecorder

# Not typing.TYPE_CHECKING: the same names, imported on first use (below), as mypy sees them here.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .diff import Transcript, diff_transcripts
    from .reader import Discarded, LogReader, Record, TornTail, read_log
    from .replayer import Replayer, ReplayResult

# What only `smith-fast replay` and the tests use: reading and replaying a log drives a service with
# the SDK, whose import (the client, the v0 codec) a serving process that records need not pay at start.
_LATER = {"Transcript": "diff", "diff_transcripts": "diff", "Discarded": "reader", "LogReader": "reader",
          "Record": "reader", "TornTail": "reader", "read_log": "reader", "Replayer": "replayer",
          "ReplayResult": "replayer"}

__all__ = [
    "DIRECTION_IN",
    "DIRECTION_OUT",
    "Discarded",
    "FILE_SUFFIX",
    "FORMAT_VERSION",
    "LogFormatError",
    "LogHeader",
    "LogReader",
    "RECORD_IN",
    "RECORD_IN_DISCARDED",
    "RECORD_IN_LINE",
    "RECORD_IN_MALFORMED",
    "RECORD_OUT",
    "Record",
    "ReplayResult",
    "Replayer",
    "RecordingStore",
    "SessionRecorder",
    "TornTail",
    "Transcript",
    "diff_transcripts",
    "read_log",
]


def __getattr__(name: str) -> object:
    if name not in _LATER:
        raise AttributeError(f"module 'smith_fast.replay' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LATER[name]}", __name__), name)
    globals()[name] = value  # once: the next look-up is a plain module attribute
    return value
