"""Reading a session log: records in file order, up to the first torn or garbled one.

A torn tail (a record cut short by a crash, or one whose length or checksum is wrong) ends the
iteration quietly; :attr:`LogReader.torn` then says where and why. Only a bad *header* raises.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..pb import smith_pb2 as pb
from google.protobuf.message import DecodeError

from .format import (
    BODY_PREFIX,
    BODY_PREFIX_SIZE,
    DIRECTION_OUT,
    DISCARDED,
    HEADER_FIXED,
    MAX_RECORD_SIZE,
    RECORD_HEADER,
    RECORD_IN_DISCARDED,
    RECORD_KINDS,
    LogHeader,
    crc,
    decode_header,
)

__all__ = ["Discarded", "LogReader", "Record", "TornTail", "read_log"]

_READ_SIZE = 1 << 20


@dataclass(frozen=True, slots=True)
class Discarded:
    """What a ``RECORD_IN_DISCARDED`` record says about inbound bytes the service did not read.

    Attributes:
        offset: their offset in the inbound byte stream.
        size: how many (as far as the service saw them).
        complete: the whole unit was seen.
        head: their first bytes, when kept (a v1 length prefix).
    """

    offset: int
    size: int
    complete: bool
    head: bytes


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a session log.

    Attributes:
        direction: the record kind (``smith_fast.replay.format``): ``RECORD_IN`` (0) and
            ``RECORD_OUT`` (1) hold an Envelope; 2 to 4 are inbound bytes as they arrived.
        offset_ns: monotonic nanoseconds since the recording started.
        envelope: the record's payload: a serialized ``smith.v1.Envelope`` for kinds 0 and 1.
        position: byte offset of the record in the file.
    """

    direction: int
    offset_ns: int
    envelope: bytes
    position: int

    @property
    def inbound(self) -> bool:
        """True for a client → service record."""
        return self.direction != DIRECTION_OUT

    @property
    def kind(self) -> str:
        """The kind's name: ``in``, ``out``, ``line``, ``malformed`` or ``discarded``."""
        return RECORD_KINDS[self.direction]

    @property
    def raw(self) -> bool:
        """True for inbound bytes kept as they arrived (kinds 2 to 4), which hold no Envelope."""
        return self.direction > DIRECTION_OUT

    def parse(self) -> pb.Envelope:
        """The envelope as a protobuf message.

        Raises:
            google.protobuf.message.DecodeError: the bytes are not an Envelope (a raw record, or a
                recorder that was handed something else; the checksum only vouches that they are
                what was recorded).
        """
        if self.raw:
            raise DecodeError(f"a {self.kind} record holds inbound bytes as they arrived, not an Envelope")
        envelope: pb.Envelope = pb.Envelope.FromString(self.envelope)
        return envelope

    def discarded(self) -> Discarded:
        """The description a ``RECORD_IN_DISCARDED`` record holds.

        Raises:
            ValueError: another kind of record, or a payload too short.
        """
        if self.direction != RECORD_IN_DISCARDED or len(self.envelope) < DISCARDED.size:
            raise ValueError(f"record at byte {self.position} is not a well-formed discarded record")
        offset, size, complete = DISCARDED.unpack_from(self.envelope)
        return Discarded(offset, size, bool(complete), self.envelope[DISCARDED.size :])


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where reading stopped early.

    Attributes:
        offset: file offset of the first record that could not be read.
        size: bytes from there to the end of the file (ignored by the reader).
        reason: what was wrong with it.
    """

    offset: int
    size: int
    reason: str


class LogReader:
    """Iterate over the records of a session log.

    Args:
        source: a path, or a binary file object positioned at the start of a log.

    Raises:
        LogFormatError: the file is not a session log or its header is damaged.
        OSError: the file cannot be opened or read.

    Attributes:
        header: the log's metadata.
        header_size: bytes of header before the first record.
        torn: set once iteration stopped at a torn or garbled record; None while none was met.
    """

    def __init__(self, source: Path | str | BinaryIO) -> None:
        if isinstance(source, (str, Path)):
            self.name: str | None = str(source)
            self._file: BinaryIO = open(source, "rb")  # noqa: SIM115  (closed by close())
            self._owned = True
        else:
            self.name = getattr(source, "name", None)
            self._file = source
            self._owned = False
        try:
            head = self._file.read(HEADER_FIXED.size)
            if len(head) == HEADER_FIXED.size:
                size = HEADER_FIXED.unpack(head)[3]
                if head.startswith(b"SMITHREC") and size < (1 << 20):
                    head += self._file.read(size)
            self.header: LogHeader
            self.header, self.header_size = decode_header(head, self.name)
        except BaseException:
            self.close()
            raise
        self.torn: TornTail | None = None
        self._pos = self.header_size
        self._buf = b""
        self._at = 0  # read position inside _buf
        self._eof = False

    def _fill(self, need: int) -> bool:
        """Make ``need`` unread bytes available in the buffer; False when the file ends first."""
        while len(self._buf) - self._at < need and not self._eof:
            chunk = self._file.read(max(_READ_SIZE, need))
            if not chunk:
                self._eof = True
                break
            self._buf = self._buf[self._at :] + chunk
            self._at = 0
        return len(self._buf) - self._at >= need

    def _remaining(self) -> int:
        rest = len(self._buf) - self._at
        while not self._eof:
            chunk = self._file.read(_READ_SIZE)
            if not chunk:
                self._eof = True
            rest += len(chunk)
        return rest

    def _stop(self, reason: str) -> None:
        self.torn = TornTail(self._pos, self._remaining(), reason)

    def __iter__(self) -> Iterator[Record]:
        unpack_header = RECORD_HEADER.unpack_from
        unpack_prefix = BODY_PREFIX.unpack_from
        hsize = RECORD_HEADER.size
        while self.torn is None:
            if not self._fill(hsize):
                if len(self._buf) - self._at:
                    self._stop(f"incomplete record header ({len(self._buf) - self._at} of {hsize} bytes)")
                return
            length, checksum = unpack_header(self._buf, self._at)
            if not BODY_PREFIX_SIZE <= length <= MAX_RECORD_SIZE:
                self._stop(f"implausible record length {length}")
                return
            if not self._fill(hsize + length):
                have = len(self._buf) - self._at - hsize
                self._stop(f"incomplete record ({have} of {length} body bytes)")
                return
            start = self._at + hsize
            body = memoryview(self._buf)[start : start + length]
            if crc(body) != checksum:
                self._stop("record checksum mismatch")
                return
            direction, offset_ns = unpack_prefix(body)
            if direction not in RECORD_KINDS or (direction > DIRECTION_OUT and self.header.format_version < 2):
                self._stop(f"unknown record kind {direction}")
                return
            record = Record(direction, offset_ns, bytes(body[BODY_PREFIX_SIZE:]), self._pos)
            self._at = start + length
            self._pos += hsize + length
            yield record

    def close(self) -> None:
        """Close the file if this reader opened it."""
        if self._owned:
            self._file.close()

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_log(source: Path | str | bytes | BinaryIO) -> tuple[LogHeader, list[Record], TornTail | None]:
    """Read a whole log.

    Args:
        source: a path, a binary file object, or the log's bytes.

    Returns:
        The header, every intact record before any torn tail, and the torn tail (or None).

    Raises:
        LogFormatError: not a session log, or a damaged header.
        OSError: the file cannot be read.
    """
    if isinstance(source, (bytes, bytearray)):
        source = io.BytesIO(bytes(source))
    with LogReader(source) as reader:
        records = list(reader)
        return reader.header, records, reader.torn

