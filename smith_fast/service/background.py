"""Background processes: ShellExecs that outlive their request and their session.

A ShellExec with ``background`` passes the choke point as any other (:func:`launch.stream
<smith_fast.service.launch.stream>`: hooks, size, env policy, audit, a ``--max-processes`` slot,
:func:`~smith_fast.service.spawn.spawn` and so the sandbox, its cgroup and the child guard); then,
instead of streaming, its process goes into the core's :class:`BackgroundTable` and its request ends
``READY`` at once after a ``LogEvent`` naming it. From then on the table owns it:

* its output (stdout and stderr together, one byte-offset space) goes into a :class:`Ring` of
  ``--background-buffer`` bytes that drops the oldest, so memory stays bounded whatever it writes
  and whoever reads;
* any session of the service with ``shell_exec`` granted lists it (``ListProcessesCommand``),
  follows it (``AttachCommand``: retained output from an offset, then live, then its exit), writes
  its stdin, resizes it and cancels it (Cancel/Stdin/Resize naming its id: the runner looks here
  for an id that is not one of its session's running requests);
* a session that ends leaves it running; the service's shutdown terminates it (``--kill-grace``),
  and if the service dies the child guard kills its group and cgroup (:mod:`smith_fast.childguard`).

The table keeps at most ``--max-background`` entries, running or exited (an exited one keeps its
output and exit code for a late attach); a new one makes room by dropping the oldest exited entry.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from ..errors import ProtocolError
from ..logs import get_logger
from ..pb import smith_pb2 as pb
from ..process import STDERR, STDOUT, ShellProcess
from . import process_slots
from .shell_exec import working_directory
from .sizes import terminal_size
from .egress import open_egress
from .spawn import spawn

if TYPE_CHECKING:
    from .config import Limits
    from .execution import ControlTarget, Execution

__all__ = ["BackgroundTable", "Background", "Output", "Ring", "COMMAND_SHOWN", "follow", "unknown_process"]

_log = get_logger("smith_fast.background")

COMMAND_SHOWN = 200
"""Bytes of a background process's command a ProcessList shows."""

_ATTACH_BURST = 8
"""Chunks an attach sends before it yields to the loop (and checks that its peer reads)."""

_STOPPING: set[asyncio.Task[int]] = set()  # terminations under way (the loop keeps only weak refs)


class _Segment:
    __slots__ = ("offset", "fd", "data")

    def __init__(self, offset: int, fd: int, data: bytes) -> None:
        self.offset = offset
        self.fd = fd
        self.data = bytearray(data)


class Ring:
    """The last ``limit`` bytes of a process's output, as segments (offset, stream, bytes).

    Offsets count every byte the process wrote (stdout and stderr together) from 0; what falls out
    of the ring moves :attr:`first` forward. Adjacent writes to the same stream are merged up to
    ``merge`` bytes, so a chatty process does not make thousands of segments.
    """

    __slots__ = ("limit", "merge", "first", "next", "_segments", "_size")

    def __init__(self, limit: int, merge: int) -> None:
        self.limit = limit
        self.merge = merge
        self.first = 0
        self.next = 0
        self._segments: deque[_Segment] = deque()
        self._size = 0

    @property
    def retained(self) -> int:
        return self._size

    def feed(self, fd: int, data: bytes) -> None:
        if not data:
            return
        start = self.next
        self.next += len(data)
        if len(data) > self.limit:  # only its tail fits
            start += len(data) - self.limit
            data = data[len(data) - self.limit :]
        segments = self._segments
        last = segments[-1] if segments else None
        # (only onto bytes it follows: a chunk larger than the ring keeps just its tail, after a gap)
        if last is not None and last.fd == fd and last.offset + len(last.data) == start and len(last.data) + len(data) <= self.merge:
            last.data += data
        else:
            segments.append(_Segment(start, fd, data))
        self._size += len(data)
        excess = self._size - self.limit
        while excess > 0:
            head = segments[0]
            if len(head.data) <= excess:
                segments.popleft()
                self._size -= len(head.data)
                excess -= len(head.data)
            else:
                del head.data[:excess]
                head.offset += excess
                self._size -= excess
                excess = 0
        self.first = self.next - self._size

    def read(self, offset: int, size: int) -> list[tuple[int, int, bytes]]:
        """Up to ``size`` bytes from ``offset`` on (from :attr:`first` if that was dropped), as
        ``(offset, fd, data)`` pieces; ``[]`` when nothing is there yet."""
        offset = max(offset, self.first)
        out: list[tuple[int, int, bytes]] = []
        segments = self._segments
        i = len(segments)
        while i > 0 and segments[i - 1].offset > offset:  # from the tail: readers follow it
            i -= 1
        i = max(i - 1, 0)
        while i < len(segments) and size > 0:
            seg = segments[i]
            if seg.offset + len(seg.data) > offset:
                skip = max(offset - seg.offset, 0)
                piece = bytes(seg.data[skip : skip + size])
                out.append((seg.offset + skip, seg.fd, piece))
                size -= len(piece)
                offset = seg.offset + skip + len(piece)
            i += 1
        return out


class Background:
    """One background process: its process, its output ring, how it ended."""

    __slots__ = (
        "id", "command", "proc", "ring", "started_ms", "ended_ms", "exit_code",
        "stopping", "attached", "stdin_taken", "_changed", "_loop", "workspace",
    )

    def __init__(self, rid: str, command: str, ring: Ring, workspace: str = "") -> None:
        self.id = rid
        self.workspace = workspace  # the workspace it runs in (--workspaces), "" for the shared root
        self.command = command
        self.proc: ShellProcess | None = None
        self.ring = ring
        self.started_ms = int(time.time() * 1000)
        self.ended_ms = 0
        self.exit_code: int | None = None
        self.stopping = False
        self.attached = 0
        self.stdin_taken = 0
        self._loop = asyncio.get_running_loop()
        self._changed: asyncio.Future[None] = self._loop.create_future()

    @property
    def running(self) -> bool:
        return self.exit_code is None

    @property
    def state(self) -> str:
        if self.exit_code is not None:
            return "exited"
        return "stopping" if self.stopping else "running"

    @property
    def first(self) -> int:
        return self.ring.first

    @property
    def next(self) -> int:
        return self.ring.next

    def read(self, offset: int, size: int) -> list[tuple[int, int, bytes]]:
        return self.ring.read(offset, size)

    async def more(self) -> None:
        await asyncio.shield(self.changed())  # shared by its attaches: one detaching must not cancel it for the others

    def _wake(self) -> None:
        if not self._changed.done():
            self._changed.set_result(None)

    def changed(self) -> asyncio.Future[None]:
        """Done once there is more output, more stdin taken, or the exit."""
        if self._changed.done():
            self._changed = self._loop.create_future()
        return self._changed

    def on_output(self, fd: int, data: bytes) -> None:
        self.ring.feed(fd, data)
        self._wake()

    def on_stdin(self, total: int) -> None:
        self.stdin_taken = total
        self._wake()

    def ended(self, code: int) -> None:
        self.exit_code = code
        self.ended_ms = int(time.time() * 1000)
        self._wake()

    def info(self) -> pb.BackgroundProcess:
        proc = self.proc
        command = self.command.encode()[:COMMAND_SHOWN].decode("utf-8", "ignore")
        out = pb.BackgroundProcess(
            id=self.id, command=command, state=self.state, pid=proc.pid if proc is not None else 0,
            started_ms=self.started_ms, ended_ms=self.ended_ms, first_offset=self.ring.first,
            next_offset=self.ring.next, retained=self.ring.retained, attached=self.attached,
            stdin_open=proc is not None and proc.stdin_open, pty=proc is not None and proc.is_pty,
        )
        if self.exit_code is not None:
            out.exit_code = self.exit_code
        return out


_CHUNK_FIELDS = {(STDOUT, str): "stdout", (STDERR, str): "stderr", (STDOUT, bytes): "stdout_bytes", (STDERR, bytes): "stderr_bytes"}


def _send_chunk(ex: Execution, rid: str, fd: int, data: str | bytes, offset: int) -> None:
    """One attach chunk: text or raw bytes of stdout or stderr, with its offset."""
    so = pb.ShellOutputEvent(request_id=rid, offset=offset)
    setattr(so, _CHUNK_FIELDS[fd, type(data)], data)
    ex.sink.event(pb.Event(shell_output=so))


def unknown_process(pid: str, rid: str | None) -> ProtocolError:
    """What naming no background process in an Attach says."""
    return ProtocolError(
        f"no background process {pid} on this service (smith-fast ps lists them)", pb.ERROR_CODE_UNSPECIFIED, rid,
        {"reason": "unknown_process", "process_id": pid},
    )


class BackgroundTable:
    """The service's background processes (one per :class:`~smith_fast.service.core.ServiceCore`).

    Args:
        limits: ``--max-background``, ``--background-buffer``, ``--chunk-size``, ``--kill-grace``,
            ``--max-stdin-buffer``, the per-command limits.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._entries: OrderedDict[str, Background] = OrderedDict()
        self._starting: set[str] = set()  # ids admitted whose process is being spawned: they hold their room
        self._waiters: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, pid: str) -> Background | None:
        return self._entries.get(pid)

    def __contains__(self, pid: object) -> bool:
        return pid in self._entries

    def running_in(self, workspace: str) -> list[str]:
        """The ids of the running background processes started in ``workspace``."""
        return [e.id for e in self._entries.values() if e.workspace == workspace and e.ended_ms == 0 and e.exit_code is None]

    def ids(self) -> list[str]:
        """The ids of the processes kept, running or exited, oldest first."""
        return list(self._entries)

    def process(self, pid: str) -> ShellProcess | None:
        entry = self._entries.get(pid)
        return entry.proc if entry is not None else None

    def running(self) -> int:
        return sum(1 for e in self._entries.values() if e.running)

    def processes(self) -> list[pb.BackgroundProcess]:
        return [e.info() for e in self._entries.values()]

    # ---- starting -------------------------------------------------------------------------------

    def _make_room(self, rid: str) -> None:
        limit = self.limits.max_background
        if limit <= 0:
            raise ProtocolError(
                "background processes are off on this service (--max-background 0); run it without background",
                pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid, {"reason": "max_background", "limit": "0"},
            )
        if rid in self._entries or rid in self._starting:
            raise ProtocolError(
                f"a background process with id {rid} already exists; give this ShellExec another request_id",
                pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "duplicate_id"},
            )
        while len(self._entries) + len(self._starting) >= limit:
            oldest = next((e for e in self._entries.values() if not e.running), None)
            if oldest is None:
                raise ProtocolError(
                    f"too many background processes running (max --max-background {limit}); "
                    "stop one with smith-fast kill ID, or wait for one to exit",
                    pb.ERROR_CODE_RESOURCE_EXHAUSTED, rid, {"reason": "max_background", "limit": str(limit)},
                )
            del self._entries[oldest.id]

    async def start(self, ex: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str]) -> int:
        """Start ShellExec ``rid`` (admitted by :func:`~smith_fast.service.launch.admit`) in the
        background: its request then ends ``READY`` while it runs on. Returns 0.

        Raises:
            ProtocolError: background processes are off, all ``--max-background`` run, the id is
                taken, an output hook watches (it would not see this output), no process slot, or
                it could not be started.
        """
        if ex.hooks.handles("on_shell_output"):
            raise ProtocolError(
                "a background ShellExec is refused while an on_shell_output hook watches this session: "
                "its output would not pass the hook",
                pb.ERROR_CODE_PERMISSION_DENIED, rid, {"reason": "output_hook"},
            )
        if ex.cancelling():
            raise ProtocolError("request cancelled: the command was not started", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"})
        self._make_room(rid)
        self._starting.add(rid)
        try:
            return await self._start(ex, rid, cmd, env)
        finally:
            self._starting.discard(rid)

    async def _start(self, ex: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str]) -> int:
        core = ex.core
        limits = core.limits
        pty = cmd.pty if cmd.HasField("pty") else None
        size = terminal_size(pty.rows, pty.cols, rid) if pty is not None else None
        if pty is not None:
            env = {"TERM": pty.term or "xterm-256color", **env}
        freed = process_slots.take(core, ex.slots, rid)  # its session's count too, while it runs
        entry = Background(rid, cmd.command, Ring(self.limits.background_buffer, limits.chunk_size),
                           ex.workspace.id if ex.workspace is not None else "")
        sandbox = core.tool_context.sandbox
        home = ex.home  # it outlives the session: so does the home it writes (session_home.py)
        release = freed if home is None else _both(freed, home.release)
        if home is not None:
            home.hold()
        try:
            proc = await spawn(
                cmd.command,
                shell=cmd.shell if cmd.HasField("shell") else None,
                cwd=working_directory(core.tool_context.root, cmd.cwd if cmd.HasField("cwd") else None,
                                      confined=sandbox is not None and sandbox.confines_files),
                env=env,
                on_output=entry.on_output,
                sandbox=sandbox,
                stdin=cmd.open_stdin,
                pty=size,
                stdin_limit=limits.max_stdin_buffer,
                on_stdin=entry.on_stdin,
                limits=limits.command_limits(),
                egress=open_egress(ex, rid),
            )
        except BaseException:
            release()
            raise
        entry.proc = proc
        # What the peer sent for its stdin before it started (hooks run first) goes to it now; from
        # here on it is not this session's process (a session's teardown must not reach it).
        ex.process_started(rid, proc)
        ex.process_ended(rid, proc)
        self._entries[rid] = entry
        timeout = cmd.timeout_ms / 1000 if cmd.HasField("timeout_ms") and cmd.timeout_ms else None
        waiter = asyncio.get_running_loop().create_task(self._watch(entry, proc, timeout, release))
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)
        ex.audit.note(rid, background=True, pid=proc.pid)
        ex.sink.log(
            pb.LOG_LEVEL_INFO,
            f"running in the background as {rid} (pid {proc.pid}); follow it with smith-fast attach {rid}",
            rid,
            {"reason": "background", "process_id": rid, "pid": str(proc.pid)},
        )
        _log.info("background process started", extra={"fields": {"process_id": rid, "pid": proc.pid, "command": entry.info().command}})
        return 0

    async def _watch(self, entry: Background, proc: ShellProcess, timeout: float | None, release: Callable[[], None]) -> None:
        """Wait for the process (its explicit ``timeout_ms``, if any, ends it), then record its exit."""
        killed = None
        try:
            try:
                code = await proc.wait(timeout)
            except TimeoutError:
                killed = "timeout"
                code = await proc.terminate(self.limits.kill_grace)
        except asyncio.CancelledError:
            proc.close()
            code = proc.returncode if proc.returncode is not None else -9
            raise
        except Exception as exc:  # on_output cannot raise; a bug of ours, logged, the entry still ends
            _log.error("background process failed", extra={"fields": {"process_id": entry.id, "error": repr(exc)}})
            code = proc.returncode if proc.returncode is not None else -9
        finally:
            if proc.returncode is None:
                proc.kill()
            entry.ended(code)
            release()
            fields: dict[str, object] = {"process_id": entry.id, "pid": proc.pid, "exit_code": code}
            if killed:
                fields["killed"] = killed
            if proc.usage is not None:
                fields.update(proc.usage.fields())
            _log.info("background process ended", extra={"fields": fields})

    # ---- control --------------------------------------------------------------------------------

    def elsewhere(self, pid: str, report: Callable[[ProtocolError], None]) -> ControlTarget | None:
        """Cancel, Stdin and Resize of ``pid`` when it is not in this table: None here (a NATS
        worker's table finds it on another worker, smith_fast.nats.processes)."""
        return None

    def cancel(self, pid: str) -> None:
        """SIGTERM its process group, SIGKILL after ``--kill-grace`` (harmless when it ended or a
        cancel is under way); attached requests get its final output and exit."""
        entry = self._entries.get(pid)
        if entry is None:
            raise unknown_process(pid, pid)
        if not entry.running or entry.stopping or entry.proc is None:
            return
        entry.stopping = True
        entry._wake()
        task = asyncio.get_running_loop().create_task(entry.proc.terminate(self.limits.kill_grace))
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)

    async def shutdown(self, grace: float) -> None:
        """The service stops: every running background process is terminated (TERM, ``grace``, KILL)."""
        procs = [e.proc for e in self._entries.values() if e.running and e.proc is not None]
        await asyncio.gather(*(p.terminate(grace) for p in procs), return_exceptions=True)
        if self._waiters:
            await asyncio.wait(list(self._waiters), timeout=grace + 1)

    # ---- attach ---------------------------------------------------------------------------------

    async def attach(self, ex: Execution, rid: str, cmd: pb.AttachCommand) -> None:
        """AttachCommand ``rid``: the output of process ``cmd.process_id`` from ``cmd.from_offset``
        (the oldest retained byte if that was dropped, said in a WARN ``LogEvent``; an offset past
        the end waits for new output), then live, then its final ``ShellOutput(finished, exit_code)``;
        ``READY`` after that. Cancelling this request detaches (the process goes on)."""
        pid = cmd.process_id
        entry = self._entries.get(pid)
        if entry is None:
            raise unknown_process(pid, rid)
        entry.attached += 1
        try:
            await follow(ex, rid, cmd, entry, entry.proc is not None and entry.proc.stdin_open)
        finally:
            entry.attached -= 1

    async def list_processes(self, ex: Execution, rid: str, _cmd: pb.ListProcessesCommand) -> None:
        """ListProcessesCommand ``rid``: one ``ProcessListEvent``, then ``READY``."""
        ex.sink.event(pb.Event(process_list=pb.ProcessListEvent(request_id=rid, processes=self.processes())))


class Output(Protocol):
    """A background process's output as an attach follows it: its ring here
    (:class:`Background`), or one held by another NATS worker (smith_fast.nats.processes)."""

    @property
    def first(self) -> int:
        """The oldest offset still retained."""
        ...

    @property
    def next(self) -> int:
        """The offset of the next byte it writes."""
        ...

    @property
    def exit_code(self) -> int | None: ...

    @property
    def stdin_taken(self) -> int:
        """Bytes of its stdin it has read so far."""
        ...

    def read(self, offset: int, size: int) -> list[tuple[int, int, bytes]]:
        """As :meth:`Ring.read`."""
        ...

    async def more(self) -> None:
        """Return once there may be more output, more stdin taken, or the exit."""
        ...


async def follow(ex: Execution, rid: str, cmd: pb.AttachCommand, output: Output, stdin_open: bool) -> None:
    """Send ``output`` as AttachCommand ``rid`` asks (:meth:`BackgroundTable.attach`), until the exit."""
    pid = cmd.process_id
    binary = cmd.binary_output and ex.sink.version == 1
    chunk = ex.core.limits.chunk_size
    cursor = min(cmd.from_offset, output.next)
    decoders = {STDOUT: codecs.getincrementaldecoder("utf-8")("replace"), STDERR: codecs.getincrementaldecoder("utf-8")("replace")}
    acked = 0
    wants_acks = ex.sink.version == 1 and stdin_open
    while True:
        await ex.reading()  # a peer that does not read: the ring keeps (and drops), nothing piles up here
        first = output.first
        if cursor < first:
            ex.sink.log(
                pb.LOG_LEVEL_WARN,
                f"output of {pid} before offset {first} was dropped (--background-buffer); attached from {first}, "
                f"{first - cursor} bytes lost",
                rid,
                {"reason": "output_dropped", "process_id": pid, "requested_offset": str(cursor), "start_offset": str(first)},
            )
            cursor = first
        pieces = output.read(cursor, chunk * _ATTACH_BURST)
        for offset, fd, data in pieces:
            for at in range(0, len(data), chunk):
                _send(ex, rid, fd, data[at : at + chunk], offset + at, binary, decoders)
            cursor = offset + len(data)
        if wants_acks and output.stdin_taken > acked:
            acked = output.stdin_taken
            ex.sink.event(pb.Event(shell_output=pb.ShellOutputEvent(request_id=rid, stdin_written=acked)))
        if pieces:
            await asyncio.sleep(0)
            continue
        if output.exit_code is not None and cursor >= output.next:
            tail = {fd: d.decode(b"", final=True) for fd, d in decoders.items()} if not binary else {}
            for fd, text in tail.items():
                if text:
                    _send_chunk(ex, rid, fd, text, cursor)
            ex.sink.event(pb.Event(shell_output=pb.ShellOutputEvent(
                request_id=rid, exit_code=output.exit_code, finished=True, offset=output.next)))
            return
        await output.more()


def _send(ex: Execution, rid: str, fd: int, data: bytes, offset: int, binary: bool, decoders: Mapping[int, codecs.IncrementalDecoder]) -> None:
    if binary:
        _send_chunk(ex, rid, fd, data, offset)
        return
    decoder = decoders[fd]
    held = len(decoder.getstate()[0])  # bytes of a character cut by the previous piece: this text starts there
    text = decoder.decode(data)
    if text:
        _send_chunk(ex, rid, fd, text, offset - held)


def _both(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            second()

    return both
