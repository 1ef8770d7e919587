"""The client SDK over gRPC: a :class:`~smith_fast.client_link.Link` that is one ``SmithService.Stream`` call.

Envelopes travel as the bytes the client builds and parses itself (no (de)serializers), one per
gRPC message. ``grpc`` is imported only when a gRPC link is made, so a client that never speaks
gRPC never loads it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .client_link import Dispatch, Link, Receive, Reconnect
from .pb import smith_pb2 as pb

if TYPE_CHECKING:
    import grpc
    from grpc import aio as grpc_aio

__all__ = ["GrpcLink", "NEGOTIATE_METHOD", "STREAM_METHOD", "grpc_channel"]

STREAM_METHOD = "/smith.v1.SmithService/Stream"
NEGOTIATE_METHOD = "/smith.v1.SmithService/Negotiate"


def grpc_channel(target: str, tls_ca: bytes | None = None) -> grpc_aio.Channel:
    """A channel to ``HOST:PORT``: over TLS verified with ``tls_ca`` (PEM root certificates) if given."""
    from grpc import aio, ssl_channel_credentials

    options = [("grpc.max_receive_message_length", -1)]
    if tls_ca is not None:
        return aio.secure_channel(target, ssl_channel_credentials(root_certificates=tls_ca), options=options)
    return aio.insecure_channel(target, options=options)


class GrpcLink(Link):
    """A ``Stream`` call on ``channel``, started at once.

    Args:
        channel: the gRPC channel (closed by :meth:`release`).
        token: the service's shared secret, sent as ``authorization: Bearer`` metadata of every call.
    """

    def __init__(self, channel: grpc_aio.Channel, token: str | None = None) -> None:
        self.channel = channel
        self.status: grpc.StatusCode | None = None  # the call's final status once it ended
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
        stream: grpc_aio.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM_METHOD)
        self._call = stream(self._requests(), metadata=self.metadata)

    async def _requests(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._outbox.get()
            if item is None:
                return
            yield item

    def send(self, envelope: bytes) -> None:
        self._outbox.put_nowait(envelope)

    def send_line(self, line: bytes) -> None:
        raise ValueError("gRPC carries protocol v1 only")

    def close_sending(self) -> None:
        """Half-close: send nothing more."""
        self._outbox.put_nowait(None)

    async def pump(self, receive: Receive, dispatch: Dispatch, reconnect: Reconnect) -> BaseException:
        import grpc

        received = False
        try:
            async for raw in self._call:
                received = True
                receive(raw)
            self.status = await self._call.code()
            return EOFError("the service ended the stream")
        except grpc.aio.AioRpcError as exc:
            self.status = exc.code()
            code = dict(exc.trailing_metadata() or ()).get("smith-error-code")
            if code is not None and not received:
                # Refused before the stream began (a wrong token in the metadata, too many
                # connections): tell whoever waits as the ErrorEvent a socket peer would get.
                try:
                    dispatch(pb.Event(error=pb.ErrorEvent(error_code=code, message=exc.details() or "")))
                except ValueError:
                    pass
            return exc
        except asyncio.CancelledError:
            self.status = grpc.StatusCode.CANCELLED
            raise

    async def flush(self) -> None:
        pass

    async def close(self) -> None:
        self._call.cancel()
        # End the request generator too: gRPC's task that drains it would otherwise be left
        # waiting on it and be destroyed pending when the loop closes.
        self._outbox.put_nowait(None)

    async def release(self) -> None:
        await self.channel.close()

    async def negotiate(self, request: pb.NegotiateRequest) -> pb.NegotiateResponse:
        """The unary ``Negotiate`` call.

        Raises:
            grpc.aio.AioRpcError: the call failed (a refusal carries ``smith-error-code`` in its trailers).
        """
        method = self.channel.unary_unary(
            NEGOTIATE_METHOD,
            request_serializer=pb.NegotiateRequest.SerializeToString,
            response_deserializer=pb.NegotiateResponse.FromString,
        )
        return await method(request, metadata=self.metadata)
