"""Sandboxes for the processes the service starts on a peer's behalf (PROTOCOL.md, "Sandbox").

A :class:`Sandbox` is a value: the mode (``workspace-write``, ``read-only``, ``off``), the network
(``on``, ``off``, ``loopback``) and the workspace root. :meth:`Sandbox.wrap` turns a command's argv
into one that starts with the exec wrapper (:mod:`smith_fast.sandbox.exec`), which restricts
itself with Landlock (and, for the network, a private user + network namespace) and then execs
the command; :mod:`smith_fast.sandbox.spawner` applies the same policy in the child itself, with no wrapper
in between, where it can (``--network on``, the C build); :meth:`Sandbox.check` is the service's start-up check, which fails closed with
:class:`SandboxUnavailable` when the kernel lacks what the mode needs.

Kernel features each setting needs:

| setting | needs |
|---|---|
| ``--sandbox workspace-write`` / ``read-only`` | Landlock ABI >= 3 (Linux 6.2: truncation is a right only from ABI 3) |
| ``--network off`` | unprivileged user namespaces (``CLONE_NEWUSER``) with network namespaces; Landlock ABI 4 adds TCP bind/connect denial when present |
| ``--network loopback`` | unprivileged user + network namespaces |
| ``--sandbox off --network on`` | nothing: no wrapper at all |

``SMITH_FAST_SANDBOX_HIDE=landlock,userns`` makes the probe report those features missing, so the
refusal can be tested on a kernel that has them (it can only make the service refuse to start).
"""

from __future__ import annotations

import atexit
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._compat import NO_EXTENSIONS
from ..errors import SmithFastError
from . import landlock

__all__ = [
    "MIN_LANDLOCK_ABI",
    "MODES",
    "NETWORKS",
    "Sandbox",
    "SandboxUnavailable",
    "default_wrapper",
    "kernel_features",
    "make_scratch",
    "prepare_scratch",
    "read_grants",
]

MODES = ("workspace-write", "read-only", "off")
NETWORKS = ("on", "off", "loopback")
MIN_LANDLOCK_ABI = 3
HIDE_ENV = "SMITH_FAST_SANDBOX_HIDE"
WRAPPER = str(pathlib.Path(__file__).with_name("exec.py"))
"""The exec wrapper, run by path as ``python -I -S WRAPPER`` (no site-packages to import)."""
HELPER = str(pathlib.Path(__file__).with_name("sandbox-exec"))
"""The same wrapper in C (``csrc/sandbox_exec.c``), built by ``setup.py``; used when present."""


class SandboxUnavailable(SmithFastError):
    """The kernel lacks what the requested sandbox needs; the service refuses to start."""


@dataclass(frozen=True, slots=True)
class KernelFeatures:
    """What the probe found.

    Attributes:
        landlock_abi: the Landlock ABI (0: none).
        userns: unprivileged user namespaces look available (checked for real by the trial run).
    """

    landlock_abi: int
    userns: bool


def kernel_features() -> KernelFeatures:
    """Probe the running kernel (cheap: one system call and a sysctl), honouring ``SMITH_FAST_SANDBOX_HIDE``."""
    hidden = {name.strip() for name in os.environ.get(HIDE_ENV, "").split(",")}
    abi = 0 if "landlock" in hidden else landlock.abi_version()
    userns = "userns" not in hidden
    if userns:
        try:
            userns = int(pathlib.Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
        except (OSError, ValueError):
            userns = False
    return KernelFeatures(abi, userns)


_spare_scratch: list[str] = []


def make_scratch() -> str:
    """A fresh private (0700) temporary directory for one request: its ``TMPDIR`` (the empty one
    :func:`prepare_scratch` made, if there is one)."""
    while _spare_scratch:
        path = _spare_scratch.pop()
        if os.path.isdir(path) and not os.path.islink(path):  # (a /tmp cleaner may have taken it)
            return path
    return tempfile.mkdtemp(prefix="smith-fast-req-")


def prepare_scratch() -> None:
    """Make the next request's temporary directory now, while nothing waits for it (one at
    most; removed at exit)."""
    if not _spare_scratch:
        _spare_scratch.append(tempfile.mkdtemp(prefix="smith-fast-req-"))


@atexit.register
def _remove_spare_scratch() -> None:
    while _spare_scratch:
        remove_scratch(_spare_scratch.pop())


def remove_scratch(path: str | None) -> None:
    """Remove a request's temporary directory and everything in it (errors ignored)."""
    if path:
        try:
            os.rmdir(path)  # most commands leave it empty: one system call instead of rmtree's walk
        except OSError:
            shutil.rmtree(path, ignore_errors=True)


PYTHON_WRAPPER: tuple[str, ...] = (sys.executable, "-I", "-S", WRAPPER)
"""How the Python exec wrapper is started: no site-packages, no environment-driven imports."""


def read_grants(denied: Sequence[str]) -> list[str]:
    """What to grant read on so that everything but ``denied`` (and what lies beneath) is readable.

    Landlock only grants, beneath a path; so for each directory on the way from ``/`` to a denied
    path, each of its entries but the next step is granted instead of ``/`` as a whole. A snapshot:
    entries created later in those directories are not readable, and those directories themselves
    cannot be listed (looking names up in them still works: Landlock does not control it).
    """
    blocked = {os.path.realpath(path) for path in denied}
    ancestors: set[str] = set()
    for path in blocked:
        parent = os.path.dirname(path)
        while True:
            ancestors.add(parent)
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    grants: list[str] = []
    for parent in sorted(ancestors):
        if parent in blocked:
            continue
        try:
            names = sorted(os.listdir(parent))
        except OSError:  # not there (yet): nothing in it to grant
            continue
        for name in names:
            child = os.path.join(parent, name)
            # A symlink needs no grant (what it leads to is judged where it is), and granting it
            # would grant its target: /tmp/pytest-current -> a directory holding a denied path.
            if child not in blocked and child not in ancestors and not os.path.islink(child):
                grants.append(child)
    return grants


def default_wrapper() -> tuple[str, ...]:
    """The C helper when it was built (and ``SMITH_FAST_NO_EXTENSIONS`` is not set, which picks
    the Python twins everywhere), else the Python wrapper."""
    return (HELPER,) if not NO_EXTENSIONS and os.access(HELPER, os.X_OK) else PYTHON_WRAPPER


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How the processes started for peers are confined.

    Attributes:
        mode: ``workspace-write`` (write only under ``root`` and the request's temporary
            directory), ``read-only`` (only the temporary directory) or ``off``.
        network: ``on``, ``off`` (no network at all, loopback included) or ``loopback`` (a
            private loopback only).
        root: the workspace root (resolved).
        wrapper: the exec wrapper's argv prefix; empty: :func:`default_wrapper`.
        deny_read: paths whose contents commands may not read (``--sandbox-deny-read``; see
            :func:`read_grants` for what that costs); needs a mode other than ``off``.
    """

    mode: str = "workspace-write"
    network: str = "on"
    root: str = "/"
    wrapper: tuple[str, ...] = field(default=(), compare=False)
    deny_read: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, not {self.network!r}")
        if self.deny_read and self.mode == "off":
            raise ValueError("--sandbox-deny-read needs --sandbox workspace-write or read-only, not off")
        if not self.wrapper:
            object.__setattr__(self, "wrapper", default_wrapper())

    @property
    def active(self) -> bool:
        """Whether processes go through the wrapper at all."""
        return self.mode != "off" or self.network != "on"

    @property
    def confines_files(self) -> bool:
        return self.mode != "off"

    def request_writable(self, scratch: str | None) -> list[str]:
        """What a request's command may write: the root (workspace-write only) and its scratch dir."""
        out = [self.root] if self.mode == "workspace-write" else []
        if scratch:
            out.append(scratch)
        return out

    def wrap(self, argv: Sequence[str], writable: Sequence[str]) -> list[str]:
        """``argv`` run through the exec wrapper, allowed to write only ``writable``.

        ``argv[0]`` must be a path (the wrapper does no ``PATH`` look-up). Without an active
        sandbox, ``argv`` unchanged.
        """
        if not self.active:
            return list(argv)
        out = [*self.wrapper, *self._policy()]
        for path in writable:
            out += ["--write", path]
        out.append("--")
        out += argv
        return out

    def readable(self) -> list[str]:
        """What commands may read and execute (:func:`read_grants` of ``deny_read``); empty: all."""
        return read_grants(self.deny_read) if self.deny_read else []

    def _policy(self) -> list[str]:
        out = ["--fs", "on" if self.confines_files else "off", "--network", self.network]
        for path in self.readable():
            out += ["--read", path]
        return out

    def info(self) -> dict[str, str]:
        """The ``Ready.service_info`` entries that tell a peer what is in force."""
        return {"smith_fast.sandbox": self.mode, "smith_fast.network": self.network}

    def check(self) -> None:
        """The start-up check: the kernel has what this sandbox needs, and the wrapper works.

        Raises:
            SandboxUnavailable: it does not; the message says what is missing and what to do.
        """
        if not self.active:
            return
        features = kernel_features()
        if self.confines_files and features.landlock_abi < MIN_LANDLOCK_ABI:
            have = f"ABI {features.landlock_abi}" if features.landlock_abi else "none (not built in, or not in the lsm= boot list)"
            raise SandboxUnavailable(
                f"--sandbox {self.mode} needs Landlock ABI >= {MIN_LANDLOCK_ABI} (Linux 6.2+); this kernel has {have}. "
                "Enable Landlock, or pass --sandbox off to run commands unconfined"
            )
        if self.network != "on" and not features.userns:
            raise SandboxUnavailable(
                f"--network {self.network} needs unprivileged user namespaces (user.max_user_namespaces > 0, "
                "not blocked by AppArmor or kernel.unprivileged_userns_clone); pass --network on to run without network isolation"
            )
        probe = [*self.wrapper, *self._policy(), "--probe"]
        try:
            done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxUnavailable(f"the sandbox wrapper {probe[0]!r} does not run: {exc}") from None
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip() or f"exit status {done.returncode}"
            raise SandboxUnavailable(f"--sandbox {self.mode} --network {self.network} does not work on this kernel: {why}")
