"""The one call that creates a process for a peer (a ShellExec, a plan step, a tool's process).

Everything that decides *whether* it runs (hooks, env policy, size, slots, audit) is
:mod:`smith_fast.service.launch`, which every path goes through before it gets here; this is where
*how* it runs is decided: the sandbox (:mod:`smith_fast.sandbox`: namespaces, a private mount
view, Landlock, rlimits) wraps this call, so that no path starts a peer's process outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..containment import CommandLimits
from ..process import STDIN_LIMIT, ShellProcess
from ..sandbox import Sandbox
from ..sandbox.zygote import Zygotes

if TYPE_CHECKING:
    from .egress import RequestEgress

__all__ = ["spawn"]


async def spawn(
    command: str,
    *,
    shell: str | None,
    cwd: str,
    env: Mapping[str, str],
    on_output: Callable[[int, bytes], None],
    sandbox: Sandbox | None,
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
    stdin_limit: int = STDIN_LIMIT,
    on_stdin: Callable[[int], None] | None = None,
    limits: CommandLimits | None = None,
    zygotes: Zygotes | None = None,
    egress: RequestEgress | None = None,
) -> ShellProcess:
    """Start a peer's process: ``[shell, "-c", command]`` in ``cwd`` with ``env`` over the base
    environment, its own process group, output to ``on_output(fd, data)``, confined by ``sandbox``
    (the core's ``--sandbox``/``--network``; None only where the operator turned it off); with
    ``stdin`` or ``pty`` as :meth:`ShellProcess.start` takes them (process control), in a cgroup of its
    own under ``limits`` (:mod:`smith_fast.containment`); forked inside the session's sandbox by one
    of ``zygotes`` (the session's, :mod:`smith_fast.sandbox.zygote`) where the command can be, else
    with a sandbox of its own (None: always; a background process, which outlives its session).
    With ``egress`` (``--network allow``: :func:`smith_fast.service.egress.open_egress`), its proxy
    variables and secret placeholders are in its environment, its listener is served while it runs
    (a sandbox of its own: the listener is the command's), and its output is redacted.

    Raises:
        ProtocolError: it could not be started (:meth:`ShellProcess.start`).
    """
    if egress is None:
        return await ShellProcess.start(
            command, shell=shell, cwd=cwd, env=env, on_output=on_output, sandbox=sandbox,
            stdin=stdin, pty=pty, stdin_limit=stdin_limit, on_stdin=on_stdin, limits=limits, zygotes=zygotes,
        )
    redacted, on_end = egress.redacting(on_output)
    try:
        proc = await ShellProcess.start(
            command, shell=shell, cwd=cwd, env={**env, **egress.environment()}, on_output=redacted, on_end=on_end,
            sandbox=sandbox, stdin=stdin, pty=pty, stdin_limit=stdin_limit, on_stdin=on_stdin, limits=limits,
            egress_fd=egress.child_fd,
        )
    except BaseException:
        egress.close()
        raise
    egress.follow(proc)
    return proc
