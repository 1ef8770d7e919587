"""One HTTP/1.1 POST over asyncio streams: all the llm planner needs from HTTP.

Why not a client library: the planner makes one request per plan, with no connection reuse,
redirects, cookies or proxies to manage, and the service already runs on asyncio streams (uvloop
or stdlib). ``httpx`` would add six packages (httpcore, h11, anyio, sniffio, idna, certifi) to a
service that otherwise needs none of them; this module is about 150 lines and is tested against
the stdlib ``http.server`` over a real socket.

What it does: ``http`` and ``https`` (system trust store, SNI, hostname checked), IPv6 literals,
``Content-Length``, ``chunked`` and close-delimited bodies, skipping ``1xx`` interim responses, a
cap on the body size, one deadline for the whole exchange. What it does not: redirects (a ``3xx``
is returned as is), proxies, compression (it asks for ``identity``), keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from .._version import __version__
from ..errors import SmithFastError

__all__ = ["MAX_RESPONSE", "HttpError", "HttpResponse", "post"]

MAX_RESPONSE = 8 << 20
"""Default cap on a response body, in bytes."""
USER_AGENT = f"smith-fast/{__version__}"
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})(?: ([^\r\n]*))?\r?\n")
_MAX_HEADERS = 100
_LINE_LIMIT = 64 * 1024


class HttpError(SmithFastError):
    """The exchange failed below HTTP semantics: bad URL, no connection, a malformed response.

    Attributes:
        connect: ``True`` when no connection could be made (nothing was sent).
    """

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete response.

    Attributes:
        status: the status code.
        reason: the reason phrase.
        headers: header names lowercased; repeated headers joined with ``", "``.
        body: the decoded (de-chunked) body.
    """

    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


def _check_header(name: str, value: str) -> None:
    if any(c in value for c in "\r\n\0") or any(c in name for c in "\r\n\0: "):
        raise HttpError(f"header {name!r} holds a line break or NUL; refusing to send it")


async def post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout: float,
    max_response: int = MAX_RESPONSE,
    ssl_context: ssl.SSLContext | None = None,
) -> HttpResponse:
    """POST ``body`` to ``url`` and read the whole response.

    Args:
        url: an ``http://`` or ``https://`` URL.
        body: the request body.
        headers: extra request headers (``Host``, ``Content-Length``, ``Connection``,
            ``User-Agent`` and ``Accept-Encoding`` are set here).
        timeout: seconds for the whole exchange, connecting included.
        max_response: the largest body accepted.
        ssl_context: for ``https``; ``None`` means ``ssl.create_default_context()``.

    Returns:
        The response, whatever its status.

    Raises:
        HttpError: a bad URL or header, no connection, or a malformed, truncated or oversize response.
        TimeoutError: the deadline passed.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"{url!r} is not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise HttpError(f"{url!r} has an invalid port") from None
    host = parts.hostname
    authority = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        authority += f":{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"POST {target} HTTP/1.1", f"Host: {authority}"]
    fixed = {"host", "content-length", "connection", "user-agent", "accept-encoding"}
    for name, value in headers.items():
        _check_header(name, value)
        if name.lower() not in fixed:
            lines.append(f"{name}: {value}")
    lines += [f"User-Agent: {USER_AGENT}", "Accept-Encoding: identity", f"Content-Length: {len(body)}", "Connection: close"]
    text = "\r\n".join(lines) + "\r\n\r\n"
    if not text.isascii():
        raise HttpError("request headers must be ASCII")
    head = text.encode("ascii")
    context = None
    if parts.scheme == "https":
        context = ssl_context or ssl.create_default_context()
    async with asyncio.timeout(timeout):
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context, limit=_LINE_LIMIT)
        except (OSError, ssl.SSLError) as exc:
            raise HttpError(f"cannot connect to {authority}: {exc.strerror or exc}", connect=True) from None
        try:
            writer.write(head + body)
            await writer.drain()
            return await _read_response(reader, max_response)
        except (ConnectionError, ssl.SSLError) as exc:
            raise HttpError(f"connection to {authority} failed: {exc}") from None
        except asyncio.IncompleteReadError:
            raise HttpError(f"{authority} closed the connection before the response was complete") from None
        except (asyncio.LimitOverrunError, ValueError):
            raise HttpError(f"{authority} sent a header line longer than {_LINE_LIMIT} bytes") from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


async def _read_response(reader: asyncio.StreamReader, max_response: int) -> HttpResponse:
    while True:
        line = await reader.readline()
        match = _STATUS.fullmatch(line)
        if match is None:
            shown = line[:80].decode("latin-1")
            raise HttpError(f"the response does not start with an HTTP/1.x status line: {shown!r}")
        status = int(match[1])
        headers = await _read_headers(reader)
        if not 100 <= status < 200:  # 1xx responses are interim; the real one follows
            break
    reason = (match[2] or b"").decode("latin-1")
    encoding = headers.get("transfer-encoding", "").lower()
    if status in (204, 304):
        body = b""
    elif "chunked" in encoding:
        body = await _read_chunked(reader, max_response)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            length = -1
        if length < 0:
            raise HttpError(f"invalid Content-Length {headers['content-length']!r}")
        if length > max_response:
            raise HttpError(f"response body of {length} bytes is over the {max_response}-byte limit")
        body = await reader.readexactly(length)
    else:
        buffer = bytearray()
        while chunk := await reader.read(65536):  # close-delimited: the body ends at EOF
            buffer += chunk
            if len(buffer) > max_response:
                raise HttpError(f"response body is over the {max_response}-byte limit")
        body = bytes(buffer)
    return HttpResponse(status, reason, headers, body)


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS + 1):
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        if line in (b"\r\n", b"\n"):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(f"malformed header line {line[:80].decode('latin-1')!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise HttpError(f"more than {_MAX_HEADERS} header lines")


async def _read_chunked(reader: asyncio.StreamReader, max_response: int) -> bytes:
    body = bytearray()
    while True:
        line = await reader.readline()
        if not line.endswith(b"\n"):
            raise asyncio.IncompleteReadError(line, None)
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpError(f"malformed chunk size line {line[:40].decode('latin-1')!r}") from None
        if size < 0:
            raise HttpError(f"malformed chunk size line {line[:40].decode('latin-1')!r}")
        if size == 0:
            await _read_headers(reader)  # trailers
            return bytes(body)
        if len(body) + size > max_response:
            raise HttpError(f"response body is over the {max_response}-byte limit")
        body += await reader.readexactly(size)
        if (await reader.readexactly(2)) != b"\r\n":
            raise HttpError("a chunk is not followed by CRLF")
