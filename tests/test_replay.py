"""Session logs: the file format, torn tails, write failures, and replays against real services.

The recorded sessions are real: a raw v1 (or v0) client drives a real ``smith-fast serve`` process
and records every envelope it sends and receives with :class:`SessionRecorder`, as the service will.
Replays run the real ``python -m smith_fast.replay`` command.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from smith_fast import events as wire_events
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.jsonl import JsonlCodec, LineDecoder
from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import (
    DIRECTION_IN,
    DIRECTION_OUT,
    LogFormatError,
    LogReader,
    Replayer,
    SessionRecorder,
    Transcript,
    diff_transcripts,
    read_log,
)
from smith_fast.replay.format import HEADER_FIXED, RECORD_HEADER

from harness.server import ROOT, ServerProcess

_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)


# ---- helpers ---------------------------------------------------------------------------------------


def envelope(i: int, size: int = 20) -> bytes:
    """A distinct outbound envelope of roughly ``size`` bytes of output."""
    return wire_events.encode_shell_output(1_700_000_000_000 + i, i + 1, f"r{i}", f"{i:06d}" + "x" * size, None, None, False, framed=False)


def write_log(directory: pathlib.Path, n: int, session_id: str = "s") -> tuple[pathlib.Path, list[bytes]]:
    bodies = []
    with SessionRecorder.open(directory, session_id=session_id, protocol_version=1, service_id="svc") as rec:
        for i in range(n):
            cmd = pb.Envelope(timestamp=i, sequence=i + 1)
            cmd.command.tool_call.request_id = f"r{i}"
            cmd.command.tool_call.tool = "fs.read"
            raw = cmd.SerializeToString() if i % 2 == 0 else envelope(i, 10 + 37 * i)
            (rec.record_in if i % 2 == 0 else rec.record_out)(raw)
            bodies.append(raw)
    return rec.path, bodies


def record_starts(data: bytes) -> list[int]:
    """Byte offsets of every record, walking the length fields."""
    meta = HEADER_FIXED.unpack_from(data)[3]
    pos, out = HEADER_FIXED.size + meta, []
    while pos < len(data):
        out.append(pos)
        pos += RECORD_HEADER.size + RECORD_HEADER.unpack_from(data, pos)[0]
    assert pos == len(data)
    return out


class RecordingClient:
    """A raw v1 client that records every envelope it sends and receives."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, recorder: SessionRecorder) -> None:
        self.reader, self.writer, self.recorder = reader, writer, recorder
        self.events: list[pb.Event] = []
        self.changed = asyncio.Event()
        self.closed = False
        self.seq = 0
        self.task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, path: str, recorder: SessionRecorder) -> RecordingClient:
        reader, writer = await asyncio.open_unix_connection(path)
        return cls(reader, writer, recorder)

    async def _read(self) -> None:
        decoder = FrameDecoder()
        while data := await self.reader.read(1 << 16):
            for frame in decoder.feed(data):
                self.recorder.record_out(frame)
                self.events.append(pb.Envelope.FromString(frame).event)
            self.changed.set()
        self.closed = True
        self.changed.set()

    async def wait(self, pred: Callable[[], bool], timeout: float = 20) -> None:
        async def loop() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(loop(), timeout)

    def send(self, command: pb.Command) -> None:
        self.seq += 1
        env = pb.Envelope(timestamp=int(time.time() * 1000), sequence=self.seq)
        env.command.CopyFrom(command)
        raw = env.SerializeToString()
        self.recorder.record_in(raw)
        self.writer.write(encode_frame(raw))

    def ended(self, rid: str) -> bool:
        return any(
            e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == rid and e.state_change.state in _TERMINAL
            for e in self.events
        )

    async def handshake(self) -> None:
        cmd = pb.Command()
        cmd.handshake.version = 1
        cmd.handshake.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
        self.send(cmd)
        await self.wait(lambda: any(e.WhichOneof("event_type") == "ready" for e in self.events))

    def shell(self, command: str) -> str:
        rid = str(uuid.uuid4())
        cmd = pb.Command()
        cmd.shell_exec.request_id = rid
        cmd.shell_exec.command = command
        self.send(cmd)
        return rid

    def tool(self, tool: str, args: dict) -> str:  # type: ignore[type-arg]
        rid = str(uuid.uuid4())
        cmd = pb.Command()
        cmd.tool_call.request_id = rid
        cmd.tool_call.tool = tool
        cmd.tool_call.args = json.dumps(args).encode()
        self.send(cmd)
        return rid

    async def shutdown(self) -> None:
        cmd = pb.Command()
        cmd.shutdown.SetInParent()
        self.send(cmd)
        await self.wait(lambda: self.closed)
        self.writer.close()


async def record_session(server: ServerProcess, directory: pathlib.Path) -> pathlib.Path:
    """Drive a varied session against ``server`` and record it; returns the log's path."""
    recorder = SessionRecorder.open(directory, session_id="recorded", protocol_version=1, service_id="?")
    client = await RecordingClient.connect(server.sock_path, recorder)
    await client.handshake()
    rid = client.shell("printf 'one\\ntwo\\n'; echo oops >&2; exit 3")
    await client.wait(lambda: client.ended(rid))
    rid = client.tool("fs.read", {"path": "hello.txt"})
    await client.wait(lambda: client.ended(rid))
    # Two requests in flight at once: their events interleave differently from run to run.
    both = [client.shell("sleep 0.2; echo late"), client.tool("fs.read", {"path": "hello.txt"})]
    await client.wait(lambda: all(client.ended(r) for r in both))
    rid = client.tool("no.such.tool", {})
    await client.wait(lambda: client.ended(rid))
    rid = client.shell("head -c 3000 /dev/zero | tr '\\0' x")
    await client.wait(lambda: client.ended(rid))
    await client.shutdown()
    recorder.close()
    assert recorder.error is None
    return recorder.path


def replay_cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "smith_fast.replay", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


# ---- servers and a recorded session ------------------------------------------------------------------


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    out = {}
    for name in ("a", "b"):
        root = tmp_path_factory.mktemp(f"root-{name}")
        (root / "hello.txt").write_text(f"hello from {name.upper()}\n")
        out[name] = root
    return out


@pytest.fixture(scope="module")
def server_a(roots: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path_factory.mktemp("srv-a"), root=roots["a"]).start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.fixture(scope="module")
def server_b(roots: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path_factory.mktemp("srv-b"), root=roots["b"], loop="asyncio").start()
    yield srv
    assert srv.stop() == 0, "\n".join(srv.raw_stderr[-30:])


@pytest.fixture(scope="module")
def recorded(server_a: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return asyncio.run(record_session(server_a, tmp_path_factory.mktemp("logs")))


# ---- the format ---------------------------------------------------------------------------------------


def test_round_trip(tmp_path: pathlib.Path) -> None:
    path, bodies = write_log(tmp_path, 9, session_id="a/b c")
    assert path.parent == tmp_path and path.suffix == ".smithrec"
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z-a_b_c\.smithrec", path.name)
    header, records, torn = read_log(path)
    assert torn is None
    assert (header.session_id, header.service_id, header.protocol_version) == ("a/b c", "svc", 1)
    assert abs(header.start_time_ns - time.time_ns()) < 60e9
    assert header.extra["smith_fast_version"]
    assert [r.envelope for r in records] == bodies
    assert [r.direction for r in records] == [DIRECTION_IN if i % 2 == 0 else DIRECTION_OUT for i in range(9)]
    offsets = [r.offset_ns for r in records]
    assert offsets == sorted(offsets) and offsets[0] >= 0
    assert records[1].parse().event.shell_output.stdout.startswith("000001x")
    assert records[0].parse().command.tool_call.request_id == "r0"
    assert [r.position for r in records] == record_starts(path.read_bytes())


def test_torn_tail_at_every_byte_of_the_last_record(tmp_path: pathlib.Path) -> None:
    path, bodies = write_log(tmp_path, 6)
    data = path.read_bytes()
    last = record_starts(data)[-1]
    for cut in reversed(range(last, len(data))):  # the real file, cut shorter and shorter
        os.truncate(path, cut)
        header, records, torn = read_log(path)
        assert [r.envelope for r in records] == bodies[:-1], cut
        if cut == last:
            assert torn is None  # the file simply ends between records
        else:
            assert torn is not None and torn.offset == last and torn.size == cut - last
            assert "incomplete" in torn.reason
    assert [r.envelope for r in read_log(data)[1]] == bodies
    assert len(data) - last > 40  # the last record is long enough for this to mean something


def test_torn_or_garbled_middle_record_keeps_everything_before_it(tmp_path: pathlib.Path) -> None:
    path, bodies = write_log(tmp_path, 7)
    data = path.read_bytes()
    starts = record_starts(data)
    middle = starts[3]
    for cut in range(middle, middle + RECORD_HEADER.size + 1):  # every byte of its length field and crc
        records, torn = read_log(data[:cut])[1:]
        assert [r.envelope for r in records] == bodies[:3]
        assert (torn is None) == (cut == middle)
    # A garbled length field (the file goes on after it): implausible, or the checksum fails.
    for bad in (b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x05\x00\x00\x00", (len(bodies[3]) + 30).to_bytes(4, "little")):
        broken = data[:middle] + bad + data[middle + 4 :]
        records, torn = read_log(broken)[1:]
        assert [r.envelope for r in records] == bodies[:3], bad
        assert torn is not None and torn.offset == middle and torn.size == len(data) - middle
    # A flipped bit in a body.
    broken = bytearray(data)
    broken[starts[5] + RECORD_HEADER.size + 12] ^= 0x10
    records, torn = read_log(bytes(broken))[1:]
    assert [r.envelope for r in records] == bodies[:5]
    assert torn is not None and torn.reason == "record checksum mismatch"


def test_bad_headers_raise_clear_errors(tmp_path: pathlib.Path) -> None:
    path, _ = write_log(tmp_path, 2)
    data = path.read_bytes()
    cases = {
        b"": "truncated header",
        data[:5]: "truncated header",
        data[: HEADER_FIXED.size + 3]: "truncated header",
        b"{\"type\":\"Handshake\"}\n" * 3: "not a smith-fast session log",
        data[:8] + b"\x09\x00" + data[10:]: "unsupported log format version 9",
        data[:-60] + b"X" + data[-59:]: "",  # a garbled record, not header: no error
    }
    meta_at = HEADER_FIXED.size + 2
    cases[data[:meta_at] + b"#" + data[meta_at + 1 :]] = "metadata checksum mismatch"
    for blob, message in cases.items():
        if not message:
            assert read_log(blob)[2] is not None
            continue
        with pytest.raises(LogFormatError, match=message):
            read_log(blob)
    empty = tmp_path / "empty.smithrec"
    empty.write_bytes(b"")
    with pytest.raises(LogFormatError, match=f"{re.escape(str(empty))}: truncated header"):
        LogReader(empty)


async def test_aclose_writes_everything_then_fsyncs_off_the_loop(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service closes session logs with ``aclose``: a long log's fsync must not stall the loop."""
    rec = SessionRecorder.open(tmp_path, session_id="aclose", protocol_version=1, service_id="svc")
    for i in range(20):
        rec.record_out(envelope(i, 1000))
    synced: list[tuple[int, int]] = []  # (thread, fd) of each fsync
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((threading.get_ident(), fd))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fd = rec._fd  # noqa: SLF001
    closing = asyncio.ensure_future(rec.aclose())
    await asyncio.sleep(0)  # aclose has written everything before it first yields
    assert len(read_log(rec.path)[1]) == 20 and rec.path.stat().st_size == rec.bytes_written
    await closing
    assert synced == [(synced[0][0], fd)] and synced[0][0] != threading.get_ident()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    await rec.aclose()  # idempotent, as close() is
    rec.close()
    assert len(synced) == 1


async def test_records_are_written_once_per_loop_tick(tmp_path: pathlib.Path) -> None:
    rec = SessionRecorder.open(tmp_path, session_id="tick", protocol_version=1, service_id="svc")
    size = rec.bytes_written
    for i in range(50):
        rec.record_out(envelope(i))
    assert rec.path.stat().st_size == size  # buffered: nothing written yet in this tick
    await asyncio.sleep(0)
    assert rec.path.stat().st_size == rec.bytes_written > size
    assert len(read_log(rec.path)[1]) == 50
    # Past flush_bytes the buffer is written at once, in whole records.
    big = envelope(0, 40_000)
    rec.record_out(big)
    rec.record_out(big)
    assert rec.path.stat().st_size == rec.bytes_written
    assert len(read_log(rec.path)[1]) == 52
    # However small the records, one write never takes more than IOV_MAX pieces.
    before = rec.bytes_written
    for _ in range(600):
        rec.record_out(b"\x10\x01")
    assert before < rec.path.stat().st_size == rec.bytes_written  # written before the tick ended
    await asyncio.sleep(0)
    assert len(read_log(rec.path)[1]) == 652
    # A mutable buffer is copied: changing it afterwards does not change the record.
    scratch = bytearray(b"\x10\x02")
    rec.record_in(scratch)
    scratch[1] = 0x7F
    rec.flush()
    assert read_log(rec.path)[1][-1].envelope == b"\x10\x02"
    # A frame as the sink writes it (varint prefix) is recorded without the prefix.
    small = wire_events.encode_shell_output(1, 2, "r", "y" * 300, None, None, False)  # copied
    large = wire_events.encode_shell_output(1, 2, "r", "z" * 30_000, None, None, False)  # kept as a view
    rec.record_out_frame(small)
    rec.record_out_frame(large)
    rec.close()
    rec.close()
    records = read_log(rec.path)[1]
    assert records[-2].envelope == small[2:] and records[-2].parse().event.shell_output.stdout == "y" * 300
    assert records[-1].envelope == large[3:] and records[-1].parse().event.shell_output.stdout == "z" * 30_000
    rec.record_out(big)  # after close: ignored, never raises
    assert len(read_log(rec.path)[1]) == 655 and rec.records == 655


async def test_flush_delay_batches_over_several_ticks(tmp_path: pathlib.Path) -> None:
    rec = SessionRecorder.open(tmp_path, session_id="delay", protocol_version=1, service_id="svc", flush_delay=0.05)
    rec.record_out(envelope(1))
    await asyncio.sleep(0)
    rec.record_out(envelope(2))
    assert read_log(rec.path)[1] == []
    await asyncio.sleep(0.2)
    assert [r.envelope for r in read_log(rec.path)[1]] == [envelope(1), envelope(2)]
    rec.close()


def test_v0_sessions_are_recorded_as_v1_envelopes(tmp_path: pathlib.Path) -> None:
    codec = JsonlCodec()
    with SessionRecorder.open(tmp_path, session_id="v0", protocol_version=0, service_id="svc") as rec:
        command = codec.decode_command(b'{"type":"Handshake","data":{"version":0,"capabilities":["shell_exec"]}}')
        rec.record_command(command)
        rec.record_event(codec.decode_event(b'{"type":"Log","data":{"level":"Info","message":"m","timestamp":5,"request_id":null}}'))
    header, records, _ = read_log(rec.path)
    assert header.protocol_version == 0
    first, second = (r.parse() for r in records)
    assert first.command.handshake.capabilities == [pb.CAPABILITY_SHELL_EXEC] and first.sequence == 1
    assert second.event.log.message == "m" and second.sequence == 1 and second.timestamp > 0


# ---- write failures ------------------------------------------------------------------------------------

_FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys
    from smith_fast import events
    from smith_fast.replay import SessionRecorder, read_log
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # RLIMIT_FSIZE: EFBIG instead of a kill
    if len(sys.argv) > 2:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    errors = []
    rec = SessionRecorder.open(sys.argv[1], session_id="full", protocol_version=1, service_id="svc",
                               flush_bytes=8192, on_error=errors.append)
    session_events = 0
    for i in range(2000):  # ~1 MB of records: far more than fits
        rec.record_out(events.encode_shell_output(i, i + 1, "r", "z" * 500, None, None, False, framed=False))
        session_events += 1  # the session goes on whatever the recorder met
    rec.close()
    header, records, torn = read_log(rec.path)
    print(json.dumps({"error": rec.error, "callbacks": errors, "active": rec.active, "accepted": rec.records,
                      "read": len(records), "torn": torn and torn.reason, "session_events": session_events,
                      "sequences": [r.parse().sequence for r in records]}))
    """
)


def _check_full_disk(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["session_events"] == 2000
    assert out["error"] and reason in out["error"] and "the session goes on" in out["error"]
    assert out["callbacks"] == [out["error"]]
    assert not out["active"]
    assert 0 < out["read"] < 2000
    assert out["torn"] is None  # the partial batch was cut off
    assert out["sequences"] == list(range(1, out["read"] + 1))
    assert out["accepted"] >= out["read"]
    assert sum("session recording failed" in line for line in result.stderr.splitlines()) == 1  # logged once


def test_recorder_survives_a_full_disk(tmp_path: pathlib.Path) -> None:
    """A real ENOSPC: a 64 KiB tmpfs mounted in a private mount namespace (as root, or via a user namespace)."""
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK_SCRIPT)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    shell = 'mount -t tmpfs -o size=64k tmpfs "$1" && exec "$2" "$3" "$1"'
    result = subprocess.run(
        ["unshare", "--mount", *userns, "sh", "-c", shell, "sh", str(mnt), sys.executable, str(script)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    _check_full_disk(result, "No space left on device")
    assert list(mnt.iterdir()) == []  # the tmpfs lived only in the child's namespace


def test_recorder_survives_the_file_size_limit(tmp_path: pathlib.Path) -> None:
    """RLIMIT_FSIZE with SIGXFSZ ignored: writes past 100 kB fail with EFBIG."""
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK_SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "logs"), "100000"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    _check_full_disk(result, "File too large")
    (log,) = (tmp_path / "logs").iterdir()
    assert log.stat().st_size <= 100_000


def test_open_fails_loudly_when_the_directory_cannot_be_made(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        SessionRecorder.open(blocker / "sub", session_id="x", protocol_version=1, service_id="svc")


# ---- normalisation and diff --------------------------------------------------------------------------


def _event(**kw) -> pb.Event:  # type: ignore[no-untyped-def]
    return pb.Event(**kw)


def test_normalisation_ignores_what_varies_between_runs() -> None:
    def run(service_id: str, ts: int, duration: int, node: str, chunks: list[str]) -> Transcript:
        evs = [
            _event(ready=pb.ReadyEvent(version=1, service_id=service_id, service_info={"event_loop": str(ts), "service_name": "s"})),
            _event(state_change=pb.StateChangeEvent(request_id="r1", state=pb.SERVICE_STATE_PROCESSING, timestamp=ts)),
            *[_event(shell_output=pb.ShellOutputEvent(request_id="r1", stdout=c)) for c in chunks],
            _event(shell_output=pb.ShellOutputEvent(request_id="r1", exit_code=0, finished=True)),
            _event(tool_result=pb.ToolResultEvent(request_id="r2", success=True, result=b'{"a": 1}', duration_ms=duration)),
            _event(graph_delta=pb.GraphDeltaEvent(request_id="r2", nodes_added=[pb.GraphNode(id=node, label="n")])),
            _event(log=pb.LogEvent(message="m", timestamp=ts, fields={"trace_id": str(ts), "k": "v"})),
        ]
        t = Transcript(["r1", "r2"])
        for i, e in enumerate(evs):
            env = pb.Envelope(timestamp=ts + i, sequence=i + ts)
            env.event.CopyFrom(e)
            t.add_envelope(env)
        return t.finish()

    a = run(str(uuid.uuid4()), 1, 5, str(uuid.uuid4()), ["a\nb", "\nc\n"])
    b = run(str(uuid.uuid4()), 99, 7, str(uuid.uuid4()), ["a\n", "b\nc", "\n"])
    assert a.streams == b.streams
    assert diff_transcripts(a, b) == []
    assert a.streams["r1"][1:4] == ['stdout "a\\n"', 'stdout "b\\n"', 'stdout "c\\n"']
    assert a.streams["r2"][0] == 'tool_result {"result": {"json": {"a": 1}}, "success": true}'
    assert '"id": "<id1>"' in a.streams["r2"][1]
    c = run(str(uuid.uuid4()), 1, 5, str(uuid.uuid4()), ["a\nB\nc\n"])
    diff = diff_transcripts(a, c, labels={"r1": "shell_exec 'x'"})
    assert diff[0] == "=== request r1 (shell_exec 'x')"
    assert '-stdout "b\\n"' in diff and '+stdout "B\\n"' in diff


# ---- replays against real services ---------------------------------------------------------------------


def test_the_recorded_session_reads_back(recorded: pathlib.Path) -> None:
    header, records, torn = read_log(recorded)
    assert torn is None
    ins = [r.parse().command.WhichOneof("command_type") for r in records if r.inbound]
    assert ins == ["handshake", "shell_exec", "tool_call", "shell_exec", "tool_call", "tool_call", "shell_exec", "shutdown"]
    outs = [r.parse() for r in records if not r.inbound]
    assert [e.sequence for e in outs] == list(range(1, len(outs) + 1))
    assert any(e.event.WhichOneof("event_type") == "ready" for e in outs)


def test_replay_against_the_same_service_is_identical(recorded: pathlib.Path, server_a: ServerProcess) -> None:
    result = replay_cli(str(recorded), "--against", server_a.unix)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "identical" in result.stdout and "replayed 8 commands" in result.stdout


def test_fast_replay_over_tcp_is_identical(recorded: pathlib.Path, server_a: ServerProcess) -> None:
    start = time.monotonic()
    result = replay_cli(str(recorded), "--against", server_a.tcp, "--fast")
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - start < 30


def test_replay_against_a_changed_service_shows_the_difference(recorded: pathlib.Path, server_b: ServerProcess) -> None:
    result = replay_cli(str(recorded), "--against", server_b.unix, "--fast")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert out.count("(tool_call fs.read)") == 2  # both fs.read requests, nothing else
    assert "-tool_result" in out and "hello from A" in out
    assert "+tool_result" in out and "hello from B" in out
    assert "shell_exec" not in out.split("+++", 1)[1].split("replayed 8 commands")[0]
    assert "the events differ" in out


def test_replay_against_a_spawned_service(recorded: pathlib.Path, roots: dict[str, pathlib.Path]) -> None:
    same = replay_cli(str(recorded), "--spawn", "--fast", "--serve-args", f"--root {roots['a']}")
    assert same.returncode == 0, same.stdout + same.stderr
    smaller = replay_cli(str(recorded), "--spawn", "--fast", "--serve-args", f"--root {roots['a']} --max-output 1000")
    assert smaller.returncode == 1, smaller.stdout + smaller.stderr
    out = smaller.stdout
    assert "=== request" in out and "shell_exec \"head -c 3000" in out
    assert '+stderr "[smith-fast: output truncated after 1000 bytes' in out
    assert "fs.read" not in out


def test_replay_errors_exit_2(recorded: pathlib.Path, tmp_path: pathlib.Path) -> None:
    result = replay_cli(str(recorded), "--against", f"unix:{tmp_path / 'nobody.sock'}")
    assert result.returncode == 2 and "smith-fast replay:" in result.stderr
    bad = tmp_path / "bad.smithrec"
    bad.write_bytes(b"not a log at all")
    result = replay_cli(str(bad), "--print")
    assert result.returncode == 2 and "bad magic" in result.stderr


def test_replay_against_a_grpc_address_is_refused_with_a_message(recorded: pathlib.Path, server_a: ServerProcess) -> None:
    # A grpc: address parses to HOST:PORT text, which replay once spread into open_connection(*target)
    # as characters: a TypeError traceback. Replay re-sends frames over a socket; gRPC has none.
    host, port = server_a.tcp.removeprefix("tcp:").rsplit(":", 1)
    result = replay_cli(str(recorded), "--against", f"grpc:{host}:{port}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"smith-fast replay: cannot replay against grpc:{host}:{port}" in result.stderr
    assert "unix: or tcp:" in result.stderr


def test_print_shows_every_record_and_the_torn_tail(recorded: pathlib.Path, tmp_path: pathlib.Path) -> None:
    records = read_log(recorded)[1]
    result = replay_cli(str(recorded), "--print")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["header"]["session_id"] == "recorded" and lines[0]["header"]["protocol_version"] == 1
    body = lines[1:]
    assert len(body) == len(records)
    assert [x["direction"] for x in body] == ["in" if r.inbound else "out" for r in records]
    assert body[0]["envelope"]["command"]["handshake"] == {"version": 1, "capabilities": ["CAPABILITY_SHELL_EXEC"]}
    assert any(x["envelope"].get("event", {}).get("tool_result") for x in body)
    assert all(isinstance(x["t_ms"], float) for x in body)
    torn = tmp_path / "torn.smithrec"
    torn.write_bytes(recorded.read_bytes()[:-5])
    result = replay_cli(str(torn), "--print")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.returncode == 0
    assert len(lines) == len(records) + 1  # header, all but the last record, the torn-tail line
    assert lines[-1]["torn_tail"]["reason"].startswith("incomplete record")
    assert lines[-1]["torn_tail"]["offset"] == records[-1].position


async def test_replayer_api_paces_like_the_recording(recorded: pathlib.Path, server_a: ServerProcess) -> None:
    header, records, torn = read_log(recorded)
    inbound = [r.offset_ns for r in records if r.inbound]
    span = (inbound[-1] - inbound[0]) / 1e9
    start = time.monotonic()
    result = await Replayer(header, records, torn=torn).against(server_a.unix)
    elapsed = time.monotonic() - start
    assert result.identical, "\n".join(result.differences + result.notes)
    assert result.sent == 8 and result.notes == []
    assert span > 0.2 and elapsed >= span  # recorded pacing: the last command went out no sooner than it did
    assert result.replayed.events == result.recorded.events


async def test_v0_session_replays_over_v0(server_a: ServerProcess, tmp_path: pathlib.Path) -> None:
    codec = JsonlCodec()
    rec = SessionRecorder.open(tmp_path, session_id="v0", protocol_version=0, service_id="?")
    reader, writer = await asyncio.open_unix_connection(server_a.sock_path)
    lines = LineDecoder()
    got: list[pb.Event] = []

    async def until(pred: Callable[[pb.Event], bool]) -> None:
        while not any(pred(e) for e in got):
            for line in lines.feed(await asyncio.wait_for(reader.read(65536), 20)):
                event = codec.decode_event(line)
                rec.record_event(event)
                got.append(event)

    def send(command: pb.Command) -> None:
        rec.record_command(command)
        writer.write(codec.encode_command(command))

    send(codec.decode_command(b'{"type":"Handshake","data":{"version":0,"capabilities":["shell_exec"]}}'))
    await until(lambda e: e.WhichOneof("event_type") == "ready")
    rid = str(uuid.uuid4())
    cmd = pb.Command()
    cmd.shell_exec.request_id, cmd.shell_exec.command = rid, "echo v0; exit 4"
    send(cmd)
    await until(lambda e: e.state_change.request_id == rid and e.state_change.state in _TERMINAL)
    writer.close()
    rec.close()
    header, records, torn = read_log(rec.path)
    result = await Replayer(header, records, fast=True).against(server_a.unix)
    assert result.identical, "\n".join(result.differences + result.notes)
    assert any('"exit_code": 4' in line for line in result.replayed.streams[rid])
    # The same v0 log replayed over v1 differs only where v0 lacks fields (service_info, Ready.version).
    result = await Replayer(header, records, fast=True, protocol=1).against(server_a.unix)
    assert not result.identical
    assert result.differences[0] == "=== session (events of no request)"
    assert rid not in "\n".join(result.differences)


def test_replaying_a_torn_log_replays_what_is_intact(recorded: pathlib.Path, server_a: ServerProcess, tmp_path: pathlib.Path) -> None:
    records = read_log(recorded)[1]
    assert not records[-1].inbound  # the recording ends with the service's last event
    torn = tmp_path / "torn.smithrec"
    torn.write_bytes(recorded.read_bytes()[:-3])
    result = replay_cli(str(torn), "--against", server_a.unix, "--fast")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"note: the log ends in a torn record at byte {records[-1].position}" in result.stderr
    changes = [line for line in result.stdout.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len(changes) == 1 and changes[0].startswith("+")  # the one event the torn record held


def test_command_usage_figures_are_measurements_not_behaviour() -> None:
    """The accounting LogEvent and shell.run's ``usage`` differ in every run: a replay compares what
    they say happened (source, a limit hit), not the figures; v0 (message only) and v1 (fields too) agree."""
    from smith_fast.replay.diff import render_event

    def usage_log(cpu: int, *, limit: str | None = None, fields: bool = True) -> pb.Event:
        figures = {"cpu_user_us": str(cpu), "max_rss_bytes": str(cpu * 7), "source": "cgroup"}
        if limit:
            figures["limit_hit"] = limit
        text = "command usage: " + " ".join(f"{k}={v}" for k, v in figures.items())
        return pb.Event(log=pb.LogEvent(level=pb.LOG_LEVEL_INFO, message=text, fields=figures if fields else {}))

    assert render_event(usage_log(10)) == render_event(usage_log(99)) == render_event(usage_log(5, fields=False))
    assert render_event(usage_log(10, limit="--max-cpu-per-command")) != render_event(usage_log(10))
    assert "limit_hit=--max-cpu-per-command" in render_event(usage_log(3, limit="--max-cpu-per-command"))

    def result(cpu: int) -> pb.Event:
        body = {"exit_code": 0, "usage": {"cpu_user_us": cpu, "source": "cgroup", "limit_hit": None}}
        return pb.Event(tool_result=pb.ToolResultEvent(request_id="r", success=True, result=json.dumps(body).encode()))

    assert render_event(result(1)) == render_event(result(2))
    assert '"source": "cgroup"' in render_event(result(1))
