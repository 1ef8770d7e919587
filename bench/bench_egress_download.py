"""Egress throughput: a 100 MB download through ``--network allow``'s proxy against ``--network on``, in one run.

``python -m bench.bench_egress_download [--quick] [--json PATH]``; ``make bench`` runs it too and puts
its figures in the report (``bench/report/egress.py``). The target: the proxied download's throughput
at least 0.8x that of ``--network on``, in the same run.

Two real ``smith-fast serve`` processes (``harness/server.py``): ``--network on`` (a command reaches
the host's network straight) and ``--network allow`` with ``--egress-allow blob.test --egress-allow
127.0.0.1/32 --egress-resolve blob.test=127.0.0.1`` (a command reaches ``blob.test`` only through the
service's egress proxy, which resolves the name itself). Each round runs, as a ShellExec of each
service over the SDK (:class:`smith_fast.client.Client`, a Unix socket), ``curl`` of a 100 MB file
from a ``python3 -m http.server`` of its own process on the host's loopback; the rounds are
interleaved, the order rotating, so that the load of others on the machine falls on both alike.

Figures: per network the median request throughput (100 MB over the request's time, ShellExec to its
final event: the command's start included) and curl's own (``speed_download``: the transfer alone);
the median of the rounds' ratios allow/on of each, against the target (met when both reach it); the
load average before and after. Ratios, not absolute figures, compare on a shared machine.
``bench/bench_egress_sandbox.py``'s served group runs the same rounds under pytest-benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvloop

from harness.server import ServerProcess
from smith_fast.client import Client

from ._cli import bench_main

__all__ = ["DOWNLOAD", "NETWORKS", "SCALES", "TARGET", "DownloadScale", "figures", "http_server", "main", "measure",
           "render", "served_once", "served_round", "served_services"]

PROG = "python -m bench.bench_egress_download"
DOWNLOAD = 100 << 20  # bytes of the file curl fetches
TARGET = 0.8  # allow / on, at least: the request's throughput and curl's
NETWORKS = ("on", "allow")
# --network allow lets blob.test (resolved by the proxy) and the host's loopback through; by name, as
# a command would reach a real host (127.0.0.1 itself is NO_PROXY: the command's own loopback)
EGRESS = ("--egress-allow", "blob.test", "--egress-allow", "127.0.0.1/32", "--egress-resolve", "blob.test=127.0.0.1")
HOSTS = {"on": "127.0.0.1", "allow": "blob.test"}
DOWNLOAD_TIMEOUT = 120.0  # seconds for one download's request: a stuck service fails the run instead of hanging it


@dataclass(frozen=True)
class DownloadScale:
    """The size of one run: ``rounds`` measured rounds (a download through each service) after ``warmups``."""

    name: str
    rounds: int
    warmups: int = 1


SCALES = {
    "quick": DownloadScale("quick", rounds=7),
    "full": DownloadScale("full", rounds=15),
}


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """A ``python3 -m http.server`` serving ``/blob`` (:data:`DOWNLOAD` bytes, sparse) on the host's
    loopback; its port. A process of its own, not this one's GIL (which the client's loop runs under)."""
    www = tempfile.mkdtemp(prefix="bench-egress-www-", dir="/var/tmp")
    server: subprocess.Popen[bytes] | None = None
    try:
        with open(os.path.join(www, "blob"), "wb") as f:
            f.truncate(DOWNLOAD)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", www],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield port
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(www, ignore_errors=True)


@contextlib.contextmanager
def served_services(root: pathlib.Path) -> Iterator[dict[str, ServerProcess]]:
    """The two real services of :data:`NETWORKS`, on ``root``, stopped (their directories removed) on the way out."""
    base = tempfile.mkdtemp(prefix="bench-egress-served-", dir="/var/tmp")
    servers: dict[str, ServerProcess] = {}
    try:
        for network in NETWORKS:
            home = os.path.join(base, network)
            os.makedirs(home)
            # info: little but "ready" and the audit lines; keep: a long run must not hold them all
            servers[network] = ServerProcess(pathlib.Path(home), "--network", network, *(EGRESS if network == "allow" else ()),
                                             root=root, tcp=False, log_level="info", keep=2000).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def served_once(server: ServerProcess, network: str, port: int) -> tuple[float, float]:
    """One download as a ShellExec of ``server``: (seconds from the request to its final event, curl's bytes/s)."""
    command = f"curl -sSf -o /dev/null -w '%{{speed_download}}' http://{HOSTS[network]}:{port}/blob"
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        out, err, code = "", "", None
        start = time.perf_counter()
        async for event in client.shell_exec(command):
            if event.WhichOneof("event_type") == "shell_output":
                out += event.shell_output.stdout
                err += event.shell_output.stderr
                if event.shell_output.finished:
                    code = event.shell_output.exit_code
        took = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"--network {network}: curl exited {code}: {err.strip()[:300]}")
    return took, float(out)


async def served_round(servers: dict[str, ServerProcess], port: int, first: int = 0) -> dict[str, tuple[float, float]]:
    """A download through each service, one after the other, starting with ``NETWORKS[first]``."""
    order = NETWORKS[first:] + NETWORKS[:first]
    got: dict[str, tuple[float, float]] = {}
    for network in order:
        got[network] = await asyncio.wait_for(served_once(servers[network], network, port), DOWNLOAD_TIMEOUT)
    return got


def figures(rounds: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """The medians of ``rounds`` (network -> (seconds, curl's bytes/s) per round, the rounds paired by
    index) and the median of the rounds' ratios allow/on, against :data:`TARGET`."""
    on, allow = rounds["on"], rounds["allow"]
    if not on or len(on) != len(allow):
        raise ValueError(f"unpaired rounds: {len(on)} on, {len(allow)} allow")
    pairs = list(zip(on, allow))
    ratio = {"request": round(statistics.median(o[0] / a[0] for o, a in pairs), 3),
             "curl": round(statistics.median(a[1] / o[1] for o, a in pairs), 3)}
    networks = {network: {"request_mb_s": round(DOWNLOAD / statistics.median(r[0] for r in got) / 1e6, 1),
                          "curl_mb_s": round(statistics.median(r[1] for r in got) / 1e6, 1),
                          "request_s": [round(r[0], 4) for r in got],
                          "curl_mb_s_all": [round(r[1] / 1e6, 1) for r in got]}
                for network, got in rounds.items()}
    return {"bytes": DOWNLOAD, "rounds": len(pairs), "networks": networks, "ratio": ratio, "target": TARGET,
            "met": min(ratio.values()) >= TARGET}


async def _rounds(scale: DownloadScale, tell: Callable[[str], None]) -> dict[str, list[tuple[float, float]]]:
    rounds: dict[str, list[tuple[float, float]]] = {network: [] for network in NETWORKS}
    with tempfile.TemporaryDirectory(prefix="bench-egress-root-", dir="/var/tmp") as root, http_server() as port, \
            served_services(pathlib.Path(root)) as servers:
        tell(f"{scale.warmups} warm-up + {scale.rounds} rounds of a {DOWNLOAD >> 20} MB download through each service")
        for r in range(scale.warmups + scale.rounds):
            got = await served_round(servers, port, r % len(NETWORKS))
            if r >= scale.warmups:
                for network, figure in got.items():
                    rounds[network].append(figure)
    return rounds


def measure(scale: DownloadScale, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``scale``'s rounds; the JSON-ready result (:func:`render` prints it)."""
    tell = say or (lambda line: print(line, file=sys.stderr, flush=True))
    load = os.getloadavg()
    started = time.perf_counter()
    result = {"scale": scale.name, "warmups": scale.warmups, **figures(uvloop.run(_rounds(scale, tell)))}
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["load_average"] = {"start": [round(x, 2) for x in load], "end": [round(x, 2) for x in os.getloadavg()]}
    result["cpus"] = os.cpu_count()
    return result


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines: each network's medians, the ratios and the verdict."""
    out = [f"--network allow vs on through a real serve: curl of {result['bytes'] >> 20} MB, {result['rounds']} interleaved rounds"
           + (f" ({result['scale']}, {result['wall_s']} s)" if "scale" in result else "") + ", median of the rounds' ratios:"]
    for network, got in result["networks"].items():
        out.append(f"  {network:10} request {got['request_mb_s']:6.0f} MB/s, curl's transfer {got['curl_mb_s']:6.0f} MB/s")
    r = result["ratio"]
    out.append(f"  allow/on: request {r['request']:4.2f}x, curl's transfer {r['curl']:4.2f}x "
               f"(target >= {result['target']:g}x): {'met' if result['met'] else 'NOT met'}")
    if "load_average" in result:
        load = result["load_average"]
        out.append(f"  load average {' '.join(map(str, load['start']))} at the start, {' '.join(map(str, load['end']))} at the end")
    return out


def main(argv: list[str] | None = None) -> int:
    return bench_main(PROG, __doc__, SCALES, measure, render, f"{SCALES['quick'].rounds} rounds instead of {SCALES['full'].rounds}", argv)


if __name__ == "__main__":
    raise SystemExit(main())
