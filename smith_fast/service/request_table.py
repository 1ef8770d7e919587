"""A session's requests: the live ones by id, and one ring of the ids that ended.

:class:`RequestTable` admits a request (its id set, not running, not a copy a resumed peer owes
us, under ``--max-requests``) and resolves the id a control command names: a live request of the
session, else a background process of the service (any session's, service/background.py), else an
id that ended lately ("has already ended") or one never seen ("no request … is running").
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .. import tracing
from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from .request import Request, RequestState, Terminal, write_input
from .sizes import terminal_size

if TYPE_CHECKING:
    from ..process import ShellProcess
    from ..relaypeek import ToolCall
    from .audit import AuditRecord
    from .commands import CommandSpec
    from .config import Limits
    from .execution import BackgroundProcesses, ControlTarget

__all__ = ["ENDED_KEPT", "BackgroundTarget", "RequestTable", "TableHost", "not_running"]

ENDED_KEPT = 1024
"""Recently ended request ids kept, so that a late Cancel gets "has ended", not "unknown"."""


class TableHost(Terminal, Protocol):
    """What the table needs of its session beyond a request's end."""

    def protocol_error(self, exc: ProtocolError) -> None:
        """Report a problem with the peer's input; the session carries on."""
        ...

    def reject(self, exc: ProtocolError) -> None:
        """End a request that did not run: its error, then its terminal ``ERROR``."""
        ...


def not_running(rid: str, what: str, ended: bool) -> ProtocolError:
    """The error of a control command naming no live request."""
    if ended:
        return ProtocolError(f"request {rid} has already ended; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "not_running"})
    return ProtocolError(
        f"no request {rid} is running in this session; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unknown_request"}
    )


class RequestTable:
    """The requests of one session.

    Args:
        host: the session (where refusals are reported, what a request's end needs).
        limits: the service's limits (``--max-requests``, the live requests it admits at once;
            what its requests' controls are bounded by).
    """

    __slots__ = ("_host", "_limits", "live", "_ended", "owed")

    def __init__(self, host: TableHost, limits: Limits) -> None:
        self._host = host  # what a request's end is sent through
        self._limits = limits
        self.live: dict[str, Request] = {}
        self._ended: collections.OrderedDict[str, bool] = collections.OrderedDict()  # id -> it was cancelled
        # Requests a resume's replay could not show were read (admitted, not started when it was
        # taken): the one copy of each the resumed peer sends is refused (Session.reattach).
        self.owed: set[str] = set()

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, rid: object) -> bool:
        return rid in self.live

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self.live.values()))

    def get(self, rid: str) -> Request | None:
        return self.live.get(rid)

    def any_admitted(self) -> bool:
        """Whether the session ever admitted a request (one is live, or one ended)."""
        return bool(self.live) or bool(self._ended)

    def admit(self, rid: str, spec: CommandSpec | None, command: Any, call: ToolCall | None = None) -> Request | None:
        """A request ``rid`` of ``spec``'s kind, live from now on; None when it is refused (what
        the peer is told was sent: an error, and a terminal state where the id is its own).
        ``command`` asked for it, or ``call`` did (a plain tool call, :class:`Request`)."""
        if not rid:
            self._host.protocol_error(ProtocolError("request_id is empty", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "invalid_field"}))
            return None
        if self.owed and rid in self.owed:
            # The copy a resumed peer sends of a request this session had read but not started
            # when the replay was taken: refused even when that request ended meanwhile, or it
            # would run twice (its PROCESSING and READY came after the replay, on the way to the peer).
            self.owed.discard(rid)
            self._host.protocol_error(ProtocolError(
                f"request {rid} was read before the connection dropped (its PROCESSING came after the replay); this copy was not run",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_request"},
            ))
            return None
        live = self.live
        if rid in live:
            self._host.protocol_error(ProtocolError(f"request {rid} is already running", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_request"}))
            return None
        if len(live) >= (most := self._limits.max_requests):
            self._host.reject(ProtocolError(f"too many requests in flight (max {most})", pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid))
            return None
        request = live[rid] = Request(self._host, rid, spec, command, self._limits, call)
        return request

    def ended(self, request: Request) -> None:
        """``request`` sent its terminal state: among the ended ids (it stays live until its task is done)."""
        self._remember(request.id, request.cancelled)

    def _remember(self, rid: str, cancelled: bool) -> None:
        ended = self._ended
        ended[rid] = cancelled
        if len(ended) > ENDED_KEPT:
            ended.popitem(last=False)

    def forget(self, request: Request) -> None:
        """``request``'s task is done: no longer live (one cancelled before it ran, which sent no
        terminal state, is ended now)."""
        rid, live = request.id, self.live
        if live.get(rid) is request:
            del live[rid]
        if request.state is not RequestState.ENDED:
            request.state = RequestState.ENDED
            self._remember(rid, request.cancelled)

    def owe_unstarted(self) -> None:
        """A resume's replay was taken: the requests read but not started are owed (:attr:`owed`)."""
        self.owed = {rid for rid, request in self.live.items() if request.state is RequestState.ADMITTED}

    def resolve(self, rid: str, what: str, background: BackgroundProcesses | None, granted: frozenset[int]) -> ControlTarget | None:
        """What a control command that would ``what`` ``rid`` addresses: the live request, else a
        background process of the service (on a NATS worker: of any worker), else nothing (None: a Cancel of a request that ended
        cancelled, which is harmless).

        Raises:
            ProtocolError: ``rid`` is no live request and no background process
                (``not_running``/``unknown_request``), or it is a background process and the
                session was not granted ``shell_exec``.
        """
        request = self.live.get(rid)
        if request is not None and request.state is not RequestState.ENDED:
            return request
        if request is None and background is not None and (
            (held := rid in background) or (elsewhere := background.elsewhere(rid, self._host.protocol_error)) is not None
        ):
            if pb.CAPABILITY_SHELL_EXEC not in granted:
                # steering a background process takes what starting it took
                raise ProtocolError(
                    f"background process {rid} can be steered only by a session granted shell_exec in its handshake",
                    pb.ERROR_CODE_INVALID_CAPABILITY, rid, {"reason": "capability_required", "capability": "shell_exec"},
                )
            return BackgroundTarget(background, rid, self._limits.max_stdin_buffer) if held else elsewhere
        if what == "cancel" and self._ended.get(rid, False):
            return None  # already cancelled and ended: cancelling twice is harmless
        raise not_running(rid, what, rid in self._ended or request is not None)

    def spans(self) -> Mapping[str, tracing.SpanHandle]:
        """Request id → its command span, for what records decisions on it (hooks)."""
        return _Spans(self.live)

    def audit_record(self, rid: str) -> AuditRecord | None:
        request = self.live.get(rid)
        return request.audit if request is not None else None


class _Spans(Mapping[str, "tracing.SpanHandle"]):
    """The spans of the live requests that have one (a view: no copy per request)."""

    __slots__ = ("_live",)

    def __init__(self, live: dict[str, Request]) -> None:
        self._live = live

    def __getitem__(self, rid: str) -> tracing.SpanHandle:
        request = self._live.get(rid)
        if request is None or request.span is tracing.NOOP:
            raise KeyError(rid)
        return request.span

    def get(self, rid: str, default: Any = None) -> Any:
        request = self._live.get(rid)
        if request is None or request.span is tracing.NOOP:
            return default
        return request.span

    def __iter__(self) -> Iterator[str]:
        return (rid for rid, request in self._live.items() if request.span is not tracing.NOOP)

    def __len__(self) -> int:
        return sum(1 for _ in self)



class BackgroundTarget:
    """A background process (any session's, service/background.py) as a control command's target."""

    __slots__ = ("_background", "_rid", "_limit")

    def __init__(self, background: BackgroundProcesses, rid: str, stdin_limit: int) -> None:
        self._background = background
        self._rid = rid
        self._limit = stdin_limit

    def cancel(self) -> None:
        self._background.cancel(self._rid)

    def _process(self, what: str) -> ShellProcess:
        proc = self._background.process(self._rid)
        if proc is None:  # it ended between the lookup and now
            raise not_running(self._rid, what, True)
        return proc

    def write_stdin(self, data: bytes, eof: bool) -> None:
        write_input(self._process("write stdin to"), self._rid, data, eof, self._limit)

    def resize(self, rows: int, cols: int) -> None:
        proc, rid = self._process("resize"), self._rid
        if not proc.is_pty:
            raise ProtocolError(f"request {rid} has no terminal: send its ShellExec with pty to resize it", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "no_terminal"})
        proc.resize(*terminal_size(rows, cols, rid))
