"""End-to-end: a real ``smith-fast serve`` process, every listener, v1 and v0, uvloop and asyncio."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import stat
import uuid

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb

from harness.server import ServerProcess, descendants, host_pids, pid_alive, running, wait_until


LOOPS = ["uvloop", "asyncio"]
VIAS = ["unix", "tcp", "stdio"]
PROTOCOLS = ["v1", "v0"]


@pytest.fixture(scope="module", params=LOOPS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"srv-{request.param}")
    (tmp / "hello.txt").write_text("hello world\n")
    srv = ServerProcess(tmp, loop=request.param).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.fixture
def inside(server: ServerProcess, tmp_path: pathlib.Path) -> pathlib.Path:
    """A fresh directory inside the server's root: the default sandbox lets commands write only there."""
    path = server.root / tmp_path.name
    path.mkdir()
    return path


async def connect(server: ServerProcess, via: str, protocol: str) -> Client:
    if via == "stdio":
        loop = server.argv[server.argv.index("--loop") + 1]
        return await Client.spawn("--loop", loop, "--root", str(server.root), protocol=protocol)
    return await Client.connect(server.address(via), protocol=protocol)


def outputs(events: list[pb.Event]) -> tuple[str, str, pb.ShellOutputEvent | None]:
    out = err = ""
    final = None
    for ev in events:
        if ev.WhichOneof("event_type") == "shell_output":
            so = ev.shell_output
            out += so.stdout if so.HasField("stdout") else ""
            err += so.stderr if so.HasField("stderr") else ""
            if so.finished:
                final = so
    return out, err, final


async def run(client: Client, command: str, **kw) -> tuple[str, str, pb.ShellOutputEvent | None, list[pb.Event]]:  # type: ignore[no-untyped-def]
    events = [ev async for ev in client.shell_exec(command, **kw)]
    out, err, final = outputs(events)
    return out, err, final, events


# ---- handshake -------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("via", VIAS)
async def test_handshake_and_shell_exec_everywhere(server: ServerProcess, via: str, protocol: str) -> None:
    client = await connect(server, via, protocol)
    try:
        ready = await client.handshake(["shell_exec"])
        version = 1 if protocol == "v1" else 0
        assert ready.version == version
        assert list(ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
        uuid.UUID(ready.service_id)
        if version == 1:
            info = dict(ready.service_info)
            assert info["service_name"] == "smith-fast"
            assert info["negotiated_version"] == "1"
            assert info["implementation"] in ("c", "py")
            assert info["event_loop"] == server.argv[server.argv.index("--loop") + 1]
            assert info["protobuf_support"] == "true"
        out, err, final, events = await run(client, "echo out; echo err >&2; exit 3")
        assert (out, err) == ("out\n", "err\n")
        assert final is not None and final.exit_code == 3 and final.finished
        states = [ev.state_change.state for ev in events if ev.WhichOneof("event_type") == "state_change"]
        assert states[0] == pb.SERVICE_STATE_PROCESSING and states[-1] == pb.SERVICE_STATE_READY
    finally:
        await client.close()


def test_logs_name_the_peer(server: ServerProcess) -> None:
    """TCP peers by address and port; Unix peers (unnamed sockets) by the listener and SO_PEERCRED."""
    from .peers import V1Peer

    unix, tcp = V1Peer(server.unix), V1Peer(server.tcp)
    for peer in (unix, tcp):
        peer.handshake()
    host, port = tcp.sock.getsockname()[:2]
    wanted = {f"unix:{server.sock_path} pid={os.getpid()} uid={os.getuid()}", f"tcp:{host}:{port}"}

    def seen() -> set[str]:
        return {r.get("peer") for r in server.logs if r.get("event") == "handshake"}

    assert wait_until(lambda: wanted <= seen(), 5), seen()
    unix.close()
    tcp.close()


async def test_state_changes_around_ready(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake([])
        first = await asyncio.wait_for(client.events.get(), 5)
        assert first.state_change.state == pb.SERVICE_STATE_READY
        # STARTING preceded Ready; it was consumed by handshake() from the same queue
        assert not first.state_change.HasField("request_id")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_unknown_capability_reported_rest_granted(server: ServerProcess, protocol: str) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        ready = await client.handshake(["shell_exec", "nats"] + ([99] if protocol == "v1" else []))
        assert list(ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
        # one warning per handshake, naming each refused capability (not one per entry: a peer could list thousands)
        (warning,) = client.warnings
        assert warning.error_code == pb.ERROR_CODE_INVALID_CAPABILITY
        if protocol == "v1":  # v0 ErrorEvents have no details field
            assert "capabilities nats, 99 are unknown or not available" in warning.message
            assert warning.details["capability"] == "nats,99" and warning.details["refused"] == "2"
        else:
            assert "capability nats is not available" in warning.message


async def test_unsupported_version(server: ServerProcess) -> None:
    async with await Client.connect(server.tcp) as client:
        with pytest.raises(SmithError) as info:
            await client.handshake(version=7)
        assert info.value.code == pb.ERROR_CODE_UNSUPPORTED_VERSION
        assert "7" in str(info.value)
        # the session is still usable: a correct handshake works afterwards
        assert (await client.handshake()).version == 1


async def test_command_before_handshake(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        with pytest.raises(SmithError, match="before handshake") as info:
            await client.call_tool("tools.list", {})
        assert info.value.details["reason"] == "handshake_required"


async def test_shell_exec_needs_capability(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake([])
        with pytest.raises(SmithError, match="shell_exec") as info:
            await run(client, "true")
        assert info.value.code == pb.ERROR_CODE_INVALID_CAPABILITY


# ---- shell exec ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_shell_exec_cwd_env_shell_and_signal(server: ServerProcess, protocol: str, inside: pathlib.Path) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        await client.handshake()
        out, _, final, _ = await run(client, 'pwd; echo "$GREETING"; echo "${SECRET_SERVICE_VAR-unset}"',
                                     cwd=str(inside), env={"GREETING": "héllo ✓"})
        assert out == f"{inside}\nhéllo ✓\nunset\n" and final and final.exit_code == 0
        out, _, final, _ = await run(client, "echo $0", shell="/bin/bash")
        assert out == "/bin/bash\n"
        _, _, final, _ = await run(client, "kill -9 $$")
        assert final is not None and final.exit_code == -9


async def test_shell_exec_bad_cwd_is_an_error(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        with pytest.raises(SmithError, match="/no/such/dir"):
            await run(client, "true", cwd="/no/such/dir")


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_large_output_is_complete_and_chunked(server: ServerProcess, protocol: str) -> None:
    async with await Client.connect(server.unix, protocol=protocol) as client:
        await client.handshake()
        out, _, final, events = await run(client, "seq 1 200000")
        assert out == "".join(f"{i}\n" for i in range(1, 200001))
        assert final and final.exit_code == 0
        chunks = [ev.shell_output.stdout for ev in events if ev.shell_output.HasField("stdout")]
        assert max(len(c.encode()) for c in chunks) <= 64 * 1024
        assert len(chunks) < 200000 // 10  # small reads are coalesced


async def test_timeout_kills_process_group(server: ServerProcess, inside: pathlib.Path) -> None:
    pidfile = inside / "pids"
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        with pytest.raises(SmithError) as info:
            await run(client, f"sleep 60.{os.getpid()} & echo $! > {pidfile}; echo $$ >> {pidfile}; wait", timeout_ms=300)
        assert info.value.code == pb.ERROR_CODE_EXECUTION_TIMEOUT
    # (the pids it wrote are its pid namespace's, gone with it: what is left is found by its line)
    assert wait_until(lambda: not running(f"sleep 60.{os.getpid()}") and not running(str(pidfile)))


async def test_concurrent_requests_interleave(server: ServerProcess) -> None:
    async with await Client.connect(server.unix) as client:
        await client.handshake()
        slow = asyncio.ensure_future(run(client, "sleep 0.5; echo slow"))
        fast = await run(client, "echo fast")
        assert fast[0] == "fast\n" and not slow.done()
        tools = await asyncio.gather(*(client.call_tool("fs.read", {"path": "hello.txt"}) for _ in range(20)))
        assert all(json.loads(t.result)["content"] == "hello world\n" for t in tools)
        assert (await slow)[0] == "slow\n"


# ---- tools ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_tool_calls(server: ServerProcess, protocol: str) -> None:
    async with await Client.connect(server.tcp, protocol=protocol) as client:
        await client.handshake([])
        listed = json.loads((await client.call_tool("tools.list")).result)
        names = {t["name"] for t in listed["tools"]}
        assert {"fs.read", "fs.write", "fs.list", "fs.search", "shell.run", "tools.list"} <= names
        res = await client.call_tool("fs.read", {"path": "hello.txt"})
        assert res.success and json.loads(res.result)["content"] == "hello world\n"
        if protocol == "v1":
            assert res.duration_ms >= 0
        bad = await client.call_tool("fs.read", raw_args=b"{not json")
        # v1 carries args as bytes, so the tool sees the broken JSON; v0 carries a JSON value, so the
        # SDK could only send the text as a JSON string, which the schema then refuses
        assert not bad.success and ("invalid JSON" in bad.error if protocol == "v1" else "is not of type 'object'" in bad.error)
        bad = await client.call_tool("fs.read", {"nope": 1})
        assert not bad.success and bad.error
        with pytest.raises(SmithError) as info:
            await client.call_tool("no.such.tool", {})
        assert info.value.code == pb.ERROR_CODE_INVALID_TOOL and "no.such.tool" in str(info.value)
        with pytest.raises(SmithError) as info:
            await client.call_tool("fs.read", {"path": "../../etc/passwd"})
        assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED
        with pytest.raises(SmithError) as info:
            await client.call_tool("shell.run", {"command": "sleep 5"}, timeout_ms=200)
        assert info.value.code == pb.ERROR_CODE_EXECUTION_TIMEOUT


# ---- shutdown, disconnect, signals -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_shutdown_cancels_running_and_closes(server: ServerProcess, protocol: str, inside: pathlib.Path) -> None:
    pidfile = inside / "pid"
    client = await Client.connect(server.unix, protocol=protocol)
    await client.handshake()
    events: list[pb.Event] = []

    async def long() -> None:
        with pytest.raises(SmithError):
            async for ev in client.shell_exec(f"echo $$ > {pidfile}; echo started; exec sleep 60.{os.getpid()}"):
                events.append(ev)

    task = asyncio.ensure_future(long())
    assert wait_until(pidfile.exists, 5) or await asyncio.sleep(0.5) is None
    await asyncio.sleep(0.3)
    await asyncio.wait_for(client.shutdown(), 10)
    await asyncio.wait_for(task, 10)
    _, _, final = outputs(events)
    assert final is not None and final.exit_code < 0  # killed by a signal
    states = [ev.state_change.state for ev in events if ev.WhichOneof("event_type") == "state_change"]
    assert pb.SERVICE_STATE_ERROR in states
    assert wait_until(lambda: not running(f"sleep 60.{os.getpid()}"), 5)
    await client.close()


async def test_disconnect_kills_children(server: ServerProcess, inside: pathlib.Path) -> None:
    pidfile = inside / "pid"
    client = await Client.connect(server.unix)
    await client.handshake()
    agen = client.shell_exec(f"echo $$ > {pidfile}; sleep 60")  # no exec: the shell, whose line names the pid file, stays
    await agen.__anext__()  # PROCESSING: the command is running
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 5)
    (pid,) = host_pids(server.pid, [int(pidfile.read_text())], str(pidfile))  # printed in its pid namespace
    assert pid_alive(pid)
    await client.close()
    assert wait_until(lambda: not pid_alive(pid), 10)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_zero_and_cleans_up(tmp_path: pathlib.Path, sig: int) -> None:
    srv = ServerProcess(tmp_path).start()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(srv.sock_path)
    hs = pb.Envelope()
    hs.command.handshake.version = 1
    hs.command.handshake.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
    run_cmd = pb.Envelope()
    run_cmd.command.shell_exec.request_id = str(uuid.uuid4())
    run_cmd.command.shell_exec.command = "sleep 60"
    from google.protobuf.internal.encoder import _VarintBytes  # noqa: PLC0415

    for env in (hs, run_cmd):
        data = env.SerializeToString()
        sock.sendall(_VarintBytes(len(data)) + data)
    assert wait_until(lambda: any(s != "Z" for _, s in descendants(srv.pid)), 5)
    kids = [pid for pid, _ in descendants(srv.pid)]
    assert srv.stop(sig) == 0
    assert not os.path.exists(srv.sock_path)
    assert wait_until(lambda: not any(pid_alive(p) for p in kids), 5)
    sock.close()


# ---- listeners ----------------------------------------------------------------------------------


def test_unix_socket_is_private_and_stale_socket_replaced(tmp_path: pathlib.Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "smith.sock"))
    stale.close()  # the file stays behind, nobody listens: stale
    srv = ServerProcess(tmp_path).start()
    try:
        mode = stat.S_IMODE(os.stat(srv.sock_path).st_mode)
        assert mode == 0o600
        # a second server must not steal a live socket
        second = ServerProcess(tmp_path)
        second.argv[second.argv.index("--tcp") + 1] = "127.0.0.1:0"
        with pytest.raises(RuntimeError, match="in use"):
            second.start(timeout=10)
    finally:
        assert srv.stop() == 0


def test_tcp_refuses_non_loopback_without_flag(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path)
    srv.argv[srv.argv.index("--tcp") + 1] = "0.0.0.0:0"
    with pytest.raises(RuntimeError, match="allow-remote"):
        srv.start(timeout=10)
    assert srv.proc is not None and srv.proc.wait(10) == 2


@pytest.mark.parametrize("pinned", ["v1", "v0"])
async def test_protocol_can_be_pinned(tmp_path: pathlib.Path, pinned: str) -> None:
    srv = ServerProcess(tmp_path, "--protocol", pinned).start()
    try:
        async with await Client.connect(srv.unix, protocol=pinned) as client:
            assert (await client.handshake()).version == (1 if pinned == "v1" else 0)
        # the other protocol is not sniffed any more: its bytes are read as the pinned one and refused
        other = "v0" if pinned == "v1" else "v1"
        async with await Client.connect(srv.unix, protocol=other) as client:
            with pytest.raises(Exception):
                await asyncio.wait_for(client.handshake(), 5)
    finally:
        assert srv.stop() == 0
