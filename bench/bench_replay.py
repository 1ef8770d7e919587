"""Session recording: its cost per envelope, and on a real shell-output stream.

Run: ``.venv/bin/pytest bench/bench_replay.py --benchmark-only -p no:cacheprovider``.

* ``record per envelope``: the service's own per-event work (``encode_shell_output``) with and
  without ``SessionRecorder.record_out_frame`` of the result, 1,000 envelopes per call, the log on
  the temp directory's file system (buffer written at 64 KiB, as without a loop tick).
* ``shell-output stream``: a real ``smith-fast serve`` streams 16 MiB of output in 1,024 ShellOutput
  envelopes over its Unix socket to an asyncio (uvloop) client that decodes every frame; ``[recorded]``
  also records each one with a SessionRecorder flushed once per loop tick, exactly what a recording
  service adds per outbound envelope. (Client-side, because the service's ``--record`` is wired in
  separately; the per-envelope work is the same.)
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest
import uvloop

from smith_fast import events
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb
from smith_fast.replay import SessionRecorder, read_log
from tests.server import ServerProcess

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
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("bench-replay"), "--chunk-size", str(CHUNK)).start()
    yield srv
    srv.stop()


async def _stream(path: str, recorder: SessionRecorder | None) -> int:
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
    decoder = FrameDecoder(1 << 26)
    record = recorder.record_out if recorder is not None else None

    def send(command: pb.Command) -> None:
        env = pb.Envelope()
        env.command.CopyFrom(command)
        raw = env.SerializeToString()
        if recorder is not None:
            recorder.record_in(raw)
        writer.write(encode_frame(raw))

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
    done = False
    while not done:
        data = await reader.read(1 << 20)
        if not data:
            raise EOFError("the service closed the connection")
        for frame in decoder.feed(data):
            if record is not None:
                record(frame)
            envelopes += 1
            event = pb.Envelope.FromString(frame).event
            kind = event.WhichOneof("event_type")
            if kind == "shell_output":
                received += len(event.shell_output.stdout)
            elif kind == "state_change" and event.state_change.request_id and event.state_change.state == pb.SERVICE_STATE_READY:
                done = True
    writer.close()
    assert received == STREAM_BYTES
    return envelopes


@pytest.mark.parametrize("mode", ["plain", "recorded"])
def test_shell_output_stream(benchmark, stream_server: ServerProcess, logdir: pathlib.Path, mode: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"shell-output stream: {STREAM_BYTES >> 20} MiB in {CHUNK >> 10} KiB envelopes, Unix socket"
    loop = uvloop.new_event_loop()
    recorders: list[SessionRecorder] = []
    counts: list[int] = []  # envelopes per run: chunk boundaries follow pipe timing

    def run() -> int:
        rec = None
        if mode == "recorded":
            rec = SessionRecorder.open(logdir, session_id=str(uuid.uuid4()), protocol_version=1, service_id="bench")
            recorders.append(rec)
        try:
            count = loop.run_until_complete(_stream(stream_server.sock_path, rec))
        finally:
            if rec is not None:
                rec.close(fsync=False)
        counts.append(count)
        return count

    try:
        envelopes = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    finally:
        loop.close()
    benchmark.extra_info["envelopes"] = envelopes
    benchmark.extra_info["MiB"] = STREAM_BYTES >> 20
    for rec, count in zip(recorders, counts if recorders else [], strict=True):
        assert rec.error is None
        records = read_log(rec.path)[1]
        assert sum(r.inbound for r in records) == 2 and len(records) == count + 2
