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
  time per connect (printed by it), so the start is left out.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from smith_fast.process import ShellProcess
from smith_fast.sandbox import HELPER, Sandbox

from ._summary import print_summary

ROOT = tempfile.mkdtemp(prefix="bench-egress-sandbox-", dir="/var/tmp")
CONNECTS = 2000
NETWORKS = ("loopback", "allow")
_start: dict[str, float] = {}  # network -> median seconds
_connect: dict[str, float] = {}  # network -> median microseconds per connect

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


def _lines() -> Iterator[str]:
    if not _start and not _connect:
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
