"""A recorded session that had bad input replays with no difference against the same service.

A real ``smith-fast serve --record`` process records a v0 and a v1 session, each sending every kind
of bad input the service answers (malformed JSON, invalid UTF-8, an unknown command type, wrongly
typed and missing fields, frames that are not an Envelope, empty commands and envelopes, commands
before the handshake, unknown capabilities, oversize lines, commands and frames, too many requests,
a duplicate id ...) between good requests. ``smith-fast replay LOG --spawn`` (the real CLI, a real
spawned service with the same limits) must then find no difference (exit 0), and a service with
another limit must (exit 1). With a token, the token is in no record, raw ones included.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import uuid

import pytest

from smith_fast.framing import encode_frame, encode_varint
from smith_fast.jsonl import JsonlCodec
from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import read_log
from smith_fast.replay.format import RECORD_IN_DISCARDED, RECORD_IN_LINE, RECORD_IN_MALFORMED

from .peers import open_socket
from .server import ServerProcess, assert_clean_log, wait_until
from harness.server import beside

LIMITS = ("--max-frame-size", "4096", "--max-command-size", "300", "--max-requests", "2")
TOKEN = "tok-7c2e0d91a4b3"
_codec = JsonlCodec()


def uid() -> str:
    return str(uuid.uuid4())


def replay_cli(log: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smith_fast", "replay", str(log), "--spawn", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


class Peer:
    """A raw client that reads everything the service says while it sends: ``exchange`` sends some
    bytes and reads until ``done`` holds for what arrived (the session's order is then fixed)."""

    def __init__(self, address: str, protocol: str) -> None:
        self.sock = open_socket(address, 20)
        self.protocol = protocol
        self.buf = b""
        self.events: list[pb.Event] = []

    def _one(self) -> pb.Event | None:
        if self.protocol == "v0":
            if b"\n" not in self.buf:
                return None
            line, self.buf = self.buf.split(b"\n", 1)
            return _codec.decode_event(line)
        size, shift, i = 0, 0, 0
        while i < len(self.buf):
            b = self.buf[i]
            size |= (b & 0x7F) << shift
            shift += 7
            i += 1
            if b < 0x80:
                if len(self.buf) < i + size:
                    return None
                env = pb.Envelope.FromString(self.buf[i : i + size])
                self.buf = self.buf[i + size :]
                return env.event if env.HasField("event") else pb.Event()
        return None

    def read_until(self, done) -> None:  # type: ignore[no-untyped-def]
        while not done(self.events):
            event = self._one()
            if event is not None:
                self.events.append(event)
                continue
            data = self.sock.recv(1 << 16)
            if not data:
                return
            self.buf += data

    def exchange(self, data: bytes, done) -> None:  # type: ignore[no-untyped-def]
        self.sock.sendall(data)
        self.read_until(done)

    def command(self, command: pb.Command) -> bytes:
        if self.protocol == "v0":
            return _codec.encode_command(command)
        return encode_frame(pb.Envelope(command=command).SerializeToString())


def count(kind: str, n: int):  # type: ignore[no-untyped-def]
    """``done``: ``n`` events of ``kind`` have arrived in all."""
    return lambda events: sum(e.WhichOneof("event_type") == kind for e in events) >= n


def ended(rid: str):  # type: ignore[no-untyped-def]
    return lambda events: any(
        e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == rid
        and e.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR) for e in events
    )  # fmt: skip


def shell(rid: str, command: str) -> pb.Command:
    return pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command=command))


def handshake(version: int, caps: list[int], **client_info: str) -> pb.Command:
    return pb.Command(handshake=pb.HandshakeCommand(version=version, capabilities=caps, client_info=client_info))


def v0_line(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def v0_session(peer: Peer, token: str | None = None) -> None:
    """Every kind of bad v0 input, each answered before the next is sent."""
    errors = 0

    def bad(data: bytes) -> None:
        nonlocal errors
        errors += 1
        peer.exchange(data, count("error", errors))

    if token is None:
        before = uid()  # a command before the handshake
        errors += 1
        peer.exchange(peer.command(shell(before, "echo early")), ended(before))
    bad(b'{"type":"Handshake","data":{"version":0,"capabilities":["shell_exec", oops\n')  # malformed JSON
    bad(b'{"type": "Shell\xff\xfe"}\n')  # invalid UTF-8
    bad(b"[1, 2, 3]\n")  # not an object
    bad(b"{}\n")  # no type
    bad(v0_line({"type": "ShellExec"}))  # an empty command: no data
    hs = {"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec", "teleport"]}}  # an unknown capability
    if token is not None:
        hs["data"]["token"] = token
    errors += 1
    peer.exchange(v0_line(hs), count("ready", 1))
    for line in (
        {"type": "Teleport", "data": {"request_id": (rid := uid())}},  # an unknown command type
        {"type": "ShellExec", "data": {"request_id": uid(), "command": 5}},  # a wrongly typed field
        {"type": "ShellExec", "data": {"request_id": uid()}},  # a missing field
        {"type": "ToolCall", "data": {"request_id": uid(), "tool": "fs.read", "args": {}, "timeout_ms": "soon"}},
        {"type": "ShellExec", "data": {"request_id": "not-a-uuid", "command": "true"}},  # an id that is not a UUID
    ):
        errors += 1
        rid = line["data"]["request_id"]  # type: ignore[index]
        peer.exchange(v0_line(line), ended(rid) if rid != "not-a-uuid" else count("error", errors))
    bad(b'{"type":"ShellExec","data":{"request_id":"' + uid().encode() + b'","command":"' + b"x" * 5000 + b'"}}\n')  # oversize line
    errors += 1
    peer.exchange(peer.command(shell(big := uid(), "echo " + "y" * 400)), ended(big))  # oversize command
    errors += 1
    peer.exchange(peer.command(pb.Command(hook_load=pb.HookLoadCommand(request_id=(hook := uid()), hook_type="js", script="x"))), ended(hook))
    if token is not None:  # a malformed line holding the token where it cannot be parsed
        bad(b'{"type":"Handshake","data":{"version":0,"token":"' + token.encode() + b'", oops\n')
    slow, dup, third = uid(), uid(), uid()
    peer.exchange(peer.command(shell(slow, "sleep 0.3; echo slow")) + peer.command(shell(dup, "sleep 0.3; echo dup")),
                  count("state_change", sum(e.WhichOneof("event_type") == "state_change" for e in peer.events) + 2))
    errors += 2
    peer.exchange(peer.command(shell(dup, "echo again")) + peer.command(shell(third, "echo too many")), ended(third))  # duplicate, too many
    peer.read_until(lambda events: ended(slow)(events) and ended(dup)(events))
    good = uid()
    peer.exchange(peer.command(shell(good, "echo good")), ended(good))
    peer.exchange(peer.command(pb.Command(shutdown=pb.ShutdownCommand())), lambda events: False)  # until the service closes


def v1_session(peer: Peer, token: str | None = None) -> None:
    """Every kind of bad v1 input, each answered before the next is sent; the last one breaks the framing."""
    errors = 0

    def bad(data: bytes) -> None:
        nonlocal errors
        errors += 1
        peer.exchange(data, count("error", errors))

    if token is None:
        before = uid()
        errors += 1
        peer.exchange(peer.command(shell(before, "echo early")), ended(before))
    bad(encode_frame(b"\xff\xff\xff\xff"))  # a frame that is not an Envelope
    bad(encode_frame(b"\x1a\x05\x12\x03\x0a\x01"))  # a Command whose ShellExec is cut short
    info = {"token": token} if token is not None else {}
    errors += 1
    peer.exchange(peer.command(handshake(1, [pb.CAPABILITY_SHELL_EXEC, 99], **info)), count("ready", 1))  # an unknown capability
    bad(encode_frame(pb.Envelope(command=pb.Command()).SerializeToString()))  # an empty command
    bad(encode_frame(pb.Envelope().SerializeToString()))  # an empty envelope
    env = pb.Envelope()
    env.health_check_request.service_name = ""
    bad(encode_frame(env.SerializeToString()))  # a health check not asked for
    bad(peer.command(handshake(0, [])))  # version 0 on a v1 connection
    bad(peer.command(shell("", "echo no id")))  # an empty request id
    if token is not None:
        bad(encode_frame(b"\xff" + token.encode()))  # a broken frame holding the token
    errors += 1
    peer.exchange(peer.command(shell(big := uid(), "echo " + "y" * 400)), ended(big))  # oversize command
    errors += 1
    peer.exchange(peer.command(pb.Command(hook_load=pb.HookLoadCommand(request_id=(hook := uid()), hook_type="cobol"))), ended(hook))
    slow, dup, third = uid(), uid(), uid()
    peer.exchange(peer.command(shell(slow, "sleep 0.3; echo slow")) + peer.command(shell(dup, "sleep 0.3; echo dup")),
                  count("state_change", sum(e.WhichOneof("event_type") == "state_change" for e in peer.events) + 2))
    errors += 2
    peer.exchange(peer.command(shell(dup, "echo again")) + peer.command(shell(third, "echo too many")), ended(third))
    peer.read_until(lambda events: ended(slow)(events) and ended(dup)(events))
    good = uid()
    peer.exchange(peer.command(shell(good, "echo good")), ended(good))
    peer.exchange(encode_varint(1 << 20), lambda events: False)  # an oversize frame: the stream is closed


def record(server: ServerProcess, protocol: str, directory: pathlib.Path, token: str | None = None) -> pathlib.Path:
    def new() -> list[pathlib.Path]:
        return [p for p in directory.glob("*.smithrec") if p not in before]

    before = set(directory.glob("*.smithrec")) if directory.exists() else set()
    peer = Peer(server.unix, protocol)
    (v0_session if protocol == "v0" else v1_session)(peer, token)
    peer.sock.close()
    assert wait_until(lambda: len(new()) == 1)
    (log,) = new()
    # the service closed the connection; its log is complete once its last event (SHUTTING) is in
    assert wait_until(lambda: _ends_shutting(log))
    return log


def _ends_shutting(log: pathlib.Path) -> bool:
    records = read_log(log)[1]
    if not records or records[-1].inbound:
        return False
    return records[-1].parse().event.state_change.state == pb.SERVICE_STATE_SHUTTING


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("bad-input")
    srv = ServerProcess(tmp, "--record", str(beside(tmp, "rec")), *LIMITS).start()
    srv.rec = beside(tmp, "rec")  # type: ignore[attr-defined]
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("bad-input-token")
    srv = ServerProcess(tmp, "--record", str(beside(tmp, "rec")), "--token", TOKEN, *LIMITS).start()
    srv.rec = beside(tmp, "rec")  # type: ignore[attr-defined]
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


@pytest.mark.parametrize("protocol", ["v0", "v1"])
def test_a_session_with_bad_input_replays_with_no_difference(server: ServerProcess, protocol: str) -> None:
    log = record(server, protocol, server.rec)  # type: ignore[attr-defined]
    kinds = {r.direction for r in read_log(log)[1]}
    assert RECORD_IN_MALFORMED in kinds and RECORD_IN_DISCARDED in kinds
    assert (RECORD_IN_LINE in kinds) == (protocol == "v0")
    same = replay_cli(log, "--fast", "--serve-args", " ".join(LIMITS))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "identical" in same.stdout
    # A changed service: the oversize command now runs, and that shows.
    changed = replay_cli(log, "--fast", "--serve-args", " ".join(LIMITS[:2]) + " --max-command-size 100000 --max-requests 2")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "y" * 50 in changed.stdout


@pytest.mark.parametrize("protocol", ["v0", "v1"])
def test_the_token_stays_out_of_raw_records(guarded: ServerProcess, protocol: str) -> None:
    log = record(guarded, protocol, guarded.rec, TOKEN)  # type: ignore[attr-defined]
    data = log.read_bytes()
    assert TOKEN.encode() not in data
    assert b"<redacted>" in data
    same = replay_cli(log, "--fast", "--token", TOKEN, "--serve-args", " ".join(LIMITS))
    assert same.returncode == 0, same.stdout + same.stderr
    printed = subprocess.run([sys.executable, "-m", "smith_fast", "replay", str(log), "--print"], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and TOKEN not in printed.stdout
    assert any(json.loads(line).get("kind") == "malformed" for line in printed.stdout.splitlines())


def test_format_1_logs_are_still_read(tmp_path: pathlib.Path) -> None:
    """A log written before the raw kinds existed (format 1: Envelopes only, a v0 line as its decoded
    command) reads as it did; a raw kind in a format 1 file can only be damage: reading stops there."""
    from smith_fast.replay import SessionRecorder
    from smith_fast.replay.format import HEADER_FIXED, crc

    rec = SessionRecorder.open(tmp_path, session_id="old", protocol_version=0, service_id="s")
    rec.record_command(shell(rid := uid(), "echo old"))
    rec.record_line(b'{"type":"Shutdown"}')
    rec.close()
    data = bytearray(rec.path.read_bytes())
    magic, _, reserved, size, checksum = HEADER_FIXED.unpack_from(data)
    data[: HEADER_FIXED.size] = HEADER_FIXED.pack(magic, 1, reserved, size, checksum)
    header, records, torn = read_log(bytes(data))
    assert header.format_version == 1 and crc(bytes(data[HEADER_FIXED.size : HEADER_FIXED.size + size])) == checksum
    assert [r.parse().command.shell_exec.request_id for r in records] == [rid]
    assert torn is not None and torn.reason == "unknown record kind 2"
    header, records, torn = read_log(rec.path)  # as written: format 2, both records
    assert header.format_version == 2 and torn is None
    assert [r.kind for r in records] == ["in", "line"]


def test_a_grpc_session_with_bad_messages_replays_with_no_difference(tmp_path: pathlib.Path) -> None:
    """A gRPC ``Stream`` is recorded as a v1 session: its messages that are not an Envelope too."""
    import grpc

    srv = ServerProcess(tmp_path, "--record", str(beside(tmp_path, "rec")), "--grpc", "127.0.0.1:0", *LIMITS).start()
    try:
        rid, hook = uid(), uid()
        messages = [
            b"\xff\xff\xff\xff",  # not an Envelope
            pb.Envelope(command=handshake(1, [pb.CAPABILITY_SHELL_EXEC, 99])).SerializeToString(),
            b"\x0a",  # cut short
            pb.Envelope(command=pb.Command()).SerializeToString(),  # an empty command
            pb.Envelope(command=pb.Command(hook_load=pb.HookLoadCommand(request_id=hook, hook_type="cobol"))).SerializeToString(),
            pb.Envelope(command=shell(rid, "echo via grpc")).SerializeToString(),
        ]
        with grpc.insecure_channel(srv.grpc.removeprefix("grpc:")) as channel:
            call = channel.stream_stream("/smith.v1.SmithService/Stream")(iter(messages))
            replies = [pb.Envelope.FromString(data) for data in call]  # half-closed: ends once rid ended
        assert any(e.event.state_change.request_id == rid and e.event.state_change.state == pb.SERVICE_STATE_READY for e in replies)
        assert wait_until(lambda: len(list(beside(tmp_path, "rec").glob("*.smithrec"))) == 1)
        (log,) = beside(tmp_path, "rec").glob("*.smithrec")
        assert wait_until(lambda: sum(not r.inbound for r in read_log(log)[1]) == len(replies))
        assert [r.kind for r in read_log(log)[1] if r.inbound] == ["malformed", "in", "malformed", "in", "in", "in"]
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)
    same = replay_cli(log, "--fast", "--serve-args", " ".join(LIMITS))
    assert same.returncode == 0, same.stdout + same.stderr
