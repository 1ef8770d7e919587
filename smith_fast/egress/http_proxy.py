"""The HTTP side of the proxy: a request head read by llhttp (httptools), a CONNECT target or an
absolute-form URL taken apart, the head forwarded upstream, and the proxy's own answers.

One :class:`RequestReader` per connection is fed every byte the client sends: it finds the head
(bounded by the proxy's head limit), then, for a forwarded request, gives the body as llhttp
de-frames it (re-chunked when it came chunked), and says when the request ended; bytes after it
are not forwarded (the upstream connection serves one request: ``Connection: close``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

import httptools

from .rules import normal_host

__all__ = ["RequestReader", "Target", "parse_authority", "parse_absolute", "forward_head", "answer", "closing_heads"]

# Headers of the hop between client and proxy, never forwarded (RFC 9110 section 7.6.1), and the
# Host the proxy sets itself from the URL it decided on (a Host the client chose could steer a
# shared address to a site no rule allows).
_HOP = frozenset({b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
                  b"proxy-authenticate", b"te", b"trailer", b"host"})

_REASONS = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}


class Target:
    """Where a request goes: host (rules' form), port, and for a forwarded request the origin-form path."""

    __slots__ = ("host", "port", "path")

    def __init__(self, host: str, port: int, path: bytes = b"") -> None:
        self.host = host
        self.port = port
        self.path = path


def parse_authority(authority: bytes, default_port: int | None) -> Target | None:
    """``host:port`` / ``[v6]:port`` (a CONNECT target, a URL's authority); None if malformed."""
    try:
        text = authority.decode("ascii")
    except UnicodeDecodeError:
        return None
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, ""
        if ":" in host:
            return None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    elif default_port is None:
        return None
    else:
        port = default_port
    host = normal_host(host)
    if not host or any(c in host for c in "/@ \\%"):
        return None
    return Target(host, port)


def parse_absolute(url: bytes) -> Target | None:
    """An absolute-form ``http://`` URL as a Target (path and query, no userinfo, no fragment)."""
    try:
        parts = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return None
    if parts.schema is None or parts.schema.lower() != b"http" or not parts.host:
        return None
    authority = parts.host if b":" not in parts.host else b"[" + parts.host + b"]"
    target = parse_authority(authority, 80 if parts.port is None else int(parts.port))
    if target is None:
        return None
    target.path = (parts.path or b"/") + (b"?" + parts.query if parts.query is not None else b"")
    return target


class RequestReader:
    """llhttp's callbacks for one connection's request (see the module docstring)."""

    def __init__(self, max_head: int, on_body: Callable[[bytes], None]) -> None:
        self.max_head = max_head
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = b""
        self.version = b"1.1"
        self.chunked = False
        self.head_done = False
        self.message_done = False
        self.upgraded = False
        self.after_head = b""   # bytes past the head of a CONNECT or Upgrade request
        self._on_body = on_body
        self._seen = 0   # bytes fed while the head is not complete
        self._size = 0   # the head's size as llhttp hands it over (a head that came in one read)
        self._parser = httptools.HttpRequestParser(self)

    def feed(self, data: bytes) -> str | None:
        """Feed client bytes; an error text (the head too large, bytes that are no HTTP) or None."""
        if self.message_done:
            return None  # a pipelined request: not forwarded (one request per upstream connection)
        if not self.head_done:
            self._seen += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self.upgraded = True
            self.after_head = data[int(upgrade.args[0]):]
        except httptools.HttpParserError as exc:
            return f"bad request ({exc})"
        if self._size > self.max_head or (not self.head_done and self._seen > self.max_head):
            return "head too large"
        return None

    # llhttp callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url
        self._size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        self._size += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self.head_done = self._size <= self.max_head
        self.method = self._parser.get_method()
        self.version = self._parser.get_http_version().encode()
        self.chunked = any(n.lower() == b"transfer-encoding" and b"chunked" in v.lower() for n, v in self.headers)

    def on_body(self, body: bytes) -> None:
        self._on_body(b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body)

    def on_message_complete(self) -> None:
        self.message_done = True
        if self.chunked and not self.upgraded:
            self._on_body(b"0\r\n\r\n")


def _substitute_basic(value: bytes, pairs: tuple[tuple[bytes, bytes], ...]) -> tuple[bytes, tuple[bytes, bytes] | None]:
    """``Authorization: Basic`` with the placeholders inside its token replaced, and (the token
    sent, the client's token) when it changed."""
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"basic":
        return value, None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return value, None
    changed = decoded
    for placeholder, secret in pairs:
        changed = changed.replace(placeholder, secret)
    if changed == decoded:
        return value, None
    sent = base64.b64encode(changed)
    return scheme + b" " + sent, (sent, token.strip())


def forward_head(reader: RequestReader, target: Target, pairs: tuple[tuple[bytes, bytes], ...]
                 ) -> tuple[bytes, tuple[tuple[bytes, bytes], ...]]:
    """The head sent upstream: origin-form, Host from the URL, hop headers dropped, ``Connection:
    close``, and each placeholder of ``pairs`` replaced by its secret in header values (inside
    ``Authorization: Basic`` too, where git and pip put a URL's password). A request that carries
    secrets asks for ``Accept-Encoding: identity``: its response is searched for them
    (:mod:`~.http_response`), which a compressed body would hide. With the head: (the Basic token
    sent, the client's own) for each token that changed, for the response to be searched for too
    (a host that echoes the header would hand back the value in base64)."""
    host = target.host if ":" not in target.host else f"[{target.host}]"
    authority = host if target.port == 80 else f"{host}:{target.port}"
    lines = [b"%b %b HTTP/%b\r\nHost: %b\r\n" % (reader.method, target.path, reader.version, authority.encode())]
    upgrade = reader.upgraded
    encoded: list[tuple[bytes, bytes]] = []
    for name, value in reader.headers:
        lower = name.lower()
        if lower in _HOP or (pairs and lower == b"accept-encoding"):
            continue
        if pairs:
            for placeholder, secret in pairs:
                value = value.replace(placeholder, secret)
            if lower == b"authorization":
                value, token = _substitute_basic(value, pairs)
                if token is not None:
                    encoded.append(token)
        lines.append(b"%b: %b\r\n" % (name, value))
    if pairs:
        lines.append(b"Accept-Encoding: identity\r\n")
    lines.append(b"Connection: upgrade\r\n\r\n" if upgrade else b"Connection: close\r\n\r\n")
    return b"".join(lines), tuple(encoded)


_RESPONSE_HOP = (b"connection:", b"keep-alive:", b"proxy-connection:")


def closing_heads(data: bytes, limit: int) -> tuple[bytes, bytes, bool]:
    """The complete response heads at the start of ``data``, the final one made to say
    ``Connection: close``: (heads to send, the rest, whether the final head was among them).

    Interim (1xx) heads pass unchanged, and so does ``101 Switching Protocols`` (the connection
    becomes the upgraded protocol's). Bytes that are no response head, or a head over ``limit``,
    are given back as "done" unchanged: they are relayed as they are, never buffered further.
    """
    out: list[bytes] = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > limit or (len(data) >= 5 and not data.startswith(b"HTTP/")):
                return b"".join(out), data, True
            return b"".join(out), data, False
        head, data = data[:end + 4], data[end + 4:]
        status = head[9:12]
        if not head.startswith(b"HTTP/1.") or not status.isdigit():
            return b"".join(out) + head, data, True
        if status[:1] == b"1":
            out.append(head)
            if status == b"101":
                return b"".join(out), data, True
            continue
        lines = [line for line in head[:-4].split(b"\r\n") if not line.lower().startswith(_RESPONSE_HOP)]
        out.append(b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n")
        return b"".join(out), data, True


def answer(status: int, text: str) -> bytes:
    """The proxy's own response: ``status`` with ``text`` as a plain-text body, then close."""
    body = (text + "\n").encode()
    return (b"HTTP/1.1 %d %b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Connection: close\r\nX-Smith-Egress: %b\r\n\r\n%b"
            % (status, _REASONS.get(status, "Error").encode(), len(body),
               b"refused" if status == 403 else b"error", body))
