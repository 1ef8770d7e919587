"""What the process that starts a service leaves it does not reach its commands, nor break it.

Signals: a service started with signals ignored or blocked runs its commands with every signal at
its default, and can still be stopped.

A script's ``smith-fast serve &`` starts the service with SIGINT and SIGQUIT ignored (a shell
without job control ignores both for what it puts in the background), ``nohup`` with SIGHUP
ignored; a launcher may start it with signals blocked. Ignored and blocked signals survive fork and
exec: commands run outside the sandbox (whose init resets them all) inherited them, so ``kill
-QUIT`` or ``kill -TERM`` of a command, or Ctrl-\\ on its terminal, did nothing (``SigIgn:
0000000000000004``, ``SigBlk: 0000000000014202`` in a ``--sandbox off`` command's status before
the fix), and with SIGTERM blocked the service itself could not be stopped. The service goes on
ignoring what it was started ignoring.

Standard fds: a service started with fds 0, 1 and 2 closed (a supervisor's, or ``serve >&- 2>&-``)
has ``/dev/null`` on them, where its loop's epoll and io_uring instances and a pipe of its own took
those numbers before: its "stderr" was a pipe of libuv's, and SIGTERM then ended it by SIGABRT;
``smith-fast exec CMD >&-`` ended by SIGABRT too.

The file mode creation mask: started with ``umask 000``, what the service makes on the way to its
own directories (``~/.cache/smith-fast``, where compiled Rust hooks wait to be run), what its
commands and ``fs.write`` make, is not writable by others (it was: ``drwxrwxrwx``, ``-rw-rw-rw-``);
group write, as ``umask 002`` asks, is kept.

The working directory: started in a directory since removed, ``serve`` without ``--root`` says
so and what to do (it printed a traceback, from building its parser); with ``--root`` it serves.

Real ``smith-fast`` processes, through the SDK.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from smith_fast.client import Client
from smith_fast.service.lifecycle import INHERITED_IGNORES

from harness.server import ROOT, ServerProcess, wait_until

IGNORED_MASK = sum(1 << (sig - 1) for sig in INHERITED_IGNORES)
BLOCKED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD)
STATUS = "exec grep -E '^Sig(Ign|Blk)' /proc/self/status"


STANDARD = (1 << 31) - 1  # signals 1-31: 32 and 33 are the C library's, which sigaction does not let anyone set


def masks(status: bytes) -> tuple[int, int]:
    """The ``SigIgn`` and ``SigBlk`` masks in a ``/proc/PID/status`` text, of the standard signals.

    A library loaded earlier in the suite's process may leave signal 32 ignored, which every
    process it starts inherits, the sandbox's init too (glibc refuses to change it)."""
    def mask(name: bytes) -> int:
        return int(status.split(name + b":")[1].split()[0], 16) & STANDARD

    return mask(b"SigIgn"), mask(b"SigBlk")


@pytest.fixture(scope="module", params=["off", "workspace-write"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"ignoring-{request.param}")
    srv = ServerProcess(tmp, "--sandbox", request.param, "--kill-grace", "1s", tcp=False, ignoring=INHERITED_IGNORES,
                        blocking=BLOCKED).start()
    yield srv
    # SIGTERM, blocked when it started, stops it as it stops any service
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_the_service_unblocks_them_holds_the_ignored_by_a_handler_and_says_so(server: ServerProcess) -> None:
    ignored, blocked = masks(pathlib.Path(f"/proc/{server.pid}/status").read_bytes())
    caught = int(pathlib.Path(f"/proc/{server.pid}/status").read_text().split("SigCgt:")[1].split()[0], 16)
    assert blocked == 0 and ignored & IGNORED_MASK == 0 and caught & IGNORED_MASK == IGNORED_MASK
    said = [line for line in server.logs if line.get("event", "").startswith("started with signals blocked or ignored")]
    assert said and said[0]["ignored"] == "SIGHUP,SIGINT,SIGQUIT", said
    assert said[0]["unblocked"] == "SIGINT,SIGUSR1,SIGTERM,SIGCHLD", said


async def test_its_commands_get_every_signal_at_its_default(server: ServerProcess) -> None:
    client = await Client.connect(server.unix)
    await client.handshake()
    try:
        plain = await client.run(STATUS)
        assert plain.exit_code == 0 and masks(plain.stdout) == (0, 0), plain
        on_a_terminal = await client.run(STATUS, pty=(24, 80))
        assert on_a_terminal.exit_code == 0 and masks(on_a_terminal.stdout) == (0, 0), on_a_terminal
        pid = await client.background(STATUS)
        attached = await client.attach(pid)
        out = b"".join([chunk.data async for chunk in attached])
        assert await attached.wait() == 0 and masks(out) == (0, 0), out
        # and so each ends the command as it would anywhere else
        for sig in {*INHERITED_IGNORES, *BLOCKED} - {signal.SIGCHLD}:
            killed = await client.run(f"kill -{int(sig)} $$; sleep 30")
            assert killed.exit_code == -sig, (sig, killed)
    finally:
        await client.close()


async def test_the_service_goes_on_ignoring_what_it_was_started_ignoring(server: ServerProcess) -> None:
    for sig in INHERITED_IGNORES:
        if sig != signal.SIGINT:  # SIGINT stops a service, as SIGTERM does, however it was started
            os.kill(server.pid, sig)
    client = await Client.connect(server.unix)
    await client.handshake()
    try:
        assert (await client.run("echo still here")).stdout == b"still here\n"
    finally:
        await client.close()
    assert server.proc is not None and server.proc.poll() is None


# closes fds 0-2, then execs its arguments
CLOSING = "import os, sys\nfor fd in (0, 1, 2): os.close(fd)\nos.execv(sys.argv[1], sys.argv[1:])\n"


def _stdio(pid: int) -> list[str]:
    return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in range(3)]


async def test_a_service_started_with_its_stdio_closed_has_dev_null_there(tmp_path: pathlib.Path) -> None:
    sock, root = tmp_path / "smith.sock", tmp_path / "root"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", CLOSING, sys.executable, "-m", "smith_fast", "serve", "--unix", str(sock),
                             "--root", str(root), "--sandbox", "off"], cwd=ROOT)
    try:
        assert wait_until(sock.exists, 20.0)
        client = await Client.connect(f"unix:{sock}")
        await client.handshake()
        try:
            result = await client.run("echo started")
        finally:
            await client.close()
        assert result.stdout == b"started\n"
        assert _stdio(proc.pid) == ["/dev/null"] * 3
    finally:
        proc.terminate()
        assert proc.wait(20) == 0  # stopped as a service stops (was -SIGABRT)


def test_a_client_started_with_its_stdio_closed_ends_with_the_commands_code(server: ServerProcess) -> None:
    # `smith-fast exec CMD >&-`: libuv aborted at the end (exit -6), its loop's fds being 0-2
    done = subprocess.run([sys.executable, "-c", CLOSING, sys.executable, "-m", "smith_fast", "exec", "--connect", server.unix,
                           "echo out; echo err >&2; exit 3"], cwd=ROOT, timeout=60)
    assert done.returncode == 3


def _in_a_removed_directory(tmp: pathlib.Path, *argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    gone = tmp / "gone"
    gone.mkdir()
    return subprocess.run(["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone), sys.executable, "-m", "smith_fast", *argv],
                          input=stdin, capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_serve_in_a_removed_directory_says_what_to_do_or_serves_the_root_given(tmp_path: pathlib.Path) -> None:
    refused = _in_a_removed_directory(tmp_path, "serve", "--unix", str(tmp_path / "smith.sock"))
    assert refused.returncode == 2 and b"Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.decode().strip() == (
        "smith-fast serve: the current directory was removed: cd to one that exists, or give --root DIR")
    for command in (("exec", "true"), ("ping",)):  # said once, before a serve --stdio of its own would start there
        spawning = _in_a_removed_directory(tmp_path, *command)
        assert spawning.returncode == 2 and spawning.stderr.decode() == (
            "smith-fast: the current directory was removed: cd to one that exists, or give --connect ADDR\n"), spawning.stderr
    root = tmp_path / "root"
    root.mkdir()
    served = _in_a_removed_directory(tmp_path, "serve", "--stdio", "--root", str(root))  # to the end of its input
    assert served.returncode == 0 and b"Traceback" not in served.stderr, served.stderr


@pytest.mark.parametrize(("umask", "expected"), [(0o000, 0o002), (0o002, 0o002), (0o027, 0o027)])
async def test_others_write_is_masked_whatever_the_umask_it_started_with(tmp_path: pathlib.Path, umask: int, expected: int) -> None:
    cache = tmp_path / "xdg" / "cache"  # made by the service, parents and all
    root = tmp_path / "root"
    root.mkdir()
    srv = ServerProcess(tmp_path, root=root, tcp=False, umask=umask, env={"XDG_CACHE_HOME": str(cache)}).start()
    try:
        client = await Client.connect(srv.unix)
        await client.handshake()
        try:
            made = await client.run("umask; echo x > by-command; mkdir dir-by-command")
            assert made.exit_code == 0 and int(made.stdout.split()[0], 8) == expected, made
            await client.call_tool("fs.write", {"path": "by-tool", "content": "x"})
        finally:
            await client.close()
    finally:
        assert srv.stop() == 0
    for path, full in ((root / "by-command", 0o666), (root / "dir-by-command", 0o777), (root / "by-tool", 0o666)):
        assert path.stat().st_mode & 0o777 == full & ~expected, (path, oct(path.stat().st_mode))
    made_dirs = [tmp_path / "xdg", cache, *(p for p in cache.rglob("*") if p.is_dir())]
    assert len(made_dirs) > 3 and not [p for p in made_dirs if p.stat().st_mode & 0o002], [(p, oct(p.stat().st_mode)) for p in made_dirs]
