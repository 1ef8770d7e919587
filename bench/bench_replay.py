"""Session recording: its cost per envelope, and on a real shell-output stream.

Run: ``.venv/bin/pytest bench/bench_replay.py --benchmark-only -p no:cacheprovider``.

* ``record per envelope``: the service's own per-event work (``encode_shell_output``) with and
  without ``SessionRecorder.record_out_frame`` of the result, 1,000 envelopes per call, the log on
  the temp directory's file system (buffer written at 64 KiB, as without a loop tick).
* ``shell-output stream``: a real ``smith-fast serve`` streams 16 MiB of output in 16 KiB
  ShellOutput envelopes over its Unix socket to an asyncio (uvloop) client that decodes every frame;
  ``[recorded]`` is the same against a service started with ``--record DIR``, which writes every
  envelope in and out of the session to its log. The summary gives the time and the server's CPU per
  MiB of each, and the recorded log is read back and checked against what the client received.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import uvloop

from harness.server import ServerProcess, beside
from smith_fast import events
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import SessionRecorder, read_log

from ._summary import print_summary
from .report.drivers import cpu_seconds_of

N = 1000
STREAM_BYTES = 16 << 20
CHUNK = 16 << 10


@pytest.fixture
def logdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="bench-replay-"))
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("size", [64, 1024, 16384])
@pytest.mark.parametrize("mode", ["encode", "encode+record (disk)", "encode+record (tmpfs)"])
def test_record_per_envelope(benchmark, logdir: pathlib.Path, size: int, mode: str) -> None:  # type: ignore[no-untyped-def]
    """(disk): the log in the temp directory; (tmpfs): in /dev/shm, the CPU cost without the disk."""
    text = "x" * size
    benchmark.group = f"record per envelope: {size} B of output x {N}"
    benchmark.extra_info["envelopes"] = N
    where = pathlib.Path(tempfile.mkdtemp(prefix="bench-replay-", dir="/dev/shm")) if "tmpfs" in mode else logdir
    rec = SessionRecorder.open(where, session_id=str(uuid.uuid4()), protocol_version=1, service_id="bench")
    encode = events.encode_shell_output

    if mode == "encode":

        def run() -> None:
            for i in range(N):
                encode(i, i, "request", text, None, None, False)

    else:
        record = rec.record_out_frame

        def run() -> None:
            for i in range(N):
                record(encode(i, i, "request", text, None, None, False))

    try:
        benchmark(run)
        rec.close(fsync=False)
        if mode != "encode":
            assert read_log(rec.path)[1][-1].parse().event.shell_output.stdout == text
    finally:
        if where != logdir:
            shutil.rmtree(where)


@pytest.fixture(scope="module")
def stream_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ServerProcess]]:
    plain = ServerProcess(tmp_path_factory.mktemp("bench-stream"), "--chunk-size", str(CHUNK)).start()
    root = tmp_path_factory.mktemp("bench-stream-recorded")
    recorded = ServerProcess(root, "--chunk-size", str(CHUNK), "--record", str(beside(root, "logs"))).start()
    yield {"plain": plain, "recorded": recorded}
    plain.stop()
    recorded.stop()


_stream_figures: dict[str, tuple[float, float]] = {}  # mode -> (best ms, server CPU ms per MiB)


@pytest.fixture(scope="module", autouse=True)
def stream_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    print_summary(request, _stream_lines())


def _stream_lines() -> Iterator[str]:
    if "plain" not in _stream_figures:
        return
    base_ms, base_cpu = _stream_figures["plain"]
    yield ""
    yield f"shell-output stream, {STREAM_BYTES >> 20} MiB, against 'plain':"
    for mode, (ms, cpu) in _stream_figures.items():
        yield f"  {mode:9} best {ms:7.1f} ms ({ms / base_ms:4.2f}x)   server CPU {cpu:6.2f} ms/MiB ({cpu / base_cpu:4.2f}x)"


async def _stream(path: str) -> tuple[int, str | None]:
    """Run the command; the envelopes received, and the session's log (Ready's service_info)."""
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
    decoder = FrameDecoder(1 << 26)

    def send(command: pb.Command) -> None:
        env = pb.Envelope()
        env.command.CopyFrom(command)
        writer.write(encode_frame(env.SerializeToString()))

    hs = pb.Command()
    hs.handshake.version = 1
    hs.handshake.capabilities.append(pb.CAPABILITY_SHELL_EXEC)
    send(hs)
    cmd = pb.Command()
    cmd.shell_exec.request_id = str(uuid.uuid4())
    cmd.shell_exec.command = f"head -c {STREAM_BYTES} /dev/zero"
    send(cmd)
    received = 0
    envelopes = 0
    log: str | None = None
    done = False
    while not done:
        data = await reader.read(1 << 20)
        if not data:
            raise EOFError("the service closed the connection")
        for frame in decoder.feed(data):
            envelopes += 1
            event = pb.Envelope.FromString(frame).event
            kind = event.WhichOneof("event_type")
            if kind == "shell_output":
                received += len(event.shell_output.stdout)
            elif kind == "ready":
                log = event.ready.service_info.get("smith_fast.recording")
            elif kind == "state_change" and event.state_change.request_id and event.state_change.state == pb.SERVICE_STATE_READY:
                done = True
    writer.close()
    await writer.wait_closed()
    assert received == STREAM_BYTES
    return envelopes, log


@pytest.mark.parametrize("mode", ["plain", "recorded"])
def test_shell_output_stream(benchmark, stream_servers: dict[str, ServerProcess], mode: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"shell-output stream: {STREAM_BYTES >> 20} MiB in {CHUNK >> 10} KiB envelopes, Unix socket"
    server = stream_servers[mode]
    loop = uvloop.new_event_loop()
    runs: list[tuple[int, str | None]] = []  # envelopes per run (chunk boundaries follow pipe timing), log
    cpu = 0.0

    def run() -> int:
        nonlocal cpu
        before = cpu_seconds_of(server.pid)
        runs.append(loop.run_until_complete(_stream(server.sock_path)))
        cpu += cpu_seconds_of(server.pid) - before
        return runs[-1][0]

    try:
        envelopes = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    finally:
        loop.close()
    benchmark.extra_info["envelopes"] = envelopes
    benchmark.extra_info["MiB"] = STREAM_BYTES >> 20
    cpu_ms_per_mib = cpu / len(runs) * 1e3 / (STREAM_BYTES >> 20)
    benchmark.extra_info["server_cpu_ms_per_MiB"] = round(cpu_ms_per_mib, 3)
    _stream_figures[mode] = (benchmark.stats.stats.min * 1e3, cpu_ms_per_mib)
    for count, log in runs:
        if mode == "plain":
            assert log is None
            continue
        assert log is not None
        # the log is complete once the service has seen the session end
        deadline = time.monotonic() + 10
        while True:
            records = read_log(pathlib.Path(log))[1]
            if len(records) >= count + 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # in: the handshake and the command; out: everything the client received
        assert sum(r.inbound for r in records) == 2 and len(records) == count + 2, (len(records), count)
