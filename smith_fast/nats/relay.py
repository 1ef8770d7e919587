"""The relay between a gateway and a worker: subjects, the message format, publishing from sync code.

A frontend's session lives on one worker; its gateway moves the frontend's bytes to that worker and
the session's bytes back, one core NATS message per loop tick each way (PROTOCOL.md, "Scale-out
over NATS"), the messages of one loop iteration written to nats-server at once (:class:`Outbox`). Nothing here is stored by the server: a message lost on the way (a NATS server
restart) is seen as a gap in the per-direction sequence and ends the relay (``relay_lost``), which
a resumable session survives like any dropped connection.

A relay message is ``seq`` (varint, per direction and connection, from 1), ``kind`` (one byte),
then the body: :data:`OPEN` (the gateway's first message: a varint size and that many bytes of
JSON — the connection's protocol, peer and first sequence number — then the frontend's first
bytes) and the worker's answer :data:`OPENED` or :data:`REFUSED`; :data:`DATA`
carries stream bytes exactly as the frontend wrote them or as the session wrote them; :data:`CLOSE`
a UTF-8 reason; :data:`ACK` a varint count; the four flow-control kinds and :data:`EOF` have no body.

Gathering (both ends say ``"acks": true``, in the OPEN's JSON and the OPENED's): the worker
acknowledges the DATA it reads (an :data:`ACK` with their count, written with what the session
answers in that loop step); while a DATA the gateway sent is not acknowledged, it does not read the
frontend, and at the ACK it sends what the frontend sent meanwhile in one DATA (64 KiB at most).
One hop carries as much as came in while the last went round, and no timer waits: a lone request
goes at once (pipelined small calls went one or two per message, each paying a message at every
hop; a window of two DATA was measured slower: smaller messages). The frontend's first
bytes travel in the OPEN, without waiting for an answer (a session starts in one hop); a refusal
makes the gateway send them again to another worker. Headers are not used on this path (one parse
less per message on both sides).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .._varint import decode as decode_varint
from .._varint import encode as encode_varint
from ..logs import get_logger

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

__all__ = [
    "ACK", "CLOSE", "DATA", "EOF", "KINDS", "OPEN", "OPENED", "READ_PAUSE", "READ_RESUME", "REFUSED", "WRITE_PAUSE", "WRITE_RESUME",
    "Outbox", "Subjects", "is_id", "pack", "publish_now", "unpack",
]

log = get_logger("smith_fast.nats")

DATA = 1
CLOSE = 2
READ_PAUSE = 3  # the receiver stops reading its peer's input (the sender's session holds its input)
READ_RESUME = 4
WRITE_PAUSE = 5  # the frontend does not take what is written: the receiving session pauses its output
WRITE_RESUME = 6
OPEN = 7  # gateway -> worker, a connection's first message: varint size, JSON (protocol, peer, first sequence), first bytes
OPENED = 8  # worker -> gateway, the answer: the session is there (JSON: the worker's id)
REFUSED = 9  # worker -> gateway, the answer: not here (UTF-8 reason: worker_draining, max_sessions ...)
EOF = 10  # gateway -> worker: the frontend sends nothing more but still reads (a file on a gateway's stdin)
ACK = 11  # worker -> gateway: a varint, how many more DATA it has read
KINDS = frozenset({DATA, CLOSE, READ_PAUSE, READ_RESUME, WRITE_PAUSE, WRITE_RESUME, OPEN, OPENED, REFUSED, EOF, ACK})

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def is_id(text: str) -> bool:
    """Whether ``text`` can name a gateway, worker or connection in a subject (one token, no wildcards)."""
    return bool(_ID.match(text))


def pack(seq: int, kind: int, body: bytes = b"") -> bytes:
    """One relay message."""
    return encode_varint(seq) + bytes((kind,)) + body


def unpack(data: bytes) -> tuple[int, int, memoryview]:
    """``(seq, kind, body)`` of one relay message.

    Raises:
        ValueError: not a relay message (bad varint, unknown kind).
    """
    try:
        seq, at = decode_varint(data[:10], 0)
    except IndexError:  # the varint runs off the end
        raise ValueError("not a relay message") from None
    if at >= len(data) or data[at] not in KINDS:
        raise ValueError("not a relay message")
    return seq, data[at], memoryview(data)[at + 1 :]


class Subjects:
    """The subjects of one deployment (``prefix``, default ``smith``); see PROTOCOL.md for the roles
    that may publish and subscribe to each (``smith-fast nats-auth`` writes them as permissions)."""

    __slots__ = ("prefix",)

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    @property
    def presence(self) -> str:
        return f"{self.prefix}.presence"

    @property
    def presence_query(self) -> str:
        return f"{self.prefix}.presence.query"

    def to_worker(self, worker: str, gateway: str, conn: str) -> str:
        return f"{self.prefix}.s.{worker}.{gateway}.{conn}"

    def to_worker_filter(self, worker: str) -> str:
        return f"{self.prefix}.s.{worker}.>"

    def to_gateway(self, gateway: str, worker: str, conn: str) -> str:
        return f"{self.prefix}.g.{gateway}.{worker}.{conn}"

    def to_gateway_filter(self, gateway: str) -> str:
        return f"{self.prefix}.g.{gateway}.>"

    def heartbeat(self, gateway: str) -> str:
        return f"{self.prefix}.hb.{gateway}"

    def heartbeat_filter(self) -> str:
        return f"{self.prefix}.hb.*"

    def processes(self, worker: str) -> str:
        """Another worker asks ``worker`` about its background processes (request/reply)."""
        return f"{self.prefix}.ps.{worker}"


_DIRECT_MAX_BUFFERED = 1 << 20  # beyond this much unsent, publishes queue in nats-py (it flushes and waits)


def publish_now(nc: NATS, subject: str, payload: bytes) -> bool:
    """Publish from synchronous code, without a task per message.

    While the connection is up and nats-py holds nothing unsent, the ``PUB`` goes straight to its
    transport: nats-py's own path (a future, a queue and its flusher task per loop iteration) cost
    the relay as much CPU as the rest of a relayed tool call (profiled: half of a gateway's time).
    Otherwise ``Client.publish``, a coroutine that only suspends when its 64 MiB pending buffer is
    full, is stepped here by hand, and only a suspended one is handed to the loop. False: the
    connection is closed or the message cannot be sent (over the server's payload limit, or the
    buffer is full while disconnected).
    """
    if _direct(nc, len(payload)):
        nc._transport.write(_pub(subject, payload))  # type: ignore[union-attr]  # noqa: SLF001  (_direct: there is one)
        _count(nc, payload)
        return True
    return _publish_queued(nc, subject, payload)


def _direct(nc: NATS, size: int) -> bool:
    """Whether a ``PUB`` may be written to nats-py's transport now, in order with what nats-py sent."""
    transport = nc._transport  # noqa: SLF001  (nats-py's, pinned in pyproject: nats-py>=2.16,<3)
    return (
        transport is not None and nc.is_connected and not nc._pending_data_size  # noqa: SLF001
        and size <= nc.max_payload and _buffered(transport) < _DIRECT_MAX_BUFFERED
    )


def _pub(subject: str, payload: bytes) -> bytes:
    return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)


def _count(nc: NATS, payload: bytes) -> None:
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(payload)


def _publish_queued(nc: NATS, subject: str, payload: bytes) -> bool:
    """``Client.publish`` stepped by hand (see :func:`publish_now`)."""
    coro = nc.publish(subject, payload)
    try:
        waiting = coro.send(None)
    except StopIteration:
        return True
    except Exception as exc:  # nats.errors.Error (closed, too large, buffer full): nothing was queued
        log.debug("publish failed", extra={"fields": {"subject": subject, "error": repr(exc)}})
        return False
    asyncio.ensure_future(_finish(coro, waiting))
    return True


_OUTBOX_MAX = 64 << 10  # bytes gathered before they are written at once (a large output is not held)


class Outbox:
    """What one NATS connection publishes on the relay in a loop iteration, written as one write.

    uvloop writes a small write at once (a syscall each), and each write to nats-server wakes it
    (and, on a busy machine, lets it take the CPU from the writer): a gateway that reads a
    frontend's and the NATS connection's bytes in the same iteration, or a worker that answers a
    session's OPEN and then writes its Ready, paid a write, a nats-server wake-up and a message to
    parse per relay message. Here the ``PUB`` commands of an iteration are gathered and written by one
    callback of the loop (``call_soon``): no waiting for more, only what is already there goes
    together. Order is kept among its messages, and behind what nats-py held unsent when they were
    published: while anything is gathered, every publish goes behind it; what cannot be written
    directly (the connection is down, nats-py holds unsent bytes) takes :func:`publish_now`'s queued
    path, in order. (A ``Client.publish`` made meanwhile may go before what is gathered: the relay's
    subjects are published through the outbox only.)

    Args:
        nc: the connection; ``loop`` defaults to the running one.
    """

    __slots__ = ("_nc", "_parts", "_size", "_scheduled", "_loop", "_flush_cb")

    def __init__(self, nc: NATS, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._nc = nc
        self._parts: list[tuple[str, bytes]] = []
        self._size = 0
        self._scheduled = False
        self._loop = loop or asyncio.get_running_loop()
        self._flush_cb: Callable[[], None] = self.flush

    def publish(self, subject: str, payload: bytes, *, hold: bool = False) -> bool:
        """Publish ``payload`` on ``subject`` with what else goes out in this iteration.

        ``hold``: gathered, but its write not scheduled yet: the caller calls :meth:`soon` once
        the callbacks that publish more (a worker's new session, which writes its first bytes
        in the connection's next step) are scheduled, so that they go in the same write. False:
        the connection is closed or the message cannot be sent (as :func:`publish_now`).
        """
        nc = self._nc
        if not self._parts and not _direct(nc, len(payload)):
            return _publish_queued(nc, subject, payload)
        if len(payload) > nc.max_payload:
            return False
        self._parts.append((subject, payload))
        self._size += len(payload)
        if self._size >= _OUTBOX_MAX:
            self.flush()
        elif not hold:
            self.soon()
        return True

    def soon(self) -> None:
        """Write what is gathered after the callbacks scheduled so far."""
        if not self._scheduled and self._parts:
            self._scheduled = True
            self._loop.call_soon(self._flush_cb)

    def flush(self) -> None:
        """Write what was gathered (called by the loop; at once when it grows large)."""
        self._scheduled = False
        parts, self._parts, self._size = self._parts, [], 0
        if not parts:
            return
        nc = self._nc
        if _direct(nc, 0):
            nc._transport.write(b"".join([_pub(subject, payload) for subject, payload in parts]))  # type: ignore[union-attr]  # noqa: SLF001
            for _, payload in parts:
                _count(nc, payload)
            return
        for subject, payload in parts:  # the connection dropped meanwhile: nats-py buffers them, in order
            _publish_queued(nc, subject, payload)


def _buffered(transport: Any) -> int:
    """Bytes nats-py's transport has not sent yet (0 when it cannot tell)."""
    writer = getattr(transport, "_io_writer", None)
    inner = getattr(writer, "transport", None)
    return inner.get_write_buffer_size() if inner is not None else _DIRECT_MAX_BUFFERED


async def _finish(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """Drive a publish that suspended on ``waiting`` (an asyncio future) to its end."""
    while True:
        try:
            await waiting
        except Exception as exc:
            try:
                waiting = coro.throw(exc)
            except (StopIteration, Exception):
                return
            continue
        try:
            waiting = coro.send(None)
        except (StopIteration, Exception):
            return
