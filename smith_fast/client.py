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

A service with workspaces (``serve --workspaces DIR``; PROTOCOL.md, "Workspaces") gives the session a
copy-on-write copy of a template: checkpoint it, fork from a checkpoint, diff, undo a request::

    client = await Client.connect("unix:/run/smith.sock", template="python")   # or fork=checkpoint_id
    await client.handshake(["shell_exec", "workspaces"], accept=["changes"])
    before = await client.checkpoint("clean")
    result = await client.run("make")                    # result.changes: what make changed
    for change in await client.diff(before):              # Change(path, kind, size, ...)
        print(change.letter, change.path)
    await client.restore(before)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from .addresses import ADDRESS_FORMS, format_address, parse_address, unreachable
from .client_link import Link, StreamLink, open_stream
from .client_wire import TOKEN_KEY, AnswerRoute, Route, Wire, event_request_id
from .client_workspace import (
    FORK_KEY,
    TEMPLATE_KEY,
    WORKSPACE_KEY,
    Change,
    UndoResult,
    changes_of,
    checkpoint_command,
    diff_command,
    restore_command,
    undo_command,
)
from .errors import AddressError, ConnectError, ConnectionClosed, NotASmithService, SmithError, SmithFastError
from .framing import FrameDecoder
from .grpc_link import GrpcLink, grpc_channel
from .jsonl import LineDecoder
from .pb import smith_pb2 as pb
from .remote_process import STDIN_WINDOW, Chunk, InputWait, RemoteProcess, RunResult, ToolOutput, cancel_command, terminal_state
from .request_ids import new_request_id

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
    "Change",
    "Chunk",
    "InputWait",
    "UndoResult",
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
        resume_via: other addresses of the same service (its other NATS gateways), tried in turn
            with ``address`` when the session is resumed.
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
        resume_via: Sequence[str] = (),
    ) -> None:
        decoder = FrameDecoder(max_frame_size) if protocol == "v1" else LineDecoder(max_frame_size)
        self._init(protocol, StreamLink(reader, writer, decoder), process=process, token=token, address=address,
                   resume=resume and protocol == "v1" and address is not None, resume_via=resume_via)

    def _init(self, protocol: str, link: Link, *, process: asyncio.subprocess.Process | None = None, token: str | None = None,
              address: str | None = None, resume: bool = False, resume_via: Sequence[str] = ()) -> None:
        if protocol not in ("v1", "v0"):
            raise ValueError(f"protocol must be 'v1' or 'v0', not {protocol!r}")
        self.protocol = protocol
        self.process = process
        self.token = token
        self.address = address
        self.resume = resume
        self.ready: pb.ReadyEvent | None = None
        self.accepted: frozenset[str] = frozenset()
        self.warnings: list[pb.ErrorEvent] = []
        self.notices: list[pb.LogEvent] = []  # said while a handshake waited for its answer (a gateway placing the session)
        self.diff_truncated = False  # the last diff() was cut at a limit (its list or its unified diffs)
        self.workspace_info: dict[str, str] = {}  # handshake client_info: smith_fast.template / smith_fast.fork (connect)
        self._wire = wire = Wire(link, protocol, address=address, token=token, resume=resume, resume_via=tuple(resume_via))
        self.events = wire.events  # None once the connection ended
        self.metrics = wire.metrics
        self.resource_usage = wire.resource_usage

    @property
    def answered(self) -> bool:
        """Something Smith-shaped has arrived."""
        return self._wire.answered

    @property
    def batches_received(self) -> int:
        """BatchEvent envelopes received (``accept=["batch_event"]``)."""
        return self._wire.batches_received

    @property
    def resume_token(self) -> str:
        """The session's resume token (``resume=True``), once the handshake is answered."""
        return self._wire.resume_token

    @property
    def last_sequence(self) -> int:
        """The sequence of the last envelope received (what a resume asks to go on after)."""
        return self._wire.last_sequence

    @property
    def resumes(self) -> int:
        """How many times the session was resumed over a new connection."""
        return self._wire.resumes

    @property
    def workspace(self) -> str | None:
        """The session's workspace id (``Ready.service_info["smith_fast.workspace"]``), once the
        handshake is answered by a service with workspaces; else None."""
        return self._service_info(WORKSPACE_KEY)

    @property
    def template(self) -> str | None:
        """The template the session's workspace is a copy of (``service_info["smith_fast.template"]``)."""
        return self._service_info(TEMPLATE_KEY)

    def _service_info(self, key: str) -> str | None:
        if self.ready is None:
            return None
        return self.ready.service_info.get(key) or None

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls, address: str, *, protocol: str = "v1", tls_ca: bytes | None = None, token: str | None = None, resume: bool = False,
        resume_via: Sequence[str] = (), template: str | None = None, fork: str | None = None,
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
            resume_via: more addresses of the same service, tried in turn with ``address`` when
                resuming: a scale-out's other gateways (any gateway leads a resume to the worker
                the session lives on).
            template: with a service that has workspaces (``serve --workspaces``), the template the
                session's workspace is a copy of (the handshake's ``client_info["smith_fast.template"]``;
                None: the service's default).
            fork: instead, a checkpoint id: the workspace starts as that checkpoint (``smith_fast.fork``).

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
            client: Client = GrpcClient(grpc_channel(target, tls_ca), token=token, address=name)
        else:
            try:
                reader, writer = await open_stream(target)
            except OSError as exc:
                raise unreachable(name, exc) from exc
            via = [format_address(*parse_address(a)) for a in resume_via]  # a bad one fails now, not at the drop
            client = cls(reader, writer, protocol=protocol, token=token, address=name, resume=resume, resume_via=via)
        if template is not None:
            client.workspace_info[TEMPLATE_KEY] = template
        if fork is not None:
            client.workspace_info[FORK_KEY] = fork
        return client

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

    # The SDK's own routing, used by tests that drive a request by hand.
    @property
    def _writer(self) -> asyncio.StreamWriter:
        """The stream this client writes to now (a resume replaces it); a stream client's only."""
        assert isinstance(self._wire.link, StreamLink)
        return self._wire.link.writer

    @property
    def _routes(self) -> dict[str, Route]:
        return self._wire.routes

    @property
    def _closed(self) -> asyncio.Event:
        return self._wire.closed

    def _route(self, rid: str) -> asyncio.Queue[pb.Event | None]:
        return self._wire.route(rid)

    async def _next(self, queue: asyncio.Queue[pb.Event | None]) -> pb.Event:
        return await self._wire.next(queue)

    # ---- sending -----------------------------------------------------------------------------

    def send(self, command: pb.Command) -> None:
        """Send one command as is (for commands the helpers below do not cover).

        Raises:
            ConnectionClosed: the connection is gone.
        """
        self._wire.send(command)

    def send_envelope(self, env: pb.Envelope) -> None:
        """Stamp (timestamp, sequence) and send one v1 envelope.

        Raises:
            ConnectionClosed: the connection is gone.
            ValueError: this is a v0 connection.
        """
        self._wire.send_envelope(env)

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
            accept: Envelope additions to ask for (v1): ``batch_event``, ``health``, ``metrics``, ``usage``,
                ``resume``, ``changes`` (what each request changed in the session's workspace:
                :attr:`RunResult.changes`). What the service granted is in :attr:`accepted` afterwards.
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
        hs.client_info.update(self.workspace_info)
        accept = list(accept)
        if self.resume and "resume" not in accept:
            accept.append("resume")
        if accept:
            hs.client_info[ACCEPT_KEY] = ",".join(accept)
        if metrics_interval_ms is not None:
            hs.client_info[INTERVAL_KEY] = str(metrics_interval_ms)
        if self.token is not None and self.protocol == "v0":
            self._wire.send_v0_handshake(cmd, self.token)
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
        reason = self._wire.close_reason
        if isinstance(reason, NotASmithService):
            return reason
        details = getattr(reason, "details", None)
        if callable(details):  # a gRPC call that failed: nothing (Smith) listens there
            return ConnectError(f"cannot connect to {self.address}: {reason.code().name}: {details()} "  # type: ignore[union-attr]  # details() callable: an AioRpcError, which has code()
                                "(is smith-fast serve --grpc running there?)")
        return NotASmithService(f"not a Smith service at {self.address}: it closed the connection without answering the handshake")

    async def _await_ready(self) -> pb.ReadyEvent:
        while True:
            event = await self._wire.next(self.events)
            kind = event.WhichOneof("event_type")
            if kind == "ready":
                self.ready = event.ready
                self._wire.ready(event.ready)
                granted = event.ready.service_info.get(ACCEPTED_KEY, "")
                self.accepted = frozenset(item for item in granted.split(",") if item)
                return event.ready
            if kind == "error":
                if event.error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY:
                    self.warnings.append(event.error)
                    continue
                raise SmithError(event.error)
            if kind == "log":
                self.notices.append(event.log)

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
        se.request_id = request_id or new_request_id()
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
        queue = self._wire.route(rid)
        try:
            self.send(cmd)
        except BaseException:
            self._wire.routes.pop(rid, None)
            raise

        def done() -> None:
            self._wire.routes.pop(rid, None)

        return self._process(rid, queue, done)

    def _process(self, rid: str, queue: asyncio.Queue[pb.Event | None], done: Callable[[], None], target: str | None = None) -> RemoteProcess:
        """The handle of request ``rid`` whose events arrive on ``queue`` (:meth:`start`, :meth:`attach`)."""
        return RemoteProcess(
            rid,
            send=self.send,
            events=queue,
            closed=self._wire.gone,
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
        rid = new_request_id()
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
        rid = new_request_id()
        queue = self._wire.route(rid)
        routed_target = process_id not in self._wire.routes
        if routed_target:  # refusals of stdin/resize name the process: they belong to this handle
            self._wire.routes[process_id] = queue
        attach = pb.AttachCommand(request_id=rid, process_id=process_id, from_offset=from_offset)
        attach.binary_output = binary and self.protocol == "v1"

        def done() -> None:
            self._wire.routes.pop(rid, None)
            if routed_target and self._wire.routes.get(process_id) is queue:
                del self._wire.routes[process_id]

        try:
            self.send(pb.Command(attach=attach))
        except BaseException:
            done()
            raise
        return self._process(rid, queue, done, process_id)

    async def _request(self, rid: str, cmd: pb.Command) -> AsyncIterator[pb.Event]:
        """Send ``cmd``, yield its events until its terminal state change; raise its ErrorEvent.

        Left before that (a ``break``, a cancelled task): the service is told to cancel it."""
        queue = self._wire.route(rid)
        error: pb.ErrorEvent | None = None
        ended = False
        try:
            self._wire.send(cmd, soon=True)  # it waits next: the loop runs, and writes it with the step's others
            while True:
                event = await self._wire.next(queue)
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
            self._left(rid, ended)
        if error is not None:
            raise SmithError(error)

    def _left(self, rid: str, ended: bool) -> None:
        """Request ``rid``'s caller is done with it: its route goes, and the service is told to
        cancel it if it has not ended (a ``break``, a cancelled task) while the connection lasts."""
        self._wire.routes.pop(rid, None)
        if not ended and not self._wire.closed.is_set():
            with contextlib.suppress(SmithFastError, ConnectionError, RuntimeError):
                self.send(cancel_command(rid))

    async def call_tool(
        self, tool: str, args: object = None, *, timeout_ms: int | None = None, raw_args: bytes | None = None
    ) -> pb.ToolResultEvent:
        """Call a tool with JSON-serializable ``args`` (or pre-encoded ``raw_args``); returns its result.

        A tool that ran and failed returns ``success=False`` with ``error`` set.

        Raises:
            SmithError: unknown tool, permission denied, timeout, ...
        """
        rid = new_request_id()
        cmd = pb.Command()
        tc = cmd.tool_call
        tc.request_id = rid
        tc.tool = tool
        tc.args = raw_args if raw_args is not None else json.dumps({} if args is None else args).encode()
        if timeout_ms is not None:
            tc.timeout_ms = timeout_ms
        result: pb.ToolResultEvent = await self._answer(rid, cmd, "tool_result", "ToolResult")
        return result

    async def _answer(self, rid: str, cmd: pb.Command, member: str, what: str) -> Any:
        """The last ``Event.<member>`` request ``rid`` got before its terminal state.

        As :meth:`_request`, without waking the caller for each event: its route keeps what it needs
        and wakes it once, at the end (a tool call's PROCESSING, result and READY were three wakes).

        Raises:
            SmithError: it ended with an error.
            ConnectionClosed: it ended without one (``what`` names it).
        """
        answer = AnswerRoute(member, self._wire.loop.create_future())
        self._wire.add_route(rid, answer)
        try:
            self._wire.send(cmd, soon=True)  # as in _request
            if not await answer.ended:
                raise self._wire.gone()
        finally:
            self._left(rid, answer.over)
        if answer.error is not None:
            raise SmithError(answer.error)
        if answer.answer is None:
            raise ConnectionClosed(f"the request ended without a {what}")
        return answer.answer

    # ---- workspaces (PROTOCOL.md, "Workspaces") --------------------------------------------------

    async def checkpoint(self, label: str = "") -> str:
        """Freeze the session's workspace as it is now; returns the checkpoint's id (to
        :meth:`restore`, :meth:`diff`, or fork a new session from: ``connect(fork=...)``).

        Raises:
            SmithError: no workspace (``no_workspace``), ``max_checkpoints``, ``workspace_busy`` ...
        """
        return (await self._workspace_request(checkpoint_command(label))).checkpoint_id

    async def restore(self, checkpoint_id: str) -> list[str]:
        """Put the session's workspace back as it was at ``checkpoint_id``. The session's running
        requests are cancelled first (each ends with reason ``restored``) and its background
        processes killed; returns their ids.

        Raises:
            SmithError: ``unknown_checkpoint``, ``no_workspace`` ...
        """
        return list((await self._workspace_request(restore_command(checkpoint_id))).cancelled)

    async def diff(self, from_id: str, to_id: str | None = None, *, max_diff_bytes: int = 0, paths: Sequence[str] = ()) -> list[Change]:
        """What differs from checkpoint ``from_id`` to checkpoint ``to_id`` (None: the workspace
        now), sorted by path; text files with their unified diff, up to ``max_diff_bytes`` in all
        (0: the service's default, which also caps it); only beneath ``paths`` when given.

        Raises:
            SmithError: ``unknown_checkpoint``, ``no_workspace`` ...
            ValueError: ``max_diff_bytes`` out of range.
        """
        answer = await self._workspace_request(diff_command(from_id, to_id, max_diff_bytes=max_diff_bytes, paths=paths))
        self.diff_truncated = answer.truncated
        return changes_of(answer.changes)

    async def undo(self, request_id: str, *, force: bool = False) -> UndoResult:
        """Put back what request ``request_id`` (a ShellExec or an ``fs.write`` of this session)
        changed. A path a later request changed too is left alone and listed in ``conflicts``,
        unless ``force``.

        Raises:
            SmithError: ``changes_not_recorded`` (the session did not accept ``changes``),
                ``undo_expired``, ``changes_shared``, ``unknown_request`` ...
        """
        answer = await self._workspace_request(undo_command(request_id, force=force))
        return UndoResult(changes_of(answer.changes), list(answer.conflicts))

    async def _workspace_request(self, cmd: pb.Command) -> pb.WorkspaceEvent:
        kind = cmd.WhichOneof("command_type")
        assert kind is not None
        rid: str = getattr(cmd, kind).request_id
        answer: pb.WorkspaceEvent = await self._answer(rid, cmd, "workspace", "WorkspaceEvent")
        return answer

    # ---- parking a session (PROTOCOL.md, "Resume") -----------------------------------------------

    async def park(self) -> str:
        """Close this connection but not the session: it waits, parked, for the service's
        ``--resume-window`` (its workspace, its checkpoints with it) until a connection resumes it
        with :meth:`resume_session`. Returns its resume token; :attr:`last_sequence` is what to
        resume after.

        Raises:
            ValueError: the session is not resumable (connect with ``resume=True``, v1 over Unix or TCP).
        """
        token = self.resume_token
        if not token:
            raise ValueError("this session cannot be parked: connect with resume=True (v1 over Unix or TCP) and handshake first")
        await self.close()  # no Shutdown: a dropped resumable session is parked, not ended
        return token

    async def resume_session(self, token: str, after: int = 0, *, timeout: float | None = None) -> pb.ReadyEvent:
        """Carry on a parked session (:meth:`park`) over this new connection, instead of a
        :meth:`handshake`: its ``Ready`` (``resumed``), then what it sent after sequence ``after``
        (the events of requests that are not this client's go to :attr:`events`).

        Raises:
            SmithError: refused: ``resume_unknown`` (a wrong token, or its window passed),
                ``resume_gap`` (what follows ``after`` is no longer kept), ``resume_invalid`` ...
            ValueError: this is a v0 connection.
        """
        if self.protocol != "v1":
            raise ValueError("resume is protocol v1 only")
        if self.address is not None and isinstance(self._wire.link, StreamLink):
            self.resume = self._wire.resume = True  # so that it can be parked again, and survive a drop
        self._wire.resume_token = token  # from now on the sequence of what arrives is counted
        cmd = pb.Command(handshake=pb.HandshakeCommand(version=1, resume_token=token, resume_after=after))
        if self.token is not None:
            cmd.handshake.client_info[TOKEN_KEY] = self.token
        self.send(cmd)
        try:
            return await asyncio.wait_for(self._await_ready(), timeout)
        except BaseException:
            self._wire.resume_token = ""
            raise

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
        return await self._wire.health_check(env)

    async def load_hook(self, hook_type: str, script: str) -> pb.HookResultEvent:
        """Load a ``"js"`` or ``"rust"`` hook into this session; returns the ALLOW naming its id and triggers.

        Raises:
            SmithError: the hook did not load (the message carries the engine's or compiler's
                diagnostics), or the capability was not granted.
        """
        rid = new_request_id()
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
        rid = request_id or new_request_id()
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
        await self._wire.shut()

    async def close(self) -> None:
        """Close the connection (and stop a spawned service)."""
        await self._wire.close()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                if self.process.returncode is None:
                    await asyncio.wait_for(self.process.wait(), 10)
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()

class GrpcClient(Client):
    """A :class:`Client` over the gRPC ``SmithService.Stream`` call (protocol v1).

    Create it with ``Client.connect("grpc:HOST:PORT")`` or :meth:`open`. Everything a
    :class:`Client` does works the same (its link is a :class:`~smith_fast.grpc_link.GrpcLink`);
    :meth:`negotiate` adds the unary ``Negotiate`` call.
    """

    def __init__(self, channel: grpc_aio.Channel, *, token: str | None = None, address: str | None = None) -> None:
        self._grpc = GrpcLink(channel, token)
        self._init("v1", self._grpc, token=token, address=address)

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
        return cls(grpc_channel(target, tls_ca), token=token)

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
        try:
            return await self._grpc.negotiate(request)
        except grpc.aio.AioRpcError as exc:
            code = dict(exc.trailing_metadata() or ()).get("smith-error-code")
            if code is None:
                raise
            raise SmithError(pb.ErrorEvent(error_code=code, message=exc.details() or "")) from exc

    async def close_sending(self) -> None:
        """Half-close: send nothing more; the service finishes the running requests, then ends the call."""
        self._grpc.close_sending()

    @property
    def status(self) -> grpc.StatusCode | None:
        """The call's final ``grpc.StatusCode`` once it ended (None before)."""
        return self._grpc.status
