"""'Waiting for input' end to end (PROTOCOL.md, "Waiting for input"): a command with open stdin or a pty that sleeps
reading it gets one LogEvent (``fields.reason = waiting_for_input``) per wait, against a real
``smith-fast serve`` and real programs (``input()``, ``read -p``, the Python REPL), over every front;
a sleeping command, one reading some other pipe, and one without open stdin get none."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from smith_fast.client import Chunk, Client, InputWait
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import RemoteProcess

from harness.server import ServerProcess

from .test_process_control import Raw, shell, stdin

NOTICE = "300ms"
SETTLE = 2.5  # a generous wait (8x the notice time) in which no notice may arrive


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("input_wait")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--input-wait-notice", NOTICE).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def connect(server: ServerProcess, via: str, protocol: str = "v1", *extra: str) -> Client:
    if via == "stdio":
        return await Client.spawn("--input-wait-notice", NOTICE, *extra, "--root", str(server.root), protocol=protocol)
    if via == "grpc":
        return await Client.connect(server.grpc)
    return await Client.connect(server.address(via), protocol=protocol)


async def notice(proc: RemoteProcess) -> InputWait:
    wait = await asyncio.wait_for(proc.input_wanted(), 15)
    assert wait is not None, "the command ended without a notice"
    return wait


async def output_until(chunks: AsyncIterator[Chunk], marker: bytes) -> bytes:
    """Read ``chunks`` (one ``aiter(proc)`` for the whole test: leaving an ``async for`` cancels
    the command) until ``marker`` came."""
    seen = b""
    while marker not in seen:
        seen += (await asyncio.wait_for(anext(chunks), 15)).data
    return seen


@pytest.mark.parametrize("via", ["unix", "tcp", "stdio", "grpc"])
def test_input_on_open_stdin_gets_one_notice_and_input_ends_it(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("python3 -c 'print(\"got\", input())'", stdin=True)
            wait = await notice(proc)
            assert (wait.tty, wait.fd, wait.call) == (False, 0, "read")
            assert wait.pid > 0 and wait.idle_ms >= 250 and "waiting for input" in wait.message
            await asyncio.sleep(SETTLE)  # still waiting: no second notice for the same wait
            assert len(proc.input_waits) == 1
            proc.write("bob\n")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert proc.output().stdout == b"got bob\n"
            assert len(proc.input_waits) == 1 and proc.waiting_for_input is None

    run(main())


@pytest.mark.parametrize("protocol", ["v1", "v0"])
def test_the_notice_is_a_log_event_of_the_request(run, server: ServerProcess, protocol: str) -> None:
    """v1: the fields; v0: the same Log line without them (v0's Log has none), its message says it."""

    async def main() -> None:
        async with await Client.connect(server.unix, protocol=protocol) as client:
            await client.handshake(["shell_exec"])
            raw = Raw(client, str(uuid.uuid4()))
            client.send(shell(raw.rid, "read x", open_stdin=True))
            event = await raw.until(lambda e: e.WhichOneof("event_type") == "log")
            log = event.log
            assert log.request_id == raw.rid and log.level == pb.LOG_LEVEL_INFO and "waiting for input" in log.message
            if protocol == "v1":
                assert set(log.fields) == {"reason", "idle_ms", "pid", "fd", "call", "tty"}
                assert log.fields["reason"] == "waiting_for_input" and log.fields["tty"] == "false"
            else:
                assert not log.fields
            client.send(stdin(raw.rid, b"x\n"))
            await raw.end()
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_READY] and len(raw.of("log")) == 1

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_a_prompt_on_a_pty_gets_one_notice(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("read -p 'name? ' n; echo \"hi $n\"", pty=(24, 80))
            wait = await notice(proc)
            assert (wait.tty, wait.fd, wait.call) == (True, 0, "read")
            assert b"name? " in proc.output().stdout
            proc.write("bob\r")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert b"hi bob" in proc.output().stdout
            assert len(proc.input_waits) == 1

    run(main())


def test_reading_twice_gets_two_notices(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            proc = await client.start('read a; echo "got $a"; read b; echo "got $b"', stdin=True)
            chunks = aiter(proc)
            await notice(proc)
            proc.write("1\n")
            await output_until(chunks, b"got 1")
            await notice(proc)
            assert len(proc.input_waits) == 2
            proc.write("2\n")
            await output_until(chunks, b"got 2")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert len(proc.input_waits) == 2

    run(main())


def test_a_repl_waiting_in_select_on_its_terminal(run, server: ServerProcess) -> None:
    """The Python REPL (as vi) waits in pselect6 on the terminal, not in read."""

    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("python3 -q", pty=(24, 80), env={"PYTHON_BASIC_REPL": "1"})
            chunks = aiter(proc)
            first = await notice(proc)
            assert first.tty
            proc.write("print(6 * 7)\r")
            await output_until(chunks, b"42")
            await notice(proc)
            proc.write("exit()\r")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert len(proc.input_waits) == 2

    run(main())


@pytest.mark.parametrize("mode", ["stdin", "pty"])
def test_sleeping_with_open_input_gets_no_notice(run, server: ServerProcess, mode: str) -> None:
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("sleep 3", stdin=mode == "stdin", pty=(24, 80) if mode == "pty" else None)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert proc.input_waits == []

    run(main())


@pytest.mark.parametrize("open_stdin", [True, False])
def test_reading_another_pipe_or_without_open_stdin_gets_no_notice(run, server: ServerProcess, open_stdin: bool) -> None:
    """Blocked in read, but on a FIFO of its own (not the stdin the peer writes): no notice; nor for
    a command whose stdin is /dev/null."""

    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            fifo = f"fifo-{uuid.uuid4().hex[:8]}"
            proc = await client.start(f"mkfifo {fifo}; (sleep 3; echo x > {fifo}) & cat {fifo}; rm {fifo}", stdin=open_stdin)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert proc.output().stdout == b"x\n"
            assert proc.input_waits == []

    run(main())


def test_zero_turns_it_off(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await Client.spawn("--input-wait-notice", "0", "--root", str(server.root)) as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("read x; echo \"got $x\"", stdin=True)
            await asyncio.sleep(SETTLE)
            proc.write("y\n")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert proc.output().stdout == b"got y\n" and proc.input_waits == []

    run(main())


def test_vi_waiting_for_keys(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("vi -u NONE -N -i NONE", pty=(24, 80), env={"TERM": "xterm"})
            wait = await notice(proc)
            assert wait.tty and wait.call in ("select", "poll", "read")
            proc.write("\x1b:q!\r")
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            assert len(proc.input_waits) == 1

    run(main())


# The detection itself, on real programs (what the notice rests on): which process, fd and call.
PROGRAMS = [
    ("cat", False, (0, "read")),
    ("read -p 'name? ' x", True, (0, "read")),
    ("python3 -c 'import select, sys; select.select([sys.stdin], [], [])'", False, (0, "select")),
    ("python3 -c 'import select, sys; p = select.poll(); p.register(0, select.POLLIN); p.poll()'", True, (0, "poll")),
    ("python3 -c 'import select, sys; e = select.epoll(); e.register(0, select.EPOLLIN); e.poll()'", False, (0, "epoll")),
    ("less /etc/hostname /etc/passwd", True, (3, "read")),  # opens /dev/tty
    ("python3 -c 'import getpass; getpass.getpass()'", True, (3, "read")),
    ("sleep 5", False, None),
    ("sleep 5", True, None),
    ("mkfifo f$$; exec 3<>f$$; rm f$$; cat <&3", False, None),  # a pipe of its own
    ("python3 -c 'import select, os; r, w = os.pipe(); select.select([r], [], [])'", True, None),
    ("set -m; cat & sleep 5", True, None),  # a background job reading the terminal is stopped (SIGTTIN), not waiting
]


@pytest.mark.parametrize(("command", "tty", "expected"), PROGRAMS)
def test_what_counts_as_reading_the_input(run, tmp_path, command: str, tty: bool, expected: tuple[int, str] | None) -> None:  # type: ignore[no-untyped-def]
    from smith_fast.process import ShellProcess
    from smith_fast.service.input_wait import blocked_on_input, target_of

    async def main() -> None:
        proc = await ShellProcess.start(command, cwd=str(tmp_path), on_output=lambda _s, _d: None, stdin=not tty,
                                        pty=(24, 80) if tty else None, env={"PATH": "/usr/bin:/bin", "TERM": "xterm"})
        try:
            found = None
            for _ in range(40):  # until it settles into its wait (or, for the negatives, a generous while)
                await asyncio.sleep(0.05)
                target = target_of(proc)
                assert target is not None
                found = blocked_on_input(proc.pid, target)
                if found is not None:
                    break
            assert (None if found is None else (found.fd, found.call)) == expected
        finally:
            proc.kill()
            await proc.wait()

    run(main())
