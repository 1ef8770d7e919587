"""Raw peers for the reliability and security tests: blocking sockets, protobuf's own varint codec
(not smith_fast.framing) for v1 and plain ``json`` for v0, to any ``unix:``/``tcp:`` address."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast.pb import smith_pb2 as pb

from harness.frames import read_envelope


def open_socket(address: str, timeout: float = 10.0) -> socket.socket:
    """A connected blocking socket to ``unix:PATH`` or ``tcp:HOST:PORT``."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX)
        target: Any = address[5:]
    else:
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET)
        target = (host.strip("[]"), int(port))
    sock.settimeout(timeout)
    sock.connect(target)
    return sock


class V1Peer:
    """Writes and reads varint-delimited Envelopes."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.sock = open_socket(address, timeout)
        self.buf = b""
        self.seq = 0

    def send(self, env: pb.Envelope) -> None:
        data = env.SerializeToString()
        self.sock.sendall(_VarintBytes(len(data)) + data)

    def command(self, **kw: Any) -> None:
        self.seq += 1
        env = pb.Envelope(timestamp=int(time.time() * 1000), sequence=self.seq)
        env.command.CopyFrom(pb.Command(**kw))
        self.send(env)

    def handshake(self, caps: tuple[int, ...] = (pb.CAPABILITY_SHELL_EXEC,), **client_info: str) -> list[pb.Envelope]:
        self.command(handshake=pb.HandshakeCommand(version=1, capabilities=list(caps), client_info=client_info))
        return self.until(lambda e: e.event.WhichOneof("event_type") in ("ready", "error"))

    def recv(self) -> pb.Envelope:
        """The next envelope; EOFError when the service closed the connection."""
        env, self.buf = read_envelope(self.sock, self.buf)
        return env

    def until(self, pred: Callable[[pb.Envelope], bool]) -> list[pb.Envelope]:
        out = []
        while True:
            env = self.recv()
            out.append(env)
            if pred(env):
                return out

    def rest(self) -> list[pb.Envelope]:
        """Every envelope until the service closes the connection."""
        out = []
        try:
            while True:
                out.append(self.recv())
        except EOFError:
            return out

    def close(self) -> None:
        self.sock.close()


class V0Peer:
    """Writes and reads JSON lines."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.sock = open_socket(address, timeout)
        self.buf = b""

    def send(self, obj: object) -> None:
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        """Bytes as they are (broken lines, oversize lines)."""
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def until(self, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        out = []
        while True:
            msg = self.recv()
            out.append(msg)
            if pred(msg):
                return out

    def rest(self) -> list[dict[str, Any]]:
        out = []
        try:
            while True:
                out.append(self.recv())
        except EOFError:
            return out

    def close(self) -> None:
        self.sock.close()


def kind(env: pb.Envelope) -> str | None:
    """The event type an envelope carries (None for non-event envelopes)."""
    return env.event.WhichOneof("event_type") if env.HasField("event") else None


def errors(envs: list[pb.Envelope]) -> list[pb.ErrorEvent]:
    return [e.event.error for e in envs if kind(e) == "error"]


def terminal(rid: str) -> Callable[[pb.Envelope], bool]:
    """A predicate: the envelope is request ``rid``'s terminal StateChange (READY or ERROR)."""

    def pred(env: pb.Envelope) -> bool:
        sc = env.event.state_change
        return kind(env) == "state_change" and sc.request_id == rid and sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)

    return pred
