"""ShellExec: run a command, stream its output as ShellOutput events, report its exit.

Output flows child pipe → ``ShellProcess`` (large non-blocking reads) → one ``OutputChunker`` per
stream → the session's sink. Full chunks go out at once; smaller reads are drained once per loop
tick, so a burst of short lines becomes one event. When the peer stops reading, the session pauses
the pipes (the child then blocks on a full pipe), so memory stays bounded.

When a hook watches output (``on_shell_output``), chunks pass through it in order on a small
queue; the pipes are paused while the queue is long, so a slow hook cannot make memory grow either.

A ShellExec may ask for its stdin to stay open (``open_stdin``) or for a pseudo-terminal
(``pty``): the process is registered with the runner (``process_started``), which writes the
peer's StdinCommands and resizes to it, and watched for "waiting for input"
(:mod:`~smith_fast.service.input_wait`: one LogEvent when it sleeps reading that input). With
``binary_output`` its output goes out as raw bytes (``stdout_bytes``/``stderr_bytes``), cut at
``--chunk-size`` and never decoded; text (UTF-8, invalid bytes replaced) stays the default, and so
it stays while an output hook watches (hooks see text).

What a hook's transform returns is chunked again to ``--chunk-size`` and counted against
``--max-output`` (a transform may make a 3-byte chunk 5 MB).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..chunking import OutputChunker
from ..containment import Usage
from ..logs import get_logger, log_fields
from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from ..process import ShellProcess
from . import process_slots, workspace_commands
from .input_wait import InputWatch, notifier
from .egress import open_egress
from .sizes import terminal_size
from .spawn import spawn

if TYPE_CHECKING:
    from ..workspaces import WorkspaceOps
    from .execution import Execution

__all__ = ["limit_error", "report_usage", "run_shell_exec", "terminal_size", "working_directory"]

_TRUNCATED = ("output truncated after {cap} bytes (--max-output); its output is no longer read, so a command "
              "that writes more gets SIGPIPE")

_log = get_logger("smith_fast.accounting")


def report_usage(session: Execution, rid: str, usage: Usage, *, to_peer: bool) -> None:
    """What a command cost: one structured line in the service's log (the audit trail) and, for a
    peer that asked for ``usage`` in its handshake (``to_peer``), a LogEvent right after the final
    ShellOutput with the :class:`~smith_fast.containment.Usage` fields (also as ``key=value`` pairs
    in its message). Opt-in, as every Envelope addition is: a strict frontend that never asked sees
    exactly the events it always did."""
    fields = usage.fields()
    if to_peer:
        text = "command usage: " + " ".join(f"{k}={v}" for k, v in fields.items())
        session.sink.log(pb.LOG_LEVEL_INFO, text, rid, fields)
    # Written with the request's audit line (linger): a line of its own at the end of the loop
    # step was one more write to stderr per command (~5% of the service's CPU per `true`), and the
    # direct line skips the LogRecord and the logger tree.
    log_fields(_log, logging.INFO, "command usage", {"request_id": rid, **fields}, linger=True)


def limit_error(usage: Usage | None, rid: str | None) -> None:
    """Raise ``ERROR_CODE_RESOURCE_EXHAUSTED`` naming the limit a finished command hit, if any."""
    if usage is None or usage.limit_hit is None:
        return
    raise ProtocolError(
        f"command hit {usage.limit_hit} and was stopped (see `smith-fast serve --help`)",
        pb.ERROR_CODE_RESOURCE_EXHAUSTED,
        rid,
        {"reason": "limit", "limit": usage.limit_hit},
    )


def working_directory(root: pathlib.Path, cwd: str | None, *, confined: bool = False) -> str:
    """Where a ShellExec runs: ``--root`` when it names no ``cwd`` (or an empty one), a relative
    ``cwd`` taken from the root, an absolute one as it is. As with ``shell.run``, so that the two
    ways of running a command agree.

    Args:
        root: the workspace root (resolved).
        cwd: the request's ``cwd``.
        confined: the sandbox is on: ``cwd`` must resolve (symlinks followed) inside the root.

    Raises:
        ProtocolError: ``ERROR_CODE_PERMISSION_DENIED``, ``confined`` and ``cwd`` is outside the root
            (said whether or not it exists, so nothing outside can be probed).
    """
    path = str(root / cwd) if cwd else str(root)
    if confined and cwd:
        real = os.path.realpath(path)
        top = str(root)
        if real != top and not real.startswith(top.rstrip("/") + "/"):
            raise ProtocolError(
                f"cwd {cwd!r} is outside the workspace root {top!r}; with --sandbox on, commands run inside it",
                pb.ERROR_CODE_PERMISSION_DENIED,
                details={"reason": "cwd_outside_root"},
            )
    return path


class _Output:
    """Caps, chunks and forwards one command's stdout and stderr."""

    __slots__ = (
        "sink", "rid", "chunkers", "room", "truncated", "cap", "proc", "_drain_scheduled", "_loop",
        "_hooks", "_queue", "_consumer", "_held", "binary", "chunk_size", "_out_room", "_cut",
    )

    HIGH_WATER = 64  # queued chunks waiting for an output hook before the pipes are paused
    LOW_WATER = 16

    def __init__(self, session: Execution, rid: str, binary: bool = False) -> None:
        limits = session.core.limits
        self.sink = session.sink
        self.rid = rid
        self._hooks = session.hooks if session.hooks.handles("on_shell_output") else None
        self.binary = binary and self._hooks is None
        chunker = _BytesChunker if self.binary else OutputChunker
        self.chunkers: dict[int, OutputChunker | _BytesChunker] = {1: chunker(limits.chunk_size), 2: chunker(limits.chunk_size)}
        self.cap = limits.max_output
        self.room = limits.max_output
        self.chunk_size = limits.chunk_size
        self._out_room = limits.max_output  # what output hooks send: transforms can inflate it
        self._cut = False  # output hooks' output reached --max-output
        self.truncated = False
        self.proc: ShellProcess | None = None
        self._drain_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._queue: deque[tuple[int, str, bool]] = deque()
        self._consumer: asyncio.Task[None] | None = None
        self._held = False

    def _send(self, fd: int, text: str | bytes | memoryview) -> None:
        if not isinstance(text, str):
            self.sink.shell_output_bytes(self.rid, fd, text)
        elif fd == 1:
            self.sink.shell_output(self.rid, stdout=text)
        else:
            self.sink.shell_output(self.rid, stderr=text)

    def emit(self, fd: int, chunks: Sequence[str] | Sequence[bytes | memoryview], *, filtered: bool = True) -> None:
        if self._hooks is None:
            for text in chunks:
                self._send(fd, text)
            return
        self._queue.extend((fd, text, filtered) for text in chunks if isinstance(text, str))
        if self._queue and self._consumer is None:
            self._consumer = self._loop.create_task(self._consume())
        if len(self._queue) > self.HIGH_WATER and self.proc is not None and not self._held:
            self._held = True
            self.proc.pause_reading()

    async def _consume(self) -> None:
        assert self._hooks is not None
        try:
            while self._queue:
                fd, text, filtered = self._queue.popleft()
                out = await self._hooks.on_shell_output(self.rid, "stdout" if fd == 1 else "stderr", text) if filtered else text
                if self._cut or out is None:
                    pass  # blocked, or over --max-output after a transform: nothing more of this command
                elif out is text or not filtered:
                    self._out_room -= len(out) if out.isascii() else len(out.encode("utf-8", "replace"))  # as it came (or the notice)
                    self._send(fd, out)
                elif out:
                    self._forward(fd, out)
                if self._held and len(self._queue) < self.LOW_WATER and self.proc is not None:
                    self._held = False
                    self.proc.resume_reading()
        finally:
            self._consumer = None

    def _forward(self, fd: int, text: str) -> None:
        """Send a hook's transformed text as ``--chunk-size`` chunks, within ``--max-output``."""
        data = text.encode("utf-8", "replace")
        if len(data) > self._out_room:
            cut = max(self._out_room, 0)
            while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:  # not inside a character
                cut -= 1
            data = data[:cut]
            self._cut = True
        self._out_room -= len(data)
        chunker = OutputChunker(self.chunk_size)
        for piece in [*chunker.feed(data), *chunker.flush()]:
            self._send(fd, piece)
        if self._cut:
            self.truncated = True  # the rest of the child's output is not read (stop_output)
            self._queue.clear()
            if self.proc is not None:
                if self._held:
                    self._held = False
                    self.proc.resume_reading()
                self.proc.stop_output()
            self._send(2, f"\n[smith-fast: {_TRUNCATED.format(cap=self.cap)}]\n")

    async def settle(self) -> None:
        """Wait until every queued chunk went through the output hooks."""
        while self._consumer is not None:
            await asyncio.shield(self._consumer)

    def on_output(self, fd: int, data: bytes) -> None:
        if self.truncated:
            return  # what the pipes held when they were closed
        if len(data) > self.room:
            data = data[: self.room]
            self.truncated = True
        self.room -= len(data)
        self.emit(fd, self.chunkers[fd].feed(data))
        if self.truncated:
            self.finish()
            if self.proc is not None:
                self.proc.stop_output()
            notice = f"\n[smith-fast: {_TRUNCATED.format(cap=self.cap)}]\n"
            self.emit(2, [notice.encode()] if self.binary else [notice], filtered=False)
        elif not self._drain_scheduled:
            self._drain_scheduled = True
            self._loop.call_soon(self.drain)

    def drain(self) -> None:
        self._drain_scheduled = False
        for fd, chunker in self.chunkers.items():
            if chunker.pending:
                self.emit(fd, chunker.drain())

    def finish(self) -> None:
        """Flush both chunkers (idempotent: they are empty afterwards)."""
        for fd, chunker in self.chunkers.items():
            self.emit(fd, chunker.flush())


class _BytesChunker:
    """The binary twin of :class:`~smith_fast.chunking.OutputChunker`: bytes cut at ``size``, never decoded."""

    __slots__ = ("size", "_buf")

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf = bytearray()

    @property
    def pending(self) -> bool:
        return bool(self._buf)

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        buf, size = self._buf, self.size
        if buf:  # top up what is pending to one chunk first
            take = data[: size - len(buf)]
            buf += take
            data = data[len(take) :]
            if len(buf) < size:
                return []
            out: list[bytes | memoryview] = [bytes(buf)]
            buf.clear()
        else:
            out = []
        # Full chunks are views of the read (immutable bytes): the encoder copies them once, into the frame.
        view = memoryview(data)
        cut = len(data) - len(data) % size
        out += [view[i : i + size] for i in range(0, cut, size)]
        buf += view[cut:]
        return out

    def drain(self) -> list[bytes | memoryview]:
        return self.flush()

    def flush(self) -> list[bytes | memoryview]:
        if not self._buf:
            return []
        out: list[bytes | memoryview] = [bytes(self._buf)]
        self._buf.clear()
        return out


class _StdinAcks:
    """Tells a v1 peer how much of its stdin the command took (``ShellOutputEvent.stdin_written``),
    at most once per loop tick, so it can keep what it has in flight under ``--max-stdin-buffer``."""

    __slots__ = ("sink", "rid", "total", "scheduled", "ended", "_loop")

    def __init__(self, session: Execution, rid: str) -> None:
        self.sink = session.sink
        self.rid = rid
        self.total = 0
        self.scheduled = False
        self.ended = False
        self._loop = asyncio.get_running_loop()

    def taken(self, total: int) -> None:
        self.total = total
        if not self.scheduled and self.sink.version == 1:
            self.scheduled = True
            self._loop.call_soon(self._send)

    def _send(self) -> None:
        self.scheduled = False
        if not self.ended:  # nothing after the request's final event
            self.sink.event(pb.Event(shell_output=pb.ShellOutputEvent(request_id=self.rid, stdin_written=self.total)))


def _cancelled(rid: str, what: str) -> ProtocolError:
    return ProtocolError(f"request cancelled: {what}", pb.ERROR_CODE_UNSPECIFIED, rid, {"reason": "cancelled"})


async def run_shell_exec(session: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` for ``session`` and return its exit code (negative: killed by that signal).

    ``env`` (when given) replaces ``cmd.env``: the request's variables plus any the service adds
    (tracing). Raises ProtocolError for limits, spawn failures and timeouts.
    """
    core = session.core
    limits = core.limits
    if session.cancelling():
        raise _cancelled(rid, "the command was not started")
    pty = cmd.pty if cmd.HasField("pty") else None
    size = terminal_size(pty.rows, pty.cols, rid) if pty is not None else None
    if pty is not None:
        env = {"TERM": pty.term or "xterm-256color", **(env if env is not None else cmd.env)}
    release = process_slots.take(core, session.slots, rid)
    output = _Output(session, rid, cmd.binary_output)
    acks = _StdinAcks(session, rid)
    on_output, on_stdin = output.on_output, acks.taken
    # "Waiting for input" (service/input_wait.py): only a command the peer can type into is watched.
    watch: InputWatch | None = None
    if (cmd.open_stdin or pty is not None) and limits.input_wait_notice > 0:
        watch = InputWatch(limits.input_wait_notice, notifier(session.sink, rid))
        on_output, on_stdin = watch.hearing(on_output), watch.hearing(on_stdin)
    proc: ShellProcess | None = None
    sandbox = core.tool_context.sandbox
    confined = sandbox is not None and sandbox.confines_files
    # The session's workspace while it records this command's changes (a layer of its own from
    # before the spawn until it exited: PROTOCOL.md, "Workspaces"); None once ended.
    recording: WorkspaceOps | None = None

    def exited(code: int) -> None:
        """The final ShellOutput, with what the command changed for a peer that asked."""
        nonlocal recording
        taken, recording = recording, None
        changes = workspace_commands.end(session, taken, rid)
        if changes is None:
            session.sink.shell_output(rid, exit_code=code, finished=True)
        else:
            session.sink.shell_exit_changes(rid, code, changes)

    async def final(code: int) -> None:
        if watch is not None:
            watch.stop()  # nothing of the request after its final event
        output.finish()
        await output.settle()
        acks.ended = True
        exited(code)
        if proc is not None and proc.usage is not None:
            report_usage(session, rid, proc.usage, to_peer=session.wants("usage"))

    try:
        recording = workspace_commands.begin(session, rid)
        proc = await spawn(
            cmd.command,
            shell=cmd.shell if cmd.HasField("shell") else None,
            cwd=working_directory(core.tool_context.root, cmd.cwd if cmd.HasField("cwd") else None, confined=confined),
            env=env if env is not None else dict(cmd.env),
            on_output=on_output,
            sandbox=sandbox,
            stdin=cmd.open_stdin,
            pty=size,
            stdin_limit=limits.max_stdin_buffer,
            on_stdin=on_stdin,
            limits=limits.command_limits(),
            zygotes=session.zygotes,
            egress=open_egress(session, rid),
        )
        proc.hold_cleanup()  # its directories go after the final event (release_soon below)
        output.proc = proc
        session.process_started(rid, proc)
        if watch is not None:
            watch.watch(proc)
        if session.paused:
            proc.pause_reading()
        timeout_ms = cmd.timeout_ms if cmd.HasField("timeout_ms") else limits.default_timeout_ms
        try:
            code = await proc.wait(timeout=timeout_ms / 1000 if timeout_ms else None)
        except TimeoutError:
            code = await proc.terminate(limits.kill_grace)
            await final(code)
            raise ProtocolError(
                f"command timed out after {timeout_ms} ms; its process group was terminated (exit code {code})",
                pb.ERROR_CODE_EXECUTION_TIMEOUT,
                rid,
            ) from None
        except asyncio.CancelledError:
            # Cancelling wait() killed the group; still say how it ended if anyone listens.
            output.finish()
            acks.ended = True
            exited(proc.returncode if proc.returncode is not None else -9)
            raise
        await final(code)
        if session.cancelling():
            raise _cancelled(rid, f"the command ended with {code}")
        limit_error(proc.usage, rid)
        if session.shutting:
            raise ProtocolError(
                f"request cancelled: the session is shutting down (the command ended with {code})",
                pb.ERROR_CODE_UNSPECIFIED,
                rid,
                {"reason": "cancelled"},
            )
        return code
    finally:
        if recording is not None:  # it never exited (it did not start): its layer ends all the same
            workspace_commands.end(session, recording, rid)
        if watch is not None:
            watch.stop()
        if proc is not None:
            session.process_ended(rid, proc)
            if proc.returncode is None:
                proc.kill()
            proc.release_soon()
        release()
