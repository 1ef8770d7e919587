"""The gateway's end of a frontend connection: read the handshake, place the session, relay bytes.

One :class:`RelayConnection` per frontend connection (Unix, TCP, stdio), a lifecycle object:

``HANDSHAKE``
    The first frame (v1) or line (v0) is read, at most ``--max-handshake-frame-size``, within
    ``--handshake-timeout``. With ``--token`` it must be a handshake presenting it (else the
    frontend hears what ``serve`` says and the connection closes); the token is then removed, so
    that it never travels on NATS. Its ``client_info["smith_fast.placement"]`` names the labels
    the worker must have; a resume token names its worker (``<worker>.<secret>``).
``PLACING``
    The gateway picks a worker and opens the session there: its OPEN carries the frontend's first
    bytes, the worker answers OPENED or REFUSED (then another worker is tried). What the frontend
    sends meanwhile is kept (bounded by ``--max-session-buffer``, then not read). No worker
    fits: a ``LogEvent`` after ``--queue-notice``, ``RESOURCE_EXHAUSTED`` (``no_worker``) after
    ``--queue-timeout``, and the connection stays for another handshake.
``RELAYING``
    Bytes both ways, untouched: the worker's :class:`~smith_fast.service.connection.Connection`
    reads exactly what the frontend wrote (the rewritten handshake first) and the frontend reads
    exactly what the worker's session wrote. The gateway keeps no per-request object: only the set
    of request ids open (read from the frames' heads by :mod:`smith_fast.relaypeek`) and the last
    sequence number, so that when the worker dies each open request still ends with exactly one
    terminal state (``worker_gone``), numbered after the last envelope the frontend got.
``ENDED``
    Either side closed.
"""

from __future__ import annotations

import asyncio
import enum
import json
import secrets
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from google.protobuf.message import DecodeError

from .. import events, relaypeek
from ..errors import FramingError
from .._varint import decode as decode_varint
from ..framing import FrameDecoder, encode_varint, varint_size
from ..jsonl import JsonlCodec
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.auth import TOKEN_KEY, token_matches
from ..service.health import health_response
from ..service.connection import GUARDED_READ_BUFFER_SIZE, LINGER, READ_BUFFER_SIZE, REFUSAL_WAIT, describe_peer, sniff_version
from ..service.sinks import now_ms
from ..workspaces import FORK_KEY, TEMPLATE_KEY
from .placement import PLACEMENT_KEY, parse_labels
from .relay import ACK, CLOSE, DATA, EOF, OPEN, OPENED, READ_PAUSE, READ_RESUME, REFUSED, WRITE_PAUSE, WRITE_RESUME, Outbox, pack, unpack

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from ..service.connections import ConnectionGate
    from ..service.core import ServiceCore

__all__ = ["Offered", "Placed", "RelayConnection", "RelayHost"]

log = get_logger("smith_fast.gateway")

_HEALTH_RESPONSE = pb.Envelope.DESCRIPTOR.fields_by_name["health_check_response"].number
OPEN_TIMEOUT = 5.0  # seconds a worker has to answer an OPEN before another one is tried
_OPEN_IDS_MAX = 65536  # request ids tracked per connection at most (ids that never end are dropped oldest first)
GATHER_MAX = 64 << 10  # bytes of the frontend's gathered at most (then they go)
GATHER_WINDOW = 1  # DATA sent and not acknowledged before the frontend's bytes are gathered


def _says_acks(opened: memoryview) -> bool:
    """Whether the worker's OPENED says it answers every DATA (an older worker's does not)."""
    try:
        return json.loads(bytes(opened)).get("acks") is True
    except (ValueError, AttributeError):
        return False


class Placed(Protocol):
    """Where a placed session went: what the gateway's open request answered."""

    worker: str
    subject: str  # the worker's subject of this connection


Offered = tuple[str, "asyncio.Future[str | None]"]  # a worker offered a session, and its answer to come


class RelayHost(Protocol):
    """What a relayed connection needs of its gateway (:class:`~smith_fast.nats.gateway.Gateway`)."""

    @property
    def core(self) -> ServiceCore: ...

    @property
    def nc(self) -> NATS | None: ...

    @property
    def outbox(self) -> Outbox | None:
        """What relay messages are published through (the NATS connection's), once connected."""
        ...

    def offer_now(self, conn: RelayConnection, wanted: Mapping[str, str], route: str | None) -> Offered | None:
        """Offer ``conn``'s session to a worker at once, in the step its handshake is read: the
        worker and its answer to come, for :meth:`place` to wait for; None: no worker to offer it to now."""
        ...

    async def place(self, conn: RelayConnection, wanted: Mapping[str, str], route: str | None, tried: Collection[str] = ()) -> Placed | str:
        """Place ``conn``'s session: where it went, or why not (``no_worker``, ``resume_unknown``, ``nats_unavailable``);
        ``tried``: workers that refused it already."""
        ...

    def refused(self, conn: RelayConnection, worker: str, reason: str) -> None:
        """``worker`` did not take ``conn``'s session (``reason``, or it did not answer): withdraw the offer."""

    def forget(self, conn: RelayConnection) -> None:
        """``conn`` is over: no more messages for it."""


class State(enum.Enum):
    HANDSHAKE = "handshake"
    PLACING = "placing"
    RELAYING = "relaying"
    ENDED = "ended"


class RelayConnection(asyncio.BufferedProtocol):
    """A frontend's connection, relayed to the worker its session lives on.

    Args are those of :class:`~smith_fast.service.connection.Connection` (a listener makes either),
    with ``host`` (the gateway) in place of the core.
    """

    def __init__(
        self,
        host: RelayHost,
        *,
        protocol: str = "auto",
        writer: asyncio.WriteTransport | None = None,
        on_closed: Callable[[], None] | None = None,
        peer: str | None = None,
        trusted: bool = False,
        finish_on_eof: bool = False,
        gate: ConnectionGate | None = None,
    ) -> None:
        self.host = host
        core = host.core
        self._core = core
        self._limits = core.limits
        self.protocol = protocol
        self.peer = peer or "?"
        self.trusted = trusted
        self._finish_on_eof = finish_on_eof
        self._eof = False  # the input ended (a file) before the session was placed
        self._gate = None if trusted else gate
        self._writer = writer
        self._on_closed = on_closed
        self.conn_id = secrets.token_urlsafe(9)
        self.state = State.HANDSHAKE
        self.worker = ""
        self._subject = ""  # the worker's subject of this connection, once placed
        self._transport: asyncio.BaseTransport | None = None
        # small until the session is placed (as serve's Connection until its first accepted handshake)
        self._buffer = bytearray(READ_BUFFER_SIZE if trusted else GUARDED_READ_BUFFER_SIZE)
        self._view = memoryview(self._buffer)
        self._raw = bytearray()  # read before the session was placed
        self._version: int | None = None
        self._peek: FrameDecoder | None = None  # v1 frames, for their request ids
        self._lines = bytearray()  # v0: the tail of the last line not ended yet
        self._out_seq = 0
        self._in_seq = 0
        self.open_ids: dict[str, None] = {}  # requests started and not ended, oldest first
        self._answer: asyncio.Future[str | None] | None = None  # the worker's answer to OPEN, while placing
        self._offered = 0  # bytes of _raw sent behind the OPEN
        self._head = 0  # bytes of _raw that are the (rewritten) first frame
        self._answered = False  # the session's Ready went by (v1)
        self.resumable = False  # its Ready carried a resume token
        self._sequence = 0  # the last Envelope.sequence the frontend got
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._placing: asyncio.Task[None] | None = None
        self._reading_held = False
        self._worker_holds = False
        self._paused = False  # the frontend's socket is not read (_read_or_not)
        # Gathering (relay.py): the worker acknowledges the DATA it reads; while GATHER_WINDOW are
        # not, the frontend is not read (what was read before the pause took waits here), and
        # what it sent meanwhile goes in one DATA at the next ACK
        self._acks = False  # the worker said it acknowledges
        self._unacked = 0
        self._gathered = bytearray()
        self._loop = asyncio.get_event_loop()

    # ---- asyncio protocol callbacks ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if self._writer is None:
            self._writer = cast("asyncio.WriteTransport", transport)
        self._loop = asyncio.get_running_loop()
        if self.peer == "?":
            self.peer = describe_peer(transport)
        if self.trusted:
            return
        if self._gate is not None and not self._gate.admit(self):
            log.warning("too many connections", extra={"fields": {"peer": self.peer, "max_connections": self._gate.limit}})
            self._refused = True
            self._timer = self._loop.call_later(REFUSAL_WAIT, self._refuse_over_limit)
            return
        timeout = self._limits.handshake_timeout
        if timeout > 0:
            self._timer = self._loop.call_later(timeout, self._handshake_late)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._view[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        state = self.state
        if state is State.RELAYING:
            self._peek_in(data)
            if self._unacked >= GATHER_WINDOW:  # read before the pause took
                self._gathered += data
                if len(self._gathered) >= GATHER_MAX:
                    self._send_gathered()
                return
            self._send_data(bytes(data))
            if self._unacked >= GATHER_WINDOW:
                self._read_or_not()
            return
        if state is State.ENDED:
            return
        self._raw += data
        if self._refused:
            if len(self._raw) >= 2:
                self._refuse_over_limit()
            return
        if state is State.PLACING:
            if len(self._raw) > self._limits.max_session_buffer:
                self._hold(True)
            return
        self._read_handshake()

    def eof_received(self) -> bool:
        if not self._finish_on_eof or self.state is State.ENDED:
            return False
        # A file of requests ended: they run to their end, then the worker closes (told once placed).
        if self.state is State.RELAYING:
            self._send(EOF)
        else:
            self._eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is State.ENDED:
            return
        if self.state is State.RELAYING:
            self._send(CLOSE, b"peer_gone")
        self._end()

    def pause_writing(self) -> None:
        if self.state is State.RELAYING:
            self._send(WRITE_PAUSE)

    def resume_writing(self) -> None:
        if self.state is State.RELAYING:
            self._send(WRITE_RESUME)

    # ---- the handshake ----------------------------------------------------------------------------

    def _read_handshake(self) -> None:
        raw = self._raw
        if self._version is None:
            if len(raw) < 2 and self.protocol == "auto":
                return
            self._version = {"v1": 1, "v0": 0}.get(self.protocol, sniff_version(bytes(raw[:2])) if len(raw) >= 2 else 1)
        limit = self._limits.max_handshake_frame_size
        if self._version == 1:
            try:
                frames = FrameDecoder(limit).feed(bytes(raw[: limit + 16]))
            except FramingError as exc:
                frames = exc.frames
                if not frames:
                    self._close_with(pb.ERROR_CODE_RESOURCE_EXHAUSTED, f"{exc}; closing the connection",
                                     {"reason": "handshake_frame_too_large", "limit": str(limit)})
                    return
            if not frames:
                return
            first = frames[0]
            end = varint_size(len(first)) + len(first)
            self._first_v1(first, end)
        else:
            newline = raw.find(b"\n", 0, limit + 1)
            if newline < 0:
                if len(raw) > limit:
                    self._close_with(pb.ERROR_CODE_RESOURCE_EXHAUSTED, f"the first line is over the {limit} bytes allowed before an "
                                     "accepted handshake (--max-handshake-frame-size); closing the connection",
                                     {"reason": "handshake_frame_too_large", "limit": str(limit)})
                return
            self._first_v0(bytes(raw[: newline + 1]), newline + 1)

    def _first_v1(self, frame: bytes, end: int) -> None:
        token = None if self.trusted else self._core.config.token  # whoever holds stdio started the gateway
        try:
            env = pb.Envelope.FromString(frame)
        except DecodeError:
            env = None
        if env is not None and env.WhichOneof("payload") == "health_check_request":
            # Answered here, before any session is placed: whether the gateway can place one (NATS
            # reached, a worker alive) is what a probe of the gateway asks.
            self._sequence += 1
            ts = now_ms()
            answer = health_response(self._core, env.health_check_request.service_name).SerializeToString()
            if self._writer is not None:
                self._writer.write(events.encode_envelope(ts, self._sequence, _HEALTH_RESPONSE, answer))
            del self._raw[:end]
            if self._raw:
                self._read_handshake()
            return
        hs = env.command.handshake if env is not None and env.WhichOneof("payload") == "command" and env.command.WhichOneof("command_type") == "handshake" else None
        if hs is None:
            if token is not None:
                self._deny("the first message is no handshake: this service needs a token")
                return
            self._start_placing(frame, end, {}, None)  # the worker answers it as serve would
            return
        if token is not None:
            presented = hs.client_info.get(TOKEN_KEY)
            if not token_matches(token, presented):
                self._deny("the handshake " + ("presents no token" if presented is None else "presents a wrong token"))
                return
        if TOKEN_KEY in hs.client_info:
            del hs.client_info[TOKEN_KEY]  # the worker trusts its gateway; the token never travels on NATS
            assert env is not None
            frame = env.SerializeToString()
        try:
            wanted = parse_labels(hs.client_info.get(PLACEMENT_KEY, ""))
        except ValueError as exc:
            self._refuse_handshake(end, pb.ERROR_CODE_UNSPECIFIED, f"client_info[{PLACEMENT_KEY!r}]: {exc}", {"reason": "invalid_field"})
            return
        template = hs.client_info.get(TEMPLATE_KEY)
        if template:
            wanted[TEMPLATE_KEY] = template  # a worker that has it (Announcement.templates)
        route = hs.resume_token.partition(".")[0] if hs.resume_token else None
        fork = hs.client_info.get(FORK_KEY, "")
        if route is None and fork.startswith("ck_") and "." in fork:
            route = fork[3:].partition(".")[0]  # a fork's layers live on the worker that took the checkpoint
        self._start_placing(frame, end, wanted, route)

    def _first_v0(self, line: bytes, end: int) -> None:
        token = None if self.trusted else self._core.config.token
        if token is None:
            self._start_placing(line, end, {}, None)
            return
        try:
            obj: Any = json.loads(line)
            data = obj.get("data") if isinstance(obj, dict) else None
            presented = data.get(TOKEN_KEY) if isinstance(data, dict) else None
            kind = obj.get("type") if isinstance(obj, dict) else None
        except ValueError:
            presented, kind, data, obj = None, None, None, None
        if kind != "Handshake" or not isinstance(data, dict):
            self._deny("the first line is no Handshake: this service needs a token")
            return
        if not isinstance(presented, str) or not token_matches(token, presented):
            self._deny("the handshake " + ("presents no token" if presented is None else "presents a wrong token"))
            return
        del data[TOKEN_KEY]
        self._start_placing(json.dumps(obj, separators=(",", ":")).encode() + b"\n", end, {}, None)

    def _start_placing(self, first: bytes, end: int, wanted: Mapping[str, str], route: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = State.PLACING
        head = encode_varint(len(first)) + first if self._version == 1 else first
        rest = bytes(self._raw[end:])
        self._raw = bytearray(head + rest)
        self._head = len(head)
        # The OPEN goes out now, with the frontend's first bytes, rather than from the task's first
        # step one loop iteration later (a session start waits for its worker's answer anyway).
        offered = self.host.offer_now(self, wanted, route)
        if offered is None:
            self._placing = self._loop.create_task(self._place(wanted, route, len(head), ()))
            return
        # Most often the first worker takes the session: its OPENED switches this connection to
        # relaying as it is read (received), and no task runs (one would wake as the session's
        # first bytes go to the frontend). A refusal, or no answer within OPEN_TIMEOUT, starts
        # the placing task with that worker tried.
        worker, answer = offered
        self._timer = self._loop.call_later(OPEN_TIMEOUT, answer.cancel)
        answer.add_done_callback(lambda done: self._first_answer(done, worker, wanted, route, len(head)))

    def _first_answer(self, answer: asyncio.Future[str | None], worker: str, wanted: Mapping[str, str], route: str | None,
                      head: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.state is not State.PLACING or self._answer is not answer:
            return  # relaying (it took the session), or the connection ended
        self.host.refused(self, worker, "no answer" if answer.cancelled() else str(answer.result()))
        self._placing = self._loop.create_task(self._place(wanted, route, head, (worker,)))

    async def _place(self, wanted: Mapping[str, str], route: str | None, head: int, tried: Collection[str]) -> None:
        outcome = await self.host.place(self, wanted, route, tried)
        if self.state is State.PLACING and isinstance(outcome, str):
            self._placement_failed(outcome, head)

    def _opened(self) -> None:
        """The worker took the session (its OPENED): relay from now on. Done in the same step as
        the answer is read, so that nothing the worker writes next is read as still placing."""
        self.state = State.RELAYING
        if len(self._buffer) < READ_BUFFER_SIZE:
            self._buffer = bytearray(READ_BUFFER_SIZE)
            self._view = memoryview(self._buffer)
        pending, self._raw = bytes(self._raw), bytearray()
        self._peek_in(memoryview(pending)[self._head :])
        if len(pending) > self._offered:  # what the frontend sent while the worker answered
            self._send_data(pending[self._offered :])
        if self._eof:
            self._send(EOF)
        if self._reading_held and not self._worker_holds:
            self._hold(False)
        log.debug("relaying", extra={"fields": {"peer": self.peer, "worker": self.worker, "conn": self.conn_id}})

    def offer(self, worker: str, subject: str, nc: NATS) -> asyncio.Future[str | None]:
        """Open the session on ``worker``: OPEN, then what the frontend sent so far, at once; the
        future is the worker's answer (None: it took the session; else why not)."""
        self.worker, self._subject = worker, subject
        self._out_seq = self._in_seq = 0
        self._answer = self._loop.create_future()
        opening = json.dumps({"protocol": f"v{self.version}", "peer": self.peer, "first_sequence": self.first_sequence,
                              "acks": True}).encode()
        self._offered = len(self._raw)
        head = encode_varint(len(opening)) + opening
        room = max(0, self._chunk() - len(head))
        self._send(OPEN, head + self._raw[:room])  # one message (most often): the session starts in one hop
        self._send_data(bytes(self._raw[room:]))
        outbox = self.host.outbox
        if outbox is not None:  # nothing else to wait for: the session start waits on this
            outbox.flush()
        return self._answer

    def withdraw(self) -> None:
        """The worker did not take the session (or did not answer): forget it; another is tried."""
        if self._answer is not None and not self._answer.done():
            self._answer.cancel()
        self._send(CLOSE, b"withdrawn")  # should its answer come late, the session there ends
        self.worker, self._subject, self._answer = "", "", None

    def _placement_failed(self, reason: str, head: int) -> None:
        """No worker took the session: say why; the connection stays for another handshake."""
        if reason == "resume_unknown":
            message = ("the resume token names no session that can be resumed here (its worker is gone, or the token is wrong); "
                       "send a fresh handshake")
            code = pb.ERROR_CODE_PERMISSION_DENIED
        elif reason == "nats_unavailable":
            message = "the gateway cannot reach NATS, so no worker can take this session; try again later"
            code = pb.ERROR_CODE_RESOURCE_EXHAUSTED
        else:
            message = ("no worker could take this session within --queue-timeout: none is connected, none has the labels "
                       "asked for, or all are full; try again later")
            code = pb.ERROR_CODE_RESOURCE_EXHAUSTED
        self.state = State.HANDSHAKE
        self._raw = self._raw[head:]
        self.say_error(code, message, {"reason": reason})
        if self._eof:  # nothing more will come: no other handshake
            self._close()
            return
        self._hold(False)
        if self._raw:
            self._read_handshake()

    def notice(self, message: str, fields: Mapping[str, str]) -> None:
        """A ``LogEvent`` (WARN) for the frontend while its session waits for a worker."""
        if self.state is not State.PLACING or self._writer is None:
            return
        ts = now_ms()
        if self._version == 1:
            self._sequence += 1
            data = events.encode_log(ts, self._sequence, pb.LOG_LEVEL_WARN, message, ts, None, fields)
        else:
            data = JsonlCodec(self._core.config.jsonl_backend).log(pb.LOG_LEVEL_WARN, message, ts, None)
        self._writer.write(data)

    @property
    def subject(self) -> str:
        """The worker's subject of this connection ("" until it is offered to one)."""
        return self._subject

    @property
    def first_sequence(self) -> int:
        """The sequence number the worker's session starts at (after what the gateway said)."""
        return self._sequence + 1

    @property
    def version(self) -> int:
        return 1 if self._version is None else self._version

    # ---- relaying ---------------------------------------------------------------------------------

    def _peek_in(self, data: bytes | memoryview) -> None:
        """Note the request ids the frontend starts (v1 frames or v0 lines)."""
        ids: list[str] = []
        if self._version == 1:
            peek = self._peek
            if peek is None:
                peek = self._peek = FrameDecoder(self._limits.max_frame_size)
            try:
                frames = peek.feed(data)
            except FramingError as exc:  # the worker's connection closes on it; nothing more to peek
                frames = exc.frames
                self._peek = FrameDecoder(1)
            for frame in frames:
                ids += relaypeek.command_ids(frame)
        else:
            buf = self._lines
            buf += data
            start = 0
            while (nl := buf.find(b"\n", start)) >= 0:
                ids += relaypeek.v0_command_ids(bytes(buf[start:nl]))
                start = nl + 1
            del buf[:start]
            if len(buf) > self._limits.max_frame_size:
                buf.clear()
        if ids:
            open_ids = self.open_ids
            longest = self._limits.max_request_id_size
            for rid in ids:
                if len(rid) <= longest or len(rid.encode()) <= longest:  # a longer one is refused without a terminal state
                    open_ids[rid] = None
            while len(open_ids) > _OPEN_IDS_MAX:
                del open_ids[next(iter(open_ids))]

    def received(self, data: bytes) -> None:
        """One relay message from the worker."""
        state = self.state
        if state is not State.RELAYING and state is not State.PLACING:
            return
        try:
            seq, kind, body = unpack(data)
        except ValueError:
            return
        if state is State.PLACING:
            answer = self._answer
            if seq == 1 and answer is not None and not answer.done() and kind in (OPENED, REFUSED):
                self._in_seq = 1
                if kind == OPENED:
                    self._acks = _says_acks(body)
                    self._opened()
                answer.set_result(None if kind == OPENED else bytes(body).decode("utf-8", "replace"))
            return
        if seq != self._in_seq + 1:
            log.warning("relay lost", extra={"fields": {"peer": self.peer, "worker": self.worker, "expected": self._in_seq + 1, "got": seq}})
            self.relay_lost()
            return
        self._in_seq = seq
        if kind == ACK:
            self._acked(body)
        elif kind == DATA:
            # to the frontend first: what is read of the bytes below is for later (a lost worker)
            if self._writer is not None:
                self._writer.write(body)
            if self._version == 1:
                if not self._answered:
                    self._look_for_ready(body)
                last, ended = relaypeek.event_marks(body)
                if last > self._sequence:
                    self._sequence = last
            else:
                ended = relaypeek.v0_event_marks(body)
            if ended:
                open_ids = self.open_ids
                for rid in ended:
                    open_ids.pop(rid, None)
        elif kind == CLOSE:
            reason = bytes(body).decode("utf-8", "replace")
            if reason in ("end", "taken_over"):
                self.state = State.ENDED  # the session said everything it had to
                self._close()
            elif reason == "relay_lost":
                self.relay_lost()
            else:
                self.end_session(reason)
        elif kind == READ_PAUSE:
            self._worker_holds = True
            self._hold(True)
        elif kind == READ_RESUME:
            self._worker_holds = False
            self._hold(False)

    def _look_for_ready(self, body: memoryview) -> None:
        """Read the session's first envelopes (once per connection) for its Ready: whether it can
        be resumed decides what a lost relay means for the frontend (:meth:`relay_lost`)."""
        try:
            frames = FrameDecoder(self._limits.max_frame_size).feed(body)
        except FramingError:
            return
        for frame in frames:
            try:
                env = pb.Envelope.FromString(frame)
            except DecodeError:
                return
            if env.WhichOneof("payload") == "event" and env.event.WhichOneof("event_type") == "ready":
                self._answered = True
                self.resumable = bool(env.event.ready.resume_token)
                return

    def relay_lost(self) -> None:
        """Messages between the gateway and the worker were lost (a NATS server restart): the relay
        cannot go on. A resumable session is left to its peer, which resumes it through any gateway
        (its worker keeps it parked, and replays what was lost); any other ends here, each open
        request with its terminal state (the worker drops it as a dropped connection)."""
        if self.resumable:
            self._send(CLOSE, b"relay_lost")
            self.state = State.ENDED
            self._close()
        else:
            self.end_session("relay_lost")

    def end_session(self, reason: str, message: str | None = None) -> None:
        """The worker is gone (or stopped, or the relay lost messages): end each open request with
        one terminal state, then the session, then the connection."""
        if self.state is State.ENDED:
            return
        if message is None:
            message = {
                "worker_gone": f"the worker {self.worker} running this session is gone",
                "worker_stopping": f"the worker {self.worker} running this session stopped",
                "relay_lost": "messages between the gateway and the worker were lost (the NATS server restarted)",
                "gateway_stopping": "the gateway is stopping",
            }.get(reason, f"the session ended: {reason}")
        if self.state is State.RELAYING:
            self._send(CLOSE, reason.encode())
        self.state = State.ENDED
        writer = self._writer
        if writer is not None and not writer.is_closing():
            ts = now_ms()
            details = {"reason": reason, "worker": self.worker}
            out: list[bytes] = []
            if self._version == 1:
                seq = self._sequence
                for rid in self.open_ids:
                    out.append(events.encode_error(ts, seq + 1, pb.ERROR_CODE_INTERNAL_ERROR, f"{message}; the request's outcome is unknown",
                                                   rid, ts, details))
                    out.append(events.encode_state_change(ts, seq + 2, pb.SERVICE_STATE_ERROR, rid, ts))
                    seq += 2
                out.append(events.encode_error(ts, seq + 1, pb.ERROR_CODE_INTERNAL_ERROR, message + "; start a new session", None, ts, details))
                out.append(events.encode_state_change(ts, seq + 2, pb.SERVICE_STATE_SHUTTING, None, ts))
                self._sequence = seq + 2
            else:
                codec = JsonlCodec(self._core.config.jsonl_backend)
                for rid in self.open_ids:
                    out.append(codec.error(pb.ERROR_CODE_INTERNAL_ERROR, f"{message}; the request's outcome is unknown", rid, ts))
                    out.append(codec.state_change(pb.SERVICE_STATE_ERROR, rid, ts))
                out.append(codec.error(pb.ERROR_CODE_INTERNAL_ERROR, message + "; start a new session", None, ts))
            if out:
                writer.write(b"".join(out))
        log.info("session ended by the gateway", extra={"fields": {"peer": self.peer, "worker": self.worker, "reason": reason,
                                                                     "requests": len(self.open_ids)}})
        self.open_ids.clear()
        self._close()

    def _chunk(self) -> int:
        """The most stream bytes one relay message carries: the server's payload limit, less room
        for the relay header (a larger message would be refused, and the session hang)."""
        nc = self.host.nc
        return max(1024, (nc.max_payload if nc is not None else 1 << 20) - 64)

    def _send_data(self, data: bytes) -> None:
        chunk = self._chunk()
        if len(data) <= chunk:
            if data:
                self._send(DATA, data)
            return
        view = memoryview(data)
        for at in range(0, len(data), chunk):
            self._send(DATA, bytes(view[at : at + chunk]))

    def reconnected(self) -> None:
        """The NATS connection came back: a DATA or its ACK may have been lost with the server,
        and no ACK will come for it. Gathering starts afresh, so what the frontend sends goes on
        (a message lost on the way shows as a gap at the worker, which ends the relay as before)."""
        if self.state is not State.RELAYING or not self._unacked:
            return
        self._unacked = 0
        if self._gathered:
            self._send_gathered()
        self._read_or_not()

    def _acked(self, body: memoryview) -> None:
        try:
            count = decode_varint(body[:10])[0]
        except IndexError:
            return
        self._unacked = max(0, self._unacked - count)
        if self._gathered and self._unacked < GATHER_WINDOW:
            self._send_gathered()
        self._read_or_not()

    def _send_gathered(self) -> None:
        gathered, self._gathered = self._gathered, bytearray()
        self._send_data(bytes(gathered))

    def _send(self, kind: int, body: bytes = b"") -> None:
        outbox = self.host.outbox
        if outbox is None or not self._subject:
            return
        if kind == DATA:
            if self._acks:
                self._unacked += 1
        elif self._gathered:  # in order: what the frontend sent goes before its EOF, close or pause
            self._send_gathered()
        self._out_seq += 1
        outbox.publish(self._subject, pack(self._out_seq, kind, body))

    # ---- answers of the gateway's own ---------------------------------------------------------------

    def say_error(self, code: int, message: str, details: Mapping[str, str]) -> None:
        writer = self._writer
        if writer is None or writer.is_closing():
            return
        self._core.metrics.error(code)
        ts = now_ms()
        if self._version == 0:
            data = JsonlCodec(self._core.config.jsonl_backend).error(code, message, None, ts)
        else:
            self._sequence += 1
            data = events.encode_error(ts, self._sequence, code, message, None, ts, details)
        writer.write(data)

    def _close_with(self, code: int, message: str, details: Mapping[str, str]) -> None:
        self.say_error(code, message, details)
        self._close()

    def _refuse_handshake(self, end: int, code: int, message: str, details: Mapping[str, str]) -> None:
        """A handshake the gateway cannot place: say why, read on (another handshake may follow)."""
        self.say_error(code, message, details)
        del self._raw[:end]
        if self._raw:
            self._read_handshake()

    def _deny(self, message: str) -> None:
        log.warning("authentication failed", extra={"fields": {"peer": self.peer, "error": message}})
        self._close_with(pb.ERROR_CODE_PERMISSION_DENIED, message + "; closing the connection", {"reason": "unauthenticated"})

    def _handshake_late(self) -> None:
        self._timer = None
        if self.state is State.HANDSHAKE:
            timeout = self._limits.handshake_timeout
            log.info("closing connection", extra={"fields": {"peer": self.peer, "reason": "handshake_timeout"}})
            self._close_with(pb.ERROR_CODE_UNSPECIFIED, f"no handshake within {timeout:g} s (--handshake-timeout); closing the connection",
                             {"reason": "handshake_timeout"})

    def _refuse_over_limit(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._gate is not None:
            self._gate.waited(self)
        limit = self._gate.limit if self._gate is not None else self._limits.max_connections
        if self._version is None:
            self._version = sniff_version(bytes(self._raw[:2])) if len(self._raw) >= 2 else 1
        self._close_with(pb.ERROR_CODE_RESOURCE_EXHAUSTED, f"too many connections (max {limit}); try again later",
                         {"reason": "too_many_connections", "limit": str(limit)})

    # ---- flow and the end -------------------------------------------------------------------------

    def _hold(self, held: bool) -> None:
        transport = self._transport
        if held == self._reading_held or transport is None or transport.is_closing():
            return
        if not held and self._worker_holds:
            return
        self._reading_held = held
        self._read_or_not()

    def _read_or_not(self) -> None:
        """Read the frontend's socket unless the session holds its input (flow control) or
        GATHER_WINDOW DATA are not acknowledged (gathering: what it sends meanwhile waits in the
        socket, and goes in one read and one DATA at the next ACK)."""
        transport = self._transport
        paused = self._reading_held or self._unacked >= GATHER_WINDOW
        if paused == self._paused or transport is None or transport.is_closing():
            return
        self._paused = paused
        try:
            if paused:
                transport.pause_reading()  # type: ignore[attr-defined]  # a ReadTransport here
            else:
                transport.resume_reading()  # type: ignore[attr-defined]  # likewise
        except (AttributeError, RuntimeError):
            pass

    def close(self) -> None:
        """The gateway stops: a resumable session parks on its worker (its peer resumes through
        any gateway); any other ends, each open request with its terminal state."""
        if self.state is State.RELAYING and not self.resumable:
            self.end_session("gateway_stopping")
            return
        if self.state is State.RELAYING:
            self._send(CLOSE, b"gateway_stopping")
        self._close()

    def _close(self) -> None:
        writer = self._writer
        transport = self._transport
        self._end()
        if writer is not None and writer is not transport:
            writer.close()
        if transport is None or transport.is_closing():
            return
        if writer is transport and writer is not None and writer.can_write_eof():
            writer.write_eof()
            self._loop.call_later(LINGER, writer.close)
            return
        transport.close()

    def _end(self) -> None:
        if self.state is State.ENDED and self._transport is None:
            return
        self.state = State.ENDED
        # Nothing more is read (what still arrives before the transport closes is dropped, but the
        # buffer may not be empty); what the buffers hold would wait for the collector (cycles).
        self._buffer, self._raw = bytearray(512), bytearray()
        self._view = memoryview(self._buffer)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._placing is not None and not self._placing.done():
            self._placing.cancel()
        if self._gate is not None:
            self._gate.release(self)
            self._gate = None
        self.host.forget(self)
        if self._on_closed is not None:
            on_closed, self._on_closed = self._on_closed, None
            on_closed()
