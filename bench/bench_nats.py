"""End to end: commands/s and events/s through ``smith-fast gateway`` + 1, + 2 and + 3 ``smith-fast
worker``s over a real nats-server (JetStream, file storage), next to a direct ``smith-fast serve``,
all on this machine, in one run.

Four topologies, the same client and the same bytes on the frontend's wire:

* ``serve``: one ``smith-fast serve``;
* ``gateway+N``: nats-server, one gateway, N workers (N = 1, 2, 3);
* ``gateway+1r``: as ``gateway+1``, the gateway with a fixed ``--gateway-id`` and the client's
  session resumable (``accept: resume``): every envelope is journaled in NATS before the client
  gets it (smith_fast/nats/journal.py), what a gateway restart costs while nothing restarts;
* ``gateway+2b``: as ``gateway+2``, the gateway with ``--max-session-buffer 256M``: each forwarded
  tool call reserves ``--tool-max-output`` (1 MiB) of its session's output budget while it is in
  flight (what bounds a gateway's memory for a peer that does not read), so with the default 16 MiB
  a session has ~15 calls in flight and the gateway's batches stay small.

Three workloads, each over the gateway's (or serve's) Unix socket, v1, from a plain blocking socket
(the driver below parses every envelope, as a client must):

* ``tools``: 1,000 pipelined ``fs.read`` calls, 64 in flight: commands/s (3 events each);
* ``shell``: 300 pipelined ``true`` shell commands, 32 in flight: commands/s (a process each);
* ``events``: one ``seq 1 100000`` at ``--chunk-size 32`` (~18,400 ShellOutput events): events/s.

Where the time goes: each entry also records the CPU seconds every process of the topology
(and the driver, this process) spent per command or per event during the measured rounds, from /proc, and the
NATS messages per command or event (nats-server's ``/varz`` ``in_msgs`` and ``out_msgs``: messages
clients published to the server and messages it delivered to clients, JetStream acknowledgements
and pull requests included). The summary gives each topology's best and median round and its
ratio to ``serve`` (medians): the machine is shared, so compare within one run.

Run: ``.venv/bin/pytest bench/bench_nats.py --benchmark-only -p no:cacheprovider``
(``-k tools`` for the tool calls alone).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import time
import urllib.request
import socket
import uuid
from collections.abc import Iterator

import pytest

from harness.nats_cluster import Cluster, free_port
from harness.server import ServerProcess
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from ._summary import print_summary

TOOL_CALLS = 1000
TOOL_WINDOW = 64
SHELLS = 300
SHELL_WINDOW = 32
EVENTS_COMMAND = "seq 1 100000"
CHUNK_SIZE = "32"
_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)
ROUNDS = 5
_RESULTS: list[str] = []
_RATES: dict[tuple[str, str], tuple[float, float, str]] = {}  # (workload, topology): best, median rate, unit
TOPOLOGIES = ["serve", "gateway+1", "gateway+1r", "gateway+2", "gateway+2b", "gateway+3"]


class Topology:
    """What runs one topology: the address a client connects to and the pids to account CPU for."""

    def __init__(self, name: str, tmp: pathlib.Path) -> None:
        self.name = name
        self.serve: ServerProcess | None = None
        self.cluster: Cluster | None = None
        self.monitor: str | None = None  # nats-server's monitoring endpoint
        self.resume = name.endswith("r")  # the session is journaled (gateway with --gateway-id)
        if name == "serve":
            self.serve = ServerProcess(tmp, "--chunk-size", CHUNK_SIZE, log_level="info").start()
            self.path = self.serve.sock_path
            self.root = self.serve.root
        else:
            workers = int(name.rpartition("+")[2].rstrip("rb"))
            gateway_args = ("--gateway-id", "bench") if self.resume else ()
            if name.endswith("b"):
                gateway_args += ("--max-session-buffer", "256M")
            self.cluster = Cluster(
                tmp, workers=workers, worker_args=("--chunk-size", CHUNK_SIZE, "--concurrency", "64"),
                gateway_args=gateway_args,
            )
            # the processes log at debug for the tests; here that would be measured too (info: "ready" only)
            self.cluster.worker_args = tuple(a if a != "debug" else "info" for a in self.cluster.worker_args)
            self.cluster.gateway.argv = [a if a != "debug" else "info" for a in self.cluster.gateway.argv]
            port = free_port()
            self.cluster.nats.extra = ("-m", str(port))
            self.monitor = f"http://127.0.0.1:{port}/varz"
            self.cluster.start()
            self.path = str(tmp / "gw" / "smith.sock")
            self.root = self.cluster.root
        (self.root / "small.txt").write_text("a small file\n")

    def pids(self) -> dict[str, int]:
        if self.serve is not None:
            return {"serve": self.serve.pid}
        assert self.cluster is not None and self.cluster.nats.proc is not None
        pids = {"gateway": self.cluster.gateway.pid, "nats-server": self.cluster.nats.proc.pid}
        for i, worker in enumerate(self.cluster.workers):
            pids[f"worker{i + 1}"] = worker.pid
        return pids

    def messages(self) -> tuple[int, int]:
        """(in_msgs, out_msgs) of nats-server so far; (0, 0) without one."""
        if self.monitor is None:
            return 0, 0
        with urllib.request.urlopen(self.monitor, timeout=10) as answer:
            varz = json.load(answer)
        return int(varz["in_msgs"]), int(varz["out_msgs"])

    def stop(self) -> None:
        if self.serve is not None:
            self.serve.stop()
        if self.cluster is not None:
            self.cluster.stop()


@pytest.fixture(scope="module", params=TOPOLOGIES)
def topology(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    topo = Topology(request.param, tmp_path_factory.mktemp(f"bench-nats-{request.param.replace('+', '-')}"))
    yield topo
    topo.stop()


@pytest.fixture(scope="module", autouse=True)
def _print_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    lines = []
    if _RESULTS:
        lines = ["\n\nbest round; CPU per unit by process (the driver in brackets); NATS messages per unit (in/out of nats-server):",
                 *_RESULTS, "", "median of rounds, and its ratio to serve's median (best in brackets):"]
        for (workload, name), (best, median, unit) in _RATES.items():
            direct = _RATES.get((workload, "serve"))
            ratio = f"{median / direct[1]:6.2f}x  ({best / direct[0]:.2f}x)" if direct else ""
            lines.append(f"  {workload:7s} {name:10s} {median:>10,.0f} {unit}s/s  {ratio}")
    print_summary(request, lines)
    _RESULTS.clear()
    _RATES.clear()


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (10 ms resolution)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class _Cpu:
    """CPU seconds of a topology's processes (and of this client) between two points."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        self.client = time.process_time()

    def per_unit(self, units: int) -> dict[str, float]:
        """Microseconds of CPU per unit, by process."""
        return {name: (_cpu_seconds(pid) - self.start[name]) / units * 1e6 for name, pid in self.pids.items()}

    def client_per_unit(self, units: int) -> float:
        """Microseconds of this process's CPU per unit (the driver: encoding, parsing every event)."""
        return (time.process_time() - self.client) / units * 1e6


class _Client:
    """A handshaken v1 session over a blocking Unix socket."""

    def __init__(self, path: str, resume: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(path)
        self.frames = FrameDecoder(1 << 26)
        hs = pb.Envelope()
        hs.command.handshake.version = 1
        hs.command.handshake.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
        if resume:
            hs.command.handshake.client_info["smith_fast.accept"] = "resume"
        self.sock.sendall(encode_frame(hs.SerializeToString()))
        while not any(e.WhichOneof("event_type") == "state_change" and e.state_change.state == pb.SERVICE_STATE_READY
                      and not e.state_change.HasField("request_id") for e in self.recv()):
            pass

    def recv(self) -> list[pb.Event]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise RuntimeError("the service closed the connection")
        return [pb.Envelope.FromString(frame).event for frame in self.frames.feed(data)]

    def close(self) -> None:
        self.sock.close()


def _encode(command: pb.Command) -> bytes:
    env = pb.Envelope()
    env.command.CopyFrom(command)
    return encode_frame(env.SerializeToString())


def _pipelined(client: _Client, commands: list[pb.Command], window: int) -> tuple[int, int]:
    """Send ``commands`` keeping ``window`` in flight; returns (events, bytes of output/results)
    once every one ended READY."""
    frames = [_encode(c) for c in commands]
    n = len(frames)
    sent = min(window, n)
    client.sock.sendall(b"".join(frames[:sent]))
    done = events = payload = 0
    while done < n:
        freed = 0
        for event in client.recv():
            events += 1
            kind = event.WhichOneof("event_type")
            if kind == "state_change" and event.state_change.state in _TERMINAL and event.state_change.HasField("request_id"):
                if event.state_change.state != pb.SERVICE_STATE_READY:
                    raise RuntimeError(f"request failed: {event}")
                done += 1
                freed += 1
            elif kind == "shell_output":
                payload += len(event.shell_output.stdout)
                if event.shell_output.finished and event.shell_output.exit_code != 0:
                    raise RuntimeError(f"command failed: {event}")
            elif kind == "tool_result":
                if not event.tool_result.success:
                    raise RuntimeError(f"tool failed: {event.tool_result.error}")
                payload += len(event.tool_result.result)
            elif kind == "error":
                raise RuntimeError(event.error.message)
        if freed and sent < n:
            k = min(freed, n - sent)
            client.sock.sendall(b"".join(frames[sent : sent + k]))
            sent += k
    return events, payload


def _tool_calls(n: int) -> list[pb.Command]:
    out = []
    for _ in range(n):
        cmd = pb.Command()
        cmd.tool_call.request_id = str(uuid.uuid4())
        cmd.tool_call.tool = "fs.read"
        cmd.tool_call.args = b'{"path": "small.txt"}'
        out.append(cmd)
    return out


def _shells(n: int, command: str) -> list[pb.Command]:
    out = []
    for _ in range(n):
        cmd = pb.Command()
        cmd.shell_exec.request_id = str(uuid.uuid4())
        cmd.shell_exec.command = command
        out.append(cmd)
    return out


_SEQ_BYTES = len("".join(f"{i}\n" for i in range(1, 100001)))


@pytest.mark.parametrize("workload", ["tools", "shell", "events"])
def test_nats_scale_out(benchmark, topology: Topology, workload: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = workload
    benchmark.name = topology.name
    client = _Client(topology.path, topology.resume)
    counted: list[int] = []

    def once() -> None:
        if workload == "tools":
            events, _ = _pipelined(client, _tool_calls(TOOL_CALLS), TOOL_WINDOW)
        elif workload == "shell":
            events, _ = _pipelined(client, _shells(SHELLS, "true"), SHELL_WINDOW)
        else:
            events, size = _pipelined(client, _shells(1, EVENTS_COMMAND), 1)
            assert size == _SEQ_BYTES
        counted.append(events)

    once()  # warm up (outside the CPU and message accounting)
    counted.clear()
    cpu = _Cpu(topology.pids())
    msgs_before = topology.messages()
    try:
        benchmark.pedantic(once, rounds=ROUNDS, iterations=1)
    finally:
        client.close()
    msgs_after = topology.messages()
    data = benchmark.stats.stats.data
    best, median = min(data), statistics.median(data)
    unit, units = ("event", counted[-1]) if workload == "events" else ("command", TOOL_CALLS if workload == "tools" else SHELLS)
    rate = units / best
    total = sum(counted) if workload == "events" else units * len(counted)
    per = cpu.per_unit(total)
    client_cpu = cpu.client_per_unit(total)
    msgs_in, msgs_out = ((msgs_after[0] - msgs_before[0]) / total, (msgs_after[1] - msgs_before[1]) / total)
    benchmark.extra_info.update({f"{unit}s_per_s": round(rate), f"median_{unit}s_per_s": round(units / median),
                                 "events_per_round": counted[-1],
                                 f"cpu_us_per_{unit}_client": round(client_cpu, 1),
                                 f"nats_msgs_in_per_{unit}": round(msgs_in, 2), f"nats_msgs_out_per_{unit}": round(msgs_out, 2),
                                 **{f"cpu_us_per_{unit}_{k}": round(v, 1) for k, v in per.items()}})
    _RATES[(workload, topology.name)] = (rate, units / median, unit)
    where = ", ".join(f"{k} {v:.1f}" for k, v in per.items()) + f" (client {client_cpu:.1f})"
    nats = f"   NATS msgs/{unit}: {msgs_in:.2f} in {msgs_out:.2f} out" if topology.monitor else ""
    _RESULTS.append(f"  {workload:7s} {topology.name:10s} {rate:>10,.0f} {unit}s/s  {counted[-1] / best:>9,.0f} events/s   CPU µs/{unit}: {where}{nats}")
