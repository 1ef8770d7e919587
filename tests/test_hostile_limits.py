"""The resource findings of the hostile-input review (RELIABILITY.md), each against a real
``smith-fast serve`` with the hostile bytes: the service refuses what it must with an error naming
the limit, stays within a stated memory bound and goes on answering an honest session."""

from __future__ import annotations

import json
import pathlib
import re
import socket
import threading
import time
import uuid

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast.pb import smith_pb2 as pb

from .peers import V0Peer, V1Peer, errors, kind, open_socket, terminal
from harness.server import ServerProcess

TOKEN = "tok-limits-5d1e0b"
MiB = 1024 * 1024


def rss(pid: int) -> int:
    """The process's resident set, in bytes (/proc/PID/status, VmRSS)."""
    text = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) * 1024  # type: ignore[union-attr]


def ping(peer: V1Peer, rid: str | None = None) -> list[pb.Envelope]:
    """One ``fs.list``-free round trip that needs no capability: ``tools.list``."""
    rid = rid or str(uuid.uuid4())
    peer.command(tool_call=pb.ToolCallCommand(request_id=rid, tool="tools.list", args=b"{}"))
    return peer.until(terminal(rid))


def honest(address: str, token: str | None = TOKEN) -> V1Peer:
    peer = V1Peer(address, timeout=60)
    info = {"token": token} if token else {}
    envs = peer.handshake((), **info)
    assert kind(envs[-1]) == "ready", envs
    return peer


# ---- unauthenticated memory: frames before the handshake -----------------------------------------


@pytest.fixture(scope="module")
def tokened(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("tokened")
    srv = ServerProcess(tmp, "--handshake-timeout", "60", env={"SMITH_TOKEN": TOKEN}).start()
    yield srv
    assert srv.stop() == 0


def _flood(address: str, declared: int, sent: int, hold: threading.Event, answers: list[bytes]) -> None:
    """Declare ``declared`` bytes, send ``sent`` zeros, never handshake; keep the socket until ``hold``."""
    try:
        sock = open_socket(address, timeout=30)
    except OSError:
        return
    try:
        sock.sendall(_VarintBytes(declared))
        block = b"\0" * (256 * 1024)
        left = sent
        while left > 0:
            sock.sendall(block[: min(left, len(block))])
            left -= len(block)
    except OSError:
        pass  # the service closed it: what a fixed service does
    try:
        sock.settimeout(5)
        answers.append(sock.recv(1 << 16))
    except OSError:
        answers.append(b"")
    hold.wait(60)
    sock.close()


def test_declared_frames_before_handshake_cost_nothing(tokened: ServerProcess) -> None:
    """40 connections each declaring a 16 MiB frame and sending 4 MiB of it, no handshake (before:
    150 such took the service from 649 to 2,327 MB). Each is told RESOURCE_EXHAUSTED naming
    --max-handshake-frame-size and closed; the service's RSS grows by less than 48 MB (what the
    peers sent: 160 MB); an honest session is answered meanwhile."""
    before = rss(tokened.pid)
    hold = threading.Event()
    answers: list[bytes] = []
    threads = [
        threading.Thread(target=_flood, args=(tokened.tcp, 16 * MiB - 1, 4 * MiB, hold, answers), daemon=True)
        for _ in range(40)
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(answers) < len(threads) and time.monotonic() < deadline:
            time.sleep(0.1)
        grown = rss(tokened.pid) - before
        peer = honest(tokened.unix)
        assert kind(ping(peer)[-1]) == "state_change"
        peer.close()
    finally:
        hold.set()
        for t in threads:
            t.join(10)
    assert grown < 48 * MiB, f"the service grew by {grown // MiB} MB for 40 unauthenticated connections"
    assert len(answers) == len(threads)
    said = answers[0]
    assert b"max-handshake-frame-size" in said and b"handshake_frame_too_large" in said, said[:300]


def test_oversize_frame_before_handshake_is_refused(tokened: ServerProcess) -> None:
    peer = V1Peer(tokened.unix)
    env = pb.Envelope(command=pb.Command(tool_call=pb.ToolCallCommand(request_id="r", tool="tools.list", args=b" " * (100 * 1024))))
    peer.send(env)
    errs = errors(peer.rest())
    assert len(errs) == 1 and errs[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    assert errs[0].details["reason"] == "handshake_frame_too_large" and errs[0].details["limit"] == str(64 * 1024)
    assert "--max-handshake-frame-size" in errs[0].message


def test_large_command_pipelined_behind_the_handshake_is_served(tokened: ServerProcess) -> None:
    """The pre-handshake limit is checked after a read's frames were handled: a client that sends
    its handshake and a 300 KB command in one write is served."""
    peer = V1Peer(tokened.unix, timeout=30)
    hs = pb.Envelope(command=pb.Command(handshake=pb.HandshakeCommand(version=1, client_info={"token": TOKEN})))
    big = pb.Envelope(command=pb.Command(tool_call=pb.ToolCallCommand(request_id="big", tool="tools.list", args=b"{}" + b" " * (300 * 1024))))
    data = b"".join(_VarintBytes(len(b)) + b for b in (hs.SerializeToString(), big.SerializeToString()))
    peer.sock.sendall(data)
    envs = peer.until(terminal("big"))
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, errors(envs)
    peer.close()


def test_long_v0_line_before_handshake_is_refused(tmp_path: pathlib.Path) -> None:
    """Without a token too, and for v0: a line over the limit before the handshake closes the connection."""
    srv = ServerProcess(tmp_path, "--max-handshake-frame-size", "4k").start()
    try:
        peer = V0Peer(srv.unix)
        peer.send_raw(b'{"type": "ping", "data": "' + b"a" * (64 * 1024))
        msgs = peer.rest()
        assert [m["type"] for m in msgs].count("Error") == 1, msgs
        err = next(m for m in msgs if m["type"] == "Error")
        assert "--max-handshake-frame-size" in json.dumps(err)
        v1 = honest(srv.unix, token=None)
        assert kind(ping(v1)[-1]) == "state_change"
    finally:
        assert srv.stop() == 0


# ---- batches -------------------------------------------------------------------------------------


def _batch(calls: int, prefix: str, ordered: bool = False) -> pb.Envelope:
    env = pb.Envelope()
    env.batch_command.require_ordering = ordered
    for i in range(calls):
        env.batch_command.commands.add().tool_call.CopyFrom(pb.ToolCallCommand(request_id=f"{prefix}{i}", tool="tools.list", args=b"{}"))
    return env


def test_batch_over_the_limit_is_refused_whole(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-batch-commands", "100").start()
    try:
        peer = honest(srv.unix, token=None)
        env = _batch(150, "b")
        env.batch_command.commands[7].tool_call.request_id = "b3"  # a duplicate id: one terminal state
        env.batch_command.commands[8].tool_call.request_id = ""  # unreadable: none
        peer.send(env)
        envs = peer.until(terminal("b149"))
        envs += ping(peer, "after")
        errs = errors(envs)
        assert len(errs) == 1 and errs[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and not errs[0].request_id
        assert errs[0].details["reason"] == "batch_too_large" and errs[0].details["limit"] == "100"
        assert "--max-batch-commands" in errs[0].message
        ends = [e.event.state_change for e in envs if kind(e) == "state_change" and e.event.state_change.request_id.startswith("b")]
        assert all(sc.state == pb.SERVICE_STATE_ERROR for sc in ends)
        ids = [sc.request_id for sc in ends]
        assert sorted(ids) == sorted({f"b{i}" for i in range(150)} - {"b7", "b8"})  # each once, nothing ran
        assert not any(kind(e) == "tool_result" and e.event.tool_result.request_id.startswith("b") for e in envs)
    finally:
        assert srv.stop() == 0


def test_large_batch_does_not_stall_other_sessions(tmp_path: pathlib.Path) -> None:
    """A batch of 40,000 calls (before: one of 200,000 stalled another session 14.6 s). Another
    session's round trip sent right behind it is answered well before the batch is done."""
    n = 40_000
    srv = ServerProcess(tmp_path, "--max-batch-commands", str(n), "--max-requests", str(n)).start()
    try:
        big = honest(srv.unix, token=None)
        other = honest(srv.unix, token=None)
        ping(other, "warm")
        data = _batch(n, "x").SerializeToString()
        start = time.monotonic()
        big.sock.sendall(_VarintBytes(len(data)) + data)
        time.sleep(0.05)  # the batch is being read and dispatched
        t0 = time.monotonic()
        assert ping(other, "probe")[-1].event.state_change.state == pb.SERVICE_STATE_READY
        probe = time.monotonic() - t0
        done = 0
        while done < n:
            env = big.recv()
            if kind(env) == "state_change" and env.event.state_change.request_id.startswith("x") and env.event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                done += 1
        batch = time.monotonic() - start
        print(f"probe {probe:.3f} s, batch {batch:.3f} s")
        assert probe < batch / 3, f"the other session waited {probe:.2f} s during a {batch:.2f} s batch"
    finally:
        assert srv.stop() == 0


def test_a_batch_over_the_limit_is_counted_not_decoded(tmp_path: pathlib.Path) -> None:
    """Two batches of 100,000 calls (2.8 MB each; before: each decoded into 30 MB of objects only
    to be refused, and a hostile load of them took the server's RSS past its bound) pipelined behind
    a batch of 300 that is still being dispatched (so they wait in turn, unread): each refused once,
    each request id in them ended once, a cancel's id not (it names another request), nothing run,
    and the server's RSS stays within a bound (48 MiB: the two frames, their ids and 200,000 terminal
    states; measured 13-21 MiB, 25 with the decoding path). What tells the paths apart: a call in the
    second batch whose tool name is not UTF-8, which the decoding path refused with the whole batch as
    no Envelope (no terminal state for anything in it)."""
    n = 100_000
    srv = ServerProcess(tmp_path).start()
    try:
        peer = honest(srv.unix, token=None)
        ping(peer, "warm")
        before = rss(srv.pid)
        first = _batch(300, "a")
        huge = [_batch(n, p) for p in ("x", "y")]
        huge[1].batch_command.commands.add().cancel.request_id = "c-names-another"
        frames = [e.SerializeToString() for e in (first, *huge)]
        # and a call whose tool name is not UTF-8: decoding the batch would refuse all of it as no Envelope
        # (no terminal states); counted unread, it is refused for its size and its readable ids end
        bad_call = b"\x0a\x05y-bad" + b"\x12\x01\xff"  # ToolCallCommand: request_id "y-bad", tool b"\xff"
        bad = b"\x1a" + _VarintBytes(len(bad_call)) + bad_call  # Command.tool_call
        batch = huge[1].batch_command.SerializeToString() + b"\x0a" + _VarintBytes(len(bad)) + bad
        frames[2] = b"\x62" + _VarintBytes(len(batch)) + batch  # Envelope.batch_command (12)
        data = b"".join(_VarintBytes(len(f)) + f for f in frames)
        # sent from a thread: the service stops reading while its answers wait to be read
        sender = threading.Thread(target=peer.sock.sendall, args=(data,), daemon=True)
        sender.start()
        peak = 0
        ended: dict[str, int] = {}
        envs: list[pb.Envelope] = []
        while len(ended) < 300 + 2 * n + 1:
            env = peer.recv()
            envs.append(env) if kind(env) != "state_change" else None
            sc = env.event.state_change
            if kind(env) == "state_change" and sc.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                assert sc.request_id not in ended, sc.request_id
                ended[sc.request_id] = sc.state
                if len(ended) % 20_000 == 0:
                    peak = max(peak, rss(srv.pid))
        sender.join(10)
        envs += ping(peer, "after")
        assert all(ended[f"a{i}"] == pb.SERVICE_STATE_READY for i in range(300))
        assert all(ended[f"{p}{i}"] == pb.SERVICE_STATE_ERROR for p in "xy" for i in range(n))
        assert "c-names-another" not in ended and ended["y-bad"] == pb.SERVICE_STATE_ERROR
        errs = errors(envs)
        assert [e.details["reason"] for e in errs] == ["batch_too_large"] * 2, errs
        assert [e.details["size"] for e in errs] == [str(n), str(n + 2)]
        assert not any(kind(e) == "tool_result" and e.event.tool_result.request_id[:1] in "xy" for e in envs)
        grown = (peak - before) // MiB
        print(f"RSS grew {grown} MiB")
        assert grown < 48, f"the server's RSS grew {grown} MiB refusing two batches of {n}"
    finally:
        assert srv.stop() == 0


# ---- request ids ---------------------------------------------------------------------------------


def test_long_request_id_is_refused_unread(tmp_path: pathlib.Path) -> None:
    """A 2 MiB request_id (before: 15 MiB was accepted, and echoed in every event)."""
    srv = ServerProcess(tmp_path).start()
    try:
        peer = honest(srv.unix, token=None)
        long_id = "i" * (2 * MiB)
        peer.command(tool_call=pb.ToolCallCommand(request_id=long_id, tool="tools.list", args=b"{}"))
        peer.command(tool_call=pb.ToolCallCommand(request_id="i" * 256, tool="tools.list", args=b"{}"))  # at the limit: runs
        envs = peer.until(terminal("i" * 256))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        errs = errors(envs)
        assert len(errs) == 1 and errs[0].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and not errs[0].request_id
        assert errs[0].details["reason"] == "request_id_too_long" and errs[0].details["limit"] == "256"
        assert "--max-request-id-size" in errs[0].message
        assert max(e.ByteSize() for e in envs) < 64 * 1024  # the long id was echoed nowhere
    finally:
        assert srv.stop() == 0


# ---- hooks per session ---------------------------------------------------------------------------


def _load(peer: V1Peer, rid: str, script: str) -> list[pb.Envelope]:
    peer.command(hook_load=pb.HookLoadCommand(request_id=rid, hook_type="js", script=script))
    return peer.until(terminal(rid))


def _ended(envs: list[pb.Envelope]) -> int:
    return envs[-1].event.state_change.state


def test_hook_count_is_bounded(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-hooks-per-session", "3").start()
    try:
        peer = honest(srv.unix, token=None)
        peer.handshake((pb.CAPABILITY_HOOKS_JS,))
        for i in range(3):
            assert _ended(_load(peer, f"h{i}", f"// {i}\nfunction beforeToolCall(p) {{ return {{action: 'allow'}}; }}")) == pb.SERVICE_STATE_READY
        envs = _load(peer, "h3", "// 3\nfunction beforeToolCall(p) { return {action: 'allow'}; }")
        assert _ended(envs) == pb.SERVICE_STATE_ERROR
        (err,) = errors(envs)
        assert err.error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED and err.request_id == "h3"
        assert err.details["reason"] == "too_many_hooks" and "--max-hooks-per-session" in err.message
        assert _ended(ping(peer)) == pb.SERVICE_STATE_READY  # the three loaded hooks still allow
    finally:
        assert srv.stop() == 0


def test_hook_memory_per_session_is_bounded(tmp_path: pathlib.Path) -> None:
    """12 JS hooks each holding a 28 MiB array (before: 30 such took the service from 74 to 888 MB).
    With --max-session-hook-memory 96M and --hook-memory 32M three load; the rest are refused
    naming the limit, and the service grows by less than 96 MB + 48 MB."""
    srv = ServerProcess(tmp_path, "--hook-memory", "32M", "--max-session-hook-memory", "96M").start()
    try:
        peer = honest(srv.unix, token=None)
        peer.handshake((pb.CAPABILITY_HOOKS_JS,))
        before = rss(srv.pid)
        outcomes = []
        for i in range(12):
            script = f"// {i}\nconst held = new Uint8Array(28 << 20); held.fill(1);\nfunction beforeToolCall(p) {{ return {{action: 'allow'}}; }}"
            envs = _load(peer, f"m{i}", script)
            outcomes.append((_ended(envs), errors(envs)))
        grown = rss(srv.pid) - before
        assert [o[0] for o in outcomes[:3]] == [pb.SERVICE_STATE_READY] * 3
        refused = outcomes[3:]
        assert all(state == pb.SERVICE_STATE_ERROR for state, _ in refused)
        for _, errs in refused:
            assert errs[-1].error_code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
            assert errs[-1].details["reason"] == "hook_memory" and "--max-session-hook-memory" in errs[-1].message
        assert grown < (96 + 48) * MiB, f"the service grew by {grown // MiB} MB"
        assert _ended(ping(peer)) == pb.SERVICE_STATE_READY
    finally:
        assert srv.stop() == 0


# ---- hook transforms within --chunk-size and --max-output ----------------------------------------

_INFLATE = """
function onShellOutput(p) {
  return { action: "transform", data: { stream: p.stream, text: p.text.replace(/\\n/g, "").repeat(%d) + "\\n" } };
}
"""


def _run_inflated(srv: ServerProcess, command: str, factor: int) -> tuple[list[pb.ShellOutputEvent], list[pb.Envelope]]:
    peer = honest(srv.unix, token=None)
    peer.handshake((pb.CAPABILITY_HOOKS_JS, pb.CAPABILITY_SHELL_EXEC))
    assert _ended(_load(peer, "inflate", _INFLATE % factor)) == pb.SERVICE_STATE_READY
    peer.command(shell_exec=pb.ShellExecCommand(request_id="sh", command=command))
    envs = peer.until(terminal("sh"))
    outs = [e.event.shell_output for e in envs if kind(e) == "shell_output"]
    peer.close()
    return outs, envs


def test_transformed_output_is_rechunked(tmp_path: pathlib.Path) -> None:
    """A 3-byte chunk a hook turns into 5 MB (before: it went out as one 5 MB event) goes out as
    --chunk-size chunks, all of it."""
    srv = ServerProcess(tmp_path, "--chunk-size", "64k").start()
    try:
        outs, envs = _run_inflated(srv, "printf abc", 5 * MiB // 3)
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        sizes = [len(o.stdout.encode()) for o in outs if o.HasField("stdout")]
        assert max(sizes) <= 64 * 1024
        text = "".join(o.stdout for o in outs if o.HasField("stdout"))
        assert text == "abc" * (5 * MiB // 3) + "\n"
        assert outs[-1].finished and outs[-1].exit_code == 0
    finally:
        assert srv.stop() == 0


def test_transformed_output_counts_against_max_output(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path, "--max-output", "1M", "--chunk-size", "64k").start()
    try:
        outs, envs = _run_inflated(srv, "for i in 1 2 3 4 5; do echo abc; sleep 0.05; done", 200_000)
        stdout = sum(len(o.stdout.encode()) for o in outs if o.HasField("stdout"))
        assert stdout <= 1 * MiB, stdout
        assert max(len(o.stdout.encode()) for o in outs if o.HasField("stdout")) <= 64 * 1024
        assert any("output truncated after 1048576 bytes" in o.stderr for o in outs)
        assert outs[-1].finished
    finally:
        assert srv.stop() == 0


# ---- a command that cannot fit in a NATS message -------------------------------------------------


def test_commands_and_results_larger_than_a_nats_message_pass_the_relay_whole(tmp_path: pathlib.Path) -> None:
    """A command just under --max-command-size (1M) and a tool result near --tool-max-output (1M)
    are, with their envelopes, over nats-server's default max_payload (1 MiB): the relay splits
    them into several messages and they arrive whole; the same for what a frontend sends before its
    session is placed (one OPEN would have been refused by the server, and the session hung)."""
    from harness.nats_cluster import Cluster

    cluster = Cluster(tmp_path, workers=1).start()
    (cluster.root / "big.txt").write_bytes(b"b" * (1024 * 1024 - 16))
    try:
        peer = V1Peer(cluster.unix, timeout=30)
        args = b'{"path":"written.txt","content":"' + b"a" * (1024 * 1024 - 120) + b'"}'
        # the handshake and a 1 MiB command in one write: both ride in the session's opening
        peer.command(handshake=pb.HandshakeCommand(version=1))
        peer.command(tool_call=pb.ToolCallCommand(request_id="huge", tool="fs.write", args=args))
        envs = peer.until(terminal("huge"))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, errors(envs)
        assert (cluster.root / "written.txt").stat().st_size == 1024 * 1024 - 120
        peer.command(tool_call=pb.ToolCallCommand(request_id="read", tool="fs.read", args=b'{"path": "big.txt"}'))
        envs = peer.until(terminal("read"))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, errors(envs)
        (result,) = [e.event.tool_result for e in envs if e.HasField("event") and e.event.WhichOneof("event_type") == "tool_result"]
        assert len(result.result) > 1024 * 1024  # the 1 MiB file, in JSON, back through the relay
        assert ping(peer, "after")[-1].event.state_change.state == pb.SERVICE_STATE_READY
        peer.close()
    finally:
        codes = cluster.stop()
    assert set(codes.values()) == {0}, codes


async def test_grpc_long_request_id_and_big_batch(tmp_path: pathlib.Path) -> None:
    """The same admission on the gRPC front: a long request id refused unread, a batch over the limit
    refused whole with one terminal state per readable id."""
    from grpc import aio

    from smith_fast.pb import smith_pb2_grpc

    srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--max-batch-commands", "10").start()
    try:
        async with aio.insecure_channel(srv.grpc.removeprefix("grpc:")) as channel:
            call = smith_pb2_grpc.SmithServiceStub(channel).Stream()
            hs = pb.Envelope()
            hs.command.handshake.version = 1
            await call.write(hs)
            while (await call.read()).event.WhichOneof("event_type") != "ready":
                pass
            long_id = pb.Envelope()
            long_id.command.tool_call.CopyFrom(pb.ToolCallCommand(request_id="L" * 100_000, tool="tools.list", args=b"{}"))
            await call.write(long_id)
            await call.write(_batch(11, "g"))
            await call.write(pb.Envelope(command=pb.Command(tool_call=pb.ToolCallCommand(request_id="end", tool="tools.list", args=b"{}"))))
            got: list[pb.Envelope] = []
            while not terminal("end")(env := await call.read()):
                got.append(env)
            await call.done_writing()
        reasons = [e.details["reason"] for e in errors(got)]
        assert reasons == ["request_id_too_long", "batch_too_large"], reasons
        ended = sorted(e.event.state_change.request_id for e in got if kind(e) == "state_change" and e.event.state_change.state == pb.SERVICE_STATE_ERROR)
        assert ended == sorted(f"g{i}" for i in range(11))
    finally:
        assert srv.stop() == 0


async def test_grpc_unauthenticated_messages_cost_bounded_memory(tmp_path: pathlib.Path) -> None:
    """The gRPC form of the unauthenticated-memory finding: 40 ``Stream`` calls without the token,
    each sending one 15 MB message. Each is refused (``handshake_frame_too_large``), at most
    ``--grpc-handshake-reads`` are taken at once, and what was taken is let go (before: the service
    held every message, 40 x 15 MB); a call that presents the token is served meanwhile."""
    import asyncio

    from grpc import aio

    from smith_fast.pb import smith_pb2_grpc

    srv = ServerProcess(tmp_path, "--grpc", "127.0.0.1:0", "--grpc-handshake-reads", "2", env={"SMITH_TOKEN": TOKEN}).start()
    target = srv.grpc.removeprefix("grpc:")
    big = b"\0" * (15 * 1000 * 1000)
    try:
        before = rss(srv.pid)
        channels = [aio.insecure_channel(target, options=[("grpc.max_send_message_length", -1)]) for _ in range(40)]

        async def hostile(channel: aio.Channel) -> list[bytes]:
            call = channel.stream_stream("/smith.v1.SmithService/Stream")()
            answers: list[bytes] = []
            try:
                await call.write(big)
                async for answer in call:
                    answers.append(answer)
            except Exception:  # the call may fail as a whole once refused: also a refusal
                pass
            return answers

        attacks = asyncio.gather(*(hostile(ch) for ch in channels))
        async with aio.insecure_channel(target) as channel:
            call = smith_pb2_grpc.SmithServiceStub(channel).Stream(metadata=(("smith-token", TOKEN),))
            hs = pb.Envelope()
            hs.command.handshake.version = 1
            await call.write(hs)
            while (await call.read()).event.WhichOneof("event_type") != "ready":
                pass
            await call.write(pb.Envelope(command=pb.Command(tool_call=pb.ToolCallCommand(request_id="t", tool="tools.list", args=b"{}"))))
            while not terminal("t")(await call.read()):
                pass
            await call.done_writing()
        results = await attacks
        for channel in channels:
            await channel.close()
        grown = rss(srv.pid) - before
        refusals = [pb.Envelope.FromString(a) for answers in results for a in answers]
        reasons = [e.event.error.details["reason"] for e in refusals if kind(e) == "error"]
        assert reasons.count("handshake_frame_too_large") == len(results) == 40, reasons
        assert grown < 200 * MiB, f"the service grew by {grown // MiB} MB"
        peer = honest(srv.unix)
        assert ping(peer)[-1].event.state_change.state == pb.SERVICE_STATE_READY
        peer.close()
    finally:
        assert srv.stop() == 0
