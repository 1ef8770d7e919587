"""``smith-fast gateway``: the listeners of ``smith-fast serve``, with the commands run by workers.

Frontends connect exactly as to ``serve`` (v1 or v0 on Unix, TCP and stdio, v1 on gRPC). Each
connection gets a plain :class:`~smith_fast.service.session.Session`, which answers the handshake,
health checks and everything else session-wide itself and admits each request as ``serve`` would;
its :class:`~smith_fast.nats.forwarding.NatsRunner` (the gateway's
:class:`~smith_fast.service.runner.RequestRunner`) forwards each admitted request (ShellExec,
ToolCall, HookLoad, Plan) into the command stream instead of running it. The workers' events come
back on the gateway's own event subjects (:class:`~smith_fast.nats.bridge.Bridge`); a
:class:`~.wire.RequestStream` per request turns them into what a single ``serve`` would have sent:
in order, each final event exactly once. The session's sink then stamps them (v1) or writes them
as JSON lines (v0).

:class:`Gateway` puts the parts together: a plain :class:`~smith_fast.service.core.ServiceCore`
(the gateway is its :class:`~smith_fast.service.core.Backend`: health, ``service_info``, the
journal of resumable sessions and their hand-over at shutdown), the bridge, and the runners.

``ReadyEvent`` grants ``nats`` while the gateway is connected to NATS.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import GatewayIdInUse
from ..logs import get_logger
from ..service.config import ServiceConfig
from ..service.core import Backend, ServiceCore
from ..service.negotiation import DEFAULT_METRICS_INTERVAL_MS
from ..service.resume import DetachedFront
from ..service.sinks import V1Sink
from .bridge import Bridge
from .config import NatsConfig
from .forwarding import NatsRunner
from .journal import Saved

if TYPE_CHECKING:
    from ..service.runner import RequestHost
    from ..service.session import Session

__all__ = ["Gateway", "GatewayIdInUse", "NatsRunner", "Bridge"]

log = get_logger("smith_fast.gateway")


class Gateway(Backend):
    """A service core whose sessions forward their requests to workers over NATS, and its bridge.

    Args:
        config: the service configuration (limits, protocol, JSON backend).
        nats_config: NATS names and limits.
        loop_name: reported in ``ReadyEvent.service_info``.
        gateway_id: names this gateway's subjects and consumer; given, it is fixed: resumable
            sessions are journaled and handed over to the next process with that id.

    Attributes:
        core: what the listeners serve (``serve(..., core=gateway.core)``).
        bridge: the NATS side (``await gateway.bridge.run()`` connects it, ``close()`` ends it).
    """

    def __init__(self, config: ServiceConfig, nats_config: NatsConfig, *, loop_name: str = "asyncio", gateway_id: str | None = None) -> None:
        self.core = ServiceCore(config, loop_name=loop_name, runner=self._forwarding, backend=self)
        self.bridge = Bridge(self.core, nats_config, gateway_id, durable=gateway_id is not None, restore=self._restore)
        self._journal_index: dict[str, int] = {}  # a restored session's last journal message index

    def _forwarding(self, host: RequestHost) -> NatsRunner:
        return NatsRunner(self.core, self.bridge, host)

    # ---- resumable sessions outlive the process (smith_fast.nats.journal) ---------------------------

    def made_resumable(self, session: Session) -> None:
        """With a fixed ``--gateway-id``, what a resumable session writes is journaled in NATS
        before its peer gets it, so that the next process with that id can take it over."""
        journal, runner, resumable, sink = self.bridge.journal, session.runner, session.resumable, session.sink
        if journal is None or not isinstance(runner, NatsRunner) or resumable is None or not isinstance(sink, V1Sink):
            return
        retention = resumable.retention
        runner.journal = journal.open(
            session.session_id, functools.partial(self._snapshot, session, runner, sink),
            lambda: retention.first, sink.framed, sink.flush_batch, self._journal_index.pop(session.session_id, 0),
            self.core.limits.max_session_buffer, runner.journaled,
        )
        token = self.core.config.token
        runner.journal.conceal(lambda: token)
        runner.journal.conceal(lambda: resumable.token)  # "" until a restored session's peer resumes
        sink.interpose(runner.journal.stage)

    def _snapshot(self, session: Session, runner: NatsRunner, sink: V1Sink) -> dict[str, Any]:
        resumable = session.resumable
        assert resumable is not None
        return {
            "v": 1, "key": resumable.key, "granted": sorted(session.granted), "accepted": sorted(session.accepted),
            "framed": sink.framed, "protocol": session.protocol, "peer": session.peer, "next": sink.last_sequence + 1,
            **runner.snapshot(),
        }

    def _restore(self, saved: Saved) -> None:
        """Take over one session the process before left (it handed it over, or was killed)."""
        snap = saved.snapshot
        try:
            framed, key, first = bool(snap["framed"]), str(snap["key"]), int(snap["next"])
            granted = frozenset(int(c) for c in snap["granted"])
            accepted = frozenset(str(a) for a in snap["accepted"])
            self._journal_index[saved.session_id] = int(snap["journal_index"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("journal snapshot unusable", extra={"fields": {"session": saved.session_id, "error": repr(exc)}})
            return
        front = DetachedFront(framed)
        sink = V1Sink(front.write, framed=framed, notify=front.notify, first_sequence=max(1, first))
        front.flush_batch = sink.flush_batch
        session = self.core.new_session(sink, close=front.close, front=front, peer=str(snap.get("peer", "?")),
                                        protocol=str(snap.get("protocol", "v1")), session_id=saved.session_id)
        runner = session.runner
        assert isinstance(runner, NatsRunner)
        if session.restore(key, granted, accepted, saved.units, DEFAULT_METRICS_INTERVAL_MS):
            runner.adopt(snap)
            self.bridge.counters.taken_over += 1
            log.info("session taken over", extra={"fields": {"session": saved.session_id, "requests": len(snap.get("open", [])),
                                                             "retained": len(saved.units), "window": self.core.parked.window}})

    def carried_on(self, sessions: Sequence[Session]) -> list[Session] | None:
        """As ``serve`` does, except that with a fixed ``--gateway-id`` the resumable sessions are
        handed over to the next process instead (their requests go on on the workers)."""
        if self.bridge.journal is None or not self.bridge.ready:
            return None
        return [s for s in sessions if isinstance(s.runner, NatsRunner) and s.runner.journal is not None]

    async def hand_over(self, sessions: list[Session]) -> None:
        await self.bridge.hand_over(sessions)

    def unavailable(self) -> str | None:
        return self.bridge.unavailable()

    def service_info(self) -> dict[str, str]:
        bridge = self.bridge
        info = {"smith_fast.gateway": bridge.gateway_id}
        # The handshake succeeds without workers or NATS; these say whether anything will run.
        info["smith_fast.workers"] = str(bridge.workers_alive())
        info["smith_fast.nats"] = "connected" if bridge.ready and bridge.counters.connected else "unreachable"
        reason = bridge.unavailable()
        if reason is not None:
            info["smith_fast.not_serving_reason"] = reason
        return info
