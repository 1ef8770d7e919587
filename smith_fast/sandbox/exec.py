"""The exec wrapper: restrict this process, then ``exec`` the command.

``python -I -S .../smith_fast/sandbox/exec.py [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] -- PROGRAM ARG...``
(also ``python -m smith_fast.sandbox.exec``). The service spawns commands through it so that the
restriction happens in the child between fork and exec without running Python code in a forked
copy of the threaded service (``preexec_fn`` is not safe there). Order: the network namespace
(``unshare`` needs a single-threaded process, and must precede ``no_new_privs``-style lockdown of
``/proc/self/uid_map``), then Landlock (``PR_SET_NO_NEW_PRIVS`` + ``landlock_restrict_self``),
then ``execv``. Any failure ends the wrapper with status 126 and one line on stderr: nothing runs
unrestricted (fail closed). ``--probe`` applies the restriction and exits 0 instead of running
anything: the service's start-up check.

Standard library only, and the siblings are loaded by path, so ``-S`` (no site-packages) works:
that keeps the cost of a sandboxed start to an interpreter start-up (see bench/bench_sandbox.py).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:
    from . import landlock, netns
else:  # run by path with -I -S: no package, no site-packages
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import landlock
    import netns

    del sys.path[0]

READ = landlock.FS_EXECUTE | landlock.FS_READ_FILE | landlock.FS_READ_DIR
DEVICE = landlock.FS_READ_FILE | landlock.FS_WRITE_FILE | landlock.FS_TRUNCATE | landlock.FS_IOCTL_DEV
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/random", "/dev/urandom")
"""Device files every sandboxed command may read, write and ioctl (``> /dev/null``, terminals)."""
TERMINALS = "/dev/pts"
FAILED = 126
NOT_FOUND = 127


def _die(message: str, code: int = FAILED) -> None:
    os.write(2, f"smith-fast sandbox: {message}\n".encode("utf-8", "replace"))
    os._exit(code)


def _parse(argv: list[str]) -> tuple[list[str], list[str], bool, str, bool, list[str]]:
    writable: list[str] = []
    readable: list[str] = []
    fs, network, probe = True, "on", False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return writable, readable, fs, network, probe, argv[i + 1 :]
        if arg == "--probe":
            probe = True
            i += 1
            continue
        if i + 1 >= len(argv):
            break
        value = argv[i + 1]
        if arg == "--write":
            writable.append(value)
        elif arg == "--read":
            readable.append(value)
        elif arg == "--fs" and value in ("on", "off"):
            fs = value == "on"
        elif arg == "--network" and value in ("on", "off", "loopback"):
            network = value
        else:
            break
        i += 2
    if probe:
        return writable, readable, fs, network, probe, []
    _die(f"usage: exec.py [--write DIR]... [--read PATH]... [--fs on|off] [--network on|off|loopback] [--probe] -- PROGRAM ARG... (at {argv[i:i+1]})", 2)
    raise AssertionError("unreachable")


def apply(writable: list[str], *, fs: bool, network: str, readable: list[str] | None = None) -> None:
    """Restrict this process: network namespace first, then Landlock.

    ``readable``: what may be read and executed; empty or None: everything beneath ``/``.

    Raises:
        OSError: the kernel refused a step.
    """
    if network != "on":
        netns.enter(loopback=network == "loopback")
    abi = landlock.abi_version()
    if not fs and network != "off":
        return
    if abi < 1:
        raise landlock.LandlockError(0, "the kernel has no Landlock")
    # --read paths are not followed: one swapped for a symlink after the service listed it
    # must not grant what the link points to.
    rules: list[tuple[str, int, bool]] = [(path, READ, False) for path in readable] if readable else [("/", READ, True)]
    rules += [(path, DEVICE, True) for path in DEVICES]
    rules.append((TERMINALS, DEVICE | landlock.FS_READ_DIR, True))
    rules += [(path, landlock.fs_rights(abi), True) for path in writable]
    scopes = landlock.SCOPE_SIGNAL if fs else 0
    if network != "on":
        scopes |= landlock.SCOPE_ABSTRACT_UNIX_SOCKET
    landlock.restrict(abi, rules, handle_fs=fs, deny_tcp=network == "off", scopes=scopes)


def main(argv: list[str]) -> None:
    writable, readable, fs, network, probe, command = _parse(argv)
    try:
        apply(writable, fs=fs, network=network, readable=readable)
    except OSError as exc:
        _die(f"cannot restrict the command: {exc.strerror or exc}")
    if probe:
        os._exit(0)
    # The interpreter ignores SIGPIPE (and SIGXFSZ) at start-up, and an ignored signal stays ignored
    # across exec: without this, `yes | head` in a command would print "Broken pipe" instead of
    # ending quietly as it does outside the sandbox (and under the C wrapper).
    for name in ("SIGPIPE", "SIGXFSZ"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _die(f"cannot run {command[0]!r}: {exc.strerror or exc}", NOT_FOUND if isinstance(exc, FileNotFoundError) else FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
