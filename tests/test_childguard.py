"""Children never outlive a service that is SIGKILLed: the child guard (``smith_fast.childguard``).

A real ``smith-fast serve`` runs a command that leaves a background job; the service is then
SIGKILLed, so neither the request's cleanup nor ``kill_all`` at exit runs. The guard process notices
its pipe close and kills the command's whole process group. A separate process using
``smith_fast.process`` directly shows the other side: without a guard (never started, or stopped in
an orderly way) the same children survive their parent, which is what the guard exists to prevent.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from smith_fast import containment
from smith_fast.pb import smith_pb2 as pb

from .peers import V1Peer, kind, terminal
from harness.server import ROOT, ServerProcess, descendants, host_pids, is_child_guard, parent_of, pid_alive, wait_until

# the shell's own pid, then its background job's, then both sleep
SPAWN = "sleep 300 & echo $$ $!; wait"


def _guards_of(pid: int) -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and is_child_guard(int(e)) and parent_of(int(e)) == pid]


def _guard_of(pid: int) -> int:
    found: list[int] = []

    def look() -> bool:
        found[:] = _guards_of(pid)
        return len(found) == 1

    assert wait_until(look, 5), f"no child guard under {pid}: {found}"
    assert wait_until(lambda: _ignores_terminal_signals(found[0]), 10), "the guard never got going"
    return found[0]


def _ignores_terminal_signals(pid: int) -> bool:
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    ignored = int(status.split("SigIgn:")[1].split()[0], 16)
    return all(ignored >> (sig - 1) & 1 for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def _pids_from(peer: V1Peer, *rids: str) -> list[int]:
    """The pids each of the ``SPAWN`` requests ``rids`` printed."""
    out = dict.fromkeys(rids, "")
    while not all("\n" in text for text in out.values()):
        env = peer.recv()
        if kind(env) == "shell_output":
            out[env.event.shell_output.request_id] += env.event.shell_output.stdout
    return [int(p) for rid in rids for p in out[rid].split()]


def _kill_quietly(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def test_sigkilled_service_leaves_no_command_running(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path).start()
    pids: list[int] = []
    try:
        peer = V1Peer(srv.unix)
        peer.handshake()
        assert not _guards_of(srv.pid)  # armed at start, started by the first process it guards
        peer.command(shell_exec=pb.ShellExecCommand(request_id="a", command=SPAWN + " # a"))
        peer.command(shell_exec=pb.ShellExecCommand(request_id="b", command=SPAWN + " # b"))
        printed = _pids_from(peer, "a", "b")  # pids in each command's pid namespace
        guard = _guard_of(srv.pid)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a terminal's signals: ignored
            os.kill(guard, sig)
        pids = host_pids(srv.pid, printed[:2], "# a") + host_pids(srv.pid, printed[2:], "# b")
        assert len(pids) == 4 and all(pid_alive(p) for p in pids)
        # the process groups the service started: the sandbox's monitors, its children
        groups = sorted(pid for pid, _ in descendants(srv.pid) if parent_of(pid) == srv.pid and not is_child_guard(pid))
        assert pid_alive(guard)
        srv.proc.kill()  # type: ignore[union-attr]
        assert srv.proc.wait(10) == -signal.SIGKILL  # type: ignore[union-attr]
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), [p for p in pids if pid_alive(p)]
        assert wait_until(lambda: not pid_alive(guard), 10)  # and the guard is gone too
        # and it said so on the service's stderr, in the service's log format
        assert wait_until(lambda: any(r.get("logger") == "smith_fast.childguard" for r in srv.logs), 5), srv.raw_stderr[-5:]
        (record,) = [r for r in srv.logs if r.get("logger") == "smith_fast.childguard"]
        assert record["level"] == "warning" and record["process_groups"] == groups
    finally:
        srv.stop()
        _kill_quietly(pids)


def test_sigkilled_service_leaves_no_cgroup_of_its_own(tmp_path: pathlib.Path) -> None:
    # The service's cells' parents (smith-fast-PID in each hierarchy) are made with its first cell.
    # A service killed with no command running left them behind (the guard removed only the cells
    # of what it tracked and their parents): one per hierarchy per killed service, for good.
    # Now the guard removes them at its end, whichever way the service ended.
    srv = ServerProcess(tmp_path).start()
    try:
        (record,) = [r for r in srv.logs if r.get("event") == "command containment"]
        parents = record["cgroups"]
        assert parents and not [p for p in parents if os.path.exists(p)]  # seen to be possible, not kept
        peer = V1Peer(srv.unix)
        peer.handshake()
        peer.command(shell_exec=pb.ShellExecCommand(request_id="a", command="true"))
        list(peer.until(terminal("a")))
        assert all(os.path.isdir(p) for p in parents)
        guard = _guard_of(srv.pid)
        peer.close()  # the session ends, and its zygote with it: nothing of it left for the guard to track
        assert wait_until(lambda: not [pid for pid, _ in descendants(srv.pid) if pid != guard], 10)
        srv.proc.kill()  # type: ignore[union-attr]
        assert srv.proc.wait(10) == -signal.SIGKILL  # type: ignore[union-attr]
        assert wait_until(lambda: not pid_alive(guard), 10)
        assert [p for p in parents if os.path.exists(p)] == []
    finally:
        srv.stop()


def test_sigkilled_service_that_ran_no_command_leaves_no_cgroup(tmp_path: pathlib.Path) -> None:
    # Tool calls only: no process of the service's, so no child guard to clean up after a SIGKILL
    # (it starts with the first command). The cells' parents were made at its start to see what the
    # host allows, and stayed: one per hierarchy per killed service (seen in the suite's runs).
    srv = ServerProcess(tmp_path).start()
    try:
        (record,) = [r for r in srv.logs if r.get("event") == "command containment"]
        parents = record["cgroups"]
        assert parents and record["kill"] in ("cgroup.kill", "cgroup")  # what the host allows, as before
        (srv.root / "f.txt").write_text("x")
        peer = V1Peer(srv.unix)
        peer.handshake()
        peer.command(tool_call=pb.ToolCallCommand(request_id="r", tool="fs.read", args=b'{"path": "f.txt"}'))
        list(peer.until(terminal("r")))
        srv.proc.kill()  # type: ignore[union-attr]
        assert srv.proc.wait(10) == -signal.SIGKILL  # type: ignore[union-attr]
        assert [p for p in parents if os.path.exists(p)] == []
    finally:
        srv.stop()


# A hook that leaves a process in its group and names it: a hook process ends on EOF of its stdin,
# what it started does not.
RUST_SPAWNER = r"""
fn before_tool_call(_p: &Json) -> Action {
    match std::process::Command::new("/bin/sleep").arg("300").spawn() {
        Ok(child) => Action::block(format!("spawned {}", child.id())),
        Err(e) => Action::block(format!("spawn failed: {}", e)),
    }
}
hooks! { before_tool_call }
"""


def test_sigkilled_service_leaves_no_rust_hook_process(tmp_path: pathlib.Path) -> None:
    hook = tmp_path / "spawner.rs"
    hook.write_text(RUST_SPAWNER)
    srv = ServerProcess(tmp_path, "--hook", str(hook)).start(timeout=180)  # rustc compiles it first
    pids: list[int] = []
    try:
        peer = V1Peer(srv.unix)
        peer.handshake()
        peer.command(tool_call=pb.ToolCallCommand(request_id="t", tool="fs.list", args=b"{}"))
        text = " ".join(e.error.message for e in (env.event for env in peer.until(terminal("t"))) if e.HasField("error"))
        assert "spawned " in text, text
        inner = int(text.split("spawned ")[1].split()[0].strip("\"'.,;:)"))
        pids = host_pids(srv.pid, [inner], "/bin/sleep")  # the hook runs in a pid namespace of its own
        hook_pid = next(pid for pid, _ in descendants(srv.pid) if pid not in pids)
        pids.append(hook_pid)
        assert all(pid_alive(p) for p in pids)
        srv.proc.kill()  # type: ignore[union-attr]
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), [p for p in pids if pid_alive(p)]
    finally:
        srv.stop()
        _kill_quietly(pids)


def test_service_runs_on_when_its_guard_dies(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path).start()
    try:
        first = V1Peer(srv.unix)  # its first command starts the guard
        first.handshake()
        first.command(shell_exec=pb.ShellExecCommand(request_id="w", command="echo w"))
        first.until(terminal("w"))
        guard = _guard_of(srv.pid)
        os.kill(guard, signal.SIGKILL)
        # dead (a zombie: its pipe closed), so that the first registration finds it gone: a
        # session's zygote registers once, at the session's first command, not per command (so
        # another session's)
        assert wait_until(lambda: not pid_alive(guard), 5)
        peer = V1Peer(srv.unix)
        peer.handshake()
        for rid in ("x", "y"):  # the first one finds the guard gone, the second does not look again
            peer.command(shell_exec=pb.ShellExecCommand(request_id=rid, command=f"echo {rid}"))
            envs = peer.until(terminal(rid))
            out = "".join(e.event.shell_output.stdout for e in envs if kind(e) == "shell_output")
            assert out == f"{rid}\n"
        assert wait_until(lambda: any("child guard process died" in r.get("event", "") for r in srv.logs), 5), srv.raw_stderr
    finally:
        assert srv.stop() == 0


SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from smith_fast import childguard, process

    async def main(mode):
        if mode != "never-started":
            assert childguard.start() and childguard.active()
        proc = await process.ShellProcess.start({spawn!r}, on_output=lambda *a: None)
        done = await process.ShellProcess.start("true", on_output=lambda *a: None)
        await done.wait()  # ended normally: unregistered before it was reaped
        print(proc.pid, flush=True)
        if mode == "stopped":
            childguard.stop()
            assert not childguard.active()
        await asyncio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main(sys.argv[1]))
    """
).format(spawn="sleep 300")


def _remove_cells_of(pid: int) -> None:
    """The cgroup directories a killed process ``pid`` made beside ours (``smith-fast-PID`` and its
    cells), which nothing removes when it ran without its guard."""
    own = containment.cgroup_paths()
    for point, root, kind, controllers in containment.cgroup_mounts():
        key = "" if kind == "cgroup2" else min(controllers & set(own), default=None)
        if key not in own:
            continue
        top = pathlib.Path(containment.cgroup_dir(point, root, own[key])) / f"smith-fast-{pid}"
        if top.is_dir():
            for cell in [d for d in top.iterdir() if d.is_dir()]:
                wait_until(lambda cell=cell: _rmdir_quietly(cell), 5)
            _rmdir_quietly(top)


def _rmdir_quietly(path: pathlib.Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:  # EBUSY: a member still exiting
        return False
    return True


@pytest.mark.parametrize(("mode", "survives"), [("guarded", False), ("never-started", True), ("stopped", True)])
def test_children_of_a_killed_process(mode: str, survives: bool) -> None:
    script = subprocess.Popen([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    out, err = script.communicate(timeout=30)
    assert script.returncode == -signal.SIGKILL, err
    pid = int(out.split()[0])
    try:
        if survives:
            assert pid_alive(pid)
        else:
            assert wait_until(lambda: not pid_alive(pid), 10)
    finally:
        _kill_quietly([pid])
        wait_until(lambda: not pid_alive(pid), 5)
        _remove_cells_of(script.pid)
