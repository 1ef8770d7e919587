"""The open-file limit (smith_fast/open_files.py) against real ``smith-fast serve`` processes started
with a low soft ``RLIMIT_NOFILE``: the service raises its own to what its limits need and holds
that many busy sessions (started with 128, it held 7), says so once when the hard limit is too low,
and every command, sandboxed or not, piped or on a terminal, gets the limit it was started with."""

from __future__ import annotations

import asyncio
import pathlib
import resource
import subprocess
import sys

import pytest

from smith_fast import open_files
from smith_fast.client import Client

from harness.server import ROOT, ServerProcess, assert_clean_log

STARTED_WITH = 128
# the hard limit the tests' servers start with: this process's, which only root may exceed
_HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
HARD = 65536 if _HARD == resource.RLIM_INFINITY else min(_HARD, 65536)


def _soft_limit(pid: int) -> int:
    line = next(x for x in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    return int(line.split()[3])


async def _ulimits(address: str, sessions: int, command: str = "ulimit -n", **options: object) -> list[str]:
    """``ulimit -n`` in a command of each of ``sessions`` sessions, all kept open meanwhile."""
    clients = []
    try:
        for _ in range(sessions):
            client = await Client.connect(address)
            await client.handshake()
            clients.append(client)
        out = []
        for client in clients:
            result = await client.run(command, **options)
            assert result.exit_code == 0, result
            out.append(result.text.strip())
        return out
    finally:
        for client in clients:
            await client.close()


def test_needed_counts_sessions_and_processes() -> None:
    assert open_files.needed(0, 0) == open_files.SPARE
    assert open_files.needed(64, 72) == 64 * open_files.PER_SESSION + 72 * open_files.PER_PROCESS + open_files.SPARE
    raised = open_files.Raised(before=128, after=1000, hard=1000, needed=2000)
    assert raised.short and raised.sessions(10) == (1000 - open_files.SPARE - 10 * open_files.PER_PROCESS) // open_files.PER_SESSION


@pytest.mark.parametrize(("limits", "wanted", "expected"), [
    ((256, HARD), (10, 10), (256, 496, 256)),  # raised to the need; commands get 256 back
    ((256, 1000), (100, 10), (256, 1000, 256)),  # to the hard limit at most
    ((900, 1000), (10, 10), (900, 900, 0)),  # never lowered: commands inherit it as it is
])
def test_raise_for_in_a_fresh_process(limits: tuple[int, int], wanted: tuple[int, int], expected: tuple[int, int, int]) -> None:
    code = ("import resource, sys; from smith_fast import open_files as o\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, {limits!r})\n"
            f"r = o.raise_for(*{wanted!r}); again = o.raise_for(*{wanted!r})\n"
            "assert again == r, (r, again)\n"
            "print(r.before, resource.getrlimit(resource.RLIMIT_NOFILE)[0], o.for_commands())\n"
            "more = o.raise_for(r.needed, 0)\n"  # a second service that needs more: further, from the first
            "assert more.before == r.before and more.after >= r.after and o.for_commands() == r.before, (r, more)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert tuple(int(x) for x in out.stdout.split()) == expected


def test_a_service_started_with_a_low_limit_raises_it_and_holds_its_sessions(tmp_path: pathlib.Path) -> None:
    # 40 sessions that ran a command hold ~13 descriptors each: 128 ran out at the 8th
    srv = ServerProcess(tmp_path, "--max-connections", "64", tcp=False, open_files=(STARTED_WITH, HARD)).start()
    try:
        assert _soft_limit(srv.pid) == min(open_files.needed(64, 64 + 8), HARD)
        assert asyncio.run(_ulimits(srv.unix, 40)) == [str(STARTED_WITH)] * 40  # the sessions' zygotes
        assert asyncio.run(_ulimits(srv.unix, 1, pty=(24, 80))) == [str(STARTED_WITH)]  # the one-shot way
        assert not [r for r in srv.logs if "open-file limit" in str(r.get("event")) and r.get("level") == "warning"]
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


def test_unsandboxed_commands_get_the_limit_back(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--sandbox", "off", "--max-connections", "64", tcp=False,
                        open_files=(STARTED_WITH, HARD)).start()
    try:
        assert _soft_limit(srv.pid) > STARTED_WITH
        # given back just after the spawn (open_files.give_back), so read after a moment
        assert asyncio.run(_ulimits(srv.unix, 3, "sleep 0.2; ulimit -n")) == [str(STARTED_WITH)] * 3
        assert asyncio.run(_ulimits(srv.unix, 1, "sleep 0.2; ulimit -n", pty=(24, 80))) == [str(STARTED_WITH)]
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_a_hard_limit_below_the_need_is_said_once_with_the_remedy(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, tcp=False, open_files=(STARTED_WITH, 1024)).start()  # --max-connections 1024
    try:
        assert _soft_limit(srv.pid) == 1024
        said = [r for r in srv.logs if "open-file limit" in str(r.get("event"))]
        assert len(said) == 1 and said[0]["level"] == "warning", said
        assert said[0]["hard"] == 1024 and said[0]["started_with"] == STARTED_WITH
        assert said[0]["needed"] == open_files.needed(1024, 64 + 8)
        assert "ulimit -Hn" in said[0]["remedy"] and "--max-connections" in said[0]["remedy"]
        assert "busy sessions" in said[0]["event"]
        assert asyncio.run(_ulimits(srv.unix, 2)) == [str(STARTED_WITH)] * 2  # it serves all the same
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_a_worker_raises_it_for_its_sessions_and_a_gateway_for_its_connections(tmp_path: pathlib.Path) -> None:
    from harness.nats_cluster import Cluster

    cluster = Cluster(tmp_path, workers=0)
    cluster.gateway.open_files = (STARTED_WITH, HARD)
    try:
        cluster.start()
        worker = cluster.make_worker("--max-sessions", "20")
        worker.open_files = (STARTED_WITH, HARD)
        worker.start()
        cluster.wait_connected(1)
        assert _soft_limit(worker.pid) == min(open_files.needed(20, 64 + 8), HARD)  # --max-sessions, not --max-connections
        assert _soft_limit(cluster.gateway.pid) == min(open_files.needed(1024, 0), HARD)  # it runs no command
        assert asyncio.run(_ulimits(cluster.unix, 2)) == [str(STARTED_WITH)] * 2  # a command on the worker
    finally:
        cluster.stop()


def test_a_service_on_stdin_and_stdout_alone_needs_one_session(tmp_path: pathlib.Path) -> None:
    """`smith-fast exec`'s own server and an MCP client's hold one session: a hard limit of 1024,
    which a socket server warns about, is plenty, and nothing is said."""
    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    out = subprocess.run([sys.executable, "-m", "smith_fast", "serve", "--stdio", "--root", str(tmp_path), "--log-level", "debug"],
                         cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, preexec_fn=low)
    assert '"event":"ready"' in out.stderr, out.stderr
    assert "open-file limit" not in out.stderr
    assert open_files.needed(1, 64 + 8) < 1024
