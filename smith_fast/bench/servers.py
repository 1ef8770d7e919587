"""``smith-fast serve`` processes for the report: one per contender configuration.

The server is this interpreter running ``-m smith_fast serve`` with the contender's flags and
environment (``SMITH_FAST_NO_EXTENSIONS=1`` for the pure-Python twins). It logs JSON lines on
stderr; the runner waits for the ``ready`` record and takes the gRPC address from the
``listening`` records, then keeps draining stderr so a chatty server can never block on it.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["ServerStartError", "ServiceProcess"]


class ServerStartError(RuntimeError):
    """A server did not become ready; the message holds its stderr."""


class ServiceProcess:
    """One ``smith-fast serve`` on a Unix socket (and gRPC when asked), started by :meth:`start`.

    Args:
        sock_path: the Unix socket to listen on.
        root: the tool workspace.
        args: further ``serve`` arguments (``--loop``, ``--jsonl-backend``, ``--grpc`` ...).
        env: variables added to this process's environment.
    """

    def __init__(self, sock_path: pathlib.Path, root: pathlib.Path, args: Sequence[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.sock_path = str(sock_path)
        self.argv = [sys.executable, "-m", "smith_fast", "serve", "--unix", self.sock_path, "--root", str(root),
                     "--log-level", "info", *args]
        self.env = dict(os.environ, **(env or {}))
        self.grpc = ""
        self.service_info: dict[str, str] = {}
        self.stderr: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._ok = False

    def start(self) -> ServiceProcess:
        """Spawn the process (without waiting: see :meth:`wait_ready`)."""
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=self.env)
        threading.Thread(target=self._pump, daemon=True).start()
        return self

    def _pump(self) -> None:
        assert self.proc and self.proc.stderr
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            if len(self.stderr) < 200:
                self.stderr.append(line)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            address = str(record.get("address", ""))
            if record.get("event") == "listening" and address.startswith("grpc:") and not self.grpc:
                self.grpc = address.removeprefix("grpc:")
            if record.get("event") == "ready":
                self.service_info = {k: str(v) for k, v in record.items()}
                self._ok = True
                self._ready.set()
        self._ready.set()  # stderr closed: the process is gone

    def wait_ready(self, timeout: float = 60.0) -> ServiceProcess:
        """Block until the server said ``ready``.

        Raises:
            ServerStartError: it exited or said nothing in time.
        """
        if not self._ready.wait(timeout) or not self._ok:
            self.stop()
            raise ServerStartError(f"{' '.join(self.argv)} did not become ready:\n" + "\n".join(self.stderr[-20:]))
        return self

    @property
    def pid(self) -> int:
        assert self.proc
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
