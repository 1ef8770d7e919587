"""What travels over NATS between a gateway and its workers, and how the gateway makes an
at-least-once transport look exactly-once to a frontend.

Commands and events are v1 ``Envelope`` bytes (no length prefix); everything else is a header
(PROTOCOL.md, "Scale-out over NATS"):

* a **command** message (subject ``<prefix>.cmd.<gateway>.<session>``) carries
  ``Nats-Msg-Id: <session>.<n>`` (``n`` numbers the session's forwarded requests from 1),
  ``Smith-Reply`` (the session's event subject), ``Smith-Capabilities`` (what the handshake
  granted, as capability numbers) and, when the session loaded hooks, ``Smith-Hooks`` (their keys
  in the hooks bucket, in load order);
* an **event** message (subject ``Smith-Reply``) is an ``Envelope`` with one ``event`` or a
  ``batch_event`` (the events one command emitted in one loop iteration) and carries
  ``Nats-Msg-Id: <session>.<n>.<attempt>.<index>``: the request, the delivery of the command that
  produced it (JetStream's delivery count) and its 1-based position among that delivery's event
  messages;
* a **control** message (subject ``<prefix>.ctl.<session>``, empty body) carries
  ``Smith-Control: pause | resume | shutdown | end | cancel`` (``cancel`` with
  ``Smith-Request: <n>``, the request it cancels);
* a **request control** message (subject ``<prefix>.ctl.<session>.<n>.<attempt>``, heard by the
  worker running that delivery) is an ``Envelope.command`` with the peer's ``StdinCommand`` (and
  ``Smith-Stdin-Offset``: the stdin bytes sent to that delivery before it) or ``ResizeCommand``
  (``smith_fast.nats.control``).

Batches, for throughput: a command message may carry several consecutive requests of one
session (``Smith-Commands: <k>``, the payload their ``Envelope`` s, each varint length-prefixed
as on the v1 wire, numbered ``n`` .. ``n+k-1``), and an event message the event messages of
several requests of one session (``Smith-Parts: <n>.<attempt>.<index>,...``, one per framed
``Envelope`` of the payload). One message then costs one publish, one store and one delivery for
all of them.

The message ids double as JetStream's publish deduplication keys, so a message republished after
a lost acknowledgement is stored once.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import cast

from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from ..sequencing import Resequencer
from ..service.sinks import now_ms

__all__ = [
    "MSG_ID",
    "REPLY",
    "CAPABILITIES",
    "HOOKS",
    "TRACEPARENT",
    "CONTROL",
    "CONTROLS",
    "REQUEST",
    "STDIN_OFFSET",
    "COMMANDS",
    "PARTS",
    "CommandMeta",
    "RequestStream",
    "command_headers",
    "parse_command_headers",
    "event_msg_id",
    "parse_event_msg_id",
    "hook_key",
]

MSG_ID = "Nats-Msg-Id"
REPLY = "Smith-Reply"
CAPABILITIES = "Smith-Capabilities"
HOOKS = "Smith-Hooks"
TRACEPARENT = "traceparent"  # W3C Trace Context, as OpenTelemetry's NATS instrumentations carry it
CONTROL = "Smith-Control"
CONTROLS = frozenset({"pause", "resume", "shutdown", "end", "cancel"})
REQUEST = "Smith-Request"  # a cancel's request number in its session
STDIN_OFFSET = "Smith-Stdin-Offset"  # a forwarded Stdin's first byte among those sent to its delivery
COMMANDS = "Smith-Commands"  # a batch of consecutive commands: how many (framed Envelopes)
PARTS = "Smith-Parts"  # a batch of event messages: the <n>.<attempt>.<index> of each framed Envelope

_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
DEFAULT_WINDOW = 1 << 16


@dataclasses.dataclass(frozen=True)
class CommandMeta:
    """The headers of one command message.

    Attributes:
        session: the gateway session's id (a UUID).
        number: the request's number within its session (from 1).
        reply: the subject its events go to.
        capabilities: capability numbers the session's handshake granted.
        hooks: keys of the session's hooks in the hooks bucket, in load order.
        traceparent: the gateway's session span (W3C ``traceparent``) when the session asked for
            ``tracing``: the worker's command spans are its children.
    """

    session: str
    number: int
    reply: str
    capabilities: frozenset[int] = frozenset()
    hooks: tuple[str, ...] = ()
    traceparent: str | None = None


def command_headers(meta: CommandMeta) -> dict[str, str]:
    """The NATS headers of a command message."""
    headers = {
        MSG_ID: f"{meta.session}.{meta.number}",
        REPLY: meta.reply,
        CAPABILITIES: ",".join(str(c) for c in sorted(meta.capabilities)),
    }
    if meta.hooks:
        headers[HOOKS] = ",".join(meta.hooks)
    if meta.traceparent:
        headers[TRACEPARENT] = meta.traceparent
    return headers


def parse_command_headers(headers: Mapping[str, str] | None) -> CommandMeta:
    """Read the headers of a command message.

    Args:
        headers: the message's headers.

    Returns:
        What they say.

    Raises:
        ProtocolError: a header is missing or malformed (the message did not come from a gateway).
    """
    headers = headers or {}
    try:
        session, _, number = headers[MSG_ID].rpartition(".")
        caps = headers.get(CAPABILITIES, "")
        hooks = headers.get(HOOKS, "")
        return CommandMeta(
            session=session,
            number=int(number),
            reply=headers[REPLY],
            capabilities=frozenset(int(c) for c in caps.split(",") if c),
            hooks=tuple(h for h in hooks.split(",") if h),
            traceparent=headers.get(TRACEPARENT) or None,
        )
    except (KeyError, ValueError) as exc:
        raise ProtocolError(
            f"not a command message of a smith-fast gateway: bad or missing header ({exc})",
            pb.ERROR_CODE_UNSPECIFIED,
            details={"reason": "malformed"},
        ) from None


def event_msg_id(session: str, number: int, attempt: int, index: int) -> str:
    """``Nats-Msg-Id`` of an event: ``<session>.<n>.<attempt>.<index>``."""
    return f"{session}.{number}.{attempt}.{index}"


def parse_event_msg_id(value: str) -> tuple[int, int, int]:
    """``(n, attempt, index)`` from an event's ``Nats-Msg-Id``.

    Raises:
        ValueError: it is not one.
    """
    _, n, attempt, index = value.rsplit(".", 3)
    return int(n), int(attempt), int(index)


def hook_key(hook_type: str, script: str) -> str:
    """The key of a hook's source in the hooks bucket: SHA-256 (hex) of its type and its text."""
    kind = hook_type.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(b"%d:%s" % (len(kind), kind))  # length-prefixed: no type/text split collides
    digest.update(script.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


class RequestStream:
    """The events of one forwarded request as the frontend must see them.

    A command may be delivered to several workers one after the other (a worker died, or held it
    past the ack wait), and each event may arrive more than once (a republish, a redelivery by
    the event stream) or out of order (a republish after a reconnect). Events carry
    ``(attempt, index)``; this class delivers, exactly once and in order:

    * the events of the latest attempt, in index order (a :class:`~smith_fast.sequencing.Resequencer`
      per attempt drops duplicates and holds early arrivals); the events of an older attempt are
      dropped as soon as a newer one is heard from;
    * ``StateChange(PROCESSING)`` once, whichever attempt sent it first;
    * when an attempt starts after the frontend already saw output of an older one, a
      ``LogEvent`` (WARN, ``fields.reason = redelivered``, ``fields.attempt``) saying the request
      runs again from the start;
    * the terminal ``StateChange`` (``READY``/``ERROR``) of the request exactly once; after it
      nothing more of this request.

    A session-wide ``StateChange(SHUTTING)`` from a worker is dropped: the gateway sends its own.

    Args:
        request_id: the request's id, as the frontend sent it.
        window: how far ahead of the next expected index an event is held.
        resequencer: the Resequencer class to use (default: the compiled twin when built).
    """

    __slots__ = ("request_id", "attempt", "finished", "state", "dropped", "restarts", "_reseq", "_new", "_window", "_processing", "_shown")

    def __init__(self, request_id: str, window: int = DEFAULT_WINDOW, resequencer: type[Resequencer] = Resequencer) -> None:
        self.request_id = request_id
        self.attempt = 0
        self.finished = False
        self.state = 0  # the terminal state (READY or ERROR) once finished
        self.dropped = 0  # duplicates and events of superseded attempts
        self.restarts = 0  # attempts announced to the frontend
        self._window = window
        self._new = resequencer
        self._reseq = resequencer(window)  # holds Sequence[pb.Event] items: push() only gets those
        self._processing = False
        self._shown = False

    def push(self, attempt: int, index: int, events: Sequence[pb.Event]) -> list[pb.Event]:
        """Take one event message as it arrived; return what the frontend gets now, in order.

        Args:
            attempt: the delivery of the command that produced it (1 first).
            index: its 1-based position among that attempt's event messages.
            events: the events it carries (one, or a batch), in order.

        Returns:
            Events to send, possibly none.
        """
        if self.finished or attempt < self.attempt:
            self.dropped += 1
            return []
        out: list[pb.Event] = []
        if attempt > self.attempt:
            if self._shown:
                self.restarts += 1
                out.append(self._restart_notice(attempt))
                self._shown = False
            self.dropped += self._reseq.held
            self.attempt = attempt
            self._reseq = self._new(self._window)
        before = self._reseq.duplicates
        # Resequencer is not generic (the compiled twin is a cdef class): every item pushed here is a
        # Sequence[pb.Event], so that is what comes back out.
        ready = cast("list[Sequence[pb.Event]]", self._reseq.push(index, events))
        self.dropped += self._reseq.duplicates - before
        rid = self.request_id
        for batch in ready:  # (two loops, not a generator: a generator step per relayed event)
            for ev in batch:
                if ev.WhichOneof("event_type") == "state_change":
                    sc = ev.state_change
                    if not sc.HasField("request_id"):
                        if sc.state == pb.SERVICE_STATE_SHUTTING:
                            continue
                    elif sc.request_id == rid:
                        if sc.state == pb.SERVICE_STATE_PROCESSING:
                            if not self._processing:
                                self._processing = True
                                out.append(ev)
                            continue
                        if sc.state in _TERMINAL:
                            out.append(ev)
                            self.finished = True
                            self.state = sc.state
                            return out  # nothing of it after its terminal state
                self._shown = True
                out.append(ev)
        return out

    def position(self) -> list[int]:
        """How far its events came: ``[attempt, next index, PROCESSING sent, output shown,
        restarts announced]``, to go on from in another process (smith_fast.nats.journal).
        Events held for an earlier index are not part of it."""
        return [self.attempt, self._reseq.expected, int(self._processing), int(self._shown), self.restarts]

    @classmethod
    def restored(cls, request_id: str, position: Sequence[int]) -> RequestStream:
        """A stream that goes on from :meth:`position`."""
        stream = cls(request_id)
        attempt, expected, processing, shown, restarts = (int(v) for v in position)
        stream.attempt = attempt
        stream._reseq = stream._new(stream._window, max(1, expected))
        stream._processing, stream._shown, stream.restarts = bool(processing), bool(shown), restarts
        return stream

    def _restart_notice(self, attempt: int) -> pb.Event:
        event = pb.Event()
        log = event.log
        log.level = pb.LOG_LEVEL_WARN
        log.message = (
            f"request {self.request_id} runs again from the start (delivery {attempt}): the worker running it "
            "stopped before it finished; the output sent so far came from the earlier run"
        )
        log.timestamp = now_ms()
        log.request_id = self.request_id
        log.fields["reason"] = "redelivered"
        log.fields["attempt"] = str(attempt)
        return event
