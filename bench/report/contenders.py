"""The contenders: a server configuration and the client that drives it, behind one interface.

Every contender gets its own ``smith-fast serve`` process (:meth:`Contender.server`), so one
contender's garbage or open sessions never weigh on another's figures. What a contender isolates:

* ``v1`` / ``v1-py`` / ``v1-asyncio``: the same client (compiled framing + upb, blocking socket)
  against servers that differ only in the wire core (compiled twins, or the pure-Python twins with
  ``SMITH_FAST_NO_EXTENSIONS=1`` in the *server's* environment) or in the server's event loop.
* ``v1-batch``: ``v1`` asking for ``batch_event``: events of one loop iteration in one envelope.
* ``v0-json`` / ``v0-orjson``: v0 JSON lines, the server's ``--jsonl-backend`` being the only
  difference; the client parses with orjson (the cheapest JSONL client) for both.
* ``grpc`` / ``grpc-batch``: the gRPC ``Stream`` with one envelope per message, or with
  ``BatchEvent`` out and ``BatchCommand`` in; the client is grpc.aio on the stdlib loop.
* ``mcp``: smith-fast's MCP front (``serve --mcp``, stdio), and its rival ``mcp-sdk``: a server
  written with the official MCP Python SDK the way its documentation shows
  (``bench/mcp_sdk_server.py``), both driven by the same JSON-RPC client (``bench.report.stdio``).
* References, floors rather than competitors (``role="reference"``): ``floor``, the bare blocking
  stdlib loop of ``bench/report/floor_server.py`` (reads a line, opens the file, writes one answer;
  no validation, no path check, no concurrency), and ``no-server``, commands run by the report's own
  process with ``posix_spawn`` and two pipes.

A contender that does not answer a workload (``groups``) is shown as "—" there, not as failed.

:class:`Client` is what a workload drives: ``encode`` commands before timing, then ``pipeline``,
``round_trips`` or ``pipeline_many``, each returning the seconds of its timed region only.
"""

from __future__ import annotations

import asyncio
import pathlib
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from harness.server import ROOT, ServerProcess
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from .drivers import Session, Tracker, pipeline, pipeline_many, round_trips
from .stdio import McpClient, NoServer, SpawnClient, StdioServer
from .wire import WIRES, handshake_command

__all__ = ["CONTENDERS", "BASELINES", "ROLES", "Client", "Contender", "Endpoint", "GrpcClient", "UnixClient",
           "contender_names", "probe_service_info"]

# what a contender is to the reader: a configuration of this service, another server for the same
# job, or a floor that shows what the job costs with (almost) no server at all
ROLES = ("smith-fast", "rival", "reference")
# the workload groups of small tool calls and of commands (for the contenders that answer only those)
TOOL_CALLS = frozenset({"latency", "pipelined"})
COMMANDS = frozenset({"lines", "bulk", "seq", "spawn"})


@dataclass(frozen=True)
class Contender:
    """One way of serving and speaking the protocol.

    Attributes:
        name: short name used in tables and charts.
        description: one line for the report.
        transport: ``"unix"`` or ``"grpc"``.
        wire: ``"v1"`` or ``"v0"`` (gRPC is always v1).
        loop: the server's ``--loop``.
        no_extensions: run the server with ``SMITH_FAST_NO_EXTENSIONS=1``.
        jsonl_backend: the server's ``--jsonl-backend``.
        batched: ask for ``batch_event`` (and, on gRPC, send ``BatchCommand``s).
        implementation: the wire core the server must report (``c``/``py``).
        role: one of :data:`ROLES`.
        groups: the workload groups it answers (None: all).
        argv: a stdio contender's command line (``{python}``, ``{root}`` and ``{repo}`` filled in).
        tools: Smith tool name -> the stdio server's tool name.
        handshake: a stdio contender speaks MCP ``initialize`` first.
    """

    name: str
    description: str
    transport: str = "unix"
    wire: str = "v1"
    loop: str = "uvloop"
    no_extensions: bool = False
    jsonl_backend: str = "orjson"
    batched: bool = False
    implementation: str = "c"
    role: str = "smith-fast"
    groups: frozenset[str] | None = None
    argv: tuple[str, ...] = ()
    tools: tuple[tuple[str, str], ...] = ()
    handshake: bool = True

    def answers(self, group: str) -> bool:
        """Whether this contender runs workloads of ``group``."""
        return self.groups is None or group in self.groups

    def server(self, workdir: pathlib.Path, root: pathlib.Path, extra: Sequence[str] = ()) -> Endpoint:
        """This contender's server (not launched): its own process, or this one for ``no-server``."""
        return _SERVERS[self.transport](self, workdir, root, extra)

    def client(self, server: Endpoint) -> Client:
        """A connected, handshaken client for ``server``."""
        return _CLIENTS[self.transport](self, server)

    def check(self, server: Endpoint) -> dict[str, str]:
        """What the server says it runs (a smith-fast socket server must run what the contender claims)."""
        if self.transport == "unix" or self.transport == "grpc":
            assert isinstance(server, ServerProcess)
            return _check_socket_server(self, server)
        if isinstance(server, StdioServer) and server.peer is not None and server.peer.server_info:
            info = server.peer.server_info
            return {"server": str(info.get("name", "?")), "version": str(info.get("version", "?"))}
        return {}

    def smith_server(self, workdir: pathlib.Path, root: pathlib.Path, extra: Sequence[str] = ()) -> ServerProcess:
        """This contender's server (not launched), with its socket in ``workdir/NAME``.

        It logs at ``info`` (not the tests' ``debug``) and keeps only its first stderr lines: the
        report measures the server, not its logging.
        """
        args = ["--jsonl-backend", self.jsonl_backend, "--max-output", "2G", *extra]
        if self.transport == "grpc":
            args += ["--grpc", "127.0.0.1:0"]
        env = {"SMITH_FAST_NO_EXTENSIONS": "1"} if self.no_extensions else {"SMITH_FAST_NO_EXTENSIONS": ""}
        home = workdir / self.name
        home.mkdir(parents=True, exist_ok=True)
        return ServerProcess(home, *args, loop=self.loop, root=root, env=env, tcp=False, log_level="info", keep=200)


class Endpoint(Protocol):
    """What the runner needs of a contender's server: start it, wait, stop it, and whose CPU to count."""

    @property
    def pid(self) -> int: ...

    def launch(self) -> object: ...

    def wait_ready(self, timeout: float) -> object: ...

    def stop(self) -> object: ...


def _stdio_server(c: Contender, workdir: pathlib.Path, root: pathlib.Path, extra: Sequence[str]) -> Endpoint:
    fill = {"python": sys.executable, "root": str(root), "repo": str(ROOT)}
    return StdioServer([part.format(**fill) for part in c.argv], ROOT, c.handshake)


_SERVERS: dict[str, Callable[[Contender, pathlib.Path, pathlib.Path, Sequence[str]], Endpoint]] = {
    "unix": Contender.smith_server,
    "grpc": Contender.smith_server,
    "stdio": _stdio_server,
    "none": lambda c, workdir, root, extra: NoServer(),
}
_CLIENTS: dict[str, Callable[[Contender, Any], Client]] = {
    "unix": lambda c, s: UnixClient(s.sock_path, c.wire, c.batched),
    "grpc": lambda c, s: GrpcClient(s.grpc.removeprefix("grpc:"), c.batched),
    "stdio": lambda c, s: cast(Client, McpClient(s, dict(c.tools))),
    "none": lambda c, s: cast(Client, SpawnClient(ROOT)),
}


CONTENDERS: tuple[Contender, ...] = (
    Contender("v1", "v1 protobuf frames, Cython wire core, uvloop (Unix socket)"),
    Contender("v1-batch", "v1 as above, asking for BatchEvent (`smith_fast.accept=batch_event`)", batched=True),
    Contender("v1-py", "v1, pure-Python twins in the server (`SMITH_FAST_NO_EXTENSIONS=1`), uvloop",
              no_extensions=True, implementation="py"),
    Contender("v1-asyncio", "v1, Cython wire core, stdlib asyncio loop in the server", loop="asyncio"),
    Contender("v0-json", "v0 JSONL, server on the stdlib `json` backend, uvloop", wire="v0", jsonl_backend="json"),
    Contender("v0-orjson", "v0 JSONL, server on the `orjson` backend, uvloop", wire="v0", jsonl_backend="orjson"),
    Contender("grpc", "gRPC Stream, one Envelope per message, uvloop", transport="grpc"),
    Contender("grpc-batch", "gRPC Stream with BatchEvent out and BatchCommand in, uvloop", transport="grpc",
              batched=True),
    Contender("mcp", "smith-fast's MCP front: `smith-fast serve --mcp` on stdio (JSON-RPC lines), uvloop",
              transport="stdio", groups=TOOL_CALLS | {"seq", "spawn"},
              argv=("{python}", "-m", "smith_fast", "serve", "--mcp", "--root", "{root}", "--log-level", "warning",
                    "--tool-max-output", "16M", "--mcp-max-result-chars", "8000000")),
    Contender("mcp-sdk", "a server written with the official MCP Python SDK as its documentation shows "
              "(`bench/mcp_sdk_server.py`: `MCPServer`, `read_file` and `shell` tools, stdio)", transport="stdio",
              role="rival", groups=TOOL_CALLS | {"seq", "spawn"}, tools=(("fs.read", "read_file"),),
              argv=("{python}", "{repo}/bench/mcp_sdk_server.py", "{root}")),
    Contender("floor", "reference, not a competitor: the bare blocking stdlib loop of "
              "`bench/report/floor_server.py` on stdio (read a line, open the file, write one answer, flush; "
              "no validation, no path check, no concurrency)", transport="stdio", role="reference",
              groups=TOOL_CALLS, argv=("{python}", "{repo}/bench/report/floor_server.py", "{root}"), handshake=False),
    Contender("no-server", "reference, not a competitor: the report's own process runs each command with "
              "`posix_spawn` and two pipes (no server at all); its CPU is that process's", transport="none",
              role="reference", groups=COMMANDS),
)
BASELINES = ("v0-json", "v0-orjson")


def contender_names() -> list[str]:
    return [c.name for c in CONTENDERS]


def _check_socket_server(contender: Contender, server: ServerProcess) -> dict[str, str]:
    """The server runs what the contender says (wire core, loop), or the report would lie."""
    info = probe_service_info(server.sock_path)
    if info.get("implementation") != contender.implementation or info.get("event_loop") != contender.loop:
        raise RuntimeError(f"{contender.name}: the server reports implementation={info.get('implementation')} "
                           f"event_loop={info.get('event_loop')}, expected {contender.implementation}/{contender.loop}")
    return info


def probe_service_info(path: str) -> dict[str, str]:
    """The ``Ready.service_info`` a v1 handshake gets from the server at ``path`` (the config check)."""
    env = pb.Envelope()
    env.command.CopyFrom(handshake_command(1, ()))
    frames = FrameDecoder()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(encode_frame(env.SerializeToString()))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return {}
            for frame in frames.feed(data):
                got = pb.Envelope.FromString(frame)
                if got.WhichOneof("payload") == "event" and got.event.WhichOneof("event_type") == "ready":
                    return dict(got.event.ready.service_info)


class Client:
    """What a workload drives; every timed method returns the seconds of its timed region."""

    def encode(self, commands: Sequence[pb.Command]) -> list[Any]:
        """Commands in this client's wire form (not timed)."""
        raise NotImplementedError

    def pipeline(self, units: Sequence[Any], tracker: Tracker, window: int) -> float:
        raise NotImplementedError

    def round_trips(self, unit: Any, rid: str, count: int) -> list[float]:
        raise NotImplementedError

    def pipeline_many(self, units: Sequence[Sequence[Any]], trackers: Sequence[Tracker], window: int) -> float:
        """One extra session per entry of ``units`` (opened before, closed after the timed region)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class UnixClient(Client):
    """Blocking Unix-socket client (``drivers``), v1 or v0."""

    def __init__(self, path: str, wire: str, batched: bool) -> None:
        self.path = path
        self.wire_name = wire
        self.accept = "batch_event" if batched else None
        self.session = Session(path, wire, self.accept)

    def encode(self, commands: Sequence[pb.Command]) -> list[bytes]:
        encode = WIRES[self.wire_name]().encode
        return [encode(c) for c in commands]

    def pipeline(self, units: Sequence[bytes], tracker: Tracker, window: int) -> float:
        return pipeline(self.session, units, tracker, window)

    def round_trips(self, unit: bytes, rid: str, count: int) -> list[float]:
        return round_trips(self.session, unit, rid, count)

    def pipeline_many(self, units: Sequence[Sequence[bytes]], trackers: Sequence[Tracker], window: int) -> float:
        sessions = [Session(self.path, self.wire_name, self.accept) for _ in units]
        try:
            return pipeline_many(sessions, units, trackers, window)
        finally:
            for s in sessions:
                s.close()

    def close(self) -> None:
        self.session.close()


_TIMEOUT = 300.0  # seconds: a hung server fails the run instead of hanging it


_loop: asyncio.AbstractEventLoop | None = None


def _grpc_loop() -> asyncio.AbstractEventLoop:
    # One loop for every gRPC client of the process, never closed: grpc.aio binds its completion
    # queue poller to a loop, and a closed one makes the poller thread raise "Event loop is closed".
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop


class GrpcClient(Client):
    """grpc.aio client on a stdlib asyncio loop; each timed method is one ``run_until_complete``."""

    def __init__(self, target: str, batched: bool) -> None:
        from . import grpc_client  # grpc.aio only for the gRPC contenders

        self._g = grpc_client
        self.batched = batched
        self.loop = _grpc_loop()
        self.channel = self.loop.run_until_complete(self._channel(target))
        self.stream = self._run(self._g.GrpcStream(self.channel, batched).open())

    async def _channel(self, target: str) -> Any:
        return self._g.open_channel(target)

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, _TIMEOUT))

    def encode(self, commands: Sequence[pb.Command]) -> list[Any]:
        return self._g.encode_units(commands)

    def pipeline(self, units: Sequence[Any], tracker: Tracker, window: int) -> float:
        return float(self._run(self._g.grpc_pipeline(self.stream, units, tracker, window)))

    def round_trips(self, unit: Any, rid: str, count: int) -> list[float]:
        return list(self._run(self._g.grpc_round_trips(self.stream, unit, rid, count)))

    def pipeline_many(self, units: Sequence[Sequence[Any]], trackers: Sequence[Tracker], window: int) -> float:
        async def run() -> float:
            streams = await asyncio.gather(*(self._g.GrpcStream(self.channel, self.batched).open() for _ in units))
            try:
                return float(await self._g.grpc_pipeline_many(streams, units, trackers, window))
            finally:
                await asyncio.gather(*(s.close() for s in streams))

        return float(self._run(run()))

    def close(self) -> None:
        self._run(self.stream.close())
        self._run(self.channel.close())
