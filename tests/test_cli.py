"""The ``smith-fast`` command line, run as a real subprocess."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from .server import ServerProcess

CLI = [sys.executable, "-m", "smith_fast"]


def cli(*args: str, timeout: float = 60, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("command", ["serve", "exec", "call", "ping"])
def test_help_is_complete(command: str) -> None:
    res = cli(command, "--help")
    assert res.returncode == 0
    assert "usage: smith-fast " + command in res.stdout
    for flag in {"serve": ["--stdio", "--unix", "--tcp", "--allow-remote", "--protocol", "--root", "--max-output", "--timeout-ms"],
                 "exec": ["--connect", "--cwd", "--env", "--timeout-ms"],
                 "call": ["--connect", "JSON"],
                 "ping": ["--connect", "--count"]}[command]:
        assert flag in res.stdout, flag


def test_exec_spawned_streams_and_exits_with_code(tmp_path: pathlib.Path) -> None:
    res = cli("exec", "echo to-out; echo to-err >&2; exit 7", cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (7, "to-out\n", "to-err\n")


@pytest.mark.parametrize("protocol", ["v1", "v0"])
def test_exec_call_ping_against_a_server(tmp_path: pathlib.Path, protocol: str) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    srv = ServerProcess(tmp_path).start()
    try:
        res = cli("exec", "--connect", srv.unix, "--protocol", protocol, "--env", "X=42", "echo $X; kill -TERM $$")
        assert res.stdout == "42\n" and res.returncode == 128 + 15
        res = cli("call", "--connect", srv.tcp.removeprefix("tcp:"), "--protocol", protocol, "fs.read", '{"path": "a.txt"}')
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["content"] == "alpha\n"
        res = cli("call", "--connect", srv.unix, "fs.read", '{"path": "../outside"}')
        assert res.returncode == 1 and "PERMISSION_DENIED" in res.stderr
        res = cli("call", "--connect", srv.unix, "fs.read", "{bad json")
        assert res.returncode == 2 and "not valid JSON" in res.stderr
        res = cli("ping", "--connect", srv.unix, "--protocol", protocol, "-c", "2")
        assert res.returncode == 0 and res.stdout.count("round trip") == 2
    finally:
        assert srv.stop() == 0
