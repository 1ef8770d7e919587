"""Where one command's events go on a worker: Envelope messages to its gateway's event subject.

Each event message is published with the id ``<session>.<n>.<attempt>.<index>`` (or
``<session>.b<n>-<count>.<attempt>.<index>`` for a batch run in one session) through the worker's
:class:`~smith_fast.nats.batching.EventOutbox`, and republished until the event stream stored it;
the gateway's :class:`~smith_fast.nats.wire.RequestStream` puts them back in order and drops
repeats.
"""

from __future__ import annotations

import asyncio

from ..pb import smith_pb2 as pb
from ..service.sinks import V1Sink
from .batching import EventOutbox
from .jetstream import Publisher, message_size
from .wire import MSG_ID, CommandMeta

__all__ = ["Publication", "unpublishable"]


class Publication:
    """Where one command's events go: Envelope messages, each published with its ``(attempt, index)`` id.

    The events a command emits in one loop iteration leave as one ``Envelope.batch_event``
    message (its sink's batcher, flushed once per iteration, at most 1024 events / 256 KiB each),
    so a burst of output costs one NATS message, not one per event; and the outbox sends the event
    messages of all the session's commands of that iteration as one NATS message (``Smith-Parts``).
    """

    __slots__ = ("sink", "stored", "meta", "_outbox", "_publisher", "_subject", "_session", "_part", "_index", "_scheduled", "_loop")

    def __init__(self, outbox: EventOutbox, publisher: Publisher, meta: CommandMeta, attempt: int, shared: int = 0) -> None:
        """``shared``: the number of commands of a batch run in one session whose events all go
        out here, as one stream (parts ``b<n>-<count>.<attempt>.<index>``); 0 for one command."""
        self.meta = meta
        self._outbox = outbox
        self._publisher = publisher
        self._subject = meta.reply
        self._session = meta.session
        self._part = f"b{meta.number}-{shared}.{attempt}." if shared else f"{meta.number}.{attempt}."
        self._index = 0
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self.stored: list[asyncio.Future[int]] = []
        self.sink = V1Sink(self._publish, framed=False, notify=self._schedule)
        self.sink.start_batching()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        self.sink.flush_batch()

    @property
    def published(self) -> int:
        """Event messages published so far."""
        return self._index

    def _publish(self, data: bytes) -> None:
        self._index += 1
        part = f"{self._part}{self._index}"
        size, limit = message_size(data, {MSG_ID: f"{self._session}.{part}"}), self._publisher.max_payload
        if size > limit:  # it could never be published: say so in its place, for its request
            data = unpublishable(data, size, limit)
        self.stored.append(self._outbox.put(self._subject, self._session, part, data))


def unpublishable(data: bytes, size: int, limit: int) -> bytes:
    """An ErrorEvent envelope standing for an event message over the NATS server's max_payload
    (a tool result near --tool-max-output is one): RESOURCE_EXHAUSTED for the event's request."""
    env = pb.Envelope.FromString(data)
    first = env.batch_event.events[0] if env.HasField("batch_event") and env.batch_event.events else env.event
    kind = first.WhichOneof("event_type")
    rid = getattr(getattr(first, kind), "request_id", "") if kind else ""
    out = pb.Envelope(timestamp=env.timestamp, sequence=env.sequence)
    error = out.event.error
    error.error_code = pb.ERROR_CODE_RESOURCE_EXHAUSTED
    error.message = (
        f"a {kind or 'event'} message of {size} bytes was dropped: over the NATS server's max_payload of {limit} bytes"
    )
    error.timestamp = env.timestamp
    error.details.update({"reason": "too_large_for_nats", "size": str(size), "limit": str(limit)})
    if rid:
        error.request_id = rid
    return out.SerializeToString()
