"""A v1 session framed by a protobuf implementation other than ours: protobufjs on Node.js.

``tests/interop/v1_client.mjs`` loads ``proto/smith/v1/smith.proto`` with protobufjs and speaks to a
real ``smith-fast serve`` using only ``Envelope.encodeDelimited``/``decodeDelimited``: if our framing
were anything but protobuf's standard delimited format, or our messages anything but the schema's,
this session would break. ``make test`` installs the client's npm packages (``npm ci``).
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import time
from typing import Any

import pytest

from harness.server import ROOT, ServerProcess

INTEROP = ROOT / "tests" / "interop"
CLIENT = INTEROP / "v1_client.mjs"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
CONTENT = "héllo from Python ✓\nsecond line\n"
READY, PROCESSING, ERROR = "SERVICE_STATE_READY", "SERVICE_STATE_PROCESSING", "SERVICE_STATE_ERROR"


def pinned_protobufjs() -> str:
    return str(json.loads((INTEROP / "package.json").read_text())["dependencies"]["protobufjs"])


def node_client() -> list[str]:
    """The command that runs the Node client; fails (never skips) when its runtime is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("`node` is not on PATH: install Node.js (>= 18, with npm), then run `make test`, "
                    "which installs tests/interop's npm packages")
    if not (INTEROP / "node_modules" / "protobufjs" / "package.json").is_file():
        pytest.fail("tests/interop/node_modules is missing: run `make test` "
                    "(it runs `npm ci --prefix tests/interop`)")
    return [node, str(CLIENT)]


def run_client(srv: ServerProcess, read_path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*node_client(), srv.sock_path, read_path], capture_output=True, encoding="utf-8",
                          timeout=90, cwd=ROOT, check=False)


def expected_kinds(shell_chunks: int) -> list[str]:
    """Every event of the session in order (PROTOCOL.md, "Sessions"); only the chunking may vary."""
    def state(name: str) -> str:
        return f"stateChange:{name}"

    return [
        state("SERVICE_STATE_STARTING"), "ready", state(READY),                      # handshake
        state(PROCESSING), *["shellOutput"] * (shell_chunks + 1), state(READY),       # ShellExec
        state(PROCESSING), "toolResult", state(READY),                                # fs.read
        state(PROCESSING), "error", state(ERROR),                                     # unknown tool
        state("SERVICE_STATE_SHUTTING"),                                              # Shutdown
    ]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_v1_session_framed_by_protobufjs(tmp_path: pathlib.Path, loop: str) -> None:
    node_client()
    root = tmp_path / "root"
    root.mkdir()
    (root / "greeting.txt").write_text(CONTENT, encoding="utf-8")
    srv = ServerProcess(tmp_path, loop=loop, root=root).start()
    before_ms = time.time() * 1000
    try:
        run = run_client(srv, "greeting.txt")
    finally:
        status = srv.stop()
    after_ms = time.time() * 1000
    assert run.returncode == 0, f"node client failed:\n{run.stderr}\n{run.stdout}\nserver:\n" + "\n".join(srv.raw_stderr[-20:])
    assert status == 0, "\n".join(srv.raw_stderr[-30:])
    summary: dict[str, Any] = json.loads(run.stdout)
    assert summary["ok"] is True and "error" not in summary
    assert summary["client"]["library"] == "protobufjs"
    assert summary["client"]["library_version"] == pinned_protobufjs()

    hs = summary["handshake"]
    assert hs["states"] == ["SERVICE_STATE_STARTING", READY]
    ready = hs["ready"]
    assert ready["version"] == 1 and ready["capabilities"] == ["CAPABILITY_SHELL_EXEC"]
    assert UUID_RE.match(ready["service_id"])
    info = ready["service_info"]
    assert info["negotiated_version"] == "1" and info["granted_capabilities"] == "shell_exec"
    assert info["event_loop"] == loop and info["service_name"] == "smith-fast"

    shell = summary["shell"]
    assert shell["stdout"] == "a\nb\n" and shell["stderr"] == "err\n"
    assert shell["exit_code"] == 4
    assert shell["states"] == [PROCESSING, READY]
    assert shell["chunks"] >= 2  # stdout and stderr never share a ShellOutput

    tool = summary["tool"]
    size = len(CONTENT.encode())
    assert tool["success"] is True and tool["error"] is None
    assert tool["result"] == {"path": "greeting.txt", "content": CONTENT, "size": size, "offset": 0,
                              "length": size, "truncated": False}
    assert tool["states"] == [PROCESSING, READY] and tool["duration_ms"] >= 0

    bad = summary["unknown_tool"]
    assert bad["error_code"] == "ERROR_CODE_INVALID_TOOL" and "no.such.tool" in bad["message"]
    assert bad["states"] == [PROCESSING, ERROR]

    assert summary["shutdown"] == {"states": ["SERVICE_STATE_SHUTTING"], "trailing": [], "closed": True}

    received = summary["received"]
    kinds = expected_kinds(shell["chunks"])
    assert received["kinds"] == kinds
    assert received["count"] == len(kinds)
    assert received["sequences"] == list(range(1, len(kinds) + 1))
    assert received["timestamps_plausible"] is True and received["timestamps_monotonic"] is True
    # checked against Python's clock too, not only the client's own judgement (1 s of slack)
    assert before_ms - 1000 <= received["first_timestamp"] <= received["last_timestamp"] <= after_ms + 1000
    assert summary["sent"] == {"count": 5, "sequences": [1, 2, 3, 4, 5]}

    # the service agrees: it logged one v1 handshake granting shell_exec
    handshakes = [r for r in srv.logs if r.get("event") == "handshake"]
    assert [(h["version"], h["granted"]) for h in handshakes] == [(1, ["shell_exec"])]


def test_client_reports_a_protocol_surprise(tmp_path: pathlib.Path) -> None:
    """The client's exit status means something: a service speaking JSON lines is a surprise."""
    node_client()
    srv = ServerProcess(tmp_path, "--protocol", "v0").start()
    try:
        run = run_client(srv, "greeting.txt")
    finally:
        srv.stop()
    assert run.returncode == 1, run.stderr
    summary = json.loads(run.stdout)
    # A JSON line read as a delimited frame is either unparsable or an Envelope of unknown fields
    # only, depending on the line's bytes; both must be reported.
    assert summary["ok"] is False and "handshake" not in summary
    assert re.search(r"not a valid Envelope|carries no payload, not event", summary["error"]), summary["error"]
    assert summary["error"] in run.stderr and summary["sent"]["sequences"] == [1]
