"""Reading varint-delimited ``Envelope``s off a blocking socket, with protobuf's own varint codec
(not the service's), for the test and benchmark peers."""

from __future__ import annotations

import socket

from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]

from smith_fast.pb import smith_pb2 as pb

__all__ = ["read_envelope"]


def read_envelope(sock: socket.socket, buf: bytes) -> tuple[pb.Envelope, bytes]:
    """The next envelope from ``buf`` and then ``sock``, and what is left of the bytes read.

    Raises:
        EOFError: the service closed the connection before a whole envelope arrived.
    """
    while True:
        if buf:
            try:
                size, pos = _DecodeVarint(buf, 0)
            except IndexError:  # the varint itself is not complete yet
                size, pos = -1, 0
            if size >= 0 and len(buf) >= pos + size:
                return pb.Envelope.FromString(buf[pos : pos + size]), buf[pos + size :]
        data = sock.recv(1 << 16)
        if not data:
            raise EOFError("the service closed the connection")
        buf += data
