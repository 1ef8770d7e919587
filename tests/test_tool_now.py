"""The one-step tool call (``CommandSpec.now``, ``ToolRegistry.start``): a tool that ends in the
step that read its call gives what the task path gives, on the wire (the same events in the same
order), in the outcome and in the audit line; what it cannot finish in one step goes on as any
request."""

from __future__ import annotations

import asyncio
import collections
import json
import pathlib
from typing import Any

import pytest

from harness.server import ServerProcess, assert_clean_log, wait_until
from smith_fast import relaypeek
from smith_fast._compat import COMPILED_IN_PLACE, NO_EXTENSIONS
from smith_fast._varint import encode as varint
from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.service.config import ServiceConfig
from smith_fast.service.core import ServiceCore
from smith_fast.service.sinks import V1Sink
from smith_fast.tools import ToolContext, ToolOutcome, default_registry
from smith_fast.tools.fs import INLINE_READ
from tests.peers import V1Peer, kind, terminal

pytestmark = pytest.mark.timeout(60)

BIG = INLINE_READ * 2  # read in a worker thread: the inline call suspends

# (args, what the call gives): every way an fs.read can end
CASES: list[tuple[bytes, str]] = [
    (b'{"path":"hello.txt"}', "ok"),
    (b'{"path":"big.txt"}', "ok"),  # suspends: the rest in a task
    (b'{"path":"hello.txt","encoding":"base64","offset":2}', "ok"),
    (b"{not json", "failed"),
    (b'{"nope":1}', "failed"),
    (b'{"path":"missing.txt"}', "failed"),
    (b'{"path":"sub"}', "failed"),  # a directory
    (b'{"path":"../outside.txt"}', "denied"),
]


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "ws"
    path.mkdir()
    (path / "hello.txt").write_text("hello world\n")
    (path / "big.txt").write_bytes(b"x" * BIG)
    (path / "sub").mkdir()
    (tmp_path / "outside.txt").write_text("secret\n")
    return path


def _same(a: ToolOutcome, b: ToolOutcome) -> tuple[bool, bytes, str | None]:
    assert (a.success, a.result, a.error) == (b.success, b.result, b.error)
    return a.success, a.result, a.error


@pytest.mark.parametrize(("args", "expect"), CASES)
def test_start_gives_what_call_gives(run, root: pathlib.Path, args: bytes, expect: str) -> None:
    registry = default_registry(entry_points=False)
    ctx = ToolContext(root)

    async def main() -> None:
        try:
            normal: ToolOutcome | ProtocolError = await registry.call("fs.read", args, ctx)
        except ProtocolError as exc:
            normal = exc
        now: Any = registry.start("fs.read", args, ctx)
        assert now is not None
        if isinstance(normal, ProtocolError):
            assert expect == "denied" and type(now) is not ToolOutcome
            with pytest.raises(ProtocolError) as info:
                await now
            assert (info.value.code, str(info.value)) == (normal.code, str(normal))
            return
        if args == b'{"path":"big.txt"}':
            assert type(now) is not ToolOutcome  # a large read goes to a thread
            now = await now
        assert type(now) is ToolOutcome
        success, result, _ = _same(now, normal)
        assert success == (expect == "ok")
        if success:
            assert json.loads(result)["path"] in ("hello.txt", "big.txt")

    run(main())


def test_start_ends_only_what_needs_no_wait(run, root: pathlib.Path) -> None:
    """tools.list (a plain function) ends in its start; an async tool goes on (an awaitable);
    an unknown tool is None (call raises for it)."""
    registry = default_registry(entry_points=False)
    ctx = ToolContext(root)
    assert type(registry.start("tools.list", b"{}", ctx)) is ToolOutcome
    assert registry.start("no.such.tool", b"{}", ctx) is None

    async def main() -> None:
        step: Any = registry.start("fs.list", b"{}", ctx)
        assert type(step) is not ToolOutcome
        done = await step
        assert done.success and b"hello.txt" in done.result

    run(main())


def test_start_of_other_tools_gives_what_call_gives(run, root: pathlib.Path) -> None:
    """A tool that raises before it is awaited, one that returns another awaitable, one that
    suspends, one that raises a protocol error: the outcome (or error) of call, each."""
    from smith_fast.tools import Tool, ToolRegistry

    def raises_at_once(args: Any, ctx: ToolContext) -> Any:
        raise RuntimeError("broken before awaiting")

    def plain_awaitable(args: Any, ctx: ToolContext) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.set_result({"plain": True})
        return future

    async def suspends(args: Any, ctx: ToolContext) -> Any:
        await asyncio.sleep(0)
        return {"slept": True}

    async def refuses(args: Any, ctx: ToolContext) -> Any:
        raise ProtocolError("no", pb.ERROR_CODE_PERMISSION_DENIED)

    registry = ToolRegistry()
    for name, handler in [("t.raises", raises_at_once), ("t.plain", plain_awaitable), ("t.suspends", suspends), ("t.refuses", refuses)]:
        registry.register(Tool(name=name, description="a test tool", schema={"type": "object"}, handler=handler))
    ctx = ToolContext(root)

    async def outcome(name: str, now: bool) -> Any:
        try:
            if not now:
                got = await registry.call(name, b"{}", ctx)
            else:
                step: Any = registry.start(name, b"{}", ctx)
                assert step is not None
                got = step if type(step) is ToolOutcome else await step
            return (got.success, got.result, got.error)
        except ProtocolError as exc:
            return (exc.code, str(exc))

    async def main() -> None:
        for name in ("t.raises", "t.plain", "t.suspends", "t.refuses"):
            assert await outcome(name, True) == await outcome(name, False), name
        assert (await outcome("t.raises", True))[2] == "RuntimeError: broken before awaiting"

    run(main())


def _exchange(peer: V1Peer, rid: str, args: bytes) -> list[pb.Envelope]:
    peer.command(tool_call=pb.ToolCallCommand(request_id=rid, tool="fs.read", args=args))
    return [e for e in peer.until(terminal(rid)) if _rid(e) == rid]  # not the handshake's READY before


def _rid(env: pb.Envelope) -> str:
    member = env.event.WhichOneof("event_type")
    return getattr(env.event, member).request_id if member in ("state_change", "tool_result", "error") else ""


def _shape(envs: list[pb.Envelope]) -> list[Any]:
    """What the peer is told, without the stamps and durations (they differ between any two calls)."""
    out: list[Any] = []
    for env in envs:
        assert env.HasField("event")
        event = pb.Event()
        event.CopyFrom(env.event)
        if kind(env) == "state_change":
            event.state_change.timestamp = 0
        elif kind(env) == "tool_result":
            event.tool_result.duration_ms = 0
        elif kind(env) == "error":
            event.error.timestamp = 0
        out.append(event.SerializeToString(deterministic=True))
    return out


def _audit(server: ServerProcess, rid: str) -> dict[str, Any]:
    assert wait_until(lambda: any(r.get("event") == "request" and r.get("request_id") == rid for r in server.logs), 10)
    line = next(r for r in server.logs if r.get("event") == "request" and r.get("request_id") == rid)
    return {k: v for k, v in line.items() if k not in ("ts", "duration_ms", "request_id")}


@pytest.mark.parametrize("impl", ["c", "py"])
def test_the_wire_and_the_audit_line_are_the_normal_paths(tmp_path: pathlib.Path, root: pathlib.Path, impl: str) -> None:
    """Each case once through the one-step path (nothing else runs) and once as a task (a command
    with open stdin runs meanwhile and holds its share of the output budget, so no call is
    answered in the step that read it): the same events, in the same order, and the same audit line.
    Run by a server with the request path compiled (``c``) and by one running its source (``py``)."""
    env = {"SMITH_FAST_NO_EXTENSIONS": "1"} if impl == "py" else None  # "c": as this run is built
    server = ServerProcess(tmp_path, root=root, log_level="info", env=env).start()
    try:
        assert server.proc is not None
        assert _runs_compiled(server.proc.pid) == (impl == "c" and not NO_EXTENSIONS)
        peer = V1Peer(server.unix)
        peer.handshake()
        fasts = [_exchange(peer, f"f{i}", args) for i, (args, _) in enumerate(CASES)]
        peer.command(shell_exec=pb.ShellExecCommand(request_id="holder", command="cat", open_stdin=True))
        peer.until(lambda e: kind(e) == "state_change" and e.event.state_change.request_id == "holder")
        normals = [_exchange(peer, f"n{i}", args) for i, (args, _) in enumerate(CASES)]
        peer.command(stdin=pb.StdinCommand(request_id="holder", eof=True))
        peer.until(terminal("holder"))
        for i, (args, expect) in enumerate(CASES):
            fast, normal = fasts[i], normals[i]
            assert _shape(fast) == _shape([_renamed(e, f"n{i}", f"f{i}") for e in normal]), args
            states = [e.event.state_change.state for e in fast if kind(e) == "state_change"]
            assert states == [pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_ERROR if expect == "denied" else pb.SERVICE_STATE_READY]
            seqs = [e.sequence for e in fast]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # nothing in between, none skipped
            assert _audit(server, f"f{i}") == _audit(server, f"n{i}")
        # pipelined: every call its three events, in order per request
        rids = [f"p{i}" for i in range(50)]
        for rid in rids:
            peer.command(tool_call=pb.ToolCallCommand(request_id=rid, tool="fs.read", args=b'{"path":"hello.txt"}'))
        seen: dict[str, list[str]] = {rid: [] for rid in rids}
        while any(len(v) < 3 for v in seen.values()):
            env = peer.recv()
            if _rid(env) in seen:
                seen[_rid(env)].append(kind(env) or "")
        assert all(v == ["state_change", "tool_result", "state_change"] for v in seen.values())
        peer.close()
    finally:
        assert server.stop() == 0, "\n".join(server.raw_stderr[-30:])


def _runs_compiled(pid: int) -> bool:
    """Whether process ``pid`` runs the request path compiled (none of it, if not). A command's
    modules (process_spawn, shell_exec …) are imported by the first command, so a process that ran
    only tool calls has not loaded them at all: the tool call's own path must be all or nothing."""
    maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
    loaded = {name for name in COMPILED_IN_PLACE if f"/{name.replace('.', '/')}.cpython-" in maps}
    tool_path = {"smith_fast.service.connection", "smith_fast.service.session", "smith_fast.service.runner",
                 "smith_fast.service.request_start", "smith_fast.tools.registry", "smith_fast.tools.fs", "smith_fast.service.sinks"}
    assert tool_path <= set(COMPILED_IN_PLACE)
    assert not loaded or tool_path <= loaded, sorted(loaded)
    return bool(loaded)


def _renamed(env: pb.Envelope, old: str, new: str) -> pb.Envelope:
    out = pb.Envelope()
    out.CopyFrom(env)
    for member in (out.event.state_change, out.event.tool_result, out.event.error):
        if member.request_id == old:
            member.request_id = new
    return out


def _field(number: int, wire: int, value: int | bytes) -> bytes:
    """One protobuf field written by hand (a varint for wire type 0, else a length and the bytes)."""
    if wire == 0:
        assert isinstance(value, int)
        return varint(number << 3) + varint(value)
    assert isinstance(value, bytes)
    return varint(number << 3 | 2) + varint(len(value)) + value


def _call_frame(rid: str, args: bytes, extra: bytes = b"", sequence: int = 1) -> bytes:
    call = pb.ToolCallCommand(request_id=rid, tool="fs.read", args=args, timeout_ms=30_000).SerializeToString() + extra
    return _field(2, 0, sequence) + _field(10, 2, _field(3, 2, call))


def test_a_call_read_off_its_frame_is_the_call_the_runtime_reads(tmp_path: pathlib.Path, root: pathlib.Path) -> None:
    """The session reads a plain tool call off its frame (``relaypeek.tool_call``) and leaves any
    other frame to the protobuf runtime. The same call both ways (an unknown field in its
    ``ToolCallCommand``, which the runtime ignores, makes the frame not plain) gives the same
    events in the same order and the same audit line; an id over ``--max-request-id-size`` is
    refused alike (an ``ErrorEvent`` with no request id, and no terminal state)."""
    server = ServerProcess(tmp_path, root=root, log_level="info").start()
    try:
        peer = V1Peer(server.unix)
        peer.handshake()
        sequence = 1
        for i, (args, _expect) in enumerate(CASES):
            got = {}
            for rid, extra in ((f"q{i}", b""), (f"r{i}", _field(99, 0, 1))):
                frame = _call_frame(rid, args, extra, sequence := sequence + 1)
                assert (relaypeek.tool_call(frame) is None) == bool(extra)
                peer.sock.sendall(varint(len(frame)) + frame)
                got[rid] = [e for e in peer.until(terminal(rid)) if _rid(e) == rid]
            assert _shape(got[f"q{i}"]) == _shape([_renamed(e, f"r{i}", f"q{i}") for e in got[f"r{i}"]]), args
            assert _audit(server, f"q{i}") == _audit(server, f"r{i}")
        errors = []
        for extra in (b"", _field(99, 0, 1)):
            peer.sock.sendall(varint(len(frame := _call_frame("x" * 300, b"{}", extra, sequence := sequence + 1))) + frame)
            errors.append(peer.until(lambda e: kind(e) == "error")[-1])
        assert _shape(errors[:1]) == _shape(errors[1:])
        assert errors[0].event.error.request_id == "" and "--max-request-id-size" in errors[0].event.error.message
        peer.close()
    finally:
        assert server.stop() == 0, "\n".join(server.raw_stderr[-30:])


def test_mangled_tool_call_frames_leave_the_service_answering(tmp_path: pathlib.Path, root: pathlib.Path) -> None:
    """Hostile bytes at the quick read: 2,000 tool-call frames cut, with a byte changed, with
    bytes put in, with fields of every size added, sent in one stream to a real server (the
    runtime and the quick read agree on which are readable: the relaypeek tests). Every request
    that started ends, the rest get an ErrorEvent, a plain call sent after them all is answered,
    and the log has no traceback and no error."""
    import random

    rng = random.Random(20261207)
    server = ServerProcess(tmp_path, root=root, log_level="info").start()
    try:
        peer = V1Peer(server.unix)
        peer.handshake()
        stream = bytearray()
        for i in range(2000):
            frame = bytearray(_call_frame(f"m{i}", b'{"path":"hello.txt"}', sequence=i + 2))
            match rng.randrange(4):
                case 0:
                    del frame[rng.randrange(len(frame)):]
                case 1:
                    frame[rng.randrange(len(frame))] = rng.randrange(256)
                case 2:
                    at = rng.randrange(len(frame) + 1)
                    frame[at:at] = rng.randbytes(rng.randrange(1, 7))
                case _:
                    wire = rng.choice([0, 2])
                    frame += _field(rng.choice([1, 4, 10, 99]), wire, rng.randrange(1 << 64) if wire == 0 else rng.randbytes(rng.randrange(8)))
            stream += varint(len(frame)) + frame
        peer.sock.sendall(bytes(stream))
        frame = _call_frame("last", b'{"path":"hello.txt"}', sequence=5000)
        peer.sock.sendall(varint(len(frame)) + frame)
        seen = peer.until(terminal("last"))
        got = [e for e in seen if _rid(e) == "last"]
        assert [kind(e) for e in got] == ["state_change", "tool_result", "state_change"]
        assert got[-1].event.state_change.state == pb.SERVICE_STATE_READY
        peer.command(shutdown=pb.ShutdownCommand())  # what still runs ends, then the connection closes
        seen += peer.rest()
        started: collections.Counter[str] = collections.Counter()
        ended: collections.Counter[str] = collections.Counter()
        for env in seen:
            if kind(env) == "state_change" and env.event.state_change.request_id:
                change = env.event.state_change
                if change.state == pb.SERVICE_STATE_PROCESSING:
                    started[change.request_id] += 1
                elif change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                    ended[change.request_id] += 1
        assert len(started) > 300  # hundreds were still calls (719 with this seed)
        assert all(ended[rid] >= n for rid, n in started.items()), [rid for rid, n in started.items() if ended[rid] < n]
        assert sum(1 for env in seen if kind(env) == "error") > 100  # and the rest were told why
        peer.close()
        assert_clean_log(server)
    finally:
        assert server.stop() == 0, "\n".join(server.raw_stderr[-30:])


def test_a_call_read_off_its_frame_makes_no_command_unless_asked(run, root: pathlib.Path) -> None:
    """In process: a plain call read off its frame is admitted with its ``call`` (compiled build;
    the Python twin's walk would cost more than the runtime, so that build decodes) and no
    ``pb.Command`` until something asks for one; the one made is the runtime's."""
    core = ServiceCore(ServiceConfig(root=root))
    out: list[bytes] = []

    async def main() -> None:
        session = core.new_session(V1Sink(out.append), close=lambda: None, peer="test")
        session.handle(pb.Command(handshake=pb.HandshakeCommand(version=1)))
        frame = _call_frame("big", b'{"path":"big.txt"}')  # suspends: still live after the step
        session.handle_frame(frame)
        request = session.requests.get("big")
        assert request is not None
        compiled = relaypeek.IMPLEMENTATION == "c"
        assert (request.call is not None) == compiled
        assert (request._command is None) == compiled
        while session.busy:
            await asyncio.sleep(0.01)
        # what it makes when asked is what the runtime reads
        assert request.command == pb.Envelope.FromString(frame).command

    run(main())


def test_the_sink_writes_one_step_as_one_write_of_three_frames() -> None:
    from smith_fast.framing import FrameDecoder
    from smith_fast.service.sinks import V1Sink

    units: list[bytes] = []
    counted: list[tuple[bytes, int]] = []
    sink = V1Sink(units.append, write_frames=lambda data, n: counted.append((data, n)))
    sink.tool_done("r1", True, b'{"a":1}', None, 4)
    assert not units and len(counted) == 1 and counted[0][1] == 3
    envs = [pb.Envelope.FromString(f) for f in FrameDecoder().feed(counted[0][0])]
    assert [e.sequence for e in envs] == [1, 2, 3]
    assert [e.event.WhichOneof("event_type") for e in envs] == ["state_change", "tool_result", "state_change"]
    assert [envs[0].event.state_change.state, envs[2].event.state_change.state] == [pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY]
    assert envs[1].event.tool_result.result == b'{"a":1}' and envs[1].event.tool_result.duration_ms == 4
    # recorded (tapped) or batching: one envelope per write, as any event
    seen: list[bytes] = []
    sink.tap(seen.append)
    sink.tool_done("r2", False, b"", "no", 0)
    assert len(counted) == 1 and len(units) == 3 and seen == units
    assert [pb.Envelope.FromString(next(iter(FrameDecoder().feed(u)))).sequence for u in units] == [4, 5, 6]


def test_a_tool_says_nothing_of_how_it_is_scheduled() -> None:
    """The plug-in ``Tool`` is what a tool is (name, description, schema, handler); whether a call
    ends in one step follows from its handler (a plain function that returns), not from a hint."""
    import dataclasses

    from smith_fast.tools import Tool

    assert [f.name for f in dataclasses.fields(Tool)] == ["name", "description", "schema", "handler"]
