"""ShellExec start to first output and to the final event, service vs no server, side by side.

Run: ``.venv/bin/python -m bench.bench_exec_start [--count 200] [--network on|off] [--sandbox MODE] [--base PYTHON]``

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

and their ratio (service / no server; the target is <= 1.3).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

from harness.server import ServerProcess

from .report.drivers import Session, request_ids
from .report.stats import percentile
from .report.stdio import spawn_sh
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
    p.add_argument("--network", default="on", choices=("on", "off", "loopback"))
    p.add_argument("--sandbox", default="workspace-write", choices=("workspace-write", "read-only", "off"))
    p.add_argument("--base", metavar="PYTHON", help="also run a server on this interpreter (another checkout's venv, "
                   "e.g. main's: the before), interleaved with the others")
    p.add_argument("--pid-file", help="write the server's pid here once it is ready (for profilers)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds to wait after start (attach a profiler)")
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
        print(f"sandbox {args.sandbox}, network {args.network}, {args.count} requests each, interleaved; "
              f"load {os.getloadavg()[0]:.2f}")
        names = [*sessions, "no-server"]
        print(f"{'command':10} {'figure':6} " + " ".join(f"{n + ' p50':>15}" for n in names) + "   ratios to no-server"
              + "   " + " ".join(f"{n + ' p90':>15}" for n in names))
        for command in COMMANDS:
            figures: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
            for i in range(args.count + 10):
                units = {n: encode(shell_exec_command(request_ids(1)[0], command)) for n in sessions}
                got = {n: _service(session, units[n]) for n, session in sessions.items()}
                got["no-server"] = _reference(command)
                if i >= 10:  # warm-up
                    for n, f in got.items():
                        figures[n].append(f)
            for j, figure in enumerate(("first", "final")):
                p50 = {n: percentile(sorted(x[j] for x in v), .5) for n, v in figures.items()}
                p90 = {n: percentile(sorted(x[j] for x in v), .9) for n, v in figures.items()}
                ratios = " ".join(f"{n} {p50[n] / p50['no-server']:.2f}x" for n in sessions)
                print(f"{command:10} {figure:6} " + " ".join(f"{p50[n] * 1e3:12.3f} ms" for n in names)
                      + f"   {ratios}   " + " ".join(f"{p90[n] * 1e3:12.3f} ms" for n in names))
        for session in sessions.values():
            session.close()
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
