"""The sandbox holds: each attack of the sandbox's threat model, from a real command of a real server.

The peer relays what a language model decided, so every command here is hostile. The suite runs
as root, as the service does on this machine and in most containers: without the sandbox each of
these attacks succeeds (they did, before the sandbox had namespaces, a read-only view of the host,
a private /proc, /dev and /tmp and no capabilities). Each test checks that the attack is refused,
that nothing outside changed, and that the service stays up and answers.

Victims live outside /tmp (a command's /tmp is a private one, so host paths there are not even in
its view) and outside the root.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.sandbox import HELPER
from smith_fast.service.config import DEFAULT_COMMAND_MEMORY, DEFAULT_COMMAND_PIDS, Limits

from harness.server import ROOT, ServerProcess, ServerStartError, descendants, parent_of, wait_until

TOKEN = f"tok-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, pathlib.Path]]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-holds-", dir="/var/tmp"))
    out = {name: base / name for name in ("root", "victims", "srv")}
    for path in out.values():
        path.mkdir()
    victim = out["victims"] / "victim.txt"
    victim.write_text("untouched\n")
    os.chmod(victim, 0o600)
    (out["root"] / ".env").write_text("API_KEY=hunter2\n")
    (out["root"] / "secrets").mkdir()
    (out["root"] / "secrets" / "key").write_text("PRIVATE hunter2\n")
    (out["root"] / "visible.txt").write_text("public hunter2\n")
    (out["root"] / "link").symlink_to(".env")
    try:
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def server(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    root = places["root"]
    srv = ServerProcess(
        places["srv"], "--sandbox-deny-read", str(root / ".env"), "--sandbox-deny-read", str(root / "secrets"),
        root=root, env={"SMITH_TOKEN": TOKEN},
    ).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def _client(srv: ServerProcess) -> Client:
    client = await Client.connect(srv.unix, token=TOKEN)
    await client.handshake(["shell_exec"])
    return client


async def _run(srv: ServerProcess, command: str) -> tuple[int, str, str]:
    async with await _client(srv) as client:
        done = await client.run(command)
        return done.exit_code, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


async def _still_serving(srv: ServerProcess) -> None:
    assert srv.proc is not None and srv.proc.poll() is None
    async with await _client(srv) as client:
        assert (await client.run("echo alive")).stdout == b"alive\n"


def _digest(path: str) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


# -- the service's own files ------------------------------------------------------------------------


async def test_a_command_cannot_replace_what_the_service_runs_or_take_its_socket(server: ServerProcess) -> None:
    helper = _digest(HELPER)
    code, _, err = await _run(server, f"printf '#!/bin/sh\\nid > /tmp/pwned\\n' > x && chmod +x x && mv x {HELPER}; cp x {HELPER}")
    # read-only in the command's view, or not in it at all (an installation under the private /tmp)
    assert code != 0 and ("Read-only file system" in err or "No such file" in err) and _digest(HELPER) == helper
    async with await _client(server) as client:
        with pytest.raises(SmithError, match="PERMISSION_DENIED"):
            await client.call_tool("fs.write", {"path": HELPER, "content": "#!/bin/sh\n"})
    # The socket is covered in the command's view: no rename, no relay, no connection to it.
    sock = server.sock_path
    code, out, err = await _run(server, f"mv {sock} {sock}.aside; ls -l {sock}; "
                                        f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{sock}\"); print(\"connected\")'")
    assert not out.endswith("connected\n") and "srw" not in out
    assert "PermissionError" in err or "ConnectionRefusedError" in err, err
    assert pathlib.Path(sock).is_socket() and not os.path.exists(sock + ".aside")
    await _still_serving(server)  # the operator's client, through the real socket


@pytest.mark.parametrize("what", ["installation", "socket", "recordings", "state"])
def test_the_service_refuses_a_root_that_holds_its_own_files(tmp_path: pathlib.Path, what: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    env: dict[str, str] = {}
    extra: tuple[str, ...] = ()
    if what == "installation":
        root = ROOT  # what `make serve` served before: the repository, with the package and the venv in it
    elif what == "socket":
        extra = ("--unix", str(root / "service.sock"))
    elif what == "recordings":
        extra = ("--record", str(root / "rec"))
    else:
        env = {"XDG_STATE_HOME": str(root / ".state")}
    srv = ServerProcess(tmp_path, *extra, root=root, env=env)
    with pytest.raises(ServerStartError) as info:
        srv.start()
    text = str(info.value)
    assert "holds the service's own files" in text and f"its {what}" in text and "--allow-service-files-in-root" in text
    assert "Traceback" not in text
    # The operator may insist, knowing what it costs.
    insisted = ServerProcess(tmp_path, *extra, "--allow-service-files-in-root", root=root, env=env).start()
    assert insisted.stop() == 0


# -- root without its powers ----------------------------------------------------------------------


async def test_root_in_a_command_has_no_capabilities(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    code, out, _ = await _run(server, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; id -u")
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert f"{field}:\t0000000000000000" in out, out
    assert "NoNewPrivs:\t1" in out and out.endswith("0\n")  # still uid 0 (files keep their owner), powerless
    # Device nodes: a loop device over the disk, the kernel log.
    code, _, err = await _run(server, "mknod ./blk b 7 0; mknod ./disk b 254 0; mknod ./kmsg c 1 11; ls")
    assert err.count("Operation not permitted") + err.count("Permission denied") == 3, err
    assert not any((places["root"] / n).exists() for n in ("blk", "disk", "kmsg"))
    # The host's network configuration.
    code, _, err = await _run(server, "ip addr add 127.0.0.99/8 dev lo")
    assert code != 0 and "127.0.0.99" not in subprocess.run(["ip", "addr", "show", "lo"], capture_output=True, text=True).stdout
    # Ownership of a file outside the root.
    victim = places["victims"] / "victim.txt"
    code, _, err = await _run(server, f"chown 1234:1234 {victim}")
    assert code != 0 and victim.stat().st_uid == 0


async def test_a_command_sees_only_its_own_processes(server: ServerProcess) -> None:
    assert server.pid is not None
    code, out, err = await _run(server, f"ps -eo pid=,comm=; cat /proc/{server.pid}/environ; "
                                        "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c SMITH_TOKEN")
    pids = [line.split()[0] for line in out.splitlines()[:-1]]
    assert len(pids) <= 4 and "1" in pids, out  # its init, its shell, ps (and the pipeline's cat)
    assert TOKEN not in out and TOKEN not in err and out.splitlines()[-1] == "0"
    assert "No such file or directory" in err  # the service is not in its /proc at all


async def test_metadata_outside_the_root_cannot_change(server: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    victim = places["victims"] / "victim.txt"
    before = victim.stat()
    script = (f"chmod 0666 {victim}; touch -d 2000-01-01 {victim}; "
              f"python3 -c 'import os; os.setxattr(\"{victim}\", \"user.pwned\", b\"1\")'; "
              f"truncate -s 0 {victim}; ln {victim} ./hardlink")
    code, _, err = await _run(server, script)
    after = victim.stat()
    assert (after.st_mode, after.st_mtime_ns, after.st_size) == (before.st_mode, before.st_mtime_ns, before.st_size)
    assert "user.pwned" not in os.listxattr(victim) and victim.read_text() == "untouched\n"
    assert err.count("Read-only file system") >= 4, err
    assert not (places["root"] / "hardlink").exists()  # a link across the view's mounts: refused


async def test_other_terminals_are_out_of_reach(server: ServerProcess) -> None:
    master, slave = os.openpty()  # a terminal of someone else on this machine
    try:
        name = os.ttyname(slave)
        os.set_blocking(master, False)
        script = (f"ls /dev/pts; echo intruder > {name}; "
                  f"python3 -c 'import fcntl, termios; fd = open(\"{name}\", \"w\"); "
                  "[fcntl.ioctl(fd, termios.TIOCSTI, c) for c in (b\"i\", b\"d\", b\"\\n\")]'")
        code, out, err = await _run(server, script)
        assert out.split() == ["ptmx"]  # its own devpts: no other terminal in it
        assert err.count("No such file or directory") + err.count("Permission denied") == 2, err
        with pytest.raises(BlockingIOError):
            os.read(master, 1024)  # nothing was written into it, nothing pushed as input
    finally:
        os.close(master)
        os.close(slave)
    # A command's own terminal still is one.
    async with await _client(server) as client:
        done = await client.run("test -t 0 && test -t 1 && tty >/dev/null && echo own terminal; ls /dev/pts", pty=(24, 80))
        assert b"own terminal" in done.stdout


# -- deny-read means deny ---------------------------------------------------------------------------


async def test_deny_read_inside_the_root_is_denied_to_commands_and_tools(server: ServerProcess) -> None:
    code, out, err = await _run(server, "cat .env; cat link; ls secrets; cat secrets/key; cat visible.txt; grep -r hunter2 . | sort")
    assert "API_KEY" not in out and "PRIVATE" not in out and out.count("public hunter2") == 2, out
    assert err.count("Permission denied") >= 4, err
    async with await _client(server) as client:
        for path in (".env", "link", "secrets/key", "secrets"):
            tool = "fs.list" if path == "secrets" else "fs.read"
            with pytest.raises(SmithError, match="PERMISSION_DENIED"):
                await client.call_tool(tool, {"path": path})
        with pytest.raises(SmithError, match="PERMISSION_DENIED"):
            await client.call_tool("fs.write", {"path": ".env", "content": "overwritten"})
        found = await client.tool("fs.search", {"pattern": "hunter2"})
        assert [m["path"] for m in found.value["matches"]] == ["visible.txt"]
        assert (await client.tool("fs.read", {"path": "visible.txt"})).value["content"] == "public hunter2\n"
    # and the deny-read paths are untouched on the host
    assert (server.root / ".env").read_text() == "API_KEY=hunter2\n"


# -- nothing left behind, and bounded by default ----------------------------------------------------


async def test_a_killed_service_leaves_no_scratch_directory(tmp_path: pathlib.Path) -> None:
    before = {p for p in os.listdir("/tmp") if p.startswith("smith-fast-req-")}
    srv = ServerProcess(tmp_path).start()
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            proc = await client.start("echo x > $TMPDIR/f; echo started; sleep 60")
            async for chunk in proc:
                if b"started" in chunk.data:
                    break
            os.kill(srv.pid or 0, signal.SIGKILL)
            assert srv.proc is not None and srv.proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        srv.stop()
    # no per-request directory on the host at all: a command's TMPDIR is its private /tmp
    assert wait_until(lambda: not {p for p in os.listdir("/tmp") if p.startswith("smith-fast-req-")} - before)
    assert not any(p.name == "f" for p in pathlib.Path("/tmp").iterdir())


def test_the_default_limits_fit_a_build_and_bound_a_command() -> None:
    limits = Limits()
    assert limits.max_memory_per_command == DEFAULT_COMMAND_MEMORY == 8 << 30
    assert limits.max_pids_per_command == DEFAULT_COMMAND_PIDS == 1024
    assert limits.max_tmp_per_command == 1 << 30 and limits.max_file_size == 8 << 30


async def test_a_command_is_bounded_by_default(server: ServerProcess) -> None:
    # The private /tmp of the defaults, then a fork bomb that stops at the default pids limit.
    code, out, _ = await _run(server, "df -B1 --output=size /tmp | tail -1")
    assert int(out) == 1 << 30
    async with await _client(server) as client:
        with pytest.raises(SmithError, match="RESOURCE_EXHAUSTED.*--max-pids-per-command"):
            await client.run("i=0; while [ $i -lt 1100 ]; do sleep 30 & i=$((i+1)); done; wait")
    await _still_serving(server)


@pytest.mark.parametrize("limit", ["tmp", "file", "memory"])
async def test_a_command_past_its_bounds_is_stopped(tmp_path: pathlib.Path, limit: str) -> None:
    flag, script, says = {
        "tmp": ("--max-tmp-per-command", "head -c 8M /dev/zero > $TMPDIR/f", "No space left on device"),
        "file": ("--max-file-size", "head -c 8M /dev/zero > big", "File size limit exceeded"),  # SIGXFSZ
        "memory": ("--max-memory-per-command", "python3 -c 'b = bytearray(256 << 20); print(len(b))'", "RESOURCE_EXHAUSTED"),
    }[limit]
    value = "64M" if limit == "memory" else "4M"
    srv = ServerProcess(tmp_path, flag, value).start()
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            try:
                done = await client.run(script)
            except SmithError as exc:
                assert says in str(exc) and flag in str(exc)
            else:
                assert done.exit_code != 0 and says in done.stderr.decode(), done
            assert (await client.run("echo alive")).stdout == b"alive\n"
        if limit == "file":
            assert (tmp_path / "big").stat().st_size == 4 << 20
    finally:
        assert srv.stop() == 0


async def test_an_output_flood_is_not_read_past_max_output(tmp_path: pathlib.Path) -> None:
    # Four `yes` past --max-output: the service closes their output, so they end (SIGPIPE) instead
    # of costing it the CPU of every byte; another session is answered meanwhile.
    srv = ServerProcess(tmp_path, "--max-output", "1M").start()
    try:
        async with await Client.connect(srv.unix) as flood, await Client.connect(srv.unix) as other:
            await flood.handshake()
            await other.handshake()
            procs = [await flood.start("yes") for _ in range(4)]
            assert (await other.run("echo answered")).stdout == b"answered\n"
            for proc in procs:
                code = await proc.wait()
                assert code in (-signal.SIGPIPE, 128 + signal.SIGPIPE)  # yes, or the shell telling of it
                out = proc.output()
                assert len(out.stdout) == 1 << 20 and b"--max-output" in out.stderr
    finally:
        assert srv.stop() == 0


async def test_a_service_that_adopts_orphans_leaves_no_zombie(tmp_path: pathlib.Path) -> None:
    # The sandbox program ends before its init is reaped (the namespaces' teardown takes an RCU
    # grace period or two); whoever adopts the init reaps it. A service that is pid 1 of its pid
    # namespace (a container's entry point) would be that one, and reaps only its own children:
    # there the sandbox program waits for its init instead (--reap).
    srv = ServerProcess(tmp_path)
    srv.argv = ["unshare", "--pid", "--fork", "--kill-child=SIGTERM", "--mount-proc", *srv.argv]
    srv.start()
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            seen = set()
            for _ in range(10):
                # in the session's pid namespace (its init, the sandbox program, is pid 1 there)
                pid, init = (await client.run("sleep 0.01 & echo $$; cat /proc/1/comm")).stdout.split()
                assert init == b"sandbox-exec" and 1 < int(pid) < 100
                seen.add(pid)
            assert len(seen) == 10
            assert srv.proc is not None
            # a command the zygote's init killed is a zombie until the init reaps it (a moment)
            def zombies() -> list[int]:
                return [pid for pid, state in descendants(srv.proc.pid) if state == "Z"]  # type: ignore[union-attr]

            assert wait_until(lambda: not zombies(), 5), zombies()
        # unshare --fork ignores SIGTERM while it waits for its child: the service is told itself
        # (a handler of its own, so the namespace's init gets it), and unshare ends with its status
        # (srv.stop() waited 20 s for unshare, then killed it)
        inner = [pid for pid, _ in descendants(srv.proc.pid) if parent_of(pid) == srv.proc.pid]
        assert len(inner) == 1, inner
        os.kill(inner[0], signal.SIGTERM)
        assert srv.proc.wait(20) == 0
    finally:
        srv.stop()


async def test_the_hosts_service_sockets_are_out_of_reach(server: ServerProcess) -> None:
    # Root's sockets under /run (docker.sock, systemd's private socket, D-Bus) would each be a way
    # out: a read-only mount does not stop a connect(), and the command is uid 0. Abstract sockets
    # belong to the network namespace, which --network on shares.
    import socket

    path = f"/run/smith-fast-test-{uuid.uuid4().hex[:8]}.sock"
    name = f"\0smith-fast-test-{uuid.uuid4().hex[:8]}"
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    try:
        listeners[0].bind(path)
        listeners[1].bind(name)
        for sock in listeners:
            sock.listen()
            sock.setblocking(False)
        probe = ("import socket, sys\n"
                 "for where in sys.argv[1:]:\n"
                 "    s = socket.socket(socket.AF_UNIX)\n"
                 "    try:\n"
                 "        s.connect(where.replace('@', chr(0)))\n"
                 "        print('connected', where)\n"
                 "    except OSError as e:\n"
                 "        print('refused', e.errno)\n")
        code, out, err = await _run(server, f"python3 -c \"{probe}\" {path} @{name[1:]}; ls /run | wc -l; test -s /etc/resolv.conf && echo resolver")
        assert "connected" not in out and out.count("refused") == 2, (out, err)
        assert f"refused {errno.ENOENT}" in out and f"refused {errno.EPERM}" in out  # not there; Landlock's scope
        assert out.endswith("0\nresolver\n")  # an empty /run; the resolver's configuration kept
        for sock in listeners:
            with pytest.raises(BlockingIOError):
                sock.accept()  # nobody came
    finally:
        for sock in listeners:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# -- the request's environment is the command's -----------------------------------------------------

PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
/* Says where it was loaded, and leaves a mark in MARKS: a directory outside the root, which only
   a process outside the sandbox can write. */
__attribute__((constructor)) static void preloaded(void) {
    char exe[512] = {0}, mark[1024];
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) return;
    dprintf(2, "preloaded in %s\n", exe);
    snprintf(mark, sizeof mark, "%s/%d", MARKS, (int)getpid());
    int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && write(fd, exe, strlen(exe)) < 0) {}
    if (fd >= 0) close(fd);
}
"""


async def test_a_requests_loader_variables_reach_the_command_not_the_sandbox_program(places: dict[str, pathlib.Path]) -> None:
    # An operator who lets requests set LD_PRELOAD (--allow-env) means it for the command, inside
    # its walls. The sandbox program that builds those walls was started with the command's
    # environment, so its own dynamic loader ran the peer's library first, as the service's user,
    # outside every wall: for each command that starts the one-shot way (on a terminal, in a
    # workspace, with --network allow, in the background). Now the program gets the command's
    # variables under names its loader does not read (Sandbox.wrap_environ).
    root, marks = places["root"], places["victims"] / f"marks-{uuid.uuid4().hex[:8]}"
    marks.mkdir()
    (root / "preload.c").write_text(PRELOAD_C)
    so = root / "preload.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKS="{marks}"', "-o", str(so), str(root / "preload.c")], check=True)
    (places["srv"] / "preload").mkdir()
    srv = ServerProcess(places["srv"] / "preload", "--allow-env", "LD_PRELOAD", root=root, env={"SMITH_TOKEN": TOKEN}).start()
    try:
        async with await _client(srv) as client:
            env = {"LD_PRELOAD": str(so)}
            piped = await client.run("true", env=env)  # the session's zygote
            on_terminal = await client.start("true", env=env, pty=(24, 80))  # one-shot
            assert await on_terminal.wait() == 0
            background = await client.start("true", env=env, background=True)  # one-shot, outliving the session
            assert await background.wait() == 0
            shown = [piped.stderr.decode(), on_terminal.output().stdout.decode(), background.output().stderr.decode()]
            # A session's next command runs in a shell started ahead with this one's environment
            # (warm_shell.py): one asked without the library must not get a shell that loaded it,
            # and one asked with it must get a shell that did, as `sh -c` would.
            asked = [True, False, False, True, True, False]
            runs = [await client.run("true", env=env if preload else {}) for preload in asked]
        for text in shown:  # the command's shell loaded it, and nothing before the shell did
            assert "preloaded in " in text and "sandbox-exec" not in text and "python" not in text, shown
        assert [run.stderr.decode().startswith("preloaded in ") for run in runs] == asked, [run.stderr for run in runs]
        assert os.listdir(marks) == [], [(m, (marks / m).read_text()) for m in os.listdir(marks)]
        await _still_serving(srv)
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
        for name in ("preload.c", "preload.so"):
            (root / name).unlink()
