"""The sandbox on the real kernel, through real servers.

Every check runs a command in a real ``smith-fast serve`` and looks at what the kernel let it do:
a read-only view of the host and Landlock for the file system, a private network namespace for
the network. The machine's kernel has Landlock ABI >= 3 and unprivileged user namespaces (the
service refuses to start otherwise, which is tested by making the probe hide them). The tests run
as whatever user runs the suite; as root, every refused write below would succeed without the
sandbox, which is what makes them mean something. The attacks of the sandbox's threat model are in
``test_sandbox_holds.py``.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.sandbox import HELPER, HIDE_ENV, MIN_LANDLOCK_ABI, Sandbox, kernel_features

from harness.server import ServerProcess, ServerStartError, SmithProcess

EACCES = "Permission denied"
EROFS = "Read-only file system"
RUN = uuid.uuid4().hex[:12]  # outside paths are unique per run: a stale one must not decide a test


def refused(err: str) -> bool:
    """A write outside what the command may write: the read-only view says EROFS, Landlock EACCES."""
    return EACCES in err or EROFS in err


def outside(name: str) -> str:
    """A path in /etc (writable by root, which the suite may run as, unless the sandbox stops it)."""
    return f"/etc/smith-fast-{name}-{RUN}"


def test_the_kernel_has_what_the_default_needs() -> None:
    # Not a skip: a kernel without these fails the suite, as the issue requires them of CI.
    features = kernel_features()
    assert features.landlock_abi >= MIN_LANDLOCK_ABI and features.userns


async def _sh(client: Client, command: str, *, cwd: str | None = None) -> tuple[int, str, str]:
    out, err, code = "", "", None
    async for ev in client.shell_exec(command, cwd=cwd):
        if ev.WhichOneof("event_type") == "shell_output":
            o = ev.shell_output
            out += o.stdout if o.HasField("stdout") else ""
            err += o.stderr if o.HasField("stderr") else ""
            if o.finished:
                code = o.exit_code
    assert code is not None
    return code, out, err


@pytest.fixture(scope="module")
def places() -> Iterator[dict[str, pathlib.Path]]:
    # Outside /tmp: a command's /tmp is a private one, so host paths there are not in its view at
    # all, and what these tests look at is what the view lets a command do with what it can see.
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-sandbox-", dir="/var/tmp"))
    try:
        yield from _places(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _places(base: pathlib.Path) -> Iterator[dict[str, pathlib.Path]]:
    out = {name: base / name for name in ("root", "home", "outside", "ww", "ro", "lo")}
    for path in out.values():
        path.mkdir(exist_ok=True)
    (out["home"] / ".bashrc").write_text("# theirs\n")
    (out["home"] / ".ssh").mkdir()
    (out["home"] / ".ssh" / "id_ed25519").write_text("PRIVATE\n")
    (out["root"] / "escape").symlink_to(out["outside"])  # a symlink inside the root that leads out
    yield out


def _server(places: dict[str, pathlib.Path], name: str, *extra: str) -> Iterator[ServerProcess]:
    srv = ServerProcess(places[name], *extra, root=places["root"], env={"HOME": str(places["home"])}).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.fixture(scope="module")
def default(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    yield from _server(places, "ww")  # no flag: the default is workspace-write, network on


@pytest.fixture(scope="module")
def read_only(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    deny = str(places["home"] / ".ssh")
    yield from _server(places, "ro", "--sandbox", "read-only", "--network", "off", "--sandbox-deny-read", deny)


@pytest.fixture(scope="module")
def loopback(places: dict[str, pathlib.Path]) -> Iterator[ServerProcess]:
    yield from _server(places, "lo", "--network", "loopback")


# -- files --------------------------------------------------------------------------------------


async def test_workspace_write_refuses_writes_outside_the_root(default: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await Client.connect(default.unix) as client:
        await client.handshake()
        target = outside("touch")
        code, _, err = await _sh(client, f"touch {target}")
        assert code != 0 and refused(err) and not os.path.exists(target)
        code, _, err = await _sh(client, f'echo pwned >> {places["home"]}/.bashrc')  # the service's HOME (commands get their own)
        assert code != 0 and refused(err)
        assert (places["home"] / ".bashrc").read_text() == "# theirs\n"
        code, _, err = await _sh(client, "echo out > escape/f")  # through the symlink inside the root
        assert code != 0 and refused(err) and not (places["outside"] / "f").exists()
        # the errno itself, not only the shell's wording: EROFS (the view) before EACCES (Landlock)
        code, out, _ = await _sh(client, f"python3 -c 'import os\ntry: os.open(\"{outside('errno')}\", os.O_CREAT | os.O_WRONLY)\nexcept OSError as e: print(e.errno)'")
        assert out == "30\n"


async def test_workspace_write_allows_the_root_tmpdir_and_devices(default: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await Client.connect(default.unix) as client:
        await client.handshake()
        code, out, err = await _sh(
            client,
            'echo in > inside.txt && mkdir -p d/e && mv inside.txt d/e/ && echo t > "$TMPDIR/t" && cat "$TMPDIR/t"'
            ' && echo x > /dev/null && head -c 3 /dev/zero | wc -c && echo "$TMPDIR"',
        )
        assert code == 0, err
        lines = out.splitlines()
        assert lines[:2] == ["t", "3"]
        assert lines[2] == "/tmp"
        assert (places["root"] / "d" / "e" / "inside.txt").read_text() == "in\n"
        # a private /tmp per session: not the host's, kept for the session's next command (its
        # sandbox is built once), empty for another session's
        assert not os.path.exists("/tmp/t") or pathlib.Path("/tmp/t").read_bytes() != b"t\n"
        _, out2, _ = await _sh(client, 'cat "$TMPDIR/t"; ls -A "$TMPDIR" | wc -l')
        assert out2.split() == ["t", "1"]
    async with await Client.connect(default.unix) as other:
        await other.handshake()
        code, out3, err = await _sh(other, 'ls -A "$TMPDIR" | wc -l; cat "$TMPDIR/t"')
        assert out3.strip() == "0" and "No such file" in err and code != 0


async def test_shell_run_and_plan_steps_are_confined_too(default: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await Client.connect(default.unix) as client:
        await client.handshake(["shell_exec"])
        result = await client.call_tool("shell.run", {"command": f"touch {outside('tool')}; echo ok > tool.txt"})
        assert result.success
        ran = json.loads(result.result)
        assert refused(ran["stderr"]) and not os.path.exists(outside("tool"))
        assert (places["root"] / "tool.txt").read_text() == "ok\n"
        events = [ev async for ev in client.plan(f"touch {outside('plan')}", {"execute": "true"})]
        err = "".join(ev.shell_output.stderr for ev in events if ev.WhichOneof("event_type") == "shell_output")
        assert refused(err) and not os.path.exists(outside("plan"))


async def test_read_only_refuses_writes_in_the_root_but_not_in_tmpdir(read_only: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await Client.connect(read_only.unix) as client:
        await client.handshake()
        code, _, err = await _sh(client, "echo x > ro.txt")
        assert code != 0 and refused(err) and not (places["root"] / "ro.txt").exists()
        code, out, err = await _sh(client, 'echo t > "$TMPDIR/t" && cat "$TMPDIR/t" && cat /etc/hostname > /dev/null && echo read')
        assert code == 0 and out == "t\nread\n", err


async def test_deny_read_hides_a_path_and_nothing_else(read_only: ServerProcess, default: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    key = places["home"] / ".ssh" / "id_ed25519"
    async with await Client.connect(read_only.unix) as client:  # --sandbox-deny-read HOME/.ssh
        await client.handshake()
        code, out, err = await _sh(client, f"cat {key}")
        assert code != 0 and out == "" and EACCES in err
        code, out, err = await _sh(client, f"ls {key.parent}")
        assert code != 0 and EACCES in err
        code, out, err = await _sh(client, f"cat {places['home']}/.bashrc && cat /etc/hostname > /dev/null && python3 -c 'print(2)'")
        assert code == 0 and out == "# theirs\n2\n", err
    async with await Client.connect(default.unix) as client:  # without the flag: readable (documented)
        await client.handshake()
        code, out, _ = await _sh(client, f"cat {key}")
        assert code == 0 and out == "PRIVATE\n"


async def test_a_command_cannot_signal_the_service(default: ServerProcess) -> None:
    # The service is not in the command's pid namespace (and Landlock ABI 6 scopes signals too).
    async with await Client.connect(default.unix) as client:
        await client.handshake()
        code, _, err = await _sh(client, f"kill -KILL {default.pid}")
        assert code != 0 and ("no such process" in err.lower() or "not permitted" in err.lower())
        code, out, _ = await _sh(client, "sleep 30 & p=$!; kill -TERM $p; wait $p; echo own children: $?")
        assert out == "own children: 143\n"  # its own processes it can signal
    assert default.proc is not None and default.proc.poll() is None


async def test_a_cwd_outside_the_root_is_refused(default: ServerProcess, places: dict[str, pathlib.Path]) -> None:
    async with await Client.connect(default.unix) as client:
        await client.handshake()
        for cwd in ("/", str(places["outside"]), "escape", ".."):
            with pytest.raises(SmithError, match="PERMISSION_DENIED.*outside the workspace root"):
                await _sh(client, "pwd", cwd=cwd)
        code, out, _ = await _sh(client, "pwd")  # the service stays up and answers, in the root
        assert code == 0 and out == f"{places['root']}\n"
        code, out, _ = await _sh(client, "pwd", cwd=str(places["root"]))  # absolute inside: fine
        assert out == f"{places['root']}\n"


# -- network ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def listener() -> Iterator[int]:
    """A TCP listener of the test on 127.0.0.1 (the host's loopback) that accepts and closes."""
    sock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join()
    sock.close()


def _connect(port: int) -> str:
    return f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=5); print(\"connected\")'"


# The command starts a listener of its own on its loopback and connects to it.
OWN_LOOPBACK = (
    "python3 -c 'import socket; s = socket.create_server((\"127.0.0.1\", 0)); "
    "socket.create_connection(s.getsockname(), timeout=5); print(\"own loopback\")'"
)


async def test_network_on_reaches_the_hosts_loopback(default: ServerProcess, listener: int) -> None:
    async with await Client.connect(default.unix) as client:
        ready = await client.handshake()
        assert ready.service_info["smith_fast.network"] == "on"
        code, out, err = await _sh(client, _connect(listener))
        assert code == 0 and out == "connected\n", err


async def test_network_off_reaches_nothing_not_even_loopback(read_only: ServerProcess, listener: int) -> None:
    async with await Client.connect(read_only.unix) as client:
        await client.handshake()
        code, out, err = await _sh(client, _connect(listener))
        assert code != 0 and "connected" not in out and ("PermissionError" in err or "Network is unreachable" in err), err
        code, out, err = await _sh(client, OWN_LOOPBACK)
        assert code != 0 and out == "", err
        code, out, err = await _sh(client, "python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b\"x\", (\"1.1.1.1\", 53))'")
        assert code != 0 and "unreachable" in err, err  # not TCP only: the namespace has no route at all


async def test_network_loopback_is_a_private_loopback(loopback: ServerProcess, listener: int) -> None:
    async with await Client.connect(loopback.unix) as client:
        ready = await client.handshake()
        assert ready.service_info["smith_fast.network"] == "loopback"
        code, out, err = await _sh(client, OWN_LOOPBACK)
        assert code == 0 and out == "own loopback\n", err
        # the host's loopback services are not on the command's loopback (PROTOCOL.md, "Sandbox")
        code, out, err = await _sh(client, _connect(listener))
        assert code != 0 and "ConnectionRefusedError" in err, err


# -- start-up and what the peer is told -----------------------------------------------------------


async def test_service_info_names_the_mode(default: ServerProcess, read_only: ServerProcess) -> None:
    for server, mode, network in ((default, "workspace-write", "on"), (read_only, "read-only", "off")):
        async with await Client.connect(server.unix, protocol="v1") as client:  # v0's Ready has no service_info
            ready = await client.handshake()
            assert ready.service_info["smith_fast.sandbox"] == mode
            assert ready.service_info["smith_fast.network"] == network


@pytest.mark.parametrize(
    ("hide", "args", "says"),
    [
        ("landlock", (), "--sandbox workspace-write needs Landlock ABI >= 3"),
        ("landlock", ("--sandbox", "read-only"), "--sandbox read-only needs Landlock"),
        ("userns", ("--network", "off"), "the sandbox needs unprivileged user namespaces"),
        ("userns", ("--sandbox", "off", "--network", "loopback"), "the sandbox needs unprivileged user namespaces"),
        ("userns", (), "the sandbox needs unprivileged user namespaces"),
    ],
)
def test_the_service_refuses_to_start_without_the_kernel_features(
    tmp_path: pathlib.Path, hide: str, args: tuple[str, ...], says: str
) -> None:
    srv = ServerProcess(tmp_path, *args, env={HIDE_ENV: hide})
    with pytest.raises(ServerStartError) as info:
        srv.start()
    text = str(info.value)
    assert says in text and "Traceback" not in text
    assert not os.path.exists(srv.sock_path)  # it never listened


async def test_sandbox_off_starts_without_landlock_and_says_so(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--sandbox", "off", env={HIDE_ENV: "landlock,userns"}).start()
    try:
        async with await Client.connect(srv.unix) as client:
            ready = await client.handshake()
            assert ready.service_info["smith_fast.sandbox"] == "off"
            code, out, _ = await _sh(client, "echo $TMPDIR; pwd", cwd="/")  # today's behaviour
            assert code == 0 and out.splitlines()[-1] == "/"
    finally:
        assert srv.stop() == 0


# -- Rust hooks ---------------------------------------------------------------------------------

RUST_PROBE = r"""
fn before_shell_exec(_p: &Json) -> Action {
    let outside = match std::fs::write("OUTSIDE", "x") { Ok(_) => "written".to_string(), Err(e) => e.to_string() };
    let inside = match std::fs::write("scratch", "x") { Ok(_) => "written".to_string(), Err(e) => e.to_string() };
    Action::block(format!("outside: {}; workdir: {}", outside, inside))
}
hooks! { before_shell_exec }
"""


async def test_rustc_and_rust_hooks_run_sandboxed(tmp_path: pathlib.Path) -> None:
    hook = tmp_path / "probe.rs"
    hook.write_text(RUST_PROBE.replace("OUTSIDE", outside("hook")))
    root = tmp_path / "root"
    root.mkdir()
    # a fresh cache: rustc compiles under the sandbox (writing only its build directory)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    srv = ServerProcess(tmp_path, "--hook", str(hook), root=root, env=env).start(timeout=120)
    try:
        async with await Client.connect(srv.unix) as client:
            await client.handshake()
            with pytest.raises(SmithError) as info:
                await _sh(client, "true")
        assert "outside: Read-only file system (os error 30); workdir: written" in str(info.value)
        assert not os.path.exists(outside("hook"))
    finally:
        assert srv.stop() == 0


# -- the sandbox program itself (csrc/sandbox_exec.c) ---------------------------------------------


def test_the_service_starts_from_a_directory_the_sandbox_hides(tmp_path: pathlib.Path) -> None:
    """A service started from a directory under /tmp (a checkout there): the commands' /tmp is a
    private one, so that directory is not in their view; the start-up probe runs in the root
    instead, and the service starts and runs commands there."""
    elsewhere = tmp_path / "checkout"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    srv = SmithProcess(tmp_path, "serve", "--unix", str(tmp_path / "smith.sock"), "--root", str(root), cwd=elsewhere)
    try:
        srv.start()
        done = subprocess.run([sys.executable, "-m", "smith_fast", "exec", "--connect", srv.unix, "--", "pwd"],
                              capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout.strip()) == (0, str(root)), done.stderr
    finally:
        srv.stop()


@pytest.mark.parametrize("network", ["on", "off", "loopback"])
def test_the_sandbox_program_enforces_the_policy(tmp_path: pathlib.Path, network: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    prefix = [HELPER, "--fs", "on", "--network", network, "--write", str(root), "--"]
    script = f"touch {outside('wrapper')}; echo in > inside; cat inside; echo > /dev/null && echo dev"
    done = subprocess.run([*prefix, "/bin/sh", "-c", script], capture_output=True, text=True, cwd=root)
    assert done.stdout == "in\ndev\n" and refused(done.stderr)
    done = subprocess.run([*prefix, "/bin/sh", "-c", OWN_LOOPBACK], capture_output=True, text=True, cwd=root)
    assert (done.returncode == 0) == (network != "off"), done.stderr


def test_the_sandbox_program_leaves_sigpipe_to_the_command() -> None:
    # `yes | head` must end quietly, as it does unsandboxed.
    done = subprocess.run([HELPER, "--fs", "on", "--", "/bin/sh", "-c", "yes | head -c 5"],
                          capture_output=True, text=True, timeout=30, cwd="/")
    assert (done.returncode, done.stdout, done.stderr) == (0, "y\ny\ny", "")


def test_the_sandbox_program_fails_closed() -> None:
    # Nothing runs when it cannot do what it was asked: a bad argument, a missing program.
    done = subprocess.run([HELPER, "--network", "sideways", "--", "/bin/sh", "-c", "echo ran"], capture_output=True, text=True, cwd="/")
    assert done.returncode == 2 and done.stdout == "" and "usage" in done.stderr
    done = subprocess.run([HELPER, "--write", "/proc/1", "--", "/bin/sh", "-c", "echo ran"], capture_output=True, text=True, cwd="/")
    assert done.returncode == 2 and done.stdout == "" and "usage" in done.stderr
    done = subprocess.run([HELPER, "--", "/nonexistent/program"], capture_output=True, text=True, cwd="/")
    assert done.returncode == 127 and done.stderr.startswith("smith-fast sandbox: cannot run /nonexistent/program")


@pytest.mark.parametrize("how", ["exit", "signal", "killed"])
def test_the_sandbox_program_ends_as_its_command_ends(how: str) -> None:
    # The service sees the monitor: its status must be the command's, a signal included, and a
    # signal sent to its process group reaches the command (the init forwards it).
    script = {"exit": "exit 3", "signal": "kill -TERM $$", "killed": "trap 'exit 7' TERM; echo ready; sleep 60 & wait"}[how]
    proc = subprocess.Popen([HELPER, "--", "/bin/sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True, cwd="/")
    if how == "killed":
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == {"exit": 3, "signal": -signal.SIGTERM, "killed": 7}[how]


def test_the_service_uses_the_sandbox_program() -> None:
    # setup.py builds it, with the C extensions or without them (SMITH_FAST_NO_EXTENSIONS).
    assert os.access(HELPER, os.X_OK)
    assert Sandbox("read-only", "on", "/").wrap(["/bin/true"], [])[0] == HELPER


async def _collect(command: str, sandbox: Sandbox, cwd: pathlib.Path) -> tuple[int, str]:
    from smith_fast.process import ShellProcess

    out: list[bytes] = []
    proc = await ShellProcess.start(command, cwd=str(cwd), on_output=lambda fd, data: out.append(data), sandbox=sandbox)
    return await proc.wait(), b"".join(out).decode()


async def test_a_sandboxed_command_gets_signals_and_fds_as_popen_leaves_them(tmp_path: pathlib.Path) -> None:
    # Default handlers (SIGPIPE too: `yes | head` ends quietly), an empty mask, no inherited fd
    # beyond 0-2, a session of its own, no new privileges.
    sandbox = Sandbox("workspace-write", "on", str(tmp_path))
    # (the status of the shell itself by exec: dash blocks every signal while it waits for a child)
    code, out = await _collect("yes | head -c 3; echo; ls /proc/$$/fd; ps -o sid= -p $$; echo $$; "
                               "exec grep -E '^(SigBlk|SigIgn|NoNewPrivs)' /proc/self/status", sandbox, tmp_path)
    lines = out.split("\n")
    assert code == 0 and out.startswith("y\ny\n0\n1\n2\n"), out
    assert lines[5].strip() == lines[6]  # its own session
    # Ignored signals as Popen leaves them from this process (SIGPIPE and SIGXFSZ back to their
    # defaults; what this process ignores for other reasons, such as a signal the C library
    # reserves, which an earlier test's library may have set, still ignored): asked of Popen here.
    popen = subprocess.run(["grep", "^SigIgn", "/proc/self/status"], capture_output=True, text=True, check=True).stdout
    assert "SigBlk:\t0000000000000000" in out and "NoNewPrivs:\t1" in out, out
    ignored = int(out.split("SigIgn:")[1].split()[0], 16)
    assert ignored & ~int(popen.split()[1], 16) == 0, (out, popen)  # nothing Popen would not leave
    assert ignored & ((1 << (signal.SIGPIPE - 1)) | (1 << (signal.SIGXFSZ - 1))) == 0


async def test_the_sandbox_reports_what_popen_reports(tmp_path: pathlib.Path) -> None:
    from smith_fast.errors import ProtocolError
    from smith_fast.process import ShellProcess

    sandbox = Sandbox("workspace-write", "on", str(tmp_path))
    cases = {"working directory": dict(cwd=str(tmp_path / "missing")), "illegal environment": dict(env={"A=B": "1"}),
             "embedded null": dict(env={"A": "x\0y"})}
    for message, kwargs in cases.items():
        with pytest.raises(ProtocolError, match=message):
            await ShellProcess.start("true", on_output=lambda fd, data: None, sandbox=sandbox,
                                     **{"cwd": str(tmp_path), **kwargs})  # type: ignore[arg-type]
