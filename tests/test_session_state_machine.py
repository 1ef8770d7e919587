"""A hypothesis state machine of one client session against a real ``smith-fast serve`` process.

A raw socket peer (no SDK, protobuf's own varint codec for v1, plain JSON for v0) interleaves
handshakes (valid and invalid versions, known, unavailable and unknown capabilities), short shell
commands (some with timeouts), tool calls (valid, failing, unknown tools, bad or deeply nested
arguments), well-framed garbage and shutdowns (some with a command right behind them in the same
write), which end the session; the next step then opens a new connection. Checked throughout:

* every request gets exactly one terminal ``StateChange`` (READY or ERROR), and no event of a
  request follows its terminal state; no terminal state names a request that was never sent (one
  sent right behind a Shutdown gets at most one);
* every piece of garbage gets an Error event, and the service never hangs up unless told to;
* v1 sequence numbers strictly increase within a session;
* the server process never dies;
* after each session, the server holds no more file descriptors than before it and has no child
  processes left.
"""

from __future__ import annotations

import json
import pathlib
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, fd_count, fd_links, wait_until

TERMINAL = {"Ready", "Error"}
_STATE_NAMES = {
    pb.SERVICE_STATE_STARTING: "Starting",
    pb.SERVICE_STATE_READY: "Ready",
    pb.SERVICE_STATE_PROCESSING: "Processing",
    pb.SERVICE_STATE_ERROR: "Error",
    pb.SERVICE_STATE_SHUTTING: "Shutting",
}
_V0_CAPABILITIES = {pb.CAPABILITY_SHELL_EXEC: "shell_exec", pb.CAPABILITY_HOOKS_JS: "hooks_js",
                    pb.CAPABILITY_NATS: "nats", pb.CAPABILITY_TRACING: "tracing"}  # fmt: skip
SHELL_COMMANDS = ["true", "echo hi", "exit 3", "printf 'a\\nb'", "echo oops >&2", "sleep 0.3", "head -c 3000 /dev/zero"]
# (tool, v1 args bytes); v0 sends the same JSON as a value, and skips what is not JSON
TOOL_CALLS = [
    ("tools.list", b""),
    ("fs.list", b'{"path":"."}'),
    ("fs.read", b'{"path":"present.txt"}'),
    ("fs.read", b'{"path":"missing.txt"}'),
    ("fs.read", b'{"path":"../../../etc/passwd"}'),
    ("fs.read", b'{"no_such_argument":1}'),
    ("no.such.tool", b"{}"),
    ("fs.list", b"{not json"),
    ("fs.list", b"\xff\xfe"),
    ("tools.list", b"[" * 5000 + b"]" * 5000),
]


@dataclass
class Event:
    """One event as the checks see it, whatever the wire protocol."""

    kind: str
    request_id: str | None
    state: str | None = None
    sequence: int | None = None


class Peer:
    """A raw connection speaking v1 frames or v0 lines; ``poll`` returns whatever events have arrived."""

    def __init__(self, path: str, version: int) -> None:
        self.version = version
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""
        self.eof = False
        self.sent = 0

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.eof = True
            self.lost()
        self.sent += len(data)

    def lost(self) -> NoReturn:
        """Fail: the service hung up on its own (one place, so that every sighting fails alike)."""
        raise AssertionError("the service closed the connection without a Shutdown")

    def command(self, *commands: pb.Command) -> None:
        """Send ``commands`` in one write (so the service reads them together)."""
        self.send_raw(b"".join(map(self.encode, commands)))

    def encode(self, command: pb.Command) -> bytes:
        if self.version == 1:
            env = pb.Envelope(timestamp=int(time.time() * 1000), sequence=self.sent + 1)
            env.command.CopyFrom(command)
            data = env.SerializeToString()
            return _VarintBytes(len(data)) + data
        kind = command.WhichOneof("command_type")
        m = getattr(command, kind)
        if kind == "handshake":
            caps = [_V0_CAPABILITIES.get(c, f"unknown_{c}") for c in m.capabilities]
            obj: dict[str, Any] = {"type": "Handshake", "data": {"version": m.version, "capabilities": caps}}
        elif kind == "shell_exec":
            obj = {"type": "ShellExec", "data": {"request_id": m.request_id, "command": m.command, "shell": None,
                                                 "cwd": None, "env": dict(m.env),
                                                 "timeout_ms": m.timeout_ms if m.HasField("timeout_ms") else None}}
        elif kind == "tool_call":
            args = json.loads(m.args) if m.args else {}
            obj = {"type": "ToolCall", "data": {"request_id": m.request_id, "tool": m.tool, "args": args,
                                                "timeout_ms": None}}
        else:
            obj = {"type": "Shutdown"}
        return json.dumps(obj).encode() + b"\n"

    def _read(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except (TimeoutError, BlockingIOError):
            return
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        self.buf += data

    def _parse(self) -> Iterator[Event]:
        while self.buf:
            if self.version == 0:
                line, nl, rest = self.buf.partition(b"\n")
                if not nl:
                    return
                self.buf = rest
                msg = json.loads(line)
                data = msg.get("data") or {}
                yield Event(msg["type"], data.get("request_id"), data.get("state"))
                continue
            try:
                size, pos = _DecodeVarint(self.buf, 0)
            except IndexError:
                return
            if len(self.buf) < pos + size:
                return
            env = pb.Envelope.FromString(self.buf[pos : pos + size])
            self.buf = self.buf[pos + size :]
            which = env.event.WhichOneof("event_type")
            if which is None:  # not an event (a health check answer ...): seen, carries no request
                yield Event(str(env.WhichOneof("payload")), None, None, env.sequence)
                continue
            m = getattr(env.event, which)
            field = m.DESCRIPTOR.fields_by_name.get("request_id")
            rid = None
            if field is not None and (m.HasField("request_id") if field.has_presence else m.request_id):
                rid = m.request_id
            state = _STATE_NAMES.get(m.state) if which == "state_change" else None
            yield Event({"state_change": "StateChange", "ready": "Ready", "error": "Error"}.get(which, which), rid,
                        state, env.sequence)  # fmt: skip

    def poll(self, timeout: float = 0.0) -> list[Event]:
        if not self.eof:
            self._read(timeout)
        return list(self._parse())

    def until_eof(self, timeout: float = 15.0) -> list[Event]:
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while not self.eof:
            assert time.monotonic() < deadline, "the service did not close the connection after Shutdown"
            events += self.poll(0.2)
        return events + list(self._parse())


class SessionMachine(RuleBasedStateMachine):
    """One session at a time against :attr:`server`; :attr:`protocol` is 1 (frames) or 0 (lines)."""

    server: ServerProcess
    protocol: int
    fd_baseline: int

    def __init__(self) -> None:
        super().__init__()
        self.peer: Peer | None = None
        self._open()

    # ---- bookkeeping ---------------------------------------------------------------------------

    def _open(self) -> None:
        self.peer = Peer(self.server.sock_path, self.protocol)
        self.handshaken = False
        self.requests: list[str] = []
        self.late: list[str] = []
        self.terminal: dict[str, str] = {}
        self.last_sequence = 0

    def _record(self, events: list[Event]) -> None:
        for ev in events:
            if ev.sequence is not None:
                assert ev.sequence > self.last_sequence, f"sequence {ev.sequence} after {self.last_sequence}"
                self.last_sequence = ev.sequence
            rid = ev.request_id
            if not rid:
                continue
            assert rid not in self.terminal, f"{ev} after the terminal state of {rid}"
            if ev.kind == "StateChange" and ev.state in TERMINAL:
                assert rid in self.requests or rid in self.late, f"a terminal state for a request never sent: {ev}"
                self.terminal[rid] = ev.state

    def _finish(self, events: list[Event]) -> None:
        """The connection is over: every request has its one terminal state; nothing leaked."""
        assert self.peer is not None
        self._record(events)
        self.peer.close()
        self.peer = None
        missing = [rid for rid in self.requests if rid not in self.terminal]
        assert not missing, f"requests without a terminal StateChange: {missing}"
        pid = self.server.pid
        assert wait_until(lambda: not self.server.children(), 10), f"children left: {self.server.children()}"
        assert wait_until(lambda: fd_count(pid) <= self.fd_baseline, 10), (
            f"{fd_count(pid)} fds open, {self.fd_baseline} before the session: {fd_links(pid)}"
        )

    def _await_error(self, timeout: float = 5.0) -> None:
        """Wait for the Error event that answers a piece of garbage (or notice at once that the
        service hung up instead, so that such a failure always shows at the same step)."""
        assert self.peer is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self.peer.poll(0.05)
            self._record(events)
            if any(ev.kind == "Error" and ev.request_id is None for ev in events):
                return
            if self.peer.eof:
                self.peer.lost()
        raise AssertionError("garbage got no Error event")

    def _request_id(self) -> str:
        rid = str(uuid.uuid4())
        self.requests.append(rid)
        return rid

    def _ensure_open(self) -> Peer:
        if self.peer is None:
            self._open()
        assert self.peer is not None
        return self.peer

    # ---- rules -----------------------------------------------------------------------------------

    @initialize(first=st.sampled_from(["handshake", "handshake", "handshake", "none"]))
    def begin(self, first: str) -> None:
        """Most sessions start with a good handshake, so that requests run rather than bounce."""
        if first == "handshake":
            self.handshake(self.protocol, [pb.CAPABILITY_SHELL_EXEC])

    @rule(
        version=st.sampled_from([1, 1, 0, 2, 77]),
        caps=st.lists(st.sampled_from([pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS,
                                       pb.CAPABILITY_NATS, 42]), max_size=3),
    )  # fmt: skip
    def handshake(self, version: int, caps: list[int]) -> None:
        if self.protocol == 0 and 42 in caps:
            caps = [c for c in caps if c != 42] + [pb.CAPABILITY_TRACING]
        self._ensure_open().command(pb.Command(handshake=pb.HandshakeCommand(version=version, capabilities=caps)))
        if version == self.protocol or (self.protocol == 0 and version == 1):
            self.handshaken = True

    @rule(command=st.sampled_from(SHELL_COMMANDS), timeout_ms=st.sampled_from([None, None, 100]))
    def shell_exec(self, command: str, timeout_ms: int | None) -> None:
        peer = self._ensure_open()
        cmd = pb.ShellExecCommand(request_id=self._request_id(), command=command)
        if timeout_ms is not None:
            cmd.timeout_ms = timeout_ms
        peer.command(pb.Command(shell_exec=cmd))

    @rule(call=st.sampled_from(TOOL_CALLS))
    def tool_call(self, call: tuple[str, bytes]) -> None:
        tool, args = call
        peer = self._ensure_open()
        if self.protocol == 0:
            try:
                json.loads(args or b"{}")
            except (ValueError, RecursionError):
                args = b'{"path":7}'  # v0 args are JSON values: send a wrongly typed one instead
        peer.command(pb.Command(tool_call=pb.ToolCallCommand(request_id=self._request_id(), tool=tool, args=args)))

    @rule(data=st.binary(max_size=64), shape=st.integers(0, 3))
    def garbage(self, data: bytes, shape: int) -> None:
        """Well-framed junk: an Error event each, and the session carries on."""
        peer = self._ensure_open()
        if self.protocol == 1:
            if shape == 1:
                event = pb.Event(log=pb.LogEvent(message="from a client"))  # a client sends no events
                data = pb.Envelope(sequence=3, event=event).SerializeToString()
            elif shape == 2:
                data = pb.Envelope(timestamp=5).SerializeToString()  # no payload at all
            else:
                try:
                    env = pb.Envelope.FromString(data)
                except DecodeError:
                    pass
                else:
                    if env.WhichOneof("payload") not in (None, "event"):
                        # Random bytes must never become a command that runs (or a health check
                        # or anything else the service answers): 0xFF is an invalid wire type.
                        data = b"\xff" + data
            if len(data) == 0x7B:
                data += b"\x00"  # a 123-byte frame starts with "{": keep the sniffer on v1
            if not data and not peer.sent:
                data = b"\xff"  # the service tells v0 from v1 by two bytes: it waits for a second one
            peer.send_raw(_VarintBytes(len(data)) + data)
            self._await_error()
            return
        if shape == 1:
            line = b'{"type":"FlyToTheMoon","data":{}}'
        elif shape == 2:
            line = b'{"type":"ShellExec","data":{"request_id":"not-a-uuid","command":"true","env":{}}}'
        elif shape == 3 and peer.sent:
            # Found by fuzz_jsonl: brackets only inside a string used to drop the connection.
            line = b'"' + b"[" * 200 + b'"'
        else:
            line = b'{"' + data.replace(b"\n", b" ")  # starts like JSON so the sniffer picks v0
        peer.send_raw(line + b"\n")
        self._await_error()

    @rule(late=st.sampled_from([None, None, "sleep 5", "true"]))
    def shutdown(self, late: str | None) -> None:
        """Shutdown, maybe with a shell command right behind it in the same write."""
        peer = self._ensure_open()
        commands = [pb.Command(shutdown=pb.ShutdownCommand())]
        if late is not None:
            rid = str(uuid.uuid4())
            self.late.append(rid)  # raced with the shutdown: at most one terminal state, no leak
            commands.append(pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command=late)))
        peer.command(*commands)
        if not self.handshaken:
            if late is not None:
                self.requests.append(self.late.pop())  # refused before the handshake, like any other
            return  # the session goes on
        self._finish(peer.until_eof())

    @precondition(lambda self: self.peer is not None)
    @rule()
    def wait_a_little(self) -> None:
        assert self.peer is not None
        self._record(self.peer.poll(0.05))

    # ---- invariants --------------------------------------------------------------------------------

    @invariant()
    def server_alive_and_consistent(self) -> None:
        assert self.server.proc is not None and self.server.proc.poll() is None, "the server died"
        if self.peer is not None:
            self._record(self.peer.poll())
            if self.peer.eof:
                self.peer.lost()

    def teardown(self) -> None:
        peer = self.peer
        if peer is None:
            return
        if peer.eof:
            peer.close()
            peer.lost()
        # Let the requests end on their own (the shutdown rule covers cancelling them midway).
        deadline = time.monotonic() + 10
        while any(rid not in self.terminal for rid in self.requests) and time.monotonic() < deadline:
            self._record(peer.poll(0.1))
        if not self.handshaken:
            self._finish([])  # a Shutdown would be refused: just disconnect
            return
        peer.command(pb.Command(shutdown=pb.ShutdownCommand()))
        self._finish(peer.until_eof())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("state-machine")
    (tmp / "present.txt").write_text("hello\n")
    srv = ServerProcess(tmp, "--max-frame-size", "64k", "--kill-grace", "0.5").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def _warm_up(srv: ServerProcess) -> int:
    """Run one of each request once, so lazily opened fds count in the baseline; return it."""
    peer = Peer(srv.sock_path, 1)
    peer.command(pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC])))
    peer.command(pb.Command(shell_exec=pb.ShellExecCommand(request_id=str(uuid.uuid4()), command="true")))
    peer.command(pb.Command(tool_call=pb.ToolCallCommand(request_id=str(uuid.uuid4()), tool="tools.list")))
    time.sleep(0.5)
    peer.command(pb.Command(shutdown=pb.ShutdownCommand()))
    peer.until_eof()
    peer.close()
    assert wait_until(lambda: not srv.children(), 10)
    time.sleep(0.2)
    return fd_count(srv.pid)


@pytest.mark.parametrize("protocol", [1, 0], ids=["v1", "v0"])
def test_session_state_machine(server: ServerProcess, protocol: int) -> None:
    machine = type(f"SessionMachineV{protocol}", (SessionMachine,), {
        "server": server, "protocol": protocol, "fd_baseline": _warm_up(server),
    })  # fmt: skip
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=40,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
    assert server.proc is not None and server.proc.poll() is None
