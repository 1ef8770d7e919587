"""Faults and load against a real ``smith-fast serve`` process: children that misbehave, peers that
vanish, a full disk and a SIGKILL while recording, connection and request limits, idle and
half-open connections, and a bounded soak in which every event is accounted for.

The soak runs ``SMITH_SOAK_SESSIONS`` (default 100) concurrent raw v1 clients for
``SMITH_SOAK_SECONDS`` (default 60) seconds; ``make soak`` runs it longer. RELIABILITY.md lists
every case with the figures measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import signal
import socket
import struct
import threading
import time
import uuid
from collections import Counter

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast import containment
from smith_fast.framing import FrameDecoder
from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import read_log

from .peers import V0Peer, V1Peer, errors, kind, terminal
from harness.server import ServerProcess, assert_clean_log, beside, descendants, pid_alive, running, wait_until

SOAK_SECONDS = float(os.environ.get("SMITH_SOAK_SECONDS", "60"))
SOAK_SESSIONS = int(os.environ.get("SMITH_SOAK_SESSIONS", "100"))
SOAK_REPORT = os.environ.get("SMITH_SOAK_REPORT")  # a path: the soak's figures are written there as JSON


_CELL = re.compile(r"/smith-fast-\d+/(c\d+)(?:/|$)")


def _links(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return out


def fds(pid: int) -> int:
    """The service's open fds, but for those of the cgroup cells it keeps for the next commands:
    containment keeps up to _MAX_SPARES cells, each with its directories and usage files open, a
    bounded cache whose fill depends on how the last commands ended (:func:`cells` counts them)."""
    return sum(1 for link in _links(pid) if not _CELL.search(link))


def cells(pid: int) -> int:
    """The cgroup cells the service holds open."""
    return len({match.group(1) for link in _links(pid) if (match := _CELL.search(link))})


def rss_kb(pid: int) -> int:
    match = re.search(r"VmRSS:\s+(\d+)", pathlib.Path(f"/proc/{pid}/status").read_text())
    assert match
    return int(match.group(1))


def outputs(envs: list[pb.Envelope]) -> tuple[str, str, list[pb.ShellOutputEvent]]:
    out = "".join(e.event.shell_output.stdout for e in envs if kind(e) == "shell_output")
    err = "".join(e.event.shell_output.stderr for e in envs if kind(e) == "shell_output")
    finals = [e.event.shell_output for e in envs if kind(e) == "shell_output" and e.event.shell_output.finished]
    return out, err, finals


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("faults")
    srv = ServerProcess(tmp, "--kill-grace", "0.5").start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


# ---- children that misbehave ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v1", "v0"])
def test_child_ignoring_sigterm_is_killed_after_the_grace(server: ServerProcess, tmp_path: pathlib.Path, protocol: str) -> None:
    inside = server.root / tmp_path.name  # the default sandbox lets commands write only in the root
    inside.mkdir()
    pidfile = inside / "pids"
    command = f"trap '' TERM; sleep 30.{os.getpid()} & echo $! > {pidfile}; echo $$ >> {pidfile}; echo started; wait; echo never"
    start = time.monotonic()
    if protocol == "v1":
        peer = V1Peer(server.unix)
        peer.handshake()
        peer.command(shell_exec=pb.ShellExecCommand(request_id="t", command=command, timeout_ms=300))
        envs = peer.until(terminal("t"))
        out, _, finals = outputs(envs)
        (err,) = errors(envs)
        assert err.error_code == pb.ERROR_CODE_EXECUTION_TIMEOUT and "terminated (exit code -9)" in err.message
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_ERROR
        assert [f.exit_code for f in finals] == [-9]  # SIGTERM ignored: SIGKILL after --kill-grace
    else:
        peer0 = V0Peer(server.unix)
        peer0.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
        peer0.until(lambda m: m["type"] == "Ready")
        rid = str(uuid.uuid4())
        peer0.send({"type": "ShellExec", "data": {"request_id": rid, "command": command, "shell": None, "cwd": None, "env": {}, "timeout_ms": 300}})
        msgs = peer0.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == rid and m["data"]["state"] in ("Ready", "Error"))
        out = "".join(m["data"]["stdout"] or "" for m in msgs if m["type"] == "ShellOutput")
        assert [m["data"]["exit_code"] for m in msgs if m["type"] == "ShellOutput" and m["data"]["finished"]] == [-9]
        assert [m["data"]["error_code"] for m in msgs if m["type"] == "Error"] == ["EXECUTION_TIMEOUT"]
        assert msgs[-1]["data"]["state"] == "Error"
    elapsed = time.monotonic() - start
    assert out == "started\n"
    assert 0.75 <= elapsed < 5, elapsed  # 0.3 s timeout + 0.5 s grace
    # (the pids it wrote are its pid namespace's, gone with it: what is left is found by its line)
    assert wait_until(lambda: not running(f"sleep 30.{os.getpid()}") and not running(str(pidfile)), 5)


def test_child_closing_stdout_but_running_is_waited_for(server: ServerProcess) -> None:
    peer = V1Peer(server.unix)
    peer.handshake()
    start = time.monotonic()
    peer.command(shell_exec=pb.ShellExecCommand(request_id="c", command="echo before; exec 1>&-; sleep 2; echo err >&2; exit 4"))
    envs = peer.until(terminal("c"))
    out, err, finals = outputs(envs)
    assert (out, err, [f.exit_code for f in finals]) == ("before\n", "err\n", [4])
    assert time.monotonic() - start >= 1.9  # stdout's EOF did not end the command early
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY and not errors(envs)


@pytest.mark.parametrize("protocol", ["v1", "v0"])
@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_disconnect_mid_stream_kills_children_and_leaks_nothing(tmp_path: pathlib.Path, via: str, protocol: str) -> None:
    srv = ServerProcess(tmp_path).start()
    try:
        warm = V1Peer(srv.unix)
        warm.handshake()
        warm.command(shell_exec=pb.ShellExecCommand(request_id="w", command="true"))
        warm.until(terminal("w"))
        warm.close()
        assert wait_until(lambda: srv.children() == [], 5)
        time.sleep(0.5)
        baseline = fds(srv.pid)
        for round_ in range(5):
            flood = "while :; do echo line-$$-flowing; done & while :; do echo err >&2; done & wait"
            if protocol == "v1":
                peer: V1Peer | V0Peer = V1Peer(srv.address(via))
                peer.handshake()  # type: ignore[union-attr]
                for i in range(3):
                    peer.command(shell_exec=pb.ShellExecCommand(request_id=f"f{i}", command=flood))  # type: ignore[union-attr]
                got = 0
                while got < 200:  # output is flowing
                    got += kind(peer.recv()) == "shell_output"  # type: ignore[operator]
            else:
                peer = V0Peer(srv.address(via))
                peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
                for _ in range(3):
                    peer.send({"type": "ShellExec", "data": {"request_id": str(uuid.uuid4()), "command": flood, "shell": None, "cwd": None, "env": {}, "timeout_ms": None}})
                got = 0
                while got < 200:
                    got += peer.recv()["type"] == "ShellOutput"
            kids = [pid for pid, _ in descendants(srv.pid)]
            assert len(kids) >= 3
            # vanish without a word, leaving unread output in the socket; over TCP every other
            # round with a reset (SO_LINGER 0) instead of a FIN
            if via == "tcp" and round_ % 2:
                peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()
            assert wait_until(lambda: not any(pid_alive(p) for p in kids), 10), round_
        assert wait_until(lambda: descendants(srv.pid) == [], 5)
        assert wait_until(lambda: fds(srv.pid) <= baseline, 5), (fds(srv.pid), baseline)
        # and it still serves
        peer1 = V1Peer(srv.tcp)
        peer1.handshake()
        peer1.command(shell_exec=pb.ShellExecCommand(request_id="after", command="echo still"))
        assert outputs(peer1.until(terminal("after")))[0] == "still\n"
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


# ---- recording under faults ----------------------------------------------------------------------------


def test_sigkill_while_recording_pipelined_calls_keeps_what_the_peer_got(tmp_path: pathlib.Path) -> None:
    """Tool calls answered in the step that read them, many at once: their answers leave in several
    writes during the step (WRITE_FLUSH_BYTES), each after the session log took what precedes it,
    so a SIGKILL never leaves the peer with an envelope the log lacks."""
    rec = beside(tmp_path, "rec")
    srv = ServerProcess(tmp_path, "--record", str(rec)).start()
    (srv.root / "small.txt").write_text("hello, smith-fast\n" * 4)
    peer = V1Peer(srv.unix)
    ready = peer.handshake()[-1].event.ready
    path = pathlib.Path(ready.service_info["smith_fast.recording"])
    frames = []
    for i in range(3000):
        peer.seq += 1
        env = pb.Envelope(timestamp=int(time.time() * 1000), sequence=peer.seq)
        env.command.tool_call.CopyFrom(pb.ToolCallCommand(request_id=f"r{i}", tool="fs.read", args=b'{"path":"small.txt"}'))
        data = env.SerializeToString()
        frames.append(_VarintBytes(len(data)) + data)
    peer.sock.sendall(b"".join(frames))
    received: dict[int, bytes] = {}
    while len(received) < 300:
        env = peer.recv()
        received[env.sequence] = env.SerializeToString()
    os.kill(srv.pid, signal.SIGKILL)
    with contextlib.suppress(EOFError, ConnectionResetError):
        while True:
            env = peer.recv()
            received[env.sequence] = env.SerializeToString()
    assert srv.proc is not None and srv.proc.wait(10) == -signal.SIGKILL
    _, records, _ = read_log(path)
    logged = {e.sequence: e.SerializeToString() for e in (r.parse() for r in records if not r.inbound)}
    assert max(received) <= max(logged), (max(received), max(logged))
    assert all(logged[seq] == data for seq, data in received.items())


def test_sigkill_while_recording_keeps_every_complete_record(tmp_path: pathlib.Path) -> None:
    for attempt, after in enumerate((50, 400, 1500)):
        rec = beside(tmp_path, f"rec{attempt}")
        srv = ServerProcess(tmp_path, "--record", str(rec), "--chunk-size", "256").start()
        peer = V1Peer(srv.unix)
        ready = peer.handshake()[-1].event.ready
        path = pathlib.Path(ready.service_info["smith_fast.recording"])
        peer.command(shell_exec=pb.ShellExecCommand(request_id="s", command="i=0; while :; do i=$((i+1)); echo line-$i; done"))
        received: dict[int, bytes] = {}
        while len(received) < after:
            env = peer.recv()
            received[env.sequence] = env.SerializeToString()
        os.kill(srv.pid, signal.SIGKILL)
        try:
            while True:
                env = peer.recv()
                received[env.sequence] = env.SerializeToString()
        except (EOFError, ConnectionResetError):
            pass
        assert srv.proc is not None and srv.proc.wait(10) == -signal.SIGKILL
        header, records, torn = read_log(path)
        assert header.session_id and records
        outbound = [r.parse() for r in records if not r.inbound]
        inbound = [r.parse() for r in records if r.inbound]
        assert inbound[0].command.HasField("handshake") and inbound[1].command.shell_exec.request_id == "s"
        sequences = [e.sequence for e in outbound]
        assert sequences == list(range(1, len(sequences) + 1))  # complete up to the last record
        # the recorder writes before the socket does: whatever the peer got is in the log, byte for byte
        logged = {e.sequence: e.SerializeToString() for e in outbound}
        assert max(received) <= max(logged)
        assert all(logged[seq] == data for seq, data in received.items())
        if torn is not None:  # killed in the middle of a write: reported, never taken for a record
            assert torn.reason and torn.offset >= header_size(path)
        peer.close()
        srv.stop()


def header_size(path: pathlib.Path) -> int:
    from smith_fast.replay.format import decode_header

    return decode_header(path.read_bytes())[1]


def test_full_disk_while_recording_the_session_goes_on(tmp_path: pathlib.Path) -> None:
    """A real ENOSPC: the service runs in a private mount namespace whose --record DIR is a 64 KiB tmpfs."""
    mnt = beside(tmp_path, "mnt")
    mnt.mkdir()
    srv = ServerProcess(tmp_path, "--record", str(mnt))
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    # mode 0700: a recordings directory others may enter is refused (a recording holds a session's bytes)
    shell = 'mount -t tmpfs -o size=64k,mode=0700 tmpfs "$1" && shift && exec "$@"'
    srv.argv = ["unshare", "--mount", *userns, "sh", "-c", shell, "sh", str(mnt), *srv.argv]
    srv.start()
    try:
        peer = V1Peer(srv.unix)
        ready = peer.handshake()[-1].event.ready
        path = pathlib.Path(ready.service_info["smith_fast.recording"])
        expected = "".join(f"{i}\n" for i in range(1, 40001))  # ~230 kB: more than fits
        peer.command(shell_exec=pb.ShellExecCommand(request_id="big", command="seq 1 40000"))
        envs = peer.until(terminal("big"))
        assert outputs(envs)[0] == expected and envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        warnings = [e.event.log for e in envs if kind(e) == "log" and e.event.log.fields.get("reason") == "recording_failed"]
        assert len(warnings) == 1 and warnings[0].level == pb.LOG_LEVEL_WARN
        assert "No space left on device" in warnings[0].message and "the session goes on" in warnings[0].message
        # the session goes on, unrecorded
        peer.command(tool_call=pb.ToolCallCommand(request_id="after", tool="tools.list"))
        after = peer.until(terminal("after"))
        assert [e.event.tool_result.success for e in after if kind(e) == "tool_result"] == [True]
        # the log holds a readable prefix (read through the service's mount namespace)
        inside = pathlib.Path(f"/proc/{srv.pid}/root") / path.relative_to("/")
        header, records, torn = read_log(inside)
        sequences = [r.parse().sequence for r in records if not r.inbound]
        assert 0 < len(sequences) and sequences == list(range(1, len(sequences) + 1)) and torn is None
    finally:
        assert srv.stop() == 0
    assert list(mnt.iterdir()) == []  # the tmpfs lived only in the service's namespace


# ---- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_connection_limit(tmp_path: pathlib.Path, loop: str) -> None:
    srv = ServerProcess(tmp_path, "--max-connections", "2", "--grpc", "127.0.0.1:0", loop=loop).start()
    try:
        a, b = V1Peer(srv.unix), V1Peer(srv.tcp)
        a.handshake()
        b.handshake()
        # one more, v1: an ErrorEvent frame, then the connection closes
        c = V1Peer(srv.unix)
        (err,) = errors(c.handshake() + c.rest())
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "too many connections (max 2)" in err.message
        assert err.details["reason"] == "too_many_connections"
        # one more, v0: the same as a JSON line
        d = V0Peer(srv.tcp)
        d.send({"type": "Handshake", "data": {"version": 0, "capabilities": []}})
        assert [(m["type"], m["data"]["error_code"]) for m in d.rest()] == [("Error", "RESOURCE_EXHAUSTED")]
        # one more that says nothing: the v1 frame after a second
        start = time.monotonic()
        e = V1Peer(srv.unix)
        assert [x.event.error.error_code for x in e.rest()] == [pb.ERROR_CODE_RESOURCE_EXHAUSTED]
        assert 0.8 < time.monotonic() - start < 5
        # a gRPC stream counts too
        import grpc
        from grpc import aio

        from smith_fast.pb import smith_pb2_grpc

        async def grpc_stream() -> grpc.StatusCode:
            async with aio.insecure_channel(srv.grpc.removeprefix("grpc:")) as channel:
                call = smith_pb2_grpc.SmithServiceStub(channel).Stream()
                return await call.code()  # type: ignore[no-any-return]

        assert asyncio.run(grpc_stream()) == grpc.StatusCode.RESOURCE_EXHAUSTED
        # the first two were never disturbed; closing one frees its place
        a.command(shell_exec=pb.ShellExecCommand(request_id="a", command="echo a"))
        assert outputs(a.until(terminal("a")))[0] == "a\n"
        b.close()
        assert wait_until(lambda: V1Peer(srv.unix).handshake()[-1].event.WhichOneof("event_type") == "ready", 5)
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


def test_request_and_process_limits(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-requests", "2", "--max-processes", "3").start()
    try:
        peer = V1Peer(srv.unix)
        peer.handshake()
        for i in range(3):
            peer.command(shell_exec=pb.ShellExecCommand(request_id=f"r{i}", command="sleep 0.5; echo done"))
        (err,) = errors(peer.until(terminal("r2")))
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and err.request_id == "r2" and "max 2" in err.message
        other = V1Peer(srv.unix)
        other.handshake()
        other.command(shell_exec=pb.ShellExecCommand(request_id="o1", command="sleep 0.5"))
        other.command(shell_exec=pb.ShellExecCommand(request_id="o2", command="true"))
        (err,) = errors(other.until(terminal("o2")))
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "too many commands running (max 3)" in err.message
        assert outputs(peer.until(terminal("r1")))[0].count("done") >= 1
    finally:
        assert srv.stop() == 0


# ---- idle and half-open connections -----------------------------------------------------------------


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_half_open_connections_are_closed(tmp_path: pathlib.Path, loop: str) -> None:
    srv = ServerProcess(tmp_path, "--handshake-timeout", "1", "--idle-timeout", "0", loop=loop).start()
    try:
        start = time.monotonic()
        silent = V1Peer(srv.tcp)
        (err,) = errors(silent.rest())  # no byte sent: told in v1
        assert err.details["reason"] == "handshake_timeout" and "no handshake within 1 s" in err.message
        assert 0.9 < time.monotonic() - start < 4
        partial = V0Peer(srv.unix)
        partial.sock.sendall(b'{"type": "Hands')  # a v0 peer that stalls mid-line: told in v0
        assert [m["type"] for m in partial.rest()] == ["Error"]
        chatty = V1Peer(srv.unix)  # commands without a handshake do not keep it open either
        for _ in range(3):
            chatty.command(tool_call=pb.ToolCallCommand(request_id=str(uuid.uuid4()), tool="tools.list"))
            time.sleep(0.1)
        reasons = [e.details.get("reason") for e in errors(chatty.rest())]
        assert reasons == ["handshake_required"] * 3 + ["handshake_timeout"]
        # a handshake in time: no deadline any more
        ok = V1Peer(srv.unix)
        ok.handshake()
        time.sleep(1.5)
        ok.command(shell_exec=pb.ShellExecCommand(request_id="ok", command="echo ok"))
        assert outputs(ok.until(terminal("ok")))[0] == "ok\n"
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_idle_connections_are_closed_busy_ones_are_not(tmp_path: pathlib.Path, loop: str) -> None:
    srv = ServerProcess(tmp_path, "--idle-timeout", "1", "--grpc", "127.0.0.1:0", loop=loop).start()
    try:
        idle = V1Peer(srv.unix)
        answered = idle.handshake()[-1].timestamp
        rest = idle.rest()
        # On the service's clock (Envelope.timestamp, ms): the client's own scheduling on a loaded
        # machine cannot skew it (a client-side clock once measured 0.89 s for the 1 s deadline).
        (log_env,) = [e for e in rest if kind(e) == "log"]
        assert 900 < log_env.timestamp - answered < 3000
        log = log_env.event.log
        assert log.level == pb.LOG_LEVEL_WARN and log.fields["reason"] == "idle_timeout" and "idle for 1 s" in log.message
        assert rest[-1].event.state_change.state == pb.SERVICE_STATE_SHUTTING
        # a running request keeps it open; the clock starts again when it ends
        busy = V1Peer(srv.tcp)
        busy.handshake()
        busy.command(shell_exec=pb.ShellExecCommand(request_id="b", command="sleep 2.5; echo done"))
        envs = busy.until(terminal("b"))
        assert outputs(envs)[0] == "done\n" and envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        ended = envs[-1].timestamp
        logs = [e for e in busy.rest() if kind(e) == "log"]
        assert [e.event.log.fields["reason"] for e in logs] == ["idle_timeout"]
        assert 900 < logs[0].timestamp - ended < 3000
        # messages keep it open
        chatty = V1Peer(srv.unix)
        chatty.handshake()
        for _ in range(6):
            time.sleep(0.4)
            chatty.handshake()
        chatty.command(shell_exec=pb.ShellExecCommand(request_id="c", command="echo alive"))
        assert outputs(chatty.until(terminal("c")))[0] == "alive\n"
        # and a v0 peer is told in v0
        v0 = V0Peer(srv.unix)
        v0.send({"type": "Handshake", "data": {"version": 0, "capabilities": []}})
        msgs = v0.rest()
        assert [m["type"] for m in msgs][-2:] == ["Log", "StateChange"] and msgs[-1]["data"]["state"] == "Shutting"
        # gRPC streams have the same deadline
        from smith_fast.client import Client

        async def grpc_idle() -> object:
            async with await Client.connect(srv.grpc) as client:
                await client.handshake()
                await asyncio.wait_for(client._closed.wait(), 5)  # noqa: SLF001
                return client.status  # type: ignore[attr-defined]

        import grpc

        assert asyncio.run(grpc_idle()) == grpc.StatusCode.OK
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


# ---- the soak -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SoakStats:
    sessions: int = 0
    requests: int = 0
    envelopes: int = 0
    events: int = 0
    lost: int = 0  # sequence gaps
    duplicates: int = 0
    outcomes: Counter[str] = dataclasses.field(default_factory=Counter)
    failures: list[str] = dataclasses.field(default_factory=list)


_SEQ_OUTPUT = "".join(f"{i}\n" for i in range(1, 3001))
_SOAK_FILE = "soak.txt"
_SOAK_TEXT = "soak file\n" * 50


@dataclasses.dataclass
class _Request:
    kind: str
    stdout: str = ""
    stderr: str = ""
    finished: list[int] = dataclasses.field(default_factory=list)
    results: list[pb.ToolResultEvent] = dataclasses.field(default_factory=list)
    errors: list[int] = dataclasses.field(default_factory=list)
    terminal: list[int] = dataclasses.field(default_factory=list)


def _soak_command(kind_: str, rid: str) -> pb.Command:
    if kind_ == "echo":
        return pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command=f"echo {rid}"))
    if kind_ == "exit":
        return pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="printf out; echo err >&2; exit 3"))
    if kind_ == "seq":
        return pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="seq 1 3000"))
    if kind_ == "timeout":
        return pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="sleep 10", timeout_ms=50))
    args = {"read": {"path": _SOAK_FILE}, "list": {}, "ls": {"path": "."}, "run": {"command": "echo run"}, "bad": {}}[kind_]
    tool = {"read": "fs.read", "list": "tools.list", "ls": "fs.list", "run": "shell.run", "bad": "no.such.tool"}[kind_]
    return pb.Command(tool_call=pb.ToolCallCommand(request_id=rid, tool=tool, args=json.dumps(args).encode()))


def _check(rid: str, req: _Request) -> str | None:
    """Why the finished request is wrong, or None."""
    if len(req.terminal) != 1:
        return f"{rid} ({req.kind}) got {len(req.terminal)} terminal states"
    state = req.terminal[0]
    if req.kind in ("echo", "exit", "seq", "timeout") and len(req.finished) != 1:
        return f"{rid} ({req.kind}) got {len(req.finished)} final ShellOutputs"
    expect = {
        "echo": (req.stdout == f"{rid}\n" and req.finished == [0] and state == pb.SERVICE_STATE_READY),
        "exit": (req.stdout == "out" and req.stderr == "err\n" and req.finished == [3] and state == pb.SERVICE_STATE_READY),
        "seq": (req.stdout == _SEQ_OUTPUT and req.finished == [0] and state == pb.SERVICE_STATE_READY),
        "timeout": (req.errors == [pb.ERROR_CODE_EXECUTION_TIMEOUT] and req.finished == [-15] and state == pb.SERVICE_STATE_ERROR),
        "bad": (req.errors == [pb.ERROR_CODE_INVALID_TOOL] and not req.results and state == pb.SERVICE_STATE_ERROR),
    }.get(req.kind)
    if expect is None:  # a tool that works
        ok = len(req.results) == 1 and req.results[0].success and state == pb.SERVICE_STATE_READY and not req.errors
        if ok and req.kind == "read":
            ok = json.loads(req.results[0].result)["content"] == _SOAK_TEXT
        if ok and req.kind == "run":
            ok = json.loads(req.results[0].result)["stdout"] == "run\n"
        expect = ok
    return None if expect else f"{rid} ({req.kind}) ended wrong: {req}"


_MIX = ["echo", "read", "list", "exit", "run", "ls", "seq", "read", "bad", "echo", "list", "timeout"]
_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)


async def _soak_session(address: str, index: int, deadline: float, stats: SoakStats) -> None:
    """One connection: handshake, then groups of three pipelined requests (some as a BatchCommand),
    each group awaited; every envelope's sequence number checked. Ends after 20 groups."""
    if address.startswith("unix:"):
        reader, writer = await asyncio.open_unix_connection(address[5:], limit=1 << 22)
    else:
        host, _, port = address[4:].rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
    decoder = FrameDecoder(1 << 24)
    expected_seq = 1
    requests: dict[str, _Request] = {}
    pending: set[str] = set()
    ready = False
    stats.sessions += 1

    def send(env: pb.Envelope) -> None:
        data = env.SerializeToString()
        writer.write(_VarintBytes(len(data)) + data)

    def on_event(ev: pb.Event) -> None:
        nonlocal ready
        stats.events += 1
        which = ev.WhichOneof("event_type")
        if which == "ready":
            ready = True
            return
        inner = getattr(ev, which)
        rid = getattr(inner, "request_id", "")  # unset optional ids read as ""
        if not rid:
            return
        req = requests.get(rid)
        if req is None:
            stats.failures.append(f"event for unknown request {rid}: {which}")
            return
        if req.terminal:
            stats.failures.append(f"{rid}: {which} after its terminal state")
        if which == "shell_output":
            so = ev.shell_output
            req.stdout += so.stdout
            req.stderr += so.stderr
            if so.finished:
                req.finished.append(so.exit_code)
        elif which == "tool_result":
            req.results.append(ev.tool_result)
        elif which == "error":
            req.errors.append(ev.error.error_code)
        elif which == "state_change" and ev.state_change.state in _TERMINAL:
            req.terminal.append(ev.state_change.state)
            pending.discard(rid)
            why = _check(rid, req)
            stats.outcomes[req.kind] += 1
            if why:
                stats.failures.append(why)

    async def pump(until) -> None:  # type: ignore[no-untyped-def]
        nonlocal expected_seq
        while not until():
            data = await reader.read(1 << 20)
            if not data:
                raise EOFError("the service closed the connection")
            for frame in decoder.feed(data):
                env = pb.Envelope.FromString(frame)
                stats.envelopes += 1
                if env.sequence != expected_seq:
                    if env.sequence > expected_seq:
                        stats.lost += env.sequence - expected_seq
                    else:
                        stats.duplicates += 1
                    stats.failures.append(f"session {index}: sequence {env.sequence}, expected {expected_seq}")
                expected_seq = env.sequence + 1
                on_event(env.event)

    try:
        hs = pb.Envelope()
        hs.command.handshake.version = 1
        hs.command.handshake.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
        send(hs)
        await asyncio.wait_for(pump(lambda: ready), 30)
        for group in range(20):
            if time.monotonic() > deadline:
                break
            kinds = [_MIX[(index + group * 3 + j) % len(_MIX)] for j in range(3)]
            commands = []
            for k in kinds:
                rid = str(uuid.uuid4())
                requests[rid] = _Request(k)
                pending.add(rid)
                commands.append(_soak_command(k, rid))
            stats.requests += len(commands)
            if group % 4 == 3:  # a BatchCommand now and then
                env = pb.Envelope()
                env.batch_command.commands.extend(commands)
                send(env)
            else:
                for command in commands:
                    env = pb.Envelope()
                    env.command.CopyFrom(command)
                    send(env)
            await asyncio.wait_for(pump(lambda: not pending), 60)
    except (TimeoutError, EOFError, OSError) as exc:
        stats.failures.append(f"session {index}: {type(exc).__name__}: {exc} (pending {[requests[r].kind for r in pending]})")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _soak(addresses: list[str], sessions: int, seconds: float, stats: SoakStats) -> None:
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        address = addresses[index % len(addresses)]
        while time.monotonic() < deadline:
            await _soak_session(address, index, deadline, stats)

    await asyncio.gather(*(client(i) for i in range(sessions)))


def _run_soak(addresses: list[str], sessions: int, seconds: float) -> SoakStats:
    import uvloop

    stats = SoakStats()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_soak(addresses, sessions, seconds, stats))
    return stats


@pytest.mark.timeout(SOAK_SECONDS * 1.25 + 120)
def test_soak(tmp_path: pathlib.Path) -> None:
    (tmp_path / _SOAK_FILE).write_text(_SOAK_TEXT)
    srv = ServerProcess(tmp_path, "--max-processes", "256", "--log-level", "info").start()
    addresses = [srv.unix, srv.unix, srv.unix, srv.tcp]
    try:
        # Warm up with the same load, then take the baseline with nothing connected: the heap's
        # high-water mark settles within some 15 s of this load, and what the allocator keeps
        # afterwards is not returned to the system (measured: 76, 92, 99, 95, 96, 97 MB after six
        # 10 s rounds), so a baseline taken cold would make the warm-up look like a leak.
        warm = _run_soak(addresses, SOAK_SESSIONS, min(15.0, SOAK_SECONDS / 4))
        assert warm.failures == [], warm.failures[:10]
        assert wait_until(lambda: srv.children() == [], 10)
        time.sleep(1.0)
        base_fds, base_rss = fds(srv.pid), rss_kb(srv.pid)
        peaks = {"rss_kb": 0, "fds": 0, "children": 0}
        done = threading.Event()

        def sample() -> None:  # the highs while the load runs, for the report
            while not done.wait(0.5):
                with contextlib.suppress(OSError, AssertionError):
                    peaks["rss_kb"] = max(peaks["rss_kb"], rss_kb(srv.pid))
                    peaks["fds"] = max(peaks["fds"], fds(srv.pid))
                    peaks["children"] = max(peaks["children"], len(srv.children()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        try:
            stats = _run_soak(addresses, SOAK_SESSIONS, SOAK_SECONDS)
        finally:
            done.set()
            sampler.join()
        elapsed = time.monotonic() - start
        assert stats.failures == [], f"{len(stats.failures)} failures: {stats.failures[:10]}"
        assert stats.lost == 0 and stats.duplicates == 0
        assert stats.outcomes.total() == stats.requests  # every request reached exactly one terminal state
        assert stats.sessions >= SOAK_SESSIONS and stats.requests > SOAK_SESSIONS * 3
        # back to the baseline: file descriptors exactly, no child left, memory within 30 %
        assert wait_until(lambda: descendants(srv.pid) == [], 10), descendants(srv.pid)
        assert wait_until(lambda: fds(srv.pid) <= base_fds, 10), (fds(srv.pid), base_fds)
        assert cells(srv.pid) <= containment._MAX_SPARES, cells(srv.pid)  # the cache stays bounded
        time.sleep(1.0)
        end_rss = rss_kb(srv.pid)
        # CPython keeps freed arenas and the allocator's high-water mark depends on how bursts
        # interleave: allow 30 % or 48 MB, whichever is more (a leak grows with the run's length:
        # SMITH_SOAK_SECONDS=300 measured 89 MB after vs 83 MB before).
        assert end_rss <= base_rss + max(base_rss * 0.3, 48 * 1024), (end_rss, base_rss)
        report = {
            "seconds": round(elapsed, 1), "concurrent_sessions": SOAK_SESSIONS, "sessions": stats.sessions,
            "requests": stats.requests, "envelopes": stats.envelopes, "events": stats.events, "events_lost": stats.lost,
            "duplicates": stats.duplicates, "requests_per_second": round(stats.requests / elapsed),
            "outcomes": dict(stats.outcomes), "fds_baseline": base_fds, "fds_after": fds(srv.pid),
            "rss_kb_baseline": base_rss, "rss_kb_after": end_rss, "peaks_under_load": peaks,
        }  # fmt: skip
        print("soak:", json.dumps(report))
        if SOAK_REPORT:
            pathlib.Path(SOAK_REPORT).write_text(json.dumps(report, indent=2) + "\n")
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)

