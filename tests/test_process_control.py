"""Process control end to end (PROTOCOL.md, "Process control"): Cancel, stdin, PTY, resize and binary output
against a real ``smith-fast serve`` process, over Unix/TCP/stdio v1, v0 and gRPC, raw and through the SDK."""

from __future__ import annotations

import asyncio
import os
import pathlib
import uuid

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import terminal_state

from harness.server import ServerProcess, descendants, wait_until

VIAS = ["unix", "tcp", "stdio", "grpc"]
# every front and protocol: v1 on each, v0 on the sockets and stdio (gRPC is v1 only)
FRONTS = [(via, "v1") for via in VIAS] + [(via, "v0") for via in VIAS if via != "grpc"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("control")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--kill-grace", "1s", "--max-stdin-buffer", "256k",
                        "--capabilities", "shell_exec,hooks_js,hooks_rust,replay,tracing").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def connect(server: ServerProcess, via: str, protocol: str = "v1") -> Client:
    if via == "stdio":
        return await Client.spawn("--kill-grace", "1s", "--max-stdin-buffer", "256k", "--root", str(server.root), protocol=protocol)
    if via == "grpc":
        return await Client.connect(server.grpc)
    return await Client.connect(server.address(via), protocol=protocol)


def rid() -> str:
    return str(uuid.uuid4())


class Raw:
    """A request's events as they arrive, through Client.send (the wire, no SDK helpers)."""

    def __init__(self, client: Client, request_id: str) -> None:
        self.client = client
        self.rid = request_id
        self.queue = client._route(request_id)
        self.events: list[pb.Event] = []

    async def until(self, pred, timeout: float = 15.0) -> pb.Event:  # type: ignore[no-untyped-def]
        async def one() -> pb.Event:
            while True:
                event = await self.client._next(self.queue)
                self.events.append(event)
                if pred(event):
                    return event

        return await asyncio.wait_for(one(), timeout)

    async def end(self) -> pb.Event:
        return await self.until(lambda e: terminal_state(e) is not None)

    def stdout(self) -> bytes:
        out = b""
        for e in self.events:
            if e.WhichOneof("event_type") == "shell_output":
                so = e.shell_output
                out += so.stdout_bytes if so.HasField("stdout_bytes") else so.stdout.encode()
        return out

    def of(self, kind: str) -> list[pb.Event]:
        return [e for e in self.events if e.WhichOneof("event_type") == kind]

    def terminals(self) -> list[int]:
        return [s for e in self.events if (s := terminal_state(e)) is not None]

    def errors(self) -> list[pb.ErrorEvent]:
        return [e.error for e in self.of("error")]

    async def quiet(self, seconds: float = 0.3) -> None:
        """Nothing more arrives for this request (exactly one terminal state)."""
        await asyncio.sleep(seconds)
        while not self.queue.empty():
            event = self.queue.get_nowait()
            assert event is not None
            self.events.append(event)


def shell(request_id: str, command: str, **fields) -> pb.Command:  # type: ignore[no-untyped-def]
    return pb.Command(shell_exec=pb.ShellExecCommand(request_id=request_id, command=command, **fields))


def cancel(request_id: str) -> pb.Command:
    return pb.Command(cancel=pb.CancelCommand(request_id=request_id))


def stdin(request_id: str, data: bytes = b"", eof: bool = False) -> pb.Command:
    return pb.Command(stdin=pb.StdinCommand(request_id=request_id, data=data, eof=eof))


async def started(raw: Raw, marker: bytes) -> None:
    await raw.until(lambda e: marker in raw.stdout())


# ---- 1. cancel ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("via", "protocol"), FRONTS)
def test_cancel_a_shell_exec_terms_its_group_sends_its_output_and_ends_once(run, server: ServerProcess, via: str, protocol: str) -> None:
    async def main() -> None:
        async with await connect(server, via, protocol) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            # The trap proves SIGTERM came first (and its output still arrives); the background
            # sleeps prove the whole group is stopped.
            client.send(shell(r, "trap 'echo bye; exit 7' TERM; sleep 300 & sleep 301 & echo up; wait"))
            await started(raw, b"up")
            client.send(cancel(r))
            client.send(cancel(r))  # twice while under way: harmless
            await raw.end()
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_ERROR]
            assert b"bye" in raw.stdout()
            finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
            assert len(finals) == 1 and finals[0].exit_code == 7
            [error] = raw.errors()
            assert "cancelled" in error.message
            if protocol == "v1":  # v0 errors have no details
                assert error.details["reason"] == "cancelled"
            client.send(cancel(r))  # after it ended as cancelled: still harmless, nothing sent
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_ERROR] and len(raw.errors()) == 1

    run(main())
    if via != "stdio":
        assert wait_until(lambda: not sleeps(server, "sleep 30"), 10), cmdlines(server)


def test_cancel_kills_what_ignores_sigterm_after_the_grace(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "trap '' TERM; echo up; while :; do sleep 0.1; done"))
            await started(raw, b"up")
            loop = asyncio.get_running_loop()
            start = loop.time()
            client.send(cancel(r))
            await raw.end()
            assert loop.time() - start >= 0.9  # --kill-grace 1s: TERM was tried first
            finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
            assert [f.exit_code for f in finals] == [-9]
            assert raw.terminals() == [pb.SERVICE_STATE_ERROR]
            assert raw.errors()[-1].details["reason"] == "cancelled"

    run(main())


def test_a_tool_call_that_needs_no_waiting_ends_before_a_cancel_in_the_same_read(run, server: ServerProcess) -> None:
    """A small fs.read is answered in the step that read it (the one-step shortcut): it has ended when the Cancel behind it
    in the same read is looked at, which then gets not_running and no state (PROTOCOL.md, Process control)."""
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            (pathlib.Path(server.root) / "eager.txt").write_text("quick\n")
            r = rid()
            raw = Raw(client, r)
            client.send(pb.Command(tool_call=pb.ToolCallCommand(request_id=r, tool="fs.read", args=b'{"path": "eager.txt"}')))
            client.send(cancel(r))  # in the same write as its command
            error = await raw.until(lambda e: e.WhichOneof("event_type") == "error")
            assert error.error.details["reason"] == "not_running"
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_READY]
            result = next(e.tool_result for e in raw.events if e.WhichOneof("event_type") == "tool_result")
            assert result.success and b"quick" in result.result

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_cancel_unknown_and_finished_ids_get_a_clear_error_and_no_state(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            unknown = rid()
            client.send(cancel(unknown))
            event = await asyncio.wait_for(client.events.get(), 10)
            while event.WhichOneof("event_type") != "error":  # the handshake's states come first
                event = await asyncio.wait_for(client.events.get(), 10)
            assert event.error.details["reason"] == "unknown_request" and unknown in event.error.message
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo done"))
            await raw.end()
            client.send(cancel(r))
            error = await raw.until(lambda e: e.WhichOneof("event_type") == "error")
            assert error.error.details["reason"] == "not_running" and "already ended" in error.error.message
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


@pytest.mark.parametrize(("kind", "via"), [(kind, "unix") for kind in ("tool_call", "plan", "hook_load", "before_start")]
                         + [("tool_call", "grpc"), ("plan", "grpc"), ("before_start", "grpc")])
def test_cancel_any_request(run, server: ServerProcess, kind: str, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec", "hooks_rust"])
            r = rid()
            raw = Raw(client, r)
            if kind == "tool_call":
                client.send(pb.Command(tool_call=pb.ToolCallCommand(request_id=r, tool="shell.run", args=b'{"command": "sleep 300"}')))
            elif kind == "plan":
                client.send(pb.Command(plan=pb.PlanCommand(request_id=r, goal="sleep 300", context={"execute": "true"})))
            elif kind == "hook_load":  # compiling a Rust hook takes seconds (a new source: not cached)
                script = f"// {r}\nhooks! {{ before_tool_call }}\nfn before_tool_call(_p: &Json) -> Action {{ Action::Allow }}\n"
                client.send(pb.Command(hook_load=pb.HookLoadCommand(request_id=r, hook_type="rust", script=script)))
            else:  # in the same write as its command: cancelled before its task started
                client.send(shell(r, "sleep 300"))
                client.send(cancel(r))
            if kind != "before_start":
                await raw.until(lambda e: e.WhichOneof("event_type") == "state_change" and e.state_change.state == pb.SERVICE_STATE_PROCESSING)
                if kind in ("tool_call", "plan"):
                    assert wait_until(lambda: sleeps(server, "sleep 300"), 10)
                else:
                    assert wait_until(lambda: sleeps(server, "rustc"), 10), cmdlines(server)
                    # rustc runs in a worker thread of the hooks module, which a Cancel does not
                    # reach: the request ends as cancelled and rustc finishes into the cache.
                client.send(cancel(r))
            await raw.end()
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_ERROR]
            assert raw.errors()[-1].details["reason"] == "cancelled"

    run(main())
    assert wait_until(lambda: not sleeps(server, "sleep 300"), 10), cmdlines(server)


# ---- 2. stdin -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("via", "protocol"), FRONTS)
def test_stdin_round_trip_and_end_of_input(run, server: ServerProcess, via: str, protocol: str) -> None:
    async def main() -> None:
        async with await connect(server, via, protocol) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "while read line; do echo \"got $line\"; done; echo eof", open_stdin=True))
            client.send(stdin(r, b"one\n"))
            await raw.until(lambda e: b"got one" in raw.stdout())
            client.send(stdin(r, b"two\n", eof=True))
            await raw.end()
            assert raw.stdout() == b"got one\ngot two\neof\n"
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


def test_without_the_option_stdin_is_dev_null_and_stdin_is_refused(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await connect(server, "unix") as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "readlink /proc/self/fd/0; cat; echo end; sleep 0.5"))
            await raw.until(lambda e: b"end" in raw.stdout())
            client.send(stdin(r, b"x"))
            await raw.end()
            assert raw.stdout().startswith(b"/dev/null\nend")
            [error] = raw.errors()
            assert error.details["reason"] == "stdin_closed" and "open_stdin" in error.message
            assert raw.terminals() == [pb.SERVICE_STATE_READY]  # the request itself was fine

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_stdin_of_a_command_that_does_not_read_is_bounded_and_refused(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo up; sleep 1; wc -c", open_stdin=True))
            await started(raw, b"up")
            rss = server_rss(server)
            piece = b"x" * (64 * 1024)
            for _ in range(64):  # 4 MiB at a child that reads nothing yet: the buffer is 256k
                client.send(stdin(r, piece))
            await raw.until(lambda e: e.WhichOneof("event_type") == "error")
            assert server_rss(server) - rss < 16 << 20
            client.send(stdin(r, eof=True))
            await raw.end()
            refused = [e for e in raw.errors() if e.details["reason"] == "stdin_full"]
            assert refused and refused[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
            assert "--max-stdin-buffer" in refused[0].message
            taken = int(raw.stdout().split()[-1])
            # what was accepted was written, in order, and what was refused was not
            assert taken == (64 - len(refused)) * len(piece)
            acks = [e.shell_output.stdin_written for e in raw.of("shell_output") if e.shell_output.HasField("stdin_written")]
            assert acks and acks == sorted(acks) and acks[-1] == taken
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


async def eventually(pred, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    """wait_until without blocking the loop (what is checked may need it to run: an SDK's aclose)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.05)
    return True


def cmdlines(server: ServerProcess) -> list[str]:
    """The command lines of the service's descendants (not its child guard)."""
    out = []
    for pid, _state in descendants(server.pid):
        try:
            out.append(pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return out


def server_rss(server: ServerProcess) -> int:
    for line in pathlib.Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---- 3. PTY ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("via", "protocol"), FRONTS)
def test_pty_size_term_resize_and_ctrl_c(run, server: ServerProcess, via: str, protocol: str) -> None:
    async def main() -> None:
        async with await connect(server, via, protocol) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            script = ("tty; stty size; echo \"term=$TERM\"; trap 'echo winch; stty size' WINCH; "
                      "echo ready; while :; do sleep 0.05; done")
            client.send(shell(r, script, pty=pb.PtyRequest(rows=33, cols=101, term="vt100")))
            await started(raw, b"ready")
            out = raw.stdout()
            # (the sandbox's /dev has a devpts of its own: the command's terminal is its console)
            assert out.startswith(b"/dev/console\r\n") and b"33 101\r\n" in out and b"term=vt100\r\n" in out
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=40, cols=120)))
            await raw.until(lambda e: b"40 120" in raw.stdout())
            client.send(stdin(r, b"\x03"))  # Ctrl-C: SIGINT to the foreground group
            await raw.end()
            finals = [e.shell_output for e in raw.of("shell_output") if e.shell_output.finished]
            assert finals[0].exit_code in (130, -2)
            assert not raw.of("shell_output")[0].shell_output.HasField("stderr")  # a terminal has one stream

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_resize_of_a_command_without_a_terminal_is_refused(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo up; sleep 0.5", open_stdin=True))
            await started(raw, b"up")
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=10, cols=10)))
            await raw.end()
            assert [e.details["reason"] for e in raw.errors()] == ["no_terminal"]
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


# ---- 4. binary output -----------------------------------------------------------------------------


@pytest.mark.parametrize("via", ["unix", "tcp", "stdio", "grpc"])
def test_binary_output_is_byte_exact_and_text_stays_the_default(run, server: ServerProcess, via: str) -> None:
    blob = bytes(range(256)) * 1000

    async def main() -> None:
        (server.root / "blob.bin").write_bytes(blob)
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, f"printf '\\377\\376ab'; cat {server.root / 'blob.bin'}; printf '\\377' >&2", binary_output=True))
            await raw.end()
            outs = raw.of("shell_output")
            assert raw.stdout() == b"\xff\xfeab" + blob
            assert b"".join(e.shell_output.stderr_bytes for e in outs) == b"\xff"
            assert not any(e.shell_output.HasField("stdout") for e in outs)
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "printf '\\377\\376ab'"))
            await raw.end()
            assert raw.stdout() == b"\xef\xbf\xbd\xef\xbf\xbdab"  # text: invalid UTF-8 replaced, as before
            assert not any(e.shell_output.HasField("stdout_bytes") for e in raw.of("shell_output"))

    run(main())


# ---- 9. the SDK -------------------------------------------------------------------------------------


def sleeps(server: ServerProcess, marker: str) -> list[str]:
    return [c for c in cmdlines(server) if marker in c]


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_sdk_start_write_iterate_wait_and_run(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            proc = await client.start("cat; echo done >&2", stdin=True)
            proc.write("hello ")
            proc.write(b"world\n")
            proc.close_stdin()
            chunks = [c async for c in proc]
            assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"hello world\n"
            assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"done\n"
            assert await proc.wait() == 0
            result = await client.run("printf '\\377'; exit 3")
            assert (result.exit_code, result.stdout, result.stderr) == (3, b"\xff", b"")
            big = os.urandom(3 << 20)  # past the service's 256k stdin buffer: flow control, not refusals
            result = await client.run("sleep 0.2; cat", input=big)
            assert result.stdout == big
            pty = await client.start("read -p 'name? ' n; echo \"hi $n\"", pty=(20, 60))
            seen = b""
            async for chunk in pty:
                seen += chunk.data
                if b"name? " in seen:
                    pty.write("bob\r")
            assert await pty.wait() == 0
            assert b"hi bob" in seen
            value = await client.tool("shell.run", {"command": "echo 42"})
            assert value.success and value.value["stdout"].strip() == "42" and value.raw.startswith(b"{")

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
@pytest.mark.parametrize("how", ["break", "aclose", "task_cancel", "cancel", "shell_exec_break"])
def test_sdk_leaving_cancels_on_the_service(run, server: ServerProcess, how: str, via: str) -> None:
    marker = f"sleep 3{abs(hash(how)) % 1000:03d}"

    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"])
            command = f"echo up; {marker}"
            if how == "shell_exec_break":
                async for event in client.shell_exec(command):
                    if event.WhichOneof("event_type") == "shell_output":
                        break
            else:
                proc = await client.start(command)
                if how == "break":
                    async for _chunk in proc:
                        break
                elif how == "aclose":
                    async for _chunk in proc:
                        await proc.aclose()
                        break
                elif how == "task_cancel":
                    async for _chunk in proc:
                        break  # started (this break alone also cancels: the next wait tells)
                    proc2 = await client.start(f"echo up; {marker}")
                    task = asyncio.ensure_future(proc2.wait())
                    assert await eventually(lambda: len(sleeps(server, marker)) >= 1)
                    await asyncio.sleep(0.2)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                else:
                    async for _chunk in proc:
                        proc.cancel()
                    with pytest.raises(SmithError, match="cancelled"):
                        await proc.wait()
            assert await eventually(lambda: not sleeps(server, marker)), sleeps(server, marker)
            # the connection is still fine
            assert (await client.run("echo ok")).stdout == b"ok\n"

    run(main())


# ---- the v0 shapes ----------------------------------------------------------------------------------


def test_v0_lines_of_the_control_commands(run, server: ServerProcess) -> None:
    async def main() -> None:
        reader, writer = await asyncio.open_unix_connection(server.sock_path)
        r = rid()
        lines = [
            b'{"type":"Handshake","data":{"version":0,"capabilities":["shell_exec"]}}',
            b'{"type":"ShellExec","data":{"request_id":"%s","command":"tty >/dev/null && echo tty; cat","open_stdin":true,"pty":{"rows":5,"cols":20}}}' % r.encode(),
            b'{"type":"Stdin","data":{"request_id":"%s","data":"hello\\n","eof":false}}' % r.encode(),
        ]
        writer.write(b"\n".join(lines) + b"\n")
        seen = b""
        while b"hello" not in seen or b"tty" not in seen:
            seen += await asyncio.wait_for(reader.readline(), 10)
        writer.write(b'{"type":"Cancel","data":{"request_id":"%s"}}\n' % r.encode())
        rest = []
        while not rest or b'"StateChange"' not in rest[-1]:
            rest.append(await asyncio.wait_for(reader.readline(), 10))
        assert b'"type":"Error"' in rest[-2] and b"cancelled" in rest[-2]  # the ErrorEvent, then the state
        assert b'"state":"Error"' in rest[-1] and r.encode() in rest[-1]
        writer.close()

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_binary_output_in_batches(run, server: ServerProcess, via: str) -> None:
    # A peer that asked for BatchEvents gets the raw chunks inside them, as any event.
    async def main() -> None:
        async with await connect(server, via) as client:
            await client.handshake(["shell_exec"], accept=["batch_event"])
            result = await client.run("for i in 1 2 3 4 5 6 7 8; do printf '\\377\\000%s' $i; done; printf '\\376' >&2")
            assert result.stdout == b"".join(b"\xff\x00" + str(i).encode() for i in range(1, 9))
            assert result.stderr == b"\xfe"
            assert client.batches_received > 0

    run(main())
