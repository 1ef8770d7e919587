"""No process outlives its request, and every command says what it cost (``smith_fast.containment``).

Against a real ``smith-fast serve`` on this machine's kernel: a command starts daemons that leave
its process group every way a shell can (``setsid``, a double fork, ``nohup``, a Python
daemonization) and prints their pids; the request is then ended each way a request can end
(normal exit, timeout, disconnect, session shutdown, service SIGTERM, service SIGKILL), and /proc
is polled until every daemon is gone. Then the accounting LogEvent that follows the final
ShellOutput, the ``usage`` of ``shell.run``, and each ``--max-*-per-command`` limit answered with
``ERROR_CODE_RESOURCE_EXHAUSTED`` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import sys
import uuid
from collections.abc import Callable

import pytest

from smith_fast.pb import smith_pb2 as pb

from .peers import V0Peer, V1Peer, kind, terminal
from harness.server import ServerProcess, host_pids, pid_alive, wait_until

# The interpreter itself, not the venv's link to it: a command sees the host read-only but a
# private /tmp, and a checkout (its .venv) under /tmp is out of its view.
PY = os.path.realpath(sys.executable)
_DAEMONIZE = (
    "import os, sys, time\n"
    "if os.fork(): sys.exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): sys.exit(0)\n"
    "print(os.getpid(), flush=True)\n"
    "os.close(1); os.close(2); time.sleep(3013)\n"
)
# Each line prints one daemon's pid; none of them stays in the shell's process group.
DAEMONS = "\n".join([
    "setsid sleep 3010 >/dev/null 2>&1 & echo $!",
    "(setsid sleep 3011 >/dev/null 2>&1 & echo $!)",
    "nohup setsid sleep 3012 >/dev/null 2>&1 & echo $!",
    f"{PY} -c '{_DAEMONIZE}'",
])  # fmt: skip
N_DAEMONS = 4


def _shell(peer: V1Peer, rid: str, command: str, **kw: object) -> None:
    peer.command(shell_exec=pb.ShellExecCommand(request_id=rid, command=command, **kw))  # type: ignore[arg-type]


def _daemon_pids(srv: ServerProcess, peer: V1Peer, rid: str) -> list[int]:
    out = ""
    while out.count("\n") < N_DAEMONS:
        env = peer.recv()
        if kind(env) == "shell_output" and env.event.shell_output.request_id == rid:
            out += env.event.shell_output.stdout
    # printed in the command's pid namespace: the same processes as this test sees them
    pids = host_pids(srv.pid or 0, [int(p) for p in out.split()], "sleep 3010")
    assert len(pids) == N_DAEMONS and all(pid_alive(p) for p in pids), (out, pids)
    return pids


def _assert_gone(pids: list[int]) -> None:
    try:
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), [p for p in pids if pid_alive(p)]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _server(tmp_path: pathlib.Path, *extra: str) -> ServerProcess:
    return ServerProcess(tmp_path, *extra, tcp=False).start()


def _end_normal(srv: ServerProcess, peer: V1Peer) -> None:
    # The shell lingers so the daemons are seen alive first: ending at once raced the cell's kill
    # (at the shell's exit) against the last daemon printing its pid and the check that they live.
    _shell(peer, "r", DAEMONS + "\nsleep 2")
    pids = _daemon_pids(srv, peer, "r")
    peer.until(terminal("r"))
    _assert_gone(pids)


def _end_timeout(srv: ServerProcess, peer: V1Peer) -> None:
    _shell(peer, "r", DAEMONS + "\nsleep 300", timeout_ms=1500)
    pids = _daemon_pids(srv, peer, "r")
    ends = peer.until(terminal("r"))
    assert any(kind(e) == "error" and e.event.error.error_code == pb.ERROR_CODE_EXECUTION_TIMEOUT for e in ends)
    _assert_gone(pids)


def _end_disconnect(srv: ServerProcess, peer: V1Peer) -> None:
    _shell(peer, "r", DAEMONS + "\nsleep 300")
    pids = _daemon_pids(srv, peer, "r")
    peer.sock.close()
    _assert_gone(pids)


def _end_shutdown(srv: ServerProcess, peer: V1Peer) -> None:
    _shell(peer, "r", DAEMONS + "\nsleep 300")
    pids = _daemon_pids(srv, peer, "r")
    peer.command(shutdown=pb.ShutdownCommand())
    _assert_gone(pids)


def _end_sigterm(srv: ServerProcess, peer: V1Peer) -> None:
    _shell(peer, "r", DAEMONS + "\nsleep 300")
    pids = _daemon_pids(srv, peer, "r")
    srv.stop(signal.SIGTERM)
    _assert_gone(pids)


def _end_sigkill(srv: ServerProcess, peer: V1Peer) -> None:
    _shell(peer, "r", DAEMONS + "\nsleep 300")
    pids = _daemon_pids(srv, peer, "r")
    os.kill(srv.pid, signal.SIGKILL)  # no cleanup runs in the service: the child guard must do it
    _assert_gone(pids)


ENDINGS: dict[str, Callable[[ServerProcess, V1Peer], None]] = {
    "normal-exit": _end_normal,
    "timeout": _end_timeout,
    "disconnect": _end_disconnect,
    "session-shutdown": _end_shutdown,
    "service-sigterm": _end_sigterm,
    "service-sigkill": _end_sigkill,
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_daemons_die_with_their_request(tmp_path: pathlib.Path, ending: str) -> None:
    srv = _server(tmp_path)
    try:
        peer = V1Peer(srv.unix)
        peer.handshake()
        ENDINGS[ending](srv, peer)
        if ending not in ("service-sigterm", "service-sigkill"):  # the service lives on and answers
            other = V1Peer(srv.unix)
            other.handshake()
            _shell(other, "after", "echo still here")
            assert any(kind(e) == "shell_output" and "still here" in e.event.shell_output.stdout
                       for e in other.until(terminal("after")))
    finally:
        if srv.pid and pid_alive(srv.pid):
            srv.stop()
    # nothing of ours is left in the cgroup trees either (the guard or the service removed them)
    # the service's exit removes them, or its child guard's sweep a moment later (a v1 memory cell whose last
    # member is still exiting refuses rmdir; seen taking over 5 s once in a loaded CI run)
    assert wait_until(lambda: not _leftover_cgroups(srv.pid), 20), _leftover_cgroups(srv.pid)


def _leftover_cgroups(pid: int) -> list[str]:
    found = []
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"):
        for dirpath, dirnames, _ in os.walk(base):
            if f"smith-fast-{pid}" in dirnames:
                found.append(f"{dirpath}/smith-fast-{pid}")
            if dirpath.count("/") > 8:
                dirnames.clear()
    return found


def _usage_of(envs: list[pb.Envelope], rid: str) -> dict[str, str]:
    logs = [e.event.log for e in envs if kind(e) == "log" and e.event.log.request_id == rid
            and "cpu_user_us" in e.event.log.fields]  # fmt: skip
    assert len(logs) == 1, envs
    return dict(logs[0].fields)


def test_accounting_follows_the_final_output(tmp_path: pathlib.Path) -> None:
    srv = _server(tmp_path)
    try:
        peer = V1Peer(srv.unix)
        peer.handshake(**{"smith_fast.accept": "usage"})  # an Envelope addition: only for peers that ask
        _shell(peer, "mem", f"{PY} -c 'b = b\"x\" * (100 << 20); print(len(b))'")
        envs = peer.until(terminal("mem"))
        finals = [i for i, e in enumerate(envs) if kind(e) == "shell_output" and e.event.shell_output.finished]
        usage = _usage_of(envs, "mem")
        log_at = next(i for i, e in enumerate(envs) if kind(e) == "log" and "cpu_user_us" in e.event.log.fields)
        assert finals and log_at > finals[0]  # it accompanies the final ShellOutput
        assert set(usage) >= {"cpu_user_us", "cpu_system_us", "max_rss_bytes", "memory_peak_bytes",
                              "io_read_bytes", "io_write_bytes", "pids_peak", "source"}
        assert int(usage["max_rss_bytes"]) >= 100 << 20
        assert int(usage["memory_peak_bytes"]) >= 100 << 20
        assert usage["source"] == "cgroup"  # this machine kind delegates cgroups to root
        assert int(usage["pids_peak"]) >= 1

        burn = f"{PY} -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass'"
        _shell(peer, "cpu", burn)
        cpu = _usage_of(peer.until(terminal("cpu")), "cpu")
        assert int(cpu["cpu_user_us"]) + int(cpu["cpu_system_us"]) >= 500_000
        assert int(cpu["memory_peak_bytes"]) < 100 << 20  # its own, not the previous command's

        # the same in the service's log, one structured line per command
        def usage_lines() -> list[dict[str, object]]:
            return [r for r in srv.logs if r.get("event") == "command usage"]

        assert wait_until(lambda: {line["request_id"] for line in usage_lines()} >= {"mem", "cpu"}, 5), usage_lines()
        assert all("cpu_user_us" in line and "memory_peak_bytes" in line for line in usage_lines())

        # a peer that did not ask sees exactly the events it always did (strict frontends); v0 has
        # no handshake key to ask with: the service's log has the figures of every command
        quiet = V1Peer(srv.unix)
        quiet.handshake()
        _shell(quiet, "quiet", "echo quiet")
        assert not [e for e in quiet.until(terminal("quiet")) if kind(e) == "log"]
        quiet.close()
        v0 = V0Peer(srv.unix)
        v0.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
        v0.until(lambda m: m["type"] == "Ready")
        rid = str(uuid.uuid4())  # v0 request ids are UUIDs
        v0.send({"type": "ShellExec", "data": {"request_id": rid, "command": "echo v0", "shell": None, "cwd": None,
                                                "env": {}, "timeout_ms": None}})
        msgs = v0.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == rid
                        and m["data"]["state"] in ("Ready", "Error"))  # fmt: skip
        assert [m for m in msgs if m["type"] == "ShellOutput"] and not [m for m in msgs if m["type"] == "Log"]
        v0.close()
        assert wait_until(lambda: {line["request_id"] for line in usage_lines()} >= {"quiet", rid}, 5), usage_lines()

        # and in shell.run's result
        args = json.dumps({"command": "echo hi"}).encode()
        peer.command(tool_call=pb.ToolCallCommand(request_id="tool", tool="shell.run", args=args))
        result = next(e.event.tool_result for e in peer.until(terminal("tool")) if kind(e) == "tool_result")
        assert result.success, result.error
        body = json.loads(result.result)
        assert body["stdout"] == "hi\n" and body["usage"]["source"] == "cgroup"
        assert body["usage"]["cpu_user_us"] >= 0 and body["usage"]["limit_hit"] is None
    finally:
        srv.stop()


LIMITS = {
    "--max-memory-per-command": f"{PY} -c 'b = b\"x\" * (400 << 20); print(len(b))'",
    "--max-pids-per-command": "for i in $(seq 30); do sleep 5 & done; wait",
    "--max-cpu-per-command": f"{PY} -c 'while True: pass'",
}


def test_each_limit_hit_is_resource_exhausted_naming_it(tmp_path: pathlib.Path) -> None:
    srv = _server(tmp_path, "--max-memory-per-command", "128M", "--max-pids-per-command", "10",
                  "--max-cpu-per-command", "0.5")
    try:
        peer = V1Peer(srv.unix)
        peer.handshake(**{"smith_fast.accept": "usage"})
        for flag, command in LIMITS.items():
            rid = flag.strip("-")
            _shell(peer, rid, command, timeout_ms=60_000)
            envs = peer.until(terminal(rid))
            errs = [e.event.error for e in envs if kind(e) == "error"]
            assert len(errs) == 1, (flag, envs)
            assert errs[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED, (flag, errs[0])
            assert errs[0].details["limit"] == flag and flag in errs[0].message
            assert _usage_of(envs, rid)["limit_hit"] == flag
        # under the limits a command runs as before
        _shell(peer, "fine", "echo fine")
        envs = peer.until(terminal("fine"))
        assert not [e for e in envs if kind(e) == "error"] and "limit_hit" not in _usage_of(envs, "fine")
        # shell.run is held to the same limits
        args = json.dumps({"command": LIMITS["--max-cpu-per-command"]}).encode()
        peer.command(tool_call=pb.ToolCallCommand(request_id="tool", tool="shell.run", args=args))
        errs = [e.event.error for e in peer.until(terminal("tool")) if kind(e) == "error"]
        assert len(errs) == 1 and errs[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
        assert errs[0].details["limit"] == "--max-cpu-per-command"
    finally:
        srv.stop()


def test_without_cgroups_usage_comes_from_rusage() -> None:
    """Where no cgroup hierarchy is writable (containment off here), a command still reports what
    it cost, from the shell's wait4 rusage, which covers the children it waited for."""
    import asyncio

    from smith_fast import containment
    from smith_fast.process import run_collect

    burn = f"{PY} -c 'import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass'"
    containment.set_enabled(False)
    try:
        collected = asyncio.run(run_collect(f"{burn}; true"))
    finally:
        containment.set_enabled(True)
    usage = collected.usage
    assert collected.exit_code == 0 and usage is not None
    assert usage.source == "rusage" and usage.pids_peak == 0 and usage.limit_hit is None
    assert usage.cpu_user_us + usage.cpu_system_us >= 250_000
    assert usage.memory_peak_bytes == usage.max_rss_bytes > 0


def test_usage_fields_name_every_field_in_order() -> None:
    """``Usage.fields()`` (the audit line's and the usage LogEvent's fields) takes its names once, not
    from ``dataclasses.fields()`` each time: it must still name every one, in the dataclass's order,
    as strings, and ``limit_hit`` only when a limit was hit."""
    import dataclasses

    from smith_fast.containment import Usage

    names = [f.name for f in dataclasses.fields(Usage)]
    usage = Usage(*range(1, 8), "cgroup")
    assert list(usage.fields()) == [n for n in names if n != "limit_hit"]
    assert usage.fields() == {n: str(getattr(usage, n)) for n in names if n != "limit_hit"}
    hit = dataclasses.replace(usage, limit_hit="--max-memory")
    assert list(hit.fields()) == names and hit.fields()["limit_hit"] == "--max-memory"


def test_memory_bound_reads_a_cells_limit_whichever_hierarchy_holds_memory() -> None:
    """What a NATS worker announces as its memory: a process in a cell of 256 MiB reads that limit
    (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``: this machine's layout is hybrid), and this
    unbounded test process reads none."""
    import subprocess

    from smith_fast import containment

    bound = containment.memory_bound()
    assert bound is None or bound[0] > 0
    cell = containment.new_cell(containment.CommandLimits(memory=256 << 20))
    code = "import sys; from smith_fast.containment import memory_bound; sys.stdin.readline(); print(*memory_bound())"
    try:
        with cell.joined():
            child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        cell.attach(child.pid)  # the cell's limits are set now (as for a command's shell)
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        cell.release()
    assert child.returncode == 0
    limit, used = map(int, out.split())
    assert limit == 256 << 20 and 0 < used < limit


def test_moves_favored_reads_the_cgroup_mounts_options(tmp_path: pathlib.Path) -> None:
    """``favordynmods`` on any cgroup mount (v1 or v2) counts; another filesystem's does not."""
    from smith_fast import containment

    plain = ("35 24 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
             "36 24 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "37 24 0:32 / /mnt rw - tmpfs tmpfs rw,favordynmods\n")
    for text, favored in ((plain, False),
                          (plain.replace("cgroup2 cgroup2 rw", "cgroup2 cgroup2 rw,favordynmods"), True),
                          (plain.replace("rw,memory", "rw,memory,favordynmods"), True)):
        path = tmp_path / "mountinfo"
        path.write_text(text)
        assert containment.moves_favored(str(path)) is favored, text
    assert containment.moves_favored(str(tmp_path / "none")) is False


def test_start_up_says_when_commands_wait_for_cgroup_moves(tmp_path: pathlib.Path) -> None:
    """Where an unsandboxed command's start (the service's step into its cgroup v2 cell, a move of
    the whole service) waits for an RCU grace period after an idle moment (a v2 hierarchy, no cgroup
    mount favoring moves), a service with ``--sandbox off`` says so once at start-up (at info: a
    cost of the host's), naming the remedy; otherwise, and with the sandbox on (its commands are
    born in their cells), it says nothing. This machine's answer is read here as the service reads it."""
    from smith_fast import containment

    expected = containment.slow_moves()
    for extra, says in (((), False), (("--sandbox", "off"), expected)):
        home = tmp_path / ("off" if extra else "on")
        home.mkdir()
        srv = _server(home, *extra)
        try:
            warned = [r for r in srv.logs if r.get("level") == "info" and "favordynmods" in json.dumps(r)]
        finally:
            assert srv.stop() == 0
        assert len(warned) == (1 if says else 0), (extra, warned)
        if says:
            assert warned[0]["cgroup2"] in {m[0] for m in containment.cgroup_mounts() if m[2] == "cgroup2"}
            assert warned[0]["remedy"].startswith("mount -o remount,favordynmods")


async def test_a_one_shot_command_is_born_in_its_v2_cell_and_the_service_stays_out(tmp_path: pathlib.Path) -> None:
    """A sandboxed command started the one-shot way (here on a terminal) is born in its cgroup v2
    cell by the sandbox program (``--cgroup-fd``: its init is cloned into the cell), so the service
    only steps into the v1 cells, a thread's moves: a whole process's move into v2 waits for an RCU
    grace period after an idle moment. Seen from the host: the init and the command are in the
    cell, the sandbox program's monitor (the service's child) is not, and what the command left
    behind (``setsid``) dies with it."""
    from smith_fast.client import Client
    from smith_fast.containment import cgroup_paths
    from harness.server import descendants

    def _v2_of(pid: int) -> str:
        return cgroup_paths(pid)[""]

    srv = _server(tmp_path)
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            run = asyncio.ensure_future(client.run("setsid sleep 3011 & grep '^0::' /proc/self/cgroup; sleep 1", pty=(24, 80)))
            found: dict[str, list[int]] = {}

            def seen() -> bool:
                found.clear()
                for pid, _ in descendants(srv.pid):
                    with contextlib.suppress(OSError):
                        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                        if argv[0].endswith(b"sandbox-exec") and b"--tty" in argv:
                            found.setdefault("sandbox", []).append(pid)
                        elif argv[:2] == [b"sleep", b"3011"]:
                            found.setdefault("left", []).append(pid)
                return len(found.get("sandbox", ())) == 2 and bool(found.get("left"))

            for _ in range(200):  # the event loop runs meanwhile (wait_until would block it)
                if seen():
                    break
                await asyncio.sleep(0.05)
            assert seen(), found
            monitor, init = sorted(found["sandbox"], key=lambda pid: _v2_of(pid).count("/"))
            cell = _v2_of(init)
            assert cell.rsplit("/", 1)[1].startswith("c") and _v2_of(monitor) == _v2_of(srv.pid), (cell, _v2_of(monitor))
            assert all(_v2_of(pid) == cell for pid in found["left"])
            done = await run
            assert done.exit_code == 0 and f"0::{cell}".encode() in done.stdout, done
        left = found["left"]
        assert wait_until(lambda: not any(pid_alive(p) for p in left), 10), left
    finally:
        assert srv.stop() == 0


def test_a_service_says_at_start_what_its_commands_go_without(tmp_path: pathlib.Path) -> None:
    """A host that does not let the service bound its commands as configured (no writable cgroup,
    a controller missing: an unprivileged container) is said at start-up, once, as a warning naming
    the limits not kept; here nothing is missing, and a service says nothing."""
    from smith_fast import containment

    assert containment._shortfall({"memory", "pids"}) == []
    (pids,) = containment._shortfall({"memory"})
    assert "--max-pids-per-command is not enforced" in pids
    (memory,) = containment._shortfall({"pids", "io"})
    assert "--max-memory-per-command is RLIMIT_AS" in memory
    (nothing,) = containment._shortfall(None)
    assert "process group" in nothing and "--max-pids-per-command is not enforced" in nothing
    srv = ServerProcess(tmp_path).start()
    try:
        assert containment.shortfall() == []
        assert not [r for r in srv.logs if "not bounded" in str(r.get("event"))]
    finally:
        assert srv.stop() == 0
