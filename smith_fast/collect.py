"""Run a command to its end and keep its output: :func:`run_collect` (tools, hooks, plan steps).

What ``ShellExec`` streams, these collect: stdout and stderr each kept up to a bound
(:class:`CappedOutput`, also used on its own by the service's choke point), the rest read and
dropped, and what happened (:class:`Collected`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import containment
from .process_spawn import STDERR, STDOUT
from .sandbox import Sandbox
from .shell_process import TERMINATE_GRACE, ShellProcess

__all__ = ["CappedOutput", "Collected", "run_collect"]


@dataclass(frozen=True, slots=True)
class Collected:
    """What :func:`run_collect` gathered.

    Attributes:
        exit_code: the exit status, or ``-N`` if signal ``N`` killed the shell (on timeout usually
            ``-15``, or ``-9`` if it ignored SIGTERM). Always set by :func:`run_collect`.
        stdout: standard output, at most ``max_output`` bytes.
        stderr: standard error, at most ``max_output`` bytes.
        truncated: a stream produced more than ``max_output`` bytes and the rest was discarded.
        timed_out: the command ran past ``timeout`` and was terminated.
        duration_ms: wall time from spawning to the last output, in milliseconds.
        usage: what the command cost (:class:`smith_fast.containment.Usage`), when known.
    """

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool
    timed_out: bool
    duration_ms: int
    usage: containment.Usage | None = field(default=None, compare=False)  # varies run to run


class CappedOutput:
    """A command's stdout and stderr kept up to ``max_output`` bytes each; the rest is read (so the
    child never blocks) and dropped, and :attr:`truncated` says so. ``on_output`` is the
    :class:`ShellProcess` callback."""

    __slots__ = ("max_output", "truncated", "_buffers")

    def __init__(self, max_output: int) -> None:
        self.max_output = max_output
        self.truncated = False
        self._buffers = {STDOUT: bytearray(), STDERR: bytearray()}

    def on_output(self, stream: int, data: bytes) -> None:
        buf = self._buffers[stream]
        room = self.max_output - len(buf)
        if len(data) <= room:
            buf += data
        else:
            if room > 0:
                buf += data[:room]
            self.truncated = True

    @property
    def stdout(self) -> bytes:
        return bytes(self._buffers[STDOUT])

    @property
    def stderr(self) -> bytes:
        return bytes(self._buffers[STDERR])


async def run_collect(
    command: str,
    *,
    shell: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    max_output: int = 1 << 20,
    sandbox: Sandbox | None = None,
    limits: containment.CommandLimits | None = None,
) -> Collected:
    """Run a command to completion and collect its output.

    Output past ``max_output`` bytes per stream is read (so the child never blocks) and discarded.
    On timeout the group gets SIGTERM, then SIGKILL after :data:`TERMINATE_GRACE` seconds.

    Args:
        command: the command line, run as ``[shell, "-c", command]``.
        shell: the shell; ``None`` means :data:`DEFAULT_SHELL`.
        cwd: the working directory; ``None`` means the service's own.
        env: variables layered over :func:`base_environment`.
        timeout: seconds before the command is terminated; ``None`` for no limit.
        max_output: the most bytes kept of each of stdout and stderr.
        sandbox: confine the command (see :meth:`ShellProcess.start`).
        limits: what the command may use (:mod:`smith_fast.containment`).

    Returns:
        The exit code, both outputs and what happened.

    Raises:
        ProtocolError: the command could not be started (see :meth:`ShellProcess.start`).
        asyncio.CancelledError: the caller was cancelled; the group was killed first.
    """
    output = CappedOutput(max_output)
    started = time.monotonic()
    proc = await ShellProcess.start(command, shell=shell, cwd=cwd, env=env, on_output=output.on_output, sandbox=sandbox, limits=limits)
    timed_out = False
    try:
        try:
            code = await proc.wait(None if timeout is None else max(timeout, 0.0))
        except TimeoutError:
            timed_out = proc.returncode is None  # else it exited in time and only output was in flight
            code = await proc.terminate(TERMINATE_GRACE)
    except BaseException:
        proc.close()
        raise
    return Collected(
        exit_code=code,
        stdout=output.stdout,
        stderr=output.stderr,
        truncated=output.truncated,
        timed_out=timed_out,
        duration_ms=int((time.monotonic() - started) * 1000),
        usage=proc.usage,
    )
