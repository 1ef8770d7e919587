"""Drivers for the end-to-end service benchmarks (``bench/bench_service.py``).

The socket drivers live in :mod:`bench.report` (``wire`` and ``drivers``), shared with the
end-to-end report (``python -m bench.report``); this module re-exports them under the names the
suite uses and adds the echo server that is the round trips' floor.

Everything talks to a real ``smith-fast serve`` process over its Unix socket with a plain blocking
socket: no asyncio in the client, so the client's own overhead is small and, above all, identical
for both protocols. The two protocols differ only in the wire: v1 (``framing`` + ``Envelope``) or
v0 (``LineDecoder`` + a JSON parser per line, orjson when installed); the drivers (same pipelining,
same 1 MiB reads, same per-request bookkeeping) never look at which wire they drive.
"""

from __future__ import annotations

import socket
import subprocess
import sys

from .report.drivers import (
    READ_SIZE,
    PipelineResult,
    ProtocolFailure,
    Session,
    ShellResult,
    cpu_seconds_of,
    pipelined_tool_calls,
    round_trip,
    shell_exec,
    tool_call_request_ids,
)
from .report.stats import percentile
from .report.wire import WIRES, V0Wire, V1Wire, Wire

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
