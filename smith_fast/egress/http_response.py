"""A forwarded plain-HTTP response with the secrets of its host put back: :class:`ResponseRedactor`.

The proxy puts a secret's real value into a request for its host (:func:`~.http_proxy.forward_head`);
a host that echoes it back (an error page quoting the header, a debugging endpoint) would hand
the command the value the placeholder stands for. So a response from a host that got secrets is
read by llhttp, not spliced: each head is rebuilt with the values replaced by their placeholders,
and the body, de-framed, goes through a :class:`~.redacting.StreamRedactor` (a value split across
reads or chunks is still caught). The replacement changes the body's length, so the final head
loses ``Content-Length`` and ``Transfer-Encoding`` and the body ends where the connection does (it
closes after one response anyway: ``Connection: close``). Only responses from such hosts take
this path; every other response is spliced untouched. A compressed body is not looked into: the
request to such a host asks for ``Accept-Encoding: identity`` (:func:`~.http_proxy.forward_head`).
"""

from __future__ import annotations

import httptools

from .redacting import StreamRedactor

__all__ = ["ResponseRedactor"]

# Hop headers the proxy drops (it says Connection: close itself), and the framing it redoes.
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection"})
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class ResponseRedactor:
    """llhttp's callbacks for one response (see the module docstring).

    Args:
        pairs: (real value, placeholder) of each secret the request's host got.
        max_head: the most bytes of heads read before the response is refused (an error).
    """

    def __init__(self, pairs: tuple[tuple[bytes, bytes], ...], max_head: int) -> None:
        self._pairs = pairs
        self._body = StreamRedactor(pairs)
        self._max_head = max_head
        self._head_size = 0
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._out: list[bytes] = []
        self._upgraded = False
        self.done = False   # the final response ended (its body complete)
        self._parser = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> bytes | None:
        """Bytes from the host; what goes to the client now, or None: no HTTP response (or a head
        over the limit), and the connection ends without passing anything unread on."""
        if self._upgraded:
            return self._body.feed(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded = True  # 101: what follows is the other protocol's, redacted as a stream
            self._out.append(self._body.feed(data[int(upgrade.args[0]):]))
        except httptools.HttpParserError:
            return None
        if self._head_size > self._max_head:
            return None
        out = b"".join(self._out)
        self._out.clear()
        return out

    def end(self) -> bytes:
        """The host closed: what the body's redactor still held."""
        return self._body.end()

    def _redacted(self, data: bytes) -> bytes:
        for value, placeholder in self._pairs:
            if value in data:
                data = data.replace(value, placeholder)
        return data

    # llhttp callbacks
    def on_message_begin(self) -> None:
        self._headers = []
        self._reason = b""

    def on_status(self, reason: bytes) -> None:
        self._reason += reason
        self._head_size += len(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._head_size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        interim = 100 <= status < 200
        # 204 and 304 have no body; a 1xx is followed by the real response
        reframed = not interim and status not in (204, 304)
        lines = [b"HTTP/%b %d %b\r\n" % (self._parser.get_http_version().encode(), status, self._reason)]
        for name, value in self._headers:
            lower = name.lower()
            if not interim and (lower in _HOP or (reframed and lower in _FRAMING)):
                continue
            lines.append(b"%b: %b\r\n" % (name, value))
        if not interim:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        self._out.append(self._redacted(b"".join(lines)))

    def on_body(self, body: bytes) -> None:
        self._out.append(self._body.feed(body))

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            return
        self._out.append(self._body.end())
        self.done = True
