"""ShellExec: run a command, stream its output as ShellOutput events, report its exit.

Output flows child pipe → ``ShellProcess`` (large non-blocking reads) → one ``OutputChunker`` per
stream → the session's sink. Full chunks go out at once; smaller reads are drained once per loop
tick, so a burst of short lines becomes one event. When the peer stops reading, the session pauses
the pipes (the child then blocks on a full pipe), so memory stays bounded.

When a hook watches output (``on_shell_output``), chunks pass through it in order on a small
queue; the pipes are paused while the queue is long, so a slow hook cannot make memory grow either.
What a hook's transform returns is chunked again to ``--chunk-size`` and counted against
``--max-output`` (a transform may make a 3-byte chunk 5 MB).
"""

from __future__ import annotations

import asyncio
import pathlib
from collections import deque
from typing import TYPE_CHECKING

from ..chunking import OutputChunker
from ..errors import ProtocolError
from ..pb import smith_pb2 as pb
from ..process import ShellProcess

if TYPE_CHECKING:
    from .execution import Execution

__all__ = ["run_shell_exec", "working_directory"]


def working_directory(root: pathlib.Path, cwd: str | None) -> str:
    """Where a ShellExec runs: ``--root`` when it names no ``cwd`` (or an empty one), a relative
    ``cwd`` taken from the root, an absolute one as it is. As with ``shell.run``, so that the two
    ways of running a command agree; unlike the tools, a ShellExec is not confined to the root.
    """
    return str(root / cwd) if cwd else str(root)


class _Output:
    """Caps, chunks and forwards one command's stdout and stderr."""

    __slots__ = (
        "sink", "rid", "chunkers", "room", "truncated", "cap", "proc", "_drain_scheduled", "_loop",
        "_hooks", "_queue", "_consumer", "_held", "chunk_size", "_out_room", "_cut",
    )

    HIGH_WATER = 64  # queued chunks waiting for an output hook before the pipes are paused
    LOW_WATER = 16

    def __init__(self, session: Execution, rid: str) -> None:
        limits = session.core.limits
        self.sink = session.sink
        self.rid = rid
        self.chunkers = {1: OutputChunker(limits.chunk_size), 2: OutputChunker(limits.chunk_size)}
        self.cap = limits.max_output
        self.room = limits.max_output
        self.chunk_size = limits.chunk_size
        self._out_room = limits.max_output  # what output hooks send: transforms can inflate it
        self._cut = False  # output hooks' output reached --max-output
        self.truncated = False
        self.proc: ShellProcess | None = None
        self._drain_scheduled = False
        self._loop = asyncio.get_running_loop()
        self._hooks = session.hooks if session.hooks.handles("on_shell_output") else None
        self._queue: deque[tuple[int, str, bool]] = deque()
        self._consumer: asyncio.Task[None] | None = None
        self._held = False

    def _send(self, fd: int, text: str) -> None:
        if fd == 1:
            self.sink.shell_output(self.rid, stdout=text)
        else:
            self.sink.shell_output(self.rid, stderr=text)

    def emit(self, fd: int, chunks: list[str], *, filtered: bool = True) -> None:
        if self._hooks is None:
            for text in chunks:
                self._send(fd, text)
            return
        self._queue.extend((fd, text, filtered) for text in chunks)
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
            self.truncated = True  # the rest of the child's output is read and discarded
            self._queue.clear()
            if self._held and self.proc is not None:
                self._held = False
                self.proc.resume_reading()
            self._send(2, f"\n[smith-fast: output truncated after {self.cap} bytes; the rest is discarded]\n")

    async def settle(self) -> None:
        """Wait until every queued chunk went through the output hooks."""
        while self._consumer is not None:
            await asyncio.shield(self._consumer)

    def on_output(self, fd: int, data: bytes) -> None:
        if self.truncated:
            return  # keep reading (the child must not block) but forward nothing more
        if len(data) > self.room:
            data = data[: self.room]
            self.truncated = True
        self.room -= len(data)
        self.emit(fd, self.chunkers[fd].feed(data))
        if self.truncated:
            self.finish()
            notice = f"\n[smith-fast: output truncated after {self.cap} bytes; the rest is discarded]\n"
            self.emit(2, [notice], filtered=False)
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


async def run_shell_exec(session: Execution, rid: str, cmd: pb.ShellExecCommand, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` for ``session`` and return its exit code (negative: killed by that signal).

    ``env`` (when given) replaces ``cmd.env``: the request's variables plus any the service adds
    (tracing). Raises ProtocolError for limits, spawn failures and timeouts.
    """
    core = session.core
    limits = core.limits
    if not core.acquire_process():
        raise ProtocolError(
            f"too many commands running (max {limits.max_processes}); try again later",
            pb.ERROR_CODE_RESOURCE_EXHAUSTED,
            rid,
        )
    output = _Output(session, rid)
    proc: ShellProcess | None = None

    async def final(code: int) -> None:
        output.finish()
        await output.settle()
        session.sink.shell_output(rid, exit_code=code, finished=True)

    try:
        proc = await ShellProcess.start(
            cmd.command,
            shell=cmd.shell if cmd.HasField("shell") else None,
            cwd=working_directory(core.tool_context.root, cmd.cwd if cmd.HasField("cwd") else None),
            env=env if env is not None else dict(cmd.env),
            on_output=output.on_output,
        )
        output.proc = proc
        session.processes.add(proc)
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
            session.sink.shell_output(rid, exit_code=proc.returncode if proc.returncode is not None else -9, finished=True)
            raise
        await final(code)
        if session.shutting:
            raise ProtocolError(
                f"request cancelled: the session is shutting down (the command ended with {code})",
                pb.ERROR_CODE_UNSPECIFIED,
                rid,
                {"reason": "cancelled"},
            )
        return code
    finally:
        if proc is not None:
            session.processes.discard(proc)
            if proc.returncode is None:
                proc.kill()
        core.release_process()
