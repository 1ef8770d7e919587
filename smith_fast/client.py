"""Asyncio client SDK: talk to ``smith-fast serve`` (or any Smith service) over stdio, Unix or TCP.

Example::

    async with await Client.connect("unix:/tmp/smith.sock") as client:
        await client.handshake()
        async for event in client.shell_exec("ls -l"):
            print(event.shell_output.stdout or "", end="")
        result = await client.call_tool("fs.list", {"path": "."})

Events of concurrent requests are routed to their callers by ``request_id``; events without one
(Ready, capability warnings, logs) go to :attr:`Client.events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from .errors import FramingError, SmithFastError
from .framing import FrameDecoder, encode_frame
from .jsonl import JsonlCodec, LineDecoder
from .pb import smith_pb2 as pb
from .sequencing import Sequencer

__all__ = ["Client", "SmithError", "ConnectionClosed", "event_request_id", "parse_address"]

_CAPS = {name.removeprefix("CAPABILITY_").lower(): value for name, value in pb.Capability.items() if value}


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


def event_request_id(event: pb.Event) -> str | None:
    """The request an event belongs to, or None (Ready, service-wide state changes, ...)."""
    kind = event.WhichOneof("event_type")
    if kind is None or kind == "ready":
        return None
    inner = getattr(event, kind)
    if inner.DESCRIPTOR.fields_by_name["request_id"].has_presence and not inner.HasField("request_id"):
        return None
    return inner.request_id or None


def parse_address(address: str) -> tuple[str, Any]:
    """``unix:PATH``, ``tcp:HOST:PORT``, ``HOST:PORT`` or a path → (kind, target)."""
    if address.startswith("unix:"):
        return "unix", address[5:]
    if address.startswith("tcp:"):
        address = address[4:]
    elif "/" in address or not address.rpartition(":")[2].isdigit():
        return "unix", address
    host, _, port = address.rpartition(":")
    return "tcp", (host.strip("[]") or "127.0.0.1", int(port))


class Client:
    """A connection to a Smith service.

    Create it with :meth:`connect` or :meth:`spawn`, then call :meth:`handshake` first.

    Args:
        reader, writer: an asyncio stream pair connected to the service.
        protocol: ``"v1"`` (varint-delimited protobuf) or ``"v0"`` (JSON lines).
        process: the spawned service process, if :meth:`spawn` made one.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        protocol: str = "v1",
        process: asyncio.subprocess.Process | None = None,
        max_frame_size: int = 64 * 1024 * 1024,
    ) -> None:
        if protocol not in ("v1", "v0"):
            raise ValueError(f"protocol must be 'v1' or 'v0', not {protocol!r}")
        self.protocol = protocol
        self.process = process
        self.ready: pb.ReadyEvent | None = None
        self.events: asyncio.Queue[pb.Event] = asyncio.Queue()
        self.warnings: list[pb.ErrorEvent] = []
        self._reader = reader
        self._writer = writer
        self._routes: dict[str, asyncio.Queue[pb.Event | None]] = {}
        self._closed = asyncio.Event()
        self._close_reason: BaseException | None = None
        self._seq = Sequencer()
        self._codec = JsonlCodec()
        self._decoder: Any = FrameDecoder(max_frame_size) if protocol == "v1" else LineDecoder(max_frame_size)
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    async def connect(cls, address: str, *, protocol: str = "v1") -> Client:
        """Connect to ``unix:PATH``, ``tcp:HOST:PORT`` or ``HOST:PORT``."""
        kind, target = parse_address(address)
        limit = 1 << 20
        if kind == "unix":
            reader, writer = await asyncio.open_unix_connection(target, limit=limit)
        else:
            reader, writer = await asyncio.open_connection(*target, limit=limit)
        return cls(reader, writer, protocol=protocol)

    @classmethod
    async def spawn(
        cls, *serve_args: str, protocol: str = "v1", python: str = sys.executable, env: Mapping[str, str] | None = None
    ) -> Client:
        """Start ``smith-fast serve --stdio`` as a child process and talk to it over its stdin/stdout."""
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
        return cls(proc.stdout, proc.stdin, protocol=protocol, process=proc)  # type: ignore[arg-type]

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- sending -----------------------------------------------------------------------------

    def send(self, command: pb.Command) -> None:
        """Send one command as is (for commands the helpers below do not cover)."""
        if self._closed.is_set():
            raise ConnectionClosed(f"connection closed: {self._close_reason}")
        if self.protocol == "v1":
            env = pb.Envelope()
            env.command.CopyFrom(command)
            self._writer.write(encode_frame(self._seq.stamp(env).SerializeToString()))
        else:
            self._writer.write(self._codec.encode_command(command))

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
    ) -> pb.ReadyEvent:
        """Negotiate; returns the ReadyEvent. Capability warnings land in :attr:`warnings`.

        Raises:
            SmithError: the service refused the version.
        """
        cmd = pb.Command()
        hs = cmd.handshake
        hs.version = (1 if self.protocol == "v1" else 0) if version is None else version
        hs.capabilities.extend(_CAPS[c] if isinstance(c, str) else c for c in capabilities)
        hs.client_info.update(client_info or {"client": "smith-fast-sdk"})
        self.send(cmd)
        while True:
            event = await self._next(self.events)  # type: ignore[arg-type]
            kind = event.WhichOneof("event_type")
            if kind == "ready":
                self.ready = event.ready
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
        rid = request_id or str(uuid.uuid4())
        cmd = pb.Command()
        se = cmd.shell_exec
        se.request_id = rid
        se.command = command
        if shell is not None:
            se.shell = shell
        if cwd is not None:
            se.cwd = cwd
        se.env.update(env or {})
        if timeout_ms is not None:
            se.timeout_ms = timeout_ms
        async for event in self._request(rid, cmd):
            yield event

    async def _request(self, rid: str, cmd: pb.Command) -> AsyncIterator[pb.Event]:
        """Send ``cmd``, yield its events until its terminal state change; raise its ErrorEvent."""
        queue = self._route(rid)
        error: pb.ErrorEvent | None = None
        try:
            self.send(cmd)
            while True:
                event = await self._next(queue)
                kind = event.WhichOneof("event_type")
                if kind == "error":
                    error = event.error
                    continue
                if kind == "state_change" and event.state_change.state in (
                    pb.SERVICE_STATE_READY,
                    pb.SERVICE_STATE_ERROR,
                ):
                    yield event
                    break
                yield event
        finally:
            self._routes.pop(rid, None)
        if error is not None:
            raise SmithError(error)

    async def call_tool(
        self, tool: str, args: Any = None, *, timeout_ms: int | None = None, raw_args: bytes | None = None
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
        await self._writer.drain()
        await self._closed.wait()

    async def close(self) -> None:
        """Close the connection (and stop a spawned service)."""
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

    def _decode(self, unit: bytes) -> pb.Event | None:
        if self.protocol == "v0":
            return self._codec.decode_event(unit)
        env = pb.Envelope.FromString(unit)
        return env.event if env.WhichOneof("payload") == "event" else None

    def _dispatch(self, event: pb.Event) -> None:
        rid = event_request_id(event)
        queue = self._routes.get(rid) if rid else None
        if queue is not None:
            queue.put_nowait(event)
        else:
            self.events.put_nowait(event)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(1 << 20)
                if not data:
                    self._close_reason = EOFError("the service closed the connection")
                    break
                for unit in self._decoder.feed(data):
                    event = self._decode(unit)
                    if event is not None:
                        self._dispatch(event)
        except (FramingError, SmithFastError, ConnectionError, OSError) as exc:
            self._close_reason = exc
        except asyncio.CancelledError:
            self._close_reason = ConnectionClosed("client closed")
        finally:
            self._closed.set()
            for queue in list(self._routes.values()) + [self.events]:
                queue.put_nowait(None)  # type: ignore[arg-type]
