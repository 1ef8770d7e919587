"""Start-up of ``serve --mcp`` and ``serve --stdio``: what the way to the first answer leaves out,
and that what it defers still comes when needed. Real servers, real processes; no timing asserted
(``bench/bench_start.py`` measures it, side by side with the peers)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from bench.bench_start import SCALES, STARTERS, measure
from harness.server import ROOT
from smith_fast.framing import FrameDecoder, encode_frame
from smith_fast.pb import smith_pb2 as pb

# Imported by nothing the first answers need: the other commands' parsers, the SDK client (replay
# drives services with it), jsonschema (only for a value the built-in tools' fast check refuses),
# importlib.metadata (only with a plug-in tool installed, or tracing's exporters asked for), the Rust
# hook engine (only for a Rust hook), OpenTelemetry (only for a session's spans, when recorded or asked for),
# the process stack (the first command that starts a process imports it: COMMANDS' handlers), the
# planner (the first plan), the background table (the first background process or listing), the
# workspace modules (only with --workspaces), the recordings (only with --record or replay granted).
NOT_AT_START = ("jsonschema", "importlib.metadata", "smith_fast.hooks.rust", "opentelemetry.trace", "smith_fast.client",
                "smith_fast.nats.cli",
                "smith_fast.nats.auth", "smith_fast.replay.replayer", "smith_fast.replay.diff", "smith_fast.replay.cli",
                "smith_fast.background_cli",
                "smith_fast.service.launch", "smith_fast.service.shell_exec", "smith_fast.service.spawn",
                "smith_fast.service.background", "smith_fast.plan", "smith_fast.workspaces", "smith_fast.workspaces.workspace",
                "smith_fast.replay")
PROCESS_STACK = {"smith_fast.service.launch", "smith_fast.service.shell_exec", "smith_fast.service.spawn"}


@pytest.fixture
def root() -> Iterator[pathlib.Path]:
    with tempfile.TemporaryDirectory(prefix="smith-fast-start-", dir="/var/tmp") as tmp:
        (pathlib.Path(tmp) / "small.txt").write_text("hello, start\n")
        yield pathlib.Path(tmp)


def _serve(root: pathlib.Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-X", "importtime", "-m", "smith_fast", "serve", *args, "--root", str(root),
                             "--log-level", "warning"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)


def _imported(stderr: bytes) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.decode().splitlines() if line.startswith("import time:")}


def test_mcp_answers_initialize_and_a_read_without_what_they_do_not_need(root: pathlib.Path) -> None:
    proc = _serve(root, "--mcp")
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs.read", "arguments": {"path": "small.txt"}}}]
    out, err = proc.communicate(b"".join(json.dumps(m).encode() + b"\n" for m in lines), timeout=60)
    answers = {m["id"]: m for m in map(json.loads, out.splitlines()) if "id" in m}
    assert answers[1]["result"]["serverInfo"]["name"] == "smith-fast"
    assert answers[2]["result"]["isError"] is False and "hello, start" in json.dumps(answers[2]["result"])
    imported = _imported(err)
    assert "smith_fast.service.server" in imported  # the list is real
    assert not imported & set(NOT_AT_START), sorted(imported & set(NOT_AT_START))
    # Nor, with Rust hooks not permitted (their build cache hashes sources), hashlib and hmac (their
    # OpenSSL start: a token's comparison, a resume token's key), secrets and random (tokens).
    assert not imported & {"hashlib", "hmac", "secrets", "random"}, sorted(imported & {"hashlib", "hmac", "secrets", "random"})
    # Nor, on its way out, the process stack: no command ran, so there is none to kill.
    assert "smith_fast.shell_process" not in imported and "smith_fast.process" not in imported


def _envelope(command: pb.Command) -> bytes:
    return encode_frame(pb.Envelope(command=command).SerializeToString())


def test_stdio_v1_grants_the_hook_kinds_and_answers_without_what_it_does_not_need(root: pathlib.Path) -> None:
    """rustc --version now runs while the service is imported: the Ready still grants Rust hooks
    when rustc runs here (the test machine has one), as it did when the core waited for it."""
    from smith_fast.hooks import available_kinds

    proc = _serve(root, "--stdio", "--capabilities", "shell_exec,hooks_js,hooks_rust")
    hello = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_HOOKS_RUST, pb.CAPABILITY_HOOKS_JS]))
    read = pb.Command(tool_call=pb.ToolCallCommand(request_id="r1", tool="fs.read", args=b'{"path":"small.txt"}'))
    out, err = proc.communicate(_envelope(hello) + _envelope(read), timeout=60)
    events = [pb.Envelope.FromString(frame).event for frame in FrameDecoder().feed(out)]
    ready = next(e.ready for e in events if e.WhichOneof("event_type") == "ready")
    assert "rust" in available_kinds()  # else this test would prove nothing
    assert pb.CAPABILITY_HOOKS_RUST in ready.capabilities
    result = next(e.tool_result for e in events if e.WhichOneof("event_type") == "tool_result")
    assert result.success and b"hello, start" in result.result
    assert not _imported(err) & set(NOT_AT_START)


def test_the_deferred_process_stack_comes_with_the_first_command(root: pathlib.Path) -> None:
    """A shell command after the start's first answers: its handler imports the process stack then,
    and the command runs sandboxed as ever (its output, its exit)."""
    proc = _serve(root, "--stdio")
    hello = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC]))
    read = pb.Command(tool_call=pb.ToolCallCommand(request_id="r1", tool="fs.read", args=b'{"path":"small.txt"}'))
    shell = pb.Command(shell_exec=pb.ShellExecCommand(request_id="s1", command="cat small.txt; echo late"))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(_envelope(hello) + _envelope(read) + _envelope(shell))
    proc.stdin.flush()
    events: list[pb.Event] = []
    frames = FrameDecoder()
    while not any(e.WhichOneof("event_type") == "state_change" and e.state_change.request_id == "s1"
                  and e.state_change.state == pb.SERVICE_STATE_READY for e in events):  # stdin open until then: EOF ends the session
        chunk = proc.stdout.read1(65536)
        assert chunk, "the service closed its stdout before the command ended"
        events += [pb.Envelope.FromString(frame).event for frame in frames.feed(chunk)]
    _, err = proc.communicate(timeout=60)
    shell_out = [e.shell_output for e in events if e.WhichOneof("event_type") == "shell_output"]
    assert b"".join(o.stdout.encode() + o.stdout_bytes for o in shell_out) == b"hello, start\nlate\n", events
    assert [o.exit_code for o in shell_out if o.finished] == [0], events
    assert PROCESS_STACK <= _imported(err)


def test_a_wrong_llm_planner_still_fails_the_start(root: pathlib.Path) -> None:
    """The rules planner is made by the first plan; any other is made at start, so a wrong
    --planner-url or --planner-model still stops the service before it serves."""
    proc = subprocess.run([sys.executable, "-m", "smith_fast", "serve", "--stdio", "--planner", "llm", "--root", str(root)],
                          input=b"", capture_output=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and b"--planner llm needs --planner-url" in proc.stderr, proc.stderr


def test_the_sandbox_trial_run_started_early_still_refuses(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The sandbox's trial run goes on while ``serve`` imports its fronts; a failed one is raised
    where it is waited for, and at every later wait (each new session's), never forgotten; a kernel
    without what the sandbox needs still fails the start before anything is answered."""
    from smith_fast.errors import SandboxUnavailable
    from smith_fast.sandbox import Sandbox

    failing = tmp_path / "sandbox-exec"
    failing.write_text("#!/bin/sh\necho 'no namespaces here' >&2\nexit 3\n")
    failing.chmod(0o755)
    wait = Sandbox("workspace-write", "on", str(root), wrapper=(str(failing),)).start_check()
    for _ in range(2):
        with pytest.raises(SandboxUnavailable, match="no namespaces here"):
            wait()
    working = Sandbox("workspace-write", "on", str(root)).start_check()
    working()
    working()  # done: at once
    for front in ("--mcp", "--stdio"):
        proc = subprocess.run([sys.executable, "-m", "smith_fast", "serve", front, "--root", str(root)],
                              input=b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n', capture_output=True, cwd=ROOT, timeout=60,
                              env={**os.environ, "SMITH_FAST_SANDBOX_HIDE": "userns"})
        assert proc.returncode == 2 and proc.stdout == b"", (front, proc.stdout, proc.stderr)
        assert b"user namespaces" in proc.stderr


def test_rustc_version_started_early_reads_the_same(tmp_path: pathlib.Path) -> None:
    code = ("from smith_fast.hooks import rust_build as r; import sys; early = sys.argv[1] == 'early'\n"
            "if early: r.start_rustc_version(); assert r._asked is not None or r.rustc_path() is None\n"
            "print(r.rustc_version())")
    answers = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, check=True, cwd=ROOT).stdout
               for how in ("early", "late")}
    assert answers["early"] == answers["late"] and answers["early"].startswith("rustc ")
    broken = tmp_path / "rustc"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    env = {**os.environ, "SMITH_FAST_RUSTC": str(broken)}
    out = subprocess.run([sys.executable, "-c", code, "early"], capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    assert out.stdout.strip() == "None"


def test_plug_in_discovery_looks_where_importlib_metadata_looks(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from smith_fast.tools.plugins import _may_declare

    assert _may_declare("smith_fast.tests.nothing.declares.this") is False
    dist = tmp_path / "demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo_plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[smith_fast.tests.nothing.declares.this]\nx = demo:X\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _may_declare("smith_fast.tests.nothing.declares.this") is True
    # an egg or a zip on the path: not looked into here, so importlib.metadata decides
    monkeypatch.syspath_prepend(str(tmp_path / "something.egg"))
    assert _may_declare("another.group") is True


def test_the_start_benchmark_runs_every_starter_once_side_by_side() -> None:
    result = measure(SCALES["smoke"], lambda line: None, STARTERS)
    assert set(result["contenders"]) == {"mcp", "v1", "mcp-sdk", "floor"}
    for figures in result["contenders"].values():
        assert len(figures["first answer ms"]["all"]) == SCALES["smoke"].reps
        assert 0 < figures["first answer ms"]["median"] <= figures["first call ms"]["median"]


def test_rustc_is_asked_only_when_rust_hooks_are_permitted(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """Rust hooks are off unless --capabilities lists them: a default start never runs rustc (15-40 ms
    on the way to the first answer); one that permits them asks it, and grants them when it runs."""
    asked = tmp_path / "asked"
    rustc = tmp_path / "rustc"
    rustc.write_text(f"#!/bin/sh\necho \"$@\" >> {asked}\necho 'rustc 1.99.0 (test)'\n")
    rustc.chmod(0o755)
    hello = pb.Command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_HOOKS_RUST, pb.CAPABILITY_SHELL_EXEC]))
    granted = {}
    for label, extra in (("default", ()), ("permitted", ("--capabilities", "shell_exec,hooks_rust"))):
        proc = subprocess.Popen([sys.executable, "-m", "smith_fast", "serve", "--stdio", *extra, "--root", str(root),
                                 "--log-level", "warning"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "SMITH_FAST_RUSTC": str(rustc)})
        out, _ = proc.communicate(_envelope(hello), timeout=60)
        events = [pb.Envelope.FromString(frame).event for frame in FrameDecoder().feed(out)]
        granted[label] = set(next(e.ready for e in events if e.WhichOneof("event_type") == "ready").capabilities)
        if label == "default":
            assert not asked.exists(), "rustc ran although Rust hooks are not permitted"
    assert pb.CAPABILITY_SHELL_EXEC in granted["default"] and pb.CAPABILITY_HOOKS_RUST not in granted["default"]
    assert pb.CAPABILITY_HOOKS_RUST in granted["permitted"]
    assert asked.read_text().split() == ["--version"]  # once, early, and read when the core needed it


def test_the_collector_is_off_while_serve_starts_and_on_once_it_serves(root: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``python -m smith_fast`` turns the cyclic collector off for the start and cli.main turns it
    back on, after freezing what the start made: a real server, observed by a sitecustomize that
    reports the collector's state when the service answers and at exit."""
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print(f'gc at exit: enabled={gc.isenabled()} frozen={gc.get_freeze_count()}', file=sys.stderr))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    hello = pb.Command(handshake=pb.HandshakeCommand(version=1))
    read = pb.Command(tool_call=pb.ToolCallCommand(request_id="r1", tool="fs.read", args=b'{"path":"small.txt"}'))
    for entry in (["-m", "smith_fast"], ["-c", "import sys; from smith_fast.__main__ import main; sys.exit(main())"]):
        # the second: what the console script does (pyproject's entry point)
        proc = subprocess.run([sys.executable, *entry, "serve", "--stdio", "--root", str(root), "--log-level", "warning"],
                              input=_envelope(hello) + _envelope(read), capture_output=True, cwd=ROOT, env=env, timeout=60)
        events = [pb.Envelope.FromString(frame).event for frame in FrameDecoder().feed(proc.stdout)]
        assert any(e.WhichOneof("event_type") == "tool_result" and e.tool_result.success for e in events), proc.stderr[-2000:]
        state = [line for line in proc.stderr.decode().splitlines() if line.startswith("gc at exit:")]
        enabled, frozen = state[0].removeprefix("gc at exit: ").split()
        assert enabled == "enabled=True", entry
        assert int(frozen.removeprefix("frozen=")) > 10_000, entry  # the start's objects, out of later collections


def test_mcp_sessions_are_traced_when_spans_are_recorded(root: pathlib.Path) -> None:
    """The MCP front asks for tracing only when an exporter records spans: then its session and
    calls have spans, as before (the console exporter writes them to stderr)."""
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "start-test"}
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "fs.read", "arguments": {"path": "small.txt"}}}]
    proc = subprocess.run([sys.executable, "-m", "smith_fast", "serve", "--mcp", "--root", str(root), "--log-level", "warning"],
                          input=b"".join(json.dumps(m).encode() + b"\n" for m in lines), capture_output=True, cwd=ROOT,
                          env=env, timeout=60)
    answers = {m["id"]: m for m in map(json.loads, proc.stdout.splitlines()) if "id" in m}
    assert answers[2]["result"]["isError"] is False
    err = proc.stderr.decode()
    assert '"name": "smith.session"' in err and '"name": "smith.tool_call"' in err, err[-2000:]
