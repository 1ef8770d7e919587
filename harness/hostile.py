"""Hostile load against a real server: the attacks a hostile peer tried (a peer that stops reading,
a busy hook, a ReDoS search, large batches, oversize frames before the handshake, hoarding hooks)
and the honest sessions beside them.

Shared by ``tests/test_hostile_load.py`` (the honest sessions lose no event, the server's RSS stays
under its bound) and ``bench/bench_hostile_load.py`` (the honest p99 round trip under attack as a
ratio to an unloaded run).

Each attack is a function in :data:`ATTACKS` that runs in a thread of its own against the server's
addresses until its ``stop`` event is set, then closes what it opened. An attack whose fix lands
on another branch is added here as one more row (the names waiting for one are in
:data:`PENDING`); nothing else changes.
"""

from __future__ import annotations

import json
import pathlib
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast.pb import smith_pb2 as pb

from harness.frames import read_envelope

__all__ = ["ATTACKS", "PENDING", "SERVER_ARGS", "Honest", "Peer", "prepare_root", "rss_kib", "run_attacks"]

MB = 1 << 20
BUSY_HOOK_MS = 400  # under the default 0.5 s hook time limit
BUSY_HOOK = (
    "function beforeToolCall(p) { const t = Date.now(); while (Date.now() - t < %d) {} return {action: 'allow'}; }"
    % BUSY_HOOK_MS
)


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``) of ``pid`` in KiB, from /proc."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise LookupError(f"no {field_name} in /proc/{pid}/status")


def prepare_root(root: pathlib.Path) -> None:
    """The files the attacks and the honest sessions read."""
    (root / "big.bin").write_bytes(b"x" * MB)
    (root / "small.txt").write_text("hello\n")


def _connect(address: str, rcvbuf: int | None = None) -> socket.socket:
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX)
        target: Any = address[5:]
    else:
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        sock = socket.socket(socket.AF_INET)
        target = (host, int(port))
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect(target)
    return sock


def frame(env: pb.Envelope) -> bytes:
    data = env.SerializeToString()
    prefix: bytes = _VarintBytes(len(data))
    return prefix + data


def command(**kw: Any) -> bytes:
    return frame(pb.Envelope(command=pb.Command(**kw)))


class Peer:
    """A blocking v1 peer (protobuf's own varint codec, not the service's)."""

    def __init__(self, address: str, rcvbuf: int | None = None) -> None:
        self.sock = _connect(address, rcvbuf)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> pb.Envelope:
        env, self.buf = read_envelope(self.sock, self.buf)
        return env

    def handshake(self, *caps: int) -> None:
        self.send(command(handshake=pb.HandshakeCommand(version=1, capabilities=list(caps))))  # type: ignore[arg-type]  # Capability values
        while not self.recv().event.HasField("ready"):
            pass

    def until_ended(self, rids: set[str]) -> list[pb.Envelope]:
        """Envelopes until every request of ``rids`` reached its terminal state."""
        out = []
        left = set(rids)
        while left:
            env = self.recv()
            out.append(env)
            sc = env.event.state_change
            if env.event.HasField("state_change") and sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                left.discard(sc.request_id)
        return out

    def close(self) -> None:
        self.sock.close()


# ---- the attacks ---------------------------------------------------------------------------------

Attack = Callable[[str, threading.Event], None]
"""``attack(address, stop)``: runs until ``stop`` is set."""


def non_reading_peer(address: str, stop: threading.Event) -> None:
    """SO_RCVBUF=4096, a handshake, 1000 ``fs.read`` of a 1 MB file, never read."""
    peer = Peer(address, rcvbuf=4096)
    peer.send(command(handshake=pb.HandshakeCommand(version=1)))
    data = b"".join(
        command(tool_call=pb.ToolCallCommand(request_id=f"r{i}", tool="fs.read", args=b'{"path":"big.bin"}')) for i in range(1000)
    )
    peer.sock.setblocking(False)
    sent = 0
    while not stop.is_set() and sent < len(data):
        try:
            sent += peer.sock.send(data[sent : sent + 65536])
        except BlockingIOError:
            stop.wait(0.05)
    stop.wait()
    peer.close()


def busy_js_hook(address: str, stop: threading.Event) -> None:
    """A hook that busy-waits just under its time limit on every call, 20 calls pipelined at a time."""
    peer = Peer(address)
    peer.handshake(pb.CAPABILITY_HOOKS_JS)
    peer.send(command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=BUSY_HOOK)))
    peer.until_ended({"h"})
    n = 0
    while not stop.is_set():
        rids = {f"b{n + i}" for i in range(20)}
        n += 20
        peer.send(b"".join(command(tool_call=pb.ToolCallCommand(request_id=r, tool="tools.list", args=b"{}")) for r in rids))
        peer.until_ended(rids)
    peer.close()


def redos_search(address: str, stop: threading.Event) -> None:
    """``(a+)+$`` over ``aaaa…a!`` (exponential for a backtracking engine), again and again."""
    peer = Peer(address)
    peer.handshake()
    content = json.dumps({"path": "r.txt", "content": "a" * 25 + "!\n"}).encode()
    peer.send(command(tool_call=pb.ToolCallCommand(request_id="w", tool="fs.write", args=content)))
    peer.until_ended({"w"})
    n = 0
    while not stop.is_set():
        rid = f"s{n}"
        n += 1
        args = json.dumps({"pattern": "(a+)+$", "path": "r.txt"}).encode()
        peer.send(command(tool_call=pb.ToolCallCommand(request_id=rid, tool="fs.search", args=args, timeout_ms=500)))
        peer.until_ended({rid})
    peer.close()


def large_batch(address: str, stop: threading.Event) -> None:
    """One ``BatchCommand`` of 200,000 calls (5.7 MB), again and again, reading what comes back
    (it is refused whole past ``--max-batch-commands``, each readable request id ended)."""
    peer = Peer(address)
    peer.handshake()
    calls = [pb.Command(tool_call=pb.ToolCallCommand(request_id=f"x{i}", tool="tools.list", args=b"{}")) for i in range(200_000)]
    data = frame(pb.Envelope(batch_command=pb.BatchCommand(commands=calls)))
    while not stop.is_set():
        peer.sock.settimeout(60)
        peer.send(data)
        peer.sock.settimeout(0.2)
        quiet = 0
        while not stop.is_set() and quiet < 3:  # drain until the answers stop coming
            try:
                chunk = peer.sock.recv(1 << 20)
            except TimeoutError:
                quiet += 1
                continue
            if not chunk:
                return
            quiet = 0
    peer.close()


def oversize_preauth_frames(address: str, stop: threading.Event) -> None:
    """Connections that declare a 16 MiB frame and send zeros, no handshake (refused past
    ``--max-handshake-frame-size``; the decoder holds what arrived, not what was declared)."""
    prefix = _VarintBytes(16_777_215)
    zeros = b"\0" * (256 << 10)
    while not stop.is_set():
        socks = []
        for _ in range(20):
            try:
                sock = _connect(address)
                sock.settimeout(1)
                sock.sendall(prefix + zeros)
            except OSError:  # the service closed it: what it must do
                continue
            socks.append(sock)
        stop.wait(0.5)
        for sock in socks:
            sock.close()


HOOK_HOARD = "// %d\nconst held = new Uint8Array(28 << 20); held.fill(1);\nfunction beforeToolCall(p) { return {action: 'allow'}; }"
"""A JS hook that holds 28 MiB for as long as it is loaded (the number keeps each script distinct)."""


def many_hooks(address: str, stop: threading.Event) -> None:
    """Sessions that load 30 hooks each holding 28 MiB (840 MB from one session if nothing bounded it); the
    service loads what ``--max-session-hook-memory`` allows and refuses the rest. Each session
    keeps its hooks for a few seconds, then a new one tries again."""
    n = 0
    while not stop.is_set():
        peer = Peer(address)
        peer.handshake(pb.CAPABILITY_HOOKS_JS)
        for _ in range(30):
            n += 1
            peer.send(command(hook_load=pb.HookLoadCommand(request_id=f"m{n}", hook_type="js", script=HOOK_HOARD % n)))
            peer.until_ended({f"m{n}"})
            if stop.is_set():
                break
        stop.wait(3)
        peer.close()


ATTACKS: dict[str, Attack] = {
    "non_reading_peer": non_reading_peer,
    "busy_js_hook": busy_js_hook,
    "redos_search": redos_search,
    "large_batch": large_batch,
    "oversize_preauth_frames": oversize_preauth_frames,
    "many_hooks": many_hooks,
}
"""The hostile attacks run at once by tests/test_hostile_load.py and bench/bench_hostile_load.py."""

PENDING: dict[str, str] = {}
"""Hostile attacks tested on their own rather than in this load (and why)."""

SERVER_ARGS = ("--max-session-hook-memory", "64M")
"""The server's options under this load: the hook budget of a session at 64 MiB (two 28 MiB hooks
of ``many_hooks``; the default, 256 MiB, is more than the load's RSS bound allows for)."""


def run_attacks(address: str, names: list[str], stop: threading.Event) -> list[threading.Thread]:
    """Start the named attacks (one thread each); they end when ``stop`` is set."""
    threads = []
    for name in names:
        thread = threading.Thread(target=_quietly, args=(ATTACKS[name], address, stop), name=f"attack-{name}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def _quietly(attack: Attack, address: str, stop: threading.Event) -> None:
    try:
        attack(address, stop)
    except (OSError, EOFError):  # the service may close a hostile connection: that is its right
        pass


# ---- the honest sessions -------------------------------------------------------------------------


@dataclass
class Honest:
    """One honest session: rounds of 4 pipelined tool calls and a shell command, each round checked
    for every event (the tool results, the shell's output and exit code, one terminal state per
    request, contiguous sequence numbers).

    Attributes:
        round_trips: seconds from a round's first send to its last terminal state.
        problems: what was missing or wrong (empty for a session that lost nothing).
    """

    address: str
    index: int
    round_trips: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event, rounds: int | None = None) -> None:
        try:
            self._run(stop, rounds)
        except (OSError, EOFError) as exc:
            self.problems.append(f"session {self.index}: {exc!r}")

    def _run(self, stop: threading.Event, rounds: int | None) -> None:
        peer = Peer(self.address)
        peer.handshake(pb.CAPABILITY_SHELL_EXEC)
        last_seq: int | None = None
        n = 0
        while not stop.is_set() and (rounds is None or n < rounds):
            tag = f"{self.index}-{n}-{uuid.uuid4().hex[:6]}"
            tools = {f"t{i}-{tag}": ("fs.read" if i % 2 else "tools.list") for i in range(4)}
            shell = f"x-{tag}"
            data = b"".join(
                command(tool_call=pb.ToolCallCommand(
                    request_id=rid, tool=tool, args=b'{"path":"small.txt"}' if tool == "fs.read" else b"{}"))
                for rid, tool in tools.items()
            )
            data += command(shell_exec=pb.ShellExecCommand(request_id=shell, command=f"echo {tag}"))
            start = time.perf_counter()
            peer.send(data)
            envs = peer.until_ended({*tools, shell})
            self.round_trips.append(time.perf_counter() - start)
            for env in envs:
                if last_seq is not None and env.sequence != last_seq + 1:
                    self.problems.append(f"session {self.index}: sequence {last_seq} then {env.sequence}")
                last_seq = env.sequence
            self._check(envs, tools, shell, tag)
            n += 1
        peer.close()

    def _check(self, envs: list[pb.Envelope], tools: dict[str, str], shell: str, tag: str) -> None:
        ends: dict[str, list[int]] = {}
        results: dict[str, pb.ToolResultEvent] = {}
        stdout = ""
        exit_code: int | None = None
        for env in envs:
            ev = env.event
            kind = ev.WhichOneof("event_type")
            if kind == "state_change" and ev.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                ends.setdefault(ev.state_change.request_id, []).append(ev.state_change.state)
            elif kind == "tool_result":
                results[ev.tool_result.request_id] = ev.tool_result
            elif kind == "shell_output" and ev.shell_output.request_id == shell:
                stdout += ev.shell_output.stdout
                if ev.shell_output.HasField("exit_code"):
                    exit_code = ev.shell_output.exit_code
            elif kind == "error":
                self.problems.append(f"session {self.index}: error {ev.error.message}")
        for rid in [*tools, shell]:
            if ends.get(rid) != [pb.SERVICE_STATE_READY]:
                self.problems.append(f"session {self.index}: {rid} ended {ends.get(rid)}")
        for rid in tools:
            if rid not in results or not results[rid].success:
                self.problems.append(f"session {self.index}: {rid} has no successful result")
        if stdout != tag + "\n" or exit_code != 0:
            self.problems.append(f"session {self.index}: shell {shell} said {stdout!r}, exit {exit_code}")
