"""The end-to-end workloads of the report, at three scales (smoke, quick, full).

Each :class:`Case` is one measured workload (a ladder is several cases of one group). For a
contender's client, :meth:`Case.prepare` builds and encodes every command (not timed) and returns
the function that runs one repetition and returns its figures. The runner times nothing itself:
each repetition's figures come from the drivers' timed regions, and the runner adds the server's
CPU time per unit of work (``_work`` in the figures) from ``/proc``.

Workloads (the issue's list; :func:`cases` gives their sizes per scale):

* ``mixed``: one session runs a test-runner-like command (``awk`` printing short PASSED lines on
  stdout with a warning on stderr every 8th line) while pipelining ``fs.read`` calls of a 72 B and
  a 4 KiB file beside it, 32 in flight: ShellOutput, ToolResult and StateChange events interleaved
  on one stream. Its servers run with ``--chunk-size 128``, so the output travels as line-sized
  events (~1 per 2.5 lines) whatever the pipe timing: with the default 64 KiB chunks the event
  count followed the race between the command's writes and the server's reads (a server that
  keeps up reads smaller pieces, so it gets more events), and the repetitions varied 5x. Figures:
  time until the last request ended, and events/s. (``fs.list`` was left out: it runs in a worker
  thread, and the thread pool's wake-ups, not the wire, then set the pace.)
* ``lines``: ``seq 1000000``, 1,000,000 short lines (6.9 MB): MB/s delivered and time to the
  final event.
* ``bulk``: ``yes`` text cut by ``head -c``: MB/s delivered.
* ``seq``: ``seq 200000`` (1.3 MB), the MCP issue's command workload: an MCP server returns the
  whole output in one result (the MCP front with ``--tool-max-output 16M``, so nothing is cut).
* ``spawn``: sequential ``ShellExec`` of ``true``, one at a time: p50 from the request to its final
  event (process start and exit).
* ``latency``: sequential ``fs.read`` calls of a 72 B file, one in flight: p50 and p99.
* ``pipelined``: ``fs.read`` calls of the 72 B file, 256 in flight: calls/s.
* ``sessions-N``: the same total of calls spread over N concurrent sessions, 32 in flight in each.
* ``size-S``: pipelined ``fs.read`` of an S-byte file, 64 in flight: calls/s and MB/s of file
  content.
* ``chunk-S``: bulk output from a server started with ``--chunk-size S``, so every ShellOutput
  event carries S bytes: MB/s and events/s.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass

from .contenders import Client
from .drivers import Tracker, request_ids
from .stats import percentile
from .wire import shell_exec_command, tool_call_command

__all__ = ["Case", "Metric", "Scale", "SCALES", "cases", "make_workspace"]

Figures = dict[str, float]
Rep = Callable[[], Figures]

SMALL = "small.txt"
SMALL_TEXT = "hello, smith-fast\n" * 4  # 72 bytes
MEDIUM = "medium.txt"
YES_LINE = "smith-fast bulk output: the quick brown fox jumps over the lazy dog"


@dataclass(frozen=True)
class Metric:
    """One figure of a case: its key in the figures, unit, and which direction is better."""

    key: str
    unit: str
    higher_is_better: bool = True


@dataclass(frozen=True)
class Scale:
    """The sizes of every workload at one scale, and how often each is repeated."""

    name: str
    reps: int
    warmups: int
    mixed_lines: int
    mixed_calls: int
    lines: int
    bulk: int
    rt_calls: int
    pipe_calls: int
    sessions: tuple[int, ...]
    session_total: int
    sizes: tuple[int, ...]
    size_calls: int
    chunks: tuple[int, ...]
    chunk_events: int
    chunk_cap: int
    seq_lines: int
    spawns: int


KIB, MIB = 1 << 10, 1 << 20
SCALES: dict[str, Scale] = {
    "smoke": Scale("smoke", reps=2, warmups=1, mixed_lines=200, mixed_calls=20, lines=2000, bulk=256 * KIB,
                   rt_calls=20, pipe_calls=100, sessions=(1, 4), session_total=40, sizes=(16, 4 * KIB),
                   size_calls=20, chunks=(256, 64 * KIB), chunk_events=64, chunk_cap=1 * MIB, seq_lines=2000, spawns=5),
    # quick: the fewest repetitions that give a median and a range (3), each several times longer
    # than they were (300-call repetitions lasted ~50 ms, so one scheduler hiccup on a shared
    # machine moved the figure by half), paid for by shorter ladders
    "quick": Scale("quick", reps=3, warmups=1, mixed_lines=20_000, mixed_calls=600, lines=1_000_000,
                   bulk=32 * MIB, rt_calls=1000, pipe_calls=4000, sessions=(1, 100), session_total=2000,
                   sizes=(16, 64 * KIB), size_calls=500, chunks=(256, 64 * KIB), chunk_events=2048,
                   chunk_cap=8 * MIB, seq_lines=200_000, spawns=100),
    "full": Scale("full", reps=5, warmups=1, mixed_lines=30_000, mixed_calls=1000, lines=1_000_000,
                  bulk=128 * MIB, rt_calls=1000, pipe_calls=4000, sessions=(1, 10, 100), session_total=2000,
                  sizes=(16, 256, 4 * KIB, 16 * KIB, 64 * KIB), size_calls=500, chunks=(64, 1 * KIB, 16 * KIB, 64 * KIB),
                  chunk_events=4096, chunk_cap=16 * MIB, seq_lines=200_000, spawns=200),
}
DEFAULT_CHUNK = 64 * KIB  # the server's default --chunk-size: chunk cases of this size use the main servers
MIXED_CHUNK = 128


@dataclass(frozen=True)
class Case:
    """One measured workload.

    Attributes:
        key: unique key (``size-4096``).
        group: ``mixed``, ``lines``, ``bulk``, ``latency``, ``pipelined``, ``sessions``, ``size``, ``chunk``.
        title: what it is, for tables.
        param: the ladder's parameter (sessions, bytes), 0 elsewhere.
        metrics: the figures shown; the first is the headline.
        cpu: how the server's CPU time is shown: (figure key, scale per unit of ``_work``).
        server_args: extra ``serve`` arguments this case needs (its own servers when not empty).
        prepare: ``prepare(client, root) -> rep``.
    """

    key: str
    group: str
    title: str
    param: int
    metrics: tuple[Metric, ...]
    cpu: tuple[str, float]
    prepare: Callable[[Client, pathlib.Path], Rep]
    server_args: tuple[str, ...] = ()


def make_workspace(root: pathlib.Path, scale: Scale) -> None:
    """The files the tool calls read: the small and medium files and the size ladder's files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / SMALL).write_text(SMALL_TEXT)
    (root / MEDIUM).write_text(("medium file line of text, 4 KiB in all " * 120)[: 4 * KIB])
    for size in scale.sizes:
        (root / f"size-{size}.txt").write_text((YES_LINE + "\n") * (size // (len(YES_LINE) + 1) + 1))
        with open(root / f"size-{size}.txt", "r+b") as f:
            f.truncate(size)


def _read(path: str) -> bytes:
    return b'{"path":"%s"}' % path.encode()


def _cpu_us_per_call() -> tuple[str, float]:
    return ("server CPU µs/call", 1e6)


def _pipelined(tool_args: list[tuple[str, bytes]], calls: int, window: int, size: int = 0) -> Callable[[Client, pathlib.Path], Rep]:
    def prepare(client: Client, root: pathlib.Path) -> Rep:
        rids = request_ids(calls)
        units = client.encode([tool_call_command(r, *tool_args[i % len(tool_args)]) for i, r in enumerate(rids)])

        def rep() -> Figures:
            seconds = client.pipeline(units, Tracker(rids), window)
            out = {"calls/s": calls / seconds, "_work": calls}
            if size:
                out["MB/s"] = calls * size / seconds / 1e6
            return out

        return rep

    return prepare


def _sessions(n: int, total: int) -> Callable[[Client, pathlib.Path], Rep]:
    per = max(1, total // n)

    def prepare(client: Client, root: pathlib.Path) -> Rep:
        rids = [request_ids(per) for _ in range(n)]
        units = [client.encode([tool_call_command(r, "fs.read", _read(SMALL)) for r in mine]) for mine in rids]

        def rep() -> Figures:
            seconds = client.pipeline_many(units, [Tracker(mine) for mine in rids], 32)
            return {"calls/s": n * per / seconds, "_work": n * per}

        return rep

    return prepare


def _latency(count: int) -> Callable[[Client, pathlib.Path], Rep]:
    def prepare(client: Client, root: pathlib.Path) -> Rep:
        rid = request_ids(1)[0]
        unit = client.encode([tool_call_command(rid, "fs.read", _read(SMALL))])[0]

        def rep() -> Figures:
            times = sorted(client.round_trips(unit, rid, count))
            return {"p50 µs": percentile(times, 0.5) * 1e6, "p99 µs": percentile(times, 0.99) * 1e6, "_work": count}

        return rep

    return prepare


def _shell(command: str, expected: int) -> Callable[[Client, pathlib.Path], Rep]:
    def prepare(client: Client, root: pathlib.Path) -> Rep:
        rid = request_ids(1)[0]
        units = client.encode([shell_exec_command(rid, command)])

        def rep() -> Figures:
            tracker = Tracker((), (rid,))
            seconds = client.pipeline(units, tracker, 1)
            if tracker.output != expected:
                raise AssertionError(f"{command!r}: {tracker.output} characters delivered, {expected} expected")
            return {"MB/s": expected / seconds / 1e6, "final ms": seconds * 1e3, "events/s": tracker.events / seconds,
                    "events": tracker.events, "_work": expected / 1e6}

        return rep

    return prepare


def _spawns(command: str, count: int) -> Callable[[Client, pathlib.Path], Rep]:
    def prepare(client: Client, root: pathlib.Path) -> Rep:
        rids = request_ids(count)
        units = client.encode([shell_exec_command(r, command) for r in rids])

        def rep() -> Figures:
            times = sorted(client.pipeline([unit], Tracker((), (rid,)), 1) for unit, rid in zip(units, rids))
            return {"p50 ms": percentile(times, 0.5) * 1e3, "calls/s": count / sum(times), "_work": count}

        return rep

    return prepare


def _mixed(lines: int, calls: int) -> Callable[[Client, pathlib.Path], Rep]:
    awk = ("awk 'BEGIN{for(i=1;i<=%d;i++){printf \"tests/test_%%05d.py::test_case PASSED [%%3d%%%%]\\n\", i, 100*i/%d;"
           " if(i%%8==0) printf \"warning: slow test %%d took 0.%%03ds\\n\", i, i%%1000 > \"/dev/stderr\"}}'") % (lines, lines)
    kinds = [("fs.read", _read(SMALL)), ("fs.read", _read(MEDIUM))]

    def prepare(client: Client, root: pathlib.Path) -> Rep:
        shell_rid, *rids = request_ids(calls + 1)
        commands = [shell_exec_command(shell_rid, awk)]
        commands += [tool_call_command(r, *kinds[i % len(kinds)]) for i, r in enumerate(rids)]
        units = client.encode(commands)

        def rep() -> Figures:
            tracker = Tracker(rids, (shell_rid,))
            seconds = client.pipeline(units, tracker, 33)
            return {"final ms": seconds * 1e3, "events/s": tracker.events / seconds, "events": tracker.events,
                    "_work": 1}

        return rep

    return prepare


def _yes(n: int) -> str:
    return f"yes '{YES_LINE}' | head -c {n}"


def cases(scale: Scale) -> list[Case]:
    """Every case at ``scale``, in the order they run: those needing their own servers last, grouped."""
    per_mb = ("server CPU ms/MB", 1e3)
    out = [
        Case("mixed", "mixed", f"mixed stream: {scale.mixed_lines:,} lines + {scale.mixed_calls:,} tool calls", 0,
             (Metric("final ms", "ms", False), Metric("events/s", "events/s")), ("server CPU ms/run", 1e3),
             _mixed(scale.mixed_lines, scale.mixed_calls), ("--chunk-size", str(MIXED_CHUNK))),
        Case("lines", "lines", f"`seq {scale.lines}`", 0, (Metric("MB/s", "MB/s"), Metric("final ms", "ms", False)),
             per_mb, _shell(f"seq {scale.lines}", sum(len(str(i)) + 1 for i in range(1, scale.lines + 1)))),
        Case("bulk", "bulk", f"bulk output, {_bytes(scale.bulk)}", 0, (Metric("MB/s", "MB/s"),), per_mb,
             _shell(_yes(scale.bulk), scale.bulk)),
        Case("seq", "seq", f"`seq {scale.seq_lines}`, whole output", 0,
             (Metric("final ms", "ms", False), Metric("MB/s", "MB/s")), per_mb,
             _shell(f"seq {scale.seq_lines}", sum(len(str(i)) + 1 for i in range(1, scale.seq_lines + 1)))),
        Case("spawn", "spawn", f"{scale.spawns:,} sequential `true`", 0,
             (Metric("p50 ms", "ms", False), Metric("calls/s", "calls/s")), _cpu_us_per_call(),
             _spawns("true", scale.spawns)),
        Case("latency", "latency", f"round trip, {scale.rt_calls:,} sequential fs.read", 0,
             (Metric("p50 µs", "µs", False), Metric("p99 µs", "µs", False)), _cpu_us_per_call(), _latency(scale.rt_calls)),
        Case("pipelined", "pipelined", f"{scale.pipe_calls:,} pipelined fs.read, 256 in flight", 0,
             (Metric("calls/s", "calls/s"),), _cpu_us_per_call(),
             _pipelined([("fs.read", _read(SMALL))], scale.pipe_calls, 256)),
    ]
    for n in scale.sessions:
        out.append(Case(f"sessions-{n}", "sessions", f"{n} sessions x {max(1, scale.session_total // n):,} calls", n,
                        (Metric("calls/s", "calls/s"),), _cpu_us_per_call(), _sessions(n, scale.session_total)))
    for size in scale.sizes:
        out.append(Case(f"size-{size}", "size", f"fs.read of {_bytes(size)}", size,
                        (Metric("calls/s", "calls/s"), Metric("MB/s", "MB/s")), _cpu_us_per_call(),
                        _pipelined([("fs.read", _read(f"size-{size}.txt"))], scale.size_calls, 64, size)))
    for size in sorted(scale.chunks, key=lambda s: (s != DEFAULT_CHUNK, s)):
        total = min(size * scale.chunk_events, scale.chunk_cap)
        args = () if size == DEFAULT_CHUNK else ("--chunk-size", str(size))
        out.append(Case(f"chunk-{size}", "chunk", f"{_bytes(total)} in {_bytes(size)} ShellOutput chunks", size,
                        (Metric("MB/s", "MB/s"), Metric("events/s", "events/s")), per_mb, _shell(_yes(total), total),
                        args))
    return sorted(out, key=lambda c: c.server_args != ())  # stable: the main servers' cases first


def _bytes(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"

