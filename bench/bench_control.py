"""What steering a running command costs (PROTOCOL.md, "Process control"): a Cancel, and a stdin round trip.

Run: ``.venv/bin/pytest bench/bench_control.py --benchmark-only -p no:cacheprovider``

A real ``smith-fast serve`` (uvloop, Unix socket, ``--kill-grace 2s``) driven from this process with
a plain blocking socket speaking v1, so the client's own overhead is small:

* ``cancel-*``: the time from sending ``CancelCommand`` to receiving the request's terminal
  ``StateChange(ERROR)`` (after the final ShellOutput with the exit code and the ErrorEvent
  ``reason=cancelled``), for a command that exits on SIGTERM (``sleep``: TERM, reap, final events)
  and for a ``ToolCall`` (``shell.run``, whose task is cancelled). The command is started and seen
  running in the round's setup, which is not timed.
* ``stdin-*``: one long-lived ``cat`` with ``open_stdin`` (``binary_output``), or on a ``pty``;
  a round writes 64 bytes in a ``StdinCommand`` and waits until they come back as ShellOutput.
  The floor is the same write and read-back on a ``cat`` this process runs itself over a pipe.

A summary with the medians and the ratio to the floor is printed after the module.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.server import ServerProcess
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from ._summary import print_summary

PAYLOAD = b"x" * 63 + b"\n"
RESULTS: dict[str, float] = {}


class Wire:
    """A blocking v1 session over the service's Unix socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.decoder = FrameDecoder(64 << 20)
        self.pending: list[pb.Event] = []
        self.send(pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC])))
        self.until(lambda e: e.WhichOneof("event_type") == "ready")

    def send(self, command: pb.Command) -> None:
        self.sock.sendall(encode_frame(pb.Envelope(command=command).SerializeToString()))

    def until(self, pred: Any) -> pb.Event:
        while True:
            while self.pending:
                event = self.pending.pop(0)
                if pred(event):
                    return event
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("the service closed the connection")
            for frame in self.decoder.feed(data):
                env = pb.Envelope.FromString(frame)
                if env.WhichOneof("payload") == "event":
                    self.pending.append(env.event)

    def close(self) -> None:
        self.sock.close()


def _terminal(rid: str) -> Any:
    return lambda e: (e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == rid
                      and e.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("bench-control")
    srv = ServerProcess(tmp, "--kill-grace", "2s", tcp=False, log_level="info", keep=200).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _lines())


def _lines() -> Iterator[str]:
    if not RESULTS:
        return
    yield "process control: medians"
    for name, value in sorted(RESULTS.items()):
        yield f"  {name:<22} {value * 1e6:9.0f} µs"
    if "stdin-pipe" in RESULTS and "stdin-floor" in RESULTS:
        yield f"  stdin round trip over the service / local pipe floor: {RESULTS['stdin-pipe'] / RESULTS['stdin-floor']:.1f}x"


@pytest.fixture
def wire(server: ServerProcess) -> Iterator[Wire]:
    w = Wire(server.sock_path)
    yield w
    w.close()


def _median(benchmark: Any) -> float:
    return float(benchmark.stats.stats.median)


@pytest.mark.benchmark(group="cancel")
@pytest.mark.parametrize("kind", ["shell_exec", "tool_call"])
def test_cancel(benchmark: Any, wire: Wire, kind: str) -> None:
    state: dict[str, str] = {}

    def setup() -> None:
        rid = state["rid"] = str(uuid.uuid4())
        if kind == "shell_exec":
            wire.send(pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command="echo up; exec sleep 300")))
            wire.until(lambda e: e.WhichOneof("event_type") == "shell_output" and e.shell_output.stdout == "up\n")
        else:
            wire.send(pb.Command(tool_call=pb.ToolCallCommand(request_id=rid, tool="shell.run", args=b'{"command": "sleep 300"}')))
            wire.until(lambda e: e.WhichOneof("event_type") == "state_change" and e.state_change.state == pb.SERVICE_STATE_PROCESSING)
            time.sleep(0.05)  # the tool's process is running

    def cancel() -> None:
        rid = state["rid"]
        wire.send(pb.Command(cancel=pb.CancelCommand(request_id=rid)))
        event = wire.until(_terminal(rid))
        assert event.state_change.state == pb.SERVICE_STATE_ERROR

    benchmark.pedantic(cancel, setup=setup, rounds=30, iterations=1)
    RESULTS[f"cancel-{kind}"] = _median(benchmark)


@pytest.mark.benchmark(group="stdin")
@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_stdin_round_trip(benchmark: Any, wire: Wire, mode: str) -> None:
    rid = str(uuid.uuid4())
    fields: dict[str, Any] = {"open_stdin": True} if mode == "pipe" else {"pty": pb.PtyRequest(rows=24, cols=200)}
    command = "cat" if mode == "pipe" else "stty -echo raw; echo ready; cat"
    wire.send(pb.Command(shell_exec=pb.ShellExecCommand(request_id=rid, command=command, binary_output=True, **fields)))
    got = bytearray()

    def take(e: pb.Event) -> bool:
        if e.WhichOneof("event_type") == "shell_output" and e.shell_output.request_id == rid:
            got.extend(e.shell_output.stdout_bytes)
        return len(got) >= len(PAYLOAD)

    if mode == "pty":
        wire.until(lambda e: take(e) or b"ready" in got)
        got.clear()

    def round_trip() -> None:
        got.clear()
        wire.send(pb.Command(stdin=pb.StdinCommand(request_id=rid, data=PAYLOAD)))
        wire.until(take)

    benchmark.pedantic(round_trip, rounds=300, iterations=1, warmup_rounds=10)
    RESULTS[f"stdin-{mode}"] = _median(benchmark)
    wire.send(pb.Command(cancel=pb.CancelCommand(request_id=rid)))
    wire.until(_terminal(rid))


@pytest.mark.benchmark(group="stdin")
def test_stdin_floor(benchmark: Any) -> None:
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    fin, fout = proc.stdin.fileno(), proc.stdout.fileno()

    def round_trip() -> None:
        os.write(fin, PAYLOAD)
        n = 0
        while n < len(PAYLOAD):
            n += len(os.read(fout, 65536))

    try:
        benchmark.pedantic(round_trip, rounds=300, iterations=1, warmup_rounds=10)
    finally:
        proc.kill()
        proc.wait()
    RESULTS["stdin-floor"] = _median(benchmark)
