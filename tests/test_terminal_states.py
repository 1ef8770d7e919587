"""Exactly one terminal state per readable request id, on every front (PROTOCOL.md, "Terminal states").

Against a real ``smith-fast serve`` process, over v0 (JSON lines), v1 (framed Envelopes) and gRPC:
each way a request can be refused before it runs is sent on its own connection, and the test asserts
that its request id gets exactly one terminal ``StateChange`` (ERROR), that the refusal says why (an
``ErrorEvent``), and that the connection carries on: a following good request runs to READY. A
duplicate of a running request's id is the exception the rule documents: the refused duplicate gets
its ``ErrorEvent`` only, and the id's one terminal state is the running request's own.
"""

from __future__ import annotations

import json
import pathlib
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from smith_fast.framing import encode_frame
from smith_fast.jsonl import JsonlCodec
from smith_fast.pb import smith_pb2 as pb

from .peers import open_socket
from .server import ServerProcess, assert_clean_log

TOKEN = "tok-5e1d9b0c44a2"
MAX_COMMAND_SIZE = 200
SHELL = pb.CAPABILITY_SHELL_EXEC
TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
_codec = JsonlCodec()


class Wire:
    """A raw client of one protocol: sends commands (or raw bytes), yields the events it reads."""

    protocol = ""

    def command(self, command: pb.Command) -> None:
        raise NotImplementedError

    def raw(self, data: bytes) -> None:
        raise NotImplementedError

    def event(self) -> pb.Event:
        """The next event; EOFError once the service closed."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def handshake(self, caps: tuple[int, ...] = (SHELL,)) -> None:
        self.command(pb.Command(handshake=pb.HandshakeCommand(version=1 if self.protocol != "v0" else 0, capabilities=list(caps))))

    def shell(self, rid: str, command: str) -> None:
        self.command(pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command=command)))


class SocketWire(Wire):
    def __init__(self, address: str, protocol: str) -> None:
        self.protocol = protocol
        self.sock = open_socket(address, 20)
        self.buf = b""

    def command(self, command: pb.Command) -> None:
        if self.protocol == "v0":
            self.raw(_codec.encode_command(command))
        else:
            self.raw(encode_frame(pb.Envelope(command=command).SerializeToString()))

    def raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError("closed")
        self.buf += data

    def event(self) -> pb.Event:
        if self.protocol == "v0":
            while b"\n" not in self.buf:
                self._fill()
            line, self.buf = self.buf.split(b"\n", 1)
            return _codec.decode_event(line)
        while True:
            env = self._envelope()
            if env is not None and env.HasField("event"):
                return env.event

    def _envelope(self) -> pb.Envelope | None:
        while True:
            size, shift, i = 0, 0, 0
            while i < len(self.buf):
                b = self.buf[i]
                size |= (b & 0x7F) << shift
                shift += 7
                i += 1
                if b < 0x80:
                    if len(self.buf) >= i + size:
                        env = pb.Envelope.FromString(self.buf[i : i + size])
                        self.buf = self.buf[i + size :]
                        return env
                    break
            self._fill()

    def close(self) -> None:
        self.sock.close()


class GrpcWire(Wire):
    """A ``Stream`` call with raw bytes both ways (the front's own pass-through method handler)."""

    protocol = "grpc"

    def __init__(self, address: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.channel = grpc.insecure_channel(address.removeprefix("grpc:"))
        self.out: queue.Queue[bytes | None] = queue.Queue()
        stream = self.channel.stream_stream("/smith.v1.SmithService/Stream")
        self.call = stream(self._requests(), metadata=metadata or None)
        self.events: queue.Queue[pb.Event | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self) -> Iterator[bytes]:
        while (item := self.out.get()) is not None:
            yield item

    def _read(self) -> None:
        try:
            for data in self.call:
                env = pb.Envelope.FromString(data)
                if env.HasField("event"):
                    self.events.put(env.event)
                for event in env.batch_event.events:
                    self.events.put(event)
        except grpc.RpcError:
            pass
        self.events.put(None)

    def command(self, command: pb.Command) -> None:
        self.raw(pb.Envelope(command=command).SerializeToString())

    def raw(self, data: bytes) -> None:
        self.out.put(data)

    def event(self) -> pb.Event:
        item = self.events.get(timeout=20)
        if item is None:
            self.events.put(None)
            raise EOFError("call ended")
        return item

    def close(self) -> None:
        self.out.put(None)
        self.call.cancel()
        self.channel.close()


def request_id(event: pb.Event) -> str:
    kind = event.WhichOneof("event_type")
    inner = getattr(event, kind) if kind else None
    return getattr(inner, "request_id", "") or ""


def terminals(events: list[pb.Event], rid: str) -> list[int]:
    return [e.state_change.state for e in events if e.WhichOneof("event_type") == "state_change"
            and e.state_change.request_id == rid and e.state_change.state in TERMINAL]  # fmt: skip


def errors_of(events: list[pb.Event], rid: str | None = None) -> list[pb.ErrorEvent]:
    return [e.error for e in events if e.WhichOneof("event_type") == "error" and (rid is None or e.error.request_id == rid)]


def read_until(wire: Wire, pred: Callable[[pb.Event], bool], into: list[pb.Event]) -> list[pb.Event]:
    while True:
        event = wire.event()
        into.append(event)
        if pred(event):
            return into


def ended(rid: str) -> Callable[[pb.Event], bool]:
    return lambda e: e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == rid and e.state_change.state in TERMINAL


def uid() -> str:
    return str(uuid.uuid4())


# ---- the refusals ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One refusal: ``send(wire, rid)`` makes the service refuse request ``rid`` with an
    ``ErrorEvent`` of ``code`` and (v1, where v0 has no details) ``details["reason"]``."""

    name: str
    protocols: tuple[str, ...]
    send: Callable[[Wire, str], None]
    code: int
    reason: str | None = None


def _v0_line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def before_handshake(wire: Wire, rid: str) -> None:
    wire.shell(rid, "echo never")


def missing_capability(wire: Wire, rid: str) -> None:
    wire.handshake(caps=())
    wire.shell(rid, "echo never")


def unknown_hook_type(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.command(pb.Command(hook_load=pb.HookLoadCommand(request_id=rid, hook_type="cobol", script="x")))


def too_large(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.shell(rid, "echo " + "x" * (MAX_COMMAND_SIZE * 2))


def too_many_requests(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.shell(running := uid(), "sleep 0.5")  # --max-requests 1: this one holds the slot
    wire.shell(rid, "echo never")
    wire.running = running  # type: ignore[attr-defined]


def v0_wrong_field_type(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.raw(_v0_line({"type": "ShellExec", "data": {"request_id": rid, "command": 5}}))


def v0_missing_field(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.raw(_v0_line({"type": "ShellExec", "data": {"request_id": rid}}))


def v0_wrong_map(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.raw(_v0_line({"type": "ShellExec", "data": {"request_id": rid, "command": "true", "env": ["A=1"]}}))


def v0_unknown_type(wire: Wire, rid: str) -> None:
    wire.handshake()
    wire.raw(_v0_line({"type": "ShellExecute", "data": {"request_id": rid, "command": "echo never"}}))


def v0_wrong_type_before_handshake(wire: Wire, rid: str) -> None:
    wire.raw(_v0_line({"type": "ToolCall", "data": {"request_id": rid, "tool": ["fs.read"], "args": {}}}))


ALL = ("v0", "v1", "grpc")
CASES = [
    Case("before_handshake", ALL, before_handshake, pb.ERROR_CODE_UNSPECIFIED, "handshake_required"),
    Case("missing_capability", ALL, missing_capability, pb.ERROR_CODE_INVALID_CAPABILITY),
    Case("unknown_hook_type", ALL, unknown_hook_type, pb.ERROR_CODE_INVALID_CAPABILITY),
    Case("too_large", ALL, too_large, pb.ERROR_CODE_RESOURCE_EXHAUSTED, "too_large"),
    Case("too_many_requests", ALL, too_many_requests, pb.ERROR_CODE_RESOURCE_EXHAUSTED),
    # v0 only: protobuf has no wrongly typed fields (a mismatched wire type is an unknown field)
    # and no unknown command types (an unknown oneof member leaves the command empty: no id).
    Case("wrong_field_type", ("v0",), v0_wrong_field_type, pb.ERROR_CODE_UNSPECIFIED),
    Case("missing_field", ("v0",), v0_missing_field, pb.ERROR_CODE_UNSPECIFIED),
    Case("wrong_map", ("v0",), v0_wrong_map, pb.ERROR_CODE_UNSPECIFIED),
    Case("unknown_type", ("v0",), v0_unknown_type, pb.ERROR_CODE_UNSPECIFIED),
    Case("wrong_type_before_handshake", ("v0",), v0_wrong_type_before_handshake, pb.ERROR_CODE_UNSPECIFIED),
]
PARAMS = [pytest.param(p, c, id=f"{p}-{c.name}") for c in CASES for p in c.protocols]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("terminal")
    srv = ServerProcess(
        tmp, "--grpc", "127.0.0.1:0", "--max-command-size", str(MAX_COMMAND_SIZE), "--max-requests", "1"
    ).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("terminal-token")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--token", TOKEN).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


def connect(server: ServerProcess, protocol: str) -> Wire:
    return GrpcWire(server.grpc) if protocol == "grpc" else SocketWire(server.unix, protocol)


@pytest.mark.parametrize(("protocol", "case"), PARAMS)
def test_a_refused_request_ends_exactly_once_and_the_connection_carries_on(server: ServerProcess, protocol: str, case: Case) -> None:
    wire = connect(server, protocol)
    try:
        rid = uid()
        case.send(wire, rid)
        events = read_until(wire, ended(rid), [])
        running = getattr(wire, "running", None)
        if running is not None:  # the request that held the slot ends on its own
            read_until(wire, ended(running), events)
        # A good request afterwards: the connection carries on (the handshake is repeated, so the
        # cases that refused it or granted nothing are served too).
        wire.handshake()
        good = uid()
        wire.shell(good, "echo fine")
        read_until(wire, ended(good), events)
        assert terminals(events, rid) == [pb.SERVICE_STATE_ERROR], events
        refusals = errors_of(events, rid)
        assert [e.error_code for e in refusals] == [case.code], refusals
        if case.reason is not None and protocol != "v0":
            assert refusals[0].details["reason"] == case.reason
        assert terminals(events, good) == [pb.SERVICE_STATE_READY]
        if running is not None:
            assert terminals(events, running) == [pb.SERVICE_STATE_READY]
    finally:
        wire.close()


def _running_then(wire: Wire, rid: str, refuse: Callable[[], None]) -> list[pb.Event]:
    wire.handshake()
    wire.shell(rid, "sleep 0.5; echo once")
    events = read_until(wire, lambda e: e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == rid, [])
    assert events[-1].state_change.state == pb.SERVICE_STATE_PROCESSING
    refuse()
    return read_until(wire, ended(rid), events)


DUPLICATES = {
    "same_command": lambda wire, rid: wire.shell(rid, "echo twice"),
    "too_large": lambda wire, rid: wire.shell(rid, "echo " + "x" * (MAX_COMMAND_SIZE * 2)),
    "missing_capability": lambda wire, rid: wire.command(pb.Command(hook_load=pb.HookLoadCommand(request_id=rid, hook_type="cobol"))),
    "v0_wrong_field_type": lambda wire, rid: wire.raw(_v0_line({"type": "ShellExec", "data": {"request_id": rid, "command": 5}})),
}


@pytest.mark.parametrize(
    ("protocol", "dup"),
    [pytest.param(p, d, id=f"{p}-{d}") for d in DUPLICATES for p in (("v0",) if d.startswith("v0") else ("v0", "v1", "grpc"))],
)
def test_a_refused_duplicate_leaves_the_running_requests_one_terminal_state(server: ServerProcess, protocol: str, dup: str) -> None:
    wire = connect(server, protocol)
    try:
        rid = uid()
        events = _running_then(wire, rid, lambda: DUPLICATES[dup](wire, rid))
        good = uid()
        wire.shell(good, "echo fine")
        read_until(wire, ended(good), events)
        assert terminals(events, rid) == [pb.SERVICE_STATE_READY]  # the running request's own
        out = "".join(e.shell_output.stdout for e in events if e.WhichOneof("event_type") == "shell_output" and request_id(e) == rid)
        assert out == "once\n"
        assert len(errors_of(events, rid)) == 1  # the duplicate's refusal, naming the id
        assert terminals(events, good) == [pb.SERVICE_STATE_READY]
    finally:
        wire.close()


@pytest.mark.parametrize("protocol", ["v0", "v1", "grpc"])
def test_a_request_refused_for_want_of_the_token_ends_then_the_connection_closes(guarded: ServerProcess, protocol: str) -> None:
    wire = connect(guarded, protocol)
    try:
        rid = uid()
        wire.shell(rid, "touch should-not-exist")
        events: list[pb.Event] = []
        with pytest.raises(EOFError):
            read_until(wire, lambda e: False, events)
        assert terminals(events, rid) == [pb.SERVICE_STATE_ERROR]
        assert [e.error_code for e in errors_of(events)] == [pb.ERROR_CODE_PERMISSION_DENIED]
        assert not (pathlib.Path(guarded.root) / "should-not-exist").exists()
    finally:
        wire.close()


def test_only_a_request_sends_a_request_terminal_state() -> None:
    """In the service, a request's terminal state (``READY``/``ERROR`` naming a request id) is sent
    by ``Request`` (service/request.py) only: ``finish``, or ``refuse`` for one that never ran.
    Any other ``state_change(READY|ERROR, rid)`` would be a second place that can end a request."""
    import ast
    import pathlib

    service = pathlib.Path(__file__).resolve().parent.parent / "smith_fast" / "service"
    senders: list[str] = []
    for path in sorted(service.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "state_change"
                and len(node.args) == 2
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr in ("SERVICE_STATE_READY", "SERVICE_STATE_ERROR")
            ):
                senders.append(f"{path.name}:{node.lineno}")
    assert senders and {s.split(":")[0] for s in senders} <= {"request.py", "sinks.py"}, senders
