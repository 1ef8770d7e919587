"""Background processes across the workers: every session sees the fleet's, as on ``serve``.

A background ShellExec runs on the worker its session lives on and stays in that worker's table (a
process cannot move). On ``serve`` any session lists every background process and attaches to,
cancels, writes to and resizes any of them; through a gateway a session lives on one worker, so its
worker asks the others:

* **Each worker answers for its own** on ``<prefix>.ps.<worker>`` (core NATS request/reply, one
  answer per request, nothing stored): ``list``; ``cancel``, ``stdin``, ``resize`` of one id it
  holds (done, or the error ``serve`` would send: ``stdin_full``, ``no_terminal`` ...); and
  ``read``, one step of an attach: the output from an offset, waiting up to a few seconds for new
  output, the stdin taken or the exit. An attach to another worker's process is those reads one
  after the other (a long poll), so the asker's peer sets the pace (the asker reads again only
  once its peer took what came, ``Execution.reading``), the owner keeps nothing per attach between
  two reads, an asker that goes away leaves nothing behind, and every answer fits the one reply a
  worker may send (``allow_responses``).
* **Where a process is** comes from the presence announcements (``background``, every worker's
  ids; smith_fast/nats/presence.py), which each worker now hears too, and from the lists it asked
  for; a worker announces at once when it starts one, so the others know it before its starter's
  ``READY`` can come back to a frontend. An Attach of an id known nowhere asks every live worker
  before it says ``unknown_process``; a background ShellExec of an id another worker is known to
  hold is refused (``duplicate_id``, as ``serve`` refuses one its table holds).
* **ListProcesses** asks every other live worker at once and waits :data:`LIST_WAIT` at most; what
  answered is listed, and the workers that did not are named in a WARN ``LogEvent`` before the
  ``ProcessList`` (``reason = workers_unanswered``, ``workers``).
* **Cancel, Stdin, Resize** of another worker's process go to it one at a time, in the order the
  session sent them (a queue per owner); what it refuses comes back as the ``ErrorEvent`` ``serve``
  sends, without a state.
* **A worker that is gone** (it left, fell silent in the presence set, or nobody answers on its
  subject): its processes died with it (its shutdown, or the child guard); naming one gets what
  ``serve`` says of an unknown id, with ``reason = worker_gone`` (and ``worker``); the last
  :data:`GONE_KEPT` such ids are remembered.

The message of each request and answer is a JSON header (one line), a newline, then a body of
bytes (stdin to write, the output read, a serialized ``ProcessListEvent``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..service.background import BackgroundTable, follow, unknown_process
from ..service.request_table import BackgroundTarget, not_running
from ..service.sizes import terminal_size
from .presence import Announcement, LiveSet
from .relay import Subjects, publish_now

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

    from ..service.config import Limits
    from ..service.execution import ControlTarget, Execution

__all__ = ["FleetProcesses", "GONE_KEPT", "LIST_WAIT", "MAX_READS", "READ_MAX", "READ_WAIT"]

log = get_logger("smith_fast.nats.processes")

LIST_WAIT = 0.2
"""Seconds ListProcesses waits for the other workers' lists (what answered is shown)."""
ASK_TIMEOUT = 5.0
"""Seconds a worker waits for another's answer to anything else (past a read's own wait)."""
READ_WAIT = 5.0
"""Seconds an owner holds a read open for new output before it answers with none."""
READ_MAX = 256 << 10
"""Output bytes one read answers with at most (and never more than half the server's max_payload)."""
MAX_PIECES = 4096
"""Output segments one read answers with at most (their offsets are in the JSON header)."""
MAX_READS = 64
"""Reads an owner holds open at once (the attaches from other workers following its processes live)."""
MAX_QUEUED = 256
"""Cancel/Stdin/Resize commands waiting per owner worker; past it the command is refused."""
GONE_KEPT = 1024
"""Ids of processes whose worker is gone, remembered so naming one says so."""


def _encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def _decode(data: bytes) -> tuple[dict[str, Any], bytes]:
    """``(header, body)`` of a message.

    Raises:
        ValueError: not such a message.
    """
    head, sep, body = bytes(data).partition(b"\n")
    header = json.loads(head) if sep else None
    if not isinstance(header, dict):
        raise ValueError("not a process message")
    return header, body


def _refusal(exc: ProtocolError) -> bytes:
    return _encode({"ok": False, "code": exc.code, "message": str(exc), "details": exc.details})


def _refused(header: dict[str, Any], rid: str) -> ProtocolError:
    """The error an owner answered with, as one of request ``rid`` here."""
    details = header.get("details")
    return ProtocolError(str(header.get("message", "refused")), int(header.get("code", pb.ERROR_CODE_UNSPECIFIED)), rid,
                         {str(k): str(v) for k, v in details.items()} if isinstance(details, dict) else None)


def worker_gone(pid: str, rid: str, worker: str, what: str | None) -> ProtocolError:
    """What naming a process whose worker is gone says: what ``serve`` says of an unknown id
    (a control command's ``unknown_request``, an Attach's ``unknown_process``), with the reason."""
    why = f"background process {pid} ran on worker {worker}, which is gone: it ended with it"
    if what is None:
        message = f"no background process {pid} on this service ({why}; smith-fast ps lists them)"
    else:
        message = f"no request {pid} is running in this session ({why}); nothing to {what}"
    return ProtocolError(message, pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "worker_gone", "process_id": pid, "worker": worker})


def _unresponsive(pid: str, rid: str, worker: str) -> ProtocolError:
    return ProtocolError(
        f"worker {worker}, which holds background process {pid}, did not answer in {ASK_TIMEOUT:g}s; it may not have been done",
        pb.ERROR_CODE_INTERNAL_ERROR, rid, {"reason": "worker_unresponsive", "process_id": pid, "worker": worker},
    )


class _Gone(Exception):
    """Nobody listens on the worker's subject: it is gone."""


class FleetProcesses(BackgroundTable):
    """A worker's background processes (its own table) and, for its sessions, every other live
    worker's: the core's ``background`` (:class:`~smith_fast.service.execution.BackgroundProcesses`).

    Args:
        limits: the worker's limits (its own table's).
        worker: this worker's id.
        subjects: the deployment's subjects.
        presence_interval: the workers' ``--presence-interval`` (when one silent is gone).
    """

    def __init__(self, limits: Limits, worker: str, subjects: Subjects, presence_interval: float) -> None:
        super().__init__(limits)
        self.worker = worker
        self.subjects = subjects
        self.live = LiveSet(presence_interval)  # the other workers
        self.nc: NATS | None = None
        self._announcement: Callable[[], Announcement] | None = None
        self._where: dict[str, str] = {}  # another worker's process id -> that worker
        self._gone: collections.OrderedDict[str, str] = collections.OrderedDict()  # process id -> its gone worker
        self._reads: set[asyncio.Task[None]] = set()
        self._queues: dict[str, collections.deque[tuple[dict[str, Any], bytes, str, Callable[[ProtocolError], None]]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def listen(self, nc: NATS, announcement: Callable[[], Announcement],
                     inline: Callable[[str, Callable[[bytes, bytes], None]], Awaitable[None]]) -> None:
        """Answer on this worker's subject and hear the others' announcements.

        Args:
            announcement: this worker's, published at once when a background process starts.
            inline: subscribes a handler of ``(subject, payload)`` on the path the relay's
                messages take (:meth:`~smith_fast.nats.delivery.InlineDelivery.subscribe`). The
                announcements must take it too: on nats-py's own path (a queue and a task) a
                relayed Stdin read right behind the announcement of its process was handled first,
                and refused as naming nothing.
        """
        self.nc = nc
        self._announcement = announcement
        await nc.subscribe(self.subjects.processes(self.worker), cb=self._asked)
        await inline(self.subjects.presence, self._heard)

    def close(self) -> None:
        for task in [*self._reads, *self._senders.values()]:
            task.cancel()

    # ---- where the others' processes are ----------------------------------------------------------

    def _heard(self, subject: bytes, payload: bytes) -> None:
        try:
            ann = Announcement.decode(payload)
        except ValueError:
            return
        if ann.worker == self.worker:
            return
        self.live.heard(ann)
        held = set() if ann.leaving else set(ann.background)
        for pid in [p for p, w in self._where.items() if w == ann.worker and p not in held]:
            del self._where[pid]
            if ann.leaving:  # a stopping worker ends its processes
                self._lost(pid, ann.worker)
        for pid in held:
            self._where[pid] = ann.worker
            self._gone.pop(pid, None)

    def alive(self) -> set[str]:
        """The other live workers (those silent too long are gone, with their processes)."""
        for worker in self.live.expire():
            self.lost(worker)
        return {a.worker for a in self.live.alive()}

    def _owner(self, pid: str) -> str | None:
        """The live worker known to hold ``pid``."""
        worker = self._where.get(pid)
        if worker is not None and worker not in self.alive():
            self.lost(worker)
            return None
        return worker

    def _lost(self, pid: str, worker: str) -> None:
        self._gone[pid] = worker
        self._gone.move_to_end(pid)
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)

    def lost(self, worker: str) -> None:
        """``worker`` is gone: its processes with it."""
        for pid in [p for p, w in self._where.items() if w == worker]:
            del self._where[pid]
            self._lost(pid, worker)

    # ---- the asking side: this worker's sessions ----------------------------------------------------

    async def start(self, ex: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str]) -> int:
        if (owner := self._owner(rid)) is not None:  # one id, one process in the fleet, as in serve's table
            raise ProtocolError(
                f"a background process with id {rid} already exists (on worker {owner}); give this ShellExec another request_id",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_id"},
            )
        code = await super().start(ex, rid, cmd, env)
        nc, announcement = self.nc, self._announcement
        if nc is not None and announcement is not None:  # before its READY leaves: the others know it first
            publish_now(nc, self.subjects.presence, announcement().encode())
        return code

    def elsewhere(self, pid: str, report: Callable[[ProtocolError], None]) -> ControlTarget | None:
        owner = self._owner(pid)
        if owner is not None:
            return _RemoteTarget(self, owner, pid, report)
        gone = self._gone.get(pid)
        return _GoneTarget(pid, gone) if gone is not None else None

    async def attach(self, ex: Execution, rid: str, cmd: pb.AttachCommand) -> None:
        pid = cmd.process_id
        if pid in self:
            await super().attach(ex, rid, cmd)
            return
        owner = self._owner(pid)
        if owner is None and pid not in self._gone:
            await self.listing()  # started a moment ago (its announcement is on its way), or never
            owner = self._owner(pid)
        if owner is None:
            gone = self._gone.get(pid)
            raise worker_gone(pid, rid, gone, None) if gone is not None else unknown_process(pid, rid)
        output = _RemoteOutput(self, owner, pid, rid)
        stdin_open = await output.open(cmd.from_offset)
        await follow(ex, rid, cmd, output, stdin_open)

    async def list_processes(self, ex: Execution, rid: str, cmd: pb.ListProcessesCommand) -> None:
        theirs, silent = await self.listing()
        processes = sorted([*self.processes(), *theirs], key=lambda p: (p.started_ms, p.id))
        if silent:
            ex.sink.log(
                pb.LOG_LEVEL_WARN,
                f"worker{'s' if len(silent) > 1 else ''} {', '.join(silent)} did not list {'their' if len(silent) > 1 else 'its'} "
                f"background processes within {LIST_WAIT:g}s: they are not shown",
                rid, {"reason": "workers_unanswered", "workers": ",".join(silent)},
            )
        ex.sink.event(pb.Event(process_list=pb.ProcessListEvent(request_id=rid, processes=processes)))

    async def listing(self) -> tuple[list[pb.BackgroundProcess], list[str]]:
        """Every other live worker's processes, and the workers that did not answer in time."""
        workers = sorted(self.alive())
        answers = await asyncio.gather(*(self.ask(w, {"op": "list"}, timeout=LIST_WAIT) for w in workers), return_exceptions=True)
        out: list[pb.BackgroundProcess] = []
        silent: list[str] = []
        for worker, answer in zip(workers, answers):
            if isinstance(answer, _Gone):
                self.lost(worker)
                silent.append(worker)
                continue
            if isinstance(answer, BaseException) or not answer[0].get("ok"):
                log.info("worker did not list its background processes", extra={"fields": {"worker": worker, "error": repr(answer)}})
                silent.append(worker)
                continue
            processes = list(pb.ProcessListEvent.FromString(answer[1]).processes)
            for pid in [p for p, w in self._where.items() if w == worker]:
                del self._where[pid]
            for proc in processes:
                if proc.id not in self:
                    self._where[proc.id] = worker
                    self._gone.pop(proc.id, None)
            out.extend(processes)
        return out, silent

    async def ask(self, worker: str, header: dict[str, Any], body: bytes = b"", timeout: float = ASK_TIMEOUT) -> tuple[dict[str, Any], bytes]:
        """One request to ``worker``'s subject; its answer.

        Raises:
            _Gone: nobody listens there.
            TimeoutError: no answer within ``timeout`` (or no NATS connection).
            ValueError: the answer is no process message.
        """
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        nc = self.nc
        if nc is None or nc.is_closed:
            raise TimeoutError(worker)
        try:
            msg = await nc.request(self.subjects.processes(worker), _encode(header, body), timeout=timeout)
        except NoRespondersError:
            raise _Gone(worker) from None
        except NatsTimeout:
            raise TimeoutError(worker) from None
        return _decode(msg.data)

    def steer(self, owner: str, header: dict[str, Any], body: bytes, rid: str, report: Callable[[ProtocolError], None]) -> None:
        """Send a Cancel/Stdin/Resize to ``owner`` after those sent before it; what it refuses goes to ``report``.

        Raises:
            ProtocolError: :data:`MAX_QUEUED` are waiting already.
        """
        queue = self._queues.setdefault(owner, collections.deque())
        if len(queue) >= MAX_QUEUED:
            raise ProtocolError(
                f"too many commands on their way to worker {owner} (max {MAX_QUEUED}); this {header['op']} was not sent",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid, {"reason": "steering_full", "worker": owner},
            )
        queue.append((header, body, rid, report))
        if owner not in self._senders:
            self._senders[owner] = asyncio.get_running_loop().create_task(self._send(owner, queue))

    async def _send(self, owner: str, queue: collections.deque[tuple[dict[str, Any], bytes, str, Callable[[ProtocolError], None]]]) -> None:
        try:
            while queue:
                header, body, rid, report = queue[0]
                try:
                    answer, _ = await self.ask(owner, header, body)
                    error = None if answer.get("ok") else _refused(answer, rid)
                except _Gone:
                    self.lost(owner)
                    error = worker_gone(rid, rid, owner, _WHAT.get(str(header["op"]), str(header["op"])))
                except (TimeoutError, ValueError):
                    error = _unresponsive(rid, rid, owner)
                queue.popleft()
                if error is not None:
                    with contextlib.suppress(Exception):  # its session may have ended meanwhile
                        report(error)
        finally:
            del self._senders[owner]
            if not queue:
                self._queues.pop(owner, None)

    # ---- the owning side: what the others ask of this worker's processes ---------------------------

    async def _asked(self, msg: Msg) -> None:
        if not msg.reply:
            return
        try:
            header, body = _decode(msg.data)
            op, pid = str(header["op"]), str(header.get("id", ""))
        except (ValueError, KeyError, TypeError):
            await self._respond(msg, _refusal(ProtocolError("not a process request", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"})))
            return
        if op == "read":
            if len(self._reads) >= MAX_READS:
                await self._respond(msg, _refusal(ProtocolError(
                    f"worker {self.worker} follows {MAX_READS} background processes for other workers already; attach again later",
                    pb.ERROR_CODE_RESOURCE_EXHAUSTED, pid, {"reason": "max_attaches", "worker": self.worker},
                )))
                return
            task = asyncio.get_running_loop().create_task(self._read(msg, pid, header))  # it may wait: the next request must not
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)
            return
        try:
            answer = self._answer(op, pid, header, body)
        except ProtocolError as exc:
            answer = _refusal(exc)
        except (ValueError, KeyError, TypeError):
            answer = _refusal(ProtocolError(f"not a {op} request", pb.ERROR_CODE_UNSPECIFIED, pid or None, {"reason": "malformed"}))
        await self._respond(msg, answer)

    async def _respond(self, msg: Msg, data: bytes) -> None:
        with contextlib.suppress(Exception):  # the asker's connection went, or ours
            await msg.respond(data)

    def _answer(self, op: str, pid: str, header: dict[str, Any], body: bytes) -> bytes:
        if op == "list":
            return _encode({"ok": True}, pb.ProcessListEvent(processes=self.processes()).SerializeToString())
        what = _WHAT.get(op)
        if what is None:
            raise ProtocolError(f"a worker's process subject takes no {op!r} request", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"})
        if pid not in self:  # dropped for a newer one since the asker heard of it (and one elsewhere is not for here to forward)
            raise not_running(pid, what, True)
        target = BackgroundTarget(self, pid, self.limits.max_stdin_buffer)
        if op == "cancel":
            target.cancel()
        elif op == "stdin":
            target.write_stdin(body, bool(header.get("eof")))
        else:
            target.resize(int(header["rows"]), int(header["cols"]))
        return _encode({"ok": True})

    async def _read(self, msg: Msg, pid: str, header: dict[str, Any]) -> None:
        """One step of another worker's attach: output from ``from`` as soon as there is some,
        or the stdin taken, or the exit; after ``wait`` seconds at most, whatever there is."""
        entry = self.get(pid)
        if entry is None:
            await self._respond(msg, _refusal(unknown_process(pid, None)))
            return
        nc = self.nc
        try:
            cursor = int(header["from"])
            if header.get("open"):
                cursor = min(cursor, entry.next)
            size = max(1, min(int(header.get("max", READ_MAX)), READ_MAX, (nc.max_payload // 2) if nc is not None else READ_MAX))
            wait = max(0.0, min(float(header.get("wait", 0)), READ_WAIT))
            known = int(header.get("taken", 0))
        except (ValueError, KeyError, TypeError):
            await self._respond(msg, _refusal(ProtocolError("not a read request", pb.ERROR_CODE_UNSPECIFIED, details={"reason": "malformed"})))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        entry.attached += 1
        try:
            while True:
                pieces = entry.read(cursor, size)[:MAX_PIECES]
                if pieces or entry.exit_code is not None or entry.stdin_taken > known or (left := deadline - loop.time()) <= 0:
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(entry.changed()), left)
        finally:
            entry.attached -= 1
        proc = entry.proc
        answer = {
            "ok": True, "from": cursor, "first": entry.first, "next": entry.next, "exit_code": entry.exit_code,
            "taken": entry.stdin_taken, "stdin_open": proc is not None and proc.stdin_open,
            "pieces": [[offset, fd, len(data)] for offset, fd, data in pieces],
        }
        await self._respond(msg, _encode(answer, b"".join(data for _, _, data in pieces)))


_WHAT = {"cancel": "cancel", "stdin": "write stdin to", "resize": "resize"}


class _RemoteTarget:
    """Another live worker's background process as a control command's target."""

    __slots__ = ("_fleet", "_owner", "_pid", "_report")

    def __init__(self, fleet: FleetProcesses, owner: str, pid: str, report: Callable[[ProtocolError], None]) -> None:
        self._fleet = fleet
        self._owner = owner
        self._pid = pid
        self._report = report

    def _steer(self, header: dict[str, Any], body: bytes = b"") -> None:
        self._fleet.steer(self._owner, {**header, "id": self._pid}, body, self._pid, self._report)

    def cancel(self) -> None:
        self._steer({"op": "cancel"})

    def write_stdin(self, data: bytes, eof: bool) -> None:
        nc = self._fleet.nc
        room = (nc.max_payload if nc is not None else 1 << 20) - 1024
        if len(data) > room:
            raise ProtocolError(
                f"{len(data)} bytes of stdin for background process {self._pid} on worker {self._owner} do not fit one NATS "
                f"message (max {room}); the data was not written: send it in smaller pieces",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, self._pid, {"reason": "too_large", "limit": str(room)},
            )
        self._steer({"op": "stdin", "eof": eof}, data)

    def resize(self, rows: int, cols: int) -> None:
        terminal_size(rows, cols, self._pid)  # what is out of range is refused here, at once, as on serve
        self._steer({"op": "resize", "rows": rows, "cols": cols})


class _GoneTarget:
    """A background process whose worker is gone: every command on it is refused (``worker_gone``)."""

    __slots__ = ("_pid", "_worker")

    def __init__(self, pid: str, worker: str) -> None:
        self._pid = pid
        self._worker = worker

    def cancel(self) -> None:
        raise worker_gone(self._pid, self._pid, self._worker, "cancel")

    def write_stdin(self, data: bytes, eof: bool) -> None:
        raise worker_gone(self._pid, self._pid, self._worker, "write stdin to")

    def resize(self, rows: int, cols: int) -> None:
        raise worker_gone(self._pid, self._pid, self._worker, "resize")


class _RemoteOutput:
    """Another worker's background process as an attach follows it (:class:`~smith_fast.service.background.Output`):
    what its last read answered, and the next read when that was taken."""

    def __init__(self, fleet: FleetProcesses, owner: str, pid: str, rid: str) -> None:
        self._fleet = fleet
        self._owner = owner
        self._pid = pid
        self._rid = rid
        self.first = 0
        self.next = 0
        self.exit_code: int | None = None
        self.stdin_taken = 0
        self._pieces: collections.deque[tuple[int, int, bytes]] = collections.deque()
        self._at = 0  # where the next read starts: what was taken so far

    async def open(self, offset: int) -> bool:
        """The first read (from ``offset``, past the end meaning the end), at once; whether its stdin is open."""
        header = await self._read(offset, opening=True)
        self._at = int(header["from"])
        return bool(header.get("stdin_open"))

    async def _read(self, offset: int, opening: bool = False) -> dict[str, Any]:
        fleet, owner, pid, rid = self._fleet, self._owner, self._pid, self._rid
        wait = 0.0 if opening else READ_WAIT
        request = {"op": "read", "id": pid, "from": offset, "open": opening, "wait": wait, "taken": self.stdin_taken, "max": READ_MAX}
        while True:
            try:
                header, body = await fleet.ask(owner, request, timeout=wait + ASK_TIMEOUT)
                break
            except _Gone:
                fleet.lost(owner)
                raise worker_gone(pid, rid, owner, None) from None
            except TimeoutError:
                # A worker killed while it held this read never answers, nor does one cut off
                # from NATS for a while: asked again until it answers or falls silent in the
                # presence set (three intervals).
                if owner not in fleet.alive():
                    raise worker_gone(pid, rid, owner, None) from None
            except ValueError:
                raise _unresponsive(pid, rid, owner) from None
        if not header.get("ok"):
            raise _refused(header, rid)
        try:
            self.first, self.next = int(header["first"]), int(header["next"])
            code = header.get("exit_code")
            self.exit_code = None if code is None else int(code)
            self.stdin_taken = int(header.get("taken", 0))
            at = 0
            for start, fd, size in cast("list[list[int]]", header["pieces"]):
                self._pieces.append((int(start), int(fd), body[at : at + int(size)]))
                at += int(size)
        except (ValueError, KeyError, TypeError):
            raise _unresponsive(pid, rid, owner) from None
        return header

    def read(self, offset: int, size: int) -> list[tuple[int, int, bytes]]:
        out: list[tuple[int, int, bytes]] = []
        pieces = self._pieces
        while pieces and size > 0:
            start, fd, data = pieces[0]
            if start + len(data) <= offset:
                pieces.popleft()
                continue
            skip = max(offset - start, 0)
            piece = data[skip : skip + size]
            out.append((start + skip, fd, piece))
            size -= len(piece)
            offset = start + skip + len(piece)
            if skip + len(piece) >= len(data):
                pieces.popleft()
            else:
                pieces[0] = (offset, fd, data[skip + len(piece) :])
        self._at = offset
        return out

    async def more(self) -> None:
        await self._read(self._at)
