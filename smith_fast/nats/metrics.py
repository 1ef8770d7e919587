"""The NATS figures of a gateway and of a worker, as :class:`~smith_fast.service.metrics.Figure`s.

Both are added to their core's metrics (``core.metrics.add_source``), so they show on
``/metrics``, in in-stream ``MetricsEvent`` samples and nowhere else differently.

| name | kind | where | what |
|---|---|---|---|
| ``smith_fast_nats_connected`` | gauge | both | 1 while connected to NATS |
| ``smith_fast_nats_rtt_seconds`` | gauge | both | last measured round trip to the NATS server |
| ``smith_fast_nats_workers_alive`` | gauge | gateway | workers heard from recently |
| ``smith_fast_nats_sessions`` | gauge | gateway | per ``worker``: sessions this gateway relays to it |
| ``smith_fast_nats_worker_sessions`` | gauge | gateway | per ``worker``: sessions it serves (its announcement) |
| ``smith_fast_nats_worker_running`` / ``_capacity`` | gauge | gateway | per ``worker``: processes running / its ``--max-processes`` |
| ``smith_fast_nats_worker_draining`` | gauge | both | 1 while the worker takes no new session (it stops) |
| ``smith_fast_nats_sessions_opened_total`` | counter | worker | sessions gateways opened here |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..service.metrics import Figure
from .presence import Announcement

__all__ = ["gateway_figures", "worker_figures"]


def _common(connected: bool, rtt: float) -> list[Figure]:
    return [
        Figure("smith_fast_nats_connected", "1 while connected to NATS", 1.0 if connected else 0.0),
        Figure("smith_fast_nats_rtt_seconds", "Last measured round trip to the NATS server", rtt),
    ]


def gateway_figures(connected: bool, rtt: float, workers: Iterable[Announcement], relayed: Mapping[str, int]) -> list[Figure]:
    """A gateway's figures: its connection, and per worker what it announced and what is relayed to it."""
    alive = list(workers)
    out = _common(connected, rtt)
    out.append(Figure("smith_fast_nats_workers_alive", "Workers heard from recently", float(len(alive))))
    for worker in sorted(set(relayed) | {a.worker for a in alive}):
        out.append(Figure("smith_fast_nats_sessions", "Sessions this gateway relays to the worker", float(relayed.get(worker, 0)),
                          labels={"worker": worker}))
    for ann in alive:
        labels = {"worker": ann.worker}
        out.append(Figure("smith_fast_nats_worker_sessions", "Sessions the worker serves (as it announced)", float(ann.sessions), labels=labels))
        out.append(Figure("smith_fast_nats_worker_running", "Processes the worker runs (as it announced)", float(ann.running), labels=labels))
        out.append(Figure("smith_fast_nats_worker_capacity", "Processes the worker runs at once at most", float(ann.capacity), labels=labels))
        out.append(Figure("smith_fast_nats_worker_draining", "1 while the worker takes no new session", 1.0 if ann.draining else 0.0,
                          labels=labels))
    return out


def worker_figures(connected: bool, rtt: float, opened: int, draining: bool) -> list[Figure]:
    """A worker's figures (its sessions and processes are the core's own figures)."""
    out = _common(connected, rtt)
    out.append(Figure("smith_fast_nats_sessions_opened_total", "Sessions gateways opened on this worker", float(opened), counter=True))
    out.append(Figure("smith_fast_nats_worker_draining", "1 while the worker takes no new session", 1.0 if draining else 0.0))
    return out
