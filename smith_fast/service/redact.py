"""Taking the token out of inbound bytes before the session log keeps them as they arrived.

A decoded v1 handshake is redacted by :func:`~smith_fast.service.auth.redacted_handshake`; these
are for the raw records (``smith_fast/replay/format.py``): a v0 line, which carries the token as the
``"token"`` member of its ``data``, and bytes that could not be decoded at all, where the service's
own token is looked for and replaced wherever it appears. Only bytes that may hold a token are
parsed, so recording a session costs one substring test per line.
"""

from __future__ import annotations

import json

from .auth import REDACTED, TOKEN_KEY

__all__ = ["redacted_bytes", "redacted_line"]

_KEY = TOKEN_KEY.encode()
_REDACTED = REDACTED.encode()
_REDACTED_JSON = json.dumps(REDACTED).encode()


def redacted_bytes(data: bytes, token: str | None) -> bytes:
    """``data`` with every occurrence of ``token`` (UTF-8) replaced by ``<redacted>``."""
    if token:
        secret = token.encode("utf-8", "surrogatepass")
        if secret in data:
            return data.replace(secret, _REDACTED)
    return data


def redacted_line(line: bytes, token: str | None) -> bytes:
    """A v0 line with its ``data.token`` member (and, if configured, the service's token wherever it
    appears) replaced by ``<redacted>``; the rest of the line is kept byte for byte when it can be.

    A key written with JSON escapes (``"\\u0074oken"``) still names the member, so a line holding a
    backslash is parsed too.
    """
    if _KEY in line or b"\\" in line:
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            obj = None
        data = obj.get("data") if type(obj) is dict else None
        if type(data) is dict and TOKEN_KEY in data:
            value = data[TOKEN_KEY]
            written = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass") if isinstance(value, str) else b""
            if written and line.count(written) == 1:
                line = line.replace(written, _REDACTED_JSON)  # the rest stays as the peer wrote it
            else:  # escaped, or not a string: say it again, compactly
                data[TOKEN_KEY] = REDACTED
                line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return redacted_bytes(line, token)
