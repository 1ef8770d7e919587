"""Process control through the NATS gateway: Cancel, Stdin and Resize reach the
worker that runs the request they name, Attach the worker holding the background process.

The routes (PROTOCOL.md, "Scale-out over NATS", "Process control"), one row per forwardable
command kind in :data:`FORWARDED`:

* ``session``: the session's control subject ``<prefix>.ctl.<session>``, which every worker
  hears (``Smith-Control: cancel``, ``Smith-Request: <n>``). A Cancel goes there because the
  gateway may not know yet which worker holds the command (it may be on its way to one), and
  because every worker must remember it: the one that is handed the command later drops it.
* ``worker`` / ``workers``: background processes stay on the worker that started them; their
  Attach, and Cancel/Stdin/Resize naming one, go to that worker's own subject, ListProcesses to
  every live worker's (smith_fast/nats/processes.py).
* ``request``: the request's own subject ``<prefix>.ctl.<session>.<n>.<attempt>``, which only
  the worker running that delivery of the command subscribes to, and only for a ShellExec with
  ``open_stdin`` or ``pty``: stdin and terminal sizes travel to one worker, in order, and cost
  nothing for the other commands. The gateway holds what the peer sends until the first event of
  the delivery came back (the worker subscribed before it published anything), so nothing is sent
  to a subject nobody hears.

Stdin is flow-controlled end to end: the gateway accepts at most ``--max-stdin-buffer`` bytes a
worker has not reported taken (``ShellOutputEvent.stdin_written``, which the worker publishes
with the request's events) or refused; a StdinCommand that would go past it is refused whole
(``stdin_full``), as ``serve`` does. So neither the gateway, nor NATS, nor the worker holds more
than that per request, however little the command reads.

:class:`InputChannel` is the gateway's side of one request's stdin and terminal,
:class:`WorkerControls` a worker's side of both routes.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.commands import COMMANDS
from ..service.shell_exec import terminal_size
from .wire import STDIN_OFFSET, CommandMeta

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

    from ..service.session import Session
    from .config import NatsConfig

__all__ = ["FORWARDED", "ControlHold", "InputChannel", "WorkerControls", "interactive", "not_running", "request_subject"]

log = get_logger("smith_fast.nats.control")

FORWARDED: Mapping[str, str] = {
    "cancel": "session",  # every worker: the one running it stops it, the others remember it
    "stdin": "request",  # the worker running this delivery, in order
    "resize": "request",
    "attach": "worker",  # the worker holding the background process (smith_fast.nats.processes)
    "list_processes": "workers",  # every live worker, their answers as one ProcessList
}
"""Control commands the gateway forwards, and their route: ``session``, ``request``, or for
background processes ``worker`` / ``workers`` (``<prefix>.wrk.<worker>``, core NATS request/reply:
smith_fast/nats/processes.py). A Cancel, Stdin or Resize naming a background process rather than a
request of the session takes the ``worker`` route too."""

_CANCELLED_TTL = 600.0  # seconds a worker remembers a cancelled command it was not running
_CANCELLED_MAX = 100_000
REFUSED_BYTES = "refused_bytes"  # ErrorEvent.details of a worker's stdin refusal: bytes not written


def request_subject(config: NatsConfig, session: str, number: int, attempt: int) -> str:
    """The control subject of one delivery of a request: ``<prefix>.ctl.<session>.<n>.<attempt>``."""
    return f"{config.control_subject(session)}.{number}.{attempt}"


def interactive(command: pb.Command) -> bool:
    """A ShellExec whose stdin stays open (``open_stdin`` or ``pty``): the only kind that takes
    Stdin and Resize."""
    if command.WhichOneof("command_type") != "shell_exec":
        return False
    cmd = command.shell_exec
    return cmd.open_stdin or cmd.HasField("pty")


def not_running(rid: str, what: str, ended: bool) -> ProtocolError:
    """A control command for a request the gateway does not run (any more)."""
    if ended:
        return ProtocolError(f"request {rid} has already ended; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "not_running"})
    return ProtocolError(
        f"no request {rid} is running in this session; nothing to {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "unknown_request"}
    )


def _no_stdin(rid: str, what: str) -> ProtocolError:
    return ProtocolError(
        f"request {rid} has no open stdin: {what} needs a ShellExec sent with open_stdin or pty",
        pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "stdin_closed"},
    )


def _no_terminal(rid: str) -> ProtocolError:
    return ProtocolError(f"request {rid} has no terminal: send its ShellExec with pty to resize it", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "no_terminal"})


def _envelope(command: pb.Command) -> bytes:
    return pb.Envelope(command=command).SerializeToString()


Send = Callable[[int, bytes, dict[str, str]], None]
"""Publishes one control message to a delivery of the request: ``send(attempt, payload, headers)``."""


class InputChannel:
    """The gateway's side of one forwarded request's stdin and terminal.

    Made when the request is forwarded, or earlier when a Stdin or Resize arrives before that (in
    the same read as its ShellExec): then what kind of request it is is learnt by :meth:`adopt`.

    Args:
        rid: the request id.
        limit: ``--max-stdin-buffer``: bytes in flight (sent, not yet taken or refused) at most.
    """

    __slots__ = ("rid", "limit", "known", "pty", "sent", "taken", "refused", "closed", "attempt", "_held", "_send")

    def __init__(self, rid: str, limit: int) -> None:
        self.rid = rid
        self.limit = limit
        self.known = False  # adopt() ran: it is an interactive ShellExec
        self.pty = False
        self.sent = 0  # stdin bytes accepted for the current delivery
        self.taken = 0  # what its worker reported written (stdin_written)
        self.refused = 0  # what its worker refused (stdin_full / stdin_closed there)
        self.closed = False  # eof sent, or the worker said the command closed it
        self.attempt = 0  # the delivery a worker runs (0: none heard from yet)
        self._held: list[tuple[pb.Command, bytes, dict[str, str]]] = []
        self._send: Send | None = None

    @property
    def in_flight(self) -> int:
        return self.sent - self.taken - self.refused

    def adopt(self, command: pb.Command) -> list[ProtocolError]:
        """The request turned out to be ``command``. Returns what was wrong with the input sent
        before it was known (stdin or a resize for a command without them; dropped)."""
        if interactive(command):
            self.known = True
            self.pty = command.shell_exec.HasField("pty")
            if not self.pty and any(c.HasField("resize") for c, _, _ in self._held):
                self._held = [h for h in self._held if not h[0].HasField("resize")]
                return [_no_terminal(self.rid)]
            return []
        if not self._held:
            return []
        self._held.clear()
        return [ProtocolError(  # one for all of it, as serve says
            f"request {self.rid} has no open stdin: its ShellExec was sent without open_stdin or pty; the data was not written",
            pb.ERROR_CODE_UNSPECIFIED, self.rid, {"reason": "stdin_closed"},
        )]

    def write(self, data: bytes, eof: bool) -> None:
        """Forward one StdinCommand, or refuse it whole.

        Raises:
            ProtocolError: ``stdin_closed`` (eof was sent, or the command closed it), ``stdin_full``
                (more than ``limit`` bytes would be in flight).
        """
        if self.closed:
            if data:
                raise ProtocolError(f"the stdin of request {self.rid} is closed; the data was not written", pb.ERROR_CODE_UNSPECIFIED, self.rid, {"reason": "stdin_closed"})
            return  # a second eof
        if data and self.in_flight + len(data) > self.limit:
            raise ProtocolError(
                f"the stdin of request {self.rid} is full: the command has not read {self.in_flight} bytes "
                f"(max --max-stdin-buffer {self.limit}); this StdinCommand was refused whole, send it again once it reads",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, self.rid, {"reason": "stdin_full"},
            )
        if not data and not eof:
            return
        headers = {STDIN_OFFSET: str(self.sent)}
        self.sent += len(data)
        self.closed = eof
        self._out(pb.Command(stdin=pb.StdinCommand(request_id=self.rid, data=data, eof=eof)), headers)

    def resize(self, rows: int, cols: int) -> None:
        """Forward one ResizeCommand.

        Raises:
            ProtocolError: ``no_terminal``, ``invalid_field`` (a size over 65535).
        """
        if self.known and not self.pty:
            raise _no_terminal(self.rid)
        terminal_size(rows, cols, self.rid)  # the worker checks again; a bad size is refused here
        self._out(pb.Command(resize=pb.ResizeCommand(request_id=self.rid, rows=rows, cols=cols)), {})

    def _out(self, command: pb.Command, headers: dict[str, str]) -> None:
        payload = _envelope(command)
        if self._send is None or not self.attempt:
            self._held.append((command, payload, headers))
        else:
            self._send(self.attempt, payload, headers)

    def bind(self, attempt: int, send: Send) -> None:
        """A worker runs delivery ``attempt`` and listens on its subject: send what was held.

        A later delivery (the first worker stopped) is a new process: its stdin starts empty and
        open, and what was sent to the earlier one is not sent again."""
        if attempt <= self.attempt:
            return
        if self.attempt:
            self.sent = self.taken = self.refused = 0
            self.closed = False
            self._held.clear()
        self.attempt = attempt
        self._send = send
        held, self._held = self._held, []
        for _, payload, headers in held:
            send(attempt, payload, headers)

    def observe(self, event: pb.Event, kind: str | None) -> None:
        """Learn from an event of the request on its way to the peer: what the command took,
        what the worker refused."""
        if kind == "shell_output":
            so = event.shell_output
            if so.HasField("stdin_written"):
                self.taken = max(self.taken, so.stdin_written)
        elif kind == "error":
            details = event.error.details
            refused = details.get(REFUSED_BYTES)
            if refused is not None and refused.isdigit():
                self.refused += int(refused)
            if details.get("reason") == "stdin_closed" and refused is not None:
                self.closed = True  # the command closed it: refused here from now on


def only_stdin_written(event: pb.Event) -> bool:
    """A ShellOutputEvent that carries nothing but a ``stdin_written`` acknowledgement (v1 only)."""
    so = event.shell_output
    return so.HasField("stdin_written") and not (so.stdout or so.stderr or so.finished or so.HasField("stdout_bytes") or so.HasField("stderr_bytes"))


class ControlHold:
    """A command this worker holds, from its session's creation to its end."""

    __slots__ = ("rid", "session", "started", "offset", "subscription")

    def __init__(self, rid: str, session: Session) -> None:
        self.rid = rid
        self.session = session
        self.started = False
        self.offset = 0  # the stdin offset the next Stdin message must carry
        self.subscription: Subscription | None = None


class WorkerControls:
    """A worker's side: the cancels it heard of, and the control subscriptions of the commands it runs.

    Args:
        config: NATS names.
    """

    def __init__(self, config: NatsConfig) -> None:
        self.config = config
        self._held: dict[tuple[str, int], ControlHold] = {}
        self._cancelled: collections.OrderedDict[tuple[str, int], float] = collections.OrderedDict()

    # ---- the session route: cancel --------------------------------------------------------------

    def cancel(self, session_id: str, number: int) -> None:
        """A gateway cancelled request ``number`` of ``session_id``: stop it if it runs here,
        remember it in any case (a later delivery of it here is dropped)."""
        key = (session_id, number)
        now = time.monotonic()
        self._cancelled[key] = now
        self._cancelled.move_to_end(key)
        while self._cancelled and (len(self._cancelled) > _CANCELLED_MAX or now - next(iter(self._cancelled.values())) > _CANCELLED_TTL):
            self._cancelled.popitem(last=False)
        held = self._held.get(key)
        if held is not None and held.started:
            held.session.cancel(held.rid)  # its LocalRunner: TERM, grace, KILL; final events; cancelled

    def cancelled(self, meta: CommandMeta) -> bool:
        """Whether a gateway cancelled this command (then it must not run)."""
        return (meta.session, meta.number) in self._cancelled

    # ---- the request route: stdin, resize ---------------------------------------------------------

    def hold(self, meta: CommandMeta, rid: str, session: Session) -> ControlHold:
        """Before ``session`` runs the command: a cancel finds it from now on."""
        held = ControlHold(rid, session)
        self._held[(meta.session, meta.number)] = held
        return held

    async def listen(self, nc: NATS, meta: CommandMeta, attempt: int, command: pb.Command, held: ControlHold) -> None:
        """An interactive ShellExec: listen for its stdin and resizes. The subscription is made
        before the command's first event is published, so the gateway, which sends only after
        that event came back, is heard."""
        if not interactive(command):
            return
        subject = request_subject(self.config, meta.session, meta.number, attempt)

        async def on_message(msg: Msg) -> None:
            self._input(held, msg)

        held.subscription = await nc.subscribe(subject, cb=on_message)

    async def release(self, meta: CommandMeta, held: ControlHold) -> None:
        if self._held.get((meta.session, meta.number)) is held:
            del self._held[(meta.session, meta.number)]
        if held.subscription is not None:
            with contextlib.suppress(Exception):
                await held.subscription.unsubscribe()

    def _input(self, held: ControlHold, msg: Msg) -> None:
        session = held.session
        try:
            command = pb.Envelope.FromString(msg.data).command
        except Exception as exc:
            log.warning("malformed control message dropped", extra={"fields": {"subject": msg.subject, "error": repr(exc)}})
            return
        kind = command.WhichOneof("command_type")
        spec = COMMANDS.get(kind or "")
        if kind is None or FORWARDED.get(kind) != "request" or spec is None or spec.control is None:
            log.warning("control message dropped", extra={"fields": {"subject": msg.subject, "kind": kind}})
            return
        request = getattr(command, kind)
        if kind == "stdin":
            offset = (msg.headers or {}).get(STDIN_OFFSET, "")
            if offset != str(held.offset):  # core NATS lost a message (a reconnect): say so, go on
                session.protocol_error(ProtocolError(
                    f"stdin of request {held.rid} arrived with a gap (at byte {held.offset}, the gateway sent from {offset or '?'}): "
                    "some of it was lost between gateway and worker",
                    pb.ERROR_CODE_INTERNAL_ERROR, held.rid, {"reason": "stdin_lost"},
                ))
            held.offset = (int(offset) if offset.isdigit() else held.offset) + len(request.data)
        try:
            spec.control(session.runner, request)
        except ProtocolError as exc:
            exc.request_id = exc.request_id or held.rid
            if kind == "stdin" and request.data:
                exc.details = {**exc.details, REFUSED_BYTES: str(len(request.data))}  # the gateway's in-flight count
            session.protocol_error(exc)

    def start(self, meta: CommandMeta, held: ControlHold) -> bool:
        """Just before the command runs: False (and it must not run) when it was cancelled."""
        if self.cancelled(meta):
            return False
        held.started = True
        return True
