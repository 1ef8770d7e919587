"""What one sequential tool call costs a real server in system calls and wake-ups: a small
``fs.read`` answered in the step that read it is one socket read, the file's pread, one write of
its three events, and one sleep in the loop's poll; no timer, callback or thread wakes the
server between calls, and the audit lines go out in batches, not one write per call."""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Iterator

import pytest

from harness.server import ServerProcess
from smith_fast._varint import encode as encode_varint
from smith_fast.pb import smith_pb2 as pb
from tests.peers import V1Peer, kind, terminal

pytestmark = pytest.mark.timeout(60)

CALLS = 300


def _counts(pid: int) -> dict[str, int]:
    """The process's read and write system calls (/proc/PID/io) and the times it slept
    (voluntary context switches, summed over its threads)."""
    io = dict(line.split(": ") for line in pathlib.Path(f"/proc/{pid}/io").read_text().splitlines())
    slept = 0
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                slept += int(line.split()[1])
    return {"reads": int(io["syscr"]), "writes": int(io["syscw"]), "sleeps": slept}


@contextlib.contextmanager
def _served(tmp_path: pathlib.Path, impl: str) -> Iterator[tuple[int, V1Peer]]:
    """A server (``impl``'s twins) with ``small.txt`` in its root, and a handshaken peer: its pid and the peer."""
    root = tmp_path / "ws"
    root.mkdir()
    (root / "small.txt").write_text("hello, smith-fast\n" * 4)
    env = {"SMITH_FAST_NO_EXTENSIONS": "1"} if impl == "py" else None
    server = ServerProcess(tmp_path, root=root, log_level="info", env=env).start()
    try:
        assert server.proc is not None
        peer = V1Peer(server.unix)
        peer.handshake()
        yield server.proc.pid, peer
        peer.close()
    finally:
        assert server.stop() == 0, "\n".join(server.raw_stderr[-30:])


def test_a_sequential_call_costs_one_write_and_one_wake(tmp_path: pathlib.Path, impl: str) -> None:
    with _served(tmp_path, impl) as (pid, peer):

        def call(rid: str) -> list[pb.Envelope]:
            peer.command(tool_call=pb.ToolCallCommand(request_id=rid, tool="fs.read", args=b'{"path":"small.txt"}'))
            return peer.until(terminal(rid))

        for i in range(20):  # warm: first imports, caches
            call(f"w{i}")
        before = _counts(pid)
        for i in range(CALLS):
            events = call(f"r{i}")
            assert [kind(e) for e in events] == ["state_change", "tool_result", "state_change"]
            assert events[1].event.tool_result.success
        after = _counts(pid)
        spent = {key: after[key] - before[key] for key in before}
        # Slack for the audit lines' writes (one per 50 ms or 16 KiB of them) and a stray wake.
        slack = CALLS // 20
        assert spent["writes"] <= CALLS + slack, spent  # the three events in one write
        assert spent["reads"] <= 2 * CALLS + slack, spent  # the command's read and the file's pread
        assert spent["sleeps"] <= CALLS + slack, spent  # one wait for the next command, nothing else


BATCH = 400


def test_many_answers_of_one_read_leave_in_several_writes(tmp_path: pathlib.Path, impl: str) -> None:
    """A pipelining peer's requests that arrive in one read are answered in writes of about
    WRITE_FLUSH_BYTES, not in one write once the whole batch is done: the peer starts on the first
    answers (and sends its next calls) while the server computes the rest."""
    from smith_fast.service.connection import WRITE_FLUSH_BYTES

    with _served(tmp_path, impl) as (pid, peer):
        frames = []
        for i in range(BATCH):
            peer.seq += 1
            envelope = pb.Envelope(timestamp=int(time.time() * 1000), sequence=peer.seq)
            envelope.command.tool_call.CopyFrom(pb.ToolCallCommand(request_id=f"r{i}", tool="fs.read", args=b'{"path":"small.txt"}'))
            data = envelope.SerializeToString()
            frames.append(encode_varint(len(data)) + data)
        blob = b"".join(frames)
        before = _counts(pid)
        peer.sock.sendall(blob)
        events = peer.until(terminal(f"r{BATCH - 1}"))
        after = _counts(pid)
        writes = after["writes"] - before["writes"]
        answered = sum(len(e.SerializeToString()) + 2 for e in events)  # each with its varint length (< 16 KiB)
        ended = [e for e in events if kind(e) == "tool_result"]
        assert len(ended) == BATCH and all(e.event.tool_result.success for e in ended)
        # Each write of answers is WRITE_FLUSH_BYTES (8 KiB) and at most one small frame more (more
        # writes if the requests came in several reads: each tick ends with a write; the audit
        # lines add a few of their own). Held to the tick's end, the ~100 KB went in one write.
        assert answered // (16 * 1024) <= writes <= answered // WRITE_FLUSH_BYTES + BATCH // 20, (writes, answered)
