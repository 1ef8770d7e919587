"""Asyncio client SDK: talk to ``smith-fast serve`` (or any Smith service) over stdio, Unix, TCP
or gRPC.

Example::

    async with await Client.connect("unix:/tmp/smith.sock") as client:   # or "grpc:127.0.0.1:50051"
        await client.handshake()
        async for event in client.shell_exec("ls -l"):
            print(event.shell_output.stdout or "", end="")
        result = await client.call_tool("fs.list", {"path": "."})

A command to steer (stdin, a terminal, cancel) or to read as bytes::

    proc = await client.start("python3 -i", pty=(24, 80))    # or stdin=True
    proc.write("print(6 * 7)\n")
    async for chunk in proc:                                   # Chunk(stream, data)
        ...
    code = await proc.wait()
    result = await client.run("cat image.png")               # RunResult(exit_code, stdout, stderr)

Events of concurrent requests are routed to their callers by ``request_id``; events without one
(Ready, capability warnings, logs) go to :attr:`Client.events`, which gets ``None`` once the
connection has ended. A client can ask for the Envelope
additions in its handshake (``accept=["batch_event", "health", "metrics"]``): BatchEvents are
unpacked transparently, :meth:`Client.health_check` asks in-stream, and metrics reports land in
:attr:`Client.metrics` and :attr:`Client.resource_usage`.

A client connected with ``resume=True`` (v1 over Unix or TCP) survives a dropped connection: it
reconnects, resumes its session (PROTOCOL.md, "Resume") and sends again the requests the service
never read, so an ``async for`` over a request's events goes on as if nothing happened::

    client = await Client.connect("tcp:host:7878", resume=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from google.protobuf.message import DecodeError

from .errors import FramingError, SmithFastError
from .framing import FrameDecoder, encode_frame
from .jsonl import JsonlCodec, LineDecoder
from .options import ADDRESS_FORMS
from .pb import smith_pb2 as pb
from .remote_process import STDIN_WINDOW, Chunk, InputWait, RemoteProcess, RunResult, ToolOutput, cancel_command, terminal_state
from .sequencing import Sequencer

if TYPE_CHECKING:
    import grpc
    from grpc import aio as grpc_aio

__all__ = [
    "Client",
    "GrpcClient",
    "SmithError",
    "ConnectionClosed",
    "ConnectError",
    "NotASmithService",
    "AddressError",
    "Chunk",
    "InputWait",
    "RemoteProcess",
    "RunResult",
    "ToolOutput",
    "ADDRESS_FORMS",
    "event_request_id",
    "format_address",
    "parse_address",
]

ACCEPT_KEY = "smith_fast.accept"
INTERVAL_KEY = "smith_fast.metrics_interval_ms"
ACCEPTED_KEY = "smith_fast.accepted"
TOKEN_KEY = "token"  # client_info key of the shared secret (serve --token)
STREAM_METHOD = "/smith.v1.SmithService/Stream"
NEGOTIATE_METHOD = "/smith.v1.SmithService/Negotiate"

_CAPS = {name.removeprefix("CAPABILITY_").lower(): value for name, value in pb.Capability.items() if value}

def _capability(name: str | int) -> pb.Capability:
    """A capability name (``shell_exec``) or number → its number."""
    if not isinstance(name, str):
        number = name
    else:
        try:
            number = _CAPS[name]
        except KeyError:
            raise ValueError(f"unknown capability {name!r}; the capabilities are: {', '.join(sorted(_CAPS))}") from None
    # The stubs type enum fields as pb.Capability, an int subclass that exists for checkers only:
    # at run time an enum value is a plain int, so the number is one as it stands.
    return cast("pb.Capability", number)


class SmithError(SmithFastError):
    """The service answered a request with an ``ErrorEvent``.

    Attributes:
        code: the ``ErrorCode`` value; ``code_name`` its name (``ERROR_CODE_EXECUTION_TIMEOUT`` ...).
        request_id: the request it concerns, if any.
        details: ``ErrorEvent.details``.
    """

    def __init__(self, error: pb.ErrorEvent) -> None:
        super().__init__(f"{pb.ErrorCode.Name(error.error_code)}: {error.message}")
        self.code = error.error_code
        self.code_name = pb.ErrorCode.Name(error.error_code)
        self.request_id = error.request_id if error.HasField("request_id") else None
        self.details = dict(error.details)
        self.error = error


class ConnectionClosed(SmithFastError):
    """The connection ended before the awaited answer arrived."""


class ConnectError(ConnectionClosed, ConnectionError):
    """The service cannot be reached; the message names the address and says what to check.

    A :class:`ConnectionClosed` (what a handshake on a dead connection raised before) and an
    ``OSError`` (what connecting raised before), so that existing handlers of either still apply.
    """


class NotASmithService(ConnectError):
    """Something answers at the address, but not the Smith protocol (an HTTP server, a gRPC port
    reached as a socket, the metrics port ...), or nothing answered the handshake in time."""


class AddressError(SmithFastError, ValueError):
    """An address that is none of :data:`ADDRESS_FORMS`."""


_REASONS = {  # errno → what to say; "is it running?" where that is the likely cause
    FileNotFoundError: "no such file (is smith-fast serve running there?)",
    ConnectionRefusedError: "connection refused (is smith-fast serve running there?)",
    PermissionError: "permission denied (the socket is mode 0600: connect as the user running the service)",
    TimeoutError: "timed out",
}


def _reason(exc: OSError) -> str:
    for cls, text in _REASONS.items():
        if isinstance(exc, cls):
            return text
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host name ({exc.strerror})"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def event_request_id(event: pb.Event) -> str | None:
    """The request an event belongs to, or None (Ready, service-wide state changes, ...)."""
    kind = event.WhichOneof("event_type")
    if kind is None or kind == "ready":
        return None
    inner = getattr(event, kind)
    if inner.DESCRIPTOR.fields_by_name["request_id"].has_presence and not inner.HasField("request_id"):
        return None
    return inner.request_id or None


def parse_address(address: str) -> tuple[str, str | tuple[str, int]]:
    """``unix:PATH``, ``tcp:HOST:PORT``, ``grpc:HOST:PORT``, ``HOST:PORT`` or a path → (kind, target).

    ``grpc`` targets are returned as the ``HOST:PORT`` string grpcio takes.

    Raises:
        AddressError: an empty path, or a ``tcp:``/``grpc:`` address without a numeric port.
    """
    if address.startswith("unix:") or ("/" in address and not address.startswith(("tcp:", "grpc:"))) or (
        ":" not in address and address
    ):
        path = address.removeprefix("unix:")
        if not path:
            raise AddressError(f"address {address!r} names no socket path (forms: {ADDRESS_FORMS})")
        return "unix", path
    kind = "grpc" if address.startswith("grpc:") else "tcp"
    host, sep, port = address.removeprefix(f"{kind}:").rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise AddressError(f"address {address!r} is not {kind}:HOST:PORT with a port number (forms: {ADDRESS_FORMS})")
    host = host.strip("[]") or "127.0.0.1"
    if kind == "grpc":
        return "grpc", f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    return "tcp", (host, int(port))


def format_address(kind: str, target: str | tuple[str, int]) -> str:
    """The inverse of :func:`parse_address`: ``unix:PATH``, ``tcp:HOST:PORT``, ``grpc:HOST:PORT``."""
    if isinstance(target, tuple):
        host, port = target
        return f"tcp:[{host}]:{port}" if ":" in host else f"tcp:{host}:{port}"
    return f"{kind}:{target}"


class Client:
    """A connection to a Smith service.

    Create it with :meth:`connect` or :meth:`spawn`, then call :meth:`handshake` first.

    Args:
        reader, writer: an asyncio stream pair connected to the service.
        protocol: ``"v1"`` (varint-delimited protobuf) or ``"v0"`` (JSON lines).
        process: the spawned service process, if :meth:`spawn` made one.
        max_frame_size: largest frame (or line) accepted from the service.
        token: the service's shared secret (``serve --token``), sent in every handshake.
        address: where it is connected (``unix:PATH`` ...), for messages; None for a spawned service.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        protocol: str = "v1",
        process: asyncio.subprocess.Process | None = None,
        max_frame_size: int = 64 * 1024 * 1024,
        token: str | None = None,
        address: str | None = None,
        resume: bool = False,
    ) -> None:
        self._init_state(protocol, process)
        self.token = token
        self.address = address
        self.resume = resume and protocol == "v1" and address is not None
        self._reader = reader
        self._writer = writer
        self._decoder: FrameDecoder | LineDecoder = FrameDecoder(max_frame_size) if protocol == "v1" else LineDecoder(max_frame_size)
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    def _init_state(self, protocol: str, process: asyncio.subprocess.Process | None) -> None:
        if protocol not in ("v1", "v0"):
            raise ValueError(f"protocol must be 'v1' or 'v0', not {protocol!r}")
        self.protocol = protocol
        self.process = process
        self.token = None
        self.address = None  # see __init__ and connect()
        self.ready: pb.ReadyEvent | None = None
        self.answered = False  # something Smith-shaped has arrived
        self.accepted: frozenset[str] = frozenset()
        self.events: asyncio.Queue[pb.Event | None] = asyncio.Queue()  # None once the connection ended
        self.metrics: asyncio.Queue[pb.MetricsEvent] = asyncio.Queue()
        self.resource_usage: asyncio.Queue[pb.ResourceUsageEvent] = asyncio.Queue()
        self.warnings: list[pb.ErrorEvent] = []
        self.batches_received = 0
        self._health: deque[asyncio.Future[pb.HealthCheckResponse]] = deque()
        self._routes: dict[str, asyncio.Queue[pb.Event | None]] = {}
        self._closed = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._seq = Sequencer()
        self._codec = JsonlCodec()
        # resume (PROTOCOL.md, "Resume"): the session's token, the last sequence received, the
        # requests sent that the service has not said it read, and the replay still to come
        self.resume = False
        self.resume_token = ""
        self.last_sequence = 0
        self.resumes = 0
        self._unread: dict[str, tuple[pb.Command, asyncio.StreamWriter]] = {}  # with the connection it went on
        self._replay_left = -1
        self._closing = False
        self._resume_refusal: ConnectionClosed | None = None

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls, address: str, *, protocol: str = "v1", tls_ca: bytes | None = None, token: str | None = None, resume: bool = False
    ) -> Client:
        """Connect to ``unix:PATH``, ``tcp:HOST:PORT``, ``HOST:PORT`` or ``grpc:HOST:PORT``.

        Args:
            address: where the service listens.
            protocol: ``v1`` or ``v0`` (gRPC is always v1).
            tls_ca: PEM root certificate(s) to verify a gRPC service's TLS certificate with; a
                ``grpc:`` address is then reached over TLS.
            token: the service's shared secret (``serve --token``): sent in the handshake's
                ``client_info["token"]`` (v0: the Handshake's ``"token"`` member) and, over gRPC,
                as ``authorization: Bearer`` call metadata.
            resume: ask for ``resume`` in the handshake and, when the connection drops, reconnect
                and resume the session (v1 over Unix or TCP; PROTOCOL.md, "Resume").

        Returns:
            The connected client (a :class:`GrpcClient` for ``grpc:`` addresses).

        Raises:
            AddressError: ``address`` is none of the forms above.
            ConnectError: nothing accepts connections there; the message names the address and
                the likely cause (``cannot connect to unix:x.sock: no such file (is smith-fast
                serve running there?)``).
        """
        kind, target = parse_address(address)
        name = format_address(kind, target)
        if kind == "grpc" and isinstance(target, str):  # a grpc target is always the HOST:PORT text
            if protocol != "v1":
                raise ValueError("gRPC carries protocol v1 only")
            client: Client = await GrpcClient.open(target, tls_ca=tls_ca, token=token)
            client.address = name
            return client
        limit = 1 << 20
        try:
            if isinstance(target, str):
                reader, writer = await asyncio.open_unix_connection(target, limit=limit)
            else:
                reader, writer = await asyncio.open_connection(*target, limit=limit)
        except OSError as exc:
            raise ConnectError(f"cannot connect to {name}: {_reason(exc)}") from exc
        return cls(reader, writer, protocol=protocol, token=token, address=name, resume=resume)

    @classmethod
    async def spawn(
        cls,
        *serve_args: str,
        protocol: str = "v1",
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> Client:
        """Start ``smith-fast serve --stdio`` as a child process and talk to it over its stdin/stdout.

        ``token`` is sent in the handshake as :meth:`connect` does (a stdio service trusts the
        process that started it and does not ask for it).
        """
        proc = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "smith_fast",
            "serve",
            "--stdio",
            *serve_args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
            limit=1 << 20,
        )
        assert proc.stdout is not None and proc.stdin is not None
        return cls(proc.stdout, proc.stdin, protocol=protocol, process=proc, token=token)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- sending -----------------------------------------------------------------------------

    def send(self, command: pb.Command) -> None:
        """Send one command as is (for commands the helpers below do not cover)."""
        if self.protocol == "v1":
            env = pb.Envelope()
            env.command.CopyFrom(command)
            self.send_envelope(env)
        else:
            if self._closed.is_set():
                raise ConnectionClosed(f"connection closed: {self._close_reason}")
            self._writer.write(self._codec.encode_command(command))

    def send_envelope(self, env: pb.Envelope) -> None:
        """Stamp (timestamp, sequence) and send one v1 envelope.

        Raises:
            ConnectionClosed: the connection is gone.
            ValueError: this is a v0 connection.
        """
        if self.protocol != "v1":
            raise ValueError("envelopes are protocol v1 only")
        if self._closed.is_set():
            raise ConnectionClosed(f"connection closed: {self._close_reason}")
        self._send_bytes(self._seq.stamp(env).SerializeToString())

    def _send_bytes(self, envelope: bytes) -> None:
        if self.resume_token and self._routes:
            self._note_unread(envelope)
        self._writer.write(encode_frame(envelope))

    def _send_v0_handshake(self, command: pb.Command, token: str) -> None:
        """A v0 Handshake with a ``"token"`` member in its ``data`` (v0 has no ``client_info``)."""
        if self._closed.is_set():
            raise ConnectionClosed(f"connection closed: {self._close_reason}")
        line = json.loads(self._codec.encode_command(command))
        line["data"][TOKEN_KEY] = token
        self._writer.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")

    def _route(self, rid: str) -> asyncio.Queue[pb.Event | None]:
        if rid in self._routes:
            raise ValueError(f"request {rid} is already in flight")
        queue: asyncio.Queue[pb.Event | None] = asyncio.Queue()
        self._routes[rid] = queue
        return queue

    async def _next(self, queue: asyncio.Queue[pb.Event | None]) -> pb.Event:
        event = await queue.get()
        if event is None:
            raise ConnectionClosed(f"connection closed: {self._close_reason}")
        return event

    # ---- commands ----------------------------------------------------------------------------

    async def handshake(
        self,
        capabilities: Iterable[str | int] = ("shell_exec",),
        client_info: Mapping[str, str] | None = None,
        *,
        version: int | None = None,
        accept: Iterable[str] = (),
        metrics_interval_ms: int | None = None,
        timeout: float | None = None,
    ) -> pb.ReadyEvent:
        """Negotiate; returns the ReadyEvent. Capability warnings land in :attr:`warnings`.

        Args:
            capabilities: capability names (``shell_exec`` ...) or numbers to ask for.
            client_info: ``HandshakeCommand.client_info`` (v1 only).
            version: the protocol version to ask for (default: the connection's).
            accept: Envelope additions to ask for (v1): ``batch_event``, ``health``, ``metrics``, ``usage``.
                What the service granted is in :attr:`accepted` afterwards.
            metrics_interval_ms: how often to send metrics reports, with ``metrics``.
            timeout: seconds to wait for the service's first answer on this connection; None
                waits as long as it takes.

        Raises:
            ValueError: an unknown capability name (the message lists the valid ones).
            SmithError: the service refused the version.
            NotASmithService: what answers at the address does not speak the protocol, or
                nothing answered within ``timeout``.
        """
        cmd = pb.Command()
        hs = cmd.handshake
        hs.version = (1 if self.protocol == "v1" else 0) if version is None else version
        hs.capabilities.extend(_capability(c) for c in capabilities)
        hs.client_info.update(client_info or {"client": "smith-fast-sdk"})
        accept = list(accept)
        if self.resume and "resume" not in accept:
            accept.append("resume")
        if accept:
            hs.client_info[ACCEPT_KEY] = ",".join(accept)
        if metrics_interval_ms is not None:
            hs.client_info[INTERVAL_KEY] = str(metrics_interval_ms)
        if self.token is not None and self.protocol == "v0":
            self._send_v0_handshake(cmd, self.token)
        else:
            if self.token is not None:
                hs.client_info[TOKEN_KEY] = self.token
            self.send(cmd)
        try:
            return await asyncio.wait_for(self._await_ready(), timeout)
        except TimeoutError:
            if self.answered or self.address is None:
                raise
            raise NotASmithService(f"not a Smith service at {self.address}: no answer to the handshake within {timeout:g}s") from None
        except ConnectionClosed as exc:
            if self.answered or self.address is None or isinstance(exc, NotASmithService):
                raise
            raise self._unanswered() from exc

    def _unanswered(self) -> ConnectError:
        """Why the connection ended before the service said anything."""
        reason = self._close_reason
        if isinstance(reason, NotASmithService):
            return reason
        details = getattr(reason, "details", None)
        if callable(details):  # a gRPC call that failed: nothing (Smith) listens there
            return ConnectError(f"cannot connect to {self.address}: {reason.code().name}: {details()} "  # type: ignore[union-attr]  # details() callable: an AioRpcError, which has code()
                                "(is smith-fast serve --grpc running there?)")
        return NotASmithService(f"not a Smith service at {self.address}: it closed the connection without answering the handshake")

    async def _await_ready(self) -> pb.ReadyEvent:
        while True:
            event = await self._next(self.events)
            kind = event.WhichOneof("event_type")
            if kind == "ready":
                self.ready = event.ready
                self.resume_token = event.ready.resume_token if self.resume else ""
                granted = event.ready.service_info.get(ACCEPTED_KEY, "")
                self.accepted = frozenset(item for item in granted.split(",") if item)
                return event.ready
            if kind == "error":
                if event.error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY:
                    self.warnings.append(event.error)
                    continue
                raise SmithError(event.error)

    async def shell_exec(
        self,
        command: str,
        *,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        request_id: str | None = None,
    ) -> AsyncIterator[pb.Event]:
        """Run ``command``; yields its events (state changes, ShellOutput ...) until the final one.

        Raises:
            SmithError: the service answered with an ErrorEvent (after the final output, if any).
        """
        cmd = self.shell_exec_command(command, shell=shell, cwd=cwd, env=env, timeout_ms=timeout_ms, request_id=request_id)
        rid = cmd.shell_exec.request_id
        async for event in self._request(rid, cmd):
            yield event

    def shell_exec_command(
        self,
        command: str,
        *,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        request_id: str | None = None,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        term: str | None = None,
        binary: bool = False,
    ) -> pb.Command:
        """The ``ShellExec`` command :meth:`shell_exec` and :meth:`start` send."""
        cmd = pb.Command()
        se = cmd.shell_exec
        se.request_id = request_id or str(uuid.uuid4())
        se.command = command
        if shell is not None:
            se.shell = shell
        if cwd is not None:
            se.cwd = cwd
        se.env.update(env or {})
        if timeout_ms is not None:
            se.timeout_ms = timeout_ms
        se.open_stdin = stdin
        if pty is not None:
            se.pty.rows, se.pty.cols = pty
            se.pty.term = term or ""
        se.binary_output = binary
        return cmd

    async def start(
        self,
        command: str,
        *,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        term: str | None = None,
        binary: bool = True,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        request_id: str | None = None,
        background: bool = False,
    ) -> RemoteProcess:
        """Start ``command`` and return it running: write its stdin, resize, cancel, read its output.

        Args:
            stdin: keep its stdin open for :meth:`RemoteProcess.write` (else it is ``/dev/null``).
            pty: ``(rows, cols)``: run it on a pseudo-terminal (stdin open, output on stdout).
            term: ``TERM`` on the terminal (default ``xterm-256color``).
            binary: output as exact bytes (v1 only: on v0 it is text).
            background: run it as a background process (PROTOCOL.md, "Background processes"): it
                outlives this request and this connection; the handle returned is attached to it
                from offset 0 (:meth:`attach`), its id is ``proc.target``.

        Leaving ``async for chunk in proc`` early, ``proc.aclose()`` or cancelling a task awaiting
        ``proc.wait()`` cancels it on the service (detaches, with ``background``).

        Raises:
            SmithError: with ``background``, the service refused it (``--max-background``, hooks ...).
        """
        cmd = self.shell_exec_command(
            command, shell=shell, cwd=cwd, env=env, timeout_ms=timeout_ms, request_id=request_id,
            stdin=stdin, pty=pty, term=term, binary=binary and self.protocol == "v1",
        )
        rid = cmd.shell_exec.request_id
        if background:
            return await self.attach(await self._background(cmd), binary=binary)
        queue = self._route(rid)
        try:
            self.send(cmd)
        except BaseException:
            self._routes.pop(rid, None)
            raise

        def done() -> None:
            self._routes.pop(rid, None)

        return self._process(rid, queue, done)

    def _process(self, rid: str, queue: asyncio.Queue[pb.Event | None], done: Callable[[], None], target: str | None = None) -> RemoteProcess:
        """The handle of request ``rid`` whose events arrive on ``queue`` (:meth:`start`, :meth:`attach`)."""
        return RemoteProcess(
            rid,
            send=self.send,
            events=queue,
            closed=lambda: ConnectionClosed(f"connection closed: {self._close_reason}"),
            error=SmithError,
            done=done,
            window=STDIN_WINDOW if self.protocol == "v1" else 0,
            target=target,
        )

    async def run(self, command: str, *, input: bytes | str | None = None, **options: Any) -> RunResult:
        """Run ``command`` to its end; returns its exit code, stdout and stderr (bytes).

        ``input`` is written to its stdin (then closed). Cancelling the awaiting task cancels the
        command on the service. Options are :meth:`start`'s.

        Raises:
            SmithError: the request ended with an error (timeout, refused ...).
        """
        proc = await self.start(command, stdin=input is not None or options.pop("stdin", False), **options)
        if input is not None:
            try:
                await proc.send(input)
            except asyncio.CancelledError:
                proc.cancel()
                raise
            proc.close_stdin()
        await proc.wait()
        return proc.output()

    async def tool(self, tool: str, args: object = None, *, timeout_ms: int | None = None) -> ToolOutput:
        """:meth:`call_tool` with the result's JSON parsed (``value``; ``raw`` keeps the bytes)."""
        return ToolOutput.of(await self.call_tool(tool, args, timeout_ms=timeout_ms))

    def cancel(self, request_id: str) -> None:
        """Ask the service to cancel a running request of this connection, or a background process
        of the service, by its id."""
        self.send(cancel_command(request_id))

    async def background(
        self,
        command: str,
        *,
        stdin: bool = False,
        pty: tuple[int, int] | None = None,
        term: str | None = None,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int | None = None,
        request_id: str | None = None,
    ) -> str:
        """Start ``command`` as a background process and return its id at once (as ``docker run -d``);
        :meth:`attach` follows it, :meth:`cancel` stops it, :meth:`list_processes` lists it.

        Raises:
            SmithError: the service refused it (``--max-background``, a hook, no ``shell_exec`` ...).
        """
        return await self._background(self.shell_exec_command(
            command, shell=shell, cwd=cwd, env=env, timeout_ms=timeout_ms, request_id=request_id, stdin=stdin, pty=pty, term=term,
        ))

    async def _background(self, cmd: pb.Command) -> str:
        cmd.shell_exec.background = True
        rid = cmd.shell_exec.request_id
        async for _event in self._request(rid, cmd):
            pass  # READY once it runs in the background (an ErrorEvent raises SmithError)
        return rid

    async def list_processes(self) -> list[pb.BackgroundProcess]:
        """The service's background processes, oldest first (PROTOCOL.md, "Background processes").

        Raises:
            SmithError: refused (``shell_exec`` was not granted).
        """
        rid = str(uuid.uuid4())
        found: list[pb.BackgroundProcess] = []
        async for event in self._request(rid, pb.Command(list_processes=pb.ListProcessesCommand(request_id=rid))):
            if event.WhichOneof("event_type") == "process_list":
                found.extend(event.process_list.processes)
        return found

    async def attach(self, process_id: str, from_offset: int = 0, *, binary: bool = True) -> RemoteProcess:
        """Follow background process ``process_id``: its output retained from ``from_offset`` (from
        the oldest retained byte if that was dropped), then live, then its exit.

        The handle is :meth:`start`'s: ``write``/``close_stdin``/``resize``/``cancel`` reach the
        process (``cancel`` stops it); leaving ``async for`` early or ``aclose()`` only detaches.
        ``await proc.wait()`` returns its exit code. ``proc.request_id`` is the attach request,
        ``proc.target`` the process.

        Raises:
            SmithError: from :meth:`RemoteProcess.wait`, e.g. no such background process.
        """
        rid = str(uuid.uuid4())
        queue = self._route(rid)
        routed_target = process_id not in self._routes
        if routed_target:  # refusals of stdin/resize name the process: they belong to this handle
            self._routes[process_id] = queue
        attach = pb.AttachCommand(request_id=rid, process_id=process_id, from_offset=from_offset)
        attach.binary_output = binary and self.protocol == "v1"

        def done() -> None:
            self._routes.pop(rid, None)
            if routed_target and self._routes.get(process_id) is queue:
                del self._routes[process_id]

        try:
            self.send(pb.Command(attach=attach))
        except BaseException:
            done()
            raise
        return self._process(rid, queue, done, process_id)

    async def _request(self, rid: str, cmd: pb.Command) -> AsyncIterator[pb.Event]:
        """Send ``cmd``, yield its events until its terminal state change; raise its ErrorEvent.

        Left before that (a ``break``, a cancelled task): the service is told to cancel it."""
        queue = self._route(rid)
        error: pb.ErrorEvent | None = None
        ended = False
        try:
            self.send(cmd)
            while True:
                event = await self._next(queue)
                kind = event.WhichOneof("event_type")
                if kind == "error":
                    error = event.error
                    continue
                if terminal_state(event) is not None:
                    ended = True
                    yield event
                    break
                yield event
        except ConnectionClosed:
            ended = True
            raise
        finally:
            self._routes.pop(rid, None)
            if not ended and not self._closed.is_set():
                with contextlib.suppress(SmithFastError, ConnectionError, RuntimeError):
                    self.send(cancel_command(rid))
        if error is not None:
            raise SmithError(error)

    async def call_tool(
        self, tool: str, args: object = None, *, timeout_ms: int | None = None, raw_args: bytes | None = None
    ) -> pb.ToolResultEvent:
        """Call a tool with JSON-serializable ``args`` (or pre-encoded ``raw_args``); returns its result.

        A tool that ran and failed returns ``success=False`` with ``error`` set.

        Raises:
            SmithError: unknown tool, permission denied, timeout, ...
        """
        rid = str(uuid.uuid4())
        cmd = pb.Command()
        tc = cmd.tool_call
        tc.request_id = rid
        tc.tool = tool
        tc.args = raw_args if raw_args is not None else json.dumps({} if args is None else args).encode()
        if timeout_ms is not None:
            tc.timeout_ms = timeout_ms
        result: pb.ToolResultEvent | None = None
        async for event in self._request(rid, cmd):
            if event.WhichOneof("event_type") == "tool_result":
                result = event.tool_result
        if result is None:
            raise ConnectionClosed("the request ended without a ToolResult")
        return result

    async def health_check(self, service_name: str = "") -> pb.HealthCheckResponse:
        """Ask the service in-stream how it is (needs ``accept=["health"]`` in the handshake).

        Args:
            service_name: ``""`` for the whole service.

        Returns:
            The response, ``metrics`` filled.

        Raises:
            ConnectionClosed: the connection ended first.
        """
        env = pb.Envelope()
        env.health_check_request.service_name = service_name
        future: asyncio.Future[pb.HealthCheckResponse] = asyncio.get_running_loop().create_future()
        self._health.append(future)
        try:
            self.send_envelope(env)
        except BaseException:
            self._health.remove(future)
            raise
        return await future

    async def load_hook(self, hook_type: str, script: str) -> pb.HookResultEvent:
        """Load a ``"js"`` or ``"rust"`` hook into this session; returns the ALLOW naming its id and triggers.

        Raises:
            SmithError: the hook did not load (the message carries the engine's or compiler's
                diagnostics), or the capability was not granted.
        """
        rid = str(uuid.uuid4())
        cmd = pb.Command()
        cmd.hook_load.request_id = rid
        cmd.hook_load.hook_type = hook_type
        cmd.hook_load.script = script
        answer: pb.HookResultEvent | None = None
        async for event in self._request(rid, cmd):
            if event.WhichOneof("event_type") == "hook_result":
                answer = event.hook_result
        if answer is None:
            raise ConnectionClosed("the request ended without a HookResult")
        return answer

    async def plan(self, goal: str, context: Mapping[str, str] | None = None, *, request_id: str | None = None) -> AsyncIterator[pb.Event]:
        """Send a PlanCommand; yields its events (GraphDeltas, TokenUsage, and, when executed, the
        steps' own events under their node ids) until the plan request ends.

        Raises:
            SmithError: no plan could be made.
        """
        rid = request_id or str(uuid.uuid4())
        cmd = pb.Command()
        cmd.plan.request_id = rid
        cmd.plan.goal = goal
        cmd.plan.context.update(context or {})
        step_queue = self.events  # step events carry their node ids: they arrive on the general queue
        async for event in self._request(rid, cmd):
            while not step_queue.empty():
                queued = step_queue.get_nowait()
                if queued is not None:
                    yield queued
            yield event
        while not step_queue.empty():
            queued = step_queue.get_nowait()
            if queued is not None:
                yield queued

    async def ping(self) -> float:
        """Round-trip time in seconds of a HandshakeCommand → ReadyEvent exchange."""
        start = time.perf_counter()
        await self.handshake(capabilities=[c for c in (self.ready.capabilities if self.ready else [])])
        return time.perf_counter() - start

    async def shutdown(self) -> None:
        """Ask the service to end this session, and wait until it closed the connection."""
        cmd = pb.Command()
        cmd.shutdown.SetInParent()
        self.send(cmd)
        self._closing = True  # the close that follows is no drop to resume from
        await self._writer.drain()
        await self._closed.wait()

    async def close(self) -> None:
        """Close the connection (and stop a spawned service)."""
        self._closing = True
        if not self._writer.is_closing():
            self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._closed.wait(), 5)
        self._reader_task.cancel()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                if self.process.returncode is None:
                    await asyncio.wait_for(self.process.wait(), 10)
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()

    # ---- receiving ---------------------------------------------------------------------------

    def _receive(self, unit: bytes) -> None:
        """One v1 envelope or v0 line from the service: route what it carries."""
        if self.protocol == "v0":
            try:
                event = self._codec.decode_event(unit)
            except SmithFastError:
                if not self.answered:
                    raise self._not_smith() from None
                raise
            self.answered = True
            if event is not None:
                self._dispatch(event)
            return
        try:
            env = pb.Envelope.FromString(unit)
        except DecodeError:
            if not self.answered:
                raise self._not_smith() from None
            raise
        kind = env.WhichOneof("payload")
        if kind is None and not self.answered:
            raise self._not_smith()
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

    def _not_smith(self) -> NotASmithService:
        return NotASmithService(f"not a Smith service at {self.address or 'the spawned process'}: "
                                f"it answered with something other than the {self.protocol} protocol")

    def _dispatch(self, event: pb.Event) -> None:
        rid = event_request_id(event)
        if self._unread and rid in self._unread and event.WhichOneof("event_type") == "state_change":
            del self._unread[rid]  # the service read it
        queue = self._routes.get(rid) if rid else None
        if queue is not None:
            queue.put_nowait(event)
        else:
            self.events.put_nowait(event)

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    data = await self._reader.read(1 << 20)
                except (ConnectionError, OSError) as exc:
                    if await self._resumed():
                        continue
                    self._close_reason = self._resume_refusal or exc
                    break
                if not data:
                    if await self._resumed():
                        continue
                    self._close_reason = self._resume_refusal or EOFError("the service closed the connection")
                    break
                for unit in self._decoder.feed(data):
                    self._receive(unit)
        except (FramingError, SmithFastError, ConnectionError, OSError, DecodeError) as exc:
            self._close_reason = self._not_smith() if not self.answered and isinstance(exc, FramingError) else exc
        except asyncio.CancelledError:
            self._close_reason = ConnectionClosed("client closed")
        finally:
            self._connection_ended()

    # ---- resume (PROTOCOL.md, "Resume") --------------------------------------------------------

    def _note_unread(self, envelope: bytes) -> None:
        """Keep a request command until the service says it read it (its first state change), to
        send it again after a resume if the drop lost it."""
        command = pb.Envelope.FromString(envelope).command
        kind = command.WhichOneof("command_type")
        rid = getattr(getattr(command, kind), "request_id", "") if kind not in (None, "cancel", "stdin", "resize", "handshake") else ""
        if rid and rid in self._routes:
            self._unread[rid] = (command, self._writer)

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
            if sent_on is self._writer:
                continue  # sent after the resume handshake, on this connection: read in turn
            self._unread[rid] = (command, self._writer)
            env = pb.Envelope()
            env.command.CopyFrom(command)
            self._writer.write(encode_frame(self._seq.stamp(env).SerializeToString()))

    async def _resumed(self, patience: float = 30.0) -> bool:
        """The connection dropped: reconnect and resume the session, retrying for ``patience``
        seconds (the service's ``--resume-window`` is 30 s by default). False when this client does
        not resume, is closing, or the service refused (the session is gone)."""
        if not (self.resume and self.resume_token) or self._closing or self.address is None:
            return False
        kind, target = parse_address(self.address)
        deadline = time.monotonic() + patience
        delay = 0.01
        while not self._closing and time.monotonic() < deadline:
            try:
                if isinstance(target, str):
                    reader, writer = await asyncio.open_unix_connection(target, limit=1 << 20)
                else:
                    reader, writer = await asyncio.open_connection(*target, limit=1 << 20)
                answer, rest = await self._resume_on(reader, writer)
            except (ConnectionError, OSError, EOFError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if not answer.resumed and answer.service_info.get("reason") == "resume_not_ready":
                # a restarting gateway still taking its sessions over: ask again
                writer.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if not answer.resumed:  # refused: the session is gone
                self._resume_refusal = ConnectionClosed(
                    f"the connection dropped and the session could not be resumed: {answer.service_info.get('error', '')}")
                writer.close()
                return False
            self._reader, self._writer = reader, writer
            self.resumes += 1
            self._replay_left = int(answer.service_info.get("smith_fast.replayed", "0"))
            if self._replay_left == 0:
                self._resend()
            for unit in rest:
                self._receive(unit)
            return True
        return False

    async def _resume_on(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[pb.ReadyEvent, list[bytes]]:
        """Send the resume handshake on a new connection; the answer (a Ready, ``resumed`` false
        when refused, the error in ``service_info["error"]``) and the envelopes read behind it."""
        hs = pb.HandshakeCommand(version=1, resume_token=self.resume_token, resume_after=self.last_sequence)
        if self.token is not None:
            hs.client_info[TOKEN_KEY] = self.token
        env = pb.Envelope()
        env.command.handshake.CopyFrom(hs)
        writer.write(encode_frame(self._seq.stamp(env).SerializeToString()))
        self._decoder = FrameDecoder(self._decoder.max_frame_size)  # type: ignore[union-attr]  # v1: a FrameDecoder
        units: list[bytes] = []
        while not units:
            data = await reader.read(1 << 20)
            if not data:
                raise EOFError("closed during the resume")
            units = self._decoder.feed(data)
        first = pb.Envelope.FromString(units[0])
        if first.event.WhichOneof("event_type") == "ready" and first.event.ready.resumed:
            return first.event.ready, units[1:]
        refused = pb.ReadyEvent()
        refused.service_info["error"] = first.event.error.message or str(first)
        refused.service_info["reason"] = first.event.error.details.get("reason", "")
        return refused, []

    def _connection_ended(self) -> None:
        self._closed.set()
        for queue in list(self._routes.values()) + [self.events]:
            queue.put_nowait(None)
        while self._health:
            future = self._health.popleft()
            if not future.done():
                future.set_exception(ConnectionClosed(f"connection closed: {self._close_reason}"))


class GrpcClient(Client):
    """A :class:`Client` over the gRPC ``SmithService.Stream`` call (protocol v1).

    Create it with ``Client.connect("grpc:HOST:PORT")`` or :meth:`open`. Everything a
    :class:`Client` does works the same; :meth:`negotiate` adds the unary ``Negotiate`` call.
    """

    def __init__(self, channel: grpc_aio.Channel, *, token: str | None = None) -> None:
        self._init_state("v1", None)
        self.token = token
        self._channel = channel
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._status: grpc.StatusCode | None = None
        self._metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
        # No (de)serializers: envelopes travel as the bytes we build and parse ourselves.
        stream: grpc_aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM_METHOD)
        self._call = stream(self._requests(), metadata=self._metadata)
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, target: str, *, tls_ca: bytes | None = None, token: str | None = None) -> GrpcClient:
        """Open a channel to ``HOST:PORT`` and start a ``Stream`` call on it.

        Args:
            target: ``HOST:PORT``.
            tls_ca: PEM root certificate(s); given, the channel uses TLS.
            token: the service's shared secret: sent as ``authorization: Bearer`` metadata of
                every call and in the handshake.

        Returns:
            The client.
        """
        from grpc import aio, ssl_channel_credentials

        options = [("grpc.max_receive_message_length", -1)]
        if tls_ca is not None:
            channel = aio.secure_channel(target, ssl_channel_credentials(root_certificates=tls_ca), options=options)
        else:
            channel = aio.insecure_channel(target, options=options)
        return cls(channel, token=token)

    async def _requests(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._outbox.get()
            if item is None:
                return
            yield item

    def _send_bytes(self, envelope: bytes) -> None:
        self._outbox.put_nowait(envelope)

    async def negotiate(
        self,
        supported_versions: Iterable[int] = (1, 0),
        capabilities: Iterable[str | int] = (),
        client_metadata: Mapping[str, str] | None = None,
    ) -> pb.NegotiateResponse:
        """The unary ``Negotiate`` call.

        Raises:
            SmithError: the service refused (no version in common ...); ``code`` is the ErrorCode.
            grpc.aio.AioRpcError: the call failed otherwise.
        """
        import grpc

        request = pb.NegotiateRequest(
            supported_versions=list(supported_versions),
            capabilities=[_capability(c) for c in capabilities],
            client_metadata=dict(client_metadata or {}),
        )
        method = self._channel.unary_unary(
            NEGOTIATE_METHOD,
            request_serializer=pb.NegotiateRequest.SerializeToString,
            response_deserializer=pb.NegotiateResponse.FromString,
        )
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            code = dict(exc.trailing_metadata() or ()).get("smith-error-code")
            if code is None:
                raise
            raise SmithError(pb.ErrorEvent(error_code=code, message=exc.details() or "")) from exc

    async def close_sending(self) -> None:
        """Half-close: send nothing more; the service finishes the running requests, then ends the call."""
        self._outbox.put_nowait(None)

    async def shutdown(self) -> None:
        cmd = pb.Command()
        cmd.shutdown.SetInParent()
        self.send(cmd)
        await self._closed.wait()

    async def close(self) -> None:
        """Cancel the call (the service then stops this session's commands) and close the channel."""
        self._call.cancel()
        # End the request generator too: gRPC's task that drains it would otherwise be left
        # waiting on it and be destroyed pending when the loop closes.
        self._outbox.put_nowait(None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._closed.wait(), 5)
        self._reader_task.cancel()
        await self._channel.close()

    @property
    def status(self) -> grpc.StatusCode | None:
        """The call's final ``grpc.StatusCode`` once it ended (None before)."""
        return self._status

    async def _read_loop(self) -> None:
        import grpc

        received = False
        try:
            async for raw in self._call:
                received = True
                self._receive(raw)
            self._status = await self._call.code()
            self._close_reason = EOFError("the service ended the stream")
        except grpc.aio.AioRpcError as exc:
            self._status = exc.code()
            self._close_reason = exc
            code = dict(exc.trailing_metadata() or ()).get("smith-error-code")
            if code is not None and not received:
                # Refused before the stream began (a wrong token in the metadata, too many
                # connections): tell whoever waits as the ErrorEvent a socket peer would get.
                with contextlib.suppress(ValueError):
                    self._dispatch(pb.Event(error=pb.ErrorEvent(error_code=code, message=exc.details() or "")))
        except asyncio.CancelledError:
            self._status = grpc.StatusCode.CANCELLED
            self._close_reason = ConnectionClosed("client closed")
        except (SmithFastError, ValueError) as exc:
            self._close_reason = exc
        finally:
            self._connection_ended()
