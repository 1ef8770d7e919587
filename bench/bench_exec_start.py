"""ShellExec start to first output and to the final event, service vs no server, side by side.

Run: ``.venv/bin/python -m bench.bench_exec_start [--count 200] [--gap SECONDS [--burst N] [--new-session] [--pty]] [--network on|off] [--sandbox MODE] [--base PYTHON]``

The start-up target: a ``ShellExec`` of ``true`` and of ``echo hi`` through a real ``smith-fast serve``
(v1 over its Unix socket, uvloop, Cython wire core, sandbox on: by default ``--sandbox
workspace-write --network on``) against the report's "no server" reference
(:class:`bench.report.stdio.SpawnClient`: ``posix_spawn`` of ``/bin/sh -c`` with two pipes, in this
process). The two are interleaved request by request, so load on the shared machine hits both
alike. Figures per command: p50 (and p90) of

* ``first``: from the send to the first ShellOutput (the data chunk for ``echo hi``; for ``true``,
  which prints nothing, the exit); for the reference, the first pipe read that returned data (or
  the exit);
* ``final``: from the send to the terminal ``StateChange(READY)``; for the reference, the reaped
  exit status after both pipes reached EOF;

and their ratio (service / no server; the target is <= 1.3). With ``--gap``, each request (of each
side) follows that many seconds of idleness, as an agent's commands do (its model thinks between
them): what a command costs after the caches and the kernel have cooled. ``--burst N`` makes each
request after a gap N requests one after another (each position reported apart: the second's
process is made as the first starts), ``--new-session`` starts each in a new session (a session's
first command; its handshake is not timed), ``--pty`` runs the service's commands on a terminal
(the one-shot way: the sandbox program per command). The cgroup moves a command's process makes are
what ``--gap --burst 2``, ``--new-session`` and ``--gap --pty`` show (README, "Limits").

Then the rate of ``true`` run one after another (``--rate-count`` per block, ``--rounds`` blocks
per contender, the contenders' blocks interleaved, their order rotating per block), side by side: the service over its socket
(v1), the service's MCP front (``serve --mcp`` on stdio, its ``shell`` tool), the MCP SDK server
(``bench/mcp_sdk_server.py``, its ``shell`` tool) and no server; for each its commands per second,
the ratio to no-server and to the MCP SDK server, and the server's CPU per command (user + system
of its process, from ``/proc/PID/stat``: what the service spends, not its commands). The targets:
>= 0.8x no-server, >= 1.5x the MCP SDK server, <= 400 us of service CPU per ``true``.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

from harness.server import ServerProcess

from .report.drivers import Session, request_ids
from .report.stats import percentile
from .report.stdio import StdioPeer, spawn_sh
from .report.wire import OUTPUT, STATE, shell_exec_command, WIRES
from smith_fast.pb import smith_pb2 as pb

COMMANDS = ("true", "echo hi")


def _service(session: Session, unit: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    session.send((unit,))
    first = 0.0
    while True:
        views = session.recv()
        now = time.perf_counter()
        for kind, _rid, a, b in views:
            if kind == OUTPUT and not first:
                first = now - start
                if b is not None and b != 0:
                    raise AssertionError(f"exit code {b}")
            elif kind == STATE and a == pb.SERVICE_STATE_READY:
                return first or now - start, now - start
            elif kind == STATE and a == pb.SERVICE_STATE_ERROR:
                raise AssertionError("request failed")


def _command(rid: str, command: str, pty: bool) -> pb.Command:
    """The ShellExec of ``command``; on a terminal (24x80) with ``pty``."""
    cmd = shell_exec_command(rid, command)
    if pty:
        cmd.shell_exec.pty.rows, cmd.shell_exec.pty.cols = 24, 80
    return cmd


def _reference(command: str) -> tuple[float, float]:
    """The report's no-server reference (bench.report.stdio.spawn_sh), with the first read timed."""
    start = time.perf_counter()
    first = 0.0

    def seen(_size: int) -> None:
        nonlocal first
        first = first or time.perf_counter() - start

    status = spawn_sh(command, seen)
    if status:
        raise AssertionError(f"status {status}")
    final = time.perf_counter() - start
    return first or final, final


_TICKS = os.sysconf("SC_CLK_TCK")
REPO = pathlib.Path(__file__).resolve().parent.parent


def _cpu(pid: int) -> float:
    """Seconds of CPU (user + system, every thread) process ``pid`` has used."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _mcp_true(peer: StdioPeer) -> None:
    peer.call("shell", {"command": "true"})  # a failed command is an isError result, which raises


def _service_true(session: Session, encode: Callable[[pb.Command], bytes]) -> object:
    return _service(session, encode(shell_exec_command(request_ids(1)[0], "true")))


def _rates(sessions: dict[str, Session], pids: dict[str, int], peers: dict[str, StdioPeer], args: argparse.Namespace) -> None:
    """Sequential ``true``: commands per second and server CPU per command, contenders interleaved."""
    encode = WIRES["v1"]().encode
    names = [*sessions, *peers, "no-server"]
    runs: dict[str, Callable[[], object]] = {"no-server": functools.partial(_reference, "true")}
    for n, session in sessions.items():
        runs[n] = functools.partial(_service_true, session, encode)
    for n, peer in peers.items():
        runs[n] = functools.partial(_mcp_true, peer)
    for run in runs.values():  # warm-up (a session's sandbox is built at its first command)
        for _ in range(10):
            run()
    took = {n: 0.0 for n in names}
    cpu = {n: 0.0 for n in names}
    for r in range(args.rounds):
        # the order rotates per block: the contender after no-server's block started ~8% slower
        # here (its processes idle meanwhile, the machine's CPUs asleep), whichever it was
        for n in names[r % len(names):] + names[: r % len(names)]:
            pid = pids.get(n, os.getpid())
            c0, t0 = _cpu(pid), time.perf_counter()
            for _ in range(args.rate_count):
                runs[n]()
            took[n] += time.perf_counter() - t0
            cpu[n] += _cpu(pid) - c0
    total = args.rounds * args.rate_count
    rate = {n: total / took[n] for n in names}
    print(f"\n`true` one after another, {args.rounds} interleaved blocks of {args.rate_count}; load {os.getloadavg()[0]:.2f}")
    print(f"{'contender':12} {'per s':>8} {'vs no-server':>13} {'vs mcp-sdk':>11} {'server CPU/cmd':>15}")
    for n in names:
        vs_sdk = f"{rate[n] / rate['mcp-sdk']:10.2f}x" if "mcp-sdk" in rate else "-"
        cpu_text = f"{cpu[n] / total * 1e6:11.0f} us" if n != "no-server" else "(driver's)"
        print(f"{n:12} {rate[n]:8.0f} {rate[n] / rate['no-server']:12.2f}x {vs_sdk:>11} {cpu_text:>15}")


def _server(tmp: pathlib.Path, name: str, args: argparse.Namespace, python: str | None) -> ServerProcess:
    home = tmp / name
    home.mkdir()
    env = {"SMITH_FAST_NO_EXTENSIONS": ""}
    if python:
        env["PYTHONSAFEPATH"] = "1"  # import that checkout's smith_fast, not this one (the cwd)
    server = ServerProcess(home, "--sandbox", args.sandbox, "--network", args.network, "--max-output", "2G",
                           loop="uvloop", root=tmp / "root", env=env, tcp=False, log_level="info", keep=200)
    if python:
        server.argv[0] = python
    return server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_exec_start", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200, help="requests per command and side (default 200)")
    p.add_argument("--gap", type=float, default=0.0, metavar="SECONDS",
                   help="idle seconds before each request of the p50 part (an agent's think time; default 0)")
    p.add_argument("--burst", type=int, default=1, metavar="N",
                   help="after each gap, N requests one after another, each position's figures apart (default 1)")
    p.add_argument("--pty", action="store_true",
                   help="the service's commands on a terminal (they start the one-shot way; no-server's on pipes)")
    p.add_argument("--new-session", action="store_true",
                   help="each burst in a new session (its handshake not timed): a session's first commands")
    p.add_argument("--network", default="on", choices=("on", "off", "loopback"))
    p.add_argument("--sandbox", default="workspace-write", choices=("workspace-write", "read-only", "off"))
    p.add_argument("--base", metavar="PYTHON", help="also run a server on this interpreter (another checkout's venv, "
                   "e.g. main's: the before), interleaved with the others")
    p.add_argument("--pid-file", help="write the server's pid here once it is ready (for profilers)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds to wait after start (attach a profiler)")
    p.add_argument("--rate-count", type=int, default=100, help="`true` per block in the rate comparison (0: skip it)")
    p.add_argument("--rounds", type=int, default=5, help="blocks per contender in the rate comparison")
    args = p.parse_args(argv)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-exec-start-"))
    (tmp / "root").mkdir()
    servers = {"service": _server(tmp, "service", args, None)}
    if args.base:
        servers["base"] = _server(tmp, "base", args, args.base)
    for server in servers.values():
        server.start()
    try:
        if args.pid_file:
            pathlib.Path(args.pid_file).write_text(str(servers["service"].pid))
        if args.pause:
            time.sleep(args.pause)
        sessions = {name: Session(server.sock_path, "v1") for name, server in servers.items()}
        encode = WIRES["v1"]().encode
        print(f"sandbox {args.sandbox}, network {args.network}, {args.count} requests each, interleaved"
              f"{f', {args.gap:g} s idle before each' if args.gap else ''}"
              f"{f' burst of {args.burst}' if args.burst > 1 else ''}{', each in a new session' if args.new_session else ''}"
              f"{', on a terminal' if args.pty else ''}; "
              f"load {os.getloadavg()[0]:.2f}")
        names = [*sessions, "no-server"]
        print(f"{'command':10} {'figure':6} " + " ".join(f"{n + ' p50':>15}" for n in names) + "   ratios to no-server"
              + "   " + " ".join(f"{n + ' p90':>15}" for n in names))
        for command in COMMANDS:
            # per side, per position in a burst: (first, final) of each request
            figures: dict[str, list[list[tuple[float, float]]]] = {n: [[] for _ in range(args.burst)] for n in names}
            for i in range(args.count + 10):
                got: dict[str, list[tuple[float, float]]] = {}
                for n, server in servers.items():
                    if args.new_session:
                        sessions[n].close()
                        sessions[n] = Session(server.sock_path, "v1")
                    units = [encode(_command(rid, command, args.pty)) for rid in request_ids(args.burst)]
                    time.sleep(args.gap)
                    got[n] = [_service(sessions[n], unit) for unit in units]
                time.sleep(args.gap)
                got["no-server"] = [_reference(command) for _ in range(args.burst)]
                if i >= 10:  # warm-up
                    for n, f in got.items():
                        for k, one in enumerate(f):
                            figures[n][k].append(one)
            for k in range(args.burst):
                label = f"{command} #{k + 1}" if args.burst > 1 else command
                for j, figure in enumerate(("first", "final")):
                    p50 = {n: percentile(sorted(x[j] for x in v[k]), .5) for n, v in figures.items()}
                    p90 = {n: percentile(sorted(x[j] for x in v[k]), .9) for n, v in figures.items()}
                    ratios = " ".join(f"{n} {p50[n] / p50['no-server']:.2f}x" for n in sessions)
                    print(f"{label:10} {figure:6} " + " ".join(f"{p50[n] * 1e3:12.3f} ms" for n in names)
                          + f"   {ratios}   " + " ".join(f"{p90[n] * 1e3:12.3f} ms" for n in names))
        if args.rate_count > 0:
            root = tmp / "root"
            peers = {
                "mcp": StdioPeer([sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(root), "--log-level", "warning",
                                  "--sandbox", args.sandbox, "--network", args.network], REPO, env={"SMITH_FAST_NO_EXTENSIONS": ""}),
                "mcp-sdk": StdioPeer([sys.executable, str(REPO / "bench" / "mcp_sdk_server.py"), str(root)], root),
            }
            try:
                pids = {n: server.pid for n, server in servers.items()} | {n: peer.proc.pid for n, peer in peers.items()}
                _rates(sessions, pids, peers, args)
            finally:
                for peer in peers.values():
                    peer.close()
        for session in sessions.values():
            session.close()
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
