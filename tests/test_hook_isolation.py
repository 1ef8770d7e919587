"""A session's JS hook time is not other sessions' latency.

The attack (one finding of the hostile-input review, RELIABILITY.md) against a real
``smith-fast serve``: a session loads a JavaScript hook whose ``beforeToolCall`` busy-waits just
under the time limit, then pipelines 20 tool calls. Before, the hooks ran on the event loop: the 20
calls' hooks ran back to back in one loop iteration and another session's ping waited for all of
them (9 s). Now each hook runs on a thread of its own with the GIL released
(``smith_fast/hooks/js.py``), so the other session keeps its round trips while the hostile one is
still in its calls. No timing is asserted: the honest session must complete more pings than the
hostile session has calls while those calls run.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from harness.server import ServerProcess, assert_clean_log
from smith_fast.pb import smith_pb2 as pb

from .peers import V1Peer, kind, terminal

CALLS = 20
SPIN_MS = 400  # under the default 0.5 s time limit
BUSY_HOOK = (
    "function beforeToolCall(p) { const t = Date.now(); while (Date.now() - t < %d) {} return {action: 'allow'}; }" % SPIN_MS
)


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("hook-isolation"), log_level="info").start()  # the default 0.5 s hook limit
    yield srv
    srv.stop()
    assert_clean_log(srv)


def hostile(server: ServerProcess) -> V1Peer:
    """A session with the busy hook loaded."""
    peer = V1Peer(server.unix, timeout=120)
    peer.handshake(caps=(pb.CAPABILITY_HOOKS_JS,))
    peer.command(hook_load=pb.HookLoadCommand(request_id="h", hook_type="js", script=BUSY_HOOK))
    envs = peer.until(terminal("h"))
    assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY, envs
    return peer


def test_a_busy_hook_does_not_stall_another_session(server: ServerProcess) -> None:
    attacker = hostile(server)
    honest = V1Peer(server.unix, timeout=120)
    honest.handshake()
    for i in range(CALLS):
        attacker.command(tool_call=pb.ToolCallCommand(request_id=f"a{i}", tool="tools.list", args=b"{}"))
    done = threading.Event()
    ends: list[str] = []

    def drain() -> None:
        while len(ends) < CALLS:
            env = attacker.recv()
            if kind(env) == "state_change" and env.event.state_change.request_id.startswith("a"):
                if env.event.state_change.state in (pb.SERVICE_STATE_READY, pb.SERVICE_STATE_ERROR):
                    ends.append(env.event.state_change.request_id)
        done.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    pings = 0
    while not done.is_set():
        honest.command(tool_call=pb.ToolCallCommand(request_id=f"p{pings}", tool="tools.list", args=b"{}"))
        envs = honest.until(terminal(f"p{pings}"))
        assert envs[-1].event.state_change.state == pb.SERVICE_STATE_READY
        pings += 1
    reader.join(60)
    assert sorted(ends) == sorted(f"a{i}" for i in range(CALLS))  # every hostile call still ran, once
    # Before, the first ping waited for all 20 hooks (the loop ran them back to back): 1 or 2 pings.
    assert pings > CALLS, f"only {pings} round trips of another session while {CALLS} busy hook calls ran"
    attacker.close()
    honest.close()
