"""A peer that stops reading cannot make the service buffer without bound.

The attack (one finding of the hostile-input review, RELIABILITY.md) against a real
``smith-fast serve``: a client with a tiny receive buffer (``SO_RCVBUF=4096``) handshakes,
pipelines hundreds of ``fs.read`` of a 1 MB file and never reads. Before, every read ran and its
result waited in the transport's buffer (RSS 184 → 1124 MB for 1000 reads); now a session holds at
most ``--max-session-buffer`` of output (``smith_fast/service/flow.py``): its further requests wait
unstarted and its commands are not read. Each test checks the server's VmHWM/VmRSS from /proc, that
another session is served meanwhile, that nothing grows once the client left, and (where the client
reads again) that every request still ends with exactly one terminal state.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]
from grpc import aio

from harness.server import ServerProcess, assert_clean_log, wait_until
from smith_fast.pb import smith_pb2 as pb

from .peers import V0Peer, V1Peer, kind, terminal

MB = 1 << 20
BUDGET = 8 * MB  # the servers' --max-session-buffer
READS = 300  # 300 MB of results if they all ran
BOUND_KIB = 40 * 1024  # growth of the server's peak RSS allowed by the attack: the budget plus slack (before: 117+ MB in 4 s)
STALL = 4.0  # how long the hostile client does not read


def status_kib(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    """A server of its own per test: VmHWM is a high-water mark."""
    tmp = tmp_path
    (tmp / "big.bin").write_bytes(b"x" * MB)  # fs.read answers with the bytes as they are
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--max-session-buffer", str(BUDGET), log_level="info").start()
    yield srv
    srv.stop()
    assert_clean_log(srv)


def tiny_socket(address: str) -> socket.socket:
    """A connected socket that can hold almost nothing the service sends."""
    host, _, port = address.removeprefix("tcp:").rpartition(":")
    sock = socket.socket(socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def v1_frame(**command: object) -> bytes:
    data = pb.Envelope(command=pb.Command(**command)).SerializeToString()  # type: ignore[arg-type]
    prefix: bytes = _VarintBytes(len(data))
    return prefix + data


def read_call(rid: str) -> dict[str, object]:
    return {"tool_call": pb.ToolCallCommand(request_id=rid, tool="fs.read", args=json.dumps({"path": "big.bin"}).encode())}


def push(sock: socket.socket, data: bytes, seconds: float = 0.5) -> int:
    """Send what the service takes of ``data`` within ``seconds`` (it stops reading once its
    budget is spent); how many bytes went out."""
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent : sent + 65536])
        except BlockingIOError:
            time.sleep(0.01)
    return sent


def honest_pings(server: ServerProcess, n: int) -> int:
    """Another session's tool calls, each answered: how many were."""
    peer = V1Peer(server.unix)
    peer.handshake()
    for i in range(n):
        peer.command(tool_call=pb.ToolCallCommand(request_id=f"p{i}", tool="tools.list", args=b"{}"))
        envs = peer.until(terminal(f"p{i}"))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
    peer.close()
    return n


def stall_and_measure(server: ServerProcess, before: int) -> int:
    """Wait while the hostile peer does not read; the peak RSS growth (KiB) seen by then."""
    deadline = time.monotonic() + STALL
    grown = 0
    while time.monotonic() < deadline:
        grown = status_kib(server.pid, "VmHWM") - before
        if grown > BOUND_KIB:
            break
        time.sleep(0.2)
    return grown


def test_a_peer_that_does_not_read_is_bounded_then_served_in_full(server: ServerProcess) -> None:
    before = status_kib(server.pid, "VmHWM")
    sock = tiny_socket(server.tcp)
    sock.sendall(v1_frame(handshake=pb.HandshakeCommand(version=1)))
    frames = b"".join(v1_frame(**read_call(f"r{i}")) for i in range(READS))
    sent = push(sock, frames)  # what did not go out is sent below, once the client reads
    grown = stall_and_measure(server, before)
    assert grown <= BOUND_KIB, f"the server's peak RSS grew {grown // 1024} MB for a peer that does not read"
    assert honest_pings(server, 20) == 20  # another session is served meanwhile
    # The peer reads again: every request runs and ends with exactly one terminal state.
    buf = bytearray()  # its front is deleted in O(1): 300 MB arrive
    ends: dict[str, int] = {}
    results = 0
    deadline = time.monotonic() + 120
    total = len(frames)
    while len(ends) < READS and time.monotonic() < deadline:
        if sent < total:
            try:
                sent += sock.send(frames[sent : sent + 65536])
            except BlockingIOError:
                pass
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            time.sleep(0.001)
            continue
        assert data, "the service closed the connection"
        buf += data
        while True:
            env = _next(buf)
            if env is None:
                break
            k = kind(env)
            if k == "tool_result":
                results += 1
                assert env.event.tool_result.success and json.loads(env.event.tool_result.result)["length"] == MB
            elif k == "state_change" and env.event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                rid = env.event.state_change.request_id
                if rid:
                    ends[rid] = ends.get(rid, 0) + 1
            elif k == "error":
                raise AssertionError(env.event.error)
    sock.close()
    assert sent == total
    assert len(ends) == READS and set(ends.values()) == {1}, (len(ends), results)
    assert results == READS


def _next(buf: bytearray) -> pb.Envelope | None:
    """The first complete envelope of ``buf``, taken off it; None while none is complete."""
    if not buf:
        return None
    try:
        size, pos = _DecodeVarint(bytes(buf[:10]), 0)
    except IndexError:
        return None
    if len(buf) < pos + size:
        return None
    env = pb.Envelope.FromString(bytes(buf[pos : pos + size]))
    del buf[: pos + size]
    return env


def test_memory_stops_growing_once_the_peer_left(server: ServerProcess) -> None:
    before = status_kib(server.pid, "VmHWM")
    sock = tiny_socket(server.tcp)
    sock.sendall(v1_frame(handshake=pb.HandshakeCommand(version=1)))
    push(sock, b"".join(v1_frame(**read_call(f"r{i}")) for i in range(READS)))
    grown = stall_and_measure(server, before)
    assert grown <= BOUND_KIB, f"the server's peak RSS grew {grown // 1024} MB"
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset, as a crash would
    sock.close()
    assert wait_until(lambda: honest_pings(server, 3) == 3, timeout=10)
    after_leave = status_kib(server.pid, "VmRSS")
    time.sleep(1.0)
    assert status_kib(server.pid, "VmRSS") <= after_leave + 8 * 1024  # nothing of the gone session runs on
    assert status_kib(server.pid, "VmHWM") - before <= BOUND_KIB


def test_v0_peer_that_does_not_read_is_bounded(server: ServerProcess) -> None:
    before = status_kib(server.pid, "VmHWM")
    sock = tiny_socket(server.tcp)
    lines = [json.dumps({"type": "Handshake", "data": {"version": 0, "capabilities": []}})]
    lines += [
        json.dumps({"type": "ToolCall", "data": {"request_id": str(uuid.uuid4()), "tool": "fs.read", "args": {"path": "big.bin"}, "timeout_ms": None}})
        for i in range(READS)
    ]
    push(sock, ("\n".join(lines) + "\n").encode())
    grown = stall_and_measure(server, before)
    sock.close()
    assert grown <= BOUND_KIB, f"the server's peak RSS grew {grown // 1024} MB for a v0 peer that does not read"
    assert honest_pings(server, 5) == 5
    v0 = V0Peer(server.unix)  # and v0 is still served
    v0.send({"type": "Handshake", "data": {"version": 0, "capabilities": []}})
    v0.until(lambda m: m.get("type") == "Ready")
    v0.close()


async def test_grpc_stream_that_does_not_read_is_bounded(server: ServerProcess) -> None:
    before = status_kib(server.pid, "VmHWM")
    target = server.grpc.removeprefix("grpc:")

    async def requests() -> AsyncIterator[bytes]:
        yield pb.Envelope(command=pb.Command(handshake=pb.HandshakeCommand(version=1))).SerializeToString()
        for i in range(READS):
            yield pb.Envelope(command=pb.Command(**read_call(f"g{i}"))).SerializeToString()  # type: ignore[arg-type]
        await asyncio.sleep(3600)  # the stream stays open; nothing is read

    options = [("grpc.max_receive_message_length", -1)]
    async with aio.insecure_channel(target, options=options) as channel:
        stream: aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream("/smith.v1.SmithService/Stream")
        call = stream(requests())
        loop = asyncio.get_running_loop()
        grown = await loop.run_in_executor(None, stall_and_measure, server, before)
        assert grown <= BOUND_KIB, f"the server's peak RSS grew {grown // 1024} MB for a gRPC stream that does not read"
        assert await loop.run_in_executor(None, honest_pings, server, 5) == 5
        call.cancel()


def test_plan_steps_wait_for_a_peer_that_does_not_read(server: ServerProcess) -> None:
    """One request that produces output step by step: a plan of 200 ``fs.read`` steps."""
    before = status_kib(server.pid, "VmHWM")
    steps = [{"id": f"s{i}", "kind": "tool", "tool": "fs.read", "args": {"path": "big.bin"}} for i in range(200)]
    context = {"steps": json.dumps(steps), "execute": "true", "max_parallel": "4"}
    sock = tiny_socket(server.tcp)
    sock.sendall(v1_frame(handshake=pb.HandshakeCommand(version=1)))
    sock.sendall(v1_frame(plan=pb.PlanCommand(request_id="plan", goal="read it all", context=context)))
    grown = stall_and_measure(server, before)
    sock.close()
    assert grown <= BOUND_KIB, f"the server's peak RSS grew {grown // 1024} MB for a plan whose peer does not read"
    assert honest_pings(server, 5) == 5
