"""One session may not take every process slot of the service (``--max-processes-per-session``;
smith_fast/service/process_slots.py), against a real ``smith-fast serve``.

The attack: a session starts as many long commands as the service runs at once (``sleep`` in a
loop of ShellExecs, background ones, ``shell.run`` tool calls); before, every other session's
commands were then refused with ``too many commands running`` until they ended."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, assert_clean_log

SESSION_MOST = 3


async def _up(root: pathlib.Path, name: str) -> None:
    """Until the command made its file: it runs, and holds its slot. (Reading its output would
    not do: a RemoteProcess left before its end stops the command.)"""
    while not (root / name).exists():
        await asyncio.sleep(0.01)


async def _refused(client: Client, command: str) -> str:
    proc = await client.start(command)
    with pytest.raises(SmithError) as caught:
        await proc.wait()
    assert caught.value.error.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED, caught.value
    return caught.value.error.message


async def _scenario(address: str, root: pathlib.Path) -> None:
    hostile = await Client.connect(address)
    other = await Client.connect(address)
    await hostile.handshake()
    await other.handshake()
    try:
        held = [await hostile.start(f": > up-{i}; exec sleep 60") for i in range(SESSION_MOST)]
        await asyncio.wait_for(asyncio.gather(*(_up(root, f"up-{i}") for i in range(SESSION_MOST))), 30)
        # its next one, whichever way it would start, is refused, and says why
        message = await _refused(hostile, "echo no")
        assert "--max-processes-per-session" in message and f"runs {SESSION_MOST} commands" in message, message
        with pytest.raises(SmithError) as caught:
            await hostile.background("sleep 60")
        assert "--max-processes-per-session" in caught.value.error.message
        with pytest.raises(SmithError) as caught:
            await hostile.call_tool("shell.run", {"command": "echo no"})
        assert caught.value.code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and "--max-processes-per-session" in caught.value.error.message
        # every other session runs at once, as often as it likes
        began = time.monotonic()
        for _ in range(5):
            result = await other.run("echo ok")
            assert result.exit_code == 0 and result.text == "ok\n"
        assert time.monotonic() - began < 30
        # one of the hostile session's ends: its place is its own again
        held.pop().cancel()
        for _ in range(100):
            try:
                assert (await hostile.run("echo again")).text == "again\n"
                break
            except SmithError as exc:  # the cancelled one may still be on its way out
                assert "--max-processes-per-session" in exc.error.message
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the session's slot never came back")
        # a background process keeps its session's count while it runs
        rid = await hostile.background(": > up-b; exec sleep 60")
        await asyncio.wait_for(_up(root, "up-b"), 30)
        assert "--max-processes-per-session" in await _refused(hostile, "echo no")
        hostile.cancel(rid)
        for p in held:
            p.cancel()
    finally:
        await hostile.close()
        await other.close()


def test_one_session_cannot_take_every_process_slot(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-processes", "4", "--max-processes-per-session", str(SESSION_MOST), "--kill-grace", "0.5s",
                        tcp=False).start()
    try:
        asyncio.run(_scenario(srv.unix, tmp_path))
    finally:
        assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)
