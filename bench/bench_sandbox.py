"""What the sandbox costs a command's start: ``sh -c true`` through ShellProcess, with and without it.

Run: ``.venv/bin/pytest bench/bench_sandbox.py --benchmark-only -p no:cacheprovider``

Variants (one uvloop loop, start + wait, best and median of the rounds):

* ``off``: no sandbox program (``--sandbox off --network on``): a bare spawn;
* ``<mode>/<network>``: through ``smith_fast/sandbox/sandbox-exec`` (namespaces, the read-only view,
  private /proc, /dev and /tmp, no capabilities, Landlock), what the service does by default;
* ``workspace-write/on/reap``: the same, waiting for the namespaces' teardown as the service does
  when it is pid 1 of a container (``--reap``);
* ``workspace-write/on/zygote``: the same walls built once, the command forked inside by the
  session's zygote (``smith_fast/sandbox/zygote.py``), as a session's piped commands are.

The summary gives each variant's median start latency and its ratio to ``off`` (one run, so the
ratios compare like with like on a shared machine).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop

from smith_fast.process import ShellProcess
from smith_fast.sandbox import HELPER, Sandbox
from smith_fast.sandbox.zygote import Zygotes

from ._summary import print_summary

ROOT = tempfile.mkdtemp(prefix="bench-sandbox-")


VARIANTS: dict[str, Sandbox | None] = {
    "off": None,
    "workspace-write/on": Sandbox("workspace-write", "on", ROOT),
    "read-only/on": Sandbox("read-only", "on", ROOT),
    "workspace-write/off": Sandbox("workspace-write", "off", ROOT),
    "workspace-write/loopback": Sandbox("workspace-write", "loopback", ROOT),
    "workspace-write/on/reap": Sandbox("workspace-write", "on", ROOT, reap=True),
    "workspace-write/on/zygote": Sandbox("workspace-write", "on", ROOT),
}
ZYGOTES = Zygotes()  # the variant's "session": its zygote is made by the first (warm-up) round
_results: dict[str, float] = {}  # variant -> median seconds


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = uvloop.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _summary_lines())


def _summary_lines() -> Iterator[str]:
    base = _results.get("off")
    if not base:
        return
    yield ""
    yield "ShellExec start latency (sh -c true, start + wait, median):"
    for variant, median in _results.items():
        yield f"  {variant:30} {median * 1000:7.2f} ms  {median / base:5.1f}x off"


async def _once(sandbox: Sandbox | None, zygotes: Zygotes | None) -> int:
    proc = await ShellProcess.start("true", cwd=ROOT, on_output=lambda fd, data: None, sandbox=sandbox, zygotes=zygotes)
    return await proc.wait()


@pytest.mark.benchmark(group="sandbox-start")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_start(benchmark: Any, loop: asyncio.AbstractEventLoop, variant: str) -> None:
    if variant != "off":
        assert os.access(HELPER, os.X_OK), "build it: make install"
    sandbox = VARIANTS[variant]
    zygotes = ZYGOTES if variant.endswith("/zygote") else None
    assert benchmark.pedantic(lambda: loop.run_until_complete(_once(sandbox, zygotes)), rounds=40, warmup_rounds=3) == 0
    if zygotes is not None:
        zygotes.close()
    _results[variant] = benchmark.stats.stats.median
