"""Scale-out by session placement: ``smith-fast gateway`` + ``smith-fast worker``\\ s over a real
nats-server, next to a direct ``smith-fast serve``, all on this machine, in one run.

``python -m bench.bench_nats [--quick] [--json PATH]``; ``make bench`` runs it too and puts its
figures in the report (``bench/report/nats.py``). Every client is the SDK's
(:class:`smith_fast.client.Client`) over a Unix socket; the processes are started as the tests start
them (``harness/nats_cluster.py``), only by their command lines (``gateway --nats URL --unix PATH``,
``worker --nats URL --root DIR``), so the benchmark measures whatever the gateway and the worker do
inside. Three figures, each side by side within the run, as ratios (the machine is shared: compare
within one run, never across runs):

1. **pipelined calls**: ``fs.read`` of the report's 72 B file (``bench/report/workloads.py``), 64
   in flight on one session (as the report's ``pipelined`` case, there with its own driver), through
   ``serve`` and through ``gateway + 1 worker``, repetitions interleaved (the order rotates): calls/s,
   the ratio, and the CPU per call of each process (utime + stime from ``/proc/PID/stat``, summed over
   the measured repetitions, divided by their calls; the client's, this process's, from ``getrusage``). Target:
   >= 0.7x, with the gateway's CPU per call at most ``serve``'s. On few CPUs the relay's extra processes
   take CPU that the client and the worker would use, so the run also states the ceiling that the CPU
   per call of each process puts on the ratio here (:func:`cpu_ceiling`).
2. **scaling**: 16 sessions, each running CPU-bound commands one after another (a ``python3 -c``
   loop of about 50 ms of CPU, calibrated here at the start), through one gateway to 1, 2 and 4
   workers, each worker confined to a quarter of a CPU in a cgroup of its own (``bench/cpu_quota.py``:
   the worker and every command it runs): commands/s at each, and the ratio 4/1 (target >= 3.2).
   Each repetition runs a fixed number of commands per session and ends when the last one has:
   with 16 commands sharing a quarter of a CPU, each takes seconds, and they end in bursts that a
   time window would cut at random. Each worker's CPU in the run (its own and its commands') shows
   how evenly the sessions were placed.
3. **session start**: from ``Client.connect`` to the handshake's Ready, a fresh connection each time,
   through ``serve`` and through ``gateway + 1 worker`` (interleaved): p50 and the ratio (target <= 2x).

It prints a table and the ratios, and writes the figures as JSON with ``--json``. ``--quick`` keeps
the whole run under a minute on 2 cores; the full run takes a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from harness.nats_cluster import Cluster
from harness.server import ServerProcess, SmithProcess
from smith_fast.client import Client

from . import cpu_quota
from ._cli import bench_main
from ._guard import guarded
from .report.stats import percentile
from .report.workloads import SMALL, SMALL_TEXT

__all__ = ["SCALES", "BenchScale", "cpu_bound", "cpu_ceiling", "main", "measure", "render"]

PROG = "python -m bench.bench_nats"
WINDOW = 64
SESSIONS = 16
WORKER_COUNTS = (1, 2, 4)
QUOTA = 0.25  # of one CPU, per worker (cpu.max 25000 100000)
COMMAND_CPU = 0.050  # seconds of CPU each scaling command is calibrated to
SCALING_TARGET = 3.2  # commands/s at 4 workers over 1 worker, at least
RELAY_TARGET = 0.7  # pipelined calls/s through gateway + 1 worker over serve's, at least (and the gateway's CPU per call at most serve's)
START_TARGET = 2.0  # session start p50 through the gateway over serve, at most
_READ_ARGS = b'{"path":"%s"}' % SMALL.encode()
CLIENT = "client"  # the pipelined figure's name for this process's CPU (the SDK client that drives it)
KEEP_LINES = 2000  # stderr lines of each server process kept (its start-up); the rest is drained in big reads
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class BenchScale:
    """The sizes of one run.

    Attributes:
        name: ``quick`` or ``full``.
        calls: pipelined calls per repetition.
        reps: measured repetitions of the pipelined calls (after one warm-up).
        commands: commands per session per scaling repetition.
        scaling_reps: scaling repetitions (each runs every worker count once).
        starts: session starts per topology per round.
        start_rounds: rounds of session starts.
    """

    name: str
    calls: int
    reps: int
    commands: int
    scaling_reps: int
    starts: int
    start_rounds: int


SCALES = {
    "quick": BenchScale("quick", calls=2000, reps=3, commands=2, scaling_reps=1, starts=20, start_rounds=3),
    "full": BenchScale("full", calls=4000, reps=5, commands=3, scaling_reps=3, starts=20, start_rounds=5),
}


# --- processes -----------------------------------------------------------------------------------


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own, waited-for children's) CPU seconds of process ``pid`` so far: utime + stime and
    cutime + cstime from ``/proc/PID/stat`` (10 ms ticks); (0, 0) once it is gone."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK, (int(fields[13]) + int(fields[14])) / _CLK_TCK


@dataclass
class Topology:
    """One running topology: where a client connects and whose CPU is accounted."""

    name: str
    address: str
    pids: dict[str, int]
    stop: Callable[[], object]
    workers: list[SmithProcess] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes] | None] = field(default_factory=dict)

    def gone(self) -> str:
        """Which of its processes ended, and how (empty while all run)."""
        out = []
        for name, proc in self.procs.items():
            code = None if proc is None else proc.poll()
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                out.append(f"{name} (pid {proc.pid if proc else '?'}) {how}")
        return "; ".join(out)


def start_serve(tmp: pathlib.Path, root: pathlib.Path) -> Topology:
    server = ServerProcess(tmp / "serve", log_level="info", tcp=False, root=root, keep=KEEP_LINES)
    (tmp / "serve").mkdir(exist_ok=True)
    server.start(60)
    return Topology("serve", server.unix, {"serve": server.pid}, server.stop, procs={"serve": server.proc})


def launch_cluster(tmp: pathlib.Path, root: pathlib.Path, workers: int, quota: cpu_quota.Quota | None, first: int = 0) -> Cluster:
    """nats-server, ``workers`` workers (each in its own CPU cell when ``quota`` is given, cells
    ``first`` ...) and a gateway, all launched at once; :func:`ready_cluster` waits for them."""
    tmp.mkdir(parents=True, exist_ok=True)
    # the tests' processes log at debug; here that would be measured too (info: little but "ready").
    # With credentials and per-role permissions, as README's deployment: nkeys cost nothing per message.
    # Their stderr kept only as far as start-up (a worker logs a line per request: kept and parsed one
    # by one, that was this process's CPU, counted as the client's, ~10 us per relayed call).
    cluster = Cluster(tmp, workers=workers, log_level="info", worker_args=("--root", str(root)), keep=KEEP_LINES)
    try:
        cluster.nats.start()
        for i in range(workers):
            worker = cluster.make_worker()
            if quota is not None:
                worker.argv[:0] = quota.prefix(first + i)
            worker.launch()
        cluster.gateway.launch()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def ready_cluster(name: str, cluster: Cluster, quota: cpu_quota.Quota | None = None, first: int = 0) -> Topology:
    """Wait until ``cluster`` (from :func:`launch_cluster`) is up and knows its workers."""
    try:
        for proc in [*cluster.workers, cluster.gateway]:
            proc.wait_ready(90)  # a worker confined to a quarter of a CPU imports slowly
        cluster.wait_connected(cluster.count, timeout=90)
    except BaseException:
        cluster.stop()
        raise
    pids = {"gateway": cluster.gateway.pid}
    for i, worker in enumerate(cluster.workers):
        pids[f"worker{i + 1}"] = worker.pid
        if quota is not None:
            quota.adopt(first + i, worker.pid)
    assert cluster.nats.proc is not None
    pids["nats-server"] = cluster.nats.proc.pid
    procs = {"gateway": cluster.gateway.proc, "nats-server": cluster.nats.proc}
    procs.update({f"worker{i + 1}": w.proc for i, w in enumerate(cluster.workers)})
    return Topology(name, cluster.unix, pids, cluster.stop, list(cluster.workers), procs)


async def _session(address: str) -> Client:
    client = await Client.connect(address)
    await client.handshake(timeout=60)
    return client


async def probe(topology: Topology, timeout: float = 60.0) -> None:
    """Read the 72 B file through ``topology`` until it answers right (or raise after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = await _session(topology.address)
            try:
                result = await client.call_tool("fs.read", raw_args=_READ_ARGS)
            finally:
                await client.close()
            if result.success and SMALL_TEXT.encode() in result.result.replace(b"\\n", b"\n"):
                return
            problem = f"fs.read answered {result.error or result.result[:200]!r}"
        except Exception as exc:  # not up yet: the gateway may not have heard of its workers
            problem = f"{type(exc).__name__}: {exc}"
        gone = topology.gone()
        if gone or time.monotonic() > deadline:
            raise RuntimeError(f"{topology.name} does not answer an fs.read: {problem}" + (f" ({gone})" if gone else ""))
        await asyncio.sleep(0.25)


# --- 1. pipelined calls ---------------------------------------------------------------------------


async def pipelined(client: Client, calls: int, window: int) -> float:
    """``calls`` ``fs.read`` calls on ``client``, ``window`` in flight; seconds from the first sent to
    the last answered."""
    per, extra = divmod(calls, window)

    async def lane(n: int) -> None:
        for _ in range(n):
            result = await client.call_tool("fs.read", raw_args=_READ_ARGS)
            if not result.success:
                raise RuntimeError(f"fs.read failed: {result.error}")

    started = time.perf_counter()
    await asyncio.gather(*(lane(per + (i < extra)) for i in range(window)))
    return time.perf_counter() - started


async def measure_pipelined(topologies: list[Topology], scale: BenchScale) -> dict[str, Any]:
    clients = {t.name: await _session(t.address) for t in topologies}
    rates: dict[str, list[float]] = {t.name: [] for t in topologies}
    # the client (this process: the SDK's Client, nothing else runs meanwhile) shares the machine too
    cpu: dict[str, dict[str, float]] = {t.name: dict.fromkeys([*t.pids, CLIENT], 0.0) for t in topologies}
    try:
        for rep in range(scale.reps + 1):  # the first is the warm-up
            order = topologies[rep % len(topologies):] + topologies[: rep % len(topologies)]
            for t in order:
                before = {k: proc_cpu(pid)[0] for k, pid in t.pids.items()}
                own = _own_cpu()
                seconds = await guarded(t, pipelined(clients[t.name], scale.calls, WINDOW), 60 + scale.calls / 100)
                if rep:
                    rates[t.name].append(scale.calls / seconds)
                    cpu[t.name][CLIENT] += _own_cpu() - own
                    for k, pid in t.pids.items():
                        cpu[t.name][k] += proc_cpu(pid)[0] - before[k]
    finally:
        for client in clients.values():
            await client.close()
    calls = scale.calls * scale.reps
    out: dict[str, Any] = {"calls": scale.calls, "window": WINDOW, "reps": scale.reps, "file_bytes": len(SMALL_TEXT)}
    for t in topologies:
        out[t.name] = {"calls_per_s": [round(r) for r in rates[t.name]], "median": statistics.median(rates[t.name]),
                       "cpu_us_per_call": {k: v / calls * 1e6 for k, v in cpu[t.name].items()}}
    first, second = topologies[0].name, topologies[1].name
    out["ratio"] = out[second]["median"] / out[first]["median"]
    out["ratio_of"] = f"{second} / {first}"
    out["target"] = RELAY_TARGET
    relayed, direct = out[second]["cpu_us_per_call"], out[first]["cpu_us_per_call"]
    out["met"] = out["ratio"] >= RELAY_TARGET and relayed.get("gateway", 0.0) <= direct.get("serve", 0.0)
    out["ceiling"] = cpu_ceiling(direct, relayed, os.cpu_count() or 1)
    return out


def cpu_bound(cpu_us_per_call: dict[str, float], cpus: int) -> float:
    """The most calls/s that processes with these CPU costs per call (the client's included) can
    make on ``cpus`` CPUs: all of them together use at most ``cpus`` CPUs, and each at most one
    (nats-server's threads could use more, but it is far from the busiest)."""
    total, most = sum(cpu_us_per_call.values()), max(cpu_us_per_call.values())
    return 1e6 / max(total / cpus, most) if most > 0 else 0.0


def cpu_ceiling(direct: dict[str, float], relayed: dict[str, float], cpus: int) -> dict[str, float]:
    """How far the relay's ratio could go on this machine at the CPU each process spent per call in
    the run: the ratio of the two :func:`cpu_bound`\\ s (``ratio``), and each topology's bound.

    On few CPUs the relay's extra processes (gateway, nats-server) take CPU the client and the
    worker would use: then the relay cannot reach the ratio that its own costs alone would allow,
    and the measured ratio is to be read against this one."""
    bounds = {"direct": cpu_bound(direct, cpus), "relayed": cpu_bound(relayed, cpus)}
    return {**bounds, "ratio": bounds["relayed"] / bounds["direct"] if bounds["direct"] else 0.0, "cpus": cpus}


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --- 3. session start -----------------------------------------------------------------------------


async def session_starts(topologies: list[Topology], scale: BenchScale) -> dict[str, Any]:
    times: dict[str, list[float]] = {t.name: [] for t in topologies}
    for rnd in range(scale.start_rounds + 1):  # the first is the warm-up
        order = topologies[rnd % len(topologies):] + topologies[: rnd % len(topologies)]
        for t in order:
            for _ in range(scale.starts):
                started = time.perf_counter()
                client = await guarded(t, _session(t.address), 60)
                took = time.perf_counter() - started
                await client.close()
                if rnd:
                    times[t.name].append(took)
    out: dict[str, Any] = {"starts": scale.starts * scale.start_rounds, "target": START_TARGET}
    for t in topologies:
        ordered = sorted(times[t.name])
        out[t.name] = {"p50_ms": percentile(ordered, 0.5) * 1e3, "p90_ms": percentile(ordered, 0.9) * 1e3}
    first, second = topologies[0].name, topologies[1].name
    out["ratio"] = out[second]["p50_ms"] / out[first]["p50_ms"]
    out["ratio_of"] = f"{second} / {first}"
    out["met"] = out["ratio"] <= START_TARGET
    return out


# --- 2. scaling -----------------------------------------------------------------------------------


def python3() -> str:
    """The interpreter the commands run: this one's real file (the venv's ``python3`` is a link that
    a sandboxed command may not see, and a ``python3`` on PATH may be a slow shim)."""
    return os.path.realpath(sys.executable)


def command_for(iterations: int) -> str:
    return f"{python3()} -S -c 'for i in range({iterations}): pass'"


def _child_cpu(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def calibrate(target: float = COMMAND_CPU) -> tuple[int, float]:
    """Iterations of the command's loop for ``target`` seconds of CPU in all (start-up included),
    and the CPU seconds it then took here, unconfined and outside the sandbox."""
    exe = python3()
    startup = min(_child_cpu([exe, "-S", "-c", "pass"]) for _ in range(3))
    probe_n = 1_000_000
    per = max(1e-9, (min(_child_cpu([exe, "-S", "-c", f"for i in range({probe_n}): pass"]) for _ in range(2)) - startup) / probe_n)
    iterations = max(10_000, round((target - startup) / per))
    took = statistics.median(_child_cpu([exe, "-S", "-c", f"for i in range({iterations}): pass"]) for _ in range(3))
    return iterations, took


async def scaling_rep(clients: list[Client], command: str, commands: int) -> float:
    """Every session runs ``commands`` commands one after another; seconds until the last ended."""

    async def session(client: Client) -> None:
        for _ in range(commands):
            result = await client.run(command)
            if result.exit_code != 0:
                raise RuntimeError(f"the command failed ({result.exit_code}): {result.stderr[-500:]!r}")

    started = time.perf_counter()
    await asyncio.gather(*(session(c) for c in clients))
    return time.perf_counter() - started


def _children() -> dict[int, list[int]]:
    """Parent pid -> its live children's pids, from one pass over /proc."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                rest = pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if rest[0] != "Z":
                out.setdefault(int(rest[1]), []).append(int(entry))
    return out


def _descendants(children: dict[int, list[int]], pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, ())]
        found += frontier
    return found


async def _watch_cells(topology: Topology, quota: cpu_quota.Quota, first: int, seen: dict[str, int], stop: asyncio.Event) -> None:
    """While commands run, check that each worker's descendants (its commands) are in its cell."""
    while not stop.is_set():
        children = _children()
        for i, worker in enumerate(topology.workers):
            for pid in _descendants(children, worker.pid):
                inside = quota.inside(first + i, pid)
                if inside is not None:
                    seen["inside" if inside else "outside"] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def _worker_cpu(quota: cpu_quota.Quota, index: int, pid: int) -> float:
    """CPU seconds of a worker and its commands (its cell's), else its own and its waited-for children's."""
    used = quota.usage(index)
    return used if used is not None else sum(proc_cpu(pid))


async def measure_scaling(topologies: dict[int, Topology], quota: cpu_quota.Quota, firsts: dict[int, int],
                          scale: BenchScale, command: str) -> dict[str, Any]:
    sessions = {n: [await _session(t.address) for _ in range(SESSIONS)] for n, t in topologies.items()}
    for n, clients in sessions.items():  # the warm-up: a process spawned on every session, at no CPU cost
        await guarded(topologies[n], asyncio.gather(*(c.run("true") for c in clients)), 120)
    rates: dict[int, list[float]] = {n: [] for n in topologies}
    worker_cpu: dict[int, list[float]] = {n: [0.0] * n for n in topologies}
    seen = {"inside": 0, "outside": 0}
    throttled_before = {i: quota.throttled(i) for i in quota.cells}
    counts = list(topologies)
    try:
        for rep in range(scale.scaling_reps):
            for n in counts[rep % len(counts):] + counts[: rep % len(counts)]:
                t = topologies[n]
                before = [_worker_cpu(quota, firsts[n] + i, w.pid) for i, w in enumerate(t.workers)]
                stop = asyncio.Event()
                watcher = asyncio.ensure_future(_watch_cells(t, quota, firsts[n], seen, stop)) if quota.confines else None
                try:
                    expected = SESSIONS * scale.commands * COMMAND_CPU / (n * QUOTA)
                    seconds = await guarded(t, scaling_rep(sessions[n], command, scale.commands), 120 + 10 * expected)
                finally:
                    stop.set()
                    if watcher is not None:
                        await watcher
                rates[n].append(SESSIONS * scale.commands / seconds)
                for i, w in enumerate(t.workers):
                    worker_cpu[n][i] += _worker_cpu(quota, firsts[n] + i, w.pid) - before[i]
    finally:
        for clients in sessions.values():
            for client in clients:
                await client.close()
    out: dict[str, Any] = {
        "sessions": SESSIONS, "commands_per_session": scale.commands, "reps": scale.scaling_reps, "command": command,
        "quota": {"fraction": quota.fraction, "method": quota.method, "detail": quota.detail,
                  "commands_seen_inside": seen["inside"], "commands_seen_outside": seen["outside"],
                  "throttled_periods": {str(i): (quota.throttled(i) or 0) - (throttled_before.get(i) or 0)
                                        for i in quota.cells if quota.throttled(i) is not None}},
        "target": SCALING_TARGET,
        "worker_cpu_source": "cell" if quota.usage(firsts[min(topologies)]) is not None else "process",
    }
    for n in topologies:
        out[str(n)] = {"commands_per_s": [round(r, 2) for r in rates[n]], "median": statistics.median(rates[n]),
                       "worker_cpu_s": [round(c, 2) for c in worker_cpu[n]]}
    out["ratio"] = out[str(max(topologies))]["median"] / out[str(min(topologies))]["median"]
    out["ratio_of"] = f"{max(topologies)} workers / {min(topologies)}"
    out["met"] = out["ratio"] >= SCALING_TARGET if quota.confines else None
    return out


# --- the run --------------------------------------------------------------------------------------


async def _measure(tmp: pathlib.Path, scale: BenchScale, say: Callable[[str], None]) -> dict[str, Any]:
    root = tmp / "root"
    root.mkdir()
    (root / SMALL).write_text(SMALL_TEXT)
    result: dict[str, Any] = {"scale": scale.name}
    iterations, took = calibrate()
    command = command_for(iterations)
    result["command_cpu_ms_unconfined"] = took * 1e3
    quota = cpu_quota.find(QUOTA)
    say(f"CPU confinement: {quota.method}: {quota.detail}")
    stops: list[Callable[[], object]] = []
    try:
        # everything is launched at once (idle processes cost nothing), then waited for: start-up
        # of confined workers is slow, and would otherwise add up
        firsts: dict[int, int] = {}
        clusters: dict[int, Cluster] = {}
        index = 0
        for n in WORKER_COUNTS:
            firsts[n] = index
            clusters[n] = launch_cluster(tmp / f"scale{n}", root, n, quota if quota.confines else None, index)
            stops.append(clusters[n].stop)
            index += n
        plain = launch_cluster(tmp / "plain", root, 1, None)
        stops.append(plain.stop)
        serve = start_serve(tmp, root)
        stops.append(serve.stop)
        gateway = ready_cluster("gateway+1", plain)
        scaled = {n: ready_cluster(f"gateway+{n} (confined)", c, quota if quota.confines else None, firsts[n])
                  for n, c in clusters.items()}
        for t in (serve, gateway, *scaled.values()):
            await probe(t)
        say("pipelined fs.read ...")
        result["pipelined"] = await measure_pipelined([serve, gateway], scale)
        say("session start ...")
        result["session_start"] = await session_starts([serve, gateway], scale)
        say(f"scaling: {SESSIONS} sessions, {scale.commands} command(s) each, 1/2/4 workers ...")
        result["scaling"] = await measure_scaling(scaled, quota, firsts, scale, command)
    finally:
        for stop in reversed(stops):
            with contextlib.suppress(Exception):
                stop()
        quota.cleanup()
    return result


def measure(scale: BenchScale, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every figure at ``scale``; the JSON-ready result (:func:`render` prints it)."""
    tell = say or (lambda line: print(line, file=sys.stderr, flush=True))
    load = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smith-fast-bench-nats-") as tmp:
        result = _run(_measure(pathlib.Path(tmp), scale, tell))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["load_average"] = {"start": [round(x, 2) for x in load], "end": [round(x, 2) for x in os.getloadavg()]}
    result["cpus"] = os.cpu_count()
    return result


def _run(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]  # a coroutine, typed as its awaitable face
    return uvloop.run(coro)  # type: ignore[arg-type]  # the same


# --- output ---------------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "not decided (no CPU confinement)"}[met]


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines: three tables and their ratios."""
    out = [f"NATS scale-out by session placement ({result['scale']}, {result.get('wall_s', '?')} s, {result.get('cpus')} CPUs, "
           f"load average {' '.join(map(str, result.get('load_average', {}).get('start', [])))} at the start)", ""]
    p = result["pipelined"]
    names = [k for k in p if isinstance(p[k], dict) and "calls_per_s" in p[k]]  # the topologies
    procs = list(dict.fromkeys(k for n in names for k in p[n]["cpu_us_per_call"]))
    out.append(f"1. pipelined fs.read of {p['file_bytes']} B, {p['window']} in flight, SDK client, {p['calls']:,} calls "
               f"x {p['reps']} repetitions (interleaved)")
    out.append(f"   {'topology':12s} {'calls/s':>10s}  {'range':>17s}   CPU µs/call: " + "  ".join(f"{k:>11s}" for k in procs))
    for n in names:
        rates, cpu = p[n]["calls_per_s"], p[n]["cpu_us_per_call"]
        out.append(f"   {n:12s} {_n(p[n]['median']):>10s}  {_n(min(rates)) + '-' + _n(max(rates)):>17s}                "
                   + "  ".join(f"{_n(cpu[k]) if k in cpu else '-':>11s}" for k in procs))
    out.append(f"   ratio {p['ratio_of']}: {p['ratio']:.3f}x the calls/s (target >= {p['target']:g}x, and the gateway's CPU per "
               f"call at most serve's): {_verdict(p['met'])}")
    c = p["ceiling"]
    out += [f"   CPU-bound ceiling on {c['cpus']} CPU(s) at these CPU costs per call (the client's included): "
            f"{_n(c['direct'])} and {_n(c['relayed'])} calls/s, a ratio of {c['ratio']:.3f}x", ""]
    s = result["scaling"]
    q = s["quota"]
    out.append(f"2. scaling: {s['sessions']} sessions x {s['commands_per_session']} CPU-bound command(s) x {s['reps']} repetition(s), "
               f"one gateway, each worker confined to {q['fraction']:g} CPU ({q['method']})")
    out.append(f"   command: {s['command']} ({result['command_cpu_ms_unconfined']:.0f} ms of CPU here, unconfined, outside the sandbox)")
    whose = "its cell's: itself and its commands" if s.get("worker_cpu_source") == "cell" else "its own and its reaped children's"
    out.append(f"   {'workers':8s} {'commands/s':>10s}  {'x 1 worker':>10s}   CPU s per worker in the runs ({whose})")
    counts = [k for k in s if k.isdigit()]
    base = s[counts[0]]["median"]
    for k in counts:
        out.append(f"   {k:8s} {_n(s[k]['median']):>10s}  {s[k]['median'] / base:>9.2f}x   {', '.join(f'{c:.1f}' for c in s[k]['worker_cpu_s'])}")
    out.append(f"   ratio {s['ratio_of']}: {s['ratio']:.2f}x (target >= {s['target']:g}): {_verdict(s['met'])}")
    if q["method"] == "none":
        out.append(f"   NO CPU CONFINEMENT: {q['detail']}; the workers shared the machine's CPUs, the ratio says little")
    else:
        out.append(f"   confinement: {q['detail']}")
        out.append(f"   commands seen in their worker's cell: {q['commands_seen_inside']} samples inside, "
                   f"{q['commands_seen_outside']} outside; throttled periods per cell: "
                   + ", ".join(f"{v}" for v in q["throttled_periods"].values()))
    out.append("")
    st = result["session_start"]
    out.append(f"3. session start, Client.connect to Ready, a fresh connection each ({st['starts']} per topology, interleaved)")
    for n in [k for k in st if isinstance(st[k], dict)]:
        out.append(f"   {n:12s} p50 {st[n]['p50_ms']:7.2f} ms   p90 {st[n]['p90_ms']:7.2f} ms")
    out.append(f"   ratio {st['ratio_of']}: {st['ratio']:.2f}x the p50 (target <= {st['target']:g}x): {_verdict(st['met'])}")
    return out


def main(argv: list[str] | None = None) -> int:
    return bench_main(PROG, __doc__, SCALES, measure, render, "smaller figures, under a minute on 2 cores", argv)


if __name__ == "__main__":
    raise SystemExit(main())
