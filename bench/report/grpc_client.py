"""gRPC ``SmithService/Stream`` drivers (grpc.aio), the twins of the socket drivers in ``drivers``.

A :class:`GrpcStream` is one ``Stream`` call, handshaken, carrying bare ``Envelope`` bytes both
ways (no serializers: the client parses every message itself, as :func:`~.wire.envelope_views`).
Two ways to use it, the two gRPC contenders:

* single: one ``Envelope`` per gRPC message, both ways;
* batched: the handshake asks for ``batch_event`` (PROTOCOL.md, "Asking for the additions"), and
  the commands freed by one read leave as one ``BatchCommand`` message (batches both ways: the
  same batching opportunity a socket client gets by writing many frames at once).

The drivers mirror ``drivers.pipeline``/``round_trips``/``pipeline_many`` on the same
:class:`~.drivers.Tracker`; the timed region is the same (first send to the last terminal event).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from grpc import aio

from smith_fast.pb import smith_pb2 as pb
from .drivers import ProtocolFailure, Tracker
from .wire import ERROR, STATE, View, batch_command, batch_item, envelope_views, handshake_command

__all__ = ["GrpcStream", "GrpcUnit", "encode_units", "grpc_pipeline", "grpc_pipeline_many", "grpc_round_trips",
           "open_channel"]

METHOD = "/smith.v1.SmithService/Stream"
GrpcUnit = tuple[bytes, bytes]  # (the command as an Envelope, the command as a BatchCommand entry)


def encode_units(commands: Sequence[pb.Command]) -> list[GrpcUnit]:
    """Each command both ways it may travel, encoded before any timed region."""
    out = []
    for command in commands:
        env = pb.Envelope()
        env.command.CopyFrom(command)
        out.append((env.SerializeToString(), batch_item(command)))
    return out


def open_channel(target: str) -> aio.Channel:
    """An insecure channel to ``HOST:PORT`` without a receive size limit (call on the running loop)."""
    return aio.insecure_channel(target, options=[("grpc.max_receive_message_length", -1)])


class GrpcStream:
    """One ``Stream`` call. Use :meth:`open` (handshake) first, :meth:`close` at the end.

    Args:
        channel: the channel to call on.
        batched: ask for ``batch_event`` and send several commands as one ``BatchCommand``.
    """

    def __init__(self, channel: aio.Channel, batched: bool) -> None:
        self.batched = batched
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        method: aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(METHOD)
        self._call = method(self._requests())

    async def _requests(self) -> AsyncIterator[bytes]:
        while (item := await self._queue.get()) is not None:
            yield item

    async def open(self) -> GrpcStream:
        """Handshake (v1, shell_exec; ``batch_event`` when batched) and wait for READY.

        Raises:
            ProtocolFailure: the handshake was refused or the stream ended.
        """
        env = pb.Envelope()
        env.command.CopyFrom(handshake_command(1, accept="batch_event" if self.batched else None))
        self._queue.put_nowait(env.SerializeToString())
        while True:
            views = await self.recv()
            if any(v[0] == ERROR for v in views):
                raise ProtocolFailure(f"handshake refused: {views}")
            if any(v[0] == STATE and v[2] == pb.SERVICE_STATE_READY for v in views):
                return self

    def send(self, units: Sequence[GrpcUnit]) -> None:
        """Queue commands: one message each, or one ``BatchCommand`` when batched."""
        put = self._queue.put_nowait
        if self.batched and len(units) > 1:
            put(batch_command([u[1] for u in units]))
        else:
            for unit in units:
                put(unit[0])

    async def recv(self) -> list[View]:
        """The views of the next message.

        Raises:
            ProtocolFailure: the stream ended.
        """
        raw = await self._call.read()
        if not isinstance(raw, bytes):  # aio.EOF
            raise ProtocolFailure(f"the stream ended: {await self._call.code()}")
        return envelope_views(raw)

    async def close(self) -> None:
        """End the request stream and cancel the call, waiting until gRPC has let go of it."""
        self._queue.put_nowait(None)
        self._call.cancel()
        await self._call.code()


async def grpc_pipeline(stream: GrpcStream, units: Sequence[GrpcUnit], tracker: Tracker, window: int) -> float:
    """``drivers.pipeline`` over a Stream: seconds until every request ended."""
    n = len(units)
    send, recv, feed = stream.send, stream.recv, tracker.feed
    sent = min(window, n)
    start = time.perf_counter()
    send(units[:sent])
    while tracker.left:
        ended = feed(await recv())
        if ended and sent < n:
            k = min(ended, n - sent)
            send(units[sent : sent + k])
            sent += k
    return time.perf_counter() - start


async def grpc_round_trips(stream: GrpcStream, unit: GrpcUnit, rid: str, count: int) -> list[float]:
    """``drivers.round_trips`` over a Stream."""
    out = []
    for _ in range(count):
        tracker = Tracker((rid,))
        start = time.perf_counter()
        stream.send((unit,))
        while tracker.left:
            tracker.feed(await stream.recv())
        out.append(time.perf_counter() - start)
    return out


async def grpc_pipeline_many(streams: Sequence[GrpcStream], units: Sequence[Sequence[GrpcUnit]],
                             trackers: Sequence[Tracker], window: int) -> float:
    """``drivers.pipeline_many`` over concurrent Streams of one channel."""
    start = time.perf_counter()
    await asyncio.gather(*(grpc_pipeline(s, u, t, window) for s, u, t in zip(streams, units, trackers)))
    return time.perf_counter() - start
