"""One client connection's protocol machinery (:class:`Wire`), under the SDK's request API.

The :class:`~smith_fast.client.Client` says what to ask; its wire stamps and sends the commands
and envelopes over a :class:`~smith_fast.client_link.Link`, reads what comes back, routes each
event to the request it belongs to (by ``request_id``) or to the general queue, answers in-stream
health checks, and, for a resumable session (PROTOCOL.md, "Resume"), resumes it over a new
connection when the old one drops: it keeps the requests the service has not said it read and
sends them again after the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from .addresses import parse_address
from .client_link import Link, StreamLink, open_stream, resume_exchange
from .errors import ConnectionClosed, FramingError, NotASmithService, SmithFastError
from .framing import FrameDecoder
from .jsonl import JsonlCodec
from .pb import smith_pb2 as pb
from .remote_process import terminal_state
from .sequencing import Sequencer

__all__ = ["TOKEN_KEY", "AnswerRoute", "Route", "Wire", "event_request_id"]

TOKEN_KEY = "token"  # client_info key of the shared secret (serve --token)

_UNREAD_KINDS = frozenset({"cancel", "stdin", "resize", "handshake"})  # commands that are no request of their own


def event_request_id(event: pb.Event) -> str | None:
    """The request an event belongs to, or None (Ready, service-wide state changes, ...)."""
    kind = event.WhichOneof("event_type")
    if kind is None or kind == "ready":
        return None
    inner = getattr(event, kind)
    optional = _OPTIONAL_ID.get(kind)
    if optional is None:  # once per kind: the descriptor lookup cost as much as the rest
        optional = _OPTIONAL_ID[kind] = inner.DESCRIPTOR.fields_by_name["request_id"].has_presence
    if optional and not inner.HasField("request_id"):
        return None
    return inner.request_id or None


_OPTIONAL_ID: dict[str, bool] = {}  # event kind: whether its request_id may be absent (a service-wide one)


class Route(Protocol):
    """Where the events of one request in flight go (:attr:`Wire.routes`): ``None`` once the
    connection ended. An ``asyncio.Queue`` is one (a request followed event by event)."""

    def put_nowait(self, event: pb.Event | None) -> None: ...


class AnswerRoute:
    """The route of a request whose caller wants only its last ``Event.<member>`` and how it ended:
    it keeps them and resolves :attr:`ended` once (True: its terminal state came; False: the
    connection ended first), so the caller is not woken for every event.

    Attributes:
        answer: the last ``Event.<member>``, or None.
        error: its ``ErrorEvent``, or None.
        over: the request ended (or the connection did); a caller that leaves before cancels it.
    """

    __slots__ = ("answer", "ended", "error", "member", "over")

    def __init__(self, member: str, ended: asyncio.Future[bool]) -> None:
        self.member = member
        self.ended = ended
        self.answer: Any = None
        self.error: pb.ErrorEvent | None = None
        self.over = False

    def put_nowait(self, event: pb.Event | None) -> None:
        if self.over:
            return
        if event is None:
            self._end(False)
            return
        kind = event.WhichOneof("event_type")
        if kind == self.member:
            self.answer = getattr(event, kind)
        elif kind == "error":
            self.error = event.error
        elif kind == "state_change" and terminal_state(event) is not None:
            self._end(True)

    def _end(self, ended: bool) -> None:
        self.over = True
        if not self.ended.done():  # not cancelled with its caller
            self.ended.set_result(ended)


class Wire:
    """Sends, receives and routes for one client; reads from the moment it is made.

    Args:
        link: what carries the bytes.
        protocol: ``v1`` or ``v0``.
        address: where it is connected (``unix:PATH`` ...), for messages and for a resume; None
            for a spawned service.
        token: the service's shared secret (sent again in a resume handshake).
        resume: resume the session when the connection drops (v1 over Unix or TCP).
        resume_via: more addresses to resume through, tried in turn after ``address``.

    Attributes:
        events: events of no request in flight here (Ready, logs ...); ``None`` once the connection ended.
        metrics, resource_usage: the metrics reports (``accept=["metrics"]``, ``["usage"]``).
        routes: the route of each request in flight (its queue, or an :class:`AnswerRoute`), by request id.
        closed: set once the connection ended (``close_reason`` says why).
        loop: the event loop it runs on.
    """

    def __init__(self, link: Link, protocol: str, *, address: str | None, token: str | None, resume: bool,
                 resume_via: tuple[str, ...] = ()) -> None:
        self.link = link
        self.resume_via = resume_via
        self.protocol = protocol
        self.address = address
        self.token = token
        self.resume = resume
        self.answered = False  # something Smith-shaped has arrived
        self.batches_received = 0
        self.events: asyncio.Queue[pb.Event | None] = asyncio.Queue()
        self.metrics: asyncio.Queue[pb.MetricsEvent] = asyncio.Queue()
        self.resource_usage: asyncio.Queue[pb.ResourceUsageEvent] = asyncio.Queue()
        self.routes: dict[str, Route] = {}
        self.closed = asyncio.Event()
        self.close_reason: BaseException | None = None
        self._health: deque[asyncio.Future[pb.HealthCheckResponse]] = deque()
        self._seq = Sequencer()
        self._codec = JsonlCodec()
        # resume: the session's token, the last sequence received, the requests sent that the
        # service has not said it read, and the replay still to come
        self.resume_token = ""
        self.last_sequence = 0
        self.resumes = 0
        self._unread: dict[str, tuple[pb.Command, int]] = {}  # with the connection it went on (its resumes count)
        self._replay_left = -1
        self.closing = False  # closing on purpose: a drop is no reason to resume
        self._resume_refusal: ConnectionClosed | None = None
        self.loop = asyncio.get_running_loop()  # its reader's: the futures of its requests are made on it
        self._reader_task = self.loop.create_task(self._read_loop())

    # ---- sending -----------------------------------------------------------------------------

    def gone(self) -> ConnectionClosed:
        """The error for a send or a wait on an ended connection."""
        return ConnectionClosed(f"connection closed: {self.close_reason}")

    def send(self, command: pb.Command, *, soon: bool = False) -> None:
        """Send one command (an envelope on v1, a JSON line on v0); ``soon``: with the others of
        this loop step, as it ends (:meth:`Link.send_soon <smith_fast.client_link.Link.send_soon>`)."""
        if self.protocol == "v1":
            env = pb.Envelope()
            env.command.CopyFrom(command)
            self.send_envelope(env, soon=soon)
        else:
            if self.closed.is_set():
                raise self.gone()
            self.link.send_line(self._codec.encode_command(command))

    def send_envelope(self, env: pb.Envelope, *, soon: bool = False) -> None:
        """Stamp (timestamp, sequence) and send one v1 envelope (``soon``: as :meth:`send`).

        Raises:
            ConnectionClosed: the connection is gone.
            ValueError: this is a v0 connection.
        """
        if self.protocol != "v1":
            raise ValueError("envelopes are protocol v1 only")
        if self.closed.is_set():
            raise self.gone()
        envelope = self._seq.stamp(env).SerializeToString()
        if self.resume_token and self.routes:
            self._note_unread(envelope)
        if soon:
            self.link.send_soon(envelope)
        else:
            self.link.send(envelope)

    def send_v0_handshake(self, command: pb.Command, token: str) -> None:
        """A v0 Handshake with a ``"token"`` member in its ``data`` (v0 has no ``client_info``)."""
        if self.closed.is_set():
            raise self.gone()
        line = json.loads(self._codec.encode_command(command))
        line["data"][TOKEN_KEY] = token
        self.link.send_line(json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")

    def route(self, rid: str) -> asyncio.Queue[pb.Event | None]:
        """A queue of its own for request ``rid``'s events.

        Raises:
            ValueError: a request with that id is in flight.
        """
        queue: asyncio.Queue[pb.Event | None] = asyncio.Queue()
        self.add_route(rid, queue)
        return queue

    def add_route(self, rid: str, route: Route) -> None:
        """Send request ``rid``'s events to ``route``.

        Raises:
            ValueError: a request with that id is in flight.
        """
        if rid in self.routes:
            raise ValueError(f"request {rid} is already in flight")
        self.routes[rid] = route

    async def next(self, queue: asyncio.Queue[pb.Event | None]) -> pb.Event:
        """The next event on ``queue``.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        event = await queue.get()
        if event is None:
            raise self.gone()
        return event

    async def health_check(self, env: pb.Envelope) -> pb.HealthCheckResponse:
        """Send a ``health_check_request`` envelope; its response (they are answered in order)."""
        future: asyncio.Future[pb.HealthCheckResponse] = asyncio.get_running_loop().create_future()
        self._health.append(future)
        try:
            self.send_envelope(env)
        except BaseException:
            self._health.remove(future)
            raise
        return await future

    # ---- ending --------------------------------------------------------------------------------

    async def shut(self) -> None:
        """After a Shutdown was sent: wait until the service closed the connection."""
        self.closing = True  # the close that follows is no drop to resume from
        await self.link.flush()
        await self.closed.wait()

    async def close(self) -> None:
        """Close the connection and stop reading."""
        self.closing = True
        await self.link.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.closed.wait(), 5)
        self._reader_task.cancel()
        await self.link.release()

    # ---- receiving ---------------------------------------------------------------------------

    def _receive(self, unit: bytes) -> None:
        """One v1 envelope or v0 line from the service: route what it carries."""
        if self.protocol == "v0":
            try:
                event = self._codec.decode_event(unit)
            except SmithFastError:
                if not self.answered:
                    raise self.not_smith() from None
                raise
            self.answered = True
            if event is not None:
                self._dispatch(event)
            return
        try:
            env = pb.Envelope.FromString(unit)
        except DecodeError:
            if not self.answered:
                raise self.not_smith() from None
            raise
        kind = env.WhichOneof("payload")
        if kind is None and not self.answered:
            raise self.not_smith()
        self.answered = True
        if kind == "event":
            self._dispatch(env.event)
        elif kind == "batch_event":
            self.batches_received += 1
            for event in env.batch_event.events:
                self._dispatch(event)
        elif kind == "health_check_response":
            while self._health:
                future = self._health.popleft()
                if not future.done():
                    future.set_result(env.health_check_response)
                    break
        elif kind == "metrics":
            self.metrics.put_nowait(env.metrics)
        elif kind == "resource_usage":
            self.resource_usage.put_nowait(env.resource_usage)
        # After its events: the last replayed envelope may carry a request's first state change,
        # which says the service read it (sent again, it would run twice had it ended by then).
        if env.sequence and self.resume_token:
            self._sequenced(env.sequence)

    def not_smith(self) -> NotASmithService:
        """The error for an answer that is not the Smith protocol."""
        return NotASmithService(f"not a Smith service at {self.address or 'the spawned process'}: "
                                f"it answered with something other than the {self.protocol} protocol")

    def _dispatch(self, event: pb.Event) -> None:
        rid = event_request_id(event)
        if self._unread and rid in self._unread and event.WhichOneof("event_type") == "state_change":
            del self._unread[rid]  # the service read it
        queue = self.routes.get(rid) if rid else None
        if queue is not None:
            queue.put_nowait(event)
        else:
            self.events.put_nowait(event)

    async def _read_loop(self) -> None:
        try:
            reason = await self.link.pump(self._receive, self._dispatch, self._resumed)
            self.close_reason = self._resume_refusal or reason
        except (FramingError, SmithFastError, ConnectionError, OSError, DecodeError, ValueError) as exc:
            self.close_reason = self.not_smith() if not self.answered and isinstance(exc, FramingError) else exc
        except asyncio.CancelledError:
            self.close_reason = ConnectionClosed("client closed")
        finally:
            self._connection_ended()

    def _connection_ended(self) -> None:
        self.closed.set()
        for queue in list(self.routes.values()) + [self.events]:
            queue.put_nowait(None)
        while self._health:
            future = self._health.popleft()
            if not future.done():
                future.set_exception(self.gone())

    # ---- resume (PROTOCOL.md, "Resume") --------------------------------------------------------

    def _note_unread(self, envelope: bytes) -> None:
        """Keep a request command until the service says it read it (its first state change), to
        send it again after a resume if the drop lost it."""
        command = pb.Envelope.FromString(envelope).command
        kind = command.WhichOneof("command_type")
        rid = getattr(getattr(command, kind), "request_id", "") if kind is not None and kind not in _UNREAD_KINDS else ""
        if rid and rid in self.routes:
            self._unread[rid] = (command, self.resumes)

    def _sequenced(self, sequence: int) -> None:
        self.last_sequence = sequence
        if self._replay_left > 0:
            self._replay_left -= 1
            if self._replay_left == 0:
                self._resend()

    def _resend(self) -> None:
        """After the replay: what the service never read goes again (a copy of one it did read is
        refused as a duplicate, which changes nothing)."""
        self._replay_left = -1
        for rid, (command, sent_on) in list(self._unread.items()):
            if sent_on == self.resumes:
                continue  # sent after the resume handshake, on this connection: read in turn
            self._unread[rid] = (command, self.resumes)
            env = pb.Envelope()
            env.command.CopyFrom(command)
            self.link.send(self._seq.stamp(env).SerializeToString())

    async def _resumed(self, patience: float = 30.0) -> bool:
        """The connection dropped: reconnect and resume the session, retrying for ``patience``
        seconds (the service's ``--resume-window`` is 30 s by default). False when this client does
        not resume, is closing, or the service refused (the session is gone)."""
        link = self.link
        if not (self.resume and self.resume_token) or self.closing or self.address is None or not isinstance(link, StreamLink):
            return False
        targets = [parse_address(a)[1] for a in (self.address, *self.resume_via)]
        deadline = time.monotonic() + patience
        delay = 0.01
        attempt = 0
        while not self.closing and time.monotonic() < deadline:
            decoder = FrameDecoder(link.decoder.max_frame_size)  # type: ignore[union-attr]  # v1: a FrameDecoder
            target = targets[attempt % len(targets)]
            attempt += 1
            try:
                reader, writer = await open_stream(target)
                answer, rest = await resume_exchange(reader, writer, self._resume_handshake(), decoder)
            except (ConnectionError, OSError, EOFError):
                if attempt % len(targets) == 0:  # every address tried once: wait before the next round
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                continue
            if not answer.resumed:  # refused: the session is gone
                self._resume_refusal = ConnectionClosed(
                    f"the connection dropped and the session could not be resumed: {answer.service_info.get('error', '')}")
                writer.close()
                return False
            link.replace(reader, writer, decoder)
            self.resumes += 1
            self._replay_left = int(answer.service_info.get("smith_fast.replayed", "0"))
            if self._replay_left == 0:
                self._resend()
            for unit in rest:
                self._receive(unit)
            return True
        return False

    def _resume_handshake(self) -> bytes:
        """The resume handshake, stamped: this session's token and the last sequence received."""
        hs = pb.HandshakeCommand(version=1, resume_token=self.resume_token, resume_after=self.last_sequence)
        if self.token is not None:
            hs.client_info[TOKEN_KEY] = self.token
        env = pb.Envelope()
        env.command.handshake.CopyFrom(hs)
        return self._seq.stamp(env).SerializeToString()

    def ready(self, ready: pb.ReadyEvent) -> None:
        """The handshake's answer: a resumable session's token comes with it."""
        self.resume_token = ready.resume_token if self.resume else ""
