"""A session's side of resume (PROTOCOL.md, "Resume"): offered in the handshake, parked when its
connection drops, re-attached to the connection that presents its token.

:class:`SessionResume` is one per session and owns what resume needs of it: the connection that
carries it (a :class:`~smith_fast.service.resume.Front`) and, once offered, its
:class:`~smith_fast.service.resume.Resumable` (token, key, retention ring). It sees its session
through :class:`Carried`; the parking lot, the ring and the tokens are in
:mod:`~smith_fast.service.resume`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .. import events
from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from .admission import ready_event
from .negotiation import ACCEPTABLE, DEFAULT_METRICS_INTERVAL_MS
from .resume import Front, ParkedSessions, Resumable, ResumeRefused, Retention
from .sinks import EventSink, now_ms

if TYPE_CHECKING:
    from ..replay import SessionRecorder
    from .config import Limits
    from .request_table import RequestTable

__all__ = ["Carried", "SessionResume"]

log = get_logger("smith_fast.session")

_EVENT = pb.Envelope.DESCRIPTOR.fields_by_name["event"].number


class Carried(Protocol):
    """What resume does to its session (:class:`~smith_fast.service.session.Session`)."""

    sink: EventSink
    peer: str
    version: int
    granted: frozenset[int]
    accepted: frozenset[str]
    handshaken: bool
    authenticated: bool
    shutting: bool
    recorder: SessionRecorder | None
    last_active: float

    @property
    def core(self) -> ResumeCore: ...

    @property
    def closing(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    @property
    def requests(self) -> RequestTable: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def carry_over(self, front: Front | None) -> None:
        """Write to, read from and close ``front`` from now on (None: nothing, while parked)."""

    def apply_accepted(self, accepted: frozenset[str], interval_ms: int) -> None: ...

    def expire_parked(self) -> None: ...

    def lost(self) -> None:
        """End as a dropped connection does (its processes killed)."""

    def end_quietly(self) -> None:
        """End without a word (a connection that resumed another session)."""

    def protocol_error(self, exc: ProtocolError) -> None: ...

    def now(self) -> float: ...

    def reattach(self, front: Front, after: int) -> None: ...


class ResumeCore(Protocol):
    """What resume uses of the core (part of :class:`~smith_fast.service.session.SessionCore`)."""

    @property
    def parked(self) -> ParkedSessions: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def service_id(self) -> str: ...

    def service_info(
        self, version: int, granted: list[int], accepted: Sequence[str] = (), interval_ms: int = DEFAULT_METRICS_INTERVAL_MS
    ) -> dict[str, str]: ...



class SessionResume:
    """The resume state of one session.

    Args:
        session: the session.
        front: the connection carrying it, when it can be resumed over another one after it
            dropped (Unix, TCP, gRPC; not stdio).
    """

    __slots__ = ("_session", "front", "resumable")

    def __init__(self, session: Carried, front: Front | None) -> None:
        self._session = session
        self.front = front
        self.resumable: Resumable | None = None  # once a handshake asked for resume

    def parked_bytes(self) -> int:
        """What was retained since the connection dropped (unsent, for the output budget)."""
        resumable = self.resumable
        return resumable.retention.parked_bytes if resumable is not None else 0

    def offer(self) -> str | None:
        """Make the session resumable (from now on what it writes is retained); its token, or
        None where it cannot be (no front, v0, ``--resume-window 0``)."""
        session = self._session
        if self.resumable is not None:
            return self.resumable.token
        core = session.core
        if self.front is None or session.version != 1 or core.parked.window <= 0:
            return None
        retention = Retention(core.limits.max_session_buffer, session.pause, framed=session.sink.framed)
        token, key = core.parked.issue(session)
        self.resumable = Resumable(token, key, retention, self.front)
        if session.recorder is not None:  # its Ready carries the token to the peer, never to the recording
            session.recorder.conceal(token)
        session.sink.tap(retention.record)
        return token

    def park(self) -> bool:
        """The connection dropped: keep a resumable session running for ``--resume-window``."""
        session = self._session
        resumable = self.resumable
        if resumable is None or session.shutting or session.closing or not session.core.parked.park(resumable.key):
            return False
        resumable.retention.park()
        resumable.origin.forward(None)
        self.front = None
        session.carry_over(None)
        if session.paused:  # by the dropped connection's flow control: its requests go on, into the ring
            session.resume()
        log.info("session parked", extra={"fields": {"peer": session.peer, "window": session.core.parked.window, "requests": len(session.requests)}})
        return True

    def resume_from(self, hs: pb.HandshakeCommand) -> None:
        """A resume handshake: this connection carries the session its token names from now on,
        and this one, which never served, ends without a word. A refusal is an ``ErrorEvent``;
        the connection stays, for a fresh handshake."""
        session = self._session
        try:
            if self.front is None or session.version != 1:
                raise ResumeRefused(
                    "this connection cannot resume a session: only v1 over Unix, TCP and gRPC can (PROTOCOL.md, \"Resume\")",
                    "resume_unsupported",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            if session.handshaken:
                raise ResumeRefused(
                    "a resume must be the first handshake of its connection; this one already carries a session",
                    "resume_invalid",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            other = session.core.parked.find(hs.resume_token)
            if not isinstance(other, type(session)) or other is session or other.closing:
                raise ResumeRefused(
                    "the resume token names no session that can be resumed here (a wrong token, an ended session, "
                    "or its --resume-window passed); send a fresh handshake",
                    "resume_unknown",
                )
            if other.sink.framed != self.front.framed:
                raise ResumeRefused(
                    "that session was started over gRPC (or a socket) and resumes only over the same kind of front",
                    "resume_unsupported",
                    pb.ERROR_CODE_UNSPECIFIED,
                )
            other.reattach(self.front, hs.resume_after)
        except ResumeRefused as exc:
            log.warning("resume refused", extra={"fields": {"peer": session.peer, "error": str(exc)}})
            session.protocol_error(exc)
            return
        session.end_quietly()

    def reattach(self, front: Front, after: int) -> None:
        """Carry on over ``front``: answer ``Ready(resumed)``, send what was retained after
        sequence ``after``, then go on live. A session still carried by another connection (one
        that has not noticed its peer is gone) is taken from it.

        Raises:
            ResumeRefused: what follows ``after`` cannot be sent exactly once; nothing changed.
        """
        session = self._session
        resumable = self.resumable
        assert resumable is not None
        # What waits in a pending batch goes into the ring first: the replay must hold everything
        # written so far, or a peer would send again a request whose PROCESSING is still batched.
        session.sink.flush_batch()
        units = resumable.retention.replay(after)
        # A request read but not started (waiting for the budget, or read in this very loop
        # iteration, its task not run yet) has no PROCESSING in the replay: the peer will send it
        # again, once. It may well have ended by the time that copy arrives, so the copy is
        # refused by id (RequestTable.admit), not by its being still running.
        session.requests.owe_unstarted()
        old, self.front = self.front, front
        if old is not None:
            old.release()
        session.core.parked.unpark(resumable.key)
        session.carry_over(front)
        front.carry(session)
        resumable.retention.attach()
        front.write(self._resumed(resumable.token, len(units)))
        for unit in units:
            front.write(unit)
        resumable.origin.forward(front)
        session.last_active = session.now()
        if session.paused:
            session.resume()
        log.info("session resumed", extra={"fields": {"peer": session.peer, "after": after, "replayed": len(units), "took_over": old is not None}})

    def _resumed(self, token: str, replayed: int) -> bytes:
        """The answer to a resume handshake: outside the session's sequence (0), never retained."""
        session = self._session
        granted = sorted(session.granted)
        accepted = [a for a in ACCEPTABLE if a in session.accepted]
        info = session.core.service_info(session.version, granted, accepted)
        info["smith_fast.replayed"] = str(replayed)
        event = ready_event(session.core, session.version, granted, info, token, resumed=True)
        return events.encode_envelope(now_ms(), 0, _EVENT, event.SerializeToString(), framed=session.sink.framed)
