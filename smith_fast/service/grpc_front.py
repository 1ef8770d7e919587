"""The gRPC front: ``smith.v1.SmithService`` (Negotiate, Stream) and ``grpc.health.v1.Health``.

One service core, several fronts: a ``Stream`` call is driven by the same
:class:`~smith_fast.service.session.Session` as a socket connection. Its sink writes bare
``Envelope`` bytes (the hot encoders with ``framed=False``) into a queue that the call's response
generator yields from; the method is registered with a pass-through response serializer, so events
are never parsed back into protobuf objects. When the peer asked for ``batch_event``, the queue is
fed from the sink's batcher: whenever the generator is ready to send, everything batched since
the previous message leaves as one ``BatchEvent``, so a slow reader gets many events per message.

The queue is bounded the way a transport's buffer is: above :data:`HIGH_WATER` bytes the session
is paused (its commands' pipes are no longer read, its further requests wait and its request
stream is no longer read, so HTTP/2 flow control holds the client back), below :data:`LOW_WATER`
it resumes; what the queue holds counts against ``--max-session-buffer``
(:mod:`~smith_fast.service.flow`).

grpc.aio runs on whichever asyncio loop is current, uvloop included: it polls its completion queue
in a gRPC thread and wakes the loop through a socket pair. So the gRPC front shares the one loop
(and the one core) of every other listener.

A ``Stream`` whose client half-closes (ends its request stream) keeps running until its requests
have ended, then ends with OK; a cancelled call (the client went away) kills its commands at once,
as a closed socket does, or parks a resumable session. A call whose connection dropped ends its
requests as a half-close would, and grpc reports it cancelled only a little later: a resumable
session's half-close is therefore taken as one after :data:`HALF_CLOSE_GRACE` (an idle session was
otherwise closed by the very cut it should have survived).

With ``--token``, a call presents it in its metadata (``authorization: Bearer …`` or
``smith-token``) or, for ``Stream``, in the handshake's ``client_info["token"]`` (``Negotiate``:
``client_metadata["token"]``); a wrong or missing one fails the call ``UNAUTHENTICATED`` (a
``Stream`` after the ``ErrorEvent`` saying so). ``Stream`` calls count towards
``--max-connections`` (over it: ``RESOURCE_EXHAUSTED``) and have the handshake and idle deadlines
of a socket connection. The standard health service needs no token.
"""

from __future__ import annotations

import asyncio
import collections
import collections.abc
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

import grpc
from grpc import aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .auth import TOKEN_KEY, metadata_token, token_matches
from .connections import ConnectionGate
from .core import ACCEPTABLE, ServiceCore, accept_additions, capability_name, endpoint_list
from .resume import Front
from .deadlines import Deadlines
from .health import SERVICE_NAMES
from .negotiation import NAMED, wire_capabilities
from .session import Session
from .sinks import V1Sink

if TYPE_CHECKING:
    from grpc_health.v1._async import HealthServicer

__all__ = [
    "GrpcFront",
    "GRPC_STATUS",
    "ERROR_CODE_METADATA",
    "SERVICE_NAME",
    "HIGH_WATER",
    "LOW_WATER",
    "negotiate",
]

log = get_logger("smith_fast.grpc")

# The request and response types of a call's context: Stream passes bytes, Negotiate messages.
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")

SERVICE_NAME = "smith.v1.SmithService"
HIGH_WATER = 1 << 20
LOW_WATER = 256 * 1024
# How long a call refused for a wrong token in its metadata is given to deliver its first message.
_REFUSAL_READ_WAIT = 1.0
ERROR_CODE_METADATA = "smith-error-code"  # trailing metadata: the ErrorCode name of a failed call
HALF_CLOSE_GRACE = 0.25
"""Seconds the end of a resumable session's requests waits before it is taken as a half-close: a
dropped connection's call ends its requests first and is cancelled in the meantime (its reader is
then cancelled, and the session parked for a resume rather than finished)."""

# How a call that fails as a whole reports the schema's ErrorCode as a gRPC status.
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    pb.ERROR_CODE_UNSPECIFIED: grpc.StatusCode.UNKNOWN,
    pb.ERROR_CODE_UNSUPPORTED_VERSION: grpc.StatusCode.UNIMPLEMENTED,
    pb.ERROR_CODE_INVALID_CAPABILITY: grpc.StatusCode.INVALID_ARGUMENT,
    pb.ERROR_CODE_INVALID_TOOL: grpc.StatusCode.NOT_FOUND,
    pb.ERROR_CODE_EXECUTION_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    pb.ERROR_CODE_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    pb.ERROR_CODE_RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    pb.ERROR_CODE_INTERNAL_ERROR: grpc.StatusCode.INTERNAL,
}


def negotiate(core: ServiceCore, request: pb.NegotiateRequest) -> pb.NegotiateResponse:
    """Answer a ``NegotiateRequest`` by the handshake's rules (PROTOCOL.md, "Negotiate").

    The selected version is the first of ours (1, then 0) that the client supports and some
    listener speaks; ``fallback_to_jsonl`` is true when that is 0, and
    ``service_metadata["jsonl_endpoints"]`` then lists the socket listeners where v0 is spoken
    (never one pinned to v1). Capabilities are the requested ones the service has; the others are
    named in ``service_metadata["rejected_capabilities"]``. The rest of ``service_metadata`` is
    what the handshake's ``Ready.service_info`` would say (``core.service_info``), with the
    additions asked for in ``client_metadata["smith_fast.accept"]``.

    Args:
        core: the service core.
        request: the client's request.

    Returns:
        The response.

    Raises:
        ProtocolError: no version in common, or only v0 and no listener speaks it
            (``ERROR_CODE_UNSUPPORTED_VERSION``).
    """
    spoken = core.versions()
    common = [v for v in spoken if v in request.supported_versions]
    if not common:
        offered = ",".join(map(str, request.supported_versions)) or "none"
        ours = " and ".join(map(str, spoken))
        if 0 in request.supported_versions and 0 not in spoken:
            pinned = any(not e.address.startswith("grpc:") for e in core.endpoints)
            why = "its Unix and TCP listeners are pinned to v1: serve --protocol v1" if pinned else "it has no Unix or TCP listener"
            message = f"the client supports {offered}, and no listener of this service speaks version 0 ({why}); connect with version {ours}"
        else:
            message = f"no protocol version in common: the client supports {offered}, this service {ours}"
        raise ProtocolError(message, pb.ERROR_CODE_UNSUPPORTED_VERSION, details={"supported_versions": ",".join(map(str, spoken))})
    version = common[0]
    granted, refused = core.grant(list(request.capabilities))
    accepted, interval_ms, _ = accept_additions(request.client_metadata) if version == 1 else ([], 0, [])
    meta = core.service_info(version, granted, accepted, interval_ms)
    meta["available_capabilities"] = ",".join(sorted(capability_name(c) for c in core.capabilities))
    meta["smith_fast.acceptable"] = ",".join(ACCEPTABLE)
    if refused:
        meta["rejected_capabilities"] = ",".join(capability_name(c) for c in refused[:NAMED])
    fallback = version == 0
    if fallback:
        meta["jsonl_endpoints"] = endpoint_list(core.addresses(0))
    return pb.NegotiateResponse(
        selected_version=version, capabilities=wire_capabilities(granted), service_metadata=meta, fallback_to_jsonl=fallback
    )


class _Stream:
    """One ``Stream`` call: a session, its outgoing queue and the reader of its requests."""

    __slots__ = ("session", "sink", "out", "pending", "closed", "wake", "io", "_paused", "_reading", "_onward", "_released")

    framed = False  # bare envelopes (a resume.Front: a session resumes on a front that frames alike)

    def __init__(self, core: ServiceCore, peer: str) -> None:
        self.out: collections.deque[bytes] = collections.deque()
        self.pending = 0
        self.closed = False
        self.wake = asyncio.Event()
        self.io = core.metrics.io["grpc"]
        self._paused = False
        self._reading = asyncio.Event()  # clear while the session holds the peer's input
        self._reading.set()
        self._onward: _Stream | None = None  # its session resumed on another call: its writes go there
        self._released = False  # another call took its session over
        self.sink = V1Sink(self.push, framed=False, notify=self.notify)
        self.session: Session = core.new_session(
            self.sink, close=self.close, peer=peer, protocol="grpc", unsent=self._unsent, hold_input=self._hold_input, front=self
        )

    def _unsent(self) -> int:
        return self.pending

    def _hold_input(self, held: bool) -> None:
        if held:
            self._reading.clear()
        else:
            self._reading.set()

    def push(self, data: bytes) -> None:
        if self.closed:
            if self._onward is not None:
                self._onward.push(data)
            return
        self.out.append(data)
        self.pending += len(data)
        if self.pending > HIGH_WATER and not self._paused:
            self._paused = True
            self.session.pause()
        self.notify()

    def notify(self) -> None:
        if self._onward is not None:
            self._onward.notify()
            return
        wake = self.wake
        if not wake.is_set():
            wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    # ---- resume (a resume.Front) ---------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.push(data)

    def unsent(self) -> int:
        return self.pending

    def hold_input(self, held: bool) -> None:
        self._hold_input(held)

    def forward(self, to: Front | None) -> None:
        assert to is None or isinstance(to, _Stream)  # a gRPC session resumes on a gRPC call
        self._onward = to

    def carry(self, session: object) -> None:
        assert isinstance(session, Session)
        self.session = session
        self.sink = session.sink  # type: ignore[assignment]  # a gRPC session's sink is a V1Sink

    def release(self) -> None:
        """Another call took the session over: end this one (as done, not as a lost peer)."""
        self._released = True
        self.close()

    async def read(self, requests: AsyncIterator[bytes], gate: asyncio.Semaphore) -> None:
        reading = self._reading
        if not self.session.authenticated:  # a token is set and the metadata did not present it
            rest = await self._read_guarded(requests, gate)
            if rest is None:
                return
            requests = rest
        async for raw in requests:
            if self._released:
                return
            if not reading.is_set():  # the peer does not read, or its requests wait: take no more
                await reading.wait()
            self._take(raw)
        if not self._released and self.session.resumable is not None:
            await asyncio.sleep(HALF_CLOSE_GRACE)  # a dropped connection's cancellation, if it is one
        if not self._released:
            await self.session.finish()  # half-close: the client still listens

    async def _read_guarded(self, requests: AsyncIterator[bytes], gate: asyncio.Semaphore) -> AsyncIterator[bytes] | None:
        """Read and handle messages until the session has an accepted handshake, each read under the
        service-wide ``gate``, each message at most ``--max-handshake-frame-size``.

        gRPC receives a message whole (up to ``--max-frame-size``) before handing it over, so the
        size check alone would come after the memory is taken: the gate (``--grpc-handshake-reads``)
        is what bounds how many such messages unauthenticated calls can make the service hold at once.
        Returns the rest of the call's messages, to be read without the gate, or None when the call
        was closed for a message over the limit.
        """
        limit = self.session.core.limits.max_handshake_frame_size
        it = aiter(requests)
        while True:
            session = self.session  # another one once a resume handshake took it over
            if (session.handshaken and session.authenticated) or session.closing or self._released:
                break
            async with gate:
                try:
                    raw = await anext(it)
                except StopAsyncIteration:
                    break
            if len(raw) > limit:
                self.io.frames_in += 1
                self.io.bytes_in += len(raw)
                session.protocol_error(
                    ProtocolError(
                        f"the message is {len(raw)} bytes, above the {limit} allowed before an accepted "
                        "handshake (--max-handshake-frame-size); closing the call",
                        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
                        details={"reason": "handshake_frame_too_large", "size": str(len(raw)), "limit": str(limit)},
                    )
                )
                del raw
                await session.shutdown()
                if isinstance(it, collections.abc.AsyncGenerator):
                    # grpc's request iterator holds the message it yielded last, and is in a cycle
                    # that only a full collection frees: 60 refused calls kept 900 MB without this.
                    await it.aclose()
                return None
            self._take(raw)
        return it

    def _take(self, raw: bytes) -> None:
        """Count one message of the call and hand it to the session that now carries the call
        (another one once a resume handshake took it over)."""
        self.io.frames_in += 1
        self.io.bytes_in += len(raw)
        self.session.handle_frame(raw)

    async def responses(self) -> AsyncIterator[bytes]:
        out, io, wake = self.out, self.io, self.wake
        while True:
            if not out:
                self.sink.flush_batch()  # everything batched while the previous message was sent
                if not out:
                    if self.closed:
                        return
                    wake.clear()
                    await wake.wait()
                    continue
            data = out.popleft()
            self.pending -= len(data)
            if self._paused and self.pending < LOW_WATER:
                self._paused = False
                self.session.resume()
            io.frames_out += 1
            io.bytes_out += len(data)
            yield data


async def _first_message(requests: AsyncIterator[bytes]) -> None:
    """Take a refused call's first message (its handshake), waiting :data:`_REFUSAL_READ_WAIT` at most.

    A refusal sent while the client is still writing reaches it as the failed write (``INTERNAL``)
    instead of the refusal's status and ``ErrorCode``, about one call in ten.
    """
    with contextlib.suppress(Exception):
        await asyncio.wait_for(anext(aiter(requests)), _REFUSAL_READ_WAIT)


class GrpcFront:
    """The gRPC listeners of one service process.

    Args:
        core: the service core every call is served by.
        tls: ``(certificate chain PEM, private key PEM)`` to serve TLS, or None for plaintext.
        gate: the server's count of live connections (``--max-connections``): each ``Stream``
            call is handed to it; None: a gate of this front's own.
    """

    def __init__(self, core: ServiceCore, *, tls: tuple[bytes, bytes] | None = None, gate: ConnectionGate | None = None) -> None:
        self.core = core
        self.tls = tls
        self.gate = gate if gate is not None else ConnectionGate(core.limits.max_connections)
        self.addresses: list[str] = []
        self._health_tasks: set[asyncio.Task[None]] = set()
        self._handshake_reads = asyncio.Semaphore(max(1, core.limits.grpc_handshake_reads))
        limit = core.limits.max_frame_size
        self.server = aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                # With BDP probing grpc widens a call's receive window to megabytes even while the
                # service does not read the call (20 unread calls: +80 MB RSS; without it: +1 MB).
                # What the service reads comes from the peers' small commands; 64 KiB windows do.
                ("grpc.http2.bdp_probe", 0),
                ("grpc.max_send_message_length", -1),
                # Without this a second server could bind the same port and steal half the calls.
                ("grpc.so_reuseport", 0),
            ]
        )
        handlers = {
            "Negotiate": grpc.unary_unary_rpc_method_handler(
                self._negotiate,
                request_deserializer=pb.NegotiateRequest.FromString,
                response_serializer=pb.NegotiateResponse.SerializeToString,
            ),
            # No (de)serializers: requests are parsed by the reader (a bad one is an ErrorEvent, not
            # a failed call), responses are already bytes.
            "Stream": grpc.stream_stream_rpc_method_handler(self._stream),
        }
        self.server.add_registered_method_handlers(SERVICE_NAME, handlers)
        self.health: HealthServicer = grpc_health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

    def add_port(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (port 0 picks one); returns the address as ``grpc:HOST:PORT``.

        Raises:
            OSError: the port cannot be bound.
        """
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if self.tls is not None:
                creds = grpc.ssl_server_credentials([(self.tls[1], self.tls[0])])
                bound = self.server.add_secure_port(target, creds)
            else:
                bound = self.server.add_insecure_port(target)
        except RuntimeError as exc:  # grpcio reports a failed bind this way
            raise OSError(f"cannot listen on gRPC {target}: {exc}") from None
        if not bound:
            raise OSError(f"cannot listen on gRPC {target}")
        address = f"grpc:[{host}]:{bound}" if ":" in host else f"grpc:{host}:{bound}"
        self.addresses.append(address)
        return address

    async def start(self) -> None:
        await self._set_health()
        self.core.watch_health(self._health_changed)
        await self.server.start()

    async def _set_health(self) -> None:
        serving = self.core.unavailable() is None and not self.core.shutting_down
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in SERVICE_NAMES:
            await self.health.set(name, status)

    def _health_changed(self) -> None:
        if not self.core.shutting_down:
            task = asyncio.get_running_loop().create_task(self._set_health())
            self._health_tasks.add(task)
            task.add_done_callback(self._health_tasks.discard)

    async def begin_shutdown(self) -> None:
        """Health says NOT_SERVING from now on; new Stream calls are refused (UNAVAILABLE)."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float) -> None:
        """Stop listening; calls still running after ``grace`` seconds are cancelled."""
        await self.server.stop(grace)

    # ---- methods -------------------------------------------------------------------------------

    async def _negotiate(
        self, request: pb.NegotiateRequest, context: aio.ServicerContext[pb.NegotiateRequest, pb.NegotiateResponse]
    ) -> pb.NegotiateResponse:
        self.core.metrics.io["grpc"].frames_in += 1
        token = self.core.config.token
        if token is not None:
            presented = metadata_token(context.invocation_metadata())
            if presented is None:
                presented = request.client_metadata.get(TOKEN_KEY)
            if not token_matches(token, presented):
                await self._unauthenticated(context, "Negotiate " + ("presents no token" if presented is None else "presents a wrong token"))
        try:
            response = negotiate(self.core, request)
        except ProtocolError as exc:
            self.core.metrics.error(exc.code)
            await self._abort(context, exc)
            raise  # not reached: abort raises
        self.core.metrics.io["grpc"].frames_out += 1
        return response

    @staticmethod
    async def _abort(context: aio.ServicerContext[_Request, _Response], exc: ProtocolError) -> None:
        context.set_trailing_metadata(((ERROR_CODE_METADATA, pb.ErrorCode.Name(exc.code)),))
        await context.abort(GRPC_STATUS.get(exc.code, grpc.StatusCode.UNKNOWN), str(exc))

    async def _unauthenticated(self, context: aio.ServicerContext[_Request, _Response], message: str) -> None:
        log.warning("authentication failed", extra={"fields": {"peer": context.peer(), "error": message}})
        self.core.metrics.error(pb.ERROR_CODE_PERMISSION_DENIED)
        context.set_trailing_metadata(((ERROR_CODE_METADATA, "ERROR_CODE_PERMISSION_DENIED"),))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def _stream(self, requests: AsyncIterator[bytes], context: aio.ServicerContext[bytes, bytes]) -> None:
        core = self.core
        if core.shutting_down:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the service is shutting down")
        token = core.config.token
        presented = metadata_token(context.invocation_metadata()) if token is not None else None
        if token is not None and presented is not None and not token_matches(token, presented):
            await _first_message(requests)
            await self._unauthenticated(context, "the call metadata presents a wrong token")
        gate = self.gate
        if not gate.admit(context):  # the call is the connection the gate counts
            await _first_message(requests)
            log.warning("too many connections", extra={"fields": {"peer": context.peer(), "max_connections": gate.limit}})
            core.metrics.error(pb.ERROR_CODE_RESOURCE_EXHAUSTED)
            await self._abort(
                context,
                ProtocolError(f"too many connections (max {gate.limit}); try again later", pb.ERROR_CODE_RESOURCE_EXHAUSTED),
            )
        try:
            stream = _Stream(core, context.peer())
        except BaseException:
            gate.release(context)
            raise
        if presented is not None:
            stream.session.authenticated = True
        deadlines = Deadlines(core.limits, lambda: stream.session, lambda reason, message: stream.session.expire(reason, message))
        log.debug("stream", extra={"fields": {"peer": stream.session.peer}})
        reader = asyncio.get_running_loop().create_task(stream.read(requests, self._handshake_reads))
        reader.add_done_callback(lambda task: self._reader_done(task, stream))
        try:
            write = context.write
            async for data in stream.responses():
                await write(data)
            if stream.session.denied:  # the ErrorEvent saying why went out first
                context.set_trailing_metadata(((ERROR_CODE_METADATA, "ERROR_CODE_PERMISSION_DENIED"),))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the handshake did not present the token")
        finally:
            gate.release(context)
            deadlines.cancel()
            reader.cancel()
            if not stream.closed:  # cancelled: the peer is gone
                stream.closed = True
                stream.session.connection_lost()

    @staticmethod
    def _reader_done(task: asyncio.Task[None], stream: _Stream) -> None:
        if task.cancelled() or task.exception() is None:
            return
        # The request stream broke (the call is failing anyway): end the session as a lost peer.
        log.info("stream reader ended", extra={"fields": {"peer": stream.session.peer, "error": repr(task.exception())}})
        if not stream.closed:
            stream.session.connection_lost()
            stream.close()
