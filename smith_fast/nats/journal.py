"""A gateway's journal: what each resumable session sent, kept in JetStream, so that the next
gateway process with the same ``--gateway-id`` takes the session over (a gateway restart loses
no running request's events).

Why a journal, and why before the peer sees anything: a resumable session's peer reconnects with
the last sequence it received (PROTOCOL.md, "Resume"). The process that answers it must be able to
send everything after that sequence, byte for byte, in the same numbering. A gateway's envelopes
are not a function of the workers' events alone (its own errors, notices, answers to health and
metrics requests are interleaved), so they cannot be made again from the event stream: they are
kept. Each loop iteration's envelopes of a session go into one message on
``<prefix>.out.<gateway>.<session>`` (stream ``--nats-journal-stream``), and leave for the peer
only once JetStream stored that message: whatever the peer may have received, a successor can
replay. The event stream is acknowledged only up to what was journaled (Bridge), so an event
either is in the journal or is still in the event stream for the successor.

A message is ``varint(len(snapshot)) snapshot chunk``: the snapshot (JSON) is the session's state
at that moment (its id, the key of its resume token, what its handshake granted and accepted, the
requests it follows and how far each one's events came: what a successor needs to go on), and the
chunk a piece of the stream of envelopes, each ``varint(len) envelope``. A flush larger than a
NATS message is cut into several; header ``Smith-Journal: <index> <skip>`` numbers the messages
of a session from 1 and says how many bytes at the start of the chunk finish an envelope begun in
the message before. Old messages are purged once the session's retention ring (``--max-session-
buffer``) no longer holds their envelopes; the whole subject when the session ends.

What it costs: only resumable sessions of a gateway started with ``--gateway-id`` are journaled;
their envelopes wait one JetStream round trip (batched per loop iteration), and each iteration of
such a session costs one more NATS message. Sessions that did not ask for ``resume``, and every
session of a gateway with a fresh id, are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import orjson

from .._varint import decode as decode_varint
from ..concealing import conceal
from .._varint import encode as encode_varint
from ..logs import get_logger
from ..service.resume import sequence_of
from .config import NatsConfig
from .wire import MSG_ID

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from .jetstream import Publisher

__all__ = ["JOURNAL", "Journal", "SessionJournal", "Saved", "split_chunks"]

log = get_logger("smith_fast.journal")

JOURNAL = "Smith-Journal"  # "<index> <skip>"
_ROOM = 512  # bytes of a NATS message kept for its headers
_TRIM_EVERY = 64  # purge old messages of a session once this many are kept (one API request per so many)
_READ_TIMEOUT = 10.0  # seconds the restore waits for the next journal message


def split_chunks(units: Iterable[bytes], room: int) -> list[tuple[bytes, int]]:
    """The stream ``varint(len) unit ...`` cut into pieces of at most ``room`` bytes, each with
    how many of its first bytes end a unit begun in the piece before (``skip``)."""
    starts: list[int] = []
    parts: list[bytes] = []
    offset = 0
    for unit in units:
        starts.append(offset)
        head = encode_varint(len(unit))
        parts.append(head)
        parts.append(unit)
        offset += len(head) + len(unit)
    data = b"".join(parts)
    out: list[tuple[bytes, int]] = []
    i = 0
    for off in range(0, len(data), room):
        end = min(off + room, len(data))
        while i < len(starts) and starts[i] < off:
            i += 1
        skip = (starts[i] - off) if i < len(starts) and starts[i] < end else end - off
        out.append((data[off:end], skip))
    return out


def _units(data: bytes) -> list[bytes] | None:
    """The units of a journal's stream; None when it ends inside one (a message went missing)."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        try:
            size, pos = decode_varint(data, pos)
        except (IndexError, ValueError):
            return None
        if pos + size > end:
            return None
        out.append(data[pos:pos + size])
        pos += size
    return out


@dataclasses.dataclass
class Saved:
    """One session as the journal kept it: its last snapshot and the envelopes still kept."""

    session_id: str
    snapshot: dict[str, Any]
    units: list[bytes]


class _Flush:
    """The envelopes of one flush, waiting until every message carrying them is stored."""

    __slots__ = ("units", "first", "last", "last_sequence", "stream_seq", "size", "state")

    def __init__(self, units: list[bytes], first: int, last: int, last_sequence: int) -> None:
        self.units = units
        self.size = sum(len(u) for u in units)
        self.state: dict[str, Any] | None = None  # the snapshot it carries
        self.first = first  # its first and last message index
        self.last = last
        self.last_sequence = last_sequence  # the Envelope.sequence of its last unit
        self.stream_seq = 0  # the lowest stream sequence of its messages, once stored


class SessionJournal:
    """One resumable session's journal (made by :meth:`Journal.open`).

    Args:
        journal: the gateway's journal.
        session_id: the session.
        snapshot: the session's state now (JSON-able), taken as each flush leaves.
        oldest: the sequence of the oldest envelope the session's retention ring still keeps:
            messages holding only older ones are purged.
        framed: its envelopes carry a length prefix (socket sessions).
        prepare: called before each flush (the sink's ``flush_batch``: what its snapshot counts
            as sent must be in the flush).
        next_index: the last message index the process before used (a restored session).
        limit: ``--max-session-buffer``: old messages are purged at least each time this many
            bytes more are kept, so the journal holds about twice what the ring does at most.
        stored: called with the snapshot of each flush once it is stored, in order; with None
            when a flush could not be journaled (nothing is durable for this session then).
    """

    def __init__(self, journal: Journal, session_id: str, snapshot: Callable[[], dict[str, Any]],
                 oldest: Callable[[], int], framed: bool, prepare: Callable[[], None], next_index: int = 0,
                 limit: int = 1 << 24, stored: Callable[[dict[str, Any] | None], None] | None = None) -> None:
        self._journal = journal
        self.session_id = session_id
        self.subject = journal.config.journal_subject(journal.gateway_id, session_id)
        self._snapshot = snapshot
        self._oldest = oldest
        self._framed = framed
        self._prepare = prepare
        self._on_stored = stored
        self._deliver: Callable[[bytes], None] = _nowhere
        self.pending: list[bytes] = []
        self.index = next_index  # the last message index used
        self._flushes: dict[int, _Flush] = {}  # by last index, not yet released
        self._stored: dict[int, int] = {}  # index -> stream sequence, of messages stored and not yet released
        self._released = next_index  # every message up to this index is stored, its envelopes sent on
        self._kept: list[_Flush] = []  # released flushes whose messages are still in the stream
        self._trim_at = _TRIM_EVERY
        self._last_sequence = 0  # of the last unit journaled
        self._limit = limit
        self._kept_bytes = 0
        self._trim_bytes = limit
        self._outstanding: set[asyncio.Future[int]] = set()
        self.failed = False  # a message could not be stored: a successor cannot take this session over exactly
        self.ended = False
        self._secrets: list[Callable[[], str | None]] = []  # masked in what is journaled (conceal)

    def conceal(self, secret: Callable[[], str | None]) -> None:
        """Keep the secret ``secret()`` returns at each flush (the service's token; the session's
        resume token, which its Ready carries and a restored session learns back only when its peer
        resumes) out of the journal: masked byte for byte in what is stored (smith_fast.concealing),
        while the peer gets the envelopes as they are. A successor replays a masked Ready only to a
        peer that resumed with the token already."""
        self._secrets.append(secret)

    def _concealed(self, units: list[bytes]) -> list[bytes]:
        secrets = tuple(dict.fromkeys(s.encode("utf-8", "surrogatepass") for s in (get() for get in self._secrets) if s))
        return [conceal(u, secrets) for u in units] if secrets else units

    def stage(self, write: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """The sink's interposed stage (EventSink.interpose): hold each unit until it is journaled."""
        self._deliver = write
        return self.append

    def append(self, unit: bytes) -> None:
        self.pending.append(unit)
        if len(self.pending) == 1:
            self._journal.dirty(self)

    def flush(self, *, force: bool = False) -> None:
        """Journal what was written since the last flush; it goes on to the peer once stored.
        ``force``: a message even with nothing written, for the snapshot (a stopping gateway's
        last word: the requests it follows as they are now)."""
        self._prepare()
        units, self.pending = self.pending, []
        if not units and not force:
            return
        publisher = self._journal.publisher
        if publisher is None or self.ended:  # NATS never reached (or ended): nothing to keep it in; the peer gets it now
            self._fail("NATS is not reached yet")
            self._unjournaled(units)
            return
        state = self._snapshot()
        try:
            snapshot = orjson.dumps(state)
        except (TypeError, ValueError) as exc:  # a bug of ours: the peer must still get what it was sent
            self._fail(f"the session's state could not be written down: {exc}")
            self._unjournaled(units)
            return
        head = encode_varint(len(snapshot)) + snapshot
        room = max(4096, publisher.max_payload - len(head) - _ROOM)
        chunks = split_chunks(self._concealed(units), room)
        first = self.index + 1
        if units:
            self._last_sequence = sequence_of(units[-1], self._framed)
        else:
            chunks = [(b"", 0)]
        flush = _Flush(units, first, self.index + len(chunks), self._last_sequence)
        flush.state = state
        self._flushes[flush.last] = flush
        gateway = self._journal.gateway_id
        for chunk, skip in chunks:
            self.index += 1
            # the process's own id in the message id: a republish is stored once, but a successor
            # reusing an index whose message arrived late is not taken for that one
            headers = {MSG_ID: f"{gateway}.{self.session_id}.{self._journal.incarnation}.j{self.index}", JOURNAL: f"{self.index} {skip}"}
            future = publisher.publish(self.subject, head + chunk, headers)
            self._journal.published += 1
            self._outstanding.add(future)
            self._journal.outstanding.add(future)
            future.add_done_callback(functools.partial(self._done, self.index))

    def _unjournaled(self, units: list[bytes]) -> None:
        """Units that cannot be journaled: to the peer after those journaled before them."""
        self.index += 1
        self._flushes[self.index] = _Flush(units, self.index, self.index, 0)
        self._stored[self.index] = 0
        self._release()

    def _done(self, index: int, future: asyncio.Future[int]) -> None:
        self._outstanding.discard(future)
        self._journal.outstanding.discard(future)
        if future.cancelled():
            seq = 0
            self._fail("the publish was cancelled")
        elif (exc := future.exception()) is not None:
            seq = 0
            self._fail(str(exc) or type(exc).__name__)
        else:
            seq = future.result()
        self._stored[index] = seq
        self._release()

    def _release(self) -> None:
        """Send on, in index order, the units of every flush whose messages are all stored."""
        while self._released + 1 in self._stored:  # in index order: a republished message may be stored late
            self._released += 1
            flush = self._flushes.pop(self._released, None)
            if flush is None:
                continue
            seqs = [self._stored.pop(i) for i in range(flush.first, flush.last + 1)]
            flush.stream_seq = min((s for s in seqs if s), default=0)
            for unit in flush.units:
                self._deliver(unit)
            flush.units = []
            if self._on_stored is not None:
                self._on_stored(flush.state if flush.stream_seq else None)
            flush.state = None
            self._kept.append(flush)
            self._kept_bytes += flush.size
        if len(self._kept) >= self._trim_at or self._kept_bytes >= self._trim_bytes:
            self._trim()
            # one purge request per so many flushes or bytes at most
            self._trim_at = len(self._kept) + _TRIM_EVERY
            self._trim_bytes = self._kept_bytes + self._limit

    def _fail(self, why: str) -> None:
        if not self.failed and not self.ended:
            self.failed = True
            log.warning("journal incomplete", extra={"fields": {
                "session": self.session_id, "error": why,
                "consequence": "if this gateway stops now, its successor cannot resume this session"}})

    def _trim(self) -> None:
        """Purge the messages whose envelopes the session's ring no longer keeps."""
        oldest = self._oldest()
        kept = self._kept
        drop = 0
        while drop < len(kept) - 1 and kept[drop].last_sequence < oldest:
            drop += 1
        if not drop:
            return
        keep_from = kept[drop].stream_seq
        self._kept_bytes -= sum(f.size for f in kept[:drop])
        del kept[:drop]
        if keep_from:
            self._journal.purge(self.subject, keep_from)

    async def settled(self) -> None:
        """Everything written so far is stored (or failed)."""
        self.flush()
        if self._outstanding:
            await asyncio.wait(list(self._outstanding))

    def end(self) -> None:
        """The session is over: its journal goes (once what is on its way was stored)."""
        if self.ended:
            return
        self.flush()
        self.ended = True
        self._journal.forget(self)


def _nowhere(_unit: bytes) -> None:
    pass


class Journal:
    """The journals of a gateway's resumable sessions.

    Args:
        config: NATS names (the journal stream, subjects).
        gateway_id: the gateway's fixed id (``--gateway-id``).
        spawn: runs a coroutine in the background (the bridge's, which waits for them on close).
    """

    def __init__(self, config: NatsConfig, gateway_id: str, spawn: Callable[[Any], None]) -> None:
        self.config = config
        self.gateway_id = gateway_id
        self._spawn = spawn
        self.publisher: Publisher | None = None
        self.js: JetStreamContext | None = None
        self.sessions: dict[str, SessionJournal] = {}
        self.outstanding: set[asyncio.Future[int]] = set()
        self._dirty: list[SessionJournal] = []
        self.incarnation = uuid.uuid4().hex[:12]  # this process
        self.published = 0  # journal messages

    def attach(self, publisher: Publisher, js: JetStreamContext) -> None:
        self.publisher, self.js = publisher, js

    def open(self, session_id: str, snapshot: Callable[[], dict[str, Any]], oldest: Callable[[], int], framed: bool,
             prepare: Callable[[], None], next_index: int = 0, limit: int = 1 << 24,
             stored: Callable[[dict[str, Any] | None], None] | None = None) -> SessionJournal:
        journal = SessionJournal(self, session_id, snapshot, oldest, framed, prepare, next_index, limit, stored)
        self.sessions[session_id] = journal
        return journal

    @property
    def busy(self) -> bool:
        """Something written is not stored yet."""
        return bool(self._dirty or self.outstanding)

    def dirty(self, journal: SessionJournal) -> None:
        if not self._dirty:
            asyncio.get_running_loop().call_soon(self.flush)
        self._dirty.append(journal)

    def snapshot_all(self) -> None:
        """A message of every session's state now, written or not (a stopping gateway)."""
        for journal in list(self.sessions.values()):
            journal.flush(force=True)

    def flush(self) -> None:
        """Journal every session's envelopes of this loop iteration (one message each)."""
        dirty, self._dirty = self._dirty, []
        for journal in dirty:
            journal.flush()

    async def settled(self) -> None:
        """Everything written so far by every session is stored (or failed)."""
        self.flush()
        if self.outstanding:
            await asyncio.wait(list(self.outstanding))

    def purge(self, subject: str, keep_from: int = 0) -> None:
        """Remove a session's journal messages below stream sequence ``keep_from`` (all: 0)."""
        self._spawn(self._purge(subject, keep_from))

    async def _purge(self, subject: str, keep_from: int) -> None:
        if self.js is None:
            return
        with contextlib.suppress(Exception):
            await self.js.purge_stream(self.config.journal_stream, seq=keep_from or None, subject=subject)

    def forget(self, journal: SessionJournal) -> None:
        if self.sessions.get(journal.session_id) is journal:
            del self.sessions[journal.session_id]
        self._spawn(self._forget(journal))

    async def _forget(self, journal: SessionJournal) -> None:
        await journal.settled()
        await self._purge(journal.subject, 0)

    async def read(self) -> list[Saved]:
        """Every session this gateway id journaled (the process before this one handed them over,
        or died holding them): each one's last snapshot and the envelopes still kept."""
        js = self.js
        assert js is not None
        config = self.config
        subjects = config.journal_filter(self.gateway_id)
        try:
            info = await js.stream_info(config.journal_stream, subjects_filter=subjects)
        except Exception as exc:
            log.warning("journal not read", extra={"fields": {"error": repr(exc)}})
            return []
        total = sum((info.state.subjects or {}).values())
        if not total:
            return []
        found: dict[str, dict[int, tuple[int, bytes, bytes]]] = {}
        sub = await js.subscribe(subjects, stream=config.journal_stream, ordered_consumer=True)
        started = time.monotonic()
        try:
            for _ in range(total):
                msg = await sub.next_msg(timeout=_READ_TIMEOUT)
                try:
                    index, skip = (int(v) for v in (msg.headers or {})[JOURNAL].split())
                    size, pos = decode_varint(msg.data, 0)
                except (KeyError, ValueError, IndexError):
                    continue
                session = msg.subject.rpartition(".")[2]
                found.setdefault(session, {})[index] = (skip, msg.data[pos:pos + size], msg.data[pos + size:])
                if msg.metadata.num_pending == 0:
                    break
        except asyncio.TimeoutError:
            log.warning("journal read incomplete", extra={"fields": {"read_sessions": len(found)}})
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        saved = []
        for session, messages in found.items():
            restored = _reassemble(session, messages)
            if restored is None:
                log.warning("journal unusable", extra={"fields": {"session": session, "messages": len(messages)}})
                self.purge(config.journal_subject(self.gateway_id, session))
                continue
            saved.append(restored)
        log.info("journal read", extra={"fields": {"sessions": len(saved), "messages": total,
                                                    "took_ms": round((time.monotonic() - started) * 1000, 1)}})
        return saved


def _reassemble(session: str, messages: dict[int, tuple[int, bytes, bytes]]) -> Saved | None:
    """The last unbroken run of a session's messages, as its snapshot and envelopes."""
    last = max(messages)
    first = last
    while first - 1 in messages:
        first -= 1
    try:
        snapshot = orjson.loads(messages[last][1])
    except orjson.JSONDecodeError:
        return None
    skip = messages[first][0]
    data = b"".join(messages[i][2] for i in range(first, last + 1))[skip:]
    units = _units(data)
    if units is None or not isinstance(snapshot, dict):
        return None
    snapshot["journal_index"] = last
    return Saved(session, snapshot, units)

