"""The shell process runner, with real subprocesses, on both uvloop and stdlib asyncio.

Every test runs twice (``[asyncio]`` and ``[uvloop]``) through the ``run`` fixture, which fails the
test if the loop's exception handler fired or if any shell was left unreaped.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from smith_fast import process, shell_process
from smith_fast.errors import ProtocolError
from smith_fast.pb import smith_pb2
from smith_fast.process import (
    STDERR,
    STDOUT,
    Collected,
    ShellProcess,
    base_environment,
    kill_all,
    run_collect,
)

from .conftest import LOOP_FACTORIES, Runner

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def after_loop() -> Callable[[], None]:
    """Once a test's loop is closed (the ``run`` fixture, tests/conftest.py): no shell left unreaped."""

    def check() -> None:
        assert shell_process._LIVE == {}, f"shells left unreaped: {shell_process._LIVE}"

    return check


class Sink:
    """An ``on_output`` that keeps everything, per stream."""

    def __init__(self) -> None:
        self.data: dict[int, bytearray] = {STDOUT: bytearray(), STDERR: bytearray()}
        self.chunks = 0

    def __call__(self, fd: int, data: bytes) -> None:
        assert fd in (STDOUT, STDERR)
        assert isinstance(data, bytes) and data
        self.data[fd] += data
        self.chunks += 1

    @property
    def out(self) -> bytes:
        return bytes(self.data[STDOUT])

    @property
    def err(self) -> bytes:
        return bytes(self.data[STDERR])


async def run_sink(command: str, **kwargs: Any) -> tuple[int, Sink]:
    sink = Sink()
    proc = await ShellProcess.start(command, on_output=sink, **kwargs)
    return await proc.wait(), sink


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def assert_dies(pid: int) -> None:
    """``pid`` is dead, or dies within moments (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + 5.0
    while alive(pid):
        assert time.monotonic() < deadline, f"process {pid} is still alive"
        time.sleep(0.01)


def open_fds() -> set[str]:
    """This process's descriptors but its epolls: a loop's own, and its epoll of pipes
    (smith_fast.fd_watch), made with its first command and closed when the loop is collected,
    which may be during a later test."""
    listing = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        names = os.listdir(listing)
    finally:
        os.close(listing)
    out = set()
    for name in names:
        try:
            if name != str(listing) and os.readlink(f"/proc/self/fd/{name}") != "anon_inode:[eventpoll]":
                out.add(name)
        except FileNotFoundError:  # closed meanwhile (a collected loop's)
            pass
    return out


# -- output ----------------------------------------------------------------------------------------


def test_a_pipe_is_enlarged_once_output_fills_it_and_only_then(run: Runner[Any]) -> None:
    # A command with little output keeps the kernel's default pipe (no F_SETPIPE_SZ, no larger
    # ring to allocate and free); one whose output comes faster than it is read gets PIPE_SIZE.
    async def body() -> tuple[int, int, int]:
        r, w = os.pipe()
        default = fcntl.fcntl(r, fcntl.F_GETPIPE_SZ)
        os.close(r)
        os.close(w)
        sink = Sink()
        proc = await ShellProcess.start("echo hi; head -c 3000000 /dev/zero >&2; sleep 5", on_output=sink)
        try:
            await until(lambda: len(sink.err) == 3_000_000)
            return default, fcntl.fcntl(proc._pipes[STDOUT], fcntl.F_GETPIPE_SZ), fcntl.fcntl(proc._pipes[STDERR], fcntl.F_GETPIPE_SZ)
        finally:
            proc.kill()
            await proc.wait()

    default, out, err = run(body())
    assert out == default < err == process.PIPE_SIZE


def test_stdout_and_stderr_are_separate_and_byte_exact(run: Runner[Any], tmp_path: Path) -> None:
    big = os.urandom(50_000_000)
    small = os.urandom(3_000_000)
    (tmp_path / "big").write_bytes(big)
    (tmp_path / "small").write_bytes(small)
    code, sink = run(run_sink("cat big & cat small >&2; wait", cwd=str(tmp_path)))
    assert code == 0
    assert len(sink.out) == len(big)
    assert hashlib.sha256(sink.out).digest() == hashlib.sha256(big).digest()
    assert sink.err == small


def test_output_order_within_a_stream_survives_many_small_writes(run: Runner[Any]) -> None:
    code, sink = run(run_sink("seq 1 200000; seq 1 1000 >&2"))
    assert code == 0
    assert sink.out == b"".join(b"%d\n" % i for i in range(1, 200001))
    assert sink.err == b"".join(b"%d\n" % i for i in range(1, 1001))


def test_a_burst_of_small_writes_is_read_in_few_large_chunks(run: Runner[Any]) -> None:
    # seq writes 4 KiB at a time; read as each write lands it came in up to ~320 chunks (each an
    # event for the peer). Paced (shell_process.READ_PACE): a few quick reads at once, then at most
    # one small read per pace, so a few ms of output is a few reads (the count bounds a slow
    # machine too: ~60 ms of writing at most ~60 paced reads)
    code, sink = run(run_sink("seq 1 200000"))
    assert code == 0 and sink.out == b"".join(b"%d\n" % i for i in range(1, 200001))
    assert sink.chunks <= 80, sink.chunks


def test_the_pace_ends_with_the_command(run: Runner[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # Small writes spaced so each is read alone: the fourth starts the pace (made 60 s here). The
    # command then ends: its last output and its end are read at the reap, not a pace later (the
    # MCP shell's `true` writes six times and waited for its final event this way). The grace for
    # an escaped writer, which would read them too, is made a minute as well.
    monkeypatch.setattr(shell_process, "READ_PACE", 60.0)
    monkeypatch.setattr(shell_process, "ESCAPED_WRITER_GRACE", 60.0)

    async def body() -> tuple[int, Sink, float, bool]:
        sink = Sink()
        proc = await ShellProcess.start("for c in a b c d; do printf $c; sleep 0.05; done; printf e", on_output=sink)
        while proc.returncode is None and proc._pacing is None:  # noqa: SLF001 (the pace began)
            await asyncio.sleep(0.01)
        pacing = proc._pacing is not None  # noqa: SLF001
        start = time.monotonic()
        try:
            code = await proc.wait(timeout=20)
        finally:
            proc.close()
        return code, sink, time.monotonic() - start, pacing

    code, sink, waited, pacing = run(body())
    assert pacing, "the fourth small write did not start the pace"
    assert (code, sink.out) == (0, b"abcde")
    assert waited < 20, f"the end waited for the pace ({waited:.1f} s)"


def test_read_size_bounds_each_chunk(run: Runner[Any]) -> None:
    sizes: list[int] = []

    async def body() -> int:
        proc = await ShellProcess.start(
            "head -c 1000000 /dev/zero", on_output=lambda fd, data: sizes.append(len(data)), read_size=4096
        )
        return await proc.wait()

    assert run(body()) == 0
    assert sum(sizes) == 1_000_000
    assert max(sizes) <= 4096


# -- exit codes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [0, 3, 255])
def test_exit_status(run: Runner[Any], status: int) -> None:
    code, sink = run(run_sink(f"echo out; echo err >&2; exit {status}"))
    assert code == status
    assert (sink.out, sink.err) == (b"out\n", b"err\n")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killed_by_signal_is_negative(run: Runner[Any], sig: int) -> None:
    code, _ = run(run_sink(f"kill -{int(sig)} $$; sleep 5"))
    assert code == -sig


def test_returncode_and_kill(run: Runner[Any]) -> None:
    async def body() -> None:
        proc = await ShellProcess.start("sleep 30", on_output=Sink())
        assert proc.returncode is None
        assert repr(proc) == f"<ShellProcess pid={proc.pid} running>"
        assert os.getpgid(proc.pid) == proc.pid  # leads its own group
        proc.kill()
        assert await proc.wait() == -signal.SIGKILL
        assert proc.returncode == -signal.SIGKILL
        assert "returncode=-9" in repr(proc)
        assert not alive(proc.pid)
        proc.kill()  # reaped: a no-op, never a signal to a reused pid
        assert await proc.terminate() == -signal.SIGKILL

    run(body())


# -- environment and working directory -------------------------------------------------------------


def parse_env(output: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.decode().splitlines())


def test_base_environment_is_documented_and_minimal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMITH_FAST_TEST_SECRET", "hunter2")
    monkeypatch.setenv("PATH", "/opt/x/bin:/usr/bin")
    monkeypatch.setenv("HOME", "/home/somebody")
    env = base_environment()
    assert set(env) == {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TERM", "SMITH_FAST"}
    assert env["PATH"] == "/opt/x/bin:/usr/bin"
    assert env["HOME"] == "/home/somebody"
    assert env["USER"] == env["LOGNAME"] != ""
    assert (env["SHELL"], env["LANG"], env["LC_ALL"], env["TERM"], env["SMITH_FAST"]) == (
        "/bin/sh",
        "C.UTF-8",
        "C.UTF-8",
        "dumb",
        "1",
    )
    monkeypatch.delenv("PATH")
    monkeypatch.delenv("HOME")
    env = base_environment()
    assert env["PATH"] == process.DEFAULT_PATH
    assert env["HOME"].startswith("/")
    env["PATH"] = "mutated"
    assert base_environment()["PATH"] == process.DEFAULT_PATH  # a fresh dict each time


def test_env_is_layered_over_the_base(run: Runner[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMITH_FAST_TEST_SECRET", "hunter2")
    code, sink = run(run_sink("env", env={"FOO": "bar baz", "LANG": "en_US.UTF-8", "EMPTY": ""}))
    assert code == 0
    seen = parse_env(sink.out)
    seen.pop("PWD", None)  # the shell exports its working directory itself
    expected = base_environment() | {"FOO": "bar baz", "LANG": "en_US.UTF-8", "EMPTY": ""}
    assert seen == expected
    assert "SMITH_FAST_TEST_SECRET" not in seen


def test_shell_is_exported_as_SHELL(run: Runner[Any]) -> None:
    code, sink = run(run_sink('echo "$SHELL"', shell="bash"))
    assert code == 0
    assert sink.out == b"bash\n"


def test_cwd(run: Runner[Any], tmp_path: Path) -> None:
    code, sink = run(run_sink("pwd -P", cwd=str(tmp_path)))
    assert (code, sink.out) == (0, str(tmp_path.resolve()).encode() + b"\n")
    code, sink = run(run_sink("pwd -P", cwd=""))  # proto3 default: the service's directory
    assert (code, sink.out) == (0, os.path.realpath(os.getcwd()).encode() + b"\n")


def test_another_shell(run: Runner[Any]) -> None:
    code, sink = run(run_sink('echo "${BASH_VERSION:+bash}"', shell="/bin/bash"))
    assert (code, sink.out) == (0, b"bash\n")


# -- spawn failures --------------------------------------------------------------------------------


def spawn_failure(run: Runner[Any], command: str = "true", **kwargs: Any) -> ProtocolError:
    before = open_fds()
    with pytest.raises(ProtocolError) as info:
        run(ShellProcess.start(command, on_output=Sink(), **kwargs))
    assert open_fds() == before
    assert info.value.code == smith_pb2.ERROR_CODE_UNSPECIFIED
    assert info.value.details["reason"] == "spawn_failed"
    return info.value


def test_missing_shell(run: Runner[Any]) -> None:
    err = spawn_failure(run, shell="/no/such/shell")
    assert str(err) == "shell '/no/such/shell' not found"
    assert err.details["errno"] == "ENOENT"


def test_shell_not_executable(run: Runner[Any], tmp_path: Path) -> None:
    script = tmp_path / "notexec"
    script.write_text("#!/bin/sh\n")
    err = spawn_failure(run, shell=str(script))
    assert str(err).startswith(f"shell {str(script)!r} is not executable")
    assert err.details["errno"] == "EACCES"


def test_missing_cwd(run: Runner[Any], tmp_path: Path) -> None:
    missing = str(tmp_path / "gone")
    err = spawn_failure(run, cwd=missing)
    assert str(err) == f"working directory {missing!r} does not exist"


def test_cwd_is_a_file(run: Runner[Any], tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("")
    err = spawn_failure(run, cwd=str(path))
    assert str(err) == f"working directory {str(path)!r} is not a directory"


def test_nul_byte(run: Runner[Any]) -> None:
    assert "null byte" in str(spawn_failure(run, command="echo a\0b"))
    spawn_failure(run, env={"A": "x\0y"})


# -- timeouts and termination ----------------------------------------------------------------------


def test_timeout_kills_the_whole_group(run: Runner[Any]) -> None:
    result = run(run_collect("sh -c 'sleep 100 & echo $!; echo $$; sleep 100'", timeout=0.3))
    assert isinstance(result, Collected)
    assert result.timed_out
    assert result.exit_code == -signal.SIGTERM
    assert 250 <= result.duration_ms < 5000
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        assert_dies(pid)


@pytest.mark.parametrize("timeout", [None, 10.0])
def test_a_wait_resumes_one_loop_step_after_the_command_is_done(run: Runner[Any], timeout: float | None) -> None:
    # wait() resumes in the loop step after the one that saw the command done (reaped, its pipes
    # at their end), as a future awaited directly does: the final event of a ShellExec goes out
    # then. Through asyncio.shield or asyncio.wait (their own callback first) it took two.
    async def body() -> tuple[bool, int]:
        proc = await ShellProcess.start("true", on_output=Sink())
        waiting = asyncio.ensure_future(proc.wait(timeout=timeout))
        while not proc._done.done():  # the step that saw it done ran; the waiter's wake is queued
            await asyncio.sleep(0)
        await asyncio.sleep(0)  # one loop step
        return waiting.done(), await waiting

    assert run(body()) == (True, 0)


def test_sigterm_ignored_then_killed_after_grace(run: Runner[Any]) -> None:
    async def body() -> tuple[int, float, int]:
        sink = Sink()
        proc = await ShellProcess.start("trap '' TERM; sleep 100 & echo $!; wait", on_output=sink)
        await until(lambda: sink.out.endswith(b"\n"))
        started = time.monotonic()
        code = await proc.terminate(grace=0.3)
        return code, time.monotonic() - started, int(sink.out)

    code, elapsed, grandchild = run(body())
    assert code == -signal.SIGKILL
    assert elapsed >= 0.3
    assert_dies(grandchild)


def test_wait_timeout_leaves_the_process_running(run: Runner[Any]) -> None:
    async def body() -> tuple[int, Sink]:
        sink = Sink()
        proc = await ShellProcess.start("echo start; trap 'echo bye; exit 7' TERM; sleep 100 & wait", on_output=sink)
        with pytest.raises(TimeoutError):
            await proc.wait(timeout=0.3)
        assert proc.returncode is None
        assert sink.out == b"start\n"
        code = await proc.terminate(grace=30)  # the trap runs: graceful, output still delivered
        assert await proc.wait(timeout=0) == code
        return code, sink

    code, sink = run(body())
    assert (code, sink.out) == (7, b"start\nbye\n")


def test_terminate_sends_sigterm(run: Runner[Any]) -> None:
    async def body() -> tuple[int, float]:
        proc = await ShellProcess.start("sleep 100", on_output=Sink())
        started = time.monotonic()
        return await proc.terminate(grace=30), time.monotonic() - started

    code, elapsed = run(body())
    assert code == -signal.SIGTERM
    assert elapsed < 5


def test_terminate_wakes_a_stopped_group(run: Runner[Any]) -> None:
    async def body() -> int:
        proc = await ShellProcess.start("kill -STOP $$; echo resumed", on_output=Sink())
        await until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")
        return await proc.terminate(grace=30)

    assert run(body()) == -signal.SIGTERM


def test_run_collect_without_timeout_reports_success(run: Runner[Any]) -> None:
    result = run(run_collect("echo hello; echo oops >&2; exit 2", timeout=30))
    assert result == Collected(2, b"hello\n", b"oops\n", False, False, result.duration_ms)
    assert 0 <= result.duration_ms < 5000


def test_run_collect_truncates_each_stream(run: Runner[Any]) -> None:
    result = run(run_collect("head -c 3000000 /dev/zero; printf 0123456789 >&2; echo done >&2", max_output=1_000_000))
    assert result.exit_code == 0  # the discarded output was still read: the child never blocked
    assert result.stdout == bytes(1_000_000)
    assert result.stderr == b"0123456789done\n"
    assert result.truncated and not result.timed_out


def test_run_collect_exact_cap_is_not_truncated(run: Runner[Any]) -> None:
    result = run(run_collect("printf 12345; printf abcde >&2", max_output=5))
    assert (result.stdout, result.stderr, result.truncated) == (b"12345", b"abcde", False)
    result = run(run_collect("printf 123456", max_output=5))
    assert (result.stdout, result.truncated) == (b"12345", True)


# -- pipes held open, early close ------------------------------------------------------------------


def test_child_closes_stdout_but_keeps_running(run: Runner[Any]) -> None:
    async def body() -> tuple[int, Sink, bool]:
        sink = Sink()
        proc = await ShellProcess.start("echo first; exec 1>&-; sleep 0.3; echo late >&2; exit 4", on_output=sink)
        await until(lambda: STDOUT not in proc._pipes)  # stdout reached EOF ...
        running = proc.returncode is None  # ... while the shell still runs
        return await proc.wait(), sink, running

    code, sink, running = run(body())
    assert running
    assert (code, sink.out, sink.err) == (4, b"first\n", b"late\n")


def test_background_orphan_holding_the_pipe_does_not_hang_wait(
    run: Runner[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long escape grace proves the group kill, not the escaped-writer timer, closed the pipe.
    monkeypatch.setattr(shell_process, "ESCAPED_WRITER_GRACE", 30.0)

    async def body() -> tuple[int, float, int]:
        sink = Sink()
        started = time.monotonic()
        proc = await ShellProcess.start("sleep 100 & echo $!", on_output=sink)
        code = await proc.wait()
        return code, time.monotonic() - started, int(sink.out)

    code, elapsed, orphan = run(body())
    assert code == 0
    assert elapsed < 10
    assert_dies(orphan)


def test_writer_that_escaped_the_group_does_not_hang_wait(run: Runner[Any]) -> None:
    async def body() -> tuple[int, float, Sink]:
        sink = Sink()
        started = time.monotonic()
        proc = await ShellProcess.start("setsid sleep 30 & echo $!; sleep 0.1; echo tail >&2", on_output=sink)
        code = await proc.wait()
        return code, time.monotonic() - started, sink

    code, elapsed, sink = run(body())
    escaped = int(sink.out)
    try:
        assert code == 0
        assert sink.err == b"tail\n"
        assert elapsed < shell_process.ESCAPED_WRITER_GRACE + 3
        # out of reach of the group kill, but not of the command's cgroup (smith_fast.containment),
        # which process.py kills with the group when the shell exits (it was the documented limit)
        deadline = time.monotonic() + 5
        while alive(escaped) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(escaped)
    finally:
        os.kill(escaped, signal.SIGKILL)


# -- backpressure ----------------------------------------------------------------------------------


def test_pause_reading_blocks_the_child_and_loses_nothing(run: Runner[Any]) -> None:
    total = 64 << 20

    async def body() -> tuple[int, int, int, bool]:
        received = 0
        proc: ShellProcess

        def on_output(fd: int, data: bytes) -> None:
            nonlocal received
            if not received:
                proc.pause_reading()
            received += len(data)

        proc = await ShellProcess.start(f"head -c {total} /dev/zero", on_output=on_output)
        await until(lambda: received > 0)
        held = received
        await asyncio.sleep(0.5)
        blocked = proc.returncode is None
        assert received == held  # nothing read while paused
        proc.resume_reading()
        proc.pause_reading()
        proc.pause_reading()  # idempotent
        proc.resume_reading()
        proc.resume_reading()
        return await proc.wait(), held, received, blocked

    code, held, received, blocked = run(body())
    assert code == 0
    assert 0 < held <= process.DEFAULT_READ_SIZE
    assert blocked  # the child could not write 64 MiB into a full pipe
    assert received == total


def test_pause_toggled_on_every_chunk_keeps_order(run: Runner[Any]) -> None:
    async def body() -> tuple[int, Sink]:
        loop = asyncio.get_running_loop()
        sink = Sink()
        proc: ShellProcess

        def on_output(fd: int, data: bytes) -> None:
            sink(fd, data)
            proc.pause_reading()
            loop.call_later(0.001, proc.resume_reading)

        proc = await ShellProcess.start("seq 1 100000; seq 1 100000 >&2", on_output=on_output, read_size=8192)
        return await proc.wait(), sink

    code, sink = run(body())
    expected = b"".join(b"%d\n" % i for i in range(1, 100001))
    assert (code, sink.out, sink.err) == (0, expected, expected)
    assert sink.chunks > 2 * len(expected) // 8192


def test_wait_waits_for_paused_output_past_the_escape_grace(run: Runner[Any]) -> None:
    async def body() -> tuple[Sink, int]:
        sink = Sink()
        proc = await ShellProcess.start("echo hi; echo there >&2", on_output=sink)
        proc.pause_reading()  # before the loop ever read: everything waits in the pipes
        await until(lambda: proc.returncode is not None)
        waiter = asyncio.ensure_future(proc.wait())
        await asyncio.sleep(shell_process.ESCAPED_WRITER_GRACE * 1.5)
        assert not waiter.done()
        assert sink.chunks == 0
        proc.resume_reading()
        return sink, await waiter

    sink, code = run(body())
    assert (code, sink.out, sink.err) == (0, b"hi\n", b"there\n")


# -- cancellation and cleanup ----------------------------------------------------------------------


def test_cancelling_wait_kills_reaps_and_closes(run: Runner[Any]) -> None:
    async def body() -> tuple[ShellProcess, int]:
        before = open_fds()
        sink = Sink()
        proc = await ShellProcess.start("sleep 100 & echo $!; sleep 100", on_output=sink)
        await until(lambda: sink.out.endswith(b"\n"))
        waiter = asyncio.ensure_future(proc.wait())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert proc._pipes == {}  # closed at once
        assert await proc.wait() == -signal.SIGKILL  # reaped in the background
        assert open_fds() == before
        return proc, int(sink.out)

    proc, grandchild = run(body())
    assert not os.path.exists(f"/proc/{proc.pid}")  # reaped, not a zombie
    assert_dies(grandchild)


def test_cancelling_terminate_kills(run: Runner[Any]) -> None:
    async def body() -> int:
        sink = Sink()
        proc = await ShellProcess.start("trap '' TERM; echo ready; sleep 100", on_output=sink)
        await until(lambda: sink.out == b"ready\n")  # SIGTERM before the trap would just kill it
        task = asyncio.ensure_future(proc.terminate(grace=30))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await proc.wait()

    assert run(body()) == -signal.SIGKILL


def test_cancelling_run_collect_kills_and_reaps(run: Runner[Any], tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    async def body() -> list[int]:
        task = asyncio.ensure_future(run_collect(f"sleep 100 & echo $! $$ > {pids}; wait", timeout=60))
        await until(lambda: pids.exists() and pids.read_text().endswith("\n"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        found = [int(p) for p in pids.read_text().split()]
        await until(lambda: not shell_process._LIVE)  # the shell is reaped in the background
        return found

    grandchild, shell = run(body())
    assert not os.path.exists(f"/proc/{shell}")
    assert_dies(grandchild)


def test_on_output_error_kills_and_reaches_wait(run: Runner[Any]) -> None:
    class Boom(Exception):
        pass

    def on_output(fd: int, data: bytes) -> None:
        raise Boom("consumer failed")

    async def body() -> ShellProcess:
        proc = await ShellProcess.start("echo x; sleep 100", on_output=on_output)
        with pytest.raises(Boom):
            await proc.wait()
        return proc

    assert run(body()).returncode == -signal.SIGKILL


def test_kill_all(run: Runner[Any]) -> None:
    async def body() -> list[int]:
        procs = [await ShellProcess.start("sleep 100 & sleep 100", on_output=Sink()) for _ in range(3)]
        assert set(shell_process._LIVE) >= {p.pid for p in procs}
        kill_all()
        return [await p.wait() for p in procs]

    assert run(body()) == [-signal.SIGKILL] * 3


def test_no_fd_leak_after_many_runs(run: Runner[Any]) -> None:
    async def body() -> None:
        for i in range(200):
            if i % 20 == 0:
                with pytest.raises(ProtocolError):
                    await run_collect("true", cwd="/no/such/dir")
            elif i % 20 == 1:
                proc = await ShellProcess.start("sleep 100", on_output=Sink())
                proc.close()
                assert await proc.wait() == -signal.SIGKILL
            else:
                result = await run_collect("echo out; echo err >&2")
                assert (result.stdout, result.stderr) == (b"out\n", b"err\n")

    run(body())  # warm up anything allocated once (the loop's own fds, lazy imports)
    before = open_fds()
    run(body())
    assert open_fds() == before


def test_concurrent_commands(run: Runner[Any]) -> None:
    async def body() -> list[Collected]:
        return await asyncio.gather(*(run_collect(f"seq 1 {n}; exit {n % 7}") for n in range(1, 41)))

    for n, result in enumerate(run(body()), start=1):
        assert result.exit_code == n % 7
        assert result.stdout == b"".join(b"%d\n" % i for i in range(1, n + 1))


def test_polling_fallback_without_pidfd(run: Runner[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell_process, "_HAVE_PIDFD", False)  # as on Linux < 5.3
    code, sink = run(run_sink("sleep 0.1 & echo $!; exit 6"))
    assert code == 6
    assert_dies(int(sink.out))
    result = run(run_collect("sleep 100", timeout=0.2))
    assert (result.timed_out, result.exit_code) == (True, -signal.SIGTERM)


EXITING_SERVICE = """
import asyncio, sys
import uvloop
from smith_fast.process import ShellProcess

async def main():
    got = asyncio.Event()
    def on_output(fd, data):
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        got.set()
    await ShellProcess.start("sleep 100 & echo $! $$; sleep 100", on_output=on_output)
    await got.wait()

(uvloop.run if sys.argv[1] == "uvloop" else asyncio.run)(main())
"""


@pytest.mark.parametrize("loop_name", sorted(LOOP_FACTORIES))
def test_service_exit_kills_children(loop_name: str) -> None:
    # The script returns without waiting for its command: atexit's kill_all must take the group down.
    done = subprocess.run(
        [sys.executable, "-c", EXITING_SERVICE, loop_name], capture_output=True, timeout=30, check=True
    )
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        assert_dies(pid)
