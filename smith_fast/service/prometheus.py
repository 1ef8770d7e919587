"""Prometheus exposition of the core's metrics: ``smith-fast serve --metrics HOST:PORT``.

A custom collector reads the core's plain counters only when scraped (nothing on the hot path
touches prometheus_client), next to prometheus_client's own process collector
(``process_resident_memory_bytes``, ``process_cpu_seconds_total``, ``process_open_fds`` ...), so
dashboards built for any Python exporter work unchanged. ``GET /metrics`` is answered on the
service's own event loop by the service's HTTP server (no exporter thread reading the core's
state concurrently), in the text format or OpenMetrics as the scraper's ``Accept`` header asks.
"""

from __future__ import annotations

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
from ..errors import HttpRefused
from ..http.head import Head
from ..http.server import HttpConnection, HttpLimits, HttpServer, Request
from ..logs import get_logger
from .metrics import Figure, Gauges, ServiceMetrics

__all__ = ["MetricsSource", "SmithCollector", "make_registry", "MetricsServer"]

log = get_logger("smith_fast.metrics")

PATH = "/metrics"
_MAX_BODY = 1024  # a scrape has none; a small one is refused (405) without being read
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
    """``GET``/``HEAD /metrics``: a route of the service's HTTP server (:mod:`smith_fast.http.server`).

    Scrapers are not peers: their connections do not count towards ``--max-connections``, carry
    no body and have :data:`_READ_TIMEOUT` to send a request.

    Args:
        core: the service core to expose.
    """

    def __init__(self, core: MetricsSource) -> None:
        self.registry = make_registry(core)
        self.server = HttpServer({PATH: self}, HttpLimits(max_body=_MAX_BODY, first_timeout=_READ_TIMEOUT, idle_timeout=_READ_TIMEOUT),
                                 name="metrics")
        self.addresses: list[str] = []

    async def listen(self, host: str, port: int, *, backlog: int = 100) -> str:
        """Listen on ``host:port`` (port 0 picks one) with an accept queue of ``backlog``; returns
        ``http://HOST:PORT/metrics``."""
        h, p = await self.server.listen(host, port, backlog=backlog)
        address = f"http://[{h}]:{p}{PATH}" if ":" in h else f"http://{h}:{p}{PATH}"
        self.addresses.append(address)
        return address

    def share(self, server: HttpServer, host: str, port: int) -> str:
        """Serve ``/metrics`` on another front's HTTP server too (``--metrics`` and ``--mcp-http``
        on one address: one listener, its limits and its connection count); the URL."""
        server.add_route(PATH, self)
        address = f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"
        self.addresses.append(address)
        return address

    def close(self) -> None:
        self.server.close()

    def admit(self, conn: HttpConnection, head: Head) -> None:
        if head.method not in ("GET", "HEAD"):
            raise HttpRefused(405, f"{head.method} is not allowed on {PATH}; GET it", headers=(("Allow", "GET, HEAD"),))

    def handle(self, conn: HttpConnection, request: Request) -> None:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        conn.respond(200, encoder(self.registry), content_type, [])

    def closed(self, conn: HttpConnection) -> None:
        pass
