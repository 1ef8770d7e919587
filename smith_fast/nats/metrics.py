"""The NATS figures of a gateway and of a worker, as :class:`~smith_fast.service.metrics.Figure`s.

Both are added to their core's metrics (``core.metrics.add_source``), so they show on
``/metrics``, in in-stream ``MetricsEvent`` samples and nowhere else differently.

| name | kind | where | what |
|---|---|---|---|
| ``smith_fast_nats_connected`` | gauge | both | 1 while connected to NATS |
| ``smith_fast_nats_rtt_seconds`` | gauge | both | last measured round trip to the NATS server |
| ``smith_fast_nats_queue_depth`` | gauge | gateway | commands in the work-queue stream no worker took yet |
| ``smith_fast_nats_commands_in_flight`` | gauge | gateway | commands handed to a worker, not yet acknowledged |
| ``smith_fast_nats_workers_alive`` | gauge | gateway | workers heard from recently |
| ``smith_fast_nats_worker_running`` / ``_capacity`` | gauge | gateway | per ``worker``: commands running / its concurrency |
| ``smith_fast_nats_commands_dispatched_total`` | counter | both | gateway: commands stored in the stream; worker: commands handed to it |
| ``smith_fast_nats_commands_redelivered_total`` | counter | both | gateway: requests whose events came from a second delivery; worker: deliveries after the first |
| ``smith_fast_nats_commands_acked_total`` | counter | both | gateway: requests whose final event came back; worker: commands acknowledged |
| ``smith_fast_nats_events_relayed_total`` | counter | both | gateway: event messages received; worker: published |
| ``smith_fast_nats_worker_running`` | gauge | worker | commands it runs now (no label) |
| ``smith_fast_nats_journal_sessions`` | gauge | gateway | sessions journaled now (``--gateway-id``: smith_fast.nats.journal) |
| ``smith_fast_nats_journal_messages_total`` | counter | gateway | journal messages published |
| ``smith_fast_nats_sessions_taken_over_total`` | counter | gateway | sessions of the process before this one taken over at its start |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..service.metrics import Figure
from .presence import Announcement

__all__ = ["NatsCounters", "gateway_figures", "worker_figures"]


@dataclasses.dataclass
class NatsCounters:
    """What one gateway or worker counts (plain ints, added to on the hot path)."""

    dispatched: int = 0
    redelivered: int = 0
    acked: int = 0
    events: int = 0
    connected: bool = False
    rtt: float = 0.0
    journal_messages: int = 0  # gateway with --gateway-id: journal messages published
    taken_over: int = 0  # gateway: sessions of the process before taken over


def _common(c: NatsCounters) -> list[Figure]:
    return [
        Figure("smith_fast_nats_connected", "1 while connected to NATS", 1.0 if c.connected else 0.0),
        Figure("smith_fast_nats_rtt_seconds", "Last measured round trip to the NATS server", c.rtt),
        Figure("smith_fast_nats_commands_dispatched_total", "Commands stored in (gateway) or taken from (worker) the work queue",
               float(c.dispatched), counter=True),
        Figure("smith_fast_nats_commands_redelivered_total", "Commands delivered again after a worker died or stalled",
               float(c.redelivered), counter=True),
        Figure("smith_fast_nats_commands_acked_total", "Commands finished: final event relayed (gateway), acknowledged (worker)",
               float(c.acked), counter=True),
        Figure("smith_fast_nats_events_relayed_total", "Event messages received (gateway) or published (worker)",
               float(c.events), counter=True),
    ]


def gateway_figures(c: NatsCounters, queue_depth: int, in_flight: int, workers: Iterable[Announcement], journaled: int = 0) -> list[Figure]:
    """A gateway's figures: its counters, the queue as last polled, its live workers and the
    sessions it journals."""
    live = list(workers)
    out = _common(c)
    out += [
        Figure("smith_fast_nats_journal_sessions", "Resumable sessions journaled in NATS for a restart (--gateway-id)", float(journaled)),
        Figure("smith_fast_nats_journal_messages_total", "Journal messages published", float(c.journal_messages), counter=True),
        Figure("smith_fast_nats_sessions_taken_over_total", "Sessions of the process before taken over at this one's start",
               float(c.taken_over), counter=True),
    ]
    out += [
        Figure("smith_fast_nats_queue_depth", "Commands in the work-queue stream that no worker took yet", float(queue_depth)),
        Figure("smith_fast_nats_commands_in_flight", "Commands handed to a worker and not yet acknowledged", float(in_flight)),
        Figure("smith_fast_nats_workers_alive", "Workers heard from in the last three presence intervals", float(len(live))),
    ]
    out += [Figure("smith_fast_nats_worker_running", "Commands running, per worker", float(w.running), {"worker": w.worker}) for w in live]
    out += [Figure("smith_fast_nats_worker_capacity", "Commands a worker runs at once", float(w.capacity), {"worker": w.worker}) for w in live]
    return out


def worker_figures(c: NatsCounters, running: int, capacity: int) -> list[Figure]:
    """A worker's figures: its counters and what it runs now."""
    return [
        *_common(c),
        Figure("smith_fast_nats_worker_running", "Commands this worker runs now", float(running)),
        Figure("smith_fast_nats_worker_capacity", "Commands this worker runs at once", float(capacity)),
    ]
