"""What a session writes down besides its events: its recording (``--record``, or a session
granted ``replay``) and its periodic metrics reports (the ``metrics`` handshake addition)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .auth import TOKEN_KEY, redacted_handshake
from .metrics import Gauges, ResourceSampler
from .sinks import EventSink, now_ms

if TYPE_CHECKING:
    from ..replay import RecordingStore, SessionRecorder
    from .metrics import ServiceMetrics

__all__ = ["MetricsReporter", "ReportCore", "close_recording", "loggable", "open_recording"]

log = get_logger("smith_fast.session")

_METRICS = pb.Envelope.DESCRIPTOR.fields_by_name["metrics"].number
_RESOURCE_USAGE = pb.Envelope.DESCRIPTOR.fields_by_name["resource_usage"].number
_CLOSING_LOGS: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps only weak refs)


def open_recording(
    recordings: RecordingStore, sink: EventSink, *, session_id: str, version: int, service_id: str, peer: str, conceal: list[str | None]
) -> SessionRecorder | None:
    """Record a session (every envelope in and out) in ``recordings``; a failure to start or to
    write is reported to the peer as a warning and the session goes on. What ``conceal`` lists
    (the service's token, the session's resume token) is never written."""
    try:
        recorder = recordings.open(
            session_id=session_id,
            protocol_version=version,
            service_id=service_id,
            on_error=lambda err: sink.log(pb.LOG_LEVEL_WARN, f"recording stopped: {err}", fields={"reason": "recording_failed"}),
            metadata={"peer": peer},
        )
    except OSError as exc:
        log.warning("cannot record session", extra={"fields": {"peer": peer, "error": str(exc)}})
        sink.log(pb.LOG_LEVEL_WARN, f"cannot record this session: {exc}", fields={"reason": "recording_failed"})
        return None
    for secret in conceal:
        recorder.conceal(secret)
    sink.record_to(recorder)
    return recorder


def close_recording(recorder: SessionRecorder) -> None:
    """Close a session log once everything the session will ever send was written: its fsync in a
    worker thread, as a long session's log must not stall every other session."""
    task = asyncio.get_running_loop().create_task(recorder.aclose())
    _CLOSING_LOGS.add(task)
    task.add_done_callback(_CLOSING_LOGS.discard)


def loggable(env: pb.Envelope, kind: str | None) -> bytes:
    """The bytes of ``env`` for the session log: a handshake's token and resume token replaced (auth.py)."""
    if kind == "command":
        if TOKEN_KEY in env.command.handshake.client_info or env.command.handshake.resume_token:
            env = redacted_handshake(env)
    elif kind == "batch_command" and any(
        TOKEN_KEY in c.handshake.client_info or c.handshake.resume_token for c in env.batch_command.commands
    ):
        env = redacted_handshake(env)
    return env.SerializeToString()


class ReportCore(Gauges, Protocol):
    """What a metrics report reads of the core."""

    @property
    def metrics(self) -> ServiceMetrics: ...

    def network_connections(self) -> int: ...


class Reported(Protocol):
    @property
    def paused(self) -> bool: ...

    @property
    def closing(self) -> bool: ...


def send_metrics(core: ReportCore, sink: EventSink, sampler: ResourceSampler) -> None:
    """One report: a MetricsEvent per sample, then a ResourceUsageEvent."""
    ts = now_ms()
    for name, labels, value in core.metrics.samples(core):
        sink.envelope(_METRICS, pb.MetricsEvent(metric_name=name, value=value, timestamp=ts, labels=labels).SerializeToString())
    usage = sampler.sample(core.network_connections())
    sink.envelope(_RESOURCE_USAGE, usage.event(ts).SerializeToString())


class MetricsReporter:
    """A session's MetricsEvents every ``interval`` s, skipped while its peer does not read."""

    __slots__ = ("_task",)

    def __init__(self, session: Reported, core: ReportCore, sink: EventSink, interval: float) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(session, core, sink, interval))

    @staticmethod
    async def _run(session: Reported, core: ReportCore, sink: EventSink, interval: float) -> None:
        sampler = ResourceSampler()
        while True:
            await asyncio.sleep(interval)
            if session.closing:
                return
            if not session.paused:  # a peer that does not read would only make us buffer reports
                send_metrics(core, sink, sampler)

    def stop(self) -> None:
        self._task.cancel()
