"""EgressProxy: one policy, served on any number of listeners (:class:`Served`, one per sandbox)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket

from ..logs import get_logger, log_fields
from .addresses import host_addresses
from .attempts import Attempt, Observer, Record, Verdict
from .connection import ANSWERED, DECIDING, RELAY, ProxyConnection
from .limits import EgressLimits
from .policy import EgressPolicy
from .resolver import Resolver, SystemResolver

__all__ = ["EgressProxy", "Served"]


_log = get_logger("smith_fast.egress")


def _observer_failed(call: str, attempt: Attempt, exc: Exception) -> None:
    log_fields(_log, logging.ERROR, "egress observer failed",
               {"call": call, "host": attempt.host, "port": attempt.port, "error": repr(exc)})


class Served:
    """One listener being served: its connections, its bounds, its observer.

    A sweeper (one timer per listener, not one per connection) closes connections that took
    longer than the handshake timeout to name a destination, and tunnels idle for longer than the
    idle timeout; a connection over the limit is closed at accept.
    """

    def __init__(self, proxy: "EgressProxy", listener: socket.socket, observer: Observer,
                 policy: EgressPolicy | None = None) -> None:
        self.policy = proxy.policy if policy is None else policy.with_own(proxy.policy.own)
        self.limits = proxy.limits
        self.resolver = proxy.resolver
        self.observer = observer
        self.connections: set[ProxyConnection] = set()
        self._listener = listener
        self._address = listener.getsockname()
        self.loop = self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        listener.setblocking(False)
        limits = proxy.limits
        # a timeout of 0 is none: never reached in ticks, and no reason for a faster sweep
        handshake = limits.handshake_timeout or math.inf
        idle = limits.idle_timeout or math.inf
        self._tick = max(0.02, min(1.0, handshake / 4, idle / 4))
        self._handshake_ticks = handshake / self._tick
        self._idle_ticks = idle / self._tick
        self._accepting = self._loop.create_task(self._accept())
        self._sweeper = self._loop.call_later(self._tick, self._sweep)
        self._closed = asyncio.Event()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) it listens on; (path, 0) for a Unix socket."""
        if isinstance(self._address, (str, bytes)):
            return (os.fsdecode(self._address), 0)
        return (str(self._address[0]), int(self._address[1]))

    async def _accept(self) -> None:
        loop = self._loop
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except asyncio.CancelledError:
                raise
            except OSError:
                # EMFILE and kin: wait instead of spinning; the listener itself stays
                await asyncio.sleep(0.1)
                continue
            if len(self.connections) >= self.limits.max_connections:
                sock.close()
                attempt, verdict = Attempt("", 0, "connect"), Verdict(False, "limit", "too many connections")
                self.refused(attempt, verdict)
                try:
                    self.observer.closed(Record(attempt, None, verdict, 0, 0))
                except Exception as exc:
                    _observer_failed("closed", attempt, exc)
                continue
            sock.setblocking(False)
            connection = ProxyConnection(self, sock)
            self.connections.add(connection)
            task = loop.create_task(connection.run())
            connection.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _sweep(self) -> None:
        for connection in list(self.connections):
            connection.age += 1
            connection.quiet += 1
            if connection.phase == RELAY:
                if connection.quiet >= self._idle_ticks:
                    connection.task.cancel()
            elif connection.phase < DECIDING and connection.age >= self._handshake_ticks:
                connection.task.cancel()
            elif connection.phase == ANSWERED and connection.quiet >= self._handshake_ticks:
                connection.task.cancel()  # a client that does not read our answer
            # DECIDING is bounded by the hook's, the resolver's and the connect timeouts
        self._sweeper = self._loop.call_later(self._tick, self._sweep)

    def ended(self, connection: ProxyConnection, record: Record) -> None:
        """A connection's end: its one Record to the observer."""
        self.connections.discard(connection)
        try:
            self.observer.closed(record)
        except Exception as exc:  # the service's bug must not end the proxy's bookkeeping
            _observer_failed("closed", record.attempt, exc)

    def refused(self, attempt: Attempt, verdict: Verdict) -> None:
        """An attempt refused: to the observer."""
        try:
            self.observer.refused(attempt, verdict)
        except Exception as exc:
            _observer_failed("refused", attempt, exc)

    def close(self) -> None:
        """Stop accepting and abort every connection (each still gives its Record)."""
        if self._closed.is_set():
            return
        self._accepting.cancel()
        self._sweeper.cancel()
        self._listener.close()
        for task in list(self._tasks):
            task.cancel()
        self._closed.set()

    async def wait_closed(self) -> None:
        """Until :meth:`close` was called and the accept task ended."""
        await self._closed.wait()
        await asyncio.gather(self._accepting, *self._tasks, return_exceptions=True)


class EgressProxy:
    """HTTP CONNECT, plain-HTTP forwarding and SOCKS5 on one listener, under one policy.

    Args:
        policy: the rules (narrowed per session by making one proxy per narrowed policy).
        resolver: names to addresses (the host's resolver when None).
        limits: the bounds (the defaults of :class:`EgressLimits` when None).
    """

    def __init__(self, policy: EgressPolicy, *, resolver: Resolver | None = None,
                 limits: EgressLimits | None = None) -> None:
        self.policy = policy if policy.own else policy.with_own(host_addresses())
        self.resolver: Resolver = resolver if resolver is not None else SystemResolver()
        self.limits = limits or EgressLimits()

    def serve(self, listener: socket.socket, observer: Observer, *, policy: EgressPolicy | None = None) -> Served:
        """Accept on an already-listening socket (made inside the sandbox's network namespace), on the running loop.

        Args:
            listener: a listening TCP socket; the Served owns it from here (:meth:`Served.close` closes it).
            observer: hears every attempt, refusal and Record of this listener.
            policy: this listener's policy instead of the proxy's (a session's
                ``proxy.policy.narrowed(...)``); the host's own addresses are the proxy's.
        """
        return Served(self, listener, observer, policy)

    async def start_tcp(self, host: str, port: int, observer: Observer, *,
                        policy: EgressPolicy | None = None) -> Served:
        """Listen on ``host:port`` (0: any free port; see :attr:`Served.address`) and serve it, as :meth:`serve`."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, port), family=family, backlog=1024)
        return self.serve(listener, observer, policy=policy)
