"""Start-up: from spawning a stdio server to its first answer, each contender side by side in one run.

``python -m bench.bench_start [--quick] [--json PATH] [--baseline DIR]``; ``make bench`` runs it too
and puts its figures in the report (``bench/report/start.py``, and a row of the summary table). A
frontend (an MCP client, an agent's harness) spawns its server and waits: this is that wait. Each
start is a fresh process, spawned by ``subprocess.Popen`` with its stdin and stdout on pipes, and
the clock runs from just before the spawn to the moment the answer's line or frame is read:

* ``mcp``: ``smith-fast serve --mcp``: ``initialize`` answered (``first answer``), then a
  ``tools/call`` of ``fs.read`` on the report's 72 B file answered (``first call``).
* ``v1``: ``smith-fast serve --stdio``, v1 frames: the handshake's Ready (``first answer``), then
  the same ``fs.read`` answered (``first call``).
* ``mcp-sdk``: the official MCP SDK's server (``bench/mcp_sdk_server.py``), the same two requests
  (``read_file``).
* ``floor``: the bare stdlib loop (``bench/report/floor_server.py``): it has no handshake, so its
  first answer is the ``fs.read`` itself.

Every smith-fast server is run as ``python -m smith_fast`` from a source tree (this one, and with
``--baseline DIR`` another checkout too: ``mcp@base``, ``v1@base``), so a change and what it
changed from are measured in the same run. The repetitions are interleaved, the order rotating
from one to the next, so a burst of load from elsewhere falls on every contender alike. Figures:
medians and ranges in milliseconds, and each contender's ratio to ``mcp`` (> 1: ``mcp`` starts
faster).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

from .report.stats import summarize
from .report.workloads import SMALL, SMALL_TEXT

__all__ = ["SCALES", "StartScale", "STARTERS", "Starter", "main", "measure", "render", "starters"]

PROG = "python -m bench.bench_start"
REPO = pathlib.Path(__file__).resolve().parent.parent
PROTOCOL_VERSION = "2025-11-25"
TIMEOUT = 30.0  # seconds: a server that does not answer fails the run instead of hanging it


@dataclass(frozen=True)
class StartScale:
    name: str
    reps: int
    warmups: int


SCALES = {
    "smoke": StartScale("smoke", reps=2, warmups=1),
    "quick": StartScale("quick", reps=9, warmups=1),
    "full": StartScale("full", reps=15, warmups=2),
}


class _Pipes:
    """A spawned server's pipes, read without Python's buffering games: whole lines or frames."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc, self.stdin, self.stdout = proc, proc.stdin, proc.stdout
        self.frames = FrameDecoder()
        self.pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.stdin.write(data)
        self.stdin.flush()

    def line(self) -> dict[str, Any]:
        """The next JSON-RPC message that carries an id (notifications and logs skipped)."""
        while True:
            raw = self.stdout.readline()
            if not raw:
                raise RuntimeError(f"pid {self.proc.pid} closed its stdout before answering")
            message = json.loads(raw)
            if "id" in message:
                return dict(message)

    def envelope(self) -> pb.Envelope:
        while not self.pending:
            data = os.read(self.stdout.fileno(), 1 << 16)
            if not data:
                raise RuntimeError(f"pid {self.proc.pid} closed its stdout before answering")
            self.pending.extend(self.frames.feed(data))
        return pb.Envelope.FromString(self.pending.pop(0))


def _rpc(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n"


_INITIALIZE = _rpc(1, "initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                     "clientInfo": {"name": "smith-fast-bench-start", "version": "0"}})
_INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode() + b"\n"


def _checked(message: dict[str, Any], what: str) -> dict[str, Any]:
    result = message.get("result")
    if not isinstance(result, dict) or result.get("isError"):
        raise RuntimeError(f"{what}: {str(message)[:300]}")
    return result


def _mcp_talk(tool: str) -> Callable[[_Pipes], tuple[float, float]]:
    """MCP: initialize answered, then a ``tools/call`` of ``tool`` on the small file answered."""
    def talk(pipes: _Pipes) -> tuple[float, float]:
        pipes.write(_INITIALIZE)
        _checked(pipes.line(), "initialize")
        first = time.perf_counter()
        pipes.write(_INITIALIZED + _rpc(2, "tools/call", {"name": tool, "arguments": {"path": SMALL}}))
        if SMALL_TEXT.splitlines()[0] not in json.dumps(_checked(pipes.line(), tool)):
            raise RuntimeError(f"{tool} did not answer the file's text")
        return first, time.perf_counter()

    return talk


def _floor_talk(pipes: _Pipes) -> tuple[float, float]:
    pipes.write(_rpc(1, "tools/call", {"name": "fs.read", "arguments": {"path": SMALL}}))
    _checked(pipes.line(), "fs.read")
    now = time.perf_counter()
    return now, now


def _v1_talk(pipes: _Pipes) -> tuple[float, float]:
    """v1 frames: the handshake's Ready, then ``fs.read`` of the small file answered."""
    env = pb.Envelope()
    env.command.handshake.version = 1
    pipes.write(encode_frame(env.SerializeToString()))
    while (kind := pipes.envelope().event.WhichOneof("event_type")) != "ready":  # StateChange STARTING first
        if kind == "error":
            raise RuntimeError("the handshake was refused")
    first = time.perf_counter()
    env = pb.Envelope()
    env.command.tool_call.request_id = "b4f2a3c0-6f1e-4d7b-9a2e-1c5d8e7f6a90"
    env.command.tool_call.tool = "fs.read"
    env.command.tool_call.args = json.dumps({"path": SMALL}).encode()
    pipes.write(encode_frame(env.SerializeToString()))
    while True:
        got = pipes.envelope()
        kind = got.event.WhichOneof("event_type")
        if kind == "tool_result":
            if not got.event.tool_result.success:
                raise RuntimeError(f"fs.read failed: {got.event.tool_result.error}")
            return first, time.perf_counter()
        if kind == "error":
            raise RuntimeError(f"fs.read: {got.event.error}")


@dataclass(frozen=True)
class Starter:
    """One way of starting a stdio server and asking it for its first answers.

    Attributes:
        name: as in the report's contenders (``@base``: the baseline tree's).
        argv: the command line (``{python}``, ``{root}``, ``{repo}`` filled in).
        talk: the conversation: returns the clock at the first answer and at the first call's answer.
        cwd: where it runs (a smith-fast tree: ``python -m smith_fast`` imports that tree's package).
    """

    name: str
    argv: tuple[str, ...]
    talk: Callable[[_Pipes], tuple[float, float]]
    cwd: pathlib.Path = REPO

    def once(self, root: pathlib.Path) -> tuple[float, float]:
        """One start: seconds from the spawn to the first answer and to the first call's answer."""
        argv = [part.format(python=sys.executable, root=root, repo=REPO) for part in self.argv]
        # bytecode cached, as an installed package has it (pip compiles it): without it each start
        # compiles every module again (PYTHONDONTWRITEBYTECODE in a test environment)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["SMITH_FAST_NO_EXTENSIONS"] = ""
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                cwd=self.cwd, env=env)
        hung = threading.Timer(TIMEOUT, proc.kill)  # a server that never answers ends the run, not hangs it
        hung.start()
        try:
            first, call = self.talk(_Pipes(proc))
        finally:
            hung.cancel()
            _end(proc)
        return first - start, call - start


def _end(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_SMITH = ("{python}", "-m", "smith_fast", "serve", "--root", "{root}", "--log-level", "warning")
STARTERS: tuple[Starter, ...] = (
    Starter("mcp", (*_SMITH, "--mcp"), _mcp_talk("fs.read")),
    Starter("v1", (*_SMITH, "--stdio"), _v1_talk),
    Starter("mcp-sdk", ("{python}", "{repo}/bench/mcp_sdk_server.py", "{root}"), _mcp_talk("read_file")),
    Starter("floor", ("{python}", "{repo}/bench/report/floor_server.py", "{root}"), _floor_talk),
)


def starters(baseline: pathlib.Path | None = None) -> list[Starter]:
    """:data:`STARTERS`, and this tree's smith-fast starters run from ``baseline`` as ``NAME@base``."""
    out = list(STARTERS)
    if baseline is not None:
        out += [Starter(f"{s.name}@base", s.argv, s.talk, baseline.resolve()) for s in STARTERS if s.argv[: len(_SMITH)] == _SMITH]
    return out


def measure(scale: StartScale, say: Callable[[str], None] | None = None,
            who: Sequence[Starter] | None = None) -> dict[str, Any]:
    """Start every starter ``scale.warmups + scale.reps`` times, interleaved; the JSON-ready result."""
    tell = say or (lambda line: print(line, file=sys.stderr, flush=True))
    chosen = list(who if who is not None else STARTERS)
    times: dict[str, dict[str, list[float]]] = {s.name: {"first answer ms": [], "first call ms": []} for s in chosen}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="smith-fast-bench-start-", dir="/var/tmp") as tmp:
        root = pathlib.Path(tmp)
        (root / SMALL).write_text(SMALL_TEXT)
        for r in range(scale.warmups + scale.reps):
            shift = r % len(chosen)
            for starter in chosen[shift:] + chosen[:shift]:
                first, call = starter.once(root)
                if r >= scale.warmups:
                    times[starter.name]["first answer ms"].append(first * 1e3)
                    times[starter.name]["first call ms"].append(call * 1e3)
    result: dict[str, Any] = {"scale": scale.name, "reps": scale.reps, "contenders": {},
                              "load_average": [round(x, 2) for x in load]}
    for name, figures in times.items():
        result["contenders"][name] = {key: {"median": summarize(values).median, "low": min(values),
                                            "high": max(values), "all": [round(v, 2) for v in values]}
                                      for key, values in figures.items()}
    tell(f"{len(chosen)} starters x {scale.warmups + scale.reps} starts done")
    return result


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines: a table, and each contender's ratio to ``mcp``."""
    got = result["contenders"]
    out = [f"start -> first answer ({result['scale']}, {result['reps']} interleaved repetitions, medians and ranges, ms)",
           f"  {'contender':12s} {'first answer':>22s} {'first call':>22s}  vs mcp (first answer)"]
    base = got.get("mcp", {}).get("first answer ms", {}).get("median")
    for name, figures in got.items():
        cells = [f"{f['median']:7.1f} ({f['low']:.0f}-{f['high']:.0f})" for f in figures.values()]
        ratio = f"x{figures['first answer ms']['median'] / base:.2f}" if base else ""
        out.append(f"  {name:12s} {cells[0]:>22s} {cells[1]:>22s}  {ratio}")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="scale", action="store_const", const="quick", help="fewer repetitions")
    size.add_argument("--smoke", dest="scale", action="store_const", const="smoke", help="two repetitions")
    p.set_defaults(scale="full")
    p.add_argument("--json", type=pathlib.Path, metavar="PATH", help="write the figures there as JSON")
    p.add_argument("--baseline", type=pathlib.Path, metavar="DIR",
                   help="another smith-fast source tree (a checkout of main) whose servers start beside these")
    p.add_argument("--only", help="comma list of contenders (default all)")
    args = p.parse_args(argv)
    chosen = starters(args.baseline)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",")}
        chosen = [s for s in chosen if s.name in wanted]
    result = measure(SCALES[args.scale], lambda line: print(line, file=sys.stderr, flush=True), chosen)
    print("\n".join(render(result)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
