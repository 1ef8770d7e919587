"""A request the gateway forwarded to the workers, as it follows it (:class:`Remote`)."""

from __future__ import annotations

import asyncio

from .control import InputChannel
from .wire import RequestStream

__all__ = ["Remote"]


class Remote:
    """One forwarded request: its number in the session, and what the frontend saw of it.

    Its :class:`~smith_fast.nats.forwarding.NatsRunner` owns it; the :class:`~smith_fast.nats.bridge.Bridge`
    keeps it by the stream sequence of its command message, to end it when no worker could run it.
    """

    __slots__ = ("number", "rid", "kind", "stream", "done", "seq", "key", "attempt", "watch", "ctl", "cancelled", "cancel_seen", "overdue",
                 "timers", "over")

    def __init__(self, number: int, rid: str, kind: str, key: str | None) -> None:
        self.number = number
        self.rid = rid
        self.kind = kind
        self.stream = RequestStream(rid)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.seq = 0  # the command's sequence number in the command stream, once stored
        self.key = key  # HookLoad: the hook's key in the hooks bucket
        self.attempt = 0  # the delivery whose events came last; 0 while no worker took it
        # Process control (smith_fast.nats.control): only requests it concerns pay for it.
        self.watch = False  # its events are looked at on the way (ctl or cancelled)
        self.ctl: InputChannel | None = None  # an interactive ShellExec's stdin and terminal
        self.cancelled = False  # the peer cancelled it
        self.cancel_seen = False  # its worker reported it cancelled
        self.overdue: asyncio.TimerHandle | None = None  # ends it here if its worker never confirms the cancel
        self.timers: list[asyncio.TimerHandle] = []  # its queue notice and timeout (NatsRunner._queue_timers)
        self.over = False  # its forwarding ended here (NatsRunner._follow): a late storing confirmation changes nothing
