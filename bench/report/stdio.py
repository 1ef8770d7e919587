"""Stdio contenders: a server spawned as a child and spoken to with newline-delimited JSON-RPC on
its pipes (as MCP clients spawn servers), and the in-process "no server" reference for commands.

:class:`StdioPeer` is the minimal JSON-RPC client (orjson, blocking pipes), the same for every
stdio contender, so its cost is the same for all of them and small. :class:`StdioServer` gives the
runner the same launch/wait/stop/pid face as ``harness.server.ServerProcess``. :class:`McpClient`
translates the workloads' Smith commands into ``tools/call`` requests (``fs.read`` to the server's
read tool, ``ShellExec`` to its ``shell`` tool) and the answers into the views the
:class:`~bench.report.drivers.Tracker` checks, so an MCP server is held to the same checks as the
socket contenders. :class:`SpawnClient` runs each command itself with ``posix_spawn`` and two
pipes: what starting a command and reading its output costs with no server at all.
"""

from __future__ import annotations

import os
import pathlib
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import orjson

from smith_fast.pb import smith_pb2 as pb

from .drivers import ProtocolFailure, Tracker
from .wire import OUTPUT, RESULT, STATE, View

__all__ = ["McpClient", "NoServer", "SpawnClient", "StdioPeer", "StdioServer"]

PROTOCOL_VERSION = "2025-11-25"
_PROCESSING, _READY = pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY


class StdioPeer:
    """A spawned stdio server and a JSON-RPC client on its pipes.

    Args:
        argv: the server's command line.
        cwd: its working directory.
        handshake: send MCP ``initialize`` + ``notifications/initialized`` first.
        env: extra environment for the server.
    """

    def __init__(self, argv: Sequence[str], cwd: pathlib.Path, handshake: bool = True,
                 env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=cwd, env={**os.environ, **(env or {})})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in: IO[bytes] = self.proc.stdin
        self._out: IO[bytes] = self.proc.stdout
        self._id = 0
        self.server_info: dict[str, Any] = {}
        if handshake:
            self.server_info = dict(self.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                "clientInfo": {"name": "smith-fast-bench", "version": "0"}}).get("serverInfo", {}))
            self.send([orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + b"\n"])

    def send(self, lines: Sequence[bytes]) -> None:
        self._in.write(b"".join(lines))
        self._in.flush()

    def answer(self) -> dict[str, Any]:
        """The next message that carries an ``id`` (notifications are skipped)."""
        while True:
            line = self._out.readline()
            if not line:
                raise ProtocolFailure(f"the server (pid {self.proc.pid}) closed its stdout")
            message = orjson.loads(line)
            if "id" in message:
                return dict(message)

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request, its result (a JSON-RPC error raises :class:`ProtocolFailure`)."""
        self._id += 1
        self.send([orjson.dumps({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params}) + b"\n"])
        while True:
            answer = self.answer()
            if answer["id"] == self._id:
                if "result" not in answer:
                    raise ProtocolFailure(f"{method}: {answer}")
                return dict(answer["result"])

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """One ``tools/call``; its result (``isError`` raises :class:`ProtocolFailure`)."""
        result = self.request("tools/call", {"name": tool, "arguments": args})
        if result.get("isError") is not False:
            raise ProtocolFailure(f"{tool}: {str(result)[:300]}")
        return result

    def call_line(self, tool: str, args: dict[str, Any], rid: Any = None) -> bytes:
        """A ``tools/call`` request line (id ``rid``, or the next number)."""
        if rid is None:
            self._id += 1
            rid = self._id
        return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                             "params": {"name": tool, "arguments": args}}) + b"\n"

    def pipelined(self, lines: Sequence[bytes], window: int) -> list[dict[str, Any]]:
        """Send ``lines`` keeping ``window`` in flight (the freed ones in one write); every answer."""
        n, sent = len(lines), min(window, len(lines))
        answers: list[dict[str, Any]] = []
        self.send(lines[:sent])
        while len(answers) < n:
            answers.append(self.answer())
            if sent < n:
                self.send(lines[sent : sent + 1])
                sent += 1
        return answers

    def close(self) -> None:
        try:
            self._in.close()
        except OSError:  # a dead server's pipe
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class StdioServer:
    """A stdio contender's server for the runner: spawned by :meth:`launch`, ready when its peer is.

    Once a client is dropped (:meth:`release`: after a failure the stream may hold a half-read
    answer) the next :meth:`connect` gets a fresh process.
    """

    def __init__(self, argv: Sequence[str], cwd: pathlib.Path, handshake: bool) -> None:
        self.argv, self.cwd, self.handshake = list(argv), cwd, handshake
        self.peer: StdioPeer | None = None
        self.released = False

    def connect(self) -> StdioPeer:
        """The peer on the server's pipes (a fresh server when the last client was released)."""
        if self.peer is None or self.released:
            self.restart()
            self.released = False
        assert self.peer is not None
        return self.peer

    def release(self) -> None:
        self.released = True

    def launch(self) -> None:
        self.peer = StdioPeer(self.argv, self.cwd, self.handshake, {"SMITH_FAST_NO_EXTENSIONS": ""})

    def wait_ready(self, timeout: float) -> None:
        if self.peer is None:
            self.launch()

    @property
    def pid(self) -> int:
        assert self.peer is not None
        return self.peer.proc.pid

    def restart(self) -> None:
        self.stop()
        self.launch()

    def stop(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None


class NoServer:
    """The runner's view of the in-process reference: the "server" is this process."""

    pid = os.getpid()

    def launch(self) -> None:
        pass

    def wait_ready(self, timeout: float) -> None:
        pass

    def stop(self) -> None:
        pass


def _args_of(command: pb.Command) -> tuple[str, str, dict[str, Any]]:
    """(request id, ``tool``/``shell``, arguments) of a workload's command."""
    if command.WhichOneof("command_type") == "tool_call":
        call = command.tool_call
        return call.request_id, call.tool, dict(orjson.loads(call.args or b"{}"))
    shell = command.shell_exec
    return shell.request_id, "shell", {"command": shell.command}


class McpClient:
    """Drives a stdio JSON-RPC server with the workloads' commands (a :class:`contenders.Client`).

    Args:
        server: the contender's server.
        tools: Smith tool name -> this server's tool name (``fs.read`` -> ``read_file``).
    """

    def __init__(self, server: StdioServer, tools: Mapping[str, str]) -> None:
        self.server, self.peer, self.tools = server, server.connect(), dict(tools)

    def encode(self, commands: Sequence[pb.Command]) -> list[tuple[str, bool, bytes]]:
        out = []
        for command in commands:
            rid, tool, args = _args_of(command)
            out.append((rid, tool == "shell", self.peer.call_line(self.tools.get(tool, tool), args, rid)))
        return out

    def pipeline(self, units: Sequence[tuple[str, bool, bytes]], tracker: Tracker, window: int) -> float:
        shells = {rid for rid, shell, _ in units if shell}
        lines = [line for _, _, line in units]
        start = time.perf_counter()
        answers = self.peer.pipelined(lines, window)
        seconds = time.perf_counter() - start
        for answer in answers:
            tracker.feed(_views(answer, str(answer.get("id")) in shells))
            tracker.events -= 2  # one message per answer, not the three views it stands for
        if tracker.left:
            raise ProtocolFailure(f"{tracker.left} requests unanswered")
        return seconds

    def round_trips(self, unit: tuple[str, bool, bytes], rid: str, count: int) -> list[float]:
        line, times = unit[2], []
        for _ in range(count):
            start = time.perf_counter()
            self.peer.send([line])
            answer = self.peer.answer()
            times.append(time.perf_counter() - start)
            Tracker([rid]).feed(_views(answer, False))
        return times

    def pipeline_many(self, units: Sequence[Sequence[Any]], trackers: Sequence[Tracker], window: int) -> float:
        raise NotImplementedError("stdio servers have one session")

    def close(self) -> None:
        self.server.release()


def _views(answer: dict[str, Any], shell: bool) -> list[View]:
    """The Smith views an MCP answer stands for: PROCESSING, the result, READY."""
    rid = str(answer.get("id"))
    result = answer.get("result")
    if not isinstance(result, dict):
        raise ProtocolFailure(f"request {rid!r}: {str(answer)[:300]}")
    if result.get("isError") is not False:
        raise ProtocolFailure(f"tool failed for {rid!r}: {str(result)[:300]}")
    views: list[View] = [(STATE, rid, _PROCESSING, None)]
    if shell:
        structured = result.get("structuredContent") or {}
        chars = len(structured.get("stdout", "")) + len(structured.get("stderr", ""))
        views.append((OUTPUT, rid, chars, structured.get("exit_code")))
    else:
        views.append((RESULT, rid, True, None))
    return [*views, (STATE, rid, _READY, None)]


def spawn_sh(command: str, on_output: Callable[[int], None]) -> int:
    """The no-server reference's whole job: ``/bin/sh -c command`` by ``posix_spawn`` with its
    stdout and stderr on pipes, read until both close (``on_output(size)`` for each read), reaped;
    returns the wait status."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2),
               (os.POSIX_SPAWN_CLOSE, out_r), (os.POSIX_SPAWN_CLOSE, err_r)]
    # SIGPIPE back to its default, as a server's child gets it (Python ignores it, and children
    # inherit that: `yes | head` would then end with a "Broken pipe" message instead of quietly)
    pid = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", command], os.environ, file_actions=actions,
                         setsigdef=(signal.SIGPIPE,))
    os.close(out_w)
    os.close(err_w)
    with selectors.DefaultSelector() as sel:
        sel.register(out_r, selectors.EVENT_READ)
        sel.register(err_r, selectors.EVENT_READ)
        open_fds = 2
        while open_fds:
            for key, _ in sel.select():
                data = os.read(key.fd, 1 << 16)
                if data:
                    on_output(len(data))
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    open_fds -= 1
    return os.waitpid(pid, 0)[1]


class SpawnClient:
    """The "no server" reference: runs each ``ShellExec`` here with ``posix_spawn`` and two pipes."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root

    def encode(self, commands: Sequence[pb.Command]) -> list[tuple[str, str]]:
        out = []
        for command in commands:
            rid, tool, args = _args_of(command)
            if tool != "shell":
                raise NotImplementedError("the no-server reference runs commands only")
            out.append((rid, args["command"]))
        return out

    def pipeline(self, units: Sequence[tuple[str, str]], tracker: Tracker, window: int) -> float:
        start = time.perf_counter()
        for rid, command in units:  # one at a time: window is 1 in every command workload
            tracker.feed(self._run(rid, command))
        return time.perf_counter() - start

    def _run(self, rid: str, command: str) -> list[View]:
        views: list[View] = [(STATE, rid, _PROCESSING, None)]
        status = spawn_sh(command, lambda size: views.append((OUTPUT, rid, size, None)))
        views.append((OUTPUT, rid, 0, os.waitstatus_to_exitcode(status)))
        return [*views, (STATE, rid, _READY, None)]

    def round_trips(self, unit: Any, rid: str, count: int) -> list[float]:
        raise NotImplementedError("the no-server reference runs commands only")

    def pipeline_many(self, units: Sequence[Sequence[Any]], trackers: Sequence[Tracker], window: int) -> float:
        raise NotImplementedError("the no-server reference runs commands only")

    def close(self) -> None:
        pass
