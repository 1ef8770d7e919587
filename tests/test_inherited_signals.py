"""A service started with signals ignored runs its commands with them at their defaults.

A script's ``smith-fast serve &`` starts the service with SIGINT and SIGQUIT ignored (a shell
without job control ignores both for what it puts in the background), ``nohup`` with SIGHUP
ignored. An ignored signal survives fork and exec: commands run outside the sandbox (whose init
sets every signal to its default) inherited them, and ``kill -QUIT`` of a command, or Ctrl-\\ on
its terminal, did nothing (``SigIgn: 0000000000000004`` in a ``--sandbox off`` command's status
before the fix). The service itself goes on ignoring them. Real ``smith-fast serve`` processes,
through the SDK.
"""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import Iterator

import pytest

from smith_fast.client import Client
from smith_fast.service.lifecycle import INHERITED_IGNORES

from harness.server import ServerProcess

MASK = sum(1 << (sig - 1) for sig in INHERITED_IGNORES)
STATUS = "grep '^SigIgn' /proc/self/status"


def ignored(status: bytes) -> int:
    """The ``SigIgn`` mask of a ``grep '^SigIgn' /proc/self/status`` output."""
    return int(status.split(b"SigIgn:")[1].split()[0], 16)


@pytest.fixture(scope="module", params=["off", "workspace-write"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp(f"ignoring-{request.param}")
    srv = ServerProcess(tmp, "--sandbox", request.param, "--kill-grace", "1s", tcp=False, ignoring=INHERITED_IGNORES).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


def test_the_service_holds_them_by_a_handler_and_says_so(server: ServerProcess) -> None:
    # the premise: the wrapper's `trap ''` reached the service (as a handler now: SigCgt, not SigIgn)
    status = pathlib.Path(f"/proc/{server.pid}/status").read_text()
    caught = int(status.split("SigCgt:")[1].split()[0], 16)
    assert caught & MASK == MASK, status
    said = [line for line in server.logs if line.get("event", "").startswith("started with signals ignored")]
    assert said and said[0]["signals"] == "SIGHUP,SIGINT,SIGQUIT", said


async def test_its_commands_get_them_at_their_defaults(server: ServerProcess) -> None:
    client = await Client.connect(server.unix)
    await client.handshake()
    try:
        plain = await client.run(STATUS)
        assert plain.exit_code == 0 and ignored(plain.stdout) & MASK == 0, plain
        on_a_terminal = await client.run(STATUS, pty=(24, 80))
        assert on_a_terminal.exit_code == 0 and ignored(on_a_terminal.stdout) & MASK == 0, on_a_terminal
        pid = await client.background(STATUS)
        attached = await client.attach(pid)
        out = b"".join([chunk.data async for chunk in attached])
        assert await attached.wait() == 0 and ignored(out) & MASK == 0, out
        # and so each ends the command as it would anywhere else
        for sig in INHERITED_IGNORES:
            killed = await client.run(f"kill -{int(sig)} $$; sleep 30")
            assert killed.exit_code == -sig, (sig, killed)
    finally:
        await client.close()


async def test_the_service_goes_on_ignoring_them(server: ServerProcess) -> None:
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
