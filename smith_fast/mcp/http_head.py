"""The request heads of the MCP HTTP front, read strictly (RFC 9112 section 3, 5 and 6).

A request head that two HTTP implementations could read differently (a proxy in front and this
service behind it) is a request smuggled past the proxy, so anything ambiguous is refused, not
repaired: a ``Content-Length`` that is not ASCII digits (``²`` is a digit to ``str.isdigit``), that
has more than :data:`MAX_LENGTH_DIGITS` of them, that is a list (``5, 999``) or repeated; a
``Transfer-Encoding`` beside a ``Content-Length`` or in an HTTP/1.0 request; a header line folded
over two lines, with a space before its colon, with a byte no token or field value may hold (NUL,
a lone CR or LF, controls); a repeated header that can only be given once (``Host``,
``Authorization``, ``Origin``, ``Mcp-Session-Id`` ...); an HTTP/1.1 request without ``Host``.
Each is a :class:`HeadError` with status 400 (``Transfer-Encoding: chunked`` alone, well formed
but not spoken here, is 501), never another exception.

Parsing works on the bytes with ``bytes.translate`` against tables of the allowed bytes, which
stays linear in the head's size (at most 16 KiB) and needs no regular expression.
"""

from __future__ import annotations

from ..errors import SmithFastError

__all__ = ["Head", "HeadError", "parse_head", "split_host", "MAX_LENGTH_DIGITS"]

# More than enough for any length this service accepts (--max-frame-size is far below 10**19),
# and short enough that int() never sees a number it refuses (Python's 4,300-digit limit).
MAX_LENGTH_DIGITS = 19

_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# field-vchar (VCHAR, obs-text) and the SP/HTAB allowed inside a value
_FIELD = bytes(range(0x21, 0x7F)) + bytes(range(0x80, 0x100)) + b" \t"
_FIELD_CRLF = _FIELD + b"\r\n"
# request-target in origin-form: VCHAR only (no SP, controls or non-ASCII)
_TARGET = bytes(range(0x21, 0x7F))
_HOST = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=%"
_HEX = b"0123456789abcdefABCDEF:."

# Headers this front reads as one value: a repetition is ambiguous (which one wins?), so refused.
_SINGLE = frozenset({
    "content-length", "transfer-encoding", "host", "authorization", "origin", "mcp-session-id",
    "mcp-protocol-version", "content-type",
})


class HeadError(SmithFastError):
    """A request head refused: ``status`` is the HTTP answer, the message says what and where."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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


def _only(data: bytes, allowed: bytes) -> bool:
    return not data.translate(None, allowed)


def parse_head(head: bytes, max_body: int) -> Head:
    """A request head (the bytes before its blank line) → :class:`Head`.

    Args:
        head: the request line and header lines, CRLF-separated, without the final CRLF CRLF.
        max_body: the largest body accepted (``--max-frame-size``).

    Raises:
        HeadError: anything malformed or ambiguous (400), an HTTP version other than 1.0/1.1
            (505), ``Transfer-Encoding`` (501), a body over ``max_body`` (413).
    """
    first, _, block = head.partition(b"\r\n")
    method, target, version = _request_line(first)
    headers: dict[str, str] = {}
    if block:
        # One pass over all header lines for the bytes no value may hold (NUL, controls), and CR
        # and LF only as CRLF pairs; then each line's name is checked on its own.
        crlf = block.count(b"\r\n")
        if block.translate(None, _FIELD_CRLF) or block.count(b"\r") != crlf or block.count(b"\n") != crlf:
            raise HeadError(400, f"header line {_bad_line(block)} holds a byte no field value may (a control, a lone CR or LF)")
        for number, line in enumerate(block.split(b"\r\n"), 2):
            name, sep, value = line.partition(b":")
            if not sep or not name or name.translate(None, _TCHAR):
                # also a folded line (it starts with SP/HTAB) and "Name : value"
                raise HeadError(400, f"malformed header line {number}")
            key = name.lower().decode("ascii")
            text = value.strip(b" \t").decode("latin-1")
            if key in headers:
                if key in _SINGLE:
                    raise HeadError(400, f"{name.decode('ascii')} is given more than once")
                headers[key] = f"{headers[key]}, {text}"
            else:
                headers[key] = text
    length = _length(headers, version, max_body)
    if version == "HTTP/1.1" and "host" not in headers:
        raise HeadError(400, "Host is missing (HTTP/1.1 requires it)")
    connection = {token.strip() for token in headers.get("connection", "").lower().split(",")}
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return Head(method, target, headers, length, keep_alive)


def _bad_line(block: bytes) -> int:
    """The number of the first header line (the request line is 1) holding a byte no value may."""
    for number, line in enumerate(block.split(b"\r\n"), 2):
        if line.translate(None, _FIELD):
            return number
    return 2


def _request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[0] or not _only(parts[0], _TCHAR) or not parts[1].startswith(b"/") or not _only(parts[1], _TARGET):
        raise HeadError(400, "malformed request line")
    version = parts[2]
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        if len(version) == 8 and version.startswith(b"HTTP/") and version[5:6].isdigit() and version[6:7] == b"." and version[7:].isdigit():
            raise HeadError(505, f"{version.decode('ascii')} is not spoken here; use HTTP/1.1")
        raise HeadError(400, "malformed request line")
    return parts[0].decode("ascii"), parts[1].decode("ascii"), version.decode("ascii")


def _length(headers: dict[str, str], version: str, max_body: int) -> int:
    coding = headers.get("transfer-encoding")
    text = headers.get("content-length")
    if coding is not None:
        if text is not None:
            raise HeadError(400, "Content-Length and Transfer-Encoding together")
        if version != "HTTP/1.1" or coding.lower() != "chunked":
            raise HeadError(400, f"Transfer-Encoding {coding!r} is not valid here")
        raise HeadError(501, "Transfer-Encoding request bodies are not supported; send Content-Length")
    if text is None:
        return 0
    if not text or len(text) > MAX_LENGTH_DIGITS or not text.isascii() or not text.isdigit():
        raise HeadError(400, "Content-Length is not one number of at most 19 ASCII digits")
    length = int(text)
    if length > max_body:
        raise HeadError(413, f"the body is larger than {max_body} bytes (--max-frame-size)")
    return length


def split_host(host: str) -> tuple[str, int | None] | None:
    """A ``Host`` value → (lower-case name or address without brackets, port or None); None when
    it is not ``uri-host [ ":" port ]`` (RFC 9110 section 7.2)."""
    raw = host.encode("latin-1")
    if raw.startswith(b"["):
        end = raw.find(b"]")
        if end < 0 or not _only(raw[1:end], _HEX) or end == 1:
            return None
        name, rest = raw[1:end], raw[end + 1 :]
        if rest and not rest.startswith(b":"):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, sep, port_bytes = raw.partition(b":")
        port_text = port_bytes if sep else None
        if not name or not _only(name, _HOST):
            return None
    port: int | None = None
    if port_text:
        if len(port_text) > 5 or not port_text.isdigit():
            return None
        port = int(port_text)
    return name.decode("ascii").lower().rstrip("."), port
