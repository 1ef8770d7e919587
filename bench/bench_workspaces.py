"""Workspaces (``serve --workspaces DIR --template NAME=PATH``): what a copy-on-write workspace per
session costs, against the same service without one, in one run.

``python -m bench.bench_workspaces [--quick] [--json PATH]``; ``make bench`` runs it too and puts its
figures in the report (``bench/report/workspaces.py``). Every client is the SDK's
(:class:`smith_fast.client.Client`) over a Unix socket, every service a real ``smith-fast serve``
started by its command line (``harness/server.py``), so the benchmark measures whatever the service
does inside. Five figures, each side by side within the run, repetitions interleaved (the order
rotates), as ratios: the machine is shared, so compare within one run, never across runs.

1. **session start** from a template of 10,000 files / 200 MB: ``Client.connect`` + handshake to
   Ready, a fresh connection each time, through ``serve --workspaces`` (default warm pool), the same
   with ``--warm-workspaces 0`` (the mounts themselves) and a plain ``serve --root`` of the same
   directory: p50s, the ratio with/without (target <= 1.5), and ``cp -a`` of the template (p50 of a
   few runs) over the with-workspace p50 (target >= 50). These sessions close without a request, so
   their workspaces go back to the warm pool as they are; the same again spaced 50 ms apart (the
   service quiet at each start), and with each session running a command before it closes (not
   timed: its workspace is unmounted and the pool refilled, beside the next starts).
2. **checkpoint and fork**, the 200 MB template against a 1 MB one (100 files), the same small change
   written before each checkpoint: ``client.checkpoint()`` round trip p50 and fork (connect +
   handshake with ``fork=ID`` to Ready) p50, ratios 200 MB / 1 MB (target <= 1.5 each).
3. **many sessions**: 500 sessions alive at once (100 with ``--quick``), each with its own workspace,
   each running ``echo $i > f; cat f`` and checking its own output, opened 50 at a time: the wall
   time, then, all idle, the service's RSS growth per session (``VmRSS`` of ``/proc/PID/status``) and
   the kernel side (the memory cgroup the service was started in, its mounts' and tmpfs' memory
   included; n/a where no memory cgroup can be made here).
4. **changes**: a command appending to 10 files of the 10,000-file template, in a session that
   accepted ``changes`` and in one that did not (same service, interleaved): request to final event
   p50, the ratio (target <= 1.2); then the same runs spaced 50 ms apart (a recorded run's layer is
   frozen once it ended, on the loop: back to back, that lands in the next run, whichever session's).
5. **commands in a session**: ``true`` one after another in one session of ``serve --workspaces``
   and one of the plain service, interleaved blocks: commands per second and the ratio (both forked
   in their session's sandbox built once).

The templates are generated once and cached under ``/var/tmp/smith-fast-bench-templates`` (keyed by
their parameters): only the first run pays for them. Everything else (services, workspace
directories, copies) is gone when the run ends. ``--quick`` keeps it to about a minute on 2 cores
(fewer repetitions, fewer sessions; the same 200 MB template, which is the point).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pathlib
import random
import resource
import shutil
import signal
import subprocess
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.server import ServerProcess
from smith_fast.client import Client
from smith_fast.containment import cgroup_dir, cgroup_mounts, cgroup_paths

from ._cli import bench_main
from ._guard import guarded
from .report.stats import percentile

__all__ = ["SCALES", "BenchScale", "TemplateSpec", "main", "measure", "render", "template"]

PROG = "python -m bench.bench_workspaces"
CACHE = pathlib.Path("/var/tmp/smith-fast-bench-templates")
START_TARGET = 1.5  # session start p50 with a workspace over without, at most
COPY_TARGET = 50.0  # cp -a of the template over the session start with a workspace, at least
SIZE_TARGET = 1.5  # checkpoint and fork p50, 200 MB template over 1 MB, at most
CHANGES_TARGET = 1.2  # the 10-file command's p50 accepting changes over not, at most
OPEN_CONCURRENCY = 50
SPACING = 0.05  # seconds between the spaced session starts (figure 1's second part)
CAPS = ["shell_exec", "workspaces"]
TOUCH_10 = "for i in 0 1 2 3 4 5 6 7 8 9; do echo x >> dir$i/file$i; done"
# What a session of figure 1's third part runs before it closes: any request makes its workspace
# one that cannot go back to the pool as it is; /tmp (each command's own) because the plain
# service's root is the template itself.
USE = "echo x > /tmp/used"
T = TypeVar("T")


@dataclass(frozen=True)
class BenchScale:
    """The sizes of one run.

    Attributes:
        name: ``quick`` or ``full``.
        starts: session starts per service per round (figure 1).
        start_rounds: measured rounds of session starts (after one warm-up round).
        copies: ``cp -a`` runs of the big template (one per round, the first rounds).
        checkpoints: checkpoints (and forks) per template (figure 2).
        sessions: sessions alive at once (figure 3).
        changes: runs of the 10-file command per session (figure 4).
    """

    name: str
    starts: int
    start_rounds: int
    copies: int
    checkpoints: int
    sessions: int
    changes: int


SCALES = {
    "quick": BenchScale("quick", starts=15, start_rounds=3, copies=2, checkpoints=15, sessions=100, changes=30),
    "full": BenchScale("full", starts=20, start_rounds=5, copies=3, checkpoints=30, sessions=500, changes=40),
}


# --- templates ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateSpec:
    """A generated template: ``dirs`` directories ``dir0``... of ``files / dirs`` small files each
    (``file0``..., text, sizes log-normal around ``median`` bytes), except ``big`` binary files in
    ``assets/`` that take what the small ones leave of ``total`` bytes. ``dir$i/file$i`` for i < 10
    exist and are small (figure 4 appends to them)."""

    files: int
    total: int
    big: int
    dirs: int
    median: int = 2500
    seed: int = 1

    @property
    def key(self) -> str:
        return f"f{self.files}-b{self.total}-big{self.big}-d{self.dirs}-m{self.median}-s{self.seed}-v1"

    @property
    def label(self) -> str:
        mb = self.total / 1e6
        return f"{self.files:,} files / {mb:g} MB"


BIG = TemplateSpec(files=10_000, total=200_000_000, big=100, dirs=100)
SMALL = TemplateSpec(files=100, total=1_000_000, big=0, dirs=10, median=10_000)


def _sizes(spec: TemplateSpec) -> tuple[list[int], list[int]]:
    rng = random.Random(spec.seed)
    count = spec.files - spec.big
    small = [min(256 * 1024, max(64, int(rng.lognormvariate(math.log(spec.median), 1.0)))) for _ in range(count)]
    if not spec.big:  # the small files make the total on their own: scale them to it
        scale = spec.total / sum(small)
        small = [max(1, int(s * scale)) for s in small]
        small[-1] += spec.total - sum(small)
        return small, []
    rest = spec.total - sum(small)
    if rest <= spec.big:
        raise ValueError(f"{spec}: the small files already take {sum(small)} of {spec.total} bytes")
    weights = [rng.lognormvariate(0, 0.8) for _ in range(spec.big)]
    big = [int(rest * w / sum(weights)) for w in weights]
    big[-1] += rest - sum(big)
    return small, big


def template(spec: TemplateSpec, say: Callable[[str], None] | None = None) -> pathlib.Path:
    """The template's directory, generated now unless cached (made aside, then renamed into place,
    so a run cut short leaves no half template behind)."""
    where = CACHE / spec.key
    if where.is_dir():
        return where
    CACHE.mkdir(parents=True, exist_ok=True)
    if say:
        say(f"generating the {spec.label} template in {where} (once; cached)")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{spec.key}-", dir=CACHE))
    try:
        small, big = _sizes(spec)
        rng = random.Random(spec.seed + 1)
        text = rng.randbytes(3 * 1024 * 1024).hex().encode()  # 6 MiB of text to cut the small files from
        blob = rng.randbytes(8 * 1024 * 1024)  # binary, for the big ones
        per_dir = -(-len(small) // spec.dirs)
        for d in range(spec.dirs):
            (tmp / f"dir{d}").mkdir()
        for n, size in enumerate(small):
            d, i = n % spec.dirs, n // spec.dirs  # file i of dir d: dir$i/file$i exist for every i < per_dir
            start = (n * 7919) % (len(text) - size)
            lines = bytearray(text[start:start + size])
            lines[79::80] = b"\n" * len(lines[79::80])
            (tmp / f"dir{d}" / f"file{i}").write_bytes(bytes(lines))
        assert per_dir >= 10 and spec.dirs >= 10, "figure 4 needs dir0..9/file0..9"
        if big:
            (tmp / "assets").mkdir()
        for k, size in enumerate(big):
            with open(tmp / "assets" / f"blob{k}.bin", "wb") as f:
                left = size
                while left:
                    piece = blob[(k * 4096) % len(blob):][:left] or blob[:left]
                    f.write(piece)
                    left -= len(piece)
        os.chmod(tmp, 0o755)
        os.rename(tmp, where)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if where.is_dir():  # another run made it meanwhile
            return where
        raise
    return where


def tree_size(path: pathlib.Path) -> tuple[int, int]:
    """(files, bytes) beneath ``path``."""
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


# --- memory -----------------------------------------------------------------------------------------


def vm_rss_kib(pid: int) -> int:
    """``VmRSS`` of process ``pid`` in KiB (0 once it is gone)."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class MemoryCell:
    """A memory cgroup of its own for the service of figure 3 (and everything it starts: its mount
    host, its commands, and the tmpfs and overlay memory they charge), below this process's cgroup,
    so its usage is the service's alone; :attr:`detail` says why there is none where none can be made."""

    def __init__(self) -> None:
        self.cell: str | None = None
        self.version = 0
        self.detail = ""
        try:
            mounts, own = cgroup_mounts(), cgroup_paths()
        except (OSError, ValueError) as exc:
            self.detail = f"cannot read this process's cgroups ({exc})"
            return
        v1 = next((m for m in mounts if m[2] == "cgroup" and "memory" in m[3]), None)
        v2 = next((m for m in mounts if m[2] == "cgroup2"), None)
        tried = []
        if v1 is not None and "memory" in own:
            home = cgroup_dir(v1[0], v1[1], own["memory"])
            if self._make(home, "memory.usage_in_bytes"):
                self.version = 1
                self.detail = f"cgroup v1 memory, a cell under {home}"
                return
            tried.append(f"cgroup v1 memory {home}: cannot make a cell")
        if v2 is not None and "" in own:
            home = cgroup_dir(v2[0], v2[1], own[""])
            try:
                enabled = pathlib.Path(home, "cgroup.subtree_control").read_text().split()
            except OSError:
                enabled = []
            if "memory" in enabled and self._make(home, "memory.current"):
                self.version = 2
                self.detail = f"cgroup v2, a cell under {home}"
                return
            tried.append(f"cgroup v2 {home}: memory not enabled for its children, or no cell can be made there")
        self.detail = "; ".join(tried) or "no memory cgroup hierarchy"

    def _make(self, home: str, usage: str) -> bool:
        cell = f"{home}/smith-bench-ws-{os.getpid()}"
        try:
            os.mkdir(cell)
        except FileExistsError:
            pass
        except OSError:
            return False
        if not os.path.exists(f"{cell}/{usage}") or not os.access(f"{cell}/cgroup.procs", os.W_OK):
            with contextlib.suppress(OSError):
                os.rmdir(cell)
            return False
        self.cell = cell
        return True

    def prefix(self) -> list[str]:
        """The command-line prefix that starts a process in the cell (its pid written at birth)."""
        if self.cell is None:
            return []
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{self.cell}/cgroup.procs"]

    def usage(self) -> dict[str, int] | None:
        """The cell's memory now, in bytes (None without a cell): ``total`` (its usage), ``anon``
        (its processes' own memory), ``shmem`` (tmpfs pages: the workspaces' files), ``kernel``
        (slab, page tables, stacks: the mounts, inodes and dentries among them) and ``file`` (page cache)."""
        if self.cell is None:
            return None
        try:
            stat = dict(line.split() for line in pathlib.Path(self.cell, "memory.stat").read_text().splitlines())
            if self.version == 1:  # the total_ rows count the cells below (the commands') too
                kernel = int(pathlib.Path(self.cell, "memory.kmem.usage_in_bytes").read_text())
                return {"total": int(pathlib.Path(self.cell, "memory.usage_in_bytes").read_text()), "anon": int(stat["total_rss"]),
                        "shmem": int(stat["total_shmem"]), "kernel": kernel, "file": int(stat["total_cache"]) - int(stat["total_shmem"])}
            return {"total": int(pathlib.Path(self.cell, "memory.current").read_text()), "anon": int(stat["anon"]),
                    "shmem": int(stat["shmem"]), "kernel": int(stat.get("kernel", stat.get("slab", 0))),
                    "file": int(stat["file"]) - int(stat["shmem"])}
        except (OSError, ValueError, KeyError):
            return None

    def cleanup(self) -> None:
        if self.cell is not None:
            for _ in range(50):  # its last processes may take a moment to leave
                try:
                    os.rmdir(self.cell)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            self.cell = None


# --- services ---------------------------------------------------------------------------------------


@dataclass
class Service:
    """One running ``serve``: its name in the tables, where it listens, what a handshake asks for."""

    name: str
    server: ServerProcess
    caps: list[str]

    @property
    def address(self) -> str:
        return self.server.unix

    def gone(self) -> str:
        proc = self.server.proc
        code = None if proc is None else proc.poll()
        if code is None:
            return ""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"{self.name} (pid {self.server.pid}) {how}: " + " / ".join(self.server.raw_stderr[-5:])


class Services:
    """The services a run starts, all stopped (and their directories removed) on the way out."""

    def __init__(self, base: pathlib.Path) -> None:
        self.base = base
        self.started: list[Service] = []

    def start(self, name: str, root: pathlib.Path, *extra: str, workspaces: bool = True,
              templates: dict[str, pathlib.Path] | None = None, prefix: list[str] | None = None) -> Service:
        tmp = self.base / name
        tmp.mkdir(parents=True)
        args: list[str] = []
        if workspaces:
            ws = self.base / f"{name}-ws"
            ws.mkdir()
            args += ["--workspaces", str(ws)]
            for tname, path in (templates or {}).items():
                args += ["--template", f"{tname}={path}"]
        # info: little but "ready" (debug would log a line per request, measured too)
        server = ServerProcess(tmp, *args, *extra, root=root, tcp=False, log_level="info", keep=2000)
        if prefix:
            server.argv[:0] = prefix
        service = Service(name, server, CAPS if workspaces else ["shell_exec"])
        self.started.append(service)
        server.start(60)
        return service

    def stop(self, service: Service) -> None:
        code = service.server.stop()
        if code not in (0, -signal.SIGTERM):
            raise RuntimeError(f"{service.name} ended with status {code}: " + " / ".join(service.server.raw_stderr[-5:]))

    def close(self) -> None:
        for service in self.started:
            if service.server.proc is not None and service.server.proc.poll() is None:
                service.server.stop()


async def open_session(service: Service, *, template: str | None = None, fork: str | None = None,
                       accept: tuple[str, ...] = ()) -> Client:
    client = await Client.connect(service.address, template=template, fork=fork)
    try:
        await client.handshake(service.caps, accept=accept, timeout=60)
    except BaseException:
        await client.close()
        raise
    return client


def _rotate(items: list[T], n: int) -> list[T]:
    n %= len(items)
    return items[n:] + items[:n]


def _p(values: list[float], q: float) -> float:
    return percentile(sorted(values), q)


# --- 1. session start -------------------------------------------------------------------------------


async def _check_workspace(service: Service) -> None:
    """One session of ``service`` sees the template in its workspace (not the template itself)."""
    client = await Client.connect(service.address)
    try:
        ready = await client.handshake(service.caps, timeout=60)
        ws = ready.service_info.get("smith_fast.workspace", "")
        if not ws:
            raise RuntimeError(f"{service.name}: the session has no workspace (Ready.service_info {dict(ready.service_info)})")
        result = await client.run("test -f dir0/file0 && echo ok > mine && pwd")
        if result.exit_code != 0:
            raise RuntimeError(f"{service.name}: a session's first command failed: {result.stderr[-300:]!r}")
        if b"/s/" not in result.stdout:
            raise RuntimeError(f"{service.name}: the command ran in {result.stdout!r}, not in a workspace {ws}")
    finally:
        await client.close()


async def session_starts(services: list[Service], template_dir: pathlib.Path, scratch: pathlib.Path,
                         scale: BenchScale) -> dict[str, Any]:
    for service in services:
        if service.caps == CAPS:
            await _check_workspace(service)
    times: dict[str, list[float]] = {s.name: [] for s in services}
    copies: list[float] = []
    for rnd in range(scale.start_rounds + 1):  # the first is the warm-up
        for service in _rotate(services, rnd):
            for _ in range(scale.starts):
                started = time.perf_counter()
                client = await guarded(service, open_session(service), 60)
                took = time.perf_counter() - started
                await client.close()
                if rnd:
                    times[service.name].append(took)
        if rnd and len(copies) < scale.copies:
            copies.append(copy_template(template_dir, scratch / f"copy{rnd}"))
    # The same, each start SPACING after the last one's close: the service quiet by then (the last
    # workspace unmounted, the warm pool refilled), so a start pays only for itself.
    spaced: dict[str, list[float]] = {s.name: [] for s in services}
    for i in range(scale.starts * scale.start_rounds // 2):
        for service in _rotate(services, i):
            await asyncio.sleep(SPACING)
            started = time.perf_counter()
            client = await guarded(service, open_session(service), 60)
            spaced[service.name].append(time.perf_counter() - started)
            await client.close()
    # The same again, each session running a command after its Ready (not timed) before it closes:
    # a workspace a request touched cannot go back to the warm pool as it is (an untouched one does),
    # so these starts are the ones the pool's own mounts serve, its refills and unmounts beside them.
    used: dict[str, list[float]] = {s.name: [] for s in services}
    for i in range(scale.starts * scale.start_rounds // 2):
        for service in _rotate(services, i):
            started = time.perf_counter()
            client = await guarded(service, open_session(service), 60)
            used[service.name].append(time.perf_counter() - started)
            if (await guarded(service, client.run(USE), 60)).exit_code != 0:
                raise RuntimeError(f"{service.name}: `{USE}` failed")
            await client.close()
    out: dict[str, Any] = {"starts": scale.starts * scale.start_rounds, "template": BIG.label}
    for service in services:
        out[service.name] = {"p50_ms": _p(times[service.name], 0.5) * 1e3, "p90_ms": _p(times[service.name], 0.9) * 1e3}
    out["used"] = {"starts": len(used[services[0].name]), "command": USE}
    for service in services:
        out["used"][service.name] = {"p50_ms": _p(used[service.name], 0.5) * 1e3, "p90_ms": _p(used[service.name], 0.9) * 1e3}
    out["spaced"] = {"starts": len(spaced[services[0].name]), "spacing_ms": SPACING * 1e3}
    for service in services:
        out["spaced"][service.name] = {"p50_ms": _p(spaced[service.name], 0.5) * 1e3, "p90_ms": _p(spaced[service.name], 0.9) * 1e3}
    with_ws, without = services[0].name, services[-1].name
    out["ratio"] = out[with_ws]["p50_ms"] / out[without]["p50_ms"]
    out["ratio_of"] = f"{with_ws} / {without}"
    out["target"] = START_TARGET
    out["met"] = out["ratio"] <= START_TARGET
    out["spaced"]["ratio"] = out["spaced"][with_ws]["p50_ms"] / out["spaced"][without]["p50_ms"]
    out["used"]["ratio"] = out["used"][with_ws]["p50_ms"] / out["used"][without]["p50_ms"]
    out["copy"] = {"runs": len(copies), "p50_ms": _p(copies, 0.5) * 1e3, "all_ms": [round(c * 1e3) for c in copies]}
    out["copy_ratio"] = out["copy"]["p50_ms"] / out[with_ws]["p50_ms"]
    out["copy_target"] = COPY_TARGET
    out["copy_met"] = out["copy_ratio"] >= COPY_TARGET
    return out


# --- 5. commands in a session ----------------------------------------------------------------------


async def commands_rate(services: list[Service], scale: BenchScale) -> dict[str, Any]:
    """``true`` one after another in one session of each service, in interleaved blocks: a
    workspace session's commands against a plain session's (both forked in the session's sandbox
    built once; a workspace session's was built per command before)."""
    clients = {s.name: await open_session(s) for s in services}
    try:
        for client in clients.values():
            for _ in range(10):  # the session's sandbox built, its warm shell made
                await client.run("true")
        rates: dict[str, list[float]] = {name: [] for name in clients}
        block = scale.changes * 5
        for rnd in range(scale.start_rounds):
            for name in _rotate(list(clients), rnd):
                started = time.perf_counter()
                for _ in range(block):
                    if (await clients[name].run("true")).exit_code != 0:
                        raise RuntimeError(f"{name}: `true` failed")
                rates[name].append(block / (time.perf_counter() - started))
    finally:
        for client in clients.values():
            await client.close()
    out: dict[str, Any] = {"command": "true", "block": block, "rounds": scale.start_rounds}
    for name, values in rates.items():
        out[name] = {"per_s": round(statistics.median(values), 1), "all": [round(v) for v in values]}
    ws, plain = services[0].name, services[-1].name
    out["ratio_of"] = f"{ws} / {plain}"
    out["ratio"] = round(out[ws]["per_s"] / out[plain]["per_s"], 3)
    return out


def copy_template(src: pathlib.Path, dest: pathlib.Path) -> float:
    """Seconds ``cp -a src dest`` took (the copy is removed afterwards, untimed)."""
    started = time.perf_counter()
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    took = time.perf_counter() - started
    shutil.rmtree(dest)
    return took


# --- 2. checkpoint and fork ---------------------------------------------------------------------------


async def checkpoints_and_forks(service: Service, scale: BenchScale) -> dict[str, Any]:
    names = ["big", "small"]
    owners = {name: await open_session(service, template=name) for name in names}
    ckpt: dict[str, list[float]] = {n: [] for n in names}
    fork: dict[str, list[float]] = {n: [] for n in names}
    try:
        for rep in range(scale.checkpoints + 2):  # the first two are the warm-up
            for name in _rotate(names, rep):
                client = owners[name]
                # the same small change before each checkpoint, so that each freezes a layer of the same size
                written = await guarded(service, client.run(f"echo {rep} > change.txt; echo {rep} >> dir0/file0"))
                if written.exit_code != 0:
                    raise RuntimeError(f"the change failed in the {name} workspace: {written.stderr[-300:]!r}")
                started = time.perf_counter()
                cid = await guarded(service, client.checkpoint())
                took_ckpt = time.perf_counter() - started
                started = time.perf_counter()
                child = await guarded(service, open_session(service, fork=cid))
                took_fork = time.perf_counter() - started
                seen = await guarded(service, child.run("cat change.txt"))
                await child.close()
                if seen.stdout != f"{rep}\n".encode():
                    raise RuntimeError(f"a fork of the {name} checkpoint read {seen.stdout!r}, not {rep}")
                if rep >= 2:
                    ckpt[name].append(took_ckpt)
                    fork[name].append(took_fork)
    finally:
        for client in owners.values():
            await client.close()
    out: dict[str, Any] = {"reps": scale.checkpoints, "target": SIZE_TARGET, "templates": {"big": BIG.label, "small": SMALL.label}}
    for what, times in (("checkpoint", ckpt), ("fork", fork)):
        row = {n: {"p50_ms": _p(times[n], 0.5) * 1e3, "p90_ms": _p(times[n], 0.9) * 1e3} for n in names}
        ratio = row["big"]["p50_ms"] / row["small"]["p50_ms"]
        out[what] = {**row, "ratio": ratio, "met": ratio <= SIZE_TARGET}
    return out


# --- 4. changes -------------------------------------------------------------------------------------


async def changes_cost(service: Service, scale: BenchScale) -> dict[str, Any]:
    sessions = {"changes": await open_session(service, template="big", accept=("changes",)),
                "no changes": await open_session(service, template="big")}
    times: dict[str, list[float]] = {n: [] for n in sessions}
    quiet: dict[str, list[float]] = {n: [] for n in sessions}  # each run SPACING after the last
    try:
        if "changes" not in sessions["changes"].accepted:
            raise RuntimeError("the service did not grant changes")
        for rep in range(2 * scale.changes + 3):  # the first three are the warm-up, the second half spaced
            spaced = rep >= scale.changes + 3
            for name in _rotate(list(sessions), rep):
                if spaced:
                    await asyncio.sleep(SPACING)
                started = time.perf_counter()
                result = await guarded(service, sessions[name].run(TOUCH_10))
                took = time.perf_counter() - started
                if result.exit_code != 0:
                    raise RuntimeError(f"the 10-file command failed ({name}): {result.stderr[-300:]!r}")
                if name == "changes":
                    paths = sorted(c.path for c in result.changes or [] if c.file_type == "file")
                    want = sorted(f"dir{i}/file{i}" for i in range(10))
                    if paths != want:
                        raise RuntimeError(f"the changes listed {paths}, not {want}")
                elif result.changes is not None:
                    raise RuntimeError("changes came to a session that did not accept them")
                if spaced:
                    quiet[name].append(took)
                elif rep >= 3:
                    times[name].append(took)
    finally:
        for client in sessions.values():
            await client.close()
    out: dict[str, Any] = {"reps": scale.changes, "command": TOUCH_10, "template": BIG.label, "target": CHANGES_TARGET}
    quarter = max(1, scale.changes // 4)
    for name in sessions:
        # early and late: whether a run costs more as the session's requests pile up (each adds a layer)
        out[name] = {"p50_ms": _p(times[name], 0.5) * 1e3, "p90_ms": _p(times[name], 0.9) * 1e3,
                     "early_p50_ms": _p(times[name][:quarter], 0.5) * 1e3, "late_p50_ms": _p(times[name][-quarter:], 0.5) * 1e3,
                     "all_ms": [round(t * 1e3, 2) for t in times[name]]}
    out["quarter"] = quarter
    out["spaced"] = {"spacing_ms": SPACING * 1e3, **{name: {"p50_ms": _p(quiet[name], 0.5) * 1e3, "p90_ms": _p(quiet[name], 0.9) * 1e3}
                                                     for name in sessions}}
    out["spaced"]["ratio"] = out["spaced"]["changes"]["p50_ms"] / out["spaced"]["no changes"]["p50_ms"]
    out["ratio"] = out["changes"]["p50_ms"] / out["no changes"]["p50_ms"]
    out["ratio_of"] = "changes / no changes"
    out["met"] = out["ratio"] <= CHANGES_TARGET
    return out


# --- 3. many sessions -------------------------------------------------------------------------------


def open_fds(pid: int) -> int:
    """Open file descriptors of process ``pid`` (-1 when they cannot be listed)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def proc_nofile(pid: int) -> int:
    """The soft open-file limit of process ``pid`` (-1 when unreadable)."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def overlay_mounts(pid: int) -> int:
    """Overlay mounts in process ``pid``'s mount namespace (the service's workspaces)."""
    try:
        return sum(1 for line in pathlib.Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if " - overlay " in line)
    except OSError:
        return -1


async def many_sessions(service: Service, cell: MemoryCell, scale: BenchScale) -> dict[str, Any]:
    pid = service.server.pid
    warm = await open_session(service)  # imports and caches warmed by one session first
    if (await warm.run("echo 0 > f; cat f")).stdout != b"0\n":
        raise RuntimeError("the warm-up session's command failed")
    await warm.close()
    await asyncio.sleep(1.0)  # its workspace released, the warm pool refilled
    rss_before, mem_before, mounts_before, fds_before = vm_rss_kib(pid), cell.usage(), overlay_mounts(pid), open_fds(pid)
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    clients: list[Client] = []

    async def one(i: int) -> None:
        async with gate:
            client = await open_session(service)
            clients.append(client)
            result = await client.run(f"echo {i} > f; cat f")
            if result.exit_code != 0 or result.stdout != f"{i}\n".encode():
                raise RuntimeError(f"session {i}: exit {result.exit_code}, stdout {result.stdout!r}, stderr {result.stderr[-200:]!r}")

    try:
        started = time.perf_counter()
        await guarded(service, asyncio.gather(*(one(i) for i in range(scale.sessions))), 600)
        wall = time.perf_counter() - started
        await asyncio.sleep(2.0)  # idle: every command reaped, the warm pool refilled
        rss_after, mem_after, mounts_after, fds_after = vm_rss_kib(pid), cell.usage(), overlay_mounts(pid), open_fds(pid)
        # all still there: one answer each, and their workspaces still mounted
        alive = sum(await guarded(service, asyncio.gather(*(_answers(c, gate) for c in clients)), 300))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    n = scale.sessions
    out: dict[str, Any] = {
        "sessions": n, "concurrency": OPEN_CONCURRENCY, "template": BIG.label, "open_wall_s": wall,
        "rss_kib": {"before": rss_before, "after": rss_after}, "rss_kib_per_session": (rss_after - rss_before) / n,
        "overlay_mounts": {"before": mounts_before, "after": mounts_after}, "alive_at_end": alive,
        # the service does not raise its own RLIMIT_NOFILE: what an idle session holds says how many fit under it
        "fds": {"before": fds_before, "after": fds_after, "per_session": (fds_after - fds_before) / n,
                "soft_limit": proc_nofile(pid)},
        "memory_cgroup": cell.detail,
    }
    if mem_before is not None and mem_after is not None:
        out["cgroup_bytes"] = {k: {"before": mem_before[k], "after": mem_after[k]} for k in mem_after}
        out["cgroup_kib_per_session"] = {k: (mem_after[k] - mem_before[k]) / 1024 / n for k in mem_after}
        # the kernel side of a workspace: its kernel objects and its tmpfs pages
        out["kernel_kib_per_session"] = out["cgroup_kib_per_session"]["kernel"] + out["cgroup_kib_per_session"]["shmem"]
    if alive != n:
        raise RuntimeError(f"only {alive} of {n} sessions still answered at the end")
    return out


async def _answers(client: Client, gate: asyncio.Semaphore) -> int:
    async with gate:  # the service runs 64 commands at once (--max-processes)
        result = await client.run("cat f")
    return int(result.exit_code == 0 and result.stdout.strip().isdigit())


# --- the run ----------------------------------------------------------------------------------------


def raise_nofile(want: int) -> tuple[int, int]:
    """Raise this process's open-file limit towards ``want`` (the services inherit it); the limit then."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


async def _measure(base: pathlib.Path, scale: BenchScale, tell: Callable[[str], None]) -> dict[str, Any]:
    big, small = template(BIG, tell), template(SMALL, tell)
    files, size = tree_size(big)
    result: dict[str, Any] = {"scale": scale.name, "templates": {"big": {"path": str(big), "files": files, "bytes": size},
                                                                 "small": {"path": str(small), **dict(zip(("files", "bytes"), tree_size(small)))}}}
    # per session: a socket here, one there, and the command's pipes while it runs
    result["nofile"] = list(raise_nofile(4 * scale.sessions + 1024))
    services = Services(base)
    try:
        tell("1. session start: three services on the 200 MB template")
        ws = services.start("workspaces", big, templates={"big": big})
        cold = services.start("workspaces, no warm pool", big, "--warm-workspaces", "0", templates={"big": big})
        plain = services.start("plain", big, workspaces=False)
        result["session_start"] = await session_starts([ws, cold, plain], big, base, scale)
        tell("5. commands in a session: a workspace session's and a plain one's")
        result["commands"] = await commands_rate([ws, plain], scale)
        for service in (ws, cold, plain):
            services.stop(service)
        tell("2. checkpoint and fork, 4. changes: one service, both templates")
        both = services.start("templates", big, "--max-checkpoints", str(scale.checkpoints + 10),
                              templates={"big": big, "small": small})
        result["checkpoint_fork"] = await checkpoints_and_forks(both, scale)
        result["changes"] = await changes_cost(both, scale)
        services.stop(both)
        tell(f"3. {scale.sessions} sessions at once")
        cell = MemoryCell()
        try:
            many = services.start("many", big, "--max-workspaces", str(scale.sessions + 50),
                                  "--max-connections", str(scale.sessions + 100), templates={"big": big}, prefix=cell.prefix())
            result["many_sessions"] = await many_sessions(many, cell, scale)
            services.stop(many)
        finally:
            services.close()
            cell.cleanup()
    finally:
        services.close()
    return result


def measure(scale: BenchScale, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every figure at ``scale``; the JSON-ready result (:func:`render` prints it)."""
    tell = say or (lambda line: print(line, file=sys.stderr, flush=True))
    load = os.getloadavg()
    started = time.perf_counter()
    with _scratch() as base:
        result = _run(_measure(base, scale, tell))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["load_average"] = {"start": [round(x, 2) for x in load], "end": [round(x, 2) for x in os.getloadavg()]}
    result["cpus"] = os.cpu_count()
    return result


@contextlib.contextmanager
def _scratch() -> Iterator[pathlib.Path]:
    """A directory under /var/tmp for the services, their workspaces and the copies (a command's /tmp
    is a private tmpfs: a workspace under the host's /tmp would be out of its view)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="smith-fast-bench-ws-", dir="/var/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(coro: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]  # a coroutine, typed as its awaitable face
    return uvloop.run(coro)  # type: ignore[arg-type]  # the same


# --- output -----------------------------------------------------------------------------------------


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def render(result: dict[str, Any]) -> list[str]:
    """The result as plain-text lines: four tables and their ratios."""
    t = result["templates"]["big"]
    out = [f"Workspaces ({result['scale']}, {result.get('wall_s', '?')} s, {result.get('cpus')} CPUs, load average "
           f"{' '.join(map(str, result.get('load_average', {}).get('start', [])))} at the start); "
           f"big template {t['files']:,} files, {t['bytes'] / 1e6:.0f} MB", ""]
    st = result["session_start"]
    out.append(f"1. session start, Client.connect + handshake to Ready, a fresh connection each ({st['starts']} per service, interleaved)")
    for n in [k for k in st if isinstance(st[k], dict) and "p90_ms" in st[k]]:
        out.append(f"   {n:26s} p50 {st[n]['p50_ms']:8.2f} ms   p90 {st[n]['p90_ms']:8.2f} ms")
    cp = st["copy"]
    out.append(f"   {'cp -a of the template':26s} p50 {cp['p50_ms']:8.0f} ms   ({cp['runs']} runs: {', '.join(map(str, cp['all_ms']))} ms)")
    out.append(f"   ratio {st['ratio_of']}: {st['ratio']:.2f}x the p50 (target <= {st['target']:g}x): {_verdict(st['met'])}")
    sp = st["spaced"]
    out.append(f"   spaced {sp['spacing_ms']:g} ms apart ({sp['starts']} per service), the service quiet at each start: "
               + ", ".join(f"{n} p50 {sp[n]['p50_ms']:.2f} ms" for n in sp if isinstance(sp[n], dict))
               + f"; ratio {sp['ratio']:.2f}x")
    us = st["used"]
    out.append(f"   each session running `{us['command']}` before it closes ({us['starts']} per service; a workspace a request ran in "
               "does not go back to the warm pool as it is): " + ", ".join(f"{n} p50 {us[n]['p50_ms']:.2f} ms" for n in us if isinstance(us[n], dict))
               + f"; ratio {us['ratio']:.2f}x")
    out.append(f"   cp -a / workspaces: {st['copy_ratio']:,.0f}x (target >= {st['copy_target']:g}x): {_verdict(st['copy_met'])}")
    out.append("")
    cf = result["checkpoint_fork"]
    out.append(f"2. checkpoint (round trip) and fork (connect + handshake with fork=ID to Ready), the same small change before each, "
               f"{cf['reps']} each, interleaved")
    out.append(f"   {'':12s} {'200 MB p50':>11s} {'1 MB p50':>10s} {'200 MB p90':>11s} {'1 MB p90':>10s}   ratio 200 MB / 1 MB")
    for what in ("checkpoint", "fork"):
        r = cf[what]
        out.append(f"   {what:12s} {r['big']['p50_ms']:8.2f} ms {r['small']['p50_ms']:7.2f} ms {r['big']['p90_ms']:8.2f} ms "
                   f"{r['small']['p90_ms']:7.2f} ms   {r['ratio']:.2f}x (target <= {cf['target']:g}x): {_verdict(r['met'])}")
    out.append("")
    m = result["many_sessions"]
    out.append(f"3. {m['sessions']} sessions alive at once, each its own workspace and command, opened {m['concurrency']} at a time")
    out.append(f"   open + handshake + command, all of them: {m['open_wall_s']:.1f} s; overlay mounts {m['overlay_mounts']['before']} "
               f"-> {m['overlay_mounts']['after']}; {m['alive_at_end']} answered at the end")
    fd = m["fds"]
    out.append(f"   service file descriptors {fd['before']} -> {fd['after']}: {fd['per_session']:.1f} per idle session "
               f"(its soft limit: {fd['soft_limit']}, inherited: the service does not raise it)")
    out.append(f"   service RSS {m['rss_kib']['before'] / 1024:.1f} -> {m['rss_kib']['after'] / 1024:.1f} MiB: "
               f"{m['rss_kib_per_session']:.1f} KiB per idle session")
    if "cgroup_kib_per_session" in m:
        out.append(f"   kernel side (kernel memory + tmpfs pages): {m['kernel_kib_per_session']:.1f} KiB per idle session; "
                   f"the service's memory cgroup ({m['memory_cgroup']}), KiB per idle session:")
        out.append("   " + ", ".join(f"{k} {v:.1f}" for k, v in m["cgroup_kib_per_session"].items()))
    else:
        out.append(f"   kernel side: n/a ({m['memory_cgroup']})")
    out.append("")
    c = result["changes"]
    out.append(f"4. changes: `{c['command']}` in the {c['template']} template, {c['reps']} runs per session, interleaved")
    for n in ("changes", "no changes"):
        out.append(f"   {n:12s} p50 {c[n]['p50_ms']:8.2f} ms   p90 {c[n]['p90_ms']:8.2f} ms   "
                   f"first {c['quarter']} runs p50 {c[n]['early_p50_ms']:.2f} ms, last {c['quarter']} {c[n]['late_p50_ms']:.2f} ms")
    out.append(f"   ratio {c['ratio_of']}: {c['ratio']:.2f}x the p50 (target <= {c['target']:g}x): {_verdict(c['met'])}")
    cs = c["spaced"]
    out.append(f"   spaced {cs['spacing_ms']:g} ms apart (the same runs again, the service quiet at each: the last run's layer frozen): "
               f"changes p50 {cs['changes']['p50_ms']:.2f} ms, no changes p50 {cs['no changes']['p50_ms']:.2f} ms; ratio {cs['ratio']:.2f}x")
    if "commands" in result:
        k = result["commands"]
        out.append("")
        out.append(f"5. commands in a session: `{k['command']}` one after another, {k['rounds']} interleaved blocks of {k['block']} per session")
        for n in (x for x in k if isinstance(k[x], dict)):
            out.append(f"   {n:26s} {k[n]['per_s']:8.0f} per s   ({', '.join(map(str, k[n]['all']))})")
        out.append(f"   ratio {k['ratio_of']}: {k['ratio']:.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    return bench_main(PROG, __doc__, SCALES, measure, render, "fewer repetitions and 100 sessions, about a minute on 2 cores", argv)


if __name__ == "__main__":
    raise SystemExit(main())
