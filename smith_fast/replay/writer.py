"""Recording a session: :class:`SessionRecorder` appends every envelope in and out to a log file.

The hot path (:meth:`SessionRecorder.record_in` / :meth:`~SessionRecorder.record_out`) packs a
17-byte record head (length, CRC, direction, time) and queues it with a reference to the envelope
bytes; the queue is written with one ``os.writev`` once per event-loop tick (scheduled by the first
record of the tick), or at once when it passes ``flush_bytes``. Envelope bytes are never copied in
user space.

Durability: records reach the kernel at the end of the loop tick they were recorded in, so a crash
of the service process loses at most that tick's records, and the file is then valid up to its
last whole record (a write interrupted half-way leaves one torn record, which readers skip). There
is no ``fsync`` per record: after an OS crash or power loss, whatever the page cache had not written
back is lost, and a reader still gets the intact prefix (a garbled or zero-filled tail fails its
length or checksum test). :meth:`SessionRecorder.close` fsyncs unless told not to;
:meth:`SessionRecorder.aclose` (what the service uses) writes everything at once and leaves the
fsync to a worker thread, so closing a long log does not stall the event loop.

A write failure (disk full, file too large, I/O error) never reaches the session: it is kept in
:attr:`SessionRecorder.error`, logged once, passed to ``on_error``, the partial record is cut off
when possible, and recording stops while the session goes on.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import struct
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from .. import _varint
from .._version import __version__
from ..concealing import conceal
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .format import (
    BODY_PREFIX,
    DIRECTION_IN,
    DIRECTION_OUT,
    DISCARDED,
    FILE_SUFFIX,
    RECORD_IN_DISCARDED,
    RECORD_IN_LINE,
    RECORD_IN_MALFORMED,
    RECORD_HEADER,
    LogHeader,
    crc,
    encode_header,
)

__all__ = ["FLUSH_BYTES", "SessionRecorder", "log_file_name"]

log = get_logger("smith_fast.replay")

FLUSH_BYTES = 64 * 1024
_pack_prefix = BODY_PREFIX.pack
_monotonic_ns = time.monotonic_ns
_pack_head = struct.Struct("<" + RECORD_HEADER.format.lstrip("<") + BODY_PREFIX.format.lstrip("<")).pack  # header + prefix
_PREFIX_SIZE = BODY_PREFIX.size
_RECORD_HEADER_SIZE = RECORD_HEADER.size
_COPY_BELOW = 2048
# Records are kept as (head, envelope) pieces and written with one writev, so envelope bytes are
# never copied in user space; IOV_MAX (1024 on Linux) bounds the pieces of one call.
_MAX_PIECES = 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def log_file_name(session_id: str, start_time_ns: int) -> str:
    """``20250101T120000.123456Z-<session id>.smithrec``: sorts by start time; the id made file-safe."""
    seconds, ns = divmod(start_time_ns, 1_000_000_000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
    safe = _UNSAFE.sub("_", session_id)[:80] or "session"
    return f"{stamp}.{ns // 1000:06d}Z-{safe}{FILE_SUFFIX}"


class SessionRecorder:
    """Append-only recorder of one session's envelopes. Create it with :meth:`open`.

    Attributes:
        path: the log file.
        header: the metadata written at its start.
        error: why recording stopped after a write failure, else None.
        records: records accepted so far (written or buffered).
    """

    __slots__ = (
        "path",
        "header",
        "error",
        "records",
        "_fd",
        "_parts",
        "_pending",
        "_t0",
        "_flush_bytes",
        "_flush_delay",
        "_scheduled",
        "_written",
        "_active",
        "_on_error",
        "_in_seq",
        "_out_seq",
        "_secrets",
        "_limit",
    )

    def __init__(
        self,
        path: Path,
        fd: int,
        header: LogHeader,
        t0: int,
        *,
        flush_bytes: int = FLUSH_BYTES,
        flush_delay: float = 0.0,
        on_error: Callable[[str], None] | None = None,
        limit: Callable[[int], bool] | None = None,
    ) -> None:
        self.path = path
        self.header = header
        self.error: str | None = None
        self.records = 0
        self._fd = fd
        self._parts: list[bytes | memoryview] = []
        self._pending = 0  # bytes in _parts
        self._t0 = t0
        self._flush_bytes = flush_bytes
        self._flush_delay = flush_delay
        self._scheduled = False
        self._written = 0  # bytes of whole records (and header) on disk: where to cut a torn write
        self._active = True
        self._on_error = on_error
        self._in_seq = 0
        self._out_seq = 0
        self._secrets: tuple[bytes, ...] = ()  # masked in every record (conceal)
        self._limit = limit  # asked before each write: may these bytes more be written?

    @classmethod
    def open(
        cls,
        directory: Path | str,
        *,
        session_id: str,
        protocol_version: int,
        service_id: str,
        flush_bytes: int = FLUSH_BYTES,
        flush_delay: float = 0.0,
        on_error: Callable[[str], None] | None = None,
        metadata: Mapping[str, object] | None = None,
        limit: Callable[[int], bool] | None = None,
        mode: int = 0o700,
    ) -> SessionRecorder:
        """Create a new log file in ``directory`` (made if missing) and write its header.

        Args:
            directory: where logs go; the file name comes from the start time and ``session_id``.
            session_id: the session's id (any string; sanitized for the file name).
            protocol_version: the session's wire protocol (0 or 1).
            service_id: the service's ``ReadyEvent.service_id``.
            flush_bytes: write the buffer at once when it grows past this many bytes.
            flush_delay: seconds to wait before the loop-scheduled write; 0 writes at the end of
                the current loop tick. Without a running loop, records are written only at
                ``flush_bytes``, :meth:`flush` and :meth:`close`.
            on_error: called once, with :attr:`error`, if a write fails (e.g. to send a LogEvent).
            metadata: extra JSON-serializable header keys.
            limit: called with the size of each write (the header's included) before it is made;
                False stops recording there, as a write failure does (``--record-max-bytes``:
                :class:`~smith_fast.replay.store.RecordingStore`).
            mode: the permissions ``directory`` is created with when missing (its parents too):
                only the service's user may read recordings.

        Returns:
            The recorder, header already written.

        Raises:
            OSError: the directory or the file cannot be created, or the header cannot be written.
        """
        start_ns = time.time_ns()
        t0 = time.monotonic_ns()
        extra = dict(metadata or {})
        extra.setdefault("smith_fast_version", __version__)
        header = LogHeader(session_id, service_id, protocol_version, start_ns, extra=extra)
        directory = Path(directory)
        directory.mkdir(mode=mode, parents=True, exist_ok=True)
        path = directory / log_file_name(session_id, start_ns)
        if path.exists():  # two sessions with one id in the same microsecond: keep both
            path = path.with_name(f"{path.stem}-{uuid.uuid4().hex[:8]}{FILE_SUFFIX}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            data = encode_header(header)
            if limit is not None and not limit(len(data)):
                raise OSError(errno.EFBIG, "the recordings are at --record-max-bytes")
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        recorder = cls(path, fd, header, t0, flush_bytes=flush_bytes, flush_delay=flush_delay, on_error=on_error, limit=limit)
        recorder._written = len(data)
        return recorder

    def conceal(self, secret: str | None) -> None:
        """Keep ``secret`` out of every record from now on, in either direction: masked byte for
        byte (:func:`smith_fast.concealing.conceal`), so each record stays a valid Envelope. For
        the service's token and a session's resume token, which a Ready carries to its peer."""
        if secret:
            data = secret.encode("utf-8", "surrogatepass")
            if data not in self._secrets:
                self._secrets += (data,)

    def _concealed(self, envelope: bytes | memoryview) -> bytes | memoryview:
        """``envelope`` with the secrets masked; a view of a large frame is searched in the bytes it
        views and copied only when a secret is there (the recorder copies no envelope otherwise)."""
        whole = envelope.obj if type(envelope) is memoryview else envelope
        if type(whole) is bytes and not any(secret in whole for secret in self._secrets):
            return envelope
        return conceal(envelope, self._secrets)

    # ---- the hot path ------------------------------------------------------------------------

    def _record(self, direction: int, envelope: bytes | memoryview) -> None:
        """Queue one record; ``envelope`` must be immutable (bytes, or a view of bytes)."""
        if not self._active:
            return
        if self._secrets:  # only a session with a token or resume token: one search per secret
            envelope = self._concealed(envelope)
        t = _monotonic_ns() - self._t0
        size = len(envelope) + _PREFIX_SIZE
        parts = self._parts
        parts.append(_pack_head(size, crc(envelope, crc(_pack_prefix(direction, t))), direction, t))
        parts.append(envelope)
        self._pending += size + _RECORD_HEADER_SIZE
        self.records += 1
        if self._pending >= self._flush_bytes or len(parts) >= _MAX_PIECES:
            self.flush()
        elif not self._scheduled:
            self._schedule()

    def record_in(self, envelope: bytes | bytearray | memoryview) -> None:
        """Record a client → service ``Envelope`` (serialized, without its length prefix)."""
        self._record(DIRECTION_IN, envelope if type(envelope) is bytes else bytes(envelope))

    def record_out(self, envelope: bytes | bytearray | memoryview) -> None:
        """Record a service → client ``Envelope`` (serialized, without its length prefix)."""
        self._record(DIRECTION_OUT, envelope if type(envelope) is bytes else bytes(envelope))

    def record_out_frame(self, frame: bytes) -> None:
        """Record a service → client frame as the sink writes it: one varint-delimited Envelope.

        Args:
            frame: ``bytes`` (kept, not copied, until the next write).
        """
        # Skip the length prefix (the sink wrote it, so it is well formed); one byte below 128
        # bytes, the common case, without a call.
        i = 1 if frame[0] < 0x80 else _varint.skip(frame)
        if type(frame) is bytes and len(frame) > _COPY_BELOW:
            self._record(DIRECTION_OUT, memoryview(frame)[i:])
        else:  # copying a short frame is cheaper than making a view of it
            self._record(DIRECTION_OUT, bytes(frame[i:]))

    def record_line(self, line: bytes, *, malformed: bool = False) -> None:
        """Record a v0 line as it arrived (without its ``\\n``; the token already redacted).

        Args:
            line: the line's bytes.
            malformed: the service could not decode it (the record is kept as
                ``RECORD_IN_MALFORMED``, so a reader can tell).
        """
        self._record(RECORD_IN_MALFORMED if malformed else RECORD_IN_LINE, line if type(line) is bytes else bytes(line))

    def record_malformed(self, unit: bytes | bytearray | memoryview) -> None:
        """Record inbound bytes that are not what the protocol expects, as they arrived: a v1 frame
        or gRPC message that is not an Envelope (the token already redacted)."""
        self._record(RECORD_IN_MALFORMED, unit if type(unit) is bytes else bytes(unit))

    def record_discarded(self, offset: int, size: int, *, complete: bool, head: bytes = b"") -> None:
        """Record inbound bytes the service discarded without reading them as a unit.

        Args:
            offset: their offset in the inbound byte stream.
            size: how many there were (as far as the service saw them).
            complete: the whole unit was seen (a v0 line up to its newline).
            head: the first bytes (at most 10: a v1 length prefix); a v0 line's are not kept.
        """
        self._record(RECORD_IN_DISCARDED, DISCARDED.pack(offset, size, int(complete)) + bytes(head[:10]))

    def record_command(self, command: pb.Command) -> None:
        """Record a v0 command as the v1 Envelope carrying it (receive time, per-direction sequence)."""
        if self._active:
            self._in_seq += 1
            env = pb.Envelope(timestamp=time.time_ns() // 1_000_000, sequence=self._in_seq)
            env.command.CopyFrom(command)
            self._record(DIRECTION_IN, env.SerializeToString())

    def record_event(self, event: pb.Event) -> None:
        """Record a v0 event as the v1 Envelope carrying it (send time, per-direction sequence)."""
        if self._active:
            self._out_seq += 1
            env = pb.Envelope(timestamp=time.time_ns() // 1_000_000, sequence=self._out_seq)
            env.event.CopyFrom(event)
            self._record(DIRECTION_OUT, env.SerializeToString())

    # ---- writing -----------------------------------------------------------------------------

    def _schedule(self) -> None:
        loop = asyncio._get_running_loop()  # None instead of raising: this runs once per record without a loop
        if loop is None:
            return  # no loop: flush_bytes, flush() and close() write
        self._scheduled = True
        if self._flush_delay > 0:
            loop.call_later(self._flush_delay, self.flush)
        else:
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the buffered records now (one ``writev``). Never raises: failures stop recording."""
        self._scheduled = False
        if not self._parts or not self._active:
            return
        parts, size = self._parts, self._pending
        self._parts, self._pending = [], 0
        if self._limit is not None and not self._limit(size):
            self._fail(OSError(errno.EFBIG, "the recordings reached --record-max-bytes (the oldest are removed first; this one alone fills it)"))
            return
        try:
            n = os.writev(self._fd, parts)
            if n < size:  # short write (a signal, or the disk filling up): finish or fail
                _write_all(self._fd, memoryview(b"".join(parts))[n:])
        except OSError as exc:
            self._fail(exc)
            return
        self._written += size

    def _fail(self, exc: OSError) -> None:
        self._active = False
        self._parts, self._pending = [], 0
        reason = exc.strerror or str(exc)
        self.error = f"recording stopped: cannot write {self.path}: {reason} (errno {exc.errno}); the session goes on"
        try:  # cut a partially written batch so the file ends on a whole record
            os.ftruncate(self._fd, self._written)
        except OSError:
            pass  # readers skip a torn tail anyway
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = -1
        log.warning("session recording failed", extra={"fields": {"path": str(self.path), "error": reason, "errno": exc.errno}})
        if self._on_error is not None:
            try:
                self._on_error(self.error)
            except Exception:  # the session must not die of its own error reporter
                log.exception("recording on_error callback failed")

    @property
    def active(self) -> bool:
        """True while records are being kept (not closed, no write failure)."""
        return self._active

    @property
    def bytes_written(self) -> int:
        """Bytes on disk so far, header included (buffered records not counted)."""
        return self._written

    def close(self, *, fsync: bool = True) -> None:
        """Write what is buffered, optionally fsync, and close the file. Idempotent; never raises.

        Args:
            fsync: make the log durable before closing (the only fsync the recorder does).
        """
        fd = self._finish()
        if fd >= 0:
            _sync_and_close(fd, self.path, fsync)

    async def aclose(self) -> None:
        """:meth:`close` with the fsync in a worker thread: the event loop (every other session of the
        service) does not wait for the disk. Everything buffered is written before this returns
        control; only the fsync and the close of the file come later. Never raises."""
        fd = self._finish()
        if fd < 0:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, _sync_and_close, fd, self.path, True)
        except RuntimeError:  # the loop's executor is shut down already: do it here
            _sync_and_close(fd, self.path, True)

    def _finish(self) -> int:
        """Write what is buffered and stop recording; the fd to close, or -1 if there is none."""
        if not self._active:
            return -1
        self.flush()
        if not self._active:  # the final flush failed (and closed the file)
            return -1
        self._active = False
        fd, self._fd = self._fd, -1
        return fd

    def __enter__(self) -> SessionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sync_and_close(fd: int, path: Path, fsync: bool) -> None:
    try:
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        log.warning("session log fsync failed", extra={"fields": {"path": str(path), "error": str(exc)}})
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
