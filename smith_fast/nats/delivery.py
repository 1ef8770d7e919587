"""Relay messages handed to a plain function as the NATS connection reads them.

nats-py delivers a message in three loop iterations: its read task wakes on the socket's bytes and
parses them, each message goes into its subscription's queue, and the subscription's task wakes to
run the callback. A relayed tool call crosses that twice on each of the gateway and the worker, so
the relay pays four wake-ups per round trip that ``serve`` does not (and a session start as many).

:class:`InlineDelivery` takes both out, for the subscriptions it makes (the relay's subjects):

* the bytes the socket delivers are parsed by nats-py's own parser inside the transport's
  ``data_received``, when nothing is waiting for nats-py's read task (its reader's buffer is empty
  and the task waits for more): then every byte before them has been parsed already, and the
  order of the stream is kept. Otherwise (at start-up, after a reconnection, while the read task
  has bytes to catch up on) they take nats-py's path, and the next ones come here again once it
  has caught up;
* a message of such a subscription is handed to its handler right where the parser found it
  (no ``Msg``, no queue, no task): the handler takes the subject and the payload, and returns.

Everything else of the protocol (PING/PONG, INFO, errors, other subscriptions, reconnection,
TLS, drain) stays nats-py's: its parser does the parsing, on its own state. Uses nats-py's private
parts (pinned in pyproject: nats-py>=2.16,<3), as :func:`~smith_fast.nats.relay.publish_now` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..logs import get_logger

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

__all__ = ["Handler", "InlineDelivery"]

log = get_logger("smith_fast.nats")

Handler = Callable[[bytes, bytes], None]  # (subject, payload)


class InlineDelivery:
    """The inline path of one client's messages (see the module's docstring).

    Args:
        nc: a connected client; its protocol handler is wrapped once here, and again after each
            reconnection (:meth:`reconnected`).
    """

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._handlers: dict[int, Handler] = {}
        self._wrapped: Any = None  # the transport whose protocol is wrapped
        original = nc._process_msg  # noqa: SLF001
        handlers = self._handlers
        stats = nc.stats

        async def process_msg(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes) -> None:  # headers: None when none
            handler = handlers.get(sid)
            if handler is None or headers:
                await original(sid, subject, reply, data, headers)
                return
            stats["in_msgs"] += 1
            stats["in_bytes"] += len(data)
            try:
                handler(subject, data)
            except Exception:  # a fault of one message's handling is not the connection's (as a callback's in nats-py)
                log.exception("relay message not handled", extra={"fields": {"subject": subject.decode(errors="replace")}})

        nc._process_msg = process_msg  # type: ignore[method-assign]  # noqa: SLF001  (the parser calls it for every MSG)
        self._wrap()

    async def subscribe(self, subject: str, handler: Handler) -> None:
        """Subscribe to ``subject``; its messages go to ``handler(subject, payload)``, in order."""

        async def queued(msg: Msg) -> None:  # only if a message were read before the handler is known
            handler(msg.subject.encode(), msg.data)

        sub = await self._nc.subscribe(subject, cb=queued)
        self._handlers[sub._id] = handler  # noqa: SLF001  (nats-py's sid; SUB is written by its flusher, later)

    def reconnected(self) -> None:
        """The client has a new connection: wrap its protocol too."""
        self._wrap()

    def _wrap(self) -> None:
        nc = self._nc
        writer = getattr(nc._transport, "_io_writer", None)  # noqa: SLF001  (TcpTransport: a StreamWriter)
        reader = getattr(nc._transport, "_io_reader", None)  # noqa: SLF001
        transport = getattr(writer, "transport", None)
        if transport is None or reader is None or transport is self._wrapped:
            return
        inner = transport.get_protocol()
        if not isinstance(inner, asyncio.StreamReaderProtocol):
            return  # a transport of another kind (websocket): nats-py's path only
        self._wrapped = transport
        transport.set_protocol(_InlineProtocol(nc, inner, reader))


class _InlineProtocol(asyncio.Protocol):
    """The transport's protocol: bytes parsed here when nats-py's read task has nothing pending,
    else handed to its stream reader; every other event goes to the reader's protocol."""

    def __init__(self, nc: NATS, inner: asyncio.StreamReaderProtocol, reader: asyncio.StreamReader) -> None:
        self._nc = nc
        self._inner = inner
        self._reader = reader
        self._parser = nc._ps  # noqa: SLF001
        self._busy: asyncio.Future[None] | None = None  # a parse that suspended (rare: INFO, -ERR)
        self._held: list[bytes] = []  # read while it runs

    def data_received(self, data: bytes) -> None:
        if self._busy is not None:
            self._held.append(data)
            return
        reader = self._reader
        nc = self._nc
        # nats-py's read task waits for bytes and has none: all before these are parsed
        if reader._buffer or reader._waiter is None or nc.is_closed or nc.is_reconnecting:  # type: ignore[attr-defined]  # noqa: SLF001
            self._inner.data_received(data)
            return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        coro = self._parser.parse(data)
        try:
            waiting = coro.send(None)
        except StopIteration:
            return
        except Exception as exc:
            self._failed(exc)
            return
        self._busy = asyncio.ensure_future(self._finish(coro, waiting))

    async def _finish(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        """Drive a parse that suspended to its end, then what was read meanwhile."""
        while True:
            try:
                await waiting
            except BaseException as exc:  # noqa: BLE001  (handed to the parse, as a task would)
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    break
                except BaseException as error:  # noqa: BLE001
                    self._failed(error)
                    break
                continue
            try:
                waiting = coro.send(None)
            except StopIteration:
                break
            except BaseException as error:  # noqa: BLE001
                self._failed(error)
                break
        self._busy = None
        held, self._held = self._held, []
        for data in held:
            self.data_received(data)

    def _failed(self, exc: BaseException) -> None:
        """The parse raised (a protocol error): as nats-py's read task does, the connection is
        dropped and nats-py reconnects."""
        log.warning("nats protocol error", extra={"fields": {"error": repr(exc)}})
        transport = getattr(self._nc._transport, "_io_writer", None)  # noqa: SLF001
        if transport is not None:
            transport.transport.abort()

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
