"""Throughput of the egress proxy (smith_fast/egress/): a large download with curl, directly and
through the proxy by each of its protocols, side by side in one run.

``python -m bench.bench_egress [--quick] [--json PATH]``

Three processes, each on its own: an origin (this module's ``origin_main``: one file served with
``sendfile``, so the origin costs little CPU and the proxy is what is measured), the proxy
(``proxy_main``: an :class:`~smith_fast.egress.EgressProxy` on uvloop, as the service runs it,
allowing the test name ``bench.test`` mapped to 127.0.0.1 by the resolver override), and curl. Each
repetition downloads the file once per contender, in a rotating order (the machine is shared:
compare within one run, never across runs):

* ``direct``: curl to the origin;
* ``http``: ``--proxy http://`` (the plain-HTTP forward: the proxy parses the request, forwards it);
* ``connect``: ``--proxy http:// --proxytunnel`` (HTTP CONNECT, the tunnel HTTPS uses);
* ``socks5h``: ``--proxy socks5h://`` (the name resolved by the proxy);
* ``socat``: a reference, not the proxy: ``socat`` (C, 256 KiB reads and writes) forwarding TCP to
  the origin, the cost of any user-space relay on this machine.

Three links, each with every contender: ``loopback`` as fast as the machine goes (there every
byte crosses the kernel's TCP stack twice through any relay, and curl, the relay and the kernel
share the CPUs: a bound on a 2-core machine that ``socat`` shows), and ``paced`` / ``paced-5g``:
the origin paces its sends (``SO_MAX_PACING_RATE``, 2 and 5 Gbit/s) as a fast network link
would, where the relay's cost shows as lost throughput only if it cannot keep up.

It prints each contender's median MB/s, its range, the proxy's CPU per MB, and the ratio of each
contender's median to ``direct``'s on the same link (target >= 0.8 for the proxy's three).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from ._cli import bench_main

__all__ = ["SCALES", "BenchScale", "main", "measure", "render", "origin_main", "proxy_main"]

PROG = "python -m bench.bench_egress"
TARGET = 0.8
CONTENDERS = ("direct", "http", "connect", "socks5h", "socat")
PROXIED = ("http", "connect", "socks5h")
LINKS = {"loopback": 0, "paced": 250_000_000, "paced-5g": 625_000_000}  # bytes/s the origin paces at (0: not at all)
_SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
FILE = pathlib.Path("/var/tmp/smith-fast-bench-egress.bin")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class BenchScale:
    """The sizes of one run: ``name``, the file's ``megabytes``, measured ``reps`` (after one warm-up)."""

    name: str
    megabytes: int
    reps: int


SCALES = {"quick": BenchScale("quick", 20, 3), "full": BenchScale("full", 100, 7)}


# ---- the two servers, each a process of its own --------------------------------------------------


def origin_main(path: str, pace: str = "0") -> None:
    """Serve ``path`` to every GET on 127.0.0.1 (port printed on stdout), one thread per connection,
    each paced at ``pace`` bytes/s (0: as fast as it goes)."""
    import threading

    size = os.path.getsize(path)
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    print(listener.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        if int(pace):
            conn.setsockopt(socket.SOL_SOCKET, _SO_MAX_PACING_RATE, int(pace))
        with conn, open(path, "rb") as f:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
            conn.sendfile(f)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def proxy_main() -> None:
    """An EgressProxy on uvloop on 127.0.0.1 (port printed on stdout), allowing ``bench.test``."""
    import uvloop

    from smith_fast.egress import EgressPolicy, EgressProxy, NullObserver, OverrideResolver

    async def run() -> None:
        policy = EgressPolicy.from_options(["bench.test", "127.0.0.1/32"], [], [])
        proxy = EgressProxy(policy, resolver=OverrideResolver({"bench.test": ["127.0.0.1"]}))
        served = await proxy.start_tcp("127.0.0.1", 0, NullObserver())
        print(served.address[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(run())


# ---- measuring -----------------------------------------------------------------------------------


def _cpu(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _start(code: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True,
                               cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def _curl(contender: str, origin: int, proxy: int, socat: int) -> float:
    """One download; its bytes per second as curl measured them."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    if contender == "socat":
        contender, origin = "direct", socat
    via = {"direct": [], "http": ["--proxy", f"http://127.0.0.1:{proxy}"],
           "connect": ["--proxy", f"http://127.0.0.1:{proxy}", "--proxytunnel"],
           "socks5h": ["--proxy", f"socks5h://127.0.0.1:{proxy}"]}[contender]
    host = "127.0.0.1" if contender == "direct" else "bench.test"
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", *via,
                          f"http://{host}:{origin}/file"], env=env, check=True, capture_output=True, text=True).stdout
    size, seconds = out.split()
    return int(size) / float(seconds)


def measure(scale: BenchScale) -> dict[str, Any]:
    """Run the contenders; the figures as a dict (see :func:`render`)."""
    size = scale.megabytes * 1_000_000
    if not FILE.exists() or FILE.stat().st_size != size:
        FILE.write_bytes(os.urandom(size))
    origins = {link: _start("from bench.bench_egress import origin_main; import sys; origin_main(*sys.argv[1:])",
                            str(FILE), str(pace)) for link, pace in LINKS.items()}
    socats = {}
    for link, (_, port) in origins.items():
        listener = socket.create_server(("127.0.0.1", 0))
        socat_port = listener.getsockname()[1]
        listener.close()
        socats[link] = (subprocess.Popen(["socat", "-b", "262144", f"TCP-LISTEN:{socat_port},fork,reuseaddr,bind=127.0.0.1",
                                          f"TCP:127.0.0.1:{port}"]), socat_port)
    proxy, proxy_port = _start("from bench.bench_egress import proxy_main; proxy_main()")
    rates: dict[str, dict[str, list[float]]] = {link: {c: [] for c in CONTENDERS} for link in LINKS}
    proxy_cpu = 0.0
    proxied_bytes = 0
    started = time.monotonic()
    try:
        time.sleep(0.3)  # socat's listeners
        for link in LINKS:
            for contender in CONTENDERS:  # warm-up: page cache, the proxy's first connection
                _curl(contender, origins[link][1], proxy_port, socats[link][1])
        for rep in range(scale.reps):
            order = CONTENDERS[rep % len(CONTENDERS):] + CONTENDERS[:rep % len(CONTENDERS)]
            for link in LINKS:
                for contender in order:
                    before = _cpu(proxy.pid)
                    rates[link][contender].append(_curl(contender, origins[link][1], proxy_port, socats[link][1]))
                    if contender in PROXIED and link == "loopback":
                        proxy_cpu += _cpu(proxy.pid) - before
                        proxied_bytes += size
    finally:
        for process in [proxy] + [p for p, _ in origins.values()] + [p for p, _ in socats.values()]:
            process.terminate()
            process.wait()
    result: dict[str, Any] = {"scale": scale.name, "megabytes": scale.megabytes, "reps": scale.reps,
                              "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                              "wall_s": round(time.monotonic() - started, 1), "target": TARGET,
                              "proxy_cpu_ms_per_mb": 1000 * proxy_cpu / (proxied_bytes / 1e6)}
    for link in LINKS:
        direct = statistics.median(rates[link]["direct"])
        figures = result[link] = {"pace_mb_per_s": LINKS[link] / 1e6}
        for contender in CONTENDERS:
            median = statistics.median(rates[link][contender])
            figures[contender] = {"mb_per_s": [r / 1e6 for r in rates[link][contender]], "median_mb_per_s": median / 1e6,
                                  "ratio": median / direct}
        figures["met"] = all(figures[c]["ratio"] >= TARGET for c in PROXIED)
    return result


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines."""
    out = [f"egress proxy throughput: {result['megabytes']} MB with curl, {result['reps']} repetitions, interleaved "
           f"({result['scale']}, {result['wall_s']} s, {result['cpus']} CPUs, load {result['load_average'][0]:.2f})",
           f"   proxy CPU: {result['proxy_cpu_ms_per_mb']:.2f} ms per MB relayed (loopback)"]
    for link in LINKS:
        figures = result[link]
        pace = f"origin paced at {figures['pace_mb_per_s']:.0f} MB/s" if figures["pace_mb_per_s"] else "unpaced"
        out.append(f"   {link} ({pace}):")
        out.append(f"      {'contender':10s} {'MB/s':>8s}  {'range':>15s}  {'x direct':>8s}")
        for contender in CONTENDERS:
            r = figures[contender]
            out.append(f"      {contender:10s} {r['median_mb_per_s']:8.0f}  {min(r['mb_per_s']):7.0f}-{max(r['mb_per_s']):<7.0f}  "
                       f"{r['ratio']:8.2f}")
        out.append(f"      the proxy's three >= {result['target']}x direct: {'met' if figures['met'] else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    return bench_main(PROG, __doc__, SCALES, measure, render, "20 MB x 3 repetitions", argv)


if __name__ == "__main__":
    raise SystemExit(main())
