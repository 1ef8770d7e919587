"""Run a real ``smith-fast serve`` process for end-to-end tests."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent


class ServerProcess:
    """``python -m smith_fast serve`` with a Unix socket and an ephemeral TCP port.

    Its stderr (JSON log lines) is collected in :attr:`logs`; :attr:`unix` and :attr:`tcp` are the
    addresses it reported when it became ready, and so are :attr:`grpc` (``grpc:HOST:PORT``) and
    :attr:`metrics_url` when ``--grpc``/``--metrics`` are among the extra arguments.
    """

    def __init__(self, tmp: pathlib.Path, *extra: str, loop: str = "uvloop", root: pathlib.Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.sock_path = str(tmp / "smith.sock")
        self.root = root or tmp
        self.argv = [
            sys.executable, "-m", "smith_fast", "serve",
            "--unix", self.sock_path, "--tcp", "127.0.0.1:0",
            "--loop", loop, "--root", str(self.root), "--log-level", "debug", *extra,
        ]
        self.env = dict(os.environ, **(env or {}))
        self.logs: list[dict[str, Any]] = []
        self.raw_stderr: list[str] = []
        self.unix = f"unix:{self.sock_path}"
        self.tcp = ""
        self.grpc = ""
        self.metrics_url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> ServerProcess:
        """Launch it and wait until it says it is ready (RuntimeError, and stopped, if it does not)."""
        ready = self.launch()
        if not ready.wait(timeout) or not self.ready:
            self.stop()
            raise RuntimeError("server did not become ready:\n" + "\n".join(self.raw_stderr))
        return self

    def launch(self) -> threading.Event:
        """Start the process and the thread collecting its stderr; the event is set once it is ready
        or gone. For a process that is not expected to become ready, read :attr:`raw_stderr`."""
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, cwd=ROOT, env=self.env)
        ready = threading.Event()

        def pump() -> None:
            assert self.proc and self.proc.stderr
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                self.raw_stderr.append(line)
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                self.logs.append(record)
                if record.get("event") == "listening" and str(record.get("address", "")).startswith("tcp:"):
                    self.tcp = record["address"]
                if record.get("event") == "listening" and str(record.get("address", "")).startswith("grpc:"):
                    self.grpc = self.grpc or record["address"]
                if record.get("event") == "listening" and str(record.get("address", "")).startswith("http:"):
                    self.metrics_url = self.metrics_url or record["address"]
                if record.get("event") == "ready":
                    self.ready = True
                    ready.set()
            ready.set()  # stderr closed: the process is gone, no point waiting any longer

        self.ready = False
        threading.Thread(target=pump, daemon=True).start()
        return ready

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def address(self, kind: str) -> str:
        return self.unix if kind == "unix" else self.tcp

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
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


def pid_alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] != "Z"


def wait_until(pred, timeout: float = 10.0, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def assert_clean_log(server: ServerProcess) -> None:
    """No error records, tracebacks or complaints of the event loop's exception handler in its stderr."""
    bad = [line for line in server.raw_stderr if "Traceback" in line or "never retrieved" in line or "Exception in callback" in line]
    bad += [json.dumps(r) for r in server.logs if r.get("level") in ("error", "critical")]
    assert not bad, "\n".join(bad[:20])
