"""Process control over the gRPC front (issue 16 item 8), end to end against a real service: what
tests/test_process_control.py checks on the socket fronts only. (Cancel of a ShellExec, stdin round
trips, PTY size/resize/Ctrl-C, binary output and the SDK's start/run are run there over gRPC too;
"waiting for input" in tests/test_input_wait.py.)"""

from __future__ import annotations

import asyncio
import os

import pytest

from smith_fast.client import Client
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, wait_until

from .test_process_control import Raw, cancel, cmdlines, eventually, rid, shell, sleeps, started, stdin


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("grpc_control")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--kill-grace", "1s", "--max-stdin-buffer", "256k").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def grpc_client(server: ServerProcess) -> Client:
    client = await Client.connect(server.grpc)
    await client.handshake(["shell_exec"])
    return client


@pytest.mark.parametrize("kind", ["tool_call", "plan"])
def test_cancel_a_tool_call_or_a_plan(run, server: ServerProcess, kind: str) -> None:
    marker = f"sleep 29{len(kind)}"

    async def main() -> None:
        async with await grpc_client(server) as client:
            r = rid()
            raw = Raw(client, r)
            if kind == "tool_call":
                client.send(pb.Command(tool_call=pb.ToolCallCommand(request_id=r, tool="shell.run", args=b'{"command": "%s"}' % marker.encode())))
            else:
                client.send(pb.Command(plan=pb.PlanCommand(request_id=r, goal=marker, context={"execute": "true"})))
            assert await eventually(lambda: bool(sleeps(server, marker))), cmdlines(server)
            client.send(cancel(r))
            await raw.end()
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_ERROR]
            assert raw.errors()[-1].details["reason"] == "cancelled"

    run(main())
    assert wait_until(lambda: not sleeps(server, marker), 10), cmdlines(server)


def test_stdin_past_the_buffer_is_refused_whole_and_acknowledged(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await grpc_client(server) as client:
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo up; sleep 1; wc -c", open_stdin=True))
            await started(raw, b"up")
            piece = b"x" * (64 * 1024)
            for _ in range(16):  # 1 MiB at a child that reads nothing yet: the buffer is 256k
                client.send(stdin(r, piece))
            await raw.until(lambda e: e.WhichOneof("event_type") == "error")
            client.send(stdin(r, eof=True))
            await raw.end()
            refused = [e for e in raw.errors() if e.details["reason"] == "stdin_full"]
            assert refused and refused[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
            taken = int(raw.stdout().split()[-1])
            assert taken == (16 - len(refused)) * len(piece)
            acks = [e.shell_output.stdin_written for e in raw.of("shell_output") if e.shell_output.HasField("stdin_written")]
            assert acks and acks == sorted(acks) and acks[-1] == taken
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


def test_control_commands_that_cannot_be_done_get_their_reason_and_no_state(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await grpc_client(server) as client:
            unknown = rid()
            raw_unknown = Raw(client, unknown)
            client.send(cancel(unknown))
            error = await raw_unknown.until(lambda e: e.WhichOneof("event_type") == "error")
            assert error.error.details["reason"] == "unknown_request"
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo up; sleep 0.5"))  # stdin /dev/null, no terminal
            await started(raw, b"up")
            client.send(stdin(r, b"x"))
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=10, cols=10)))
            await raw.end()
            assert sorted(e.details["reason"] for e in raw.errors()) == ["no_terminal", "stdin_closed"]
            assert raw.terminals() == [pb.SERVICE_STATE_READY]
            client.send(cancel(r))
            error = await raw.until(lambda e: e.WhichOneof("event_type") == "error" and e.error.details["reason"] == "not_running")
            await raw.quiet()
            assert raw.terminals() == [pb.SERVICE_STATE_READY] and not raw_unknown.terminals()

    run(main())


def test_a_terminal_too_large_is_refused(run, server: ServerProcess) -> None:
    async def main() -> None:
        async with await grpc_client(server) as client:
            r = rid()
            raw = Raw(client, r)
            client.send(shell(r, "echo up; sleep 0.5", pty=pb.PtyRequest(rows=24, cols=80)))
            await started(raw, b"up")
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=r, rows=70000, cols=10)))
            await raw.end()
            assert [e.details["reason"] for e in raw.errors()] == ["invalid_field"]
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


@pytest.mark.parametrize("how", ["break", "task_cancel"])
def test_sdk_leaving_cancels_on_the_service(run, server: ServerProcess, how: str) -> None:
    marker = f"sleep 28{len(how)}"

    async def main() -> None:
        async with await grpc_client(server) as client:
            proc = await client.start(f"echo up; {marker}")
            if how == "break":
                async for _chunk in proc:
                    break
            else:
                task = asyncio.ensure_future(proc.wait())
                assert await eventually(lambda: bool(sleeps(server, marker)))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert await eventually(lambda: not sleeps(server, marker)), sleeps(server, marker)
            assert (await client.run("echo ok")).stdout == b"ok\n"  # the call goes on

    run(main())


def test_binary_output_in_batches(run, server: ServerProcess) -> None:
    async def main() -> None:
        client = await Client.connect(server.grpc)
        async with client:
            await client.handshake(["shell_exec"], accept=["batch_event"])
            result = await client.run("for i in 1 2 3 4 5 6 7 8; do printf '\\377\\000%s' $i; done; printf '\\376' >&2")
            assert result.stdout == b"".join(b"\xff\x00" + str(i).encode() for i in range(1, 9))
            assert result.stderr == b"\xfe"
            assert client.batches_received > 0
            blob = os.urandom(1 << 20)
            (server.root / "grpc-blob.bin").write_bytes(blob)
            assert (await client.run(f"cat {server.root / 'grpc-blob.bin'}")).stdout == blob

    run(main())


@pytest.mark.parametrize("mode", ["stdin", "pty"])
def test_a_cancelled_call_kills_its_interactive_commands(run, server: ServerProcess, mode: str) -> None:
    marker = f"sleep 27{len(mode)}"

    async def main() -> None:
        client = await grpc_client(server)
        r = rid()
        raw = Raw(client, r)  # not the SDK's process: leaving its `async for` would cancel it itself
        client.send(shell(r, f"echo up; {marker}", **({"open_stdin": True} if mode == "stdin" else {"pty": pb.PtyRequest()})))
        await started(raw, b"up")
        assert await eventually(lambda: bool(sleeps(server, marker)))
        await client.close()  # cancels the call: the service stops the session's commands

    run(main())
    assert wait_until(lambda: not sleeps(server, marker), 10), cmdlines(server)
