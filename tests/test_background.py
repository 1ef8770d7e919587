"""Background processes end to end (PROTOCOL.md, "Background processes"; and the CLI's
ps/attach/kill) against a real
``smith-fast serve`` process and real processes: they outlive their request and session, any
session lists, attaches (retained output from an offset, then live, then the exit), writes stdin
and cancels them, the ring drops the oldest and says so, ``--max-background`` refuses, and they
die with the service (SIGTERM and SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import uuid

import pytest

from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import terminal_state

from harness.server import ROOT, ServerProcess, assert_clean_log, host_pids, pid_alive, wait_until
from tests.peers import V0Peer
from tests.test_process_control import Raw


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("background")
    srv = ServerProcess(tmp, "--grpc", "127.0.0.1:0", "--kill-grace", "1s", "--max-background", "16", "--background-buffer", "4k").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])
    assert_clean_log(srv)


def test_ring_keeps_the_last_bytes_with_their_offsets() -> None:
    from smith_fast.service.background import Ring

    ring = Ring(10, merge=4)
    ring.feed(1, b"abc")
    ring.feed(1, b"d")  # merged into the first segment (4 bytes)
    ring.feed(2, b"EF")
    assert (ring.first, ring.next, ring.retained) == (0, 6, 6)
    assert ring.read(0, 100) == [(0, 1, b"abcd"), (4, 2, b"EF")]
    assert ring.read(2, 3) == [(2, 1, b"cd"), (4, 2, b"E")]
    ring.feed(1, b"ghijk")  # 11 bytes written: the first one falls out
    assert (ring.first, ring.next, ring.retained) == (1, 11, 10)
    assert ring.read(0, 100) == [(1, 1, b"bcd"), (4, 2, b"EF"), (6, 1, b"ghijk")]
    assert ring.read(11, 100) == []  # nothing new yet
    ring.feed(2, b"0123456789XY")  # larger than the ring: only its tail
    assert (ring.first, ring.next, ring.retained) == (13, 23, 10)
    assert ring.read(0, 100) == [(13, 2, b"23456789XY")]
    assert ring.read(20, 100) == [(20, 2, b"9XY")]


def test_ring_does_not_merge_across_the_gap_of_a_chunk_larger_than_itself() -> None:
    """A chunk larger than the ring keeps only its tail, after a gap: merged onto the segment
    before, its bytes were read at the wrong offsets and an attach following the ring stopped
    short of the end and waited for ever (seen under load, where pipe reads come in large chunks)."""
    from smith_fast.service.background import Ring

    ring = Ring(8, merge=64)
    ring.feed(1, b"abc")
    ring.feed(1, b"0123456789")  # 13 bytes written; the ring keeps 6..13 only
    assert (ring.first, ring.next, ring.retained) == (5, 13, 8)
    assert ring.read(0, 100) == [(5, 1, b"23456789")]
    assert ring.read(9, 100) == [(9, 1, b"6789")]
    cursor, got = ring.first, b""
    while pieces := ring.read(cursor, 3):  # as an attach follows it, a few bytes at a time
        for offset, _, data in pieces:
            assert offset == cursor
            got, cursor = got + data, offset + len(data)
    assert (got, cursor) == (b"23456789", ring.next)


def rid() -> str:
    return str(uuid.uuid4())


def placed(server: object) -> dict[str, str] | None:
    """The ``client_info`` of a new session: none on ``serve``; through a NATS gateway
    (tests/test_nats_background.py) the next worker in turn, so sessions that follow each other
    live on different workers."""
    placement = getattr(server, "placement", None)
    return placement() if placement is not None else None


async def connect(server: ServerProcess) -> Client:
    client = await Client.connect(server.unix)
    await client.handshake(client_info=placed(server))
    return client


def background_exec(command: str, request_id: str, **fields: object) -> pb.Command:
    return pb.Command(shell_exec=pb.ShellExecCommand(request_id=request_id, command=command, background=True, **fields))  # type: ignore[arg-type]


async def attach_raw(client: Client, process_id: str, from_offset: int = 0) -> Raw:
    attach_id = rid()
    raw = Raw(client, attach_id)
    client.send(pb.Command(attach=pb.AttachCommand(request_id=attach_id, process_id=process_id, from_offset=from_offset)))
    return raw


def outputs(raw: Raw) -> list[pb.ShellOutputEvent]:
    return [e.shell_output for e in raw.of("shell_output") if e.shell_output.stdout or e.shell_output.stderr]


def test_outlives_its_session_then_another_session_attaches_from_0_and_follows(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    go = server.root / f"go-{uuid.uuid4().hex}"
    pid_id = rid()

    async def main() -> None:
        first = await connect(server)
        start = Raw(first, pid_id)
        first.send(background_exec(f"echo early; while [ ! -e {go} ]; do sleep 0.02; done; echo late >&2; exit 7", pid_id))
        assert terminal_state(await start.end()) == pb.SERVICE_STATE_READY
        notice = start.of("log")
        assert notice and notice[0].log.fields["reason"] == "background" and notice[0].log.fields["process_id"] == pid_id
        assert not start.of("shell_output") and not start.of("error")
        await first.close()  # the session ends: the process must not

        second = await connect(server)
        listed = {p.id: p for p in await second.list_processes()}
        assert listed[pid_id].state == "running" and listed[pid_id].pid > 0 and pid_alive(listed[pid_id].pid)
        raw = await attach_raw(second, pid_id, 0)
        early = await raw.until(lambda e: e.WhichOneof("event_type") == "shell_output" and bool(e.shell_output.stdout))
        assert early.shell_output.stdout == "early\n" and early.shell_output.offset == 0
        go.touch()  # now the live part
        final = await raw.until(lambda e: e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished)
        assert final.shell_output.exit_code == 7 and final.shell_output.offset == len("early\nlate\n")
        assert terminal_state(await raw.end()) == pb.SERVICE_STATE_READY
        late = [o for o in outputs(raw) if o.stderr]
        assert [(o.stderr, o.offset) for o in late] == [("late\n", 6)]
        listed = {p.id: p for p in await second.list_processes()}
        assert listed[pid_id].state == "exited" and listed[pid_id].exit_code == 7 and listed[pid_id].next_offset == 11
        # exited, its output kept: a late attach gets it all and the exit at once
        again = await second.attach(pid_id)
        assert await again.wait() == 7
        assert again.output().stdout == b"early\n" and again.output().stderr == b"late\n"
        await second.close()

    run(main())


def test_ring_drops_the_oldest_and_attach_says_where_it_starts(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    pid_id = rid()
    expected = "".join(f"{i}\n" for i in range(1, 3001)).encode()

    async def main() -> None:
        client = await connect(server)
        await client.background("seq 1 3000", request_id=pid_id)
        assert await (await client.attach(pid_id, 1 << 40)).wait() == 0  # past the end: only its exit
        info = next(p for p in await client.list_processes() if p.id == pid_id)
        assert (info.next_offset, info.retained, info.first_offset) == (len(expected), 4096, len(expected) - 4096)
        raw = await attach_raw(client, pid_id, 10)
        await raw.end()
        warn = [e.log for e in raw.of("log") if e.log.fields.get("reason") == "output_dropped"]
        assert len(warn) == 1 and warn[0].fields["start_offset"] == str(len(expected) - 4096) and warn[0].fields["requested_offset"] == "10"
        assert warn[0].level == pb.LOG_LEVEL_WARN
        got = outputs(raw)
        assert got[0].offset == len(expected) - 4096
        assert "".join(o.stdout for o in got).encode() == expected[-4096:]
        await client.close()

    run(main())


def test_stdin_from_another_session_and_sdk_start_background(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        first = await connect(server)
        proc = await first.start("cat; echo done", stdin=True, background=True)
        pid_id = proc.target
        assert proc.request_id != pid_id
        await first.close()
        second = await connect(server)
        attached = await second.attach(pid_id)
        attached.write("hello\n")
        chunks = aiter(attached)
        assert (await anext(chunks)).data == b"hello\n"
        attached.close_stdin()
        rest = [c.data async for c in chunks]
        assert b"".join(rest) == b"done\n"
        assert await attached.wait() == 0
        await second.close()

    run(main())


def test_detach_leaves_it_running_and_cancel_from_another_session_kills_the_tree(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    pid_id = rid()

    async def main() -> None:
        first = await connect(server)
        await first.background("sleep 300 & echo $!; wait", request_id=pid_id)
        follower = await first.attach(pid_id)
        (child,) = host_pids(None, [int((await anext(aiter(follower))).data)], "sleep 300 & echo")  # printed in its pid namespace
        await follower.aclose()  # detaches: leaving an attach does not stop the process
        assert follower.done and pid_alive(child)
        shell = next(p for p in await first.list_processes() if p.id == pid_id)
        assert shell.state == "running" and pid_alive(shell.pid)
        await first.close()

        other = await connect(server)
        watch = await attach_raw(other, pid_id, 1 << 40)
        other.cancel(pid_id)
        final = await watch.until(lambda e: e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished)
        assert final.shell_output.exit_code in (-15, -9)
        assert terminal_state(await watch.end()) == pb.SERVICE_STATE_READY
        assert wait_until(lambda: not pid_alive(child) and not pid_alive(shell.pid), 10)
        other.cancel(pid_id)  # cancelling an exited one is harmless
        assert next(p for p in await other.list_processes() if p.id == pid_id).state == "exited"
        await other.close()

    run(main())


def test_unknown_ids_and_grants(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        client = await connect(server)
        missing = rid()
        with pytest.raises(SmithError, match=f"no background process {missing}") as info:
            await (await client.attach(missing)).wait()
        assert info.value.error.details["reason"] == "unknown_process"
        await client.close()
        pid_id = rid()
        owner = await connect(server)
        await owner.background("sleep 30", request_id=pid_id)
        bare = await Client.connect(server.unix)
        await bare.handshake([], client_info=placed(server))  # no shell_exec: it can neither list, attach nor steer
        with pytest.raises(SmithError, match="shell_exec"):
            await bare.list_processes()
        bare.cancel(pid_id)
        refused = await asyncio.wait_for(bare.events.get(), 10)
        while refused is not None and refused.WhichOneof("event_type") != "error":
            refused = await asyncio.wait_for(bare.events.get(), 10)
        assert refused is not None and refused.error.error_code == pb.ERROR_CODE_INVALID_CAPABILITY and refused.error.request_id == pid_id
        assert next(p for p in await owner.list_processes() if p.id == pid_id).state == "running"
        owner.cancel(pid_id)
        assert await (await owner.attach(pid_id, 1 << 40)).wait() < 0
        await bare.close()
        await owner.close()

    run(main())


def test_grpc_starts_one_a_socket_session_follows_it(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        grpc = await Client.connect(server.grpc)
        await grpc.handshake()
        pid_id = await grpc.background("echo over grpc")
        await grpc.close()
        sock = await connect(server)
        proc = await sock.attach(pid_id)
        assert await proc.wait() == 0 and proc.output().stdout == b"over grpc\n"
        await sock.close()
        grpc = await Client.connect(server.grpc)
        await grpc.handshake()
        assert pid_id in [p.id for p in await grpc.list_processes()]
        await grpc.close()

    run(main())


def test_v0_starts_lists_and_attaches(server: ServerProcess) -> None:
    peer = V0Peer(server.unix)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
    peer.until(lambda m: m["type"] == "Ready")
    pid_id = rid()
    peer.send({"type": "ShellExec", "data": {"request_id": pid_id, "command": "echo v0", "shell": None, "cwd": None, "env": {},
                                             "timeout_ms": None, "background": True}})
    # its own terminal state (not the session's Ready after the handshake): then it runs, wherever it runs
    started = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == pid_id and m["data"]["state"] in ("Ready", "Error"))
    assert started[-1]["data"]["state"] == "Ready", started
    list_id = rid()
    peer.send({"type": "ListProcesses", "data": {"request_id": list_id}})
    listed = peer.until(lambda m: m["type"] == "ProcessList")[-1]["data"]
    assert listed["request_id"] == list_id and pid_id in [p["id"] for p in listed["processes"]]
    attach_id = rid()
    peer.send({"type": "Attach", "data": {"request_id": attach_id, "process_id": pid_id, "from_offset": 0}})
    got = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == attach_id and m["data"]["state"] == "Ready")
    out = [m["data"] for m in got if m["type"] == "ShellOutput"]
    assert out[0]["stdout"] == "v0\n" and out[0]["offset"] == 0
    assert out[-1]["finished"] is True and out[-1]["exit_code"] == 0
    peer.close()


def test_max_background_refused_and_exited_ones_make_room(run, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path, "--max-background", "1", "--kill-grace", "1s", tcp=False).start()

    async def main() -> None:
        client = await Client.connect(srv.unix)
        await client.handshake()
        first = await client.background("sleep 30")
        with pytest.raises(SmithError, match=r"too many background processes running \(max --max-background 1\)") as info:
            await client.background("sleep 30")
        assert info.value.error.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and info.value.error.details["reason"] == "max_background"
        client.cancel(first)
        assert await (await client.attach(first, 1 << 40)).wait() < 0
        second = await client.background("true")  # the exited one makes room
        assert [p.id for p in await client.list_processes()] == [second]
        await client.close()

    try:
        run(main())
    finally:
        assert srv.stop() == 0


def test_max_background_0_turns_them_off(run, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path, "--max-background", "0", tcp=False).start()

    async def main() -> None:
        client = await Client.connect(srv.unix)
        await client.handshake()
        with pytest.raises(SmithError, match=r"background processes are off on this service \(--max-background 0\)") as info:
            await client.background("true")
        assert info.value.error.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
        assert (await client.run("echo still")).stdout == b"still\n"  # a plain ShellExec is not affected
        await client.close()

    try:
        run(main())
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_they_die_with_the_service(run, tmp_path: pathlib.Path, sig: int) -> None:  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path, "--kill-grace", "1s", tcp=False).start()
    pids: list[int] = []

    async def main() -> None:
        client = await Client.connect(srv.unix)
        await client.handshake()
        pid_id = await client.background("sleep 300 & echo $!; wait")
        follower = await client.attach(pid_id)
        pids.extend(host_pids(srv.pid or 0, [int((await anext(aiter(follower))).data)], "sleep 300 & echo"))
        await follower.aclose()
        pids.extend(p.pid for p in await client.list_processes())
        await client.close()

    try:
        run(main())
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        code = srv.stop(sig)
        assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10), [p for p in pids if pid_alive(p)]
    finally:
        srv.stop()


def cli(*argv: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "smith_fast", *argv], cwd=ROOT, capture_output=True, timeout=60, input=input,
                          env=dict(os.environ, SMITH_FAST_LOG_LEVEL="warning"))


def test_cli_exec_d_ps_attach_kill(server: ServerProcess) -> None:
    address = server.unix
    started = cli("exec", "-d", "--connect", address, "echo hi; sleep 0.5; echo bye; exit 3")
    assert started.returncode == 0, started.stderr
    pid_id = started.stdout.decode().strip()
    assert uuid.UUID(pid_id)
    ps = cli("ps", "--connect", address)
    assert ps.returncode == 0 and ps.stdout.decode().splitlines()[0].split()[:4] == ["ID", "PID", "STATE", "EXIT"]
    assert any(line.startswith(pid_id) and "echo hi" in line for line in ps.stdout.decode().splitlines())
    assert pid_id in cli("ps", "-q", "--connect", address).stdout.decode().split()
    rows = [json.loads(line) for line in cli("ps", "--json", "--connect", address).stdout.decode().splitlines()]
    assert any(r["id"] == pid_id for r in rows)
    attached = cli("attach", "--connect", address, pid_id[:13])  # a unique prefix
    assert (attached.returncode, attached.stdout) == (3, b"hi\nbye\n"), attached.stderr
    assert cli("attach", "--connect", address, "--from", "3", pid_id).stdout == b"bye\n"
    again = cli("kill", "--connect", address, pid_id)
    assert again.returncode == 1 and f"{pid_id} has already exited (exit code 3)" in again.stderr.decode()

    sleeper = cli("exec", "--detach", "--connect", address, "sleep 300").stdout.decode().strip()
    shell = next(json.loads(line)["pid"] for line in cli("ps", "--json", "--connect", address).stdout.decode().splitlines()
                 if json.loads(line)["id"] == sleeper)
    killed = cli("kill", "--connect", address, sleeper)
    assert (killed.returncode, killed.stdout.decode().strip()) == (0, sleeper), killed.stderr
    assert wait_until(lambda: not pid_alive(shell), 10)

    fed = cli("exec", "-d", "--connect", address, "--", "cat")  # no open stdin: its input is /dev/null
    assert cli("attach", "--connect", address, fed.stdout.decode().strip()).returncode == 0

    unknown = cli("attach", "--connect", address, "nope")
    assert unknown.returncode == 1 and f"no background process nope on {address}" in unknown.stderr.decode()
    assert b"Traceback" not in unknown.stderr
    local = cli("ps")
    assert local.returncode == 2 and "needs --connect" in local.stderr.decode()
    assert cli("exec", "-d", "true").returncode == 2
    helped = cli("attach", "--help")
    assert helped.returncode == 0 and b"examples:" in helped.stdout and b"--from" in helped.stdout


def _framed(env: pb.Envelope) -> str:
    from google.protobuf.internal.encoder import _VarintBytes

    data = env.SerializeToString()
    return " ".join(f"{b:02x}" for b in _VarintBytes(len(data)) + data)


def test_protocol_md_bytes_are_the_encodings() -> None:
    # PROTOCOL.md, "Background processes": each example as protobuf encodes it, and written there
    examples = [
        pb.Envelope(command=pb.Command(shell_exec=pb.ShellExecCommand(request_id="r1", command="make", background=True))),
        pb.Envelope(command=pb.Command(list_processes=pb.ListProcessesCommand(request_id="l1"))),
        pb.Envelope(command=pb.Command(attach=pb.AttachCommand(request_id="a1", process_id="r1", from_offset=4096))),
        pb.Envelope(event=pb.Event(shell_output=pb.ShellOutputEvent(request_id="a1", stdout="hi\n", offset=0))),
        pb.Envelope(event=pb.Event(shell_output=pb.ShellOutputEvent(request_id="a1", exit_code=0, finished=True, offset=3))),
        pb.Envelope(event=pb.Event(process_list=pb.ProcessListEvent(request_id="l1", processes=[pb.BackgroundProcess(
            id="r1", command="make", state="running", pid=42, started_ms=1, next_offset=3, retained=3)]))),
    ]
    text = (ROOT / "PROTOCOL.md").read_text()
    section = " ".join(text.split("## Background processes", 1)[1].split("\n## ", 1)[0].split())
    for env in examples:
        assert _framed(env) in section, _framed(env)


def test_a_terminal_resized_from_another_session(run, server: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        first = await connect(server)
        pid_id = await first.background("stty size; read x; stty size", pty=(24, 80))
        await first.close()
        second = await connect(server)
        assert next(p for p in await second.list_processes() if p.id == pid_id).pty
        proc = await second.attach(pid_id)
        seen = b""
        async for chunk in proc:
            seen += chunk.data
            if b"24 80" in seen:
                break  # detaches; the terminal is still the process's
        again = await second.attach(pid_id, len(seen))
        again.resize(40, 120)
        again.write("\r")
        assert await again.wait() == 0
        assert b"40 120" in again.output().stdout
        await second.close()

    run(main())
