"""Real ``smith-fast`` processes for the tests and the benchmarks, and the /proc readers around them.

A process logs JSON lines on stderr; a thread collects them (all of them, or the first ``keep`` for
a benchmark's long runs, so a chatty server never blocks on a full pipe), notes the addresses it
reports listening on and wakes the caller once it logs ``ready`` (or exits).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Self, cast

_STDERR_PIPE = 1 << 20
# argv: the signals to ignore, the signals to block (Python tuples), the umask (or None), then
# the program to exec
_LAUNCHER = (
    "import ast, os, resource, signal, sys\n"
    "for sig in ast.literal_eval(sys.argv[1]): signal.signal(sig, signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, ast.literal_eval(sys.argv[2]))\n"
    "if (mask := ast.literal_eval(sys.argv[3])) is not None: os.umask(mask)\n"
    "if (files := ast.literal_eval(sys.argv[4])) is not None: resource.setrlimit(resource.RLIMIT_NOFILE, files)\n"
    "os.execv(sys.argv[5], sys.argv[5:])\n"
)

__all__ = [
    "ROOT", "ServerProcess", "ServerStartError", "SmithProcess", "assert_clean_log", "beside", "descendants", "host_pids", "running",
    "is_child_guard", "parent_of", "pid_alive", "wait_until",
]

ROOT = pathlib.Path(__file__).resolve().parent.parent


class ServerStartError(RuntimeError):
    """A process did not become ready; the message holds its command line and stderr."""


class SmithProcess:
    """``python -m smith_fast ARGV...`` (``worker``, ``gateway``, ...), run from the repository root.

    Its stderr (JSON log lines) is collected in :attr:`logs` (and :attr:`raw_stderr`); :attr:`tcp`,
    :attr:`grpc` (``grpc:HOST:PORT``) and :attr:`metrics_url` are the addresses it reported
    listening on, :attr:`unix` the socket ``tmp/smith.sock`` a command given ``--unix`` that path
    listens on.

    Args:
        tmp: a directory of its own (its Unix socket goes there).
        argv: the ``smith_fast`` command line.
        env: variables added to this process's environment.
        keep: how many stderr lines to keep (all when None).
        cwd: its working directory (the repository's by default).
        ignoring: signals it starts with ignored, as a script's ``cmd &`` (SIGINT, SIGQUIT) or
            ``nohup`` (SIGHUP) starts it.
        blocking: signals it starts with blocked, as a launcher that blocks them may start it.
        umask: the file mode creation mask it starts with (None: this process's).
        open_files: the (soft, hard) ``RLIMIT_NOFILE`` it starts with (None: this process's).
            These four are set by a small Python program that then execs it (its pid is the same).
    """

    def __init__(self, tmp: pathlib.Path, *argv: str, env: dict[str, str] | None = None,
                 keep: int | None = None, cwd: pathlib.Path | None = None, ignoring: Sequence[int] = (),
                 blocking: Sequence[int] = (), umask: int | None = None, open_files: tuple[int, int] | None = None) -> None:
        self.ignoring = tuple(int(sig) for sig in ignoring)
        self.blocking = tuple(int(sig) for sig in blocking)
        self.umask = umask
        self.open_files = open_files
        self.cwd = cwd or ROOT
        self.sock_path = str(tmp / "smith.sock")
        self.argv = [sys.executable, "-m", "smith_fast", *argv]
        self.env = dict(os.environ, **(env or {}))
        self.keep = keep
        self.logs: list[dict[str, Any]] = []
        self.raw_stderr: list[str] = []
        self.unix = f"unix:{self.sock_path}"
        self.tcp = ""
        self.grpc = ""
        self.metrics_url = ""
        self.ready = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 20.0) -> Self:
        """Launch it and wait until it says it is ready (:meth:`wait_ready`)."""
        self.launch()
        return self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 20.0) -> Self:
        """Block until the launched process said ``ready``.

        Raises:
            ServerStartError: it exited or said nothing in time (it is stopped).
        """
        if not self._ready.wait(timeout) or not self.ready:
            self.stop()
            raise ServerStartError(f"{' '.join(self.argv)} did not become ready:\n" + "\n".join(self.raw_stderr[-200:]))
        return self

    def launch(self) -> threading.Event:
        """Start the process and the thread collecting its stderr; the event is set once it is ready
        or gone. For a process that is not expected to become ready, read :attr:`raw_stderr`."""
        argv = self.argv
        if self.ignoring or self.blocking or self.umask is not None or self.open_files is not None:
            argv = [sys.executable, "-c", _LAUNCHER, repr(self.ignoring), repr(self.blocking), repr(self.umask),
                    repr(self.open_files), *argv]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, cwd=self.cwd, env=self.env)
        assert self.proc.stderr is not None
        try:
            # A server logging a line per request must not block on a full pipe while the pump
            # waits for the GIL behind the thread driving it (the bench): room for ~4000 lines.
            fcntl.fcntl(self.proc.stderr.fileno(), fcntl.F_SETPIPE_SZ, _STDERR_PIPE)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the default 64 KiB
        self.ready = False
        self._ready = threading.Event()
        threading.Thread(target=self._pump, args=(self.proc, self._ready), daemon=True).start()
        return self._ready

    def _pump(self, proc: subprocess.Popen[bytes], ready: threading.Event) -> None:
        assert proc.stderr
        for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            kept = self.keep is None or len(self.raw_stderr) < self.keep
            if kept:
                self.raw_stderr.append(line)
            elif self.ready:
                # Past what it keeps, and ready: no address to learn. The rest is drained in big reads,
                # as a log collector would: the bench's servers log a line per request, and a line at a
                # time cost the bench's own process (whose CPU is the client's) ~8 us per call.
                while cast(io.BufferedReader, proc.stderr).read1(_STDERR_PIPE):  # Popen's pipes are buffered readers
                    pass
                break
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if kept:
                self.logs.append(record)
            address = str(record.get("address", ""))
            if record.get("event") == "listening" and address.startswith("tcp:"):
                self.tcp = address
            if record.get("event") == "listening" and address.startswith("grpc:"):
                self.grpc = self.grpc or address
            if record.get("event") == "listening" and address.startswith("http:") and address.endswith("/metrics"):
                self.metrics_url = self.metrics_url or address
            if record.get("event") == "ready":
                self.ready = True
                ready.set()
        ready.set()  # stderr closed: the process is gone, no point waiting any longer

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def address(self, kind: str) -> str:
        return self.unix if kind == "unix" else self.tcp

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Send ``sig`` (SIGTERM), then SIGKILL after ``timeout`` seconds; the exit status."""
        assert self.proc
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def children(self) -> list[int]:
        """Live (non-zombie) descendants' pids, from /proc."""
        return [pid for pid, state in descendants(self.pid) if state != "Z"]


class ServerProcess(SmithProcess):
    """``python -m smith_fast serve`` on the Unix socket ``tmp/smith.sock`` and, unless ``tcp`` is
    false, an ephemeral loopback TCP port.

    Args:
        tmp: a directory of its own.
        extra: further ``serve`` arguments (``--grpc 127.0.0.1:0``, ``--metrics ...``).
        loop: ``--loop``.
        root: ``--root`` (default ``tmp``).
        env: variables added to the environment.
        tcp: listen on TCP too.
        log_level: ``--log-level`` (``debug`` for tests; a benchmark logs less).
        keep: how many stderr lines to keep (all when None).
        ignoring, blocking, umask, open_files: what it starts with (:class:`SmithProcess`).
    """

    def __init__(self, tmp: pathlib.Path, *extra: str, loop: str = "uvloop", root: pathlib.Path | None = None,
                 env: dict[str, str] | None = None, tcp: bool = True, log_level: str = "debug",
                 keep: int | None = None, ignoring: Sequence[int] = (), blocking: Sequence[int] = (),
                 umask: int | None = None, open_files: tuple[int, int] | None = None) -> None:
        self.root = root or tmp
        super().__init__(tmp, "serve", "--loop", loop, "--root", str(self.root), "--log-level", log_level,
                         *extra, env=env, keep=keep, ignoring=ignoring, blocking=blocking, umask=umask,
                         open_files=open_files)
        sock = pathlib.Path(self.sock_path)
        if sock.resolve().is_relative_to(self.root.resolve()):
            # The service refuses a root that holds its own socket (a command could take its
            # place): the socket goes beside the directory instead.
            sock = beside(tmp, "sock") / "smith.sock"
            sock.parent.mkdir(exist_ok=True)
            self.sock_path, self.unix = str(sock), f"unix:{sock}"
        listen = ["--unix", self.sock_path, *(["--tcp", "127.0.0.1:0"] if tcp else [])]
        self.argv[4:4] = listen  # after `python -m smith_fast serve`


def beside(tmp: pathlib.Path, name: str) -> pathlib.Path:
    """A path next to ``tmp`` rather than in it: where a test puts a service's recordings or socket
    when ``tmp`` is its root (the service refuses a root that holds its own files)."""
    return tmp.parent / f"{tmp.name}-{name}"


def _stat(pid: int) -> tuple[int, str] | None:
    try:
        data = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data.rsplit(")", 1)[1].split()
    return int(rest[1]), rest[0]  # ppid, state


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None once it is gone), from /proc."""
    st = _stat(pid)
    return None if st is None else st[0]


def is_child_guard(pid: int) -> bool:
    """Whether ``pid`` is a service's child guard (``smith_fast/childguard.py``): it lives as long as
    the service does, so it is not one of the children a test expects to see come and go."""
    try:
        argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"/smith_fast/childguard.py") for arg in argv)


_CELL_DIR = re.compile(r"/smith-fast-\d+/c\d+(?=$|/[\w.]+$)")  # a cell's directory, or a file in it


def fd_count(pid: int) -> int:
    """The fds ``pid`` holds, less those of its spare cgroup cells (their directories and the usage
    files it reads in them): the service keeps up to ``containment._MAX_SPARES`` cells open for the
    next commands (made ahead or used again), a bounded pool, not a leak (:func:`spare_cells` says
    how many)."""
    return sum(1 for target in fd_links(pid) if not _CELL_DIR.search(target))


def spare_cells(pid: int) -> int:
    """How many cgroup cells ``pid`` holds open (each in one to three hierarchies)."""
    return len({found.group(0) for t in fd_links(pid) if (found := _CELL_DIR.search(t))})


def fd_links(pid: int) -> list[str]:
    """Where each fd of ``pid`` points (``/proc/PID/fd``), sorted."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return sorted(out)


def session_sandboxes(root: int) -> list[int]:
    """The processes of sessions' sandboxes (``sandbox-exec --zygote``: its monitor and init, and
    the next command's process waiting in it, a fork of the init or a warm shell, ``SHELL -s``)
    among ``root``'s descendants: they live as long as their session, not as a request."""
    below = [pid for pid, _ in descendants(root)]
    found = [pid for pid in below if " --zygote " in f" {_cmdline(pid)} "]
    warm = [pid for pid in below if _cmdline(pid).endswith(" -s ") and (_stat(pid) or (0, ""))[0] in found]
    return found + warm


def descendants(root: int) -> list[tuple[int, str]]:
    """Descendants of ``root`` (pid, state), without its child guard."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and not is_child_guard(int(entry)):
            st = _stat(int(entry))
            if st:
                table[int(entry)] = st
    out, frontier = [], {root}
    while frontier:
        nxt = {pid for pid, (ppid, _) in table.items() if ppid in frontier}
        out += [(pid, table[pid][1]) for pid in nxt]
        frontier = nxt
    return out


def _inner_pid(pid: int) -> tuple[str, int] | None:
    """The pid namespace of ``pid`` and its pid in there (None if it is in ours or gone)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            pids = line.split()[1:]
            return (ns, int(pids[-1])) if len(pids) > 1 else None
    return None


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def running(marker: str) -> list[int]:
    """The live processes (not zombies) whose command line holds ``marker``, this one aside: what is
    left of a command whose processes ran in a pid namespace of their own (a unique argument such as
    ``sleep 60.4711`` marks them)."""
    me = os.getpid()
    return [int(e) for e in os.listdir("/proc")
            if e.isdigit() and int(e) != me and marker in _cmdline(int(e)) and pid_alive(int(e))]


def host_pids(service: int | None, printed: list[int], marker: str) -> list[int]:
    """The pids, as this process sees them, of processes a sandboxed command printed (``$$``,
    ``$!``) while it runs: it runs in a pid namespace of its own, so what it prints are pids in
    there. ``marker`` is a text of the command line of a process in that namespace (the command's
    shell: one that ``exec``\\ s another program loses it; a session's sandbox init does not carry it),
    which tells its namespace from another's; the processes are the service's descendants
    (the namespace's init adopts orphans), or any process when ``service`` is None."""
    pool = [pid for pid, _ in descendants(service)] if service else [int(e) for e in os.listdir("/proc") if e.isdigit()]
    inner = {pid: _inner_pid(pid) for pid in pool}
    spaces = {where[0] for pid, where in inner.items() if where is not None and marker in _cmdline(pid)}
    # A command run by a warm shell (``sh -s``: the command is its script, not its argv) leaves no
    # marker: then any namespace, for a pid that only one of them holds.
    unique = not spaces
    if unique:
        spaces = {where[0] for where in inner.values() if where is not None}
    by_inner = {where: pid for pid, where in inner.items() if where is not None and where[0] in spaces}
    found = []
    for wanted in printed:
        matches = [pid for (_, n), pid in by_inner.items() if n == wanted]
        if matches and not (unique and len(matches) > 1):
            found.append(matches[0])
    return found


def pid_alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] != "Z"


def wait_until(pred: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``pred`` until it is true (True) or ``timeout`` seconds passed (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def assert_clean_log(server: SmithProcess) -> None:
    """No error records, tracebacks or complaints of the event loop's exception handler in its stderr."""
    lines = server.raw_stderr
    # each with what follows it (a traceback's frames and its exception), to say what went wrong
    bad = ["\n".join(lines[i : i + 25]) for i, line in enumerate(lines)
           if "Traceback" in line or "never retrieved" in line or "Exception in callback" in line]
    bad += [json.dumps(r) for r in server.logs if r.get("level") in ("error", "critical")]
    assert not bad, "\n".join(bad[:8])
