"""The SDK's single-answer requests (``call_tool``, the workspace requests): their route keeps the
answer and wakes the caller once, at the end (``client_wire.AnswerRoute``), and ends as the event by
event path does: the answer, a ``SmithError`` for an ``ErrorEvent``, ``ConnectionClosed`` when the
connection drops, and a ``Cancel`` sent when the caller leaves first. Against a real ``serve``."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.server import ServerProcess
from smith_fast.client import Client
from smith_fast.client_wire import AnswerRoute
from smith_fast.errors import ConnectionClosed, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.request_ids import new_request_id

from .conftest import Runner


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("answers")
    root = tmp / "root"
    root.mkdir()
    (root / "f.txt").write_text("hello\n")
    proc = ServerProcess(tmp, root=root, tcp=False, log_level="info").start()
    yield proc
    proc.stop()


async def _client(server: ServerProcess) -> Client:
    client = await Client.connect(server.unix)
    await client.handshake(timeout=30)
    return client


async def _sleeping(client: Client) -> tuple[asyncio.Future[pb.ToolResultEvent], str]:
    """A tool call that runs a minute, once it is in flight, and its request id."""
    call = asyncio.ensure_future(client.call_tool("shell.run", {"command": "sleep 60"}))
    while not client._routes:  # noqa: SLF001  (the SDK's own routing: the one request in flight)
        await asyncio.sleep(0.01)
    (rid,) = client._routes  # noqa: SLF001
    return call, rid


async def _ended(client: Client, rid: str) -> int:
    """The terminal state of ``rid`` that arrived after its caller left (on the general queue)."""
    while True:
        event = await asyncio.wait_for(client._wire.events.get(), 20)  # noqa: SLF001
        assert event is not None, "the connection ended"
        if event.WhichOneof("event_type") == "state_change" and event.state_change.request_id == rid:
            if event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                return event.state_change.state


def test_a_tool_call_answers_and_leaves_no_route(run: Runner[Any], server: ServerProcess) -> None:
    async def main() -> None:
        client = await _client(server)
        try:
            answers = await asyncio.gather(*(client.call_tool("fs.read", {"path": "f.txt"}) for _ in range(50)))
            assert all(a.success and b"hello" in a.result for a in answers)
            assert client._routes == {}  # noqa: SLF001
            with pytest.raises(SmithError) as refused:
                await client.call_tool("no.such.tool", {})
            assert "no.such.tool" in str(refused.value)
            failed = await client.call_tool("fs.read", {"path": "missing.txt"})  # ran, and failed
            assert not failed.success and failed.error
            assert client._routes == {}  # noqa: SLF001
        finally:
            await client.close()

    run(main())


def test_a_tool_call_left_before_its_end_is_cancelled(run: Runner[Any], server: ServerProcess) -> None:
    async def main() -> None:
        client = await _client(server)
        try:
            call, rid = await _sleeping(client)
            await asyncio.sleep(0.3)  # it runs
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert client._routes == {}  # noqa: SLF001
            # the service was told: the request ends now (cancelled), not when the sleep would
            assert await _ended(client, rid) == pb.SERVICE_STATE_ERROR
            again = await client.call_tool("fs.read", {"path": "f.txt"})
            assert again.success
        finally:
            await client.close()

    run(main())


def test_a_tool_call_whose_connection_drops_raises_connection_closed(run: Runner[Any], server: ServerProcess) -> None:
    async def main() -> None:
        client = await _client(server)
        try:
            call, _ = await _sleeping(client)
            client._writer.transport.abort()  # noqa: SLF001  (the SDK's own transport)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(call, 20)
        finally:
            await client.close()

    run(main())


def _event(**fields: Any) -> pb.Event:
    return pb.Event(**fields)


def test_an_answer_route_keeps_the_last_answer_and_ends_once(run: Runner[Any]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        route = AnswerRoute("tool_result", loop.create_future())
        route.put_nowait(_event(state_change=pb.StateChangeEvent(request_id="r", state=pb.SERVICE_STATE_PROCESSING)))
        route.put_nowait(_event(tool_result=pb.ToolResultEvent(request_id="r", success=True, result=b"1")))
        route.put_nowait(_event(tool_result=pb.ToolResultEvent(request_id="r", success=True, result=b"2")))
        assert not route.over and not route.ended.done()
        route.put_nowait(_event(error=pb.ErrorEvent(request_id="r", message="late")))
        route.put_nowait(_event(state_change=pb.StateChangeEvent(request_id="r", state=pb.SERVICE_STATE_ERROR)))
        assert route.over and route.ended.result() is True
        assert route.answer.result == b"2" and route.error is not None and route.error.message == "late"
        route.put_nowait(None)  # the connection ends later: changes nothing
        route.put_nowait(_event(tool_result=pb.ToolResultEvent(request_id="r", result=b"3")))
        assert route.ended.result() is True and route.answer.result == b"2"

        dropped = AnswerRoute("tool_result", loop.create_future())
        dropped.put_nowait(None)
        assert dropped.over and dropped.ended.result() is False

        left = AnswerRoute("tool_result", loop.create_future())
        left.ended.cancel()  # its caller was cancelled: the end still comes, and is no error
        left.put_nowait(_event(state_change=pb.StateChangeEvent(request_id="r", state=pb.SERVICE_STATE_READY)))
        assert left.over

    run(main())


def test_new_request_ids_are_random_version_4_uuids() -> None:
    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    for rid in list(ids)[:1000]:
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", rid), rid
        parsed = uuid.UUID(rid)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == rid
    # every variant digit comes up
    assert {rid[19] for rid in ids} == set("89ab")

