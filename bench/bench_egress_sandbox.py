"""What ``--network allow`` costs a command, against ``--network loopback`` (the same namespace without it).

Run: ``.venv/bin/pytest bench/bench_egress_sandbox.py --benchmark-only -p no:cacheprovider``

Two groups, each with both contenders side by side in one run (ratios, not absolute figures, are
what compares on a shared machine):

* ``egress-start``: ``sh -c true`` through ShellProcess: ``allow`` adds the egress listener made in
  the namespace and sent over ``--egress-fd``, and the unix guard's seccomp filter (received here
  and dropped: what the proxy does with it is ``bench_egress.py``'s business);
* ``egress-connect``: one sandboxed Python process making :data:`CONNECTS` TCP connections to a
  listener of its own on its loopback; under ``allow`` each ``connect()`` is a seccomp user
  notification the sandbox's init answers (``csrc/unix_guard.h``). The figure is the command's own
  time per connect (printed by it), so the start is left out;
* ``egress-download``: ``curl`` in a sandboxed command fetching :data:`DOWNLOAD` bytes from a
  ``python3 -m http.server`` of the host: ``on`` straight from the host's network, ``allow``
  through the listener of its namespace and the real :class:`~smith_fast.egress.EgressProxy` on this
  process's loop (the target: >= 0.8x of ``on``);
* ``egress-download-served``: the same curl as a ShellExec of two real ``smith-fast serve``
  processes, ``--network on`` and ``--network allow``, one download of each per round (interleaved,
  so that the load of others on the machine falls on both alike). The summary gives the median of
  the rounds' ratios, of the request's time and of curl's own transfer speed (``speed_download``:
  without the command's start). The services, the HTTP server and the figures are
  ``bench/bench_egress_download.py``'s, which runs the same rounds on its own and in ``make bench``.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import socket
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from harness.server import ServerProcess
from smith_fast.egress import EgressPolicy, EgressProxy, NullObserver
from smith_fast.process import ShellProcess
from smith_fast.sandbox import EGRESS_PORT, HELPER, Sandbox

from . import bench_egress_download as download
from ._summary import print_summary

ROOT = tempfile.mkdtemp(prefix="bench-egress-sandbox-", dir="/var/tmp")
CONNECTS = 2000
NETWORKS = ("loopback", "allow")
_start: dict[str, float] = {}  # network -> median seconds
_connect: dict[str, float] = {}  # network -> median microseconds per connect
_download: dict[str, float] = {}  # network -> median seconds
DOWNLOAD = download.DOWNLOAD
SERVED_ROUNDS = download.SCALES["full"].rounds
_served: dict[str, list[tuple[float, float]]] = {"on": [], "allow": []}  # network -> (seconds, curl's bytes/s) per round

CONNECT_LOOP = (
    "import socket, time\n"
    "s = socket.create_server(('127.0.0.1', 0), backlog=4096); addr = s.getsockname()\n"
    f"t = time.perf_counter()\n"
    f"for _ in range({CONNECTS}):\n"
    "    c = socket.socket(); c.connect(addr); c.close(); s.accept()[0].close()\n"
    f"print((time.perf_counter() - t) / {CONNECTS} * 1e6)\n"
)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _lines())
    shutil.rmtree(ROOT, ignore_errors=True)  # the commands' root, made at import


def _lines() -> Iterator[str]:
    if not _start and not _connect and not _download and not _served["on"]:
        return
    yield ""
    if "loopback" in _start and "allow" in _start:
        base = _start["loopback"]
        yield "--network allow vs loopback: command start (sh -c true, start + wait, median):"
        for network, median in _start.items():
            yield f"  {network:10} {median * 1000:7.2f} ms  {median / base:5.2f}x loopback"
    if "loopback" in _connect and "allow" in _connect:
        base = _connect["loopback"]
        yield f"--network allow vs loopback: TCP connect() on the command's loopback ({CONNECTS} per round, median):"
        for network, micros in _connect.items():
            yield f"  {network:10} {micros:7.1f} us  {micros / base:5.2f}x loopback"
    if "on" in _download and "allow" in _download:
        base = _download["on"]
        yield f"--network allow (through the proxy) vs on: curl of {DOWNLOAD >> 20} MB from the host (median):"
        for network, seconds in _download.items():
            yield f"  {network:10} {DOWNLOAD / seconds / 1e6:7.0f} MB/s  {base / seconds:5.2f}x on"
    if _served["on"] and len(_served["on"]) == len(_served["allow"]):
        yield from download.render(download.figures(_served))

async def _run(network: str, command: str, collect: list[bytes] | None = None) -> int:
    sandbox = Sandbox("workspace-write", network, ROOT)
    ours, theirs = socket.socketpair() if network == "allow" else (None, None)
    try:
        proc = await ShellProcess.start(
            command, cwd=ROOT, on_output=lambda fd, data: collect.append(data) if collect is not None and fd == 1 else None,
            sandbox=sandbox, egress_fd=theirs.fileno() if theirs is not None else -1,
        )
        if theirs is not None:
            theirs.close()
        return await proc.wait()
    finally:
        for end in (ours, theirs):
            if end is not None:
                end.close()


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    with download.http_server() as port:
        yield port


async def _download_once(network: str, port: int) -> int:
    command = f"curl -sSf -o /dev/null http://127.0.0.1:{port}/blob"
    if network == "on":
        proc = await ShellProcess.start(command, cwd=ROOT, on_output=lambda fd, data: None, sandbox=Sandbox("workspace-write", "on", ROOT))
        return await proc.wait()
    ours, theirs = socket.socketpair()
    proxy = EgressProxy(EgressPolicy.from_options(["127.0.0.1/32"], [], []))
    env = {"http_proxy": f"http://127.0.0.1:{EGRESS_PORT}"}
    try:
        proc = await ShellProcess.start(command, cwd=ROOT, env=env, on_output=lambda fd, data: None,
                                        sandbox=Sandbox("workspace-write", "allow", ROOT), egress_fd=theirs.fileno())
        theirs.close()
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)  # the init sends it before the command starts
        served = proxy.serve(socket.socket(fileno=fds[0]), NullObserver())
        try:
            return await proc.wait()
        finally:
            served.close()
    finally:
        ours.close()
        theirs.close()


@pytest.mark.benchmark(group="egress-download")
@pytest.mark.parametrize("network", ("on", "allow"))
def test_download(benchmark: Any, loop: asyncio.AbstractEventLoop, http_port: int, network: str) -> None:
    assert benchmark.pedantic(lambda: loop.run_until_complete(_download_once(network, http_port)), rounds=5, warmup_rounds=1) == 0
    _download[network] = benchmark.stats.stats.median


@pytest.mark.benchmark(group="egress-start")
@pytest.mark.parametrize("network", NETWORKS)
def test_start(benchmark: Any, loop: asyncio.AbstractEventLoop, network: str) -> None:
    assert os.access(HELPER, os.X_OK), "build it: make install"
    assert benchmark.pedantic(lambda: loop.run_until_complete(_run(network, "true")), rounds=40, warmup_rounds=3) == 0
    _start[network] = benchmark.stats.stats.median


@pytest.mark.benchmark(group="egress-connect")
@pytest.mark.parametrize("network", NETWORKS)
def test_connect(benchmark: Any, loop: asyncio.AbstractEventLoop, network: str) -> None:
    script = os.path.join(ROOT, "connect_loop.py")
    with open(script, "w") as f:
        f.write(CONNECT_LOOP)
    per_connect: list[float] = []

    def once() -> int:
        out: list[bytes] = []
        code = loop.run_until_complete(_run(network, f"python3 {script}", out))
        per_connect.append(float(b"".join(out)))
        return code

    assert benchmark.pedantic(once, rounds=5, warmup_rounds=1) == 0
    _connect[network] = statistics.median(per_connect)


@pytest.fixture(scope="module")
def served() -> Iterator[dict[str, ServerProcess]]:
    """Two real services: --network on, and --network allow letting the host's loopback through its proxy."""
    with download.served_services(pathlib.Path(ROOT)) as servers:
        yield servers


@pytest.mark.benchmark(group="egress-download-served")
def test_download_served(benchmark: Any, loop: asyncio.AbstractEventLoop, http_port: int, served: dict[str, ServerProcess]) -> None:
    def one_round() -> None:
        for network, figure in loop.run_until_complete(download.served_round(served, http_port)).items():
            _served[network].append(figure)

    benchmark.pedantic(one_round, rounds=SERVED_ROUNDS, warmup_rounds=1)
    for rounds in _served.values():
        del rounds[:-SERVED_ROUNDS]  # the warm-up round's
