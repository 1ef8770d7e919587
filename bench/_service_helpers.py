"""Drivers for the end-to-end service benchmarks (``bench/bench_service.py``).

Everything here talks to a real ``smith-fast serve`` process over its Unix socket with a plain
blocking socket: no asyncio in the client, so the client's own overhead is small and, above all,
identical for both protocols. The two protocols differ only in :class:`Wire`:

* :class:`V1Wire` encodes commands as varint-delimited ``Envelope`` frames
  (``smith_fast.framing.encode_frame``) and decodes events with ``FrameDecoder`` +
  ``Envelope.FromString``;
* :class:`V0Wire` encodes commands with ``JsonlCodec.encode_command`` and decodes events with
  ``LineDecoder`` + ``JsonlCodec.decode_event`` (orjson backend).

Both hand the drivers the same ``smith_pb2.Event`` objects, and the drivers (same pipelining, same
1 MiB reads, same per-request bookkeeping) never look at which wire they drive.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.jsonl import JsonlCodec, LineDecoder
from smith_fast.pb import smith_pb2 as pb

__all__ = [
    "READ_SIZE",
    "WIRES",
    "EchoServer",
    "PipelineResult",
    "ProtocolFailure",
    "Session",
    "ShellResult",
    "V0Wire",
    "V1Wire",
    "Wire",
    "cpu_seconds_of",
    "percentile",
    "pipelined_tool_calls",
    "round_trip",
    "shell_exec",
    "tool_call_request_ids",
]

READ_SIZE = 1 << 20
_MAX_UNIT = 1 << 26
_READY = pb.SERVICE_STATE_READY
_ERROR = pb.SERVICE_STATE_ERROR
_PROCESSING = pb.SERVICE_STATE_PROCESSING
_CLK_TCK = os.sysconf("SC_CLK_TCK")


class Wire:
    """How one protocol turns commands into bytes and bytes into events.

    Subclasses implement :meth:`encode` (a ``Command`` to wire bytes) and :meth:`decode` (received
    bytes, in any pieces, to the ``Event`` messages they complete); the command builders are shared.
    """

    name = "?"
    version = -1

    def encode(self, command: pb.Command) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> list[pb.Event]:
        raise NotImplementedError

    def handshake(self, capabilities: Iterable[int] = (pb.CAPABILITY_SHELL_EXEC,)) -> bytes:
        """A HandshakeCommand for this wire's protocol version."""
        cmd = pb.Command()
        cmd.handshake.version = self.version
        cmd.handshake.capabilities.extend(capabilities)
        return self.encode(cmd)

    def tool_call(self, request_id: str, tool: str, args: bytes) -> bytes:
        """A ToolCallCommand; ``args`` is UTF-8 JSON."""
        cmd = pb.Command()
        tc = cmd.tool_call
        tc.request_id = request_id
        tc.tool = tool
        tc.args = args
        return self.encode(cmd)

    def shell_exec(self, request_id: str, command: str) -> bytes:
        """A ShellExecCommand with the default shell, cwd and environment."""
        cmd = pb.Command()
        cmd.shell_exec.request_id = request_id
        cmd.shell_exec.command = command
        return self.encode(cmd)


class V1Wire(Wire):
    """Varint-delimited protobuf ``Envelope`` frames."""

    name = "v1"
    version = 1

    def __init__(self) -> None:
        self._frames = FrameDecoder(_MAX_UNIT)
        self._parse = pb.Envelope.FromString

    def encode(self, command: pb.Command) -> bytes:
        env = pb.Envelope()
        env.command.CopyFrom(command)
        return encode_frame(env.SerializeToString())

    def decode(self, data: bytes) -> list[pb.Event]:
        parse = self._parse
        return [parse(frame).event for frame in self._frames.feed(data)]


class V0Wire(Wire):
    """JSON lines, decoded into the same ``Event`` messages by the project's v0 codec."""

    name = "v0"
    version = 0

    def __init__(self, backend: str = "orjson") -> None:
        self.codec = JsonlCodec(backend)
        self._lines = LineDecoder(_MAX_UNIT)
        self._parse = self.codec.decode_event

    def encode(self, command: pb.Command) -> bytes:
        return self.codec.encode_command(command)

    def decode(self, data: bytes) -> list[pb.Event]:
        parse = self._parse
        return [parse(line) for line in self._lines.feed(data)]


WIRES: dict[str, type[Wire]] = {"v1": V1Wire, "v0": V0Wire}


class ProtocolFailure(AssertionError):
    """The service answered something a benchmark did not expect (an error, a failed tool ...)."""


class Session:
    """One connection to the service, handshaken, with its wire.

    Args:
        path: the service's Unix socket.
        wire: ``"v1"`` or ``"v0"``.
    """

    def __init__(self, path: str, wire: str) -> None:
        self.wire = WIRES[wire]()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.sendall(self.wire.handshake())
        while True:  # StateChange(STARTING), Ready, StateChange(READY)
            events = self.recv()
            if any(e.WhichOneof("event_type") == "error" for e in events):
                raise ProtocolFailure(f"handshake refused: {events}")
            if any(e.WhichOneof("event_type") == "state_change" and e.state_change.state == _READY for e in events):
                break

    def recv(self) -> list[pb.Event]:
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("the service closed the connection")
        return self.wire.decode(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tool_call_request_ids(n: int) -> list[str]:
    """``n`` UUID request ids (v0 peers accept nothing else; v1 gets the same ones)."""
    return [str(uuid.uuid4()) for _ in range(n)]


def _check_event(event: pb.Event, kind: str | None) -> None:
    if kind == "error":
        raise ProtocolFailure(f"ErrorEvent: {event.error.message}")
    if kind == "tool_result" and not event.tool_result.success:
        raise ProtocolFailure(f"tool failed: {event.tool_result.error}")


@dataclass
class PipelineResult:
    """What :func:`pipelined_tool_calls` saw: every request's three events."""

    requests: int
    results: int
    result_bytes: int


def pipelined_tool_calls(session: Session, requests: list[bytes], rids: list[str], window: int) -> PipelineResult:
    """Send ``requests`` keeping ``window`` in flight; return when every one has ended.

    A request counts as done at its terminal ``StateChange(READY)``; the driver checks that each
    one also brought its ``StateChange(PROCESSING)`` and a successful ``ToolResult`` first. New
    requests are sent as soon as earlier ones end, all those freed by one read in one ``send``.

    Raises:
        ProtocolFailure: an ErrorEvent, a failed tool, an event for an unknown request, or a
            request that ended without its result.
    """
    n = len(requests)
    sock = session.sock
    decode = session.wire.decode
    index = {rid: i for i, rid in enumerate(rids)}
    # per request: 0 sent, 1 PROCESSING seen, 2 result seen
    progress = [0] * n
    sent = min(window, n)
    sock.sendall(b"".join(requests[:sent]))
    done = results = result_bytes = 0
    while done < n:
        data = sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("the service closed the connection")
        freed = 0
        for event in decode(data):
            kind = event.WhichOneof("event_type")
            if kind == "state_change":
                sc = event.state_change
                i = index[sc.request_id]
                if sc.state == _PROCESSING and progress[i] == 0:
                    progress[i] = 1
                elif sc.state == _READY and progress[i] == 2:
                    progress[i] = 0
                    done += 1
                    freed += 1
                else:
                    raise ProtocolFailure(f"unexpected {event} for request {i} at stage {progress[i]}")
            elif kind == "tool_result":
                _check_event(event, kind)
                i = index[event.tool_result.request_id]
                if progress[i] != 1:
                    raise ProtocolFailure(f"ToolResult for request {i} at stage {progress[i]}")
                progress[i] = 2
                results += 1
                result_bytes += len(event.tool_result.result)
            else:
                _check_event(event, kind)
                raise ProtocolFailure(f"unexpected event {event}")
        if freed and sent < n:
            k = min(freed, n - sent)
            sock.sendall(b"".join(requests[sent : sent + k]))
            sent += k
    return PipelineResult(n, results, result_bytes)


def round_trip(session: Session, request: bytes, rid: str) -> None:
    """One tool call, sequential: send it, read until its terminal state change."""
    sock = session.sock
    decode = session.wire.decode
    sock.sendall(request)
    got_result = False
    while True:
        data = sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("the service closed the connection")
        for event in decode(data):
            kind = event.WhichOneof("event_type")
            if kind == "tool_result":
                _check_event(event, kind)
                got_result = True
            elif kind == "state_change":
                if event.state_change.state == _READY and event.state_change.request_id == rid:
                    if not got_result:
                        raise ProtocolFailure("request ended without a ToolResult")
                    return
            else:
                _check_event(event, kind)


@dataclass
class ShellResult:
    """What :func:`shell_exec` saw."""

    stdout_bytes: int
    events: int
    exit_code: int
    seconds: float


def shell_exec(session: Session, request: bytes, rid: str) -> ShellResult:
    """Run one command; count its stdout (UTF-8 bytes) until its terminal ``StateChange``.

    ``seconds`` runs from just before the command is sent to the read that brought the terminal
    event: the time to the final event.

    Raises:
        ProtocolFailure: an ErrorEvent, or a non-zero exit code.
    """
    sock = session.sock
    decode = session.wire.decode
    start = time.perf_counter()
    sock.sendall(request)
    total = count = 0
    exit_code: int | None = None
    while True:
        data = sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("the service closed the connection")
        for event in decode(data):
            count += 1
            kind = event.WhichOneof("event_type")
            if kind == "shell_output":
                so = event.shell_output
                if so.HasField("stdout"):
                    # the text is decoded here (protobuf / JSON), so it is delivered; len() of its
                    # UTF-8 bytes equals what the command wrote for ASCII output
                    total += len(so.stdout)
                if so.finished:
                    exit_code = so.exit_code
            elif kind == "state_change":
                if event.state_change.request_id == rid and event.state_change.state in (_READY, _ERROR):
                    seconds = time.perf_counter() - start
                    if event.state_change.state != _READY or exit_code != 0:
                        raise ProtocolFailure(f"command failed: exit code {exit_code}")
                    return ShellResult(total, count, exit_code, seconds)
            else:
                _check_event(event, kind)


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (10 ms resolution)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


# --- the floor for round trips: a bare echo-style server ---------------------------------------

_ECHO_SERVER = r'''
import asyncio, os, sys
path, loop_name, request_size, reply_size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
REPLY = b"x" * reply_size

class Reply(asyncio.Protocol):
    # For every request_size bytes received, write reply_size bytes: a ping-pong with the same
    # message sizes as the tool call it is the floor of.
    def connection_made(self, transport):
        self.transport = transport
        self.pending = 0
    def data_received(self, data):
        self.pending += len(data)
        while self.pending >= request_size:
            self.pending -= request_size
            self.transport.write(REPLY)

async def main():
    await asyncio.get_running_loop().create_unix_server(Reply, path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.Event().wait()

if loop_name == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
'''


class EchoServer:
    """A bare asyncio/uvloop server in a subprocess answering ``request_size`` bytes with ``reply_size``.

    Args:
        path: the Unix socket path to listen on.
        loop: ``uvloop`` or ``asyncio``.
        request_size: bytes per request.
        reply_size: bytes per reply.
    """

    def __init__(self, path: str, loop: str, request_size: int, reply_size: int) -> None:
        self.path = path
        self.request_size = request_size
        self.reply_size = reply_size
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ECHO_SERVER, path, loop, str(request_size), str(reply_size)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != b"ready\n":
            self.stop()
            raise RuntimeError("the echo server did not start")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.request = b"r" * request_size

    def round_trip(self) -> None:
        """One request, then read until the whole reply is in."""
        sock = self.sock
        sock.sendall(self.request)
        need = self.reply_size
        while need:
            data = sock.recv(READ_SIZE)
            if not data:
                raise ProtocolFailure("the echo server closed the connection")
            need -= len(data)

    def stop(self) -> None:
        if hasattr(self, "sock"):
            self.sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
