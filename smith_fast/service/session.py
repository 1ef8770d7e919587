"""One client session: handshake, command dispatch, request lifecycle. Protocol-independent.

The connection decodes commands (v1 frames or v0 lines) into ``smith_pb2.Command`` objects and hands
them to :meth:`Session.handle`; everything the session says goes out through its
:class:`~smith_fast.service.sinks.EventSink`. Requests run as concurrent tasks, so the events of
different requests interleave, each carrying its request_id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .core import SUPPORTED_VERSIONS, ServiceCore, capability_name
from .shell import run_shell_exec
from .sinks import EventSink

if TYPE_CHECKING:
    from ..process import ShellProcess

__all__ = ["Session"]

log = get_logger("smith_fast.session")

# Commands that need a capability granted in the handshake.
_REQUIRES = {"shell_exec": pb.CAPABILITY_SHELL_EXEC}
_HOOK_CAPS = {"js": pb.CAPABILITY_HOOKS_JS, "rust": pb.CAPABILITY_HOOKS_RUST}


class Session:
    """The state of one connection (or one gRPC stream).

    Args:
        core: the shared service core.
        sink: where events go; its ``version`` is the wire protocol of the connection.
        close: called once the session is over and its output flushed (closes the transport).
        peer: a printable peer name for logs.
    """

    def __init__(self, core: ServiceCore, sink: EventSink, *, close: Callable[[], None], peer: str = "?") -> None:
        self.core = core
        self.sink = sink
        self.peer = peer
        self.version = sink.version
        self.granted: frozenset[int] = frozenset()
        self.handshaken = False
        self.paused = False
        self.shutting = False
        self.processes: set[ShellProcess] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._close = close
        self._closing = False
        core.sessions.add(self)

    # ---- input -------------------------------------------------------------------------------

    def handle(self, command: pb.Command) -> None:
        """Dispatch one decoded command. Never raises: problems become ErrorEvents."""
        kind = command.WhichOneof("command_type")
        if self._closing:
            return
        if kind == "handshake":
            self._handshake(command.handshake)
            return
        if kind is None:
            self.protocol_error(ProtocolError("empty Command: no command_type set", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"}))
            return
        request = getattr(command, kind)
        rid = getattr(request, "request_id", None)
        if not self.handshaken:
            self.reject(
                ProtocolError(
                    f"{kind} before handshake: send a HandshakeCommand first",
                    pb.ERROR_CODE_UNSPECIFIED,
                    rid,
                    {"reason": "handshake_required"},
                )
            )
            return
        if kind == "shutdown":
            asyncio.get_running_loop().create_task(self.shutdown())
            return
        needed = _REQUIRES.get(kind)
        if kind == "hook_load":
            needed = _HOOK_CAPS.get(request.hook_type, -1)
        if needed is not None and needed not in self.granted:
            name = capability_name(needed) if needed >= 0 else f"hooks for {request.hook_type!r}"
            self.reject(
                ProtocolError(f"{kind} needs capability {name}, which was not granted in the handshake", pb.ERROR_CODE_INVALID_CAPABILITY, rid)
            )
            return
        if kind == "shell_exec":
            self._start(rid, run_shell_exec(self, rid, request))
        elif kind == "tool_call":
            self._start(rid, self._tool_call(rid, request))
        else:
            self.reject(ProtocolError(f"{kind} is not supported by this service yet", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unsupported_command"}))

    async def run_ordered(self, commands: list[pb.Command]) -> None:
        """A ``BatchCommand`` with ``require_ordering``: each command starts after the previous one ended."""
        for command in commands:
            self.handle(command)
            kind = command.WhichOneof("command_type")
            rid = getattr(getattr(command, kind), "request_id", None) if kind else None
            task = self._tasks.get(rid) if rid else None
            if task is not None:
                await asyncio.wait([task])

    def protocol_error(self, exc: ProtocolError) -> None:
        """Report a problem with the peer's input; the session carries on."""
        log.info("protocol error", extra={"fields": {"peer": self.peer, "error": str(exc), "code": exc.code}})
        self.sink.error(exc.code, str(exc), exc.request_id, exc.details)

    def reject(self, exc: ProtocolError) -> None:
        """Refuse a request before it starts: its error, then its terminal ERROR state."""
        self.protocol_error(exc)
        if exc.request_id:
            self.sink.state_change(pb.SERVICE_STATE_ERROR, exc.request_id)

    # ---- handshake ----------------------------------------------------------------------------

    def _handshake(self, hs: pb.HandshakeCommand) -> None:
        if hs.version not in SUPPORTED_VERSIONS:
            self.protocol_error(
                ProtocolError(
                    f"protocol version {hs.version} is not supported; this service speaks versions 1 and 0",
                    pb.ERROR_CODE_UNSUPPORTED_VERSION,
                    details={"supported_versions": "1,0"},
                )
            )
            return
        if self.version == 1 and hs.version == 0:
            self.protocol_error(
                ProtocolError(
                    "version 0 was requested on a v1 (varint-delimited protobuf) connection; "
                    "v0 is spoken as JSON lines",
                    pb.ERROR_CODE_UNSUPPORTED_VERSION,
                    details={"supported_versions": "1"},
                )
            )
            return
        granted: list[int] = []
        for cap in hs.capabilities:
            if cap in self.core.capabilities:
                if cap not in granted:
                    granted.append(cap)
                continue
            available = ",".join(sorted(capability_name(c) for c in self.core.capabilities))
            reason = "unknown" if capability_name(cap).isdigit() or cap == 0 else "not available on this service"
            self.protocol_error(
                ProtocolError(
                    f"capability {capability_name(cap)} is {reason} (available: {available}); the others are granted",
                    pb.ERROR_CODE_INVALID_CAPABILITY,
                    details={"capability": capability_name(cap)},
                )
            )
        self.granted = frozenset(granted)
        self.handshaken = True
        self.sink.state_change(pb.SERVICE_STATE_STARTING)
        event = pb.Event()
        ready = event.ready
        ready.version = self.version
        ready.capabilities.extend(granted)
        ready.service_id = self.core.service_id
        ready.service_info.update(self.core.service_info(self.version, granted))
        self.sink.event(event)
        self.sink.state_change(pb.SERVICE_STATE_READY)
        log.info("handshake", extra={"fields": {"peer": self.peer, "version": self.version, "granted": [capability_name(c) for c in granted]}})

    # ---- requests -----------------------------------------------------------------------------

    def _start(self, rid: str, coro: Coroutine[Any, Any, None]) -> None:
        if not rid:
            coro.close()
            self.protocol_error(ProtocolError("request_id is empty", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "invalid_field"}))
            return
        if rid in self._tasks:
            coro.close()
            self.protocol_error(ProtocolError(f"request {rid} is already running", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_request"}))
            return
        if len(self._tasks) >= self.core.limits.max_requests:
            coro.close()
            self.reject(
                ProtocolError(f"too many requests in flight (max {self.core.limits.max_requests})", pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid)
            )
            return
        task = asyncio.get_running_loop().create_task(self._run(rid, coro))
        self._tasks[rid] = task
        task.add_done_callback(lambda _t, rid=rid: self._tasks.pop(rid, None))

    async def _run(self, rid: str, coro: Coroutine[Any, Any, None]) -> None:
        sink = self.sink
        sink.state_change(pb.SERVICE_STATE_PROCESSING, rid)
        try:
            await coro
        except ProtocolError as exc:
            exc.request_id = exc.request_id or rid
            self.protocol_error(exc)
            sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        except asyncio.CancelledError:
            if not self._closing:  # shutdown, not disconnect: somebody is listening
                sink.error(pb.ERROR_CODE_UNSPECIFIED, "request cancelled: the session is shutting down", rid, {"reason": "cancelled"})
                sink.state_change(pb.SERVICE_STATE_ERROR, rid)
            raise
        except Exception as exc:  # a bug of ours: report it, keep the session
            log.exception("request failed", extra={"fields": {"peer": self.peer, "request_id": rid}})
            sink.error(pb.ERROR_CODE_INTERNAL_ERROR, f"internal error: {type(exc).__name__}: {exc}", rid)
            sink.state_change(pb.SERVICE_STATE_ERROR, rid)
        else:
            sink.state_change(pb.SERVICE_STATE_READY, rid)

    async def _tool_call(self, rid: str, cmd: pb.ToolCallCommand) -> None:
        timeout_ms = cmd.timeout_ms if cmd.HasField("timeout_ms") else self.core.limits.default_timeout_ms
        outcome = await self.core.tools.call(
            cmd.tool, cmd.args, self.core.tool_context, timeout=timeout_ms / 1000 if timeout_ms else None
        )
        self.sink.tool_result(rid, outcome.success, outcome.result, outcome.error, outcome.duration_ms)

    # ---- flow control and teardown --------------------------------------------------------------

    def pause(self) -> None:
        """The peer is not reading: stop reading child pipes so memory stays bounded."""
        self.paused = True
        for proc in self.processes:
            proc.pause_reading()

    def resume(self) -> None:
        self.paused = False
        for proc in self.processes:
            proc.resume_reading()

    async def _cancel_requests(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def shutdown(self) -> None:
        """SHUTTING, cancel running requests (their final events are sent), flush, close."""
        if self._closing:
            return
        self.shutting = True
        self.sink.state_change(pb.SERVICE_STATE_SHUTTING)
        self.resume()
        # Stop children gracefully first so their last output and exit codes are still delivered;
        # then cancel whatever is left (tool calls).
        grace = self.core.limits.kill_grace
        await asyncio.gather(*(p.terminate(grace) for p in list(self.processes)), return_exceptions=True)
        await self._cancel_requests()
        self._closing = True
        self.core.sessions.discard(self)
        self._close()

    def connection_lost(self) -> None:
        """The peer went away: nobody to report to, so kill children at once."""
        self._closing = True
        self.core.sessions.discard(self)
        for proc in list(self.processes):
            proc.close()
        for task in self._tasks.values():
            task.cancel()
