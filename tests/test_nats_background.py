"""Background processes through the NATS gateway (smith_fast/nats/processes.py; PROTOCOL.md,
"Scale-out over NATS", "Background processes"): a background ShellExec runs on the worker its
session lives on and stays there, and every session sees the fleet's as on ``serve``: ListProcesses
lists every live worker's, Attach, Cancel, Stdin and Resize reach the worker holding the process,
and naming one whose worker is gone gets ``worker_gone``.

Real parts only: nats-server on a loopback port with the least-privilege configuration of
``smith-fast nats-auth``, ``smith-fast gateway`` and ``worker`` processes (``harness/nats_cluster.py``),
the SDK, raw commands and the CLI over the gateway's Unix socket. Sessions are put on a chosen
worker by placement labels (w0 has ``zone=a``, w1 ``zone=b``). Processes are looked for among the
workers' descendants in /proc. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from harness.nats_cluster import Cluster
from harness.server import ROOT, SmithProcess, pid_alive, wait_until
from smith_fast.client import Client, SmithError
from smith_fast.pb import smith_pb2 as pb
from smith_fast.remote_process import terminal_state

from .test_background import attach_raw, background_exec
from .test_nats_control import FAST, LIMITS, _cmdlines, rid
from .test_process_control import Raw, cancel, stdin

# ---- serve's background tests, run against a gateway and two workers, each session on the other worker ----
# (collected here as this module's own tests: the `server` fixture below is what they are given)

from .test_background import (  # noqa: E402,F401
    test_a_terminal_resized_from_another_session,
    test_cli_exec_d_ps_attach_kill,
    test_detach_leaves_it_running_and_cancel_from_another_session_kills_the_tree,
    test_outlives_its_session_then_another_session_attaches_from_0_and_follows,
    test_ring_drops_the_oldest_and_attach_says_where_it_starts,
    test_stdin_from_another_session_and_sdk_start_background,
    test_unknown_ids_and_grants,
    test_v0_starts_lists_and_attaches,
)

ZONES = {0: ("zone=a",), 1: ("zone=b",), 2: ("zone=c",)}
ON = [{"smith_fast.placement": f"zone={z}"} for z in "abc"]  # a session on w0, w1, w2
WORKER_ARGS = (*LIMITS, "--max-background", "16", "--background-buffer", "4k")


class _Gateway:
    """What serve's tests use of a service (its socket, the workspace its commands run in), and
    the placement of each new session: the next worker in turn."""

    def __init__(self, cluster: Cluster) -> None:
        self.unix, self.root = cluster.unix, cluster.root
        self._turn = itertools.cycle(ON[:2])

    def placement(self) -> dict[str, str]:
        return next(self._turn)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("natsbg"), workers=2, nats_args=FAST, worker_args=WORKER_ARGS, gateway_args=LIMITS,
                labels=ZONES).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def server(cluster: Cluster) -> _Gateway:
    return _Gateway(cluster)


def holds(worker: SmithProcess, needle: str) -> bool:
    """Whether ``worker`` has a descendant whose command line holds ``needle``."""
    return worker.proc is not None and worker.proc.poll() is None and any(needle in line for line in _cmdlines(worker).values())


async def on(cluster: Cluster, n: int, capabilities: tuple[str, ...] = ("shell_exec",)) -> Client:
    """A session on worker ``n``."""
    client = await Client.connect(cluster.unix)
    await client.handshake(capabilities, client_info=ON[n])
    return client


async def start_background(client: Client, command: str, pid_id: str, **fields: object) -> Raw:
    start = Raw(client, pid_id)
    client.send(background_exec(command, pid_id, **fields))
    assert terminal_state(await start.end()) == pb.SERVICE_STATE_READY, start.events
    notice = start.of("log")
    assert notice and notice[0].log.fields["reason"] == "background" and notice[0].log.fields["process_id"] == pid_id, start.events
    return start


async def test_a_session_on_w1_lists_attaches_writes_and_cancels_a_process_started_on_w0(cluster: Cluster) -> None:
    pid_id = rid()
    needle = f"bg-{pid_id[:8]}"
    first = await on(cluster, 0)
    second = await on(cluster, 1)
    await start_background(first, f"sh -c 'echo start; cat; echo end' {needle}", pid_id, open_stdin=True)
    # at once, from the other worker: its announcement came before the start's READY
    raw = await attach_raw(second, pid_id, 0)
    await raw.until(lambda e: b"start\n" in raw.stdout())
    assert wait_until(lambda: holds(cluster.workers[0], needle), 10) and not holds(cluster.workers[1], needle)
    await first.close()  # its session ends: the process stays on w0

    listed = {p.id: p for p in await second.list_processes()}
    assert listed[pid_id].state == "running" and listed[pid_id].stdin_open and pid_alive(listed[pid_id].pid)
    shell_pid = listed[pid_id].pid
    second.send(stdin(pid_id, b"hello across workers\n"))
    await raw.until(lambda e: b"hello across workers\n" in raw.stdout())

    def ack(e: pb.Event) -> bool:
        return e.WhichOneof("event_type") == "shell_output" and e.shell_output.stdin_written > 0

    # the ack may come before the echoed output or after it
    acked = next((e for e in raw.events if ack(e)), None) or await raw.until(ack)
    assert acked.shell_output.stdin_written == len(b"hello across workers\n")
    assert raw.stdout() == b"start\nhello across workers\n" and not raw.errors(), raw.events

    second.send(cancel(pid_id))
    final = await raw.until(lambda e: e.WhichOneof("event_type") == "shell_output" and e.shell_output.finished)
    assert final.shell_output.exit_code in (-15, -9), final
    assert terminal_state(await raw.end()) == pb.SERVICE_STATE_READY
    await raw.quiet()
    assert raw.terminals() == [pb.SERVICE_STATE_READY]
    assert wait_until(lambda: not pid_alive(shell_pid), 10), "the background process survived its cancel"
    assert next(p for p in await second.list_processes() if p.id == pid_id).state == "exited"
    await second.close()


async def test_what_the_owner_refuses_comes_back_as_serve_says_it(cluster: Cluster) -> None:
    pid_id = rid()
    owner, other = await on(cluster, 0), await on(cluster, 1)
    start = await start_background(owner, "sleep 30", pid_id)  # no open stdin, no terminal
    watch = Raw(other, pid_id)  # the errors naming the process arrive under its id
    other.send(stdin(pid_id, b"lost\n"))
    refused = await watch.until(lambda e: e.WhichOneof("event_type") == "error")
    assert refused.error.details["reason"] == "stdin_closed" and refused.error.request_id == pid_id, refused
    other.send(pb.Command(resize=pb.ResizeCommand(request_id=pid_id, rows=40, cols=120)))
    refused = await watch.until(lambda e: e.WhichOneof("event_type") == "error" and e.error.details["reason"] != "stdin_closed")
    assert refused.error.details["reason"] == "no_terminal", refused
    assert not watch.terminals()  # control commands have no states of their own, as on serve
    other.send(background_exec("sleep 1", pid_id))  # the same id again, on the other worker
    assert terminal_state(await watch.end()) == pb.SERVICE_STATE_ERROR
    assert [e.details["reason"] for e in watch.errors()] == ["stdin_closed", "no_terminal", "duplicate_id"], watch.errors()
    owner.send(background_exec("sleep 1", pid_id))  # and on its own
    assert terminal_state(await start.end()) == pb.SERVICE_STATE_ERROR
    assert [e.details["reason"] for e in start.errors()] == ["duplicate_id"], start.errors()
    other.cancel(pid_id)
    assert await (await other.attach(pid_id, 1 << 40)).wait() < 0
    await owner.close()
    await other.close()


def cli(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "smith_fast", *argv], cwd=ROOT, capture_output=True, timeout=60,
                          env=dict(os.environ, SMITH_FAST_LOG_LEVEL="warning"))


async def test_smith_fast_ps_through_the_gateway_lists_every_workers_processes(cluster: Cluster) -> None:
    started = {}
    for n in (0, 1):
        client = await on(cluster, n)
        pid_id = rid()
        await start_background(client, f"sleep 300.{n}{int(pid_id[:6], 16)}", pid_id)
        started[pid_id] = f"sleep 300.{n}{int(pid_id[:6], 16)}"
        await client.close()
    assert [holds(cluster.workers[n], needle) for n, needle in enumerate(started.values())] == [True, True]
    for _ in range(2):  # whichever worker the ps session lands on, it lists both
        ps = cli("ps", "--json", "--connect", cluster.unix)
        assert ps.returncode == 0, ps.stderr
        rows = {row["id"]: row for row in map(json.loads, ps.stdout.decode().splitlines())}
        assert set(started) <= set(rows), (set(started) - set(rows))
        assert all(rows[p]["state"] == "running" and pid_alive(rows[p]["pid"]) for p in started)
    for pid_id in started:
        killed = cli("kill", "--connect", cluster.unix, pid_id)
        assert killed.returncode == 0, killed.stderr
    assert wait_until(lambda: not any(holds(w, n) for w in cluster.workers for n in started.values()), 10)


async def test_a_silent_worker_is_named_and_a_killed_workers_processes_are_gone(tmp_path: pathlib.Path) -> None:
    """w2 stopped (SIGSTOP): a list from w1 shows what w0 answered and says w2 did not answer.
    w0 killed (SIGKILL): its processes die with it (child guard), they are no longer listed, and
    naming one (Attach, Cancel, Stdin) says ``worker_gone``, at once (nobody answers on w0's
    subject) and once w1's presence set dropped w0; an attach following one ends so too."""
    cluster = Cluster(tmp_path, workers=3, nats_args=("--presence-interval", "1"), worker_args=WORKER_ARGS, gateway_args=LIMITS,
                      labels=ZONES).start()
    try:
        owner, asker = await on(cluster, 0), await on(cluster, 1)
        victim_id, kept_id = rid(), rid()
        await start_background(owner, "sleep 300", victim_id)
        await start_background(asker, "sleep 300", kept_id)
        shell = next(p.pid for p in await asker.list_processes() if p.id == victim_id)

        stopped = cluster.workers[2].proc
        assert stopped is not None
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            listing = Raw(asker, rid())
            asker.send(pb.Command(list_processes=pb.ListProcessesCommand(request_id=listing.rid)))
            assert terminal_state(await listing.end()) == pb.SERVICE_STATE_READY
            (warn,) = [e.log for e in listing.of("log")]
            assert warn.level == pb.LOG_LEVEL_WARN and warn.fields["reason"] == "workers_unanswered" and warn.fields["workers"] == "w2"
            (answer,) = listing.of("process_list")
            assert {victim_id, kept_id} <= {p.id for p in answer.process_list.processes}
        finally:
            os.kill(stopped.pid, signal.SIGCONT)

        following = await attach_raw(asker, victim_id, 1 << 40)  # an attach from w1 running when w0 dies
        await following.until(lambda e: e.WhichOneof("event_type") == "state_change")  # PROCESSING
        victim = cluster.workers[0].proc
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        assert wait_until(lambda: not pid_alive(shell), 20), "a background process outlived its worker (child guard)"
        watch = Raw(asker, victim_id)
        for round_ in range(2):  # at once (the Cancel goes to w0 and finds nobody), then after w1's presence set dropped w0
            for command in (cancel(victim_id), stdin(victim_id, b"x")):
                seen = len(watch.errors())
                asker.send(command)
                refused = await watch.until(lambda e: e.WhichOneof("event_type") == "error" and len(watch.errors()) > seen)
                assert refused.error.details["reason"] == "worker_gone" and refused.error.request_id == victim_id, refused
                assert f"no request {victim_id} is running" in refused.error.message and "w0" in refused.error.message
            with pytest.raises(SmithError, match=f"no background process {victim_id}") as info:
                await (await asker.attach(victim_id)).wait()
            assert info.value.error.details["reason"] == "worker_gone" and info.value.error.details["worker"] == "w0", info.value.error
            listed = {p.id for p in await asker.list_processes()}
            assert victim_id not in listed and kept_id in listed, listed
            if round_ == 0:
                await asyncio.sleep(3.5)  # w1's presence set drops w0: 3 silent intervals of 1 s
        assert not watch.terminals()
        assert terminal_state(await following.end()) == pb.SERVICE_STATE_ERROR  # its read unanswered, w0 silent: gone
        assert [e.details["reason"] for e in following.errors()] == ["worker_gone"], following.events
        asker.cancel(kept_id)
        await asker.close()
        await owner.close()
    finally:
        cluster.stop()

