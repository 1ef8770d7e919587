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

:class:`Client` is what a workload drives: ``encode`` commands before timing, then ``pipeline``,
``round_trips`` or ``pipeline_many``, each returning the seconds of its timed region only.
"""

from __future__ import annotations

import asyncio
import pathlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.server import ServerProcess
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from .drivers import Session, Tracker, pipeline, pipeline_many, round_trips
from .wire import WIRES, handshake_command

__all__ = ["CONTENDERS", "BASELINES", "Client", "Contender", "GrpcClient", "UnixClient", "contender_names",
           "probe_service_info"]


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

    def server(self, workdir: pathlib.Path, root: pathlib.Path, extra: Sequence[str] = ()) -> ServerProcess:
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

    def client(self, server: ServerProcess) -> Client:
        """A connected, handshaken client for ``server``."""
        if self.transport == "grpc":
            return GrpcClient(server.grpc.removeprefix("grpc:"), self.batched)
        return UnixClient(server.sock_path, self.wire, self.batched)


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
)
BASELINES = ("v0-json", "v0-orjson")


def contender_names() -> list[str]:
    return [c.name for c in CONTENDERS]


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
