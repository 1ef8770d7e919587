"""Normalising two event streams and diffing them, request by request.

What a replay compares is a :class:`Transcript`: the service → client events of a session, split
into one stream per ``request_id`` plus one ``session`` stream for the events that belong to no
request (handshake state changes, Ready, capability warnings, session-wide logs, SHUTTING). Events
of different requests interleave differently from run to run; within one stream the order is the
service's contract, so it is compared as is.

Normalisation drops what differs between two runs of the same service on the same input:

* ``Envelope.timestamp`` and ``sequence``; every event ``timestamp``; ``ToolResult.duration_ms``;
* ``Ready.service_id`` and the ``service_info`` keys naming the build or the host
  (``version``, ``implementation``, ``event_loop``, ``build_timestamp``, ``git_commit``, ``smith_fast.recording``);
* ``LogEvent.fields`` ``trace_id`` and ``span_id`` (new for every run when tracing is on);
* the request id inside each event (it is the stream's key; replays reuse the recorded ids);
* every other UUID (graph node and edge ids, ids quoted in messages): replaced by ``<id1>``,
  ``<id2>`` ... in order of first appearance within its stream;
* how output was cut into ``ShellOutput`` chunks, which depends on pipe timing: consecutive
  output events of a request are merged, stdout then stderr (their relative order is not
  reproducible either), and shown line by line (long lines in 100-character pieces); the final
  event keeps ``exit_code``/``finished``;
* ``ResourceUsageEvent`` entirely, and the ``value`` and ``timestamp`` of ``MetricsEvent``
  (measurements, not behaviour). ``BatchEvent`` is unpacked into its events.
* what a command cost (PROTOCOL.md, "Accounting"): the figures of the ``command usage``
  ``LogEvent`` (its message; its fields, which only v1 has, are dropped) and of ``shell.run``'s
  ``usage`` result become ``<measured>``; their ``source`` and a ``limit_hit`` are kept.

``ToolResult.result`` and other JSON ``bytes`` are shown as JSON rather than base64.
"""

from __future__ import annotations

import base64
import difflib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.json_format import MessageToDict

from ..client import event_request_id
from ..pb import smith_pb2 as pb

__all__ = ["SESSION_STREAM", "Transcript", "diff_transcripts", "event_request_id", "render_event"]

SESSION_STREAM = ""
VARIABLE_SERVICE_INFO = frozenset({"version", "implementation", "event_loop", "build_timestamp", "git_commit", "smith_fast.recording"})
VARIABLE_LOG_FIELDS = frozenset({"trace_id", "span_id"})
OUTPUT_WIDTH = 100  # longer output lines are shown in pieces, so a diff points at the change
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_TIMESTAMPED = ("state_change", "log", "error")
# The accounting LogEvent (smith_fast.service.shell_exec.report_usage) and shell.run's "usage":
# measured figures, different in every run; these keys say what happened and are kept.
USAGE_MESSAGE = "command usage:"
KEPT_USAGE = frozenset({"source", "limit_hit"})
MEASURED = "<measured>"
_KEPT_PAIR = re.compile(r"\b(?:source|limit_hit)=\S+")


def _measured(usage: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if k in KEPT_USAGE or v is None else MEASURED) for k, v in usage.items()}



def _json_or_b64(raw: bytes) -> Any:
    try:
        return {"json": json.loads(raw)} if raw else ""
    except (ValueError, UnicodeDecodeError):
        return {"base64": base64.b64encode(raw).decode()}


def render_event(event: pb.Event) -> str:
    """One normalised line for ``event`` (request id, timestamps and durations removed)."""
    kind = event.WhichOneof("event_type")
    if kind is None:
        return "event {}"
    copy = pb.Event()
    copy.CopyFrom(event)
    inner = getattr(copy, kind)
    if kind in _TIMESTAMPED:
        inner.ClearField("timestamp")
    if "request_id" in inner.DESCRIPTOR.fields_by_name:
        inner.ClearField("request_id")
    if kind == "ready":
        inner.ClearField("service_id")
        for key in VARIABLE_SERVICE_INFO & set(inner.service_info):
            del inner.service_info[key]
    elif kind == "log":
        for key in VARIABLE_LOG_FIELDS & set(inner.fields):
            del inner.fields[key]
        if inner.message.startswith(USAGE_MESSAGE):
            # v1 carries the figures as fields too, v0 only in the message: compare what both say.
            kept = [m.group(0) for m in _KEPT_PAIR.finditer(inner.message)]
            inner.message = " ".join([USAGE_MESSAGE, *kept, MEASURED])
            inner.ClearField("fields")
    elif kind == "tool_result":
        inner.ClearField("duration_ms")
    body = MessageToDict(inner, preserving_proto_field_name=True)
    if kind == "tool_result" and inner.result:
        body["result"] = _json_or_b64(inner.result)
        value = body["result"].get("json") if isinstance(body["result"], dict) else None
        if isinstance(value, dict) and isinstance(value.get("usage"), dict):
            value["usage"] = _measured(value["usage"])
    elif kind == "hook_result":
        for name in ("allowed_data", "transformed_data"):
            if inner.action.HasField(name):
                body["action"][name] = _json_or_b64(getattr(inner.action, name))
    return f"{kind} {json.dumps(body, sort_keys=True, ensure_ascii=False)}"


@dataclass
class _Stream:
    lines: list[str] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    ids: dict[str, str] = field(default_factory=dict)

    def flush_output(self) -> None:
        for name, parts in (("stdout", self.stdout), ("stderr", self.stderr)):
            if parts:
                text = "".join(parts)
                parts.clear()
                for line in text.splitlines(keepends=True):
                    for at in range(0, len(line), OUTPUT_WIDTH):
                        self.lines.append(f"{name} {json.dumps(line[at : at + OUTPUT_WIDTH], ensure_ascii=False)}")

    def add(self, line: str, keep: frozenset[str]) -> None:
        self.flush_output()

        def placeholder(m: re.Match[str]) -> str:
            text = m.group(0)
            if text in keep:
                return text
            return self.ids.setdefault(text.lower(), f"<id{len(self.ids) + 1}>")

        self.lines.append(_UUID.sub(placeholder, line))


class Transcript:
    """The normalised events of a session, one list of lines per stream.

    Build it with :meth:`from_envelopes` (or :meth:`add` one event at a time, then :meth:`finish`).

    Args:
        request_ids: ids that stay literal when they appear inside other events (the session's own
            request ids; replays reuse them, so they match).

    Attributes:
        streams: stream key (a request id, or ``SESSION_STREAM``) → normalised lines, in first-event order.
        events: how many events were added.
    """

    def __init__(self, request_ids: Iterable[str] = ()) -> None:
        self._streams: dict[str, _Stream] = {}
        self._keep = frozenset(request_ids)
        self.events = 0

    def _stream(self, key: str) -> _Stream:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        return stream

    def add(self, event: pb.Event) -> None:
        """Add one service → client event."""
        self.events += 1
        rid = event_request_id(event)
        stream = self._stream(rid or SESSION_STREAM)
        if event.WhichOneof("event_type") == "shell_output":
            so = event.shell_output
            if so.HasField("stdout"):
                stream.stdout.append(so.stdout)
            if so.HasField("stderr"):
                stream.stderr.append(so.stderr)
            if not (so.finished or so.HasField("exit_code")):
                return
            final = pb.Event()
            final.shell_output.CopyFrom(so)
            final.shell_output.ClearField("stdout")
            final.shell_output.ClearField("stderr")
            event = final
        stream.add(render_event(event), self._keep)

    def add_envelope(self, envelope: pb.Envelope) -> None:
        """Add the events an outbound envelope carries (none for commands; a batch's in order)."""
        kind = envelope.WhichOneof("payload")
        if kind == "event":
            self.add(envelope.event)
        elif kind == "batch_event":
            for event in envelope.batch_event.events:
                self.add(event)
        elif kind == "metrics":
            self.events += 1
            m = envelope.metrics
            self._stream(SESSION_STREAM).add(
                "metrics " + json.dumps({"metric_name": m.metric_name, "labels": dict(m.labels)}, sort_keys=True), self._keep
            )
        elif kind == "health_check_response":
            self.events += 1
            status = pb.HealthCheckResponse.ServingStatus.Name(envelope.health_check_response.status)
            self._stream(SESSION_STREAM).add(f"health_check_response {json.dumps({'status': status})}", self._keep)
        # resource_usage: measurements only, nothing to compare

    def finish(self) -> Transcript:
        """Flush output not yet followed by another event (a request that never finished)."""
        for stream in self._streams.values():
            stream.flush_output()
        return self

    @classmethod
    def from_envelopes(cls, envelopes: Iterable[pb.Envelope], request_ids: Iterable[str] = ()) -> Transcript:
        """A transcript of the events in ``envelopes`` (outbound ones; commands are ignored)."""
        transcript = cls(request_ids)
        for envelope in envelopes:
            transcript.add_envelope(envelope)
        return transcript.finish()

    @property
    def streams(self) -> dict[str, list[str]]:
        return {key: stream.lines for key, stream in self._streams.items()}


def diff_transcripts(
    recorded: Transcript,
    replayed: Transcript,
    *,
    order: Iterable[str] = (),
    labels: dict[str, str] | None = None,
    context: int = 3,
    max_lines: int = 400,
) -> list[str]:
    """A unified-diff-like listing of every stream that differs; empty when all are equal.

    Args:
        recorded: the transcript from the log (``-`` lines).
        replayed: the transcript from the replay (``+`` lines).
        order: stream keys in the order to report them (others follow in first-event order).
        labels: stream key → a description for its heading (e.g. ``tool_call fs.read``).
        context: unchanged lines shown around each change.
        max_lines: cap on the lines printed per stream; the rest are counted, not shown.

    Returns:
        Lines without trailing newlines.
    """
    rec, rep = recorded.streams, replayed.streams
    keys: list[str] = [SESSION_STREAM]
    for key in [*order, *rec, *rep]:
        if key not in keys:
            keys.append(key)
    labels = labels or {}
    out: list[str] = []
    for key in keys:
        a, b = rec.get(key, []), rep.get(key, [])
        if a == b:
            continue
        title = "session (events of no request)" if key == SESSION_STREAM else f"request {key}"
        if key in labels:
            title += f" ({labels[key]})"
        if not a:
            title += ": not in the recording"
        elif not b:
            title += ": no events in the replay"
        out.append(f"=== {title}")
        body = list(difflib.unified_diff(a, b, "recorded", "replayed", n=context, lineterm=""))[2:]
        if len(body) > max_lines:
            body = body[:max_lines] + [f"... {len(body) - max_lines} more diff lines"]
        out.extend(body)
    return out
