"""Health: one answer to "is this service serving?", given in-stream and by grpc.health.v1.

A peer that asked for ``health`` in its handshake sends ``Envelope.health_check_request`` on any
listener and gets ``Envelope.health_check_response`` back, with ``metrics`` filled from the core's
counters. The gRPC listener also carries the standard ``grpc.health.v1.Health`` service
(``smith_fast.service.grpc_front``), whose statuses come from :func:`serving_status` too.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

from .._version import __version__
from ..pb import smith_pb2 as pb
from .metrics import ResourceSampler, ServiceMetrics

__all__ = ["HealthSource", "SERVICE_NAMES", "serving_status", "health_response", "health_metrics"]

# Names a health check may ask about: the whole service ("") or the Smith service itself.
SERVICE_NAMES = ("", "smith.v1.SmithService", "smith-fast")

_Status = pb.HealthCheckResponse.ServingStatus


class HealthSource(Protocol):
    """What a health answer reads (:class:`~smith_fast.service.core.ServiceCore` is one)."""

    @property
    def shutting_down(self) -> bool: ...

    @property
    def metrics(self) -> ServiceMetrics: ...

    @property
    def service_id(self) -> str: ...

    @property
    def loop_name(self) -> str: ...

    @property
    def sessions(self) -> Sized: ...

    @property
    def running_processes(self) -> int: ...

    @property
    def health_sampler(self) -> ResourceSampler: ...

    def network_connections(self) -> int: ...

    def unavailable(self) -> str | None:
        """Why the service cannot serve although it runs (a gateway with no worker, NATS
        unreachable), or None."""
        ...


def serving_status(core: HealthSource, service_name: str = "") -> pb.HealthCheckResponse.ServingStatus:
    """``SERVING`` while the core runs, ``NOT_SERVING`` once it shuts down or while it says it is
    :meth:`~HealthSource.unavailable`, ``SERVICE_UNKNOWN`` for a name not in :data:`SERVICE_NAMES`."""
    if service_name not in SERVICE_NAMES:
        return _Status.SERVING_STATUS_SERVICE_UNKNOWN
    if core.shutting_down or core.unavailable() is not None:
        return _Status.SERVING_STATUS_NOT_SERVING
    return _Status.SERVING_STATUS_SERVING


def health_metrics(core: HealthSource, sampler: ResourceSampler) -> dict[str, str]:
    """The figures a HealthCheckResponse carries, as strings (the ``metrics`` map is string→string)."""
    m = core.metrics
    usage = sampler.sample(core.network_connections())
    reason = "shutting down" if core.shutting_down else core.unavailable()
    figures = {
        "version": __version__,
        "service_id": core.service_id,
        "event_loop": core.loop_name,
        "uptime_seconds": f"{m.uptime():.3f}",
        "sessions": str(len(core.sessions)),
        "running_processes": str(core.running_processes),
        "commands_total": str(sum(m.commands.values())),
        "errors_total": str(sum(m.errors.values())),
        "frames_received_total": str(sum(io.frames_in for io in m.io.values())),
        "frames_sent_total": str(sum(io.frames_out for io in m.io.values())),
        "memory_bytes": str(usage.memory_bytes),
        "cpu_percent": f"{usage.cpu_percent:.2f}",
        "file_descriptors": str(usage.file_descriptors),
        "network_connections": str(usage.network_connections),
    }
    if reason is not None:
        figures["not_serving_reason"] = reason
    return figures


def health_response(core: HealthSource, service_name: str = "") -> pb.HealthCheckResponse:
    """The in-stream answer to a ``HealthCheckRequest`` for ``service_name``.

    CPU % is measured since the previous health check of this process (or since it started).
    """
    status = serving_status(core, service_name)
    metrics = health_metrics(core, core.health_sampler) if status != _Status.SERVING_STATUS_SERVICE_UNKNOWN else {}
    return pb.HealthCheckResponse(status=status, metrics=metrics)
