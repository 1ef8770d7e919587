"""Prometheus exposition of the core's metrics: ``smith-fast serve --metrics HOST:PORT``.

A custom collector reads the core's plain counters only when scraped (nothing on the hot path
touches prometheus_client), next to prometheus_client's own process collector
(``process_resident_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds`` ...), so
dashboards built for any Python exporter work unchanged. ``GET /metrics`` is answered on the
service's own event loop (no exporter thread reading the core's state concurrently), in the text
format or OpenMetrics as the scraper's ``Accept`` header asks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from .. import framing
from .._version import __version__
from ..logs import get_logger
from .metrics import Figure, Gauges, ServiceMetrics

__all__ = ["MetricsSource", "SmithCollector", "make_registry", "MetricsServer"]

log = get_logger("smith_fast.metrics")

_MAX_REQUEST = 16 * 1024
_READ_TIMEOUT = 10.0



class MetricsSource(Gauges, Protocol):
    """What a scrape reads (:class:`~smith_fast.service.core.ServiceCore` is one)."""

    @property
    def metrics(self) -> ServiceMetrics: ...

    @property
    def service_id(self) -> str: ...

    @property
    def loop_name(self) -> str: ...

class SmithCollector:
    """Turns :class:`~smith_fast.service.metrics.ServiceMetrics` into metric families on each scrape.

    Args:
        core: the service core to read.
    """

    def __init__(self, core: MetricsSource) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        """Yield every family (see the table in ``smith_fast.service.metrics``)."""
        core, m = self.core, self.core.metrics
        info = InfoMetricFamily("smith_fast", "The service process")
        info.add_metric(
            [],
            {
                "version": __version__,
                "service_id": core.service_id,
                "implementation": framing.IMPLEMENTATION,
                "event_loop": core.loop_name,
            },
        )
        yield info
        io_families = [
            ("frames_received", "Frames received: v1 envelopes, v0 lines, gRPC messages", "frames_in"),
            ("frames_sent", "Frames sent: v1 envelopes, v0 lines, gRPC messages", "frames_out"),
            ("bytes_received", "Bytes received", "bytes_in"),
            ("bytes_sent", "Bytes sent", "bytes_out"),
        ]
        for name, doc, attr in io_families:
            fam = CounterMetricFamily(f"smith_fast_{name}", doc, labels=["protocol"])
            for proto, io in m.io.items():
                fam.add_metric([proto], getattr(io, attr))
            yield fam
        for name, doc, label, values in (
            ("commands", "Commands received, by type", "type", m.commands),
            ("errors", "ErrorEvents sent, by ErrorCode", "code", m.errors),
            ("hook_decisions", "Hook decisions, by action", "action", m.hook_decisions),
            ("sessions", "Sessions opened, by protocol", "protocol", m.sessions_total),
        ):
            fam = CounterMetricFamily(f"smith_fast_{name}", doc, labels=[label])
            for key, value in values.items():
                fam.add_metric([key], value)
            yield fam
        live = GaugeMetricFamily("smith_fast_active_sessions", "Live sessions, by protocol", labels=["protocol"])
        for proto, n in core.sessions_by_protocol().items():
            live.add_metric([proto], n)
        yield live
        yield GaugeMetricFamily("smith_fast_running_processes", "Shell commands running", value=core.running_processes)
        yield GaugeMetricFamily(
            "smith_fast_network_connections", "Live sessions over Unix, TCP and gRPC", value=core.network_connections()
        )
        yield GaugeMetricFamily("smith_fast_uptime_seconds", "Seconds since the service started", value=m.uptime())
        hist = HistogramMetricFamily("smith_fast_request_duration_seconds", "Request duration, by type", labels=["type"])
        for kind, h in m.latency.items():
            hist.add_metric([kind], h.cumulative(), h.sum)
        yield hist
        yield from _families(m.figures())


def _families(figures: Iterable[Figure]) -> Iterator[Metric]:
    """The added sources' figures as metric families, one per name."""
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
    for f in figures:
        fam = families.get(f.name)
        if fam is None:
            kind = CounterMetricFamily if f.counter else GaugeMetricFamily
            fam = families[f.name] = kind(f.name, f.doc, labels=list(f.labels))
        fam.add_metric(list(f.labels.values()), f.value)
    yield from families.values()


def make_registry(core: MetricsSource) -> CollectorRegistry:
    """A registry with the Smith collector and prometheus_client's process and platform collectors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SmithCollector(core))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class MetricsServer:
    """A minimal HTTP/1.1 endpoint on the running loop: ``GET``/``HEAD /metrics``; one request per
    connection.

    Args:
        core: the service core to expose.
    """

    def __init__(self, core: MetricsSource) -> None:
        self.registry = make_registry(core)
        self.servers: list[asyncio.base_events.Server] = []
        self.addresses: list[str] = []

    async def listen(self, host: str, port: int, *, backlog: int = 100) -> str:
        """Listen on ``host:port`` (port 0 picks one) with an accept queue of ``backlog``; returns
        ``http://HOST:PORT/metrics``."""
        server = await asyncio.start_server(self._handle, host, port, reuse_address=True, limit=_MAX_REQUEST, backlog=backlog)
        self.servers.append(server)
        h, p = server.sockets[0].getsockname()[:2]
        address = f"http://[{h}]:{p}/metrics" if ":" in h else f"http://{h}:{p}/metrics"
        self.addresses.append(address)
        return address

    def close(self) -> None:
        for server in self.servers:
            server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            status, headers, body = self._respond(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            writer.close()
            return
        try:
            head_only = head.startswith(b"HEAD ")
            lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(body)}", "Connection: close", "", ""]
            writer.write("\r\n".join(lines).encode("latin-1") + (b"" if head_only else body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _respond(self, head: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = request_line.split()
        if len(parts) != 3:
            return "400 Bad Request", [("Content-Type", "text/plain")], b"malformed request line\n"
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")], b"GET /metrics\n"
        if target.split("?", 1)[0] != "/metrics":
            return "404 Not Found", [("Content-Type", "text/plain")], b"metrics are at /metrics\n"
        accept = ""
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        return "200 OK", [("Content-Type", content_type)], encoder(self.registry)
