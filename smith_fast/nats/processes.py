"""Background processes through the NATS gateway: where each runs, listing them, attaching to them, steering them.

A background ShellExec sent through a gateway runs on the worker that takes it from the command
stream and stays there, in that worker's :class:`~smith_fast.service.background.BackgroundTable`
(a process cannot move). Everything after the start goes to that worker:

* **Where a process is.** Each worker lists the ids of its background processes in its presence
  announcement (``background``, smith_fast/nats/presence.py), at once when the list changed and
  every ``--presence-interval`` anyway, so a gateway knows them without asking, a gateway started
  again learns them from the first announcements, and no state about them lives at the gateway
  that could be lost. A gateway that has not heard yet of a process it saw started (the
  announcement is on its way) asks every live worker (below).
* **Each worker answers on a subject of its own**, ``<prefix>.wrk.<worker token>`` (core NATS
  request/reply, not stored): ``ListProcesses`` (its ``ProcessList``), ``Cancel``, ``Stdin``,
  ``Resize`` of one of its processes (an empty envelope, or the ``ErrorEvent`` that refused it,
  as ``serve`` would send it), and ``Attach`` with the headers of a command message: it answers
  at once (accepted, or ``unknown_process``) and then runs the attach as a request of the
  gateway session, whose events go through the event stream as any command's do.
* **ListProcesses** at the gateway asks every live worker at once and answers with one
  ``ProcessList`` of all their processes (oldest first), then ``READY``.
* **A worker that is gone** (no responder on its subject, or it left or fell silent in the
  presence set): its processes died with it (child guard); naming one gets ``worker_gone``.

:class:`ProcessDirectory` is the gateway's side, :class:`ProcessDesk` a worker's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.commands import COMMANDS
from ..service.runner import LocalRunner
from ..service.session import Session
from ..service.sinks import V1Sink
from .wire import CommandMeta, command_headers, parse_command_headers

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

    from ..service.core import ServiceCore
    from ..service.runner import RequestHost
    from .config import NatsConfig
    from .presence import Announcement, LiveSet

__all__ = ["ProcessDirectory", "ProcessDesk", "STEERED", "worker_subject"]

log = get_logger("smith_fast.nats.processes")

STEERED = frozenset({"cancel", "stdin", "resize"})
"""Control commands a worker's desk applies to one of its background processes."""

ASK_TIMEOUT = 5.0  # seconds a gateway waits for a worker's answer on its subject
_GONE_KEPT = 1024  # ids of processes whose worker is gone, so naming one says so
_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def worker_subject(config: NatsConfig, worker: str) -> str:
    """A worker's own request/reply subject: ``<prefix>.wrk.<worker id, '.' and ':' as '_'>``."""
    return f"{config.prefix}.wrk.{_TOKEN.sub('_', worker)}"


def _error_envelope(exc: ProtocolError) -> pb.Envelope:
    error = pb.ErrorEvent(error_code=cast("pb.ErrorCode", exc.code), message=str(exc), details=exc.details)
    if exc.request_id:
        error.request_id = exc.request_id
    return pb.Envelope(event=pb.Event(error=error))


def _refusal(env: pb.Envelope) -> ProtocolError | None:
    """The ErrorEvent a worker answered with, as the error to report; None: done."""
    if env.WhichOneof("payload") != "event" or env.event.WhichOneof("event_type") != "error":
        return None
    error = env.event.error
    return ProtocolError(error.message, error.error_code, error.request_id if error.HasField("request_id") else None, dict(error.details))


def worker_gone(pid: str, rid: str | None, worker: str) -> ProtocolError:
    return ProtocolError(
        f"background process {pid} ran on worker {worker}, which is gone: the process ended with it (smith-fast ps lists those alive)",
        pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "worker_gone", "process_id": pid, "worker": worker},
    )


def unknown_process(pid: str, rid: str | None) -> ProtocolError:
    return ProtocolError(
        f"no background process {pid} on any live worker (smith-fast ps lists them)", pb.ERROR_CODE_UNSPECIFIED, rid,
        {"reason": "unknown_process", "process_id": pid},
    )


class _NoOne(Exception):
    """Nobody listens on the worker's subject: it is gone (or cut off from NATS)."""


class ProcessDirectory:
    """The gateway's view of the workers' background processes.

    Args:
        config: NATS names.
        live: the gateway's live workers (presence).
    """

    def __init__(self, config: NatsConfig, live: LiveSet) -> None:
        self.config = config
        self.live = live
        self.nc: NATS | None = None  # set once the gateway is connected
        self._where: dict[str, str] = {}  # process id -> its worker, from announcements and answers
        self._gone: collections.OrderedDict[str, str] = collections.OrderedDict()  # process id -> its gone worker
        self._expected: collections.OrderedDict[str, None] = collections.OrderedDict()  # seen started, not heard of yet
        self._watchers: dict[str, dict[int, Callable[[], None]]] = {}  # worker -> what to tell when it is gone
        self._watch_ids = 0

    # ---- what the gateway hears -------------------------------------------------------------------

    def heard(self, ann: Announcement) -> None:
        """A worker's announcement: its processes' ids (all of them, running or exited)."""
        held = set() if ann.leaving else set(ann.background)
        for pid in [p for p, w in self._where.items() if w == ann.worker and p not in held]:
            del self._where[pid]
            if ann.leaving:  # a stopping worker terminates its processes
                self._lost(pid, ann.worker)
        for pid in held:
            self._where[pid] = ann.worker
            self._gone.pop(pid, None)
            self._expected.pop(pid, None)
        # (a leaving worker's attaches are ended by :meth:`prune`, at the gateway's next look at
        # its live set: by then the final events of those it ended itself have mostly come)

    def prune(self, alive: Iterable[str]) -> None:
        """The live workers now: the processes of the others are gone with them."""
        alive = set(alive)
        for pid, worker in list(self._where.items()):
            if worker not in alive:
                del self._where[pid]
                self._lost(pid, worker)
        for worker in [w for w in self._watchers if w not in alive]:
            self._worker_gone(worker)

    def expect(self, pid: str) -> None:
        """A background ShellExec ``pid`` ended READY through this gateway: its worker's
        announcement may not have come yet."""
        if pid not in self._where:
            self._expected[pid] = None
            while len(self._expected) > _GONE_KEPT:
                self._expected.popitem(last=False)

    def knows(self, pid: str) -> bool:
        """Whether ``pid`` is (or was) a background process on a worker."""
        return pid in self._where or pid in self._gone or pid in self._expected

    def held(self, pid: str) -> str | None:
        """The live worker known to hold ``pid``."""
        worker = self._where.get(pid)
        return worker if worker is not None and self._alive(worker) else None

    def _alive(self, worker: str) -> bool:
        return any(a.worker == worker for a in self.live.alive())

    def _lost(self, pid: str, worker: str) -> None:
        self._gone[pid] = worker
        self._gone.move_to_end(pid)
        while len(self._gone) > _GONE_KEPT:
            self._gone.popitem(last=False)

    def _unreachable(self, worker: str) -> None:
        """Nobody listens on ``worker``'s subject: its processes are taken as gone (until it
        announces them again, after a reconnect). Its attaches are left to the presence set,
        which tells a worker cut off for a moment from one that died."""
        for pid in [p for p, w in self._where.items() if w == worker]:
            del self._where[pid]
            self._lost(pid, worker)

    def _worker_gone(self, worker: str) -> None:
        for tell in list(self._watchers.pop(worker, {}).values()):
            tell()

    def watch(self, worker: str, tell: Callable[[], None]) -> int:
        """Call ``tell`` once ``worker`` is gone (left, or silent in the presence set); an id for :meth:`unwatch`."""
        self._watch_ids += 1
        self._watchers.setdefault(worker, {})[self._watch_ids] = tell
        return self._watch_ids

    def unwatch(self, worker: str, handle: int) -> None:
        watchers = self._watchers.get(worker)
        if watchers is not None:
            watchers.pop(handle, None)
            if not watchers:
                del self._watchers[worker]

    # ---- asking the workers ---------------------------------------------------------------------------

    async def _ask(self, worker: str, command: pb.Command, headers: dict[str, str] | None = None) -> pb.Envelope:
        """One request to a worker's subject; its answer.

        Raises:
            _NoOne: nobody listens there.
            TimeoutError: no answer within :data:`ASK_TIMEOUT`.
        """
        from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

        if self.nc is None or self.nc.is_closed:
            raise _NoOne(worker)
        payload = pb.Envelope(command=command).SerializeToString()
        try:
            msg = await self.nc.request(worker_subject(self.config, worker), payload, timeout=ASK_TIMEOUT, headers=headers)
        except NoRespondersError:
            raise _NoOne(worker) from None
        except NatsTimeout:
            raise TimeoutError(worker) from None
        return pb.Envelope.FromString(msg.data)

    async def listing(self) -> list[pb.BackgroundProcess]:
        """Every live worker's background processes, oldest first (workers that do not answer
        are left out: those with no responder are gone, with their processes)."""
        workers = [a.worker for a in self.live.alive()]
        answers = await asyncio.gather(*(self._ask(w, pb.Command(list_processes=pb.ListProcessesCommand())) for w in workers),
                                       return_exceptions=True)
        out: list[pb.BackgroundProcess] = []
        for worker, answer in zip(workers, answers):
            if isinstance(answer, _NoOne):
                self._unreachable(worker)
                continue
            if isinstance(answer, BaseException):
                log.warning("worker did not list its processes", extra={"fields": {"worker": worker, "error": repr(answer)}})
                continue
            processes = list(answer.event.process_list.processes)
            for pid in [p for p, w in self._where.items() if w == worker]:
                del self._where[pid]
            for proc in processes:
                self._where[proc.id] = worker
                self._gone.pop(proc.id, None)
                self._expected.pop(proc.id, None)
            out.extend(processes)
        out.sort(key=lambda p: (p.started_ms, p.id))
        return out

    async def locate(self, pid: str, rid: str | None) -> str:
        """The live worker holding ``pid``.

        Raises:
            ProtocolError: ``worker_gone`` (it was on a worker that is gone), ``unknown_process``.
        """
        worker = self.held(pid)
        if worker is None:
            await self.listing()  # just started (its announcement is on its way), or a worker asked anew
            worker = self.held(pid)
        if worker is not None:
            return worker
        if pid in self._gone:
            raise worker_gone(pid, rid, self._gone[pid])
        raise unknown_process(pid, rid)

    async def steer(self, pid: str, command: pb.Command) -> None:
        """Cancel, Stdin or Resize of background process ``pid``, to its worker.

        Raises:
            ProtocolError: what its worker refused, ``worker_gone``, ``unknown_process``,
                ``worker_unresponsive``.
        """
        await self._tell(await self.locate(pid, pid), pid, pid, command)

    async def attach(self, meta: CommandMeta, command: pb.Command) -> str:
        """Hand an Attach (request ``meta.number`` of its session) to the worker holding its
        process, which runs it; that worker.

        Raises:
            ProtocolError: ``unknown_process``, ``worker_gone``, ``worker_unresponsive``.
        """
        rid, pid = command.attach.request_id, command.attach.process_id
        worker = await self.locate(pid, rid)
        await self._tell(worker, pid, rid, command, command_headers(meta))
        return worker

    async def _tell(self, worker: str, pid: str, rid: str, command: pb.Command, headers: dict[str, str] | None = None) -> None:
        try:
            answer = await self._ask(worker, command, headers)
        except _NoOne:
            self._unreachable(worker)
            raise worker_gone(pid, rid, worker) from None
        except TimeoutError:
            raise ProtocolError(
                f"worker {worker} holding background process {pid} did not answer in {ASK_TIMEOUT:g}s; it may not have been done",
                pb.ERROR_CODE_INTERNAL_ERROR, rid, {"reason": "worker_unresponsive", "process_id": pid, "worker": worker},
            ) from None
        refusal = _refusal(answer)
        if refusal is not None:
            raise refusal


def _drop(_data: bytes) -> None:
    pass


def _nothing() -> None:
    pass


class ProcessDesk:
    """A worker's answers on its own subject (:func:`worker_subject`).

    Args:
        core: the worker's core (its background table).
        config: NATS names.
        worker: the worker's id.
        run_attach: runs an accepted Attach as a command of ``meta``'s gateway session.
    """

    def __init__(self, core: ServiceCore, config: NatsConfig, worker: str, run_attach: Callable[[CommandMeta, pb.Command], None]) -> None:
        self.core = core
        self.subject = worker_subject(config, worker)
        self._run_attach = run_attach
        self._steering: Session | None = None

    async def listen(self, nc: NATS) -> None:
        await nc.subscribe(self.subject, cb=self._on_message)

    def ids(self) -> tuple[str, ...]:
        """The ids of this worker's background processes (its announcement's ``background``)."""
        table = self.core.background
        return tuple(p.id for p in table.processes()) if len(table) else ()

    async def _on_message(self, msg: Msg) -> None:
        try:
            command = pb.Envelope.FromString(msg.data).command
        except Exception as exc:
            log.warning("malformed process message dropped", extra={"fields": {"subject": msg.subject, "error": repr(exc)}})
            return
        answer = self._answer(command, msg.headers)
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(answer.SerializeToString())

    def _answer(self, command: pb.Command, headers: dict[str, str] | None) -> pb.Envelope:
        kind = command.WhichOneof("command_type")
        table = self.core.background
        try:
            if kind == "list_processes":
                return pb.Envelope(event=pb.Event(process_list=pb.ProcessListEvent(processes=table.processes())))
            if kind == "attach":
                pid = command.attach.process_id
                if pid not in table:
                    raise ProtocolError(
                        f"no background process {pid} on this worker (it may have been dropped for a newer one)",
                        pb.ERROR_CODE_UNSPECIFIED, command.attach.request_id, {"reason": "unknown_process", "process_id": pid},
                    )
                self._run_attach(parse_command_headers(headers), command)
                return pb.Envelope()
            spec = COMMANDS.get(kind or "")
            if kind in STEERED and spec is not None and spec.control is not None:
                spec.control(self._steerer().runner, getattr(command, kind))
                return pb.Envelope()
            raise ProtocolError(f"a worker's process subject takes no {kind or 'empty'} command", pb.ERROR_CODE_UNSPECIFIED,
                                details={"reason": "malformed"})
        except ProtocolError as exc:
            return _error_envelope(exc)

    def _steerer(self) -> Session:
        """The session whose runner steers this worker's background processes for the gateways
        (which checked the peer was granted ``shell_exec``), as serve's LocalRunner does for any session."""
        session = self._steering
        if session is None or session.closing:
            core = self.core

            def runner(host: RequestHost) -> LocalRunner:
                return LocalRunner(core, host)

            session = self._steering = Session(
                core, V1Sink(_drop, framed=False), close=_nothing, runner=runner, peer="nats:processes", protocol="nats",
                granted=frozenset({pb.CAPABILITY_SHELL_EXEC}) & core.permitted,
            )
        return session
