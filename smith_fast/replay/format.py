"""The session log format: one append-only binary file per recorded session.

Layout (all integers little-endian)::

    header   "SMITHREC"            8 bytes  magic
             u16 format version    (FORMAT_VERSION)
             u16 reserved          0
             u32 metadata length   N
             u32 crc32 of metadata
             metadata              N bytes of UTF-8 JSON (see :class:`LogHeader`)
    record   u32 body length       L (at least BODY_PREFIX_SIZE)
             u32 crc32 of body
             body                  u8 kind (see below; 0 and 1 are the direction of an Envelope)
                                   u64 monotonic nanoseconds since the recording started
                                   the payload, as the kind says
    record   ...

Record kinds (the ``u8`` once called *direction*):

=====  ========================  ==============================================================
kind   name                      payload
=====  ========================  ==============================================================
0      ``RECORD_IN``             a client → service ``smith.v1.Envelope`` (unframed): a v1 frame
                                 or gRPC message the service decoded
1      ``RECORD_OUT``            a service → client ``Envelope`` (v0 events as their v1 form)
2      ``RECORD_IN_LINE``        a v0 line as it arrived, without its ``\n`` (format 2)
3      ``RECORD_IN_MALFORMED``   inbound bytes the service could not decode, as they arrived: a
                                 v0 line (invalid UTF-8 or JSON, unknown type, wrong fields) or a
                                 v1 frame / gRPC message that is not an ``Envelope`` (format 2)
4      ``RECORD_IN_DISCARDED``   inbound bytes the service discarded unread (format 2):
                                 ``u64`` stream offset, ``u64`` size, ``u8`` 1 when the whole
                                 unit was seen, then up to 10 bytes from that offset. A v0 line
                                 over the size limit (its bytes are not kept), or a v1 length
                                 prefix that broke the framing (the prefix is kept)
=====  ========================  ==============================================================

So a replay re-sends the inbound records verbatim, bad input included, and an unchanged service
answers it as it did (:mod:`smith_fast.replay.replayer`). Format 1 logs (kinds 0 and 1 only, v0
lines stored as the decoded Command's Envelope) are still read. The token of a handshake is never
kept: a decoded handshake holds ``<redacted>`` in ``client_info["token"]``, a v0 line in its
``data.token`` member, and in bytes that could not be decoded every occurrence of the service's
token is replaced by ``<redacted>``.

The checksum is zlib's CRC-32 (the stdlib has no CRC-32C; both catch torn and garbled tails
equally well). Records are appended in order, a batch per write, so a crash can leave at most one
incomplete record, at the end. A reader stops at the first record that is incomplete or fails its checksum (the *torn tail*) and
keeps everything before it. A v0 session's events are recorded as their v1 equivalents (the
``Envelope`` holding the same Event); its inbound lines as they arrived (kinds 2 to 4).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from ..errors import LogFormatError

__all__ = [
    "BODY_PREFIX",
    "BODY_PREFIX_SIZE",
    "DIRECTION_IN",
    "DIRECTION_OUT",
    "DISCARDED",
    "INBOUND_KINDS",
    "READABLE_VERSIONS",
    "RECORD_IN",
    "RECORD_IN_DISCARDED",
    "RECORD_IN_LINE",
    "RECORD_IN_MALFORMED",
    "RECORD_KINDS",
    "RECORD_OUT",
    "FILE_SUFFIX",
    "FORMAT_VERSION",
    "HEADER_FIXED",
    "MAGIC",
    "MAX_RECORD_SIZE",
    "RECORD_HEADER",
    "LogFormatError",
    "LogHeader",
    "crc",
    "decode_header",
    "encode_header",
]

MAGIC = b"SMITHREC"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FILE_SUFFIX = ".smithrec"
RECORD_IN = DIRECTION_IN = 0
RECORD_OUT = DIRECTION_OUT = 1
RECORD_IN_LINE = 2
RECORD_IN_MALFORMED = 3
RECORD_IN_DISCARDED = 4
RECORD_KINDS = {RECORD_IN: "in", RECORD_OUT: "out", RECORD_IN_LINE: "line", RECORD_IN_MALFORMED: "malformed", RECORD_IN_DISCARDED: "discarded"}
INBOUND_KINDS = frozenset(RECORD_KINDS) - {RECORD_OUT}
DISCARDED = struct.Struct("<QQB")  # stream offset, size, whole unit seen; then the head bytes
HEADER_FIXED = struct.Struct("<8sHHII")  # magic, version, reserved, metadata length, metadata crc
RECORD_HEADER = struct.Struct("<II")  # body length, body crc
BODY_PREFIX = struct.Struct("<BQ")  # direction, monotonic ns offset
BODY_PREFIX_SIZE = BODY_PREFIX.size
# Larger than any frame the service accepts (--max-frame-size is at most 4 GiB, but 64 MiB is the
# client SDK's limit); a bigger declared length can only be a garbled length field.
MAX_RECORD_SIZE = (1 << 28) + BODY_PREFIX_SIZE
_MAX_METADATA = 1 << 20

crc = zlib.crc32


@dataclass(frozen=True)
class LogHeader:
    """A session log's metadata.

    Attributes:
        session_id: the recorded session's id (the service's, or any string the recorder chose).
        service_id: the ``ReadyEvent.service_id`` of the service that was recorded.
        protocol_version: the wire protocol of the session (1, or 0 for JSON lines recorded as v1).
        start_time_ns: wall-clock Unix time in nanoseconds when recording started; record offsets
            are monotonic nanoseconds since that moment.
        format_version: the file format version.
        extra: any other metadata keys, kept as found.
    """

    session_id: str
    service_id: str
    protocol_version: int
    start_time_ns: int
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The metadata as a JSON-ready dict (``extra`` keys merged in)."""
        out = dict(self.extra)
        out.update(
            session_id=self.session_id,
            service_id=self.service_id,
            protocol_version=self.protocol_version,
            start_time_ns=self.start_time_ns,
        )
        return out


def encode_header(header: LogHeader) -> bytes:
    """The bytes of a log file's header."""
    meta = json.dumps(header.to_json(), sort_keys=True, separators=(",", ":")).encode()
    return HEADER_FIXED.pack(MAGIC, FORMAT_VERSION, 0, len(meta), crc(meta)) + meta


def decode_header(data: bytes, path: str | None = None) -> tuple[LogHeader, int]:
    """Parse the header at the start of ``data``.

    Args:
        data: at least the whole header (more is fine).
        path: the file name, for error messages.

    Returns:
        The header and its size in bytes (where the first record starts).

    Raises:
        LogFormatError: not a session log, an unsupported format version, or a damaged header.
    """
    if len(data) < HEADER_FIXED.size:
        if MAGIC.startswith(data[: len(MAGIC)]):
            raise LogFormatError(f"truncated header: {len(data)} bytes, a header needs at least {HEADER_FIXED.size}", path)
        raise LogFormatError("not a smith-fast session log (bad magic)", path)
    magic, version, _reserved, size, checksum = HEADER_FIXED.unpack_from(data)
    if magic != MAGIC:
        raise LogFormatError(f"not a smith-fast session log (bad magic {magic!r})", path)
    if version not in READABLE_VERSIONS:
        known = " and ".join(map(str, READABLE_VERSIONS))
        raise LogFormatError(f"unsupported log format version {version} (this reader knows {known})", path)
    if size > _MAX_METADATA:
        raise LogFormatError(f"damaged header: metadata length {size} is implausible", path)
    end = HEADER_FIXED.size + size
    if len(data) < end:
        raise LogFormatError(f"truncated header: metadata needs {size} bytes, {len(data) - HEADER_FIXED.size} present", path)
    meta = bytes(data[HEADER_FIXED.size : end])
    if crc(meta) != checksum:
        raise LogFormatError("damaged header: metadata checksum mismatch", path)
    try:
        obj = json.loads(meta)
        extra = {k: v for k, v in obj.items() if k not in ("session_id", "service_id", "protocol_version", "start_time_ns")}
        header = LogHeader(
            session_id=str(obj["session_id"]),
            service_id=str(obj["service_id"]),
            protocol_version=int(obj["protocol_version"]),
            start_time_ns=int(obj["start_time_ns"]),
            format_version=version,
            extra=extra,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogFormatError(f"damaged header: metadata is not the expected JSON object ({exc})", path) from None
    return header, end
