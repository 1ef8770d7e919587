"""One HTTP/1.1 POST over asyncio streams: all the llm planner needs from HTTP.

Why not a client library: the planner makes one request per plan, with no connection reuse,
redirects, cookies or proxies to manage, and the service already runs on asyncio streams (uvloop
or stdlib). ``httpx`` would add six packages (httpcore, h11, anyio, sniffio, idna, certifi) to a
service that otherwise needs none of them. The response is read by llhttp (``httptools``), the
parser of the service's own HTTP server (:mod:`smith_fast.http`); this module is tested against
the stdlib ``http.server`` over a real socket.

What it does: ``http`` and ``https`` (system trust store, SNI, hostname checked), IPv6 literals,
``Content-Length``, ``chunked`` and close-delimited bodies, skipping ``1xx`` interim responses, a
cap on the body size, one deadline for the whole exchange. What it does not: redirects (a ``3xx``
is returned as is), proxies, compression (it asks for ``identity``), keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from .._version import __version__
from ..errors import HttpError

__all__ = ["MAX_RESPONSE", "HttpError", "HttpResponse", "post"]

MAX_RESPONSE = 8 << 20
"""Default cap on a response body, in bytes."""
USER_AGENT = f"smith-fast/{__version__}"
_MAX_HEADERS = 100
_MAX_HEAD = 64 * 1024


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
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
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
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)


class _Response:
    """llhttp's callbacks for one exchange: interim (1xx) responses are skipped; the first final
    one is kept, its body capped at ``max_response``."""

    __slots__ = ("max_response", "reason", "headers", "body", "size", "final", "complete", "parser")

    def __init__(self, max_response: int) -> None:
        self.max_response = max_response
        self.reason = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.final = False  # the headers of a final (not 1xx) response were read
        self.complete = False
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.reason = b""
        self.headers = {}

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= _MAX_HEADERS:
            raise HttpError(f"more than {_MAX_HEADERS} header lines")
        key = name.decode("latin-1").lower()
        text = value.strip(b" \t").decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            return  # interim: the real response follows
        self.final = True
        length = self.headers.get("content-length")
        if length is not None and int(length) > self.max_response:  # llhttp took digits only
            raise HttpError(f"response body of {length} bytes is over the {self.max_response}-byte limit")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_response:
            raise HttpError(f"response body is over the {self.max_response}-byte limit")
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.final:
            self.complete = True

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, HttpError):
                raise exc.__context__ from None
            raise HttpError(f"malformed response: {exc}") from None
        except httptools.HttpParserUpgrade:
            raise HttpError("the server switched protocols (101), which was not asked for") from None
        except httptools.HttpParserError as exc:
            raise HttpError(f"malformed response {'body' if self.final else 'head'}: {exc}") from None

    @property
    def until_close(self) -> bool:
        """The body ends where the connection does (no length, not chunked)."""
        return self.final and "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "").lower()


async def _read_response(reader: asyncio.StreamReader, max_response: int) -> HttpResponse:
    response = _Response(max_response)
    data = await reader.read(65536)
    if data and not data.startswith(b"HTTP/1."[: len(data)]):
        shown = data.split(b"\n", 1)[0][:80].decode("latin-1").rstrip("\r")
        raise HttpError(f"the response does not start with an HTTP/1.x status line: {shown!r}")
    head = 0  # bytes read before the final response's headers were
    while data:
        response.feed(data)
        if response.complete:
            break
        if not response.final:
            head += len(data)
            if head > _MAX_HEAD:
                raise HttpError(f"the response head is larger than {_MAX_HEAD} bytes")
        data = await reader.read(65536)
    if not response.complete:
        if not response.until_close:  # else close-delimited: the body ended at EOF
            raise asyncio.IncompleteReadError(b"", None)
    status = response.parser.get_status_code()
    return HttpResponse(status, response.reason.decode("latin-1"), response.headers, b"".join(response.body))
