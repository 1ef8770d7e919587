"""Service metrics: plain counters kept by the core, read lazily by whoever reports them.

The hot path only ever adds to an ``int`` attribute or dict entry (a frame counted, a command
counted); nothing here imports an exporter. Three readers turn the counters into reports:
``MetricsEvent``/``ResourceUsageEvent`` envelopes for peers that asked for them
(:meth:`ServiceMetrics.samples`, :class:`ResourceSampler`), the ``metrics`` map of a
``HealthCheckResponse`` (``smith_fast.service.health``), and the Prometheus endpoint
(``smith_fast.service.prometheus``). All three use the metric names below, so a figure means the
same thing wherever it is read.

| name | kind | labels |
|---|---|---|
| ``smith_fast_frames_received_total`` / ``_sent_total`` | counter | ``protocol`` (v1, v0, grpc) |
| ``smith_fast_bytes_received_total`` / ``_sent_total`` | counter | ``protocol`` |
| ``smith_fast_commands_total`` | counter | ``type`` (handshake, shell_exec, tool_call, ...) |
| ``smith_fast_errors_total`` | counter | ``code`` (ErrorCode name without its prefix) |
| ``smith_fast_hook_decisions_total`` | counter | ``action`` (allow, block, transform) |
| ``smith_fast_sessions_total`` / ``smith_fast_active_sessions`` | counter / gauge | ``protocol`` |
| ``smith_fast_running_processes`` | gauge | |
| ``smith_fast_network_connections`` | gauge | (live sessions over Unix, TCP, gRPC) |
| ``smith_fast_request_duration_seconds`` | histogram | ``type`` (shell_exec, tool_call) |
| ``smith_fast_uptime_seconds`` | gauge | |

Other parts add figures of their own through :meth:`ServiceMetrics.add_source` (a
:class:`FigureSource`): ``smith-fast gateway`` and ``worker`` add the ``smith_fast_nats_*`` ones
(``smith_fast.nats.metrics``). They reach all three readers like the rest.
"""

from __future__ import annotations

import bisect
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import field
from typing import Protocol

from ..pb import smith_pb2 as pb
from ..records import record

__all__ = [
    "Gauges",
    "IOCounters",
    "Histogram",
    "ServiceMetrics",
    "ResourceUsage",
    "ResourceSampler",
    "Sample",
    "Figure",
    "FigureSource",
    "PROTOCOLS",
    "LATENCY_BUCKETS",
    "rss_bytes",
    "cpu_seconds",
    "open_fds",
]

PROTOCOLS = ("v1", "v0", "grpc", "mcp")
COMMAND_TYPES = tuple(f.name for f in pb.Command.DESCRIPTOR.oneofs_by_name["command_type"].fields)
HOOK_ACTIONS = ("allow", "block", "transform")
ERROR_CODES = tuple(name.removeprefix("ERROR_CODE_") for name in pb.ErrorCode.keys())
# Request latencies run from a sub-millisecond tool call to a build of several minutes.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

Sample = tuple[str, dict[str, str], float]
"""``(metric name, labels, value)``: one figure as a ``MetricsEvent`` carries it."""

_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096



class Gauges(Protocol):
    """The live figures the gauges read (:class:`~smith_fast.service.core.ServiceCore` has them)."""

    @property
    def running_processes(self) -> int: ...

    def sessions_by_protocol(self) -> dict[str, int]: ...

    def network_connections(self) -> int: ...

@record(frozen=True)
class Figure:
    """One figure of a :class:`FigureSource`.

    Attributes:
        name: the metric name; a counter's ends in ``_total``.
        doc: its Prometheus help text.
        value: the figure.
        labels: its labels (every figure of one name has the same label names).
        counter: a counter (only ever grows) rather than a gauge.
    """

    name: str
    doc: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    counter: bool = False


class FigureSource(Protocol):
    """Figures read at each report, from a part the core does not know (a NATS gateway or worker)."""

    def figures(self) -> Iterable[Figure]: ...


class IOCounters:
    """Frames and bytes through one protocol's fronts; fronts add to these directly."""

    __slots__ = ("frames_in", "frames_out", "bytes_in", "bytes_out")

    def __init__(self) -> None:
        self.frames_in = 0
        self.frames_out = 0
        self.bytes_in = 0
        self.bytes_out = 0


class Histogram:
    """A fixed-bucket histogram: per-bucket counts (not cumulative), sum and count.

    Args:
        bounds: ascending upper bounds; an implicit ``+Inf`` bucket follows the last.
    """

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Iterable[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count one observation (``le`` semantics: a value equal to a bound falls in that bucket)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, cumulative count), ...]`` ending with ``("+Inf", count)``, as Prometheus wants them."""
        out, total = [], 0
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts):
            total += n
            out.append((bound, total))
        return out


class ServiceMetrics:
    """Every counter one service process keeps. Attributes are read and written directly.

    Args:
        timed: the request types whose latency histogram is reported from the start, before one
            ran (the core passes the command table's ``timed`` rows); others appear once one ran.
    """

    def __init__(self, timed: Iterable[str] = ()) -> None:
        self.started = time.monotonic()
        self.io = {p: IOCounters() for p in PROTOCOLS}
        self.commands = dict.fromkeys(COMMAND_TYPES, 0)
        self.errors = dict.fromkeys(ERROR_CODES, 0)
        self.hook_decisions = dict.fromkeys(HOOK_ACTIONS, 0)
        self.sessions_total = dict.fromkeys(PROTOCOLS, 0)
        self.latency = {t: Histogram() for t in timed}
        self.sources: list[FigureSource] = []

    def add_source(self, source: FigureSource) -> None:
        """Report ``source``'s figures with the others, from now on."""
        self.sources.append(source)

    def figures(self) -> list[Figure]:
        """The added sources' figures, now."""
        return [f for source in self.sources for f in source.figures()]

    def error(self, code: int) -> None:
        """Count one ErrorEvent sent, by its code."""
        try:
            name = pb.ErrorCode.Name(code).removeprefix("ERROR_CODE_")
        except ValueError:
            name = str(code)
        self.errors[name] = self.errors.get(name, 0) + 1

    def hook_decision(self, action: str) -> None:
        """Count one hook decision: ``allow``, ``block`` or ``transform`` (``smith_fast.hooks``' actions)."""
        self.hook_decisions[action] = self.hook_decisions.get(action, 0) + 1

    def observe_request(self, kind: str, seconds: float) -> None:
        """Record how long one request of ``kind`` ran."""
        hist = self.latency.get(kind)
        if hist is None:
            hist = self.latency[kind] = Histogram()
        hist.observe(seconds)

    def uptime(self) -> float:
        return time.monotonic() - self.started

    def samples(self, core: Gauges) -> list[Sample]:
        """Every figure as ``(name, labels, value)``; histograms as their ``_count`` and ``_sum``.

        Args:
            core: the core whose sessions and processes the gauges count.

        Returns:
            The samples, in the order of the table in this module's docstring.
        """
        out: list[Sample] = []
        for proto, io in self.io.items():
            labels = {"protocol": proto}
            out.append(("smith_fast_frames_received_total", labels, float(io.frames_in)))
            out.append(("smith_fast_frames_sent_total", labels, float(io.frames_out)))
            out.append(("smith_fast_bytes_received_total", labels, float(io.bytes_in)))
            out.append(("smith_fast_bytes_sent_total", labels, float(io.bytes_out)))
        out += [("smith_fast_commands_total", {"type": k}, float(v)) for k, v in self.commands.items()]
        out += [("smith_fast_errors_total", {"code": k}, float(v)) for k, v in self.errors.items()]
        out += [("smith_fast_hook_decisions_total", {"action": k}, float(v)) for k, v in self.hook_decisions.items()]
        out += [("smith_fast_sessions_total", {"protocol": k}, float(v)) for k, v in self.sessions_total.items()]
        live = core.sessions_by_protocol()
        out += [("smith_fast_active_sessions", {"protocol": k}, float(v)) for k, v in live.items()]
        out.append(("smith_fast_running_processes", {}, float(core.running_processes)))
        out.append(("smith_fast_network_connections", {}, float(core.network_connections())))
        for kind, hist in self.latency.items():
            out.append(("smith_fast_request_duration_seconds_count", {"type": kind}, float(hist.count)))
            out.append(("smith_fast_request_duration_seconds_sum", {"type": kind}, hist.sum))
        out.append(("smith_fast_uptime_seconds", {}, self.uptime()))
        out += [(f.name, f.labels, f.value) for f in self.figures()]
        return out


# ---- resource usage --------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (``/proc/self/statm``; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if os.uname().sysname == "Darwin" else peak * 1024


def cpu_seconds() -> float:
    """User + system CPU time this process has used (its children not included)."""
    # getrusage has microsecond resolution; os.times() counts whole clock ticks (10 ms)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def open_fds() -> int:
    """Open file descriptors of this process, as ``/proc/self/fd`` lists them (0 where it does not exist)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


@record(frozen=True)
class ResourceUsage:
    """One resource reading: the fields of ``ResourceUsageEvent``."""

    memory_bytes: int
    cpu_percent: float
    file_descriptors: int
    network_connections: int

    def event(self, timestamp: int) -> pb.ResourceUsageEvent:
        return pb.ResourceUsageEvent(
            memory_bytes=self.memory_bytes,
            cpu_percent=self.cpu_percent,
            file_descriptors=self.file_descriptors,
            network_connections=self.network_connections,
            timestamp=timestamp,
        )


class ResourceSampler:
    """Reads resource usage; CPU % is over the time since the previous reading (or creation).

    Each reader (a peer's report timer, the health check) keeps its own sampler, so one reader's
    interval does not change another's CPU figure. 100 % is one core fully busy.
    """

    __slots__ = ("_cpu", "_wall")

    def __init__(self) -> None:
        self._cpu = cpu_seconds()
        self._wall = time.monotonic()

    def sample(self, connections: int) -> ResourceUsage:
        """Read memory, CPU %, fds now; ``connections`` is passed through.

        Args:
            connections: the live network sessions to report (the core counts them).

        Returns:
            The reading.
        """
        cpu, wall = cpu_seconds(), time.monotonic()
        elapsed = wall - self._wall
        percent = 100.0 * (cpu - self._cpu) / elapsed if elapsed > 0 else 0.0
        self._cpu, self._wall = cpu, wall
        return ResourceUsage(rss_bytes(), round(percent, 2), open_fds(), connections)
