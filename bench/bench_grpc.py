"""End to end: events/s over the gRPC ``Stream``, one Envelope per message vs BatchEvents, next to a
framed Unix socket, all against one real ``smith-fast serve`` process.

Two workloads, the same bytes on every path:

* ``shell``: ``seq 1 100000`` with ``--chunk-size 32``, so ~18,400 small ShellOutput events;
* ``tools``: 500 pipelined ``fs.read`` calls, 3 events each (PROCESSING, ToolResult, READY); a
  batched peer sends them as one ``BatchCommand`` (batches both ways), a single one as 500 envelopes.

Each round opens a fresh session (Unix connection or Stream call), handshakes (asking for
``batch_event`` on the batched paths), runs the workload and reads until its last terminal
StateChange, parsing every envelope it receives the way a client must. The events per second of
each entry are in its ``extra_info`` (``--benchmark-json``) and printed at the end of the run.

Run: ``.venv/bin/pytest bench/bench_grpc.py --benchmark-only -p no:cacheprovider``
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from grpc import aio

from harness.server import ServerProcess
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from ._summary import print_summary

SHELL_COMMAND = "seq 1 100000"
CHUNK_SIZE = "32"
TOOL_CALLS = 500
ROUNDS = 3
_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
_RESULTS: list[str] = []


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"bench-grpc-{request.param}")
    (tmp / "small.txt").write_text("a small file\n")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--chunk-size", CHUNK_SIZE, loop=request.param).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def aio_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module", autouse=True)
def _print_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, ["\n\nevents/s (best round):", *_RESULTS] if _RESULTS else [])
    _RESULTS.clear()


# ---- the workloads as envelopes ------------------------------------------------------------------------


def _handshake(batched: bool) -> bytes:
    env = pb.Envelope()
    hs = env.command.handshake
    hs.version = 1
    hs.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
    if batched:
        hs.client_info["smith_fast.accept"] = "batch_event"
    return env.SerializeToString()


def _workload(kind: str, batched: bool) -> tuple[list[bytes], set[str]]:
    """The command envelopes of one round and the request ids whose end closes it."""
    if kind == "shell":
        rid = str(uuid.uuid4())
        env = pb.Envelope()
        env.command.shell_exec.request_id = rid
        env.command.shell_exec.command = SHELL_COMMAND
        return [env.SerializeToString()], {rid}
    batch = pb.Envelope()
    out, rids = [], set()
    for _ in range(TOOL_CALLS):
        rid = str(uuid.uuid4())
        env = pb.Envelope()
        env.command.tool_call.request_id = rid
        env.command.tool_call.tool = "fs.read"
        env.command.tool_call.args = json.dumps({"path": "small.txt"}).encode()
        out.append(env.SerializeToString())
        batch.batch_command.commands.append(env.command)
        rids.add(rid)
    return ([batch.SerializeToString()] if batched else out), rids


class _Counter:
    """Parses envelopes as a client must, counts events, knows when every request has ended."""

    def __init__(self, rids: set[str]) -> None:
        self.waiting = set(rids)
        self.events = 0
        self.messages = 0

    def feed(self, raw: bytes) -> bool:
        """One envelope; True once the last awaited request has ended."""
        self.messages += 1
        env = pb.Envelope.FromString(raw)
        kind = env.WhichOneof("payload")
        events = (env.event,) if kind == "event" else env.batch_event.events if kind == "batch_event" else ()
        for ev in events:
            self.events += 1
            if ev.WhichOneof("event_type") == "state_change":
                sc = ev.state_change
                if sc.state in _TERMINAL and sc.request_id in self.waiting:
                    self.waiting.discard(sc.request_id)
        return not self.waiting


# ---- the clients -----------------------------------------------------------------------------------------


def _unix_round(path: str, kind: str, batched: bool) -> _Counter:
    commands, rids = _workload(kind, batched)
    counter = _Counter(rids)
    decoder = FrameDecoder(1 << 26)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(b"".join(encode_frame(c) for c in [_handshake(batched), *commands]))
        while True:
            data = sock.recv(1 << 20)
            if not data:
                raise RuntimeError("the service closed the connection")
            for frame in decoder.feed(data):
                if counter.feed(frame):
                    return counter


async def _grpc_round(channel: aio.Channel, kind: str, batched: bool) -> _Counter:
    commands, rids = _workload(kind, batched)
    counter = _Counter(rids)
    finished = asyncio.Event()

    async def requests() -> AsyncIterator[bytes]:
        yield _handshake(batched)
        for command in commands:
            yield command
        await finished.wait()

    method: aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/smith.v1.SmithService/Stream")
    call = method(requests())
    try:
        async for raw in call:
            if counter.feed(raw):
                return counter
        raise RuntimeError(f"the stream ended: {await call.code()}")
    finally:
        finished.set()
        call.cancel()


def _run(benchmark, label: str, once: Callable[[], _Counter]) -> None:  # type: ignore[no-untyped-def]
    counts: list[_Counter] = []
    benchmark.pedantic(lambda: counts.append(once()), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    last = counts[-1]
    best = min(benchmark.stats.stats.data)
    benchmark.extra_info.update(
        events=last.events, messages=last.messages, events_per_s=round(last.events / best),
        events_per_message=round(last.events / last.messages, 1),
    )
    _RESULTS.append(
        f"  {label:32s} {last.events / best:>12,.0f} events/s  {last.events:>6} events in {last.messages:>6} messages"
    )


# ---- the benchmarks -----------------------------------------------------------------------------------------


def _loop_of(server: ServerProcess) -> str:
    return server.argv[server.argv.index("--loop") + 1]


@pytest.mark.parametrize("kind", ["shell", "tools"])
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_unix_socket(benchmark, server: ServerProcess, kind: str, batched: bool) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"{kind} (service on {_loop_of(server)})"
    benchmark.name = f"unix {'batched' if batched else 'single'}"
    _run(benchmark, f"{kind} {_loop_of(server)} unix {'batched' if batched else 'single'}",
         lambda: _unix_round(server.sock_path, kind, batched))


@pytest.mark.parametrize("kind", ["shell", "tools"])
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_grpc_stream(benchmark, server: ServerProcess, aio_loop: asyncio.AbstractEventLoop, kind: str, batched: bool) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"{kind} (service on {_loop_of(server)})"
    benchmark.name = f"grpc {'batched' if batched else 'single'}"
    target = server.grpc.removeprefix("grpc:")

    async def open_channel() -> aio.Channel:  # a channel belongs to the loop it was made on
        return aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])

    channel = aio_loop.run_until_complete(open_channel())
    try:
        _run(benchmark, f"{kind} {_loop_of(server)} grpc {'batched' if batched else 'single'}",
             lambda: aio_loop.run_until_complete(_grpc_round(channel, kind, batched)))
    finally:
        aio_loop.run_until_complete(channel.close())

