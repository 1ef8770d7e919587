"""``python -m bench.report.calls [REPS]``: small tool calls side by side with the floor (what a
call costs over the least a server can do).

Pipelined ``fs.read`` of the 72 B file at 64 and 256 in flight, and sequential round trips, for
``v1`` over a Unix socket, ``v1`` over stdio (``serve --stdio``, protobuf frames on its pipes) and
the bare-loop ``floor``, interleaved (the order rotates per repetition), medians of REPS after one
warm-up. Prints calls/s, the server's CPU per call, the ratio to the floor and the driver process's
CPU per call. The report (``python -m bench.report``) measures 256 in flight on a socket only.

``python -m bench.report.calls --placement [REPS]``: the sequential round trips of ``v1`` and the
floor with the driver and each server placed by hand (every thread's affinity): side by side on one
CPU, apart on two, and left to the scheduler. It separates what a lone call costs because the two
processes wake each other across CPUs (an IPI, an idle CPU woken) from what the server's own path
costs when it runs cold, which one call at a time measures together.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from smith_fast.pb import smith_pb2 as pb

from .contenders import CONTENDERS, Client, Endpoint
from .drivers import READ_SIZE, ProtocolFailure, Tracker, cpu_seconds_of, pipeline, round_trips
from .meta import cpu_idle
from .wire import STATE, WIRES, View
from .workloads import SCALES, SMALL, Rep, _latency, _pipelined, _read, make_workspace

WINDOWS = (64, 256)
CALLS = 4000


class StdioV1:
    """``smith-fast serve --stdio`` as a child, spoken to with v1 frames on its pipes (the
    :class:`~bench.report.drivers.Session` face :func:`pipeline` and :func:`round_trips` use).
    Its stderr is drained in big reads, as a log collector would."""

    def __init__(self, root: pathlib.Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "smith_fast", "serve", "--stdio", "--root", str(root), "--log-level", "info",
             "--max-output", "2G"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._in, self._out, err = self.proc.stdin.fileno(), self.proc.stdout.fileno(), self.proc.stderr.fileno()
        threading.Thread(target=lambda: all(iter(lambda: os.read(err, 1 << 20), b"")), daemon=True).start()
        self.wire = WIRES["v1"]()
        self.send([self.wire.handshake((pb.CAPABILITY_SHELL_EXEC,))])
        while not any(v[0] == STATE and v[2] == pb.SERVICE_STATE_READY for v in self.recv()):
            pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, units: Sequence[bytes]) -> None:
        data = memoryview(b"".join(units))
        while data:
            data = data[os.write(self._in, data):]

    def recv(self) -> list[View]:
        data = os.read(self._out, READ_SIZE)
        if not data:
            raise ProtocolFailure("serve --stdio closed its stdout")
        return self.wire.decode(data)

    def encode(self, commands: Sequence[pb.Command]) -> list[bytes]:
        return [self.wire.encode(c) for c in commands]

    def pipeline(self, units: Sequence[bytes], tracker: Tracker, window: int) -> float:
        return pipeline(self, units, tracker, window)  # type: ignore[arg-type]  # the Session face

    def round_trips(self, unit: bytes, rid: str, count: int) -> list[float]:
        return round_trips(self, unit, rid, count)  # type: ignore[arg-type]  # the Session face

    def stop(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(10)


def _launch(root: pathlib.Path) -> tuple[dict[str, Endpoint], dict[str, Any]]:
    """``v1`` and the floor serving ``root``, and a client of each."""
    servers: dict[str, Endpoint] = {}
    for name in ("v1", "floor"):
        contender = next(c for c in CONTENDERS if c.name == name)
        servers[name] = contender.server(root.parent / "w", root)
        servers[name].launch()
    clients: dict[str, Any] = {}
    for name, server in servers.items():
        server.wait_ready(30)
        clients[name] = next(c for c in CONTENDERS if c.name == name).client(server)
    return servers, clients


def _stop(servers: dict[str, Endpoint], clients: dict[str, Any]) -> None:
    for client in clients.values():
        if isinstance(client, Client):
            client.close()
    for server in servers.values():
        server.stop()


def _interleaved(work: dict[tuple[str, object], Rep], pids: dict[str, int], keys: Sequence[object],
                 reps: int) -> Callable[[str, object, str], float]:
    """Run each of ``work`` (by server name and key) ``reps + 1`` times, the first discarded (the
    warm-up), the servers' order rotating per repetition; each repetition's figures gain the server's
    CPU µs per unit (``cpu``) and the driver's (``driver``). Returns ``med(name, key, figure)``, a
    figure's median."""
    figures: dict[tuple[str, object], list[dict[str, float]]] = {key: [] for key in work}
    names = list(pids)
    for rep in range(reps + 1):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for key in keys:
            for name in order:
                driver, spent = time.process_time(), cpu_seconds_of(pids[name])
                f = work[name, key]()
                f["cpu"] = (cpu_seconds_of(pids[name]) - spent) / f["_work"] * 1e6
                f["driver"] = (time.process_time() - driver) / f["_work"] * 1e6
                if rep:
                    figures[name, key].append(f)

    def med(name: str, key: object, figure: str) -> float:
        return statistics.median(f[figure] for f in figures[name, key])

    return med


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` on ``cpus`` (a thread's affinity is its own)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)


def placement(reps: int) -> int:
    """The round trips of ``v1`` and the floor, 1,000 calls a repetition, under each placement of
    the driver (this thread) and the servers; medians of ``reps`` after one warm-up."""
    everywhere = os.sched_getaffinity(0)
    if len(everywhere) < 2:
        print(f"--placement needs two CPUs; this process may run on {len(everywhere)}")
        return 1
    first, second = sorted(everywhere)[:2]
    places = {"side by side": ({first}, {first}), "apart": ({first}, {second}), "free": (everywhere, everywhere)}
    root = pathlib.Path(tempfile.mkdtemp()) / "root"
    make_workspace(root, SCALES["quick"])
    servers, clients = _launch(root)
    pids = {name: server.pid for name, server in servers.items()}
    work: dict[tuple[str, object], Rep] = {(name, "rt"): _latency(1000)(client, root) for name, client in clients.items()}
    print(f"round trips, 1,000 calls a repetition, medians of {reps}; load average {os.getloadavg()[0]:.1f}; cpu idle: {cpu_idle()}")
    try:
        for place, (driver, server_cpus) in places.items():
            os.sched_setaffinity(0, driver)
            for server in servers.values():
                _pin(server.pid, server_cpus)
            med = _interleaved(work, pids, ("rt",), reps)
            print(f"{place:13s}" + "".join(f"  {name} p50 {med(name, 'rt', 'p50 µs'):6.1f} µs, {med(name, 'rt', 'cpu'):5.1f} µs server CPU/call"
                                           for name in servers))
    finally:
        os.sched_setaffinity(0, everywhere)
        _stop(servers, clients)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--placement":
        return placement(int(argv[1]) if len(argv) > 1 else 6)
    reps = int(argv[0]) if argv else 5
    root = pathlib.Path(tempfile.mkdtemp()) / "root"
    make_workspace(root, SCALES["quick"])
    servers, clients = _launch(root)
    stdio = StdioV1(root)
    clients["v1-stdio"] = stdio
    pids = {name: server.pid for name, server in servers.items()}
    pids["v1-stdio"] = stdio.pid
    work: dict[tuple[str, object], Rep] = {}
    for name, client in clients.items():
        for window in WINDOWS:
            work[name, window] = _pipelined([("fs.read", _read(SMALL))], CALLS, window)(client, root)
        work[name, "rt"] = _latency(1000)(client, root)
    names = list(clients)
    med = _interleaved(work, pids, (*WINDOWS, "rt"), reps)
    print(f"medians of {reps}, {CALLS:,} calls each; load average {os.getloadavg()[0]:.1f}; cpu idle: {cpu_idle()}")
    for window in WINDOWS:
        floor = med("floor", window, "calls/s")
        for name in names:
            rate = med(name, window, "calls/s")
            print(f"pipelined, {window:>3} in flight  {name:9s} {rate:9,.0f} calls/s  {med(name, window, 'cpu'):5.1f} µs server CPU/call"
                  f"  ×{rate / floor:.2f} the floor  (driver {med(name, window, 'driver'):.1f} µs/call)")
    floor = med("floor", "rt", "p50 µs")
    for name in names:
        p50 = med(name, "rt", "p50 µs")
        print(f"round trip p50            {name:9s} {p50:7.1f} µs  {med(name, 'rt', 'cpu'):5.1f} µs server CPU/call  ×{floor / p50:.2f} the floor")
    _stop(servers, clients)
    stdio.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
