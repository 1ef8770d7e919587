"""A command running on a Smith service, as the SDK sees it (``Client.start``), and typed views of events.

:class:`RemoteProcess` is one ShellExec in flight: write its stdin, resize its terminal, cancel it,
read its output as :class:`Chunk` objects (``async for chunk in proc``) and wait for its exit code.
Leaving the ``async for`` early, :meth:`RemoteProcess.aclose`, or cancelling the task that awaits
it sends a ``CancelCommand``, so nothing is left running on the service.

The accessors below (:func:`stdout_of`, :func:`exit_code_of`, :func:`terminal_state`, ...) read
events without ``WhichOneof``; :class:`ToolOutput` is a tool result with its JSON parsed.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from .client_workspace import Change, changes_of
from .errors import SmithFastError
from .pb import smith_pb2 as pb

__all__ = [
    "CONTROL_REASONS",
    "STDIN_WINDOW",
    "Chunk",
    "InputWait",
    "RemoteProcess",
    "RunResult",
    "ToolOutput",
    "error_of",
    "exit_code_of",
    "stderr_of",
    "stdout_of",
    "terminal_state",
    "cancel_command",
]

CONTROL_REASONS = frozenset({"stdin_full", "stdin_closed", "no_terminal", "not_running", "unknown_request"})
"""``ErrorEvent.details["reason"]`` of a refused control command (stdin, resize, cancel): the
request goes on, so these are not its error."""

_TERMINAL = (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR)


# ---- typed accessors ------------------------------------------------------------------------------


def stdout_of(event: pb.Event) -> bytes | None:
    """The standard output an event carries (text or ``stdout_bytes``), as bytes; None if none."""
    if event.WhichOneof("event_type") != "shell_output":
        return None
    so = event.shell_output
    if so.HasField("stdout_bytes"):
        return so.stdout_bytes
    return so.stdout.encode() if so.HasField("stdout") else None


def stderr_of(event: pb.Event) -> bytes | None:
    """The standard error an event carries, as bytes; None if none."""
    if event.WhichOneof("event_type") != "shell_output":
        return None
    so = event.shell_output
    if so.HasField("stderr_bytes"):
        return so.stderr_bytes
    return so.stderr.encode() if so.HasField("stderr") else None


def exit_code_of(event: pb.Event) -> int | None:
    """The exit code of a final ShellOutput; None for any other event."""
    if event.WhichOneof("event_type") != "shell_output" or not event.shell_output.HasField("exit_code"):
        return None
    return event.shell_output.exit_code


def terminal_state(event: pb.Event) -> int | None:
    """``SERVICE_STATE_READY`` or ``SERVICE_STATE_ERROR`` if ``event`` ends its request, else None."""
    if event.WhichOneof("event_type") == "state_change" and event.state_change.state in _TERMINAL:
        return event.state_change.state
    return None


def error_of(event: pb.Event) -> pb.ErrorEvent | None:
    return event.error if event.WhichOneof("event_type") == "error" else None


def cancel_command(rid: str) -> pb.Command:
    return pb.Command(cancel=pb.CancelCommand(request_id=rid))


# ---- results --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a command's output.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"`` (a terminal's output is all ``"stdout"``).
        data: the bytes (exact with ``binary_output``, the default of :meth:`Client.start`).
    """

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class InputWait:
    """The service's "waiting for input" notice (PROTOCOL.md): the command sleeps reading its stdin
    or terminal and printed nothing for ``idle_ms``.

    Attributes:
        pid: the process (on the service's host) that is reading.
        tty: it reads its terminal (a command started with ``pty``), else its stdin pipe.
        idle_ms: at least this long without output or input.
        fd: the file descriptor it reads.
        call: how it waits: ``read``, ``select``, ``poll``, ``epoll`` (or ``wchan``: seen from the
            kernel's wait channel, fd 0).
        message: the notice's text.
    """

    pid: int
    tty: bool
    idle_ms: int
    fd: int
    call: str
    message: str

    @classmethod
    def of(cls, event: pb.Event) -> InputWait | None:
        """The notice an event is, or None."""
        if event.WhichOneof("event_type") != "log" or event.log.fields.get("reason") != "waiting_for_input":
            return None
        f = event.log.fields

        def number(key: str) -> int:
            try:
                return int(f.get(key, "0"))
            except ValueError:
                return 0

        return cls(number("pid"), f.get("tty") == "true", number("idle_ms"), number("fd"), f.get("call", ""), event.log.message)


@dataclass(frozen=True, slots=True)
class RunResult:
    """What :meth:`Client.run` collected (as :class:`subprocess.CompletedProcess`).

    ``changes``: what the command changed in the session's workspace, when the client accepted
    ``changes`` in its handshake and the service recorded them (PROTOCOL.md, "Workspaces"); else None.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    changes: list[Change] | None = None

    @property
    def text(self) -> str:
        """stdout as text."""
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool result with its JSON parsed.

    Attributes:
        success: whether the tool succeeded.
        value: ``result`` parsed as JSON (None when it is empty).
        raw: ``result`` as sent.
        error: the tool's error message when it failed.
        duration_ms: how long it ran.
        changes: what an ``fs.write`` changed in the session's workspace, for a client that
            accepted ``changes`` (PROTOCOL.md, "Workspaces"); else None.
    """

    success: bool
    value: Any
    raw: bytes
    error: str | None
    duration_ms: int
    changes: list[Change] | None = None

    @classmethod
    def of(cls, result: pb.ToolResultEvent) -> ToolOutput:
        value = json.loads(result.result) if result.result else None
        changes = changes_of(result.changes.changes) if result.HasField("changes") else None
        return cls(result.success, value, result.result, result.error if result.HasField("error") else None, result.duration_ms, changes)


# ---- a running command ----------------------------------------------------------------------------


STDIN_WINDOW = 256 * 1024
"""Bytes of stdin :meth:`RemoteProcess.drain` lets be in flight (sent, not yet taken by the
command): under the service's ``--max-stdin-buffer`` (1 MiB by default), so writes are never refused."""


class RemoteProcess:
    """A ShellExec running on the service (made by :meth:`Client.start`).

    Its events are read by a task of its own as they arrive: output waits in :meth:`__aiter__`'s
    buffer until read.

    Args:
        rid: its request id.
        send: sends a command on the client's connection.
        events: its events, as the client routes them (None: the connection ended).
        closed: makes the client's ConnectionClosed (when the connection ended).
        error: makes the exception for its ErrorEvent (the client's ``SmithError``).
        done: called once it ended (the client drops its route).
        window: see :data:`STDIN_WINDOW`; 0 turns :meth:`drain` off (a v0 service sends no
            ``stdin_written``).
        target: the id its stdin, resizes and :meth:`cancel` address, when that is not ``rid``: an
            attached background process (``Client.attach``; ``rid`` is the attach request). Then
            leaving it early (``break``, :meth:`aclose`, a cancelled wait) detaches, and the process
            runs on; :meth:`cancel` stops the process.

    Attributes:
        exit_code: set once the command exited (negative: killed by that signal).
        changes: what it changed in the session's workspace, from its final event (a client that
            accepted ``changes``; PROTOCOL.md, "Workspaces"); None until then, or without.
        changes_exact: False when another request ran at the same time, so that its changes may
            be mixed in.
        control_errors: what the service refused of :meth:`write` / :meth:`resize` (``stdin_full``:
            the command has not read ``--max-stdin-buffer`` bytes yet; the request goes on).
        waiting_for_input: the service's latest "waiting for input" notice while it holds: the
            command is asleep reading its stdin or terminal (cleared by its next output and by
            :meth:`write`); :meth:`input_wanted` waits for one. Sent for commands with ``stdin`` or
            ``pty`` after the service's ``--input-wait-notice``.
        input_waits: every notice so far, in order.
    """

    def __init__(
        self,
        rid: str,
        *,
        send: Callable[[pb.Command], None],
        events: asyncio.Queue[pb.Event | None],
        closed: Callable[[], BaseException],
        error: Callable[[pb.ErrorEvent], BaseException],
        done: Callable[[], None],
        window: int = STDIN_WINDOW,
        target: str | None = None,
    ) -> None:
        self.request_id = rid
        self.target = target or rid
        self._send = send
        self._events = events
        self._closed = closed
        self._error = error
        self._done_cb = done
        self._window = window
        self.exit_code: int | None = None
        self.changes: list[Change] | None = None
        self.changes_exact = True
        self.control_errors: list[pb.ErrorEvent] = []
        self.waiting_for_input: InputWait | None = None
        self.input_waits: list[InputWait] = []
        self._buffer: deque[Chunk] = deque()
        self._failure: pb.ErrorEvent | None = None
        self._state: int | None = None
        self._lost = False  # the connection ended first
        self._cancel_sent = False
        self._stdin_sent = 0
        self._stdin_taken = 0
        self._stdin_failed = False
        self._changed = asyncio.Condition()
        self._pump = asyncio.get_running_loop().create_task(self._read())

    @property
    def done(self) -> bool:
        """The request has ended (its terminal state arrived, or the connection ended)."""
        return self._state is not None or self._lost

    # -- events ------------------------------------------------------------------------------------

    async def _read(self) -> None:
        while not self.done:
            event = await self._events.get()
            if event is None:
                self._lost = True
                self._done_cb()
            else:
                self._handle(event)
            async with self._changed:
                self._changed.notify_all()

    def _handle(self, event: pb.Event) -> None:
        kind = event.WhichOneof("event_type")
        if kind == "shell_output":
            so = event.shell_output
            if (data := stdout_of(event)) is not None and data:
                self._buffer.append(Chunk("stdout", data))
                self.waiting_for_input = None
            if (data := stderr_of(event)) is not None and data:
                self._buffer.append(Chunk("stderr", data))
                self.waiting_for_input = None
            if (code := exit_code_of(event)) is not None:
                self.exit_code = code
            if so.HasField("changes"):  # the final event, to a client that accepted them
                self.changes = changes_of(so.changes.changes)
                self.changes_exact = so.changes.exact
            if so.HasField("stdin_written"):
                self._stdin_taken = max(self._stdin_taken, so.stdin_written)
        elif kind == "error":
            if event.error.details.get("reason") in CONTROL_REASONS:
                self.control_errors.append(event.error)
                self._stdin_failed = self._stdin_failed or event.error.details.get("reason") in ("stdin_full", "stdin_closed")
            else:
                self._failure = event.error
        elif (wait := InputWait.of(event)) is not None:
            self.waiting_for_input = wait
            self.input_waits.append(wait)
        elif (state := terminal_state(event)) is not None:
            self._state = state
            self.waiting_for_input = None
            self._done_cb()

    async def _until(self, ready: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: ready() or self.done)

    # -- input -------------------------------------------------------------------------------------

    def write(self, data: bytes | str) -> None:
        """Send ``data`` to the command's stdin (or terminal: ``"\x03"`` is Ctrl-C).

        Does not wait: a writer of much data awaits :meth:`drain` between writes (or uses
        :meth:`send`), so what is in flight stays under the service's ``--max-stdin-buffer``."""
        if isinstance(data, str):
            data = data.encode()
        if data and not self.done:
            self.waiting_for_input = None
            self._stdin_sent += len(data)
            self._send(pb.Command(stdin=pb.StdinCommand(request_id=self.target, data=data)))

    async def input_wanted(self) -> InputWait | None:
        """Wait until the command is waiting for input (the service's notice, :attr:`waiting_for_input`);
        None if it ended first. Returns at once while a notice holds."""
        await self._until(lambda: self.waiting_for_input is not None)
        return self.waiting_for_input

    async def drain(self, room: int = 0) -> None:
        """Wait until ``room`` more bytes fit in the window of stdin not yet taken by the command
        (or it ended).

        Raises:
            SmithError: the service refused stdin (``stdin_full``: more was in flight than its
                ``--max-stdin-buffer``; ``stdin_closed``: the command closed it).
        """
        if self._window:
            await self._until(lambda: self._stdin_sent - self._stdin_taken + room <= self._window or self._stdin_failed)
        if self._stdin_failed:
            raise self._error(next(e for e in self.control_errors if e.details.get("reason") in ("stdin_full", "stdin_closed")))

    async def send(self, data: bytes | str) -> None:
        """:meth:`write` in pieces of at most half the window, each once it fits (:meth:`drain`)."""
        if isinstance(data, str):
            data = data.encode()
        step = max(self._window // 2, 1) if self._window else len(data) or 1
        for i in range(0, len(data), step):
            piece = data[i : i + step]
            await self.drain(len(piece))
            self.write(piece)

    def close_stdin(self) -> None:
        """End of input (on a terminal: ^D)."""
        if not self.done:
            self.waiting_for_input = None
            self._send(pb.Command(stdin=pb.StdinCommand(request_id=self.target, eof=True)))

    def resize(self, rows: int, cols: int) -> None:
        """New terminal size (a command started with ``pty``)."""
        if not self.done:
            self._send(pb.Command(resize=pb.ResizeCommand(request_id=self.target, rows=rows, cols=cols)))

    def cancel(self) -> None:
        """Ask the service to cancel the command (SIGTERM, then SIGKILL after its grace); :meth:`wait`
        then raises the cancellation's :class:`SmithError`. Harmless when already asked or ended."""
        if self.done or self._cancel_sent:
            return
        self._cancel_sent = True
        try:
            self._send(cancel_command(self.target))
        except (SmithFastError, ConnectionError, RuntimeError):  # the connection is gone: so is the command
            pass

    def detach(self) -> None:
        """Stop following an attached background process (``Client.attach``): its request ends,
        the process runs on. For a plain ShellExec this is :meth:`cancel`."""
        if self.target == self.request_id:
            self.cancel()
            return
        if self.done or self._cancel_sent:
            return
        self._cancel_sent = True
        try:
            self._send(cancel_command(self.request_id))
        except (SmithFastError, ConnectionError, RuntimeError):
            pass

    # -- output ------------------------------------------------------------------------------------

    async def _iterate(self) -> AsyncIterator[Chunk]:
        try:
            while True:
                while self._buffer:
                    yield self._buffer.popleft()
                if self.done:
                    if self._lost:
                        raise self._closed()
                    return
                await self._until(lambda: bool(self._buffer))
        finally:
            if not self.done:  # left early (break, aclose, a cancelled task): stop it (or detach) on the service
                self.detach()

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._iterate()

    async def wait(self) -> int:
        """Wait for the command to end; returns its exit code.

        Output not read with ``async for`` is kept for :meth:`output`. Cancelling the waiting task
        cancels the command on the service.

        Raises:
            SmithError: the request ended with an error (timeout, cancelled, refused ...).
            ConnectionClosed: the connection ended first.
        """
        try:
            await self._until(lambda: False)
        except asyncio.CancelledError:
            self.detach()
            raise
        if self._lost:
            raise self._closed()
        if self._state == pb.SERVICE_STATE_ERROR:
            raise self._error(self._failure or pb.ErrorEvent(request_id=self.request_id, message="the request ended with an error"))
        return self.exit_code if self.exit_code is not None else 0

    def output(self) -> RunResult:
        """The output not read with ``async for`` (stdout and stderr joined)."""
        out = b"".join(c.data for c in self._buffer if c.stream == "stdout")
        err = b"".join(c.data for c in self._buffer if c.stream == "stderr")
        return RunResult(self.exit_code if self.exit_code is not None else 0, out, err, self.changes)

    async def aclose(self) -> None:
        """Cancel the command unless it ended (detach from an attached one), and wait for its end
        (its error, if any, is not raised)."""
        if self.done:
            return
        self.detach()
        try:
            await self.wait()
        except (SmithFastError, ConnectionError):
            pass

    async def __aenter__(self) -> RemoteProcess:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
