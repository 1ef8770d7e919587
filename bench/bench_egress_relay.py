"""The egress proxy's relay, variant against variant: what each costs a large download, side by side in one run.

``python -m bench.bench_egress_relay [--quick] [--json PATH]``

The origin of ``bench_egress.py`` (``sendfile``: it costs little CPU, so the relay is what shows),
one proxy process per relay variant (an :class:`~smith_fast.egress.EgressProxy` on uvloop whose
connections relay with that variant instead of :class:`~smith_fast.egress.splice.Pump`), curl
through each with ``--proxy http://`` (the plain-HTTP forward), ``direct`` and ``socat`` (C, 256
KiB buffers) as references. Each repetition downloads once per contender in a rotating order;
the figures are the median of the repetitions' ratios to ``direct`` (pairs taken in the same
repetition, so that the load of others on the machine falls on both alike) and each proxy's CPU
per MB (user and system: the relay's kernel work is most of it).

The variants, each the smallest change from ``splice`` (what the proxy does):

* ``splice``: splice(2) socket → pipe → socket on the loop, each wake-up splicing until the source
  has nothing (one ``EAGAIN`` per wake-up), a 1 MiB pipe for the download's direction
  (:data:`~smith_fast.egress.splice.DOWN_PIPE_SIZE`) and 256 KiB for the other;
* ``splice-256k``: 256 KiB pipes both ways (what the proxy had before);
* ``no-probe``: a splice that moved less than the pipe holds ends the wake-up (no ``EAGAIN`` splice;
  the level-triggered loop calls again when more came);
* ``more``: ``SPLICE_F_MORE`` to the destination while the pipe was full (a cork: fewer, larger sends);
* ``nodelay-off``: Nagle on both sockets (the proxy sets ``TCP_NODELAY`` upstream);
* ``bufs-4m``: ``SO_RCVBUF``/``SO_SNDBUF`` of 4 MiB on both sockets (fixed, no autotuning);
* ``thread``: off the loop: a thread per direction doing blocking splice (the same pipe sizes);
* ``copy``: on the loop, ``recv_into`` one shared 256 KiB buffer and ``send`` (two copies, no pipe).

``MSG_ZEROCOPY`` is not among them: it saves the copy of a ``send`` from user memory, which the
splice relay never makes, and on loopback the kernel copies such pages anyway.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from ._cli import bench_main
from .bench_egress import FILE, SCALES, BenchScale, _cpu, _start

__all__ = ["VARIANTS", "main", "measure", "render", "relay_proxy_main"]

PROG = "python -m bench.bench_egress_relay"
VARIANTS = ("splice", "splice-256k", "no-probe", "more", "nodelay-off", "bufs-4m", "thread", "copy")
REFERENCES = ("direct", "socat")
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_SPLICE_F_MORE = 4
_F_SETPIPE_SZ, _F_GETPIPE_SZ = 1031, 1032


# ---- the variants (in the proxy's process) --------------------------------------------------------


def _pump_class(variant: str) -> Any:
    """The class ProxyConnection relays with under ``variant`` (the Pump interface: done, stop)."""
    from smith_fast.egress.splice import PIPE_SIZE, Pump

    class Small(Pump):
        def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, counter: Any,
                     pipe_size: int = PIPE_SIZE) -> None:
            super().__init__(loop, src, dst, counter, PIPE_SIZE)

    class NoProbe(Pump):
        def _readable(self) -> None:
            while self.watching == "src":
                try:
                    moved = os.splice(self.src, self.pipe_w, self.size, flags=_FLAGS)
                except BlockingIOError:
                    return
                except OSError as exc:
                    self._finish(exc)
                    return
                if moved == 0:
                    self.eof = True
                    self.loop.remove_reader(self.src)
                    self.watching = ""
                    if self.held == 0:
                        self._end()
                    return
                self.held += moved
                self.counter.moved(self, moved)
                self._drain()
                if moved < self.size:
                    return

    class More(Pump):
        def _drain(self) -> None:
            while self.held:
                try:
                    more = _SPLICE_F_MORE if self.held >= self.size else 0
                    moved = os.splice(self.pipe_r, self.dst, self.held, flags=_FLAGS | more)
                except BlockingIOError:
                    if self.watching == "src":
                        self.loop.remove_reader(self.src)
                        self.loop.add_writer(self.dst, self._writable)
                        self.watching = "dst"
                    return
                except OSError as exc:
                    self._finish(exc)
                    return
                self.held -= moved
            if self.eof:
                self._end()
            elif self.watching == "dst":
                self.loop.remove_writer(self.dst)
                self.loop.add_reader(self.src, self._readable)
                self.watching = "src"

    def with_options(options: list[tuple[int, int, int]]) -> Any:
        class Opted(Pump):
            def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, counter: Any,
                         pipe_size: int = PIPE_SIZE) -> None:
                for sock in (src, dst):
                    for level, name, value in options:
                        sock.setsockopt(level, name, value)
                super().__init__(loop, src, dst, counter, pipe_size)
        return Opted

    class Threaded:
        def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, counter: Any,
                     pipe_size: int = PIPE_SIZE) -> None:
            self.loop, self.src, self.dst, self.counter = loop, src, dst, counter
            self.done: asyncio.Future[OSError | None] = loop.create_future()
            self.pipe_r, self.pipe_w = os.pipe2(os.O_CLOEXEC)
            try:
                fcntl.fcntl(self.pipe_w, _F_SETPIPE_SZ, pipe_size)
            except OSError:
                pass
            self.size = fcntl.fcntl(self.pipe_w, _F_GETPIPE_SZ)
            os.set_blocking(src.fileno(), True)  # both directions are threads: the loop no longer reads them
            os.set_blocking(dst.fileno(), True)
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

        def _run(self) -> None:
            error: OSError | None = None
            try:
                while (moved := os.splice(self.src.fileno(), self.pipe_w, self.size, flags=os.SPLICE_F_MOVE)) > 0:
                    self.counter.moved(self, moved)
                    while moved:
                        moved -= os.splice(self.pipe_r, self.dst.fileno(), moved, flags=os.SPLICE_F_MOVE)
                self.dst.shutdown(socket.SHUT_WR)
            except OSError as exc:
                error = exc
            self.loop.call_soon_threadsafe(self._finish, error)

        def _finish(self, error: OSError | None) -> None:
            if not self.done.done():
                self.done.set_result(error)

        def stop(self) -> None:
            if self.thread.is_alive():
                for sock in (self.src, self.dst):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self.thread.join(2)
            if self.pipe_r >= 0:
                os.close(self.pipe_r)
                os.close(self.pipe_w)
                self.pipe_r = self.pipe_w = -1

    shared = memoryview(bytearray(256 << 10))

    class Copy:
        def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket, dst: socket.socket, counter: Any,
                     pipe_size: int = 0) -> None:
            self.loop, self.src, self.dst, self.counter = loop, src, dst, counter
            self.done: asyncio.Future[OSError | None] = loop.create_future()
            self.rest = b""
            self.watching = "src"
            loop.add_reader(src.fileno(), self._readable)

        def _readable(self) -> None:
            try:
                n = self.src.recv_into(shared)
            except BlockingIOError:
                return
            except OSError as exc:
                return self._finish(exc)
            if n == 0:
                try:
                    self.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return self._finish(None)
            self.counter.moved(self, n)
            try:
                sent = self.dst.send(shared[:n])
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                return self._finish(exc)
            if sent < n:
                self.rest = bytes(shared[sent:n])
                self.loop.remove_reader(self.src.fileno())
                self.loop.add_writer(self.dst.fileno(), self._writable)
                self.watching = "dst"

        def _writable(self) -> None:
            try:
                sent = self.dst.send(self.rest)
            except BlockingIOError:
                return
            except OSError as exc:
                return self._finish(exc)
            self.rest = self.rest[sent:]
            if not self.rest:
                self.loop.remove_writer(self.dst.fileno())
                self.loop.add_reader(self.src.fileno(), self._readable)
                self.watching = "src"

        def _finish(self, error: OSError | None) -> None:
            self.stop()
            if not self.done.done():
                self.done.set_result(error)

        def stop(self) -> None:
            if self.watching == "src":
                self.loop.remove_reader(self.src.fileno())
            elif self.watching == "dst":
                self.loop.remove_writer(self.dst.fileno())
            self.watching = ""

    table = {
        "splice": Pump, "splice-256k": Small, "no-probe": NoProbe, "more": More,
        "nodelay-off": with_options([(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)]),
        "bufs-4m": with_options([(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20), (socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)]),
        "thread": Threaded, "copy": Copy,
    }
    return table[variant]


def relay_proxy_main(variant: str) -> None:
    """An EgressProxy on uvloop on 127.0.0.1 (port printed on stdout), allowing ``bench.test``, relaying with ``variant``."""
    import uvloop

    from smith_fast.egress import EgressPolicy, EgressProxy, NullObserver, OverrideResolver, connection

    connection.Pump = _pump_class(variant)  # type: ignore[misc]  # the variant under measure, in its own process

    async def run() -> None:
        policy = EgressPolicy.from_options(["bench.test", "127.0.0.1/32"], [], [])
        proxy = EgressProxy(policy, resolver=OverrideResolver({"bench.test": ["127.0.0.1"]}))
        served = await proxy.start_tcp("127.0.0.1", 0, NullObserver())
        print(served.address[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(run())


# ---- measuring -----------------------------------------------------------------------------------


def _curl(url: str, proxy: int | None) -> float:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    via = ["--proxy", f"http://127.0.0.1:{proxy}"] if proxy is not None else []
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}", *via, url],
                         env=env, check=True, capture_output=True, text=True).stdout
    size, seconds = out.split()
    return int(size) / float(seconds)


def measure(scale: BenchScale) -> dict[str, Any]:
    """Run the contenders; the figures as a dict (see :func:`render`)."""
    size = scale.megabytes * 1_000_000
    if not FILE.exists() or FILE.stat().st_size != size:
        FILE.write_bytes(os.urandom(size))
    origin, port = _start("from bench.bench_egress import origin_main; import sys; origin_main(*sys.argv[1:])", str(FILE), "0")
    listener = socket.create_server(("127.0.0.1", 0))
    socat_port = listener.getsockname()[1]
    listener.close()
    socat = subprocess.Popen(["socat", "-b", "262144", f"TCP-LISTEN:{socat_port},fork,reuseaddr,bind=127.0.0.1",
                              f"TCP:127.0.0.1:{port}"])
    proxies = {v: _start("from bench.bench_egress_relay import relay_proxy_main; import sys; relay_proxy_main(sys.argv[1])", v)
               for v in VARIANTS}
    contenders = REFERENCES + VARIANTS

    def once(contender: str) -> float:
        if contender == "direct":
            return _curl(f"http://127.0.0.1:{port}/file", None)
        if contender == "socat":
            return _curl(f"http://127.0.0.1:{socat_port}/file", None)
        return _curl(f"http://bench.test:{port}/file", proxies[contender][1])

    rates: dict[str, list[float]] = {c: [] for c in contenders}
    cpu: dict[str, float] = {v: 0.0 for v in VARIANTS}
    started = time.monotonic()
    try:
        time.sleep(0.3)  # socat's listener
        for contender in contenders:
            once(contender)  # warm-up: page cache, each proxy's first connection
        for rep in range(scale.reps):
            order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
            for contender in order:
                before = _cpu(proxies[contender][0].pid) if contender in proxies else 0.0
                rates[contender].append(once(contender))
                if contender in proxies:
                    cpu[contender] += _cpu(proxies[contender][0].pid) - before
    finally:
        processes: list[subprocess.Popen[Any]] = [origin, socat, *(p for p, _ in proxies.values())]
        for process in processes:
            process.terminate()
            process.wait()
    result: dict[str, Any] = {"scale": scale.name, "megabytes": scale.megabytes, "reps": scale.reps, "cpus": os.cpu_count(),
                              "load_average": os.getloadavg(), "wall_s": round(time.monotonic() - started, 1)}
    for contender in contenders:
        paired = [r / d for r, d in zip(rates[contender], rates["direct"])]
        result[contender] = {"median_mb_per_s": statistics.median(rates[contender]) / 1e6, "ratio": statistics.median(paired),
                             "ratio_range": [min(paired), max(paired)]}
        if contender in cpu:
            result[contender]["cpu_ms_per_mb"] = 1000 * cpu[contender] / (scale.reps * size / 1e6)
    return result


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines."""
    out = [f"egress relay variants: {result['megabytes']} MB with curl through --proxy http://, {result['reps']} repetitions, "
           f"interleaved ({result['scale']}, {result['wall_s']} s, {result['cpus']} CPUs, load {result['load_average'][0]:.2f})",
           f"   {'contender':12s} {'MB/s':>7s}  {'x direct':>8s} {'(range)':>11s}  {'proxy CPU ms/MB':>15s}"]
    for contender in REFERENCES + VARIANTS:
        r = result[contender]
        cpu = f"{r['cpu_ms_per_mb']:15.2f}" if "cpu_ms_per_mb" in r else ""
        out.append(f"   {contender:12s} {r['median_mb_per_s']:7.0f}  {r['ratio']:8.2f} {r['ratio_range'][0]:5.2f}-{r['ratio_range'][1]:<5.2f}  {cpu}")
    return out


def main(argv: list[str] | None = None) -> int:
    return bench_main(PROG, __doc__, SCALES, measure, render, "20 MB x 3 repetitions", argv)


if __name__ == "__main__":
    raise SystemExit(main())
