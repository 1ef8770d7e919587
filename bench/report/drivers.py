"""Blocking-socket drivers for a real ``smith-fast serve``: pipelined requests, round trips, fan-out.

Everything here talks to the service over its Unix socket with plain blocking sockets: no asyncio
in the client, so the client's own overhead is small and identical for every wire (v1 frames,
v1 with ``BatchEvent``, v0 JSON lines). The drivers see only :data:`~bench.report.wire.View`
tuples and a :class:`Tracker`, which the gRPC drivers (``bench.report.grpc_client``) share.

A request counts as done at its terminal ``StateChange(READY)``. The tracker checks on the way
that a tool call brought ``StateChange(PROCESSING)`` and a successful ``ToolResult`` first, and
that a shell command finished with exit code 0, so a benchmark never times a failure.
"""

from __future__ import annotations

import os
import pathlib
import selectors
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from smith_fast.pb import smith_pb2 as pb
from .wire import ERROR, OUTPUT, RESULT, STATE, WIRES, View, Wire

__all__ = [
    "READ_SIZE",
    "PipelineResult",
    "ProtocolFailure",
    "Session",
    "ShellResult",
    "Tracker",
    "cpu_seconds_of",
    "pipeline",
    "pipeline_many",
    "pipelined_tool_calls",
    "request_ids",
    "round_trip",
    "round_trips",
    "shell_exec",
    "tool_call_request_ids",
]

READ_SIZE = 1 << 20
_READY = pb.SERVICE_STATE_READY
_PROCESSING = pb.SERVICE_STATE_PROCESSING
_ERROR = pb.SERVICE_STATE_ERROR
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# stages of a request in a Tracker
_SENT, _STARTED, _ANSWERED, _DONE = range(4)


class ProtocolFailure(AssertionError):
    """The service answered something a benchmark did not expect (an error, a failed tool ...)."""


def request_ids(n: int) -> list[str]:
    """``n`` UUID request ids (v0 peers accept nothing else; v1 gets the same ones)."""
    return [str(uuid.uuid4()) for _ in range(n)]


tool_call_request_ids = request_ids


class Tracker:
    """Follows a set of requests through their events until each has ended.

    Args:
        tool_rids: request ids of tool calls.
        shell_rids: request ids of shell commands.
    """

    __slots__ = ("stage", "left", "events", "results", "output")

    def __init__(self, tool_rids: Iterable[str], shell_rids: Iterable[str] = ()) -> None:
        self.stage = dict.fromkeys(tool_rids, _SENT)
        self.stage.update(dict.fromkeys(shell_rids, _SENT))
        self.left = len(self.stage)
        self.events = 0
        self.results = 0
        self.output = 0

    def feed(self, views: list[View]) -> int:
        """Account for ``views``; return how many requests they ended.

        Raises:
            ProtocolFailure: an ErrorEvent, a failed tool or command, an event for an unknown
                request, or events out of order.
        """
        stage = self.stage
        ended = 0
        for kind, rid, a, b in views:
            if kind == OUTPUT:
                self.output += a
                if b is not None:
                    if b != 0 or stage.get(rid) != _STARTED:
                        raise ProtocolFailure(f"command {rid} finished with exit code {b} at stage {stage.get(rid)}")
                    stage[rid] = _ANSWERED
            elif kind == STATE:
                if a == _READY:
                    if stage.get(rid) != _ANSWERED:
                        raise ProtocolFailure(f"request {rid!r} ended at stage {stage.get(rid)}")
                    stage[rid] = _DONE
                    ended += 1
                elif a == _PROCESSING:
                    if stage.get(rid) != _SENT:
                        raise ProtocolFailure(f"request {rid!r} started twice or is unknown")
                    stage[rid] = _STARTED
                elif a == _ERROR:
                    raise ProtocolFailure(f"request {rid!r} ended in the ERROR state")
            elif kind == RESULT:
                if not a:
                    raise ProtocolFailure(f"tool failed: {b}")
                if stage.get(rid) != _STARTED:
                    raise ProtocolFailure(f"ToolResult for {rid!r} at stage {stage.get(rid)}")
                stage[rid] = _ANSWERED
                self.results += 1
            elif kind == ERROR:
                raise ProtocolFailure(f"ErrorEvent for {rid!r}: {a}")
        self.events += len(views)
        self.left -= ended
        return ended


class Session:
    """One Unix-socket connection to the service, handshaken.

    Args:
        path: the service's Unix socket.
        wire: ``"v1"`` or ``"v0"``, or a :class:`~bench.report.wire.Wire`.
        accept: ``client_info["smith_fast.accept"]`` of the handshake (v1 only), e.g. ``"batch_event"``.
        timeout: seconds a read may wait before ``TimeoutError`` (a hung server fails the run, not hangs it).
        capabilities: what the handshake asks for (``CAPABILITY_*`` numbers).

    Raises:
        ProtocolFailure: the handshake was refused.
    """

    def __init__(self, path: str, wire: str | Wire = "v1", accept: str | None = None, timeout: float = 120.0,
                 capabilities: Iterable[pb.Capability] = (pb.CAPABILITY_SHELL_EXEC,)) -> None:
        self.wire = WIRES[wire]() if isinstance(wire, str) else wire
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.sock.sendall(self.wire.handshake(capabilities, accept=accept))
        while True:  # StateChange(STARTING), Ready, StateChange(READY)
            views = self.recv()
            if any(v[0] == ERROR for v in views):
                raise ProtocolFailure(f"handshake refused: {views}")
            if any(v[0] == STATE and v[2] == _READY for v in views):
                break

    def send(self, units: Sequence[bytes]) -> None:
        """Send encoded commands, all in one write."""
        self.sock.sendall(b"".join(units))

    def recv(self) -> list[View]:
        """One read, decoded.

        Raises:
            ProtocolFailure: the service closed the connection.
        """
        data = self.sock.recv(READ_SIZE)
        if not data:
            raise ProtocolFailure("the service closed the connection")
        return self.wire.decode(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pipeline(session: Session, units: Sequence[bytes], tracker: Tracker, window: int) -> float:
    """Send ``units`` keeping ``window`` requests in flight; return the seconds until all ended.

    New requests go out as soon as earlier ones end, all those freed by one read in one write:
    the batching any pipelining client gets, whatever its wire.
    """
    n = len(units)
    send, recv, feed = session.send, session.recv, tracker.feed
    sent = min(window, n)
    start = time.perf_counter()
    send(units[:sent])
    while tracker.left:
        ended = feed(recv())
        if ended and sent < n:
            k = min(ended, n - sent)
            send(units[sent : sent + k])
            sent += k
    return time.perf_counter() - start


def round_trips(session: Session, unit: bytes, rid: str, count: int) -> list[float]:
    """``count`` sequential tool calls (the same request, one at a time); each one's seconds."""
    send, recv = session.send, session.recv
    out = []
    for _ in range(count):
        tracker = Tracker((rid,))
        start = time.perf_counter()
        send((unit,))
        while tracker.left:
            tracker.feed(recv())
        out.append(time.perf_counter() - start)
    return out


def pipeline_many(sessions: Sequence[Session], units: Sequence[Sequence[bytes]], trackers: Sequence[Tracker],
                  window: int) -> float:
    """:func:`pipeline` on every session at once, from one thread; the seconds until all ended.

    The sockets are multiplexed with a selector, so a session is read as soon as it has data.
    """
    sel = selectors.DefaultSelector()
    sent = [min(window, len(u)) for u in units]
    start = time.perf_counter()
    for i, session in enumerate(sessions):
        sel.register(session.sock, selectors.EVENT_READ, i)
        session.send(units[i][: sent[i]])
    running = len(sessions)
    while running:
        for key, _ in sel.select():
            i = key.data
            session, tracker, mine = sessions[i], trackers[i], units[i]
            ended = tracker.feed(session.recv())
            if ended and sent[i] < len(mine):
                k = min(ended, len(mine) - sent[i])
                session.send(mine[sent[i] : sent[i] + k])
                sent[i] += k
            if not tracker.left:
                sel.unregister(session.sock)
                running -= 1
    elapsed = time.perf_counter() - start
    sel.close()
    return elapsed


# --- the shapes bench/bench_service.py uses -------------------------------------------------------


@dataclass
class PipelineResult:
    """What :func:`pipelined_tool_calls` saw."""

    requests: int
    results: int
    events: int
    seconds: float


def pipelined_tool_calls(session: Session, requests: Sequence[bytes], rids: Sequence[str], window: int) -> PipelineResult:
    """:func:`pipeline` of tool calls, with their count of results."""
    tracker = Tracker(rids)
    seconds = pipeline(session, requests, tracker, window)
    return PipelineResult(len(requests), tracker.results, tracker.events, seconds)


def round_trip(session: Session, request: bytes, rid: str) -> None:
    """One tool call, sequential: send it, read until its terminal state change."""
    round_trips(session, request, rid, 1)


@dataclass
class ShellResult:
    """What :func:`shell_exec` saw: characters of output (stdout + stderr), events, time to the final event."""

    output_chars: int
    events: int
    exit_code: int
    seconds: float

    @property
    def stdout_bytes(self) -> int:
        """``output_chars``: bytes for the ASCII-only stdout of ``bench/bench_service.py``'s commands."""
        return self.output_chars


def shell_exec(session: Session, request: bytes, rid: str) -> ShellResult:
    """Run one command; ``seconds`` runs from its send to the read bringing its terminal event.

    Raises:
        ProtocolFailure: an ErrorEvent, or a non-zero exit code.
    """
    tracker = Tracker((), (rid,))
    seconds = pipeline(session, (request,), tracker, 1)
    return ShellResult(tracker.output, tracker.events, 0, seconds)


def cpu_seconds_of(pid: int) -> float:
    """CPU time of process ``pid`` so far, all its live threads.

    Read from each thread's ``/proc/PID/task/TID/schedstat`` (nanoseconds of run time), whose
    resolution makes a per-repetition figure meaningful even for runs of a few milliseconds;
    where the kernel has no schedstat, from ``/proc/PID/stat`` (user + system, 10 ms ticks). A
    thread that exits between two readings takes its time with it: the servers measured here keep
    their threads (the gRPC poller, the default executor's workers) for their whole life.
    """
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(pathlib.Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except FileNotFoundError:  # the thread is gone
                continue
    except FileNotFoundError:
        total = 0
    if total:
        return total / 1e9
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK
