"""The gRPC front against a real ``smith-fast serve --grpc`` process, with real grpc.aio clients.

Raw tests use the stubs protoc generated from the schema (``smith_pb2_grpc``) and the standard
health client, as any third-party gRPC client would; the rest use the SDK's :class:`GrpcClient`.
Every test runs with the service on uvloop and on the stdlib asyncio loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smith_fast.client import Client, GrpcClient, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.pb import smith_pb2_grpc

from harness.server import ServerProcess, assert_clean_log, host_pids, pid_alive, wait_until

LOOPS = ["uvloop", "asyncio"]
CLI = [sys.executable, "-m", "smith_fast"]


@pytest.fixture(scope="module", params=LOOPS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"grpc-{request.param}")
    (tmp / "hello.txt").write_text("hello world\n")
    # hooks_rust is granted only when the operator lists it (a Rust hook is native code)
    caps = ("--capabilities", "shell_exec,hooks_js,hooks_rust,replay,tracing,nats")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--chunk-size", "64", *caps, loop=request.param).start()
    assert srv.grpc.startswith("grpc:127.0.0.1:")
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


def target(srv: ServerProcess) -> str:
    return srv.grpc.removeprefix("grpc:")


def handshake(version: int = 1, caps: tuple[int, ...] = (pb.CAPABILITY_SHELL_EXEC,), **client_info: str) -> pb.Envelope:
    env = pb.Envelope()
    env.command.handshake.version = version
    env.command.handshake.capabilities.extend(caps)
    env.command.handshake.client_info.update(client_info)
    return env


def shell_exec(command: str, rid: str) -> pb.Envelope:
    env = pb.Envelope()
    env.command.shell_exec.request_id = rid
    env.command.shell_exec.command = command
    return env


async def until_terminal(responses: AsyncIterator[pb.Envelope], rid: str) -> list[pb.Envelope]:
    """Envelopes up to and including the terminal StateChange of ``rid`` (BatchEvents unpacked)."""
    out = []
    async for env in responses:
        out.append(env)
        events = [env.event] if env.HasField("event") else list(env.batch_event.events)
        for ev in events:
            sc = ev.state_change
            if ev.HasField("state_change") and sc.request_id == rid and sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                return out
    raise AssertionError(f"stream ended before {rid} did")


def events_of(envelopes: list[pb.Envelope]) -> list[pb.Event]:
    out: list[pb.Event] = []
    for env in envelopes:
        if env.HasField("event"):
            out.append(env.event)
        elif env.HasField("batch_event"):
            out.extend(env.batch_event.events)
    return out


def stdout_of(events: list[pb.Event]) -> str:
    return "".join(ev.shell_output.stdout for ev in events if ev.HasField("shell_output") and ev.shell_output.HasField("stdout"))


# ---- Negotiate -------------------------------------------------------------------------------------


async def test_negotiate_v1(server: ServerProcess) -> None:
    async with aio.insecure_channel(target(server)) as channel:
        stub = smith_pb2_grpc.SmithServiceStub(channel)
        resp = await stub.Negotiate(
            pb.NegotiateRequest(
                supported_versions=[0, 1],
                capabilities=[pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_NATS, pb.CAPABILITY_SHELL_EXEC],
                client_metadata={"client": "test"},
            )
        )
    assert resp.selected_version == 1 and not resp.fallback_to_jsonl
    assert list(resp.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
    meta = dict(resp.service_metadata)
    assert meta["service_name"] == "smith-fast" and meta["negotiated_version"] == "1"
    assert meta["granted_capabilities"] == "shell_exec" and meta["rejected_capabilities"] == "nats"
    assert meta["available_capabilities"] == "hooks_js,hooks_rust,replay,shell_exec,tracing"
    assert meta["smith_fast.acceptable"] == "batch_event,health,metrics,usage,resume,changes"
    assert meta["event_loop"] == server.argv[server.argv.index("--loop") + 1]
    assert meta["implementation"] in ("c", "py") and meta["protobuf_support"] == "true"


async def test_negotiate_falls_back_to_jsonl(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as client:
        assert isinstance(client, GrpcClient)
        resp = await client.negotiate([0], ["shell_exec"])
    assert resp.selected_version == 0 and resp.fallback_to_jsonl
    assert dict(resp.service_metadata)["negotiated_version"] == "0"
    endpoints = dict(resp.service_metadata)["jsonl_endpoints"].split(",")
    assert endpoints == [server.unix, server.tcp]  # where v0 is spoken: not the gRPC listener


async def test_negotiate_without_common_version_fails_the_call(server: ServerProcess) -> None:
    async with aio.insecure_channel(target(server)) as channel:
        stub = smith_pb2_grpc.SmithServiceStub(channel)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Negotiate(pb.NegotiateRequest(supported_versions=[2, 7]))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "2,7" in info.value.details()
    assert dict(info.value.trailing_metadata())["smith-error-code"] == "ERROR_CODE_UNSUPPORTED_VERSION"
    async with await Client.connect(server.grpc) as client:  # the SDK turns it back into the ErrorCode
        with pytest.raises(SmithError) as err:
            await client.negotiate([])  # type: ignore[attr-defined]
    assert err.value.code == pb.ERROR_CODE_UNSUPPORTED_VERSION


# ---- Stream ----------------------------------------------------------------------------------------


async def test_stream_shell_exec_with_generated_stub(server: ServerProcess) -> None:
    rid = str(uuid.uuid4())
    done = asyncio.Event()

    async def requests() -> AsyncIterator[pb.Envelope]:
        yield handshake()
        yield shell_exec("echo out; echo err >&2; exit 3", rid)
        await done.wait()

    async with aio.insecure_channel(target(server)) as channel:
        call = smith_pb2_grpc.SmithServiceStub(channel).Stream(requests())
        envelopes = await until_terminal(call, rid)
        done.set()
    seqs = [env.sequence for env in envelopes]
    assert seqs == list(range(1, len(seqs) + 1))
    assert all(abs(env.timestamp - time.time() * 1000) < 60_000 for env in envelopes)
    events = events_of(envelopes)
    assert [ev.WhichOneof("event_type") for ev in events[:3]] == ["state_change", "ready", "state_change"]
    ready = events[1].ready
    assert ready.version == 1 and list(ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
    assert ready.service_info["smith_fast.accepted"] == ""  # asked for nothing: single envelopes only
    assert all(env.HasField("event") for env in envelopes)
    out = stdout_of(events)
    err = "".join(ev.shell_output.stderr for ev in events if ev.shell_output.HasField("stderr"))
    final = [ev.shell_output for ev in events if ev.shell_output.finished]
    assert (out, err, [f.exit_code for f in final]) == ("out\n", "err\n", [3])


async def test_stream_tool_call_and_shell_exec_with_sdk(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as client:
        ready = await client.handshake(["shell_exec"])
        assert ready.version == 1
        res = await client.call_tool("fs.read", {"path": "hello.txt"})
        assert res.success and json.loads(res.result)["content"] == "hello world\n"
        with pytest.raises(SmithError) as info:
            await client.call_tool("fs.read", {"path": "../../etc/passwd"})
        assert info.value.code == pb.ERROR_CODE_PERMISSION_DENIED
        tools = await asyncio.gather(*(client.call_tool("fs.read", {"path": "hello.txt"}) for _ in range(20)))
        assert all(t.success for t in tools)
        events = [ev async for ev in client.shell_exec("seq 1 3000")]
        assert stdout_of(events) == "".join(f"{i}\n" for i in range(1, 3001))


async def test_one_core_behind_every_listener(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as g, await Client.connect(server.unix) as u:
        a, b = await g.handshake([]), await u.handshake([])
    assert a.service_id == b.service_id


async def test_batches_carry_many_events(server: ServerProcess) -> None:
    rid = str(uuid.uuid4())
    done = asyncio.Event()

    async def requests() -> AsyncIterator[pb.Envelope]:
        yield handshake(**{"smith_fast.accept": "batch_event"})
        yield shell_exec("seq 1 50000", rid)
        await done.wait()

    async with aio.insecure_channel(target(server)) as channel:
        call = smith_pb2_grpc.SmithServiceStub(channel).Stream(requests())
        envelopes = await until_terminal(call, rid)
        done.set()
    head = [env for env in envelopes if env.HasField("event")]
    assert [ev.event.WhichOneof("event_type") for ev in head] == ["state_change", "ready", "state_change"]
    assert head[1].event.ready.service_info["smith_fast.accepted"] == "batch_event"
    batches = [env for env in envelopes if env.HasField("batch_event")]
    assert len(batches) == len(envelopes) - 3  # after Ready, everything is batched
    events = events_of(envelopes)
    text = "".join(f"{i}\n" for i in range(1, 50001))
    assert stdout_of(events) == text  # complete and in order
    assert len(events) > len(text) // 64  # --chunk-size 64: many small events ...
    assert len(events) > 20 * len(batches)  # ... in few messages
    assert [env.sequence for env in envelopes] == list(range(1, len(envelopes) + 1))
    # each run of partial batches is closed by a non-partial one, the stream's last included
    assert not batches[-1].batch_event.partial_batch
    assert all(ev.HasField("shell_output") or ev.HasField("state_change") for ev in events[3:])


async def test_sdk_unpacks_batches(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as client:
        await client.handshake(["shell_exec"], accept=["batch_event"])
        assert client.accepted == {"batch_event"}
        events = [ev async for ev in client.shell_exec("seq 1 20000")]
        assert stdout_of(events) == "".join(f"{i}\n" for i in range(1, 20001))
        assert 0 < client.batches_received < len(events) / 10
        res = await client.call_tool("fs.read", {"path": "hello.txt"})  # a lone event, batched too
        assert res.success


async def test_version_0_on_a_stream_is_refused(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as client:
        with pytest.raises(SmithError) as info:
            await client.handshake(version=0)
        assert info.value.code == pb.ERROR_CODE_UNSUPPORTED_VERSION
        assert (await client.handshake()).version == 1  # the stream goes on


async def test_invalid_envelope_is_skipped(server: ServerProcess) -> None:
    async with aio.insecure_channel(target(server)) as channel:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[bytes]:
            while (item := await queue.get()) is not None:
                yield item

        call = channel.stream_stream("/smith.v1.SmithService/Stream")(requests())
        queue.put_nowait(b"\xff\xff\xff")
        env = pb.Envelope.FromString(await call.read())
        assert env.event.error.details["reason"] == "invalid_envelope"
        queue.put_nowait(handshake().SerializeToString())
        kinds = [pb.Envelope.FromString(await call.read()).event.WhichOneof("event_type") for _ in range(3)]
        assert kinds == ["state_change", "ready", "state_change"]
        queue.put_nowait(None)
        assert await call.code() == grpc.StatusCode.OK


async def test_half_close_lets_requests_finish(server: ServerProcess) -> None:
    rid = str(uuid.uuid4())

    async def requests() -> AsyncIterator[pb.Envelope]:
        yield handshake()
        yield shell_exec("sleep 0.3; echo finished", rid)  # then the request stream ends

    async with aio.insecure_channel(target(server)) as channel:
        call = smith_pb2_grpc.SmithServiceStub(channel).Stream(requests())
        envelopes = [env async for env in call]
        assert await call.code() == grpc.StatusCode.OK
    events = events_of(envelopes)
    assert stdout_of(events) == "finished\n"
    assert events[-1].state_change.request_id == rid and events[-1].state_change.state == pb.SERVICE_STATE_READY


async def test_cancelled_call_kills_its_commands(server: ServerProcess, tmp_path: pathlib.Path) -> None:
    pidfile = server.root / f"{tmp_path.name}.pid"  # the default sandbox lets commands write only in the root
    client = await Client.connect(server.grpc)
    await client.handshake()
    agen = client.shell_exec(f"echo $$ > {pidfile}; sleep 60")  # no exec: the shell, whose line names the pid file, stays
    await agen.__anext__()  # PROCESSING
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 5)
    (pid,) = host_pids(server.pid, [int(pidfile.read_text())], str(pidfile))  # printed in its pid namespace
    assert pid_alive(pid)
    await client.close()  # cancels the call
    assert wait_until(lambda: not pid_alive(pid), 10)
    await agen.aclose()


async def test_shutdown_command_ends_the_call_with_ok(server: ServerProcess) -> None:
    client = await Client.connect(server.grpc)
    await client.handshake()
    await asyncio.wait_for(client.shutdown(), 10)
    assert client.status == grpc.StatusCode.OK  # type: ignore[attr-defined]
    await client.close()


@pytest.fixture(scope="module")
def big_chunks(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A server with the default 64k chunks (the module's server makes 64-byte ones)."""
    srv = ServerProcess(tmp_path_factory.mktemp("grpc-big"), "--grpc", "127.0.0.1:0").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


async def test_slow_reader_pauses_the_command(big_chunks: ServerProcess) -> None:
    """A client that stops reading: the service's memory stays bounded, nothing is lost."""
    server = big_chunks
    total = 64 * 1024 * 1024
    rid = str(uuid.uuid4())
    done = asyncio.Event()

    async def requests() -> AsyncIterator[pb.Envelope]:
        yield handshake()
        yield shell_exec(f"yes 0123456789abcdef | head -c {total}", rid)
        await done.wait()

    def rss() -> int:
        return int(pathlib.Path(f"/proc/{server.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    async with aio.insecure_channel(target(server), options=[("grpc.max_receive_message_length", -1)]) as channel:
        call = channel.stream_stream("/smith.v1.SmithService/Stream")(
            (env.SerializeToString() async for env in requests())
        )
        await call.read()
        before = rss()
        await asyncio.sleep(1.5)  # not reading: the command must be blocked, not buffered
        assert rss() - before < 32 * 1024 * 1024
        got = 0
        while got < total:
            env = pb.Envelope.FromString(await call.read())
            so = env.event.shell_output
            if so.request_id == rid and so.HasField("stdout"):
                got += len(so.stdout)
        assert got == total
        done.set()
        call.cancel()


# ---- health --------------------------------------------------------------------------------------


async def test_standard_health_service(server: ServerProcess) -> None:
    async with aio.insecure_channel(target(server)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in ("", "smith.v1.SmithService"):
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("via", ["grpc", "unix", "tcp"])
async def test_health_in_stream(server: ServerProcess, via: str) -> None:
    address = {"grpc": server.grpc, "unix": server.unix, "tcp": server.tcp}[via]
    async with await Client.connect(address) as client:
        await client.handshake([], accept=["health"])
        assert client.accepted == {"health"}
        resp = await client.health_check()
        assert resp.status == pb.HealthCheckResponse.SERVING_STATUS_SERVING
        metrics = dict(resp.metrics)
        assert int(metrics["memory_bytes"]) > 1 << 20
        assert int(metrics["file_descriptors"]) > 3
        assert int(metrics["sessions"]) >= 1 and int(metrics["network_connections"]) >= 1
        assert float(metrics["uptime_seconds"]) > 0 and float(metrics["cpu_percent"]) >= 0
        assert metrics["service_id"] == client.ready.service_id  # type: ignore[union-attr]
        unknown = await client.health_check("no.such.Service")
        assert unknown.status == pb.HealthCheckResponse.SERVING_STATUS_SERVICE_UNKNOWN


async def test_health_request_without_asking_is_an_error(server: ServerProcess) -> None:
    async with await Client.connect(server.grpc) as client:
        await client.handshake([])
        env = pb.Envelope()
        env.health_check_request.SetInParent()
        client.send_envelope(env)
        ev = await asyncio.wait_for(client.events.get(), 5)
        assert ev.state_change.state == pb.SERVICE_STATE_READY  # the handshake's last event
        ev = await asyncio.wait_for(client.events.get(), 5)
        assert ev.error.details["reason"] == "unexpected_payload" and "smith_fast.accept=health" in ev.error.message


def test_health_cli(server: ServerProcess) -> None:
    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "health", *args], capture_output=True, text=True, timeout=60)

    res = health(server.grpc)
    assert (res.returncode, res.stdout) == (0, "SERVING\n"), res.stderr
    res = health(server.unix)
    assert res.returncode == 0 and res.stdout.startswith("SERVING\n") and "  memory_bytes: " in res.stdout
    res = health(server.tcp, "--service", "nope")
    assert (res.returncode, res.stdout) == (1, "SERVICE_UNKNOWN\n")
    res = health(server.grpc, "--service", "nope")
    assert (res.returncode, res.stdout) == (1, "SERVICE_UNKNOWN\n")


def test_health_cli_help() -> None:
    res = subprocess.run([*CLI, "health", "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "usage: smith-fast health" in res.stdout
    for flag in ("ADDR", "--service", "--timeout", "--tls-ca", "Exits 0 when SERVING"):
        assert flag in res.stdout, flag


def test_health_cli_unreachable(tmp_path: pathlib.Path) -> None:
    for address in ("grpc:127.0.0.1:9", f"unix:{tmp_path}/none.sock", "tcp:127.0.0.1:9"):
        res = subprocess.run([*CLI, "health", address, "--timeout", "2"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "smith-fast:" in res.stderr, (address, res.stderr)


# ---- lifecycle, TLS, addresses ------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
async def test_sigterm_turns_health_not_serving_and_ends_streams(tmp_path: pathlib.Path, loop: str) -> None:
    srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", loop=loop).start()
    try:
        async with aio.insecure_channel(target(srv)) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            client = await Client.connect(srv.grpc)
            await client.handshake()
            srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            assert (await asyncio.wait_for(watch.read(), 10)).status == health_pb2.HealthCheckResponse.NOT_SERVING
            states = [(await asyncio.wait_for(client.events.get(), 10)).state_change.state for _ in range(2)]
            assert states == [pb.SERVICE_STATE_READY, pb.SERVICE_STATE_SHUTTING]
            await asyncio.wait_for(client._closed.wait(), 10)  # noqa: SLF001
            assert client.status == grpc.StatusCode.OK  # type: ignore[attr-defined]
            await client.close()
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


def _self_signed(tmp: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


async def test_tls(tmp_path: pathlib.Path) -> None:
    cert, key = _self_signed(tmp_path)
    srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)).start()
    try:
        assert any(r.get("tls") is True for r in srv.logs if r.get("event") == "listening")
        async with await Client.connect(srv.grpc, tls_ca=cert.read_bytes()) as client:
            await client.handshake()
            events = [ev async for ev in client.shell_exec("echo over tls")]
            assert stdout_of(events) == "over tls\n"
        async with aio.insecure_channel(target(srv)) as channel:  # plaintext is not served
            with pytest.raises(aio.AioRpcError) as info:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        res = subprocess.run([*CLI, "health", srv.grpc, "--tls-ca", str(cert)], capture_output=True, text=True, timeout=60)
        assert (res.returncode, res.stdout) == (0, "SERVING\n"), res.stderr
    finally:
        assert srv.stop() == 0
    assert_clean_log(srv)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--grpc", "0.0.0.0:0"], "allow-remote"),
        (["--metrics", "0.0.0.0:0"], "allow-remote"),
        # a port over 65535 was taken modulo 65536 by the socket: 99999 listened on 34463
        (["--tcp", "127.0.0.1:99999"], "with a port from 0 to 65535"),
        (["--grpc", "127.0.0.1:70000"], "with a port from 0 to 65535"),
        (["--metrics", "127.0.0.1:65536"], "with a port from 0 to 65535"),
        (["--tcp", "[::1:7878"], "with a port from 0 to 65535"),  # read as host ::1 before
        (["--grpc", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
        (["--grpc", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.pem"],
         "--tls-key /nonexistent.pem: cannot be read: No such file or directory"),
    ],
)
def test_refused_listener_settings(tmp_path: pathlib.Path, extra: list[str], message: str) -> None:
    srv = ServerProcess(tmp_path, *extra)
    with pytest.raises(RuntimeError, match=message):
        srv.start(timeout=20)
    assert srv.proc is not None and srv.proc.wait(10) == 2
    assert not os.path.exists(srv.sock_path)  # refused before anything was bound


def test_a_tls_key_every_local_account_may_read_is_refused(tmp_path: pathlib.Path) -> None:
    # it was taken as it was; a group's read (0640, Debian's ssl-cert) is the usual way to share one
    cert, key = _self_signed(tmp_path)
    for mode in (0o644, 0o604):
        key.chmod(mode)
        srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key))
        with pytest.raises(RuntimeError, match=f"--tls-key {key}: every local account may read it \\(mode 0{mode:o}\\)"):
            srv.start(timeout=20)
        assert srv.proc is not None and srv.proc.wait(10) == 2
    key.chmod(0o640)
    assert ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key)).start().stop() == 0


def test_grpc_port_in_use_is_refused(server: ServerProcess, tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--grpc", target(server))
    with pytest.raises(RuntimeError, match="cannot listen on gRPC"):
        srv.start(timeout=20)
    assert srv.proc is not None and srv.proc.wait(10) == 2
