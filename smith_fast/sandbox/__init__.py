"""The sandbox of every process the service starts on a peer's behalf (PROTOCOL.md, "Sandbox").

A :class:`Sandbox` is a value: the mode (``workspace-write``, ``read-only``, ``off``), the network
(``on``, ``off``, ``loopback``), the workspace root, the paths commands may not read, and the
bounds of the private ``/tmp``. :meth:`Sandbox.wrap` turns a command's argv into one that starts
with ``sandbox-exec`` (``csrc/sandbox_exec.c``, built by ``setup.py`` beside this file), the one
program that confines every such process: a user, mount, pid, IPC and UTS namespace (and a network
namespace unless ``--network on``), the host read-only except the root, a private ``/proc``,
``/dev`` and ``/tmp``, every capability dropped, ``no_new_privs``, then Landlock. There is no
second implementation: what the wrapper does is the policy, for ShellExec, ``shell.run``, plan
steps and Rust hooks alike. A session builds it once (:mod:`smith_fast.sandbox.zygote`:
:meth:`Sandbox.zygote_argv`, ``sandbox-exec --zygote``) and its piped commands are forked inside,
each confined as :meth:`Sandbox.wrap`'s command is. :meth:`Sandbox.only_read` is the program's second form, Landlock alone,
for the processes the file tools start (``fs.search``'s rg): the rules of both are
``csrc/landlock_policy.h``'s, the only place the service's Landlock rules are written.
:meth:`Sandbox.check` is the service's start-up check, which fails
closed with :class:`SandboxUnavailable` when the helper or the kernel lacks what the mode needs,
and :func:`service_files_in` what keeps the service's own files out of the commands' reach.

Kernel features each setting needs:

| setting | needs |
|---|---|
| any sandbox (all but ``--sandbox off --network on``) | unprivileged user namespaces (``CLONE_NEWUSER``) with mount and pid namespaces, ``open_tree``/``mount_setattr`` (Linux 5.12) |
| ``--sandbox workspace-write`` / ``read-only`` | Landlock ABI >= 3 (Linux 6.2: truncation is a right only from ABI 3) |
| ``--network off`` | a network namespace; Landlock ABI 4 adds TCP bind/connect denial when present |
| ``--network allow`` | a network namespace, seccomp user notification and ``pidfd_getfd`` (Linux 5.6): the unix guard |
| ``--sandbox off --network on`` | nothing: no wrapper at all |

``SMITH_FAST_SANDBOX_HIDE=landlock,userns`` makes the probe report those features missing, so the
refusal can be tested on a kernel that has them (it can only make the service refuse to start).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import platform
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import field, replace

from .. import open_files
from ..errors import SandboxUnavailable, UnsafeRoot
from ..records import record

__all__ = [
    "DEFAULT_TMP_SIZE",
    "EGRESS_PORT",
    "ENV_PREFIX",
    "HELPER",
    "MIN_LANDLOCK_ABI",
    "MODES",
    "NETWORKS",
    "Sandbox",
    "SandboxUnavailable",
    "UnsafeRoot",
    "kernel_features",
    "service_files_in",
]

MODES = ("workspace-write", "read-only", "off")
NETWORKS = ("on", "off", "loopback", "allow")
EGRESS_PORT = 3128
"""Where a ``--network allow`` command's egress listener is, on its own 127.0.0.1
(``csrc/egress_listener.h``'s ``EGRESS_PORT``): what its proxy variables point at."""
MIN_LANDLOCK_ABI = 3
DEFAULT_TMP_SIZE = 1 << 30
"""Bytes a command's private ``/tmp`` (its ``TMPDIR``) and ``/dev/shm`` may each hold."""
TMPDIR = "/tmp"
HIDE_ENV = "SMITH_FAST_SANDBOX_HIDE"
HELPER = str(pathlib.Path(__file__).with_name("sandbox-exec"))
"""The sandbox program (``csrc/sandbox_exec.c``), built by ``setup.py``."""
ENV_PREFIX = "SMITH_FAST_ENV_"
"""What a command's variables are named in the sandbox program's environment (:meth:`Sandbox.wrap_environ`)."""


@record(frozen=True, slots=True)
class KernelFeatures:
    """What the probe found.

    Attributes:
        landlock_abi: the Landlock ABI (0: none).
        userns: unprivileged user namespaces look available (checked for real by the trial run).
    """

    landlock_abi: int
    userns: bool


def _landlock_abi() -> int:
    if platform.machine() not in ("x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # landlock_create_ruleset(VERSION)
    return int(version) if version > 0 else 0


def kernel_features() -> KernelFeatures:
    """Probe the running kernel (cheap: one system call and a sysctl), honouring ``SMITH_FAST_SANDBOX_HIDE``."""
    hidden = {name.strip() for name in os.environ.get(HIDE_ENV, "").split(",")}
    abi = 0 if "landlock" in hidden else _landlock_abi()
    userns = "userns" not in hidden
    if userns:
        try:
            userns = int(pathlib.Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
        except (OSError, ValueError):
            userns = False
    return KernelFeatures(abi, userns)


def _adopts_orphans() -> bool:
    """Whether processes orphaned below this one come back to it: it is pid 1 of its pid namespace
    (a container's entry point) or a child subreaper (``PR_SET_CHILD_SUBREAPER``, kept across exec)."""
    if os.getpid() == 1:
        return True
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(37, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0  # PR_GET_CHILD_SUBREAPER


_ADOPTS_ORPHANS = _adopts_orphans()


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def service_files_in(root: str, files: Iterable[tuple[str, str]]) -> list[str]:
    """Which of the service's own files (``(what, path)`` pairs) lie inside ``root`` (both
    resolved): ``["its socket /srv/app/.smith.sock", ...]``. A command may write anything in the
    root, so such a file could be replaced by what the command wants the service to run or be."""
    top = os.path.realpath(root)
    return [f"{what} {path}" for what, path in files if _inside(os.path.realpath(path), top)]


def _nothing_to_wait_for() -> None:
    """The end of the check of a sandbox that confines nothing."""


@record(frozen=True, slots=True)
class Sandbox:
    """How the processes started for peers are confined.

    Attributes:
        mode: ``workspace-write`` (write only under ``root``, the private ``/tmp`` and
            ``/dev/shm``), ``read-only`` (only those two) or ``off`` (no file confinement).
        network: ``on``, ``off`` (no network at all, loopback included), ``loopback`` (a
            private loopback only) or ``allow`` (a private loopback with the egress listener on
            :data:`EGRESS_PORT`, handed to the service: :meth:`wrap`'s ``egress_fd``; connect()
            to a socket file outside the writable directories refused).
        root: the workspace root (resolved).
        wrapper: the sandbox program's argv prefix (:data:`HELPER`); for tests of other builds.
        deny_read: paths commands may not read (``--sandbox-deny-read``; inside the root too):
            covered by an empty, unreadable file or directory in their view; needs a mode other
            than ``off``. Resolved on construction.
        hidden: the service's own files (its sockets, recordings, state), covered the same way.
        cover: directories covered by an empty read-only tmpfs in a command's view, in which only
            the root is put back when it lies beneath one (``--workspaces DIR``: a session's
            command sees its own workspace and nothing else of DIR). Resolved on construction.
        home: the session's home directory (``HOME`` and the tool caches under it,
            :func:`smith_fast.command_env.home_environment`), writable in workspace-write mode
            besides the root; None: commands keep the service's ``HOME`` (read-only in their view).
            Its parent, the directory of every session's home, is in :attr:`cover`
            (:meth:`with_home`), so a command sees its own home and no other. Resolved on construction.
        tmp_size: bytes the private ``/tmp`` and ``/dev/shm`` may each hold (``--max-tmp-per-command``).
        file_size: the largest file a command may write, bytes (``RLIMIT_FSIZE``; 0: no limit).
        reap: the sandbox program waits for its namespaces' teardown before it ends. It need not:
            whoever adopts its init reaps it. But when that would be this process (pid 1 of a
            container, a subreaper), which reaps only the children it started, it must (the
            default then).
    """

    mode: str = "workspace-write"
    network: str = "on"
    root: str = "/"
    wrapper: tuple[str, ...] = field(default=(HELPER,), compare=False)
    deny_read: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    cover: tuple[str, ...] = ()
    home: str | None = None
    tmp_size: int = DEFAULT_TMP_SIZE
    file_size: int = 0
    reap: bool = field(default=_ADOPTS_ORPHANS, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, not {self.network!r}")
        if self.deny_read and self.mode == "off":
            raise ValueError("--sandbox-deny-read needs --sandbox workspace-write or read-only, not off")
        if self.tmp_size <= 0 or self.file_size < 0:
            raise ValueError("the private /tmp needs a positive size, and a file size limit cannot be negative")
        object.__setattr__(self, "deny_read", tuple(os.path.realpath(p) for p in self.deny_read))
        object.__setattr__(self, "hidden", tuple(os.path.realpath(p) for p in self.hidden))
        object.__setattr__(self, "cover", tuple(os.path.realpath(p) for p in self.cover))
        if self.home is not None:
            object.__setattr__(self, "home", os.path.realpath(self.home))
        if "/" in self.cover:
            raise ValueError("a sandbox cannot cover / (cover the workspaces directory)")

    def for_workspace(self, root: str, cover: str, hidden: Sequence[str]) -> Sandbox:
        """This sandbox for a session's workspace: ``root`` (its overlay's mount point) is the root
        commands write in (or read, in read-only mode), ``cover`` (the workspaces directory) is
        covered so that nothing else of it is in their view, and ``hidden`` (the templates' host
        paths, which a command could otherwise read in place) are hidden too."""
        return replace(self, root=os.path.realpath(root), cover=(*self.cover, cover), hidden=(*self.hidden, *hidden))

    def with_home(self, home: str, homes: str | None = None) -> Sandbox:
        """This sandbox for a session whose home is ``home``, a directory of ``homes`` (the
        directory of every session's home, covered so that a command sees only its own; None when
        it lies beneath a directory already covered: a workspace's volume). Only in workspace-write
        mode: read-only and off keep the service's ``HOME``."""
        if self.mode != "workspace-write":
            return self
        cover = self.cover if homes is None or os.path.realpath(homes) in self.cover else (*self.cover, homes)
        return replace(self, home=home, cover=cover)

    @property
    def active(self) -> bool:
        """Whether processes go through the sandbox program at all."""
        return self.mode != "off" or self.network != "on"

    @property
    def confines_files(self) -> bool:
        return self.mode != "off"

    @property
    def tmpdir(self) -> str | None:
        """The ``TMPDIR`` of a confined command: its private ``/tmp`` (None when files are not confined)."""
        return TMPDIR if self.active and self.confines_files else None

    def writable(self) -> list[str]:
        """What a command may write besides its private ``/tmp``: the root (and the session's home) in workspace-write."""
        if self.mode != "workspace-write":
            return []
        return [self.root] if self.home is None else [self.root, self.home]

    def denies(self, path: str) -> bool:
        """Whether ``path`` (absolute, resolved) is one commands and the file tools may not read."""
        return any(_inside(path, denied) for denied in self.deny_read)

    def wrap(self, argv: Sequence[str], writable: Sequence[str], *, tty: bool = False, data_size: int = 0,
             usage_fd: int = -1, egress_fd: int = -1, cgroup_fd: int = -1) -> list[str]:
        """``argv`` run through the sandbox program, allowed to write only ``writable``.

        ``argv[0]`` must be a path (no ``PATH`` look-up). ``tty``: the command's stdin is a
        terminal it gets as its controlling terminal. ``data_size``: its ``RLIMIT_DATA``.
        ``usage_fd``: an fd the caller passes on (``pass_fds``), where the sandbox program writes
        the command's ``struct rusage`` before it ends (its parent's ``wait4`` sees the sandbox
        program only). ``egress_fd``: with ``network == "allow"``, a unix socket the caller passes
        on, over which the sandbox program sends the egress listener (without one, a process of
        that sandbox gets a loopback alone: no way out). ``cgroup_fd``: a cgroup v2 directory the
        caller passes on, in which the sandbox program's init (and so the command) is born
        (:meth:`~smith_fast.containment.Cell.v2_fd`). Without an active sandbox, ``argv`` unchanged.

        Start it with :meth:`wrap_environ`'s environment, not the command's.
        """
        if not self.active:
            return list(argv)
        out = [*self.wrapper, "--env-prefixed", *self._policy(egress_fd)]
        for path in writable:
            out += ["--write", path]
        if tty:
            out.append("--tty")
        if data_size:
            out += ["--data-size", str(data_size)]
        if usage_fd >= 0:
            out += ["--usage-fd", str(usage_fd)]
        if cgroup_fd >= 0:
            out += ["--cgroup-fd", str(cgroup_fd)]
        out.append("--")
        out += argv
        return out

    def wrap_environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment to start :meth:`wrap`'s argv with, for a command whose environment is
        ``environ``: each variable renamed ``SMITH_FAST_ENV_NAME``, which the sandbox program gives
        the command as ``NAME`` (``--env-prefixed``). So the sandbox program's own dynamic loader
        and C library, which run before any wall stands, read none of a request's variables
        (``LD_PRELOAD``, ``LD_AUDIT``, ``GLIBC_TUNABLES``... that ``--allow-env`` lets through: they
        are the command's). Without an active sandbox, ``environ`` as it is."""
        if not self.active:
            return dict(environ)
        return {ENV_PREFIX + name: value for name, value in environ.items()}

    def zygote_argv(self, writable: Sequence[str], control_fd: int) -> list[str]:
        """The sandbox program as a zygote (:mod:`smith_fast.sandbox.zygote`): these walls, with
        ``writable`` writable, built once, and the commands sent on the socket ``control_fd`` forked
        inside (each confined as :meth:`wrap`'s command is). The argv with ``control_fd`` 0 names
        the configuration: a session keeps one zygote per name. (``--network allow`` has an egress
        listener per command: such commands start the one-shot way, and a zygote gets loopback.)"""
        out = [*self.wrapper, *self._policy()]
        for path in writable:
            out += ["--write", path]
        return [*out, "--zygote", str(control_fd)]

    def _policy(self, egress_fd: int = -1) -> list[str]:
        network = self.network if self.network != "allow" or egress_fd >= 0 else "loopback"
        out = ["--fs", "on" if self.confines_files else "off", "--network", network, "--tmp-size", str(self.tmp_size)]
        if network == "allow":
            out += ["--egress-fd", str(egress_fd)]
        if self.reap:
            out.append("--reap")
        if self.file_size:
            out += ["--file-size", str(self.file_size)]
        if given := open_files.for_commands():  # the soft limit the service started with, before it raised its own
            out += ["--open-files", str(given)]
        if self.mode == "read-only":
            out += ["--read", self.root]  # kept in view when it lies under the private /tmp or a cover
        for path in self.cover:
            out += ["--cover", path]
        for path in (*self.deny_read, *self.hidden):
            out += ["--hide", path]
        return out

    def only_read(self, argv: Sequence[str], readable: Sequence[str]) -> list[str]:
        """``argv`` run by the sandbox program under Landlock alone (no namespace, no fork): it may
        read and list only beneath ``readable``, run only ``argv[0]`` (a path), and write, bind or
        connect nowhere. For a process a file tool starts, which must stay in the workspace
        whatever :attr:`mode` lets commands do; check :meth:`can_confine_reads` first."""
        out = list(self.wrapper)
        for path in readable:
            out += ["--only-read", path]
        return [*out, "--", *argv]

    def can_confine_reads(self) -> bool:
        """Whether :meth:`only_read` can work here: the sandbox program is built and the kernel
        has Landlock (``SMITH_FAST_SANDBOX_HIDE=landlock`` says it has not)."""
        return os.access(self.wrapper[0], os.X_OK) and kernel_features().landlock_abi >= 1

    def info(self) -> dict[str, str]:
        """The ``Ready.service_info`` entries that tell a peer what is in force."""
        return {"smith_fast.sandbox": self.mode, "smith_fast.network": self.network}

    def check(self) -> None:
        """The start-up check: the helper is there, the kernel has what this sandbox needs, and a
        trial run builds it.

        Raises:
            SandboxUnavailable: it does not; the message says what is missing and what to do.
        """
        self.start_check()()

    def start_check(self) -> Callable[[], None]:
        """:meth:`check`, begun: what the kernel lacks is raised now; the trial run is started, and
        the function returned waits for it (raising :class:`SandboxUnavailable` when it failed, at
        every call), so that a start can go on while it runs (a few ms: a process and its namespaces).

        Raises:
            SandboxUnavailable: the helper is missing or the kernel lacks what this sandbox needs.
        """
        if not self.active:
            return _nothing_to_wait_for
        if not os.access(self.wrapper[0], os.X_OK):
            raise SandboxUnavailable(
                f"the sandbox program {self.wrapper[0]!r} is missing: it is built by `pip install` with a C compiler "
                "(gcc) present; reinstall with one, or pass --sandbox off --network on to run commands unconfined"
            )
        features = kernel_features()
        if not features.userns:
            raise SandboxUnavailable(
                "the sandbox needs unprivileged user namespaces (user.max_user_namespaces > 0, not blocked by AppArmor "
                "or kernel.unprivileged_userns_clone); pass --sandbox off --network on to run commands unconfined"
            )
        if self.confines_files and features.landlock_abi < MIN_LANDLOCK_ABI:
            have = f"ABI {features.landlock_abi}" if features.landlock_abi else "none (not built in, or not in the lsm= boot list)"
            raise SandboxUnavailable(
                f"--sandbox {self.mode} needs Landlock ABI >= {MIN_LANDLOCK_ABI} (Linux 6.2+); this kernel has {have}. "
                "Enable Landlock, or pass --sandbox off to run commands unconfined"
            )
        # --network allow: the probe sends its egress listener too (dropped here) and installs the unix guard.
        ours, theirs = socket.socketpair() if self.network == "allow" else (None, None)
        egress_fd = theirs.fileno() if theirs is not None else -1
        probe = [*self.wrapper, *self._policy(egress_fd), *(a for p in self.writable() for a in ("--write", p)), "--probe"]

        def close() -> None:
            for end in (ours, theirs):
                if end is not None:
                    end.close()

        try:
            # In the root, where commands run: the service's own directory may be out of the
            # command's view (a checkout under the private /tmp), and is none of the probe's business.
            cwd = self.root if os.path.isdir(self.root) else "/"
            running = subprocess.Popen(probe, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                       pass_fds=(egress_fd,) if egress_fd >= 0 else ())
        except OSError as exc:
            close()
            raise SandboxUnavailable(f"the sandbox program {probe[0]!r} does not run: {exc}") from None

        outcome: list[SandboxUnavailable | None] = []  # the run's verdict, for every later call

        def wait() -> None:
            if not outcome:
                outcome.append(finish())
            if outcome[0] is not None:
                raise outcome[0]

        def finish() -> SandboxUnavailable | None:
            try:
                _, err = running.communicate(timeout=30)
            except subprocess.SubprocessError as exc:
                running.kill()
                running.communicate()
                return SandboxUnavailable(f"the sandbox program {probe[0]!r} does not run: {exc}")
            finally:
                close()
            if running.returncode != 0:
                why = err.decode("utf-8", "replace").strip() or f"exit status {running.returncode}"
                return SandboxUnavailable(f"--sandbox {self.mode} --network {self.network} does not work on this kernel: {why}")
            return None

        return wait
