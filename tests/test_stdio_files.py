"""``serve --stdio`` and ``serve --mcp`` with a regular file or ``/dev/null`` on stdin or stdout.

Every combination of pipe, file and ``/dev/null`` on each side, on uvloop and on the stdlib loop,
against the real CLI: ``smith-fast serve --mcp < requests.jsonl > out.jsonl``, ``serve --stdio <
requests.bin > out.bin``, ``< /dev/null``. The event loops watch only pipes, sockets and terminals
(uvloop aborted the process on a file, asyncio refused to start); ``service/stdio.py`` reads and
writes the others itself.

What is checked: the service exits 0 on its own, logs no error, and whatever output can be seen
holds the answers to the requests; a file of requests is run to its end (a command still running
when the file ends finishes: the end of a file is not a peer going away), a pipe's end as before.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from smith_fast.framing import FrameDecoder
from smith_fast.pb import smith_pb2 as pb

from harness.server import ROOT, wait_until

ENDS = ["pipe", "file", "devnull"]
LOOPS = ["uvloop", "asyncio"]

# The command outlives the read of the request file: a front that took the file's end for the
# peer leaving would kill it and never answer.
COMMAND = "sleep 0.3; echo from-the-file"


def _mcp_requests() -> bytes:
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "shell", "arguments": {"command": COMMAND}}},
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _mcp_done(out: bytes) -> bool:
    answers = {m.get("id"): m for m in (json.loads(line) for line in out.splitlines() if line.strip())}
    call = answers.get(2)
    return 1 in answers and "result" in answers[1] and call is not None and "from-the-file" in json.dumps(call.get("result"))


def _frame(seq: int, command: pb.Command) -> bytes:
    env = pb.Envelope(timestamp=int(time.time() * 1000), sequence=seq)
    env.command.CopyFrom(command)
    data = env.SerializeToString()
    return bytes(_VarintBytes(len(data))) + data


def _v1_requests() -> bytes:
    return _frame(1, pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))) + _frame(
        2, pb.Command(shell_exec=pb.ShellExecCommand(request_id="s1", command=COMMAND))
    )


def _v1_done(out: bytes) -> bool:
    envs = [pb.Envelope.FromString(f) for f in FrameDecoder(1 << 20).feed(out)]
    events = [e.event for e in envs if e.HasField("event")]
    stdout = "".join(e.shell_output.stdout for e in events if e.WhichOneof("event_type") == "shell_output")
    ready = any(
        e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == "s1"
        and e.state_change.state == pb.SERVICE_STATE_READY for e in events
    )
    return ready and "from-the-file" in stdout


FRONTS: dict[str, tuple[str, Callable[[], bytes], Callable[[bytes], bool]]] = {
    "mcp": ("--mcp", _mcp_requests, _mcp_done),
    "stdio": ("--stdio", _v1_requests, _v1_done),
}


class _Collected:
    """A pipe's bytes, read by a thread so the service never blocks on a full pipe."""

    def __init__(self, pipe: object) -> None:
        self.data = b""
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: object) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):  # type: ignore[attr-defined]
            self.data += chunk

    def join(self) -> bytes:
        self._thread.join(10)
        return self.data


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("stdout_end", ENDS)
@pytest.mark.parametrize("stdin_end", ENDS)
@pytest.mark.parametrize("front", list(FRONTS))
def test_stdio_ends(tmp_path: pathlib.Path, front: str, stdin_end: str, stdout_end: str, loop: str) -> None:
    flag, requests, done = FRONTS[front]
    data = requests()
    files: list[object] = []
    if stdin_end == "file":
        (tmp_path / "requests").write_bytes(data)
        stdin: object = open(tmp_path / "requests", "rb")  # noqa: SIM115 (closed below)
        files.append(stdin)
    else:
        stdin = subprocess.PIPE if stdin_end == "pipe" else subprocess.DEVNULL
    if stdout_end == "file":
        stdout: object = open(tmp_path / "out", "wb")  # noqa: SIM115 (closed below)
        files.append(stdout)
    else:
        stdout = subprocess.PIPE if stdout_end == "pipe" else subprocess.DEVNULL
    argv = [sys.executable, "-m", "smith_fast", "serve", flag, "--loop", loop, "--log-level", "warning", "--root", str(tmp_path)]
    proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT, env=dict(os.environ))
    for f in files:
        f.close()  # type: ignore[attr-defined]
    collected = _Collected(proc.stdout) if proc.stdout is not None else None
    errors = _Collected(proc.stderr)

    def seen() -> bytes:
        if collected is not None:
            return collected.data
        return (tmp_path / "out").read_bytes() if stdout_end == "file" else b""

    try:
        if proc.stdin is not None:
            proc.stdin.write(data)
            proc.stdin.flush()
            # A pipe's end is the peer going away (--stdio then kills what runs): close it once the
            # answers are out, where they can be seen.
            if front == "stdio" and stdout_end != "devnull":
                assert wait_until(lambda: done(seen()), 20), seen()
            proc.stdin.close()
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = errors.join().decode(errors="replace")
    assert code == 0, stderr
    for line in stderr.splitlines():
        record = json.loads(line)  # nothing but log lines: no traceback, no "cannot start"
        assert record["level"] not in ("error", "critical"), line
    out = collected.join() if collected is not None else seen()
    if stdout_end == "devnull":
        return
    if stdin_end == "devnull":
        assert out == b""  # no request, no answer
    else:
        assert done(out), out
