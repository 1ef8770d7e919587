"""Hostile sessions and honest ones at once against one real server (RELIABILITY.md,
"hostile sessions beside honest ones").

The attacks of ``harness/hostile.py`` (:data:`~harness.hostile.ATTACKS`: a peer that never reads
1000 pipelined 1 MB ``fs.read``s, a session whose JS hook busy-waits 400 ms on each of 20 pipelined
calls, a ReDoS ``fs.search``, a 200,000-call ``BatchCommand``, unauthenticated 16 MiB frames, a
session loading 30 hooks of 28 MiB each; any attack left out would be listed, with why, in
:data:`~harness.hostile.PENDING`) run together while 10 honest
sessions do rounds of 4 pipelined tool calls and a shell command. Asserted: every honest session
completes rounds and loses no event (every tool result, the shell's output and exit code, one
terminal state per request, contiguous sequence numbers), and the server's RSS stays under
:data:`RSS_BOUND_MIB` above what it was before the attacks. The round trips are not asserted:
``bench/bench_hostile_load.py`` reports them as a ratio to an unloaded run.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator

import pytest

from harness.hostile import ATTACKS, SERVER_ARGS, Honest, prepare_root, rss_kib, run_attacks
from harness.server import ServerProcess, assert_clean_log

HONEST = 10
DURATION = 12.0  # seconds of attack with the honest sessions running
# The attacks' budget: --max-session-buffer (16M) for the peer that does not read, the hook budget of
# the session of many_hooks (--max-session-hook-memory 64M, harness.hostile.SERVER_ARGS; twice, as a
# closed session's hooks may not be freed yet when the next one loads its own), plus slack.
RSS_BOUND_MIB = 256


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    prepare_root(tmp_path)
    srv = ServerProcess(tmp_path, *SERVER_ARGS, log_level="info").start()
    yield srv
    srv.stop()
    assert_clean_log(srv)


def test_honest_sessions_lose_nothing_under_attack(server: ServerProcess) -> None:
    before = rss_kib(server.pid)
    stop = threading.Event()
    attackers = run_attacks(server.tcp, list(ATTACKS), stop)
    honest = [Honest(server.unix, i) for i in range(HONEST)]
    threads = [threading.Thread(target=h.run, args=(stop,), daemon=True) for h in honest]
    for t in threads:
        t.start()
    peak = before
    deadline = time.monotonic() + DURATION
    while time.monotonic() < deadline:
        peak = max(peak, rss_kib(server.pid))
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    for t in attackers:
        t.join(30)
    peak = max(peak, rss_kib(server.pid))
    problems = [p for h in honest for p in h.problems]
    assert not problems, problems[:20]
    assert all(h.round_trips for h in honest), [len(h.round_trips) for h in honest]
    assert (peak - before) // 1024 < RSS_BOUND_MIB, f"the server's RSS grew {(peak - before) // 1024} MiB under attack"
    assert not any(t.is_alive() for t in [*threads, *attackers])
