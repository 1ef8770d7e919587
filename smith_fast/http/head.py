"""Request heads, read by llhttp (the parser of Node.js, through ``httptools``) and held to the
stricter rules of a service that must never read a request differently from a proxy in front
of it (RFC 9112 sections 3, 5 and 6).

llhttp refuses on its own: a ``Content-Length`` that is not digits, overflows, is a list or is
repeated; ``Content-Length`` beside ``Transfer-Encoding``; a header line folded, with a space
before its colon, with a control byte, a lone CR or LF; a name that is no token; an unknown
method; a target byte no URL may hold. Checked here on top, because llhttp lets them through:
a request line with more than one space between its parts, a target not in origin-form
(``/...``), an HTTP version other than 1.0 and 1.1 (505), any ``Transfer-Encoding`` (bodies are
``Content-Length`` only: ``chunked`` alone is 501, anything else 400), an ``Upgrade`` or
``CONNECT``, a repeated header that can only be given once (``Host``, ``Authorization``,
``Origin``, ``Mcp-Session-Id`` ...), an HTTP/1.1 request without ``Host``, a body over the
limit (413). Each is a :class:`~smith_fast.errors.HeadError`, never another exception.

The head is found by the server (its blank line, within the head limit) and handed here whole;
the body is then ``Content-Length`` bytes, so where a request ends is never llhttp's guess
against the server's.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httptools

from ..errors import HeadError

__all__ = ["Head", "parse_head", "split_host", "origin_key"]

# Headers read as one value: a repetition is ambiguous (which one wins?), so refused.
_SINGLE = frozenset({
    b"content-length", b"transfer-encoding", b"host", b"authorization", b"origin", b"mcp-session-id",
    b"mcp-protocol-version", b"content-type",
})
_TARGET = bytes(range(0x21, 0x7F))  # origin-form: VCHAR only (llhttp also takes some non-ASCII)
_HOST = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=%"
_HEX = b"0123456789abcdefABCDEF:."
_END = b"\r\n\r\n"


class Head:
    """A parsed request head.

    Attributes:
        method, target: from the request line.
        headers: lower-case name → value (repeats of other headers joined with ``, ``).
        length: the body's length (0 without ``Content-Length``).
        keep_alive: the connection goes on after the response.
    """

    __slots__ = ("method", "target", "headers", "length", "keep_alive")

    def __init__(self, method: str, target: str, headers: dict[str, str], length: int, keep_alive: bool) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        self.length = length
        self.keep_alive = keep_alive


class _Fields:
    """llhttp's callbacks: the target and the header fields, in order; the method, version and
    keep-alive as they stand when the head is complete (llhttp resets its flags once a request
    without a body is complete, which would read ``Connection: close`` as keep-alive)."""

    __slots__ = ("target", "fields", "parser", "method", "version", "keep_alive")

    def __init__(self) -> None:
        self.target = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.method = b""
        self.version = ""
        self.keep_alive = False

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        self.method, self.version, self.keep_alive = parser.get_method(), parser.get_http_version(), parser.should_keep_alive()

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))


def parse_head(head: bytes, max_body: int) -> Head:
    """A request head (the bytes before its blank line) → :class:`Head`.

    Args:
        head: the request line and header lines, CRLF-separated, without the final CRLF CRLF.
        max_body: the largest body accepted (``--max-frame-size``).

    Raises:
        HeadError: anything malformed or ambiguous (400), an HTTP version other than 1.0/1.1
            (505), ``Transfer-Encoding`` (501), a body over ``max_body`` (413).
    """
    _request_line(head[: head.find(b"\r\n")] if b"\r\n" in head else head)
    fields = _Fields()
    parser = fields.parser
    assert parser is not None
    try:
        parser.feed_data(head + _END)
    except httptools.HttpParserUpgrade:
        raise HeadError(400, "Upgrade and CONNECT are not spoken here") from None
    except httptools.HttpParserError as exc:
        raise HeadError(400, f"malformed request head: {exc}") from None
    finally:
        fields.parser = None  # no cycle between the parser and its callbacks: freed at once
    headers: dict[str, str] = {}
    for raw, value in fields.fields:
        name = raw.lower()
        key = name.decode("ascii")  # llhttp took only token bytes
        text = value.strip(b" \t").decode("latin-1")
        if key in headers:
            if name in _SINGLE:
                raise HeadError(400, f"{raw.decode('ascii')} is given more than once")
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text
    version = fields.version
    if "transfer-encoding" in headers:
        if version != "1.1" or headers["transfer-encoding"].lower() != "chunked":
            raise HeadError(400, f"Transfer-Encoding {headers['transfer-encoding']!r} is not valid here")
        raise HeadError(501, "Transfer-Encoding request bodies are not supported; send Content-Length")
    if version == "1.1" and "host" not in headers:
        raise HeadError(400, "Host is missing (HTTP/1.1 requires it)")
    given = headers.get("content-length")
    length = int(given) if given is not None else 0  # digits only: llhttp refused anything else
    if length > max_body:
        raise HeadError(413, f"the body is larger than {max_body} bytes (--max-frame-size)")
    return Head(fields.method.decode("ascii"), fields.target.decode("ascii"), headers, length, fields.keep_alive)


def _request_line(line: bytes) -> None:
    """What llhttp lets through in a request line: runs of spaces, a target not in
    origin-form, another version (505 when it is one)."""
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1].startswith(b"/") or parts[1].translate(None, _TARGET):
        raise HeadError(400, "malformed request line")
    version = parts[2]
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if len(version) == 8 and version.startswith(b"HTTP/") and version[5:6].isdigit() and version[6:7] == b"." and version[7:].isdigit():
            raise HeadError(505, f"{version.decode('ascii')} is not spoken here; use HTTP/1.1")
        raise HeadError(400, "malformed request line")


def split_host(host: str) -> tuple[str, int | None] | None:
    """A ``Host`` value → (lower-case name or address without brackets, port or None); None when
    it is not ``uri-host [ ":" port ]`` (RFC 9110 section 7.2)."""
    raw = host.encode("latin-1")
    if raw.startswith(b"["):
        end = raw.find(b"]")
        if end <= 1 or raw[1:end].translate(None, _HEX):
            return None
        name, rest = raw[1:end], raw[end + 1 :]
        if rest and not rest.startswith(b":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_bytes = raw.partition(b":")
        port_text = port_bytes if sep else None
        if not name or name.translate(None, _HOST):
            return None
    port: int | None = None
    if port_text:
        if len(port_text) > 5 or not port_text.isdigit():
            return None
        port = int(port_text)
    return name.decode("ascii").lower().rstrip("."), port


def origin_key(origin: str) -> str | None:
    """An origin as browsers send it, to compare with an allow-list: lower-case scheme and host,
    the port only when it is not the scheme's default; None when it is no http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not name or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    shown = f"[{name}]" if ":" in name else name
    default = 80 if parts.scheme.lower() == "http" else 443
    return f"{parts.scheme.lower()}://{shown.lower()}" + (f":{port}" if port is not None and port != default else "")
