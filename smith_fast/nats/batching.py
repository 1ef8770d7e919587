"""Batching over NATS, for throughput: what one loop iteration produces for one session leaves as
one NATS message.

A tool call through a gateway used to cost about eight NATS messages (a command publish and its
acknowledgement, its delivery, one or two event publishes with theirs, their deliveries, the
worker's ack and its confirmation), each handled in Python by nats-py and stored (and removed) by
nats-server's file store. Pipelined requests arrive together, so:

* :class:`CommandBatcher` (gateway): the commands a session forwards in one loop iteration go
  as one command message (``Smith-Commands: k``; at most ``max_commands``, and never over the
  server's ``max_payload``); one stream sequence number, one delivery, one ack for all of them.
* :class:`EventOutbox` (worker): the event messages the commands of one session emit in one loop
  iteration go as one event message (``Smith-Parts``), each part keeping its own
  ``<n>.<attempt>.<index>``, so the gateway's :class:`~.wire.RequestStream` sees exactly what it
  saw before (duplicates dropped, order restored, one final).

A lone command or event message keeps the unbatched form (no ``Smith-Commands``/``Smith-Parts``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import cast
from collections.abc import Callable, Mapping

from collections.abc import Sequence

from ..framing import FrameDecoder, encode_frames, varint_size
from ..pb import smith_pb2 as pb
from ..sequencing import Resequencer
from .jetstream import Publisher, message_size
from .wire import COMMANDS, DEFAULT_WINDOW, MSG_ID, PARTS, CommandMeta, command_headers, parse_event_msg_id

__all__ = ["CommandBatcher", "EventOutbox", "MAX_BATCH_COMMANDS", "SharedStream", "Stored", "batch_limit", "split_commands", "split_events"]

MAX_BATCH_COMMANDS = 64  # commands in one command message, at most
MAX_BATCH_PARTS = 1024  # event messages in one NATS message, at most
_HEADROOM = 512  # bytes kept free for the headers the size estimate does not see yet


def batch_limit(capacities: list[int]) -> int:
    """Commands in one command message: a quarter of the smallest live worker's ``--concurrency``
    (so a batch never holds more than a worker may run, and several workers share a burst), at
    most :data:`MAX_BATCH_COMMANDS`; 1 (no batching) while no worker is known."""
    if not capacities:
        return 1
    return max(1, min(MAX_BATCH_COMMANDS, min(capacities) // 4))


def _framed(size: int) -> int:
    return size + varint_size(size)


Stored = Callable[[int, BaseException | None], None]
"""Told how a command's storing ended: ``(sequence, None)``, or ``(0, the error)``."""


class _CommandBatch:
    __slots__ = ("meta", "payloads", "told", "size", "room")

    def __init__(self, meta: CommandMeta, max_payload: int) -> None:
        self.meta = meta
        self.payloads: list[bytes] = []
        self.told: list[Stored] = []
        self.size = 0
        # what the payloads may take: the server's max_payload less the headers (a session's hook
        # keys make them long) and the count header; a lone command over it fails alone
        self.room = max_payload - message_size(b"", command_headers(meta)) - len(f"{COMMANDS}: {MAX_BATCH_COMMANDS}\r\n")


class CommandBatcher:
    """Gathers the commands of each session forwarded in one loop iteration into one message.

    :meth:`add` returns a future of the command's stream sequence number (shared by its batch:
    one message), each command its own future, so a waiter that is cancelled cancels nobody
    else. A batch is closed before a command that would not continue it: another session's
    hooks or trace context, a gap in the numbers, ``max_commands``, or the server's
    ``max_payload``.

    Args:
        publisher: stores the messages.
        subject: the command subject of a session.
        max_commands: commands in one message, at most (the owner may change ``max_commands``).
    """

    def __init__(self, publisher: Publisher, subject: Callable[[str], str], *, max_commands: int = 1) -> None:
        self._publisher = publisher
        self._subject = subject
        self.max_commands = max_commands  # the owner follows the workers' capacities (batch_limit)
        self._open: dict[str, _CommandBatch] = {}
        self._scheduled = False
        self.messages = 0
        self.commands = 0

    def add(self, meta: CommandMeta, payload: bytes, deadline: float | None, *, alone: bool = False) -> asyncio.Future[int]:
        """Queue a command for its session's next message; ``alone``: in a message of its own
        (after the session's open batch, which is sent first, so the order holds)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.add_told(meta, payload, deadline, functools.partial(_told_future, future), alone=alone)
        return future

    def add_told(self, meta: CommandMeta, payload: bytes, deadline: float | None, told: Stored, *, alone: bool = False) -> None:
        """:meth:`add`, with ``told`` called once the command is stored (or could not be) instead
        of a future: no future, no loop callback per command (the gateway's forwarding path)."""
        batch = self._open.get(meta.session)
        if batch is not None and alone:
            self._close(meta.session, deadline)
            batch = None
        if batch is not None:
            first = batch.meta
            if (len(batch.payloads) >= self.max_commands or meta.number != first.number + len(batch.payloads) or meta.hooks != first.hooks
                    or meta.traceparent != first.traceparent or meta.capabilities != first.capabilities
                    or batch.size + _framed(len(payload)) > batch.room):
                self._close(meta.session, deadline)
                batch = None
        if batch is None:
            batch = self._open[meta.session] = _CommandBatch(meta, self._publisher.max_payload)
        batch.payloads.append(payload)
        batch.told.append(told)
        batch.size += _framed(len(payload))
        self.commands += 1
        if alone:
            self._close(meta.session, deadline)
            return
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush, deadline)

    def _flush(self, deadline: float | None) -> None:
        self._scheduled = False
        for session in list(self._open):
            self._close(session, deadline)

    def _close(self, session: str, deadline: float | None) -> None:
        batch = self._open.pop(session)
        headers = command_headers(batch.meta)
        if len(batch.payloads) == 1:
            payload = batch.payloads[0]
        else:
            headers[COMMANDS] = str(len(batch.payloads))
            payload = encode_frames(batch.payloads)
        self.messages += 1
        stored = self._publisher.publish(self._subject(session), payload, headers, deadline=deadline)
        stored.add_done_callback(functools.partial(_tell, told=batch.told))


def _tell(done: asyncio.Future[int], told: list[Stored]) -> None:
    exc = done.exception() if not done.cancelled() else asyncio.CancelledError()
    seq = done.result() if exc is None else 0
    for tell in told:
        tell(seq, exc)


def _told_future(future: asyncio.Future[int], seq: int, exc: BaseException | None) -> None:
    if future.done():
        return  # its waiter was cancelled
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(seq)


def _settle(done: asyncio.Future[int], futures: list[asyncio.Future[int]]) -> None:
    exc = done.exception() if not done.cancelled() else asyncio.CancelledError()
    for future in futures:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(done.result())


def split_commands(headers: Mapping[str, str], data: bytes, max_frame: int) -> list[bytes]:
    """The command envelopes of a command message (one, or ``Smith-Commands`` framed ones).

    Raises:
        ValueError: the count does not match the frames (not from a gateway of ours).
    """
    count = headers.get(COMMANDS)
    if count is None:
        return [data]
    decoder = FrameDecoder(max_frame)
    frames = decoder.feed(data)
    if len(frames) != int(count) or decoder.buffered:
        raise ValueError(f"{COMMANDS} says {count} commands, the payload holds {len(frames)} (and {decoder.buffered} bytes more)")
    return frames


def split_events(headers: Mapping[str, str], data: bytes, max_frame: int) -> list[tuple[int, int, int, bytes, int]]:
    """``(n, attempt, index, envelope, shared)`` of each event message an event message carries.

    ``shared`` is 0 for an event message of request ``n``; for one of the session that ran the
    ``shared`` commands of a batch from number ``n`` on (part ``b<n>-<shared>.<attempt>.<index>``)
    it is their count, and the events belong to those requests by their ``request_id``.

    Raises:
        ValueError: malformed (not from a worker of ours).
    """
    parts = headers.get(PARTS)
    if parts is None:
        n, tried, at = parse_event_msg_id(headers[MSG_ID])
        return [(n, tried, at, data, 0)]
    decoder = FrameDecoder(max_frame)
    frames = decoder.feed(data)
    ids = parts.split(",")
    if len(ids) != len(frames) or decoder.buffered:
        raise ValueError(f"{PARTS} names {len(ids)} parts, the payload holds {len(frames)}")
    out = []
    for part, frame in zip(ids, frames):
        head, attempt, index = part.split(".")
        shared = 0
        if head.startswith("b"):
            head, _, count = head[1:].partition("-")
            shared = int(count)
            if shared < 1:
                raise ValueError(f"part {part!r}: a shared part names how many commands it stands for")
        out.append((int(head), int(attempt), int(index), frame, shared))
    return out


class _EventBatch:
    __slots__ = ("session", "parts", "frames", "futures", "size")

    def __init__(self, session: str) -> None:
        self.session = session
        self.parts: list[str] = []
        self.frames: list[bytes] = []
        self.futures: list[asyncio.Future[int]] = []
        self.size = 0


class EventOutbox:
    """Gathers the event messages bound for each event subject in one loop iteration into one
    NATS message (worker side).

    Args:
        publisher: stores the messages (and republishes them until stored).
    """

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher
        self._open: dict[str, _EventBatch] = {}
        self._scheduled = False
        self.messages = 0
        self.parts = 0

    def put(self, subject: str, session: str, part: str, data: bytes) -> asyncio.Future[int]:
        """Queue one event message (``part`` = ``<n>.<attempt>.<index>``); a future of its storing.

        ``data`` must fit ``max_payload`` alone with its ``Nats-Msg-Id`` (the caller checks).
        """
        loop = asyncio.get_running_loop()
        batch = self._open.get(subject)
        limit = self._publisher.max_payload - _HEADROOM
        if batch is not None and (len(batch.parts) >= MAX_BATCH_PARTS
                                  or batch.size + _framed(len(data)) + len(part) + len(session) + 8 > limit):
            self._close(subject)
            batch = None
        if batch is None:
            batch = self._open[subject] = _EventBatch(session)
        future: asyncio.Future[int] = loop.create_future()
        batch.parts.append(part)
        batch.frames.append(data)
        batch.futures.append(future)
        batch.size += _framed(len(data)) + len(part) + 1
        self.parts += 1
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        for subject in list(self._open):
            self._close(subject)

    def _close(self, subject: str) -> None:
        batch = self._open.pop(subject)
        if len(batch.frames) == 1 and not batch.parts[0].startswith("b"):  # a batch's stream always says so
            headers = {MSG_ID: f"{batch.session}.{batch.parts[0]}"}
            payload = batch.frames[0]
        else:
            # the id names the first part and how many: a republish is the same message, stored once
            headers = {MSG_ID: f"{batch.session}.{batch.parts[0]}+{len(batch.parts)}", PARTS: ",".join(batch.parts)}
            payload = encode_frames(batch.frames)
        if message_size(payload, headers) > self._publisher.max_payload and len(batch.frames) > 1:
            # the estimate missed (long ids): send them one by one rather than lose them
            for part, frame, future in zip(batch.parts, batch.frames, batch.futures):
                one = self._publisher.publish(subject, encode_frames([frame]), {MSG_ID: f"{batch.session}.{part}", PARTS: part})
                one.add_done_callback(functools.partial(_settle, futures=[future]))
                self.messages += 1
            return
        self.messages += 1
        stored = self._publisher.publish(subject, payload, headers)
        futures = batch.futures
        stored.add_done_callback(functools.partial(_settle, futures=futures))


class SharedStream:
    """The events of a batch whose commands a worker ran in one session (gateway side): one stream
    of ``(attempt, index)`` parts, resequenced as a request's own are (duplicates dropped, early
    arrivals held, an older attempt's dropped once a newer one is heard from), then split by
    ``request_id`` into each request's runs of events, numbered 1, 2, ... per attempt as its own
    event messages would have been, for its :class:`~.wire.RequestStream`.

    Args:
        numbers: request id -> request number, for the batch's requests.
    """

    __slots__ = ("numbers", "attempt", "_reseq", "_next")

    def __init__(self, numbers: dict[str, int]) -> None:
        self.numbers = numbers
        self.attempt = 0
        self._reseq = Resequencer(DEFAULT_WINDOW)
        self._next: dict[int, int] = {}

    def position(self) -> dict[str, object]:
        """How far it came (smith_fast.nats.journal), to go on from in another process."""
        return {"numbers": self.numbers, "attempt": self.attempt, "expected": self._reseq.expected,
                "next": {str(n): i for n, i in self._next.items()}}

    @classmethod
    def restored(cls, position: Mapping[str, object]) -> SharedStream:
        """A stream that goes on from :meth:`position`."""
        numbers = position["numbers"]
        following = position["next"]
        assert isinstance(numbers, dict) and isinstance(following, dict)
        stream = cls({str(rid): int(n) for rid, n in numbers.items()})
        stream.attempt = int(str(position["attempt"]))
        stream._reseq = Resequencer(DEFAULT_WINDOW, max(1, int(str(position["expected"]))))
        stream._next = {int(n): int(i) for n, i in following.items()}
        return stream

    def push(self, attempt: int, index: int, events: Sequence[pb.Event]) -> list[tuple[int | None, int, list[pb.Event]]]:
        """``(number, index, events)`` runs now deliverable, in order; number None (index 0) for
        events of no request (the worker session's own); events of requests not in ``numbers``
        (ended at the gateway before the first event came) are dropped."""
        if attempt < self.attempt:
            return []
        if attempt > self.attempt:
            self.attempt = attempt
            self._reseq = Resequencer(DEFAULT_WINDOW)
            self._next = {}
        out: list[tuple[int | None, int, list[pb.Event]]] = []
        numbers, following = self.numbers, self._next
        # Resequencer is not generic (the compiled twin is a cdef class): what comes out is what
        # went in, event sequences
        for carried in cast("list[Sequence[pb.Event]]", self._reseq.push(index, events)):
            for event in carried:
                kind = event.WhichOneof("event_type")
                rid = getattr(getattr(event, kind), "request_id", "") if kind else ""
                number = numbers.get(rid)
                if number is None and rid:  # a request the gateway no longer follows (it ended it): nothing more of it
                    continue
                if out and out[-1][0] == number:
                    out[-1][2].append(event)
                    continue
                at = 0
                if number is not None:
                    at = following[number] = following.get(number, 0) + 1
                out.append((number, at, [event]))
        return out
