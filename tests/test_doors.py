"""Reported doors into the service, against a real ``smith-fast serve`` process: the handshake's repeated fields are
bounded and de-duplicated, and peer-reachable internal errors (a plan goal nested past the
recursion limit, NUL bytes in paths and env) are clear ``ErrorEvent``\\ s. After each attack the
service is still up and serves another session (a socket timeout, not a timing assert)."""

from __future__ import annotations

import json
import pathlib
import uuid

import pytest

from smith_fast.pb import smith_pb2 as pb

from .peers import V0Peer, V1Peer, errors, kind, terminal
from harness.server import ServerProcess, assert_clean_log, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("doors")
    srv = ServerProcess(tmp).start()
    yield srv
    assert srv.stop() == 0
    assert_clean_log(srv)


def still_serves(address: str) -> None:
    """Another session is answered: a handshake and a command, each within the peer's timeout."""
    peer = V1Peer(address, timeout=10.0)
    try:
        assert kind(peer.handshake()[-1]) == "ready"
        rid = str(uuid.uuid4())
        peer.command(shell_exec=pb.ShellExecCommand(request_id=rid, command="echo still-here"))
        envs = peer.until(terminal(rid))
        assert "".join(e.event.shell_output.stdout for e in envs) == "still-here\n"
    finally:
        peer.close()


def rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---- the handshake -------------------------------------------------------------------------------


def test_a_capability_repeated_65000_times_is_one_error(server: ServerProcess) -> None:
    """The reported frame: a first handshake of ~64 KiB listing capability 100 over and over got one
    ErrorEvent (and one log line) per entry, 65,000 of them; now one."""
    peer = V1Peer(server.unix)
    peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=[pb.CAPABILITY_SHELL_EXEC] + [100] * 64_000))
    envs = peer.until(lambda e: kind(e) == "ready")
    (err,) = errors(envs)
    assert err.error_code == pb.ERROR_CODE_INVALID_CAPABILITY
    assert err.details["capability"] == "100" and err.details["refused"] == "1"
    assert "capability 100 is unknown" in err.message
    assert list(envs[-1].event.ready.capabilities) == [pb.CAPABILITY_SHELL_EXEC]
    peer.close()
    still_serves(server.unix)

    def logged() -> list[dict[str, object]]:
        return [r for r in server.logs if r.get("event") == "protocol error" and "capability 100" in str(r.get("error"))]

    assert wait_until(logged) and len(logged()) == 1


def test_many_distinct_unknown_capabilities_are_named_boundedly(server: ServerProcess) -> None:
    peer = V1Peer(server.unix)
    unknown = list(range(1000, 13_000))
    peer.command(handshake=pb.HandshakeCommand(version=1, capabilities=unknown + unknown))
    envs = peer.until(lambda e: kind(e) == "ready")
    (err,) = errors(envs)
    assert err.details["refused"] == str(len(unknown))
    assert len(err.details["capability"].split(",")) == 16
    assert len(err.message) < 400 and f"and {len(unknown) - 16} more" in err.message
    peer.close()


def test_repeated_large_handshakes_from_a_peer_that_does_not_read(server: ServerProcess) -> None:
    """1 MB handshakes (a million unknown capabilities each) sent over and over while the peer
    reads nothing: the service's memory stays bounded and another session is served meanwhile."""
    peer = V1Peer(server.unix)
    peer.handshake()
    before = rss_kib(server.pid)
    frame = pb.HandshakeCommand(version=1, capabilities=[100] * 1_000_000)
    for _ in range(40):
        peer.command(handshake=frame)
    still_serves(server.unix)
    assert rss_kib(server.pid) - before < 128 * 1024  # was +670 MB over fewer handshakes
    peer.close()


def test_accept_list_and_env_refusals_are_bounded(server: ServerProcess) -> None:
    peer = V1Peer(server.unix)
    peer.handshake()  # the first frame is held to --max-handshake-frame-size: the next one may be larger
    envs = peer.handshake(**{"smith_fast.accept": ",".join(["nope"] * 50_000 + [f"x{i}" for i in range(5000)] + ["health"])})
    warnings = [e.event.log for e in peer.until(lambda e: kind(e) == "log") if kind(e) == "log"]
    assert kind(envs[-1]) == "ready" and envs[-1].event.ready.service_info["smith_fast.accepted"] == "health"
    (warning,) = warnings
    assert "nope, x0" in warning.message and "and 4985 more" in warning.message and len(warning.message) < 600
    rid = str(uuid.uuid4())
    env = {f"LD_{i}": "x" for i in range(20_000)}
    peer.command(shell_exec=pb.ShellExecCommand(request_id=rid, command="true", env=env))
    (err,) = errors(peer.until(terminal(rid)))
    assert err.error_code == pb.ERROR_CODE_PERMISSION_DENIED and "and 19984 more" in err.message and len(err.message) < 1000
    peer.close()


def test_a_plan_graph_costs_its_distinct_edges(server: ServerProcess) -> None:
    """A peer's steps plan naming one dependency 60,000 times draws one edge, not 60,000."""
    peer = V1Peer(server.unix)
    peer.handshake()
    steps = [{"id": "a", "kind": "shell", "command": "true"},
             {"id": "b", "kind": "shell", "command": "true", "depends_on": ["a"] * 60_000, "after": ["a"] * 60_000}]
    peer.command(plan=pb.PlanCommand(request_id="g", goal="g", context={"steps": json.dumps(steps)}))
    envs = peer.until(terminal("g"))
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, errors(envs)
    edges = [edge for e in envs if kind(e) == "graph_delta" for edge in e.event.graph_delta.edges_added]
    assert sorted(edge.edge_type for edge in edges) == ["depends_on", "depends_on"]  # b -> a, goal -> b
    peer.close()


def test_v0_unknown_capabilities_are_one_bounded_error(server: ServerProcess) -> None:
    peer = V0Peer(server.unix)
    names = ["bogus"] * 5000 + [f"n{i}" for i in range(1500)]  # under the 64 KiB of a first line
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec", *names]}})
    msgs = peer.until(lambda m: m["type"] == "Ready")
    (err,) = [m["data"] for m in msgs if m["type"] == "Error"]
    assert err["error_code"] == "INVALID_CAPABILITY" and "and 1485 more" in err["message"] and len(err["message"]) < 800
    peer.close()


# ---- internal errors a peer could reach ----------------------------------------------------------


@pytest.mark.parametrize("goal", ["$(" * 5000, 'echo "${' * 3000, '"$(' * 3000, "${" * 70 + "}" * 70])
def test_deeply_nested_plan_goal_is_an_invalid_goal(server: ServerProcess, goal: str) -> None:
    peer = V1Peer(server.unix)
    peer.handshake()
    peer.command(plan=pb.PlanCommand(request_id="p", goal=goal))
    envs = peer.until(terminal("p"))
    (err,) = errors(envs)
    assert err.error_code != pb.ERROR_CODE_INTERNAL_ERROR
    assert err.details["reason"] == "invalid_goal" and "nested more than 32 deep" in err.message
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_ERROR
    peer.close()
    still_serves(server.unix)


@pytest.mark.parametrize(
    ("field", "shell_exec"),
    [
        ("cwd", {"command": "true", "cwd": "a\0b"}),
        ("command", {"command": "tr\0ue"}),
        ("shell", {"command": "true", "shell": "/bin/s\0h"}),
        ("env", {"command": "true", "env": {"A": "b\0c"}}),
    ],
)
def test_nul_in_a_v1_shell_exec_is_an_invalid_field(server: ServerProcess, field: str, shell_exec: dict[str, object]) -> None:
    peer = V1Peer(server.unix)
    peer.handshake()
    peer.command(shell_exec=pb.ShellExecCommand(request_id="n", **shell_exec))  # type: ignore[arg-type]
    (err,) = errors(peer.until(terminal("n")))
    assert err.error_code == pb.ERROR_CODE_UNSPECIFIED
    assert err.details["reason"] == "invalid_field" and err.details["field"] == field and "NUL" in err.message
    peer.close()


@pytest.mark.parametrize(("field", "value"), [("cwd", "a\0b"), ("command", "ec\0ho"), ("shell", "/bin/\0sh")])
def test_nul_in_a_v0_field_is_an_invalid_field(server: ServerProcess, field: str, value: str) -> None:
    """The reported v0 line: a NUL in ``cwd`` was ``INTERNAL_ERROR ValueError``."""
    peer = V0Peer(server.unix)
    peer.send({"type": "Handshake", "data": {"version": 0, "capabilities": ["shell_exec"]}})
    peer.until(lambda m: m["type"] == "Ready")
    rid = str(uuid.uuid4())  # v0 ids are UUIDs
    data = {"request_id": rid, "command": "true", "shell": None, "cwd": None, "env": {}, "timeout_ms": None, field: value}
    peer.send({"type": "ShellExec", "data": data})
    msgs = peer.until(lambda m: m["type"] == "StateChange" and m["data"]["request_id"] == rid and m["data"]["state"] in ("Ready", "Error"))
    (err,) = [m["data"] for m in msgs if m["type"] == "Error"]
    assert err["error_code"] not in ("INTERNAL_ERROR", "INTERNAL") and "NUL" in err["message"] and field in err["message"]
    assert msgs[-1]["data"]["state"] == "Error"
    peer.close()
    still_serves(server.unix)


@pytest.mark.parametrize(("tool", "args"), [("shell.run", {"command": "true", "env": {"A": "\0"}}), ("shell.run", {"command": "tr\0ue"})])
def test_nul_in_a_tool_process_is_refused(server: ServerProcess, tool: str, args: dict[str, object]) -> None:
    peer = V1Peer(server.unix)
    peer.handshake()
    peer.command(tool_call=pb.ToolCallCommand(request_id="t", tool=tool, args=json.dumps(args).encode()))
    envs = peer.until(terminal("t"))
    assert all(e.error_code != pb.ERROR_CODE_INTERNAL_ERROR for e in errors(envs))
    assert "NUL" in "".join(e.message for e in errors(envs)) + "".join(e.event.tool_result.error for e in envs if kind(e) == "tool_result")
    peer.close()


def test_nul_in_a_javascript_hook_is_a_failed_load(server: ServerProcess) -> None:
    """Found by probing every string a peer can send with a NUL: QuickJS's ValueError was an INTERNAL_ERROR."""
    peer = V1Peer(server.unix)
    peer.handshake((pb.CAPABILITY_SHELL_EXEC, pb.CAPABILITY_HOOKS_JS))
    script = "function beforeShellExec(p) { return {action: 'allow'}; }\0"
    peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=script))
    (err,) = errors(peer.until(terminal("h")))
    assert err.error_code == pb.ERROR_CODE_UNSPECIFIED and err.details["reason"] == "hook_load_failed" and "NUL" in err.message
    peer.close()
    still_serves(server.unix)
