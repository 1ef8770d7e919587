"""The SDK's stream link: what one loop step sends with ``send_soon`` goes out in one write as the
step ends, in order, and ``send`` writes at once, after it; what a connection had not written when
it was replaced (a resume) is dropped; a close or a flush writes what is pending first; a
``send_soon`` on a connection that dropped raises nothing into the loop. Over real Unix sockets, on
both loops."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from smith_fast.client_link import StreamLink
from smith_fast.framing import FrameDecoder, encode_frame

from .conftest import Runner


async def _pair() -> tuple[StreamLink, socket.socket]:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    theirs.setblocking(False)
    return StreamLink(reader, writer, FrameDecoder()), theirs


async def _read(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = b""
    while len(out) < size:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), 10)
        assert chunk, "the link closed early"
        out += chunk
    return out


class _Counting:
    """The link's writer, counting its writes (the stream is the real one underneath)."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.inner = writer
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_steps_sends_go_in_one_write_in_order(run: Runner[Any]) -> None:
    async def main() -> None:
        link, peer = await _pair()
        counting = _Counting(link.writer)
        link.writer = counting  # type: ignore[assignment]
        units = [b"first", b"second" * 100, b"third"]
        for unit in units:
            link.send_soon(unit)
        assert counting.writes == 0  # not before the step ends
        expected = b"".join(encode_frame(u) for u in units)
        assert await _read(peer, len(expected)) == expected
        assert counting.writes == 1
        link.send_soon(b"later")  # a later step: a write of its own
        assert await _read(peer, len(encode_frame(b"later"))) == encode_frame(b"later")
        assert counting.writes == 2
        # send writes at once, after what the step queued: a caller may block the loop next
        link.send_soon(b"queued")
        link.send(b"at once")
        assert counting.writes == 3
        expected = encode_frame(b"queued") + encode_frame(b"at once")
        assert await _read(peer, len(expected)) == expected
        await asyncio.sleep(0.01)  # the step's scheduled write finds nothing left
        assert counting.writes == 3
        link.send_soon(b"v1 frame")
        link.send_line(b'{"v0": 1}\n')  # (a link carries one of them; the order is what counts)
        expected = encode_frame(b"v1 frame") + b'{"v0": 1}\n'
        assert await _read(peer, len(expected)) == expected
        await link.close()
        peer.close()

    run(main())


def test_close_and_flush_write_what_is_pending_first(run: Runner[Any]) -> None:
    async def main() -> None:
        link, peer = await _pair()
        link.send_soon(b"before flush")
        await link.flush()
        assert await _read(peer, len(encode_frame(b"before flush"))) == encode_frame(b"before flush")
        link.send_soon(b'{"v0": true}\n'[:-1])
        await link.close()
        assert await _read(peer, len(encode_frame(b'{"v0": true}'))) == encode_frame(b'{"v0": true}')
        peer.close()

    run(main())


def test_what_a_replaced_connection_had_not_written_is_dropped(run: Runner[Any]) -> None:
    async def main() -> None:
        link, old_peer = await _pair()
        old_writer = link.writer
        new_reader, new_writer = await asyncio.open_unix_connection(sock=(pair := socket.socketpair())[0])
        new_peer = pair[1]
        new_peer.setblocking(False)
        link.send_soon(b"for the old connection")  # in the step that replaces it (a resume's)
        link.replace(new_reader, new_writer, FrameDecoder())
        link.send_soon(b"for the new one")
        assert await _read(new_peer, len(encode_frame(b"for the new one"))) == encode_frame(b"for the new one")
        await asyncio.sleep(0.05)
        old_writer.close()
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.sock_recv(old_peer, 1 << 16), 10) == b""  # nothing came, then its end
        await link.close()
        old_peer.close()
        new_peer.close()

    run(main())


def test_a_send_after_the_connection_dropped_raises_nothing(run: Runner[Any]) -> None:
    async def main() -> None:
        link, peer = await _pair()
        link.writer.transport.abort()
        link.send_soon(b"too late")
        await asyncio.sleep(0.05)  # the write step ran: the loop's exception handler (checked by run) stayed quiet
        peer.close()

    run(main())
