"""Process control over the gRPC front (PROTOCOL.md, "Process control"): what only gRPC has (a cancelled call) and
the refusals not checked elsewhere, end to end against a real service. Cancel, stdin (round trips,
flow control, refusals), PTY size/resize/Ctrl-C, binary output, batches and the SDK are checked over
gRPC in tests/test_process_control.py (``via`` parameters), "waiting for input" in
tests/test_input_wait.py."""

from __future__ import annotations

import pytest

from smith_fast.client import Client
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, wait_until

from .test_process_control import Raw, cmdlines, connect, eventually, rid, shell, sleeps, started, stdin


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("grpc_control")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--kill-grace", "1s").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


async def started_request(client: Client, command: str, **fields) -> Raw:  # type: ignore[no-untyped-def]
    await client.handshake(["shell_exec"])
    raw = Raw(client, rid())
    client.send(shell(raw.rid, command, **fields))
    await started(raw, b"up")
    return raw


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_stdin_and_resize_of_a_plain_command_say_why(run, server: ServerProcess, via: str) -> None:
    """Without open_stdin or pty: Stdin is stdin_closed, Resize no_terminal (not stdin_closed)."""

    async def main() -> None:
        async with await connect(server, via) as client:
            raw = await started_request(client, "echo up; sleep 0.5")
            client.send(stdin(raw.rid, b"x"))
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=raw.rid, rows=10, cols=10)))
            await raw.end()
            assert sorted(e.details["reason"] for e in raw.errors()) == ["no_terminal", "stdin_closed"]
            assert raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


@pytest.mark.parametrize("via", ["unix", "grpc"])
def test_a_terminal_too_large_is_refused_and_the_command_goes_on(run, server: ServerProcess, via: str) -> None:
    async def main() -> None:
        async with await connect(server, via) as client:
            raw = await started_request(client, "echo up; sleep 0.5; stty size", pty=pb.PtyRequest(rows=24, cols=80))
            client.send(pb.Command(resize=pb.ResizeCommand(request_id=raw.rid, rows=70000, cols=10)))
            await raw.end()
            [error] = raw.errors()
            assert error.details["reason"] == "invalid_field" and "65535" in error.message
            assert b"24 80" in raw.stdout() and raw.terminals() == [pb.SERVICE_STATE_READY]

    run(main())


@pytest.mark.parametrize("mode", ["stdin", "pty"])
def test_a_cancelled_call_kills_its_interactive_commands(run, server: ServerProcess, mode: str) -> None:
    marker = f"sleep 27{len(mode)}"

    async def main() -> None:
        client = await connect(server, "grpc")
        fields = {"open_stdin": True} if mode == "stdin" else {"pty": pb.PtyRequest()}
        await started_request(client, f"echo up; {marker}", **fields)  # raw: leaving an SDK process would cancel it itself
        assert await eventually(lambda: bool(sleeps(server, marker)))
        await client.close()  # cancels the call: the service stops the session's commands

    run(main())
    assert wait_until(lambda: not sleeps(server, marker), 10), cmdlines(server)


def test_only_grpcs_handling_of_another_loops_events_is_let_through() -> None:
    # The run fixture lets through grpc.aio's poller handling an event for another test's loop
    # (grpc/grpc#25364), and nothing else: not the same error from another callback, not another
    # error from grpc's poller.
    from .conftest import _grpc_poller_of_another_loop

    poller = "Exception in callback PollerCompletionQueue._handle_events(<_UnixSelecto...e debug=False>)()"
    assert _grpc_poller_of_another_loop({"message": poller, "exception": RuntimeError("Event loop is closed")})
    assert _grpc_poller_of_another_loop({"message": poller, "exception": BlockingIOError(11, "Resource temporarily unavailable")})
    assert not _grpc_poller_of_another_loop({"message": poller, "exception": ValueError("boom")})
    assert not _grpc_poller_of_another_loop({"message": poller, "exception": RuntimeError("something else")})
    assert not _grpc_poller_of_another_loop({"message": "Exception in callback Connection._flush()",
                                              "exception": RuntimeError("Event loop is closed")})
    assert not _grpc_poller_of_another_loop({"message": "Task exception was never retrieved"})
