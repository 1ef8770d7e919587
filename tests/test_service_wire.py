"""The service on the wire, without our SDK: raw v0 JSON lines, raw v1 frames, hostile input, limits."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import time
import uuid

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast import containment
from smith_fast.sandbox import zygote
from smith_fast.pb import smith_pb2 as pb

from .peers import V0Peer, V1Peer
from harness.server import ServerProcess, descendants, fd_count, session_sandboxes, spare_cells, wait_until

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"wire-{request.param}")
    srv = ServerProcess(tmp, "--max-frame-size", "64k", "--max-output", "100k", loop=request.param).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


class JsonLines(V0Peer):
    """A raw v0 peer on the server's Unix socket (plain ``json``, not our codec)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"unix:{path}")


class Frames(V1Peer):
    """A raw v1 peer framed with protobuf's own varint codec (not smith_fast.framing)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"unix:{path}")


def test_raw_v0_session(server: ServerProcess) -> None:
    peer = JsonLines(server.sock_path)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
    msgs = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["state"] == "Ready")
    types = [m["type"] for m in msgs]
    assert types == ["StateChange", "Ready", "StateChange"]
    assert msgs[0]["data"]["state"] == "Starting" and msgs[0]["data"]["request_id"] is None
    ready = msgs[1]["data"]
    assert ready["version"] == 0 and ready["capabilities"] == ["shell_exec"]
    assert UUID_RE.match(ready["service_id"])
    rid = str(uuid.uuid4())
    peer.send({"type": "ShellExec", "data": {"request_id": rid, "command": "echo hi; echo oops >&2; exit 2",
                                            "shell": None, "cwd": None, "env": {}, "timeout_ms": None}})
    msgs = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["state"] in ("Ready", "Error"))
    outs = [m["data"] for m in msgs if m["type"] == "ShellOutput"]
    assert all(o["request_id"] == rid for o in outs)
    assert "".join(o["stdout"] or "" for o in outs) == "hi\n"
    assert "".join(o["stderr"] or "" for o in outs) == "oops\n"
    final = outs[-1]
    assert final == {"request_id": rid, "stdout": None, "stderr": None, "exit_code": 2, "finished": True}
    assert msgs[0] == {"type": "StateChange", "data": {"request_id": rid, "state": "Processing", "timestamp": msgs[0]["data"]["timestamp"]}}

    # a tool call: args is a JSON value in v0, and so is the result
    rid = str(uuid.uuid4())
    peer.send({"type": "ToolCall", "data": {"request_id": rid, "tool": "fs.list", "args": {"path": "."}, "timeout_ms": None}})
    msgs = peer.until(lambda m: m["type"] == "ToolResult")
    result = msgs[-1]["data"]
    assert result["request_id"] == rid and result["success"] is True and result["error"] is None
    assert isinstance(result["result"], dict) and "entries" in result["result"]

    # bad input: each gets an Error line and the session carries on
    peer.send_raw(b"{this is not json}\n")
    err = peer.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert err["error_code"] == "UNSPECIFIED" and "JSON" in err["message"]
    peer.send({"type": "FlyToTheMoon", "data": {}})
    err = peer.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert "FlyToTheMoon" in err["message"]
    peer.send({"type": "ShellExec", "data": {"request_id": "not-a-uuid", "command": "true", "env": {}}})
    err = peer.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert "uuid" in err["message"].lower()
    peer.send_raw(b'{"type":"ToolCall","data":{"request_id":"' + str(uuid.uuid4()).encode() + b'","tool":"x","args":"\xff\xfe"}}\n')
    err = peer.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert "utf-8" in err["message"].lower()
    # an oversize line is discarded up to its newline; the session resyncs
    peer.send_raw(b'{"type":"Log","data":"' + b"x" * 70_000 + b'"}\n')
    err = peer.until(lambda m: m["type"] == "Error")[-1]["data"]
    assert err["error_code"] == "RESOURCE_EXHAUSTED"
    rid = str(uuid.uuid4())
    peer.send({"type": "ShellExec", "data": {"request_id": rid, "command": "echo still here", "env": {}}})
    msgs = peer.until(lambda m: m["type"] == "ShellOutput" and m["data"]["finished"])
    assert "still here" in "".join(m["data"]["stdout"] or "" for m in msgs if m["type"] == "ShellOutput")
    peer.send({"type": "Shutdown"})
    msgs = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["state"] == "Shutting")
    with pytest.raises(EOFError):
        peer.recv()


def test_raw_v1_session_and_bad_frames(server: ServerProcess) -> None:
    peer = Frames(server.sock_path)
    peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
    envs = peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
    ready = envs[-1]
    assert ready.event.ready.version == 1 and ready.sequence == 2 and ready.timestamp > 1_600_000_000_000
    seqs = [e.sequence for e in envs]
    # a well-framed but unparsable message: error, then the session carries on
    peer.sock.sendall(b"\x03\xff\xff\xff")
    err = peer.until(lambda e: e.event.WhichOneof("event_type") == "error")[-1].event.error
    assert "not a valid Envelope" in err.message
    # invalid UTF-8 in a string field is rejected by the parser the same way
    bad = pb.Envelope()
    bad.command.shell_exec.request_id = "r"
    raw = bytearray(bad.SerializeToString())
    raw[raw.index(b"r")] = 0xFF
    peer.sock.sendall(_VarintBytes(len(raw)) + bytes(raw))
    err = peer.until(lambda e: e.event.WhichOneof("event_type") == "error")[-1].event.error
    assert "not a valid Envelope" in err.message
    peer.command(shell_exec=pb.ShellExecCommand(request_id="r1", command="printf abc"))
    envs2 = peer.until(lambda e: e.event.shell_output.finished)
    assert "".join(e.event.shell_output.stdout for e in envs2 if e.event.shell_output.HasField("stdout")) == "abc"
    allseq = seqs + [e.sequence for e in envs2]
    assert allseq == sorted(allseq) and len(set(allseq)) == len(allseq)
    # an oversize frame cannot be resynchronised: an error saying why, then the connection closes
    peer.sock.sendall(_VarintBytes(1 << 20))
    msgs = []
    with pytest.raises(EOFError):
        while True:
            msgs.append(peer.recv())
    errors = [m.event.error for m in msgs if m.event.WhichOneof("event_type") == "error"]
    assert errors and errors[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    assert "max_frame_size" in errors[0].message and "closing the connection" in errors[0].message


def test_output_cap_truncates_with_notice(server: ServerProcess) -> None:
    peer = Frames(server.sock_path)
    peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
    peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
    peer.command(shell_exec=pb.ShellExecCommand(request_id="big", command="head -c 16000000 /dev/zero | tr '\\0' a; while echo done >&2; do :; done"))
    envs = peer.until(lambda e: e.event.shell_output.finished)
    out = "".join(e.event.shell_output.stdout for e in envs if e.event.shell_output.HasField("stdout"))
    err = "".join(e.event.shell_output.stderr for e in envs if e.event.shell_output.HasField("stderr"))
    assert len(out) <= 100 * 1024 and "truncated" in err
    # past --max-output its output is no longer read: the pipes are closed, the next write of the
    # command (tr's, then the shell's `echo done >&2`) gets SIGPIPE, as under `| head -c N`.
    # 16 MB: more than a pipe (PIPE_SIZE) and a read hold, so tr cannot finish unread. The echo
    # loops: the pipes are closed one after the other, and a preempted service may close stderr
    # only after the shell's first echo (a CI run saw exit 0); the loop writes until it is closed.
    assert envs[-1].event.shell_output.exit_code == -signal.SIGPIPE


def test_process_limit(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-processes", "1").start()
    try:
        peer = Frames(srv.sock_path)
        peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
        peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
        peer.command(shell_exec=pb.ShellExecCommand(request_id="a", command="sleep 1"))
        peer.command(shell_exec=pb.ShellExecCommand(request_id="b", command="true"))
        err = peer.until(lambda e: e.event.WhichOneof("event_type") == "error")[-1].event.error
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and err.request_id == "b"
        done = peer.until(lambda e: e.event.shell_output.finished)[-1]
        assert done.event.shell_output.request_id == "a" and done.event.shell_output.exit_code == 0
    finally:
        assert srv.stop() == 0


def test_slow_reader_backpressure(tmp_path: pathlib.Path) -> None:
    """A peer that does not read: the service stops reading the child, memory stays bounded, nothing is lost."""
    srv = ServerProcess(tmp_path, "--max-output", "1G").start()
    try:
        peer = Frames(srv.sock_path)
        peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
        peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
        total = 200 * 1024 * 1024
        peer.command(shell_exec=pb.ShellExecCommand(request_id="flood", command=f"head -c {total} /dev/zero"))
        time.sleep(2.0)  # not reading
        rss_kb = int(re.search(r"VmRSS:\s+(\d+)", pathlib.Path(f"/proc/{srv.pid}/status").read_text()).group(1))  # type: ignore[union-attr]
        assert rss_kb < 150 * 1024, f"service RSS grew to {rss_kb} kB while the peer was not reading"
        got = 0
        while True:
            env = peer.recv()
            so = env.event.shell_output
            if so.HasField("stdout"):
                got += len(so.stdout)
            if so.finished:
                break
        assert got == total and so.exit_code == 0
    finally:
        assert srv.stop() == 0


def test_no_leaks_after_many_commands(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path).start()
    try:
        fds = lambda: fd_count(srv.pid)  # noqa: E731  # less the bounded pool of spare cells
        peer = Frames(srv.sock_path)
        peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
        peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
        peer.command(shell_exec=pb.ShellExecCommand(request_id="warm", command="true"))
        peer.until(lambda e: e.event.shell_output.finished)
        time.sleep(0.2)
        baseline = fds()
        for batch in range(5):  # 100 commands, 20 at a time (the default process limit is 64)
            for i in range(20):
                peer.command(shell_exec=pb.ShellExecCommand(request_id=f"r{batch}-{i}", command="echo x; echo y >&2"))
            finished = 0
            while finished < 20:
                if peer.recv().event.shell_output.finished:
                    finished += 1
        # a burst: the session's zygote keeps zygote.BURST_DEPTH warm shells now, one when the
        # baseline was taken, each holding our ends of its script, stdout and stderr pipes
        held = baseline + 3 * (zygote.BURST_DEPTH - 1)
        assert wait_until(lambda: fds() <= held, 5), (fds(), held)
        # the pool's bound, and the cells the session's next commands wait in (sandbox/zygote.py: Zygote.prepare)
        assert wait_until(lambda: spare_cells(srv.pid) <= containment._MAX_SPARES + zygote.BURST_DEPTH * len(session_sandboxes(srv.pid)), 5), \
            spare_cells(srv.pid)
        # what is left is the session's sandbox (its zygote), which ends with the session
        assert wait_until(lambda: len(descendants(srv.pid)) == len(session_sandboxes(srv.pid)), 5), descendants(srv.pid)
        peer.close()
        assert wait_until(lambda: descendants(srv.pid) == [], 5), descendants(srv.pid)
        assert wait_until(lambda: fds() <= baseline, 5), (fds(), baseline)
    finally:
        assert srv.stop() == 0


def test_batch_command_with_and_without_ordering(server: ServerProcess) -> None:
    peer = Frames(server.sock_path)
    peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
    peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
    for ordered in (True, False):
        env = pb.Envelope(timestamp=1, sequence=2)
        env.batch_command.require_ordering = ordered
        for i, delay in enumerate(["0.3", "0"]):
            env.batch_command.commands.add().shell_exec.CopyFrom(
                pb.ShellExecCommand(request_id=f"b{ordered}{i}", command=f"sleep {delay}; echo {i}")
            )
        peer.send(env)
        finals = []
        while len(finals) < 2:
            so = peer.recv().event.shell_output
            if so.finished:
                finals.append(so.request_id)
        # ordered: the slow first command ends first; unordered: the fast second one overtakes it
        assert finals == ([f"b{ordered}0", f"b{ordered}1"] if ordered else [f"b{ordered}1", f"b{ordered}0"])


def test_v1_unknown_command_type_is_reported(server: ServerProcess) -> None:
    peer = Frames(server.sock_path)
    peer.command(handshake=pb.HandshakeCommand(version=1))
    peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")
    # a Command whose oneof member is a field number this service does not know (from a newer peer)
    env = pb.Envelope(timestamp=1, sequence=2)
    env.command.SetInParent()
    raw = env.SerializeToString()[:-2] + bytes([0x52, 0x04, 0xA2, 0x01, 0x01, 0x00])  # command { field 20: {0x00} } (1-15 are known)
    peer.sock.sendall(_VarintBytes(len(raw)) + raw)
    err = peer.until(lambda e: e.event.WhichOneof("event_type") == "error")[-1].event.error
    assert "no command_type" in err.message and err.details["reason"] == "malformed"
    peer.command(handshake=pb.HandshakeCommand(version=1))  # the session carries on
    assert peer.until(lambda e: e.event.WhichOneof("event_type") == "ready")[-1].event.ready.version == 1
