"""MCP revision 2026-07-28 (stateless) against the official MCP Python SDK, which speaks it: ``server/discover``
(with ``--mcp-discover``), stateless calls with the per-request ``_meta`` envelope, ``resultType``, the
routing headers and cache hints (checked on raw HTTP requests too), tasks for long ``shell`` calls
(polled, fed stdin through ``tasks/update``, cancelled) and ``input_required`` when a command waits
for input.
"""

from __future__ import annotations

import contextlib
import pathlib
import time
from typing import Any, Literal

import anyio
import httpx2
import mcp_types
import pytest
from mcp.client.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from pydantic import Field, TypeAdapter

from harness.server import SmithProcess
from smith_fast.mcp import protocol

from .test_mcp import connect as mcp_connect, mcp_url

MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
SHOWN = ["fs.list", "fs.read", "fs.search", "fs.write", "shell"]


@contextlib.contextmanager
def http_server(tmp: pathlib.Path, *extra: str) -> Any:
    proc = SmithProcess(tmp, "serve", "--root", str(tmp), "--log-level", "debug", *extra, "--mcp-http", "127.0.0.1:0").start()
    try:
        yield mcp_url(proc)
    finally:
        proc.stop()


def connect(transport: str, tmp: pathlib.Path, *extra: str, **client: Any) -> contextlib.AbstractAsyncContextManager[Client]:
    """An SDK client (auto-negotiating unless told a mode) on a fresh smith-fast with ``--mcp-discover``."""
    return mcp_connect(transport, tmp, "--mcp-discover", *extra, **client)


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---- the tasks extension, as a client speaks it through the SDK's extension API ----------------

class TaskParams(mcp_types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class GetTask(mcp_types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class UpdateTask(mcp_types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class CancelTask(mcp_types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


class TaskHandle(mcp_types.Result):
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


ANY = TypeAdapter(dict[str, Any])


class Tasks(ClientExtension):
    """The tasks extension: a task handle is polled with tasks/get to its end; what the polls saw is kept."""

    identifier = TASKS

    def __init__(self) -> None:
        self.handles: list[TaskHandle] = []
        self.polls: list[dict[str, Any]] = []

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> mcp_types.CallToolResult:
        self.handles.append(handle)
        cursor = 0
        while True:
            got = await get_task(ctx.session, handle.task_id, cursor)
            self.polls.append(got)
            cursor = got["_meta"][protocol.OUTPUT_KEY]["cursor"]
            if got["status"] == "completed":
                return mcp_types.CallToolResult.model_validate(got["result"])
            assert got["status"] in ("working", "input_required"), got
            await anyio.sleep(0.1)


async def send(session: Any, request: mcp_types.Request[Any, Any]) -> dict[str, Any]:
    """A tasks/* request through the SDK's session, which stamps the envelope and the headers."""
    answer: dict[str, Any] = await session.send_request(request, ANY)
    return answer


async def get_task(session: Any, task_id: str, cursor: int | None = None) -> dict[str, Any]:
    meta: Any = {} if cursor is None else {protocol.CURSOR_KEY: cursor}
    return await send(session, GetTask(params=TaskParams(taskId=task_id, _meta=meta)))


# ---- discover, list, call ----------------------------------------------------------------------

async def test_discover_list_call(transport: str, tmp_path: pathlib.Path) -> None:
    async with connect(transport, tmp_path) as client:
        assert client.protocol_version == MODERN
        assert client.session.initialize_result is None and client.session.discover_result is not None
        caps = client.server_capabilities
        assert caps.tools is not None and caps.extensions is not None and TASKS in caps.extensions
        assert client.server_info is not None and client.server_info.name == "smith-fast"
        assert client.instructions is not None and "stateless" in client.instructions
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == SHOWN
        assert listed.ttl_ms == protocol.LISTING_TTL_MS and listed.cache_scope == "public"
        (tmp_path / "sub").mkdir()
        first = await client.call_tool("shell", {"command": "cd sub && export KEPT=1 && echo one"})
        assert not first.is_error and first.result_type == "complete"
        assert first.structured_content is not None and first.structured_content["stdout"] == "one\n"
        assert first.structured_content["cwd"] == f"{tmp_path.resolve()}/sub"
        # stateless: the next call starts from the root, without what the last one exported
        second = await client.call_tool("shell", {"command": "pwd; echo \"kept=${KEPT:-}\""})
        assert second.structured_content is not None
        assert second.structured_content["stdout"] == f"{tmp_path.resolve()}\nkept=\n"
        # ... unless it says where to go on
        third = await client.call_tool("shell", {"command": "pwd", "cwd": "sub"})
        assert third.structured_content is not None and third.structured_content["stdout"] == f"{tmp_path.resolve()}/sub\n"
        wrong = await client.call_tool("shell", {"command": "true", "timeout": -1})
        assert wrong.is_error and wrong.result_type == "complete"
        failed = await client.call_tool("shell", {"command": "exit 4"})
        assert failed.is_error and failed.structured_content is not None and failed.structured_content["exit_code"] == 4
        wrote = await client.call_tool("fs.write", {"path": "a.txt", "content": "alpha\n"})
        assert not wrote.is_error and (tmp_path / "a.txt").read_text() == "alpha\n"


async def test_without_discover_clients_fall_back(tmp_path: pathlib.Path) -> None:
    """Without --mcp-discover a negotiating client speaks a handshake revision (and keeps the shell's
    state); a client pinned to 2026-07-28 is served all the same."""
    with http_server(tmp_path) as url:
        async with Client(url) as auto:
            assert auto.protocol_version == protocol.LATEST
            await auto.call_tool("shell", {"command": "export KEPT=yes"})
            kept = await auto.call_tool("shell", {"command": "echo $KEPT"})
            assert kept.structured_content is not None and kept.structured_content["stdout"] == "yes\n"
        async with Client(url, mode=MODERN) as pinned:
            assert pinned.protocol_version == MODERN
            ran = await pinned.call_tool("shell", {"command": "echo pinned"})
            assert ran.result_type == "complete" and ran.structured_content is not None
            assert ran.structured_content["stdout"] == "pinned\n"


# ---- the wire, raw ------------------------------------------------------------------------------

def envelope(**more: Any) -> dict[str, Any]:
    return {protocol.VERSION_KEY: MODERN, protocol.CAPABILITIES_KEY: {}, protocol.CLIENT_INFO_KEY: {"name": "raw", "version": "0"}, **more}


def headers(method: str, name: str | None = None, version: str = MODERN) -> dict[str, str]:
    out = {"MCP-Protocol-Version": version, "Mcp-Method": method, "Accept": "application/json, text/event-stream"}
    if name is not None:
        out["Mcp-Name"] = name
    return out


async def test_raw_headers_and_cache_hints(tmp_path: pathlib.Path) -> None:
    with http_server(tmp_path, "--mcp-discover", "--input-wait-notice", "0.3") as url:
        async with httpx2.AsyncClient() as http:
            found = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": envelope()}},
                                    headers=headers("server/discover"))
            assert found.status_code == 200 and "mcp-session-id" not in found.headers
            result = found.json()["result"]
            assert result["resultType"] == "complete" and result["supportedVersions"] == [MODERN]
            assert result["ttlMs"] == protocol.LISTING_TTL_MS and result["cacheScope"] == "public"
            assert result["_meta"][protocol.SERVER_INFO_KEY]["name"] == "smith-fast"

            listed = (await http.post(url, json={"jsonrpc": "2.0", "id": "l", "method": "tools/list", "params": {"_meta": envelope()}},
                                      headers=headers("tools/list"))).json()
            assert listed["id"] == "l"
            assert listed["result"]["resultType"] == "complete" and listed["result"]["ttlMs"] == protocol.LISTING_TTL_MS
            assert listed["result"]["cacheScope"] == "public"
            assert [t["name"] for t in listed["result"]["tools"]] == SHOWN

            call: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                    "params": {"name": "shell", "arguments": {"command": "echo raw"}, "_meta": envelope()}}
            ran = await http.post(url, json=call, headers=headers("tools/call", "shell"))
            assert ran.status_code == 200 and ran.json()["id"] == 7
            assert ran.json()["result"]["resultType"] == "complete"
            assert ran.json()["result"]["structuredContent"]["stdout"] == "raw\n"
            # two clients may use the same id at once: each gets its own answer
            slow = {**call, "params": {**call["params"], "arguments": {"command": "sleep 0.3; echo slow"}}}
            both = []
            async with anyio.create_task_group() as tg:
                async def post(body: dict[str, Any]) -> None:
                    both.append((await http.post(url, json=body, headers=headers("tools/call", "shell"))).json())
                tg.start_soon(post, slow)
                tg.start_soon(post, call)
            assert sorted(a["result"]["structuredContent"]["stdout"] for a in both) == ["raw\n", "slow\n"]
            assert [a["id"] for a in both] == [7, 7]

            # headers that disagree with the body: 400, HEADER_MISMATCH
            for wrong in (headers("tools/list", "shell"), headers("tools/call", "other"), headers("tools/call")):
                refused = await http.post(url, json=call, headers=wrong)
                assert refused.status_code == 400 and refused.json()["error"]["code"] == protocol.HEADER_MISMATCH, wrong
            mismatched = {**call, "params": {**call["params"], "_meta": {**envelope(), protocol.VERSION_KEY: "2025-11-25"}}}
            refused = await http.post(url, json=mismatched, headers=headers("tools/call", "shell"))
            assert refused.status_code == 400 and refused.json()["error"]["code"] == protocol.HEADER_MISMATCH
            # no envelope, or half of one
            bare = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}, headers=headers("tools/list"))
            assert bare.status_code == 400 and bare.json()["error"]["code"] == protocol.INVALID_PARAMS
            half = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": {protocol.VERSION_KEY: MODERN}}}
            answer = (await http.post(url, json=half, headers=headers("tools/list"))).json()
            assert answer["error"]["code"] == protocol.INVALID_PARAMS and protocol.CAPABILITIES_KEY in answer["error"]["message"]
            # what 2026-07-28 does not have
            for method in ("initialize", "ping", "logging/setLevel"):
                gone = await http.post(url, json={"jsonrpc": "2.0", "id": 4, "method": method, "params": {"_meta": envelope()}}, headers=headers(method))
                assert gone.json()["error"]["code"] == protocol.METHOD_NOT_FOUND, method
            assert (await http.get(url, headers=headers("x"))).status_code == 405

            # input_required, raw: the command reads with a timeout and is over before the client comes
            # back; the retry gets its result. A requestState used (or never given) is refused.
            asks = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
                "name": "shell", "arguments": {"command": "timeout 1 head -n 1; echo rc=$?"},
                "_meta": envelope(**{protocol.CAPABILITIES_KEY: {"elicitation": {"form": {}}}})}}
            first = (await http.post(url, json=asks, headers=headers("tools/call", "shell"))).json()
            assert first["id"] == 9 and first["result"]["resultType"] == "input_required", first
            ((key, request),) = first["result"]["inputRequests"].items()
            assert request["params"]["mode"] == "form"
            await anyio.sleep(1.5)
            retry = {**asks, "id": 10, "params": {**asks["params"], "requestState": first["result"]["requestState"],
                                                  "inputResponses": {key: {"action": "accept", "content": {"line": "late"}}}}}
            second = (await http.post(url, json=retry, headers=headers("tools/call", "shell"))).json()
            assert second["id"] == 10 and second["result"]["resultType"] == "complete"
            assert second["result"]["structuredContent"]["stdout"] == "rc=124\n"  # the read timed out: the line came too late
            again = (await http.post(url, json=retry, headers=headers("tools/call", "shell"))).json()
            assert again["error"]["code"] == protocol.INVALID_PARAMS and "requestState" in again["error"]["message"]
            note = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers("notifications/initialized"))
            assert note.status_code == 202


# ---- tasks ------------------------------------------------------------------------------------

async def test_long_command_becomes_a_task(tmp_path: pathlib.Path) -> None:
    tasks = Tasks()
    async with connect("http", tmp_path, extensions=[tasks]) as client:
        quick = await client.call_tool("shell", {"command": "echo quick"})
        assert quick.structured_content is not None and quick.structured_content["stdout"] == "quick\n" and not tasks.handles
        started = time.monotonic()
        done = await client.call_tool("shell", {"command": "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.3; done; echo err >&2"})
        assert time.monotonic() - started >= 1.8
        assert [h.status for h in tasks.handles] == ["working"] and tasks.handles[0].poll_interval_ms
        assert done.structured_content is not None
        assert done.structured_content["stdout"] == "".join(f"line{i}\n" for i in range(1, 7))
        assert done.structured_content["stderr"] == "err\n" and done.structured_content["exit_code"] == 0
        # the polls saw the output as it came, each poll what came since the last one
        streamed = "".join(p["_meta"][protocol.OUTPUT_KEY]["stdout"] for p in tasks.polls)
        assert streamed == done.structured_content["stdout"]
        assert sum(bool(p["_meta"][protocol.OUTPUT_KEY]["stdout"]) for p in tasks.polls) >= 2
        assert tasks.polls[-1]["status"] == "completed" and tasks.polls[0]["status"] == "working"
        # the finished task can still be read, whole from cursor 0
        again = await get_task(client.session, tasks.handles[0].task_id, 0)
        assert again["_meta"][protocol.OUTPUT_KEY]["stdout"] == done.structured_content["stdout"]
        assert again["_meta"][protocol.OUTPUT_KEY]["stderr"] == "err\n"
        with pytest.raises(Exception, match="no such task"):
            await get_task(client.session, "nope")


async def test_task_stdin_and_cancel(tmp_path: pathlib.Path) -> None:
    """A task whose command waits for input says input_required with a form elicitation;
    tasks/update's answer is the line its stdin gets. tasks/cancel stops a task's command."""
    logs: list[Any] = []

    async def on_log(params: mcp_types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async with connect("http", tmp_path, "--input-wait-notice", "0.3", extensions=[Tasks()],
                       elicitation_callback=_never, logging_callback=on_log) as client:
        raw = await client.session.call_tool("shell", {"command": "echo asking; read line; echo got:$line"}, allow_claimed=True)
        assert isinstance(raw, TaskHandle), raw
        task = await _until_status(client, raw.task_id, "input_required")
        ((key, request),) = task["inputRequests"].items()
        assert request["method"] == "elicitation/create" and "line" in request["params"]["requestedSchema"]["properties"]
        assert task["_meta"][protocol.OUTPUT_KEY]["stdout"] == "asking\n"
        with pytest.raises(Exception, match="must answer"):
            await send(client.session, UpdateTask(params=UpdateParams(taskId=raw.task_id, inputResponses={"other": {}})))
        ack = await send(client.session, UpdateTask(params=UpdateParams(taskId=raw.task_id, inputResponses={key: {"action": "accept", "content": {"line": "hello"}}})))
        assert ack["resultType"] == "complete"
        done = await _until_status(client, raw.task_id, "completed")
        assert done["result"]["structuredContent"]["stdout"] == "asking\ngot:hello\n" and not done["result"]["isError"]

        marker = tmp_path / "never"
        long = await client.session.call_tool("shell", {"command": f"sleep 30; touch {marker}"}, allow_claimed=True)
        assert isinstance(long, TaskHandle)
        await send(client.session, CancelTask(params=TaskParams(taskId=long.task_id)))
        cancelled = await get_task(client.session, long.task_id)
        assert cancelled["status"] == "cancelled" and "result" not in cancelled
        await anyio.sleep(0.5)
        assert not marker.exists()
        listed = await client.call_tool("shell", {"command": "ps -eo args"})
        assert listed.structured_content is not None and "sleep 30" not in listed.structured_content["stdout"]
    assert logs == []  # no request asked for logs (no logLevel in its _meta)


async def _never(_ctx: Any, _params: Any) -> Any:
    raise AssertionError("a task's input request is answered with tasks/update, not by the driver")


async def _until_status(client: Client, task_id: str, status: str) -> dict[str, Any]:
    for _ in range(100):
        got = await get_task(client.session, task_id, 0)
        if got["status"] == status:
            return got
        await anyio.sleep(0.1)
    raise AssertionError(f"task {task_id} never became {status}: {got}")


# ---- input_required without a task --------------------------------------------------------------

async def test_input_required_round_trips(transport: str, tmp_path: pathlib.Path) -> None:
    """A client without tasks but with elicitation: a command waiting for input makes the call
    answer input_required; the SDK asks its elicitation callback and retries with the line."""
    asked: list[str] = []

    async def answer(_ctx: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"line": f"answer{len(asked)}"})

    logs: list[Any] = []

    async def on_log(params: mcp_types.LoggingMessageNotificationParams) -> None:
        logs.append(params.data)

    async with connect(transport, tmp_path, "--input-wait-notice", "0.3", elicitation_callback=answer,
                       log_level="info", logging_callback=on_log) as client:
        done = await client.call_tool("shell", {"command": "read a; echo first:$a; read b; echo second:$b"})
        assert done.structured_content is not None, done
        assert done.structured_content["stdout"] == "first:answer1\nsecond:answer2\n"
        assert len(asked) == 2 and all("waiting for input" in m for m in asked)
        # the request asked for logs from info up (_meta logLevel): the notices came as well
        notices = [d for d in logs if isinstance(d, dict) and d.get("reason") == "waiting_for_input"]
        assert len(notices) == 2, logs
        # each names the request it is about by the id the client gave it (over HTTP, not the front's own)
        assert all(isinstance(d["requestId"], int) for d in notices), notices
        # without a way to answer, stdin is at its end at once, as before
    async with connect(transport, tmp_path) as plain:
        ran = await plain.call_tool("shell", {"command": "read a; echo rc=$?"})
        assert ran.structured_content is not None and ran.structured_content["stdout"] == "rc=1\n"
