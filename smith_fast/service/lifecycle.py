"""What every long-running command does around its work: ``serve``, ``worker`` and ``gateway``.

:func:`running` raises the open-file limit to what the limits need (:mod:`smith_fast.open_files`),
starts the child guard (when the process runs commands), loads the global hooks and the tracing
exporter, and on the way out stops every process group left and closes the hooks and the exporter;
:func:`stop_on_signals` is the event SIGTERM/SIGINT set. What the process that started
this one left in its signals is undone for the commands (:func:`reset_inherited_signals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import resource
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from .. import childguard, containment, open_files, tracing
from ..errors import StartupError
from ..hooks import Hook, HookLimits, HookLoadError, load_hook_file
from ..logs import get_logger
from .config import Limits

__all__ = ["INHERITED_IGNORES", "HookHost", "StartupError", "raise_open_files", "reset_inherited_signals", "running",
           "stop_on_signals"]

log = get_logger("smith_fast.lifecycle")

INHERITED_IGNORES = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
"""Signals a service is often started with ignored: SIGINT and SIGQUIT by a script's ``cmd &`` (a
shell without job control ignores both for what it starts in the background), SIGHUP by ``nohup``.
An ignored signal stays ignored across fork and exec, so every command run outside the sandbox
(whose init sets every signal to its default) would inherit it: ``kill -INT``, ``-QUIT`` or
``-HUP`` of the command would do nothing, nor Ctrl-\\ on its terminal."""


class HookHost(Protocol):
    """What :func:`running` needs of a core: where global hooks go and the limits they load with."""

    global_hooks: list[Hook]
    hook_limits: HookLimits


def reset_inherited_signals(loop: asyncio.AbstractEventLoop) -> dict[str, str]:
    """Undo what the process that started this one left in its signals, which every command run
    outside the sandbox (whose init resets them all) would inherit across fork and exec:

    * blocked signals are unblocked (a launcher's mask would also hold SIGTERM back from this
      process, which then could not be stopped);
    * each of :data:`INHERITED_IGNORES` that is ignored gets a handler that does nothing: this
      process goes on ignoring it, and its commands get it at its default (an exec resets a
      handled signal, and keeps an ignored one).

    Returns what it changed (signal names, comma-separated, under ``unblocked`` and ``ignored``)."""
    changed: dict[str, str] = {}
    blocked = signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if blocked:
        changed["unblocked"] = _names(sorted(blocked))
    ignored = [sig for sig in INHERITED_IGNORES if signal.getsignal(sig) == signal.SIG_IGN]
    for sig in ignored:
        loop.add_signal_handler(sig, _still_ignored)
    if ignored:
        changed["ignored"] = _names(ignored)
    return changed


def _still_ignored() -> None:
    pass


def _names(signals: Iterable[int]) -> str:
    return ",".join(_name(sig) for sig in signals)


def _name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {int(sig)}"


def stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set (on the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def raise_open_files(limits: Limits, runs_commands: bool, sessions: tuple[str, int] | None = None) -> open_files.Raised:
    """Raise the soft open-file limit to what ``limits`` need (:func:`smith_fast.open_files.raise_for`);
    a hard limit below that is said once, as a warning with the sessions it holds and what to do.
    ``sessions``: the flag that bounds the sessions and its value, when not ``--max-connections``
    (a worker's sessions come over NATS: ``--max-sessions``)."""
    flag, count = sessions or ("--max-connections", limits.max_connections)
    processes = limits.max_processes + limits.max_background if runs_commands else 0
    raised = open_files.raise_for(count, processes)
    fields = {"soft": raised.after, "started_with": raised.before,
              "hard": "unlimited" if raised.hard == resource.RLIM_INFINITY else raised.hard,
              "needed": raised.needed, flag.removeprefix("--").replace("-", "_"): count}
    if raised.short:
        log.warning(f"the open-file limit ({raised.after}) is below what {flag} {count} needs (about {raised.needed}): "
                    f"past about {raised.sessions(processes)} busy sessions, commands fail with 'Too many open files' "
                    "and new connections are closed unanswered",
                    extra={"fields": {**fields, "remedy": "raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, "
                                                          f"docker run --ulimit nofile=) or lower {flag}"}})
    elif raised.after > raised.before:
        log.debug("open-file limit raised; commands get the one the service started with", extra={"fields": fields})
    return raised


@contextlib.asynccontextmanager
async def running(core: HookHost, hook_files: Iterable[pathlib.Path], *, runs_commands: bool,
                  unsandboxed: bool = False, limits: Limits | None = None,
                  sessions: tuple[str, int] | None = None) -> AsyncIterator[None]:
    """Start-up before the body, shutdown after it, the same for every command.

    Args:
        core: gets the global hooks (``--hook``), loaded before the body runs.
        hook_files: the hooks to load; one that does not load stops the start.
        runs_commands: this process runs shell commands: arm the child guard (it starts with
            the first command), so that a SIGKILLed service leaves none running, and stop every
            group left at the end.
        unsandboxed: its commands run outside the sandbox (``--sandbox off``): the start-up says
            when the host makes such a command wait for its cgroup move.
        limits: the process's limits, whose connections and processes need open files
            (:func:`raise_open_files`); None leaves the open-file limit as it is.
        sessions: what bounds the sessions, when not ``--max-connections`` (:func:`raise_open_files`).

    Raises:
        StartupError: a hook did not load.
    """
    if limits is not None:
        raise_open_files(limits, runs_commands, sessions)
    if changed := reset_inherited_signals(asyncio.get_running_loop()):
        log.debug("started with signals blocked or ignored: unblocked; the ignored still ignored here, at their "
                  "defaults in commands", extra={"fields": changed})
    if runs_commands:
        # made now, so a hierarchy we cannot write shows at start-up rather than at the first command
        contained = containment.available()
        log.debug("command containment", extra={"fields": contained})
        missing = containment.shortfall()
        if missing:  # the limits a deployment asked for, which this host does not let the service keep
            log.warning("commands are not bounded as configured: " + "; ".join(missing),
                        extra={"fields": {"cgroups": contained["cgroups"],
                                          "remedy": "run the service as root, or give it a cgroup of its own to manage "
                                                    "(systemd: Delegate=yes)"}})
        # The guard is started by the first process it guards (not on the way to the first
        # answer); it then also removes the cells' parents at the end, if we could not (SIGKILL).
        childguard.arm(containment.cell_parents())
        if unsandboxed and containment.slow_moves():  # containment.py, "Moves wait, or not": what a deployment
            # can fix, said once (info: a cost of the host's, nothing wrong with the service; `smith-fast exec`'s own
            # server, at warning, says nothing)
            mounts = containment.cgroup_mounts()
            point = next((m[0] for m in mounts if m[2] == "cgroup2"), mounts[0][0])
            log.info("an unsandboxed command starts 5-10 ms late after an idle moment: the service steps into its cgroup "
                     "v2 cell by a move of its whole process, and no cgroup mount has favordynmods, so the kernel makes "
                     "the move wait for an RCU grace period (a sandboxed command is born in its cell without that wait)",
                     extra={"fields": {"cgroup2": point,
                                       "remedy": f"mount -o remount,favordynmods {point} (any cgroup mount; Linux >= 6.0)"}})
    try:
        for path in hook_files:
            try:
                core.global_hooks.append(await load_hook_file(path, limits=core.hook_limits))
            except HookLoadError as exc:
                raise StartupError(f"--hook {exc}") from None
            log.info("global hook loaded", extra={"fields": {"hook": str(path), "hook_id": core.global_hooks[-1].id}})
        if tracing.setup_from_env():
            log.info("tracing exporter configured from OTEL_* variables")
        yield
    finally:
        # The process stack is imported by the first command that starts a process: not imported, none to
        # kill (importing it here cost a service that ran no command ~5 ms on its way out).
        started = sys.modules.get("smith_fast.shell_process") if runs_commands else None
        if started is not None:
            started.kill_all()
        for hook in core.global_hooks:
            with contextlib.suppress(Exception):
                await hook.close()
        tracing.shutdown()
